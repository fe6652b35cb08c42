"""ferry in front of a Redis Cluster with 4 event loops (workers: 4), checked
against a real 3 masters + 3 replicas cluster (harness ClusterTopology,
node-timeout 2 s), one cluster and one ferry per class:

  1. 16 clients (4 on each loop: CLIENT ID tells a client's loop) on keys of
     every shard: each loop has the map and a master view per shard; the
     stats port sums every loop's per-shard figures (requests routed).
  2. `redis-cli --cluster reshard` under a ferry that asks for the map once
     a minute: a client on a worker loop gets its keys (MOVED followed, never
     seen), and the worker's MOVED makes the main loop ask for the map (the
     stats port's map shows the moved slots well before the minute).
  3. kill -9 of one master under 8 producers + 8 consumers (4 clients on
     each loop) on 16 keys of every shard: 0 client errors, 0 acknowledged
     pushes lost.

Run:  python3 -m unittest test_cluster_workers -v        (about 40 s)
Ferry-only (skipped with FERRY_TEST_DIRECT=1).
"""
import json
import threading
import time
import unittest
import urllib.request

import harness
from harness import ClusterTopology, Ferry, wait_until

LOOPS = 4
HOLD_MS = 30000


def _s(v):
    if isinstance(v, (list, tuple)):
        return [_s(x) for x in v]
    return v.decode() if isinstance(v, bytes) else v


def stats(f):
    with urllib.request.urlopen('http://127.0.0.1:%d/stats' % f.stats_port, timeout=5) as r:
        return json.loads(r.read())


def start_ferry(cluster, refresh_ms):
    return Ferry(None, wait='port', conf={
        'workers': LOOPS,
        'cluster': {'nodes': [cluster.seeds()[0]], 'refresh_interval_ms': refresh_ms,
                    'timeout_ms': 1000},
        'upstream': {'hold_timeout_ms': HOLD_MS}})


def queue_keys(cluster, n=16):
    """n keys whose slots cover every master, in turn."""
    masters = cluster.masters()
    per = {m: [] for m in masters}
    i = 0
    while min(len(v) for v in per.values()) < n // len(masters) + 1 and i < 10000:
        k = 'wq:%d' % i
        per[cluster.master_of(cluster.keyslot(k))].append(k)
        i += 1
    keys = []
    while len(keys) < n:
        for m in masters:
            if per[m] and len(keys) < n:
                keys.append(per[m].pop(0))
    return keys


def loop_of(client):
    """The loop serving client (ids: loop i gives i + k * LOOPS)."""
    return client.client_id() % LOOPS


def clients_on_every_loop(f, n, **kw):
    """n clients through ferry, as many on each loop (asserted)."""
    cls = [f.client(**kw) for _ in range(n)]
    loops = [loop_of(c) for c in cls]
    for i in range(LOOPS):
        if loops.count(i) != n // LOOPS:
            for c in cls:
                c.close()
            raise AssertionError('clients per loop: %r' % loops)
    return cls


def wait_served(f, timeout=20.0):
    """Until every loop answers a SET on every master (each has the map)."""
    cls = clients_on_every_loop(f, LOOPS, socket_timeout=5)

    def ok():
        return all(c.set('probe:{a}', 1) and c.set('probe:{b}', 1) and c.set('probe:{c}', 1)
                   for c in cls)
    try:
        wait_until(ok, timeout=timeout, interval=0.1, msg='every loop serving the cluster')
    finally:
        for c in cls:
            c.close()


@unittest.skipIf(harness.DIRECT, 'ferry-only')
class ClusterWorkersTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.cluster = ClusterTopology(masters=3, replicas=1, node_timeout_ms=2000)
        try:
            cls.ferry = start_ferry(cls.cluster, 200)
            wait_served(cls.ferry)
        except BaseException:
            cls.cluster.stop()
            raise

    @classmethod
    def tearDownClass(cls):
        rc = cls.ferry.stop()
        cls.cluster.stop()
        if rc != 0:
            raise AssertionError('ferry exited %r:\n%s' % (rc, cls.ferry.log()[-3000:]))

    def node_client(self, port):
        return self.cluster.node_by_port(port).client(socket_timeout=5)

    def test_1_every_loop_routes_by_slot_and_the_stats_sum_them(self):
        self.cluster.wait_consistent()
        keys = queue_keys(self.cluster)
        before = {s['shard']: s['routed'] for s in stats(self.ferry)['cluster']['shards']}
        cls = clients_on_every_loop(self.ferry, 16, socket_timeout=10)
        sent = 0
        try:
            for i, c in enumerate(cls):
                for k in keys:
                    self.assertTrue(c.set(k, 'c%d' % i))
                    sent += 1
            for k in keys:
                n = self.node_client(self.cluster.master_of(self.cluster.keyslot(k)))
                try:
                    self.assertEqual(_s(n.get(k)), 'c15', k)  # on its own master
                finally:
                    n.close()
        finally:
            for c in cls:
                c.close()
        shards = stats(self.ferry)['cluster']['shards']
        self.assertEqual(len(shards), 3)
        self.assertTrue(all(s['state'] == 'UP' for s in shards), shards)
        routed = sum(s['routed'] - before.get(s['shard'], 0) for s in shards)
        # every loop's requests: one loop's alone would be a quarter
        self.assertGreaterEqual(routed, sent)
        self.assertLess(routed, sent + 50)
        # each loop has its own links to every master
        self.assertTrue(all(s['links'] >= LOOPS for s in shards),
                        [(s['shard'], s['links']) for s in shards])

    def test_2_moved_seen_by_a_worker_is_followed_and_refreshes_the_map(self):
        self.cluster.wait_consistent()
        masters = self.cluster.masters()
        src, dst = masters[0], masters[1]
        view = [v for v in self.cluster.nodes_view(src) if v['port'] == src][0]
        first = sorted(view['slots'])[:20]
        keys = []
        i = 0
        while len(keys) < 8 and i < 200000:
            k = 'wm:%d' % i
            if self.cluster.keyslot(k) in first:
                keys.append(k)
            i += 1
        self.assertEqual(len(keys), 8)
        # the map once a minute: the move is learned from a node's MOVED
        f = start_ferry(self.cluster, 60000)
        cls = []
        try:
            wait_served(f)
            cls = clients_on_every_loop(f, LOOPS, socket_timeout=10)
            worker = [c for c in cls if loop_of(c) != 0][0]
            for k in keys:
                self.assertTrue(worker.set(k, 'v' + k))
            before = stats(f)['cluster']
            self.cluster.reshard(src, dst, 20)
            t0 = time.monotonic()
            for k in keys:
                self.assertEqual(_s(worker.get(k)), 'v' + k)
                self.assertTrue(worker.set(k, 'w' + k))

            def main_map_moved():
                for s in stats(f)['cluster']['shards']:
                    if s['master']['port'] == dst:
                        return all(any(lo <= x <= hi for lo, hi in s['slots']) for x in first)
                return False
            wait_until(main_map_moved, timeout=20, interval=0.1,
                       msg="the main loop's map after a worker's MOVED")
            took = time.monotonic() - t0
            after = stats(f)['cluster']
            # every other loop follows the map the main loop sent
            for c in cls:
                for k in keys:
                    self.assertEqual(_s(c.get(k)), 'w' + k)
            n = self.node_client(dst)
            try:
                for k in keys:
                    self.assertEqual(_s(n.get(k)), 'w' + k)
            finally:
                n.close()
        finally:
            for c in cls:
                c.close()
            rc = f.stop()
        self.assertEqual(rc, 0, f.log()[-3000:])
        moved = after['moved_followed'] - before['moved_followed']
        print('\nreshard of 20 slots: %d MOVED followed by a worker loop; the main loop\'s '
              'map had the move %.2f s later' % (moved, took))
        self.assertGreater(moved, 0)
        self.assertGreater(after['rounds'], before['rounds'])
        self.assertLess(took, 30)  # well before the next periodic round (60 s)

    def test_3_kill_master_under_load_on_every_loop(self):
        self.cluster.wait_consistent()
        keys = queue_keys(self.cluster)
        owners = {k: self.cluster.master_of(self.cluster.keyslot(k)) for k in keys}
        victim = self.cluster.masters()[-1]
        c = self.ferry.client(socket_timeout=10)
        for k in keys:
            c.delete(k)
        c.close()
        cls = clients_on_every_loop(self.ferry, 16, socket_timeout=HOLD_MS / 1000 + 10)
        stop = threading.Event()
        lock = threading.Lock()
        errors, pushed, popped = [], [], []

        def producer(idx, cl):
            n = 0
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
                n += 1
                time.sleep(0.005)

        def consumer(idx, cl):
            n = 0
            while not stop.is_set():
                k = keys[(n * 3 + idx) % len(keys)]
                n += 1
                try:
                    v = cl.rpop(k)
                except Exception as e:
                    with lock:
                        errors.append('pop %s: %r' % (k, e))
                    return
                if v is not None:
                    with lock:
                        popped.append((k, _s(v)))
                time.sleep(0.005)

        # clients alternate loops: producers and consumers on every loop
        threads = [threading.Thread(target=producer if i % 2 == 0 else consumer,
                                    args=(i, cl)) for i, cl in enumerate(cls)]
        for t in threads:
            t.start()
        try:
            time.sleep(1.0)
            killed_at = time.monotonic()
            self.cluster.kill_master(victim)
            new = self.cluster.wait_promoted(victim, timeout=30)
            promoted_s = time.monotonic() - killed_at
            mark = len(pushed)
            wait_until(lambda: any(owners[k] == victim for k, _ in pushed[mark:]),
                       timeout=HOLD_MS / 1000, msg='pushes to the failed shard again')
            time.sleep(1.0)
        finally:
            stop.set()
            for t in threads:
                t.join(timeout=HOLD_MS / 1000 + 20)
            for cl in cls:
                cl.close()
        self.assertEqual(errors, [])
        left = {}
        for k in keys:
            n = self.node_client(new if owners[k] == victim else owners[k])
            try:
                left[k] = _s(n.lrange(k, 0, -1))
            finally:
                n.close()
        have = set(popped) | {(k, v) for k in keys for v in left[k]}
        lost = [p for p in pushed if p not in have]
        self.assertEqual(lost, [], 'acknowledged pushes lost: %d of %d' % (len(lost), len(pushed)))
        twice = len(popped) - len(set(popped))
        print('\nworkers: %d, kill -9 of master %d: promoted %d after %.1f s; 16 clients, '
              '%d pushes, %d pops, 0 errors, 0 lost, %d popped twice' % (
                  LOOPS, victim, new, promoted_s, len(pushed), len(popped), twice))
        shards = stats(self.ferry)['cluster']['shards']
        self.assertTrue(any(s['master']['port'] == new and s['switches'] > 0 for s in shards),
                        shards)


if __name__ == '__main__':
    unittest.main()
