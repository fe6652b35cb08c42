"""What operators see of ferry in front of a Redis Cluster (harness
ClusterTopology: 3 masters + 3 replicas, node-timeout 2 s):

  ClusterStatsTest (one cluster and one ferry for the class; the map is
  refreshed only on demand, so redirects reach ferry):
    1. After known traffic to every shard: per shard in /stats its first
       slot (the label), state UP, slots, requests routed (exactly what was
       sent), nothing held; the same figures in /metrics labelled
       shard="<first slot>" (promtool check metrics passes); the master-view
       summary is the whole cluster's (UP, not the view without a master);
       /healthz 200 naming every shard UP; the page's text summary has a
       line per shard; every key of the cluster document is described by
       --describe-stats and every cluster entry of it is in the document.
    2. Redirects are counted on the shard that answered them: ASK during a
       slot migration, MOVED after a reshard of one slot.
    3. The live page in a browser (test_page's driver): the shard count in
       its header, no error.
  ClusterUpScriptTest: `scripts/up --cluster` in a scratch copy on free
    ports (3 masters + 3 replicas and ferry in cluster mode; every shard UP
    through ferry; the documented /metrics line), a second run says it is
    running, scripts/down stops every process, and a new run starts the same
    cluster again from its nodes.conf.
  ClusterShardFailoverStatsTest (a cluster of its own: it is harmed):
    kill -9 of a shard's master: that shard, and only it, goes SWITCHING or
    DOWN in /stats and /metrics, /healthz says DEGRADED naming it (200: the
    other shards serve) and counts a held request, then UP on the promoted
    replica with the same label, one switch and a time since it.

Run:  python3 -m unittest test_cluster_ops -v        (about 40 s)
Ferry-only (skipped with FERRY_TEST_DIRECT=1); FERRY_TEST_WORKERS=4 runs
its ferry with 4 event loops.
"""
import json
import os
import re
import shutil
import subprocess
import tempfile
import threading
import time
import unittest
import urllib.error
import urllib.request

import redis

import harness
from harness import ClusterTopology, Ferry, wait_until
from test_page import CHROMIUM, HERE, Browser
from test_queue_guards import keyslot

PROMTOOL = shutil.which('promtool')


def get(f, path):
    """(status, body text) of GET path on f's stats port (an error status too)."""
    try:
        with urllib.request.urlopen('http://127.0.0.1:%d%s' % (f.stats_port, path),
                                    timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def stats(f):
    return json.loads(get(f, '/stats')[1])


def metrics(f):
    """{series: value} of f's /metrics, and the text."""
    text = get(f, '/metrics')[1]
    out = {}
    for line in text.splitlines():
        if line and not line.startswith('#'):
            series, value = line.rsplit(' ', 1)
            out[series] = float(value)
    return out, text


def by_port(doc):
    """{master port: shard object} of a stats document."""
    return {sh['master']['port']: sh for sh in doc['cluster']['shards']}


def key_for(slot, prefix='k'):
    """A key whose slot is slot."""
    return next('%s:%d' % (prefix, i) for i in range(1000000)
                if keyslot('%s:%d' % (prefix, i)) == slot)


def start_ferry(cluster, refresh_ms):
    return Ferry(None, wait='port', conf={
        'cluster': {'nodes': [cluster.seeds()[0]], 'refresh_interval_ms': refresh_ms,
                    'timeout_ms': 1000},
        'upstream': {'hold_timeout_ms': 30000}})


def wait_all_up(f, n=3, timeout=20):
    return wait_until(lambda: (lambda d: d if len(d['cluster']['shards']) == n and all(
        sh['up'] for sh in d['cluster']['shards']) else None)(stats(f)),
        timeout=timeout, interval=0.1, msg='every shard UP in ferry')


@unittest.skipIf(harness.DIRECT, 'ferry-only')
class ClusterStatsTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.cluster = ClusterTopology(masters=3, replicas=1, node_timeout_ms=2000)
        try:
            # the map is asked at start and on demand (MOVED, a lost node)
            cls.ferry = start_ferry(cls.cluster, refresh_ms=600000)
        except BaseException:
            cls.cluster.stop()
            raise

    @classmethod
    def tearDownClass(cls):
        cls.ferry.stop()
        cls.cluster.stop()

    def test_1_per_shard_figures_after_traffic(self):
        owners = self.cluster.wait_consistent()
        doc = wait_all_up(self.ferry)
        first = {}
        for s in range(16384):
            first.setdefault(owners[s], s)
        shards = by_port(doc)
        self.assertEqual(sorted(shards), sorted(first))
        # 5, 7 and 9 requests to the three shards, one at a time (after the
        # client's own start: a keyless command goes to any shard)
        sent = {}
        c = self.ferry.client(socket_timeout=5)
        try:
            self.assertTrue(c.ping())
            shards = by_port(stats(self.ferry))
            for n, port in zip((5, 7, 9), sorted(first)):
                key = key_for(first[port] + 1, 'ops%d' % port)
                self.assertEqual(self.cluster.master_of(keyslot(key)), port)
                for i in range(n):
                    self.assertTrue(c.set(key, str(i)))
                sent[port] = n
        finally:
            c.close()
        after = stats(self.ferry)
        for port, sh in by_port(after).items():
            self.assertEqual(sh['shard'], first[port], sh)
            self.assertEqual(sh['state'], 'UP')
            self.assertIs(sh['up'], True)
            self.assertEqual(sh['routed'] - shards[port]['routed'], sent[port], port)
            self.assertEqual(sh['held'], 0)
            self.assertEqual(sh['switches'], 0)
            self.assertIsNone(sh['since_switch_ms'])
            self.assertEqual(sh['not_up_ms'], 0)
            self.assertGreaterEqual(sh['links'], 1)
            self.assertEqual(sh['nslots'], sum(hi - lo + 1 for lo, hi in sh['slots']))
            self.assertEqual(sh['slots'][0][0], sh['shard'])
        cl = after['cluster']
        self.assertEqual(cl['shards_up'], 3)
        self.assertEqual(cl['slots_covered'], 16384)
        # the master-view summary is the cluster's: every shard UP
        up = after['upstream']
        self.assertIs(up['upstream_up'], True)
        self.assertEqual(up['upstream_state'], 'UP')
        self.assertEqual(up['down_for_ms'], 0)
        self.assertGreater(up['connected_since'], 0)
        self.assertIs(after['durability']['aof_enforced'], True)

        m, text = metrics(self.ferry)
        self.assertEqual(m['ferry_cluster_shards'], 3)
        self.assertEqual(m['ferry_cluster_shards_up'], 3)
        self.assertEqual(m['ferry_upstream_up'], 1)
        self.assertEqual(m['ferry_upstream_down_for_seconds'], 0)
        for port, sh in by_port(after).items():
            lab = '{shard="%d"}' % sh['shard']
            self.assertEqual(m['ferry_cluster_shard_up' + lab], 1)
            self.assertGreaterEqual(m['ferry_cluster_shard_requests_total' + lab], sh['routed'])
            self.assertEqual(m['ferry_cluster_shard_slots' + lab], sh['nslots'])
            self.assertEqual(m['ferry_cluster_shard_held_requests' + lab], 0)
            self.assertEqual(m['ferry_cluster_shard_switches_total' + lab], 0)
            self.assertNotIn('ferry_cluster_shard_since_switch_seconds' + lab, m)
            self.assertEqual(m['ferry_cluster_shard_info{shard="%d",master="127.0.0.1:%d",'
                               'state="UP"}' % (sh['shard'], port)], 1)
        # every per-shard family described has a series for each shard
        # (since_switch: none before a switch)
        out = subprocess.run([harness.FERRY_BIN, '--describe-stats'], check=True,
                             stdout=subprocess.PIPE).stdout.decode()
        for line in out.splitlines():
            path, typ, prom = line.split()[:3]
            if not path.startswith('cluster.shards[].') or prom == '-' or typ == 'text' \
                    or path.endswith('since_switch_ms'):
                continue
            for sh in after['cluster']['shards']:
                self.assertIn('%s{shard="%d"}' % (prom, sh['shard']), m, path)
        types = dict(re.findall(r'^# TYPE (\S+) (\S+)$', text, re.M))
        for name, typ in types.items():
            if typ == 'counter':
                self.assertTrue(name.endswith('_total'), name)
        if PROMTOOL:
            p = subprocess.run([PROMTOOL, 'check', 'metrics'], input=text.encode(),
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=30)
            self.assertEqual(p.returncode, 0, p.stdout.decode())

        status, body = get(self.ferry, '/healthz')
        self.assertEqual((status, body), (200, "OK: every shard's master is UP (3 shard(s))\n"))
        _, page = get(self.ferry, '/')
        for port, sh in by_port(after).items():
            self.assertIn('shard %d: UP, master 127.0.0.1:%d' % (sh['shard'], port), page)
        self.assertIn('id="shards"', page)

        # --describe-stats documents the cluster document, both ways
        out = subprocess.run([harness.FERRY_BIN, '--describe-stats'], check=True,
                             stdout=subprocess.PIPE).stdout.decode()
        described = {line.split()[0] for line in out.splitlines()
                     if '(cluster mode)' in line}
        found = {'mode', 'routing', 'cluster.shards'}
        found |= {'cluster.' + k for k in cl if k != 'shards'}
        for sh in cl['shards']:
            found |= {'cluster.shards[].' + k for k in sh}
        self.assertEqual(sorted(found), sorted(described))

    def test_2_redirects_counted_on_the_answering_shard(self):
        self.cluster.wait_consistent()
        wait_all_up(self.ferry)
        masters = self.cluster.masters()
        src, dst = masters[0], masters[2]
        ids = {v['port']: v['id'] for v in self.cluster.nodes_view(src)}
        view = [v for v in self.cluster.nodes_view(src) if v['port'] == src][0]
        slot = sorted(view['slots'])[10]
        key = key_for(slot, 'ask')
        before_doc = stats(self.ferry)
        before = by_port(before_doc)
        # ASK: the slot migrates from src to dst, the key is not on src
        self.cluster.command(dst, 'CLUSTER', 'SETSLOT', slot, 'IMPORTING', ids[src])
        self.cluster.command(src, 'CLUSTER', 'SETSLOT', slot, 'MIGRATING', ids[dst])
        c = self.ferry.client(socket_timeout=5)
        try:
            self.assertTrue(c.set(key, 'asked'))
        finally:
            c.close()
        asked = by_port(stats(self.ferry))
        self.assertEqual(asked[src]['asked'] - before[src]['asked'], 1)
        self.assertEqual(asked[dst]['asked'], before[dst]['asked'])
        self.assertEqual(asked[src]['moved'], before[src]['moved'])
        n = self.cluster.node_by_port(dst).client(socket_timeout=5)
        try:
            p = n.pipeline(transaction=False)  # one connection: ASKING then DEL
            p.execute_command('ASKING')
            p.delete(key)
            p.execute()
        finally:
            n.close()
        for port in (src, dst):
            self.cluster.command(port, 'CLUSTER', 'SETSLOT', slot, 'STABLE')
        # MOVED: one slot resharded from src to dst; ferry's map (asked only
        # on demand) still sends its key to src, which answers MOVED
        owners = self.cluster.wait_consistent()
        moved = sorted(s for s, o in self.cluster.reshard(src, dst, 1).items()
                       if o != owners[s])
        self.assertEqual(len(moved), 1, moved)
        key = key_for(moved[0], 'mv')
        c = self.ferry.client(socket_timeout=5)
        try:
            self.assertTrue(c.set(key, 'moved'))
        finally:
            c.close()
        doc = stats(self.ferry)
        now = by_port(doc)
        self.assertEqual(now[src]['moved'] - before[src]['moved'], 1)
        self.assertEqual(now[dst]['moved'], before[dst]['moved'])
        self.assertEqual(doc['cluster']['moved_followed'] -
                         before_doc['cluster']['moved_followed'], 1)
        m, _ = metrics(self.ferry)
        self.assertEqual(m['ferry_cluster_shard_moved_total{shard="%d"}' % now[src]['shard']],
                         now[src]['moved'])
        self.assertEqual(m['ferry_cluster_shard_ask_total{shard="%d"}' % now[src]['shard']],
                         now[src]['asked'])

    def test_3_page_in_browser(self):
        if not os.path.exists(CHROMIUM):
            raise AssertionError('chromium is not installed: run scripts/setup')
        if not os.path.isdir(os.path.join(HERE, 'node_modules', 'puppeteer-core')):
            raise AssertionError('puppeteer-core is missing from node_modules: run scripts/setup')
        wait_all_up(self.ferry)
        out = harness._mkdtemp('ferry-page-cluster-')
        b = Browser(self, self.ferry.stats_port, out)
        b.wait(lambda e: e['ev'] == 'view' and e['state'] == 'UP'
               and e['master'] == '3 of 3 shard(s) UP', 10, 'the shards in the header')
        b.shot('cluster')
        self.assertEqual(b.errors(), [])


@unittest.skipIf(harness.DIRECT, 'ferry-only')
class ClusterUpScriptTest(unittest.TestCase):
    """scripts/up --cluster and scripts/down, as docs/cluster.md shows them."""

    def setUp(self):
        tmp = tempfile.mkdtemp(prefix='ferry-up-cluster-')
        self.addCleanup(shutil.rmtree, tmp, True)
        self.root = os.path.join(tmp, 'repo')
        os.mkdir(self.root)
        for name in ('scripts', 'config', 'cmake'):
            os.symlink(os.path.join(harness.REPO, name), os.path.join(self.root, name))
        os.mkdir(os.path.join(self.root, 'build'))
        os.symlink(harness.FERRY_BIN, os.path.join(self.root, 'build', 'ferry'))
        self.ports = [harness._free_cluster_port() for _ in range(6)]
        self.ferry_port, self.stats_port = harness.free_port(), harness.free_port()
        self.env = dict(os.environ, UP_SKIP_SETUP='1', FERRY_BIN=harness.FERRY_BIN,
                        UP_TIMEOUT='60', CLUSTER_PORTS=' '.join(map(str, self.ports)),
                        FERRY_PORT=str(self.ferry_port), STATS_PORT=str(self.stats_port))
        self.addCleanup(self.sh, 'scripts/down')

    def sh(self, cmd, timeout=180):
        p = subprocess.run(['bash', '-c', cmd], cwd=self.root, env=self.env,
                           stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, timeout=timeout)
        return p.returncode, p.stdout.decode(errors='replace')

    def pids(self):
        """{name: pid} of what run/ names, alive."""
        out = {}
        run = os.path.join(self.root, 'run')
        for d, _, files in os.walk(run):
            for f in files:
                if f.endswith('.pid'):
                    with open(os.path.join(d, f)) as fh:
                        pid = int(fh.read().strip() or 0)
                    if pid and os.path.exists('/proc/%d' % pid):
                        out[os.path.relpath(os.path.join(d, f), run)] = pid
        return out

    def served(self):
        """Keys of every shard set and read back through ferry."""
        c = redis.Redis(port=self.ferry_port, socket_timeout=10)
        try:
            for i in range(30):
                self.assertTrue(c.set('up:%d' % i, str(i)))
            return [int(c.get('up:%d' % i)) for i in range(30)]
        finally:
            c.close()

    def test_up_cluster_then_down(self):
        rc, out = self.sh('scripts/up --cluster')
        self.assertEqual(rc, 0, out)
        self.assertIn('ferry is up (cluster mode, 3 masters + 3 replicas', out)
        self.assertIn('connect: redis-cli -p %d' % self.ferry_port, out)
        self.assertEqual(len(self.pids()), 7, self.pids())
        self.assertEqual(self.served(), list(range(30)))
        def doc():
            return json.loads(urllib.request.urlopen(
                'http://127.0.0.1:%d/stats' % self.stats_port, timeout=5).read())
        self.assertEqual(len(doc()['cluster']['shards']), 3)
        for sh in doc()['cluster']['shards']:
            self.assertIn(sh['master']['port'], self.ports)
            self.assertEqual(sh['state'], 'UP')
        # (ferry's map is asked every second: the replicas as the nodes list them)
        wait_until(lambda: all(len(sh['replicas']) == 1 for sh in doc()['cluster']['shards']),
                   timeout=10, interval=0.2, msg='a replica per shard in ferry\'s map')
        # docs/cluster.md's line, on this run's stats port
        rc, out = self.sh("curl -s 127.0.0.1:%d/metrics | grep '^ferry_cluster_shard_up'"
                          % self.stats_port, timeout=30)
        self.assertEqual(rc, 0, out)
        self.assertEqual(len(re.findall(r'^ferry_cluster_shard_up\{shard="\d+"\} 1$', out, re.M)),
                         3, out)
        rc, out = self.sh('scripts/up --cluster')
        self.assertEqual(rc, 0, out)
        self.assertIn('already running', out)
        rc, out = self.sh('scripts/down')
        self.assertEqual(rc, 0, out)
        self.assertEqual(self.pids(), {})
        # the same cluster again, from the nodes.conf of the first run
        rc, out = self.sh('scripts/up --cluster')
        self.assertEqual(rc, 0, out)
        self.assertIn('starting the cluster of run/redis-<port>/nodes.conf again', out)
        self.assertEqual(self.served(), list(range(30)))
        rc, out = self.sh('scripts/down')
        self.assertEqual((rc, self.pids()), (0, {}), out)


@unittest.skipIf(harness.DIRECT, 'ferry-only')
class ClusterShardFailoverStatsTest(unittest.TestCase):
    """Its own cluster: a master is killed."""

    def setUp(self):
        self.cluster = ClusterTopology(masters=3, replicas=1, node_timeout_ms=2000)
        self.addCleanup(self.cluster.stop)
        self.ferry = start_ferry(self.cluster, refresh_ms=200)
        self.addCleanup(self.ferry.stop)

    def test_shard_switching_then_up_after_kill_9(self):
        owners = self.cluster.wait_consistent()
        wait_all_up(self.ferry)
        victim = owners[0]
        label = 0
        replica = wait_until(lambda: (self.cluster.replicas_of(victim) or [None])[0],
                             timeout=20, interval=0.1, msg='a replica of %d known' % victim)
        others = [sh for p, sh in by_port(stats(self.ferry)).items() if p != victim]
        key = key_for(label + 1, 'held')
        t0 = time.monotonic()
        self.cluster.kill_master(victim)
        seen = {}

        def not_up():
            d = stats(self.ferry)
            sh = [s for s in d['cluster']['shards'] if s['shard'] == label][0]
            return (d, sh) if not sh['up'] else None
        d, sh = wait_until(not_up, timeout=10, interval=0.05,
                           msg='shard %d not UP in ferry after kill -9' % label)
        t_down = time.monotonic() - t0
        self.assertIn(sh['state'], ('SWITCHING', 'DOWN'))
        self.assertEqual(d['cluster']['shards_up'], 2)
        self.assertEqual(sorted(s['shard'] for s in d['cluster']['shards'] if s['up']),
                         sorted(s['shard'] for s in others))
        self.assertIs(d['upstream']['upstream_up'], False)
        self.assertEqual(d['upstream']['upstream_state'], sh['state'])
        # a write for that shard waits for its new master
        result = {}

        def writer():
            c = self.ferry.client(socket_timeout=30)
            try:
                result['set'] = c.set(key, 'after')
            except Exception as e:  # noqa: BLE001 - reported below
                result['error'] = repr(e)
            finally:
                c.close()
        t = threading.Thread(target=writer)
        t.start()
        self.addCleanup(t.join, 30)

        def held_seen():
            status, body = get(self.ferry, '/healthz')
            m, _ = metrics(self.ferry)
            d = stats(self.ferry)
            sh = [s for s in d['cluster']['shards'] if s['shard'] == label][0]
            self.assertFalse(sh['up'], 'shard %d UP again before its held write was seen'
                             % label)
            if sh['held'] >= 1 and 'request(s) held' in body and \
                    m.get('ferry_cluster_shard_held_requests{shard="%d"}' % label, 0) >= 1:
                seen.update(status=status, body=body, m=m)
                return True
            return None
        wait_until(held_seen, timeout=10, interval=0.05, msg='the write held for shard %d' % label)
        self.assertEqual(seen['status'], 200, seen['body'])
        self.assertRegex(seen['body'], r'^OK: 2 of 3 shard\(s\) UP; DEGRADED: 1 shard\(s\) '
                                       r'without a master')
        # (the map names the old master until it names the promoted replica)
        self.assertRegex(seen['body'], r'\nshard %d \(master 127\.0\.0\.1:(%d|%d), \d+ '
                                       r'slot\(s\)\): (SWITCHING|DOWN) for \d+ ms'
                         % (label, victim, replica))
        m = seen['m']
        self.assertEqual(m['ferry_cluster_shard_up{shard="%d"}' % label], 0)
        self.assertGreater(m['ferry_cluster_shard_not_up_seconds{shard="%d"}' % label], 0)
        self.assertEqual(m['ferry_cluster_shards_up'], 2)
        for o in others:
            self.assertEqual(m['ferry_cluster_shard_up{shard="%d"}' % o['shard']], 1)

        # UP again on the promoted replica, with the same label
        new = self.cluster.wait_promoted(victim)
        self.assertEqual(new, replica)

        def back():
            d = stats(self.ferry)
            sh = [s for s in d['cluster']['shards'] if s['shard'] == label]
            return (d, sh[0]) if sh and sh[0]['up'] and sh[0]['master']['port'] == new else None
        d, sh = wait_until(back, timeout=20, interval=0.1,
                           msg='shard %d UP on the promoted replica %d' % (label, new))
        t_up = time.monotonic() - t0
        print('\n  kill -9 of master %d: shard %d not UP on the stats port after %.2f s, UP on '
              'the promoted replica %d after %.2f s (node-timeout 2 s)' % (
                  victim, label, t_down, new, t_up))
        t.join(30)
        self.assertEqual(result, {'set': True})
        self.assertEqual(sh['switches'], 1)
        self.assertIsNotNone(sh['since_switch_ms'])
        self.assertGreater(sh['since_switch_ms'], 0)
        self.assertEqual(sh['held'], 0)
        self.assertIs(d['upstream']['upstream_up'], True)
        self.assertEqual(d['failover']['failovers'], 1)
        rec = d['failover']['recent']
        self.assertEqual([(r['from'], r['to']) for r in rec],
                         [('127.0.0.1:%d' % victim, '127.0.0.1:%d' % new)], rec)
        for o in others:
            self.assertEqual(by_port(d)[o['master']['port']]['switches'], 0)
        status, body = get(self.ferry, '/healthz')
        self.assertEqual(status, 200, body)
        self.assertTrue(body.startswith("OK: every shard's master is UP"), body)
        m, _ = metrics(self.ferry)
        self.assertEqual(m['ferry_cluster_shard_up{shard="%d"}' % label], 1)
        self.assertEqual(m['ferry_cluster_shard_switches_total{shard="%d"}' % label], 1)
        self.assertGreater(m['ferry_cluster_shard_since_switch_seconds{shard="%d"}' % label], 0)
        self.assertEqual(m['ferry_cluster_shard_info{shard="%d",master="127.0.0.1:%d",'
                           'state="UP"}' % (label, new)], 1)


if __name__ == '__main__':
    unittest.main()
