"""ioredis (Node.js) through ferry, in Sentinel mode (replicas_ack 1) and with
a fixed master: MULTI/EXEC, WATCH abort, a 1000-command pipeline, pub/sub and
BRPOP with a timeout. Each check runs node/clients.js (one scenario, one JSON
object printed) against ferry's port and asserts on that and on what Redis
holds. scripts/setup installs ioredis into node_modules/; without it these
tests fail."""

import json
import os
import shutil
import subprocess
import unittest

from modes import FixedMasterMode, SentinelMode, key_prefix, sentinel_first

HERE = os.path.dirname(os.path.abspath(__file__))
DRIVER = os.path.join(HERE, 'node', 'clients.js')
NODE_TIMEOUT = 60   # seconds for one node run; the driver gives up after 40


class NodeClientChecks:
    @classmethod
    def setUpClass(cls):
        node = shutil.which('node')
        if node is None:
            raise AssertionError('node is not installed: run scripts/setup')
        if not os.path.isdir(os.path.join(HERE, 'node_modules', 'ioredis')):
            raise AssertionError('ioredis is missing from %s: run scripts/setup'
                                 % os.path.join(HERE, 'node_modules'))
        cls.node = node
        super().setUpClass()

    def run_node(self, scenario):
        """The driver's JSON for scenario; fails the test on any error."""
        p = subprocess.run([self.node, DRIVER, str(self.ferry.port), scenario,
                            key_prefix(self)],
                           capture_output=True, text=True, timeout=NODE_TIMEOUT, cwd=HERE)
        try:
            out = json.loads(p.stdout.strip().splitlines()[-1])
        except (IndexError, ValueError):
            self.fail('node %s (exit %d) printed no JSON:\n%s\n%s\n%s' % (
                scenario, p.returncode, p.stdout, p.stderr, self.diag()))
        if p.returncode != 0 or 'error' in out:
            self.fail('node %s failed (exit %d): %s\n%s\n%s' % (
                scenario, p.returncode, json.dumps(out), p.stderr[-2000:], self.diag()))
        self.assertNotIn('conn_errors', out)
        return out

    def test_multi_exec(self):
        k = key_prefix(self)
        out = self.run_node('multi')
        self.assertEqual(out['exec'], [[None, 0], [None, 1], [None, 2], [None, 1],
                                       [None, ['b', 'a']]])
        self.assertEqual(out['after'], ['b', 'a'])
        self.assertEqual([out['multi_reply'], out['queued'], out['discard']],
                         ['OK', 'QUEUED', 'OK'])
        self.assertEqual(out['discarded_exists'], 0)
        self.assertEqual([out['big_n'], out['big_errors'], out['big_last'], out['big_len']],
                         [1000, 0, 1000, 1000])
        m = self.master().client()
        self.assertEqual(m.lrange(k + ':list', 0, -1), ['b', 'a'])
        self.assertEqual(m.get(k + ':counter'), '1')
        self.assertEqual(m.exists(k + ':discarded'), 0)
        self.assertEqual(m.lrange(k + ':big', 0, -1), [str(i) for i in range(1000)])

    def test_watch_abort(self):
        k = key_prefix(self)
        out = self.run_node('watch')
        self.assertEqual([out['watch'], out['read'], out['other_set']], ['OK', 'v0', 'OK'])
        self.assertIsNone(out['aborted'])
        self.assertEqual(out['value_after_abort'], 'theirs')
        self.assertIsNone(out['side_after_abort'])
        self.assertEqual(out['committed'], [[None, 'OK'], [None, 1]])
        self.assertEqual([out['value_after_commit'], out['side_after_commit']], ['mine', '1'])
        self.assertEqual(out['unwatch'], 'OK')
        self.assertEqual(out['after_unwatch'], [[None, 'OK']])
        self.assertEqual(out['value_final'], 'mine2')
        m = self.master().client()
        self.assertEqual(m.get(k + ':watched'), 'mine2')
        self.assertEqual(m.get(k + ':side'), '1')

    def test_pipeline_1000(self):
        k = key_prefix(self)
        out = self.run_node('pipeline')
        self.assertEqual(out['n'], 1000)
        self.assertEqual(out['errors'], [])
        self.assertEqual(out['mismatches'], [])
        self.assertEqual(out['len'], 500)
        self.assertEqual(self.master().client().lrange(k + ':plist', 0, -1),
                         [str(i) for i in range(0, 1000, 2)])

    def test_pubsub(self):
        k = key_prefix(self)
        out = self.run_node('pubsub')
        self.assertEqual([out['subscribe'], out['psubscribe']], [2, 3])
        self.assertEqual(out['published'], [1, 1, 1])
        self.assertEqual(out['unsubscribe_one'], 2)
        self.assertEqual(out['published_after_unsubscribe'], [0, 1])
        self.assertEqual([out['punsubscribe'], out['unsubscribe_all']], [1, 0])
        self.assertEqual(out['published_after_all'], [0, 0])
        self.assertEqual(out['ping_after'], 'PONG')
        self.assertEqual(out['messages'], [
            ['message', k + ':ch1', 'one'],
            ['pmessage', k + ':news.*', k + ':news.x', 'two'],
            ['message', k + ':ch2', 'three'],
            ['message', k + ':ch2', 'four'],
        ])

    def test_brpop_timeout(self):
        k = key_prefix(self)
        out = self.run_node('brpop')
        self.assertIsNone(out['timeout_result'])
        # BRPOP k 1: nil after about a second, not before and not much later
        self.assertGreaterEqual(out['timeout_ms'], 900)
        self.assertLess(out['timeout_ms'], 2500)
        self.assertEqual(out['pushed'], 1)
        self.assertEqual(out['pop_result'], [k + ':bq', 'x'])
        self.assertLess(out['pop_ms'], 3000)
        self.assertEqual(out['priority'], [[k + ':high', 'h1'], [k + ':low', 'l1'], None])
        m = self.master().client()
        self.assertEqual([m.llen(k + ':bq'), m.llen(k + ':high'), m.llen(k + ':low')],
                         [0, 0, 0])


class SentinelNodeClientsTest(SentinelMode, NodeClientChecks, unittest.TestCase):
    pass


class FixedMasterNodeClientsTest(FixedMasterMode, NodeClientChecks, unittest.TestCase):
    pass


load_tests = sentinel_first

if __name__ == '__main__':
    unittest.main()
