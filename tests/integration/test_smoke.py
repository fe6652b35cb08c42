"""redis-benchmark's default suite, redis-cli and redis-py, unmodified,
through ferry: in Sentinel mode (replicas_ack 1) and with a fixed master."""

import subprocess
import time
import unittest

import redis

from harness import DIRECT, resp_read_reply, resp_send, wait_until
from modes import FixedMasterMode, SentinelMode, key_prefix, sentinel_first

CLIENT_TIMEOUT = 5   # seconds one redis-py command may take through ferry
CLI_TIMEOUT = 10     # seconds one redis-cli run may take


class SmokeChecks:
    def client(self, **kw):
        kw.setdefault('socket_timeout', CLIENT_TIMEOUT)
        return self.ferry.client(**kw)

    def test_redis_benchmark_default_suite(self):
        # Every default test (PING, SET, GET, INCR, LPUSH, RPUSH, LPOP, RPOP,
        # SADD, HSET, SPOP, ZADD, ZPOPMIN, LRANGE_*, MSET) at -P 1 and -P 16.
        for pipeline in ('1', '16'):
            out = subprocess.run(
                ['redis-benchmark', '-p', str(self.ferry.port), '-q', '-n', '2000', '-c', '20',
                 '-P', pipeline],
                capture_output=True, text=True, timeout=180)
            self.assertEqual(out.returncode, 0, out.stdout + out.stderr)
            lines = [l for l in out.stdout.replace('\r', '\n').split('\n')
                     if 'requests per second' in l]
            self.assertGreaterEqual(len(lines), 17, out.stdout)
            self.assertNotIn('ERR', out.stdout + out.stderr)
            self.assertNotIn('rror', out.stderr)

    def test_redis_cli(self):
        def cli(*args, stdin=None):
            try:
                return subprocess.run(['redis-cli', '-p', str(self.ferry.port)] + list(args),
                                      input=stdin, capture_output=True, text=True,
                                      timeout=CLI_TIMEOUT)
            except subprocess.TimeoutExpired as e:
                self.fail('redis-cli %r (input %r) got no answer in %d s; it printed %r'
                          % (args, stdin, CLI_TIMEOUT, e.stdout))
        k = key_prefix(self) + ':jobs'
        self.assertEqual(cli('ping').stdout.strip(), 'PONG')
        self.assertEqual(cli('rpush', k, 'a', 'b').stdout.strip(), '2')
        self.assertEqual(cli('brpop', k, '0').stdout.split(), [k, 'b'])
        self.assertEqual(cli('--no-raw', 'lrange', k, '0', '-1').stdout.strip(), '1) "a"')
        # piped commands, as operators script it
        out = cli(stdin='SET k v\nGET k\nDEL k\n')
        self.assertEqual(out.stdout.split(), ['OK', 'v', '1'])
        # a transaction typed at the prompt
        t = key_prefix(self) + ':tx'
        out = cli(stdin='MULTI\nRPUSH %s x\nINCR %s:n\nEXEC\n' % (t, t))
        self.assertEqual(out.stdout.split(), ['OK', 'QUEUED', 'QUEUED', '1', '1'],
                         out.stdout + out.stderr)
        self.assertEqual(self.master().client().lrange(t, 0, -1), ['x'])
        if DIRECT:
            return   # plain Redis would shut down
        out = cli('shutdown')
        self.assertIn('ferry: SHUTDOWN is not allowed through the proxy', out.stdout + out.stderr)

    def test_redis_py_commands_and_pipeline(self):
        r = self.client()
        k = key_prefix(self)
        self.assertTrue(r.ping())
        self.assertEqual(r.lpush(k + ':q', 'a', 'b', 'c'), 3)
        self.assertEqual(r.rpop(k + ':q'), 'a')
        self.assertEqual(r.brpop([k + ':q'], 1), (k + ':q', 'b'))
        # a plain pipeline of 1000 commands, writes and reads interleaved
        p = r.pipeline(transaction=False)
        for i in range(500):
            p.rpush(k + ':p', i)
            p.lindex(k + ':p', -1)
        got = p.execute()
        want = []
        for i in range(500):
            want += [i + 1, str(i)]
        self.assertEqual(got, want)
        self.assertEqual(self.master().client().llen(k + ':p'), 500)
        # a BRPOP that times out answers nil after about its timeout
        t0 = time.monotonic()
        self.assertIsNone(r.brpop([k + ':empty'], 1))
        self.assertLess(time.monotonic() - t0, 10.0)  # a bound on a hang

    def test_redis_py_pubsub(self):
        k = key_prefix(self)
        r = self.client()
        ps = self.client().pubsub()
        self.addCleanup(ps.close)

        def messages(n):
            """The next n messages (confirmations included), 5 s at most."""
            got = []
            deadline = time.monotonic() + 5
            while len(got) < n and time.monotonic() < deadline:
                m = ps.get_message(timeout=0.2)
                if m is not None:
                    got.append((m['type'], m.get('pattern'), m['channel'], m['data']))
            return got
        ps.subscribe(k + ':ch')
        ps.psubscribe(k + ':p.*')
        self.assertEqual(messages(2), [('subscribe', None, k + ':ch', 1),
                                       ('psubscribe', None, k + ':p.*', 2)])
        self.assertEqual(r.publish(k + ':p.x', 'two'), 1)
        self.assertEqual(r.publish(k + ':ch', 'one'), 1)
        self.assertEqual(messages(2), [('pmessage', k + ':p.*', k + ':p.x', 'two'),
                                       ('message', None, k + ':ch', 'one')])
        ps.unsubscribe()
        ps.punsubscribe()
        self.assertEqual(messages(2), [('unsubscribe', None, k + ':ch', 1),
                                       ('punsubscribe', None, k + ':p.*', 0)])
        self.assertEqual(r.publish(k + ':ch', 'lost'), 0)
        self.assertEqual(r.publish(k + ':p.y', 'lost'), 0)

    def test_redis_py_transaction(self):
        r = self.client()
        k = key_prefix(self)
        p = r.pipeline(transaction=True)
        p.delete(k + ':q')
        p.lpush(k + ':q', 'a', 'b')
        p.incr(k + ':n')
        p.lrange(k + ':q', 0, -1)
        self.assertEqual(p.execute(), [0, 2, 1, ['b', 'a']])
        m = self.master().client()
        self.assertEqual(m.lrange(k + ':q', 0, -1), ['b', 'a'])
        self.assertEqual(m.get(k + ':n'), '1')
        # MULTI, a write, DISCARD on one connection: nothing applied
        # (raw RESP: redis-py turns +QUEUED into False for SET)
        sock = self.ferry.raw(timeout=CLIENT_TIMEOUT)
        self.addCleanup(sock.close)
        for cmd, want in ((['MULTI'], 'OK'), (['SET', k + ':discarded', 'x'], 'QUEUED'),
                          (['DISCARD'], 'OK'), (['EXISTS', k + ':discarded'], 0)):
            resp_send(sock, cmd)
            self.assertEqual(resp_read_reply(sock, CLIENT_TIMEOUT), want, cmd)
        self.assertIsNone(m.get(k + ':discarded'))

    def test_transaction_state_does_not_outlive_its_client(self):
        # A client that leaves inside MULTI or with a WATCH open must not
        # hand that state to the next client that gets the same Redis
        # connection: the queued write is never applied, and later
        # transactions neither fail nor abort.
        k = key_prefix(self)
        m = self.master().client()
        for cmds in ([['MULTI'], ['SET', k + ':never', 'x']], [['WATCH', k + ':w']]):
            sock = self.ferry.raw(timeout=CLIENT_TIMEOUT)
            self.addCleanup(sock.close)
            for cmd in cmds:
                resp_send(sock, cmd)
                self.assertIn(resp_read_reply(sock, CLIENT_TIMEOUT), ('OK', 'QUEUED'), cmd)
            sock.close()
        m.set(k + ':w', 'changed')   # would abort an EXEC still watching it

        def in_multi():
            return [c for c in m.client_list() if c.get('multi', '-1') != '-1']
        wait_until(lambda: not in_multi(), timeout=5,
                   msg='no Redis connection left inside MULTI: %r' % (in_multi(),))
        for i in range(4):
            r = self.client()
            p = r.pipeline(transaction=True)
            p.set(k + ':after', i)
            p.incr(k + ':n')
            self.assertEqual(p.execute(), [True, i + 1], 'transaction %d' % i)
            r.close()
        self.assertIsNone(m.get(k + ':never'))

    def test_redis_py_watch_abort(self):
        r = self.client()
        other = self.client()
        k = key_prefix(self)
        r.set(k, 'v0')
        with r.pipeline(transaction=True) as p:
            p.watch(k)
            self.assertEqual(p.get(k), 'v0')
            other.set(k, 'theirs')
            p.multi()
            p.set(k, 'mine')
            p.incr(k + ':side')
            with self.assertRaises(redis.WatchError):
                p.execute()
        m = self.master().client()
        self.assertEqual(m.get(k), 'theirs')
        self.assertIsNone(m.get(k + ':side'))
        # the same without interference commits
        with r.pipeline(transaction=True) as p:
            p.watch(k)
            p.multi()
            p.set(k, 'mine')
            p.incr(k + ':side')
            self.assertEqual(p.execute(), [True, 1])
        self.assertEqual(m.get(k), 'mine')
        self.assertEqual(m.get(k + ':side'), '1')


class SentinelSmokeTest(SentinelMode, SmokeChecks, unittest.TestCase):
    pass


class FixedMasterSmokeTest(FixedMasterMode, SmokeChecks, unittest.TestCase):
    pass


load_tests = sentinel_first

if __name__ == '__main__':
    unittest.main()
