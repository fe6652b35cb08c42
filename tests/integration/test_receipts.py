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
build without it); with it, the client gets 2-0. The look itself, in each
mode and without a failover: test_xreads.

The same for a push (durability.push_receipts): without its receipt the push
sent again was on the new master twice (checked with push_receipts off:
['i4', 'i4', 'i1', 'i2', 'i3']); with it, once, and its reply is the length
the first push left (4), kept in the receipt.

The same for a transaction with a push (RQ's enqueue: MULTI, HSET, RPUSH,
EXEC), which goes as the transaction receipt script. Without its receipt
the transaction rebuilt and sent again ran twice (checked with
push_receipts off: ['i1', 'i2', 'i3', 'i4', 'i4'], HSET answered 0); with
it, once, answered with the first run's replies.

Run: python3 -m unittest test_receipts -v
"""
import os
import threading
import time
import unittest

from failover_load import FAILOVER_CONF, current_master
from harness import (DIRECT, Ferry, SentinelTopology, resp_encode, resp_read_reply, resp_send,
                     wait_until)
from test_stats import stats_json

BIG = int(os.environ.get('RECEIPT_BIG_MB', '32')) << 20  # the reply the pop's waits behind
ATTEMPTS = 4  # the freeze must fall while the pop's reply is still in the master
# N4's delayed queue: the first member taken in one step.
N4_TAKE = """
local v = redis.call('ZRANGE', KEYS[1], 0, 0)
if v[1] then
  redis.call('ZREM', KEYS[1], v[1])
end
return v[1]
"""


@unittest.skipIf(DIRECT, 'ferry only')
class LostPopReplyTest(unittest.TestCase):
    """kind: 'pop' (RPOP), 'bpop' (BRPOP), 'xread' (XREADGROUP ... >),
    'bxread' (the same with BLOCK), 'push' (LPUSH), 'gpush' (LPUSH to a
    bounded queue: queues max_length), 'xadd' (XADD, its id made by Redis) or
    'tx' (MULTI, HSET, RPUSH, EXEC)."""

    def attempt(self, kind):
        """One try; returns (found, result) or None when the freeze came
        after the pop's reply had left the master."""
        blocking = kind in ('bpop', 'bxread', 'mbpop', 'bzpop', 'bzmpop')
        stream = kind in ('xread', 'bxread')
        # No output buffer limit for the replicas: the large value goes to
        # them whole, however loaded the machine is.
        topo = SentinelTopology(redis_conf={'client-output-buffer-limit': 'replica 0 0 0'})
        self.addCleanup(topo.stop)
        conf = dict(FAILOVER_CONF)
        if kind == 'gpush':
            # A bounded queue: the push goes as the guard's script, which
            # keeps the receipt as well (guard_push.lua).
            conf['queues'] = [{'keys': 'q', 'max_length': 100}]
        f = Ferry(None, conf=conf, sentinel=topo)
        self.addCleanup(f.stop)
        m = topo.master()
        mc = m.client(socket_timeout=30)
        mc.set('big', b'x' * BIG)
        mc.rpush('q', 'i1', 'i2', 'i3')
        mc.zadd('z', {'m1': 1, 'm2': 2.5, 'm3': 3})
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
        wait_until(lambda: all(r.llen('q') == 3 and r.zcard('z') == 3 and
                               r.strlen('big') == BIG and pending(r) ==
                               (1 if stream else 0) for r in replicas),
                   timeout=60, interval=0.1, msg='both replicas have the value and the queues')
        rc = replicas[0]
        if blocking or kind in ('script', 'scriptsha'):
            # Pinned to a dedicated link: the GET and the blocking call (a
            # script) go on the same connection, in order.
            c.client_setname('pinned')
        if kind in ('tx', 'txpop', 'txzpop'):
            sk = f.raw(timeout=60)
            self.addCleanup(sk.close)
            resp_send(sk, resp_encode('CLIENT', 'SETNAME', 'pinned'))  # as above
            self.assertEqual(resp_read_reply(sk), 'OK')
        out = {}
        sha = c.script_load(N4_TAKE) if kind == 'scriptsha' else None

        def run():
            p = c.pipeline(transaction=False)
            p.strlen('big')  # a small reply, so the client reads little...
            p.get('big')     # ...then the large one the pop's reply waits behind
            if kind in ('tx', 'txpop', 'txzpop'):
                # RQ's enqueue, pipelined behind the large reply (raw: a
                # client library would wrap the whole pipeline in MULTI);
                # txpop: a pop inside MULTI, its job marked active with it;
                # txzpop: the same with a sorted-set pop (a RESP2 client).
                work = ([['HSET', 'job:1', 'status', 'queued'], ['RPUSH', 'q', 'i4']]
                        if kind == 'tx' else
                        [['RPOP', 'q'], ['HSET', 'job:1', 'status', 'active']]
                        if kind == 'txpop' else
                        [['ZPOPMIN', 'z'], ['HSET', 'job:1', 'status', 'active']])
                cmds = [['STRLEN', 'big'], ['GET', 'big'], ['MULTI']] + work + [['EXEC']]
                try:
                    resp_send(sk, b''.join(resp_encode(cmd) for cmd in cmds))
                    out['r'] = [resp_read_reply(sk, timeout=60) for _ in cmds]
                except Exception as e:  # noqa: BLE001 - fails the test below
                    out['e'] = repr(e)
                return
            if stream:
                p.xreadgroup('g', 'c', {'s': '>'}, count=1, block=20000 if blocking else None)
            elif kind in ('push', 'gpush'):
                p.lpush('q', 'i4')
            elif kind == 'xadd':
                p.xadd('s', {'n': 'e5'})
            elif kind == 'bzpop':
                p.bzpopmin('z', timeout=20)
            elif kind == 'lmpop':
                p.execute_command('LMPOP', 2, 'q:high', 'q', 'RIGHT', 'COUNT', 2)
            elif kind == 'bzmpop':
                p.execute_command('BZMPOP', 20, 1, 'z', 'MIN', 'COUNT', 2)
            elif kind == 'mbpop':
                p.brpop(['q:high', 'q'], timeout=20)  # N2: the first key empty
            elif blocking:
                p.brpop('q', timeout=20)
            elif kind == 'zpop':
                p.zpopmin('z')
            elif kind == 'script':
                p.eval(N4_TAKE, 1, 'z')
            elif kind == 'scriptsha':
                p.evalsha(sha, 1, 'z')
            elif kind == 'nzpop':
                p.zpopmax('z', 2)
            elif kind == 'npop':
                p.rpop('q', 2)
            elif kind == 'lnpop':
                p.lpop('q', 2)
            else:
                p.rpop('q')
            try:
                out['r'] = p.execute()
            except Exception as e:  # noqa: BLE001 - fails the test below
                out['e'] = repr(e)
        t = threading.Thread(target=run, daemon=True)
        t.start()

        def applied():
            if kind == 'tx':
                return rc.llen('q') == 4
            if kind == 'txpop':
                return rc.llen('q') == 2
            if kind == 'txzpop':
                return rc.zcard('z') == 2
            if kind in ('push', 'gpush'):
                return rc.llen('q') == 4
            if kind == 'xadd':
                return rc.xlen('s') == 5
            if kind in ('npop', 'lnpop', 'lmpop'):
                return rc.llen('q') == 1
            if kind == 'bzmpop':
                return rc.zcard('z') == 1
            if kind in ('zpop', 'script', 'scriptsha', 'bzpop'):
                return rc.zcard('z') == 2
            if kind == 'nzpop':
                return rc.zcard('z') == 1
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
        if 'e' in out:
            print('[receipts] %s: %s' % (kind, out['e']), flush=True)
        self.assertNotIn('e', out, 'ferry held the client across the failover')
        res = out['r']
        self.assertEqual(res[0], BIG)
        self.assertEqual(len(res[1]), BIG)
        nm = current_master(topo).client(socket_timeout=10)
        d = stats_json(f.stats_port)['durability']
        if kind == 'txpop':
            # Run once, answered with the item the first run took.
            self.assertEqual(nm.lrange('q', 0, -1), ['i1', 'i2'],
                             'the transaction sent again popped a second time')
            self.assertEqual(res[2:], ['OK', 'QUEUED', 'QUEUED', [b'i3', 1]])
            wait_until(lambda: nm.keys('ferry:rcpt:*') == [], timeout=10,
                       msg='receipts deleted once the reply was in')
            return d['transaction_receipts_found']
        if kind == 'txzpop':
            # Run once, answered with the member (and score) the first run took.
            self.assertEqual(nm.zrange('z', 0, -1), ['m2', 'm3'],
                             'the transaction sent again popped a second time')
            self.assertEqual(res[2:], ['OK', 'QUEUED', 'QUEUED', [[b'm1', b'1'], 1]])
            wait_until(lambda: nm.keys('ferry:rcpt:*') == [], timeout=10,
                       msg='receipts deleted once the reply was in')
            return d['transaction_receipts_found']
        if kind == 'tx':
            # Run once, answered with the first run's replies (HSET's 1).
            self.assertEqual(nm.lrange('q', 0, -1), ['i1', 'i2', 'i3', 'i4'],
                             'the transaction sent again ran a second time')
            self.assertEqual(res[2:], ['OK', 'QUEUED', 'QUEUED', [1, 4]])
            wait_until(lambda: nm.keys('ferry:rcpt:*') == [], timeout=10,
                       msg='receipts deleted once the reply was in')
            self.assertGreaterEqual(d['transaction_receipts'], 1)
            return d['transaction_receipts_found']
        if stream:
            # The entry the first read took, once: not 3-0 read past it.
            self.assertEqual(res[2], [['s', [('2-0', {'n': 'e2'})]]],
                             'the read sent again took other entries')
            info = nm.xinfo_groups('s')[0]
            self.assertEqual((info['pending'], info['last-delivered-id']), (2, '2-0'))
            self.assertGreaterEqual(d['stream_reads_looked'], 1)
            return d['stream_reads_found']
        if kind == 'xadd':
            # Added once, answered with the id the first XADD gave.
            entries = nm.xrange('s')
            self.assertEqual([e[1]['n'] for e in entries], ['e1', 'e2', 'e3', 'e4', 'e5'],
                             'the XADD sent again added a second entry')
            self.assertEqual(res[2], entries[-1][0])
            wait_until(lambda: nm.keys('ferry:rcpt:*') == [], timeout=10,
                       msg='receipts deleted once the reply was in')
            return d['push_receipts_found']
        if kind in ('push', 'gpush'):
            # Pushed once, answered with the length the first push left.
            self.assertEqual(nm.lrange('q', 0, -1), ['i4', 'i1', 'i2', 'i3'],
                             'the push sent again pushed a second time')
            self.assertEqual(res[2], 4)
            wait_until(lambda: nm.keys('ferry:rcpt:*') == [], timeout=10,
                       msg='receipts deleted once the reply was in')
            self.assertGreaterEqual(d['push_receipts'], 1)
            return d['push_receipts_found']
        if kind == 'bzpop':
            # The member the first pop took, with its score, once.
            self.assertEqual(tuple(res[2]), ('z', 'm1', 1.0),
                             'the pop sent again took another member')
            self.assertEqual(nm.zrange('z', 0, -1), ['m2', 'm3'])
            wait_until(lambda: nm.keys('ferry:rcpt:*') == [], timeout=10,
                       msg='receipts deleted once the reply was in')
            return d['pop_receipts_found']
        if kind in ('script', 'scriptsha'):
            # Run once: the item the first run took, answered from its
            # receipt by the script sent again (counted as resent: its
            # reply is the script's own, nothing says "found").
            self.assertEqual(res[2], 'm1', 'the script sent again took another member')
            self.assertEqual(nm.zrange('z', 0, -1), ['m2', 'm3'])
            wait_until(lambda: nm.keys('ferry:rcpt:*') == [], timeout=10,
                       msg='receipts deleted once the reply was in')
            self.assertGreaterEqual(d['script_receipts'], 1)
            return d['script_receipts_resent']
        if kind in ('zpop', 'nzpop'):
            # The members the first pop took, with their scores, once.
            want, left = (([('m1', 1.0)], ['m2', 'm3']) if kind == 'zpop' else
                          ([('m3', 3.0), ('m2', 2.5)], ['m1']))
            self.assertEqual(res[2], want, 'the sorted-set pop sent again took other members')
            self.assertEqual(nm.zrange('z', 0, -1), left)
            wait_until(lambda: nm.keys('ferry:rcpt:*') == [], timeout=10,
                       msg='receipts deleted once the reply was in')
            return d['pop_receipts_found']
        if kind in ('npop', 'lnpop'):
            # The first batch's items, once, in the order taken.
            want, left = (['i3', 'i2'], ['i1']) if kind == 'npop' else (['i1', 'i2'], ['i3'])
            self.assertEqual(res[2], want, 'the batch pop sent again took other items')
            self.assertEqual(nm.lrange('q', 0, -1), left)
            wait_until(lambda: nm.keys('ferry:rcpt:*') == [], timeout=10,
                       msg='receipts deleted once the reply was in')
            return d['pop_receipts_found']
        if kind in ('lmpop', 'bzmpop'):
            # The first pop's items, once, in LMPOP's (ZMPOP's) shape.
            want, left = ((['q', ['i3', 'i2']], ['i1']) if kind == 'lmpop' else
                          (['z', [['m1', '1'], ['m2', '2.5']]], ['m3']))
            self.assertEqual(res[2], want, 'the pop sent again took other items')
            self.assertEqual(nm.lrange('q', 0, -1) if kind == 'lmpop' else nm.zrange('z', 0, -1),
                             left)
            wait_until(lambda: nm.keys('ferry:rcpt:*') == [], timeout=10,
                       msg='receipts deleted once the reply was in')
            return d['pop_receipts_found']
        if kind == 'mbpop':
            self.assertEqual(list(res[2]), ['q', 'i3'], 'the pop sent again took another item')
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

    def test_batch_rpop_reply_lost_with_the_master(self):
        """RPOP q 2 (N6's batch pop) goes as the receipt script."""
        self.scenario('npop')

    def test_batch_lpop_reply_lost_with_the_master(self):
        self.scenario('lnpop')

    def test_zpopmin_reply_lost_with_the_master(self):
        """ZPOPMIN (N3's priority queue) goes as the receipt script."""
        self.scenario('zpop')

    def test_zpopmax_count_reply_lost_with_the_master(self):
        self.scenario('nzpop')

    def test_script_reply_lost_with_the_master(self):
        """N4's delayed queue: a script that takes the first due member."""
        self.scenario('script')

    def test_evalsha_reply_lost_with_the_master(self):
        """The same script called by its SHA1 (SCRIPT LOAD through ferry)."""
        self.scenario('scriptsha')

    def test_priority_brpop_reply_lost_with_the_master(self):
        """N2's priority pop (BRPOP of several keys, the first empty): its
        try script moves the item into the receipt of its key."""
        self.scenario('mbpop')

    def test_lmpop_reply_lost_with_the_master(self):
        # LMPOP of two keys with a count, the first key empty.
        self.scenario('lmpop')

    def test_bzmpop_reply_lost_with_the_master(self):
        self.scenario('bzmpop')

    def test_bzpopmin_reply_lost_with_the_master(self):
        """N3's blocking sorted-set pop: its try script moves the member
        into a sorted-set receipt with its score."""
        self.scenario('bzpop')

    def test_brpop_reply_lost_with_the_master(self):
        self.scenario('bpop')

    def test_lpush_reply_lost_with_the_master(self):
        self.scenario('push')

    def test_bounded_queue_lpush_reply_lost_with_the_master(self):
        self.scenario('gpush')

    def test_transaction_reply_lost_with_the_master(self):
        self.scenario('tx')

    def test_transaction_pop_reply_lost_with_the_master(self):
        """RPOP inside MULTI goes in the transaction's receipt script."""
        self.scenario('txpop')

    def test_transaction_zpop_reply_lost_with_the_master(self):
        """ZPOPMIN inside MULTI (a RESP2 client) goes in the transaction's
        receipt script too."""
        self.scenario('txzpop')

    def test_xadd_reply_lost_with_the_master(self):
        self.scenario('xadd')

    def test_xreadgroup_reply_lost_with_the_master(self):
        """The consumer's pending list is the read's receipt (xreads.c)."""
        self.scenario('xread')

    def test_blocking_xreadgroup_reply_lost_with_the_master(self):
        self.scenario('bxread')

if __name__ == '__main__':
    unittest.main()
