"""ferry answers NOSCRIPT itself: the scripts a client loaded (SCRIPT LOAD)
or ran (EVAL) through ferry are remembered, and an EVALSHA that would meet
a server lacking its script (a promoted replica: Redis 7.0 copies no
script to its replicas; a server flushed behind ferry's back) gets the
script's reply, not -NOSCRIPT. The clients here send EVALSHA on a raw
socket or with redis-py's execute_command: no library falls back to EVAL.

  SentinelScriptsTest (1 master, 2 replicas, 3 sentinels, one ferry):
    1. SCRIPT FLUSH on the master itself: an EVALSHA through ferry on a
       connection whose link had the script, and on a fresh one, answers
       the script's result; /stats counts the SCRIPT LOADs ferry sent.
       An EVALSHA of a sha nobody loaded gets -NOSCRIPT, as from Redis.
    2. kill -9 of the master: after the failover, EVALSHA of a script
       loaded with SCRIPT LOAD and of one run with EVAL answer their
       results; a pipeline of EVALSHA, SET, GET, EVALSHA_RO... on a raw
       socket gets every reply in order, each the right one.
  FixedScriptsTest (a fixed master): the master restarted (its script cache
    empty): EVALSHA answers; SCRIPT FLUSH through ferry forgets the script.
  ClusterScriptsTest (ClusterTopology: 3 masters + 3 replicas, one ferry):
    1. 5 slots resharded to a master flushed behind ferry's back: an
       EVALSHA on a key of a moved slot answers the script's result.
    2. SCRIPT LOAD through ferry, kill -9 of a master: an EVALSHA on a key of
    that shard answers the script's result once its replica is promoted.

Run:  python3 -m unittest test_scripts_reload -v        (about 40 s)
"""
import hashlib
import json
import unittest
import urllib.request

import redis

import harness
from harness import (ClusterTopology, Ferry, RedisServer, RespError, SentinelTopology,
                     resp_encode, resp_read_reply, resp_send, wait_until)
from test_queue_guards import keyslot

INCR = "return redis.call('INCRBY', KEYS[1], ARGV[1])"
ECHO = "return 'echo:' .. ARGV[1]"
READ = "#!lua flags=no-writes\nreturn redis.call('GET', KEYS[1])"


def sha1(body):
    return hashlib.sha1(body.encode()).hexdigest()


def stats(f):
    with urllib.request.urlopen('http://127.0.0.1:%d/stats' % f.stats_port, timeout=5) as r:
        return json.loads(r.read().decode())


def ask(sock, *args):
    resp_send(sock, resp_encode(*args))
    return resp_read_reply(sock)


@unittest.skipIf(harness.DIRECT, 'ferry-only: Redis itself answers NOSCRIPT')
class SentinelScriptsTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.topo = SentinelTopology()
        try:
            cls.ferry = Ferry(None, sentinel=cls.topo,
                              conf={'upstream': {'hold_timeout_ms': 20000}})
        except BaseException:
            cls.topo.stop()
            raise

    @classmethod
    def tearDownClass(cls):
        cls.ferry.stop()
        cls.topo.stop()

    def test_1_flushed_behind_ferrys_back(self):
        c = self.ferry.client()
        sha = c.execute_command('SCRIPT', 'LOAD', INCR)
        self.assertEqual(sha, sha1(INCR))
        # Once on this connection, so that its link was given the script.
        self.assertEqual(c.execute_command('EVALSHA', sha, 1, 'fl:n', 1), 1)
        before = stats(self.ferry)['errors']
        self.topo.master().client().script_flush()
        self.assertEqual(self.topo.master().client().script_exists(sha), [False])
        self.assertEqual(c.execute_command('EVALSHA', sha, 1, 'fl:n', 2), 3)
        s = self.ferry.raw()
        try:
            self.assertEqual(ask(s, 'EVALSHA', sha.upper(), '1', 'fl:n', '3'), 6)
        finally:
            s.close()
        after = stats(self.ferry)['errors']
        print('\n[flushed] scripts_reloaded +%d, noscript_resent +%d' % (
            after['scripts_reloaded'] - before['scripts_reloaded'],
            after['noscript_resent'] - before['noscript_resent']), flush=True)
        self.assertGreater(after['scripts_reloaded'], before['scripts_reloaded'])
        self.assertEqual(self.topo.master().client().script_exists(sha), [True])
        # A sha nobody loaded: Redis' NOSCRIPT, as without ferry.
        s = self.ferry.raw()
        try:
            reply = ask(s, 'EVALSHA', 'f' * 40, '0')
            self.assertIsInstance(reply, RespError)
            self.assertTrue(str(reply).startswith('NOSCRIPT'), reply)
            self.assertEqual(ask(s, 'PING'), 'PONG')
        finally:
            s.close()

    def test_2_kill9_master(self):
        c = self.ferry.client()
        sha_incr = c.execute_command('SCRIPT', 'LOAD', INCR)
        sha_read = c.execute_command('SCRIPT', 'LOAD', READ)
        # ECHO is only ever run with EVAL: Redis caches it, so does ferry.
        self.assertEqual(c.execute_command('EVAL', ECHO, 0, 'x'), 'echo:x')
        c.set('k9:n', 10)
        self.topo.wait_replicas_synced(self.topo.master(), 2)
        old = self.topo.master()
        old.kill()
        new_port = self.topo.wait_failover(old.port, timeout=30)
        new = self.topo.redis_by_port(new_port)
        self.assertEqual(new.client().script_exists(sha_incr, sha_read, sha1(ECHO)),
                         [False, False, False], 'Redis copied its script cache to the replica')
        self.assertEqual(c.execute_command('EVALSHA', sha_incr, 1, 'k9:n', 5), 15)
        self.assertEqual(c.execute_command('EVALSHA', sha1(ECHO), 0, 'y'), 'echo:y')
        # A pipeline on a new connection: every reply in order.
        s = self.ferry.raw()
        try:
            resp_send(s, b''.join([
                resp_encode('EVALSHA', sha_incr, '1', 'k9:p', '1'),
                resp_encode('SET', 'k9:s', 'a'),
                resp_encode('EVALSHA', sha_incr, '1', 'k9:p', '10'),
                resp_encode('EVALSHA_RO', sha_read, '1', 'k9:p'),
                resp_encode('GET', 'k9:p'),
                resp_encode('EVALSHA', 'e' * 40, '0'),
                resp_encode('EVALSHA', sha1(ECHO), '0', 'z'),
                resp_encode('GET', 'k9:s'),
            ]))
            got = [resp_read_reply(s) for _ in range(8)]
        finally:
            s.close()
        self.assertEqual(got[:5], [1, 'OK', 11, b'11', b'11'])
        self.assertIsInstance(got[5], RespError)
        self.assertTrue(str(got[5]).startswith('NOSCRIPT'), got[5])
        self.assertEqual(got[6:], [b'echo:z', b'a'])
        self.assertEqual(new.client().get('k9:p'), '11')


@unittest.skipIf(harness.DIRECT, 'ferry-only: Redis itself answers NOSCRIPT')
class FixedScriptsTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.redis = RedisServer()
        try:
            cls.ferry = Ferry(cls.redis, conf={'upstream': {'hold_timeout_ms': 20000}})
        except BaseException:
            cls.redis.kill()
            raise

    @classmethod
    def tearDownClass(cls):
        cls.ferry.stop()
        cls.redis.kill()

    def test_master_restarted(self):
        c = self.ferry.client()
        sha = c.execute_command('SCRIPT', 'LOAD', INCR)
        self.assertEqual(c.execute_command('EVALSHA', sha, 1, 'fx:n', 1), 1)
        self.redis.restart()
        self.assertEqual(self.redis.client().script_exists(sha), [False])
        # ferry enforces appendfsync always: the INCRBY before the kill is kept.
        self.assertEqual(c.execute_command('EVALSHA', sha, 1, 'fx:n', 2), 3)
        # SCRIPT FLUSH through ferry forgets it: Redis' NOSCRIPT again.
        self.assertTrue(c.execute_command('SCRIPT', 'FLUSH'))
        with self.assertRaises(redis.exceptions.NoScriptError):
            c.execute_command('EVALSHA', sha, 1, 'fx:n', 2)


@unittest.skipIf(harness.DIRECT, 'ferry-only: Redis itself answers NOSCRIPT')
class ClusterScriptsTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.cluster = ClusterTopology(masters=3, replicas=1, node_timeout_ms=2000)
        try:
            cls.cluster.wait_consistent()
            cls.ferry = Ferry(None, wait='port', conf={
                'cluster': {'nodes': [cls.cluster.seeds()[0]], 'timeout_ms': 1000},
                'upstream': {'hold_timeout_ms': 20000}})
        except BaseException:
            cls.cluster.stop()
            raise

    @classmethod
    def tearDownClass(cls):
        cls.ferry.stop()
        cls.cluster.stop()

    def setUp(self):
        wait_until(lambda: (lambda d: len(d['cluster']['shards']) == 3 and all(
            sh['up'] for sh in d['cluster']['shards']))(stats(self.ferry)),
            timeout=20, interval=0.1, msg='every shard UP in ferry')

    def test_1_slots_moved_to_a_master_that_lacks_the_script(self):
        c = self.ferry.client(socket_timeout=30)
        sha = c.execute_command('SCRIPT', 'LOAD', INCR)
        a, b = self.cluster.masters()[:2]
        before = self.cluster.wait_consistent()
        # b loses its scripts behind ferry's back (as a master added later,
        # or restarted, has none), then gets slots of a.
        self.cluster.node_by_port(b).client().script_flush()
        after = self.cluster.reshard(a, b, 5)
        moved = {sl for sl, p in after.items() if p == b and before.get(sl) == a}
        self.assertTrue(moved)
        key = next(k for k in ('rs:%d' % i for i in range(1000000)) if keyslot(k) in moved)
        self.assertEqual(c.execute_command('EVALSHA', sha, 1, key, 4), 4)
        self.assertEqual(self.cluster.node_by_port(b).client().script_exists(sha), [True])

    def test_2_kill9_master_then_evalsha(self):
        c = self.ferry.client(socket_timeout=30)
        sha = c.execute_command('SCRIPT', 'LOAD', INCR)
        self.assertEqual(sha, sha1(INCR))
        for m in self.cluster.masters():
            self.assertEqual(self.cluster.node_by_port(m).client().script_exists(sha), [True])
        key = 'cs:{a}'
        self.assertEqual(c.execute_command('EVALSHA', sha, 1, key, 2), 2)
        victim = self.cluster.master_of(self.cluster.keyslot(key))
        self.cluster.kill_master(victim)
        new = self.cluster.wait_promoted(victim)
        self.assertEqual(self.cluster.node_by_port(new).client().script_exists(sha), [False],
                         'Redis copied its script cache to the replica')
        # The write before the kill reached the replica or not (no WAIT
        # here): the script's result is the counter plus 3 either way.
        got = c.execute_command('EVALSHA', sha, 1, key, 3)
        self.assertIn(got, (3, 5))
        self.assertEqual(self.cluster.node_by_port(new).client().get(key), str(got))


if __name__ == '__main__':
    unittest.main()
