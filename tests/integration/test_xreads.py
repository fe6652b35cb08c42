"""XREADGROUP '>' reads sent again look first in the consumer's pending
list (proxy/queue/xreads.c): the same read with each '>' replaced by the highest
entry id the client was handed from that stream. What the look finds (the
entries a read whose reply was lost took) is the answer; if nothing, the
'>' read goes.

Made here without a failover (test_receipts makes it with one), in each
mode: ferry's link carrying a blocked read is killed on Redis (the read
sent again), or Redis refuses the read (READONLY: nothing applied, held and
sent again); meanwhile an entry was handed to the consumer behind ferry's
back, as a read whose reply was lost would leave it.

Run: python3 -m unittest test_xreads -v
"""
import socket
import unittest

from harness import DIRECT, Ferry, RedisServer, resp_encode, resp_read_reply, wait_until
from modes import FixedMasterMode, SentinelMode, key_prefix, sentinel_first
from test_cluster_compat import ClusterOnce, ClusterReader, start_cluster_ferry
from test_stats import stats_json


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


def pairs(reply):
    """[(stream, [ids])] from a RESP2 array or a RESP3 map; [] for a null."""
    if reply is None:
        return []
    items = reply.items() if isinstance(reply, dict) else reply
    return [(k, [e[0] for e in entries]) for k, entries in items]


class LinkLostChecks:
    """A blocked '>' read whose link Redis closes is sent again: its look
    answers what the consumer holds after the client's last entry."""

    def direct(self, key):
        return self.master().client()

    def keys(self):
        tag = key_prefix(self)
        return '{%s}s1' % tag, '{%s}s2' % tag

    def blocked_link(self, rc):
        """The id of the client on Redis blocked in XREADGROUP (ferry's link)."""
        found = []

        def blocked():
            found[:] = [int(d['id']) for d in rc.client_list()
                        if 'b' in d['flags'] and d['cmd'] == 'xreadgroup']
            return len(found) == 1
        wait_until(blocked, timeout=10, msg='no XREADGROUP blocked on Redis')
        return found[0]

    def check(self, proto):
        s1, s2 = self.keys()
        rc = self.direct(s1)
        for i in (1, 2):
            rc.xadd(s1, {'n': i}, id='%d-0' % i)
        rc.xgroup_create(s1, 'g', id='0')
        rc.xgroup_create(s2, 'g', id='0', mkstream=True)
        sock = self.ferry.raw()
        self.addCleanup(sock.close)
        if proto == 3:
            _raw_call(sock, 'HELLO', '3')
        read = ['XREADGROUP', 'GROUP', 'g', 'c', 'COUNT', '1']
        self.assertEqual(pairs(_raw_call(sock, *read, 'STREAMS', s1, '>')), [(s1.encode(), [b'1-0'])])
        # Handed to c behind ferry's back: 2-0, pending, never seen.
        rc.xreadgroup('g', 'c', {s1: '>'}, count=1)
        sock.sendall(resp_encode(*read, 'BLOCK', 20000, 'STREAMS', s1, s2, '>', '>'))
        rc.client_kill_filter(_id=self.blocked_link(rc))
        # Sent again, it looked after 1-0 (s1) and 0 (s2): 2-0 is its answer.
        self.assertEqual(pairs(resp_read_reply(sock, 20.0)), [(s1.encode(), [b'2-0'])])
        # Again with nothing pending: the look finds nothing, the read
        # blocks again and takes the next entry.
        sock.sendall(resp_encode(*read, 'BLOCK', 20000, 'STREAMS', s1, s2, '>', '>'))
        rc.client_kill_filter(_id=self.blocked_link(rc))
        self.blocked_link(rc)
        rc.xadd(s2, {'n': 1}, id='5-0')
        self.assertEqual(pairs(resp_read_reply(sock, 20.0)), [(s2.encode(), [b'5-0'])])
        d = stats_json(self.ferry.stats_port)['durability']
        self.assertEqual((d['stream_reads_looked'], d['stream_reads_found']), (2, 1))
        self.assertEqual((rc.xpending(s1, 'g')['pending'], rc.xpending(s2, 'g')['pending']), (2, 1))

    def test_link_lost_resp2(self):
        self.check(2)

    def test_link_lost_resp3(self):
        self.check(3)


@unittest.skipIf(DIRECT, 'ferry only')
class SentinelLinkLost(SentinelMode, LinkLostChecks, unittest.TestCase):
    pass


@unittest.skipIf(DIRECT, 'ferry only')
class FixedMasterLinkLost(FixedMasterMode, LinkLostChecks, unittest.TestCase):
    pass


class ClusterLinkLost(ClusterOnce, LinkLostChecks, unittest.TestCase):
    """The same in cluster mode: the streams share a slot (one tag)."""

    def setUp(self):
        self.ferry = start_cluster_ferry(self.cluster)
        self.addCleanup(self.ferry.stop)
        self.reader = ClusterReader(self.cluster)
        self.addCleanup(self.reader.close)

    def direct(self, key):
        return self.reader.node(key)


load_tests = sentinel_first

if __name__ == '__main__':
    unittest.main()
