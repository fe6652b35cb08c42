"""Offset brackets (exactly once across a failover, first steps): with
durability.replicas_ack (Sentinel mode's default) ferry reads the master's
replication id once (INFO replication) and pipelines a ROLE beside each
replicas_ack WAIT, so every held write reply gets the master's replication
offset before and after it. These tests check the brackets from the stats
port against Redis itself, and that nothing of it runs without
replicas_ack.

Run: python3 -m unittest test_brackets -v
"""
import socket
import unittest

from harness import DIRECT, Ferry, RedisServer, SentinelTopology, resp_read_reply, resp_send, wait_until
from test_stats import stats_json

NPUSH = 300     # LPUSHes sent through ferry
PIPELINE = 10   # sent per write on one connection, so batches hold several replies


def push_all(port, key, n, pipeline):
    """n LPUSHes on one connection, pipeline at a time; returns the replies."""
    s = socket.create_connection(('127.0.0.1', port), timeout=10)
    out = []
    try:
        sent = 0
        while sent < n:
            k = min(pipeline, n - sent)
            for i in range(k):
                resp_send(s, ['LPUSH', key, 'item-%d' % (sent + i)])
            for _ in range(k):
                out.append(resp_read_reply(s, timeout=10))
            sent += k
    finally:
        s.close()
    return out


@unittest.skipIf(DIRECT, 'ferry only')
class BracketTest(unittest.TestCase):
    def test_sentinel_every_held_write_gets_a_bracket(self):
        topo = SentinelTopology()
        self.addCleanup(topo.stop)
        master = topo.master()
        topo.wait_replicas_synced(master, 2)
        f = Ferry(None, sentinel=topo)
        self.addCleanup(f.stop)

        replies = push_all(f.port, 'bq', NPUSH, PIPELINE)
        self.assertEqual(replies, list(range(1, NPUSH + 1)))
        info = master.client().info('replication')
        dur = {}

        def counted():
            dur.update(stats_json(f.stats_port)['durability'])
            return dur['brackets'] + dur['brackets_open'] >= NPUSH and dur['master_replid'] != ''
        wait_until(counted, timeout=10, msg='every push bracketed and the replid learned')
        # Each held LPUSH reply got exactly one bracket, a full one: the ROLE
        # that verified the shared link gives the first batch its lower end.
        self.assertEqual(dur['brackets'], NPUSH, dur)
        self.assertEqual(dur['brackets_open'], 0, dur)
        self.assertGreater(dur['bracket_roles'], 0, dur)
        self.assertLessEqual(dur['bracket_roles'], NPUSH + 1, dur)
        # A bracket covers at least the request's own bytes in the
        # replication stream ("*3\r\n$5\r\nLPUSH\r\n$2\r\nbq\r\n$6\r\nitem-0\r\n").
        min_cmd = len('*3\r\n$5\r\nLPUSH\r\n$2\r\nbq\r\n$6\r\nitem-0\r\n')
        self.assertGreaterEqual(dur['bracket_bytes'], NPUSH * min_cmd, dur)
        # ... and no more than the whole stream written meanwhile, once per
        # request of a batch.
        self.assertLessEqual(dur['bracket_bytes'], NPUSH * info['master_repl_offset'], dur)
        self.assertEqual(dur['master_replid'], info['master_replid'])

    def test_fixed_without_replicas_ack_no_brackets(self):
        # A fixed master: replicas_ack 0 by default; no ROLE, no INFO for it.
        r = RedisServer()
        self.addCleanup(r.stop)
        f = Ferry(r)
        self.addCleanup(f.stop)
        replies = push_all(f.port, 'bq', 50, PIPELINE)
        self.assertEqual(replies, list(range(1, 51)))
        dur = stats_json(f.stats_port)['durability']
        self.assertEqual(dur['replicas_ack'], 0, dur)
        self.assertEqual(dur['bracket_roles'], 0, dur)
        self.assertEqual(dur['brackets'], 0, dur)
        self.assertEqual(dur['brackets_open'], 0, dur)
        self.assertEqual(dur['master_replid'], '', dur)


if __name__ == '__main__':
    unittest.main()
