"""Offset brackets (exactly once across a failover, first steps): with
durability.replicas_ack (Sentinel mode's default) ferry reads the master's
replication id once (INFO replication) and pipelines a ROLE beside each
replicas_ack WAIT, so every held write reply gets the master's replication
offset before and after it. These tests check the brackets from the stats
port against Redis itself, and that nothing of it runs without
replicas_ack.

After a failover ferry reads the new master's master_replid2 and
second_repl_offset (before it carries a request) and decides, for every
write or pop whose outcome the failover left unknown, whether the new master
has it (bracket.h). A write answered but unconfirmed that the new master has
is not sent again (its held reply is delivered); everything else follows the
retry policy and is counted. The kill -9 runs (4 producers + 4 consumers,
also with workers: 4) check that against what the workload sees: 0 lost,
every duplicate a verdict proves is seen (duplicates_known: a pop's data
delivered although the pop was not applied), and no other duplicate but one
a counted ambiguous case explains. A planned failover (SENTINEL FAILOVER)
must give no duplicate at all.

Run: python3 -m unittest test_brackets -v
     BRACKET_RUNS=20 python3 -m unittest test_brackets.BracketFailoverTest -v
         (prints one line per run: lost, duplicates, verdicts)
"""
import os
import socket
import time
import unittest

from failover_load import (FAILOVER_CONF, AccountingChecks, Load, current_master, each_run, merged,
                           now, sentinel_config_epoch)
from harness import DIRECT, Ferry, RedisServer, SentinelTopology, resp_read_reply, resp_send, wait_until
from test_stats import stats_json

RUNS = max(1, int(os.environ.get('BRACKET_RUNS', '3')))
PRE_FAULT = 3.0      # s of load before the kill
POST_RECOVERY = 2.0  # s of load after the new master is announced

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


@unittest.skipIf(DIRECT, 'ferry only')
class BracketFailoverTest(AccountingChecks, unittest.TestCase):
    def failover_runs(self, name, runs, fault, conf=None):
        """runs kill -9 (or planned) failovers under 4 producers + 4
        consumers, each on fresh processes; returns the table of runs."""
        table = []

        def run(k, cleanups):
            topo = SentinelTopology(replica_conf={'appendfsync': 'everysec'})
            cleanups.append(topo.stop)
            ferry = Ferry(None, conf=merged(FAILOVER_CONF, conf or {}), sentinel=topo)
            cleanups.append(ferry.stop)
            load = Load(ferry, '%s-%d' % (name, k)).start()
            cleanups.append(lambda: (load.stop_producers.set(), load.stop_consumers.set()))
            time.sleep(PRE_FAULT)
            old_port = topo.master_port()
            t_fault = now()
            fault(topo)
            topo.wait_failover(old_port, timeout=30)
            t_rec = now()
            load.wait_service(t_rec)
            time.sleep(POST_RECOVERY)
            res = load.finish(lambda: current_master(topo))
            res.t_fault, res.t_recovered = t_fault, t_rec
            fo = stats_json(ferry.stats_port)['failover']
            ndup = sum(n - 1 for n in res.duplicates.values())
            row = (k + 1, len(res.lost), ndup, fo['duplicates_known'], fo['decided_applied'],
                   fo['decided_not_applied'], fo['requests_ambiguous'],
                   sentinel_config_epoch(topo))
            table.append(row)
            print('[%s run %d] lost %d, duplicates %d, predicted %d; decided applied %d, '
                  'not applied %d, ambiguous %d (config epoch %d)' % ((name,) + row), flush=True)
            self.check_accounting(res, topo, ferry)
            with self.subTest(check='verdicts explain the duplicates'):
                # A duplicate a verdict proves is counted (duplicates_known:
                # a pop's data delivered although the pop was not applied);
                # any other one must have a counted ambiguous case.
                self.assertGreaterEqual(ndup, fo['duplicates_known'],
                                        'a predicted duplicate did not happen: a wrong verdict'
                                        + self.diag(topo, ferry, res))
                self.assertLessEqual(ndup, fo['duplicates_known'] + fo['requests_ambiguous'],
                                     'a duplicate no verdict explains'
                                     + self.diag(topo, ferry, res))
            return res
        each_run(self, runs, run)
        if table:
            print('[%s] run lost dups predicted applied not_applied ambiguous epoch' % name)
            for row in table:
                print(' '.join(str(x) for x in row))
        return table

    def test_kill9_verdicts_explain_duplicates(self):
        self.failover_runs('kill9', RUNS, lambda topo: topo.master().kill())

    def test_kill9_workers4(self):
        # Each of the 4 event loops keeps its own brackets and reads the
        # new master itself before it sends it anything.
        self.failover_runs('kill9-workers4', max(1, RUNS // 2), lambda topo: topo.master().kill(),
                           conf={'workers': 4})

    def test_planned_failover_no_duplicate(self):
        # SENTINEL FAILOVER: the old master lets its replicas catch up
        # before one is promoted, so every write it answered is on the new
        # master (verdict: applied) and nothing is sent twice.
        table = self.failover_runs('planned', 1, lambda topo: self.assertEqual(topo.failover(0),
                                                                               'OK'))
        for row in table:
            self.assertEqual(row[1], 0, 'lost')
            self.assertEqual(row[2], 0, 'duplicates after a planned failover')

if __name__ == '__main__':
    unittest.main()
