"""Leases (queues: processing) and queue depths in cluster mode (harness
ClusterTopology: 3 masters + 3 replicas). Every key of a lease is in the
queue key's slot: the queue's hash tag is its processing list's and dead
letter's (processing: "{key}:processing" on a key "{q1}"), and ferry sends
each lease script to that slot's master.

  ClusterLeaseTest (one cluster and one ferry for the class):
    1. On a queue key of every shard: a move leases the item (the lease is
       on the shard's own master), an ack ends it, a lease that runs out
       puts the item back at its end with its delivery count raised, and
       past max_attempts it goes to the dead letter; a blocking move too.
    2. A queue key without a hash tag: its processing list is in another
       slot, and the move is refused with a node's CROSSSLOT.
    3. Queue depths: keys of every shard are sampled on their master and
       appear in /stats with their lengths; a deleted one leaves.
    4. A client that hangs up holding leases on every shard: its items are
       back at once (lease_expire_on_disconnect), each on its own master.
    5. consumer_backoff: a consumer paused by its queue's shard (the paused
       set lives on another shard) has its pops held; another is not.
    6. ferry --queues lists the queue keys of every shard with their
       processing lists, open leases and dead letters.
  ClusterLeaseFailoverTest (a cluster of its own: it is harmed):
    kill -9 of the master of the shard that holds an item's lease and the
    registry of processing lists: a lease on another shard runs out (from
    the registry as ferry last read it); once the replica is promoted, the lease runs out there
    and the item is back in its queue exactly once; a list first leased
    while the registry's master was down is registered and expired after.
  ClusterLeaseConfigTest: `ferry -t` with cluster accepts processing whose
    text before {key} has no '{', refuses one that has.

Run:  python3 -m unittest test_cluster_lease -v        (about 45 s)
"""
import json
import os
import subprocess
import time
import unittest
import urllib.request

import redis

import harness
from harness import ClusterTopology, Ferry, wait_until
from test_queue_guards import keyslot, queues_yaml

LEASE_MS = 600


def stats(f):
    with urllib.request.urlopen('http://127.0.0.1:%d/stats' % f.stats_port, timeout=5) as r:
        return json.loads(r.read().decode())


def lkey(kind, q, proc):
    """ferry:<kind>:{T}:<proc>: T is q's hash tag (these tests' keys have one)."""
    tag = q[q.index('{') + 1:q.index('}')]
    return 'ferry:%s:{%s}:%s' % (kind, tag, proc)


class ClusterCase(unittest.TestCase):

    @classmethod
    def start(cls, entries, extra=''):
        cls.cluster = ClusterTopology(masters=3, replicas=1, node_timeout_ms=2000)
        try:
            cls.owners = cls.cluster.wait_consistent()
            cls.ferry = Ferry(None, wait='port', conf={
                'cluster': {'nodes': [cls.cluster.seeds()[0]], 'timeout_ms': 1000},
                'upstream': {'hold_timeout_ms': 30000}},
                extra_yaml=queues_yaml(entries) + extra)
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
            timeout=30, interval=0.1, msg='every shard UP in ferry')

    def masters(self):
        return sorted(set(self.owners.values()))

    def tagged_on(self, port, prefix):
        """A queue key {<prefix><i>} whose slot port's master serves."""
        return next('{%s%d}' % (prefix, i) for i in range(1000000)
                    if self.owners[keyslot('{%s%d}' % (prefix, i))] == port)

    def node(self, port):
        return self.cluster.node_by_port(port).client()


@unittest.skipIf(harness.DIRECT, 'ferry-only')
class ClusterLeaseTest(ClusterCase):

    @classmethod
    def setUpClass(cls):
        cls.start([{'keys': '{lq*}', 'processing': '"{key}:processing"', 'lease_ms': LEASE_MS,
                    'max_attempts': 2, 'lease_expire_on_disconnect': 'false'},
                   {'keys': 'ju:*', 'processing': '"{key}:processing"'},
                   {'keys': '{dq*}'},
                   {'keys': '{dc*}', 'processing': '"{key}:processing"', 'lease_ms': 30000},
                   {'keys': '{bo*}', 'processing': '"{key}:processing"', 'lease_ms': 300,
                    'max_attempts': 100,
                    'consumer_backoff': '{after_failures: 2, pause_ms: 8000}'}],
                  'queue_depths: {interval_ms: 100, keys_per_round: 50}\n')

    def test_1_lease_ack_expiry_dead_letter_on_every_shard(self):
        c = self.ferry.client(socket_timeout=10)
        keys = {port: self.tagged_on(port, 'lq') for port in self.masters()}
        for port, q in keys.items():
            proc, dead = q + ':processing', q + ':dead'
            m = self.node(port)
            leases = lkey('leases', q, proc)
            attempts = lkey('attempts', q, proc)
            self.assertEqual(c.rpush(q, 'a1', 'a2'), 2)
            # a move leases, on the shard's own master
            self.assertEqual(c.rpoplpush(q, proc), 'a2')
            wait_until(lambda: m.zscore(leases, 'a2') is not None, timeout=5, interval=0.02,
                       msg='lease of a2 on %d' % port)
            self.assertEqual(m.hget(attempts, 'a2'), '1:R')
            # the ack ends it
            self.assertEqual(c.lrem(proc, 1, 'a2'), 1)
            self.assertIsNone(m.zscore(leases, 'a2'))
            self.assertIsNone(m.hget(attempts, 'a2'))
            # a blocking move leases too; unacked, it comes back at the right end
            self.assertEqual(c.blmove(q, proc, 1, 'RIGHT', 'LEFT'), 'a1')
            wait_until(lambda: m.zscore(leases, 'a1') is not None, timeout=5, interval=0.02,
                       msg='lease of a1 on %d' % port)
            wait_until(lambda: m.lrange(q, 0, -1) == ['a1'], timeout=10, interval=0.05,
                       msg='a1 back in %s' % q)
            self.assertEqual(m.lrange(proc, 0, -1), [])
            self.assertEqual(m.hget(attempts, 'a1'), '2:R')
            # a second delivery that runs out: past max_attempts 2, dead letter
            self.assertEqual(c.lmove(q, proc, 'RIGHT', 'LEFT'), 'a1')
            wait_until(lambda: m.lrange(dead, 0, -1) == ['a1'], timeout=10, interval=0.05,
                       msg='a1 in %s' % dead)
            self.assertEqual(m.llen(q), 0)
            self.assertEqual(m.llen(proc), 0)
            self.assertIsNone(m.zscore(leases, 'a1'))
            self.assertIsNone(m.hget(attempts, 'a1'))
            # the lock of this queue's leases is on this master, ferry's
            self.assertIsNotNone(m.get('ferry:leases:{%s}:lock' % q[1:-1]))
        q0 = stats(self.ferry)['queues']['queues'][0]
        self.assertEqual(q0['lease_expired'], 2 * len(keys), q0)
        self.assertEqual(q0['dead_lettered'], len(keys), q0)

    def test_2_untagged_processing_in_another_slot(self):
        c = self.ferry.client(socket_timeout=10)
        self.assertNotEqual(keyslot('ju:1'), keyslot('ju:1:processing'))
        self.assertEqual(c.rpush('ju:1', 'x'), 1)
        with self.assertRaises(redis.ResponseError) as cm:
            c.rpoplpush('ju:1', 'ju:1:processing')
        self.assertEqual(str(cm.exception), "CROSSSLOT Keys in request don't hash to the same slot")
        self.assertEqual(c.lrange('ju:1', 0, -1), ['x'])

    def test_3_depths_sampled_on_every_shard(self):
        c = self.ferry.client(socket_timeout=10)
        want = {}
        for n, port in enumerate(self.masters()):
            for j in range(2):
                key = self.tagged_on(port, 'dq%d_' % j)
                c.rpush(key, *range(3 * n + j + 1))
                want[key] = 3 * n + j + 1
                self.assertEqual(self.node(port).llen(key), want[key])

        def lengths():
            d = stats(self.ferry)['queues']
            return {k['key']: k['length'] for k in d['queue_keys'] if k['key'] in want}
        wait_until(lambda: lengths() == want, timeout=15, interval=0.1,
                   msg='lengths of every shard sampled (%r)' % want)
        d = stats(self.ferry)['queues']
        self.assertIs(d['queue_sampling'], True)
        self.assertEqual(d['queues'][2]['length'], sum(want.values()))
        gone = sorted(want)[0]
        c.delete(gone)
        wait_until(lambda: gone not in lengths(), timeout=15, interval=0.1,
                   msg='a deleted key leaves')


    def test_4_disconnect_expires_on_every_shard(self):
        keys = {port: self.tagged_on(port, 'dc') for port in self.masters()}
        c = self.ferry.client(socket_timeout=10)
        for q in keys.values():
            self.assertEqual(c.rpush(q, *['%s-%d' % (q, i) for i in range(5)]), 5)
        w = self.ferry.client(socket_timeout=10)
        for port, q in keys.items():
            for _ in range(5):
                self.assertIsNotNone(w.rpoplpush(q, q + ':processing'))
            m = self.node(port)
            wait_until(lambda: m.zcard(lkey('leases', q, q + ':processing')) == 5, timeout=5,
                       interval=0.02, msg='5 leases on %d' % port)
        w.connection_pool.disconnect()  # the socket closes
        t0 = time.monotonic()
        for port, q in keys.items():
            m = self.node(port)
            wait_until(lambda: m.llen(q) == 5 and m.llen(q + ':processing') == 0, timeout=10,
                       interval=0.05, msg='the items of %s back at once' % q)
            self.assertEqual(m.hget(lkey('attempts', q, q + ':processing'), q + '-0'), '2:R')
        self.assertLess(time.monotonic() - t0, 10)  # lease_ms is 30 s

    def test_5_consumer_backoff_across_shards(self):
        # the paused set's own slot is on another shard than the queue's
        paused_at = self.owners[keyslot('ferry:consumers:paused')]
        port = next(p for p in self.masters() if p != paused_at)
        q = self.tagged_on(port, 'bo')
        proc = q + ':processing'
        m = self.node(port)
        w1, w2 = self.ferry.client(socket_timeout=30), self.ferry.client(socket_timeout=30)
        w1.client_setname('w1')
        w2.client_setname('w2')
        self.assertEqual(w2.rpush(q, *['j%d' % i for i in range(6)]), 6)
        for _ in range(2):
            self.assertIsNotNone(w1.rpoplpush(q, proc))
            wait_until(lambda: m.llen(proc) == 0, timeout=5, interval=0.02,
                       msg='the lease expired')
        pm = self.node(paused_at)
        wait_until(lambda: pm.zscore('ferry:consumers:paused', 'w1') is not None, timeout=5,
                   interval=0.02, msg='w1 paused')
        wait_until(lambda: stats(self.ferry)['queues']['consumers_paused'] == 1, timeout=5,
                   interval=0.02, msg='ferry knows w1 is paused')
        t0 = time.monotonic()
        self.assertIsNotNone(w2.rpoplpush(q, proc))
        # w2 is not paused: at once (a bound on a hang; paused, it would wait
        # about pause_ms, 8 s)
        self.assertLess(time.monotonic() - t0, 3.0)
        # Every loop reads the paused set every 200 ms (workers: N; only the
        # main loop's is on /stats): give w1's loop ten times that, well
        # inside the pause.
        time.sleep(2.0)
        t0 = time.monotonic()
        self.assertIsNotNone(w1.rpoplpush(q, proc))
        self.assertGreater(time.monotonic() - t0, 1.0)  # held until the pause ends
        self.assertIn("consumer 'w1' paused for 8000 ms after 2 expired leases",
                      self.ferry.log())

    def test_6_queues_report_of_every_shard(self):
        keys = {port: self.tagged_on(port, 'dc9_') for port in self.masters()}  # lease 30 s
        c = self.ferry.client(socket_timeout=10)
        for q in keys.values():
            self.assertEqual(c.rpush(q, 'a', 'b', 'c'), 3)
            self.assertEqual(c.rpoplpush(q, q + ':processing'), 'c')
        for port, q in keys.items():
            wait_until(lambda: self.node(port).zcard(lkey('leases', q, q + ':processing')) == 1,
                       timeout=5, interval=0.02, msg='lease on %d' % port)
        run = subprocess.run([harness.FERRY_BIN, '--queues', '-c', self.ferry.config_path],
                             capture_output=True, text=True, timeout=30)
        self.assertEqual(run.returncode, 0, run.stderr)
        lines = run.stdout.splitlines()
        self.assertIn('queues[3] keys={dc*} max_length=0 on_full=refuse '
                      'processing={key}:processing lease_ms=30000 max_attempts=5 '
                      'dead_letter={key}:dead', lines)
        for q in keys.values():
            self.assertIn('  %s length=2 processing=1 leases_open=1 dead=0' % q, lines)
        self.assertTrue(lines[-1].startswith('consumers paused:'), run.stdout)


@unittest.skipIf(harness.DIRECT, 'ferry-only')
class ClusterLeaseFailoverTest(ClusterCase):

    @classmethod
    def setUpClass(cls):
        cls.start([{'keys': '{fq*}', 'processing': '"{key}:processing"', 'lease_ms': 1500,
                    'max_attempts': 5, 'lease_expire_on_disconnect': 'false'}])

    def test_kill_master_mid_lease(self):
        # the victim is the shard that also holds the registry of processing
        # lists (ferry:leases:registry): the hardest shard to lose
        victim = self.owners[keyslot('ferry:leases:registry')]
        other, third = [p for p in self.masters() if p != victim]
        q, q2, q3 = (self.tagged_on(victim, 'fq'), self.tagged_on(other, 'fq'),
                     self.tagged_on(third, 'fq'))
        proc = q + ':processing'
        c = self.ferry.client(socket_timeout=40)
        for key, item in ((q, 'v1'), (q2, 'o1'), (q3, 't1')):
            self.assertEqual(c.rpush(key, item), 1)
        self.assertEqual(c.rpoplpush(q, proc), 'v1')
        m = self.node(victim)
        wait_until(lambda: m.zscore(lkey('leases', q, proc), 'v1') is not None and
                   m.sismember('ferry:leases:registry', q2 + ':processing') is not None,
                   timeout=5, interval=0.02, msg='lease of v1')
        # o1's list is registered before the kill; t1's is first leased after it
        self.assertEqual(c.rpoplpush(q2, q2 + ':processing'), 'o1')
        wait_until(lambda: m.sismember('ferry:leases:registry', q2 + ':processing'),
                   timeout=5, interval=0.02, msg='%s registered' % q2)
        wait_until(lambda: self.node(other).zscore(lkey('leases', q2, q2 + ':processing'),
                                                   'o1') is not None,
                   timeout=5, interval=0.02, msg='lease of o1')
        # the lease and the move are on the replica before the kill
        self.assertEqual(m.execute_command('WAIT', 1, 5000), 1)
        time.sleep(0.3)  # an expiry round reads the registry with o1's list in it
        self.cluster.kill_master(victim)
        self.assertEqual(c.rpoplpush(q3, q3 + ':processing'), 't1')
        # o1's lease runs out on its own shard, from the registry ferry read
        # last (the nodes answer CLUSTERDOWN while the victim's slots have no
        # master: until then nothing can be written anywhere)
        o = self.node(other)
        wait_until(lambda: o.lrange(q2, 0, -1) == ['o1'], timeout=20, interval=0.05,
                   msg='o1 back in its queue')
        new = self.cluster.wait_promoted(victim)
        n = self.node(new)
        wait_until(lambda: n.lrange(q, 0, -1) == ['v1'], timeout=20, interval=0.05,
                   msg='v1 back in its queue on the promoted replica')
        # t1's list was registered once the registry's shard was back
        t = self.node(third)
        wait_until(lambda: t.lrange(q3, 0, -1) == ['t1'], timeout=20, interval=0.05,
                   msg='t1 back in its queue after the failover')
        self.assertTrue(n.sismember('ferry:leases:registry', q3 + ':processing'))
        # once: it stays one copy, out of the processing list, no lease left
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline:
            self.assertEqual(n.lrange(q, 0, -1), ['v1'])
            time.sleep(0.1)
        self.assertEqual(n.llen(proc), 0)
        self.assertEqual(n.zcard(lkey('leases', q, proc)), 0)
        self.assertEqual(n.hget(lkey('attempts', q, proc), 'v1'), '2:R')
        # and it is delivered again through ferry
        self.assertEqual(c.rpoplpush(q, proc), 'v1')
        self.assertEqual(c.lrem(proc, 1, 'v1'), 1)


@unittest.skipIf(harness.DIRECT, 'ferry-only')
class ClusterLeaseConfigTest(unittest.TestCase):

    def check(self, text):
        d = harness._mkdtemp('ferry-cluster-lease-conf-')
        path = os.path.join(d, 'ferry.yml')
        with open(path, 'w') as fh:
            fh.write('cluster:\n  nodes: [127.0.0.1:7000]\n' + text)
        return Ferry.check_config(path)

    def test_ferry_t(self):
        for ok in ({'keys': '{q*}', 'processing': '"{key}:processing"'},
                   {'keys': 'q:*', 'processing': 'p:{key}', 'dead_letter': '"}d:{key}"'}):
            rc, out = self.check(queues_yaml([ok]))
            self.assertEqual(rc, 0, out)
        for bad, field in (({'keys': 'q:*', 'processing': '"{p}:{key}"'}, 'processing'),
                           ({'keys': 'q:*', 'processing': '"{key}:p"',
                             'dead_letter': '"{d}{key}"'}, 'dead_letter')):
            rc, out = self.check(queues_yaml([bad]))
            self.assertEqual(rc, 1, out)
            self.assertIn("queues[0].%s: with cluster, no '{' may come before {key}" % field, out)


if __name__ == '__main__':
    unittest.main()
