"""The fallback store in cluster mode, per shard (harness ClusterTopology:
3 masters + 3 replicas, node-timeout 2 s, `cluster-require-full-coverage
no`: with the default `yes` every node answers CLUSTERDOWN for every slot
once one shard has no master, and the other shards could not be served).

  ClusterFallbackTest (one cluster and one ferry for the class, fallback
  after_ms 1000):
    1. Both the master and the replica of one shard killed (kill -9): that
       shard has no master at all. Pushes (RPUSH, LPUSH, ZADD) to keys of
       that shard are acknowledged by the fallback store once the shard has
       been DOWN for fallback.after_ms; keys of the other shards are served
       by Redis meanwhile (written on their masters, read back, nothing in
       the store); LPOP and ZPOPMIN on the shard's keys are served from the
       store, in order; a BLPOP on a key of the shard with no rows is woken
       by a push to it. Writes to the other shards are never held behind
       the failed one. Once the two nodes are restarted, the rows are
       replayed to the shard's master: each once, in order after what Redis
       held before, the store empty; the marker hash of each key lies in
       the key's slot; the replay's rounds waited for the shard's replica
       (durability.replicas_ack 1: WAIT on the restarted master); a push
       after the replay lands after the replayed rows.
    2. A key's slot moved while it had rows: ferry stopped with rows of a
       key of a shard without any master pending, the shard's nodes
       restarted and the key's slot resharded to another shard; the new
       ferry replays the rows to the new owner, after what the key held
       there (moved with the slot), its marker in that slot there.

Run:  python3 -m unittest test_cluster_fallback -v        (about 20 s)
Ferry-only (skipped with FERRY_TEST_DIRECT=1); cluster mode runs one event
loop (workers: 1), so FERRY_TEST_WORKERS is not applied here.
"""
import json
import os
import threading
import time
import unittest
import urllib.request

import harness
from harness import ClusterTopology, Ferry, wait_until
from test_queue_guards import keyslot

AFTER_MS = 1000


def stats(f):
    with urllib.request.urlopen('http://127.0.0.1:%d/stats' % f.stats_port, timeout=5) as r:
        return json.loads(r.read().decode())


def keys_on(owners, port, prefix, n):
    """n keys (prefix:i) whose slots the master on port serves (owners: the
    {slot: master port} map)."""
    out = []
    for i in range(100000):
        k = '%s:%d' % (prefix, i)
        if owners[keyslot(k)] == port:
            out.append(k)
            if len(out) == n:
                return out
    raise AssertionError('no %d keys for %d' % (n, port))


@unittest.skipIf(harness.DIRECT, 'ferry-only')
class ClusterFallbackTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.cluster = ClusterTopology(masters=3, replicas=1, node_timeout_ms=2000,
                                      redis_conf={'cluster-require-full-coverage': 'no'})
        try:
            cls.path = os.path.join(harness._mkdtemp('ferry-cluster-fallback-'), 'fb.db')
            cls.conf = {
                'workers': 1,
                'cluster': {'nodes': cls.cluster.seeds(), 'refresh_interval_ms': 200,
                            'timeout_ms': 1000},
                'upstream': {'hold_timeout_ms': 30000},
                # the replay's rounds wait for the shard's replica (WAIT on
                # its master's link), as every write does
                'durability': {'replicas_ack': 1},
                'fallback': {'path': cls.path, 'after_ms': AFTER_MS}}
            cls.ferry = Ferry(None, wait='port', conf=cls.conf)
        except BaseException:
            cls.cluster.stop()
            raise

    @classmethod
    def tearDownClass(cls):
        cls.ferry.stop()
        cls.cluster.stop()

    def shards_up(self):
        d = stats(self.ferry)
        return sorted(s['shard'] for s in d['cluster']['shards'] if s['up'])

    def test_1_a_shard_without_any_master_is_served_by_the_store(self):
        owners = self.cluster.wait_consistent()
        wait_until(lambda: len(self.shards_up()) == 3, timeout=20, interval=0.1,
                   msg='every shard UP in ferry')
        victim = owners[0]
        others = sorted(set(owners.values()) - {victim})
        replica = wait_until(lambda: (self.cluster.replicas_of(victim) or [None])[0],
                             timeout=20, interval=0.1, msg='a replica of %d known' % victim)
        q1, q2, q3, qz, qb = keys_on(owners, victim, 'fbq', 5)
        other_keys = [keys_on(owners, p, 'fbo', 1)[0] for p in others]
        c = self.ferry.client(socket_timeout=30)
        self.addCleanup(c.close)
        self.assertEqual(c.rpush(q1, 'r0'), 1)  # in Redis before the outage

        # the shard loses every node: no replica can be promoted
        self.cluster.node_by_port(replica).kill()
        self.cluster.kill_master(victim)
        t0 = time.monotonic()
        acked = [('rpush', 'r%d' % i) for i in range(1, 6)]
        for i in range(1, 6):
            self.assertEqual(c.rpush(q1, 'r%d' % i), i, 'the store answers its own part')
        t_first = time.monotonic() - t0
        self.assertGreaterEqual(t_first, AFTER_MS / 1000.0 * 0.9,
                                'taken by the store only after fallback.after_ms')
        print('\n  first push acknowledged by the store %.2f s after the kill' % t_first,
              flush=True)
        self.assertEqual(c.lpush(q2, 'a', 'b'), 2)
        self.assertEqual(c.zadd(qz, {'m1': 1, 'm2': 2, 'm3': 3}), 3)
        self.assertEqual(c.rpush(q3, 'x1', 'x2', 'x3'), 3)
        self.assertGreaterEqual(stats(self.ferry)['fallback']['fallback_pending'], 13)
        with urllib.request.urlopen('http://127.0.0.1:%d/healthz' % self.ferry.stats_port,
                                    timeout=5) as r:
            body = r.read().decode()
        self.assertRegex(body, r'^OK: 2 of 3 shard\(s\) UP; DEGRADED')
        self.assertRegex(body, r'\nshard 0 \(master 127\.0\.0\.1:%d, \d+ slot\(s\)\): DOWN '
                         % victim)
        self.assertRegex(body, r'\nfallback store: taking the queue writes of the shard\(s\) '
                               r'DOWN, 1[3-9] row\(s\) pending\n')

        # the other shards are served by Redis meanwhile, not held
        for k, p in zip(other_keys, others):
            t = time.monotonic()
            self.assertEqual(c.rpush(k, 'o1', 'o2'), 2)
            self.assertEqual(c.lpop(k), 'o1')
            self.assertLess(time.monotonic() - t, 15.0, 'shard %d held' % p)
            direct = self.cluster.node_by_port(p).client()
            self.assertEqual(direct.lrange(k, 0, -1), ['o2'], 'written on its master')
            direct.close()
        self.assertEqual(len(self.shards_up()), 2)

        # pops on the shard's keys come from the store, in order
        self.assertEqual(c.lpop(q3), 'x1')
        self.assertEqual(c.rpop(q3), 'x3')
        self.assertEqual(c.zpopmin(qz), [('m1', 1.0)])
        # a blocked pop on a key with no rows is woken by a push to it
        got = {}

        def blocked():
            b = self.ferry.client(socket_timeout=30)
            try:
                got['v'] = b.blpop([qb], timeout=20)
            finally:
                b.close()
        th = threading.Thread(target=blocked)
        th.start()
        self.addCleanup(th.join, 30)
        wait_until(lambda: [s for s in stats(self.ferry)['cluster']['shards']
                            if s['shard'] == 0][0]['held'] >= 1,
                   timeout=10, interval=0.05, msg='the BLPOP held for the shard')
        c2 = self.ferry.client(socket_timeout=30)
        self.addCleanup(c2.close)
        self.assertEqual(c2.rpush(qb, 'woke'), 1)
        th.join(20)
        self.assertEqual(got.get('v'), (qb, 'woke'))

        # the shard's nodes come back: the rows are replayed to its master
        self.cluster.node_by_port(victim).start()
        self.cluster.node_by_port(replica).start()
        self.cluster.wait_consistent(timeout=60)
        wait_until(lambda: len(self.shards_up()) == 3, timeout=30, interval=0.1,
                   msg='every shard UP in ferry again')
        wait_until(lambda: stats(self.ferry)['fallback']['fallback_pending'] == 0, timeout=30,
                   interval=0.1, msg='the store replayed')
        master = self.cluster.wait_consistent()[keyslot(q1)]
        self.assertEqual(master, victim, 'the restarted master serves its slots again')
        d = self.cluster.node_by_port(master).client()
        self.addCleanup(d.close)
        self.assertEqual(d.lrange(q1, 0, -1), ['r0'] + [v for _, v in acked],
                         'each row once, in order, after what Redis held')
        self.assertEqual(d.lrange(q2, 0, -1), ['b', 'a'])
        self.assertEqual(d.lrange(q3, 0, -1), ['x2'])
        self.assertEqual(d.zrange(qz, 0, -1, withscores=True), [('m2', 2.0), ('m3', 3.0)])
        self.assertEqual(d.llen(qb), 0, 'the row the blocked pop took is not replayed')
        # the marker hashes lie in their keys' slots
        markers = [k for k in d.scan_iter(match='ferry:fallback:*')]
        self.assertTrue(markers, 'a marker hash on the shard\'s master')
        marked = {}
        for m in markers:
            for field in d.hkeys(m):
                marked[field] = m
        for k in (q1, q2, q3, qz):
            self.assertIn(k, marked)
            self.assertEqual(keyslot(marked[k]), keyslot(k), (k, marked[k]))
        # the restarted master ran the replay's WAIT for its replica (no
        # client write reached it since its restart)
        self.assertGreater(d.info('commandstats').get('cmdstat_wait', {}).get('calls', 0), 0)
        # new writes land after the replayed rows
        self.assertEqual(c.rpush(q1, 'after'), 7)
        self.assertEqual(d.lrange(q1, -2, -1), ['r5', 'after'])
        st = stats(self.ferry)['fallback']
        self.assertEqual(st['fallback_replay_errors'], 0,
                         [l for l in self.ferry.log().splitlines() if 'replay' in l])

    def test_3_push_unanswered_by_a_frozen_shard_is_not_pushed_twice(self):
        """A push sent with its receipt to a shard's master that then froze
        with its replica (SIGSTOP) is taken by the store past
        fallback.after_ms; the master, thawed, runs it too. The replay finds
        its receipt in the key's slot and pushes nothing: each item once
        (before: twice)."""
        owners = self.cluster.wait_consistent()
        wait_until(lambda: len(self.shards_up()) == 3, timeout=20, interval=0.1,
                   msg='every shard UP in ferry')
        victim = owners[0]
        replica = wait_until(lambda: (self.cluster.replicas_of(victim) or [None])[0],
                             timeout=20, interval=0.1, msg='a replica of %d known' % victim)
        q = keys_on(owners, victim, 'fbh', 1)[0]
        c = self.ferry.client(socket_timeout=30)
        self.addCleanup(c.close)
        self.assertEqual(c.rpush(q, 'before'), 1)
        nodes = [self.cluster.node_by_port(victim), self.cluster.node_by_port(replica)]
        for n in nodes:
            n.sigstop()
        self.addCleanup(lambda: [n.sigcont() for n in nodes])
        self.assertEqual(c.rpush(q, 'h1', 'h2'), 2)
        self.assertEqual(stats(self.ferry)['fallback']['fallback_pending'], 2)
        for n in nodes:
            n.sigcont()
        self.cluster.wait_consistent(timeout=60)
        wait_until(lambda: len(self.shards_up()) == 3, timeout=30, interval=0.1,
                   msg='every shard UP in ferry again')
        wait_until(lambda: stats(self.ferry)['fallback']['fallback_pending'] == 0, timeout=30,
                   interval=0.1, msg='the store replayed')
        master = self.cluster.wait_consistent()[keyslot(q)]
        d = self.cluster.node_by_port(master).client()
        self.addCleanup(d.close)
        self.assertEqual(d.lrange(q, 0, -1), ['before', 'h1', 'h2'], 'each item once')
        self.assertEqual([k for k in d.scan_iter(match='ferry:rcpt:*:' + q)], [],
                         'no receipt of its pushes left')

    def test_2_rows_of_a_key_whose_slot_moved_go_to_its_new_owner(self):
        owners = self.cluster.wait_consistent()
        wait_until(lambda: len(self.shards_up()) == 3, timeout=20, interval=0.1,
                   msg='every shard UP in ferry')
        victim = owners[0]
        target = min(set(owners.values()) - {victim})
        replica = wait_until(lambda: (self.cluster.replicas_of(victim) or [None])[0],
                             timeout=20, interval=0.1, msg='a replica of %d known' % victim)
        # the lowest slot of the shard: the first one a reshard moves
        low = min(sl for sl, p in owners.items() if p == victim)
        key = next('mv:%d' % i for i in range(1000000) if keyslot('mv:%d' % i) == low)
        c = self.ferry.client(socket_timeout=30)
        self.assertEqual(c.rpush(key, 'm0'), 1)
        self.cluster.node_by_port(replica).kill()
        self.cluster.kill_master(victim)
        for i in range(1, 4):
            self.assertEqual(c.rpush(key, 'm%d' % i), i, 'the store answers its own part')
        c.close()
        # ferry stops with the rows pending; the shard comes back and the
        # key's slot moves to another shard before ferry starts again
        self.ferry.stop()
        self.cluster.node_by_port(victim).start()
        self.cluster.node_by_port(replica).start()
        self.cluster.wait_consistent(timeout=60)
        owners = self.cluster.reshard(victim, target, 1)
        self.assertEqual(owners[low], target, 'the reshard moved the key\'s slot')
        type(self).ferry = Ferry(None, wait='port', conf=self.conf)
        wait_until(lambda: stats(self.ferry)['fallback']['fallback_pending'] == 0, timeout=30,
                   interval=0.1, msg='the store replayed')
        d = self.cluster.node_by_port(target).client()
        self.addCleanup(d.close)
        self.assertEqual(d.lrange(key, 0, -1), ['m0', 'm1', 'm2', 'm3'],
                         'replayed to the new owner, after what it held')
        markers = [m for m in d.scan_iter(match='ferry:fallback:*') if d.hexists(m, key)]
        self.assertEqual(len(markers), 1, markers)
        self.assertEqual(keyslot(markers[0]), low)
        v = self.cluster.node_by_port(victim).client()
        self.addCleanup(v.close)
        self.assertFalse([m for m in v.scan_iter(match='ferry:fallback:*')
                          if v.hexists(m, key)], 'no marker for the key on its old owner')


if __name__ == '__main__':
    unittest.main()
