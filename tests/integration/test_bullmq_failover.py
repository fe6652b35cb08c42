"""BullMQ through ferry in Sentinel mode across a kill -9 of the master: the
same run and checks as test_cluster_bullmq_failover (node/bullmq_failover.js:
Queue.add and addBulk, two Workers, a QueueEvents, prefix {bull}), on 1
master + 2 replicas watched by 3 sentinels, ferry with its defaults
(durability.replicas_ack 1): 0 client-visible errors, every acknowledged job
processed exactly once, the completed set in Redis holds each once, nothing
left waiting or active.

Run:  python3 -m unittest test_bullmq_failover -v     (about 30 s)
Ferry-only (skipped with FERRY_TEST_DIRECT=1); FERRY_TEST_WORKERS=4 runs
its ferry with 4 event loops.
"""
import unittest

import harness
from failover_load import current_master
from harness import Ferry, SentinelTopology
from test_cluster_bullmq_failover import BullMQThroughAKill


@unittest.skipIf(harness.DIRECT, 'ferry-only: needs ferry in sentinel mode')
class SentinelBullMQFailoverTest(BullMQThroughAKill, unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.topo = SentinelTopology()
        try:
            cls.ferry = Ferry(None, sentinel=cls.topo,
                              conf={'upstream': {'hold_timeout_ms': 30000}})
        except BaseException:
            cls.topo.stop()
            raise

    @classmethod
    def tearDownClass(cls):
        rc = cls.ferry.stop()
        cls.topo.stop()
        if rc != 0:
            raise AssertionError('ferry exited %r:\n%s' % (rc, cls.ferry.log()[-3000:]))

    def test_kill_9_of_the_master_every_job_once(self):
        old = current_master(self.topo)

        def kill():
            old.kill()

            def wait_new():
                new = self.topo.wait_failover(old.port, timeout=30)
                return self.topo.redis_by_port(new), 'sentinel: %d promoted' % new
            return wait_new
        self.bullmq_through_a_kill(kill, 'sentinel mode')


if __name__ == '__main__':
    unittest.main()
