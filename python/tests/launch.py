"""Runs a launched program (torchrun, chorusrun, a library's own launcher) in a network namespace
of its own whose only interface is loopback: the programs meet on torch's TCPStore, which
listens on every address. Shared by the tests that launch whole programs (test_backend.py,
test_fabric.py, test_accelerate.py)."""
import os
import subprocess
import sys
import unittest

TIMEOUT = 300  # seconds for one launched program


def beside(name):
    """A file of this directory (the scripts the tests launch)."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), name)


class Namespace:
    """A network namespace with loopback up, for the life of a test class."""

    def __init__(self, tag):
        self.name = f"chorus-{tag}-{os.getpid()}"
        made = subprocess.run(["ip", "netns", "add", self.name], capture_output=True, text=True)
        if made.returncode != 0:
            raise unittest.SkipTest(f"cannot make a network namespace (needs root and iproute2): {made.stderr}")
        subprocess.run(["ip", "-n", self.name, "link", "set", "lo", "up"], check=True)

    def remove(self):
        subprocess.run(["ip", "netns", "del", self.name], capture_output=True)

    def run(self, command, env=None, timeout=TIMEOUT, cwd=None):
        """Runs `command` inside; returns the CompletedProcess (stdout and stderr captured)."""
        return subprocess.run(["ip", "netns", "exec", self.name] + command, capture_output=True, text=True,
                              env=env, timeout=timeout, cwd=cwd)


class InNamespace(unittest.TestCase):
    """A test class whose launched programs run in a namespace of its own (`self.netns`)."""

    tag = "launch"

    @classmethod
    def setUpClass(cls):
        cls.netns = Namespace(cls.tag)

    @classmethod
    def tearDownClass(cls):
        cls.netns.remove()


def torchrun(nproc):
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc)]


def chorusrun(nproc):
    return [os.environ["CHORUSRUN"], "--standalone", "--nproc-per-node", str(nproc), sys.executable]
