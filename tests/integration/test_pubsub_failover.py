"""Pub/sub and blocked pops across a Sentinel failover: a subscriber keeps its
subscriptions on the new master without seeing ferry's re-subscription, and
a BRPOP with a timeout is re-issued with what is left of it."""

import time
import unittest

from harness import Ferry, RespError, SentinelTopology, resp_read_reply, resp_send, wait_until


def dec(x):
    if isinstance(x, bytes):
        return x.decode()
    if isinstance(x, list):
        return [dec(e) for e in x]
    return x


def read(sock, timeout):
    return dec(resp_read_reply(sock, timeout))


class PubSubFailoverTest(unittest.TestCase):
    def setUp(self):
        # down_after_ms 4 s (not 1): a failover of ~5 s keeps a pop re-issued
        # with its whole timeout (~11 s) far from one that keeps it (~6 s)
        self.topo = SentinelTopology(down_after_ms=4000)
        self.addCleanup(self.topo.stop)
        self.ferry = Ferry(None, sentinel=self.topo,
                           conf={'durability': {'replicas_ack': 1}})
        self.addCleanup(self.ferry.stop)

    def raw(self):
        s = self.ferry.raw()
        self.addCleanup(s.close)
        return s

    def test_subscriber_survives_kill9(self):
        sub = self.raw()
        resp_send(sub, ['SUBSCRIBE', 'news'])
        self.assertEqual(read(sub, 5), ['subscribe', 'news', 1])
        resp_send(sub, ['PSUBSCRIBE', 'ev.*'])
        self.assertEqual(read(sub, 5), ['psubscribe', 'ev.*', 2])
        pub = self.ferry.client(socket_timeout=30)
        self.assertEqual(pub.publish('news', 'before'), 1)
        self.assertEqual(read(sub, 5), ['message', 'news', 'before'])

        old = self.topo.master()
        old.kill()
        self.topo.wait_failover(old.port, timeout=30)
        # once ferry has re-subscribed on the new master, a publish reaches it
        wait_until(lambda: pub.publish('news', 'probe') == 1, timeout=20, interval=0.1,
                   msg='the subscriber to be back on the new master')
        self.assertEqual(pub.publish('ev.x', 'after'), 1)
        # the first thing the client sees after the failover is a message:
        # ferry's own subscribe confirmations never reach it
        got = []
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            m = read(sub, 5)
            got.append(m)
            if m == ['pmessage', 'ev.*', 'ev.x', 'after']:
                break
        self.assertTrue(all(isinstance(m, list) and m[0] in ('message', 'pmessage')
                            for m in got), got)
        self.assertEqual(got[-1], ['pmessage', 'ev.*', 'ev.x', 'after'])
        # and the client's own commands still work in subscribed mode
        resp_send(sub, ['UNSUBSCRIBE', 'news'])
        self.assertEqual(read(sub, 5), ['unsubscribe', 'news', 1])

    def test_blocked_pop_keeps_its_timeout(self):
        s = self.raw()
        t0 = time.monotonic()
        resp_send(s, ['BRPOP', 'nothing-here', '6'])
        # BLMOVE: ferry sends the pop as a move into its receipt (receipts.c).
        wait_until(lambda: any('cmd=brpop' in c or 'cmd=blmove' in c for c in
                               self.topo.master().client().execute_command('CLIENT', 'LIST')
                               .split('\n')), timeout=5, msg='BRPOP blocked on the master')
        old = self.topo.master()
        old.kill()
        reply = resp_read_reply(s, 30)
        took = time.monotonic() - t0
        self.assertIsNone(reply)              # its timeout ran out: nil, not an error
        self.assertNotIsInstance(reply, RespError)
        # re-issued with what was left, not the whole 6 s again (that would
        # end after the failover, ~5 s, plus 6 s): printed, and bounded with
        # margin on both sides
        print('\nBRPOP 6 answered nil after %.2f s across a failover' % took)
        self.assertGreater(took, 5.5)
        self.assertLess(took, 9.0)


if __name__ == '__main__':
    unittest.main()
