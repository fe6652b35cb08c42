"""Failover through ferry in Sentinel mode: 1 master + 2 replicas + 3
sentinels (SentinelTopology), ferry following the master the sentinels
announce, and a queue workload across the fault:

  4 producers  LPUSH q <unique id>, each on its own connection to ferry; an id
               counts as acknowledged only when LPUSH returned an integer
  4 consumers  BRPOP q 1 in a loop, recording every id received

After the fault and recovery, producers stop, consumers drain the list, and
the accounting must be exact: every acknowledged id delivered or still in the
list on the current master, no id twice but a retried unknown-outcome write
(at most one per producer), no error seen by any client. Each run prints its
longest gap between two consecutive acknowledged pushes. The workload and the
checks live in failover_load.py (shared with test_failover_paths).

Run:  python3 -m unittest test_failover -v
      FAILOVER_RUNS=3 python3 -m unittest test_failover.FailoverTest.test_1_kill9_master -v
          (repeat a scenario; prints each run and the median longest gap)
      FERRY_TEST_KEEP=1 ...   keep every log / config dir

Ferry-only (skipped with FERRY_TEST_DIRECT=1).
"""
import os
import re
import statistics
import time
import unittest

import harness
from failover_load import (FAILOVER_CONF, AccountingChecks, Load, current_master, each_run, merged,
                           now, sentinel_config_epoch)
from harness import Ferry, RespError, SentinelTopology, resp_read_reply, resp_send, wait_until

RUNS = max(1, int(os.environ.get('FAILOVER_RUNS', '1')))

KEY = 'q'                  # Load's list (its default key)
PRE_FAULT = 3.0            # s of load before the fault
POST_RECOVERY = 4.0        # s of load after recovery

# Merged over every scenario's ferry config (replicas_ack 1: see there).
FERRY_CONF = FAILOVER_CONF

SENTINEL_UNREACHABLE = re.compile(r'sentinel.*unreachable|unreachable.*sentinel', re.I)
TRYAGAIN_PREFIX = 'TRYAGAIN ferry: no master for'


# --------------------------------------------------------------------------
# the tests


@unittest.skipIf(harness.DIRECT, 'ferry-only: needs ferry in sentinel mode')
class FailoverTest(AccountingChecks, unittest.TestCase):

    results = {}

    # ---- setup helpers

    def start(self, cleanups, ferry_conf=None, **topo_kw):
        topo = SentinelTopology(**topo_kw)
        cleanups.append(topo.stop)
        ferry = Ferry(None, conf=merged(FERRY_CONF, ferry_conf), sentinel=topo)
        cleanups.append(ferry.stop)
        return topo, ferry

    def repeat(self, name, fn):
        """Run fn(run_index) RUNS times, each as a subTest with fresh
        processes; print each run's summary (and the median gap)."""
        gaps = [res.gap_ms for res in each_run(self, RUNS, fn) if res is not None]
        if RUNS > 1 and gaps:
            print('[%s] longest_gap_ms per run: %s, median %.0f' % (
                name, ', '.join('%.0f' % g for g in gaps), statistics.median(gaps)), flush=True)
        self.results[name] = gaps

    def check_enforced(self, node, topo, ferry):
        """Scenario 5: ferry set appendonly yes / appendfsync always on the new
        master (it was started with appendfsync everysec)."""
        with self.subTest(check='durability enforced on the new master (scenario 5)'):
            c = node.client(socket_timeout=10)
            seen = {}

            def enforced():
                seen.update(c.config_get('appendfsync'))
                seen.update(c.config_get('appendonly'))
                return seen.get('appendfsync') == 'always' and seen.get('appendonly') == 'yes'
            try:
                wait_until(enforced, timeout=15, interval=0.2,
                           msg='appendfsync always + appendonly yes on %d' % node.port)
            except AssertionError as e:
                self.fail('%s; CONFIG GET says %r%s' % (e, seen, self.diag(topo, ferry)))

    # ---- 1. kill -9 of the master

    def test_1_kill9_master(self):
        def run(k, cleanups):
            # Sentinel sometimes fails over a second time right after the
            # first (see test_failover_paths.kill9_under_load): that is
            # Sentinel's decision, so such a run (config epoch above 1) is
            # run once more on fresh processes, and fails if it happens twice.
            for attempt in (1, 2):
                topo, ferry = self.start(cleanups, replica_conf={'appendfsync': 'everysec'})
                load = Load(ferry, 'kill9-%d-%d' % (k, attempt)).start()
                cleanups.append(lambda: (load.stop_producers.set(), load.stop_consumers.set()))
                time.sleep(PRE_FAULT)
                old = topo.master()
                t_fault = now()
                old.kill()
                new_port = topo.wait_failover(old.port, timeout=30)
                t_rec = now()
                t_service = load.wait_service(t_rec)
                time.sleep(POST_RECOVERY)
                res = load.finish(lambda: current_master(topo))
                epoch = sentinel_config_epoch(topo)
                if epoch <= 1 or attempt == 2:
                    break
                print('\n[kill9 run %d] Sentinel failed over twice (config epoch %d): running '
                      'again on fresh processes' % (k + 1, epoch), flush=True)
                while cleanups:
                    try:
                        cleanups.pop()()
                    except Exception:  # noqa: BLE001
                        pass
            self.assertLessEqual(epoch, 1, 'Sentinel failed over more than once in two runs')
            res.t_fault, res.t_recovered, res.t_service = t_fault, t_rec, t_service
            print(res.summary('kill9 run %d/%d' % (k + 1, RUNS)), flush=True)
            self.check_accounting(res, topo, ferry)
            self.check_consumers_after(res, t_rec, topo, ferry)
            self.check_enforced(topo.redis_by_port(new_port), topo, ferry)
            return res
        self.repeat('kill9', run)

    # ---- 2. the killed master comes back (stale) and is demoted by Sentinel

    def test_2_killed_master_restarts(self):
        def run(k, cleanups):
            # The hold budget must cover what Sentinel does here: the old
            # master back at +3.5 s can make a first failover attempt abort
            # (the replica it promoted stays a master), and Sentinel converts
            # a node that reports the wrong role only some 8-10 s after the
            # final failover, so the new master can be without any replica
            # (replicas_ack 1 unmet) for over 10 s. Past hold_timeout_ms the
            # honest answer is -NOREPLICAS; this test wants the pause.
            topo, ferry = self.start(cleanups, ferry_conf={'upstream': {'hold_timeout_ms': 30000}})
            load = Load(ferry, 'restart-%d' % k, reconnect_every=20, client_timeout=45,
                        join_timeout=60.0).start()
            cleanups.append(lambda: (load.stop_producers.set(), load.stop_consumers.set()))
            time.sleep(PRE_FAULT)
            old = topo.master()
            idx = topo.redis.index(old)
            t_fault = now()
            old.kill()
            time.sleep(max(0.0, t_fault + 3.5 - now()))
            topo.restart_redis(idx)
            t_back = now()
            # While the restarted node still claims to be master, nothing
            # through ferry may reach it (its commandstats restart from 0).
            writes_seen = {}

            def demoted():
                # One INFO call, so role and counters are the same instant:
                # once demoted, the node applies the new master's stream and
                # counts those LPUSH/RPOP too, which are not ferry's doing.
                info = old.client(socket_timeout=1).execute_command(
                    'INFO', 'replication', 'commandstats')
                if info.get('role') != 'master':
                    return True
                for cmd in ('lpush', 'brpop', 'rpop', 'lpop'):
                    st = info.get('cmdstat_' + cmd)
                    if st:
                        writes_seen[cmd] = max(writes_seen.get(cmd, 0), st.get('calls', 0))
                return False
            wait_until(demoted, timeout=40, interval=0.1,
                       msg='sentinel to demote the restarted old master %d' % old.port)
            t_demoted = now()
            new_port = topo.wait_failover(old.port, timeout=10)
            time.sleep(2.0)
            res = load.finish(lambda: current_master(topo))
            res.t_fault, res.t_recovered = t_fault, t_demoted
            print(res.summary('restart run %d/%d' % (k + 1, RUNS))
                  + ' restarted_at=+%.1fs demoted_at=+%.1fs' % (t_back - t_fault,
                                                             t_demoted - t_fault), flush=True)
            with self.subTest(check='no command through ferry reached the stale master'):
                self.assertEqual(writes_seen, {}, 'commands executed on the restarted old '
                                 'master while it claimed to be master: %r%s' % (
                                     writes_seen, self.diag(topo, ferry, res)))
            self.check_accounting(res, topo, ferry)
            with self.subTest(check='the demoted old master holds the same list'):
                master = topo.redis_by_port(new_port)
                mc = master.client(socket_timeout=10)
                oc = old.client(socket_timeout=10)

                def same():
                    return (oc.info('replication').get('master_link_status') == 'up'
                            and oc.lrange(KEY, 0, -1) == mc.lrange(KEY, 0, -1))
                wait_until(same, timeout=20, interval=0.2,
                           msg='old master %d in sync with %d' % (old.port, new_port))
            return res
        self.repeat('restart', run)

    # ---- 3. planned failover (SENTINEL FAILOVER) under load

    def test_3_planned_failover(self):
        def run(k, cleanups):
            topo, ferry = self.start(cleanups, replica_conf={'appendfsync': 'everysec'})
            load = Load(ferry, 'planned-%d' % k).start()
            cleanups.append(lambda: (load.stop_producers.set(), load.stop_consumers.set()))
            time.sleep(PRE_FAULT)
            old_port = topo.master_port()
            t_fault = now()
            self.assertEqual(topo.failover(0), 'OK')
            new_port = topo.wait_failover(old_port, timeout=30)
            t_rec = now()
            t_service = load.wait_service(t_rec)
            time.sleep(POST_RECOVERY)
            res = load.finish(lambda: current_master(topo))
            res.t_fault, res.t_recovered, res.t_service = t_fault, t_rec, t_service
            print(res.summary('planned run %d/%d' % (k + 1, RUNS)), flush=True)
            self.check_accounting(res, topo, ferry)
            self.check_consumers_after(res, t_rec, topo, ferry)
            self.check_enforced(topo.redis_by_port(new_port), topo, ferry)
            return res
        self.repeat('planned', run)

    # ---- 4. SIGSTOP of the master past down-after, then SIGCONT

    def test_4_sigstop_master(self):
        def run(k, cleanups):
            topo, ferry = self.start(cleanups, down_after_ms=1000)
            load = Load(ferry, 'sigstop-%d' % k).start()
            cleanups.append(lambda: (load.stop_producers.set(), load.stop_consumers.set()))
            time.sleep(PRE_FAULT)
            old = topo.master()
            cleanups.append(old.sigcont)
            t_fault = now()
            old.sigstop()
            time.sleep(2.5)
            old.sigcont()
            try:
                topo.wait_failover(old.port, timeout=15)
                failed_over = True
            except AssertionError:
                failed_over = False
            # the old master, if demoted, is turned into a replica only ~10 s later
            port = topo.wait_stable(timeout=45)
            t_rec = now()
            time.sleep(2.0)
            res = load.finish(lambda: current_master(topo))
            res.t_fault, res.t_recovered = t_fault, t_rec
            print(res.summary('sigstop run %d/%d' % (k + 1, RUNS))
                  + ' failed_over=%s master=%d stable_at=+%.1fs' % (failed_over, port,
                                                                   t_rec - t_fault), flush=True)
            self.check_accounting(res, topo, ferry)
            return res
        self.repeat('sigstop', run)

    # ---- 6. every sentinel down: ferry keeps the master it has

    def test_6_all_sentinels_down(self):
        def run(k, cleanups):
            topo, ferry = self.start(cleanups)
            load = Load(ferry, 'nosentinel-%d' % k).start()
            cleanups.append(lambda: (load.stop_producers.set(), load.stop_consumers.set()))
            time.sleep(PRE_FAULT)
            log_start = len(ferry.log())
            t_fault = now()
            for s in topo.sentinels:
                s.kill()
            time.sleep(5.0)
            t_end = now()
            try:
                wait_until(lambda: SENTINEL_UNREACHABLE.search(ferry.log()[log_start:]),
                           timeout=10, interval=0.2, msg='ferry to log that sentinels are '
                           'unreachable')
                logged = True
            except AssertionError:
                logged = False
            res = load.finish(lambda: current_master(topo))
            res.t_fault = t_fault
            print(res.summary('nosentinel run %d/%d' % (k + 1, RUNS)), flush=True)
            self.check_accounting(res, topo, ferry)
            with self.subTest(check='pushes keep being acknowledged without sentinels'):
                n = res.load.acks_between(t_fault + 1.0, t_end)
                self.assertGreater(n, 100, 'only %d acks in the 4 s after the sentinels died%s'
                                   % (n, self.diag(topo, ferry, res)))
                self.assertLess(res.gap_ms, 1000, self.diag(topo, ferry, res))
            with self.subTest(check='pops keep working without sentinels'):
                n = sum(1 for _, t, _ in res.delivered if t_fault + 1.0 <= t < t_end)
                self.assertGreater(n, 100, 'only %d deliveries' % n)
            with self.subTest(check="ferry's log says the sentinels are unreachable"):
                self.assertTrue(logged, 'no line matching %r in the ferry log since the '
                                'sentinels died%s' % (SENTINEL_UNREACHABLE.pattern,
                                                      self.diag(topo, ferry, res)))
            return res
        self.repeat('nosentinel', run)

    # ---- 7. a hold longer than upstream.hold_timeout_ms

    def test_7_hold_timeout_no_master(self):
        hold_ms = 1500

        def push_raw(ferry, item, timeout):
            """LPUSH on a fresh raw connection: (reply, seconds taken); the
            reply is the exception if none came within timeout."""
            t0 = now()
            try:
                s = ferry.raw(timeout=timeout)
                try:
                    resp_send(s, ['LPUSH', KEY, item])
                    return resp_read_reply(s, timeout), now() - t0
                finally:
                    s.close()
            except Exception as e:  # noqa: BLE001 - reported by the caller
                return e, now() - t0

        def is_int(r):
            return isinstance(r, int) and not isinstance(r, bool)

        def run(k, cleanups):
            topo, ferry = self.start(cleanups, ferry_conf={'upstream': {'hold_timeout_ms': hold_ms}})
            before = []
            for n in range(50):
                item = 'hold-%d-before-%d' % (k, n)
                r, _ = push_raw(ferry, item, 10.0)
                self.assertTrue(is_int(r), 'push before the fault: %r' % (r,))
                before.append(item)
            old = topo.master()
            idx = topo.redis.index(old)
            for s in topo.sentinels:   # first, so that no failover can start
                s.kill()
            old.kill()
            bound = hold_ms / 1000.0 + 4.0
            for n in range(2):
                r, took = push_raw(ferry, 'hold-%d-during-%d' % (k, n), bound + 6.0)
                print('[hold run %d/%d] reply %d after %.2fs: %r' % (k + 1, RUNS, n, took, r),
                      flush=True)
                with self.subTest(check='TRYAGAIN after the hold bound', attempt=n):
                    self.assertIsInstance(r, RespError, 'expected -%s..., got %r after %.1fs%s' % (
                        TRYAGAIN_PREFIX, r, took, self.diag(topo, ferry)))
                    self.assertTrue(str(r).startswith(TRYAGAIN_PREFIX), '%r%s' % (
                        str(r), self.diag(topo, ferry)))
                    self.assertGreaterEqual(took, hold_ms / 1000.0 * 0.8)
                    self.assertLess(took, bound, 'answered only after %.1fs' % took)
                if not isinstance(r, RespError):
                    break   # ferry did not answer: no point in asking again
            got = {}

            def push_ok():
                r, _ = push_raw(ferry, 'hold-%d-after' % k, 5.0)
                got['r'] = r
                return is_int(r)

            # Stage 1: only the old master comes back; ferry, with no sentinel
            # to ask, should keep (or return to) the last master it knew.
            topo.restart_redis(idx)
            t_back = now()
            resumed = False
            with self.subTest(check='service resumes on the restarted master, sentinels down'):
                try:
                    wait_until(push_ok, timeout=15, interval=0.3,
                               msg='a push through ferry to succeed after the restart')
                    resumed = True
                except AssertionError as e:
                    self.fail('%s; last reply %r%s' % (e, got.get('r'), self.diag(topo, ferry)))
                print('[hold run %d/%d] service back %.1fs after the master restart (sentinels '
                      'down)' % (k + 1, RUNS, now() - t_back), flush=True)
            # Stage 2 (only if stage 1 failed): the sentinels come back too.
            if not resumed:
                for s in topo.sentinels:
                    s.start()
                t_back = now()
                with self.subTest(check='service resumes once the sentinels are back'):
                    try:
                        wait_until(push_ok, timeout=20, interval=0.3,
                                   msg='a push through ferry to succeed with sentinels back')
                    except AssertionError as e:
                        self.fail('%s; last reply %r%s' % (e, got.get('r'),
                                                           self.diag(topo, ferry)))
                    print('[hold run %d/%d] service back %.1fs after the sentinels restarted'
                          % (k + 1, RUNS, now() - t_back), flush=True)
            with self.subTest(check='pushes acked before the kill survived it (AOF)'):
                items = old.client(socket_timeout=10).lrange(KEY, 0, -1)
                missing = [i for i in before if i not in items]
                self.assertEqual(missing, [], 'acked before the kill, gone after the restart')
            return None
        self.repeat('hold', run)


if __name__ == '__main__':
    unittest.main()
