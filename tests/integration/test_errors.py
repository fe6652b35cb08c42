"""Errors ferry writes in Redis' place are Redis' own bytes.

Each check plays one case twice, against the master directly and through
ferry, and compares the raw replies byte for byte (Redis 7.0.15 is the
reference: the redis-server the tests run). Errors that are ferry's own
(they name ferry) are listed in docs/commands.md, "Errors ferry writes
itself", and are not compared here.

Run: python3 -m unittest test_errors -v
"""
import socket
import unittest

from harness import Ferry, RedisServer, resp_encode, resp_read_raw, wait_until
from harness import SentinelTopology
from modes import FixedMasterMode, SentinelMode, key_prefix, sentinel_first

LOOP = 'local i = 0 while true do i = i + 1 end'
BUSY_MS = 100


def connect(port):
    return socket.create_connection(('127.0.0.1', port), timeout=5)


class Conn:
    """One client connection that records every raw reply it reads."""

    def __init__(self, test, port):
        self.sock = connect(port)
        test.addCleanup(self.sock.close)

    def ask(self, *args):
        self.sock.sendall(resp_encode(*args))
        return resp_read_raw(self.sock, timeout=10.0)

    def send_raw(self, data):
        self.sock.sendall(data)
        return resp_read_raw(self.sock, timeout=10.0)


class Checks:

    def same(self, case):
        """case(port) -> list of raw replies; equal directly and through ferry."""
        direct = case(self.master().port)
        through = case(self.ferry.port)
        self.assertEqual(through, direct, 'through ferry vs. Redis directly\n%s' % self.diag())
        return direct

    # --- a script past lua-time-limit while a transaction is open ---------

    def _busy_setup(self):
        direct = self.master().client()
        old = direct.config_get('lua-time-limit')['lua-time-limit']
        direct.config_set('lua-time-limit', BUSY_MS)
        self.addCleanup(direct.config_set, 'lua-time-limit', old)
        self.addCleanup(self._settle)

    def _settle(self):
        """End a script a failed check left running; wait until Redis serves."""
        direct = self.master().client(socket_timeout=2)

        def settled():
            try:
                direct.script_kill()
            except Exception:
                pass
            try:
                return direct.ping()
            except Exception:
                return False
        wait_until(settled, timeout=10, msg='Redis still busy')

    def _start_loop(self, port):
        runner = Conn(self, port)
        runner.sock.sendall(resp_encode('EVAL', LOOP, '0'))
        probe = self.master().client(socket_timeout=2)

        def busy():
            try:
                probe.ping()
                return False
            except Exception as e:
                return 'BUSY' in str(e)
        wait_until(busy, timeout=10, msg='Redis never got busy')
        return runner

    def _kill_loop(self, runner):
        self.master().client(socket_timeout=5).script_kill()
        resp_read_raw(runner.sock, timeout=10.0)  # the script's own -ERR, killed
        self._settle()

    def test_exec_while_busy_after_a_queued_command_got_busy(self):
        """Redis' unit/multi "EXEC and script timeout": EXEC itself is
        refused -BUSY, so Redis aborts with the refusal's words."""
        self._busy_setup()
        k = key_prefix(self)

        def case(port):
            c = Conn(self, port)
            out = [c.ask('SET', k, '1'), c.ask('MULTI'), c.ask('INCR', k)]
            runner = self._start_loop(port)
            out += [c.ask('INCR', k), c.ask('EXEC')]
            self._kill_loop(runner)
            out += [c.ask('GET', k), c.ask('PING', 'asdf')]
            return out
        got = self.same(case)
        self.assertEqual(got[4], b'-EXECABORT Transaction discarded because of: BUSY Redis is '
                         b'busy running a script. You can only call SCRIPT KILL or SHUTDOWN '
                         b'NOSAVE.\r\n')

    def test_exec_while_busy(self):
        """unit/multi "just EXEC and script timeout"."""
        self._busy_setup()
        k = key_prefix(self)

        def case(port):
            c = Conn(self, port)
            out = [c.ask('SET', k, '1'), c.ask('MULTI'), c.ask('INCR', k)]
            runner = self._start_loop(port)
            out.append(c.ask('EXEC'))
            self._kill_loop(runner)
            out += [c.ask('GET', k), c.ask('PING', 'asdf')]
            return out
        self.same(case)

    def test_exec_after_busy_ended(self):
        """unit/multi "MULTI-EXEC body and script timeout": the script
        is gone by EXEC: Redis aborts for the earlier refusal."""
        self._busy_setup()
        k = key_prefix(self)

        def case(port):
            c = Conn(self, port)
            out = [c.ask('SET', k, '1'), c.ask('MULTI'), c.ask('INCR', k)]
            runner = self._start_loop(port)
            out.append(c.ask('INCR', k))
            self._kill_loop(runner)
            out += [c.ask('EXEC'), c.ask('GET', k), c.ask('PING', 'asdf')]
            return out
        got = self.same(case)
        self.assertEqual(got[4], b'-EXECABORT Transaction discarded because of previous '
                         b'errors.\r\n')


    # --- every other error ferry writes in Redis' words ---------------------

    def test_errors_ferry_writes_for_redis(self):
        """Each case's replies, one connection each, directly and through
        ferry; a raw case also asserts that the connection is then closed
        (Redis closes it after a protocol error)."""
        k = key_prefix(self)
        for name, steps in error_cases(k):
            with self.subTest(case=name):
                def case(port):
                    self.master().client().delete(k)
                    c = Conn(self, port)
                    out = []
                    for step in steps:
                        if isinstance(step, bytes):
                            out.append(c.send_raw(step))
                            out.append(closed(c.sock))
                        else:
                            out.append(c.ask(*step))
                    return out
                self.same(case)


    def test_client_unblock_error(self):
        """CLIENT UNBLOCK <id> ERROR of a blocked BLPOP: Redis' -UNBLOCKED."""
        k = key_prefix(self)

        def case(port):
            self.master().client().delete(k)
            blocked, other = Conn(self, port), Conn(self, port)
            cid = blocked.ask('CLIENT', 'ID').strip()[1:]
            blocked.sock.sendall(resp_encode('BLPOP', k, '0'))
            wait_until(lambda: other.ask('CLIENT', 'UNBLOCK', cid, 'ERROR') == b':1\r\n',
                       timeout=10, msg='the BLPOP never blocked')
            return [resp_read_raw(blocked.sock, timeout=10.0), blocked.ask('PING')]
        self.same(case)


def closed(sock):
    """b'closed' once the peer closed the connection, else what it sent."""
    sock.settimeout(10)
    try:
        data = sock.recv(100)
    except OSError as e:
        return ('error', str(e))
    return data or b'closed'


def error_cases(k):
    """(name, steps): a step is a command (a tuple) or raw bytes a client
    sends (a protocol error: Redis answers and closes the connection)."""
    q1, q2 = k + '.q1', k + '.q2'
    return [
        # transactions
        ('MULTI nested', [('MULTI',), ('MULTI',), ('DISCARD',)]),
        ('WATCH inside MULTI', [('MULTI',), ('WATCH', k), ('DISCARD',)]),
        ('EXEC without MULTI', [('EXEC',)]),
        ('DISCARD without MULTI', [('DISCARD',)]),
        ('a command never allowed in MULTI',
         [('MULTI',), ('SET', k, '1'), ('SHUTDOWN',), ('EXEC',), ('GET', k)]),
        ('an unknown command in MULTI',
         [('MULTI',), ('SET', k, '2'), ('NOSUCHCMD', 'a'), ('EXEC',), ('GET', k)]),
        ('a wrong arity in MULTI', [('MULTI',), ('GET',), ('EXEC',)]),
        ('WRONGTYPE in MULTI',
         [('LPUSH', k, 'x'), ('MULTI',), ('GET', k), ('EXEC',)]),
        # SELECT
        ('SELECT not an integer', [('SELECT', 'abc')]),
        ('SELECT out of range', [('SELECT', '99999')]),
        ('SELECT negative', [('SELECT', '-1')]),
        # HELLO, AUTH (no password anywhere)
        ('HELLO 4', [('HELLO', '4')]),
        ('HELLO not an integer', [('HELLO', 'abc')]),
        ('HELLO bad option', [('HELLO', '2', 'FOO')]),
        ('HELLO 1', [('HELLO', '1')]),
        ('HELLO bad option after AUTH', [('HELLO', '3', 'AUTH', 'default', 'x', 'NOPE', 'y')]),
        ('HELLO AUTH of another user', [('HELLO', '2', 'AUTH', 'nosuchuser', 'x')]),
        ('AUTH without a password set', [('AUTH', 'nope')]),
        ('AUTH default without a password set', [('AUTH', 'default', 'nope')]),
        # CLIENT
        ('CLIENT LIST TYPE unknown', [('CLIENT', 'LIST', 'TYPE', 'nope')]),
        ('CLIENT LIST bad', [('CLIENT', 'LIST', 'FOO')]),
        ('CLIENT KILL addr unknown', [('CLIENT', 'KILL', '1.2.3.4:5')]),
        ('CLIENT KILL ID 0', [('CLIENT', 'KILL', 'ID', '0')]),
        ('CLIENT KILL ID not a number', [('CLIENT', 'KILL', 'ID', 'abc')]),
        ('CLIENT KILL bad filter', [('CLIENT', 'KILL', 'FOO', 'bar')]),
        ('CLIENT KILL odd arguments', [('CLIENT', 'KILL', 'ID', '1', 'SKIPME')]),
        ('CLIENT UNBLOCK not a number', [('CLIENT', 'UNBLOCK', 'abc')]),
        ('CLIENT UNBLOCK bad reason', [('CLIENT', 'UNBLOCK', '1', 'FOO')]),
        ('CLIENT SETNAME with a space', [('CLIENT', 'SETNAME', 'a b')]),
        ('CLIENT unknown subcommand', [('CLIENT', 'NOPE')]),
        # arity and unknown commands
        ('PING arity', [('PING', 'a', 'b')]),
        ('ECHO arity', [('ECHO',)]),
        ('GET arity', [('GET',)]),
        ('unknown command', [('NOSUCHCMD', 'a', 'b')]),
        ('CONFIG unknown subcommand', [('CONFIG', 'NOPE')]),
        # types, scripts
        ('WRONGTYPE', [('LPUSH', k, 'x'), ('GET', k)]),
        ('NOSCRIPT', [('EVALSHA', 'ffffffffffffffffffffffffffffffffffffffff', '0')]),
        ('EVALSHA arity', [('EVALSHA', 'ffffffffffffffffffffffffffffffffffffffff')]),
        ('EVAL numkeys', [('EVAL', 'return 1', '5', 'a')]),
        ('EVAL compile error', [('EVAL', 'return +', '0')]),
        ('EVAL script error', [('EVAL', "return redis.call('nosuchcmd')", '0')]),
        # blocking pops' timeouts
        ('BRPOP timeout not a float', [('BRPOP', q1, q2, 'abc')]),
        ('BRPOP timeout negative', [('BRPOP', q1, q2, '-1')]),
        ('BLPOP one key timeout not a float', [('BLPOP', q1, 'abc')]),
        ('BLMPOP timeout negative', [('BLMPOP', '-1', '2', q1, q2, 'LEFT')]),
        ('BZPOPMIN timeout not a float', [('BZPOPMIN', q1, q2, 'x')]),
        # subscribed context
        ('a command on a subscribed connection',
         [('SUBSCRIBE', k), ('GET', k), ('PING',), ('UNSUBSCRIBE', k)]),
        # protocol errors: Redis answers, then closes the connection
        ('multibulk length not a number', [b'*abc\r\n']),
        ('multibulk length too big', [b'*3000000000\r\n']),
        ('not a bulk', [b'*1\r\nx\r\n']),
        ('bulk length not a number', [b'*1\r\n$abc\r\n']),
        ('bulk length too big', [b'*1\r\n$3000000000\r\n']),
        ('inline unbalanced quotes', [b'SET "a b\r\n']),
    ]


class PasswordErrors(unittest.TestCase):
    """A password on both: Redis' requirepass, ferry's client.password
    (ferry authenticates to Redis with it too)."""

    @classmethod
    def setUpClass(cls):
        cls.redis = RedisServer(conf={'requirepass': 'pw'})
        cls.addClassCleanup(cls.redis.stop)

    def setUp(self):
        self.ferry = Ferry(self.redis, conf={'redis': {'password': 'pw'},
                                             'client': {'password': 'pw'}}, wait='port')
        self.addCleanup(self.ferry.stop)

    def test_unauthenticated_errors(self):
        k = key_prefix(self)
        cases = [
            ('a command before AUTH', [('GET', k), ('AUTH', 'pw'), ('GET', k)]),
            ('MULTI before AUTH', [('MULTI',), ('SET', k, 'v'), ('EXEC',)]),
            ('AUTH wrong', [('AUTH', 'nope'), ('GET', k)]),
            ('AUTH default wrong', [('AUTH', 'default', 'nope')]),
            ('AUTH of another user', [('AUTH', 'nosuchuser', 'pw')]),
            ('HELLO before AUTH', [('HELLO', '3')]),
            ('HELLO AUTH wrong', [('HELLO', '2', 'AUTH', 'default', 'nope')]),
            ('HELLO without a version before AUTH', [('HELLO',)]),
        ]
        for name, steps in cases:
            with self.subTest(case=name):
                def case(port):
                    c = Conn(self, port)
                    return [c.ask(*step) for step in steps]
                direct = case(self.redis.port)
                through = case(self.ferry.port)
                self.assertEqual(through, direct, '--- ferry log ---\n%s' % self.ferry.log()[-3000:])


class NoMasterErrors(unittest.TestCase):
    """While no master is usable ferry answers PING and ECHO itself: with
    Redis' errors for their arity (compared with a live Redis)."""

    def test_standin_arity(self):
        live = RedisServer()
        self.addCleanup(live.stop)
        dead = RedisServer()
        dead.stop()
        ferry = Ferry(dead, wait='port')
        self.addCleanup(ferry.stop)
        cases = [('PING', 'a', 'b'), ('ECHO',), ('ECHO', 'a', 'b'), ('PING',), ('ECHO', 'x')]
        for cmd in cases:
            with self.subTest(cmd=cmd):
                self.assertEqual(Conn(self, ferry.port).ask(*cmd), Conn(self, live.port).ask(*cmd))


class MaxClientsErrors(unittest.TestCase):
    """One client more than allowed: Redis' maxclients, ferry's
    client.max_clients; the refused connection is answered and closed."""

    def test_max_clients(self):
        redis_ = RedisServer()
        self.addCleanup(redis_.stop)
        ferry = Ferry(redis_, conf={'client': {'max_clients': 1}})
        self.addCleanup(ferry.stop)

        def case(port):
            def alone():
                # (the client before may not be gone yet on Redis' side)
                c = Conn(self, port)
                try:
                    got = c.ask('PING')
                except OSError:  # refused and closed before the PING went
                    got = None
                if got != b'+PONG\r\n':
                    c.sock.close()
                    return None
                return c
            first = wait_until(alone, timeout=10, msg='no first client')
            got = [first.ask('PING')]
            second = connect(port)
            self.addCleanup(second.close)
            got += [resp_read_raw(second, timeout=10.0), closed(second), first.ask('PING')]
            return got
        through = case(ferry.port)
        ferry.stop()
        with redis_.client() as c:
            # Redis counts the connection being accepted too: with this one
            # gone, a first client is served, a second refused
            c.config_set('maxclients', c.info('clients')['connected_clients'] + 1)
        direct = case(redis_.port)
        self.assertEqual(through, direct)


class FailoverErrors(unittest.TestCase):
    """A transaction Redis refused a command of, rebuilt on the next master
    after a failover: the new master never saw the refusal, so ferry aborts
    EXEC itself, in Redis' words; nothing of it runs."""

    def test_refused_command_then_failover_then_exec(self):
        topo = SentinelTopology()
        self.addCleanup(topo.stop)
        ferry = Ferry(None, sentinel=topo)
        self.addCleanup(ferry.stop)
        k = key_prefix(self)
        c = Conn(self, ferry.port)
        got = [c.ask('SET', k, '1'), c.ask('MULTI'), c.ask('INCR', k), c.ask('GET')]
        old = topo.master_port()
        topo.master().kill()
        new = topo.wait_failover(old)
        # a command after the loss rebuilds the transaction on the new master
        got += [c.ask('INCR', k), c.ask('EXEC'), c.ask('GET', k)]
        self.assertEqual(got, [b'+OK\r\n', b'+OK\r\n', b'+QUEUED\r\n',
                               b"-ERR wrong number of arguments for 'get' command\r\n",
                               b'+QUEUED\r\n',
                               b'-EXECABORT Transaction discarded because of previous errors.\r\n',
                               b'$1\r\n1\r\n'], '--- ferry log ---\n%s' % ferry.log()[-4000:])
        self.assertEqual(topo.redis_by_port(new).client().get(k), '1')


class SentinelErrors(SentinelMode, Checks, unittest.TestCase):
    pass


class FixedMasterErrors(FixedMasterMode, Checks, unittest.TestCase):
    pass


load_tests = sentinel_first

if __name__ == '__main__':
    unittest.main()
