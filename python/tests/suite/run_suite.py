"""Runs PyTorch's own distributed test suite (torch.testing._internal.distributed.
distributed_test, shipped in the torch wheel) against a backend.

  BACKEND=chorus WORLD_SIZE=2 .venv/bin/python run_suite.py [--shard I/N] [-k PATTERN ...] [-v]

BACKEND may be gloo (the reference) or chorus (needs chorus_torch importable). Tests named
in skip.txt are skipped, each with the reason written there; those in ungate.txt, which the
suite runs only for a backend named gloo, run for chorus too. Each test starts WORLD_SIZE
processes that meet through a file:// store. They are forked: spawned ones (torch's CI) each
import torch 2.13 and the suite again, about 5 s a test, 23 minutes for the 285 tests at W=2;
forked, the same 90 tests pass with gloo, in 1 minute. CHORUS_SUITE_SPAWN=1 spawns them.

  BACKEND=gloo WORLD_SIZE=2 run_suite.py --record gloo-passes-w2.txt   (gloo's list, for the check)"""
import argparse
import atexit
import os
import shutil
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))

backend = os.environ.setdefault("BACKEND", "chorus")
os.environ.setdefault("WORLD_SIZE", "2")
if "TEMP_DIR" not in os.environ:  # the ranks, spawned, inherit it
    os.environ["TEMP_DIR"] = tempfile.mkdtemp(prefix="chorus-suite-")
    open(os.path.join(os.environ["TEMP_DIR"], "barrier"), "w").close()
    atexit.register(shutil.rmtree, os.environ["TEMP_DIR"], True)

import torch  # noqa: E402,F401

from torch.testing._internal.common_distributed import DistTestCases  # noqa: E402

if backend == "chorus":
    import chorus_torch  # noqa: F401,E402  registers the backend

    for feature in ("plugin", "ddp", "subgroup", "gpu"):
        DistTestCases.backend_feature[feature].add(backend)

from torch.testing._internal.distributed.distributed_test import (  # noqa: E402
    DistributedTest,
    TestDistBackend,
)


def listed(file_name):
    """`test_name  reason` per line of a file (beside this one unless a path); # starts a comment."""
    names = {}
    with open(os.path.join(HERE, file_name)) as f:
        for line in f:
            line = line.split("#", 1)[0].strip()
            if line:
                name, _, reason = line.partition(" ")
                names[name] = reason.strip()
    return names


class TestDistBackendWithSpawn(TestDistBackend, DistributedTest._DistTestBase):
    def setUp(self):
        super().setUp()
        if os.environ.get("CHORUS_SUITE_SPAWN") == "1":
            self._spawn_processes()
        else:
            self._start_processes(torch.multiprocessing.get_context("fork").Process)


if backend == "chorus":
    for name, reason in listed("skip.txt").items():
        if hasattr(TestDistBackendWithSpawn, name):
            setattr(TestDistBackendWithSpawn, name, unittest.skip(reason)(getattr(TestDistBackendWithSpawn, name)))
    for name in listed("ungate.txt"):  # the suite's skip decorators mark the function itself
        getattr(TestDistBackendWithSpawn, name).__unittest_skip__ = False


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shard", default="0/1", help="I/N: run every N-th test from the I-th (ctest jobs)")
    parser.add_argument("--gloo-passes", help="file naming the tests gloo passes here; with backend chorus, "
                        "each of them in this shard must pass or be in skip.txt (default: gloo-passes-w<W>.txt)")
    parser.add_argument("--record", help="write the names of the tests that passed to this file")
    args, rest = parser.parse_known_args()
    index, count = (int(x) for x in args.shard.split("/"))
    names = sorted(n for n in dir(TestDistBackendWithSpawn) if n.startswith("test"))
    mine = set(names[index::count])
    for n in names:
        if n not in mine:
            setattr(TestDistBackendWithSpawn, n, None)  # not a test of this shard

    runner = unittest.TextTestRunner(resultclass=Recording, verbosity=2 if "-v" in rest else 1)
    result = unittest.main(module="__main__", argv=[sys.argv[0]] + rest, testRunner=runner, exit=False).result
    if args.record:
        with open(args.record, "w") as f:
            f.write(f"# The tests of torch {torch.__version__}'s distributed_test.py that {backend} passes on this "
                    f"machine at WORLD_SIZE={os.environ['WORLD_SIZE']}\n# (BACKEND={backend} run_suite.py: "
                    f"{len(Recording.passed)} pass of {len(Recording.ran)} run; {len(result.skipped)} skip, "
                    f"{len(result.failures) + len(result.errors)} fail).\n")
            f.writelines(n + "\n" for n in sorted(Recording.passed))
    if not result.wasSuccessful():
        sys.exit(1)
    if backend != "chorus":
        return
    passes = args.gloo_passes or os.path.join(HERE, f"gloo-passes-w{os.environ['WORLD_SIZE']}.txt")
    if not os.path.exists(passes):
        print(f"no list of gloo's passes at {passes}: not compared")
        return
    expected = {n for n in listed(passes) if n in Recording.ran}
    unexplained = sorted(expected - Recording.passed - set(listed("skip.txt")))
    if unexplained:
        print(f"gloo passes these here but chorus did not run them, and skip.txt does not say why: {unexplained}")
        sys.exit(1)
    print(f"each of the {len(expected)} tests of this run that gloo passes here passed with chorus "
          f"({len(expected - Recording.passed)} of them are in skip.txt, with the reason)")


class Recording(unittest.TextTestResult):
    """Names the tests that ran, and those that passed."""
    ran, passed = set(), set()

    def startTest(self, test):
        super().startTest(test)
        Recording.ran.add(test.id().rsplit(".", 1)[-1])

    def addSuccess(self, test):
        super().addSuccess(test)
        Recording.passed.add(test.id().rsplit(".", 1)[-1])


if __name__ == "__main__":
    main()
