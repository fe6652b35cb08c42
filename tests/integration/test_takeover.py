"""Restarting ferry without its clients noticing: `ferry --takeover PATH`
against a running ferry with takeover.socket PATH, in Sentinel mode in front
of 1 master + 2 replicas + 3 sentinels (SentinelTopology).

  TakeoverUnderLoadTest  a takeover under 4 producers and 4 consumers
                         (failover_load.Load) plus four raw-socket clients:
                         a consumer blocked in BRPOP q2 0, a SUBSCRIBE client,
                         a client in SELECT 3 and one with a MULTI open (the
                         old process waits for its EXEC, then hands it over
                         too). No client error, 0 lost, no
                         connection accepted by the new process (nobody
                         reconnected) and none closed by the old one but by
                         the handover; the four clients keep their sockets
                         (same local port) and their state: the BRPOP gets an
                         item pushed after the takeover, the subscriber a
                         message published after it (on its channel and
                         on its pattern), the SELECT 3 client's SET lands
                         in db 3, and a client that had sent half a request
                         completes it on the new process, a CLIENT SETNAME
                         client keeps its name, a RESP3 client with CLIENT
                         TRACKING stays RESP3, gets a cache flush and is
                         tracked again; a MONITOR client (a stream ferry
                         does not carry over) is closed at once. The old
                         process exits 0.
  TakeoverAclTest        client.auth redis: a takeover under producers and
                         consumers running as Redis user tq (~queue:* +@list
                         +wait); a RESP2 client AUTHed as tq, a RESP3 client
                         HELLO 3 AUTH tq, a BRPOP blocked as tq (cancelled
                         and re-issued as tq) and a client whose AUTH as
                         user to waits behind its BRPOP (handed over only
                         once Redis answered it, then as to): same sockets,
                         no error, 0 lost, each still runs as its user on
                         the new process (Redis' -NOPERM on a key outside
                         its pattern, CLIENT LIST and ACL LOG name the user
                         of the new process's links), no password in the
                         logs; a new process whose client.auth differs
                         closes the clients it cannot carry (a Redis user's
                         under client.auth ferry, one authenticated by
                         ferry under client.auth redis); the takeover
                         socket has mode 0600
  TakeoverWorkersTest    the old process on workers: 4, the new one on
                         workers: 2, under load, with a BRPOP q 0, a SUBSCRIBE
                         and a SELECT 3 client on three loops of the old one:
                         every loop hands its clients over, both loops of the
                         new one adopt some; same sockets, no error, 0 lost,
                         each keeps its state, nobody reconnected, new
                         connections every 10 ms all along are all answered
                         (none refused), the old process exits 0. And a new process that goes away
                         right after ACCEPTING: the old one keeps every client
                         (the workers' served by its main loop), a BRPOP
                         cancelled for the handover is re-issued and gets an
                         item pushed after, every loop runs on
  TakeoverHeldTest       a takeover while the master is down (fixed mode):
                         two clients whose requests are held for a master,
                         never sent (a push, a transaction, a read; a push in
                         db 2), go over with them at once; the old process
                         exits 0 without reaching shutdown_timeout_ms, and
                         the new one answers each request once the master
                         is back, in order, each applied once
  TakeoverRefusedTest    a takeover with no ferry to take over (socket file
                         gone, or left behind by a killed ferry) fails at once
                         with a clear message and exit code 3
  TakeoverScriptTest     scripts/rolling-restart --ferry under the same load,
                         with a BRPOP q2 0, a SUBSCRIBE and a SELECT 3 client:
                         exit 0, the old process exited 0, the pid file names
                         the new one, 0 errors, 0 lost, nobody reconnected;
                         and its checks: --dry-run changes nothing, a ferry
                         without takeover.socket or with a dead pid is
                         refused, a new process that exits at once leaves the
                         old one serving
  TakeoverSystemdReloadTest  scripts/ferry.service's ExecReload lines run by
                         hand (what systemd replaces in them replaced) against
                         a ferry started as its ExecStart starts it, with
                         NOTIFY_SOCKET: exit 0, MAINPID=<new pid> notified,
                         the old process exited 0, a client keeps its
                         connection, a second reload works too; without a
                         takeover socket the reload fails and ferry serves on

Run:  python3 -m unittest test_takeover -v
With FERRY_TEST_WORKERS=N both processes of every test run N loops.
Ferry-only (skipped with FERRY_TEST_DIRECT=1).
"""
import os
import re
import shlex
import shutil
import signal
import socket
import struct
import subprocess
import tempfile
import threading
import time
import unittest

import harness
from failover_load import FAILOVER_CONF, AccountingChecks, Load, current_master, now
from harness import (FERRY_BIN, REPO, Ferry, RespError, SentinelTopology, free_port,
                     render_yaml, resp_encode, resp_read_raw, resp_read_reply, resp_send,
                     wait_until)

PRE_LOAD = 1.5       # s of load before the takeover
POST_LOAD = 1.5      # s of load after the old process exited
TAKEOVER_WAIT = 20   # s for the old process to exit
SCRIPT = os.path.join(REPO, 'scripts', 'rolling-restart')
FLUSH = b'>2\r\n$10\r\ninvalidate\r\n_\r\n'  # RESP3: drop every cached key
SCRIPT_TIMEOUT = 90  # s, a scripts/rolling-restart --ferry run

# As test_failover: replicas_ack 1 so that an acknowledged write is on a
# replica too.
FERRY_CONF = FAILOVER_CONF


def spawn_takeover(config_path, sock_path, out_path):
    """Start `ferry -c config --takeover sock` (its log goes to log.file)."""
    return harness._spawn([FERRY_BIN, '-c', config_path, '--takeover', sock_path], out_path)


def longest_gap(res, t0, t1):
    """Longest time (ms) between two acknowledged pushes (any producer) that
    overlaps [t0, t1]: the stall clients saw in that window."""
    times = sorted(res.acked.values())
    gaps = [(b - a) * 1000 for a, b in zip(times, times[1:]) if b >= t0 and a <= t1]
    return max(gaps, default=0.0)


def log_lines(text, pid):
    return [ln for ln in text.splitlines() if re.match(r'\S+ %d ' % pid, ln)]


@unittest.skipIf(harness.DIRECT, 'ferry-only: needs ferry in sentinel mode')
def swap_to_new(test, topo, ferry, new, old_rc):
    """After a takeover: the old process must have exited (old_rc), the new
    one must run; from here on the harness stops the new one."""
    old_proc = ferry.proc
    ferry.proc, ferry.pid = new, new.pid
    test.assertIsNotNone(old_rc, 'the old ferry did not exit within %ds%s' % (
        TAKEOVER_WAIT, test.diag(topo, ferry)))
    if old_proc.poll() is None:
        old_proc.kill()
    time.sleep(POST_LOAD)
    test.assertIsNone(new.poll(), 'the new ferry exited (%r)%s' % (
        new.poll(), test.diag(topo, ferry)))


def open_kept_state(test, ferry, mc, prefix, queue):
    """Three clients on raw sockets, in a row (so on three loops with
    workers): one in SELECT 3, one blocked in BRPOP queue 0 on the master
    (mc), one subscribed to PREFIX:ch. Returns (sel, blk, sub)."""
    sel = ferry.raw()
    resp_send(sel, ['SELECT', '3'])
    test.assertEqual(resp_read_reply(sel), 'OK')
    blk = ferry.raw()
    resp_send(blk, ['BRPOP', queue, '0'])
    sub = ferry.raw()
    resp_send(sub, ['SUBSCRIBE', prefix + ':ch'])
    test.assertEqual(resp_read_reply(sub), [b'subscribe', (prefix + ':ch').encode(), 1])
    wait_until(lambda: int(mc.info('clients')['blocked_clients']) >= 1, timeout=10,
               msg='BRPOP %s 0 blocked on the master' % queue)
    return sel, blk, sub


def check_kept_state(test, topo, sel, blk, sub, prefix, queue):
    """The SELECT 3 client, the blocked BRPOP queue 0 and the subscriber to
    PREFIX:ch after a takeover, on their own sockets."""
    with test.subTest(check='the SELECT 3 client writes to db 3'):
        resp_send(sel, ['SET', prefix + ':k', 'after'])
        test.assertEqual(resp_read_reply(sel), 'OK')
        m = current_master(topo)
        test.assertEqual(m.client(socket_timeout=5, db=3).get(prefix + ':k'), 'after')
        test.assertIsNone(m.client(socket_timeout=5).get(prefix + ':k'))
    with test.subTest(check='the BRPOP %s 0 gets an item pushed after' % queue):
        current_master(topo).client(socket_timeout=5).lpush(queue, 'after-takeover')
        test.assertEqual(resp_read_reply(blk, timeout=10), [queue.encode(), b'after-takeover'])
    with test.subTest(check='the subscriber gets a message published after'):
        pub = current_master(topo).client(socket_timeout=5)
        wait_until(lambda: pub.publish(prefix + ':ch', 'after-takeover') >= 1, timeout=10,
                   msg='the subscriber to be subscribed again')
        test.assertEqual(resp_read_reply(sub, timeout=5),
                         [b'message', (prefix + ':ch').encode(), b'after-takeover'])


class TakeoverUnderLoadTest(AccountingChecks, unittest.TestCase):

    def test_takeover_under_load(self):
        tmp = tempfile.mkdtemp(prefix='ferry-takeover-')
        self.addCleanup(shutil.rmtree, tmp, True)
        sock_path = os.path.join(tmp, 'takeover.sock')
        topo = SentinelTopology()
        self.addCleanup(topo.stop)
        store = os.path.join(tmp, 'fallback.db')
        conf = dict(FERRY_CONF, takeover={'socket': sock_path}, fallback={'path': store})
        ferry = Ferry(None, conf=conf, sentinel=topo)
        self.addCleanup(ferry.stop)
        old_pid = ferry.pid
        master = topo.master()
        mc = master.client(socket_timeout=5)
        mc.delete('q', 'q2', 'tk:k', 'tk:tx', 'tk:par', 'tk:nokey')
        master.client(socket_timeout=5, db=3).delete('tk:k')

        # The three special clients, on raw sockets: nothing can reconnect.
        sel = ferry.raw()
        resp_send(sel, ['SELECT', '3'])
        self.assertEqual(resp_read_reply(sel), 'OK')
        resp_send(sel, ['SET', 'tk:k', 'before'])
        self.assertEqual(resp_read_reply(sel), 'OK')
        blk = ferry.raw()
        resp_send(blk, ['BRPOP', 'q2', '0'])
        sub = ferry.raw()
        resp_send(sub, ['SUBSCRIBE', 'tk:ch'])
        self.assertEqual(resp_read_reply(sub), [b'subscribe', b'tk:ch', 1])
        resp_send(sub, ['PSUBSCRIBE', 'tk:p*'])
        self.assertEqual(resp_read_reply(sub), [b'psubscribe', b'tk:p*', 2])
        # Half a request read by the old process: parsed by the new one once
        # the rest arrives.
        part = ferry.raw()
        whole = b'*3\r\n$3\r\nSET\r\n$6\r\ntk:par\r\n$5\r\nwhole\r\n'
        part.sendall(whole[:20])
        # A connection setting: handed over, replayed on the new link.
        named = ferry.raw()
        resp_send(named, ['CLIENT', 'SETNAME', 'tk-named'])
        self.assertEqual(resp_read_reply(named), 'OK')
        # RESP3 with client-side caching: stays RESP3, gets a cache flush
        # (its link changes), then tracking goes on.
        mc.set('tk:tr', 'v1')
        trk = ferry.raw()
        resp_send(trk, ['HELLO', '3'])
        self.assertIsInstance(resp_read_reply(trk), dict)
        resp_send(trk, ['CLIENT', 'TRACKING', 'on'])
        self.assertEqual(resp_read_raw(trk), b'+OK\r\n')
        resp_send(trk, ['GET', 'tk:tr'])
        self.assertEqual(resp_read_raw(trk), b'$2\r\nv1\r\n')
        # A stream ferry does not carry over: closed at once (after what it
        # has received), not at shutdown_timeout_ms.
        mon = ferry.raw()
        resp_send(mon, ['MONITOR'])
        self.assertEqual(resp_read_reply(mon), 'OK')
        # A transaction open when the takeover starts: handed over after EXEC.
        tx = ferry.raw()
        resp_send(tx, ['MULTI'])
        self.assertEqual(resp_read_reply(tx), 'OK')
        resp_send(tx, ['SET', 'tk:tx', 'in-multi'])
        self.assertEqual(resp_read_reply(tx), 'QUEUED')
        # Only the BRPOP q2 0 blocks until the load starts.
        wait_until(lambda: int(mc.info('clients')['blocked_clients']) >= 1, timeout=10,
                   msg='BRPOP q2 0 blocked on the master')
        ports = [s.getsockname() for s in (sel, blk, sub, tx, part, named, trk)]

        load = Load(ferry, 'takeover').start()
        self.addCleanup(load.stop)
        time.sleep(PRE_LOAD)

        t_fault = now()
        new = spawn_takeover(ferry.config_path, sock_path, ferry.out_path)
        nothers = 6 + load.producers + load.consumers

        def handed_so_far():
            return len([ln for ln in log_lines(ferry.log(), old_pid)
                        if 'closed: handed over to the new process' in ln])
        # Everyone but the transaction goes over; it waits for its EXEC.
        wait_until(lambda: handed_so_far() >= nothers, timeout=10,
                   msg='the other clients to be handed over')
        self.assertIsNone(ferry.proc.poll(), 'the old ferry exited with a MULTI open')
        mon.settimeout(5)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and mon.recv(65536) != b'':
            pass  # what MONITOR streamed before it was closed
        self.assertLess(time.monotonic(), deadline, 'the MONITOR client was not closed')
        t_exec = now()
        resp_send(tx, ['EXEC'])
        self.assertEqual(resp_read_reply(tx), ['OK'])
        try:
            old_rc = ferry.proc.wait(TAKEOVER_WAIT)
        except subprocess.TimeoutExpired:
            old_rc = None
        took = now() - t_fault
        after_exec = now() - t_exec
        swap_to_new(self, topo, ferry, new, old_rc)

        # The three clients after the takeover, on the same sockets.
        check_kept_state(self, topo, sel, blk, sub, 'tk', 'q2')
        with self.subTest(check='the subscriber keeps its pattern'):
            pub = current_master(topo).client(socket_timeout=5)
            wait_until(lambda: pub.publish('tk:pat', 'after-takeover') >= 1, timeout=10,
                       msg='the subscriber to have its pattern again')
            self.assertEqual(resp_read_reply(sub, timeout=5),
                             [b'pmessage', b'tk:p*', b'tk:pat', b'after-takeover'])
        with self.subTest(check='the half-sent request completes on the new process'):
            part.sendall(whole[20:])
            self.assertEqual(resp_read_reply(part), 'OK')
            self.assertEqual(current_master(topo).client(socket_timeout=5).get('tk:par'),
                             'whole')
        with self.subTest(check='the CLIENT SETNAME client keeps its name'):
            resp_send(named, ['CLIENT', 'GETNAME'])
            self.assertEqual(resp_read_reply(named), b'tk-named')
        with self.subTest(check='the RESP3 tracking client: flushed, RESP3, tracked again'):
            self.assertEqual(resp_read_raw(trk), FLUSH)
            resp_send(trk, ['GET', 'tk:nokey'])
            self.assertEqual(resp_read_raw(trk), b'_\r\n')
            resp_send(trk, ['GET', 'tk:tr'])
            self.assertEqual(resp_read_raw(trk), b'$2\r\nv1\r\n')
            current_master(topo).client(socket_timeout=5).set('tk:tr', 'v2')
            self.assertEqual(resp_read_raw(trk), b'>2\r\n$10\r\ninvalidate\r\n*1\r\n'
                             b'$5\r\ntk:tr\r\n')
        with self.subTest(check='the transaction client, handed over after its EXEC'):
            self.assertEqual(current_master(topo).client(socket_timeout=5).get('tk:tx'),
                             'in-multi')
            resp_send(tx, ['GET', 'tk:tx'])
            self.assertEqual(resp_read_reply(tx), b'in-multi')
        with self.subTest(check='same sockets'):
            self.assertEqual([s.getsockname() for s in (sel, blk, sub, tx, part, named, trk)],
                             ports)

        res = load.finish(lambda: current_master(topo))
        res.t_fault = t_fault
        log = ferry.log()
        old_log = log_lines(log, old_pid)
        began = [i for i, ln in enumerate(old_log) if 'takeover: a new process connected' in ln]
        self.assertEqual(len(began), 1, '\n'.join(old_log[-40:]))
        old_log = old_log[began[0]:]
        new_log = log_lines(log, new.pid)
        handed = re.search(r'takeover: all (\d+) client\(s\) handed over in (\d+) ms',
                           '\n'.join(old_log))
        print(res.summary('takeover'), flush=True)
        print('[takeover] old process exited %.2fs after the new one started; %s; longest '
              'write gap %.0f ms during the takeover, %.0f ms before it (baseline), %.0f ms '
              'over the run' % (took, handed.group(0) if handed else 'not all handed over',
                                longest_gap(res, t_fault, t_fault + took),
                                longest_gap(res, load.t_start, t_fault - 0.001), res.gap_ms),
              flush=True)

        with self.subTest(check='the old process exits 0 after handing every client over'):
            self.assertEqual(old_rc, 0)
            self.assertIsNotNone(handed, '\n'.join(old_log[-40:]))
            self.assertEqual(int(handed.group(1)), nothers + 1)
        with self.subTest(check='no client closed by the old process but by the handover'):
            closed = [ln for ln in old_log if re.search(r' client \d+ \S+ closed: ', ln)]
            others = [ln for ln in closed if 'handed over to the new process' not in ln]
            # The MONITOR one only, at once: the old process exits right
            # after the EXEC, not at shutdown_timeout_ms (5 s).
            self.assertEqual(len(others), 1, others)
            # Closed at once, or once what it was streaming is written.
            mon_id = re.search(r' client (\d+) ', others[0]).group(1)
            said = [ln for ln in old_log if re.search(
                r' client %s \S+(:| closed:) ferry restarted \(takeover\): a MONITOR or CLIENT '
                r'REPLY stream cannot be handed over' % mon_id, ln)]
            self.assertEqual(len(said), 1, others)
            self.assertEqual(len(closed), nothers + 2)
            self.assertLess(after_exec, 3)
        with self.subTest(check='blocked calls cancelled on Redis, not by closing their link'):
            # CLIENT UNBLOCK ... TIMEOUT: nothing popped for nobody; at least
            # the BRPOP q2 0 (the load's consumers block 1 s at a time too).
            cancelled = [ln for ln in old_log if 'blocked call cancelled on Redis' in ln]
            self.assertGreaterEqual(len(cancelled), 1, '\n'.join(old_log[-40:]))
        with self.subTest(check='the fallback store passes from the old process to the new'):
            # The old one closes it (its lock) before it says DONE; the new
            # one opens it then.
            done = [i for i, ln in enumerate(log.splitlines())
                    if re.match(r'\S+ %d INFO  takeover: the old process is done' % new.pid, ln)]
            opened = [i for i, ln in enumerate(log.splitlines())
                      if re.match(r'\S+ %d INFO  fallback store %s open' % (new.pid, re.escape(store)),
                                  ln)]
            self.assertEqual(len(done), 1)
            self.assertEqual(len(opened), 1, '\n'.join(new_log[-40:]))
            self.assertGreater(opened[0], done[0])
            self.assertEqual([ln for ln in new_log if 'fallback store' in ln and 'ERROR' in ln], [])
        with self.subTest(check='nobody reconnected: the new process accepted no connection'):
            accepted = [ln for ln in new_log if re.search(r' client \d+ \S+ connected$', ln)]
            self.assertEqual(accepted, [])
        self.check_accounting(res, topo, ferry)
        for s in (sel, blk, sub, tx, part, named, trk, mon):
            s.close()


@unittest.skipIf(harness.DIRECT, 'ferry-only: needs ferry in sentinel mode')
class TakeoverWorkersTest(AccountingChecks, unittest.TestCase):
    """The old process on workers: 4, the new one on workers: 2."""

    def test_four_loops_to_two(self):
        tmp = tempfile.mkdtemp(prefix='ferry-takeover-')
        self.addCleanup(shutil.rmtree, tmp, True)
        sock_path = os.path.join(tmp, 'takeover.sock')
        topo = SentinelTopology()
        self.addCleanup(topo.stop)
        conf = dict(FERRY_CONF, takeover={'socket': sock_path}, workers=4)
        ferry = Ferry(None, conf=conf, sentinel=topo)
        self.addCleanup(ferry.stop)
        old_pid = ferry.pid
        mc = topo.master().client(socket_timeout=5)
        mc.delete('q', 'tkw:q', 'tkw:k')
        topo.master().client(socket_timeout=5, db=3).delete('tkw:k')

        # Three clients in a row: three loops of four (round-robin).
        sel, blk, sub = open_kept_state(self, ferry, mc, 'tkw', 'q')
        clients = (sel, blk, sub)
        names = [s.getsockname() for s in clients]

        load = Load(ferry, 'takeover-workers', key='tkw:q').start()
        self.addCleanup(load.stop)
        time.sleep(PRE_LOAD)

        new_conf = dict(ferry.conf, workers=2)
        new_path = os.path.join(tmp, 'new.yml')
        with open(new_path, 'w') as f:
            f.write(render_yaml(new_conf))
        # New connections all along: none refused, each answered.
        conns = Connector(ferry.port).start()
        self.addCleanup(conns.stop)
        time.sleep(0.2)
        t_fault = now()
        new = spawn_takeover(new_path, sock_path, ferry.out_path)
        try:
            old_rc = ferry.proc.wait(TAKEOVER_WAIT)
        except subprocess.TimeoutExpired:
            old_rc = None
        took = now() - t_fault
        time.sleep(0.3)
        conns.stop()
        swap_to_new(self, topo, ferry, new, old_rc)

        check_kept_state(self, topo, sel, blk, sub, 'tkw', 'q')
        with self.subTest(check='same sockets'):
            self.assertEqual([s.getsockname() for s in clients], names)

        res = load.finish(lambda: current_master(topo))
        res.t_fault = t_fault
        log = ferry.log()
        old_log = log_lines(log, old_pid)
        began = [i for i, ln in enumerate(old_log) if 'takeover: a new process connected' in ln]
        self.assertEqual(len(began), 1, '\n'.join(old_log[-40:]))
        old_log = old_log[began[0]:]
        new_log = log_lines(log, new.pid)
        nclients = 3 + load.producers + load.consumers
        handed = re.search(r'takeover: all (\d+) client\(s\) handed over in (\d+) ms',
                           '\n'.join(old_log))
        print(res.summary('takeover-workers'), flush=True)
        print('[takeover-workers] old process (4 loops) exited %.2fs after the new one (2 loops) '
              'started; %s' % (took, handed.group(0) if handed else 'not all handed over'),
              flush=True)

        # A session's id names its loop: loop i of n gives the ids i + k * n.
        def loops_of(lines, pattern, n):
            found = {}
            for ln in lines:
                m = re.search(pattern, ln)
                if m:
                    found[m.group(2)] = int(m.group(1)) % n
            return found
        old_loop = loops_of(new_log, r'takeover: client (\d+) (\S+) received', 4)
        new_loop = loops_of(new_log, r'client (\d+) (\S+) taken over', 2)
        peers = ['127.0.0.1:%d' % s.getsockname()[1] for s in clients]
        # The connector's connections: any open at the handover goes over too.
        fresh = {'127.0.0.1:%d' % p for p in conns.ports}

        def peer_of(ln):
            return re.search(r' client \d+ (\S+) ', ln).group(1)
        fresh_handed = [ln for ln in old_log if 'closed: handed over to the new process' in ln
                        and peer_of(ln) in fresh]
        old_loop = {p: i for p, i in old_loop.items() if p not in fresh}
        new_loop = {p: i for p, i in new_loop.items() if p not in fresh}
        with self.subTest(check='the old process exits 0 after handing every client over'):
            self.assertEqual(old_rc, 0)
            self.assertIsNotNone(handed, '\n'.join(old_log[-40:]))
            self.assertEqual(int(handed.group(1)), nclients + len(fresh_handed))
            done = [ln for ln in old_log if re.search(r'takeover: loop \d: its \d+ client', ln)]
            self.assertEqual(len(done), 3, '\n'.join(old_log[-40:]))
        with self.subTest(check='the three clients were on three loops of the old process'):
            self.assertEqual(len({old_loop.get(p) for p in peers}), 3, (peers, old_loop))
        with self.subTest(check='both loops of the new process adopted clients'):
            self.assertEqual(len(new_loop), nclients, new_loop)
            self.assertEqual(set(new_loop.values()), {0, 1}, new_loop)
            self.assertTrue(all(p in new_loop for p in peers), (peers, new_loop))
        with self.subTest(check='no client closed by the old process but by the handover'):
            closed = [ln for ln in old_log if re.search(r' client \d+ \S+ closed: ', ln)
                      and peer_of(ln) not in fresh]
            others = [ln for ln in closed if 'handed over to the new process' not in ln]
            self.assertEqual(others, [])
            self.assertEqual(len(closed), nclients)
        with self.subTest(check='new connections during the takeover: none refused'):
            self.assertEqual(conns.errors, [])
            self.assertGreater(len(conns.ports), 10)
        with self.subTest(check='nobody reconnected: the new process accepted no old client'):
            accepted = [ln for ln in new_log if re.search(r' client \d+ \S+ connected$', ln)]
            self.assertEqual([ln for ln in accepted if peer_of(ln) not in fresh], [])
        with self.subTest(check='the BRPOP was cancelled on Redis, not by closing its link'):
            cancelled = [ln for ln in old_log if 'blocked call cancelled on Redis' in ln]
            self.assertGreaterEqual(len(cancelled), 1, '\n'.join(old_log[-40:]))
        self.check_accounting(res, topo, ferry)
        for s in clients:
            s.close()

    def test_aborted_with_workers(self):
        """A new process that goes away right after ACCEPTING: the old one
        keeps every client (a worker's, posted for the main loop to send, is
        served by the main loop), each on its socket with its database, and
        every loop runs on."""
        tmp = tempfile.mkdtemp(prefix='ferry-takeover-')
        self.addCleanup(shutil.rmtree, tmp, True)
        sock_path = os.path.join(tmp, 'takeover.sock')
        redis_srv = harness.RedisServer()
        self.addCleanup(redis_srv.stop)
        ferry = Ferry(redis_srv, conf={'takeover': {'socket': sock_path}, 'workers': 4})
        self.addCleanup(ferry.stop)
        clients = []
        for i in range(8):  # two on each loop
            c = ferry.raw()
            resp_send(c, ['SELECT', str(i % 4)])
            self.assertEqual(resp_read_reply(c), 'OK')
            clients.append(c)
        # Blocked in BRPOP on each loop: cancelled on Redis for the handover,
        # re-issued in place once it is aborted.
        blocked = []
        for i in range(4):
            c = ferry.raw()
            resp_send(c, ['BRPOP', 'tka:q%d' % i, '0'])
            blocked.append(c)
        rc = redis_srv.client()
        wait_until(lambda: int(rc.info('clients')['blocked_clients']) >= 4, timeout=10,
                   msg='the four BRPOP blocked on Redis')
        names = [c.getsockname() for c in clients + blocked]

        fake_new_process(sock_path)
        wait_until(lambda: 'takeover: this process no longer listens' in ferry.log(), timeout=10,
                   msg='the takeover to be aborted')
        for i, c in enumerate(clients):
            resp_send(c, ['SET', 'tka:%d' % i, 'kept'])
            self.assertEqual(resp_read_reply(c, timeout=5), 'OK')
        for i in range(8):
            self.assertEqual(redis_srv.client(db=i % 4).get('tka:%d' % i), 'kept')
        wait_until(lambda: int(rc.info('clients')['blocked_clients']) >= 4, timeout=10,
                   msg='the four BRPOP blocked on Redis again')
        for i, c in enumerate(blocked):
            rc.lpush('tka:q%d' % i, 'after')
            self.assertEqual(resp_read_reply(c, timeout=5), [b'tka:q%d' % i, b'after'])
        self.assertEqual([c.getsockname() for c in clients + blocked], names)
        self.assertIsNone(ferry.proc.poll(), 'the old ferry exited')
        log = ferry.log()
        self.assertIn('takeover aborted', log)
        # Every loop serves on: none stopped once its clients were posted.
        self.assertNotIn('stopping (', log)
        # The workers' clients came back through the main loop.
        self.assertGreaterEqual(len(re.findall(r'takeover: client \d+ \S+ received', log)), 1,
                                log[-4000:])
        for c in clients + blocked:
            c.close()


class Connector:
    """Connects to ferry every 10 ms, PING, PONG, closes; notes every
    failure (a refused or unanswered connection)."""

    def __init__(self, port):
        self.port = port
        self.ports = []   # local ports of the connections answered
        self.errors = []
        self.done = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def start(self):
        self.thread.start()
        return self

    def run(self):
        while not self.done.wait(0.01):
            try:
                with socket.create_connection(('127.0.0.1', self.port), timeout=5) as c:
                    port = c.getsockname()[1]
                    resp_send(c, ['PING'])
                    if resp_read_reply(c, timeout=5) != 'PONG':
                        raise AssertionError('no PONG')
                    self.ports.append(port)
            except Exception as e:  # noqa: BLE001 - every failure is the finding
                self.errors.append('%.3f %r' % (time.monotonic(), e))

    def stop(self):
        self.done.set()
        self.thread.join(10)


def fake_new_process(sock_path):
    """Play a new process that goes away as soon as it said ACCEPTING:
    HELLO, the listeners received (and closed), then ACCEPTING on a socket
    already shut for reading, so that every send of the old process fails."""
    c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    c.settimeout(10)
    c.connect(sock_path)
    magic = b'ferry-takeover/2'
    hello = struct.pack('=I', len(magic)) + magic + struct.pack('=I', os.getpid())
    c.sendall(struct.pack('=II', len(hello), 1) + hello)  # TK_HELLO
    got = b''
    while len(got) < 8 or len(got) < 8 + struct.unpack('=I', got[:4])[0]:
        data, fds, _, _ = socket.recv_fds(c, 65536, 64)
        for fd in fds:
            os.close(fd)
        if not data:
            break
        got += data
    assert len(got) >= 8 and struct.unpack('=I', got[4:8])[0] & 0xffff == 2, got  # LISTENERS
    c.shutdown(socket.SHUT_RD)
    c.sendall(struct.pack('=II', 0, 3))  # TK_ACCEPTING
    c.close()


NOKEY = ('NOPERM this user has no permissions to access one of the keys used as arguments')


def blocked_as(client, user):
    """Redis clients of user blocked in BRPOP (CLIENT LIST on the master)."""
    return [c for c in client.client_list()
            if c.get('user') == user and c.get('cmd') == 'brpop' and 'b' in c.get('flags', '')]


@unittest.skipIf(harness.DIRECT, 'ferry-only: needs ferry in sentinel mode')
class TakeoverAclTest(AccountingChecks, unittest.TestCase):
    """client.auth redis: a takeover under producers and consumers that run
    as a Redis user keeps every client's user."""

    USERS = {'tq': ('tqpass', '~queue:*'), 'to': ('topass', '~other:*')}

    def test_takeover_keeps_redis_users(self):
        tmp = tempfile.mkdtemp(prefix='ferry-takeover-')
        self.addCleanup(shutil.rmtree, tmp, True)
        sock_path = os.path.join(tmp, 'takeover.sock')
        topo = SentinelTopology()
        self.addCleanup(topo.stop)
        for node in topo.redis:
            c = node.client(socket_timeout=5)
            for user, (pw, keys) in self.USERS.items():
                c.execute_command('ACL', 'SETUSER', user, 'reset', 'on', '>' + pw, keys,
                                  '+@list', '+wait')
            c.close()
        conf = dict(FERRY_CONF, takeover={'socket': sock_path}, client={'auth': 'redis'})
        ferry = Ferry(None, conf=conf, sentinel=topo)
        self.addCleanup(ferry.stop)
        old_pid = ferry.pid
        mc = topo.master().client(socket_timeout=5)
        mc.delete('queue:tk:load', 'queue:tk:a', 'queue:tk:r3', 'queue:tk:blk',
                  'queue:tk:pend', 'other:tk:pend', 'tk:b')
        mc.execute_command('ACL', 'LOG', 'RESET')

        def call(s, *args):
            resp_send(s, list(args))
            return resp_read_reply(s, 10)

        # RESP2 and RESP3 clients authenticated as tq, on raw sockets.
        a = ferry.raw()
        self.assertEqual(call(a, 'AUTH', 'tq', 'tqpass'), 'OK')
        self.assertEqual(call(a, 'RPUSH', 'queue:tk:a', 'before'), 1)
        r3 = ferry.raw()
        self.assertIsInstance(call(r3, 'HELLO', '3', 'AUTH', 'tq', 'tqpass'), dict)
        self.assertEqual(call(r3, 'RPUSH', 'queue:tk:r3', 'before'), 1)
        # A BRPOP blocked as tq: cancelled on Redis, re-issued as tq.
        blk = ferry.raw()
        self.assertEqual(call(blk, 'AUTH', 'tq', 'tqpass'), 'OK')
        resp_send(blk, ['BRPOP', 'queue:tk:blk', '0'])
        # A BRPOP with an AUTH as another user behind it: not handed over
        # before that AUTH is answered, then as the user it names.
        pend = ferry.raw()
        self.assertEqual(call(pend, 'AUTH', 'tq', 'tqpass'), 'OK')
        pend.sendall(resp_encode('BRPOP', 'queue:tk:pend', '0') +
                     resp_encode('AUTH', 'to', 'topass'))
        wait_until(lambda: len(blocked_as(mc, 'tq')) == 2, timeout=10,
                   msg='both BRPOPs blocked on the master as tq')
        ports = [s.getsockname() for s in (a, r3, blk, pend)]

        load = Load(ferry, 'tkacl', key='queue:tk:load',
                    client_kw={'username': 'tq', 'password': 'tqpass'}).start()
        self.addCleanup(load.stop)
        time.sleep(PRE_LOAD)

        t_fault = now()
        new = spawn_takeover(ferry.config_path, sock_path, ferry.out_path)
        nothers = 3 + load.producers + load.consumers

        def handed_so_far():
            return len([ln for ln in log_lines(ferry.log(), old_pid)
                        if 'closed: handed over to the new process' in ln])
        wait_until(lambda: handed_so_far() >= nothers, timeout=10,
                   msg='the other clients to be handed over')
        with self.subTest(check='a client with an AUTH waiting stays until it is answered'):
            self.assertIsNone(ferry.proc.poll(), 'the old ferry exited')
            self.assertEqual(handed_so_far(), nothers)
        mc.rpush('queue:tk:pend', 'served')
        self.assertEqual(resp_read_reply(pend, 10), [b'queue:tk:pend', b'served'])
        self.assertEqual(resp_read_reply(pend, 10), 'OK')
        try:
            old_rc = ferry.proc.wait(TAKEOVER_WAIT)
        except subprocess.TimeoutExpired:
            old_rc = None
        swap_to_new(self, topo, ferry, new, old_rc)
        res = load.finish(lambda: current_master(topo))
        res.t_fault = t_fault
        m = current_master(topo).client(socket_timeout=5)

        with self.subTest(check='the blocked BRPOP is re-issued as tq'):
            # The load's consumers have stopped: the one blocked now is blk's.
            wait_until(lambda: len(blocked_as(m, 'tq')) == 1, timeout=10,
                       msg='the BRPOP re-issued as tq')
            self.assertEqual([c for c in m.client_list() if c.get('cmd') == 'brpop'
                              and 'b' in c.get('flags', '')], blocked_as(m, 'tq'))
            m.rpush('queue:tk:blk', 'after')
            self.assertEqual(resp_read_reply(blk, 10), [b'queue:tk:blk', b'after'])
        with self.subTest(check='the RESP2 client runs as tq'):
            self.assertEqual(call(a, 'RPUSH', 'queue:tk:a', 'after'), 2)
            self.assertEqual(call(a, 'RPUSH', 'tk:b', 'x'), RespError(NOKEY))
        with self.subTest(check='the RESP3 client runs as tq, in RESP3'):
            resp_send(r3, ['RPUSH', 'queue:tk:r3', 'after'])
            self.assertEqual(resp_read_raw(r3), b':2\r\n')
            resp_send(r3, ['RPOP', 'queue:tk:none'])
            self.assertEqual(resp_read_raw(r3), b'_\r\n')
            self.assertEqual(call(r3, 'LPUSH', 'tk:b', 'x'), RespError(NOKEY))
        with self.subTest(check='the client whose AUTH was answered last runs as to'):
            self.assertEqual(call(pend, 'RPUSH', 'other:tk:pend', 'x'), 1)
            self.assertEqual(call(pend, 'RPUSH', 'queue:tk:pend', 'x'), RespError(NOKEY))
        with self.subTest(check='Redis names the user of the new process links'):
            self.assertEqual(m.exists('tk:b'), 0)
            self.assertEqual(m.lrange('queue:tk:a', 0, -1), ['before', 'after'])
            links = {int(c['id']): c['user'] for c in m.client_list()}
            # ... and nothing else was refused to the users (ferry runs
            # nothing a user may not on the user's links).
            log = [dict(zip(e[::2], e[1::2])) for e in m.execute_command('ACL', 'LOG')]
            self.assertEqual(sorted((e['reason'], e['username'], e['object']) for e in log),
                             [('key', 'to', 'queue:tk:pend'), ('key', 'tq', 'tk:b')], log)
            for e in log:
                info = dict(kv.split('=', 1) for kv in e['client-info'].split(' ') if '=' in kv)
                # the old process has exited: a link still open is the new one's
                self.assertEqual(links.get(int(info['id'])), e['username'], (e, links))
                self.assertEqual(info['user'], e['username'])
        with self.subTest(check='same sockets'):
            self.assertEqual([s.getsockname() for s in (a, r3, blk, pend)], ports)

        log = ferry.log()
        old_log = log_lines(log, old_pid)
        new_log = log_lines(log, new.pid)
        with self.subTest(check='the old process handed every client over and exited 0'):
            self.assertEqual(old_rc, 0)
            handed = re.search(r'takeover: all (\d+) client\(s\) handed over',
                               '\n'.join(old_log))
            self.assertIsNotNone(handed, '\n'.join(old_log[-40:]))
            self.assertEqual(int(handed.group(1)), nothers + 1)
        with self.subTest(check="blocked calls cancelled on Redis, not by closing the link"):
            # CLIENT UNBLOCK needs the user link's client id: an item Redis
            # pops as the link closes would be popped for nobody.
            began = [i for i, ln in enumerate(old_log) if 'takeover: a new process connected' in ln]
            self.assertEqual(len(began), 1)
            during = old_log[began[0]:]
            self.assertGreaterEqual(
                len([ln for ln in during if 'blocked call cancelled on Redis' in ln]), 1,
                '\n'.join(during[-40:]))
            self.assertEqual([ln for ln in during if 'its client left' in ln], [])
        with self.subTest(check='the new process received them with their users'):
            got = [ln for ln in new_log if re.search(r'takeover: client \d+ \S+ received', ln)]
            self.assertEqual(len(got), nothers + 1, '\n'.join(new_log[-40:]))
            self.assertEqual([ln for ln in got if ", user '" not in ln], [])
            self.assertEqual(len([ln for ln in got if "(RESP3, user 'tq'" in ln]), 1)
            self.assertEqual(len([ln for ln in got if "user 'to'" in ln]), 1)
            self.assertTrue(any("user 'tq'" in ln and 'blocked call' in ln for ln in got))
            accepted = [ln for ln in new_log if re.search(r' client \d+ \S+ connected$', ln)]
            self.assertEqual(accepted, [])
        with self.subTest(check='no password in any log'):
            out = log + ferry.output()
            for pw in ('tqpass', 'topass'):
                self.assertNotIn(pw, out)
        self.check_accounting(res, topo, ferry)
        for s in (a, r3, blk, pend):
            s.close()


    def test_client_auth_changed(self):
        """A new process whose client.auth differs closes the clients it
        cannot carry: one authenticated as a Redis user under client.auth
        ferry, one authenticated by ferry under client.auth redis (it would
        run as ferry's own user). The others go over."""
        tmp = tempfile.mkdtemp(prefix='ferry-takeover-')
        self.addCleanup(shutil.rmtree, tmp, True)
        sock_path = os.path.join(tmp, 'takeover.sock')
        redis_srv = harness.RedisServer()
        self.addCleanup(redis_srv.stop)
        redis_srv.client().execute_command('ACL', 'SETUSER', 'tq', 'reset', 'on', '>tqpass',
                                           '~queue:*', '+@list')
        ferry = Ferry(redis_srv, conf={'takeover': {'socket': sock_path},
                                       'client': {'auth': 'redis'}})
        self.addCleanup(ferry.stop)
        # Only ferry's own user may connect (client connections, passwords).
        self.assertEqual(os.stat(sock_path).st_mode & 0o777, 0o600)

        def call(s, *args):
            resp_send(s, list(args))
            return resp_read_reply(s, 10)

        def take_over(auth):
            conf = dict(ferry.conf, client={'auth': auth})
            path = os.path.join(tmp, 'ferry-%s.yml' % auth)
            with open(path, 'w') as f:
                f.write(render_yaml(conf))
            new = spawn_takeover(path, sock_path, ferry.out_path)
            old = ferry.proc
            try:
                self.assertEqual(old.wait(TAKEOVER_WAIT), 0)
            finally:
                ferry.proc, ferry.pid = new, new.pid
            wait_until(lambda: 'takeover: complete' in '\n'.join(log_lines(ferry.log(), new.pid)),
                       timeout=10, msg='the new process to be done')
            return log_lines(ferry.log(), new.pid)

        user = ferry.raw()
        self.assertEqual(call(user, 'AUTH', 'tq', 'tqpass'), 'OK')
        anon = ferry.raw()
        self.assertEqual(call(anon, 'PING'), RespError('NOAUTH Authentication required.'))
        new_log = take_over('ferry')
        with self.subTest(check='client.auth ferry: the Redis user client is closed'):
            user.settimeout(10)
            self.assertEqual(user.recv(100), b'')
            self.assertTrue(any("taken over authenticated as Redis user 'tq', but client.auth "
                                "is not redis here" in ln for ln in new_log), '\n'.join(new_log))
        with self.subTest(check='client.auth ferry: the other client goes on'):
            self.assertEqual(call(anon, 'PING'), 'PONG')
        by_ferry = ferry.raw()
        self.assertEqual(call(by_ferry, 'PING'), 'PONG')  # no client.password: authenticated
        new_log = take_over('redis')
        with self.subTest(check='client.auth redis: a client authenticated by ferry is closed'):
            by_ferry.settimeout(10)
            self.assertEqual(by_ferry.recv(100), b'')
            self.assertTrue(any('taken over authenticated by ferry, but client.auth is redis '
                                'here' in ln for ln in new_log), '\n'.join(new_log))
        with self.subTest(check='client.auth redis: a client never authenticated must AUTH'):
            self.assertEqual(call(anon, 'PING'), RespError('NOAUTH Authentication required.'))
            self.assertEqual(call(anon, 'AUTH', 'tq', 'tqpass'), 'OK')
            self.assertEqual(call(anon, 'RPUSH', 'tk:b', 'x'), RespError(NOKEY))
        for s in (user, anon, by_ferry):
            s.close()


@unittest.skipIf(harness.DIRECT, 'ferry-only')
@unittest.skipIf(harness.DIRECT, 'ferry-only')
class TakeoverHeldTest(unittest.TestCase):
    """A takeover while the master is down: clients whose requests ferry
    holds for a master (never sent) are handed over with those requests, and
    the new process sends them once the master is back; none is closed at
    shutdown_timeout_ms (before, the old process kept them until then and
    closed them: the chaos soak's client errors)."""

    def test_held_requests_go_over(self):
        tmp = tempfile.mkdtemp(prefix='ferry-takeover-')
        self.addCleanup(shutil.rmtree, tmp, True)
        sock_path = os.path.join(tmp, 'takeover.sock')
        redis_srv = harness.RedisServer()
        self.addCleanup(redis_srv.stop)
        ferry = Ferry(redis_srv, conf={'takeover': {'socket': sock_path},
                                       'shutdown_timeout_ms': 3000,
                                       'upstream': {'hold_timeout_ms': 60000}})
        self.addCleanup(ferry.stop)
        old_pid = ferry.pid

        def call(sk, *args):
            resp_send(sk, list(args))
            return resp_read_reply(sk, 10)

        a, b = ferry.raw(), ferry.raw()
        self.assertEqual(call(a, 'RPUSH', 'tkh:q', 'before'), 1)
        self.assertEqual(call(b, 'SELECT', '2'), 'OK')
        redis_srv.kill()
        # A pipeline of a push, a transaction and a read; a push in db 2.
        a.sendall(resp_encode('RPUSH', 'tkh:q', 'a1') + resp_encode('MULTI') +
                  resp_encode('RPUSH', 'tkh:q', 'a2') + resp_encode('EXEC') +
                  resp_encode('LRANGE', 'tkh:q', '0', '-1'))
        b.sendall(resp_encode('RPUSH', 'tkh:q2', 'b1'))
        time.sleep(0.5)   # read and held (the master is down: nothing to poll)
        new = spawn_takeover(ferry.config_path, sock_path, ferry.out_path)
        try:
            old_rc = ferry.proc.wait(TAKEOVER_WAIT)
        except subprocess.TimeoutExpired:
            old_rc = None
        old_log = '\n'.join(log_lines(ferry.log(), old_pid))
        ferry.proc, ferry.pid = new, new.pid
        self.assertEqual(old_rc, 0, old_log[-3000:])
        self.assertNotIn('not handed over within shutdown_timeout_ms', old_log)
        self.assertEqual(len(re.findall(r'request\(s\) held for a master, never sent: handed '
                                        r'over', old_log)), 2, old_log[-3000:])
        redis_srv.start(write_conf=False)
        self.assertEqual(resp_read_reply(a, 20), 2)
        self.assertEqual(resp_read_reply(a, 10), 'OK')
        self.assertEqual(resp_read_reply(a, 10), 'QUEUED')
        self.assertEqual(resp_read_reply(a, 10), [3])
        self.assertEqual(resp_read_reply(a, 10), [b'before', b'a1', b'a2'])
        self.assertEqual(resp_read_reply(b, 10), 1)
        c = redis_srv.client()
        self.assertEqual(c.lrange('tkh:q', 0, -1), ['before', 'a1', 'a2'])
        c.execute_command('SELECT', '2')
        self.assertEqual(c.lrange('tkh:q2', 0, -1), ['b1'])
        self.assertEqual(call(a, 'RPUSH', 'tkh:q', 'after'), 4)
        self.assertIsNone(new.poll())


class TakeoverRefusedTest(unittest.TestCase):

    def config(self, tmp, sock_path):
        path = os.path.join(tmp, 'new.yml')
        with open(path, 'w') as f:
            f.write(render_yaml({
                'listen': '127.0.0.1:%d' % free_port(),
                'stats': {'listen': '127.0.0.1:%d' % free_port()},
                'redis': {'address': '127.0.0.1:%d' % free_port()},
                'takeover': {'socket': sock_path},
            }))
        return path

    def run_takeover(self, cfg, sock_path):
        p = subprocess.run([FERRY_BIN, '-c', cfg, '--takeover', sock_path],
                           stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, timeout=30)
        return p.returncode, p.stdout.decode(errors='replace')

    def test_no_ferry_to_take_over(self):
        tmp = tempfile.mkdtemp(prefix='ferry-takeover-')
        self.addCleanup(shutil.rmtree, tmp, True)
        sock_path = os.path.join(tmp, 'takeover.sock')
        redis_srv = harness.RedisServer()
        self.addCleanup(redis_srv.stop)
        old = Ferry(redis_srv, conf={'takeover': {'socket': sock_path}})
        self.addCleanup(old.stop)
        self.assertTrue(os.path.exists(sock_path))
        cfg = self.config(tmp, sock_path)

        # Stopped cleanly: the socket file is gone with it.
        self.assertEqual(old.stop(), 0)
        self.assertFalse(os.path.exists(sock_path))
        t0 = time.monotonic()
        rc, out = self.run_takeover(cfg, sock_path)
        self.assertEqual(rc, 3, out)
        self.assertIn('takeover failed: cannot connect to %s: No such file or directory' % sock_path,
                      out)
        self.assertLess(time.monotonic() - t0, 5)

        # Killed: the socket file is left, nobody listens on it.
        old2 = Ferry(redis_srv, conf={'takeover': {'socket': sock_path}})
        self.addCleanup(old2.stop)
        old2.kill()
        self.assertTrue(os.path.exists(sock_path))
        rc, out = self.run_takeover(cfg, sock_path)
        self.assertEqual(rc, 3, out)
        self.assertIn('takeover failed: cannot connect to %s: Connection refused' % sock_path, out)


class PidProc:
    """A process this test did not start itself (a script or a shell did),
    with the Popen methods the harness uses to stop it. When it is a child
    of this process after all (a subreaper adopts orphans), its exit status
    is read; otherwise an exit reads as 0."""

    def __init__(self, pid):
        self.pid = pid
        self.returncode = None

    def poll(self):
        if self.returncode is not None:
            return self.returncode
        try:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid == self.pid:
                self.returncode = os.waitstatus_to_exitcode(status)
            return self.returncode
        except ChildProcessError:
            pass
        if not _running(self.pid):
            self.returncode = 0
        return self.returncode

    def send_signal(self, sig):
        if self.poll() is None:
            os.kill(self.pid, sig)

    def kill(self):
        self.send_signal(signal.SIGKILL)

    def wait(self, timeout=None):
        deadline = time.monotonic() + (timeout if timeout is not None else 60)
        while self.poll() is None:
            if time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired('ferry', timeout)
            time.sleep(0.05)
        return self.returncode


def read_pid(path):
    with open(path) as f:
        return int(f.read())


def _running(pid):
    try:
        with open('/proc/%d/stat' % pid) as f:
            return f.read().rsplit(')', 1)[1].split()[0] != 'Z'
    except (OSError, IndexError):
        return False


def run_script(args, timeout=SCRIPT_TIMEOUT):
    """scripts/rolling-restart ARGS: (exit status, output)."""
    p = subprocess.run([SCRIPT] + args, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, timeout=timeout)
    return p.returncode, p.stdout.decode(errors='replace')


@unittest.skipIf(harness.DIRECT, 'ferry-only: needs ferry in sentinel mode')
class TakeoverScriptTest(AccountingChecks, unittest.TestCase):
    """scripts/rolling-restart --ferry drives the takeover."""

    def start(self, conf_extra=None):
        tmp = tempfile.mkdtemp(prefix='ferry-takeover-')
        self.addCleanup(shutil.rmtree, tmp, True)
        topo = SentinelTopology()
        self.addCleanup(topo.stop)
        conf = dict(FERRY_CONF, takeover={'socket': os.path.join(tmp, 'takeover.sock')},
                    fallback={'path': os.path.join(tmp, 'fallback.db')})
        conf.update(conf_extra or {})
        ferry = Ferry(None, conf=conf, sentinel=topo)
        self.addCleanup(ferry.stop)
        pidfile = os.path.join(tmp, 'ferry.pid')
        with open(pidfile, 'w') as f:
            f.write('%d\n' % ferry.pid)
        return tmp, topo, ferry, pidfile

    def script_args(self, ferry, pidfile):
        return ['--ferry', '--ferry-instance', '%s:%s' % (ferry.config_path, pidfile),
                '--ferry-bin', FERRY_BIN, '--step-timeout', '30']

    def test_takeover_by_script_under_load(self):
        tmp, topo, ferry, pidfile = self.start()
        old_pid = ferry.pid
        mc = topo.master().client(socket_timeout=5)
        mc.delete('q', 'q2', 'tk:k')
        sel, blk, sub = open_kept_state(self, ferry, mc, 'tk', 'q2')
        ports = [s.getsockname() for s in (sel, blk, sub)]

        load = Load(ferry, 'takeover-script').start()
        self.addCleanup(load.stop)
        time.sleep(PRE_LOAD)
        t_fault = now()
        rc, out = run_script(self.script_args(ferry, pidfile))
        took = now() - t_fault
        print(out, flush=True)
        old_proc = ferry.proc
        try:
            old_rc = old_proc.wait(10)
        except subprocess.TimeoutExpired:
            old_rc = None
        new_pid = read_pid(pidfile)
        # From here on the harness stops the new process (by pid).
        ferry.proc, ferry.pid = PidProc(new_pid), new_pid
        self.assertEqual(rc, 0, out + self.diag(topo, ferry))
        self.assertEqual(old_rc, 0)
        self.assertNotEqual(new_pid, old_pid)
        self.assertIsNone(ferry.proc.poll(), 'the new ferry is not running')
        time.sleep(POST_LOAD)

        check_kept_state(self, topo, sel, blk, sub, 'tk', 'q2')
        with self.subTest(check='the clients keep their sockets'):
            self.assertEqual([s.getsockname() for s in (sel, blk, sub)], ports)

        res = load.finish(lambda: current_master(topo))
        res.t_fault = t_fault
        new_log = log_lines(ferry.log(), new_pid)
        print(res.summary('takeover-script'), flush=True)
        print('[takeover-script] the script took %.2fs; longest write gap %.0f ms during it, '
              '%.0f ms before it (baseline), %.0f ms over the run' % (
                  took, longest_gap(res, t_fault, t_fault + took),
                  longest_gap(res, load.t_start, t_fault - 0.001), res.gap_ms), flush=True)
        with self.subTest(check='the script reports the takeover'):
            self.assertRegex(out, r'pid %d exited 0 after [\d.]+s, \d+ client\(s\) handed over, '
                             r'0 closed after their replies; pid %d serves' % (old_pid, new_pid))
            self.assertRegex(out, r'done: 1 ferry instance\(s\) restarted in [\d.]+s')
        with self.subTest(check='nobody reconnected: the new process accepted one connection, '
                          'the script\'s PING'):
            accepted = [ln for ln in new_log if re.search(r' client \d+ \S+ connected$', ln)]
            self.assertEqual(len(accepted), 1, accepted)
        self.check_accounting(res, topo, ferry)
        for s in (sel, blk, sub):
            s.close()

    def test_script_checks(self):
        tmp, topo, ferry, pidfile = self.start()
        args = self.script_args(ferry, pidfile)
        with self.subTest(check='--dry-run changes nothing'):
            rc, out = run_script(args + ['--dry-run'], timeout=60)
            self.assertEqual(rc, 0, out)
            self.assertIn('dry run: nothing was changed', out)
            self.assertIn('--takeover %s' % os.path.join(tmp, 'takeover.sock'), out)
            self.assertTrue(ferry.running())
            self.assertEqual(read_pid(pidfile), ferry.pid)
            self.assertNotIn('takeover: a new process connected', ferry.log())
        with self.subTest(check='a ferry without takeover.socket is refused'):
            other = os.path.join(tmp, 'other.yml')
            with open(ferry.config_path) as f:
                text = f.read()
            with open(other, 'w') as f:
                f.write(re.sub(r'(?ms)^takeover:\n(\s+.*\n)*', '', text))
            rc, out = run_script(['--ferry', '--ferry-instance', '%s:%s' % (other, pidfile),
                                  '--ferry-bin', FERRY_BIN], timeout=60)
            self.assertEqual(rc, 1, out)
            self.assertIn('FAILED: other: takeover.socket is not set in %s' % other, out)
        with self.subTest(check='a pid file naming no process is refused'):
            dead = os.path.join(tmp, 'dead.pid')
            p = subprocess.Popen(['true'])
            p.wait()
            with open(dead, 'w') as f:
                f.write('%d\n' % p.pid)
            rc, out = run_script(['--ferry', '--ferry-instance', '%s:%s' % (
                ferry.config_path, dead), '--ferry-bin', FERRY_BIN], timeout=60)
            self.assertEqual(rc, 1, out)
            self.assertIn('is not running', out)
        with self.subTest(check='a new process that cannot start leaves the old one serving'):
            bad = os.path.join(tmp, 'bad-ferry')
            with open(bad, 'w') as f:
                f.write('#!/bin/sh\n[ "$1" = -t ] && exit 0\necho cannot start >&2\nexit 3\n')
            os.chmod(bad, 0o755)
            rc, out = run_script(['--ferry', '--ferry-instance', '%s:%s' % (
                ferry.config_path, pidfile), '--ferry-bin', bad, '--step-timeout', '10'],
                timeout=60)
            self.assertEqual(rc, 1, out)
            self.assertRegex(out, r'FAILED: ferry: the new process \(pid \d+\) exited with '
                             r'status 3 before pid %d was done; pid %d keeps serving'
                             % (ferry.pid, ferry.pid))
            self.assertTrue(ferry.running())
            self.assertEqual(read_pid(pidfile), ferry.pid)
            self.assertEqual(ferry.client().ping(), True)


UNIT = os.path.join(REPO, 'scripts', 'ferry.service')
RELOAD_TIMEOUT = 60          # s, one ExecReload command
PR_SET_CHILD_SUBREAPER = 36  # prctl(2)


def unit_commands(key, pid, conf, sock):
    """The unit's KEY= command lines (ExecStart, ExecReload, ...) as argv
    lists, with what systemd replaces in them ($MAINPID, $$) and the unit's
    paths replaced by this test's."""
    out = []
    with open(UNIT) as f:
        for line in f:
            if not line.startswith(key + '='):
                continue
            text = line[len(key) + 1:].strip()
            text = text.replace('$$', '\0').replace('$MAINPID', str(pid)).replace('\0', '$')
            text = (text.replace('/usr/local/bin/ferry', FERRY_BIN)
                    .replace('/etc/ferry/ferry.yml', conf)
                    .replace('/run/ferry/takeover.sock', sock))
            out.append(shlex.split(text))
    return out


@unittest.skipIf(harness.DIRECT, 'ferry-only')
class TakeoverSystemdReloadTest(unittest.TestCase):
    """scripts/ferry.service's ExecReload, run by hand against a ferry
    started as its ExecStart starts it (Type=notify: NOTIFY_SOCKET set):
    the reload exits 0 once the old process has exited (0), the new process
    told systemd MAINPID=<its pid>, and a client keeps its connection; with
    no takeover socket the reload fails (exit 1) and the old ferry serves."""

    def start(self, tmp, takeover):
        redis_srv = harness.RedisServer()
        self.addCleanup(redis_srv.stop)
        sock = os.path.join(tmp, 'takeover.sock')
        port = free_port()
        conf = os.path.join(tmp, 'ferry.yml')
        with open(conf, 'w') as f:
            f.write(render_yaml({
                'listen': '127.0.0.1:%d' % port,
                'stats': {'listen': '127.0.0.1:%d' % free_port()},
                'redis': {'address': '127.0.0.1:%d' % redis_srv.port},
                'log': {'level': 'debug', 'file': os.path.join(tmp, 'ferry.log')},
                'takeover': {'socket': sock if takeover else ''},
            }))
        notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.addCleanup(notify.close)
        self.notify_path = os.path.join(tmp, 'notify.sock')
        notify.bind(self.notify_path)
        notify.settimeout(0.2)
        [argv] = unit_commands('ExecStart', 0, conf, sock)
        for pre in unit_commands('ExecStartPre', 0, conf, sock):
            self.assertEqual(subprocess.run(pre, stdout=subprocess.DEVNULL, timeout=30).returncode,
                             0, pre)
        proc = harness._spawn(argv, os.path.join(tmp, 'ferry.out'),
                              env=dict(os.environ, NOTIFY_SOCKET=self.notify_path))
        self.addCleanup(harness._terminate, proc)
        self.assertIn('READY=1', self.notifications(notify, 'READY=1'))
        cli = socket.create_connection(('127.0.0.1', port), timeout=10)
        self.addCleanup(cli.close)
        resp_send(cli, ['SET', 'sd:k', 'before'])
        self.assertEqual(resp_read_reply(cli), 'OK')
        return conf, sock, proc, notify, cli

    def notifications(self, notify, until, timeout=10):
        got = []
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not any(until in m for m in got):
            try:
                got.append(notify.recv(4096).decode())
            except socket.timeout:
                pass
        return '\n'.join(got)

    def reload(self, main, conf, sock, tmp):
        """Run the ExecReload lines as systemd does, one after the other
        until one fails; meanwhile reap main (the service's main process)
        once it exits, as systemd, its parent, would. Returns their exit
        statuses."""
        rcs = []
        for argv in unit_commands('ExecReload', main.pid, conf, sock):
            with open(os.path.join(tmp, 'reload.out'), 'ab') as out:
                # With NotifyAccess=all systemd passes NOTIFY_SOCKET to
                # ExecReload too: the new process reports MAINPID through it.
                p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out,
                                     stderr=subprocess.STDOUT, env=dict(
                                         os.environ, NOTIFY_SOCKET=self.notify_path))
            deadline = time.monotonic() + RELOAD_TIMEOUT
            while p.poll() is None and time.monotonic() < deadline:
                main.poll()
                time.sleep(0.02)
            if p.poll() is None:
                p.kill()
                p.wait()
                self.fail('ExecReload still running after %ds: %r' % (RELOAD_TIMEOUT, argv))
            rcs.append(p.returncode)
            if p.returncode != 0:
                break
        return rcs

    def setUp(self):
        # Orphans (the process a reload starts, once its shell has exited)
        # become this process's children, so their exit is seen and reaped
        # here as systemd would (and not left to whatever init runs here).
        if harness._libc is not None:
            harness._libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
            self.addCleanup(harness._libc.prctl, PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)
        self.tmp = tempfile.mkdtemp(prefix='ferry-sd-')
        self.addCleanup(shutil.rmtree, self.tmp, True)
        self.addCleanup(self.stop_strays)

    def stop_strays(self):
        """A ferry a failed reload left running: found by this test's own
        directory in its command line, stopped by pid."""
        for d in os.listdir('/proc'):
            if not d.isdigit():
                continue
            try:
                with open('/proc/%s/cmdline' % d, 'rb') as f:
                    cmd = f.read().decode(errors='replace')
            except OSError:
                continue
            if self.tmp in cmd and '--takeover' in cmd:
                harness._terminate(PidProc(int(d)), signal.SIGKILL)

    def test_reload_is_a_takeover(self):
        tmp = self.tmp
        conf, sock, old, notify, cli = self.start(tmp, takeover=True)
        port = cli.getsockname()
        t0 = now()
        rcs = self.reload(old, conf, sock, tmp)
        took = now() - t0
        msgs = self.notifications(notify, 'MAINPID=')
        m = re.search(r'MAINPID=(\d+)', msgs)
        self.assertIsNotNone(m, msgs)
        new = PidProc(int(m.group(1)))
        self.addCleanup(harness._terminate, new)
        print('[systemd reload] ExecReload exit codes %r in %.2fs' % (rcs, took), flush=True)
        self.assertEqual(rcs, [0, 0])
        self.assertEqual(old.wait(5), 0)
        self.assertNotEqual(new.pid, old.pid)
        self.assertIsNone(new.poll())
        resp_send(cli, ['GET', 'sd:k'])
        self.assertEqual(resp_read_reply(cli), b'before')
        self.assertEqual(cli.getsockname(), port)
        log = harness._read(os.path.join(tmp, 'ferry.log'))
        self.assertRegex(log, r'\S+ %d INFO  takeover: all 1 client\(s\) handed over' % old.pid)
        # A second reload takes over from the process that took over.
        rcs = self.reload(new, conf, sock, tmp)
        self.assertEqual(rcs, [0, 0])
        m2 = re.search(r'MAINPID=(\d+)', self.notifications(notify, 'MAINPID='))
        self.assertIsNotNone(m2)
        newer = PidProc(int(m2.group(1)))
        self.addCleanup(harness._terminate, newer)
        self.assertIsNotNone(new.poll())
        resp_send(cli, ['GET', 'sd:k'])
        self.assertEqual(resp_read_reply(cli), b'before')

    def test_reload_without_takeover_socket_fails(self):
        tmp = self.tmp
        conf, sock, old, notify, cli = self.start(tmp, takeover=False)
        rcs = self.reload(old, conf, sock, tmp)
        self.assertEqual(rcs, [0, 1])
        self.assertIsNone(old.poll())
        resp_send(cli, ['GET', 'sd:k'])
        self.assertEqual(resp_read_reply(cli), b'before')
        self.assertNotIn('MAINPID=', self.notifications(notify, 'MAINPID=', timeout=0.5))


if __name__ == '__main__':
    unittest.main()
