"""Queue patterns through ferry: FIFO lists, priority BRPOP, sorted-set
queues (BZPOPMIN), a Lua delayed queue, blocking past Redis' idle timeout and
LPOP with a count.

Run: FERRY_TEST_DIRECT=1 python3 -m unittest test_queues -v  (plain Redis)
     python3 -m unittest test_queues -v                       (through ferry)
"""
import os
import random
import threading
import time
import unittest

import harness
from harness import Ferry, RedisServer, wait_until

DIRECT = harness.DIRECT   # FERRY_TEST_DIRECT=1: plain Redis, no ferry


def blocked_clients(redis_client, cmd):
    """Clients of the Redis server currently blocked in `cmd` (lowercase)."""
    n = 0
    for c in redis_client.client_list():
        if c.get('cmd') == cmd and 'b' in c.get('flags', ''):
            n += 1
    return n


def run_thread(target, *args):
    """Start a daemon thread running target(*args); exceptions are kept in
    t.error, the result in t.result."""
    t = threading.Thread(daemon=True)
    t.error = None
    t.result = None

    def body():
        try:
            t.result = target(*args)
        except BaseException as e:  # noqa: B902 - reported by the test
            t.error = e
    t.run = body
    t.start()
    return t


def join_ok(test, t, timeout):
    t.join(timeout)
    test.assertFalse(t.is_alive(), 'thread did not finish within %ss' % timeout)
    if t.error is not None:
        raise t.error
    return t.result


class QueueTestBase(unittest.TestCase):
    redis_conf = None
    ferry_conf = None

    def setUp(self):
        self.redis = RedisServer(self.redis_conf)
        self.addCleanup(self.redis.stop)
        self.ferry = Ferry(self.redis, self.ferry_conf)
        self.addCleanup(self.ferry.stop)
        self.direct = self.redis.client()   # straight to Redis, for inspection
        self.addCleanup(self.direct.close)

    def ferry_only(self):
        if DIRECT:
            self.skipTest('ferry-only')

    def client(self, **kw):
        kw.setdefault('socket_timeout', 30)
        c = self.ferry.client(**kw)
        self.addCleanup(c.close)
        return c

    def wait_blocked(self, cmd, n=1, timeout=10.0):
        wait_until(lambda: blocked_clients(self.direct, cmd) >= n, timeout=timeout,
                   msg='%d client(s) blocked in %s on Redis' % (n, cmd))


class TestFifo(QueueTestBase):
    def test_n1_lpush_brpop_fifo_1000(self):
        """N1: a consumer blocked in BRPOP before anything is pushed gets 1000
        items in push order."""
        N = 1000
        consumer = self.client()
        producer = self.client()

        def consume():
            got = []
            while len(got) < N:
                r = consumer.brpop('fifo', timeout=10)
                if r is None:
                    raise AssertionError('BRPOP timed out after %d items' % len(got))
                key, val = r
                if key != 'fifo':
                    raise AssertionError('BRPOP returned key %r' % key)
                got.append(val)
            return got

        t = run_thread(consume)
        self.wait_blocked('brpop')
        self.assertEqual(producer.llen('fifo'), 0)
        for i in range(N):
            producer.lpush('fifo', 'item-%d' % i)
        got = join_ok(self, t, 60)
        self.assertEqual(got, ['item-%d' % i for i in range(N)])
        self.assertEqual(producer.llen('fifo'), 0)

    def test_n6_rpush_lpop_fifo(self):
        """N6: the RPUSH + LPOP variant of a FIFO keeps order."""
        c = self.client()
        N = 1000
        for i in range(N):
            self.assertEqual(c.rpush('rfifo', 'x%d' % i), i + 1)
        got = [c.lpop('rfifo') for _ in range(N)]
        self.assertEqual(got, ['x%d' % i for i in range(N)])
        self.assertIsNone(c.lpop('rfifo'))
        self.assertEqual(c.exists('rfifo'), 0)

    def test_n6_lpop_count(self):
        """N6: LPOP key count returns up to count items in order; nil on a
        missing key."""
        c = self.client()
        c.rpush('lc', *['v%d' % i for i in range(150)])
        self.assertEqual(c.lpop('lc', 100), ['v%d' % i for i in range(100)])
        self.assertEqual(c.llen('lc'), 50)
        self.assertEqual(c.lpop('lc', 100), ['v%d' % i for i in range(100, 150)])
        self.assertEqual(c.exists('lc'), 0)

        c.rpush('lc30', *['w%d' % i for i in range(30)])
        self.assertEqual(c.lpop('lc30', 100), ['w%d' % i for i in range(30)])
        self.assertEqual(c.exists('lc30'), 0)

        self.assertIsNone(c.lpop('missing-list', 100))
        self.assertIsNone(c.lpop('missing-list'))


class TestPriority(QueueTestBase):
    def test_n2_brpop_priority_order(self):
        """N2: BRPOP high mid low 0 drains high first, then mid, then low."""
        c = self.client()
        for k in ('low', 'mid', 'high'):      # fill lowest priority first
            c.lpush(k, *['%s-%d' % (k, i) for i in range(3)])
        got = [tuple(c.brpop(['high', 'mid', 'low'], timeout=0)) for _ in range(9)]
        expected = [(k, '%s-%d' % (k, i)) for k in ('high', 'mid', 'low') for i in range(3)]
        self.assertEqual(got, expected)
        self.assertEqual(c.exists('high', 'mid', 'low'), 0)

        # interleaved: a high item pushed after mid/low still wins
        c.lpush('low', 'l1')
        c.lpush('mid', 'm1')
        self.assertEqual(c.brpop(['high', 'mid', 'low'], timeout=0), ('mid', 'm1'))
        c.lpush('high', 'h1')
        self.assertEqual(c.brpop(['high', 'mid', 'low'], timeout=0), ('high', 'h1'))
        self.assertEqual(c.brpop(['high', 'mid', 'low'], timeout=0), ('low', 'l1'))

    def test_n2_blocked_on_three_gets_whichever_pushed(self):
        """N2: a consumer blocked on all three lists gets the item from the one
        that is pushed."""
        consumer = self.client()
        producer = self.client()
        for k in ('mid', 'low', 'high'):
            t = run_thread(lambda: consumer.brpop(['high', 'mid', 'low'], timeout=0))
            self.wait_blocked('brpop')
            producer.lpush(k, 'only-' + k)
            r = join_ok(self, t, 10)
            self.assertEqual(tuple(r), (k, 'only-' + k))
            wait_until(lambda: blocked_clients(self.direct, 'brpop') == 0, timeout=5,
                       msg='no client left blocked')
            self.assertEqual(producer.exists('high', 'mid', 'low'), 0)


class TestSortedSetQueue(QueueTestBase):
    def test_n3_bzpopmin_100k(self):
        """N3: BZPOPMIN over a 100 000-member sorted set returns the minimum
        each time."""
        N = 100000
        c = self.client()
        rnd = random.Random(1234)
        scores = rnd.sample(range(10 ** 9), N)          # unique scores
        members = [('m%d' % i, scores[i]) for i in range(N)]
        batch = 1000
        pipe = c.pipeline(transaction=False)
        for off in range(0, N, batch):
            pipe.zadd('zq', dict(members[off:off + batch]))
        res = pipe.execute()
        self.assertEqual(res, [batch] * (N // batch))
        self.assertEqual(c.zcard('zq'), N)

        expected = sorted(members, key=lambda m: m[1])
        # first part one call at a time
        seq = 2000
        for i in range(seq):
            r = c.bzpopmin('zq', timeout=0)
            self.assertEqual(r, ('zq', expected[i][0], float(expected[i][1])),
                             'pop %d' % i)
        # the rest pipelined (blocking commands that do not block)
        i = seq
        while i < N:
            n = min(1000, N - i)
            pipe = c.pipeline(transaction=False)
            for _ in range(n):
                pipe.bzpopmin('zq', timeout=0)
            out = pipe.execute()
            self.assertEqual(len(out), n)
            for j, r in enumerate(out):
                m, s = expected[i + j]
                if tuple(r) != ('zq', m, float(s)):
                    self.fail('pop %d: got %r, expected %r' % (i + j, r, ('zq', m, float(s))))
            i += n
        self.assertEqual(c.exists('zq'), 0)

    def test_n3_blocked_bzpopmin_gets_later_member(self):
        """N3: a blocked BZPOPMIN gets a member added later."""
        consumer = self.client()
        producer = self.client()
        t = run_thread(lambda: consumer.bzpopmin('zlate', timeout=0))
        self.wait_blocked('bzpopmin')
        self.assertEqual(producer.zadd('zlate', {'late': 42.5}), 1)
        self.assertEqual(join_ok(self, t, 10), ('zlate', 'late', 42.5))
        self.assertEqual(producer.exists('zlate'), 0)


DELAYED_POP = """
local items = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, 1)
if #items == 0 then
    return false
end
redis.call('ZREM', KEYS[1], items[1])
return items[1]
"""


class TestDelayedQueue(QueueTestBase):
    def test_n4_lua_delayed_queue_race(self):
        """N4: two consumers racing on a Lua pop-if-due script (EVAL and
        EVALSHA) never get the same item, together get all due items, and
        items not yet due stay."""
        c = self.client()
        now = int(time.time() * 1000)
        due = {'due-%d' % i: now - 1 - (i % 5000) for i in range(2000)}
        later = {'later-%d' % i: now + 3600 * 1000 + i for i in range(50)}
        pipe = c.pipeline(transaction=False)
        items = list(due.items()) + list(later.items())
        for off in range(0, len(items), 500):
            pipe.zadd('delayed', dict(items[off:off + 500]))
        pipe.execute()
        self.assertEqual(c.zcard('delayed'), 2050)

        sha = c.script_load(DELAYED_POP)
        self.assertEqual(c.script_exists(sha), [True])
        # single calls first: EVAL and EVALSHA both pop something due
        one = c.eval(DELAYED_POP, 1, 'delayed', now)
        two = c.evalsha(sha, 1, 'delayed', now)
        self.assertIn(one, due)
        self.assertIn(two, due)
        self.assertNotEqual(one, two)

        start = threading.Barrier(2, timeout=10)

        def consumer(use_sha):
            r = self.client()
            got = []
            start.wait()
            while True:
                if use_sha:
                    v = r.evalsha(sha, 1, 'delayed', now)
                else:
                    v = r.eval(DELAYED_POP, 1, 'delayed', now)
                if v is None:
                    return got
                got.append(v)

        ta = run_thread(consumer, False)
        tb = run_thread(consumer, True)
        a = join_ok(self, ta, 60)
        b = join_ok(self, tb, 60)
        all_got = [one, two] + a + b
        self.assertEqual(len(set(a) & set(b)), 0, 'item popped by both consumers')
        self.assertEqual(len(all_got), len(set(all_got)), 'duplicate pops')
        self.assertEqual(set(all_got), set(due))
        self.assertGreater(len(a), 0, 'EVAL consumer got nothing')
        self.assertGreater(len(b), 0, 'EVALSHA consumer got nothing')
        # items not yet due stay, with their scores
        rest = c.zrange('delayed', 0, -1, withscores=True)
        self.assertEqual(dict(rest), {k: float(v) for k, v in later.items()})
        self.assertIsNone(c.evalsha(sha, 1, 'delayed', now))


class TestIdleTimeout(QueueTestBase):
    redis_conf = {'timeout': '1'}

    def test_n5_brpop_longer_than_redis_timeout(self):
        """N5: a consumer blocked in BRPOP for ~3 s (Redis timeout 1 s) still
        gets its item without error."""
        consumer = self.client()
        producer = self.client()
        t = run_thread(lambda: consumer.brpop('slowq', timeout=0))
        self.wait_blocked('brpop')
        time.sleep(3.0)      # the point: elapsed idleness beyond Redis' timeout
        self.assertTrue(t.is_alive(), 'BRPOP returned early: %r / %r' % (t.result, t.error))
        self.assertEqual(blocked_clients(self.direct, 'brpop'), 1)
        producer.lpush('slowq', 'late-item')
        self.assertEqual(join_ok(self, t, 10), ('slowq', 'late-item'))
        self.assertEqual(producer.llen('slowq'), 0)

    def test_n5_shared_link_survives_idle_timeout(self):
        """N5: after >2 s of idleness (Redis timeout 1 s), a plain GET through
        ferry works without error."""
        c = self.client()
        self.assertTrue(c.set('idle-k', 'v1'))
        self.assertEqual(c.get('idle-k'), 'v1')
        time.sleep(2.5)
        self.assertEqual(c.get('idle-k'), 'v1')
        self.assertTrue(c.set('idle-k', 'v2'))
        self.assertEqual(c.get('idle-k'), 'v2')

    def test_n5_client_connection_kept_across_redis_timeout(self):
        """ferry-only: the same client connection to ferry keeps working after
        Redis' idle timeout killed idle upstream links (raw socket: no
        reconnect by the client library)."""
        self.ferry_only()
        s = self.ferry.raw()
        self.addCleanup(s.close)
        harness.resp_send(s, b'*3\r\n$3\r\nSET\r\n$2\r\nik\r\n$2\r\nv1\r\n')
        self.assertEqual(_s(harness.resp_read_reply(s, 10)), 'OK')
        time.sleep(2.5)
        for _ in range(3):
            harness.resp_send(s, b'*2\r\n$3\r\nGET\r\n$2\r\nik\r\n')
            self.assertEqual(_s(harness.resp_read_reply(s, 10)), 'v1')


def _s(v):
    if isinstance(v, (bytes, bytearray)):
        return bytes(v).decode()
    return v


if __name__ == '__main__':
    unittest.main()
