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
import threading
import time
import unittest

import redis

from failover_load import FAILOVER_CONF
from harness import DIRECT, Ferry, SentinelTopology, wait_until
from test_stats import stats_json

CLIENTS = 12
CLIENT_TIMEOUT = 5.0   # redis-py socket_timeout: shorter than the hold
HOLD_MS = 30000        # durability.replicas_ack_hold_ms: longer than the clients wait

# Pop shapes that go with a receipt: (name, the call on a redis-py client).
SHAPES = {
    'rpop': lambda c, k: c.rpop(k),
    'lpop': lambda c, k: c.lpop(k),
    'brpop': lambda c, k: c.brpop(k, timeout=0),
    'blpop': lambda c, k: c.blpop(k, timeout=0),
}


def item_of(v):
    """The item a pop answered (BRPOP's [key, item] or the item), or None."""
    if v is None:
        return None
    return v[1] if isinstance(v, (list, tuple)) else v


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

    def give_up_on_held_pops(self, key, pop, frozen):
        """CLIENTS clients pop key once each through ferry while the replicas
        in frozen are stopped; returns the items any of them got. The
        replicas are let go once every client gave up (or got its reply)."""
        got, gave_up, errors = [], [], []
        lock = threading.Lock()

        def one():
            c = self.ferry.client(socket_timeout=CLIENT_TIMEOUT)
            try:
                v = item_of(pop(c, key))
                with lock:
                    got.append(v)
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
        # The case itself: the replies were held past the clients' patience.
        self.assertGreater(len(gave_up), 0, 'no client gave up: nothing was held (%r)' % got)
        return [v for v in got if v is not None]

    def count_after(self, key, pushed, delivered):
        """Waits until every pushed item is delivered or back in key, and no
        receipt key is left; fails with the counts otherwise."""
        m = self.topo.master().client(socket_timeout=10)
        state = {}

        def settled():
            left = m.lrange(key, 0, -1)
            rcpts = m.keys('ferry:rcpt:*')
            state.update(left=len(left), receipts=len(rcpts),
                         lost=sorted(set(pushed) - set(left) - set(delivered)))
            return not state['lost'] and not rcpts
        try:
            wait_until(settled, timeout=HOLD_MS / 1000 + 15, interval=0.2,
                       msg='every item delivered or back in the queue')
        except AssertionError:
            self.fail('%d pushed, %d delivered, %d left in the queue, %d receipt key(s): '
                      'lost %r' % (len(pushed), len(delivered), state['left'],
                                   state['receipts'], state['lost']))
        left = m.lrange(key, 0, -1)
        self.assertEqual([v for v in delivered if v in left], [], 'delivered and still in the queue')
        return left

    def run_shape(self, shape):
        key = 'q:undo:%s' % shape
        m = self.topo.master()
        mc = m.client(socket_timeout=10)
        pushed = ['%s-%d' % (shape, i) for i in range(2 * CLIENTS)]
        mc.rpush(key, *pushed)
        before = stats_json(self.ferry.stats_port)['durability'].get('pops_undone', 0)
        frozen = [r for r in self.topo.redis if r is not m]
        delivered = self.give_up_on_held_pops(key, SHAPES[shape], frozen)
        left = self.count_after(key, pushed, delivered)
        # Back at the end each came from: the items no client took are
        # still the queue's other end, in their order.
        untouched = pushed[:CLIENTS] if shape in ('rpop', 'brpop') else pushed[CLIENTS:]
        ends = left[:CLIENTS] if shape in ('rpop', 'brpop') else left[-CLIENTS:]
        self.assertEqual(ends, untouched, left)
        undone = stats_json(self.ferry.stats_port)['durability'].get('pops_undone', 0) - before
        print('%s: %d pushed, %d delivered, %d undone' %
              (shape, len(pushed), len(delivered), undone))
        self.assertEqual(undone, CLIENTS - len(delivered))

    def test_rpop(self):
        self.run_shape('rpop')

    def test_lpop(self):
        self.run_shape('lpop')

    def test_brpop(self):
        self.run_shape('brpop')

    def test_blpop(self):
        self.run_shape('blpop')


if __name__ == '__main__':
    unittest.main()
