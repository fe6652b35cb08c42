"""The protocol suite (test_protocol) and the compatibility matrix
(test_compat: redis-py, node-redis, ioredis, redis-cli, redis-benchmark,
RESP2 and RESP3) once more with ferry in front of a Redis Cluster: a class
per suite, each with one 3-master cluster (harness ClusterTopology, no
replicas: nothing here fails over) for all its tests, and a ferry per test,
as in the other modes.

The clients are plain ones (not cluster clients): ferry presents the
cluster as one server. What the suites read "on Redis" is read on the
cluster's masters by a reader that sends each key to its slot's master and
sums what every master counts (blocked clients, DBSIZE, subscribers).

Skipped on a cluster, each with its reason: what needs a database other
than 0 (a cluster has only db 0; ferry answers SELECT n with an error that
says so).

Run:  python3 -m unittest test_cluster_compat -v      (about 60 s here)
Ferry-only (skipped with FERRY_TEST_DIRECT=1); FERRY_TEST_WORKERS=4 runs
every ferry with 4 event loops.
"""
import unittest

import redis
from redis.crc import key_slot

import test_compat
import test_protocol
from harness import DIRECT, ClusterTopology, Ferry, wait_until

NO_DB = 'a cluster has only database 0 (ferry refuses SELECT of another db there)'


class ClusterReader:
    """What the suites read on Redis directly, read on the cluster: a
    keyed command goes to its first key's slot's master; counts are summed
    over every master."""

    def __init__(self, cluster, binary=False):
        self.cluster = cluster
        ports = cluster.masters()
        owners = cluster._slot_owners(ports[0])
        self.conns = {p: redis.Redis(host='127.0.0.1', port=p, decode_responses=not binary,
                                     socket_timeout=10) for p in ports}
        self.owner = owners

    def close(self):
        for c in self.conns.values():
            c.close()

    def all(self):
        return list(self.conns.values())

    def node(self, key):
        k = key if isinstance(key, bytes) else str(key).encode()
        return self.conns[self.owner[key_slot(k)]]

    def __getattr__(self, name):
        if name.startswith('_'):
            raise AttributeError(name)

        def keyed(key, *args, **kw):
            return getattr(self.node(key), name)(key, *args, **kw)
        return keyed

    # every master's keys or counts
    def exists(self, *keys):
        return sum(self.node(k).exists(k) for k in keys)

    def dbsize(self):
        return sum(c.dbsize() for c in self.all())

    def flushall(self):
        for c in self.all():
            c.flushall()

    def ping(self):
        return all(c.ping() for c in self.all())

    def client_list(self):
        return [x for c in self.all() for x in c.client_list()]

    def pubsub_numpat(self):
        return sum(c.pubsub_numpat() for c in self.all())

    def pubsub_numsub(self, *channels):
        per = [dict(c.pubsub_numsub(*channels)) for c in self.all()]
        return [(ch, sum(p.get(ch, 0) for p in per)) for ch in channels]

    def config_set(self, name, value):
        return all(c.config_set(name, value) for c in self.all())

    def config_get(self, name):
        got = [c.config_get(name) for c in self.all()]
        for g in got[1:]:
            if g != got[0]:
                raise AssertionError('masters differ on %s: %r' % (name, got))
        return got[0]

    def info(self, section=None):
        got = [c.info(section) for c in self.all()]
        if section == 'clients':
            out = dict(got[0])
            for k in ('blocked_clients', 'connected_clients'):
                out[k] = sum(g.get(k, 0) for g in got)
            return out
        return got[0]


def start_cluster_ferry(cluster, conf=None):
    c = {'cluster': {'nodes': [cluster.seeds()[0]], 'refresh_interval_ms': 1000,
                     'timeout_ms': 1000}}
    for k, v in (conf or {}).items():
        c[k] = v
    f = Ferry(None, wait='port', conf=c)
    try:
        probe = f.client(socket_timeout=5, password=(conf or {}).get('client', {}).get('password'))

        def served():
            return all(probe.set('probe:{%s}' % t, 1) for t in 'abc')
        try:
            wait_until(served, timeout=20, interval=0.1, msg='ferry serving the cluster')
        finally:
            probe.close()
    except BaseException:
        f.stop()
        raise
    return f


class ClusterOnce:
    """One 3-master cluster for the class (no replicas: nothing fails over)."""

    @classmethod
    def setUpClass(cls):
        if DIRECT:
            raise unittest.SkipTest('ferry-only: FERRY_TEST_DIRECT=1 has no cluster here')
        super().setUpClass()
        cls.cluster = ClusterTopology(masters=3, replicas=0, node_timeout_ms=2000)
        cls.addClassCleanup(cls.cluster.stop)


# ---------------------------------------------------------------- test_protocol

class ProtocolClusterMode(ClusterOnce):
    """test_protocol's Base, on the cluster: a ferry per test, the masters
    flushed first (the suite counts keys)."""

    def setUp(self):
        self.redis = None
        self.direct = ClusterReader(self.cluster)
        self.addCleanup(self.direct.close)
        self.ferry = start_cluster_ferry(self.cluster, self.ferry_conf)
        self.addCleanup(self.ferry.stop)
        self.direct.flushall()   # the probe keys too: the suite counts keys


class ProtocolPubSubCluster(ProtocolClusterMode, test_protocol.TestPubSub):

    def setUp(self):
        super().setUp()
        # The master a subscription lives on (ferry's choice, seen on the
        # nodes), and keys of its slots and of another master's.
        s = self.raw()
        self.assertEqual(self.call(s, 'SUBSCRIBE', 'home-probe'), ['subscribe', 'home-probe', 1])
        home = []

        def found():
            home[:] = [p for p in self.cluster.masters()
                       if self.cluster.node_by_port(p).client(socket_timeout=5)
                       .pubsub_numsub('home-probe')[0][1] == 1]
            return len(home) == 1
        wait_until(found, timeout=10, msg='the subscription on one master')
        s.close()
        keys = ['after-sub{%d}' % i for i in range(64)]
        self.AFTER_SUB_KEY = next(k for k in keys if self.cluster.master_of(
            key_slot(k.encode())) == home[0])
        self.OTHER_KEY = next(k for k in keys if self.cluster.master_of(
            key_slot(k.encode())) != home[0])

    def test_unsubscribed_connection_keys_of_another_shard(self):
        """A RESP2 connection that subscribed and then unsubscribed from
        everything stays on the master its subscriptions lived on: a key of
        another shard gets ferry's error, never the node's MOVED; after
        RESET it is routed by slot again."""
        other = self.OTHER_KEY
        s = self.raw()
        self.assertEqual(self.call(s, 'SUBSCRIBE', 'ch1'), ['subscribe', 'ch1', 1])
        self.assertEqual(self.call(s, 'UNSUBSCRIBE'), ['unsubscribe', 'ch1', 0])
        self.assertErr(self.call(s, 'SET', other, 'v'),
                       'ERR ferry: cluster mode: a connection that subscribed')
        self.assertEqual(self.call(s, 'SET', self.AFTER_SUB_KEY, 'w'), 'OK')
        self.assertEqual(self.call(s, 'RESET'), 'RESET')
        self.assertEqual(self.call(s, 'SET', other, 'v'), 'OK')
        self.assertEqual(self.call(s, 'GET', other), 'v')


class ProtocolTransactionsCluster(ProtocolClusterMode, test_protocol.TestTransactions):
    pass


class ProtocolSelectCluster(ProtocolClusterMode, test_protocol.TestSelect):
    def test_select_isolation(self):
        self.skipTest(NO_DB)

    def test_integer_arguments_read_as_redis_reads_them(self):
        # as in the other modes, but CLIENT UNBLOCK: a client id is one
        # node's, so ferry refuses it in cluster mode before reading its
        # argument (the other lines are the same)
        a = self.raw()
        for bad in ('+0', ' 0', '0 ', '00', '-0', '01', '+1', '1\x000',
                    '9223372036854775808', '-9223372036854775809', '99999999999999999999'):
            self.assertErr(self.call(a, 'SELECT', bad), 'ERR value is not an integer or out of range')
            self.assertErr(self.call(a, 'HELLO', bad),
                           'ERR Protocol version is not an integer or out of range')
            self.assertErr(self.call(a, 'CLIENT', 'UNBLOCK', bad),
                           'ERR ferry: cluster mode: CLIENT UNBLOCK is not routed yet')
        self.assertEqual(self.call(a, 'SET', 'ik', 'v'), 'OK')
        self.assertEqual(self.call(a, 'SELECT', '0'), 'OK')
        self.assertEqual(self.call(a, 'GET', 'ik'), 'v')


class ProtocolPipelineCluster(ProtocolClusterMode, test_protocol.TestPipeline):
    pass


class ProtocolDeniedCluster(ProtocolClusterMode, test_protocol.TestDenied):
    pass  # CONFIG SET reaches every master; CLIENT LIST is ferry's own list


class ProtocolAuthCluster(ProtocolClusterMode, test_protocol.TestAuth):
    pass


class ProtocolLifecycleCluster(ProtocolClusterMode, test_protocol.TestConnectionLifecycle):
    pass


class ProtocolMalformedCluster(ProtocolClusterMode, test_protocol.TestMalformed):
    pass


# ---------------------------------------------------------------- test_compat

class CompatClusterMode(ClusterOnce):
    MODE = 'cluster'
    HASH_TAG = True
    SKIP_CHECKS = {'select': NO_DB}

    def setUp(self):
        super().setUp()
        # the node driver counts blocked clients on every master directly
        self.NODE_PORTS = self.cluster.masters()
        self.ferry = start_cluster_ferry(self.cluster)
        self.addCleanup(self.ferry.stop)

    def m(self, db=0, binary=False):
        if db != 0:
            self.skipTest(NO_DB)
        cache = self.__dict__.setdefault('_cluster_readers', {})
        if binary not in cache:
            cache[binary] = ClusterReader(self.cluster, binary=binary)
            self.addCleanup(cache[binary].close)
        return cache[binary]

    def diag(self):
        return '--- ferry log ---\n%s' % self.ferry.log()[-6000:]


class CompatCluster(CompatClusterMode, test_compat.Resp2Checks, unittest.TestCase):
    pass


class CompatResp3Cluster(CompatClusterMode, test_compat.Resp3Checks, unittest.TestCase):
    pass


def tearDownModule():
    if test_compat.RESULTS:
        print('\n' + test_compat.matrix_text())


if __name__ == '__main__':
    unittest.main()
