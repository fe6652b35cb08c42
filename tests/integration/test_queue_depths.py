"""Queue depths (queues: and queue_depths: in the configuration): the lengths
of the keys matching a queue's globs, sampled on the master, follow a
producer and a consumer (in about two sampling intervals: the time taken is
printed; the test waits up to FOLLOW_S, a bound on a hang); pushes and pops
through ferry are counted per queue (summed over worker loops); 100 000
matching keys cost the master at most queue_depths.keys_per_round keys a
round (counted with INFO commandstats, never KEYS); the figures are in
/stats and /metrics; bad queues: entries are refused with file:line:column.

Run: python3 -m unittest test_queue_depths -v
"""
import json
import os
import subprocess
import tempfile
import time
import unittest
import urllib.request

import harness
from harness import Ferry, RedisServer, wait_until

INTERVAL_MS = 200
# How long a sampled length may take to follow a change before the test
# fails: it bounds a hang, it does not measure speed (about two sampling
# intervals on an idle machine; a loaded 2-core CI machine took longer).
FOLLOW_S = 30.0


def get(port, path):
    with urllib.request.urlopen('http://127.0.0.1:%d%s' % (port, path), timeout=5) as r:
        return r.read().decode()


def stats(port):
    return json.loads(get(port, '/stats'))


def key_lengths(port):
    return {k['key']: (k['type'], k['length']) for k in stats(port)['queues']['queue_keys']}


def commandstats(client):
    """{command: calls} from INFO commandstats."""
    info = client.info('commandstats')
    return {k[len('cmdstat_'):]: v['calls'] for k, v in info.items()}


def queues_yaml(globs, interval_ms=INTERVAL_MS, keys_per_round=100, max_keys=1000, workers=None):
    lines = ['queues:']
    for g in globs:
        lines.append('  - keys: %s' % json.dumps(g))
    lines += ['queue_depths:', '  interval_ms: %d' % interval_ms,
              '  keys_per_round: %d' % keys_per_round, '  max_keys: %d' % max_keys]
    if workers is not None:
        lines.append('workers: %d' % workers)
    return '\n'.join(lines) + '\n'


class QueueDepthsTest(unittest.TestCase):
    def setUp(self):
        self.redis = RedisServer()
        # SIGKILL: Redis refuses SIGTERM while it writes the first AOF.
        self.addCleanup(self.redis.kill)

    def start_ferry(self, **kw):
        f = Ferry(self.redis, extra_yaml=queues_yaml(**kw))
        self.addCleanup(f.stop)
        return f

    def wait_length(self, port, key, want, deadline_s, what):
        """Seconds until /stats shows key at length want; fails past deadline_s."""
        t0 = time.monotonic()
        last = None
        while time.monotonic() - t0 < deadline_s:
            last = key_lengths(port).get(key)
            if (last[1] if last else 0) == want:
                return time.monotonic() - t0
            time.sleep(0.02)
        self.fail('%s: %s not at %d within %.1f s (last %r)' % (what, key, want, deadline_s, last))

    def test_depth_follows_producer_and_consumer(self):
        f = self.start_ferry(globs=['jobs:*', 'delayed:*'])
        c = f.client()
        deadline = FOLLOW_S
        for i in range(300):
            c.lpush('jobs:a', 'item%d' % i)
        took = self.wait_length(f.stats_port, 'jobs:a', 300, deadline, 'after 300 pushes')
        for i in range(120):
            c.rpop('jobs:a')
        took2 = self.wait_length(f.stats_port, 'jobs:a', 180, deadline, 'after 120 pops')
        c.zadd('delayed:z', {'a': 1, 'b': 2})
        c.xadd('jobs:s', {'f': 'v'})
        c.set('jobs:plain', 'not a queue')
        wait_until(lambda: key_lengths(f.stats_port).get('delayed:z') == ('zset', 2) and
                   key_lengths(f.stats_port).get('jobs:s') == ('stream', 1),
                   timeout=deadline, msg='zset and stream lengths')
        self.assertNotIn('jobs:plain', key_lengths(f.stats_port))
        c.delete('jobs:a')  # consumed to the end: Redis removes the key
        wait_until(lambda: 'jobs:a' not in key_lengths(f.stats_port), timeout=deadline,
                   msg='a deleted key leaves the list')
        d = stats(f.stats_port)['queues']
        self.assertEqual([q['keys'] for q in d['queues']], [['jobs:*'], ['delayed:*']])
        self.assertEqual(d['queues'][0]['pushes'], 301)  # 300 LPUSH and one XADD
        self.assertEqual(d['queues'][0]['pops'], 120)
        self.assertEqual(d['queues'][1]['pushes'], 1)
        self.assertEqual(d['queues'][0]['length'], 1)
        self.assertIs(d['queue_sampling'], True)
        metrics = get(f.stats_port, '/metrics')
        self.assertIn('ferry_queue_length{queue="delayed:z",keys="delayed:*"} 2\n', metrics)
        self.assertIn('ferry_queue_pushes_total{keys="jobs:*"} 301\n', metrics)
        self.assertIn('ferry_queue_pops_total{keys="jobs:*"} 120\n', metrics)
        print('\nqueue depth followed 300 pushes in %.0f ms, 120 pops in %.0f ms '
              '(interval %d ms)' % (took * 1000, took2 * 1000, INTERVAL_MS))

    def test_pushes_and_pops_summed_over_workers(self):
        f = self.start_ferry(globs=['w:*'], workers=4)
        clients = [f.client() for _ in range(8)]
        for n, c in enumerate(clients):
            for i in range(25):
                c.rpush('w:%d' % (n % 3), i)
            c.blpop(['other', 'w:%d' % (n % 3)], timeout=1)
            c.lmove('w:%d' % (n % 3), 'w:done', 'LEFT', 'RIGHT')
            c.lmpop(2, 'nope', 'w:done', direction='LEFT')
        d = stats(f.stats_port)
        self.assertEqual(d['workers'], 4)
        q = d['queues']['queues'][0]
        self.assertEqual(q['pushes'], 8 * 25 + 8)  # RPUSH and LMOVE's push side
        self.assertEqual(q['pops'], 8 * 3)         # BLPOP, LMOVE's pop side, LMPOP
        total = sum(clients[0].llen('w:%d' % i) for i in range(3)) + clients[0].llen('w:done')
        wait_until(lambda: stats(f.stats_port)['queues']['queues'][0]['length'] == total,
                   timeout=FOLLOW_S, msg='summed length')

    def test_many_keys_cost_at_most_keys_per_round(self):
        r = self.redis.client()
        r.eval("for i = 1, 100000 do redis.call('RPUSH', 'big:' .. i, 'x') end", 0)
        self.assertEqual(r.dbsize(), 100000)
        per_round, interval_ms = 100, 50
        f = self.start_ferry(globs=['big:*'], interval_ms=interval_ms, keys_per_round=per_round,
                             max_keys=500)
        wait_until(lambda: stats(f.stats_port)['queues']['queue_sample_rounds'] > 2,
                   timeout=FOLLOW_S, msg='sampling started')
        r.config_resetstat()
        q0 = stats(f.stats_port)['queues']
        t0 = time.monotonic()
        time.sleep(3)
        q1 = stats(f.stats_port)['queues']
        elapsed = time.monotonic() - t0
        calls = commandstats(r)
        rounds = q1['queue_sample_rounds'] - q0['queue_sample_rounds']
        # one round in flight at each end may straddle the reset
        self.assertLessEqual(rounds, elapsed * 1000 / interval_ms + 2)
        self.assertGreater(rounds, 10)
        self.assertNotIn('keys', calls)
        self.assertLessEqual(calls.get('scan', 0), rounds + 1)
        self.assertLessEqual(calls.get('type', 0), (rounds + 1) * per_round)
        self.assertLessEqual(calls.get('llen', 0), (rounds + 1) * per_round)
        self.assertLessEqual(q1['queue_keys_tracked'], 500)
        self.assertGreater(q1['queue_keys_tracked'], 0)
        print('\n100000 matching keys: %d rounds in %.1f s cost SCAN %d, TYPE %d, LLEN %d '
              '(keys_per_round %d, %d keys tracked)' % (
                  rounds, elapsed, calls.get('scan', 0), calls.get('type', 0),
                  calls.get('llen', 0), per_round, q1['queue_keys_tracked']))


class QueuesConfigTest(unittest.TestCase):
    def check(self, text):
        tmp = tempfile.TemporaryDirectory(prefix='ferry-qconf-')
        self.addCleanup(tmp.cleanup)
        d = tmp.name
        path = os.path.join(d, 'ferry.yml')
        with open(path, 'w') as fh:
            fh.write('redis: {address: 127.0.0.1:6379}\n' + text)
        p = subprocess.run([harness.FERRY_BIN, '-t', '-c', path], capture_output=True, text=True,
                           timeout=10)
        return p.returncode, (p.stdout + p.stderr), path

    def test_good_entries(self):
        rc, out, _ = self.check('queues:\n  - keys: "jobs:*"\n  - {keys: [a, "b:[0-9]*"]}\n'
                                'queue_depths: {interval_ms: 500, keys_per_round: 10}\n')
        self.assertEqual(rc, 0, out)

    def test_unknown_key_in_an_entry_is_refused_with_its_place(self):
        rc, out, path = self.check('queues:\n  - keys: "jobs:*"\n    lease_time: 30000\n')
        self.assertNotEqual(rc, 0)
        self.assertIn("%s:4:5: queues[0]: unknown key 'lease_time'" % path, out)
        # lease_ms is a key of the queue guards: it needs processing.
        rc, out, path = self.check('queues:\n  - keys: "jobs:*"\n    lease_ms: 30000\n')
        self.assertNotEqual(rc, 0)
        self.assertIn("%s:4:5: queues[0]: lease_ms, max_attempts, dead_letter, "
                      "consumer_backoff and lease_expire_on_disconnect need processing" % path,
                      out)

    def test_bad_shapes_are_refused(self):
        for text, where in (('queues: "jobs:*"\n', ':2:9: queues: expected a list'),
                            ('queues:\n  - "jobs:*"\n', ':3:5: queues[0]: expected a mapping'),
                            ('queues:\n  - {}\n', ':3:5: queues[0]: keys: is required'),
                            ('queues:\n  - keys: {a: 1}\n', ':3:11: queues[0].keys: expected'),
                            ('queue_depths: {keys_per_round: 0}\n', ':2:32: queue_depths.keys_per_round')):
            rc, out, _ = self.check(text)
            self.assertNotEqual(rc, 0, text)
            self.assertIn(where, out, text)


if __name__ == '__main__':
    unittest.main()
