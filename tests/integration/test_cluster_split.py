"""ferry in front of a Redis Cluster: MGET, MSET, DEL, UNLINK, EXISTS and
TOUCH whose keys span slots are split, one part per slot, and the client
gets the one reply a single server gives (one cluster and one ferry: 3
masters with 2 replicas each, durability.replicas_ack: 1, so a write part
acknowledged is on a replica of its shard):

  1. Each merged reply compared with what the nodes themselves hold, read
     with each key's master's own client: MGET in the client's key order
     (a key named twice, missing keys nil), MSET (each key on its master),
     EXISTS (a key named twice counts twice), TOUCH, DEL, UNLINK (sums);
     the `splits` counter on the stats port (JSON and Prometheus).
  2. MGET from a RESP3 client (HELLO 3): the exact bytes of an array of the
     elements each key's master gives (nulls as RESP3's `_`).
  3. What a node refuses across slots stays refused, word for word:
     MSETNX, RPOPLPUSH; MSET with a key lacking its value gets the node's
     arity error.
  4. Pipelined behind a split MSET, a GET of one of its keys sees what the
     MSET wrote (even one on the master of its first part, whose own part
     comes last); the replies keep their order. Also when the GET comes
     in a later read, once the MSET's part for that master is sent (4b).
  5. A part's error is the reply as the node gave it (-OOM from the
     middle master): the part before stays applied, the one after is not
     sent.
  z. kill -9 of one master while clients loop MSET / MGET / EXISTS / DEL
     over keys of every shard: 0 errors, every MGET the values written.

Run:  python3 -m unittest test_cluster_split -v
Ferry-only (skipped with FERRY_TEST_DIRECT=1); cluster mode runs one event
loop (workers: 1), so FERRY_TEST_WORKERS is not applied here.
"""
import json
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


def stats(f):
    with urllib.request.urlopen('http://127.0.0.1:%d/stats' % f.stats_port, timeout=5) as r:
        return json.loads(r.read())


def metrics(f):
    with urllib.request.urlopen('http://127.0.0.1:%d/metrics' % f.stats_port, timeout=5) as r:
        return r.read().decode()


def crc16(data):
    """CRC16-XMODEM, the cluster's key hash."""
    crc = 0
    for b in data:
        crc ^= b << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) if crc & 0x8000 else crc << 1
            crc &= 0xffff
    return crc


def keyslot(key):
    """The slot of key, {hash tag} included, computed here (checked against
    CLUSTER KEYSLOT in setUpClass)."""
    k = key.encode()
    i = k.find(b'{')
    if i >= 0:
        j = k.find(b'}', i + 1)
        if j > i + 1:
            k = k[i + 1:j]
    return crc16(k) % 16384


def slot_owners(cluster):
    """{slot: master port}, as the first running node sees it."""
    owners = {}
    for n in cluster.nodes_view(cluster.running()[0].port):
        if 'master' in n['flags'] and 'fail' not in n['flags']:
            for slot in n['slots']:
                owners[slot] = n['port']
    return owners


def spread_keys(cluster, prefix, per_master=2):
    """Keys named prefix:N, per_master of them on every master, interleaved
    so that consecutive keys live on different masters."""
    owners = slot_owners(cluster)
    masters = sorted(set(owners.values()))
    per = {m: [] for m in masters}
    i = 0
    while min(len(v) for v in per.values()) < per_master and i < 10000:
        k = '%s:%d' % (prefix, i)
        m = owners[keyslot(k)]
        if len(per[m]) < per_master:
            per[m].append(k)
        i += 1
    keys = []
    for j in range(per_master):
        for m in masters:
            keys.append(per[m][j])
    return keys


@unittest.skipIf(harness.DIRECT, 'ferry-only')
class ClusterSplitTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.cluster = ClusterTopology(masters=3, replicas=2, node_timeout_ms=2000)
        try:
            conf = {'workers': 1,
                    'cluster': {'nodes': [cls.cluster.seeds()[0]], 'refresh_interval_ms': 200,
                                'timeout_ms': 1000},
                    'durability': {'replicas_ack': 1},
                    'upstream': {'hold_timeout_ms': HOLD_MS}}
            for k in ('a', '{b}c', 'x{}y', '{}{z}', 'user:{1000}:q'):
                assert keyslot(k) == cls.cluster.keyslot(k), k
            cls.ferry = Ferry(None, wait='port', conf=conf)
            c = cls.ferry.client(socket_timeout=5)
            try:
                wait_until(lambda: all(c.set('probe:{%s}' % t, 1) for t in 'abc'),
                           timeout=20, interval=0.1, msg='ferry serving the cluster')
            finally:
                c.close()
        except BaseException:
            cls.cluster.stop()
            raise

    @classmethod
    def tearDownClass(cls):
        rc = cls.ferry.stop()
        cls.cluster.stop()
        if rc not in (0, None):
            raise AssertionError('ferry exited %r:\n%s' % (rc, cls.ferry.log()[-3000:]))

    def owner(self, key):
        return slot_owners(self.cluster)[keyslot(key)]

    def by_master(self, prefix, n=600):
        """{master port: [(slot, key)...]} of n keys prefix:N."""
        owners = slot_owners(self.cluster)
        by = {}
        for i in range(n):
            k = '%s:%d' % (prefix, i)
            by.setdefault(owners[keyslot(k)], []).append((keyslot(k), k))
        return by

    def on_node(self, key, fn):
        """fn(the client of key's master) -> its result."""
        n = self.cluster.node_by_port(self.owner(key)).client(socket_timeout=5)
        try:
            return fn(n)
        finally:
            n.close()

    def test_1_merged_replies_match_the_nodes(self):
        self.cluster.wait_consistent()
        keys = spread_keys(self.cluster, 'sp1')
        self.assertEqual(len({self.owner(k) for k in keys}), 3)
        c = self.ferry.client(socket_timeout=10)
        before = stats(self.ferry)['cluster']['splits']
        c.delete(*keys)
        written = {k: 'v-%s' % k for k in keys[:4]}   # keys[4:] stay missing
        self.assertTrue(c.mset(written))
        for k, v in written.items():
            self.assertEqual(_s(self.on_node(k, lambda n: n.get(k))), v)

        # MGET: the client's order, a key named twice, missing keys nil
        ask = [keys[5], keys[0], keys[3], keys[0], keys[4], keys[1], keys[2]]
        want = [_s(self.on_node(k, lambda n: n.get(k))) for k in ask]
        self.assertEqual(_s(c.mget(ask)), want)
        self.assertIsNone(want[0])
        self.assertEqual(want[1], want[3])

        # EXISTS counts a key named twice twice; TOUCH counts what exists
        ask = [keys[0], keys[5], keys[1], keys[0], keys[2]]
        want = sum(self.on_node(k, lambda n: n.exists(k)) for k in ask)
        self.assertEqual(c.exists(*ask), want)
        self.assertEqual(want, 4)
        self.assertEqual(c.touch(*ask), want)

        # DEL and UNLINK: the keys deleted, summed over the shards
        dels = [keys[0], keys[4], keys[1], keys[0]]
        want = len({k for k in dels if self.on_node(k, lambda n: n.exists(k))})
        self.assertEqual(c.delete(*dels), want)
        self.assertEqual(want, 2)
        for k in dels:
            self.assertEqual(self.on_node(k, lambda n: n.exists(k)), 0)
        unl = [keys[2], keys[3], keys[5]]
        want = sum(self.on_node(k, lambda n: n.exists(k)) for k in unl)
        self.assertEqual(c.unlink(*unl), want)
        self.assertEqual(want, 2)
        self.assertEqual(c.exists(*keys), 0)

        # a value of 1 MB and a binary one go through whole
        big = {keys[0]: 'x' * (1 << 20), keys[1]: '\r\n\x00$-1\r\n'}
        self.assertTrue(c.mset(big))
        self.assertEqual(_s(c.mget(keys[0], keys[2], keys[1])),
                         [big[keys[0]], None, big[keys[1]]])
        self.assertEqual(c.delete(*keys), 2)
        c.close()
        after = stats(self.ferry)['cluster']['splits']
        self.assertEqual(after - before, 11)
        m = [line for line in metrics(self.ferry).splitlines()
             if line.startswith('ferry_cluster_splits_total ')]
        self.assertEqual(len(m), 1, m)
        self.assertGreaterEqual(int(m[0].split()[1]), after)

    def test_2_resp3_mget_is_the_nodes_elements(self):
        self.cluster.wait_consistent()
        keys = spread_keys(self.cluster, 'sp2', per_master=1)
        c = self.ferry.client(socket_timeout=10)
        c.delete(*keys)
        self.assertTrue(c.mset({keys[0]: 'a', keys[2]: 'c'}))
        c.close()
        ask = [keys[2], keys[1], keys[0], keys[2]]

        def element(k):
            # the key's master's own RESP3 reply to GET k: an MGET element
            node = self.cluster.node_by_port(self.owner(k))
            s = harness.socket.create_connection(('127.0.0.1', node.port), timeout=5)
            try:
                harness.resp_send(s, ['HELLO', '3'])
                harness.resp_read_raw(s)
                harness.resp_send(s, ['GET', k])
                return harness.resp_read_raw(s)
            finally:
                s.close()
        want = b'*%d\r\n' % len(ask) + b''.join(element(k) for k in ask)
        self.assertIn(b'_\r\n', want)
        s = self.ferry.raw(timeout=10)
        try:
            harness.resp_send(s, ['HELLO', '3'])
            harness.resp_read_raw(s)
            harness.resp_send(s, ['MGET'] + ask)
            self.assertEqual(harness.resp_read_raw(s), want)
            harness.resp_send(s, ['EXISTS'] + ask)
            self.assertEqual(harness.resp_read_raw(s), b':3\r\n')
        finally:
            s.close()

    def test_3_what_a_node_refuses_stays_refused(self):
        self.cluster.wait_consistent()
        a, b = spread_keys(self.cluster, 'sp3', per_master=1)[:2]
        c = self.ferry.client(socket_timeout=10)
        node = self.cluster.node_by_port(self.owner(a)).client(socket_timeout=5)
        try:
            for argv in (['MSETNX', a, '1', b, '2'], ['RPOPLPUSH', a, b],
                         ['MSET', a, '1', b]):
                with self.assertRaises(redis.ResponseError) as want:
                    node.execute_command(*argv)
                with self.assertRaises(redis.ResponseError) as got:
                    c.execute_command(*argv)
                self.assertEqual(str(got.exception), str(want.exception), argv)
            self.assertEqual(c.exists(a, b), 0)
        finally:
            node.close()
            c.close()

    def test_4_pipelined_behind_a_split(self):
        """An MSET whose parts go to master A (slot lo), then B, then A again
        (slot hi), pipelined with a GET of hi and an MGET: the GET waits for
        the MSET's last part (sent on A's link as soon as the first part
        was, it would read the value before)."""
        self.cluster.wait_consistent()
        masters = self.cluster.masters()
        by = self.by_master('sp4')
        a = sorted(by[masters[0]])
        lo, hi = a[0][1], a[-1][1]
        b = [k for slot, k in sorted(by[masters[1]]) if a[0][0] < slot < a[-1][0]]
        if not b:
            b = [sorted(by[masters[1]])[0][1]]
        keys = [hi, b[0], lo]
        s = self.ferry.raw(timeout=10)
        try:
            out = []
            for i in range(10):
                argv = ['MSET']
                for k in keys:
                    argv += [k, '%s=%d' % (k, i)]
                out += [harness.resp_encode(*argv), harness.resp_encode('GET', hi),
                        harness.resp_encode('GET', lo), harness.resp_encode('MGET', *keys)]
            harness.resp_send(s, b''.join(out))
            for i in range(10):
                self.assertEqual(harness.resp_read_reply(s), 'OK')
                self.assertEqual(harness.resp_read_reply(s), ('%s=%d' % (hi, i)).encode())
                self.assertEqual(harness.resp_read_reply(s), ('%s=%d' % (lo, i)).encode())
                self.assertEqual(harness.resp_read_reply(s),
                                 [('%s=%d' % (k, i)).encode() for k in keys])
        finally:
            s.close()

    def test_4b_a_request_read_later_waits_for_the_split(self):
        """The same, the GET sent once the MSET's part for master A is on
        A's link (A busy in a script meanwhile): it is read in another
        turn, and still waits for the MSET's last part."""
        self.cluster.wait_consistent()
        by = self.by_master('sp4b')
        masters = sorted(by)
        a = sorted(by[masters[0]])
        lo, hi, b = a[0][1], a[-1][1], sorted(by[masters[1]])[0][1]
        port = masters[0]

        def routed():
            for sh in stats(self.ferry)['cluster']['shards']:
                if sh['master']['port'] == port:
                    return sh['routed']
            raise AssertionError('no shard with master %d' % port)
        before = routed()
        busy_ms = 1500
        script = ("local t = redis.call('TIME') local t0 = t[1] * 1000000 + t[2] "
                  "while true do t = redis.call('TIME') "
                  "if t[1] * 1000000 + t[2] - t0 > tonumber(ARGV[1]) * 1000 then break end "
                  "end return 1")
        node = self.cluster.node_by_port(port).client(socket_timeout=10)
        busy = threading.Thread(target=node.eval, args=(script, 0, busy_ms))
        busy.start()
        s = self.ferry.raw(timeout=10)
        try:
            def a_is_busy():
                probe = self.cluster.node_by_port(port).client(socket_timeout=0.1)
                try:
                    probe.ping()
                    return False
                except redis.exceptions.TimeoutError:
                    return True
                finally:
                    probe.close()
            wait_until(a_is_busy, timeout=5, interval=0.05, msg='master A in its script')
            harness.resp_send(s, ['MSET', hi, 'new-hi', b, 'new-b', lo, 'new-lo'])
            wait_until(lambda: routed() > before, timeout=5, interval=0.02,
                       msg="the MSET's first part for A sent")
            harness.resp_send(s, ['GET', hi])
            self.assertEqual(harness.resp_read_reply(s), 'OK')
            self.assertEqual(harness.resp_read_reply(s), b'new-hi')
        finally:
            s.close()
            busy.join(timeout=10)
            node.close()

    def test_5_a_parts_error_is_the_reply(self):
        """MSET over three masters whose middle part is refused (that master
        at its maxmemory: -OOM): the client gets the node's error, the part
        before it stays applied (MSET across slots is not atomic) and the
        part after it is not sent."""
        self.cluster.wait_consistent()
        by = self.by_master('sp5')
        # the masters in the order of their lowest slot: the parts' order
        masters = sorted(by, key=lambda p: min(by[p])[0])
        first, middle, last = (min(by[p])[1] for p in masters)
        keys = [last, middle, first]
        c = self.ferry.client(socket_timeout=10)
        c.delete(*keys)
        node = self.cluster.node_by_port(masters[1]).client(socket_timeout=5)
        try:
            node.config_set('maxmemory', '1')
            with self.assertRaises(redis.ResponseError) as want:
                node.set(middle, 'x')
            with self.assertRaises(redis.ResponseError) as got:
                c.mset({k: 'v-' + k for k in keys})
        finally:
            node.config_set('maxmemory', '0')
            node.close()
        self.assertTrue(str(want.exception).startswith('OOM'), str(want.exception))
        self.assertEqual(str(got.exception), str(want.exception))
        self.assertEqual(_s(self.on_node(first, lambda n: n.get(first))), 'v-' + first)
        self.assertIsNone(self.on_node(middle, lambda n: n.get(middle)))
        self.assertIsNone(self.on_node(last, lambda n: n.get(last)))
        self.assertEqual(c.delete(*keys), 1)
        c.close()

    def test_z_kill_a_master_under_split_load(self):
        self.cluster.wait_consistent()
        victim = self.cluster.masters()[-1]
        stop = threading.Event()
        lock = threading.Lock()
        errors, wrong, rounds = [], [], [0]
        ambiguous = [0]

        def loop(idx):
            keys = spread_keys(self.cluster, 'spz%d' % idx)
            cl = self.ferry.client(socket_timeout=HOLD_MS / 1000 + 10)
            n = 0
            try:
                while not stop.is_set():
                    vals = ['%d:%d:%d' % (idx, n, j) for j in range(len(keys))]
                    try:
                        cl.mset(dict(zip(keys, vals)))
                        got = _s(cl.mget(keys))
                        ex = cl.exists(*(keys + keys[:1]))
                        gone = cl.delete(*keys)
                        after = cl.exists(*keys)
                    except Exception as e:
                        with lock:
                            errors.append('client %d: %r' % (idx, e))
                        return
                    with lock:
                        if got != vals or ex != len(keys) + 1 or after != 0:
                            wrong.append((idx, n, got, vals, ex, after))
                        if gone != len(keys):
                            # a DEL part sent again after its reply was lost
                            # with the master finds its keys gone already
                            ambiguous[0] += 1
                        rounds[0] += 1
                    n += 1
            finally:
                cl.close()

        unknown0 = stats(self.ferry)['errors']['requests_retried_unknown']
        threads = [threading.Thread(target=loop, args=(i,)) for i in range(3)]
        for t in threads:
            t.start()
        try:
            wait_until(lambda: rounds[0] >= 30, timeout=30, msg='split load running')
            killed_at = time.monotonic()
            self.cluster.kill_master(victim)
            self.cluster.wait_promoted(victim, timeout=30)
            promoted_s = time.monotonic() - killed_at
            at = rounds[0]
            wait_until(lambda: rounds[0] >= at + 30 or errors, timeout=HOLD_MS / 1000,
                       msg='split load running after the failover')
        finally:
            stop.set()
            for t in threads:
                t.join(timeout=HOLD_MS / 1000 + 20)
        st = stats(self.ferry)
        unknown = st['errors']['requests_retried_unknown'] - unknown0
        print('\nkill -9 of master %d under split MSET/MGET/EXISTS/DEL: promoted after %.1f s; '
              '%d rounds, %d errors, %d wrong, %d DEL sum(s) short after a write sent again '
              '(%d retried with unknown outcome); splits %d' % (
                  victim, promoted_s, rounds[0], len(errors), len(wrong), ambiguous[0],
                  unknown, st['cluster']['splits']))
        self.assertEqual(errors, [])
        self.assertEqual(wrong, [])
        self.assertLessEqual(ambiguous[0], unknown)


if __name__ == '__main__':
    unittest.main()
