"""Cluster mode: a transaction with a queue's push (RQ's enqueue) whose
EXEC reply died with its master is run once, as in Sentinel mode.

A transaction lives in one slot, so its receipt script (receipt_tx.lua)
can run on the slot's master with the receipt in that slot (a key "{N}"
whose digits hash there). The test pipelines MULTI, GET of a large value,
RPUSH, EXEC on a raw connection it does not read: EXEC's reply waits in
the master behind the value. Once the master's replica has the push, the
master is frozen and killed; the replica is promoted, and ferry sends the
transaction again. Before, it ran a second time there (the item twice);
with the receipt, the promoted replica answers the first run's replies."""

import os
import signal
import time
import unittest

import harness
from harness import ClusterTopology, Ferry, resp_encode, resp_read_reply, wait_until
from test_cluster_multi import key_on
from test_cluster_route import stats

BIG = 32 << 20  # EXEC's reply waits in the master behind this value
ATTEMPTS = int(os.environ.get('RECEIPT_ATTEMPTS', '4'))  # the freeze must fall while EXEC's reply is still in the master


@unittest.skipIf(harness.DIRECT, 'ferry-only')
class ClusterTransactionReceiptTest(unittest.TestCase):

    def attempt(self):
        cluster = ClusterTopology(masters=3, replicas=2, node_timeout_ms=2000,
                                  redis_conf={'client-output-buffer-limit': 'replica 0 0 0'})
        self.addCleanup(cluster.stop)
        f = Ferry(None, wait='port', conf={
            'cluster': {'nodes': cluster.seeds(), 'refresh_interval_ms': 200,
                        'timeout_ms': 1000},
            'upstream': {'hold_timeout_ms': 30000},
            'durability': {'replicas_ack': 1, 'replicas_ack_timeout_ms': 1000}})
        self.addCleanup(f.stop)
        owners = cluster.wait_consistent()
        victim = sorted(set(owners.values()))[0]
        tag = '{%s}' % key_on(cluster, victim, 'rq')
        q, job, big = tag + 'q', tag + 'job:1', tag + 'big'
        m = cluster.node_by_port(victim).client(socket_timeout=30)
        m.set(big, b'x' * BIG)
        m.rpush(q, 'i1', 'i2', 'i3')
        replica = wait_until(lambda: (cluster.replicas_of(victim) or [None])[0], timeout=20,
                             interval=0.1, msg='a replica of the victim known')
        rc = cluster.node_by_port(replica).client(socket_timeout=10)
        rc.execute_command('READONLY')
        wait_until(lambda: rc.llen(q) == 3 and rc.strlen(big) == BIG, timeout=60,
                   interval=0.1, msg='the replica has the value and the queue')
        c = f.client(socket_timeout=10)
        wait_until(lambda: c.llen(q) == 3, timeout=20, interval=0.1, msg='ferry serves the key')
        c.close()
        sk = f.raw(timeout=60)
        self.addCleanup(sk.close)
        cmds = [['MULTI'], ['GET', big], ['HSET', job, 'status', 'queued'], ['RPUSH', q, 'i4'],
                ['EXEC']]
        # The master frozen, ferry sends the transaction (its receipt
        # script at EXEC) into the master's socket; then ferry is frozen and
        # the master goes on: it runs the transaction, and EXEC's reply, too
        # large for the sockets, waits in the master, which dies once its
        # replica has the push.
        node = cluster.node_by_port(victim)
        node.sigstop()
        sk.sendall(b''.join(resp_encode(cmd) for cmd in cmds))
        time.sleep(0.2)
        os.kill(f.pid, signal.SIGSTOP)
        try:
            node.sigcont()
            deadline = time.monotonic() + 10
            while rc.llen(q) != 4 and time.monotonic() < deadline:
                time.sleep(0.0002)
            self.assertEqual(rc.llen(q), 4, 'the replica never got the push')
            node.sigstop()
            node.kill()
        finally:
            os.kill(f.pid, signal.SIGCONT)
        promoted = cluster.wait_promoted(victim, timeout=60)
        got = [resp_read_reply(sk, timeout=60) for _ in cmds]
        self.assertEqual(got[:4], ['OK', 'QUEUED', 'QUEUED', 'QUEUED'])
        self.assertIsInstance(got[4], list, str(got[4]))
        self.assertEqual(len(got[4]), 3, got[4][1:])
        self.assertEqual(len(got[4][0]), BIG)
        self.assertEqual(got[4][1:], [1, 4], 'the first run\'s replies')
        n = cluster.node_by_port(promoted).client(socket_timeout=10)
        self.assertEqual(n.lrange(q, 0, -1), ['i1', 'i2', 'i3', 'i4'],
                         'the transaction sent again ran a second time')
        wait_until(lambda: [k for k in n.scan_iter(match='ferry:rcpt:*')] == [], timeout=10,
                   msg='the receipt deleted once the reply was in')
        d = stats(f)['durability']
        self.assertGreaterEqual(d['transaction_receipts'], 1)
        return d['transaction_receipts_found']

    def test_transaction_reply_lost_with_the_master(self):
        found = 0
        for k in range(ATTEMPTS):
            with self.subTest(attempt=k):
                found = self.attempt()
            if found:
                break
        print('\n[cluster receipts] tx: the receipt answered after %d attempt(s)' % (k + 1),
              flush=True)
        self.assertGreaterEqual(found, 1, 'never froze the master with the reply inside it')


if __name__ == '__main__':
    unittest.main()
