"""scripts/chaos in CI: fixed short seeds of the seeded fault schedule, one
fault at a time (--calm: the faults replicas_ack 1 promises to survive), in
Sentinel mode with two ferries and in cluster mode; live takeovers of one of
two ferries, overlapping a Sentinel failover of a killed master (no client
may see an error); two ferries cut off from the master again and again (a
partition, in network namespaces: skipped, with the reason, where they
cannot be made); the disk under the master's AOF filling up (root: a tmpfs
per node); and the checker's own test: a run in which one
acknowledged item is taken out of Redis behind ferry's back, or one
delivered item put back, must fail and say so.

Each run prints its faults and its summary (pushes acknowledged, delivered,
drained, lost, twice, errors). Longer and overlapping schedules are for
operators and soaks (README: "Before production: scripts/chaos").

Run: python3 -m unittest test_chaos -v
"""
import os
import re
import shutil
import subprocess
import sys
import unittest

from harness import DIRECT

HERE = os.path.dirname(os.path.abspath(__file__))
CHAOS = os.path.join(os.path.dirname(os.path.dirname(HERE)), 'scripts', 'chaos')
SUMMARY = re.compile(r'pushes sent (\d+), acknowledged (\d+).*lost (\d+) \(\+(\d+) only in '
                     r'receipts\), twice (\d+).*strange (\d+); errors (\d+)')


def chaos(*args, timeout=600):
    p = subprocess.run([sys.executable, CHAOS] + list(args), stdin=subprocess.DEVNULL,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout)
    out = p.stdout.decode(errors='replace')
    print('\n'.join(line for line in out.splitlines()
                    if not line.startswith('  ferry ')), flush=True)
    m = SUMMARY.search(out)
    return p.returncode, out, (tuple(int(x) for x in m.groups()) if m else None)


@unittest.skipIf(DIRECT, 'ferry only')
class ChaosSeedsTest(unittest.TestCase):
    def check_ok(self, rc, out, figures):
        self.assertIsNotNone(figures, 'no summary line:\n' + out[-3000:])
        sent, acked, lost, lost_rcpt, twice, strange, errors = figures
        self.assertGreater(acked, 500, 'too little load to mean anything')
        self.assertEqual((lost, lost_rcpt, twice, strange, errors), (0, 0, 0, 0, 0), out[-4000:])
        self.assertIn('RESULT: OK', out)
        self.assertEqual(rc, 0)

    def test_sentinel_two_ferries(self):
        self.check_ok(*chaos('--mode', 'sentinel', '--ferries', '2', '--seconds', '40',
                             '--clients', '16', '--seed', '101', '--calm', '--faults',
                             'kill-master,kill-replica,stop-master,stop-replica,failover,'
                             'kill-sentinel,ferry-restart'))

    def test_sentinel_takeover(self):
        # Overlapping (no --calm): live takeovers of one of two ferries, one
        # of them while Sentinel fails a killed master over; no client may
        # see an error.
        self.check_ok(*chaos('--mode', 'sentinel', '--ferries', '2', '--seconds', '20',
                             '--clients', '16', '--seed', '405', '--faults',
                             'ferry-takeover,failover,kill-master'))

    def test_sentinel_partition(self):
        # Overlapping: two ferries cut off from the master again and again
        # (every Redis node and sentinel in a network namespace of its own).
        # Before links with unanswered requests were reset rather than closed,
        # the kernel still sent a request ferry had sent again elsewhere once
        # the partition healed: 4 items left in receipts and one twice with
        # this seed (lost 2, twice 1 on the build before this stop's).
        from harness import netns_unavailable
        why = netns_unavailable()
        if why:
            self.skipTest(why)
        self.check_ok(*chaos('--mode', 'sentinel', '--ferries', '2', '--seconds', '40',
                             '--clients', '16', '--seed', '22', '--faults', 'partition-master'))

    def test_sentinel_all_down(self):
        # Overlapping: every Redis node frozen or killed at once, again and
        # again (the fallback store takes the queue writes), with master
        # kills and failovers between. Before the store held a push that
        # was unanswered when its master froze (and left a ZADD sent
        # without a receipt to Redis), the thawed master applied such
        # writes too: seed 7 of this schedule found 1 to 19 items twice.
        self.check_ok(*chaos('--mode', 'sentinel', '--ferries', '2', '--seconds', '40',
                             '--clients', '16', '--seed', '8', '--faults',
                             'all-down,kill-master,stop-master,failover'))

    def test_sentinel_disk_full(self):
        # The disk under a node's AOF fills up (a tmpfs of its own, filled
        # to the last byte): Redis, with appendfsync always, exits at its
        # next AOF write (a short write: a part of a command at the AOF's
        # tail), and starts again with its data once the space is freed.
        # Here both faults hit the master: Sentinel fails it over.
        if os.geteuid() != 0:
            self.skipTest('needs root: a tmpfs under each Redis node')
        rc, out, figures = chaos('--mode', 'sentinel', '--ferries', '2', '--seconds', '30',
                                 '--clients', '16', '--seed', '9', '--calm', '--faults',
                                 'disk-full')
        self.assertNotIn('fault kind disk-full skipped', out)
        self.assertGreaterEqual(len(re.findall(r'fault disk-full +redis :\d+ \(master, exited',
                                               out)), 2, out[-3000:])
        self.check_ok(rc, out, figures)

    def test_cluster(self):
        # The Redis kinds named (all-down is left out: in cluster mode a
        # transaction has no receipt yet, and one in flight when every node
        # is killed is sent again where the offsets cannot tell: seed 11
        # found one MULTI's push twice, docs/failover.md's known case).
        self.check_ok(*chaos('--mode', 'cluster', '--seconds', '40', '--clients', '16',
                             '--seed', '202', '--calm', '--faults',
                             'kill-master,kill-replica,stop-master,cluster-failover,reshard'))

    def test_checker_sees_a_loss_and_a_duplicate(self):
        for what, field in (('lose', 2), ('dup', 4)):
            with self.subTest(sabotage=what):
                rc, out, figures = chaos('--seconds', '8', '--clients', '8', '--seed', '303',
                                         '--calm', '--faults', 'kill-replica',
                                         '--sabotage', what)
                self.assertIsNotNone(figures, out[-3000:])
                self.assertEqual(figures[field], 1, out[-3000:])
                self.assertIn('VIOLATION', out)
                self.assertIn('RESULT: FAILED', out)
                self.assertEqual(rc, 1)
                # A failed run keeps every process's log for the diagnosis.
                kept = re.search(r'logs of every process kept in (\S+)', out)
                self.assertIsNotNone(kept, out[-2000:])
                self.assertTrue(any(n.endswith('redis.log') for n in os.listdir(kept.group(1))))
                self.assertTrue(any(n.endswith('ferry.log') for n in os.listdir(kept.group(1))))
                shutil.rmtree(kept.group(1))


if __name__ == '__main__':
    unittest.main()
