"""Durability on every node of a Redis Cluster behind ferry (harness
ClusterTopology: 3 masters + 3 replicas, node-timeout 2 s, every node
started with `appendonly no` and `appendfsync everysec`):

  ClusterDurabilityTest (one cluster and one ferry for the class, in order):
    1. Once ferry follows the map, every master AND every replica reports
       aof_enabled:1 in INFO persistence and appendonly yes / appendfsync
       always in CONFIG GET; /stats lists each replica of the map under
       durability.replicas, enforced, and counts them in replicas_known and
       replicas_enforced.
    2. A replica restarted with `appendonly no` in its config file is
       enforced again (CONFIG GET, INFO persistence, /stats).
    3. kill -9 of a master: its replica, promoted by the cluster, already
       runs with AOF on and appendfsync always at the moment it is seen
       master, and a write through ferry to a key of that shard is answered.

Run:  python3 -m unittest test_cluster_durability -v        (about 40 s)
Ferry-only (skipped with FERRY_TEST_DIRECT=1).
"""
import json
import unittest
import urllib.request

import redis

import harness
from harness import ClusterTopology, Ferry, wait_until
from test_queue_guards import keyslot

NOT_DURABLE = {'appendonly': 'no', 'appendfsync': 'everysec'}


def stats(f):
    with urllib.request.urlopen('http://127.0.0.1:%d/stats' % f.stats_port, timeout=5) as r:
        return json.loads(r.read().decode())


def key_for(slot, prefix='d'):
    """A key whose slot is slot."""
    return next('%s:%d' % (prefix, i) for i in range(1000000)
                if keyslot('%s:%d' % (prefix, i)) == slot)


def durable(cluster, port):
    """True when the node on port runs AOF on with appendfsync always."""
    info = cluster.command(port, 'INFO', 'persistence')
    if isinstance(info, dict):
        info = ''.join('%s:%s\n' % kv for kv in info.items())
    if 'aof_enabled:1\n' not in info.replace('\r', ''):
        return False
    return (config_get(cluster, port, 'appendonly') == 'yes'
            and config_get(cluster, port, 'appendfsync') == 'always')


def config_get(cluster, port, name):
    r = cluster.command(port, 'CONFIG', 'GET', name)
    return (r if isinstance(r, dict) else dict(zip(r[::2], r[1::2]))).get(name)


@unittest.skipIf(harness.DIRECT, 'ferry-only')
class ClusterDurabilityTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.cluster = ClusterTopology(masters=3, replicas=1, node_timeout_ms=2000,
                                      redis_conf=NOT_DURABLE)
        try:
            for n in cls.cluster.nodes:   # the cluster starts without durability
                assert not durable(cls.cluster, n.port), n.port
            # a node's view names every replica's master only after gossip
            wait_until(lambda: sum(len(cls.cluster.replicas_of(m))
                                   for m in cls.cluster.masters()) == 3,
                       timeout=30, interval=0.1, msg='every replica in the cluster view')
            cls.ferry = Ferry(None, wait='port', conf={
                'cluster': {'nodes': [cls.cluster.seeds()[0]], 'refresh_interval_ms': 500,
                            'timeout_ms': 1000},
                'durability': {'enforce_interval_ms': 1000},
                'upstream': {'hold_timeout_ms': 30000}})
        except BaseException:
            cls.cluster.stop()
            raise

    @classmethod
    def tearDownClass(cls):
        cls.ferry.stop()
        cls.cluster.stop()

    def replica_rows(self):
        """{port: row} of /stats durability.replicas."""
        d = stats(self.ferry)['durability']
        return {int(r['addr'].rsplit(':', 1)[1]): r for r in d['replicas']}

    def wait_enforced(self, ports, timeout=20):
        def ok():
            rows = self.replica_rows()
            return all(p in rows and rows[p]['enforced'] and rows[p]['last_error'] == ''
                       for p in ports) and all(durable(self.cluster, p) for p in ports)
        wait_until(ok, timeout=timeout, interval=0.1,
                   msg='replicas %r enforced (%r)' % (ports, self.replica_rows()))

    def test_1_every_master_and_replica_durable(self):
        masters = self.cluster.masters()
        replicas = sorted(p for m in masters for p in self.cluster.replicas_of(m))
        self.assertEqual(len(masters), 3)
        self.assertEqual(len(replicas), 3)
        wait_until(lambda: all(durable(self.cluster, p) for p in masters), timeout=20,
                   interval=0.1, msg='every master durable')
        self.wait_enforced(replicas)
        d = stats(self.ferry)['durability']
        self.assertEqual(sorted(self.replica_rows()), replicas)
        self.assertEqual(d['replicas_known'], 3)
        self.assertEqual(d['replicas_enforced'], 3)
        for r in d['replicas']:
            self.assertGreater(r['enforced_since'], 0)

    def test_2_replica_restarted_without_aof_enforced_again(self):
        replica = self.cluster.replicas_of(self.cluster.masters()[0])[0]
        self.wait_enforced([replica])
        node = self.cluster.node_by_port(replica)
        node.kill()
        node.start(write_conf=True)   # its config file says appendonly no again
        self.assertEqual(node.port, replica)
        # it came back as it was configured, then ferry enforced it again
        self.wait_enforced([replica], timeout=30)
        self.cluster.wait_consistent()

    def test_3_promoted_replica_was_already_durable(self):
        self.cluster.wait_consistent()
        master = self.cluster.masters()[1]
        replica = self.cluster.replicas_of(master)[0]
        self.wait_enforced([replica])
        slot = next(s for s, p in self.cluster.wait_consistent().items() if p == master)
        key = key_for(slot)
        c = redis.Redis(port=self.ferry.port, socket_timeout=40, decode_responses=True)
        self.assertEqual(c.set(key, 'before'), True)
        self.cluster.kill_master(master)
        # the first moment it is seen master, it is durable already
        wait_until(lambda: self.cluster.node_by_port(replica).role() == 'master',
                   timeout=30, interval=0.05, msg='replica promoted')
        self.assertTrue(durable(self.cluster, replica))
        self.assertEqual(self.cluster.wait_promoted(master), replica)
        self.assertEqual(c.get(key), 'before')
        self.assertEqual(c.set(key, 'after'), True)
        self.assertEqual(self.cluster.command(replica, 'GET', key), 'after')


if __name__ == '__main__':
    unittest.main()
