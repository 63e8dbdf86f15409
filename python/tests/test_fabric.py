"""Lightning Fabric on backend chorus (fabric_on_chorus.py), launched by Fabric itself, by
torchrun and by chorusrun, in a network namespace (launch.py): every distributed operation of
Fabric gives what it gives on gloo, a short training reaches gloo's loss, and a rank killed
mid-step is named by the others while the launcher exits non-zero.

  PYTHONPATH=<build>/python/site CHORUSRUN=<build>/launcher/chorusrun \\
    .venv/bin/python python/tests/test_fabric.py [-v] [-k PATTERN]"""
import os
import re
import sys
import unittest

import launch

SCRIPT = launch.beside("fabric_on_chorus.py")


class Fabric(launch.InNamespace):
    tag = "fabric"

    def run_fabric(self, args, world=2, launcher=None, env=None, ok=True):
        """Fabric launches the ranks itself unless `launcher` (launch.torchrun, launch.chorusrun)."""
        command = (launcher(world) if launcher else [sys.executable]) + [SCRIPT] + args + ["--devices", str(world)]
        out = self.netns.run(command, env=dict(os.environ, **(env or {})))
        if ok:
            self.assertEqual(out.returncode, 0, out.stdout + out.stderr)
            backend = "gloo" if "gloo" in args else "chorus"
            ranks = sorted(int(r) for r in re.findall(rf"rank (\d+) of {world} on {backend}\n", out.stdout))
            self.assertEqual(ranks, list(range(world)), out.stdout + out.stderr)
        return out

    @staticmethod
    def results(out, leave_out=()):
        return sorted(line for line in out.stdout.splitlines()
                      if line.startswith("result ") and not any(x in line for x in leave_out))

    def test_operations_give_what_they_give_on_gloo(self):
        chorus = self.run_fabric(["ops"])
        gloo = self.run_fabric(["ops", "--backend", "gloo", "--skip-dtypes", "int16"])  # gloo: no int16
        self.assertEqual(chorus.stdout.count("operations gave what they must"), 2)
        self.assertGreater(len(self.results(gloo)), 50)
        self.assertEqual(self.results(chorus, leave_out=["int16"]), self.results(gloo))

    def test_operations_under_torchrun_at_3(self):
        self.run_fabric(["ops"], world=3, launcher=launch.torchrun)

    @unittest.skipUnless(os.environ.get("CHORUSRUN"), "CHORUSRUN names the chorusrun binary")
    def test_operations_under_chorusrun_at_4(self):
        self.run_fabric(["ops"], world=4, launcher=launch.chorusrun)

    def test_training_reaches_the_loss_it_reaches_on_gloo(self):
        def loss(out):
            return float(re.search(r"final loss ([\d.]+)", out.stdout).group(1))

        chorus = loss(self.run_fabric(["train"]))
        gloo = loss(self.run_fabric(["train", "--backend", "gloo"]))
        self.assertAlmostEqual(chorus, gloo, places=5)
        self.assertLess(chorus, 0.1)  # it learned

    def test_strategy_ddp_picks_chorus_when_it_is_the_default(self):
        # strategy="ddp" on CPU asks torch's default map, which CHORUS_DEFAULT_CPU_BACKEND=1 points at chorus.
        self.run_fabric(["train", "--backend", "default"], world=3, env={"CHORUS_DEFAULT_CPU_BACKEND": "1"})

    def check_killed(self, out, killed, launcher_may_stop_them=False):
        """The survivors' error names the killed rank. Under torchrun and chorusrun, which watch
        their workers, the launcher may see the death first and stop the survivors before they
        notice: then its own report names the rank and the signal."""
        self.assertNotEqual(out.returncode, 0, out.stdout + out.stderr)
        survivors = rf"rank {killed} \(on [^)]+\), pid \d+, of group 'world' died while rank \d waited"
        launchers = [rf"rank {killed} \(pid \d+\) was killed by SIGKILL",  # chorusrun
                     rf"rank *: {killed} \(local_rank: {killed}\)\n *exitcode *: -9"]  # torchrun
        self.assertRegex(out.stderr, "|".join([survivors] + (launchers if launcher_may_stop_them else [])))

    def test_a_rank_killed_mid_step_is_named(self):
        out = self.run_fabric(["train", "--kill-rank", "1", "--kill-step", "2"], ok=False)
        self.check_killed(out, 1)

    def test_a_rank_killed_mid_step_is_named_under_torchrun(self):
        out = self.run_fabric(["train", "--kill-rank", "2", "--kill-step", "3"], world=3, launcher=launch.torchrun,
                              ok=False)
        self.check_killed(out, 2, launcher_may_stop_them=True)


    @unittest.skipUnless(os.environ.get("CHORUSRUN"), "CHORUSRUN names the chorusrun binary")
    def test_a_rank_killed_mid_step_is_named_under_chorusrun(self):
        out = self.run_fabric(["train", "--kill-rank", "0", "--kill-step", "1"], launcher=launch.chorusrun, ok=False)
        self.check_killed(out, 0, launcher_may_stop_them=True)

if __name__ == "__main__":
    unittest.main()
