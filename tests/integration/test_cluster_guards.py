"""Queue guards in cluster mode (harness ClusterTopology: 3 masters + 3
replicas). A bounded queue (queues: max_length) behaves as in Sentinel
mode (test_queue_guards), whichever shard its key lives on: the guard
script touches only the pushed key, so it runs on that key's slot master.

  ClusterBoundedQueueTest (one cluster and one ferry for the class):
    1. On every shard: a push past the bound gets the exact -QFULL text and
       applies nothing (checked on the node itself); LPUSHX/RPUSHX, a push
       of several values, WRONGTYPE and the arity error as in Sentinel mode;
       a key no entry covers is not bounded; a {hash tag} key is bounded
       on its tag's shard.
    2. Eight producers on keys spread over the three shards: each list
       ends with exactly its bound, every acknowledged push is in it, every
       refusal is -QFULL and its item absent; /stats refused_full counts them.
    3. SCRIPT FLUSH on one master: the next guarded push there still works
       (NOSCRIPT answered by EVAL, never surfaced).
    4. on_full: block: a push to a full list on one shard is held until a
       consumer pops, and lands in order; a push on another shard flows.
  ClusterBoundedQueueFailoverTest (a cluster of its own: it is harmed):
    kill -9 of a bounded key's master while four producers push to it:
    held, then applied on the promoted replica (its links are sent SCRIPT
    LOAD first); only -QFULL refusals, no acknowledged push lost, the list
    ends at exactly its bound.
  ClusterGuardsConfigTest: `ferry -t` with cluster: accepts max_length and
    on_full, and an entry with processing (leases: test_cluster_lease).

Run:  python3 -m unittest test_cluster_guards -v        (about 45 s)
"""
import json
import os
import threading
import time
import unittest
import urllib.request

import redis

import harness
from harness import ClusterTopology, Ferry, wait_until
from test_queue_guards import keyslot, queues_yaml

BOUND = 300


def stats(f):
    with urllib.request.urlopen('http://127.0.0.1:%d/stats' % f.stats_port, timeout=5) as r:
        return json.loads(r.read().decode())


def qfull(key, n, m):
    return 'QFULL ferry: queue %s holds %d items (max_length %d)' % (key, n, m)


@unittest.skipIf(harness.DIRECT, 'ferry-only')
class ClusterBoundedQueueTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.cluster = ClusterTopology(masters=3, replicas=1, node_timeout_ms=2000)
        try:
            cls.owners = cls.cluster.wait_consistent()
            entries = [{'keys': 'cg:*', 'max_length': 5},
                       {'keys': 'cp:*', 'max_length': BOUND},
                       {'keys': 'cb:*', 'max_length': 2, 'on_full': 'block'}]
            cls.ferry = Ferry(None, wait='port', conf={
                'cluster': {'nodes': [cls.cluster.seeds()[0]], 'timeout_ms': 1000},
                'upstream': {'hold_timeout_ms': 20000}}, extra_yaml=queues_yaml(entries))
        except BaseException:
            cls.cluster.stop()
            raise

    @classmethod
    def tearDownClass(cls):
        cls.ferry.stop()
        cls.cluster.stop()

    def setUp(self):
        wait_until(lambda: (lambda d: d if len(d['cluster']['shards']) == 3 and all(
            sh['up'] for sh in d['cluster']['shards']) else None)(stats(self.ferry)),
            timeout=20, interval=0.1, msg='every shard UP in ferry')

    def masters(self):
        return sorted(set(self.owners.values()))

    def key_on(self, port, prefix):
        """A key of prefix whose slot port's master serves."""
        return next('%s:%d' % (prefix, i) for i in range(1000000)
                    if self.owners[keyslot('%s:%d' % (prefix, i))] == port)

    def node(self, port):
        return self.cluster.node_by_port(port).client()

    def test_1_refuse_on_every_shard(self):
        c = self.ferry.client(socket_timeout=10)
        for port in self.masters():
            key = self.key_on(port, 'cg:q')
            m = self.node(port)
            self.assertEqual(c.lpush(key, 'a', 'b', 'c', 'd'), 4)
            with self.assertRaises(redis.ResponseError) as cm:
                c.lpush(key, 'e', 'f')
            self.assertEqual(str(cm.exception), qfull(key, 4, 5))
            self.assertEqual(m.lrange(key, 0, -1), ['d', 'c', 'b', 'a'])
            self.assertEqual(c.rpushx(key, 'e'), 5)
            with self.assertRaises(redis.ResponseError) as cm:
                c.rpushx(key, 'f')
            self.assertEqual(str(cm.exception), qfull(key, 5, 5))
            with self.assertRaises(redis.ResponseError) as cm:
                c.rpush(key, 'x', 'y', 'z', 'w', 'v', 'u')
            self.assertEqual(m.lrange(key, 0, -1), ['d', 'c', 'b', 'a', 'e'])
            self.assertEqual(c.lpushx(self.key_on(port, 'cg:none'), *range(9)), 0)
            free = self.key_on(port, 'free')
            self.assertEqual(c.rpush(free, *range(20)), 20)
            s = self.key_on(port, 'cg:str')
            c.set(s, 'x')
            with self.assertRaises(redis.ResponseError) as cm:
                c.lpush(s, 'v')
            self.assertTrue(str(cm.exception).startswith('WRONGTYPE'), str(cm.exception))
            with self.assertRaises(redis.ResponseError) as cm:
                c.execute_command('LPUSH', key)
            self.assertIn('wrong number of arguments', str(cm.exception))
            # the guard ran as a script on this master, the slot's owner
            calls = m.info('commandstats')
            self.assertGreater(calls.get('cmdstat_evalsha', {}).get('calls', 0), 0, port)
        # a {hash tag} key: bounded on its tag's shard
        tagged = 'cg:{t7}:jobs'
        port = self.owners[keyslot(tagged)]
        self.assertEqual(c.rpush(tagged, *range(5)), 5)
        with self.assertRaises(redis.ResponseError) as cm:
            c.rpush(tagged, 'x')
        self.assertEqual(str(cm.exception), qfull(tagged, 5, 5))
        self.assertEqual(self.node(port).llen(tagged), 5)

    def test_2_eight_producers_over_three_shards(self):
        keys = [self.key_on(port, 'cp:jobs') for port in self.masters()]
        acked = {k: [] for k in keys}
        refused, other, over = [], [], []
        lock = threading.Lock()

        def producer(n):
            c = self.ferry.client(socket_timeout=30)
            refusals = {k: 0 for k in keys}
            i = 0
            while min(refusals.values()) < 5 and i < 3 * BOUND:  # bounded
                key = keys[i % len(keys)]
                item = 'p%d-%d' % (n, i)
                i += 1
                if refusals[key] >= 5:
                    continue
                try:
                    length = c.rpush(key, item)
                    with lock:
                        acked[key].append(item)
                        if length > BOUND:
                            over.append(length)
                except redis.ResponseError as e:
                    with lock:
                        if str(e) == qfull(key, BOUND, BOUND):
                            refused.append((key, item))
                        else:
                            other.append(str(e))
                    refusals[key] += 1

        before = stats(self.ferry)['queues']['queues'][1]['refused_full']
        threads = [threading.Thread(target=producer, args=(n,)) for n in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        self.assertFalse(any(t.is_alive() for t in threads), 'producers hung')
        self.assertEqual(other, [])
        self.assertEqual(over, [])
        for key in keys:
            items = self.node(self.owners[keyslot(key)]).lrange(key, 0, -1)
            self.assertEqual(len(items), BOUND, key)
            self.assertEqual(sorted(items), sorted(acked[key]), key)
        self.assertEqual(len(refused), 8 * 5 * len(keys))
        for key, item in refused:
            self.assertNotIn(item, acked[key])
        q = stats(self.ferry)['queues']['queues'][1]
        self.assertEqual(q['refused_full'] - before, len(refused), q)

    def test_3_script_flushed_on_one_master(self):
        c = self.ferry.client(socket_timeout=10)
        port = self.masters()[1]
        key = self.key_on(port, 'cg:flush')
        self.assertEqual(c.rpush(key, 'a'), 1)
        self.node(port).script_flush()
        self.assertEqual(c.rpush(key, 'b', 'c'), 3)
        self.assertEqual(c.rpush(key, 'd', 'e'), 5)
        with self.assertRaises(redis.ResponseError) as cm:
            c.rpush(key, 'f')
        self.assertEqual(str(cm.exception), qfull(key, 5, 5))
        self.assertEqual(self.node(port).lrange(key, 0, -1), ['a', 'b', 'c', 'd', 'e'])
        self.assertIn('queue guards: Redis lacked the guard script', self.ferry.log())

    def test_4_block_held_until_room(self):
        ports = self.masters()
        key = self.key_on(ports[0], 'cb:q')
        other = self.key_on(ports[2], 'cb:q')
        c = self.ferry.client(socket_timeout=30)
        self.assertEqual(c.rpush(key, 'i0', 'i1'), 2)
        done = []

        def producer():
            pc = self.ferry.client(socket_timeout=30)
            for i in range(3):
                pc.rpush(key, 's%d' % i)
                done.append('s%d' % i)

        t = threading.Thread(target=producer)
        t.start()
        try:
            wait_until(lambda: stats(self.ferry)['queues']['queues'][2]['held_full'] > 0,
                       timeout=10, interval=0.05, msg='the push held')
            self.assertEqual(done, [])
            self.assertEqual(self.node(ports[0]).llen(key), 2)
            # another shard's bounded key flows meanwhile
            self.assertEqual(c.rpush(other, 'x'), 1)
            popped = []
            deadline = time.monotonic() + 30
            while len(popped) < 5 and time.monotonic() < deadline:
                v = c.lpop(key)
                if v is None:
                    time.sleep(0.02)
                    continue
                popped.append(v)
                self.assertLessEqual(self.node(ports[0]).llen(key), 2)
        finally:
            t.join(30)
        self.assertFalse(t.is_alive())
        self.assertEqual(popped, ['i0', 'i1', 's0', 's1', 's2'])
        self.assertEqual(stats(self.ferry)['queues']['queues'][2]['refused_full'], 0)


@unittest.skipIf(harness.DIRECT, 'ferry-only')
class ClusterBoundedQueueFailoverTest(unittest.TestCase):
    """kill -9 of the master of a bounded key's shard while producers push
    to it: the pushes are held and go on on the promoted replica (which has
    not seen ferry's guard script), no error but -QFULL, every acknowledged
    push is there, the list never passes its bound."""

    BOUND = 60

    @classmethod
    def setUpClass(cls):
        cls.cluster = ClusterTopology(masters=3, replicas=1, node_timeout_ms=2000)
        try:
            cls.owners = cls.cluster.wait_consistent()
            cls.ferry = Ferry(None, wait='port', conf={
                'cluster': {'nodes': [cls.cluster.seeds()[0]], 'timeout_ms': 1000},
                'upstream': {'hold_timeout_ms': 30000}},
                extra_yaml=queues_yaml([{'keys': 'cf:*', 'max_length': cls.BOUND}]))
        except BaseException:
            cls.cluster.stop()
            raise

    @classmethod
    def tearDownClass(cls):
        cls.ferry.stop()
        cls.cluster.stop()

    def test_kill_master_mid_pushes(self):
        # durability.replicas_ack unset: 0 in cluster mode (one replica per
        # master, none left after the failover), as test_cluster_route's kill
        victim = sorted(set(self.owners.values()))[-1]
        key = next('cf:q:%d' % i for i in range(1000000)
                   if self.owners[keyslot('cf:q:%d' % i)] == victim)
        acked, refused, other, over = [], [], [], []
        lock = threading.Lock()
        started = threading.Event()
        # Pushes pause around the kill: with replicas_ack 0 a push acknowledged
        # a moment before it may be on no replica (asynchronous replication),
        # and that loss is what replicas_ack 1 is for. So the replica is
        # seen holding every acknowledged push first; the pushes go on at
        # once, held by ferry through the failover.
        go = threading.Event()
        go.set()
        inflight = [0]

        def producer(n):
            c = self.ferry.client(socket_timeout=40)
            refusals, i = 0, 0
            while refusals < 3 and i < 2 * self.BOUND:  # bounded
                item = 'p%d-%d' % (n, i)
                i += 1
                go.wait(60)
                with lock:
                    inflight[0] += 1
                try:
                    length = c.rpush(key, item)
                    with lock:
                        acked.append(item)
                        if length > self.BOUND:
                            over.append(length)
                        if len(acked) >= self.BOUND // 3:
                            started.set()
                except redis.ResponseError as e:
                    with lock:
                        if str(e) == qfull(key, self.BOUND, self.BOUND):
                            refused.append(item)
                        else:
                            other.append(str(e))
                    refusals += 1
                finally:
                    with lock:
                        inflight[0] -= 1
                time.sleep(0.01)

        threads = [threading.Thread(target=producer, args=(n,)) for n in range(4)]
        for t in threads:
            t.start()
        replica = self.cluster.node_by_port(self.cluster.replicas_of(victim)[0]).client(
            socket_timeout=10, single_connection_client=True)
        replica.execute_command('READONLY')  # a cluster replica's reads, on this connection
        try:
            self.assertTrue(started.wait(30), 'pushes flowing before the kill')
            go.clear()
            wait_until(lambda: inflight[0] == 0, timeout=30, interval=0.01,
                       msg='the pushes under way answered')
            with lock:
                before = list(acked)
            wait_until(lambda: set(before) <= set(replica.lrange(key, 0, -1)), timeout=20,
                       interval=0.05, msg='the replica holding every acknowledged push')
            self.cluster.kill_master(victim)
            go.set()
            new = self.cluster.wait_promoted(victim)
        finally:
            go.set()
            for t in threads:
                t.join(60)
        self.assertFalse(any(t.is_alive() for t in threads), 'producers hung')
        self.assertEqual(other, [])
        self.assertEqual(over, [])
        items = self.cluster.node_by_port(new).client().lrange(key, 0, -1)
        self.assertLessEqual(len(items), self.BOUND)
        self.assertEqual(len(items), self.BOUND)  # the producers ran until refused
        self.assertEqual(set(acked) - set(items), set(), 'acknowledged pushes lost')
        self.assertEqual(len(refused), 4 * 3)
        self.assertEqual(set(refused) & set(items), set())


@unittest.skipIf(harness.DIRECT, 'ferry-only')
class ClusterGuardsConfigTest(unittest.TestCase):

    def check(self, text):
        d = harness._mkdtemp('ferry-cluster-guards-conf-')
        path = os.path.join(d, 'ferry.yml')
        with open(path, 'w') as fh:
            fh.write('cluster:\n  nodes: [127.0.0.1:7000]\n' + text)
        return Ferry.check_config(path)

    def test_ferry_t(self):
        rc, out = self.check(queues_yaml([{'keys': 'q:*', 'max_length': 10, 'on_full': 'block'}]))
        self.assertEqual(rc, 0, out)
        rc, out = self.check(queues_yaml([{'keys': 'q:*', 'max_length': 10},
                                          {'keys': 'j:*', 'processing': '"{key}:processing"'}]))
        self.assertEqual(rc, 0, out)  # leases: test_cluster_lease


if __name__ == '__main__':
    unittest.main()
