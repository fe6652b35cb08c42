"""RESP protocol behaviour through ferry: pub/sub, transactions, SELECT,
large pipelines, inline commands, HELLO, denied commands, AUTH, QUIT,
vanishing clients and malformed input.

Run: FERRY_TEST_DIRECT=1 python3 -m unittest test_protocol -v  (plain Redis)
     python3 -m unittest test_protocol -v                       (through ferry)
"""
import os
import socket
import threading
import time
import unittest

import harness
from harness import Ferry, RedisServer, wait_until

DIRECT = harness.DIRECT   # FERRY_TEST_DIRECT=1: plain Redis, no ferry


# ---------------------------------------------------------------- helpers

def enc(*args):
    """One RESP multibulk request."""
    out = [b'*%d\r\n' % len(args)]
    for a in args:
        if isinstance(a, int):
            a = str(a)
        if isinstance(a, str):
            a = a.encode()
        out.append(b'$%d\r\n%s\r\n' % (len(a), a))
    return b''.join(out)


def is_err(r):
    if isinstance(r, BaseException):
        return True
    return type(r).__name__.lower().endswith(('error', 'err'))


def err_text(r):
    """The text of an error reply, without the leading '-'."""
    if not is_err(r):
        raise AssertionError('expected an error reply, got %r' % (r,))
    for attr in ('message', 'msg', 'text'):
        v = getattr(r, attr, None)
        if isinstance(v, (str, bytes)):
            break
    else:
        args = getattr(r, 'args', None)
        v = args[0] if args else str(r)
    if isinstance(v, bytes):
        v = v.decode()
    return v[1:] if v.startswith('-') else v


def norm(r):
    """bytes -> str recursively (errors are kept as they are)."""
    if isinstance(r, (bytes, bytearray)):
        return bytes(r).decode()
    if isinstance(r, list):
        return [norm(x) for x in r]
    if isinstance(r, tuple):
        return tuple(norm(x) for x in r)
    return r


def blocked_clients(redis_client, cmd):
    return sum(1 for c in redis_client.client_list()
               if c.get('cmd') == cmd and 'b' in c.get('flags', ''))


def pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie still answers kill(0): look at its state
    try:
        with open('/proc/%d/stat' % pid) as f:
            return f.read().rsplit(')', 1)[1].split()[0] != 'Z'
    except OSError:
        return False


class Base(unittest.TestCase):
    redis_conf = None
    ferry_conf = None

    def setUp(self):
        self.redis = RedisServer(self.redis_conf)
        self.addCleanup(self.redis.stop)
        self.ferry = Ferry(self.redis, self.ferry_conf)
        self.addCleanup(self.ferry.stop)
        self.direct = self.redis.client()
        self.addCleanup(self.direct.close)

    def ferry_only(self):
        if DIRECT:
            self.skipTest('ferry-only')

    def raw(self):
        s = self.ferry.raw()
        self.addCleanup(s.close)
        return s

    def client(self, **kw):
        kw.setdefault('socket_timeout', 30)
        c = self.ferry.client(**kw)
        self.addCleanup(c.close)
        return c

    def call(self, sock, *args, timeout=10.0):
        harness.resp_send(sock, enc(*args))
        return self.read(sock, timeout)

    def read(self, sock, timeout=10.0):
        return norm(harness.resp_read_reply(sock, timeout))

    def assertErr(self, reply, prefix, contains=None):
        t = err_text(reply)
        self.assertTrue(t.startswith(prefix), 'error %r does not start with %r' % (t, prefix))
        if contains is not None:
            self.assertIn(contains, t)
        return t

    def assertClosed(self, sock, timeout=5.0):
        """The server closes the connection: recv returns b'' (or a reset)
        within timeout, with no further data."""
        sock.settimeout(timeout)
        deadline = time.monotonic() + timeout
        while True:
            try:
                d = sock.recv(65536)
            except (ConnectionResetError, BrokenPipeError):
                return
            except socket.timeout:
                self.fail('connection not closed by the server within %ss' % timeout)
            if d == b'':
                return
            self.fail('unexpected data before close: %r' % d[:200])
            if time.monotonic() > deadline:   # pragma: no cover
                self.fail('connection not closed')

    def assertServing(self):
        """ferry (or Redis) still serves a fresh client; ferry's process lives."""
        c = self.client()
        self.assertTrue(c.ping())
        self.assertTrue(c.set('serving-check', 'yes'))
        self.assertEqual(c.get('serving-check'), 'yes')
        if not DIRECT:
            self.assertTrue(pid_alive(self.ferry.pid), 'ferry process died')


# ---------------------------------------------------------------- pub/sub

class TestPubSub(Base):
    AFTER_SUB_KEY = 'after-sub'  # a key the connection writes once unsubscribed

    def test_subscribe_publish_unsubscribe(self):
        sub = self.raw()        # SUBSCRIBE ch1 ch2
        psub = self.raw()       # PSUBSCRIBE ch*
        pub = self.client()

        harness.resp_send(sub, enc('SUBSCRIBE', 'ch1', 'ch2'))
        self.assertEqual(self.read(sub), ['subscribe', 'ch1', 1])
        self.assertEqual(self.read(sub), ['subscribe', 'ch2', 2])
        self.assertEqual(self.call(psub, 'PSUBSCRIBE', 'ch*'), ['psubscribe', 'ch*', 1])

        self.assertEqual(pub.publish('ch1', 'hello'), 2)
        self.assertEqual(self.read(sub), ['message', 'ch1', 'hello'])
        self.assertEqual(self.read(psub), ['pmessage', 'ch*', 'ch1', 'hello'])

        self.assertEqual(pub.publish('chX', 'only-pattern'), 1)
        self.assertEqual(self.read(psub), ['pmessage', 'ch*', 'chX', 'only-pattern'])
        self.assertEqual(pub.publish('other', 'nobody'), 0)

        # PING in subscribed mode (RESP2): a two-element array
        self.assertEqual(self.call(sub, 'PING'), ['pong', ''])
        self.assertEqual(self.call(sub, 'PING', 'hi'), ['pong', 'hi'])
        self.assertEqual(self.call(psub, 'PING'), ['pong', ''])

        # binary-safe payload
        payload = 'a\r\nb\x00c' + 'z' * 100000
        self.assertEqual(pub.publish('ch2', payload), 2)
        self.assertEqual(self.read(sub), ['message', 'ch2', payload])
        self.assertEqual(self.read(psub), ['pmessage', 'ch*', 'ch2', payload])

        # one connection with both a channel and a pattern: counted twice
        self.assertEqual(self.call(sub, 'PSUBSCRIBE', 'ch1*'), ['psubscribe', 'ch1*', 3])
        self.assertEqual(pub.publish('ch1', 'both'), 3)
        self.assertEqual(self.read(sub), ['message', 'ch1', 'both'])
        self.assertEqual(self.read(sub), ['pmessage', 'ch1*', 'ch1', 'both'])
        self.assertEqual(self.read(psub), ['pmessage', 'ch*', 'ch1', 'both'])

        # unsubscribing
        self.assertEqual(self.call(sub, 'UNSUBSCRIBE', 'ch1'), ['unsubscribe', 'ch1', 2])
        self.assertEqual(self.call(sub, 'PUNSUBSCRIBE', 'ch1*'), ['punsubscribe', 'ch1*', 1])
        self.assertEqual(pub.publish('ch1', 'gone'), 1)
        self.assertEqual(self.read(psub), ['pmessage', 'ch*', 'ch1', 'gone'])
        self.assertEqual(self.call(sub, 'UNSUBSCRIBE'), ['unsubscribe', 'ch2', 0])
        self.assertEqual(self.call(psub, 'PUNSUBSCRIBE'), ['punsubscribe', 'ch*', 0])
        self.assertEqual(pub.publish('ch2', 'none'), 0)

        # back to normal mode on the same connections
        self.assertEqual(self.call(sub, 'PING'), 'PONG')
        self.assertEqual(self.call(sub, 'SET', self.AFTER_SUB_KEY, 'v'), 'OK')
        self.assertEqual(self.call(sub, 'GET', self.AFTER_SUB_KEY), 'v')
        self.assertEqual(self.call(psub, 'PING'), 'PONG')

    def test_unsubscribe_when_not_subscribed(self):
        s = self.raw()
        self.assertEqual(self.call(s, 'UNSUBSCRIBE'), ['unsubscribe', None, 0])
        self.assertEqual(self.call(s, 'PUNSUBSCRIBE'), ['punsubscribe', None, 0])
        self.assertEqual(self.call(s, 'PING'), 'PONG')

    def test_subscriber_thread_with_redis_py(self):
        """Messages published from many threads all reach a redis-py
        subscriber, in per-publisher order."""
        c = self.client()
        ps = c.pubsub()
        self.addCleanup(ps.close)
        ps.subscribe('feed')
        m = ps.get_message(timeout=5)
        self.assertEqual(m['type'], 'subscribe')
        wait_until(lambda: self.direct.pubsub_numsub('feed')[0][1] == 1, timeout=5,
                   msg='subscription visible on Redis')

        def publisher(n):
            p = self.client()
            for i in range(200):
                self.assertEqual(p.publish('feed', '%d:%d' % (n, i)), 1)

        ts = [threading.Thread(target=publisher, args=(n,), daemon=True) for n in range(4)]
        for t in ts:
            t.start()
        got = []
        deadline = time.monotonic() + 30
        while len(got) < 800 and time.monotonic() < deadline:
            m = ps.get_message(timeout=1)
            if m and m['type'] == 'message':
                got.append(m['data'])
        for t in ts:
            t.join(10)
        self.assertEqual(len(got), 800)
        for n in range(4):
            self.assertEqual([g for g in got if g.startswith('%d:' % n)],
                             ['%d:%d' % (n, i) for i in range(200)])


# ---------------------------------------------------------------- transactions

class TestTransactions(Base):
    def test_multi_exec_queued(self):
        s = self.raw()
        self.assertEqual(self.call(s, 'MULTI'), 'OK')
        self.assertEqual(self.call(s, 'SET', 'tx', '1'), 'QUEUED')
        self.assertEqual(self.call(s, 'INCR', 'tx'), 'QUEUED')
        self.assertEqual(self.call(s, 'GET', 'tx'), 'QUEUED')
        self.assertEqual(self.call(s, 'LPUSH', 'tx', 'x'), 'QUEUED')   # WRONGTYPE at exec
        # not visible to others before EXEC
        self.assertIsNone(self.client().get('tx'))
        r = self.call(s, 'EXEC')
        self.assertEqual(r[:3], ['OK', 2, '2'])
        self.assertErr(r[3], 'WRONGTYPE')
        self.assertEqual(self.client().get('tx'), '2')

    def test_multi_exec_pipelined_one_write(self):
        s = self.raw()
        harness.resp_send(s, enc('MULTI') + enc('INCR', 'p') + enc('INCR', 'p') + enc('EXEC'))
        self.assertEqual([self.read(s) for _ in range(4)], ['OK', 'QUEUED', 'QUEUED', [1, 2]])

    def test_exec_abort_on_queue_error(self):
        s = self.raw()
        self.assertEqual(self.call(s, 'MULTI'), 'OK')
        self.assertEqual(self.call(s, 'SET', 'ab', '1'), 'QUEUED')
        self.assertErr(self.call(s, 'NOSUCHCOMMAND', 'x'), 'ERR unknown command')
        self.assertErr(self.call(s, 'EXEC'), 'EXECABORT')
        self.assertIsNone(self.client().get('ab'))
        self.assertEqual(self.call(s, 'PING'), 'PONG')

    def test_watch_concurrent_write_aborts(self):
        s = self.raw()
        other = self.client()
        other.set('w', 'orig')
        self.assertEqual(self.call(s, 'WATCH', 'w'), 'OK')
        self.assertEqual(self.call(s, 'GET', 'w'), 'orig')
        self.assertTrue(other.set('w', 'concurrent'))
        self.assertEqual(self.call(s, 'MULTI'), 'OK')
        self.assertEqual(self.call(s, 'SET', 'w', 'mine'), 'QUEUED')
        self.assertIsNone(self.call(s, 'EXEC'))          # aborted: nil
        self.assertEqual(other.get('w'), 'concurrent')

        # without a concurrent write the same sequence commits
        self.assertEqual(self.call(s, 'WATCH', 'w'), 'OK')
        self.assertEqual(self.call(s, 'MULTI'), 'OK')
        self.assertEqual(self.call(s, 'SET', 'w', 'mine'), 'QUEUED')
        self.assertEqual(self.call(s, 'EXEC'), ['OK'])
        self.assertEqual(other.get('w'), 'mine')

        # UNWATCH forgets the watch
        self.assertEqual(self.call(s, 'WATCH', 'w'), 'OK')
        self.assertEqual(self.call(s, 'UNWATCH'), 'OK')
        other.set('w', 'again')
        self.assertEqual(self.call(s, 'MULTI'), 'OK')
        self.assertEqual(self.call(s, 'SET', 'w', 'final'), 'QUEUED')
        self.assertEqual(self.call(s, 'EXEC'), ['OK'])
        self.assertEqual(other.get('w'), 'final')

    def test_watch_redis_py_optimistic_increment(self):
        """Several threads doing WATCH/GET/MULTI/SET/EXEC retries: no lost
        update."""
        c0 = self.client()
        c0.set('ctr', 0)
        errors = []

        def worker():
            try:
                c = self.client()
                for _ in range(50):
                    while True:
                        with c.pipeline() as p:
                            try:
                                p.watch('ctr')
                                v = int(p.get('ctr'))
                                p.multi()
                                p.set('ctr', v + 1)
                                p.execute()
                                break
                            except Exception as e:  # WatchError -> retry
                                if type(e).__name__ != 'WatchError':
                                    raise
            except Exception as e:
                errors.append(e)

        ts = [threading.Thread(target=worker, daemon=True) for _ in range(4)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(60)
            self.assertFalse(t.is_alive())
        self.assertEqual(errors, [])
        self.assertEqual(c0.get('ctr'), '200')

    def test_discard(self):
        s = self.raw()
        self.assertEqual(self.call(s, 'MULTI'), 'OK')
        self.assertEqual(self.call(s, 'SET', 'd', '1'), 'QUEUED')
        self.assertEqual(self.call(s, 'DISCARD'), 'OK')
        self.assertIsNone(self.call(s, 'GET', 'd'))
        self.assertErr(self.call(s, 'EXEC'), 'ERR EXEC without MULTI')
        self.assertErr(self.call(s, 'DISCARD'), 'ERR DISCARD without MULTI')
        self.assertIsNone(self.client().get('d'))


# ---------------------------------------------------------------- SELECT

class TestSelect(Base):
    def test_select_isolation(self):
        a = self.raw()
        b = self.client()                # db 0
        b3 = self.client(db=3)           # db 3 through redis-py's own SELECT
        self.assertEqual(self.call(a, 'SELECT', 3), 'OK')
        self.assertEqual(self.call(a, 'SET', 'sk', 'in-db3'), 'OK')
        self.assertIsNone(b.get('sk'))
        self.assertEqual(b3.get('sk'), 'in-db3')
        self.assertEqual(self.direct.get('sk'), None)
        self.assertEqual(self.redis.client(db=3).get('sk'), 'in-db3')
        # many interleaved requests from the db-0 client do not leak db 3
        for i in range(100):
            b.set('zero-%d' % i, i)
        self.assertEqual(self.call(a, 'GET', 'zero-5'), None)
        self.assertEqual(self.call(a, 'DBSIZE'), 1)
        self.assertEqual(self.call(a, 'SELECT', 0), 'OK')
        self.assertIsNone(self.call(a, 'GET', 'sk'))
        self.assertEqual(self.call(a, 'GET', 'zero-5'), '5')
        self.assertEqual(self.call(a, 'SELECT', 3), 'OK')
        self.assertEqual(self.call(a, 'GET', 'sk'), 'in-db3')
        self.assertErr(self.call(a, 'SELECT', 99), 'ERR DB index is out of range')
        self.assertEqual(self.call(a, 'GET', 'sk'), 'in-db3')

    def test_integer_arguments_read_as_redis_reads_them(self):
        # Redis reads these with string2ll: no sign but '-', no leading zero,
        # no space, no '-0', nothing past 64 bits.
        a = self.raw()
        for bad in ('+0', ' 0', '0 ', '00', '-0', '01', '+1', '1\x000',
                    '9223372036854775808', '-9223372036854775809', '99999999999999999999'):
            self.assertErr(self.call(a, 'SELECT', bad), 'ERR value is not an integer or out of range')
            self.assertErr(self.call(a, 'HELLO', bad),
                           'ERR Protocol version is not an integer or out of range')
            self.assertErr(self.call(a, 'CLIENT', 'UNBLOCK', bad),
                           'ERR value is not an integer or out of range')
        self.assertEqual(self.call(a, 'SET', 'ik', 'v'), 'OK')
        self.assertEqual(self.call(a, 'SELECT', '0'), 'OK')
        self.assertEqual(self.call(a, 'GET', 'ik'), 'v')
        self.assertEqual(self.call(a, 'CLIENT', 'UNBLOCK', '-9223372036854775808'), 0)


# ---------------------------------------------------------------- pipelines, inline

class TestPipeline(Base):
    def test_10000_commands_one_write(self):
        N = 10000
        reqs = []
        expected = []
        ctr = 0
        for i in range(N):
            k = i % 3
            if k == 0:
                reqs.append(enc('SET', 'p:%d' % i, 'v:%d' % i))
                expected.append('OK')
            elif k == 1:
                reqs.append(enc('INCR', 'pctr'))
                ctr += 1
                expected.append(ctr)
            else:
                reqs.append(enc('GET', 'p:%d' % (i - 2)))
                expected.append('v:%d' % (i - 2))
        data = b''.join(reqs)
        self.assertTrue(data.startswith(b'*3\r\n$3\r\nSET\r\n'))
        s = self.raw()
        s.sendall(data)             # one write
        got = [self.read(s, 30) for _ in range(N)]
        for i in range(N):
            if got[i] != expected[i]:
                self.fail('reply %d: got %r, expected %r' % (i, got[i], expected[i]))
        self.assertEqual(self.call(s, 'GET', 'pctr'), str(ctr))

    def test_inline_commands(self):
        s = self.raw()
        harness.resp_send(s, b'PING\r\n')
        self.assertEqual(self.read(s), 'PONG')
        harness.resp_send(s, b'SET k "a b"\r\n')
        self.assertEqual(self.read(s), 'OK')
        harness.resp_send(s, b'GET k\r\n')
        self.assertEqual(self.read(s), 'a b')
        self.assertEqual(self.client().get('k'), 'a b')
        # single quotes, escapes, extra spaces, LF-only line, empty line ignored
        harness.resp_send(s, b"SET   k2   'c d'  \r\n")
        self.assertEqual(self.read(s), 'OK')
        harness.resp_send(s, b'ECHO "x\\x41\\ty"\r\n')
        self.assertEqual(self.read(s), 'xA\ty')
        harness.resp_send(s, b'\r\nPING\n')
        self.assertEqual(self.read(s), 'PONG')
        # inline and multibulk mixed in one write
        harness.resp_send(s, b'GET k2\r\n' + enc('GET', 'k') + b'EXISTS k k2 nope\r\n')
        self.assertEqual([self.read(s) for _ in range(3)], ['c d', 'a b', 2])

    def test_hello(self):
        s = self.raw()
        r = self.call(s, 'HELLO', '2')
        self.assertIsInstance(r, list)
        self.assertEqual(len(r) % 2, 0)
        d = dict(zip(r[0::2], r[1::2]))
        self.assertEqual(d.get('proto'), 2)
        self.assertIn('server', d)
        self.assertIn('version', d)
        r = self.call(s, 'HELLO')
        d = dict(zip(r[0::2], r[1::2]))
        self.assertEqual(d.get('proto'), 2)
        self.assertEqual(self.call(s, 'PING'), 'PONG')

    def test_hello4_noproto(self):
        s = self.raw()
        self.assertErr(self.call(s, 'HELLO', '4'), 'NOPROTO')
        # still RESP2
        self.assertEqual(self.call(s, 'PING'), 'PONG')
        self.assertEqual(self.call(s, 'HSET', 'h', 'f', 'v'), 1)
        self.assertEqual(self.call(s, 'HGETALL', 'h'), ['f', 'v'])

    def test_hello3_switches_and_back(self):
        s = self.raw()
        r = self.call(s, 'HELLO', '3')
        self.assertIsInstance(r, dict)
        self.assertEqual(r[b'proto'], 3)
        self.assertEqual(r[b'server'], b'redis')
        harness.resp_send(s, enc('HSET', 'h3', 'f', 'v'))
        self.assertEqual(self.read(s), 1)
        # the bytes Redis sends in RESP3: a map, a null
        harness.resp_send(s, enc('HGETALL', 'h3'))
        self.assertEqual(harness.resp_read_raw(s), b'%1\r\n$1\r\nf\r\n$1\r\nv\r\n')
        harness.resp_send(s, enc('GET', 'h3-missing'))
        self.assertEqual(harness.resp_read_raw(s), b'_\r\n')
        r = self.call(s, 'HELLO', '2')
        d = dict(zip(r[0::2], r[1::2]))
        self.assertEqual(d.get('proto'), 2)
        harness.resp_send(s, enc('GET', 'h3-missing'))
        self.assertEqual(harness.resp_read_raw(s), b'$-1\r\n')
        self.assertEqual(self.call(s, 'HGETALL', 'h3'), ['f', 'v'])


# ---------------------------------------------------------------- denied / allowed

DENIED = [
    ('SHUTDOWN',),
    ('REPLICAOF', 'no', 'one'),
    ('FAILOVER',),
    ('DEBUG', 'SLEEP', '0'),
    ('CONFIG', 'REWRITE'),
    ('CONFIG', 'SET', 'appendonly', 'no'),
    ('CONFIG', 'SET', 'appendfsync', 'no'),
    ('CONFIG', 'SET', 'maxmemory', '0', 'appendfsync', 'no'),
]


class TestDenied(Base):
    def test_denied_commands(self):
        self.ferry_only()
        self.direct.config_set('maxmemory', '100mb')
        s = self.raw()
        for cmd in DENIED:
            r = self.call(s, *cmd)
            self.assertErr(r, 'ERR ferry: ', 'is not allowed through the proxy')
            self.assertEqual(self.call(s, 'PING'), 'PONG', 'after %r' % (cmd,))
        # also in lower case and inline
        harness.resp_send(s, b'shutdown nosave\r\n')
        self.assertErr(self.read(s), 'ERR ferry: ', 'is not allowed through the proxy')
        self.assertErr(self.call(s, 'config', 'set', 'APPENDFSYNC', 'always'), 'ERR ferry: ',
                       'is not allowed through the proxy')
        # nothing happened on Redis
        self.assertTrue(self.direct.ping())
        self.assertEqual(self.direct.config_get('maxmemory')['maxmemory'], str(100 * 1024 * 1024))
        # ferry itself enforces appendfsync always on the master it uses
        self.assertEqual(self.direct.config_get('appendfsync')['appendfsync'], 'always')
        self.assertEqual(self.direct.info('replication')['role'], 'master')
        self.assertServing()

    def test_allowed_admin_commands(self):
        s = self.raw()
        self.direct.config_set('maxmemory-policy', 'allkeys-lru')
        self.assertEqual(self.call(s, 'CONFIG', 'GET', 'appendfsync'),
                         ['appendfsync', 'everysec' if DIRECT else 'always'])
        self.assertEqual(self.call(s, 'CONFIG', 'SET', 'maxmemory-policy', 'noeviction'), 'OK')
        self.assertEqual(self.direct.config_get('maxmemory-policy')['maxmemory-policy'],
                         'noeviction')
        self.assertEqual(self.call(s, 'SET', 'enc', 'hello'), 'OK')
        self.assertEqual(self.call(s, 'OBJECT', 'ENCODING', 'enc'), 'embstr')
        self.assertEqual(self.call(s, 'HSET', 'ench', 'f', 'v'), 1)
        self.assertEqual(self.call(s, 'OBJECT', 'ENCODING', 'ench'), 'listpack')
        cl = self.call(s, 'CLIENT', 'LIST')
        self.assertIsInstance(cl, str)
        self.assertIn('id=', cl)
        self.assertEqual(self.call(s, 'FUNCTION', 'LIST'), [])
        self.assertEqual(self.call(s, 'FLUSHALL'), 'OK')
        self.assertEqual(self.call(s, 'DBSIZE'), 0)
        self.assertEqual(self.direct.dbsize(), 0)


# ---------------------------------------------------------------- AUTH

class TestAuth(Base):
    ferry_conf = {'client': {'password': 'sekret'}}

    def setUp(self):
        if DIRECT:
            self.skipTest('ferry-only')
        super().setUp()

    def test_auth(self):
        s = self.raw()
        self.assertErr(self.call(s, 'GET', 'a'), 'NOAUTH')
        self.assertErr(self.call(s, 'SET', 'a', '1'), 'NOAUTH')
        self.assertErr(self.call(s, 'AUTH', 'wrong'), 'WRONGPASS')
        self.assertErr(self.call(s, 'GET', 'a'), 'NOAUTH')
        self.assertEqual(self.call(s, 'AUTH', 'sekret'), 'OK')
        self.assertEqual(self.call(s, 'SET', 'a', '1'), 'OK')
        self.assertEqual(self.call(s, 'GET', 'a'), '1')
        self.assertEqual(self.direct.get('a'), '1')
        # a redis-py client with the password
        c = self.client(password='sekret')
        self.assertEqual(c.get('a'), '1')
        # the unauthenticated SET above did not reach Redis
        self.assertEqual(self.direct.dbsize(), 1)


# ---------------------------------------------------------------- QUIT, vanishing clients

class TestConnectionLifecycle(Base):
    def test_quit(self):
        s = self.raw()
        self.assertEqual(self.call(s, 'SET', 'q1', 'x'), 'OK')
        self.assertEqual(self.call(s, 'QUIT'), 'OK')
        self.assertClosed(s)

    def test_quit_pipelined_stops_processing(self):
        s = self.raw()
        harness.resp_send(s, enc('SET', 'before', '1') + enc('QUIT') + enc('SET', 'after', '1'))
        self.assertEqual(self.read(s), 'OK')
        self.assertEqual(self.read(s), 'OK')
        self.assertClosed(s)
        self.assertEqual(self.direct.get('before'), '1')
        self.assertIsNone(self.direct.get('after'))
        self.assertServing()

    def test_client_vanishes_mid_pipeline(self):
        bystander = self.raw()
        self.assertEqual(self.call(bystander, 'SET', 'by', '1'), 'OK')
        big = b'B' * 200000
        reqs = []
        for i in range(5000):
            if i % 100 == 0:
                reqs.append(enc('SET', 'big:%d' % i, big))
            elif i % 100 == 50:
                reqs.append(enc('GET', 'big:%d' % (i - 50)))
            else:
                reqs.append(enc('INCR', 'vctr'))
        s = self.ferry.raw()
        try:
            s.settimeout(10)
            s.sendall(b''.join(reqs))
        except OSError:
            pass       # the point is only that the client goes away mid-stream
        finally:
            s.close()
        self.assertServing()
        self.assertEqual(self.call(bystander, 'GET', 'by'), '1')
        self.assertEqual(self.call(bystander, 'INCR', 'by'), 2)
        # whatever reached Redis was executed in order: counter is consistent
        v = self.direct.get('vctr')
        self.assertTrue(v is None or 0 < int(v) <= 4900, v)

    def test_client_vanishes_mid_brpop(self):
        s = self.ferry.raw()
        harness.resp_send(s, enc('BRPOP', 'q', '0'))
        wait_until(lambda: blocked_clients(self.direct, 'brpop') == 1, timeout=10,
                   msg='BRPOP blocked on Redis')
        s.close()
        # the blocked call must go away on Redis (no client left in BRPOP)
        wait_until(lambda: blocked_clients(self.direct, 'brpop') == 0, timeout=10,
                   msg='abandoned BRPOP no longer blocked on Redis')
        c = self.client()
        self.assertEqual(c.lpush('q', 'item'), 1)
        deadline = time.monotonic() + 0.5
        while time.monotonic() < deadline:
            self.assertEqual(c.llen('q'), 1, 'item consumed by the vanished BRPOP')
            time.sleep(0.02)
        self.assertEqual(c.rpop('q'), 'item')
        self.assertServing()

    def test_many_clients_vanish_mid_brpop(self):
        socks = []
        for i in range(20):
            s = self.ferry.raw()
            harness.resp_send(s, enc('BRPOP', 'mq', '0'))
            socks.append(s)
        wait_until(lambda: blocked_clients(self.direct, 'brpop') == 20, timeout=10,
                   msg='20 BRPOPs blocked on Redis')
        for s in socks:
            s.close()
        wait_until(lambda: blocked_clients(self.direct, 'brpop') == 0, timeout=10,
                   msg='abandoned BRPOPs no longer blocked on Redis')
        c = self.client()
        c.lpush('mq', *range(5))
        deadline = time.monotonic() + 0.5
        while time.monotonic() < deadline:
            self.assertEqual(c.llen('mq'), 5)
            time.sleep(0.02)
        self.assertServing()


# ---------------------------------------------------------------- malformed input

class TestMalformed(Base):
    def check(self, data, expected):
        bystander = self.raw()
        self.assertEqual(self.call(bystander, 'SET', 'bystander', 'ok'), 'OK')
        s = self.raw()
        s.sendall(data)
        r = harness.resp_read_reply(s, 10)
        self.assertEqual(err_text(r), expected)
        self.assertClosed(s)
        self.assertEqual(self.call(bystander, 'GET', 'bystander'), 'ok')
        self.assertEqual(self.call(bystander, 'PING'), 'PONG')
        self.assertServing()

    def test_invalid_multibulk_length(self):
        self.check(b'*abc\r\n', 'ERR Protocol error: invalid multibulk length')

    def test_expected_dollar(self):
        self.check(b'*1\r\nfoo\r\n', "ERR Protocol error: expected '$', got 'f'")

    def test_bulk_length_too_big(self):
        self.check(b'*1\r\n$999999999999\r\n', 'ERR Protocol error: invalid bulk length')

    def test_bulk_length_just_over_512mb(self):
        self.check(b'*1\r\n$536870913\r\n', 'ERR Protocol error: invalid bulk length')

    def test_inline_too_big(self):
        self.check(b'x' * 70000, 'ERR Protocol error: too big inline request')

    def test_unbalanced_quotes(self):
        self.check(b'SET k "a b\r\n', 'ERR Protocol error: unbalanced quotes in request')

    def test_error_after_valid_commands_in_same_write(self):
        """Replies to the valid commands before the garbage come first."""
        s = self.raw()
        s.sendall(enc('SET', 'pre', '1') + enc('INCR', 'pre') + b'*abc\r\n' + enc('SET', 'post', '1'))
        self.assertEqual(self.read(s), 'OK')
        self.assertEqual(self.read(s), 2)
        self.assertEqual(err_text(harness.resp_read_reply(s, 10)),
                         'ERR Protocol error: invalid multibulk length')
        self.assertClosed(s)
        self.assertEqual(self.direct.get('pre'), '2')
        self.assertIsNone(self.direct.get('post'))


if __name__ == '__main__':
    unittest.main()
