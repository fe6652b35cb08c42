"""100 000 requests held while no master is reachable, all answered once
it is back: every client gets every reply, in its order (a correctness
check, not a timing: scripts/bench HELD=1 measures the time per request).

The outage is the master killed with no replica to promote: in Sentinel
mode (a master without replicas, 3 sentinels) and with a fixed master; the
same master comes back on its port.
"""

import time
import unittest

from harness import Ferry, RedisServer, SentinelTopology, wait_until
from held import HeldClients, check_in_order, held_stats

N = 100000
CLIENTS = 20  # 5 000 each: within client.max_pipeline's default (10 000)
FERRY_CONF = {
    'upstream': {'hold_timeout_ms': 120000, 'connect_timeout_ms': 300},
    'log': {'level': 'info'},
}


class HeldChecks:
    def test_held_requests_answered_in_order(self):
        f = self.ferry
        m = self.master()
        m.kill()
        wait_until(lambda: held_stats(f.stats_port)['upstream_state'] != 'UP', timeout=10,
                   msg='ferry to lose its master')
        hc = HeldClients(f.port, CLIENTS, N)
        self.addCleanup(hc.close)
        hc.send(chunk=50)
        want = N * hc.request_bytes
        wait_until(lambda: held_stats(f.stats_port)['held_bytes'] == want, timeout=60,
                   msg='%d requests held (%d bytes)' % (N, want))
        st = held_stats(f.stats_port)
        self.assertEqual(st['requests_tryagain'], 0, self.diag())
        self.assertGreaterEqual(st['held_bytes_peak'], want)
        m.restart()
        replies = hc.read_all(time.monotonic() + 120)
        self.assertIsNone(check_in_order(replies, hc.counts), self.diag())
        st = held_stats(f.stats_port)
        self.assertEqual(st['held_bytes'], 0)
        self.assertEqual(st['requests_tryagain'], 0)
        c = m.client()
        for i in (0, CLIENTS - 1):
            self.assertEqual(c.llen('held:%04d' % i), hc.counts[i])


class SentinelHeld(HeldChecks, unittest.TestCase):
    MODE = 'sentinel'

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        # The master works through 100 000 writes at once when it is back: a
        # down-after long enough that Sentinel does not take that for a
        # failure (a switch would retry the unconfirmed writes: duplicates).
        cls.topo = SentinelTopology(nreplicas=0, down_after_ms=10000)
        cls.addClassCleanup(cls.topo.stop)

    def setUp(self):
        super().setUp()
        conf = dict(FERRY_CONF, durability={'replicas_ack': 0})
        self.ferry = Ferry(None, sentinel=self.topo, conf=conf)
        self.addCleanup(self.ferry.stop)

    def master(self):
        return self.topo.redis[0]

    def diag(self):
        return '--- ferry log ---\n%s\n%s' % (self.ferry.log()[-6000:], self.topo.logs(1500))


class FixedMasterHeld(HeldChecks, unittest.TestCase):
    MODE = 'fixed master'

    def setUp(self):
        super().setUp()
        self.redis = RedisServer()
        self.addCleanup(self.redis.kill)
        self.ferry = Ferry(self.redis, conf=FERRY_CONF)
        self.addCleanup(self.ferry.stop)

    def master(self):
        return self.redis

    def diag(self):
        return '--- ferry log ---\n%s' % self.ferry.log()[-6000:]


def load_tests(loader, tests, pattern):
    suite = unittest.TestSuite()
    for cls in (SentinelHeld, FixedMasterHeld):
        suite.addTests(loader.loadTestsFromTestCase(cls))
    return suite


if __name__ == '__main__':
    unittest.main()
