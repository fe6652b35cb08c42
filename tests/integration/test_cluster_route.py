"""ferry serves clients in front of a Redis Cluster (first routing step),
checked against a real 3 masters + 3 replicas cluster (harness
ClusterTopology, node-timeout 2 s), one cluster and one ferry per class:

  1. 16 keys spread over every shard: LPUSH / RPOP / SET / GET through ferry
     land on the master serving each key's slot (read with that node's own
     client, which gets no MOVED).
  2. Keys of one slot ({tag}) go together; MSETNX across slots gets the
     exact CROSSSLOT error a node sends (MSET is split: test_cluster_split); what is not routed yet is refused with
     ferry's words.
  3. `redis-cli --cluster reshard` of some slots: the MOVED that follows is
     handled by ferry (re-routed), never seen by the client, and the keys of
     the moved slots are served from their new master.
  4. kill -9 of one master under 2 producers + 2 consumers on keys of every
     shard: 0 client errors, 0 acknowledged pushes lost, the other shards'
     keys keep flowing (their longest gap printed); again with
     durability.replicas_ack: 1 on 3 masters with 2 replicas each and
     4 producers + 4 consumers (RPOP and BRPOP, with pop receipts): every
     item once, no pop proven not applied delivered, any duplicate within
     the counted ambiguous cases (CLUSTER_KILL9_RUNS=20 repeats it on fresh
     clusters and prints the table).
  5. ASK during a slot migration: ASKING + the command on the target.
  6. Blocking pops by slot (BRPOP, BLMOVE), CROSSSLOT for a move across slots.
  7. Scripts by the slot of their keys (EVAL, EVALSHA, EVAL_RO...: on the
     slot's master, CROSSSLOT across slots as a node says, numkeys 0 to any
     master); SCRIPT LOAD / EXISTS / FLUSH on every master, one reply.
  8. Functions: FUNCTION LOAD / DELETE / FLUSH on every master, FCALL and
     FCALL_RO by slot, a master's error returned as it is.
  9. BullMQ with a {hash-tagged} prefix: a Queue and a Worker process every
     job once through ferry.
  z. CLUSTER FAILOVER: the promoted master lacks a script loaded before;
     ferry loads it there ahead of the EVALSHA (no NOSCRIPT surfaces).

Run:  python3 -m unittest test_cluster_route -v        (about 55 s)
Ferry-only (skipped with FERRY_TEST_DIRECT=1); FERRY_TEST_WORKERS=4 runs
its ferry with 4 event loops.
"""
import hashlib
import json
import os
import shutil
import subprocess
import threading
import time
import unittest
import urllib.request

import redis

import harness
from harness import ClusterTopology, Ferry, wait_until

REFRESH_MS = 200
HOLD_MS = 30000


def _s(v):
    """bytes -> str, through lists; other values as they are."""
    if isinstance(v, (list, tuple)):
        return [_s(x) for x in v]
    return v.decode() if isinstance(v, bytes) else v


def queue_keys(cluster, n=16):
    """n keys whose slots cover every master, as evenly as the names fall."""
    masters = cluster.masters()
    per = {m: [] for m in masters}
    i = 0
    while min(len(v) for v in per.values()) < n // len(masters) + 1 and i < 10000:
        k = 'q:%d' % i
        m = cluster.master_of(cluster.keyslot(k))
        per[m].append(k)
        i += 1
    keys = []
    while len(keys) < n:
        for m in masters:
            if per[m] and len(keys) < n:
                keys.append(per[m].pop(0))
    return keys


def stats(f):
    """ferry's stats JSON."""
    with urllib.request.urlopen('http://127.0.0.1:%d/stats' % f.stats_port, timeout=5) as r:
        return json.loads(r.read())


def start_ferry(cluster, refresh_ms=REFRESH_MS, replicas_ack=None):
    conf = {'cluster': {'nodes': [cluster.seeds()[0]], 'refresh_interval_ms': refresh_ms,
                        'timeout_ms': 1000},
            'upstream': {'hold_timeout_ms': HOLD_MS}}
    if replicas_ack is not None:
        conf['durability'] = {'replicas_ack': replicas_ack}
    return Ferry(None, wait='port', conf=conf)


def wait_served(f, timeout=20.0):
    """Until ferry answers a SET on every master (its map is learned)."""
    c = f.client(socket_timeout=5)

    def ok():
        return c.set('probe:{a}', 1) and c.set('probe:{b}', 1) and c.set('probe:{c}', 1)
    try:
        wait_until(ok, timeout=timeout, interval=0.1, msg='ferry serving the cluster')
    finally:
        c.close()


class KillUnderLoad:
    """kill -9 of one master under 2 producers + 2 consumers on keys of every
    shard and one client per other shard (self.cluster, self.ferry)."""

    def node_client(self, port):
        return self.cluster.node_by_port(port).client(socket_timeout=5)

    def kill_master_under_load(self, producers=2, consumers=2, exact=False):
        """exact: durability.replicas_ack is on (offset brackets, pop
        receipts per shard): no pop proven not applied delivered, and every
        duplicate explained by a counted ambiguous case. Odd consumers pop
        with BRPOP, even ones with RPOP. Returns (lost, duplicates, ferry's
        stats after the run)."""
        self.cluster.wait_consistent()
        keys = queue_keys(self.cluster)
        owners = {k: self.cluster.master_of(self.cluster.keyslot(k)) for k in keys}
        victim = self.cluster.masters()[-1]
        c = self.ferry.client(socket_timeout=10)
        for k in keys:
            c.delete(k)
        c.close()
        stop = threading.Event()
        lock = threading.Lock()
        errors, pushed, popped = [], [], []
        last = {}   # key -> time.monotonic() of its last acknowledged operation
        gaps = {}   # key -> longest gap between two acknowledged operations

        def note(k):
            now = time.monotonic()
            with lock:
                if k in last:
                    gaps[k] = max(gaps.get(k, 0.0), now - last[k])
                last[k] = now

        def producer(idx):
            cl = self.ferry.client(socket_timeout=HOLD_MS / 1000 + 10)
            n = 0
            try:
                while not stop.is_set():
                    k = keys[(n + idx) % len(keys)]
                    v = '%d:%d' % (idx, n)
                    try:
                        cl.lpush(k, v)
                    except Exception as e:
                        with lock:
                            errors.append('push %s: %r' % (k, e))
                        return
                    with lock:
                        pushed.append((k, v))
                    note(k)
                    n += 1
                    time.sleep(0.005)
            finally:
                cl.close()

        def consumer(idx):
            cl = self.ferry.client(socket_timeout=HOLD_MS / 1000 + 10)
            n = 0
            try:
                while not stop.is_set():
                    k = keys[(n * 2 + idx) % len(keys)]
                    n += 1
                    try:
                        if idx % 2:
                            v = cl.brpop(k, timeout=1)
                            v = v[1] if v else None
                        else:
                            v = cl.rpop(k)
                    except Exception as e:
                        with lock:
                            errors.append('pop %s: %r' % (k, e))
                        return
                    if v is not None:
                        with lock:
                            popped.append((k, _s(v)))
                    note(k)
                    time.sleep(0.005)
            finally:
                cl.close()

        wgap = {}  # witness (a master's port) -> longest gap between its answers

        def witness(port):
            # A client on one other shard's keys: a client's replies keep
            # their order, so only clients that touch the failed shard wait.
            cl = self.ferry.client(socket_timeout=HOLD_MS / 1000 + 10)
            mine = [k for k in keys if owners[k] == port]
            n, prev = 0, time.monotonic()
            try:
                while not stop.is_set():
                    k = mine[n % len(mine)]
                    v = 'w%d:%d' % (port, n)
                    n += 1
                    try:
                        cl.lpush(k, v)
                        with lock:
                            pushed.append((k, v))
                        got = cl.rpop(k)
                    except Exception as e:
                        with lock:
                            errors.append('witness %s: %r' % (k, e))
                        return
                    if got is not None:
                        with lock:
                            popped.append((k, _s(got)))
                    now = time.monotonic()
                    with lock:
                        wgap[port] = max(wgap.get(port, 0.0), now - prev)
                    prev = now
                    time.sleep(0.005)
            finally:
                cl.close()

        threads = [threading.Thread(target=producer, args=(i,)) for i in range(producers)]
        threads += [threading.Thread(target=consumer, args=(i,)) for i in range(consumers)]
        threads += [threading.Thread(target=witness, args=(p,))
                    for p in sorted(set(owners.values())) if p != victim]
        for t in threads:
            t.start()
        try:
            time.sleep(1.0)
            with lock:
                gaps.clear()
                wgap.clear()
            killed_at = time.monotonic()
            self.cluster.kill_master(victim)
            new = self.cluster.wait_promoted(victim, timeout=30)
            promoted_s = time.monotonic() - killed_at
            # the victim's keys flow again through ferry
            wait_until(lambda: any(k for k, _ in pushed[-50:] if owners[k] == victim),
                       timeout=HOLD_MS / 1000, msg='pushes to the failed shard again')
            time.sleep(1.0)
        finally:
            stop.set()
            for t in threads:
                t.join(timeout=HOLD_MS / 1000 + 20)
        self.assertEqual(errors, [])
        # what is left, read from each key's master now
        left = {}
        for k in keys:
            port = new if owners[k] == victim else owners[k]
            n = self.node_client(port)
            try:
                left[k] = _s(n.lrange(k, 0, -1))
            finally:
                n.close()
        have = set(popped) | {(k, v) for k in keys for v in left[k]}
        lost = [p for p in pushed if p not in have]
        self.assertEqual(lost, [], 'acknowledged pushes lost: %d of %d' % (len(lost), len(pushed)))
        # every item once: popped once or left once, never both or twice
        seen = {}
        for p in popped + [(k, v) for k in keys for v in left[k]]:
            seen[p] = seen.get(p, 0) + 1
        dups = {p: n for p, n in seen.items() if n > 1}
        ndup = sum(n - 1 for n in dups.values())
        st = stats(self.ferry)
        fo = st['failover']
        if exact:
            self.assertEqual(fo['duplicates_known'], 0, 'a pop proven not applied was delivered')
            self.assertLessEqual(ndup, fo['requests_ambiguous'],
                                 'a duplicate no ambiguous case explains: %r' % sorted(dups)[:10])
        print('\nkill -9 of master %d: promoted %d after %.1f s; %d pushes, %d pops, 0 lost; '
              'longest gap of a client on the other shards\' keys: %s; of the clients on '
              'every shard\'s keys: %.3f s' % (
                  victim, new, promoted_s, len(pushed), len(popped),
                  ', '.join('%d: %.3f s' % (p, g) for p, g in sorted(wgap.items())),
                  max(gaps.values())))
        # Between the FAIL flag and the promotion every node answers
        # CLUSTERDOWN (cluster-require-full-coverage yes, Redis' default):
        # ferry holds and retries those, so the other shards pause that
        # long, not for the whole failover.
        st = stats(self.ferry)
        print('ferry: %d request(s) refused by a node and retried (CLUSTERDOWN, MOVED...)' %
              st['errors']['requests_refused'])
        self.assertEqual(len(wgap), 2, wgap)
        # Until the FAIL flag (cluster-node-timeout 2 s) every other node
        # answers; a stall with the failed shard would last the whole
        # promotion time.
        self.assertLess(max(wgap.values()), promoted_s - 1.0,
                        'the other shards stalled with the failed one')
        return len(lost), ndup, st


@unittest.skipIf(harness.DIRECT, 'ferry-only')
class ClusterRouteTest(KillUnderLoad, unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.cluster = ClusterTopology(masters=3, replicas=1, node_timeout_ms=2000)
        try:
            cls.ferry = start_ferry(cls.cluster)
            wait_served(cls.ferry)
        except BaseException:
            cls.cluster.stop()
            raise

    @classmethod
    def tearDownClass(cls):
        rc = cls.ferry.stop()
        cls.cluster.stop()
        if rc != 0:  # a clean stop (and, under ASan, no report)
            raise AssertionError('ferry exited %r:\n%s' % (rc, cls.ferry.log()[-3000:]))

    def node_client(self, port):
        return self.cluster.node_by_port(port).client(socket_timeout=5)

    def test_1_single_key_commands_land_on_their_master(self):
        self.cluster.wait_consistent()
        keys = queue_keys(self.cluster)
        owners = {k: self.cluster.master_of(self.cluster.keyslot(k)) for k in keys}
        self.assertEqual(len(set(owners.values())), 3, owners)
        c = self.ferry.client(socket_timeout=10)
        for k in keys:
            c.delete(k)
            c.delete('s' + k)
            self.assertEqual(c.lpush(k, 'a', 'b', 'c'), 3)
            self.assertTrue(c.set('s' + k, 'v-s' + k))
        for k in keys:
            n = self.node_client(owners[k])
            try:
                # the node's own client: a key elsewhere would answer MOVED
                self.assertEqual(_s(n.lrange(k, 0, -1)), ['c', 'b', 'a'])
            finally:
                n.close()
            sk = 's' + k
            n = self.node_client(self.cluster.master_of(self.cluster.keyslot(sk)))
            try:
                self.assertEqual(_s(n.get(sk)), 'v-' + sk)
            finally:
                n.close()
            self.assertEqual(_s(c.rpop(k)), 'a')
            self.assertEqual(_s(c.get(sk)), 'v-' + sk)
        c.close()

    def test_2_crossslot_and_refusals(self):
        self.cluster.wait_consistent()
        c = self.ferry.client(socket_timeout=10)
        # one slot: goes as it is
        self.assertTrue(c.mset({'{user1}:a': '1', '{user1}:b': '2'}))
        self.assertEqual(_s(c.mget('{user1}:a', '{user1}:b')), ['1', '2'])
        a, b = 'q:0', 'q:1'
        while self.cluster.keyslot(a) == self.cluster.keyslot(b):
            b += 'x'
        node = self.node_client(self.cluster.masters()[0])
        try:
            with self.assertRaises(redis.ResponseError) as want:
                node.execute_command('MSETNX', a, '1', b, '2')
        finally:
            node.close()
        with self.assertRaises(redis.ResponseError) as got:
            c.execute_command('MSETNX', a, '1', b, '2')
        self.assertTrue(str(want.exception).startswith('CROSSSLOT'), str(want.exception))
        self.assertEqual(str(got.exception), str(want.exception))
        for argv in (['CLIENT', 'TRACKING', 'ON'], ['SCRIPT', 'KILL'],
                     ['CLUSTER', 'INFO'], ['SORT', 'q:0'], ['SELECT', '2']):
            with self.assertRaises(redis.ResponseError) as e:
                c.execute_command(*argv)
            self.assertIn('cluster mode', str(e.exception), argv)
            if argv[0] in ('CLUSTER', 'SELECT'):
                self.assertIn('presents the cluster as one server', str(e.exception), argv)
        # the connection still serves
        self.assertEqual(c.ping(), True)
        self.assertTrue(c.set('after', 'x'))
        c.close()

    def test_2b_a_pipelined_transaction_runs_as_one(self):
        """A client pipelining MULTI, its commands and EXEC (ioredis, BullMQ's
        FlowProducer, redis-py's transaction pipeline) gets a transaction on
        its keys' shard, never the commands run one by one (when cluster
        mode refused MULTI, SET and INCR ran; test_cluster_multi covers
        transactions in full)."""
        self.cluster.wait_consistent()
        key, ctr = '{tx}:k', '{tx}:n'
        s = self.ferry.raw(timeout=10)
        try:
            harness.resp_send(s, ['DEL', key, ctr])
            harness.resp_read_reply(s, timeout=10)
            for argv in (['MULTI'], ['SET', key, 'v'], ['INCR', ctr], ['EXEC'],
                         ['MULTI'], ['SET', key, 'w'], ['DISCARD'], ['GET', key]):
                harness.resp_send(s, argv)
            got = [_s(harness.resp_read_reply(s, timeout=10)) for _ in range(8)]
        finally:
            s.close()
        self.assertEqual(got, ['OK', 'QUEUED', 'QUEUED', ['OK', 1], 'OK', 'QUEUED', 'OK', 'v'])
        node = self.node_client(self.cluster.master_of(self.cluster.keyslot(key)))
        try:
            self.assertEqual(_s(node.mget(key, ctr)), ['v', '1'])
        finally:
            node.close()

    def test_3_moved_after_reshard_is_followed(self):
        self.cluster.wait_consistent()
        masters = self.cluster.masters()
        src, dst = masters[0], masters[1]
        # keys on the source master, in the first slots it serves (the ones
        # a reshard moves first)
        view = [v for v in self.cluster.nodes_view(src) if v['port'] == src][0]
        first = sorted(view['slots'])[:20]
        keys = []
        i = 0
        while len(keys) < 8 and i < 200000:
            k = 'm:%d' % i
            if self.cluster.keyslot(k) in first:
                keys.append(k)
            i += 1
        self.assertEqual(len(keys), 8)
        # a ferry that asks for the map once a minute: it learns the move
        # from the nodes' MOVED, which must never reach its client
        f = start_ferry(self.cluster, refresh_ms=60000)
        try:
            wait_served(f)
            c = f.client(socket_timeout=10)
            for k in keys:
                self.assertTrue(c.set(k, 'v' + k))
            before = stats(f)['cluster']['moved_followed']
            self.cluster.reshard(src, dst, 20)
            for k in keys:
                self.assertEqual(self.cluster.master_of(self.cluster.keyslot(k)), dst, k)
            for k in keys:
                self.assertEqual(_s(c.get(k)), 'v' + k)
                self.assertTrue(c.set(k, 'w' + k))
                self.assertGreaterEqual(c.lpush('{%s}l' % k, 1), 1)
            n = self.node_client(dst)
            try:
                for k in keys:
                    self.assertEqual(_s(n.get(k)), 'w' + k)
            finally:
                n.close()
            c.close()
            moved = stats(f)['cluster']['moved_followed'] - before
        finally:
            rc = f.stop()
        self.assertEqual(rc, 0, f.log()[-3000:])
        print('\nreshard of 20 slots: %d MOVED followed by ferry' % moved)
        self.assertGreater(moved, 0)

    def test_4_kill_master_under_load(self):
        # durability.replicas_ack unset: 0 in cluster mode (each master has
        # one replica here, none left after its failover): no WAIT, so the
        # check is that ferry loses nothing, not that Redis replicated it
        self.kill_master_under_load()

    def test_5_ask_during_migration_is_followed(self):
        self.cluster.wait_consistent()
        masters = self.cluster.masters()
        src, dst = masters[0], masters[2]
        ids = {v['port']: v['id'] for v in self.cluster.nodes_view(src)}
        view = [v for v in self.cluster.nodes_view(src) if v['port'] == src][0]
        slot = next(s for s in sorted(view['slots'])
                    if self.cluster.command(src, 'CLUSTER', 'COUNTKEYSINSLOT', s) == 0)
        key = next('ask:%d' % i for i in range(200000)
                   if self.cluster.keyslot('ask:%d' % i) == slot)
        self.cluster.command(dst, 'CLUSTER', 'SETSLOT', slot, 'IMPORTING', ids[src])
        self.cluster.command(src, 'CLUSTER', 'SETSLOT', slot, 'MIGRATING', ids[dst])
        c = self.ferry.client(socket_timeout=5)
        try:
            before = stats(self.ferry)['cluster'].get('ask_followed', 0)
            t0 = time.monotonic()
            # src has no such key and the slot migrates: it answers ASK;
            # ferry sends ASKING + SET to dst, never the ASK to its client
            self.assertTrue(c.set(key, 'asked'))
            self.assertEqual(_s(c.get(key)), 'asked')
            took = time.monotonic() - t0
            self.assertEqual(self.cluster.command(dst, 'CLUSTER', 'COUNTKEYSINSLOT', slot), 1)
            self.assertEqual(self.cluster.command(src, 'CLUSTER', 'COUNTKEYSINSLOT', slot), 0)
            self.assertGreaterEqual(stats(self.ferry)['cluster'].get('ask_followed', 0) - before, 2)
            self.assertLess(took, 10.0)  # a bound on a hang
        finally:
            c.close()
            n = self.node_client(dst)
            try:
                p = n.pipeline(transaction=False)  # one connection: ASKING then DEL
                p.execute_command('ASKING')
                p.delete(key)
                p.execute()
            finally:
                n.close()
            for port in (src, dst):
                self.cluster.command(port, 'CLUSTER', 'SETSLOT', slot, 'STABLE')
            self.cluster.wait_consistent()

    def test_6_blocking_pops_by_slot(self):
        self.cluster.wait_consistent()
        keys = queue_keys(self.cluster, n=6)
        owners = {k: self.cluster.master_of(self.cluster.keyslot(k)) for k in keys}
        self.assertEqual(len(set(owners.values())), len(self.cluster.masters()), owners)
        c = self.ferry.client(socket_timeout=10)
        for k in keys:
            c.delete('b' + k)
        got = {}

        def consumer(k):
            cl = self.ferry.client(socket_timeout=10)
            try:
                got[k] = _s(cl.brpop(['b' + k], timeout=5))
            finally:
                cl.close()
        threads = [threading.Thread(target=consumer, args=(k,)) for k in keys]
        for t in threads:
            t.start()
        # every pop blocked on its own shard before the pushes
        wait_until(lambda: sum(int(self.cluster.command(p, 'INFO', 'clients')['blocked_clients'])
                               for p in set(owners.values())) >= len(keys),
                   timeout=5, msg='the pops blocked on their masters')
        for k in keys:
            self.assertEqual(c.lpush('b' + k, 'item-' + k), 1)
        for t in threads:
            t.join(timeout=15)
        self.assertEqual(got, {k: ['b' + k, 'item-' + k] for k in keys})
        # a pop that times out answers nil; a move between two slots gets
        # CROSSSLOT (a pop over keys of several slots is served:
        # test_cluster_priority_pop)
        self.assertIsNone(c.brpop(['b' + keys[0]], timeout=0.2))
        with self.assertRaises(redis.ResponseError) as e:
            c.blmove('b' + keys[0], 'b' + keys[1], 0.2, 'RIGHT', 'LEFT')
        self.assertTrue(str(e.exception).startswith('CROSSSLOT'), str(e.exception))
        # a pop moving between keys of one slot
        c.lpush('{mv}src', 'x')
        self.assertEqual(_s(c.blmove('{mv}src', '{mv}dst', 1, 'RIGHT', 'LEFT')), 'x')
        c.close()

    def tagged_keys(self, n=6):
        """n keys of one shard each, round the masters, and their owners."""
        keys = ['{%s}:s' % k for k in queue_keys(self.cluster, n=n)]
        owners = {k: self.cluster.master_of(self.cluster.keyslot(k)) for k in keys}
        self.assertEqual(len(set(owners.values())), len(self.cluster.masters()), owners)
        return keys, owners

    def on_every_master(self, *args):
        """The reply of each master to args, by its own client."""
        out = {}
        for port in self.cluster.masters():
            n = self.node_client(port)
            try:
                out[port] = n.execute_command(*args)
            finally:
                n.close()
        return out

    def node_error(self, *args, port=None):
        """The error a master's own client gets for args (port's, else the
        first master's)."""
        n = self.node_client(port or self.cluster.masters()[0])
        try:
            with self.assertRaises(redis.ResponseError) as e:
                n.execute_command(*args)
        finally:
            n.close()
        return str(e.exception)

    def test_7_scripts_by_slot_and_script_load_everywhere(self):
        self.cluster.wait_consistent()
        keys, owners = self.tagged_keys()
        c = self.ferry.client(socket_timeout=10)
        setget = "redis.call('SET', KEYS[1], ARGV[1]) return redis.call('GET', KEYS[1])"
        for k in keys:
            self.assertEqual(_s(c.eval(setget, 1, k, 'e-' + k)), 'e-' + k)
        for k in keys:
            n = self.node_client(owners[k])
            try:  # the node's own client: a key elsewhere would answer MOVED
                self.assertEqual(_s(n.get(k)), 'e-' + k)
            finally:
                n.close()
        # SCRIPT LOAD reaches every master: EVALSHA works on keys of every shard
        self.assertEqual(c.script_flush(), True)
        sha = _s(c.script_load(setget))
        self.assertEqual(self.on_every_master('SCRIPT', 'EXISTS', sha),
                         {p: [1] for p in self.cluster.masters()})
        # Redis does not copy its script cache to replicas (ferry loads a
        # script on a promoted one ahead of an EVALSHA: test_z)
        running = {n.port for n in self.cluster.running()}
        replicas = [r for m in self.cluster.masters() for r in self.cluster.replicas_of(m)
                    if r in running]
        for r in replicas:
            self.assertEqual(self.cluster.command(r, 'SCRIPT', 'EXISTS', sha), [0], r)
        get = _s(c.script_load("return redis.call('GET', KEYS[1])"))
        # each master in turn at once, not at ferry's next tick (50 ms): 100
        # loads would take at least 5 s that way
        t0 = time.monotonic()
        for i in range(100):
            c.script_load("return 'load %d'" % i)  # none of the scripts below
        took = time.monotonic() - t0
        print('\n100 SCRIPT LOADs on every master: %.0f ms' % (took * 1000))
        self.assertLess(took, 3.0)
        for k in keys:
            self.assertEqual(_s(c.evalsha(sha, 1, k, 'h-' + k)), 'h-' + k)
            self.assertEqual(_s(c.execute_command('EVALSHA_RO', get, 1, k)), 'h-' + k)
            self.assertEqual(_s(c.execute_command('EVAL_RO', "return redis.call('GET', KEYS[1])",
                                                  1, k)), 'h-' + k)
        # two keys of one slot go together; keys of two slots: the node's CROSSSLOT
        self.assertEqual(_s(c.eval("return redis.call('MSET', KEYS[1], 1, KEYS[2], 2)", 2,
                                   '{one}a', '{one}b')), 'OK')
        a, b = keys[0], keys[1]
        want = self.node_error('EVAL', 'return 1', 2, a, b)
        self.assertTrue(want.startswith('CROSSSLOT'), want)
        for argv in (['EVAL', 'return 1', 2, a, b], ['EVALSHA', sha, 2, a, b],
                     ['EVAL_RO', 'return 1', 2, a, b], ['FCALL', 'f', 2, a, b]):
            with self.assertRaises(redis.ResponseError) as e:
                c.execute_command(*argv)
            self.assertEqual(str(e.exception), want, argv)
        # numkeys 0: any master; a numkeys Redis refuses: its own error
        self.assertEqual(c.eval('return 7', 0), 7)
        want = self.node_error('EVAL', 'return 1', 3, a)
        with self.assertRaises(redis.ResponseError) as e:
            c.execute_command('EVAL', 'return 1', 3, a)
        self.assertEqual(str(e.exception), want)
        # SCRIPT EXISTS: 1 only where every master has it
        n = self.node_client(self.cluster.masters()[1])
        try:
            only = _s(n.script_load('return 42'))
        finally:
            n.close()
        self.assertEqual(c.script_exists(sha, only, '0' * 40), [True, False, False])
        # SCRIPT FLUSH on every master: EVALSHA answers the node's NOSCRIPT
        self.assertEqual(c.script_flush(), True)
        self.assertEqual(self.on_every_master('SCRIPT', 'EXISTS', sha, only),
                         {p: [0, 0] for p in self.cluster.masters()})
        for k in keys:
            with self.assertRaises(redis.exceptions.NoScriptError):
                c.evalsha(sha, 1, k, 'x')
        # redis-py's Script: EVALSHA, NOSCRIPT, then SCRIPT LOAD and EVALSHA again
        script = c.register_script(setget)
        for k in keys:
            self.assertEqual(_s(script(keys=[k], args=['r-' + k])), 'r-' + k)
        # pipelined: SCRIPT LOAD, then EVALSHA of that script on every shard:
        # each EVALSHA goes once every master has the script
        body = 'return ARGV[1] .. KEYS[1]'
        sha2 = hashlib.sha1(body.encode()).hexdigest()
        p = c.pipeline(transaction=False)
        p.script_load(body)
        for k in keys:
            p.evalsha(sha2, 1, k, 'p-')
            p.execute_command('PING')
        p.script_exists(sha2)
        want = [sha2]
        for k in keys:
            want += ['p-' + k, True]
        self.assertEqual(_s(p.execute()), want + [[True]])
        self.assertEqual(c.ping(), True)
        c.close()

    def test_8_functions_on_every_master_and_by_slot(self):
        self.cluster.wait_consistent()
        keys, owners = self.tagged_keys()
        c = self.ferry.client(socket_timeout=10)
        lib = ("#!lua name=ferrylib\n"
               "redis.register_function('setget', function(keys, args) "
               "redis.call('SET', keys[1], args[1]) return redis.call('GET', keys[1]) end)\n"
               "redis.register_function{function_name='getro', callback=function(keys, args) "
               "return redis.call('GET', keys[1]) end, flags={'no-writes'}}\n")
        self.assertEqual(_s(c.execute_command('FUNCTION', 'FLUSH')), 'OK')
        self.assertEqual(_s(c.execute_command('FUNCTION', 'LOAD', lib)), 'ferrylib')
        for port, libs in self.on_every_master('FUNCTION', 'LIST').items():
            self.assertEqual([_s(x[1]) for x in libs], ['ferrylib'], port)
        for k in keys:
            self.assertEqual(_s(c.execute_command('FCALL', 'setget', 1, k, 'f-' + k)), 'f-' + k)
            self.assertEqual(_s(c.execute_command('FCALL_RO', 'getro', 1, k)), 'f-' + k)
            n = self.node_client(owners[k])
            try:
                self.assertEqual(_s(n.get(k)), 'f-' + k)
            finally:
                n.close()
        # a master's error is the reply, word for word (the library exists)
        want = self.node_error('FUNCTION', 'LOAD', lib)
        with self.assertRaises(redis.ResponseError) as e:
            c.execute_command('FUNCTION', 'LOAD', lib)
        self.assertEqual(str(e.exception), want)
        self.assertEqual(_s(c.execute_command('FUNCTION', 'LOAD', 'REPLACE', lib)), 'ferrylib')
        # DUMP from one master (binary: a client without decoding), DELETE
        # everywhere, RESTORE everywhere
        b = redis.Redis(host='127.0.0.1', port=self.ferry.port, socket_timeout=10)
        try:
            dump = b.execute_command('FUNCTION', 'DUMP')
            self.assertEqual(_s(b.execute_command('FUNCTION', 'DELETE', 'ferrylib')), 'OK')
            self.assertEqual(self.on_every_master('FUNCTION', 'LIST'),
                             {p: [] for p in self.cluster.masters()})
            self.assertEqual(_s(b.execute_command('FUNCTION', 'RESTORE', dump)), 'OK')
        finally:
            b.close()
        for k in keys:
            self.assertEqual(_s(c.execute_command('FCALL_RO', 'getro', 1, k)), 'f-' + k)
        self.assertEqual(_s(c.execute_command('FUNCTION', 'FLUSH')), 'OK')
        self.assertEqual(self.on_every_master('FUNCTION', 'LIST'),
                         {p: [] for p in self.cluster.masters()})
        want = self.node_error('FCALL', 'setget', 1, keys[0], 'x', port=owners[keys[0]])
        with self.assertRaises(redis.ResponseError) as e:
            c.execute_command('FCALL', 'setget', 1, keys[0], 'x')
        self.assertEqual(str(e.exception), want)
        c.close()

    def test_9_bullmq_with_a_hash_tagged_prefix(self):
        self.cluster.wait_consistent()
        node = shutil.which('node')
        if node is None:
            raise AssertionError('node is not installed: run scripts/setup')
        here = os.path.dirname(os.path.abspath(__file__))
        jobs = 200
        p = subprocess.run([node, os.path.join(here, 'node', 'bullmq_cluster.js'),
                            str(self.ferry.port), str(jobs), '{bull}'],
                           capture_output=True, text=True, timeout=60, cwd=here)
        line = (p.stdout.strip().splitlines() or [''])[-1]
        try:
            out = json.loads(line)
        except ValueError:
            self.fail('node printed no JSON (exit %d):\n%s\n%s' % (p.returncode, p.stdout,
                                                                   p.stderr[-3000:]))
        self.assertEqual(out['errors'], [], out)
        self.assertEqual((out['added'], out['distinct'], out['twice']), (jobs, jobs, 0), out)
        self.assertEqual(out['counts'].get('completed'), jobs, out)
        # every key BullMQ wrote lives on the master of {bull}'s slot
        owner = self.cluster.master_of(self.cluster.keyslot('{bull}'))
        n = self.node_client(owner)
        try:
            self.assertGreater(len(n.keys('{bull}:jobs:*')), jobs)
        finally:
            n.close()

    def test_z_evalsha_after_a_failover_finds_its_script(self):
        # last: it fails a master over (CLUSTER FAILOVER on its replica)
        self.cluster.wait_consistent()
        running = {n.port for n in self.cluster.running()}
        master = next(m for m in self.cluster.masters()
                      if any(r in running for r in self.cluster.replicas_of(m)))
        replica = next(r for r in self.cluster.replicas_of(master) if r in running)
        key = next('{%s}:ns' % k for k in queue_keys(self.cluster, n=6)
                   if self.cluster.master_of(self.cluster.keyslot(k)) == master)
        c = self.ferry.client(socket_timeout=10)
        body = "return redis.call('INCR', KEYS[1])"
        sha = _s(c.script_load(body))
        c.delete(key)
        self.assertEqual(c.evalsha(sha, 1, key), 1)
        self.assertEqual(self.cluster.command(replica, 'SCRIPT', 'EXISTS', sha), [0])
        self.assertEqual(_s(self.cluster.command(replica, 'CLUSTER', 'FAILOVER')), 'OK')
        wait_until(lambda: self.cluster.master_of(self.cluster.keyslot(key)) == replica,
                   timeout=20, interval=0.1, msg='the replica promoted')
        # The promoted master lacks the script (Redis copies no script to
        # replicas); ferry loads it there ahead of the EVALSHA: no NOSCRIPT
        # reaches the client (execute_command: no library fallback).
        count = [1]

        def ran_on_replica():
            count[0] = c.execute_command('EVALSHA', sha, 1, key)
            return self.cluster.command(replica, 'SCRIPT', 'EXISTS', sha) == [1]
        wait_until(ran_on_replica, timeout=20, interval=0.1,
                   msg='an EVALSHA served by the promoted master')
        self.assertEqual(c.execute_command('EVALSHA', sha, 1, key), count[0] + 1)
        n = self.node_client(replica)
        try:
            self.assertEqual(int(n.get(key)), count[0] + 1)
        finally:
            n.close()
        c.close()


@unittest.skipIf(harness.DIRECT, 'ferry-only')
class ClusterDurableFailoverTest(KillUnderLoad, unittest.TestCase):
    """The same kill -9 with durability.replicas_ack: 1 on a cluster of 3
    masters with 2 replicas each: every acknowledged push was confirmed by a
    replica of its shard (WAIT on the link that carried it)."""

    @classmethod
    def setUpClass(cls):
        cls.cluster = ClusterTopology(masters=3, replicas=2, node_timeout_ms=2000)
        try:
            cls.ferry = start_ferry(cls.cluster, replicas_ack=1)
            wait_served(cls.ferry)
        except BaseException:
            cls.cluster.stop()
            raise

    @classmethod
    def tearDownClass(cls):
        rc = cls.ferry.stop()
        cls.cluster.stop()
        if rc != 0:  # a clean stop (and, under ASan, no report)
            raise AssertionError('ferry exited %r:\n%s' % (rc, cls.ferry.log()[-3000:]))

    def test_a_settled_cluster_is_one_map(self):
        # Nodes list a master's replicas in the order each learned them; a
        # settled cluster of 2 replicas per master must not make a new map
        # (sent to every loop) at every answer: some run of 5 refresh rounds
        # changes nothing.
        self.cluster.wait_consistent()

        def cluster_stats():
            with urllib.request.urlopen('http://127.0.0.1:%d/stats' % self.ferry.stats_port,
                                        timeout=5) as r:
                return json.loads(r.read())['cluster']
        first = cluster_stats()
        deadline = time.monotonic() + 20
        start = first
        while True:
            now = cluster_stats()
            if now['rounds'] >= start['rounds'] + 5:
                if now['changes'] == start['changes']:
                    break
                start = now
            self.assertLess(time.monotonic(), deadline,
                            'the map changed in every 5 rounds: %d changes in %d rounds' %
                            (now['changes'] - first['changes'], now['rounds'] - first['rounds']))
            time.sleep(0.05)

    def test_kill_master_under_load_replicas_ack(self):
        # 4 producers + 4 consumers (LPUSH: push receipts; RPOP and BRPOP:
        # pop receipts), every
        # item once. CLUSTER_KILL9_RUNS=20 repeats it on fresh clusters and
        # prints the table (issue: exactly once, cluster mode).
        runs = max(1, int(os.environ.get('CLUSTER_KILL9_RUNS', '1')))
        table = []
        for k in range(runs):
            if k > 0:
                self.tearDownClass()
                self.setUpClass()
            lost, ndup, st = self.kill_master_under_load(producers=4, consumers=4, exact=True)
            fo = st['failover']
            row = (k + 1, lost, ndup, fo['decided_applied'], fo['decided_not_applied'],
                   fo['requests_ambiguous'], st['durability']['pop_receipts'],
                   st['durability']['pop_receipts_found'], st['durability']['push_receipts'],
                   st['durability']['push_receipts_found'])
            table.append(row)
            print('[cluster kill9 run %d] lost %d, duplicates %d; decided applied %d, not '
                  'applied %d, ambiguous %d; pop receipts %d, found %d; push receipts %d, '
                  'found %d' % row, flush=True)
            # the pushes waited for a replica: the masters ran ferry's WAITs
            waits = sum(n.client().info('commandstats').get('cmdstat_wait', {}).get('calls', 0)
                        for n in self.cluster.running())
            self.assertGreater(waits, 0)
            self.assertGreater(row[6], 0, 'pops went with receipts')
            self.assertGreater(row[8], 0, 'pushes went with receipts')
        if runs > 1:
            print('[cluster kill9] run lost dups applied not_applied ambiguous pop_receipts found '
                  'push_receipts found')
            for row in table:
                print(' '.join(str(x) for x in row))


@unittest.skipIf(harness.DIRECT, 'ferry-only')
class ClusterRouteConfigTest(unittest.TestCase):
    """What cluster mode does not do yet is refused at `ferry -t`."""

    def check(self, text):
        d = harness._mkdtemp('ferry-cluster-route-conf-')
        path = os.path.join(d, 'ferry.yml')
        with open(path, 'w') as fh:
            fh.write('cluster:\n  nodes: [127.0.0.1:7000]\n' + text)
        return Ferry.check_config(path)

    def test_refused_with_cluster(self):
        for text, words in (('queues:\n  - keys: [q]\n    processing: "{p}{key}"\n',
                             "no '{' may come before {key}"),):
            rc, out = self.check(text)
            self.assertEqual(rc, 1, (text, out))
            self.assertIn(words, out, text)
        for workers in ('workers: 1\n', 'workers: 4\n', 'fallback:\n  path: /tmp/x.db\n',
                        'client:\n  auth: redis\n',
                        'queues:\n  - keys: [q]\n    max_length: 10\n    on_full: block\n'):
            rc, out = self.check(workers)
            self.assertEqual(rc, 0, out)
            self.assertIn('cluster mode: commands whose keys share one slot are routed', out)


if __name__ == '__main__':
    unittest.main()
