"""Nothing acknowledged is lost when ferry itself dies (issue: receipts that
outlive their process, in one ferry or a fleet).

A pop with its receipt is sent as a move of the item into a receipt key
(receipts.c); the client's reply waits for the replicas' acknowledgement.
A ferry killed (kill -9) in between leaves the item in the receipt. Each
case makes that happen on purpose, not by luck of timing: the replicas are
frozen while CLIENTS consumers BRPOP, so every move applied on the master
and every reply is held; the ferry is killed with all of them in flight.

Then the receipts must come back to their queue: taken back by the same
instance started again, or claimed by a live peer once the dead one's
heartbeat (ferry:alive:<instance>) expired, within a few heartbeat TTLs;
each item put back is counted (durability.receipts_put_back). Two ferries
configured with the same identity are refused: the second one exits.

Run: python3 -m unittest test_ferry_death -v
"""
import threading
import time
import unittest

import redis

from failover_load import FAILOVER_CONF
from harness import DIRECT, Ferry, SentinelTopology, wait_until
from test_stats import stats_json

CLIENTS = 6
TTL_MS = 2000      # instance.heartbeat_ttl_ms: short, so the cases are quick
HOLD_MS = 60000    # replies held for their WAIT past the ferry's death
SETTLE_S = 30      # generous: a few TTLs on a loaded machine


def conf(**instance):
    c = {**FAILOVER_CONF,
         'durability': {**FAILOVER_CONF['durability'], 'replicas_ack_hold_ms': HOLD_MS},
         'instance': {'heartbeat_ttl_ms': TTL_MS, **instance}}
    return c


@unittest.skipIf(DIRECT, 'ferry only')
class FerryDeathTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.topo = SentinelTopology()

    @classmethod
    def tearDownClass(cls):
        cls.topo.stop()

    def setUp(self):
        self.ferries = []

    def tearDown(self):
        for f in self.ferries:
            if f.running():
                f.stop()

    def ferry(self, **instance):
        f = Ferry(None, conf=conf(**instance), sentinel=self.topo)
        self.ferries.append(f)
        return f

    def master(self):
        return self.topo.master().client(socket_timeout=10)

    def strand(self, ferry, key):
        """CLIENTS consumers BRPOP key through ferry while the replicas are
        frozen (every move applied, every reply held), then ferry is killed;
        the replicas go on. Returns the items pushed and their receipt keys."""
        m = self.master()
        before = set(m.keys('ferry:rcpt:*'))
        new = []
        pushed = ['%s-%d' % (key, i) for i in range(CLIENTS)]
        m.delete(key)
        m.rpush(key, *pushed)
        frozen = [r for r in self.topo.redis if r is not self.topo.master()]
        got = []

        def consume():
            c = ferry.client(socket_timeout=HOLD_MS / 1000 + 10)
            try:
                got.append(c.brpop(key, timeout=0))
            except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError):
                pass  # its ferry died: the item was never delivered
            finally:
                c.close()
        for r in frozen:
            r.sigstop()
        try:
            threads = [threading.Thread(target=consume, daemon=True) for _ in range(CLIENTS)]
            for t in threads:
                t.start()
            def moved():
                new[:] = set(m.keys('ferry:rcpt:*')) - before
                return m.llen(key) == 0 and len(new) == CLIENTS
            wait_until(moved, timeout=SETTLE_S, interval=0.05, msg='every pop moved into its receipt')
            ferry.kill()
        finally:
            for r in frozen:
                r.sigcont()
        for t in threads:
            t.join(SETTLE_S)
        self.assertEqual(got, [], 'a reply reached a client: nothing was held')
        return pushed, new

    def settled(self, key, stranded, what):
        """Waits until every item pushed is back in key and no receipt key is
        left; fails with what is left otherwise. Returns the seconds it took."""
        pushed, receipts = stranded
        m = self.master()
        state = {}
        t0 = time.monotonic()

        def done():
            state.update(queue=sorted(m.lrange(key, 0, -1)),
                         receipts=m.exists(*receipts))
            return state['queue'] == sorted(pushed) and state['receipts'] == 0
        try:
            wait_until(done, timeout=SETTLE_S, interval=0.1, msg=what)
        except AssertionError:
            self.fail('%s: %d pushed, %d back in the queue, %d receipt key(s) left' %
                      (what, len(pushed), len(state['queue']), state['receipts']))
        return time.monotonic() - t0

    def put_back(self, ferry):
        return stats_json(ferry.stats_port)['durability'].get('receipts_put_back', 0)

    def test_restart_takes_back_its_receipts(self):
        """One ferry, killed with pops in flight and started again with the
        same configuration: its own instance's receipts go back to the queue."""
        f = self.ferry()
        key = 'q:death:restart'
        stranded = self.strand(f, key)
        f._start()
        took = self.settled(key, stranded, 'the restarted ferry takes its receipts back')
        self.assertEqual(self.put_back(f), CLIENTS)
        self.assertIn('put back', f.log())
        print('restart: %d stranded, all put back in %.1f s' % (CLIENTS, took))

    def test_peer_claims_a_dead_instance(self):
        """Two ferries, one killed with pops in flight: the other claims the
        dead instance's receipts once its heartbeat expired."""
        a, b = self.ferry(), self.ferry()
        key = 'q:death:peer'
        stranded = self.strand(a, key)
        took = self.settled(key, stranded, 'the live peer claims the dead instance')
        self.assertLess(took, SETTLE_S)
        st = stats_json(b.stats_port)['durability']
        self.assertEqual(st.get('receipts_put_back', 0), CLIENTS)
        self.assertEqual(st.get('instances_claimed', 0), 1)
        print('peer: %d stranded, all put back by the peer in %.1f s' % (CLIENTS, took))

    def test_same_identity_is_refused(self):
        """Two ferries configured with the same instance name: the second one
        does not stay up, and says why."""
        a = self.ferry(name='twin')
        b = Ferry(None, conf=conf(name='twin'), sentinel=self.topo, wait='port')
        self.ferries.append(b)
        wait_until(lambda: b.proc.poll() is not None, timeout=SETTLE_S, interval=0.1,
                   msg='the second ferry with the same identity exits')
        self.assertEqual(b.proc.returncode, 4, b.log())
        self.assertIn('another live ferry', b.log())
        self.assertTrue(a.running())
        self.assertEqual(a.client().ping(), True)


if __name__ == '__main__':
    unittest.main()
