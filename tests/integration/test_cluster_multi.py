"""MULTI/EXEC and WATCH through ferry in front of a Redis Cluster, checked
against a real 3 masters + 3 replicas cluster (harness ClusterTopology,
node-timeout 2 s), one cluster and one ferry for the class:

  1. A transaction on each shard's keys runs on that shard's master (read
     with the node's own client); keyless commands inside go along; one of
     keyless commands only runs on any master.
  2. A key of another slot inside MULTI: that command gets the CROSSSLOT a
     node sends for keys of two slots, and EXEC -EXECABORT, as a node's EXEC
     after a refused command (the node's own words, compared); nothing of
     the transaction ran.
  3. WATCH pins the transaction to its key's slot: a conflict (another
     client changes the key) makes EXEC answer nil; a key of another slot
     after WATCH is refused with CROSSSLOT; DISCARD runs nothing.
  4. BullMQ's FlowProducer (MULTI/EXEC) with a {hash-tagged} prefix: every
     flow's children and parent processed once.
  5. The pinned slot moves to another master inside MULTI: MOVED is
     followed, the transaction rebuilt there, never seen by the client.
  z. kill -9 of the pinned shard's master between MULTI and EXEC: the
     transaction is rebuilt on the promoted replica and EXEC runs it there
     once; a watched one ends in nil (a watch conflict), as in Sentinel mode;
     a command answered -TRYAGAIN past the hold bound aborts its EXEC.

Run:  python3 -m unittest test_cluster_multi -v        (about 40 s)
Ferry-only (skipped with FERRY_TEST_DIRECT=1); cluster mode runs one event
loop (workers: 1), so FERRY_TEST_WORKERS is not applied here.
"""
import json
import os
import shutil
import socket
import subprocess
import unittest

import redis

import harness
from harness import ClusterTopology, Ferry
from test_cluster_route import _s, start_ferry, stats, wait_served

EXECABORT = 'EXECABORT Transaction discarded because of previous errors.'


def key_on(cluster, port, stem):
    """A key of stem's family whose slot the master on port serves."""
    for i in range(10000):
        k = '%s:%d' % (stem, i)
        if cluster.master_of(cluster.keyslot(k)) == port:
            return k
    raise AssertionError('no key of %s on %d' % (stem, port))


def other_slot(cluster, key, port=None):
    """A key whose slot is not key's (served by the master on port if given)."""
    for i in range(10000):
        k = 'other:%d' % i
        s = cluster.keyslot(k)
        if s != cluster.keyslot(key) and (port is None or cluster.master_of(s) == port):
            return k
    raise AssertionError('no other key')


def pipelined(sock, *cmds, timeout=30):
    """Send every command at once, read as many replies (errors as values)."""
    for argv in cmds:
        harness.resp_send(sock, list(argv))
    return [_s(harness.resp_read_reply(sock, timeout=timeout)) for _ in cmds]


@unittest.skipIf(harness.DIRECT, 'ferry-only')
class ClusterMultiTest(unittest.TestCase):

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
        cls.ferry.stop()
        cls.cluster.stop()

    def node_client(self, port):
        return self.cluster.node_by_port(port).client(socket_timeout=5)

    def node_get(self, key):
        n = self.node_client(self.cluster.master_of(self.cluster.keyslot(key)))
        try:
            return _s(n.get(key))
        finally:
            n.close()

    def test_1_a_transaction_runs_on_its_shard(self):
        self.cluster.wait_consistent()
        c = self.ferry.client(socket_timeout=10)
        try:
            for port in self.cluster.masters():
                k = key_on(self.cluster, port, 'tx1')
                tag = '{%s}' % k
                c.delete(tag + 'a', tag + 'n')
                # redis-py's transaction pipeline: MULTI ... EXEC at once,
                # a keyless command first (MULTI goes to the first key's shard)
                p = c.pipeline(transaction=True)
                p.ping().set(tag + 'a', port).incr(tag + 'n').echo('x').incr(tag + 'n')
                self.assertEqual(_s(p.execute()), [True, True, 1, 'x', 2])
                n = self.node_client(port)
                try:
                    self.assertEqual(_s(n.mget(tag + 'a', tag + 'n')), [str(port), '2'])
                finally:
                    n.close()
            # one command at a time (as redis-cli), keys in the same slot
            s = self.ferry.raw(timeout=10)
            try:
                k = key_on(self.cluster, self.cluster.masters()[-1], 'tx1b')
                for argv, want in ((['MULTI'], 'OK'), (['PING'], 'QUEUED'),
                                   (['SET', k, 'v'], 'QUEUED'), (['GET', k], 'QUEUED')):
                    self.assertEqual(pipelined(s, argv)[0], want, argv)
                self.assertEqual(pipelined(s, ['EXEC'])[0], ['PONG', 'OK', 'v'])
                # keyless commands only: any master runs them
                self.assertEqual(pipelined(s, ['MULTI'], ['PING'], ['ECHO', 'e'], ['EXEC']),
                                 ['OK', 'QUEUED', 'QUEUED', ['PONG', 'e']])
                self.assertEqual(pipelined(s, ['MULTI'], ['EXEC']), ['OK', []])
                # transactions back to back, pipelined, on one shard then another:
                # each MULTI goes to its own first key's shard, none runs outside
                ms = self.cluster.masters()
                ka, kb = key_on(self.cluster, ms[0], 'tx1c'), key_on(self.cluster, ms[1], 'tx1c')
                got = pipelined(s, ['MULTI'], ['SET', ka, '1'], ['EXEC'],
                                ['MULTI'], ['SET', ka, '2'], ['DISCARD'],
                                ['MULTI'], ['SET', kb, '3'], ['EXEC'],
                                ['MULTI'], ['INCR', ka], ['EXEC'], ['MGET', ka])
                self.assertEqual(got, ['OK', 'QUEUED', ['OK'], 'OK', 'QUEUED', 'OK',
                                       'OK', 'QUEUED', ['OK'], 'OK', 'QUEUED', [2], ['2']])
            finally:
                s.close()
            self.assertEqual(self.node_get(k), 'v')
        finally:
            c.close()
        self.assertEqual((self.node_get(ka), self.node_get(kb)), ('2', '3'))

    def test_2_a_key_of_another_slot_aborts_exec(self):
        self.cluster.wait_consistent()
        masters = self.cluster.masters()
        a = key_on(self.cluster, masters[0], 'tx2')
        b = other_slot(self.cluster, a, port=masters[1])
        same_node = other_slot(self.cluster, a, port=masters[0])
        # the node's own words: CROSSSLOT for keys of two slots, EXECABORT
        # for an EXEC after a refused command (there: MOVED for b)
        n = self.node_client(masters[0])
        try:
            with self.assertRaises(redis.ResponseError) as cross:
                n.execute_command('MSET', a, '1', same_node, '2')
        finally:
            n.close()
        raw = socket.create_connection(('127.0.0.1', masters[0]), timeout=10)
        try:
            got = pipelined(raw, ['MULTI'], ['SET', a, 'x'], ['SET', b, 'x'], ['EXEC'])
        finally:
            raw.close()
        self.assertTrue(str(got[2]).startswith('MOVED'), got)
        self.assertEqual(str(got[3]), EXECABORT)
        # (a node serving both slots queues both; its EXEC says CROSSSLOT)
        raw = socket.create_connection(('127.0.0.1', masters[0]), timeout=10)
        try:
            got = pipelined(raw, ['MULTI'], ['SET', a, 'x'], ['SET', same_node, 'x'], ['EXEC'])
        finally:
            raw.close()
        self.assertEqual((got[1], got[2], str(got[3])), ('QUEUED', 'QUEUED', str(cross.exception)))
        s = self.ferry.raw(timeout=10)
        try:
            for k in (a, b, same_node):
                pipelined(s, ['DEL', k])
            for other in (b, same_node):
                got = pipelined(s, ['MULTI'], ['SET', a, 'x'], ['SET', other, 'x'], ['PING'],
                                ['EXEC'])
                self.assertEqual(got[:2], ['OK', 'QUEUED'], got)
                self.assertEqual(str(got[2]), str(cross.exception), got)
                self.assertEqual(got[3], 'QUEUED')
                self.assertEqual(str(got[4]), EXECABORT, got)
            # a command Redis refuses before the first key (a keyless one goes
            # to any master; the transaction then moves to its key's shard):
            # EXEC still aborts, as on one node
            for port in masters:
                k = key_on(self.cluster, port, 'tx2m')
                got = pipelined(s, ['MULTI'], ['ECHO'], ['SET', k, 'x'], ['EXEC'], ['EXISTS', k])
                self.assertEqual(got[0], 'OK')
                self.assertIn('wrong number of arguments', str(got[1]))
                self.assertEqual((got[2], str(got[3]), got[4]), ('QUEUED', EXECABORT, 0), got)
            # the connection serves on, outside any transaction
            self.assertEqual(pipelined(s, ['SET', b, 'after'], ['GET', a]), ['OK', None])
        finally:
            s.close()
        self.assertIsNone(self.node_get(a))
        self.assertEqual(self.node_get(b), 'after')
        self.assertIsNone(self.node_get(same_node))

    def test_3_watch(self):
        self.cluster.wait_consistent()
        masters = self.cluster.masters()
        k = key_on(self.cluster, masters[1], 'tx3')
        other = other_slot(self.cluster, k, port=masters[2])
        c = self.ferry.client(socket_timeout=10)
        w = self.ferry.client(socket_timeout=10)
        try:
            c.set(k, 'start')
            # a conflict: another client changes the watched key -> nil
            with c.pipeline(transaction=True) as p:
                p.watch(k)
                self.assertEqual(_s(p.get(k)), 'start')
                w.set(k, 'theirs')
                p.multi()
                p.set(k, 'mine')
                with self.assertRaises(redis.WatchError):
                    p.execute()
            self.assertEqual(self.node_get(k), 'theirs')
            # no conflict: it runs
            with c.pipeline(transaction=True) as p:
                p.watch(k)
                p.multi()
                p.set(k, 'mine')
                self.assertEqual(p.execute(), [True])
            self.assertEqual(self.node_get(k), 'mine')
        finally:
            c.close()
            w.close()
        s = self.ferry.raw(timeout=10)
        try:
            # WATCH pins the transaction: a key of another slot is refused
            got = pipelined(s, ['WATCH', k], ['MULTI'], ['SET', other, 'x'], ['SET', k, 'y'],
                            ['EXEC'])
            self.assertEqual(got[:2], ['OK', 'OK'], got)
            self.assertTrue(str(got[2]).startswith('CROSSSLOT'), got)
            self.assertEqual((got[3], str(got[4])), ('QUEUED', EXECABORT), got)
            # before MULTI too (and WATCH of two slots, as a node answers it)
            got = pipelined(s, ['WATCH', k], ['GET', other], ['WATCH', k, other], ['UNWATCH'],
                            ['GET', other])
            self.assertEqual(got[0], 'OK')
            self.assertTrue(str(got[1]).startswith('CROSSSLOT'), got)
            self.assertTrue(str(got[2]).startswith('CROSSSLOT'), got)
            self.assertEqual(got[3:], ['OK', None], got)
            # misuse answered as a node answers it (the key's master, asked
            # directly), whichever master ferry's MULTI went to first
            for port in masters:
                mk = key_on(self.cluster, port, 'tx3m')
                misuse = (['EXEC'], ['DISCARD'], ['MULTI'], ['MULTI'], ['WATCH', mk],
                          ['GET', mk], ['EXEC'], ['UNWATCH'])
                node = socket.create_connection(('127.0.0.1', port), timeout=10)
                try:
                    want = [str(x) for x in pipelined(node, *misuse)]
                finally:
                    node.close()
                self.assertEqual([str(x) for x in pipelined(s, *misuse)], want)
            # DISCARD: nothing ran
            got = pipelined(s, ['MULTI'], ['SET', k, 'discarded'], ['DISCARD'], ['GET', k])
            self.assertEqual(got, ['OK', 'QUEUED', 'OK', 'mine'])
        finally:
            s.close()
        self.assertEqual(self.node_get(k), 'mine')
        self.assertIsNone(self.node_get(other))

    def test_4_bullmq_flow_producer(self):
        self.cluster.wait_consistent()
        node = shutil.which('node')
        if node is None:
            raise AssertionError('node is not installed: run scripts/setup')
        here = os.path.dirname(os.path.abspath(__file__))
        flows, children = 20, 3
        p = subprocess.run([node, os.path.join(here, 'node', 'bullmq_flow.js'),
                            str(self.ferry.port), str(flows), str(children), '{flow}'],
                           capture_output=True, text=True, timeout=60, cwd=here)
        line = (p.stdout.strip().splitlines() or [''])[-1]
        try:
            out = json.loads(line)
        except ValueError:
            self.fail('node printed no JSON (exit %d):\n%s\n%s' % (p.returncode, p.stdout,
                                                                   p.stderr[-3000:]))
        self.assertEqual(out['errors'], [], out)
        self.assertEqual((out['added'], out['children'], out['parents'], out['twice']),
                         (flows, flows * children, flows, 0), out)
        self.assertEqual(out['sums'], [sum(range(children))] * flows, out)
        self.assertEqual(out['counts'].get('completed'), flows, out)
        owner = self.cluster.master_of(self.cluster.keyslot('{flow}'))
        n = self.node_client(owner)
        try:
            self.assertGreater(len(n.keys('{flow}:flows:*')), flows)
        finally:
            n.close()

    def test_2b_exec_during_a_busy_script(self):
        """A queued command refused -BUSY (a script of the same node past
        lua-time-limit), then EXEC while the script runs: the node's own
        -EXECABORT ... because of: BUSY ..., directly and through ferry
        (Redis' unit/multi "EXEC and script timeout")."""
        self.cluster.wait_consistent()
        port = self.cluster.masters()[0]
        k = key_on(self.cluster, port, 'tx2b')
        loop = 'local i = 0 while true do i = i + 1 end'
        node = self.node_client(port)
        self.addCleanup(node.close)
        old = node.config_get('lua-time-limit')['lua-time-limit']
        node.config_set('lua-time-limit', 100)
        self.addCleanup(node.config_set, 'lua-time-limit', old)

        def busy():
            try:
                node.ping()
                return False
            except redis.ResponseError as e:
                return 'BUSY' in str(e)

        def served():
            try:
                node.script_kill()
            except redis.ResponseError:
                pass
            try:
                return node.ping()
            except redis.ResponseError:
                return False

        def case(at):
            c = socket.create_connection(('127.0.0.1', at), timeout=10)
            runner = socket.create_connection(('127.0.0.1', at), timeout=10)
            try:
                got = pipelined(c, ['SET', k, '1'], ['MULTI'], ['INCR', k])
                harness.resp_send(runner, ['EVAL', loop, '1', k])
                harness.wait_until(busy, timeout=10, msg='the node never got busy')
                got += pipelined(c, ['INCR', k], ['EXEC'])
                harness.wait_until(served, timeout=10, msg='the script never ended')
                got += pipelined(c, ['GET', k], ['PING', 'asdf'])
                return [str(x) for x in got]
            finally:
                c.close()
                runner.close()
        direct = case(port)
        self.assertTrue(direct[4].startswith('EXECABORT Transaction discarded because of: BUSY'),
                        direct)
        self.assertEqual(case(self.ferry.port), direct)

    def test_5_a_slot_moved_inside_a_transaction(self):
        """The pinned slot moves to another master between two commands of
        the transaction: the old master answers MOVED (and aborts it there);
        ferry rebuilds the transaction on the new master, the client sees
        no redirect."""
        self.cluster.wait_consistent()
        src, dst = self.cluster.masters()[:2]
        k = None
        for i in range(10000):
            cand = key_on(self.cluster, src, 'tx5:%d' % i)
            slot = self.cluster.keyslot(cand)
            if self.cluster.command(src, 'CLUSTER', 'COUNTKEYSINSLOT', slot) == 0:
                k = cand
                break
        self.assertIsNotNone(k)
        ids = {v['port']: v['id'] for v in self.cluster.nodes_view(src)}
        # a ferry that asks for the map only when told (MOVED), not every 200 ms
        f = start_ferry(self.cluster, refresh_ms=60000)
        wait_served(f)
        s = f.raw(timeout=30)
        try:
            self.assertEqual(pipelined(s, ['MULTI'], ['SET', k, '1']), ['OK', 'QUEUED'])
            # the (empty) slot goes to dst, as the end of a migration does
            self.cluster.command(dst, 'CLUSTER', 'SETSLOT', slot, 'IMPORTING', ids[src])
            self.cluster.command(src, 'CLUSTER', 'SETSLOT', slot, 'MIGRATING', ids[dst])
            others = [m for m in self.cluster.masters() if m not in (src, dst)]
            for port in (dst, src):
                self.cluster.command(port, 'CLUSTER', 'SETSLOT', slot, 'NODE', ids[dst])
            # ferry's map is stale: src answers MOVED
            self.assertEqual(pipelined(s, ['INCR', k], ['EXEC']), ['QUEUED', ['OK', 2]])
            self.assertEqual(stats(f)['cluster']['moved_followed'], 1)
            for port in others:
                self.cluster.command(port, 'CLUSTER', 'SETSLOT', slot, 'NODE', ids[dst])
            self.cluster.wait_consistent()
        finally:
            s.close()
            f.stop()
        n = self.node_client(dst)
        try:
            self.assertEqual(_s(n.get(k)), '2')
        finally:
            n.close()

    def test_z_kill_of_the_pinned_master_between_multi_and_exec(self):
        self.cluster.wait_consistent()
        victim = self.cluster.masters()[0]
        k = key_on(self.cluster, victim, 'txz')
        tag = '{%s}' % k
        c = self.ferry.client(socket_timeout=60)
        c.delete(tag + 'a', tag + 'n', tag + 'w')
        c.close()
        # a second ferry whose hold bound ends before the shard has a master
        short = Ferry(None, wait='port', conf={
            'workers': 1, 'upstream': {'hold_timeout_ms': 300},
            'cluster': {'nodes': [self.cluster.seeds()[0]], 'refresh_interval_ms': 200}})
        wait_served(short)
        quick = short.raw(timeout=60)
        plain = self.ferry.raw(timeout=60)
        watched = self.ferry.raw(timeout=60)
        try:
            self.assertEqual(pipelined(quick, ['MULTI']), ['OK'])
            self.assertEqual(pipelined(plain, ['MULTI'], ['SET', tag + 'a', 'v'],
                                       ['INCR', tag + 'n']), ['OK', 'QUEUED', 'QUEUED'])
            self.assertEqual(pipelined(watched, ['WATCH', tag + 'w'], ['MULTI'],
                                       ['SET', tag + 'w', 'v']), ['OK', 'OK', 'QUEUED'])
            before = stats(self.ferry)['errors']['transactions_rebuilt']
            self.cluster.kill_master(victim)
            # EXEC at once: held until the shard has a master again, then the
            # transaction is rebuilt on the promoted replica and run once there
            for argv in (['EXEC'], ['GET', tag + 'n']):
                harness.resp_send(plain, argv)
            # past the hold bound: -TRYAGAIN for that command, and EXEC aborts
            # (it must not run what was queued without it)
            got = pipelined(quick, ['SET', tag + 'q', 'v'], ['EXEC'])
            self.assertTrue(str(got[0]).startswith('TRYAGAIN'), got)
            self.assertEqual(str(got[1]), EXECABORT, got)
            promoted = self.cluster.wait_promoted(victim)
            self.assertEqual([_s(harness.resp_read_reply(plain, timeout=60)) for _ in '12'],
                             [['OK', 1], '1'])
            self.assertEqual(stats(self.ferry)['errors']['transactions_rebuilt'], before + 1)
            # watched: the watch broke with its link: a watch conflict
            self.assertEqual(pipelined(watched, ['EXEC']), [None])
        finally:
            plain.close()
            watched.close()
            quick.close()
            short.stop()
        n = self.node_client(promoted)
        try:
            self.assertEqual(_s(n.mget(tag + 'a', tag + 'n', tag + 'w', tag + 'q')),
                             ['v', '1', None, None])
        finally:
            n.close()


if __name__ == '__main__':
    unittest.main()
