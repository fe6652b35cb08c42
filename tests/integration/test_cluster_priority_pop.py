"""The priority pop (`BRPOP high mid low 0`) across slots through ferry in
front of a real 3 masters + 3 replicas cluster (harness ClusterTopology,
one cluster and one ferry for the class). A node refuses keys of several
slots (CROSSSLOT); ferry serves the call as one server would:

  1. key order across shards: items in high, mid and low (one key per
     master): BRPOP high mid low returns high's first, then mid's, then
     low's; BLPOP takes from the left; keys of one master in other slots
     interleaved keep the client's order.
  2. all empty: the call blocks on every shard; a push to one shard wakes
     it with exactly that item, the other shards' pops are cancelled (no
     client stays blocked there) and items pushed later stay where they are.
  3. the race on purpose: two consumers blocked on two shards while both
     shards get an item at once, many times over: every item is popped
     exactly once (counted), none left behind, none twice.
  4. timeouts as Redis: 0.5 s -> nil after about 0.5 s (RESP2 nil array,
     RESP3 null), a bad timeout gets Redis' own error.
  5. BZPOPMIN / BZPOPMAX across slots: key order (not score), blocking,
     the reply [key, member, score].
  6. a client that leaves while blocked: its pops are cancelled, an item
     pushed afterwards stays in its list.
  7. ferry stopped while a call blocks on every shard: a clean exit;
     ferry's Redis user without CLIENT UNBLOCK: the other pops are ended
     by closing their links.
  8. a slot in migration: ASK followed (ASKING + the pop on the node it
     names), for the non-blocking pops and the blocking ones.
  8b-8d. durability.replicas_ack 1 (a second ferry on the same cluster):
     the pop that took the client's item is followed by a WAIT on the
     link that carried it (the node's MONITOR), the item held until a
     replica confirmed it (the replica asleep: the reply waits); an item
     a cancelled pop took is put back and a WAIT follows the put-back;
     the counters multipop_calls, multipop_put_back; a kill -9 of one
     shard's master while consumers block on keys of two shards: no
     acknowledged item lost, none popped twice, every pop on the other
     shard followed by a WAIT (INFO commandstats).
  9. a failover of a shard while blocked: the pop is sent again to the
     promoted replica and a push there wakes it.

Run:  python3 -m unittest test_cluster_priority_pop -v        (about 60 s)
Ferry-only; the first ferry runs one event loop (workers: 1), the one with
replicas_ack as many as FERRY_TEST_WORKERS says.
"""
import json
import re
import socket
import threading
import time
import unittest
import urllib.request

import redis

import harness
from harness import ClusterTopology, Ferry, wait_until

HOLD_MS = 30000


def _s(v):
    if isinstance(v, (list, tuple)):
        return [_s(x) for x in v]
    return v.decode() if isinstance(v, bytes) else v


def keys_on_masters(cluster, prefix, n_per=1):
    """For each master (sorted), n_per keys named prefix:<i> in different slots."""
    masters = cluster.masters()
    per = {m: [] for m in masters}
    slots = set()
    i = 0
    while min(len(v) for v in per.values()) < n_per and i < 5000:
        k = '%s:%d' % (prefix, i)
        i += 1
        s = cluster.keyslot(k)
        m = cluster.master_of(s)
        if s in slots or len(per[m]) >= n_per:
            continue
        slots.add(s)
        per[m].append(k)
    return [per[m] for m in masters]


def blocked_on(cluster, ports):
    return sum(int(cluster.command(p, 'INFO', 'clients')['blocked_clients']) for p in ports)


def counters(f):
    """ferry's commands section of the stats (multipop_* counters)."""
    with urllib.request.urlopen('http://127.0.0.1:%d/stats' % f.stats_port, timeout=5) as r:
        return json.load(r)['commands']


def replica_llen(port, key):
    """LLEN of key read on the replica on port (READONLY)."""
    s = socket.create_connection(('127.0.0.1', port), timeout=5)
    try:
        s.sendall(harness.resp_encode('READONLY') + harness.resp_encode('LLEN', key))
        harness.resp_read_reply(s)
        return harness.resp_read_reply(s)
    finally:
        s.close()


def waits_on(cluster, port):
    """WAIT commands the node on port ran so far (INFO commandstats)."""
    st = cluster.command(port, 'INFO', 'commandstats').get('cmdstat_wait')
    return int(st['calls']) if st else 0


class Monitor:
    """MONITOR of one node, read on a thread: (client address, argv)."""
    LINE = re.compile(r'^\+[0-9.]+ \[\d+ ([^\]]+)\] (.*)$')
    ARG = re.compile(r'"((?:[^"\\]|\\.)*)"')

    def __init__(self, port):
        self.s = socket.create_connection(('127.0.0.1', port), timeout=5)
        self.s.sendall(b'MONITOR\r\n')
        self.buf = b''
        while b'\r\n' not in self.buf:
            self.buf += self.s.recv(4096)
        head, self.buf = self.buf.split(b'\r\n', 1)
        assert head == b'+OK', head
        self.seen = []
        self.lock = threading.Lock()
        self.stopped = threading.Event()
        self.s.settimeout(0.1)
        self.t = threading.Thread(target=self._run, daemon=True)
        self.t.start()

    def _run(self):
        while not self.stopped.is_set():
            try:
                data = self.s.recv(65536)
            except socket.timeout:
                continue
            except OSError:
                return
            if not data:
                return
            self.buf += data
            while b'\r\n' in self.buf:
                line, self.buf = self.buf.split(b'\r\n', 1)
                m = self.LINE.match(line.decode(errors='replace'))
                if m:
                    with self.lock:
                        self.seen.append((m.group(1), self.ARG.findall(m.group(2))))

    def commands(self):
        with self.lock:
            return list(self.seen)

    def followed_by_wait(self, name, key):
        """The clients that sent name (a command of key) and a WAIT after it."""
        seen = self.commands()
        out = []
        for i, (addr, argv) in enumerate(seen):
            if argv and argv[0].upper() == name and key in argv[1:]:
                if any(a == addr and v and v[0].upper() == 'WAIT' for a, v in seen[i + 1:]):
                    out.append(addr)
        return out

    def close(self):
        self.stopped.set()
        self.t.join(timeout=5)
        self.s.close()


@unittest.skipIf(harness.DIRECT, 'ferry-only: a node refuses keys of several slots')
class PriorityPopAcrossSlotsTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.cluster = ClusterTopology(masters=3, replicas=1)
        try:
            conf = {'workers': 1,
                    'cluster': {'nodes': [cls.cluster.seeds()[0]], 'refresh_interval_ms': 200,
                                'timeout_ms': 1000},
                    'upstream': {'hold_timeout_ms': HOLD_MS}}
            cls.ferry = Ferry(None, wait='port', conf=conf)
            # the same cluster behind a ferry with durability.replicas_ack 1
            # (workers: FERRY_TEST_WORKERS, one loop unless set)
            cls.ack = None
            ack_conf = {k: v for k, v in conf.items() if k != 'workers'}
            ack_conf['durability'] = {'replicas_ack': 1, 'replicas_ack_hold_ms': 20000}
            cls.ack = Ferry(None, wait='port', conf=ack_conf)
            for f in (cls.ferry, cls.ack):
                c = f.client(socket_timeout=5)
                try:
                    wait_until(lambda: all(c.set('probe:{%s}' % t, 1) for t in 'abc'),
                               timeout=20, interval=0.1, msg='ferry serving the cluster')
                finally:
                    c.close()
        except BaseException:
            for f in (getattr(cls, 'ferry', None), getattr(cls, 'ack', None)):
                if f is not None:
                    f.stop()
            cls.cluster.stop()
            raise

    @classmethod
    def tearDownClass(cls):
        rc = cls.ferry.stop()
        rc_ack = cls.ack.stop()
        cls.cluster.stop()
        if rc != 0:
            raise AssertionError('ferry exited %r:\n%s' % (rc, cls.ferry.log()[-3000:]))
        if rc_ack != 0:
            raise AssertionError('ferry (replicas_ack) exited %r:\n%s' % (
                rc_ack, cls.ack.log()[-3000:]))

    def setUp(self):
        self.cluster.wait_consistent()
        self.c = self.ferry.client(socket_timeout=HOLD_MS / 1000 + 10)

    def tearDown(self):
        self.c.close()

    def three(self, prefix):
        """high, mid, low: one key on each master; and the masters' ports."""
        keys = [ks[0] for ks in keys_on_masters(self.cluster, prefix)]
        for k in keys:
            self.c.delete(k)
        ports = [self.cluster.master_of(self.cluster.keyslot(k)) for k in keys]
        self.assertEqual(len(set(ports)), 3, ports)
        return keys, ports

    def test_1_key_order_across_shards(self):
        (high, mid, low), _ = self.three('order')
        self.c.lpush(low, 'l1', 'l2')
        self.c.lpush(mid, 'm1', 'm2')
        self.c.lpush(high, 'h1', 'h2')
        got = [_s(self.c.brpop([high, mid, low], timeout=0)) for _ in range(6)]
        self.assertEqual(got, [[high, 'h1'], [high, 'h2'], [mid, 'm1'], [mid, 'm2'],
                               [low, 'l1'], [low, 'l2']])
        # mid empty, low and high not: high first, then low
        self.c.lpush(low, 'l3')
        self.c.lpush(high, 'h3')
        self.assertEqual(_s(self.c.brpop([high, mid, low], timeout=1)), [high, 'h3'])
        self.assertEqual(_s(self.c.brpop([high, mid, low], timeout=1)), [low, 'l3'])
        # BLPOP: the left end, the same order
        self.c.rpush(mid, 'a', 'b')
        self.c.rpush(low, 'c')
        self.assertEqual(_s(self.c.blpop([high, mid, low], timeout=0)), [mid, 'a'])
        self.assertEqual(_s(self.c.blpop([high, mid, low], timeout=0)), [mid, 'b'])
        self.assertEqual(_s(self.c.blpop([high, mid, low], timeout=0)), [low, 'c'])
        # two keys of one master in other slots, interleaved with another master's
        per = keys_on_masters(self.cluster, 'inter', n_per=2)
        a1, a2 = per[0]
        b1 = per[1][0]
        for k in (a1, a2, b1):
            self.c.delete(k)
        self.c.lpush(a2, 'a2')
        self.c.lpush(b1, 'b1')
        self.assertEqual(_s(self.c.brpop([a1, b1, a2], timeout=1)), [b1, 'b1'])
        self.assertEqual(_s(self.c.brpop([a1, b1, a2], timeout=1)), [a2, 'a2'])
        for k in (high, mid, low, a1, a2, b1):
            self.assertEqual(self.c.llen(k), 0, k)

    def test_2_block_then_one_push_wakes_it_with_one_item(self):
        (high, mid, low), ports = self.three('wake')
        before = blocked_on(self.cluster, ports)
        got = {}

        def consumer():
            cl = self.ferry.client(socket_timeout=20)
            try:
                got['v'] = _s(cl.brpop([high, mid, low], timeout=0))
                got['t'] = time.monotonic()
            finally:
                cl.close()
        t = threading.Thread(target=consumer)
        t.start()
        wait_until(lambda: blocked_on(self.cluster, ports) >= before + 3, timeout=5,
                   msg='the call blocked on every shard')
        self.c.lpush(mid, 'm1')
        t.join(timeout=10)
        self.assertFalse(t.is_alive())
        self.assertEqual(got['v'], [mid, 'm1'])
        # the other shards' pops were cancelled: nobody left blocked there
        wait_until(lambda: blocked_on(self.cluster, ports) == before, timeout=5,
                   msg='the cancelled pops gone')
        self.c.lpush(high, 'h1')
        self.c.lpush(low, 'l1')
        time.sleep(0.2)  # what a pop left behind would take now
        self.assertEqual(_s(self.c.lrange(high, 0, -1)), ['h1'])
        self.assertEqual(_s(self.c.lrange(low, 0, -1)), ['l1'])
        self.assertEqual(self.c.llen(mid), 0)

    def test_3_race_every_item_popped_once(self):
        self.race(self.ferry, 'race', 150)

    def test_3b_race_with_replicas_ack(self):
        # the same race through the ferry with replicas_ack 1: items put
        # back with a WAIT behind each, every item still popped once
        before = counters(self.ack)
        self.race(self.ack, 'racew', 60)
        after = counters(self.ack)
        self.assertGreater(after['multipop_calls'], before['multipop_calls'])
        print('  %d put back' % (after['multipop_put_back'] - before['multipop_put_back']))

    def race(self, ferry, prefix, rounds):
        (a, b, _), ports = self.three(prefix)
        popped, errors = [], []
        lock = threading.Lock()
        stop = threading.Event()

        def consumer():
            cl = ferry.client(socket_timeout=20)
            try:
                while True:
                    try:
                        v = cl.brpop([a, b], timeout=0.3)
                    except Exception as e:
                        with lock:
                            errors.append(repr(e))
                        return
                    if v is not None:
                        with lock:
                            popped.append(tuple(_s(v)))
                    elif stop.is_set():
                        return
            finally:
                cl.close()
        threads = [threading.Thread(target=consumer) for _ in range(2)]
        for t in threads:
            t.start()
        pushed = []
        p = ferry.client(socket_timeout=20)
        try:
            for i in range(rounds):
                # both consumers blocked on both shards, then an item on each
                # at once (one pipeline: ferry sends both on their shards'
                # links in the same turn)
                wait_until(lambda: blocked_on(self.cluster, ports[:2]) >= 4, timeout=5,
                           interval=0.002, msg='both consumers blocked on both shards')
                pipe = p.pipeline(transaction=False)
                pipe.lpush(a, 'a%d' % i)
                pipe.lpush(b, 'b%d' % i)
                pipe.execute()
                pushed += [(a, 'a%d' % i), (b, 'b%d' % i)]
                wait_until(lambda: len(popped) >= len(pushed), timeout=5, interval=0.002,
                           msg='round %d popped' % i)
        finally:
            stop.set()
            for t in threads:
                t.join(timeout=10)
            p.close()
        self.assertEqual(errors, [])
        left = [(a, v) for v in _s(self.c.lrange(a, 0, -1))] + \
               [(b, v) for v in _s(self.c.lrange(b, 0, -1))]
        self.assertEqual(left, [])
        self.assertEqual(len(popped), len(set(popped)), 'an item popped twice')
        self.assertEqual(sorted(popped), sorted(pushed))
        back = len(re.findall(r'taken by a cancelled pop goes back', ferry.log()))
        print('\n  race: %d rounds, %d items popped once each; %d taken by a cancelled pop '
              'went back (in this ferry\'s life)' % (rounds, len(popped), back))

    def test_4_timeouts_as_redis(self):
        (a, b, c), _ = self.three('tmo')
        t0 = time.monotonic()
        self.assertIsNone(self.c.brpop([a, b, c], timeout=0.5))
        took = time.monotonic() - t0
        self.assertGreaterEqual(took, 0.45)
        self.assertLess(took, 5.0)  # a bound on a hang
        t0 = time.monotonic()
        self.assertIsNone(self.c.bzpopmin([a, b], timeout=0.3))
        self.assertGreaterEqual(time.monotonic() - t0, 0.25)
        # a bad timeout: Redis' own words
        for bad, want in (('x', 'timeout is not a float or out of range'),
                          ('-1', 'timeout is negative')):
            with self.assertRaises(redis.ResponseError) as e:
                self.c.execute_command('BRPOP', a, b, bad)
            self.assertEqual(str(e.exception), want)
        # RESP3: the null
        s = socket.create_connection(('127.0.0.1', self.ferry.port), timeout=5)
        try:
            t0 = time.monotonic()
            s.sendall(('HELLO 3\r\nBRPOP %s %s 0.3\r\n' % (a, b)).encode())
            buf = b''
            while not buf.endswith(b'_\r\n') and time.monotonic() - t0 < 5:
                buf += s.recv(4096)
            self.assertTrue(buf.endswith(b'_\r\n'), buf[-200:])
            self.assertGreaterEqual(time.monotonic() - t0, 0.25)
        finally:
            s.close()
        # the connection goes on after a timeout
        self.c.lpush(b, 'x')
        self.assertEqual(_s(self.c.brpop([a, b], timeout=1)), [b, 'x'])

    def test_5_bzpopmin_and_bzpopmax_across_slots(self):
        (a, b, c), ports = self.three('z')
        self.c.zadd(b, {'low-score': 1})
        self.c.zadd(a, {'high-score': 5, 'higher': 7})
        # key order first, whatever the scores
        self.assertEqual(_s(self.c.bzpopmin([a, b, c], timeout=0)), [a, 'high-score', 5.0])
        self.assertEqual(_s(self.c.bzpopmax([a, b, c], timeout=0)), [a, 'higher', 7.0])
        self.assertEqual(_s(self.c.bzpopmin([a, b, c], timeout=0)), [b, 'low-score', 1.0])
        before = blocked_on(self.cluster, ports)
        got = {}

        def consumer():
            cl = self.ferry.client(socket_timeout=20)
            try:
                got['v'] = _s(cl.bzpopmin([a, b, c], timeout=10))
            finally:
                cl.close()
        t = threading.Thread(target=consumer)
        t.start()
        wait_until(lambda: blocked_on(self.cluster, ports) >= before + 3, timeout=5,
                   msg='BZPOPMIN blocked on every shard')
        self.c.zadd(c, {'m': 2.5})
        t.join(timeout=10)
        self.assertEqual(got['v'], [c, 'm', 2.5])
        wait_until(lambda: blocked_on(self.cluster, ports) == before, timeout=5,
                   msg='the cancelled pops gone')
        for k in (a, b, c):
            self.assertEqual(self.c.zcard(k), 0)
        # RESP3: the score is a double in the reply ferry builds from a ZPOPMIN
        self.c.zadd(b, {'r3': 1.5})
        s = socket.create_connection(('127.0.0.1', self.ferry.port), timeout=5)
        try:
            s.sendall(('HELLO 3\r\nBZPOPMIN %s %s %s 1\r\n' % (a, b, c)).encode())
            want = ('*3\r\n$%d\r\n%s\r\n$2\r\nr3\r\n,1.5\r\n' % (len(b), b)).encode()
            buf, t0 = b'', time.monotonic()
            while not buf.endswith(want) and time.monotonic() - t0 < 5:
                buf += s.recv(4096)
            self.assertTrue(buf.endswith(want), buf[-200:])
        finally:
            s.close()
        self.assertEqual(self.c.zcard(b), 0)

    def test_6_client_leaves_while_blocked(self):
        (a, b, c), ports = self.three('gone')
        before = blocked_on(self.cluster, ports)
        s = socket.create_connection(('127.0.0.1', self.ferry.port), timeout=5)
        s.sendall(('BRPOP %s %s %s 0\r\n' % (a, b, c)).encode())
        wait_until(lambda: blocked_on(self.cluster, ports) >= before + 3, timeout=5,
                   msg='the call blocked on every shard')
        s.close()
        wait_until(lambda: blocked_on(self.cluster, ports) == before, timeout=5,
                   msg='its pops cancelled once its client left')
        self.c.lpush(b, 'kept')
        time.sleep(0.2)
        self.assertEqual(_s(self.c.lrange(b, 0, -1)), ['kept'])

    def test_7_ferry_stops_while_blocked(self):
        # a ferry of its own: stopped while a call blocks on every shard, it
        # exits cleanly (under ASan: no report) and cancels the pops
        (a, b, c), ports = self.three('stop')
        before = blocked_on(self.cluster, ports)
        conf = {'workers': 1, 'shutdown_timeout_ms': 500,
                'cluster': {'nodes': [self.cluster.seeds()[0]], 'refresh_interval_ms': 200,
                            'timeout_ms': 1000}}
        f = Ferry(None, wait='port', conf=conf)
        s = None
        try:
            cl = f.client(socket_timeout=5)
            wait_until(lambda: cl.set('probe:{a}', 1) and cl.set('probe:{b}', 1),
                       timeout=20, interval=0.1, msg='the second ferry serving')
            cl.close()
            s = socket.create_connection(('127.0.0.1', f.port), timeout=5)
            s.sendall(('BRPOP %s %s %s 0\r\n' % (a, b, c)).encode())
            wait_until(lambda: blocked_on(self.cluster, ports) >= before + 3, timeout=5,
                       msg='the call blocked on every shard')
        finally:
            rc = f.stop()
            if s is not None:
                s.close()
        self.assertEqual(rc, 0, f.log()[-3000:])
        wait_until(lambda: blocked_on(self.cluster, ports) == before, timeout=5,
                   msg='its pops gone with the links of the ferry that stopped')
        self.c.lpush(a, 'kept')
        self.assertEqual(_s(self.c.lrange(a, 0, -1)), ['kept'])

    def test_7b_client_unblock_refused_to_ferry(self):
        # ferry's Redis user may not run CLIENT UNBLOCK: a cancelled pop's
        # connection is closed instead; the call is served all the same
        (a, b, c), ports = self.three('acl')
        for n in self.cluster.running():
            self.cluster.command(n.port, 'ACL', 'SETUSER', 'popper', 'on', '>pw', '~*', '&*',
                                 '+@all', '-client|unblock')
        conf = {'workers': 1, 'redis': {'username': 'popper', 'password': 'pw'},
                'cluster': {'nodes': [self.cluster.seeds()[0]], 'refresh_interval_ms': 200,
                            'timeout_ms': 1000}}
        f = Ferry(None, wait='port', conf=conf)
        try:
            cl = f.client(socket_timeout=10)
            wait_until(lambda: cl.set('probe:{a}', 1) and cl.set('probe:{b}', 1),
                       timeout=20, interval=0.1, msg='the second ferry serving')
            before = blocked_on(self.cluster, ports)
            got = {}

            def consumer():
                k = f.client(socket_timeout=20)
                try:
                    got['v'] = _s(k.brpop([a, b, c], timeout=0))
                finally:
                    k.close()
            t = threading.Thread(target=consumer)
            t.start()
            wait_until(lambda: blocked_on(self.cluster, ports) >= before + 3, timeout=5,
                       msg='the call blocked on every shard')
            cl.lpush(c, 'z')
            t.join(timeout=10)
            self.assertEqual(got.get('v'), [c, 'z'])
            wait_until(lambda: blocked_on(self.cluster, ports) == before, timeout=5,
                       msg='the other pops ended by closing their links')
            self.assertIn('CLIENT UNBLOCK refused', f.log())
            cl.lpush(a, 'kept')
            self.assertEqual(_s(cl.lrange(a, 0, -1)), ['kept'])
            cl.delete(a)
            cl.close()
        finally:
            rc = f.stop()
            for n in self.cluster.running():
                self.cluster.command(n.port, 'ACL', 'DELUSER', 'popper')
        self.assertEqual(rc, 0, f.log()[-3000:])

    def test_8_ask_during_migration(self):
        masters = self.cluster.masters()
        src, dst, other = masters[0], masters[2], masters[1]
        ids = {v['port']: v['id'] for v in self.cluster.nodes_view(src)}
        view = [v for v in self.cluster.nodes_view(src) if v['port'] == src][0]
        slot = next(s for s in sorted(view['slots'])
                    if self.cluster.command(src, 'CLUSTER', 'COUNTKEYSINSLOT', s) == 0)
        key = next('pask:%d' % i for i in range(200000)
                   if self.cluster.keyslot('pask:%d' % i) == slot)
        b = next(ks[0] for ks in keys_on_masters(self.cluster, 'paskb') if
                 self.cluster.master_of(self.cluster.keyslot(ks[0])) == other)
        self.c.delete(b)
        self.cluster.command(dst, 'CLUSTER', 'SETSLOT', slot, 'IMPORTING', ids[src])
        self.cluster.command(src, 'CLUSTER', 'SETSLOT', slot, 'MIGRATING', ids[dst])
        try:
            # src lacks the key and the slot migrates: ASK, followed by ferry
            self.assertEqual(self.c.lpush(key, 'x'), 1)
            self.assertEqual(_s(self.c.brpop([b, key], timeout=0)), [key, 'x'])
            before = blocked_on(self.cluster, [dst, other])
            got = {}

            def consumer():
                cl = self.ferry.client(socket_timeout=20)
                try:
                    got['v'] = _s(cl.brpop([b, key], timeout=10))
                finally:
                    cl.close()
            t = threading.Thread(target=consumer)
            t.start()
            # its pop of key blocks on dst (after ASKING), b's on its master
            wait_until(lambda: blocked_on(self.cluster, [dst, other]) >= before + 2, timeout=5,
                       msg='the pops blocked on dst and on b\'s master')
            self.assertEqual(self.c.lpush(key, 'y'), 1)
            t.join(timeout=10)
            self.assertEqual(got.get('v'), [key, 'y'])
            self.assertEqual(self.cluster.command(dst, 'CLUSTER', 'COUNTKEYSINSLOT', slot), 0)
        finally:
            for port in (src, dst):
                self.cluster.command(port, 'CLUSTER', 'SETSLOT', slot, 'STABLE')
            self.cluster.wait_consistent()

    # ---- durability.replicas_ack 1: the WAITs of the priority pop

    def test_8b_replicas_ack_wait_after_the_winning_pop(self):
        (high, mid, low), ports = self.three('ackw')
        ca = self.ack.client(socket_timeout=30)
        before = counters(self.ack)
        mons = [Monitor(p) for p in ports]
        try:
            # a non-blocking pop takes mid's item (pushed on the node itself:
            # no write of ferry's own on that master but the pop)
            self.cluster.command(ports[1], 'LPUSH', mid, 'm1')
            self.assertEqual(_s(ca.brpop([high, mid, low], timeout=0)), [mid, 'm1'])
            wait_until(lambda: mons[1].followed_by_wait('RPOP', mid), timeout=5,
                       msg='a WAIT behind the RPOP that took the item, on its link')
            # blocked on every shard: the blocking pop that took low's item
            got = {}

            def consumer():
                cl = self.ack.client(socket_timeout=30)
                try:
                    got['v'] = _s(cl.brpop([high, mid, low], timeout=0))
                finally:
                    cl.close()
            held = blocked_on(self.cluster, ports)
            t = threading.Thread(target=consumer)
            t.start()
            wait_until(lambda: blocked_on(self.cluster, ports) >= held + 3, timeout=5,
                       msg='the call blocked on every shard')
            self.cluster.command(ports[2], 'LPUSH', low, 'l1')
            t.join(timeout=15)
            self.assertEqual(got.get('v'), [low, 'l1'])
            wait_until(lambda: mons[2].followed_by_wait('BRPOP', low), timeout=5,
                       msg='a WAIT behind the BRPOP that took the item, on its link')
            # the item is held until a replica has it: mid's replica asleep,
            # the reply waits for it to wake
            rep = self.cluster.replicas_of(ports[1])[0]
            self.cluster.command(ports[1], 'LPUSH', mid, 'm2')
            wait_until(lambda: replica_llen(rep, mid) == 1, timeout=5,
                       msg='the replica has the item')
            sleeper = socket.create_connection(('127.0.0.1', rep), timeout=5)
            try:
                sleeper.sendall(b'DEBUG SLEEP 1.5\r\n')
                t0 = time.monotonic()
                self.assertEqual(_s(ca.brpop([high, mid, low], timeout=0)), [mid, 'm2'])
                took = time.monotonic() - t0
                self.assertEqual(harness.resp_read_reply(sleeper, timeout=10), 'OK')
            finally:
                sleeper.close()
            self.assertGreater(took, 1.0, 'the item was not held for its WAIT')
            print('\n  replicas_ack: the item held %.2f s for the sleeping replica' % took)
            # a pop whose keys share a slot is not the priority pop
            self.assertIsNone(ca.brpop([mid], timeout=0.1))
            after = counters(self.ack)
            self.assertEqual(after['multipop_calls'] - before['multipop_calls'], 3)
            self.assertEqual(after['multipop_unconfirmed'], before['multipop_unconfirmed'])
        finally:
            for m in mons:
                m.close()
            ca.close()

    def test_8c_replicas_ack_wait_after_a_put_back(self):
        # made to happen: a's master sleeps while b's item wins; when it
        # wakes, the push to a (in the same read as the sleep) is served to
        # the pop ferry is cancelling: that item goes back, then a WAIT
        (a, b, _), ports = self.three('ackb')
        before = counters(self.ack)
        mon = Monitor(ports[0])
        got = {}

        def consumer():
            cl = self.ack.client(socket_timeout=30)
            try:
                got['v'] = _s(cl.brpop([a, b], timeout=0))
            finally:
                cl.close()
        try:
            held = blocked_on(self.cluster, ports[:2])
            t = threading.Thread(target=consumer)
            t.start()
            wait_until(lambda: blocked_on(self.cluster, ports[:2]) >= held + 2, timeout=5,
                       msg='the call blocked on both shards')
            sleeper = socket.create_connection(('127.0.0.1', ports[0]), timeout=5)
            try:
                sleeper.sendall(('DEBUG SLEEP 0.5\r\nLPUSH %s x\r\n' % a).encode())
                self.cluster.command(ports[1], 'LPUSH', b, 'y')
                t.join(timeout=15)
                self.assertEqual(got.get('v'), [b, 'y'])
                self.assertEqual(harness.resp_read_reply(sleeper, timeout=10), 'OK')
                self.assertEqual(harness.resp_read_reply(sleeper, timeout=10), 1)
            finally:
                sleeper.close()
            wait_until(lambda: counters(self.ack)['multipop_put_back'] >
                       before['multipop_put_back'], timeout=10, msg='the item put back')
            wait_until(lambda: mon.followed_by_wait('RPUSH', a), timeout=5,
                       msg='a WAIT behind the put-back, on its link')
            self.assertEqual(_s(self.c.lrange(a, 0, -1)), ['x'])
            self.assertEqual(self.c.llen(b), 0)
            after = counters(self.ack)
            self.assertEqual(after['multipop_put_back'] - before['multipop_put_back'], 1)
            self.assertEqual(after['multipop_calls'] - before['multipop_calls'], 1)
            self.assertEqual(after['multipop_unconfirmed'], before['multipop_unconfirmed'])
        finally:
            mon.close()
            self.c.delete(a)

    def test_8d_replicas_ack_kill_master_while_blocked_on_two_shards(self):
        (a, b, _), ports = self.three('ackk')
        victim, other = ports[0], ports[1]
        waits0 = waits_on(self.cluster, other)
        stop = threading.Event()
        lock = threading.Lock()
        errors, pushed, popped = [], [], []

        def consumer():
            cl = self.ack.client(socket_timeout=HOLD_MS / 1000 + 10)
            try:
                while not stop.is_set() or len(popped) < len(pushed):
                    try:
                        v = cl.brpop([a, b], timeout=0.5)
                    except Exception as e:
                        with lock:
                            errors.append('pop: %r' % e)
                        return
                    if v is not None:
                        with lock:
                            popped.append(tuple(_s(v)))
                    elif stop.is_set():
                        return
            finally:
                cl.close()

        def producer():
            cl = self.ack.client(socket_timeout=HOLD_MS / 1000 + 10)
            n = 0
            try:
                while not stop.is_set():
                    k = (a, b)[n % 2]
                    v = 'v%d' % n
                    n += 1
                    try:
                        cl.lpush(k, v)
                    except Exception as e:
                        with lock:
                            errors.append('push %s: %r' % (k, e))
                        return
                    with lock:
                        pushed.append((k, v))
                    time.sleep(0.01)
            finally:
                cl.close()
        threads = [threading.Thread(target=consumer) for _ in range(4)]
        threads.append(threading.Thread(target=producer))
        for t in threads:
            t.start()
        new = None
        try:
            wait_until(lambda: errors or len(popped) >= 40, timeout=20, msg='items flowing')
            self.cluster.kill_master(victim)
            new = self.cluster.wait_promoted(victim)
            # back at once, as a replica of the promoted one: writes to its
            # shard wait for it (replicas_ack 1, replicas_ack_hold_ms)
            self.cluster.node_by_port(victim).start()
            mark = len(pushed)
            wait_until(lambda: errors or (any(k == a for k, _ in pushed[mark:]) and
                                          len(popped) >= mark + 10), timeout=HOLD_MS / 1000,
                       msg='items of both shards flowing after the failover')
        finally:
            stop.set()
            for t in threads:
                t.join(timeout=HOLD_MS / 1000 + 20)
            if victim not in [n.port for n in self.cluster.running()]:
                self.cluster.node_by_port(victim).start()  # for the tests after
        self.cluster.wait_consistent()
        self.assertEqual(errors, [])
        left = [(a, v) for v in _s(self.c.lrange(a, 0, -1))] + \
               [(b, v) for v in _s(self.c.lrange(b, 0, -1))]
        twice = sorted(p for p in set(popped) if popped.count(p) > 1)
        lost = [p for p in pushed if p not in set(popped) | set(left)]
        pops_b = sum(1 for k, _ in popped if k == b)
        pushes_b = sum(1 for k, _ in pushed if k == b)
        waits = waits_on(self.cluster, other) - waits0
        print('\n  replicas_ack, kill -9 of %d (promoted %d): %d pushes, %d pops, %d left, '
              '%d lost, %d popped twice; %d WAITs on the other shard for %d pushes and %d pops'
              % (victim, new, len(pushed), len(popped), len(left), len(lost), len(twice),
                 waits, pushes_b, pops_b))
        self.assertEqual(lost, [], 'acknowledged items lost')
        self.assertEqual(twice, [], 'items popped twice')
        self.assertEqual(left, [])
        # each push and each pop on the other shard was followed by its WAIT
        self.assertGreaterEqual(waits, pushes_b + pops_b)
        self.cluster.wait_consistent()
        wait_until(lambda: self.cluster.replicas_of(new) == [victim], timeout=30,
                   msg='the old master back as a replica')

    def test_9_failover_while_blocked(self):
        (a, b, c), ports = self.three('fo')
        victim = ports[1]
        got = {}

        def consumer():
            cl = self.ferry.client(socket_timeout=60)
            try:
                got['v'] = _s(cl.brpop([a, b, c], timeout=0))
            except Exception as e:
                got['e'] = repr(e)
            finally:
                cl.close()
        t = threading.Thread(target=consumer)
        t.start()
        wait_until(lambda: blocked_on(self.cluster, ports) >= 3, timeout=5,
                   msg='the call blocked on every shard')
        self.cluster.kill_master(victim)
        new = self.cluster.wait_promoted(victim)
        # once ferry has the promoted replica, its pop is there again
        wait_until(lambda: int(self.cluster.command(new, 'INFO', 'clients')['blocked_clients'])
                   >= 1, timeout=20, msg='the pop sent again to the promoted replica')
        self.c.lpush(b, 'after')
        t.join(timeout=20)
        self.assertEqual(got.get('v'), [b, 'after'], got)
        wait_until(lambda: blocked_on(self.cluster, [ports[0], ports[2], new]) == 0, timeout=5,
                   msg='the cancelled pops gone')


if __name__ == '__main__':
    unittest.main()
