"""How often ferry asks a Redis Cluster for its slot map when its requests
keep telling it to (cluster/cluster.c's rounds on demand).

Every MOVED and CLUSTERDOWN a node answers, and every shard's master lost,
asks ferry's topology source for the map again. A cluster that stays down
(a master killed whose replica may not be promoted: every node answers
CLUSTERDOWN to every command) makes every held request ask again at each
retry; without a bound each round (a connection to every node) was followed
by the next the moment it ended, for as long as the cluster stayed down.

  1. The cluster down for a measured window under a pipeline of held
     requests: the rounds ferry starts are bounded (at most a few a second,
     backing off while the map does not change), the asks are counted per
     reason on the stats port, and once the replica is allowed to take over,
     ferry learns it and every held request is answered, without an error.
  2. A replica killed: the map changes (its health), but no slot's master
     did, so no loop is given a new map (counted cluster.meta_changes).

One cluster (3 masters + 1 replica each, node-timeout 1 s) per class; ferry
with refresh_interval_ms 1000 (the default). Stopped by pid.
Run:  python3 -m unittest test_cluster_refresh -v        (about 30 s)
Ferry-only (skipped with FERRY_TEST_DIRECT=1); FERRY_TEST_WORKERS=4 runs its
ferry with 4 event loops.
"""
import socket
import threading
import time
import unittest

import harness
from harness import ClusterTopology, Ferry, resp_read_reply, resp_send, wait_until
from test_stats import stats_json

HELD = 200          # requests pipelined while the cluster is down
WINDOW = 4.0        # seconds the rounds are counted over
# A round every refresh interval (1 s) and the rounds asked for (at least
# 100 ms apart, the gap doubling while the map does not change, up to
# 250 ms): at most ~20 in 4 s. Before the bound: 44 (a round 100 ms after
# each the dead master did not answer, another right after each asked for
# while one ran).
MAX_ROUNDS = 24


def cluster_counts(f):
    return stats_json(f.stats_port)['cluster']


@unittest.skipIf(harness.DIRECT, 'ferry-only')
class ClusterRefreshBoundTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.cluster = ClusterTopology(masters=3, replicas=1, node_timeout_ms=1000)
        try:
            conf = {'cluster': {'nodes': cls.cluster.seeds(), 'refresh_interval_ms': 1000,
                                'timeout_ms': 1000},
                    'upstream': {'hold_timeout_ms': 60000}}
            cls.ferry = Ferry(None, wait='port', conf=conf)
            c = cls.ferry.client(socket_timeout=5)
            try:
                wait_until(lambda: c.set('probe:{a}', 1) and c.set('probe:{b}', 1) and
                           c.set('probe:{c}', 1), timeout=20, interval=0.1,
                           msg='ferry serving the cluster')
            finally:
                c.close()
        except BaseException:
            cls.cluster.stop()
            raise

    @classmethod
    def tearDownClass(cls):
        rc = cls.ferry.stop()
        cls.cluster.stop()
        if rc != 0:
            raise AssertionError('ferry exited %r:\n%s' % (rc, cls.ferry.log()[-3000:]))

    def _cluster_down(self):
        for n in self.cluster.running():
            if 'cluster_state:fail' not in self.cluster.command(n.port, 'CLUSTER', 'INFO'):
                return False
        return True

    def test_1_a_cluster_down_is_asked_a_bounded_number_of_times(self):
        self.cluster.wait_consistent()
        masters = self.cluster.masters()
        victim = masters[0]
        replica = self.cluster.replicas_of(victim)[0]
        # a key served by another master: only CLUSTERDOWN keeps it from it
        key = next(k for k in ('held:{a}', 'held:{b}', 'held:{c}', 'held:{d}')
                   if self.cluster.master_of(self.cluster.keyslot(k)) != victim)
        self.cluster.command(replica, 'CONFIG', 'SET', 'cluster-replica-no-failover', 'yes')
        self.cluster.kill_master(victim)
        wait_until(self._cluster_down, timeout=30, interval=0.1,
                   msg='every node saying cluster_state:fail')

        replies = []
        s = socket.create_connection(('127.0.0.1', self.ferry.port), timeout=90)

        def read_all():
            for _ in range(HELD):
                replies.append(resp_read_reply(s, timeout=90))
        try:
            for i in range(HELD):
                resp_send(s, ['GET', key])
            reader = threading.Thread(target=read_all, daemon=True)
            reader.start()
            # the requests reach the nodes and are refused, then held
            wait_until(lambda: cluster_counts(self.ferry)['clusterdown_held'] >= HELD,
                       timeout=20, interval=0.1, msg='%d requests refused CLUSTERDOWN' % HELD)
            before = cluster_counts(self.ferry)
            t0 = time.monotonic()
            # a measuring window, not a wait for a condition
            time.sleep(WINDOW)
            after = cluster_counts(self.ferry)
            took = time.monotonic() - t0
            rounds = after['rounds'] - before['rounds']
            refused = after['clusterdown_held'] - before['clusterdown_held']
            asked = {k: v for k, v in after.items() if k.startswith('refresh_')}
            print('\ncluster down %.1f s under %d held requests: %d refusals, %d rounds '
                  '(%.1f/s); asked per reason %r' % (took, HELD, refused, rounds,
                                                     rounds / took, asked), flush=True)
            self.assertGreater(refused, HELD, 'the held requests were not retried')
            self.assertLessEqual(rounds, MAX_ROUNDS, after)
            self.assertGreater(after['refresh_clusterdown'], 0, after)
            self.assertGreater(after['refresh_deferred'], 0, after)

            # the replica takes over: ferry learns it, every held GET answered
            self.cluster.command(replica, 'CONFIG', 'SET', 'cluster-replica-no-failover', 'no')
            t1 = time.monotonic()
            new = self.cluster.wait_promoted(victim, timeout=60)
            reader.join(timeout=60)
            print('replica %d promoted, the %d held requests answered %.1f s after it was '
                  'allowed to take over' % (new, len(replies), time.monotonic() - t1),
                  flush=True)
            self.assertFalse(reader.is_alive(), 'held requests unanswered: %d of %d' % (
                len(replies), HELD))
            errors = [r for r in replies if isinstance(r, Exception) or
                      (isinstance(r, bytes) and r.startswith(b'-'))]
            self.assertEqual(errors, [])
            self.assertEqual(len(replies), HELD)
        finally:
            s.close()
            # whatever failed above, the next test finds a cluster that heals
            self.cluster.command(replica, 'CONFIG', 'SET', 'cluster-replica-no-failover', 'no')

    def test_2_a_replica_lost_changes_no_loop_routing(self):
        # Nodes disagree for seconds about replicas (their health follows
        # the replication offset each last heard): such a change of the map
        # is kept for the stats and sent to no loop, so it undoes no MOVED
        # correction and costs no loop a new map.
        self.cluster.wait_consistent()
        victim = next(p for m in self.cluster.masters() for p in self.cluster.replicas_of(m))
        before = cluster_counts(self.ferry)
        applied = self.ferry.log().count('cluster: map of ')
        self.cluster.node_by_port(victim).kill()

        def failed_in_map():
            for sh in cluster_counts(self.ferry)['shards']:
                for r in sh['replicas']:
                    if r['port'] == victim:
                        return r['health'] == 'failed'
            return True   # dropped from the map: changed as well
        wait_until(failed_in_map, timeout=30, interval=0.1,
                   msg='ferry\'s map showing replica %d failed' % victim)
        after = cluster_counts(self.ferry)
        changes = after['changes'] - before['changes']
        meta = after.get('meta_changes', 0) - before.get('meta_changes', 0)
        applied_after = self.ferry.log().count('cluster: map of ')
        print('\nreplica %d killed: %d map change(s), %d of them kept from the loops; maps '
              'applied %d -> %d' % (victim, changes, meta, applied, applied_after), flush=True)
        self.assertGreater(changes, 0, after)
        self.assertEqual(applied_after, applied, 'the loops were given a new map')
        self.assertEqual(meta, changes, after)
        c = self.ferry.client(socket_timeout=10)
        try:
            for k in ('after:{a}', 'after:{b}', 'after:{c}'):
                self.assertTrue(c.set(k, 1))
        finally:
            c.close()


if __name__ == '__main__':
    unittest.main()
