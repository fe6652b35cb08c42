"""ferry learns a Redis Cluster's slot map (cluster/), checked against a real
3 masters + 3 replicas cluster (harness.ClusterTopology, node-timeout 2 s):

  1. The map ferry shows on its stats port equals CLUSTER SHARDS of every
     node: each slot's master, each master's replicas.
  2. ferry's key slot equals CLUSTER KEYSLOT of a node for keys with and
     without {hash tags}, empty tags, binary bytes (the C function through
     the unit test binary's --keyslot mode).
  3. Nodes that say nonsense do not move the map: a fake node that answers
     CLUSTER NODES with a claim at a very high config epoch and CLUSTER
     SHARDS with wrong types, slots out of range, missing fields; and a real
     node of another (one-node) cluster that claims every slot at epoch 0.
  4. kill -9 of a master: the map shows its promoted replica within a
     deadline (figure printed); the old master, restarted, comes back a
     replica and never takes its slots back.
  5. A reshard of 100 slots: the map follows.

`ferry -t` says what cluster mode routes; the stats port shows the map
(test_cluster_route checks the serving).

One cluster and one ferry per class (setUpClass), stopped by pid.
Run:  python3 -m unittest test_cluster_map -v        (about 40 s)
Ferry-only (skipped with FERRY_TEST_DIRECT=1).
"""
import json
import os
import random
import socket
import subprocess
import threading
import time
import unittest
import urllib.request

import harness
from harness import (ClusterTopology, Ferry, RedisServer, free_port, wait_until)

REFRESH_MS = 200
PROMOTE_DEADLINE = 20.0   # kill -9 to the promoted replica in ferry's map


def ferry_map(f):
    """ferry's stats JSON (cluster mode) -> (doc, {slot: 'host:port'},
    {'host:port' of a master: sorted replica 'host:port's})."""
    with urllib.request.urlopen('http://127.0.0.1:%d/stats' % f.stats_port, timeout=5) as r:
        doc = json.loads(r.read())
    owners, replicas = {}, {}
    for sh in doc['cluster']['shards']:
        m = '%s:%d' % (sh['master']['host'], sh['master']['port'])
        for lo, hi in sh['slots']:
            for s in range(lo, hi + 1):
                owners[s] = m
        replicas[m] = sorted('%s:%d' % (r['host'], r['port']) for r in sh['replicas'])
    return doc, owners, replicas


def _s(v):
    return v.decode() if isinstance(v, bytes) else v


def shards_map(reply):
    """A node's CLUSTER SHARDS (raw RESP, harness) -> ({slot: master},
    {master: sorted live replicas}), as ferry is meant to read it."""
    owners, replicas = {}, {}
    for sh in reply:
        d = {_s(sh[i]): sh[i + 1] for i in range(0, len(sh), 2)}
        nodes = [{_s(n[i]): _s(n[i + 1]) for i in range(0, len(n), 2)} for n in d['nodes']]
        masters = [n for n in nodes if n['role'] == 'master' and n['health'] != 'failed']
        if not masters or not d['slots']:
            continue
        m = '%s:%d' % (masters[0]['endpoint'], masters[0]['port'])
        sl = d['slots']
        for i in range(0, len(sl), 2):
            for s in range(sl[i], sl[i + 1] + 1):
                owners[s] = m
        replicas[m] = sorted('%s:%d' % (n['endpoint'], n['port']) for n in nodes
                             if n['role'] != 'master')
    return owners, replicas


class FakeNode:
    """A TCP server that answers CLUSTER NODES with a valid-looking view in
    which it is a master of every slot at config epoch 999, and CLUSTER
    SHARDS / SLOTS with one nonsense reply after another."""

    NONSENSE = [
        b':7\r\n',
        b'*1\r\n:5\r\n',
        b'*1\r\n*4\r\n$5\r\nslots\r\n*2\r\n:0\r\n:16384\r\n$5\r\nnodes\r\n*0\r\n',
        b'*1\r\n*4\r\n$5\r\nslots\r\n*2\r\n:0\r\n:16383\r\n$5\r\nnodes\r\n*1\r\n:1\r\n',
        b'*1\r\n*4\r\n$5\r\nslots\r\n*2\r\n$1\r\nx\r\n:9\r\n$5\r\nnodes\r\n*0\r\n',
        b'*1\r\n*2\r\n$5\r\nslots\r\n*2\r\n:0\r\n:16383\r\n',
        b'*1\r\n*4\r\n$5\r\nslots\r\n*2\r\n:0\r\n:16383\r\n$5\r\nnodes\r\n*1\r\n*4\r\n'
        b'$2\r\nid\r\n$40\r\n' + b'f' * 40 + b'\r\n$4\r\nport\r\n:99999\r\n',
        b'$5\r\nhello\r\n',
    ]

    def __init__(self):
        self.port = free_port()
        self.id = 'f' * 40
        self.served = 0
        self.srv = socket.socket()
        self.srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.srv.bind(('127.0.0.1', self.port))
        self.srv.listen(16)
        self.stopping = False
        self.t = threading.Thread(target=self._serve, daemon=True)
        self.t.start()

    def _serve(self):
        while not self.stopping:
            try:
                c, _ = self.srv.accept()
            except OSError:
                return
            threading.Thread(target=self._conn, args=(c,), daemon=True).start()

    def _conn(self, c):
        c.settimeout(5)
        try:
            buf = b''
            while True:
                data = c.recv(4096)
                if not data:
                    return
                buf += data
                while b'CLUSTER' in buf:
                    i = buf.index(b'CLUSTER')
                    rest = buf[i + 7:]
                    if b'NODES' in rest[:20]:
                        line = '%s 127.0.0.1:%d@%d myself,master - 0 0 999 connected 0-16383\n' % (
                            self.id, self.port, self.port + 10000)
                        c.sendall(b'$%d\r\n%s\r\n' % (len(line), line.encode()))
                    elif b'SHARDS' in rest[:20] or b'SLOTS' in rest[:20]:
                        c.sendall(self.NONSENSE[self.served % len(self.NONSENSE)])
                        self.served += 1
                    else:
                        return
                    buf = rest
        except OSError:
            pass
        finally:
            c.close()

    def stop(self):
        self.stopping = True
        self.srv.close()


def keyslot_tool():
    return os.path.join(os.path.dirname(harness.FERRY_BIN), 'test_cluster')


@unittest.skipIf(harness.DIRECT, 'ferry-only')
class ClusterMapTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.cluster = ClusterTopology(masters=3, replicas=1, node_timeout_ms=2000)
        cls.fake = FakeNode()
        try:
            # seeds: one real node and the fake; the rest is learned
            cls.ferry = Ferry(None, wait=None, conf={'cluster': {
                'nodes': [cls.cluster.seeds()[0], '127.0.0.1:%d' % cls.fake.port],
                'refresh_interval_ms': REFRESH_MS, 'timeout_ms': 1000}})
        except BaseException:
            cls.fake.stop()
            cls.cluster.stop()
            raise

    @classmethod
    def tearDownClass(cls):
        cls.ferry.stop()
        cls.fake.stop()
        cls.cluster.stop()

    def wait_map_equals_cluster(self, timeout=15.0):
        """Until ferry's map equals CLUSTER SHARDS of every running node (and
        those agree); returns ferry's (doc, owners, replicas)."""
        state = {}

        def same():
            doc, owners, replicas = ferry_map(self.ferry)
            state['ferry'] = (len(owners), replicas, doc['cluster']['last_error'])
            for n in self.cluster.running():
                o, r = shards_map(self.cluster.shards(n.port))
                if o != owners or r != replicas:
                    state['node'] = (n.port, len(o), r)
                    return None
            return doc, owners, replicas
        try:
            return wait_until(same, timeout=timeout, interval=0.1,
                              msg="ferry's map equal to CLUSTER SHARDS of every node")
        except AssertionError as e:
            raise AssertionError('%s: ferry %r, node %r\n%s' % (
                e, state.get('ferry'), state.get('node'), self.ferry.log()[-3000:])) from None

    def test_1_map_equals_cluster_shards(self):
        self.cluster.wait_consistent()
        doc, owners, replicas = self.wait_map_equals_cluster()
        self.assertEqual(len(owners), 16384)
        self.assertEqual(len(doc['cluster']['shards']), 3)
        self.assertEqual(sorted(int(m.rsplit(':', 1)[1]) for m in replicas),
                         self.cluster.masters())
        for m, reps in replicas.items():
            self.assertEqual(len(reps), 1, (m, reps))
        self.assertTrue(doc['routing'])
        # each shard's epoch is its master's configEpoch
        view = {v['port']: v for v in self.cluster.nodes_view(self.cluster.masters()[0])}
        for sh in doc['cluster']['shards']:
            self.assertEqual(sh['epoch'], view[sh['master']['port']]['epoch'])

    def test_2_keyslot_matches_cluster_keyslot(self):
        rnd = random.Random(16)
        keys = [b'foo', b'{user1000}.following', b'{user1000}.followers', b'foo{}{bar}',
                b'foo{{bar}}zap', b'{}', b'{', b'}', b'a{b}c{d}', b'', b'\x00\xff{\x80}\x01',
                b'queue:{orders}:high', b'queue:{orders}:low']
        for _ in range(300):
            n = rnd.randrange(0, 24)
            keys.append(bytes(rnd.choice(b'ab{}\x00\xff:xyz') for _ in range(n)))
        p = subprocess.run([keyslot_tool(), '--keyslot'],
                           input=''.join(k.hex() + '\n' for k in keys).encode(),
                           stdout=subprocess.PIPE, timeout=30, check=True)
        ours = [int(x) for x in p.stdout.split()]
        self.assertEqual(len(ours), len(keys))
        node = self.cluster.running()[0]
        sock = socket.create_connection(('127.0.0.1', node.port), timeout=5)
        try:
            for k, s in zip(keys, ours):
                harness.resp_send(sock, ['CLUSTER', 'KEYSLOT', k])
                self.assertEqual(s, harness.resp_read_reply(sock), k)
        finally:
            sock.close()

    def test_3_nonsense_does_not_move_the_map(self):
        _, before, _ = self.wait_map_equals_cluster()
        served = self.fake.served
        wait_until(lambda: self.fake.served >= served + len(FakeNode.NONSENSE), timeout=15,
                   msg='the fake node asked every nonsense reply once more')
        doc, owners, _ = ferry_map(self.ferry)
        self.assertEqual(owners, before)
        self.assertGreater(doc['cluster']['rejected'], 0)
        self.assertIn(str(self.fake.port), doc['cluster']['last_error'] +
                      self.ferry.log()[-20000:])
        self.assertTrue(self.ferry.running())
        # a real node of another cluster claiming every slot at epoch 0
        other = RedisServer({'cluster-enabled': 'yes', 'port': _bus_free_port(),
                             'cluster-config-file': 'nodes-other.conf'})
        try:
            other.client().execute_command('CLUSTER', 'ADDSLOTSRANGE', 0, 16383)
            wait_until(lambda: 'cluster_state:ok' in other.client().execute_command(
                'CLUSTER', 'INFO'), timeout=10, msg='the other cluster ok')
            f2 = Ferry(None, wait=None, conf={'cluster': {
                'nodes': [self.cluster.seeds()[0], '127.0.0.1:%d' % other.port],
                'refresh_interval_ms': REFRESH_MS}})
            try:
                _, o2, _ = wait_until(lambda: _equal_owners(f2, before), timeout=10,
                                      msg='the second ferry learned the real map')
                rounds = ferry_map(f2)[0]['cluster']['rounds']
                # several rounds in which the other node answers: no change
                deadline = time.monotonic() + 10
                while ferry_map(f2)[0]['cluster']['rounds'] < rounds + 5:
                    self.assertLess(time.monotonic(), deadline, 'no refresh rounds')
                    self.assertEqual(ferry_map(f2)[1], before)
                    time.sleep(0.05)
                self.assertEqual(ferry_map(f2)[1], before)
                self.assertNotIn('127.0.0.1:%d' % other.port, ferry_map(f2)[1].values())
            finally:
                f2.stop()
        finally:
            other.kill()

    def test_4_kill_master_shows_promoted_replica(self):
        self.wait_map_equals_cluster()
        old = self.cluster.master_of(0)
        replica = self.cluster.replicas_of(old)
        t0 = time.monotonic()
        self.cluster.kill_master(old)
        want = '127.0.0.1:%d' % replica[0]

        def promoted():
            return ferry_map(self.ferry)[1].get(0) == want
        wait_until(promoted, timeout=PROMOTE_DEADLINE, interval=0.05,
                   msg="ferry's map to name the promoted replica %s" % want)
        took = time.monotonic() - t0
        print('\n  kill -9 of master %d -> ferry map names replica %s after %.2f s '
              '(node-timeout 2 s)' % (old, want, took))
        self.cluster.wait_promoted(old)
        self.wait_map_equals_cluster()
        # the old master restarted: a replica at its old epoch, no slots back
        self.cluster.node_by_port(old).restart()
        self.cluster.wait_consistent()
        _, owners, replicas = self.wait_map_equals_cluster()
        self.assertNotIn('127.0.0.1:%d' % old, set(owners.values()))
        self.assertIn('127.0.0.1:%d' % old, replicas[want])

    def test_5_reshard_100_slots(self):
        self.cluster.wait_consistent()
        _, before, _ = self.wait_map_equals_cluster()
        masters = self.cluster.masters()
        src, dst = masters[0], masters[1]
        moved_before = ferry_map(self.ferry)[0]['cluster']['slots_moved']
        self.cluster.reshard(src, dst, 100)
        _, after, _ = self.wait_map_equals_cluster()
        changed = [s for s in before if before[s] != after[s]]
        self.assertEqual(len(changed), 100)
        self.assertTrue(all(before[s] == '127.0.0.1:%d' % src and
                            after[s] == '127.0.0.1:%d' % dst for s in changed))
        self.assertGreaterEqual(ferry_map(self.ferry)[0]['cluster']['slots_moved'] -
                                moved_before, 100)


def _equal_owners(f, want):
    doc, owners, replicas = ferry_map(f)
    return (doc, owners, replicas) if owners == want else None


def _bus_free_port():
    return harness._free_cluster_port()


@unittest.skipIf(harness.DIRECT, 'ferry-only')
class ClusterConfigTest(unittest.TestCase):

    def check(self, text):
        d = harness._mkdtemp('ferry-cluster-conf-')
        path = os.path.join(d, 'ferry.yml')
        with open(path, 'w') as fh:
            fh.write(text)
        return Ferry.check_config(path)

    def test_ferry_t_accepts_cluster_and_says_what_is_routed(self):
        rc, out = self.check('cluster:\n  nodes: [127.0.0.1:7000, 127.0.0.1:7001]\n'
                             '  refresh_interval_ms: 500\n')
        self.assertEqual(rc, 0, out)
        self.assertIn('cluster mode: commands whose keys share one slot are routed', out)

    def test_ferry_t_refuses_two_sources_and_no_nodes(self):
        rc, out = self.check('redis: {address: 127.0.0.1:6379}\n'
                             'cluster: {nodes: [127.0.0.1:7000]}\n')
        self.assertEqual(rc, 1)
        self.assertIn('mutually exclusive', out)
        rc, out = self.check('cluster:\n  nodes: []\n')
        self.assertEqual(rc, 1)
        self.assertIn('cluster.nodes must list at least one node', out)


if __name__ == '__main__':
    unittest.main()
