"""Hugging Face Accelerate on backend chorus: Accelerate's collectives (accelerate_on_chorus.py
ops, on chorus and on gloo alike) and the test scripts Accelerate ships in its package
(accelerate/test_utils/scripts/) that run on CPU, each at W=2 under torchrun (one under
chorusrun), in a network namespace (launch.py). A script passes only if every rank reports the
world it ran in and the collectives the backend itself counted.

  PYTHONPATH=<build>/python/site CHORUSRUN=<build>/launcher/chorusrun \\
    .venv/bin/python python/tests/test_accelerate.py [-v] [-k PATTERN]"""
import os
import re
import unittest

import launch

SCRIPT = launch.beside("accelerate_on_chorus.py")


class Accelerate(launch.InNamespace):
    tag = "accelerate"

    def launched(self, what, backend="chorus", launcher=None, world=2):
        env = dict(os.environ, BACKEND=backend)
        out = self.netns.run((launcher or launch.torchrun)(world) + [SCRIPT, what], env=env)
        self.assertEqual(out.returncode, 0, out.stdout + out.stderr)
        reports = re.findall(r"rank (\d+) of (\d+) on (\w+): (\d+) collectives", out.stdout)
        self.assertEqual(sorted(int(r) for r, _, _, _ in reports), list(range(world)), out.stdout)
        for _, w, b, calls in reports:  # spread over `world` processes, by that backend
            self.assertEqual((int(w), b), (world, backend), out.stdout)
            self.assertGreater(int(calls), 0, out.stdout)
        return out.stdout

    def test_collectives_on_chorus(self):
        out = self.launched("ops")
        self.assertEqual(out.count("collectives gave what they must"), 2, out)

    def test_collectives_on_gloo_give_the_same(self):
        out = self.launched("ops", backend="gloo")
        self.assertEqual(out.count("collectives gave what they must"), 2, out)

    @unittest.skipUnless(os.environ.get("CHORUSRUN"), "CHORUSRUN names the chorusrun binary")
    def test_collectives_under_chorusrun(self):
        self.launched("ops", launcher=launch.chorusrun, world=3)

    def test_shipped_test_ops(self):
        out = self.launched("test_ops")
        for check in ("testing gather", "testing pad_across_processes", "testing reduce_mean"):
            self.assertIn(check, out)

    def test_shipped_test_script(self):
        out = self.launched("test_script")
        self.assertIn("Breakpoint trigger test", out)  # its last check

    def test_shipped_test_sync(self):
        self.launched("test_sync")

    def test_shipped_test_distributed_data_loop(self):
        out = self.launched("test_distributed_data_loop")
        # The four join tests need an accelerator (see the script); the rest all ran.
        self.assertEqual(out.count("not run on CPU"), 4 * 2, out)


if __name__ == "__main__":
    unittest.main()
