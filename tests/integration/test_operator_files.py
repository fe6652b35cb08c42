"""What ships beside the binary agrees with the binary:

  AlertRulesTest  every metric contrib/prometheus/ferry-rules.yml uses is in a
                  live ferry's /metrics (a name that is not would make its
                  alert silently never fire), and every label its templates
                  print is one the series carry.
  ManPageTest     man/ferry.1.in documents every option, exit code and
                  signal of `ferry --help`, and the man page's version is
                  the project's.

The rules' own behaviour (each alert fires on its series, and not on
others) is tested by promtool (tests/prometheus/ferry-rules.test.yml, the
alerts stage of scripts/test); the installed package by tests/package/run.

Run: python3 -m unittest test_operator_files -v
"""
import re
import subprocess
import unittest

import yaml

import harness
from harness import FERRY_BIN, REPO, Ferry, RedisServer, wait_until
from test_stats import raw_http

RULES = REPO + '/contrib/prometheus/ferry-rules.yml'
MAN = REPO + '/man/ferry.1.in'

# Labels of every ferry series as Prometheus stores them (target labels).
TARGET_LABELS = {'instance', 'job'}


def http_get(port, path, timeout=5.0):
    line, body = raw_http(port, b'GET %s HTTP/1.0\r\n\r\n' % path.encode(), timeout)
    return line, body.decode()


def exposed(text):
    """{family name: set of label names} of a Prometheus text exposition;
    a histogram's _bucket/_sum/_count series count under their family."""
    families = {}
    for line in text.splitlines():
        m = re.match(r'# TYPE (\S+) \S+$', line)
        if m:
            families.setdefault(m.group(1), set())
            continue
        if not line or line.startswith('#'):
            continue
        m = re.match(r'([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? ', line)
        name, labels = m.group(1), m.group(2) or ''
        for suffix in ('_bucket', '_sum', '_count'):
            if name.endswith(suffix) and name[:-len(suffix)] in families:
                name = name[:-len(suffix)]
        families.setdefault(name, set()).update(re.findall(r'([a-zA-Z_]\w*)="', labels))
    return families


def rules():
    with open(RULES) as f:
        doc = yaml.safe_load(f)
    return [r for g in doc['groups'] for r in g['rules']]


class AlertRulesTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        if harness.DIRECT:
            raise unittest.SkipTest('the stats port is ferry\'s own')

    def live_metrics(self):
        """Families and labels of a live ferry's /metrics, with a queues: entry
        and one sampled queue key, so the per-queue series are there too."""
        redis = RedisServer()
        self.addCleanup(redis.kill)
        ferry = Ferry(redis, conf={'queues': [{'keys': 'jobs:*'}],
                                   'queue_depths': {'interval_ms': 100}})
        self.addCleanup(ferry.stop)
        ferry.client().rpush('jobs:a', 'x')
        got = {}

        def sampled():
            status, body = http_get(ferry.stats_port, '/metrics')
            self.assertIn('200', status)
            got['families'] = exposed(body)
            return 'queue' in got['families'].get('ferry_queue_length', set())
        wait_until(sampled, timeout=10, msg='ferry_queue_length{queue=...} in /metrics')
        families = got['families']
        for name, labels in self.cluster_metrics().items():
            families.setdefault(name, set()).update(labels)
        return families

    def cluster_metrics(self):
        """Families and labels of a cluster-mode ferry's /metrics (the per-shard
        series): in front of a one-node cluster serving every slot."""
        node = RedisServer({'cluster-enabled': 'yes', 'port': harness._free_cluster_port(),
                            'cluster-config-file': 'nodes-rules.conf',
                            # a node alone never learns its own address from a peer
                            'cluster-announce-ip': '127.0.0.1'})
        self.addCleanup(node.kill)
        node.client().execute_command('CLUSTER', 'ADDSLOTSRANGE', 0, 16383)
        # ferry weighs a map by config epochs: a lone node's is 0 until bumped
        node.client().execute_command('CLUSTER', 'BUMPEPOCH')
        ferry = Ferry(None, wait='port', conf={'workers': 1, 'cluster': {
            'nodes': ['127.0.0.1:%d' % node.port], 'refresh_interval_ms': 200}})
        self.addCleanup(ferry.stop)
        got = {}

        def shard_up():
            status, body = http_get(ferry.stats_port, '/metrics')
            self.assertIn('200', status)
            got['families'] = exposed(body)
            return 'ferry_cluster_shard_up{shard="0"} 1' in body
        wait_until(shard_up, timeout=15, msg='the one shard UP in a cluster-mode /metrics')
        return got['families']

    def test_every_metric_of_the_rules_is_exposed(self):
        live = self.live_metrics()
        used = {}
        for r in rules():
            for name in re.findall(r'\b(ferry_[a-z0-9_]+)\b', r['expr']):
                used.setdefault(name, []).append(r['alert'])
        self.assertGreaterEqual(len(used), 20, sorted(used))
        missing = {}
        for name, alerts in sorted(used.items()):
            if name in live:
                continue
            missing[name] = alerts
        self.assertEqual(missing, {}, 'metrics used by alerts but not in /metrics')

    def test_template_labels_exist(self):
        live = self.live_metrics()
        for r in rules():
            names = set(re.findall(r'\b(ferry_[a-z0-9_]+)\b', r['expr']))
            carried = set(TARGET_LABELS)
            for n in names:
                carried |= live.get(n, set())
            text = ' '.join(r.get('annotations', {}).values())
            for label in re.findall(r'\$labels\.(\w+)', text):
                self.assertIn(label, carried, '%s prints $labels.%s' % (r['alert'], label))
            for key in ('summary', 'description'):
                self.assertTrue(r.get('annotations', {}).get(key), '%s has no %s' % (r['alert'], key))
            self.assertIn(r.get('labels', {}).get('severity'), ('warning', 'critical'), r['alert'])


class ManPageTest(unittest.TestCase):
    def setUp(self):
        with open(MAN) as f:
            self.man = f.read()
        self.help = subprocess.run([FERRY_BIN, '--help'], stdout=subprocess.PIPE, check=True,
                                   timeout=30).stdout.decode()

    def section(self, title):
        m = re.search(r'^\.SH %s\n(.*?)(?=^\.SH |\Z)' % re.escape(title), self.man, re.S | re.M)
        self.assertIsNotNone(m, 'no .SH %s' % title)
        return m.group(1)

    def test_every_option_is_documented(self):
        longs = set(re.findall(r'(?<![\w-])--([a-z][a-z-]+)', self.help))
        shorts = set(re.findall(r'(?<![\w-])-([a-zA-Z])\b', self.help))
        self.assertGreaterEqual(len(longs), 7, self.help)
        self.assertGreaterEqual(len(shorts), 5, self.help)
        options = self.section('OPTIONS')
        for name in sorted(longs):
            self.assertTrue('\\-\\-' + name.replace('-', '\\-') in options,
                            '--%s is not in the man page\'s OPTIONS' % name)
        for name in sorted(shorts):
            self.assertRegex(options, r'\\-%s\b' % name, '-' + name)

    def test_exit_codes_and_signals(self):
        codes = set(re.findall(r'^\s+(\d)\s{2,}\S', self.help.split('Exit codes:')[1], re.M))
        self.assertGreaterEqual(codes, {'0', '1', '2', '3'})
        status = self.section('EXIT STATUS')
        self.assertEqual(set(re.findall(r'^\.B (\d+)$', status, re.M)), codes)
        signals = set(re.findall(r'\bSIG[A-Z]+', self.help))
        self.assertGreaterEqual(signals, {'SIGTERM', 'SIGINT', 'SIGHUP'})
        for sig in signals:
            self.assertIn(sig, self.section('SIGNALS'))

    def test_version_is_the_projects(self):
        out = subprocess.run([FERRY_BIN, '--version'], stdout=subprocess.PIPE, check=True,
                             timeout=30).stdout.decode().strip()
        with open(REPO + '/CMakeLists.txt') as f:
            version = re.search(r'^project\(ferry VERSION ([0-9.]+)', f.read(), re.M).group(1)
        self.assertEqual(out, 'ferry ' + version)
        self.assertIn('"ferry @PROJECT_VERSION@"', self.man)


if __name__ == '__main__':
    unittest.main()
