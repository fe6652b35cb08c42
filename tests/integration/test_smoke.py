"""redis-benchmark's default suite and redis-cli, unmodified, through ferry."""

import subprocess
import unittest

from harness import Ferry, RedisServer


class SmokeTest(unittest.TestCase):
    def setUp(self):
        self.redis = RedisServer()
        self.addCleanup(self.redis.stop)
        self.ferry = Ferry(self.redis)
        self.addCleanup(self.ferry.stop)

    def test_redis_benchmark_default_suite(self):
        # Every default test (PING, SET, GET, INCR, LPUSH, RPUSH, LPOP, RPOP,
        # SADD, HSET, SPOP, ZADD, ZPOPMIN, LRANGE_*, MSET) at -P 1 and -P 16.
        for pipeline in ('1', '16'):
            out = subprocess.run(
                ['redis-benchmark', '-p', str(self.ferry.port), '-q', '-n', '2000', '-c', '20',
                 '-P', pipeline],
                capture_output=True, text=True, timeout=300)
            self.assertEqual(out.returncode, 0, out.stdout + out.stderr)
            lines = [l for l in out.stdout.replace('\r', '\n').split('\n')
                     if 'requests per second' in l]
            self.assertGreaterEqual(len(lines), 17, out.stdout)
            self.assertNotIn('ERR', out.stdout + out.stderr)
            self.assertNotIn('rror', out.stderr)

    def test_redis_cli(self):
        def cli(*args):
            return subprocess.run(['redis-cli', '-p', str(self.ferry.port)] + list(args),
                                  capture_output=True, text=True, timeout=30)
        self.assertEqual(cli('ping').stdout.strip(), 'PONG')
        self.assertEqual(cli('rpush', 'jobs', 'a', 'b').stdout.strip(), '2')
        self.assertEqual(cli('brpop', 'jobs', '0').stdout.split(), ['jobs', 'b'])
        self.assertEqual(cli('--no-raw', 'lrange', 'jobs', '0', '-1').stdout.strip(), '1) "a"')
        # piped commands, as operators script it
        out = subprocess.run(['redis-cli', '-p', str(self.ferry.port)],
                             input='SET k v\nGET k\nDEL k\n', capture_output=True, text=True,
                             timeout=30)
        self.assertEqual(out.stdout.split(), ['OK', 'v', '1'])
        out = cli('shutdown')
        self.assertIn('ferry: SHUTDOWN is not allowed through the proxy', out.stdout + out.stderr)


if __name__ == '__main__':
    unittest.main()
