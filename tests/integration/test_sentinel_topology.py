"""Self-test of harness.SentinelTopology against real redis-server and
redis-sentinel processes (no ferry needed): setup, planned failover, kill -9
with restart of the old master, SIGSTOP/SIGCONT, sentinels down and back.

Run: python3 -m unittest test_sentinel_topology -v   (about 1 minute)
"""
import os
import tempfile
import time
import unittest

from harness import Ferry, SentinelTopology, wait_until


class SentinelTopologyTest(unittest.TestCase):
    def test_topology_lifecycle(self):
        t0 = time.monotonic()
        topo = SentinelTopology(replica_conf={'appendfsync': 'everysec'})
        self.addCleanup(topo.stop)
        self.assertLess(time.monotonic() - t0, 25)
        m0, r1, r2 = topo.redis
        # the initial master, as every sentinel announces it
        self.assertEqual(topo.master_port(), m0.port)
        self.assertEqual(set(topo.sentinel_views().values()), {m0.port})
        self.assertEqual(topo.sentinel_addresses(),
                         ['127.0.0.1:%d' % s.port for s in topo.sentinels])
        self.assertEqual(m0.role(), 'master')
        self.assertEqual([r1.role(), r2.role()], ['slave', 'slave'])
        self.assertEqual(m0.client().config_get('appendfsync')['appendfsync'], 'always')
        self.assertEqual(r1.client().config_get('appendfsync')['appendfsync'], 'everysec')
        self.assertEqual(r1.client().config_get('appendonly')['appendonly'], 'yes')
        m0.client().lpush('q', 'a')
        wait_until(lambda: r1.client().lrange('q', 0, -1) == ['a'], timeout=5)

        # planned failover
        self.assertEqual(topo.failover(), 'OK')
        p1 = topo.wait_failover(m0.port, timeout=30)
        self.assertIn(p1, (r1.port, r2.port))
        self.assertEqual(topo.redis_by_port(p1).role(), 'master')
        self.assertEqual(topo.wait_stable(timeout=40), p1)
        self.assertEqual(m0.role(), 'slave')

        # kill -9 of the new master, restart it: sentinel demotes it
        n1 = topo.redis_by_port(p1)
        n1.kill()
        self.assertFalse(n1.running())
        p2 = topo.wait_failover(p1, timeout=30)
        self.assertNotEqual(p2, p1)
        topo.restart_redis(topo.redis.index(n1))
        self.assertEqual(n1.port, p1)
        self.assertEqual(n1.client().lrange('q', 0, -1), ['a'])   # AOF reloaded
        wait_until(lambda: n1.role() == 'slave', timeout=40, interval=0.2,
                   msg='restarted old master demoted')
        # Sentinel may fail over once more while the node rejoins (seen on a
        # loaded machine); what matters is one stable master again.
        p2 = topo.wait_stable(timeout=40)
        self.assertIn(p2, [r.port for r in topo.redis if r.running()])

        # SIGSTOP / SIGCONT
        n2 = topo.redis_by_port(p2)
        n2.sigstop()
        try:
            time.sleep(2.5)
        finally:
            n2.sigcont()
        p3 = topo.wait_stable(timeout=45)
        self.assertTrue(n2.running())
        self.assertEqual(topo.redis_by_port(p3).client().lrange('q', 0, -1), ['a'])

        # every sentinel down, then back with the config each rewrote
        for s in topo.sentinels:
            s.kill()
        self.assertEqual(topo.sentinel_views(), {})
        with self.assertRaises(AssertionError):
            topo.master_port()
        for s in topo.sentinels:
            s.start()
        self.assertEqual(topo.master_port(), p3)

        topo.stop()
        self.assertFalse(any(r.running() for r in topo.redis))
        self.assertFalse(any(s.running() for s in topo.sentinels))

    def test_ferry_sentinel_config(self):
        """Ferry(None, sentinel=...) writes a sentinel: section, no redis.address."""
        class FakeTopo:
            master_name = 'mq'

            def sentinel_addresses(self):
                return ['127.0.0.1:1', '127.0.0.1:2']
        f = Ferry.__new__(Ferry)
        f.redis, f.sentinel, f.extra_yaml = None, FakeTopo(), ''
        f.user_conf = {'sentinel': {'timeout_ms': 700}, 'upstream': {'hold_timeout_ms': 1500}}
        f.config_path = tempfile.mktemp(prefix='ferry-test-', suffix='.yml')
        f.log_path = '/dev/null'
        self.addCleanup(os.unlink, f.config_path)
        f._write_config()
        self.assertNotIn('redis', f.conf)
        self.assertEqual(f.conf['sentinel'], {'master': 'mq',
                                              'addresses': ['127.0.0.1:1', '127.0.0.1:2'],
                                              'resolve_interval_ms': 200, 'timeout_ms': 700})
        self.assertEqual(f.conf['upstream'], {'hold_timeout_ms': 1500})
        with open(f.config_path) as fh:
            text = fh.read()
        self.assertIn('sentinel:\n  master: "mq"\n  addresses:\n    - "127.0.0.1:1"\n', text)
        # a dict works as the section itself
        f.sentinel, f.user_conf = {'master': 'x', 'addresses': ['127.0.0.1:3']}, {}
        f._write_config()
        self.assertEqual(f.conf['sentinel'], {'master': 'x', 'addresses': ['127.0.0.1:3'],
                                              'resolve_interval_ms': 200, 'timeout_ms': 500})


if __name__ == '__main__':
    unittest.main()
