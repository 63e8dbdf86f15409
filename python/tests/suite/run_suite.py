"""Runs PyTorch's own distributed test suite (torch.testing._internal.distributed.
distributed_test, shipped with python3-torch) against a backend.

  BACKEND=chorus WORLD_SIZE=2 /usr/bin/python3 run_suite.py [--shard I/N] [-k PATTERN ...] [-v]

BACKEND may be gloo (the reference) or chorus (needs chorus_torch importable). Tests named
in skip.txt are skipped, each with the reason written there; those in ungate.txt, which the
suite runs only for a backend named gloo, run for chorus too. Each test spawns WORLD_SIZE
fresh processes that meet through a file:// store, as torch's own CI does."""
import argparse
import atexit
import os
import shutil
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)  # the expecttest stand-in

backend = os.environ.setdefault("BACKEND", "chorus")
os.environ.setdefault("WORLD_SIZE", "2")
if "TEMP_DIR" not in os.environ:  # the ranks, spawned, inherit it
    os.environ["TEMP_DIR"] = tempfile.mkdtemp(prefix="chorus-suite-")
    open(os.path.join(os.environ["TEMP_DIR"], "barrier"), "w").close()
    atexit.register(shutil.rmtree, os.environ["TEMP_DIR"], True)

import torch  # noqa: E402
import torch.nn.parallel._replicated_tensor_ddp_utils as replicated  # noqa: E402

# The harness switches DDP into its ReplicatedTensor mode in every rank, and that mode's
# import fails on Python 3.11 for every backend: keep DDP in its ordinary mode.
_set_replicated = replicated._set_ddp_with_replicated_tensor
replicated._set_ddp_with_replicated_tensor = lambda value: _set_replicated(False)

from torch.testing._internal.common_distributed import DistTestCases  # noqa: E402

if backend == "chorus":
    import chorus_torch  # noqa: F401,E402  registers the backend

    for feature in ("plugin", "ddp", "subgroup", "gpu"):
        DistTestCases.backend_feature[feature].add(backend)
    # recv(src=None) is the one call chorus refuses (with an error naming it).
    DistTestCases.skip_collective["sendrecv anysource"].add(backend)

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
        self._spawn_processes()


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
    args, rest = parser.parse_known_args()
    index, count = (int(x) for x in args.shard.split("/"))
    names = sorted(n for n in dir(TestDistBackendWithSpawn) if n.startswith("test"))
    mine = set(names[index::count])
    for n in names:
        if n not in mine:
            setattr(TestDistBackendWithSpawn, n, None)  # not a test of this shard

    runner = unittest.TextTestRunner(resultclass=Recording, verbosity=2 if "-v" in rest else 1)
    result = unittest.main(module="__main__", argv=[sys.argv[0]] + rest, testRunner=runner, exit=False).result
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
