"""No acknowledged push lost when Sentinel promotes a replica that lacks it.

With durability.replicas_ack 1 (Sentinel mode's default) and two replicas, a
push is acknowledged once ONE replica confirmed it. If the master dies and
Sentinel promotes the OTHER replica, which did not have it yet, the push is
gone (the first replica resyncs from the new master and drops it). ferry
keeps every acknowledged queue push (its bytes and offset bracket) until
every online replica's offset is past it; after a failover the new master's
master_replid2 / second_repl_offset say which of them it lacks, and ferry
sends those again, in order, before any client request goes there.

RedoFailoverTest makes that deterministic: the second replica (R2) frozen
with its connection's buffers full (a large value written directly to the
master), pushes acknowledged by R1 only, the master and R1 killed, R2 thawed:
Sentinel can promote only R2. Every push must be there exactly once, in order.
RedoRunningTest: entries are dropped once every replica has them, and the
bound (durability.redo_max_bytes) drops the oldest, counted, nothing else.

Run: python3 -m unittest test_redo -v  (also with FERRY_TEST_WORKERS=4)
"""
import unittest

from failover_load import FAILOVER_CONF
from harness import Ferry, SentinelTopology, wait_until
from test_stats import stats_json

BIG = 32 * 1024 * 1024  # more than the loopback socket buffers hold


def durability(f):
    return stats_json(f.stats_port)['durability']


def merged_conf(extra):
    conf = {k: (dict(v) if isinstance(v, dict) else v) for k, v in FAILOVER_CONF.items()}
    for k, v in extra.items():
        conf.setdefault(k, {}).update(v)
    return conf


class RedoFailoverTest(unittest.TestCase):
    def test_push_acked_by_one_replica_survives_promotion_of_the_other(self):
        # down-after 5 s: writing the large value (appendfsync always) keeps
        # the master busy a few seconds on a loaded machine; no failover then.
        topo = SentinelTopology(down_after_ms=5000)
        self.addCleanup(topo.stop)
        master = topo.master()
        topo.wait_replicas_synced(master, 2)
        r1, r2 = [r for r in topo.redis if r is not master]
        f = Ferry(None, conf=FAILOVER_CONF, sentinel=topo)
        self.addCleanup(f.stop)
        c = f.client(socket_timeout=30)
        self.assertEqual(c.rpush('q', 'before'), 1)
        # R2 has it (the redo lets it go once both replicas have it).
        wait_until(lambda: r2.client().lrange('q', 0, -1) == ['before'], timeout=10,
                   msg='the first push on R2')

        # R2 frozen; a large value fills its connection's buffers, so what
        # the master writes next stays in the master's own output buffer.
        r2.sigstop()
        self.addCleanup(r2.sigcont)
        mc = master.client(socket_timeout=30)
        mc.set('filler', 'x' * BIG)
        pushes = ['w%d' % i for i in range(5)]
        for i, item in enumerate(pushes):
            # Acknowledged: R1 confirmed it (WAIT 1).
            self.assertEqual(c.rpush('q', item), i + 2)
        # XADD with "*": sent again with the id its reply carried.
        sid = c.xadd('s', {'f': 'v'})
        c.zadd('z', {'m': 1})
        # (Kept: R2's offset is behind them.)
        kept = durability(f).get('redo_kept')

        old_port = master.port
        r1.kill()
        master.kill()
        r2.sigcont()
        new_port = topo.wait_failover(old_port, timeout=60)
        self.assertEqual(new_port, r2.port)

        def items():
            return f.client(socket_timeout=10).lrange('q', 0, -1)
        # R2 had only "before"; through ferry, from the first request the
        # new master carries, every acknowledged push is there, exactly
        # once, in order.
        got = wait_until(items, timeout=30, msg='ferry answers on the new master')
        self.assertEqual(got, ['before'] + pushes)
        self.assertEqual(r2.client().lrange('q', 0, -1), ['before'] + pushes)
        self.assertEqual([e[0] for e in f.client().xrange('s')], [sid])
        self.assertEqual(f.client().zrange('z', 0, -1, withscores=True), [('m', 1.0)])
        self.assertGreaterEqual(kept, len(pushes) + 2)
        d = durability(f)
        self.assertEqual(d['redo_replayed'], len(pushes) + 2, d)
        self.assertEqual(d['redo_errors'], 0, d)
        self.assertLessEqual(d['redo_ambiguous'], d['redo_replayed'], d)
        self.assertEqual(d['redo_kept'], 0, d)
        self.assertIn('redo: sending %d acknowledged push(es) again' % (len(pushes) + 2), f.log())


def info_calls(node):
    return node.client(socket_timeout=5).info('commandstats').get('cmdstat_info', {}).get('calls', 0)


def offset(node):
    return node.client(socket_timeout=5).info('replication')['master_repl_offset']


def replica_states(master):
    """{port: state} of the replicas master lists in INFO replication."""
    info = master.client(socket_timeout=5).info('replication')
    return {v['port']: v['state'] for k, v in info.items()
            if k.startswith('slave') and isinstance(v, dict)}


def wait_list(tc, f, key, want):
    """Until key reads want through ferry. With workers: 4 a loop whose
    sessions made no push may serve a read before the loop that kept them
    has sent them again (each loop holds only its own clients)."""
    seen = {}

    def items():
        try:
            seen['got'] = f.client(socket_timeout=10).lrange(key, 0, -1)
        except Exception as e:  # noqa: BLE001 (no master yet: asked again)
            seen['got'] = repr(e)
        return seen['got'] == want
    try:
        wait_until(items, timeout=30, msg='%s through ferry on the new master' % key)
    except AssertionError:
        tc.assertEqual(seen.get('got'), want)
        raise


class RedoReplicaNotOnlineTest(unittest.TestCase):
    """Pushes acknowledged (WAIT 1, by R1) while the master does not list R2
    at all (dropped after repl-timeout) or lists it mid full-resync (not
    state=online): R2 lacks them, yet Sentinel may promote it. ferry keeps
    them until every replica Sentinel lists is online past them, sends a
    transaction that went with its receipt again as that script, and counts
    the writes it cannot send again (SET, a script) as missing."""

    def run_case(self, listed):
        topo = SentinelTopology(down_after_ms=2000)
        self.addCleanup(topo.stop)
        master = topo.master()
        topo.wait_replicas_synced(master, 2)
        r1, r2 = [r for r in topo.redis if r is not master]
        # ferry reads INFO replication every ping interval: often here, so
        # that on a build that drops too early it has every chance to.
        f = Ferry(None, conf=merged_conf({'upstream': {'ping_interval_ms': 100}}), sentinel=topo)
        self.addCleanup(f.stop)
        wait_until(lambda: durability(f)['replicas_known'] == 2, timeout=15,
                   msg='ferry follows both replicas Sentinel lists')
        c = f.client(socket_timeout=30)
        self.assertEqual(c.rpush('q', 'before'), 1)
        wait_until(lambda: r2.client().lrange('q', 0, -1) == ['before'], timeout=10,
                   msg='the first push on R2')

        mc = master.client(socket_timeout=30)
        mc.config_set('repl-timeout', 2)
        r2.sigstop()
        self.addCleanup(r2.sigcont)
        wait_until(lambda: r2.port not in replica_states(master), timeout=30,
                   msg='the master drops the frozen R2 (repl-timeout)')
        if listed:
            # R2 comes back to a full resync that waits 60 s before it
            # starts: listed, state=wait_bgsave, its data as it was.
            mc.config_set('repl-backlog-size', 16384)
            mc.config_set('repl-diskless-sync', 'yes')
            mc.config_set('repl-diskless-sync-delay', 60)
            mc.set('filler', 'x' * 65536)  # past the backlog: no partial resync
            r2.sigcont()
            wait_until(lambda: replica_states(master).get(r2.port, 'online') != 'online',
                       timeout=30, msg='R2 listed, waiting for its full resync')
        calls = info_calls(master)
        wait_until(lambda: info_calls(master) >= calls + 20, timeout=30,
                   msg='ferry read INFO replication since')

        pushes = ['w%d' % i for i in range(5)]
        for i, item in enumerate(pushes):
            self.assertEqual(c.rpush('q', item), i + 2)  # acknowledged by R1
        self.assertEqual(c.lpush('l', 'a', 'b'), 2)
        self.assertEqual(c.zadd('z', {'m': 1}), 1)
        sid = c.xadd('s', {'f': 'v'})
        p = c.pipeline(transaction=True)
        p.lpush('t', 'tx')
        p.rpush('q2', 'tx')
        self.assertEqual(p.execute(), [1, 1])
        # Writes ferry cannot send again: counted when the new master lacks them.
        self.assertTrue(c.set('k', 'v'))
        self.assertEqual(c.eval("return redis.call('INCR', KEYS[1])", 1, 'n'), 1)
        wait_until(lambda: offset(r1) >= offset(master), timeout=15, msg='R1 has them all')
        calls = info_calls(master)
        wait_until(lambda: info_calls(master) >= calls + 20, timeout=30,
                   msg='ferry read INFO replication since')
        if listed:
            self.assertNotEqual(replica_states(master).get(r2.port), 'online')

        old_port = master.port
        r1.kill()
        master.kill()
        r2.sigcont()
        self.assertEqual(topo.wait_failover(old_port, timeout=60), r2.port)

        wait_list(self, f, 'q', ['before'] + pushes)
        # Each push, the XADD, the ZADD and the transaction sent again once.
        wait_until(lambda: durability(f)['redo_replayed'] == len(pushes) + 4, timeout=15,
                   msg='every kept write sent again answered')
        fc = f.client(socket_timeout=10)
        self.assertEqual(fc.lrange('l', 0, -1), ['b', 'a'])
        self.assertEqual(fc.zrange('z', 0, -1, withscores=True), [('m', 1.0)])
        self.assertEqual([e[0] for e in fc.xrange('s')], [sid])
        # The transaction that pushes went with its receipt: sent again as
        # that script, once, and its receipt deleted after it.
        self.assertEqual(fc.lrange('t', 0, -1), ['tx'])
        self.assertEqual(fc.lrange('q2', 0, -1), ['tx'])
        wait_until(lambda: fc.keys('ferry:rcpt:*') == [], timeout=10,
                   msg='no receipt left on the new master')
        # SET and the script are not sent again: lost, and counted.
        self.assertIsNone(fc.get('k'))
        self.assertIsNone(fc.get('n'))
        d = durability(f)
        self.assertEqual(d['acked_writes_missing'], 2, d)
        self.assertEqual(d['redo_errors'], 0, d)
        self.assertIn('2 acknowledged write(s) the new master lacks', f.log())

    def test_replica_not_listed(self):
        self.run_case(listed=False)

    def test_replica_listed_mid_full_resync(self):
        self.run_case(listed=True)

    def test_replica_restarted_from_its_aof_promoted(self):
        """R2 killed, pushes acknowledged by R1, M and R1 killed, R2 started
        again from its own AOF and promoted before it could resync: it
        shares no replication history with M (a new replication id), and it
        is not M restarted. ferry sends again what came after the offset M
        last listed R2 at."""
        topo = SentinelTopology(down_after_ms=2000)
        self.addCleanup(topo.stop)
        master = topo.master()
        topo.wait_replicas_synced(master, 2)
        r1, r2 = [r for r in topo.redis if r is not master]
        f = Ferry(None, conf=merged_conf({'upstream': {'ping_interval_ms': 100}}), sentinel=topo)
        self.addCleanup(f.stop)
        wait_until(lambda: durability(f)['replicas_known'] == 2, timeout=15,
                   msg='ferry follows both replicas Sentinel lists')
        c = f.client(socket_timeout=30)
        self.assertEqual(c.rpush('q', 'before'), 1)
        wait_until(lambda: r2.client().lrange('q', 0, -1) == ['before'], timeout=10,
                   msg='the first push on R2')
        # (What ferry still keeps when R2 dies it would send again, at
        # least once: R2 has it in its AOF.)
        wait_until(lambda: durability(f)['redo_kept'] == 0, timeout=10,
                   msg='ferry saw both replicas have the first push')
        r2.kill()
        wait_until(lambda: r2.port not in replica_states(master), timeout=30,
                   msg='the master lists R2 no more')
        pushes = ['w%d' % i for i in range(5)]
        for i, item in enumerate(pushes):
            self.assertEqual(c.rpush('q', item), i + 2)  # acknowledged by R1
        wait_until(lambda: offset(r1) >= offset(master), timeout=15, msg='R1 has them all')

        old_port = master.port
        r1.kill()
        master.kill()
        r2.restart()
        self.assertEqual(topo.wait_failover(old_port, timeout=60), r2.port)
        wait_list(self, f, 'q', ['before'] + pushes)
        wait_until(lambda: durability(f)['redo_replayed'] == len(pushes), timeout=15,
                   msg='every kept push sent again answered')
        # Past the offset the old master last listed R2 at: sent again,
        # counted as possibly there already ('before', before it, was not).
        self.assertEqual(durability(f)['redo_ambiguous'], len(pushes))

    def test_two_failovers_the_second_to_the_replica_that_lacked_them(self):
        """Acknowledged by R1 while R2 is frozen; SENTINEL FAILOVER promotes
        R1, which has them; R1 and the old master killed, R2 promoted. The
        pushes stay kept across the first switch (R2 still lacks them) and
        are sent again to R2."""
        topo = SentinelTopology(down_after_ms=2000)
        self.addCleanup(topo.stop)
        master = topo.master()
        topo.wait_replicas_synced(master, 2)
        r1, r2 = [r for r in topo.redis if r is not master]
        f = Ferry(None, conf=merged_conf({'upstream': {'ping_interval_ms': 100}}), sentinel=topo)
        self.addCleanup(f.stop)
        wait_until(lambda: durability(f)['replicas_known'] == 2, timeout=15,
                   msg='ferry follows both replicas Sentinel lists')
        c = f.client(socket_timeout=30)
        self.assertEqual(c.rpush('q', 'before'), 1)
        wait_until(lambda: r2.client().lrange('q', 0, -1) == ['before'], timeout=10,
                   msg='the first push on R2')
        # Frozen and dropped by the master: what follows never reaches it.
        master.client().config_set('repl-timeout', 2)
        r2.sigstop()
        self.addCleanup(r2.sigcont)
        wait_until(lambda: r2.port not in replica_states(master), timeout=30,
                   msg='the master drops the frozen R2 (repl-timeout)')
        pushes = ['w%d' % i for i in range(5)]
        for i, item in enumerate(pushes):
            self.assertEqual(c.rpush('q', item), i + 2)  # acknowledged by R1

        def r2_down():
            for s in topo.sentinels:
                flags = [r['flags'] for r in s.client().sentinel_slaves(topo.master_name)
                         if r['port'] == r2.port]
                if not flags or 's_down' not in flags[0]:
                    return False
            return True
        wait_until(r2_down, timeout=30, msg='every sentinel sees R2 down')
        old_port = master.port
        topo.failover()
        self.assertEqual(topo.wait_failover(old_port, timeout=60), r1.port)
        # Through ferry on R1: the verdict on the first master ran (R1 has
        # them all), and one more push, acknowledged by the old master, now
        # R1's replica.
        self.assertEqual(c.rpush('q', 'after'), len(pushes) + 2)
        wait_until(lambda: offset(master) >= offset(r1), timeout=15,
                   msg='the old master, replica of R1, has it all')
        calls = info_calls(r1)
        wait_until(lambda: info_calls(r1) >= calls + 20, timeout=30,
                   msg='ferry read INFO replication since')

        r1.kill()
        master.kill()
        r2.sigcont()
        self.assertEqual(topo.wait_failover(r1.port, timeout=60), r2.port)

        wait_list(self, f, 'q', ['before'] + pushes + ['after'])
        wait_until(lambda: durability(f)['redo_replayed'] == len(pushes) + 1, timeout=15,
                   msg='every kept push sent again answered')
        self.assertEqual(durability(f)['redo_errors'], 0)


class RedoRunningTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.topo = SentinelTopology()
        cls.topo.wait_replicas_synced(cls.topo.master(), 2)

    @classmethod
    def tearDownClass(cls):
        cls.topo.stop()

    def test_dropped_once_every_replica_has_them(self):
        f = Ferry(None, conf=FAILOVER_CONF, sentinel=self.topo)
        self.addCleanup(f.stop)
        c = f.client()
        for i in range(200):
            c.lpush('rq', 'item-%d' % i)
            c.zadd('rz', {'m%d' % i: i})
        c.xadd('rs', {'f': 'v'})
        # A couple of seconds after the writes stop, nothing is kept.
        wait_until(lambda: durability(f)['redo_kept'] == 0, timeout=10,
                   msg='the redo empties once both replicas have every push')
        d = durability(f)
        self.assertEqual(d['redo_kept_bytes'], 0, d)
        self.assertEqual(d['redo_dropped_unprotected'], 0, d)
        self.assertEqual(d['redo_replayed'], 0, d)

    def test_kept_while_a_replica_lags(self):
        f = Ferry(None, conf=FAILOVER_CONF, sentinel=self.topo)
        self.addCleanup(f.stop)
        lagging = [r for r in self.topo.redis if r is not self.topo.master()][1]
        lagging.sigstop()
        try:
            c = f.client()
            for i in range(20):
                c.rpush('lag', 'item-%d' % i)
            # Not every replica has them: kept (R1 alone confirmed).
            wait_until(lambda: durability(f)['redo_kept'] >= 20, timeout=5,
                       msg='pushes kept while a replica lags')
        finally:
            lagging.sigcont()
        wait_until(lambda: durability(f)['redo_kept'] == 0, timeout=15,
                   msg='dropped once the lagging replica caught up')

    def test_bound_counts_unprotected(self):
        f = Ferry(None, conf=merged_conf({'durability': {'redo_max_bytes': 200}}),
                  sentinel=self.topo)
        self.addCleanup(f.stop)
        c = f.client()
        lagging = [r for r in self.topo.redis if r is not self.topo.master()][1]
        lagging.sigstop()
        try:
            for i in range(30):
                self.assertEqual(c.rpush('bound', 'x' * 50), i + 1)
            d = durability(f)
            self.assertGreater(d['redo_dropped_unprotected'], 0, d)
            self.assertLessEqual(d['redo_kept_bytes'], 200, d)
        finally:
            lagging.sigcont()
        self.assertEqual(c.llen('bound'), 30)
        self.assertEqual(c.ping(), True)


if __name__ == '__main__':
    unittest.main()
