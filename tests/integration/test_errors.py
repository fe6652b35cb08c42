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

from harness import resp_encode, resp_read_raw, wait_until
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


class SentinelErrors(SentinelMode, Checks, unittest.TestCase):
    pass


class FixedMasterErrors(FixedMasterMode, Checks, unittest.TestCase):
    pass


load_tests = sentinel_first

if __name__ == '__main__':
    unittest.main()
