"""A script or function running past lua-time-limit holds only its own
client: the others get Redis' -BUSY at once, as they would from Redis, and
SCRIPT KILL / FUNCTION KILL sent through ferry end it.

Run: python3 -m unittest test_busy -v
     FERRY_TEST_DIRECT=1 python3 -m unittest test_busy -v   (plain Redis)
"""
import signal
import socket
import threading
import unittest

import harness
from harness import Ferry, RedisServer, RespError, resp_encode, resp_read_reply, wait_until
from test_stats import stats_json
from modes import FixedMasterMode, SentinelMode, key_prefix, sentinel_first

DIRECT = harness.DIRECT

LOOP = 'local i = 0 while true do i = i + 1 end'
LIB = ("#!lua name=%s\n"
       "redis.register_function{function_name='%s', callback=function() "
       "local i = 0 while true do i = i + 1 end end, flags={'no-writes'}}")
BUSY_MS = 100


def connect(port):
    return socket.create_connection(('127.0.0.1', port), timeout=5)


def ask(sock, *args, timeout=3.0):
    sock.sendall(resp_encode(*args))
    return resp_read_reply(sock, timeout=timeout)


def err_line(r):
    if not isinstance(r, RespError):
        raise AssertionError('expected an error reply, got %r' % (r,))
    v = r.args[0] if r.args else str(r)
    return v.decode() if isinstance(v, bytes) else v


class Checks:

    def setUp(self):
        super().setUp()
        direct = self.master().client()
        self.old_limit = direct.config_get('lua-time-limit')['lua-time-limit']
        direct.config_set('lua-time-limit', BUSY_MS)
        self.addCleanup(self._restore, direct)

    @property
    def port(self):
        return self.master().port if DIRECT else self.ferry.port

    def _restore(self, direct):
        self._settle(direct)
        direct.config_set('lua-time-limit', self.old_limit)

    @staticmethod
    def _settle(direct):
        # A check that failed may leave its script running: end it first.
        def settled():
            try:
                direct.script_kill()
            except Exception:
                pass
            try:
                direct.function_kill()
            except Exception:
                pass
            try:
                return direct.ping()
            except Exception:
                return False
        wait_until(settled, timeout=10, msg='Redis busy after the test')

    def _redis_busy(self):
        """Wait until Redis itself answers -BUSY (the script is past the limit)."""
        probe = self.master().client(socket_timeout=2)

        def busy():
            try:
                probe.ping()
                return False
            except Exception as e:
                return 'BUSY' in str(e)
        wait_until(busy, timeout=5, msg='Redis never got busy')

    def _check_busy(self, start, kill, kill_reply_word):
        runner = connect(self.port)
        self.addCleanup(runner.close)
        runner.sendall(resp_encode(*start))
        self._redis_busy()

        other = connect(self.port)
        self.addCleanup(other.close)
        # Redis answers -BUSY to every other connection while the script runs.
        for cmd in (('PING',), ('GET', key_prefix(self)), ('SET', key_prefix(self), 'v')):
            try:
                r = ask(other, *cmd, timeout=3.0)
            except (socket.timeout, TimeoutError) as e:
                self.fail('%s waited behind the busy script (%r)\n%s'
                          % (cmd[0], e, '' if DIRECT else self.diag()))
            self.assertTrue(isinstance(r, RespError) and str(r).startswith('BUSY'),
                            '%s: %r\n%s' % (cmd[0], r, '' if DIRECT else self.diag()))

        killer = connect(self.port)
        self.addCleanup(killer.close)
        self.assertEqual(ask(killer, *kill), 'OK')

        r = resp_read_reply(runner, timeout=5.0)
        self.assertIn(kill_reply_word, err_line(r).lower(), r)
        # Everyone goes on as before.
        self.assertEqual(ask(runner, 'PING'), 'PONG')
        self.assertEqual(ask(other, 'PING'), 'PONG')

    def test_eval_past_time_limit_others_get_busy_and_script_kill_ends_it(self):
        self._check_busy(('EVAL', LOOP, '0'), ('SCRIPT', 'KILL'), 'killed')

    def test_eval_ro_past_time_limit_others_get_busy(self):
        self._check_busy(('EVAL_RO', LOOP, '0'), ('SCRIPT', 'KILL'), 'killed')

    def test_fcall_ro_past_time_limit_others_get_busy_and_function_kill_ends_it(self):
        name = key_prefix(self).replace('.', '_')
        direct = self.master().client()
        direct.function_load(LIB % (name, name + '_f'), replace=True)
        self.addCleanup(lambda: (self._settle(direct), direct.function_delete(name)))
        self._check_busy(('FCALL_RO', name + '_f', '0'), ('FUNCTION', 'KILL'), 'killed')

    def test_pipelined_scripts_and_commands_keep_their_order(self):
        k = key_prefix(self)
        c = connect(self.port)
        self.addCleanup(c.close)
        c.sendall(resp_encode('DEL', k))
        resp_read_reply(c)
        n = 60
        out = []
        for i in range(n):
            if i % 3 == 0:
                out.append(resp_encode('EVAL', "return redis.call('INCR', KEYS[1])", '1', k))
            else:
                out.append(resp_encode('INCR', k))
        c.sendall(b''.join(out))
        got = [resp_read_reply(c, timeout=10.0) for _ in range(n)]
        self.assertEqual(got, list(range(1, n + 1)))

    def test_eval_inside_multi_stays_in_the_transaction(self):
        k = key_prefix(self)
        c = connect(self.port)
        self.addCleanup(c.close)
        self.assertEqual(ask(c, 'MULTI'), 'OK')
        self.assertEqual(ask(c, 'EVAL', "return redis.call('SET', KEYS[1], 'x')", '1', k),
                         'QUEUED')
        self.assertEqual(ask(c, 'GET', k), 'QUEUED')
        r = ask(c, 'EXEC')
        self.assertEqual(r, ['OK', b'x'])


@unittest.skipIf(DIRECT, 'about ferry\'s links')
class ScriptLinks(unittest.TestCase):
    """Scripts of many clients at once reuse their links (no link opened
    per call); idle links above upstream.pool_idle are closed later."""

    POOL = 4
    CLIENTS = 20
    CALLS = 200

    def test_concurrent_scripts_reuse_links_and_pool_shrinks_to_pool_idle(self):
        redis = RedisServer()
        self.addCleanup(redis.stop)
        ferry = Ferry(redis, conf={'upstream': {'pool_idle': self.POOL}})
        self.addCleanup(ferry.stop)
        before = stats_json(ferry.stats_port)['upstream']['links_opened']
        errors = []

        def client(i):
            try:
                c = connect(ferry.port)
                c.settimeout(10)
                for n in range(self.CALLS):
                    r = ask(c, 'EVAL', "return redis.call('INCR', KEYS[1])", '1', 'k%d' % i,
                            timeout=10)
                    if r != n + 1:
                        errors.append((i, n, r))
                        break
                c.close()
            except Exception as e:  # reported below
                errors.append((i, repr(e)))
        threads = [threading.Thread(target=client, args=(i,)) for i in range(self.CLIENTS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        self.assertEqual(errors, [])
        self.assertFalse(any(t.is_alive() for t in threads))
        opened = stats_json(ferry.stats_port)['upstream']['links_opened'] - before
        # at most one link per client calling at once, not one per call
        # (each event loop has its own shared link, probe and pool)
        loops = int(harness.WORKERS or 1)
        self.assertLessEqual(opened, self.CLIENTS + 2 * loops, ferry.log()[-3000:])
        wait_until(lambda: stats_json(ferry.stats_port)['upstream']['pool_idle'] <=
                   self.POOL * loops,
                   timeout=10, msg='idle links above pool_idle never closed')

    def test_graceful_stop_waits_for_a_running_script(self):
        # A script on its dedicated link is no blocking call: a stopping
        # ferry answers it before closing its client.
        redis = RedisServer()
        self.addCleanup(redis.stop)
        ferry = Ferry(redis)
        self.addCleanup(ferry.stop)
        c = connect(ferry.port)
        self.addCleanup(c.close)
        spin = ("local t = redis.call('TIME') local start = t[1] * 1000 + t[2] / 1000 "
                "local now = start while now - start < 700 do t = redis.call('TIME') "
                "now = t[1] * 1000 + t[2] / 1000 end redis.call('SET', KEYS[1], 'done') "
                "return 7")
        probe = redis.client(socket_timeout=5)
        probe.config_set('lua-time-limit', BUSY_MS)  # Redis says -BUSY once it runs
        c.sendall(resp_encode('EVAL', spin, '1', 'stopkey'))

        def busy():
            try:
                probe.ping()
                return False
            except Exception as e:
                return 'BUSY' in str(e)
        wait_until(busy, timeout=5, msg='the script never started')
        ferry.signal(signal.SIGTERM)
        self.assertEqual(resp_read_reply(c, timeout=10.0), 7)
        self.assertEqual(probe.get('stopkey'), 'done')


class SentinelBusy(SentinelMode, Checks, unittest.TestCase):
    pass


class FixedMasterBusy(FixedMasterMode, Checks, unittest.TestCase):
    pass


load_tests = sentinel_first

if __name__ == '__main__':
    unittest.main()
