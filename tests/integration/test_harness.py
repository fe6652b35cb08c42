"""Self-test of harness.py against a plain redis-server (no ferry needed)."""

import os
import signal
import socket
import tempfile
import time
import unittest

import harness
from harness import _read
from harness import (RedisServer, RespError, free_port, render_yaml, resp_encode,
                     resp_read_raw, resp_read_reply, resp_send, wait_until)


class HelpersTest(unittest.TestCase):
    def test_free_port_is_bindable_and_unique(self):
        ports = {free_port() for _ in range(20)}
        self.assertEqual(len(ports), 20)
        for p in list(ports)[:3]:
            s = socket.socket()
            s.bind(('127.0.0.1', p))
            s.close()

    def test_wait_until(self):
        t0 = time.monotonic()
        calls = []
        self.assertEqual(wait_until(lambda: calls.append(1) or len(calls) >= 3 and 'yes'), 'yes')
        self.assertEqual(len(calls), 3)
        with self.assertRaisesRegex(AssertionError, 'never true'):
            wait_until(lambda: False, timeout=0.2, msg='never true')
        # exceptions count as "not yet" and are reported
        with self.assertRaisesRegex(AssertionError, 'boom'):
            wait_until(lambda: 1 / 0 if True else None, timeout=0.1, msg='boom')
        self.assertLess(time.monotonic() - t0, 5)

    def test_render_yaml(self):
        text = render_yaml({'listen': ['127.0.0.1:1', 'unix:/tmp/x'],
                            'redis': {'address': '127.0.0.1:2', 'password': 'p w"'},
                            'deny': [], 'client': {'max_clients': 5, 'flag': True},
                            'nested': [{'a': 1, 'b': [2, 3]}]})
        self.assertIn('listen:\n  - "127.0.0.1:1"\n  - "unix:/tmp/x"\n', text)
        self.assertIn('redis:\n  address: "127.0.0.1:2"\n  password: "p w\\""\n', text)
        self.assertIn('deny: []\n', text)
        self.assertIn('  max_clients: 5\n  flag: true\n', text)
        self.assertIn('nested:\n  - a: 1\n    b:\n      - 2\n      - 3\n', text)
        try:
            import yaml  # python3-yaml, installed by scripts/setup
        except ImportError:
            return
        self.assertEqual(yaml.safe_load(text)['nested'], [{'a': 1, 'b': [2, 3]}])
        self.assertEqual(yaml.safe_load(text)['redis']['password'], 'p w"')

    def test_resp_encode(self):
        self.assertEqual(resp_encode('SET', 'k', b'v\r\n', 3),
                         b'*4\r\n$3\r\nSET\r\n$1\r\nk\r\n$3\r\nv\r\n\r\n$1\r\n3\r\n')


class RedisServerTest(unittest.TestCase):
    def setUp(self):
        self.r = RedisServer()
        self.addCleanup(self.r.stop)

    def test_attributes_and_client(self):
        self.assertTrue(os.path.isdir(self.r.dir))
        self.assertGreater(self.r.pid, 0)
        c = self.r.client()
        self.assertTrue(c.ping())
        c.set('k', 'v')
        self.assertEqual(c.get('k'), 'v')
        self.assertEqual(c.config_get('save')['save'], '')
        self.assertEqual(c.config_get('dir')['dir'], os.path.realpath(self.r.dir))
        self.assertIn('Ready to accept connections', self.r.log())

    def test_raw_resp(self):
        s = socket.create_connection(('127.0.0.1', self.r.port), timeout=10)
        self.addCleanup(s.close)
        resp_send(s, b'PING\r\n')
        self.assertEqual(resp_read_reply(s), 'PONG')
        resp_send(s, ['SET', 'a', 'x' * 100000])
        self.assertEqual(resp_read_reply(s), 'OK')
        resp_send(s, ['GET', 'a'])
        self.assertEqual(resp_read_reply(s), b'x' * 100000)
        resp_send(s, ['GET', 'missing'])
        self.assertIsNone(resp_read_reply(s))
        resp_send(s, ['INCR', 'n'])
        self.assertEqual(resp_read_reply(s), 1)
        resp_send(s, ['RPUSH', 'l', 'a', '', 'c'])
        self.assertEqual(resp_read_reply(s), 3)
        resp_send(s, ['LRANGE', 'l', 0, -1])
        self.assertEqual(resp_read_reply(s), [b'a', b'', b'c'])
        resp_send(s, ['NOSUCHCOMMAND'])
        err = resp_read_reply(s)
        self.assertIsInstance(err, RespError)
        self.assertTrue(str(err).startswith('ERR unknown command'), str(err))
        # nested arrays and a null array
        resp_send(s, ['EVAL', 'return {1, {"a", {}}, redis.call("ping")}', 0])
        self.assertEqual(resp_read_reply(s), [1, [b'a', []], 'PONG'])
        resp_send(s, ['BLPOP', 'nolist', '0.01'])
        self.assertIsNone(resp_read_reply(s))

    def test_pipelined_replies_read_one_at_a_time(self):
        s = socket.create_connection(('127.0.0.1', self.r.port), timeout=10)
        self.addCleanup(s.close)
        resp_send(s, resp_encode('SET', 'p', 'v') + resp_encode('GET', 'p') + b'PING\r\n')
        time.sleep(0.1)  # all three replies arrive in one segment
        self.assertEqual(resp_read_raw(s), b'+OK\r\n')
        self.assertEqual(resp_read_reply(s), b'v')
        # nothing beyond one reply was consumed: the rest is still in the socket
        self.assertEqual(s.recv(100), b'+PONG\r\n')

    def test_split_reply_and_timeout(self):
        # A fake server that dribbles a reply byte by byte, then goes quiet.
        ls = socket.socket()
        ls.bind(('127.0.0.1', 0))
        ls.listen(1)
        self.addCleanup(ls.close)
        c = socket.create_connection(ls.getsockname(), timeout=10)
        self.addCleanup(c.close)
        a, _ = ls.accept()
        self.addCleanup(a.close)
        for b in b'*2\r\n$3\r\nfoo\r\n:42\r\n':
            a.send(bytes([b]))
            time.sleep(0.002)
        self.assertEqual(resp_read_reply(c), [b'foo', 42])
        a.send(b'$5\r\nab')
        t0 = time.monotonic()
        with self.assertRaises(socket.timeout):
            resp_read_reply(c, timeout=0.3)
        self.assertLess(time.monotonic() - t0, 2)
        self.assertEqual(c.gettimeout(), 10)  # restored
        a.close()
        with self.assertRaises(ConnectionError):
            resp_read_reply(c, timeout=2)

    def test_stop_restart_and_kill(self):
        self.r.client().set('x', '1')
        port = self.r.port
        self.assertEqual(self.r.stop(), 0)
        self.assertFalse(self.r.running())
        with self.assertRaises(Exception):
            socket.create_connection(('127.0.0.1', port), timeout=1)
        self.r.start()
        self.assertEqual(self.r.port, port)
        self.assertTrue(self.r.client().ping())
        self.assertEqual(self.r.kill(), -signal.SIGKILL)
        self.assertFalse(self.r.running())


class RedisConfTest(unittest.TestCase):
    def test_conf_and_wait_until(self):
        r = RedisServer({'appendonly': True, 'requirepass': 'secret', 'save': ['900 1', '60 100']})
        self.addCleanup(r.stop)
        c = r.client(password='secret')
        self.assertEqual(c.config_get('appendonly')['appendonly'], 'yes')
        self.assertEqual(c.config_get('save')['save'], '900 1 60 100')
        c.set('k', '1')
        # wait_until against real server state: a key expiring
        c.pexpire('k', 100)
        wait_until(lambda: c.get('k') is None, timeout=5, msg='k to expire')

    def test_bad_conf_fails_fast_with_log(self):
        t0 = time.monotonic()
        with self.assertRaisesRegex(AssertionError, '(?s)exited.*redis log'):
            RedisServer({'no-such-directive': 'x'})
        self.assertLess(time.monotonic() - t0, 5)


class FerryDirectModeTest(unittest.TestCase):
    """Ferry config generation, without starting ferry (FERRY_TEST_DIRECT)."""

    def test_direct_mode_config(self):
        r = RedisServer()
        self.addCleanup(r.stop)
        old = harness.DIRECT
        harness.DIRECT = True
        try:
            f = harness.Ferry(r, conf={'client': {'password': 'pw'}, 'log': {'level': 'info'},
                                       'deny': ['keys', 'config rewrite']})
        finally:
            harness.DIRECT = old
        self.assertEqual(f.port, r.port)
        self.assertIsNone(f.pid)
        self.assertEqual(f.stop(), 0)
        text = _read(f.config_path)
        self.assertIn('redis:\n  address: "127.0.0.1:%d"\n' % r.port, text)
        self.assertIn('client:\n  password: "pw"\n', text)
        self.assertIn('level: "info"', text)
        self.assertIn('file: "%s"' % os.path.join(f.dir, 'ferry.log'), text)
        self.assertIn('deny:\n  - "keys"\n  - "config rewrite"\n', text)
        self.assertTrue(f.client().ping())

    def test_conf_none_removes_key(self):
        old = harness.DIRECT
        harness.DIRECT = True
        try:
            r = RedisServer()
            self.addCleanup(r.stop)
            f = harness.Ferry(r, conf={'redis': None, 'stats': {'listen': 'off'},
                                       'listen': 'unix:%s/f.sock' % tempfile.gettempdir()})
        finally:
            harness.DIRECT = old
        text = _read(f.config_path)
        self.assertNotIn('redis:', text)
        self.assertIn('listen: "off"', text)
        self.assertIsNone(f.stats_port)


if __name__ == '__main__':
    unittest.main()
