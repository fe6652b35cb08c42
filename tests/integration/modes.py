"""The two ways ferry runs, as class fixtures, so one set of client checks
runs in both.

    class Checks:                      # the test methods; use self.ferry,
        def test_x(self): ...          # self.master() for direct reads
    class SentinelX(SentinelMode, Checks, unittest.TestCase): pass
    class FixedMasterX(FixedMasterMode, Checks, unittest.TestCase): pass
    load_tests = sentinel_first

Each class starts its Redis (or Sentinel topology) once in setUpClass and
stops it after its last test; each test gets its own ferry (quick to start),
so state a failed test leaves inside ferry cannot fail the next one. Tests
keep apart in Redis by key names (key_prefix()). Sentinel mode is ferry's
product, so its classes run first.
"""

import unittest

from harness import Ferry, RedisServer, SentinelTopology


class FixedMasterMode:
    """ferry with redis.address: one RedisServer, no Sentinel."""

    MODE = 'fixed master'

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.redis = RedisServer()
        cls.addClassCleanup(cls.redis.stop)

    def setUp(self):
        super().setUp()
        self.ferry = Ferry(self.redis)
        self.addCleanup(self.ferry.stop)

    @classmethod
    def master(cls):
        """The RedisServer ferry writes to."""
        return cls.redis

    def diag(self):
        return '--- ferry log ---\n%s' % self.ferry.log()[-6000:]


class SentinelMode:
    """ferry in Sentinel mode (replicas_ack defaults to 1) in front of a
    SentinelTopology: 1 master, 2 replicas, 3 sentinels."""

    MODE = 'sentinel'

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.topo = SentinelTopology()
        cls.addClassCleanup(cls.topo.stop)

    def setUp(self):
        super().setUp()
        self.ferry = Ferry(None, sentinel=self.topo)
        self.addCleanup(self.ferry.stop)

    @classmethod
    def master(cls):
        """The RedisServer the sentinels announce."""
        return cls.topo.master()

    def diag(self):
        return '--- ferry log ---\n%s\n%s' % (self.ferry.log()[-6000:], self.topo.logs(1500))


def key_prefix(test):
    """A key/channel prefix unique to one test method of one class."""
    return '%s.%s' % (type(test).__name__, test._testMethodName)


def sentinel_first(loader, tests, pattern):
    """A load_tests hook: the module's test classes, those in Sentinel mode
    first, otherwise in the loader's order."""
    suites = list(tests)

    def in_sentinel_mode(suite):
        for t in suite:
            return isinstance(t, SentinelMode)
        return False
    suites.sort(key=lambda s: not in_sentinel_mode(s))
    return unittest.TestSuite(suites)
