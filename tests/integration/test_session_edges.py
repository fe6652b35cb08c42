"""Edges of a client session that fuzz_session (tests/fuzz) found, checked
against real Redis: transactions pipelined with writes under
durability.replicas_ack, a request stranded behind a DISCARD whose link was
lost, and a master that refuses new connections while one stays open.

Run: python3 -m unittest test_session_edges -v
"""
import os
import socket
import tempfile
import time
import unittest

from harness import (DIRECT, Ferry, RedisServer, RespError, resp_encode, resp_read_reply, resp_send,
                     wait_until)
from modes import FixedMasterMode, SentinelMode, key_prefix, sentinel_first
from test_stats import stats_json

load_tests = sentinel_first

PROMPT_S = 4.0  # replies that need no retry come well within this


def connect(ferry):
    s = socket.create_connection(('127.0.0.1', ferry.port), timeout=10)
    return s


def send_all(sock, *commands):
    """Several commands in one write (a pipeline)."""
    sock.sendall(b''.join(resp_encode(*c) for c in commands))


def replies(sock, n, timeout=PROMPT_S):
    deadline = time.monotonic() + timeout
    out = []
    for _ in range(n):
        out.append(resp_read_reply(sock, timeout=max(0.1, deadline - time.monotonic())))
    return out


class TransactionChecks:
    """Transactions pipelined with writes. In Sentinel mode replicas_ack is
    1: ferry's WAIT for a write must never be queued inside the client's
    MULTI (Redis would answer it +QUEUED, ferry would hold the write's reply
    until hold_timeout_ms, and EXEC would hand the WAITs' results to the
    client)."""

    def session(self):
        s = connect(self.ferry)
        self.addCleanup(s.close)
        # SELECT 1 pins the session to a dedicated link: the write and the
        # MULTI below travel on one connection.
        resp_send(s, ['SELECT', '1'])
        self.assertEqual(resp_read_reply(s), 'OK')
        return s

    def test_write_then_multi_in_one_pipeline(self):
        k = key_prefix(self)
        s = self.session()
        send_all(s, ['SET', k + ':a', '1'], ['MULTI'], ['SET', k + ':b', '2'])
        self.assertEqual(replies(s, 3), ['OK', 'OK', 'QUEUED'], self.diag())
        resp_send(s, ['EXEC'])
        self.assertEqual(resp_read_reply(s, timeout=PROMPT_S), ['OK'], self.diag())

    def test_two_transactions_in_one_pipeline(self):
        k = key_prefix(self)
        s = self.session()
        send_all(s, ['MULTI'], ['SET', k + ':c', '1'], ['EXEC'], ['MULTI'], ['SET', k + ':d', '2'])
        self.assertEqual(replies(s, 5), ['OK', 'QUEUED', ['OK'], 'OK', 'QUEUED'], self.diag())
        resp_send(s, ['EXEC'])
        self.assertEqual(resp_read_reply(s, timeout=PROMPT_S), ['OK'], self.diag())
        c = self.master().client(db=1)
        self.assertEqual((c.get(k + ':c'), c.get(k + ':d')), ('1', '2'))

    def lost_mid_reply(self, name, cmds, big):
        """cmds in one write on a pinned session named name, ferry's link
        killed from the master while the first one's large reply is on its
        way; returns (the replies, large ones as their length; whether ferry
        sent requests again: the link was lost mid-way)."""
        s = self.session()
        resp_send(s, ['CLIENT', 'SETNAME', name])  # sticky: the link is found by it
        self.assertEqual(resp_read_reply(s), 'OK')
        before = stats_json(self.ferry.stats_port)['errors']['requests_retried']
        send_all(s, *cmds)
        mc = self.master().client()
        for c in mc.client_list():
            if c.get('name') == name:
                mc.client_kill_filter(_id=c['id'])
        got = replies(s, len(cmds), timeout=30)
        retried = stats_json(self.ferry.stats_port)['errors']['requests_retried'] > before
        return [len(x) if isinstance(x, bytes) and len(x) == big else x for x in got], retried

    def ahead_of_multi(self, watched):
        """A request pipelined ahead of a transaction, unanswered when the
        link carrying them is lost (its large reply still on the way): sent
        again, it must go ahead of the rebuilt MULTI, not inside it. It was
        sent after the MULTI ferry rebuilt first: GET answered +QUEUED, and
        ran inside the transaction (or, watched, was answered +QUEUED by
        ferry itself, and the WATCH behind it answered an error)."""
        k = key_prefix(self)
        big = 'x' * (16 << 20)
        self.master().client(db=1).set(k + ':big', big)
        happened = 0
        for attempt in range(6):
            cmds = [['GET', k + ':big']] + ([['WATCH', k + ':w']] if watched else []) + [
                ['MULTI'], ['SET', k + ':t', str(attempt)], ['EXEC']]
            got, retried = self.lost_mid_reply('ahead%d' % attempt, cmds, len(big))
            happened += retried
            exec_reply = got[-1]
            self.assertEqual(got[:-1], [len(big)] + (['OK'] if watched else []) + ['OK', 'QUEUED'],
                             self.diag())
            # Watched, a transaction whose link was lost ends in a watch
            # conflict (null); else it ran, once rebuilt if need be.
            self.assertIn(exec_reply, (['OK'], None) if watched else (['OK'],), self.diag())
            if retried and not watched:
                self.assertEqual(self.master().client(db=1).get(k + ':t'), str(attempt))
            if happened:
                break
        self.assertTrue(happened, 'never lost the link while the large reply was on its way')

    def test_request_ahead_of_a_select_lost_with_its_link(self):
        """The same ahead of a SELECT: sent again, a request goes to the db
        it was sent in. It went to the db the SELECT behind it chose (the
        link was lent in the session's db): GET answered nil, SET written
        in both dbs."""
        k = key_prefix(self)
        big = 'x' * (16 << 20)
        self.master().client(db=1).set(k + ':big', big)
        happened = 0
        for attempt in range(6):
            a, b = '%s:a%d' % (k, attempt), '%s:b%d' % (k, attempt)
            cmds = [['GET', k + ':big'], ['SET', a, '1'], ['SELECT', '2'], ['SET', b, '1']]
            got, retried = self.lost_mid_reply('sel%d' % attempt, cmds, len(big))  # in db 1
            happened += retried
            self.assertEqual(got, [len(big), 'OK', 'OK', 'OK'], self.diag())
            db1, db2 = self.master().client(db=1), self.master().client(db=2)
            self.assertEqual((db1.exists(a), db2.exists(a), db1.exists(b), db2.exists(b)),
                             (1, 0, 0, 1), 'each SET in the db it was sent in')
            if happened:
                break
        self.assertTrue(happened, 'never lost the link while the large reply was on its way')

    def test_request_ahead_of_a_transaction_lost_with_its_link(self):
        self.ahead_of_multi(watched=False)

    def test_request_ahead_of_a_watched_transaction_lost_with_its_link(self):
        self.ahead_of_multi(watched=True)


@unittest.skipIf(DIRECT, 'ferry only')
class SentinelTransactions(SentinelMode, TransactionChecks, unittest.TestCase):
    pass


@unittest.skipIf(DIRECT, 'ferry only')
class FixedMasterTransactions(FixedMasterMode, TransactionChecks, unittest.TestCase):
    pass


@unittest.skipIf(DIRECT, 'ferry only')
class NoReplicasInMultiTest(unittest.TestCase):
    def test_write_refused_inside_multi(self):
        # min-replicas-to-write 1 and no replica: Redis refuses writes with
        # NOREPLICAS, inside a MULTI too, and EXEC then aborts. The link
        # stays: ferry passes the refusal on as Redis gave it (retrying it
        # once held ferry's view of the MULTI wrong, and the EXEC after it
        # failed an assertion: ferry aborted).
        r = RedisServer(conf={'min-replicas-to-write': 1})
        self.addCleanup(r.stop)
        f = Ferry(r)
        self.addCleanup(f.stop)
        s = connect(f)
        self.addCleanup(s.close)
        send_all(s, ['MULTI'], ['SET', 'edge:nr', '1'])
        multi, refused = replies(s, 2)
        self.assertEqual(multi, 'OK')
        self.assertIsInstance(refused, RespError)
        self.assertTrue(str(refused).startswith('NOREPLICAS'), refused)
        resp_send(s, ['EXEC'])
        aborted = resp_read_reply(s, timeout=PROMPT_S)
        self.assertIsInstance(aborted, RespError)
        self.assertTrue(str(aborted).startswith('EXECABORT'), aborted)
        send_all(s, ['MULTI'], ['GET', 'edge:nr'], ['EXEC'])
        self.assertEqual(replies(s, 3), ['OK', 'QUEUED', [None]])


@unittest.skipIf(DIRECT, 'ferry only')
class LostDiscardTest(unittest.TestCase):
    def test_watch_behind_a_lost_discard_is_served(self):
        # DISCARD (no MULTI: the shared link) and WATCH (a dedicated link:
        # it waits until DISCARD has left the shared one) in one write to a
        # frozen master. The health probe gives the master up, the fence
        # gives the DISCARD up and ferry answers it; once the master is
        # back the WATCH must still be sent.
        r = RedisServer()
        self.addCleanup(r.stop)
        f = Ferry(r, conf={'upstream': {'health_timeout_ms': 1000, 'ping_interval_ms': 200,
                                        'fence_timeout_ms': 300, 'hold_timeout_ms': 30000}})
        self.addCleanup(f.stop)
        s = connect(f)
        self.addCleanup(s.close)
        resp_send(s, ['PING'])
        self.assertEqual(resp_read_reply(s), 'PONG')
        r.sigstop()
        try:
            send_all(s, ['DISCARD'], ['WATCH', 'edge:w'])
            # ferry answers DISCARD itself once it lets the frozen master go.
            self.assertEqual(resp_read_reply(s, timeout=15), 'OK')
        finally:
            r.sigcont()
        self.assertEqual(resp_read_reply(s, timeout=15), 'OK')
        send_all(s, ['MULTI'], ['SET', 'edge:w', '1'], ['EXEC'])
        self.assertEqual(replies(s, 3, timeout=10), ['OK', 'QUEUED', ['OK']])


@unittest.skipIf(DIRECT, 'ferry only')
class RefusedConnectTest(unittest.TestCase):
    def test_no_busy_loop_when_new_connections_are_refused(self):
        # Redis on a unix socket: renaming the socket file makes every new
        # connection fail at once while ferry's shared link stays open. A
        # BLPOP needs a dedicated link: ferry must count that as a lost
        # master (and retry with its backoff), not open a link per loop turn.
        d = tempfile.mkdtemp(prefix='ferry-edge-')
        path = os.path.join(d, 'redis.sock')
        r = RedisServer(conf={'unixsocket': path, 'unixsocketperm': 700})
        self.addCleanup(r.stop)
        f = Ferry(r, conf={'redis': {'address': 'unix:' + path},
                           'upstream': {'hold_timeout_ms': 30000}})
        self.addCleanup(f.stop)
        s = connect(f)
        self.addCleanup(s.close)
        resp_send(s, ['SET', 'edge:q', 'x'])
        self.assertEqual(resp_read_reply(s), 'OK')
        resp_send(s, ['DEL', 'edge:q'])
        self.assertEqual(resp_read_reply(s), 1)

        moved = path + '.away'
        os.rename(path, moved)
        try:
            before = stats_json(f.stats_port)['upstream']['links_opened']
            resp_send(s, ['BLPOP', 'edge:q', '0'])

            def opened():
                return stats_json(f.stats_port)['upstream']['links_opened'] - before
            # ferry lets the master go (and backs off), or spins: either
            # shows within the deadline.
            wait_until(lambda: stats_json(f.stats_port)['upstream']['upstream_state'] != 'UP'
                       or opened() > 1000, timeout=10, msg='master view left UP')
            self.assertLess(opened(), 50, 'links opened with connections refused')
        finally:
            os.rename(moved, path)
        r.client().rpush('edge:q', 'item')
        self.assertEqual(resp_read_reply(s, timeout=15), [b'edge:q', b'item'])


if __name__ == '__main__':
    unittest.main()


@unittest.skipIf(DIRECT, 'ferry only')
class TryagainInsideMultiTest(unittest.TestCase):
    def test_a_command_past_the_hold_bound_aborts_exec(self):
        # A command of an open MULTI that ferry answers -TRYAGAIN (no master
        # within hold_timeout_ms) was never queued: EXEC must abort, as
        # Redis' EXEC does after a refused command. Before: the transaction
        # was rebuilt on the master that came back without it and EXEC ran
        # the rest (INCR applied, SET missing).
        r = RedisServer()
        self.addCleanup(r.stop)
        f = Ferry(r, conf={'upstream': {'hold_timeout_ms': 500}})
        self.addCleanup(f.stop)
        s = connect(f)
        self.addCleanup(s.close)
        send_all(s, ['DEL', 'edge:ta', 'edge:tb'], ['MULTI'], ['INCR', 'edge:ta'])
        self.assertEqual(replies(s, 3), [0, 'OK', 'QUEUED'])
        r.kill()
        resp_send(s, ['SET', 'edge:tb', '1'])
        refused = resp_read_reply(s, timeout=10)
        self.assertTrue(str(refused).startswith('TRYAGAIN'), refused)
        r.restart()
        c = f.client(socket_timeout=10)
        self.addCleanup(c.close)
        wait_until(lambda: c.set('edge:probe', '1'), timeout=20, interval=0.1,
                   msg='ferry serving the restarted master')
        resp_send(s, ['EXEC'])
        aborted = resp_read_reply(s, timeout=10)
        self.assertTrue(str(aborted).startswith('EXECABORT'), aborted)
        self.assertEqual((c.get('edge:ta'), c.get('edge:tb')), (None, None))
        send_all(s, ['MULTI'], ['INCR', 'edge:ta'], ['EXEC'])
        self.assertEqual(replies(s, 3), ['OK', 'QUEUED', [1]])

    def test_a_refused_command_still_aborts_a_rebuilt_transaction(self):
        # Redis refused a command of the open MULTI (wrong arity): its EXEC
        # would abort. The master is lost and the transaction rebuilt on the
        # next one from the commands Redis had queued: EXEC must still
        # abort. Before: it ran the rest there (INCR applied).
        r = RedisServer()
        self.addCleanup(r.stop)
        f = Ferry(r, conf={'upstream': {'hold_timeout_ms': 20000}})
        self.addCleanup(f.stop)
        s = connect(f)
        self.addCleanup(s.close)
        send_all(s, ['DEL', 'edge:tr'], ['MULTI'], ['INCR', 'edge:tr'], ['ECHO'])
        got = replies(s, 4)
        self.assertEqual(got[:3], [0, 'OK', 'QUEUED'])
        self.assertIn('wrong number of arguments', str(got[3]))
        r.kill()
        r.restart()
        c = f.client(socket_timeout=10)
        self.addCleanup(c.close)
        wait_until(lambda: c.set('edge:probe', '1'), timeout=20, interval=0.1,
                   msg='ferry serving the restarted master')
        resp_send(s, ['EXEC'])
        aborted = resp_read_reply(s, timeout=10)
        self.assertTrue(str(aborted).startswith('EXECABORT'), aborted)
        self.assertIsNone(c.get('edge:tr'))
