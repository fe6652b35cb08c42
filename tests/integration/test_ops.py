"""Operating ferry: `ferry -t` on good and broken configurations, the command
line (-V, -h, --describe-stats, usage errors, exit codes), graceful shutdown
on SIGTERM (pipelined replies delivered, exit 0 in time; a second SIGTERM
exits at once) and log reopening on SIGHUP.

Run: python3 -m unittest test_ops -v
"""
import json
import os
import re
import signal
import socket
import subprocess
import tempfile
import time
import unittest

import harness
from harness import (FERRY_BIN, REPO, Ferry, RedisServer, free_port, render_yaml, resp_encode,
                     resp_read_reply, wait_until)


def run_ferry(*args, timeout=30):
    """(exit code, stdout, stderr) of ferry with args."""
    p = subprocess.run([FERRY_BIN] + list(args), stdin=subprocess.DEVNULL,
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout)
    return p.returncode, p.stdout.decode(errors='replace'), p.stderr.decode(errors='replace')


def http_json(port, path='/stats'):
    with socket.create_connection(('127.0.0.1', port), timeout=5) as s:
        s.sendall(b'GET %s HTTP/1.0\r\n\r\n' % path.encode())
        data = b''
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    return json.loads(data.partition(b'\r\n\r\n')[2])


def read_eof(sock, timeout=10.0):
    """Read until the peer closes; returns what came before the close."""
    sock.settimeout(timeout)
    data = b''
    while True:
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            return data
        if not chunk:
            return data
        data += chunk


def redis_busy(port):
    """True if Redis on port does not answer a PING within 100 ms (DEBUG SLEEP)."""
    with socket.create_connection(('127.0.0.1', port), timeout=1) as s:
        s.sendall(b'PING\r\n')
        s.settimeout(0.1)
        try:
            return not s.recv(64)
        except socket.timeout:
            return True


def blocked_clients(redis_client, cmd):
    return sum(1 for c in redis_client.client_list()
               if c.get('cmd') == cmd and 'b' in c.get('flags', ''))


class ConfigCheckTest(unittest.TestCase):
    """ferry -t -c FILE."""

    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory(prefix='ferry-ops-')
        self.addCleanup(self.tmp.cleanup)

    def write(self, name, text):
        path = os.path.join(self.tmp.name, name)
        with open(path, 'w') as f:
            f.write(text)
        return path

    def test_good_configs(self):
        path = self.write('good.yml', render_yaml({
            'listen': '127.0.0.1:6380', 'redis': {'address': '127.0.0.1:6379'},
            'stats': {'listen': '127.0.0.1:22222'}, 'shutdown_timeout_ms': 3000}))
        rc, out = Ferry.check_config(path)
        self.assertEqual(rc, 0, out)
        self.assertIn('valid', out)
        rc, out = Ferry.check_config(os.path.join(REPO, 'config', 'ferry.yml'))
        self.assertEqual(rc, 0, out)

    def test_broken_configs(self):
        base = 'listen: 127.0.0.1:6380\nredis:\n  address: 127.0.0.1:6379\n'
        cases = [
            ('unknown_key', base + 'bogus: 1\n', 4, 'unknown key'),
            ('unknown_nested', base + 'stats:\n  lisen: 127.0.0.1:1\n', 5, 'unknown key'),
            ('bad_port', 'listen: 127.0.0.1:70000\nredis:\n  address: 127.0.0.1:6379\n', 1,
             'port'),
            ('bad_stats_port', base + 'stats:\n  listen: 127.0.0.1:0\n', 5, 'port'),
            ('no_master', 'listen: 127.0.0.1:6380\n', 1, 'redis'),
            ('yaml_syntax', 'listen: [127.0.0.1:6380\nredis:\n  address: 127.0.0.1:6379\n', None,
             'YAML'),
            ('bad_type', base + 'shutdown_timeout_ms: soon\n', 4, 'shutdown_timeout_ms'),
        ]
        for name, text, line, word in cases:
            with self.subTest(name):
                path = self.write(name + '.yml', text)
                rc, out = Ferry.check_config(path)
                self.assertEqual(rc, 1, out)
                m = re.match(r'^%s:(\d+):(\d+): (.+)' % re.escape(path), out)
                self.assertIsNotNone(m, 'no file:line:col: prefix in %r' % out)
                if line is not None:
                    self.assertEqual(int(m.group(1)), line, out)
                self.assertIn(word, m.group(3))

    def test_missing_file(self):
        rc, out, err = run_ferry('-t', '-c', os.path.join(self.tmp.name, 'nope.yml'))
        self.assertEqual(rc, 1)
        self.assertIn('nope.yml', err)


class CommandLineTest(unittest.TestCase):

    def test_version(self):
        rc, out, _ = run_ferry('-V')
        self.assertEqual(rc, 0)
        self.assertRegex(out, r'^ferry \d+\.\d+\.\d+\n$')
        self.assertEqual(run_ferry('--version')[:2], (0, out))

    def test_help(self):
        rc, out, err = run_ferry('-h')
        self.assertEqual(rc, 0)
        self.assertEqual(err, '')
        for word in ('Usage: ferry', '--config', '--test', '--describe-stats', 'SIGHUP',
                     'Exit codes', '2  bad command line'):
            self.assertIn(word, out)

    def test_describe_stats(self):
        rc, out, err = run_ferry('--describe-stats')
        self.assertEqual(rc, 0, err)
        self.assertEqual(run_ferry('-D')[1], out)
        lines = out.splitlines()
        self.assertGreater(len(lines), 40)
        paths = []
        proms = {}
        for line in lines:
            fields = line.split(None, 3)
            self.assertEqual(len(fields), 4, line)
            path, typ, prom, help_ = fields
            self.assertRegex(path, r'^[a-z_]+(\.[a-z_0-9]+)?$|^cluster\.shards\[\]\.[a-z_]+$')
            self.assertIn(typ, ('counter', 'gauge', 'gauge_ms', 'bool', 'text', 'histogram',
                                'nodes'))
            self.assertTrue(prom == '-' or re.fullmatch(r'ferry_[a-z0-9_]+', prom), line)
            if typ == 'counter' and prom != '-':
                self.assertTrue(prom.endswith('_total'), line)
            if typ != 'text' and prom != '-':
                self.assertNotIn(prom, proms, 'Prometheus name used twice: %s' % prom)
            proms[prom] = path
            self.assertTrue(help_.strip())
            paths.append(path)
        self.assertEqual(len(paths), len(set(paths)))
        for want in ('service', 'source', 'version', 'uptime', 'timestamp', 'total_connections',
                     'curr_connections', 'commands.commands_total',
                     'latency.request_duration_seconds', 'upstream.master_addr',
                     'failover.failovers', 'durability.aof_enforced',
                     'sentinels.sentinels_configured', 'fallback.fallback_pending'):
            self.assertIn(want, paths)

    def test_stats_doc_table_is_current(self):
        p = subprocess.run([os.path.join(REPO, 'scripts', 'gen-stats-doc'), '--check',
                            '--ferry', FERRY_BIN], stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, timeout=30)
        self.assertEqual(p.returncode, 0, p.stdout.decode())

    def test_config_doc_table_is_current(self):
        # docs/configuration.md's reference is scripts/gen-config-doc's output
        # for this binary's key table: a key added, changed or documented
        # differently without regenerating it fails here.
        p = subprocess.run([os.path.join(REPO, 'scripts', 'gen-config-doc'), '--check',
                            '--ferry', FERRY_BIN], stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, timeout=30)
        self.assertEqual(p.returncode, 0, p.stdout.decode())

    def test_describe_config_lists_every_key(self):
        p = subprocess.run([FERRY_BIN, '--describe-config'], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, timeout=30)
        self.assertEqual(p.returncode, 0, p.stderr.decode())
        rows = [line.split('\t') for line in p.stdout.decode().splitlines()]
        keys = [r[0] for r in rows]
        self.assertEqual(len(keys), len(set(keys)))
        for r in rows:
            with self.subTest(key=r[0]):
                self.assertEqual(len(r), 5, r)
                self.assertTrue(r[4].strip(), 'no meaning for %s' % r[0])
        for want in ('listen', 'workers', 'redis.address', 'sentinel.addresses', 'client.auth',
                     'client.max_pending_bytes', 'upstream.hold_timeout_ms', 'deny',
                     'stats.listen', 'fallback.path', 'durability.replicas_ack',
                     'takeover.socket', 'queues'):
            self.assertIn(want, keys)
        by_key = {r[0]: r for r in rows}
        self.assertEqual(by_key['client.max_pending_bytes'][2], '64mb')
        self.assertEqual(by_key['upstream.hold_timeout_ms'][2], '10000')
        self.assertEqual(by_key['stats.listen'][2], '127.0.0.1:22222')
        self.assertEqual(by_key['log.level'][2], 'info')
        # Every key is shown in the annotated config/ferry.yml too.
        with open(os.path.join(REPO, 'config', 'ferry.yml')) as f:
            yml = f.read()
        for key in keys:
            with self.subTest(key=key):
                self.assertRegex(yml, r'(?m)^[ #]*%s:' % re.escape(key.split('.')[-1]))

    def test_usage_errors_exit_2(self):
        for args in ([], ['--bogus'], ['-c'], ['-t'], ['-c', 'a.yml', 'extra'], ['-x']):
            with self.subTest(args=args):
                rc, out, err = run_ferry(*args)
                self.assertEqual(rc, 2, (out, err))
                self.assertIn('Usage', err)

    @unittest.skipIf(harness.DIRECT, 'starts ferry')
    def test_cannot_start_exits_3(self):
        busy = socket.socket()
        busy.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        busy.bind(('127.0.0.1', 0))
        busy.listen(1)
        self.addCleanup(busy.close)
        port = busy.getsockname()[1]
        for conf in ({'listen': '127.0.0.1:%d' % port,
                      'stats': {'listen': '127.0.0.1:%d' % free_port()}},
                     {'listen': '127.0.0.1:%d' % free_port(),
                      'stats': {'listen': '127.0.0.1:%d' % port}}):
            with self.subTest(conf=conf):
                f = Ferry(None, conf=dict(conf, redis={'address': '127.0.0.1:1'}), wait=None)
                try:
                    rc = f.proc.wait(10)
                finally:
                    f.stop()
                self.assertEqual(rc, 3, f.log())
                self.assertIn('cannot listen on 127.0.0.1:%d' % port, f.log())


@unittest.skipIf(harness.DIRECT, 'signals are sent to ferry')
class SignalTest(unittest.TestCase):

    def start(self, **conf):
        self.redis = RedisServer()
        # SIGKILL at the end: a busy Redis (DEBUG SLEEP, first AOF) may refuse SIGTERM.
        self.addCleanup(self.redis.kill)
        self.ferry = Ferry(self.redis, conf=conf)
        self.addCleanup(self.ferry.stop)
        return self.ferry

    def commands_total(self):
        return http_json(self.ferry.stats_port)['commands']['commands_total']

    def sleep_redis(self, seconds):
        """Make Redis busy for seconds (sent directly: ferry denies DEBUG)."""
        d = socket.create_connection(('127.0.0.1', self.redis.port), timeout=10)
        self.addCleanup(d.close)
        d.sendall(resp_encode('DEBUG', 'SLEEP', str(seconds)))
        wait_until(lambda: redis_busy(self.redis.port), timeout=5, msg='Redis to be busy')

    def test_sigterm_drains_pipeline_and_exits_0(self):
        f = self.start(shutdown_timeout_ms=3000)
        blocked = f.raw()
        self.addCleanup(blocked.close)
        blocked.sendall(resp_encode('BRPOP', 'q', '0'))
        wait_until(lambda: blocked_clients(self.redis.client(), 'brpop') == 1,
                   msg='BRPOP to block')
        before = self.commands_total()

        n = 2000
        pipe = f.raw()
        self.addCleanup(pipe.close)
        self.sleep_redis(1)  # so the pipeline is still in flight at SIGTERM
        pipe.sendall(resp_encode('INCR', 'n') * n)
        wait_until(lambda: self.commands_total() - before == n, timeout=10,
                   msg='ferry to parse the whole pipeline')

        t0 = time.monotonic()
        f.signal(signal.SIGTERM)
        replies = [resp_read_reply(pipe, timeout=10) for _ in range(n)]
        self.assertEqual(replies, list(range(1, n + 1)))
        self.assertEqual(read_eof(pipe), b'', 'the pipelining client is closed after its replies')
        self.assertEqual(read_eof(blocked), b'', 'the blocked client is closed')
        rc = f.proc.wait(10)
        took = time.monotonic() - t0
        self.assertEqual(rc, 0, f.log()[-3000:])
        self.assertLess(took, 3.0, 'exit took %.2fs, shutdown_timeout_ms is 3000' % took)
        log = f.log()
        self.assertIn('stopping (SIGTERM)', log)
        self.assertIn('all clients done', log)
        self.assertNotIn('shutdown timeout', log)
        self.assertEqual(self.redis.client().get('n'), str(n))

    def test_sigterm_when_idle_exits_at_once(self):
        f = self.start()
        t0 = time.monotonic()
        self.assertEqual(f.stop(signal.SIGTERM), 0)
        # not after shutdown_timeout_ms (5 s by default)
        self.assertLess(time.monotonic() - t0, 4.0)

    def test_second_sigterm_exits_at_once(self):
        f = self.start(shutdown_timeout_ms=10000)
        before = self.commands_total()
        self.sleep_redis(4)
        c = f.raw()
        self.addCleanup(c.close)
        c.sendall(resp_encode('GET', 'k'))
        wait_until(lambda: self.commands_total() > before, msg='GET parsed')
        f.signal(signal.SIGTERM)
        wait_until(lambda: 'stopping (SIGTERM)' in f.log(), timeout=5, msg='first SIGTERM seen')
        self.assertTrue(f.running(), 'ferry exited with a request in flight')
        t0 = time.monotonic()
        f.signal(signal.SIGTERM)
        rc = f.proc.wait(30)
        # not after shutdown_timeout_ms (5 s by default)
        self.assertLess(time.monotonic() - t0, 4.0)
        self.assertEqual(rc, 0)
        self.assertIn('second SIGTERM', f.log())

    def test_signal_storm_while_stopping_exits_0(self):
        """SIGTERM, SIGINT and SIGHUP sent back to back from the first
        SIGTERM until ferry is gone, with work in flight on every loop and a
        fallback store to close: none of them may kill the process on its
        way out (a signal's default action once ferry's handlers are
        closed), so it always exits 0. The window is short: three rounds."""
        for _ in range(3):
            f = self.start(shutdown_timeout_ms=10000, workers=4,
                           fallback={'path': os.path.join(harness._mkdtemp('ferry-storm-'),
                                                          'fallback.db')})
            self.sleep_redis(1)
            clients = []
            for i in range(8):
                c = f.raw()
                self.addCleanup(c.close)
                c.sendall(resp_encode('LPUSH', 'storm', str(i)))
                clients.append(c)
            wait_until(lambda: self.commands_total() >= 8, msg='the pushes parsed')
            sigs = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)
            deadline = time.monotonic() + 15
            n = 0
            while f.proc.poll() is None and time.monotonic() < deadline:
                try:
                    f.proc.send_signal(sigs[n % len(sigs)])
                except ProcessLookupError:
                    break
                n += 1
            rc = f.proc.wait(5)
            self.assertEqual(rc, 0, 'exit status %r after %d signals\n%s' % (rc, n, f.log()[-2000:]))
            self.assertIn('second SIG', f.log())

    def test_sighup_reopens_log(self):
        f = self.start()
        path = f.log_path
        self.assertIn('listening on', f.log())
        os.rename(path, path + '.1')
        f.signal(signal.SIGHUP)
        wait_until(lambda: 'log file reopened' in harness._read(path), timeout=5,
                   msg='a new log file at the original path')
        self.assertTrue(f.client().ping())
        wait_until(lambda: 'connected' in harness._read(path), timeout=5,
                   msg='new lines in the new log file')
        new = harness._read(path)
        old = harness._read(path + '.1')
        self.assertIn('listening on', old)
        self.assertNotIn('listening on', new)
        self.assertNotIn('log file reopened', old)
        self.assertEqual(f.stop(), 0)
        self.assertIn('ferry stopped', harness._read(path))


if __name__ == '__main__':
    unittest.main()
