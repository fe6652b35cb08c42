"""A pop whose client is gone before its reply was written is undone: its
item goes back to the end of the queue it came from (issue: acknowledged
items lost when clients give up on replies ferry holds).

With replicas_ack a pop's reply (an item taken out of Redis) is held until
a replica confirms the pop. A master with no replica (both frozen here, or
the only one left after a failover frozen) confirms nothing; ferry holds
the reply for durability.replicas_ack_hold_ms (30 s here, as the notes' N11
run had it). Clients with a 5 s socket timeout (redis-py) give up and close
their connections; the items their pops took must not be on nobody.

Each case pushes 2 * CLIENTS items, has CLIENTS clients pop one each while
the master has no replica, waits until every client gave up, lets the
replicas back and counts: items delivered + items left in the queue must be
every item pushed, and no receipt key may keep an item.

Run: python3 -m unittest test_pops_undone -v
"""
import socket
import threading
import time
import unittest

import redis

from failover_load import FAILOVER_CONF
from harness import DIRECT, ClusterTopology, Ferry, RedisServer, SentinelTopology, wait_until
from test_stats import stats_json

CLIENTS = 12
CLIENT_TIMEOUT = 5.0   # redis-py socket_timeout: shorter than the hold
HOLD_MS = 30000        # durability.replicas_ack_hold_ms: longer than the clients wait

# N4's delayed queue: the first due item taken in one step.
N4_TAKE = """
local v = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, 1)
if v[1] then
  redis.call('ZREM', KEYS[1], v[1])
  return v[1]
end
return false
"""

# Pop shapes that go with a receipt: the call on a redis-py client, the
# items it answered.
SHAPES = {
    'rpop': lambda c, k: [c.rpop(k)],
    'lpop': lambda c, k: [c.lpop(k)],
    'brpop': lambda c, k: [c.brpop(k, timeout=0)[1]],
    'blpop': lambda c, k: [c.blpop(k, timeout=0)[1]],
    'rpop_count': lambda c, k: c.rpop(k, 2) or [],   # N6's batch pop
    'lpop_count': lambda c, k: c.lpop(k, 2) or [],
    # N2's priority pop, its first key empty (in k's slot): the try script's
    # receipt
    'brpop_keys': lambda c, k: [c.brpop(['{%s}:empty' % k, k], timeout=0)[1]],
}
BATCH = {'rpop_count': 2, 'lpop_count': 2}  # items a shape's pop takes (default 1)

# Data replies with no receipt to undo them: (kind of key, call).
DATA_SHAPES = {
    'blmove': ('move', lambda c, k: [c.blmove(k, k + ':dst', 0, 'RIGHT', 'LEFT')]),
    'n4_script': ('zset', lambda c, k: [c.eval(N4_TAKE, 1, k, int(time.time() * 1000))]),
}


@unittest.skipIf(DIRECT, 'ferry only')
class PopsUndoneTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.topo = SentinelTopology()
        conf = {**FAILOVER_CONF,
                'durability': {**FAILOVER_CONF['durability'], 'replicas_ack_hold_ms': HOLD_MS}}
        try:
            cls.ferry = Ferry(None, conf=conf, sentinel=cls.topo)
        except BaseException:
            cls.topo.stop()
            raise

    @classmethod
    def tearDownClass(cls):
        cls.ferry.stop()
        cls.topo.stop()

    def pop_while_frozen(self, key, pop, frozen):
        """CLIENTS clients pop key once each through ferry while the replicas
        in frozen are stopped; returns (the items they got, how many gave
        up). The replicas are let go once every client gave up or got its
        reply."""
        got, gave_up, errors = [], [], []
        lock = threading.Lock()

        def one():
            c = self.ferry.client(socket_timeout=CLIENT_TIMEOUT)
            try:
                v = [i for i in pop(c, key) if i is not None]
                with lock:
                    got.extend(v)
            except redis.exceptions.TimeoutError:
                with lock:
                    gave_up.append(1)
            except Exception as e:  # noqa: BLE001 - reported below
                with lock:
                    errors.append(repr(e))
            finally:
                c.close()

        for r in frozen:
            r.sigstop()
        try:
            threads = [threading.Thread(target=one, daemon=True) for _ in range(CLIENTS)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(CLIENT_TIMEOUT * 6)
            self.assertFalse(any(t.is_alive() for t in threads), 'a client never returned')
        finally:
            for r in frozen:
                r.sigcont()
        self.assertEqual(errors, [])
        return got, len(gave_up)

    def left_in(self, m, key, kind):
        if kind == 'zset':
            return m.zrange(key, 0, -1)
        if kind == 'move':
            return m.lrange(key, 0, -1) + m.lrange(key + ':dst', 0, -1)
        return m.lrange(key, 0, -1)

    def count_after(self, key, pushed, delivered, kind='list', master=None):
        """Waits until every pushed item is delivered or back in Redis, and no
        receipt key is left; fails with the counts otherwise. Returns what
        is left."""
        m = (master or self.topo.master()).client(socket_timeout=10)
        state = {}

        def settled():
            left = self.left_in(m, key, kind)
            rcpts = m.keys('ferry:rcpt:*')
            state.update(left=len(left), receipts=len(rcpts),
                         lost=sorted(set(pushed) - set(left) - set(delivered)))
            return not state['lost'] and not rcpts
        try:
            wait_until(settled, timeout=HOLD_MS / 1000 + 15, interval=0.2,
                       msg='every item delivered or back in the queue')
        except AssertionError:
            self.fail('%d pushed, %d delivered, %d left in Redis, %d receipt key(s): '
                      'lost %r' % (len(pushed), len(delivered), state['left'],
                                   state['receipts'], state['lost']))
        # (A move's item is delivered and in its destination: that is the move.)
        queue = m.zrange(key, 0, -1) if kind == 'zset' else m.lrange(key, 0, -1)
        self.assertEqual([v for v in delivered if v in queue], [], 'delivered and still queued')
        self.assertEqual(len(delivered), len(set(delivered)), 'delivered twice')
        return queue

    def durability(self):
        return stats_json(self.ferry.stats_port)['durability']

    def master_of(self, key):
        return self.topo.master()

    def run_shape(self, shape):
        key = 'q:undo:%s' % shape
        m = self.topo.master()
        mc = m.client(socket_timeout=10)
        per = BATCH.get(shape, 1)
        pushed = ['%s-%d' % (shape, i) for i in range((per + 1) * CLIENTS)]
        mc.rpush(key, *pushed)
        before = self.durability().get('pops_undone', 0)
        frozen = [r for r in self.topo.redis if r is not m]
        delivered, gave_up = self.pop_while_frozen(key, SHAPES[shape], frozen)
        # The case itself: the replies were held past the clients' patience.
        self.assertGreater(gave_up, 0, 'no client gave up: nothing was held (%r)' % delivered)
        left = self.count_after(key, pushed, delivered)
        # Back at the end each came from: the items no client took are
        # still the queue's other end, in their order.
        right = shape in ('rpop', 'brpop', 'rpop_count', 'brpop_keys')
        untouched = pushed[:CLIENTS] if right else pushed[-CLIENTS:]
        ends = left[:CLIENTS] if right else left[-CLIENTS:]
        self.assertEqual(ends, untouched, left)
        # A batch goes back in its order: its items side by side, as taken
        # (the batches among themselves in the order their clients left).
        if per > 1:
            start = CLIENTS if right else 0
            for i in range(start, start + per * CLIENTS, per):
                batch = pushed[i:i + per]
                if batch[0] in left:
                    at = left.index(batch[0])
                    self.assertEqual(left[at:at + per], batch, left)
        undone = self.durability().get('pops_undone', 0) - before
        print('%s: %d pushed, %d delivered, %d gave up, %d undone' %
              (shape, len(pushed), len(delivered), gave_up, undone))
        self.assertEqual(undone, CLIENTS - len(delivered) // per)

    def test_rpop(self):
        self.run_shape('rpop')

    def test_lpop(self):
        self.run_shape('lpop')

    def test_brpop(self):
        self.run_shape('brpop')

    def test_rpop_count(self):
        self.run_shape('rpop_count')

    def test_brpop_keys(self):
        self.run_shape('brpop_keys')

    def test_zpopmin(self):
        """ZPOPMIN (N3) with its receipt: each member a client gave up on
        goes back with its score."""
        self.zset_shape('zpopmin', lambda c, k: [m for m, _ in c.zpopmin(k)])

    def zset_shape(self, shape, pop):
        key = 'z:undo:%s' % shape
        mc = self.topo.master().client(socket_timeout=10)
        scores = {'%s-%d' % (shape, i): i + 0.25 for i in range(2 * CLIENTS)}
        mc.zadd(key, scores)
        before = self.durability().get('pops_undone', 0)
        frozen = [r for r in self.topo.redis if r is not self.topo.master()]
        delivered, gave_up = self.pop_while_frozen(key, pop, frozen)
        self.assertGreater(gave_up, 0, 'no client gave up: nothing was held (%r)' % delivered)
        self.count_after(key, list(scores), delivered, 'zset')
        back = dict(mc.zrange(key, 0, -1, withscores=True))
        self.assertEqual(back, {m: v for m, v in scores.items() if m not in delivered})
        undone = self.durability().get('pops_undone', 0) - before
        self.assertEqual(undone, CLIENTS - len(delivered))

    def test_bzpopmin(self):
        """BZPOPMIN (N3) with its receipt (the try script's): each member a
        client gave up on goes back with its score."""
        self.zset_shape('bzpopmin', lambda c, k: [c.bzpopmin(k, timeout=0)[1]])

    def test_lpop_count(self):
        self.run_shape('lpop_count')

    def test_blpop(self):
        self.run_shape('blpop')

    def test_reply_in_never_written(self):
        """A pop whose reply came in but was never written to its client (it
        waits behind a big reply the client never reads; the client leaves)
        is undone: its item goes back to its queue. Before, the receipt was
        deleted as the reply came in: the item on nobody. The same window as
        a client whose timeout fires in the turn its reply comes in."""
        key, big = '{unwritten}q', '{unwritten}big'
        m = self.master_of(key)
        mc = m.client(socket_timeout=10)
        mc.rpush(key, 'u-0', 'u-1')
        mc.set(big, b'x' * (48 << 20))   # more than the sockets between take

        def replies():
            return stats_json(self.ferry.stats_port)['latency']['request_duration_seconds']['count']
        before_replies, before = replies(), self.durability().get('pops_undone', 0)
        s = socket.create_connection(('127.0.0.1', self.ferry.port))
        try:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            s.sendall(b'*2\r\n$3\r\nGET\r\n$%d\r\n%s\r\n*2\r\n$4\r\nRPOP\r\n$%d\r\n%s\r\n'
                      % (len(big), big.encode(), len(key), key.encode()))
            # Both replies came in from Redis (the pop's after its WAIT):
            # the item is out of the queue, in a reply ferry cannot write yet.
            wait_until(lambda: replies() >= before_replies + 2 and mc.llen(key) == 1, timeout=20,
                       interval=0.05, msg='the pop answered by Redis')
            self.assertEqual(mc.lrange(key, 0, -1), ['u-0'])
        finally:
            s.close()
        self.count_after(key, ['u-0', 'u-1'], [], master=m)
        self.assertEqual(mc.lrange(key, 0, -1), ['u-0', 'u-1'])  # back at the end it came from
        self.assertEqual(self.durability().get('pops_undone', 0) - before, 1)
        mc.delete(big)

    def test_push_receipts_deleted(self):
        """A push with its receipt whose client gave up on its held
        acknowledgement stands (the client was told nothing either way); its
        receipt key is deleted, not left behind."""
        key = 'q:undo:push'
        m = self.topo.master()
        frozen = [r for r in self.topo.redis if r is not m]
        pushed = ['push-%d' % i for i in range(CLIENTS)]
        n = iter(pushed)
        lock = threading.Lock()

        def push(c, k):
            with lock:
                v = next(n)
            c.lpush(k, v)
            return []
        delivered, gave_up = self.pop_while_frozen(key, push, frozen)
        self.assertEqual(gave_up, CLIENTS)
        left = self.count_after(key, pushed, delivered)
        self.assertEqual(sorted(left), sorted(pushed))  # each once

    def test_write_data_stays_held(self):
        """A write's own data (XADD's id, here without a receipt: NOMKSTREAM)
        is an acknowledgement: held until a replica confirms it, not
        delivered at replicas_ack_data_hold_ms (its client loses nothing by
        giving up; delivered unconfirmed, the write could die with the
        master after its client was told it was done)."""
        m = self.topo.master()
        m.client(socket_timeout=10).xadd('s:held', {'n': 0})
        frozen = [r for r in self.topo.redis if r is not m]
        out = {}

        def add():
            c = self.ferry.client(socket_timeout=60)
            try:
                out['id'] = c.xadd('s:held', {'n': 1}, nomkstream=True)
                out['at'] = time.monotonic()
            finally:
                c.close()
        for r in frozen:
            r.sigstop()
        try:
            t = threading.Thread(target=add, daemon=True)
            t0 = time.monotonic()
            t.start()
            t.join(3.0)   # six times the data bound
            held = t.is_alive()
        finally:
            for r in frozen:
                r.sigcont()
        t.join(HOLD_MS / 1000 + 10)
        self.assertIn('id', out)
        print('XADD NOMKSTREAM answered after %.1f s' % (out['at'] - t0))
        self.assertTrue(held, 'answered before a replica confirmed it')

    def test_data_replies_without_receipt(self):
        """The shapes no receipt can undo (and N4's script) are delivered
        unconfirmed at durability.replicas_ack_data_hold_ms (its default),
        before the clients give up."""
        m = self.topo.master()
        mc = m.client(socket_timeout=10)
        frozen = [r for r in self.topo.redis if r is not m]
        for shape, (kind, pop) in DATA_SHAPES.items():
            with self.subTest(shape=shape):
                key = 'q:data:%s' % shape
                pushed = ['%s-%d' % (shape, i) for i in range(3 * CLIENTS)]
                if kind == 'zset':
                    mc.zadd(key, {v: i for i, v in enumerate(pushed)})  # all due
                else:
                    mc.rpush(key, *pushed)
                before = self.durability()
                t0 = time.monotonic()
                delivered, gave_up = self.pop_while_frozen(key, pop, frozen)
                took = time.monotonic() - t0
                self.count_after(key, pushed, delivered, kind)
                print('%s: %d pushed, %d delivered in %.1f s, %d gave up' %
                      (shape, len(pushed), len(delivered), took, gave_up))
                self.assertEqual(gave_up, 0)


FROZEN_S = 15.0  # the new master's time without a replica


@unittest.skipIf(DIRECT, 'ferry only')
class FailoverWithoutReplicaTest(unittest.TestCase):
    """The notes' N11 run, small: consumers with 5 s read timeouts popping
    in each shape (a receipt's RPOP, LPOP, BRPOP and BLPOP of one key, and
    N4's script) and a producer pushing, through a kill -9 of the master
    whose successor then has no replica for FROZEN_S (the other one frozen):
    every item acknowledged is delivered or still in Redis at the end."""

    def test_n11_kill_then_no_replica(self):
        topo = SentinelTopology()
        self.addCleanup(topo.stop)
        conf = {**FAILOVER_CONF,
                'durability': {**FAILOVER_CONF['durability'], 'replicas_ack_hold_ms': HOLD_MS}}
        f = Ferry(None, conf=conf, sentinel=topo)
        self.addCleanup(f.stop)
        old = topo.master()
        mc = old.client(socket_timeout=10)
        pushed = ['i%d' % i for i in range(400)]
        mc.rpush('q', *pushed)
        due = ['d%d' % i for i in range(200)]
        mc.zadd('dq', {v: i for i, v in enumerate(due)})
        acked, delivered, gave_up, errors = [], [], [0], []
        lock = threading.Lock()
        stop, stop_pushing = threading.Event(), threading.Event()
        calls = [
            lambda c: [c.rpop('q')],
            lambda c: [c.lpop('q')],
            lambda c: [(c.brpop('q', timeout=1) or [None, None])[1]],
            lambda c: [(c.blpop('q', timeout=1) or [None, None])[1]],
            lambda c: [c.eval(N4_TAKE, 1, 'dq', int(time.time() * 1000))],
        ]

        def consumer(k):
            c = f.client(socket_timeout=CLIENT_TIMEOUT)
            while not stop.is_set():
                try:
                    got = [v for v in calls[k % len(calls)](c) if v is not None]
                    with lock:
                        delivered.extend(got)
                    if not got:
                        time.sleep(0.05)
                except (redis.exceptions.TimeoutError, redis.exceptions.ConnectionError):
                    with lock:
                        gave_up[0] += 1
                    c.close()
                    c = f.client(socket_timeout=CLIENT_TIMEOUT)
                except Exception as e:  # noqa: BLE001 - reported below
                    with lock:
                        errors.append(repr(e))
                    time.sleep(0.1)
            c.close()

        def producer():
            c = f.client(socket_timeout=CLIENT_TIMEOUT)
            n = 0
            while not stop_pushing.is_set():
                v = 'p%d' % n
                n += 1
                try:
                    c.lpush('q', v)
                    with lock:
                        acked.append(v)
                except (redis.exceptions.TimeoutError, redis.exceptions.ConnectionError):
                    c.close()
                    c = f.client(socket_timeout=CLIENT_TIMEOUT)
                time.sleep(0.02)
            c.close()

        threads = [threading.Thread(target=consumer, args=(k,), daemon=True) for k in range(20)]
        threads.append(threading.Thread(target=producer, daemon=True))
        for t in threads:
            t.start()
        try:
            wait_until(lambda: len(delivered) >= 50, timeout=30, msg='consumers under way')
            old.kill()
            new_port = topo.wait_failover(old.port)
            other = [r for r in topo.redis if r is not old and r.port != new_port][0]
            other.sigstop()
            frozen_at = time.monotonic()
            try:
                wait_until(lambda: time.monotonic() - frozen_at >= FROZEN_S, timeout=FROZEN_S + 5,
                           interval=0.5, msg='the frozen window')
            finally:
                other.sigcont()
            stop_pushing.set()
            m = topo.redis_by_port(new_port).client(socket_timeout=10)
            wait_until(lambda: m.llen('q') == 0 and m.zcard('dq') == 0, timeout=60, interval=0.5,
                       msg='the queues drained')
        finally:
            stop.set()
            stop_pushing.set()
            for t in threads:
                t.join(CLIENT_TIMEOUT * 4)
        self.assertEqual(errors, [])
        every = set(pushed) | set(due) | set(acked)
        state = {}

        def settled():
            left = set(m.lrange('q', 0, -1)) | set(m.zrange('dq', 0, -1))
            state.update(lost=sorted(every - left - set(delivered)),
                         receipts=len(m.keys('ferry:rcpt:*')))
            return not state['lost'] and not state['receipts']
        try:
            wait_until(settled, timeout=HOLD_MS / 1000 + 15, interval=0.5, msg='nothing lost')
        except AssertionError:
            rcpts = {k: (m.type(k), m.lrange(k, 0, -1) if m.type(k) == 'list' else m.get(k))
                     for k in m.keys('ferry:rcpt:*')}
            self.fail('%d acked, %d delivered, %d gave up, %d receipt key(s): lost %d %r %r' % (
                len(every), len(delivered), gave_up[0], state['receipts'], len(state['lost']),
                state['lost'][:20], rcpts))
        du = stats_json(f.stats_port)['durability']
        twice = len(delivered) - len(set(delivered))
        print('n11: %d acked, %d delivered (%d twice), %d gave up, %d undone, 0 lost' % (
            len(every), len(delivered), twice, gave_up[0], du.get('pops_undone', 0)))
        self.assertGreater(gave_up[0], 0, 'no client gave up: nothing was held')


@unittest.skipIf(DIRECT, 'ferry only')
class ClusterPopsUndoneTest(PopsUndoneTest):
    """The same in cluster mode (replicas_ack 1): the receipt in the key's
    slot, its move back and CLIENT KILL on that shard's master."""

    @classmethod
    def setUpClass(cls):
        cls.cluster = ClusterTopology(masters=3, replicas=1)
        conf = {'cluster': {'nodes': [cls.cluster.seeds()[0]], 'refresh_interval_ms': 200,
                            'timeout_ms': 1000},
                'durability': {'replicas_ack': 1, 'replicas_ack_timeout_ms': 1000,
                               'replicas_ack_hold_ms': HOLD_MS}}
        try:
            cls.ferry = Ferry(None, wait='port', conf=conf)
            c = cls.ferry.client(socket_timeout=5)
            wait_until(lambda: c.set('probe', 1), timeout=20, interval=0.1,
                       msg='ferry serving the cluster')
            c.close()
        except BaseException:
            cls.cluster.stop()
            raise

    @classmethod
    def tearDownClass(cls):
        cls.ferry.stop()
        cls.cluster.stop()

    def master_of(self, key):
        return self.shard_of(key)[0]

    def shard_of(self, key):
        port = self.cluster.master_of(self.cluster.keyslot(key))
        return (self.cluster.node_by_port(port),
                [self.cluster.node_by_port(p) for p in self.cluster.replicas_of(port)])

    def run_shape(self, shape):
        key = 'cq%s' % shape
        m, frozen = self.shard_of(key)
        self.topo = type('one_shard', (), {'master': lambda _self: m})()
        mc = m.client(socket_timeout=10)
        per = BATCH.get(shape, 1)
        pushed = ['%s-%d' % (shape, i) for i in range((per + 1) * CLIENTS)]
        mc.rpush(key, *pushed)
        before = self.durability().get('pops_undone', 0)
        delivered, gave_up = self.pop_while_frozen(key, SHAPES[shape], frozen)
        self.assertGreater(gave_up, 0, 'no client gave up: nothing was held (%r)' % delivered)
        self.count_after(key, pushed, delivered)
        undone = self.durability().get('pops_undone', 0) - before
        print('cluster %s: %d pushed, %d delivered, %d gave up, %d undone' %
              (shape, len(pushed), len(delivered), gave_up, undone))
        self.assertEqual(undone, CLIENTS - len(delivered) // per)

    def test_lpop(self):
        self.skipTest('rpop and brpop stand for the shapes here')

    def test_blpop(self):
        self.skipTest('rpop and brpop stand for the shapes here')

    def test_lpop_count(self):
        self.skipTest('rpop_count stands for the batch here')

    def test_zpopmin(self):
        self.skipTest('Sentinel mode only')

    def test_bzpopmin(self):
        self.skipTest('Sentinel mode only')

    def test_push_receipts_deleted(self):
        self.skipTest('Sentinel mode only')

    def test_write_data_stays_held(self):
        self.skipTest('Sentinel mode only')

    def test_data_replies_without_receipt(self):
        self.skipTest('Sentinel mode only')


@unittest.skipIf(DIRECT, 'ferry only')
class FrozenMasterTest(PopsUndoneTest):
    """Pops in flight, not held: the master itself frozen (a fixed master
    with one replica, replicas_ack 1), the clients give up on pops ferry
    has sent and Redis has not run yet, then the master runs them. The move
    back must come after the move: behind it on its shared link (RPOP), or
    after CLIENT KILL of its own link (BRPOP's blocking move)."""

    @classmethod
    def setUpClass(cls):
        m = RedisServer({'appendonly': 'yes', 'appendfsync': 'always'})
        r = RedisServer({'appendonly': 'yes', 'appendfsync': 'always',
                         'replicaof': '127.0.0.1 %d' % m.port})
        cls.nodes = [m, r]
        cls.topo = type('fixed', (), {'master': lambda _self: m})()
        try:
            wait_until(lambda: m.client(socket_timeout=2).info('replication')
                       .get('slave0', {}).get('state') == 'online',
                       timeout=20, interval=0.1, msg='the replica in sync')
            cls.ferry = Ferry(m, conf={
                'durability': {'replicas_ack': 1, 'replicas_ack_timeout_ms': 1000,
                               'replicas_ack_hold_ms': HOLD_MS},
                # the frozen master is waited for, not given up on
                'upstream': {'health_timeout_ms': 0, 'hold_timeout_ms': 60000}})
        except BaseException:
            for n in cls.nodes:
                n.stop()
            raise

    @classmethod
    def tearDownClass(cls):
        cls.ferry.stop()
        for n in cls.nodes:
            n.stop()

    def run_shape(self, shape):
        key = 'fq:%s' % shape
        m = self.nodes[0]
        m.client(socket_timeout=10).rpush(key, *['%s-%d' % (shape, i) for i in range(2 * CLIENTS)])
        pushed = ['%s-%d' % (shape, i) for i in range(2 * CLIENTS)]
        before = self.durability().get('pops_undone', 0)
        delivered, gave_up = self.pop_while_frozen(key, SHAPES[shape], [m])
        self.assertEqual(gave_up, CLIENTS, 'the master was frozen: no reply could come')
        self.count_after(key, pushed, delivered)
        undone = self.durability().get('pops_undone', 0) - before
        print('frozen master %s: %d pushed, %d gave up, %d undone' %
              (shape, len(pushed), gave_up, undone))
        self.assertEqual(undone, CLIENTS)

    def test_lpop(self):
        self.skipTest('rpop and brpop stand for the shapes here')

    def test_blpop(self):
        self.skipTest('rpop and brpop stand for the shapes here')

    def test_lpop_count(self):
        self.skipTest('rpop_count stands for the batch here')

    def test_zpopmin(self):
        self.skipTest('Sentinel mode only')

    def test_bzpopmin(self):
        self.skipTest('Sentinel mode only')

    def test_push_receipts_deleted(self):
        self.skipTest('replicas frozen: PopsUndoneTest')

    def test_write_data_stays_held(self):
        self.skipTest('replicas frozen: PopsUndoneTest')

    def test_data_replies_without_receipt(self):
        self.skipTest('replicas frozen: PopsUndoneTest')


if __name__ == '__main__':
    unittest.main()
