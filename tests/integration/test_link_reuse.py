"""A client's calls that take a dedicated link (scripts, blocking pops,
transactions, SELECT) reuse one link, call after call: with replicas_ack,
a call whose reply is empty (a script returning nil, a BRPOP that timed
out) leaves ferry's own WAIT and ROLE in flight behind it; the link goes
back to the pool once they are answered, not closed and opened again for
the next call (before: one new connection to the master per call).

Each check counts, over N calls of one client (N_BLOCKING of a blocking
call that times out), the dedicated links ferry opened (stats:
upstream.links_opened_dedicated) and, independently, the connections the
master accepted (INFO stats total_connections_received).
The safety side: a link that carries what its client set (SELECT, CLIENT
SETNAME, a blocked pop) is still closed when its client leaves, and in
cluster mode the name ferry sets again on each link lent to a named client
comes off before the link is pooled. Classes: Sentinel mode (replicas_ack
1 by default), a fixed master with replicas_ack 1 (one replica) and with
the default 0, cluster mode with replicas_ack 1.

Run: python3 -m unittest test_link_reuse -v
     FERRY_TEST_WORKERS=4 python3 -m unittest test_link_reuse -v
"""

import socket
import threading
import unittest

import harness
from harness import (ClusterTopology, Ferry, RedisServer, SentinelTopology, resp_encode,
                     resp_read_reply, wait_until)
from modes import FixedMasterMode, SentinelMode, key_prefix, sentinel_first
from test_stats import stats_json

N = 200  # calls per check
N_BLOCKING = 30  # of a blocking call that times out (Redis ends it within 100 ms)
# The first call may open the client's link. After it, a link given back
# with its WAIT in flight is pooled once the WAIT answers: a client whose
# next call comes sooner gets another one, and they take turns. Measured:
# 0 or 1 opened over the calls of a check as a rule, 9 at most (a WAIT
# answered late: Redis 7.0 has it wait for the replica's acknowledgement of
# anything written since); before: one per call.
MAX_OPENED = 20
# The master also counts whatever else connects meanwhile (a sentinel's or
# a replica's reconnect).
MAX_ACCEPTED = MAX_OPENED + 1

NIL_SCRIPT = "return redis.call('RPOP', KEYS[1])"
PUSH_SCRIPT = "return redis.call('LPUSH', KEYS[1], ARGV[1])"


def connect(ferry):
    return socket.create_connection(('127.0.0.1', ferry.port), timeout=10)


def ask(sock, *args):
    sock.sendall(resp_encode(*args))
    return resp_read_reply(sock, timeout=10)


def accepted(direct):
    return direct.info('stats')['total_connections_received']


class Checks:
    LINKS_PER_LOOP = 2  # a shared link and a probe (cluster mode: per shard)

    def setUp(self):
        super().setUp()
        self.direct = self.master().client()
        self.addCleanup(self.direct.close)
        self.k = key_prefix(self)

    def key(self, name):
        return '%s:%s' % (self.k, name)

    def opened(self):
        return stats_json(self.ferry.stats_port)['upstream']

    def calls(self, call, n=N):
        """call(sock, i) n + 1 times on one client connection (the first,
        i = -1, may open its link); returns the dedicated links opened and
        the connections the master accepted over the last n, and ferry's
        upstream stats before and after them."""
        s = connect(self.ferry)
        self.addCleanup(s.close)
        call(s, -1)
        # Each event loop opens its shared link and its probe at start: not
        # counted in what the master accepts during the calls.
        loops = int(harness.WORKERS or 1)
        wait_until(lambda: (lambda u: u['links_opened'] - u['links_opened_dedicated'])(
            self.opened()) >= self.LINKS_PER_LOOP * loops, timeout=10,
            msg="every loop's shared links and probes")
        before, conns = self.opened(), accepted(self.direct)
        for i in range(n):
            call(s, i)
        after = self.opened()
        return (after['links_opened_dedicated'] - before['links_opened_dedicated'],
                accepted(self.direct) - conns, before, after)

    def check(self, call, n=N):
        opened, conns, before, after = self.calls(call, n)
        why = {k: after[k] - before[k] for k in after
               if k.startswith('links_opened') and after[k] != before[k]}
        self.assertLessEqual(opened, MAX_OPENED, '%s\n%s' % (why, self.diag()))
        self.assertLessEqual(conns, MAX_ACCEPTED, '%s\n%s' % (why, self.diag()))

    # ------------------------------------------------- the four calls

    def test_nil_evalsha(self):
        sha = self.direct.script_load(NIL_SCRIPT)
        q = self.key('empty')
        self.check(lambda s, i: self.assertIsNone(ask(s, 'EVALSHA', sha, '1', q)))

    def test_multi_key_brpop_timing_out(self):
        q = [self.key('q%d' % i) for i in range(3)]
        self.check(lambda s, i: self.assertIsNone(ask(s, 'BRPOP', *q, '0.05')), N_BLOCKING)

    def test_nil_rpop(self):
        q = self.key('empty')
        self.check(lambda s, i: self.assertIsNone(ask(s, 'RPOP', q)))

    def test_pushing_script(self):
        q = self.key('pushed')
        self.check(lambda s, i: self.assertEqual(ask(s, 'EVAL', PUSH_SCRIPT, '1', q, 'v'), i + 2))
        self.assertEqual(self.direct.llen(q), N + 1)

    # ------------------------------------------------------------- siblings

    def test_script_returning_an_item(self):
        q = self.key('items')
        self.direct.rpush(q, *['i%d' % i for i in range(N + 1)])
        self.check(lambda s, i: self.assertEqual(ask(s, 'EVAL', NIL_SCRIPT, '1', q),
                                                 b'i%d' % (N - 1 - i)))

    def test_read_only_script_returning_nil(self):
        q = self.key('empty')
        self.check(lambda s, i: self.assertIsNone(
            ask(s, 'EVAL_RO', "return redis.call('LINDEX', KEYS[1], 0)", '1', q)))

    def test_brpop_timing_out(self):
        q = self.key('q')
        self.check(lambda s, i: self.assertIsNone(ask(s, 'BRPOP', q, '0.05')), N_BLOCKING)

    def test_multi_key_brpop_taking_an_item(self):
        q = [self.key('q%d' % i) for i in range(3)]
        self.direct.rpush(q[2], *['i%d' % i for i in range(N + 1)])
        self.check(lambda s, i: self.assertEqual(ask(s, 'BRPOP', *q, '0.05'),
                                                 [q[2].encode(), b'i%d' % (N - 1 - i)]))

    def test_blmove_timing_out(self):
        src, dst = self.key('src'), self.key('dst')
        self.check(lambda s, i: self.assertIsNone(
            ask(s, 'BLMOVE', src, dst, 'LEFT', 'RIGHT', '0.05')), N_BLOCKING)

    def test_bzpopmin_timing_out(self):
        z = [self.key('z1'), self.key('z2')]
        self.check(lambda s, i: self.assertIsNone(ask(s, 'BZPOPMIN', *z, '0.05')), N_BLOCKING)

    def test_xread_block_timing_out(self):
        x = self.key('stream')
        self.check(lambda s, i: self.assertIsNone(ask(s, 'XREAD', 'BLOCK', '50', 'STREAMS', x,
                                                      '$')), N_BLOCKING)

    def test_watched_transaction(self):
        k = self.key('counter')

        def call(s, i):
            self.assertEqual(ask(s, 'WATCH', k), 'OK')
            self.assertEqual(ask(s, 'MULTI'), 'OK')
            self.assertEqual(ask(s, 'INCR', k), 'QUEUED')
            self.assertEqual(ask(s, 'EXEC'), [i + 2])
        self.check(call)

    def test_aborted_transaction(self):
        k = self.key('watched')

        def call(s, i):
            self.assertEqual(ask(s, 'WATCH', k), 'OK')
            self.direct.set(k, i)  # the watch fails: EXEC answers nil
            self.assertEqual(ask(s, 'MULTI'), 'OK')
            self.assertEqual(ask(s, 'GET', k), 'QUEUED')
            self.assertIsNone(ask(s, 'EXEC'))
        self.check(call)

    def test_select_and_back(self):
        k = self.key('in1')

        def call(s, i):
            self.assertEqual(ask(s, 'SELECT', '1'), 'OK')
            self.assertIsNone(ask(s, 'RPOP', k))
            self.assertEqual(ask(s, 'SELECT', '0'), 'OK')
        self.check(call)

    def test_named_client_nil_scripts(self):
        # A client that named its connection (Sidekiq does): in cluster
        # mode its name goes on each link lent to it and comes off before
        # the link is pooled; elsewhere the client keeps its link.
        q = self.key('empty')

        def call(s, i):
            if i < 0:
                self.assertEqual(ask(s, 'CLIENT', 'SETNAME', 'named-%d' % self.ferry.port), 'OK')
            self.assertIsNone(ask(s, 'EVAL', NIL_SCRIPT, '1', q))
            self.assertEqual(ask(s, 'CLIENT', 'GETNAME'), b'named-%d' % self.ferry.port)
        self.check(call)

    def test_blocked_consumer_sends_the_master_nothing_more(self):
        # A consumer blocked in BRPOP (its WAIT queued behind it, as the pop
        # may write a receipt): the WAIT is not late while Redis has not
        # run it, so no nudge goes to the master meanwhile (before: an
        # SPUBLISH every 2 ms, about 200 a second, replicated).
        def nudges():
            return self.direct.info('commandstats').get('cmdstat_spublish', {}).get('calls', 0)
        s = connect(self.ferry)
        self.addCleanup(s.close)
        self.assertIsNone(ask(s, 'BRPOP', self.key('idle'), '0.05'))  # its link is up
        before = nudges()
        self.assertIsNone(ask(s, 'BRPOP', self.key('idle'), '1'))
        self.assertLessEqual(nudges() - before, 2, self.diag())

    # --------------------------------------- what a link carries still closes

    def assert_gone(self, name):
        wait_until(lambda: not [c for c in self.direct.client_list() if c.get('name') == name],
                   timeout=10, msg='the link named %s closed' % name)

    def test_named_link_is_closed_when_its_client_leaves(self):
        # CLIENT SETNAME lives on the client's link: another client must
        # never get a link with that name.
        name = 'reuse-%d' % self.ferry.port
        s = connect(self.ferry)
        self.assertEqual(ask(s, 'CLIENT', 'SETNAME', name), 'OK')
        self.assertIsNone(ask(s, 'EVAL', NIL_SCRIPT, '1', self.key('empty')))
        s.close()
        self.assert_gone(name)

    def test_selected_link_is_not_lent_to_the_next_client(self):
        # A client left in db 1 right after a nil script (its WAIT in
        # flight): the next client's writes go to db 0.
        k = self.key('db')
        a = connect(self.ferry)
        self.assertEqual(ask(a, 'SELECT', '1'), 'OK')
        self.assertIsNone(ask(a, 'EVAL', NIL_SCRIPT, '1', k))
        a.close()
        b = connect(self.ferry)
        self.addCleanup(b.close)
        for i in range(5):
            self.assertEqual(ask(b, 'EVAL', PUSH_SCRIPT, '1', k, 'v'), i + 1)
        self.assertEqual(self.direct.llen(k), 5)

    def test_blocked_pop_of_a_client_that_left_takes_nothing(self):
        # A consumer gone in the middle of its BRPOP: its link is closed,
        # so the item pushed next stays in the list.
        q = self.key('abandoned')
        s = connect(self.ferry)
        self.assertIsNone(ask(s, 'EVAL', NIL_SCRIPT, '1', q))
        s.sendall(resp_encode('BRPOP', q, '0'))
        wait_until(lambda: self.direct.info('clients')['blocked_clients'] >= 1, timeout=10,
                   msg='the BRPOP blocked on the master')
        s.close()
        wait_until(lambda: self.direct.info('clients')['blocked_clients'] == 0, timeout=10,
                   msg='the BRPOP of the client that left cancelled')
        self.direct.lpush(q, 'item')
        self.assertEqual(self.direct.lrange(q, 0, -1), ['item'])


class FixedAckMode(FixedMasterMode):
    """A fixed master with one replica and durability.replicas_ack 1 (the
    default there is 0)."""

    MODE = 'fixed master, replicas_ack 1'

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.replica = RedisServer(conf={'replicaof': '127.0.0.1 %d' % cls.redis.port})
        cls.addClassCleanup(cls.replica.stop)
        c = cls.redis.client()
        # Online, its first sync done (until then WAIT counts it out).
        wait_until(lambda: c.info('replication').get('slave0', {}).get('state') == 'online',
                   timeout=30, msg='the replica in sync')
        c.close()

    def setUp(self):
        super(FixedMasterMode, self).setUp()  # the checks' own set-up; this ferry instead
        self.ferry = Ferry(self.redis, conf={'durability': {'replicas_ack': 1}})
        self.addCleanup(self.ferry.stop)


class ClusterMode:
    """ferry in cluster mode (3 masters, 1 replica each) with replicas_ack
    1; every key of a test in one slot (a hash tag), so self.master() is
    the master serving it."""

    MODE = 'cluster'
    LINKS_PER_LOOP = 6
    TAG = '{reuse}'

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.cluster = ClusterTopology(masters=3, replicas=1)
        cls.addClassCleanup(cls.cluster.stop)

    def setUp(self):
        super().setUp()
        # The map is read once: each round asks every node on a connection
        # of its own (cluster.c), which the masters would count too.
        self.ferry = Ferry(None, wait='port', conf={
            'cluster': {'nodes': self.cluster.seeds(), 'refresh_interval_ms': 600000},
            'durability': {'replicas_ack': 1}})
        self.addCleanup(self.ferry.stop)
        c = self.ferry.client(socket_timeout=5)
        self.addCleanup(c.close)
        wait_until(lambda: c.set(self.key('probe'), 1), timeout=20, interval=0.1,
                   msg='ferry serving the cluster')

    @classmethod
    def master(cls):
        return cls.cluster.node_by_port(cls.cluster.master_of(cls.cluster.keyslot(cls.TAG)))

    def key(self, name):
        return '%s:%s:%s' % (self.TAG, self.k, name)

    def diag(self):
        return '--- ferry log ---\n%s' % self.ferry.log()[-6000:]

    def test_priority_pop_across_slots_timing_out(self):
        # BRPOP over keys of several slots: a link borrowed per shard, put
        # back after each call.
        keys = ['{p%d}:%s' % (i, self.k) for i in range(3)]
        masters = [self.cluster.node_by_port(p).client() for p in self.cluster.masters()]
        for m in masters:
            self.addCleanup(m.close)
        conns = sum(accepted(m) for m in masters)
        opened, _, before, after = self.calls(
            lambda s, i: self.assertIsNone(ask(s, 'BRPOP', *keys, '0.05')), N_BLOCKING)
        conns = sum(accepted(m) for m in masters) - conns
        self.assertLessEqual(opened, MAX_OPENED * len(masters), self.diag())
        self.assertLessEqual(conns, MAX_ACCEPTED * len(masters), self.diag())

    def test_named_link_is_not_pooled_without_replicas_ack(self):
        # replicas_ack 0: nothing of ferry's own follows the script, so the
        # link, with the client's name on it, was pooled as it was and lent
        # to the next client under that name.
        self.ferry.stop()
        self.ferry = Ferry(None, wait='port', conf={
            'cluster': {'nodes': self.cluster.seeds(), 'refresh_interval_ms': 600000},
            'durability': {'replicas_ack': 0}})
        self.addCleanup(self.ferry.stop)
        name = 'noack-%d' % self.ferry.port
        a = connect(self.ferry)
        self.addCleanup(a.close)
        wait_until(lambda: ask(a, 'SET', self.key('probe'), 1) == 'OK', timeout=20, interval=0.1,
                   msg='ferry serving the cluster')
        self.assertEqual(ask(a, 'CLIENT', 'SETNAME', name), 'OK')
        self.assertIsNone(ask(a, 'EVAL', NIL_SCRIPT, '1', self.key('empty')))
        b = connect(self.ferry)
        self.addCleanup(b.close)
        self.assertIsNone(ask(b, 'EVAL', NIL_SCRIPT, '1', self.key('empty')))
        named = [c for c in self.direct.client_list() if c.get('name') == name]
        self.assertLessEqual(len(named), 1, named)  # a's own link, if any: not b's too
        a.close()
        self.assert_gone(name)
        self.assertEqual(ask(b, 'CLIENT', 'GETNAME'), None)

    @unittest.skip('no SELECT in cluster mode')
    def test_select_and_back(self):
        pass

    @unittest.skip('no SELECT in cluster mode')
    def test_selected_link_is_not_lent_to_the_next_client(self):
        pass


class ClusterLinkReuse(ClusterMode, Checks, unittest.TestCase):
    pass


class FailoverLinkReuse(unittest.TestCase):
    """Links given back with their WAIT in flight while the master fails
    over (SENTINEL FAILOVER): a consumer's empty pops and nil scripts and a
    producer's pushes go on across it; every acknowledged push is popped,
    no call gets an error."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.topo = SentinelTopology()
        cls.addClassCleanup(cls.topo.stop)

    def test_calls_across_a_failover(self):
        f = Ferry(None, sentinel=self.topo, conf={'upstream': {'hold_timeout_ms': 30000}})
        self.addCleanup(f.stop)
        q = ['fo:q1', 'fo:q2', 'fo:q3']
        c = f.client()
        self.addCleanup(c.close)
        sha = c.script_load(NIL_SCRIPT)  # through ferry: loaded again on the next master
        stop = threading.Event()
        acked, got, errors = [], [], []

        def consume():
            s = connect(f)
            try:
                while not stop.is_set() or len(got) < len(acked):
                    r = ask(s, 'BRPOP', *q, '0.05')
                    if isinstance(r, list):
                        got.append(r[1])
                    elif r is not None:
                        errors.append(('BRPOP', r))
                    r = ask(s, 'EVALSHA', sha, '1', 'fo:empty')
                    if r is not None:
                        errors.append(('EVALSHA', r))
            except Exception as e:  # reported below
                errors.append(('consumer', repr(e)))
            finally:
                s.close()

        def produce():
            s = connect(f)
            try:
                i = 0
                while not stop.is_set():
                    r = ask(s, 'LPUSH', q[i % 3], 'i%d' % i)
                    if isinstance(r, int):
                        acked.append(b'i%d' % i)
                    else:
                        errors.append(('LPUSH', r))
                    i += 1
            except Exception as e:  # reported below
                errors.append(('producer', repr(e)))
            finally:
                s.close()
        threads = [threading.Thread(target=consume), threading.Thread(target=produce)]
        for t in threads:
            t.start()
        try:
            wait_until(lambda: len(got) >= 20, timeout=20, msg='pops served before the failover')
            old = self.topo.master_port()
            self.topo.failover()
            self.topo.wait_failover(old)
            n = len(got)
            wait_until(lambda: len(got) >= n + 20, timeout=30, msg='pops served after it')
        finally:
            stop.set()
            for t in threads:
                t.join(60)
        self.assertEqual(errors, [], self.diag(f))
        self.assertEqual(sorted(set(acked) - set(got)), [], self.diag(f))
        st = stats_json(f.stats_port)
        self.assertGreaterEqual(st['failover']['failovers'], 1)
        # (before: a link per empty pop and per nil script)
        self.assertLess(st['upstream']['links_opened_dedicated'], len(got) // 4, self.diag(f))

    def diag(self, f):
        return '--- ferry log ---\n%s\n%s' % (f.log()[-6000:], self.topo.logs(1500))


class FixedAckOnly:
    def test_links_waiting_for_a_stopped_replica_are_bounded(self):
        # The replica stopped: every WAIT takes replicas_ack_timeout_ms, so
        # each link given back after a nil script waits that long to be
        # pooled. At most upstream.pool_idle wait so; past them a link is
        # closed as it is given back, so a client calling in a loop does not
        # keep a link open per call. Its nil replies come at once.
        self.ferry.stop()
        self.ferry = Ferry(self.redis, conf={'durability': {'replicas_ack': 1},
                                             'upstream': {'pool_idle': 4}})
        self.addCleanup(self.ferry.stop)
        s = connect(self.ferry)
        self.addCleanup(s.close)
        q = self.key('empty')
        self.assertIsNone(ask(s, 'EVAL', NIL_SCRIPT, '1', q))
        self.replica.sigstop()
        self.addCleanup(self.wait_replica_online)
        self.addCleanup(self.replica.sigcont)
        self.direct.set(self.key('moved'), 1)  # an offset the replica never acknowledges
        for i in range(30):
            self.assertIsNone(ask(s, 'EVAL', NIL_SCRIPT, '1', q))
        up = self.opened()
        # 4 waiting, the one lent, each loop's shared link and probe (before:
        # 30 waiting)
        loops = int(harness.WORKERS or 1)
        self.assertLessEqual(up['links_open'], 4 + 1 + 2 * loops, self.diag())

    def wait_replica_online(self):
        wait_until(lambda: self.direct.info('replication').get('slave0', {}).get('state') ==
                   'online', timeout=30, msg='the replica back in sync')


class SentinelLinkReuse(SentinelMode, Checks, unittest.TestCase):
    pass


class FixedAckLinkReuse(FixedAckMode, FixedAckOnly, Checks, unittest.TestCase):
    pass


class FixedLinkReuse(FixedMasterMode, Checks, unittest.TestCase):
    pass


load_tests = sentinel_first

if __name__ == '__main__':
    unittest.main()
