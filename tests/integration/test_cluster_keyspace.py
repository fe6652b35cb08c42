"""Commands about the whole keyspace through ferry in front of a Redis
Cluster (harness ClusterTopology: 3 masters + 3 replicas, node-timeout 2 s),
answered as one server holding every master's keys would:

  ClusterKeyspaceTest (one cluster and one ferry for the class; 300 string
  keys, 30 hashes and 10 keys with a TTL, on every shard):
    1. SCAN 0 ... COUNT 10 until the cursor is 0: every key, in a bounded
       number of calls, keys of every master among them.
    2. SCAN with MATCH and with TYPE: exactly the matching keys.
    3. KEYS *: every key once; KEYS with a pattern.
    4. DBSIZE: the sum of every master's DBSIZE (asked of the nodes).
    5. RANDOMKEY: a key that exists.
    6. INFO keyspace: db0 keys and expires summed over the masters; plain
       INFO has the summed Keyspace section and the other sections.
    6b. The same through a RESP3 connection (HELLO 3): INFO's verbatim
       string summed too.
    7. READONLY, READWRITE and ASKING: +OK from ferry; commands go on.
    8. CLUSTER subcommands: refused, saying ferry presents the cluster as
       one server.
    9. FLUSHDB ASYNC and FLUSHALL: every master empty (asked of the nodes);
       DBSIZE 0, KEYS empty, SCAN ends after a call per master,
       RANDOMKEY nil.
  ClusterScanFailoverTest (a cluster of its own: it is harmed): a SCAN
    under way; kill -9 of the master whose keys it is returning, between
    two calls; the scan goes on (the calls held while the shard has no
    master) and, once the replica is promoted, ends with every key.

Run:  python3 -m unittest test_cluster_keyspace -v        (about 40 s)
Ferry-only (skipped with FERRY_TEST_DIRECT=1); FERRY_TEST_WORKERS=4 runs
its ferry with 4 event loops.
"""
import json
import time
import unittest
import urllib.request

import redis

import harness
from harness import ClusterTopology, Ferry, wait_until
from test_queue_guards import keyslot

NSTR = 300
NHASH = 30
NTTL = 10
MAX_CALLS = 1000  # a scan of 340 keys with COUNT 10 takes far fewer


def start_ferry(cluster):
    return Ferry(None, wait='port', conf={
        'cluster': {'nodes': [cluster.seeds()[0]], 'refresh_interval_ms': 200,
                    'timeout_ms': 1000},
        'upstream': {'hold_timeout_ms': 30000}})


def wait_all_up(f, timeout=20):
    """Until ferry's map names every shard's master UP (its stats port)."""
    def up():
        d = json.loads(urllib.request.urlopen(
            'http://127.0.0.1:%d/stats' % f.stats_port, timeout=5).read())
        sh = d.get('cluster', {}).get('shards', [])
        return len(sh) == 3 and all(x['up'] for x in sh)
    return wait_until(up, timeout=timeout, interval=0.1, msg='every shard UP in ferry')


def fill(f):
    """The keys of the class, written through ferry; their names by kind."""
    c = f.client(socket_timeout=10)
    try:
        strings = {'k:%d' % i for i in range(NSTR)}
        hashes = {'h:%d' % i for i in range(NHASH)}
        ttl = {'t:%d' % i for i in range(NTTL)}
        for k in strings:
            c.set(k, 'v')
        for k in hashes:
            c.hset(k, 'f', 'v')
        for k in ttl:
            c.set(k, 'v', ex=3600)
        return strings, hashes, ttl
    finally:
        c.close()


def scan_all(c, count=10, **kw):
    """Every key a full SCAN returns (a list: repeats kept) and the calls."""
    keys, cursor, calls = [], 0, 0
    while True:
        cursor, batch = c.scan(cursor=cursor, count=count, **kw)
        keys.extend(batch)
        calls += 1
        if cursor == 0:
            return keys, calls
        if calls >= MAX_CALLS:
            raise AssertionError('SCAN did not end in %d calls' % MAX_CALLS)


def master_dbsize(cluster, port):
    return int(cluster.command(port, 'DBSIZE'))


@unittest.skipIf(harness.DIRECT, 'ferry-only')
class ClusterKeyspaceTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.cluster = ClusterTopology(masters=3, replicas=1, node_timeout_ms=2000)
        try:
            cls.ferry = start_ferry(cls.cluster)
            wait_all_up(cls.ferry)
            cls.strings, cls.hashes, cls.ttl = fill(cls.ferry)
            cls.all = cls.strings | cls.hashes | cls.ttl
        except BaseException:
            cls.cluster.stop()
            raise

    @classmethod
    def tearDownClass(cls):
        cls.ferry.stop()
        cls.cluster.stop()

    def setUp(self):
        self.c = self.ferry.client(socket_timeout=10)
        self.addCleanup(self.c.close)

    def test_1_scan_count_10_every_key(self):
        owners = self.cluster.wait_consistent()
        # the keys are on every master
        self.assertEqual({owners[keyslot(k)] for k in self.all},
                         set(self.cluster.masters()))
        keys, calls = scan_all(self.c, count=10)
        self.assertEqual(set(keys), self.all)
        print('\nSCAN COUNT 10 over %d keys on 3 masters: %d calls, %d keys returned'
              % (len(self.all), calls, len(keys)))
        self.assertGreater(calls, 3)
        # COUNT 1000: about one call per master and one to end
        keys, calls = scan_all(self.c, count=1000)
        self.assertEqual(set(keys), self.all)
        self.assertLessEqual(calls, 4)

    def test_2_scan_match_and_type(self):
        keys, _ = scan_all(self.c, count=10, match='k:1*')
        self.assertEqual(set(keys), {k for k in self.strings if k.startswith('k:1')})
        keys, _ = scan_all(self.c, count=10, _type='hash')
        self.assertEqual(set(keys), self.hashes)
        keys, _ = scan_all(self.c, count=10, match='t:*', _type='string')
        self.assertEqual(set(keys), self.ttl)
        # a cursor a node refuses: its error, as one server gives it
        with self.assertRaises(redis.ResponseError) as e:
            self.c.execute_command('SCAN', 'nope')
        self.assertIn('invalid cursor', str(e.exception))

    def test_3_keys(self):
        keys = self.c.keys('*')
        self.assertEqual(len(keys), len(self.all))
        self.assertEqual(set(keys), self.all)
        self.assertEqual(set(self.c.keys('h:*')), self.hashes)
        self.assertEqual(self.c.keys('nothing:*'), [])

    def test_4_dbsize_is_the_sum(self):
        masters = self.cluster.masters()
        per = [master_dbsize(self.cluster, p) for p in masters]
        self.assertTrue(all(n > 0 for n in per), per)
        self.assertEqual(self.c.dbsize(), sum(per))
        self.assertEqual(self.c.dbsize(), len(self.all))

    def test_5_randomkey(self):
        seen = set()
        for _ in range(20):
            k = self.c.randomkey()
            self.assertIn(k, self.all)
            seen.add(k)
        self.assertGreater(len(seen), 1)

    def test_6_info_keyspace_summed(self):
        ks = self.c.info('keyspace')
        self.assertEqual(ks['db0']['keys'], len(self.all))
        self.assertEqual(ks['db0']['expires'], NTTL)
        direct = [self.cluster.node_by_port(p).client().info('keyspace')
                  for p in self.cluster.masters()]
        self.assertEqual(ks['db0']['keys'], sum(d['db0']['keys'] for d in direct))
        info = self.c.info()
        self.assertEqual(info['db0']['keys'], len(self.all))
        self.assertIn('redis_version', info)
        self.assertIn('used_memory', info)
        # a section without the keyspace: one master's, as before
        self.assertIn('redis_version', self.c.info('server'))
        self.assertNotIn('db0', self.c.info('server'))

    def test_6b_resp3(self):
        s = self.ferry.raw(timeout=10)
        self.addCleanup(s.close)

        def call(*argv, raw=False):
            harness.resp_send(s, list(argv))
            return (harness.resp_read_raw if raw else harness.resp_read_reply)(s)
        self.assertIsInstance(call('HELLO', '3'), dict)
        self.assertEqual(call('DBSIZE'), len(self.all))
        self.assertEqual({k.decode() for k in call('KEYS', 'h:*')}, self.hashes)
        self.assertIn(call('RANDOMKEY').decode(), self.all)
        info = call('INFO', 'keyspace', raw=True)
        self.assertTrue(info.startswith(b'='), info[:20])  # RESP3's verbatim string
        self.assertIn(b'\r\ntxt:', info[:20])
        self.assertIn(b'db0:keys=%d,expires=%d,' % (len(self.all), NTTL), info)
        keys, cursor = set(), b'0'
        for _ in range(MAX_CALLS):
            cursor, batch = call('SCAN', cursor, 'COUNT', '50')
            keys |= {k.decode() for k in batch}
            if cursor == b'0':
                break
        self.assertEqual(cursor, b'0')
        self.assertEqual(keys, self.all)

    def test_7_readonly_readwrite_asking(self):
        for cmd in ('READONLY', 'READWRITE', 'ASKING'):
            self.assertTrue(self.c.execute_command(cmd))
            self.assertEqual(self.c.get('k:1'), 'v')

    def test_8_cluster_refused(self):
        for args in (('CLUSTER', 'INFO'), ('CLUSTER', 'SLOTS'), ('CLUSTER', 'NODES'),
                     ('CLUSTER', 'KEYSLOT', 'x')):
            with self.assertRaises(redis.ResponseError) as e:
                self.c.execute_command(*args)
            msg = str(e.exception)
            self.assertIn('presents the cluster as one server', msg)
            self.assertIn(' '.join(args[:2]), msg)
        self.assertEqual(self.c.get('k:1'), 'v')

    def test_9_flushdb_and_flushall(self):
        masters = self.cluster.masters()
        self.assertTrue(self.c.flushdb(asynchronous=True))
        wait_until(lambda: all(master_dbsize(self.cluster, p) == 0 for p in masters),
                   timeout=10, interval=0.05, msg='every master empty after FLUSHDB ASYNC')
        self.c.set('again:1', 'x')
        self.c.set('again:2', 'x')
        self.c.set('again:3', 'x')
        self.assertEqual(self.c.dbsize(), 3)
        self.assertTrue(self.c.execute_command('FLUSHALL', 'SYNC'))
        self.assertEqual([master_dbsize(self.cluster, p) for p in masters], [0, 0, 0])
        self.assertEqual(self.c.dbsize(), 0)
        self.assertEqual(self.c.keys('*'), [])
        self.assertEqual(scan_all(self.c), ([], len(masters)))  # a call per master
        self.assertIsNone(self.c.randomkey())
        self.assertNotIn('db0', self.c.info('keyspace'))
        # refused on a master: its error (a bad argument here) is the reply
        with self.assertRaises(redis.ResponseError) as e:
            self.c.execute_command('FLUSHALL', 'SOMETIMES')
        self.assertIn('syntax error', str(e.exception))


@unittest.skipIf(harness.DIRECT, 'ferry-only')
class ClusterScanFailoverTest(unittest.TestCase):
    """Its own cluster: a master is killed."""

    def setUp(self):
        self.cluster = ClusterTopology(masters=3, replicas=1, node_timeout_ms=2000)
        self.addCleanup(self.cluster.stop)
        self.ferry = start_ferry(self.cluster)
        self.addCleanup(self.ferry.stop)

    def replicas_synced(self):
        for p in self.cluster.masters():
            info = self.cluster.node_by_port(p).client().info('replication')
            off = info['master_repl_offset']
            if not info.get('connected_slaves') or info['slave0']['offset'] != off:
                return False
        return True

    def test_scan_survives_kill_9_of_the_shard_it_reads(self):
        wait_all_up(self.ferry)
        strings, hashes, ttl = fill(self.ferry)
        everything = strings | hashes | ttl
        wait_until(self.replicas_synced, timeout=20, interval=0.05,
                   msg='every replica has every key')
        owners = self.cluster.wait_consistent()
        c = self.ferry.client(socket_timeout=40)
        self.addCleanup(c.close)
        keys, cursor, calls = [], 0, 0
        # into the second master's keys (in the order ferry scans them)
        first_master = None
        while True:
            cursor, batch = c.scan(cursor=cursor, count=10)
            calls += 1
            keys.extend(batch)
            self.assertNotEqual(cursor, 0, 'the scan ended before the kill')
            seen = {owners[keyslot(k)] for k in batch}
            if first_master is None and seen:
                first_master = seen.pop()
            elif seen and seen != {first_master}:
                break
            self.assertLess(calls, MAX_CALLS)
        victim = owners[keyslot(keys[-1])]
        self.assertNotEqual(victim, first_master)
        from_victim = {k for k in everything if owners[keyslot(k)] == victim}
        got = {k for k in keys if owners[keyslot(k)] == victim}
        self.assertLess(len(got), len(from_victim), 'the victim\'s keys all returned already')
        t0 = time.monotonic()
        self.cluster.kill_master(victim)
        while cursor != 0:
            cursor, batch = c.scan(cursor=cursor, count=10)
            calls += 1
            keys.extend(batch)
            self.assertLess(calls, MAX_CALLS)
        took = time.monotonic() - t0
        promoted = self.cluster.wait_promoted(victim)
        self.assertEqual(set(keys) - everything, set())
        self.assertEqual(everything - set(keys), set(), 'keys the scan missed')
        print('\nSCAN across kill -9 of master %d (promoted: %d): %d calls, %d keys '
              'returned for %d, the rest of the scan took %.1f s'
              % (victim, promoted, calls, len(keys), len(everything), took))
        self.assertEqual(c.dbsize(), len(everything))


if __name__ == '__main__':
    unittest.main()
