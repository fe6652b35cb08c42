"""RESP3 through ferry, in Sentinel mode and with a fixed master: HELLO 3,
the bytes Redis sends in RESP3, push frames (pub/sub with commands on the
same connection, CLIENT TRACKING invalidations, also with CLIENT REPLY OFF),
across a kill -9 of the master, the errors ferry gives where it decides
(CLIENT TRACKING REDIRECT, a refused command inside MULTI), and node-redis
speaking RESP3. The raw client reads replies with the harness' RESP3 reader
and compares exact bytes where ferry must pass them on untouched."""

import os
import shutil
import socket
import subprocess
import time
import unittest

import harness
from harness import resp_encode, resp_read_raw, resp_read_reply, resp_send, wait_until
from modes import FixedMasterMode, SentinelMode, key_prefix, sentinel_first

HERE = os.path.dirname(os.path.abspath(__file__))
NODE_DRIVER = os.path.join(HERE, 'node', 'resp3.js')
NODE_TIMEOUT = 60
FLUSH = b'>2\r\n$10\r\ninvalidate\r\n_\r\n'


def push_invalidate(*keys):
    out = [b'>2\r\n$10\r\ninvalidate\r\n*%d\r\n' % len(keys)]
    for k in keys:
        k = k.encode()
        out.append(b'$%d\r\n%s\r\n' % (len(k), k))
    return b''.join(out)


def push(*items):
    out = [b'>%d\r\n' % len(items)]
    for x in items:
        if isinstance(x, int):
            out.append(b':%d\r\n' % x)
        else:
            x = x.encode()
            out.append(b'$%d\r\n%s\r\n' % (len(x), x))
    return b''.join(out)


def bulk(x):
    x = x.encode()
    return b'$%d\r\n%s\r\n' % (len(x), x)


class Resp3Client:
    def raw3(self):
        """A connection to ferry switched to RESP3."""
        s = self.ferry.raw()
        self.addCleanup(s.close)
        resp_send(s, ['HELLO', '3'])
        hello = resp_read_reply(s, 10)
        self.assertEqual(hello[b'proto'], 3, hello)
        return s

    def call(self, s, *args):
        resp_send(s, list(args))
        return resp_read_raw(s, 10)


class Resp3Checks(Resp3Client):
    def test_hello3_map(self):
        s = self.ferry.raw()
        self.addCleanup(s.close)
        resp_send(s, ['HELLO', '3', 'SETNAME', 'resp3-named'])
        hello = resp_read_reply(s, 10)
        self.assertEqual(hello[b'server'], b'redis')
        self.assertEqual(hello[b'proto'], 3)
        self.assertEqual(hello[b'mode'], b'standalone')
        self.assertEqual(hello[b'role'], b'master')
        self.assertTrue(hello[b'proxy'].startswith(b'ferry'), hello)
        self.assertIsInstance(hello[b'id'], int)
        self.assertEqual(self.call(s, 'CLIENT', 'GETNAME'), bulk('resp3-named'))
        # HELLO with no version answers in the protocol in use
        resp_send(s, ['HELLO'])
        self.assertEqual(resp_read_reply(s, 10)[b'proto'], 3)

    def test_resp3_types_pass_as_sent(self):
        k = key_prefix(self)
        s = self.raw3()
        self.assertEqual(self.call(s, 'HSET', k + ':h', 'f', 'v'), b':1\r\n')
        self.assertEqual(self.call(s, 'HGETALL', k + ':h'), b'%1\r\n$1\r\nf\r\n$1\r\nv\r\n')
        self.assertEqual(self.call(s, 'SADD', k + ':s', 'm'), b':1\r\n')
        self.assertEqual(self.call(s, 'SMEMBERS', k + ':s'), b'~1\r\n$1\r\nm\r\n')
        self.assertEqual(self.call(s, 'ZADD', k + ':z', '1.5', 'a'), b':1\r\n')
        self.assertEqual(self.call(s, 'ZSCORE', k + ':z', 'a'), b',1.5\r\n')
        self.assertEqual(self.call(s, 'GET', k + ':none'), b'_\r\n')
        self.assertEqual(self.call(s, 'BLPOP', k + ':none', '0.05'), b'_\r\n')
        # a pipeline, in order
        resp_send(s, resp_encode('LPUSH', k + ':l', 'x') + resp_encode('LPOP', k + ':l')
                  + resp_encode('LPOP', k + ':l'))
        self.assertEqual([resp_read_raw(s, 10) for _ in range(3)],
                         [b':1\r\n', bulk('x'), b'_\r\n'])
        # a transaction on its dedicated link speaks RESP3 too
        resp_send(s, resp_encode('MULTI') + resp_encode('GET', k + ':none')
                  + resp_encode('EXEC'))
        self.assertEqual([resp_read_raw(s, 10) for _ in range(3)],
                         [b'+OK\r\n', b'+QUEUED\r\n', b'*1\r\n_\r\n'])

    def test_pubsub_with_commands_on_the_same_connection(self):
        k = key_prefix(self)
        s = self.raw3()
        self.assertEqual(self.call(s, 'SET', k, 'v'), b'+OK\r\n')
        resp_send(s, ['SUBSCRIBE', k + ':ch'])
        self.assertEqual(resp_read_raw(s, 10), push('subscribe', k + ':ch', 1))
        # RESP3: ordinary commands keep working while subscribed
        self.assertEqual(self.call(s, 'GET', k), bulk('v'))
        self.assertEqual(self.call(s, 'PING'), b'+PONG\r\n')
        # pipelined: the push and the reply in the order Redis sent them
        resp_send(s, resp_encode('SUBSCRIBE', k + ':ch2') + resp_encode('GET', k))
        self.assertEqual(resp_read_raw(s, 10), push('subscribe', k + ':ch2', 2))
        self.assertEqual(resp_read_raw(s, 10), bulk('v'))
        pub = self.ferry.client(socket_timeout=10)
        self.addCleanup(pub.close)
        self.assertEqual(pub.publish(k + ':ch', 'hi'), 1)
        self.assertEqual(resp_read_raw(s, 10), push('message', k + ':ch', 'hi'))
        resp_send(s, ['UNSUBSCRIBE'])
        got = [resp_read_reply(s, 10) for _ in range(2)]
        self.assertEqual(sorted(g[1] for g in got), [(k + ':ch').encode(), (k + ':ch2').encode()])
        self.assertEqual([g[0] for g in got], [b'unsubscribe'] * 2)
        self.assertEqual([g[2] for g in got], [1, 0])
        self.assertEqual(self.call(s, 'GET', k), bulk('v'))

    def test_tracking_invalidation(self):
        k = key_prefix(self)
        s = self.raw3()
        other = self.ferry.client(socket_timeout=10)
        self.addCleanup(other.close)
        other.set(k, 'v1')
        self.assertEqual(self.call(s, 'CLIENT', 'TRACKING', 'on'), b'+OK\r\n')
        self.assertEqual(self.call(s, 'GET', k), bulk('v1'))
        other.set(k, 'v2')
        self.assertEqual(resp_read_raw(s, 10), push_invalidate(k))
        self.assertEqual(self.call(s, 'GET', k), bulk('v2'))
        # with CLIENT REPLY OFF, invalidations still arrive
        resp_send(s, ['CLIENT', 'REPLY', 'OFF'])
        resp_send(s, ['GET', k])
        other.set(k, 'v3')
        self.assertEqual(resp_read_raw(s, 10), push_invalidate(k))
        resp_send(s, ['CLIENT', 'REPLY', 'ON'])
        self.assertEqual(resp_read_raw(s, 10), b'+OK\r\n')
        self.assertEqual(self.call(s, 'GET', k), bulk('v3'))

    def test_tracking_redirect_refused_naming_ferry(self):
        c = self.ferry.client(socket_timeout=10)
        self.addCleanup(c.close)
        with self.assertRaises(Exception) as cm:
            c.execute_command('CLIENT', 'TRACKING', 'on', 'REDIRECT', '1')
        self.assertIn('ferry', str(cm.exception))
        self.assertIn('REDIRECT', str(cm.exception))
        # RESP2 tracking without REDIRECT is accepted as on Redis
        self.assertEqual(c.execute_command('CLIENT', 'TRACKING', 'on'), 'OK')

    def test_refused_inside_multi_aborts_exec(self):
        k = key_prefix(self)
        for proto in ('2', '3'):
            s = self.ferry.raw()
            self.addCleanup(s.close)
            resp_send(s, ['HELLO', proto])
            resp_read_reply(s, 10)
            self.assertEqual(self.call(s, 'MULTI'), b'+OK\r\n')
            self.assertEqual(self.call(s, 'SET', k, proto), b'+QUEUED\r\n')
            self.assertEqual(self.call(s, 'SHUTDOWN'),
                             b'-ERR Command not allowed inside a transaction\r\n')
            self.assertTrue(self.call(s, 'REPLICAOF', 'no', 'one').startswith(b'-ERR ferry:'))
            self.assertEqual(self.call(s, 'EXEC'),
                             b'-EXECABORT Transaction discarded because of previous errors.\r\n')
            self.assertEqual(self.call(s, 'GET', k), b'_\r\n' if proto == '3' else b'$-1\r\n')
            # the connection is usable and out of the transaction
            self.assertEqual(self.call(s, 'MULTI'), b'+OK\r\n')
            self.assertEqual(self.call(s, 'EXEC'), b'*0\r\n')

    def test_node_redis_resp3(self):
        node = shutil.which('node')
        if node is None or not os.path.isdir(os.path.join(HERE, 'node_modules', 'redis')):
            raise AssertionError('node or node-redis missing: run scripts/setup')
        k = key_prefix(self)
        p = subprocess.run([node, NODE_DRIVER, str(self.ferry.port), k], capture_output=True,
                           text=True, timeout=NODE_TIMEOUT, cwd=HERE)
        import json
        try:
            out = json.loads(p.stdout.strip().splitlines()[-1])
        except (IndexError, ValueError):
            self.fail('node printed no JSON (exit %d):\n%s\n%s' % (p.returncode, p.stdout,
                                                                   p.stderr[-3000:]))
        self.assertEqual(p.returncode, 0, out)
        self.assertNotIn('error', out)
        self.assertEqual(out['hello_proto'], 3)
        self.assertEqual(out['get'], 'v')
        self.assertEqual(out['hgetall'], {'f': 'v'})
        self.assertEqual(out['zscore'], 1.5)
        self.assertEqual(out['brpop'], {'key': k + ':q', 'element': 'job'})
        self.assertEqual(out['exec'], ['OK', 1])
        self.assertEqual(out['messages'], ['m1', 'm2'])
        self.assertEqual(out['fifo'], ['1', '2', '3'])
        m = self.master().client()
        self.assertEqual(m.get(k), 'v')


class Resp3FailoverChecks(Resp3Client):
    """A RESP3 subscriber and a tracking client across a kill -9 of the
    master: the subscriber keeps its subscriptions (and its commands), the
    tracking client gets a flush invalidation and is tracked again."""

    def kill_master(self):
        raise NotImplementedError

    def test_push_clients_survive_kill9(self):
        k = key_prefix(self)
        sub = self.raw3()
        resp_send(sub, ['SUBSCRIBE', k + ':ch'])
        self.assertEqual(resp_read_raw(sub, 10), push('subscribe', k + ':ch', 1))
        trk = self.raw3()
        other = self.ferry.client(socket_timeout=30)
        self.addCleanup(other.close)
        other.set(k, 'v1')
        self.assertEqual(self.call(trk, 'CLIENT', 'TRACKING', 'on'), b'+OK\r\n')
        self.assertEqual(self.call(trk, 'GET', k), bulk('v1'))
        self.assertEqual(other.publish(k + ':ch', 'before'), 1)
        self.assertEqual(resp_read_raw(sub, 10), push('message', k + ':ch', 'before'))

        self.kill_master()

        # the tracking client is told its cache may be stale
        self.assertEqual(resp_read_raw(trk, 30), FLUSH)
        wait_until(lambda: other.publish(k + ':ch', 'probe') == 1, timeout=30, interval=0.1,
                   msg='the RESP3 subscriber back on the master')
        self.assertEqual(other.publish(k + ':ch', 'after'), 1)
        got = []
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            m = resp_read_raw(sub, 5)
            got.append(m)
            if m == push('message', k + ':ch', 'after'):
                break
        # ferry's re-subscription stays its own: only messages reach the client
        self.assertTrue(all(m.startswith(b'>3\r\n$7\r\nmessage\r\n') for m in got), got)
        self.assertEqual(got[-1], push('message', k + ':ch', 'after'))
        self.assertEqual(self.call(sub, 'GET', k), bulk('v1'))
        # tracking is on again on the new link: a new read is tracked
        self.assertEqual(self.call(trk, 'GET', k), bulk('v1'))
        other.set(k, 'v2')
        self.assertEqual(resp_read_raw(trk, 10), push_invalidate(k))


class SentinelResp3(SentinelMode, Resp3Checks, unittest.TestCase):
    pass


class FixedMasterResp3(FixedMasterMode, Resp3Checks, unittest.TestCase):
    pass


class SentinelResp3Failover(SentinelMode, Resp3FailoverChecks, unittest.TestCase):
    def kill_master(self):
        old = self.topo.master()
        old.kill()
        self.topo.wait_failover(old.port, timeout=30)


class FixedMasterResp3Failover(FixedMasterMode, Resp3FailoverChecks, unittest.TestCase):
    def kill_master(self):
        self.redis.kill()
        self.redis.start(write_conf=False)


load_tests = sentinel_first

if __name__ == '__main__':
    unittest.main()
