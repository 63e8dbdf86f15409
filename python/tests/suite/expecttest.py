"""Stand-in for the `expecttest` package, which Debian does not ship and which torch's
test harness imports: distributed_test.py uses none of its inline-expectation checks."""
import unittest

ACCEPT = False


class TestCase(unittest.TestCase):
    pass
