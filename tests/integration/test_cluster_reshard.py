"""ferry in front of a Redis Cluster that changes under load: a reshard, a
manual failover, a killed master that comes back, a rolling restart. Real
3 masters + 3 replicas clusters (harness ClusterTopology, node-timeout 2 s),
one cluster and one ferry per class; 4 producers (LPUSH) and 4 consumers
(BRPOP, then RPOP) on 16 queue keys spread over every shard
(failover_load.Load and its exact accounting: every acknowledged push is
delivered or still queued on its key's master, no client error).

  ClusterReshardTest
    1. `redis-cli --cluster reshard` of 1 000 slots (some queue keys among
       them) under the load: 0 client errors, 0 acknowledged pushes lost; the
       MOVED, ASK and TRYAGAIN the nodes answered are followed by ferry
       (counted in its stats), never seen by a client.
    2. `CLUSTER FAILOVER` on a replica under the load: 0 errors, 0 lost.
    3. kill -9 of a master under the load, then the killed master restarted:
       it comes back a replica, no queue command ever ran on it while it
       still called itself master, and ferry's map never names it again
       (the config epoch rule).
  ClusterRollingRestartTest
    scripts/rolling-restart --cluster under the load: every node restarted
    once (replicas first, a master after CLUSTER FAILOVER made it a replica),
    0 errors, 0 lost, no queue command on a restarted node claiming master.

Run:  python3 -m unittest test_cluster_reshard -v        (about 2 minutes)
Ferry-only (skipped with FERRY_TEST_DIRECT=1); cluster mode runs one event
loop (workers: 1), so FERRY_TEST_WORKERS is not applied here.
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import unittest

import redis

import harness
from failover_load import AccountingChecks, Load, now
from harness import REPO, wait_until
from test_cluster_route import start_ferry, stats, wait_served
from test_rolling_restart import NodeRestarter

SCRIPT = os.path.join(REPO, 'scripts', 'rolling-restart')
SCRIPT_TIMEOUT = 150      # s, the whole script run under load
STEP_TIMEOUT = 30         # s, --step-timeout
NKEYS = 16
RESHARD_SLOTS = 1000
QUEUE_COMMANDS = ('lpush', 'rpush', 'brpop', 'rpop', 'lpop', 'blpop')


def spread_keys(cluster, moving=None, n=NKEYS):
    """n keys 'q:<i>' over every master; with moving (a set of slots), 6 of
    them in those slots."""
    masters = cluster.masters()
    slots = {}
    for m in masters:
        view = [v for v in cluster.nodes_view(m) if v['port'] == m][0]
        for s in view['slots']:
            slots[s] = m
    buckets = {m: [] for m in masters}
    mov = []
    i = 0
    while i < 200000:
        k = 'q:%d' % i
        i += 1
        s = cluster.keyslot(k)
        if moving and s in moving:
            if len(mov) < 6:
                mov.append(k)
        elif len(buckets[slots[s]]) < n:
            buckets[slots[s]].append(k)
        if (not moving or len(mov) >= 6) and all(len(b) >= n for b in buckets.values()):
            break
    keys = list(mov)
    while len(keys) < n:
        for m in masters:
            if buckets[m] and len(keys) < n:
                keys.append(buckets[m].pop(0))
    return keys


class Owner:
    """What Load.finish wants of a master (a port); here the keys' masters
    are asked one by one."""
    port = 0


class ClusterLoad(Load):
    """Load over queue keys of every shard: producer i's n-th push goes to
    keys[(i + n) % len]; consumer i blocks on one key at a time (BRPOP, 0.1 s),
    walking the keys, with an RPOP of the next key between two blocks."""

    def __init__(self, ferry, tag, cluster, keys, **kw):
        kw.setdefault('producers', 4)
        kw.setdefault('consumers', 4)
        kw.setdefault('push_interval', 0.003)
        super().__init__(ferry, tag, **kw)
        self.cluster = cluster
        self.keys = list(keys)
        self.turn = [0] * self.consumers

    def key_of(self, item):
        m = re.search(r'-p(\d+)-(\d+)$', item)
        return self.keys[(int(m.group(1)) + int(m.group(2))) % len(self.keys)]

    def push(self, c, item):
        return c.lpush(self.key_of(item), item)

    def pop(self, c, i):
        t = self.turn[i]
        self.turn[i] += 1
        k = self.keys[(i * 4 + t) % len(self.keys)]
        out = []
        r = c.brpop(k, timeout=0.1)
        if r:
            out.append(r[1])
        r = c.rpop(self.keys[(i * 4 + t + 1) % len(self.keys)])
        if r is not None:
            out.append(r)
        return out

    def node_of(self, k):
        return self.cluster.master_of(self.cluster.keyslot(k))

    def drained(self, _owner):
        self.cluster.wait_consistent()
        for k in self.keys:
            c = self.cluster.node_by_port(self.node_of(k)).client(socket_timeout=5)
            try:
                if c.llen(k):
                    return False
            finally:
                c.close()
        return True

    def remaining(self, _owner):
        out = []
        self.cluster.wait_consistent()
        for k in self.keys:
            c = self.cluster.node_by_port(self.node_of(k)).client(socket_timeout=5)
            try:
                out.extend(c.lrange(k, 0, -1))
            finally:
                c.close()
        return out


class RestartedMasterWatch:
    """Polls the nodes given (one INFO call each: server, replication,
    commandstats). A process not running when the watch started (a restart)
    that says master before it was ever seen a replica is a stale master:
    no queue command may have run on it. ferry's map is polled too: the ports
    it names as a shard's master.

    A cluster node restarted as a replica says role:master in INFO until its
    first cluster cron (about 100 ms) points it at its master; it serves no
    slot then (CLUSTER NODES says replica), so it is listed in .claimed but
    no command may run there either: the check is on .commands."""

    LATE_S = 5

    def __init__(self, cluster, ferry, interval=0.05):
        self.cluster = cluster
        self.ferry = ferry
        self.interval = interval
        self.initial = set()
        for n in cluster.running():
            self.initial.add(n.client(socket_timeout=10).info('server')['run_id'])
        self.claimed = {}         # run_id -> port: restarted, seen as master first
        self.checked_off = set()  # run_ids seen as replica
        self.commands = {}        # run_id -> {command: calls} while a stale master
        self.ferry_masters = {}   # port -> times ferry's map named it a master
        self.late = []            # ports of processes first seen LATE_S after their start
        self.samples = 0
        self.stop_ev = threading.Event()
        self.thread = threading.Thread(target=self._run, name='restart-watch', daemon=True)
        self.thread.start()

    def _sample(self, node):
        info = node.client(socket_timeout=1, socket_connect_timeout=1).execute_command(
            'INFO', 'server', 'replication', 'commandstats')
        rid = info.get('run_id')
        if rid in self.initial or rid in self.checked_off:
            return
        if info.get('role') != 'master':
            self.checked_off.add(rid)
            return
        if rid not in self.claimed and int(info.get('uptime_in_seconds', 0)) >= self.LATE_S:
            # first seen this late (the watch was starved): a master by a
            # failover since, most likely; not judged
            self.checked_off.add(rid)
            self.late.append(node.port)
            return
        self.claimed[rid] = node.port
        for cmd in QUEUE_COMMANDS:
            st = info.get('cmdstat_' + cmd)
            if st and st.get('calls', 0):
                seen = self.commands.setdefault(rid, {})
                seen[cmd] = max(seen.get(cmd, 0), st['calls'])

    def _run(self):
        while not self.stop_ev.is_set():
            for node in list(self.cluster.nodes):
                try:
                    self._sample(node)
                except Exception:  # noqa: BLE001 - down or restarting
                    pass
            try:
                for sh in stats(self.ferry)['cluster']['shards']:
                    port = int(sh['master']['port'])
                    self.ferry_masters[port] = self.ferry_masters.get(port, 0) + 1
            except Exception:  # noqa: BLE001
                pass
            self.samples += 1
            self.stop_ev.wait(self.interval)

    def stop(self):
        self.stop_ev.set()
        self.thread.join(5)


class Movers:
    """Multi-key commands on slots that migrate: for each tag, ITEMS items go
    back and forth between {tag}:a and {tag}:b (LMOVE of one list into the
    other while it is empty: a node answers TRYAGAIN for it while the slot
    migrates and one key moved; BLMOVE back; MGET of both lengths' keys...).
    At the end the items of each tag are all there, once."""

    ITEMS = 40

    def __init__(self, ferry, cluster, tags):
        self.ferry = ferry
        self.cluster = cluster
        self.tags = list(tags)
        self.errors = []
        self.calls = 0
        self.stop_ev = threading.Event()
        c = ferry.client(socket_timeout=10)
        for t in self.tags:
            c.delete('{%s}:a' % t, '{%s}:b' % t, '{%s}:s' % t)
            c.rpush('{%s}:a' % t, *['%s-%d' % (t, i) for i in range(self.ITEMS)])
            c.set('{%s}:s' % t, 'x' * 100)
        c.close()
        self.threads = [threading.Thread(target=self._run, args=(t,), daemon=True)
                        for t in self.tags]

    def start(self):
        for t in self.threads:
            t.start()
        return self

    def _run(self, tag):
        a, b, s = '{%s}:a' % tag, '{%s}:b' % tag, '{%s}:s' % tag
        c = self.ferry.client(socket_timeout=40)
        try:
            while not self.stop_ev.is_set():
                try:
                    for _ in range(self.ITEMS):
                        if c.lmove(a, b, 'RIGHT', 'LEFT') is None:
                            break
                    c.mget(a, s, b)
                    for _ in range(self.ITEMS):
                        if c.blmove(b, a, 0.05, 'RIGHT', 'LEFT') is None:
                            break
                    c.exists(a, b, s)
                    self.calls += 1
                except Exception as e:  # noqa: BLE001 - recorded, fails the test
                    self.errors.append('%s: %r' % (tag, e))
                    return
        finally:
            c.close()

    def finish(self):
        self.stop_ev.set()
        for t in self.threads:
            t.join(45)
        lost = {}
        c = self.ferry.client(socket_timeout=10)
        for t in self.tags:
            have = sorted(c.lrange('{%s}:a' % t, 0, -1) + c.lrange('{%s}:b' % t, 0, -1))
            want = sorted('%s-%d' % (t, i) for i in range(self.ITEMS))
            if have != want:
                lost[t] = (len(have), len(set(have)))
        c.close()
        return lost


class ClusterChecks(AccountingChecks):

    def diag(self, topo, ferry, res=None):
        text = '\ncluster ports %r' % [n.port for n in topo.nodes]
        if res is not None:
            text += '\n' + res.summary('diag')
        lines = [ln for ln in ferry.log().splitlines() if ' DEBUG ' not in ln
                 and not re.search(r'client \d+ .*closed: client closed', ln)]
        text += '\n--- ferry log (%s), last non-debug lines ---\n%s' % (
            ferry.log_path, '\n'.join(lines[-60:]))
        return text

    def counters(self):
        st = stats(self.ferry)
        return {'moved': st['cluster']['moved_followed'], 'ask': st['cluster']['ask_followed'],
                'tryagain': st['cluster'].get('tryagain_held', 0),
                'clusterdown': st['cluster'].get('clusterdown_held', 0),
                'refused': st['errors']['requests_refused']}

    def run_load(self, tag, fault, keys=None, pre=1.0, post=1.0):
        """The load on keys (spread_keys by default) around fault(); returns
        (Result, counters' deltas, seconds fault() took)."""
        self.cluster.wait_consistent()
        keys = keys or spread_keys(self.cluster)
        c = self.ferry.client(socket_timeout=10)
        for k in keys:
            c.delete(k)
        c.close()
        load = ClusterLoad(self.ferry, tag, self.cluster, keys, client_timeout=40)
        self.addCleanup(load.stop)
        before = self.counters()
        load.start()
        time.sleep(pre)
        t0 = now()
        fault()
        took = now() - t0
        time.sleep(post)
        res = load.finish(lambda: Owner())
        res.t_fault = t0
        after = self.counters()
        delta = {k: after[k] - before[k] for k in after}
        print('\n' + res.summary(tag), flush=True)
        print('[%s] fault took %.2f s; ferry followed %d MOVED, %d ASK, held %d TRYAGAIN, '
              '%d CLUSTERDOWN; %d refusals retried in all' % (
                  tag, took, delta['moved'], delta['ask'], delta['tryagain'],
                  delta['clusterdown'], delta['refused']), flush=True)
        self.check_accounting(res, self.cluster, self.ferry)
        return res, delta, took


@unittest.skipIf(harness.DIRECT, 'ferry-only')
class ClusterReshardTest(ClusterChecks, unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.cluster = harness.ClusterTopology(masters=3, replicas=1, node_timeout_ms=2000)
        try:
            cls.ferry = start_ferry(cls.cluster)
            wait_served(cls.ferry)
        except BaseException:
            cls.cluster.stop()
            raise

    @classmethod
    def tearDownClass(cls):
        rc = cls.ferry.stop()
        cls.cluster.stop()
        if rc != 0:
            raise AssertionError('ferry exited %r:\n%s' % (rc, cls.ferry.log()[-3000:]))

    def test_1_reshard_under_load(self):
        self.cluster.wait_consistent()
        masters = self.cluster.masters()
        src, dst = masters[0], masters[1]
        view = [v for v in self.cluster.nodes_view(src) if v['port'] == src][0]
        moving = set(sorted(view['slots'])[:RESHARD_SLOTS])
        keys = spread_keys(self.cluster, moving)
        self.assertEqual(sum(1 for k in keys if self.cluster.keyslot(k) in moving), 6)
        tags = []
        i = 0
        while len(tags) < 6 and i < 100000:
            if self.cluster.keyslot('m%d' % i) in moving:
                tags.append('m%d' % i)
            i += 1
        movers = Movers(self.ferry, self.cluster, tags).start()
        self.addCleanup(movers.stop_ev.set)

        res, delta, took = self.run_load(
            'reshard', lambda: self.cluster.reshard(src, dst, RESHARD_SLOTS, timeout=90),
            keys=keys)
        lost = movers.finish()
        print('[reshard] multi-key movers: %d rounds, errors %r, items lost or doubled %r' % (
            movers.calls, movers.errors, lost))
        self.assertEqual(movers.errors, [])
        self.assertEqual(lost, {})
        self.assertGreater(movers.calls, 0)
        for k in keys:
            if self.cluster.keyslot(k) in moving:
                self.assertEqual(self.cluster.master_of(self.cluster.keyslot(k)), dst, k)
        print('[reshard] %d slots from %d to %d in %.1f s' % (RESHARD_SLOTS, src, dst, took))
        # the clients' commands met the migration: the nodes redirected
        # ferry, which followed
        self.assertGreater(delta['moved'] + delta['ask'], 0, delta)

    def test_2_manual_failover_under_load(self):
        self.cluster.wait_consistent()
        master = self.cluster.masters()[1]
        replica = self.cluster.replicas_of(master)[0]

        def failover():
            r = self.cluster.command(replica, 'CLUSTER', 'FAILOVER')
            self.assertIn(r, (True, 'OK', b'OK'))
            wait_until(lambda: self.cluster.node_by_port(replica).role() == 'master',
                       timeout=20, interval=0.05, msg='the replica promoted')
            self.cluster.wait_consistent()

        res, delta, took = self.run_load('manual failover', failover)
        self.assertEqual(self.cluster.node_by_port(master).role(), 'slave')
        print('[manual failover] %d -> %d in %.2f s' % (master, replica, took))

    def test_3_killed_master_restarted(self):
        self.cluster.wait_consistent()
        victim = self.cluster.masters()[2]
        node = self.cluster.node_by_port(victim)
        state = {}

        def ferry_names(port):
            return any(int(sh['master']['port']) == port
                       for sh in stats(self.ferry)['cluster']['shards'])

        def kill_and_restart():
            self.cluster.kill_master(victim)
            state['new'] = self.cluster.wait_promoted(victim, timeout=30)
            # ferry's map follows the promotion (its next refresh, or a
            # redirect) before the watch starts: what it judges is the node
            # restarted, not the killed one ferry has not dropped yet (a CI
            # run sampled that once, 'ferry's map named the restarted node').
            wait_until(lambda: ferry_names(state['new']) and not ferry_names(victim),
                       timeout=20, interval=0.05, msg="ferry's map following the promotion")
            state['watch'] = RestartedMasterWatch(self.cluster, self.ferry)
            node.start(write_conf=False)
            wait_until(lambda: node.role() == 'slave', timeout=20, interval=0.05,
                       msg='the restarted master a replica')
            wait_until(lambda: node.client(socket_timeout=2).info('replication').get(
                'master_link_status') == 'up', timeout=20, interval=0.1,
                msg='the restarted master a synced replica')
            self.cluster.wait_consistent()
            time.sleep(0.5)

        res, delta, took = self.run_load('restarted master', kill_and_restart)
        watch = state['watch']
        watch.stop()
        print('[restarted master] %d killed, %d promoted; the restart watched in %d samples; '
              'seen master after the restart: %r; ferry named as masters: %r' % (
                  victim, state['new'], watch.samples, watch.claimed, watch.ferry_masters))
        self.assertGreater(watch.samples, 5)
        self.assertEqual(watch.commands, {}, 'queue commands ran on the restarted node while '
                         'it said master' + self.diag(self.cluster, self.ferry, res))
        self.assertNotIn(victim, watch.ferry_masters, 'ferry\'s map named the restarted node '
                         'a master' + self.diag(self.cluster, self.ferry, res))
        self.assertIn(state['new'], watch.ferry_masters)
        sh = [s for s in stats(self.ferry)['cluster']['shards']
              if s['master']['port'] == victim]
        self.assertEqual(sh, [])

    # ---- one slot in migration, step by step (the reshard's moments)

    def migrating_slot(self, fill=None, migrate=True):
        """(src, dst, slot, ids, tag): an empty slot of the first master set
        MIGRATING to the second (IMPORTING there); undone by a cleanup. fill:
        {suffix: [items]} pushed to '{tag}suffix' on the source before."""
        self.cluster.wait_consistent()
        masters = self.cluster.masters()
        src, dst = masters[0], masters[1]
        ids = {v['port']: v['id'] for v in self.cluster.nodes_view(src)}
        view = [v for v in self.cluster.nodes_view(src) if v['port'] == src][0]
        slot = next(s for s in sorted(view['slots'])[100:]
                    if self.cluster.command(src, 'CLUSTER', 'COUNTKEYSINSLOT', s) == 0)
        tag = next('t%d' % i for i in range(200000) if self.cluster.keyslot('t%d' % i) == slot)
        for suffix, items in (fill or {}).items():
            self.cluster.command(src, 'RPUSH', '{%s}%s' % (tag, suffix), *items)
        if migrate:
            self.cluster.command(dst, 'CLUSTER', 'SETSLOT', slot, 'IMPORTING', ids[src])
            self.cluster.command(src, 'CLUSTER', 'SETSLOT', slot, 'MIGRATING', ids[dst])

        def undo():
            for port in (src, dst):
                try:
                    self.cluster.command(port, 'CLUSTER', 'SETSLOT', slot, 'NODE', ids[dst])
                except Exception:  # noqa: BLE001
                    pass
            self.cluster.wait_consistent()
        self.addCleanup(undo)
        return src, dst, slot, ids, tag

    def finish_migration(self, src, dst, slot, ids, keys):
        """MIGRATE keys from src to dst, then the slot is dst's."""
        self.cluster.command(src, 'MIGRATE', '127.0.0.1', dst, '', 0, 5000, 'KEYS', *keys)
        for port in (dst, src):
            self.cluster.command(port, 'CLUSTER', 'SETSLOT', slot, 'NODE', ids[dst])

    def test_4_multi_key_command_on_a_migrating_slot_is_held(self):
        # LMOVE a b with a still on the source and b missing: the node
        # answers TRYAGAIN; ferry holds the command until the slot settled
        src, dst, slot, ids, tag = self.migrating_slot({':a': ['x', 'y']})
        a, b = '{%s}:a' % tag, '{%s}:b' % tag
        n = self.cluster.node_by_port(src).client(socket_timeout=5)
        with self.assertRaises(redis.ResponseError) as cm:
            n.lmove(a, b, 'RIGHT', 'LEFT')
        n.close()
        self.assertTrue(str(cm.exception).startswith('TRYAGAIN'), cm.exception)
        before = stats(self.ferry)['errors']['requests_refused']
        held_before = stats(self.ferry)['cluster'].get('tryagain_held')
        out = {}

        def call():
            c = self.ferry.client(socket_timeout=20)
            try:
                t0 = time.monotonic()
                out['r'] = c.lmove(a, b, 'RIGHT', 'LEFT')
                out['t'] = time.monotonic() - t0
            except Exception as e:  # noqa: BLE001
                out['e'] = e
            finally:
                c.close()
        th = threading.Thread(target=call)
        th.start()
        wait_until(lambda: stats(self.ferry)['errors']['requests_refused'] > before,
                   timeout=5, interval=0.02, msg='ferry refused TRYAGAIN')
        time.sleep(0.3)
        self.assertTrue(th.is_alive(), out)
        self.finish_migration(src, dst, slot, ids, [a])
        th.join(20)
        self.assertNotIn('e', out)
        self.assertEqual(out.get('r'), 'y')
        # counted in ferry's stats (cluster.tryagain_held)
        self.assertIsNotNone(held_before, 'no cluster.tryagain_held in the stats')
        self.assertGreaterEqual(stats(self.ferry)['cluster']['tryagain_held'] - held_before, 1)
        n = self.cluster.node_by_port(dst).client(socket_timeout=5)
        try:
            self.assertEqual(n.lrange(a, 0, -1), ['x'])
            self.assertEqual(n.lrange(b, 0, -1), ['y'])
        finally:
            n.delete(a, b)
            n.close()
        print('\nLMOVE on a migrating slot: held %.2f s (TRYAGAIN), then served' % out['t'])

    def test_5_blocking_pop_on_a_migrating_slot(self):
        # BRPOP of a key the source lacks: ASK; ferry blocks on the target
        # (ASKING first, on the same link); a push (ASK as well) wakes it
        src, dst, slot, ids, tag = self.migrating_slot()
        k = '{%s}:q' % tag
        out = {}

        def call():
            c = self.ferry.client(socket_timeout=20)
            try:
                t0 = time.monotonic()
                out['r'] = c.brpop(k, timeout=10)
                out['t'] = time.monotonic() - t0
            except Exception as e:  # noqa: BLE001
                out['e'] = e
            finally:
                c.close()
        th = threading.Thread(target=call)
        th.start()
        time.sleep(0.5)
        self.assertTrue(th.is_alive(), out)
        c = self.ferry.client(socket_timeout=10)
        t_push = time.monotonic()
        self.assertEqual(c.lpush(k, 'item'), 1)
        th.join(15)
        woke = time.monotonic() - t_push
        self.assertNotIn('e', out)
        self.assertEqual(out.get('r'), (k, 'item'))
        self.assertLess(woke, 1.0)
        # and a pop blocked on the target while the slot settles there
        th = threading.Thread(target=call)
        out.clear()
        th.start()
        time.sleep(0.3)
        for port in (dst, src):
            self.cluster.command(port, 'CLUSTER', 'SETSLOT', slot, 'NODE', ids[dst])
        time.sleep(0.3)
        self.assertEqual(c.lpush(k, 'after'), 1)
        th.join(15)
        c.close()
        self.assertNotIn('e', out)
        self.assertEqual(out.get('r'), (k, 'after'))
        print('\nBRPOP on a migrating slot: woken %.3f s after the push' % woke)


    def test_6_pop_blocked_before_the_migration_gets_the_item_pushed_during_it(self):
        # BRPOP blocked on the source; the slot starts migrating; a push
        # (ASK: the key is missing on the source) lands on the target; when
        # the slot is the target's, the source answers the blocked pop
        # MOVED, which ferry follows with the time left: the pop gets it
        src, dst, slot, ids, tag = self.migrating_slot(migrate=False)
        k = '{%s}:q' % tag
        out = {}

        def call():
            c = self.ferry.client(socket_timeout=30)
            try:
                out['r'] = c.brpop(k, timeout=20)
                out['t'] = time.monotonic()
            except Exception as e:  # noqa: BLE001
                out['e'] = e
            finally:
                c.close()
        th = threading.Thread(target=call)
        th.start()
        wait_until(lambda: self.cluster.command(src, 'INFO', 'clients')['blocked_clients'] >= 1,
                   timeout=5, interval=0.02, msg='the pop blocked on the source')
        self.cluster.command(dst, 'CLUSTER', 'SETSLOT', slot, 'IMPORTING', ids[src])
        self.cluster.command(src, 'CLUSTER', 'SETSLOT', slot, 'MIGRATING', ids[dst])
        c = self.ferry.client(socket_timeout=10)
        try:
            self.assertEqual(c.lpush(k, 'item'), 1)
        finally:
            c.close()
        time.sleep(0.3)
        self.assertTrue(th.is_alive(), out)
        t_settled = time.monotonic()
        for port in (dst, src):
            self.cluster.command(port, 'CLUSTER', 'SETSLOT', slot, 'NODE', ids[dst])
        th.join(25)
        self.assertNotIn('e', out)
        self.assertEqual(out.get('r'), (k, 'item'))
        took = out['t'] - t_settled
        print('\nBRPOP blocked before a migration: the item pushed during it %.3f s after the '
              'slot settled' % took)
        self.assertLess(took, 10.0)  # a bound on a hang; the figure is printed


class ClusterNodeRestarter(NodeRestarter):
    """The restart hook of test_rolling_restart, for a ClusterTopology's
    nodes: started again with their config file and nodes.conf as they are."""

    def _restart(self, port):
        node = self.topo.node_by_port(port)
        if node is None:
            return 'ERR no node on port %d' % port
        node.proc.wait(timeout=15)
        node.start(write_conf=False)
        with self.lock:
            self.restarts.append((port, now()))
        return 'OK'


@unittest.skipIf(harness.DIRECT, 'ferry-only')
class ClusterRollingRestartTest(ClusterChecks, unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.cluster = harness.ClusterTopology(masters=3, replicas=1, node_timeout_ms=2000)
        try:
            cls.ferry = start_ferry(cls.cluster)
            wait_served(cls.ferry)
        except BaseException:
            cls.cluster.stop()
            raise

    @classmethod
    def tearDownClass(cls):
        rc = cls.ferry.stop()
        cls.cluster.stop()
        if rc != 0:
            raise AssertionError('ferry exited %r:\n%s' % (rc, cls.ferry.log()[-3000:]))

    def script(self, *extra, timeout=SCRIPT_TIMEOUT):
        argv = [sys.executable, SCRIPT, '--cluster', ','.join(self.cluster.seeds()[:2]),
                '--ferry-stats', '127.0.0.1:%d' % self.ferry.stats_port] + list(extra)
        t0 = now()
        p = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, timeout=timeout)
        return p.returncode, p.stdout.decode(errors='replace'), now() - t0

    def test_1_dry_run_changes_nothing(self):
        self.cluster.wait_consistent()
        before = {n.port: n.client(socket_timeout=10).info('server')['run_id']
                  for n in self.cluster.nodes}
        masters = self.cluster.masters()
        rc, out, _ = self.script('--dry-run', timeout=60)
        print('\n' + out)
        self.assertEqual(rc, 0, out)
        self.assertEqual(len(re.findall(r'^\S+ rolling-restart:   \d+\. ', out, re.M)), 6, out)
        # --local: the nodes and the ferry stats port from a scripts/up run
        # directory (run/redis-<port>/nodes.conf, run/<name>.yml + .pid)
        run = tempfile.mkdtemp(prefix='ferry-rolling-run-')
        self.addCleanup(shutil.rmtree, run, True)
        for n in self.cluster.nodes:
            os.makedirs(os.path.join(run, 'redis-%d' % n.port))
            open(os.path.join(run, 'redis-%d' % n.port, 'nodes.conf'), 'w').close()
        with open(os.path.join(run, 'ferry.yml'), 'w') as f:
            f.write('stats:\n  listen: 127.0.0.1:%d\n' % self.ferry.stats_port)
        with open(os.path.join(run, 'ferry.pid'), 'w') as f:
            f.write('%d\n' % self.ferry.proc.pid)
        p = subprocess.run([sys.executable, SCRIPT, '--cluster', '--local', '--run-dir', run,
                            '--dry-run'], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, timeout=60)
        out = p.stdout.decode(errors='replace')
        self.assertEqual(p.returncode, 0, out)
        self.assertIn('3 replica(s), 1 ferry instance(s) (127.0.0.1:%d)'
                      % self.ferry.stats_port, out)
        self.assertIn('redis-server %s/redis-' % run, out)
        self.assertEqual(self.cluster.masters(), masters)
        after = {n.port: n.client(socket_timeout=10).info('server')['run_id']
                 for n in self.cluster.nodes}
        self.assertEqual(before, after)

    def test_2_rolling_restart_under_load(self):
        self.cluster.wait_consistent()
        restarter = ClusterNodeRestarter(self.cluster)
        self.addCleanup(restarter.close)
        old_masters = self.cluster.masters()
        watch = RestartedMasterWatch(self.cluster, self.ferry)
        self.addCleanup(watch.stop)
        state = {}

        def roll():
            state['rc'], state['out'], state['took'] = self.script(
                '--restart-cmd', restarter.command, '--step-timeout', str(STEP_TIMEOUT))
            print('--- rolling-restart output ---\n' + state['out'], flush=True)

        res, delta, took = self.run_load('cluster rolling restart', roll, pre=1.0, post=1.0)
        watch.stop()
        out = state['out']
        self.assertEqual(state['rc'], 0, out)
        steps = re.findall(r'  step \d+/\d+: (\S+) \S+:(\d+): ([\d.]+)s', out)
        print('[cluster rolling restart] script %.2f s; steps: %s; restarted nodes seen as '
              'master before replica: %r; first seen late: %r' % (
                  took, '; '.join('%s %s %ss' % s for s in steps), watch.claimed, watch.late),
              flush=True)
        with self.subTest(check='every node restarted once, replicas first'):
            self.assertEqual(restarter.errors, [])
            self.assertEqual(sorted(p for p, _ in restarter.restarts),
                             sorted(n.port for n in self.cluster.nodes), out)
            self.assertEqual([k for k, _, _ in steps],
                             ['replica'] * 3 + ['master'] * 3, out)
            self.assertEqual(sorted(int(p) for k, p, _ in steps if k == 'master'), old_masters)
        with self.subTest(check='the old masters are replicas now'):
            self.cluster.wait_consistent()
            for p in old_masters:
                self.assertEqual(self.cluster.node_by_port(p).role(), 'slave', p)
        with self.subTest(check='no queue command reached a restarted node saying master'):
            self.assertGreater(watch.samples, 10)
            self.assertEqual(watch.commands, {}, self.diag(self.cluster, self.ferry, res))
