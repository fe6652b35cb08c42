"""workers: N event loops. With workers: 4, in Sentinel mode and with a fixed
master:

  - clients are spread over every loop (round-robin as they connect), and the
    stats port's figures add up across loops: commands counted = commands
    sent, each loop's own count included in the sum;
  - a session's replies keep their order, pipelined, with many sessions on
    several loops at once;
  - (Sentinel) a master change reaches every loop: after a planned failover
    every loop follows the new master, and no worker loop connected to it
    before the main loop (which runs the Sentinel client) named it.

Run:  python3 -m unittest test_workers -v
Ferry-only (skipped with FERRY_TEST_DIRECT=1).
"""
import json
import re
import socket
import threading
import unittest

import harness
from harness import Ferry, resp_encode, resp_read_reply, wait_until
from modes import FixedMasterMode, SentinelMode, key_prefix, sentinel_first

WORKERS = 4
CLIENTS = 12        # three per loop
PIPELINE = 400      # requests each client writes in one go


def stats_json(port, timeout=5.0):
    """The stats port's JSON document (a plain connection)."""
    s = socket.create_connection(('127.0.0.1', port), timeout=timeout)
    data = b''
    try:
        while True:
            d = s.recv(65536)
            if not d:
                break
            data += d
    finally:
        s.close()
    return json.loads(data)


class Checks:
    """Run with self.ferry (workers: 4)."""

    def test_1_clients_spread_and_stats_add_up(self):
        p = key_prefix(self)
        port = self.ferry.stats_port
        # The harness' own PING is counted once its loop has published.
        state = {}

        def settled():
            st = stats_json(port)
            state['st'] = st
            loops = st['worker_loops']
            return (st['curr_connections'] == 0 and
                    sum(l['commands_total'] for l in loops) == st['commands']['commands_total'])
        wait_until(settled, timeout=10, msg='stats settle')
        base = state['st']['commands']['commands_total']
        self.assertEqual(state['st']['workers'], WORKERS)

        socks = [self.ferry.raw() for _ in range(CLIENTS)]
        try:
            # Every client is open before any sends: round-robin puts three on
            # each loop.
            wait_until(lambda: stats_json(port)['curr_connections'] == CLIENTS, timeout=10,
                       msg='clients counted')
            loops = stats_json(port)['worker_loops']
            self.assertEqual(len(loops), WORKERS)
            self.assertEqual([l['clients'] for l in loops], [CLIENTS // WORKERS] * WORKERS,
                             'clients per loop: %r' % loops)
            sent = 0
            for i, s in enumerate(socks):
                n = 5 + 7 * i  # a different count per client
                harness.resp_send(s, b''.join(resp_encode('INCR', '%s:c%d' % (p, i))
                                              for _ in range(n)))
                for k in range(n):
                    self.assertEqual(resp_read_reply(s), k + 1)
                sent += n
        finally:
            for s in socks:
                s.close()

        def added_up():
            st = stats_json(port)
            state['st'] = st
            loops = st['worker_loops']
            total = st['commands']['commands_total']
            return total == base + sent and sum(l['commands_total'] for l in loops) == total
        try:
            wait_until(added_up, timeout=10, msg='commands_total = base + sent')
        except AssertionError:
            self.fail('sent %d after %d: %s\n%s' % (sent, base, json.dumps(state['st']['worker_loops']),
                                                    self.diag()))
        loops = state['st']['worker_loops']
        # Every loop served some of them: its own counter grew.
        self.assertTrue(all(l['commands_total'] > 0 for l in loops), loops)
        self.assertEqual(state['st']['commands']['class_stateless'] >= sent, True)

    def test_2_pipelined_replies_keep_their_order(self):
        p = key_prefix(self)
        errors = []

        def one(i):
            try:
                s = self.ferry.raw(timeout=30.0)
                try:
                    out = []
                    want = []
                    for k in range(PIPELINE):
                        kind = k % 4
                        if kind == 0:
                            out.append(resp_encode('SET', '%s:k%d' % (p, i), 'v%d' % k))
                            want.append('OK')
                        elif kind == 1:
                            out.append(resp_encode('GET', '%s:k%d' % (p, i)))
                            want.append(b'v%d' % (k - 1))
                        elif kind == 2:
                            out.append(resp_encode('ECHO', 'c%d-%d' % (i, k)))
                            want.append(b'c%d-%d' % (i, k))
                        else:
                            out.append(resp_encode('INCR', '%s:n%d' % (p, i)))
                            want.append(k // 4 + 1)
                    harness.resp_send(s, b''.join(out))
                    for k in range(PIPELINE):
                        got = resp_read_reply(s, timeout=30.0)
                        if got != want[k]:
                            errors.append('client %d reply %d: %r, expected %r' %
                                          (i, k, got, want[k]))
                            return
                finally:
                    s.close()
            except Exception as e:  # reported below
                errors.append('client %d: %r' % (i, e))

        threads = [threading.Thread(target=one, args=(i,)) for i in range(CLIENTS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        self.assertFalse(any(t.is_alive() for t in threads), 'a client hung')
        self.assertEqual(errors, [], self.diag())


class WorkersSentinel(SentinelMode, Checks, unittest.TestCase):
    def setUp(self):
        unittest.TestCase.setUp(self)
        if harness.DIRECT:
            self.skipTest('ferry-only')
        self.ferry = Ferry(None, sentinel=self.topo, conf={'workers': WORKERS})
        self.addCleanup(self.ferry.stop)

    def test_3_master_change_reaches_every_loop(self):
        p = key_prefix(self)
        port = self.ferry.stats_port
        self.topo.wait_stable()
        old = self.topo.master_port()
        # Clients on every loop, so each loop has work on the old master.
        socks = [self.ferry.raw() for _ in range(WORKERS * 2)]
        try:
            for i, s in enumerate(socks):
                harness.resp_send(s, resp_encode('INCR', '%s:n%d' % (p, i)))
                self.assertEqual(resp_read_reply(s), 1)
            wait_until(lambda: all(l['upstream_up'] and l['master'] == '127.0.0.1:%d' % old
                                   for l in stats_json(port)['worker_loops']),
                       timeout=10, msg='every loop UP on the old master')
            self.topo.failover()
            new = self.topo.wait_failover(old)
            want = '127.0.0.1:%d' % new
            state = {}

            def every_loop():
                loops = stats_json(port)['worker_loops']
                state['loops'] = loops
                return all(l['upstream_up'] and l['master'] == want for l in loops)
            try:
                wait_until(every_loop, timeout=20, msg='every loop UP on the new master')
            except AssertionError:
                self.fail('loops: %r\n%s' % (state.get('loops'), self.diag()))
            # Each session, whatever its loop, writes to the new master.
            for i, s in enumerate(socks):
                harness.resp_send(s, resp_encode('INCR', '%s:n%d' % (p, i)))
                self.assertEqual(resp_read_reply(s, timeout=20.0), 2)
        finally:
            for s in socks:
                s.close()
        # Ordering: the main loop named the new master (Sentinel's choice)
        # before any worker loop connected to it.
        log = self.ferry.log()
        conn = re.compile(r'^.*?(worker (\d+): )?master view: connecting to %s\b.*$' %
                          re.escape(want), re.M)
        seen = [(m.start(), m.group(2)) for m in conn.finditer(log)]
        self.assertTrue(seen, self.diag())
        self.assertIsNone(seen[0][1], 'a worker connected to the new master before the main '
                          'loop named it:\n%s' % '\n'.join(m.group(0) for m in conn.finditer(log)))
        workers_seen = {w for _, w in seen if w is not None}
        self.assertEqual(workers_seen, {str(i) for i in range(1, WORKERS)}, self.diag())


class WorkersFixedMaster(FixedMasterMode, Checks, unittest.TestCase):
    def setUp(self):
        unittest.TestCase.setUp(self)
        if harness.DIRECT:
            self.skipTest('ferry-only')
        self.ferry = Ferry(self.redis, conf={'workers': WORKERS})
        self.addCleanup(self.ferry.stop)


load_tests = sentinel_first


if __name__ == '__main__':
    unittest.main()
