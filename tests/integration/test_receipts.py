"""Pop receipts (durability.pop_receipts): a pop whose reply dies with the
master, while its replica already has the pop, is not lost.

The case, made on purpose: a client pipelines GET of a large value and a
pop; Redis writes a large reply in pieces over many turns, while its
replica gets the pop at once. The test waits until a replica has the pop,
freezes the master (SIGSTOP: the pop's reply is still behind the large
one in the master's memory) and kills it (kill -9). Sentinel promotes a
replica that holds the pop; ferry sends the pop again there.

Without receipts the pop sent again takes the next item and the first is
on nobody: lost (checked on a build without them: the client got i2, i3
was gone). With them the pop carries the same receipt key, the new master
has the first pop's item under it, and the client gets that item.

The same for an XREADGROUP '>' read, whose receipt is the consumer's
pending list (xreads.c): without the look, the read sent again took 3-0
and 2-0 stayed pending for a consumer that never got it (checked on a
build without it); with it, the client gets 2-0.

Run: python3 -m unittest test_receipts -v
"""
import os
import socket
import threading
import time
import unittest

from failover_load import FAILOVER_CONF, current_master
from harness import (DIRECT, Ferry, RedisServer, SentinelTopology, resp_encode, resp_read_reply,
                     wait_until)
from test_stats import stats_json

BIG = int(os.environ.get('RECEIPT_BIG_MB', '32')) << 20  # the reply the pop's waits behind
ATTEMPTS = 4  # the freeze must fall while the pop's reply is still in the master


@unittest.skipIf(DIRECT, 'ferry only')
class LostPopReplyTest(unittest.TestCase):
    """kind: 'pop' (RPOP), 'bpop' (BRPOP), 'xread' (XREADGROUP ... >) or
    'bxread' (the same with BLOCK)."""

    def attempt(self, kind):
        """One try; returns (found, result) or None when the freeze came
        after the pop's reply had left the master."""
        blocking = kind in ('bpop', 'bxread')
        stream = kind in ('xread', 'bxread')
        # No output buffer limit for the replicas: the large value goes to
        # them whole, however loaded the machine is.
        topo = SentinelTopology(redis_conf={'client-output-buffer-limit': 'replica 0 0 0'})
        self.addCleanup(topo.stop)
        f = Ferry(None, conf=FAILOVER_CONF, sentinel=topo)
        self.addCleanup(f.stop)
        m = topo.master()
        mc = m.client(socket_timeout=30)
        mc.set('big', b'x' * BIG)
        mc.rpush('q', 'i1', 'i2', 'i3')
        for i in range(1, 5):
            mc.xadd('s', {'n': 'e%d' % i}, id='%d-0' % i)
        mc.xgroup_create('s', 'g', id='0')
        c = f.client(socket_timeout=60)
        if stream:
            # A first read hands out 1-0, left pending: the read sent again
            # must look after it, not from the start of the pending list.
            self.assertEqual(c.xreadgroup('g', 'c', {'s': '>'}, count=1),
                             [['s', [('1-0', {'n': 'e1'})]]])
        replicas = [r.client(socket_timeout=10) for r in topo.redis if r is not m]

        def pending(r):
            return r.xpending('s', 'g')['pending']
        wait_until(lambda: all(r.llen('q') == 3 and r.strlen('big') == BIG and pending(r) ==
                               (1 if stream else 0) for r in replicas),
                   timeout=60, interval=0.1, msg='both replicas have the value and the queues')
        rc = replicas[0]
        if blocking:
            # Pinned to a dedicated link: the GET and the blocking call go
            # on the same connection, in order.
            c.client_setname('pinned')
        out = {}

        def run():
            p = c.pipeline(transaction=False)
            p.strlen('big')  # a small reply, so the client reads little...
            p.get('big')     # ...then the large one the pop's reply waits behind
            if stream:
                p.xreadgroup('g', 'c', {'s': '>'}, count=1, block=20000 if blocking else None)
            elif blocking:
                p.brpop('q', timeout=20)
            else:
                p.rpop('q')
            try:
                out['r'] = p.execute()
            except Exception as e:  # noqa: BLE001 - fails the test below
                out['e'] = repr(e)
        t = threading.Thread(target=run, daemon=True)
        t.start()

        def applied():
            return pending(rc) == 2 if stream else rc.llen('q') == 2
        deadline = time.monotonic() + 10
        while not applied() and time.monotonic() < deadline:
            time.sleep(0.0002)
        self.assertTrue(applied(), 'the replica never got the pop')
        m.sigstop()
        old_port = m.port
        m.kill()
        topo.wait_failover(old_port, timeout=30)
        t.join(60)
        self.assertFalse(t.is_alive(), 'the pipeline never finished')
        self.assertNotIn('e', out, 'ferry held the client across the failover')
        res = out['r']
        self.assertEqual(res[0], BIG)
        self.assertEqual(len(res[1]), BIG)
        nm = current_master(topo).client(socket_timeout=10)
        d = stats_json(f.stats_port)['durability']
        if stream:
            # The entry the first read took, once: not 3-0 read past it.
            self.assertEqual(res[2], [['s', [('2-0', {'n': 'e2'})]]],
                             'the read sent again took other entries')
            info = nm.xinfo_groups('s')[0]
            self.assertEqual((info['pending'], info['last-delivered-id']), (2, '2-0'))
            self.assertGreaterEqual(d['stream_reads_looked'], 1)
            return d['stream_reads_found']
        popped = res[2][1] if blocking else res[2]
        # The first pop's item, once: neither lost nor left in the queue.
        self.assertEqual(popped, 'i3', 'the pop sent again took another item')
        self.assertEqual(nm.lrange('q', 0, -1), ['i1', 'i2'])
        wait_until(lambda: nm.keys('ferry:rcpt:*') == [], timeout=10,
                   msg='receipts deleted once the reply was in')
        self.assertGreaterEqual(d['pop_receipts'], 1)
        return d['pop_receipts_found']

    def scenario(self, kind):
        found = 0
        for k in range(ATTEMPTS):
            with self.subTest(attempt=k):
                found = self.attempt(kind)
            if found:
                break
            # The reply reached ferry before the freeze: nothing was lost
            # to decide; try again.
        print('[receipts] %s: the receipt answered after %d attempt(s)' % (kind, k + 1), flush=True)
        self.assertGreaterEqual(found, 1, 'never froze the master with the reply inside it')

    def test_rpop_reply_lost_with_the_master(self):
        self.scenario('pop')

    def test_brpop_reply_lost_with_the_master(self):
        self.scenario('bpop')

    def test_xreadgroup_reply_lost_with_the_master(self):
        """The consumer's pending list is the read's receipt (xreads.c)."""
        self.scenario('xread')

    def test_blocking_xreadgroup_reply_lost_with_the_master(self):
        self.scenario('bxread')



def _raw_call(sock, *args, timeout=10.0):
    sock.sendall(resp_encode(*args))
    return resp_read_reply(sock, timeout)


@unittest.skipIf(DIRECT, 'ferry only')
class StreamReadLookTest(unittest.TestCase):
    """An XREADGROUP '>' read sent again looks first at the consumer's
    pending entries after the ones its client was handed (xreads.c), made
    here without a failover: Redis refuses the first send (READONLY: nothing
    applied) and entries were handed to the consumer behind
    ferry's back (as a read whose reply was lost would leave them)."""

    def setUp(self):
        self.redis = RedisServer()
        self.addCleanup(self.redis.stop)
        self.ferry = Ferry(self.redis)
        self.addCleanup(self.ferry.stop)
        self.rc = self.redis.client()
        with socket.socket() as probe:  # a port nothing listens on
            probe.bind(('127.0.0.1', 0))
            self.dead_port = probe.getsockname()[1]
        for k in ('s1', 's2'):
            for i in range(1, 4):
                self.rc.xadd(k, {'n': '%s.%d' % (k, i)}, id='%d-0' % i)
            self.rc.xgroup_create(k, 'g', id='0')

    def refused_then_sent(self, sock, *args):
        """args sent through ferry while its Redis is a replica (READONLY:
        nothing applied, ferry holds the call), then a master again: the
        reply."""
        dead = self.dead_port
        self.rc.replicaof('127.0.0.1', dead)
        self.addCleanup(self.rc.replicaof, 'NO', 'ONE')
        before = self.refusals()
        sock.sendall(resp_encode(*args))
        wait_until(lambda: self.refusals() > before, timeout=10, msg='Redis never refused the read')
        self.rc.replicaof('NO', 'ONE')
        return resp_read_reply(sock, 20.0)

    def refusals(self):
        stat = self.rc.info('errorstats').get('errorstat_READONLY', 'count=0')
        return int(stat.split('=')[1]) if isinstance(stat, str) else stat['count']

    def check(self, proto):
        sock = self.ferry.raw()
        self.addCleanup(sock.close)
        if proto == 3:
            _raw_call(sock, 'HELLO', '3')
        read = ['XREADGROUP', 'GROUP', 'g', 'c', 'COUNT', '1', 'STREAMS']
        first = _raw_call(sock, *read, 's1', '>')
        self.assertEqual(self.pairs(first), [(b's1', [b'1-0'])])
        # Handed to c behind ferry's back: 2-0 of s1, pending, never seen.
        self.rc.xreadgroup('g', 'c', {'s1': '>'}, count=1)
        got = self.refused_then_sent(sock, *read, 's1', 's2', '>', '>')
        # The look found 2-0 (after 1-0, the mark): that is the answer; s2,
        # where it found nothing, is left out as a '>' read leaves it out.
        self.assertEqual(self.pairs(got), [(b's1', [b'2-0'])])
        self.assertEqual(self.rc.xinfo_groups('s2')[0]['last-delivered-id'], '0-0')
        # Nothing left to find: the look finds nothing, the read goes.
        got = self.refused_then_sent(sock, *read, 's1', 's2', '>', '>')
        self.assertEqual(self.pairs(got), [(b's1', [b'3-0']), (b's2', [b'1-0'])])
        d = stats_json(self.ferry.stats_port)['durability']
        self.assertEqual((d['stream_reads_looked'], d['stream_reads_found']), (2, 1))
        # The consumer's pending entries: every one handed out once.
        self.assertEqual(self.rc.xpending('s1', 'g')['pending'], 3)
        self.assertEqual(self.rc.xpending('s2', 'g')['pending'], 1)

    @staticmethod
    def pairs(reply):
        """[(stream, [ids])] from a RESP2 array or a RESP3 map."""
        items = reply.items() if isinstance(reply, dict) else reply
        return [(k, [e[0] for e in entries]) for k, entries in items]

    def test_look_resp2(self):
        self.check(2)

    def test_look_resp3(self):
        self.check(3)

if __name__ == '__main__':
    unittest.main()
