"""RQ through ferry across a kill -9 of the master (Sentinel mode, replicas_ack
1 by default): RQPatternFailoverTest holds RQ's calls per job (rq_pattern.py,
no fork) to within 25 % of their rate before the failover; RQFailoverTest runs
real RQ workers across the same failover.

RQ 2.10 and redis-py 8.1 (RESP3, as users run them) come from the virtual
environment scripts/setup makes in tests/integration/pylibs-venv. RQ's paths
are the ones the plain failover workload does not take: every job is
dequeued with BLMOVE on a dedicated link, its state is written by MULTI/EXEC
and WATCH+MULTI transactions (one WAIT after each EXEC), each `rq worker`
holds a pub/sub connection and forks a work horse per job that opens
connections of its own.

The test enqueues JOBS jobs, starts 3 `rq worker` processes, measures the
jobs finished per second over WINDOW seconds, kills the master with SIGKILL,
waits for the failover and for jobs to finish again, measures another WINDOW,
and checks: no failed job, every worker still finishing jobs, and rate after
>= 0.5 x rate before (the fork per job sets RQ's rate on a small machine).
Each run prints both rates.

Run:  python3 -m unittest test_rq_failover -v
      RQ_WINDOW=20 RQ_JOBS=4000 python3 -m unittest test_rq_failover -v
      RQ_ACK=0 ...   (durability.replicas_ack 0, to compare)

Ferry-only (skipped with FERRY_TEST_DIRECT=1).
"""
import os
import signal
import subprocess
import time
import unittest

import harness
from failover_load import current_master
from harness import Ferry, SentinelTopology, wait_until
from test_stats import stats_json

HERE = os.path.dirname(os.path.abspath(__file__))
VENV = os.path.join(HERE, 'pylibs-venv')
JOBS = int(os.environ.get('RQ_JOBS', '3000'))
WINDOW = float(os.environ.get('RQ_WINDOW', '12'))   # seconds measured before and after
WORKERS = 3
MAX_DROP = 0.25  # the bug it guards against took the rate to 30-45 %; CPU noise on 2 cores is +-15 %
# Real RQ forks a work horse per job: on a small machine that fork, not ferry,
# sets the rate (about 6 jobs/s on 2 cores, direct or through ferry, noise
# +-30 %), so this test only catches a collapse; RQPatternFailoverTest below
# holds RQ's calls to within 25 %.
RQ_MAX_DROP = 0.5
EXTRA_CONF = {'durability': {'replicas_ack': int(os.environ['RQ_ACK'])}} if os.environ.get('RQ_ACK') else {}

ENQUEUE = r'''
import sys
from redis import Redis
from rq import Queue
q = Queue('default', connection=Redis(host='127.0.0.1', port=int(sys.argv[1])))
for i in range(int(sys.argv[2])):
    q.enqueue('rq_jobs.noop', i, result_ttl=3600)
print(len(q))
'''


@unittest.skipIf(harness.DIRECT, 'ferry-only: needs ferry in sentinel mode')
class RQFailoverTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        for exe in ('python', 'rq'):
            if not os.access(os.path.join(VENV, 'bin', exe), os.X_OK):
                raise AssertionError('%s is missing: run scripts/setup (it makes the virtual '
                                     'environment with RQ and redis-py from FERRY_PYLIBS)'
                                     % os.path.join(VENV, 'bin', exe))

    def env(self):
        env = dict(os.environ)
        env['PYTHONPATH'] = HERE
        return env

    def start_worker(self, port, i):
        out = os.path.join(self.ferry.dir, 'rq-worker-%d.log' % i)
        # harness._spawn: own process group (the work horses join it), dies
        # with the test process.
        p = harness._spawn([os.path.join(VENV, 'bin', 'rq'), 'worker', '--url',
                            'redis://127.0.0.1:%d' % port, '--name', 'w%d' % i, 'default'],
                           out, cwd=HERE, env=self.env())

        def stop():
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()
        self.addCleanup(stop)
        return p, out

    def finished(self):
        """(jobs finished, jobs failed, {worker: successful jobs}) on the master."""
        def ask():
            c = current_master(self.topo).client(socket_timeout=2)
            done = c.zcard('rq:finished:default')
            failed = c.zcard('rq:failed:default')
            per = {}
            for i in range(WORKERS):
                per['w%d' % i] = int(c.hget('rq:worker:w%d' % i, 'successful_job_count') or 0)
            return done, failed, per
        last = None
        for _ in range(50):
            try:
                return ask()
            except Exception as e:  # noqa: BLE001 - the master may be moving
                last = e
                time.sleep(0.1)
        raise AssertionError('cannot read RQ state from the master: %r' % (last,))

    def rate(self, label):
        d0, _, p0 = self.finished()
        t0 = time.monotonic()
        time.sleep(WINDOW)
        d1, failed, p1 = self.finished()
        dt = time.monotonic() - t0
        r = (d1 - d0) / dt
        per = {w: p1[w] - p0.get(w, 0) for w in p1}
        print('[rq %s] %.1f jobs/s over %.1f s (%d jobs; per worker %s; failed so far %d)'
              % (label, r, dt, d1 - d0, per, failed), flush=True)
        return r, per, failed

    def diag(self):
        logs = []
        for p, out in self.workers:
            with open(out, errors='replace') as f:
                logs.append('--- %s ---\n%s' % (out, f.read()[-1500:]))
        return '\n--- ferry log ---\n%s\n%s\n%s' % (self.ferry.log()[-5000:], '\n'.join(logs),
                                                   self.topo.logs(1500))

    def test_kill9_keeps_the_job_rate(self):
        self.workers = []
        self.topo = SentinelTopology()
        self.addCleanup(self.topo.stop)
        self.ferry = Ferry(None, sentinel=self.topo,
                           conf={'upstream': {'hold_timeout_ms': 10000}, **EXTRA_CONF})
        self.addCleanup(self.ferry.stop)

        p = subprocess.run([os.path.join(VENV, 'bin', 'python'), '-c', ENQUEUE,
                            str(self.ferry.port), str(JOBS)], cwd=HERE, env=self.env(),
                           capture_output=True, text=True, timeout=600)
        self.assertEqual(p.returncode, 0, 'enqueue failed: %s%s' % (p.stderr[-3000:],
                                                                   self.diag()))

        self.workers = [self.start_worker(self.ferry.port, i) for i in range(WORKERS)]
        # Warm-up: every worker has finished a few jobs.
        wait_until(lambda: min(self.finished()[2].values()) >= 3, timeout=120, interval=0.5,
                   msg='every RQ worker to finish 3 jobs')
        before, _, _ = self.rate('before the kill')
        left = JOBS - self.finished()[0]
        self.assertGreater(left, before * (WINDOW + 15),
                           'too few jobs left to measure after the failover: raise RQ_JOBS')

        old = current_master(self.topo)
        old.kill()
        new_port = self.topo.wait_failover(old.port, timeout=30)
        # Service again: jobs finish on the new master.
        done_at_kill = self.finished()[0]
        wait_until(lambda: self.finished()[0] > done_at_kill + WORKERS, timeout=60, interval=0.2,
                   msg='jobs to finish again on the new master %d' % new_port)
        time.sleep(2)
        after, per, failed = self.rate('after the kill')

        self.assertEqual(failed, 0, 'RQ jobs failed across the failover%s' % self.diag())
        idle = [w for w, n in per.items() if n == 0]
        self.assertEqual(idle, [], 'RQ workers that finished nothing after the failover: %s%s'
                         % (idle, self.diag()))
        self.assertGreaterEqual(after, before * (1 - RQ_MAX_DROP),
                                'RQ ran %.1f jobs/s before the kill -9 and %.1f after (more '
                                'than %d %% slower)%s' % (before, after, RQ_MAX_DROP * 100,
                                                          self.diag()))


PATTERN_WINDOW = float(os.environ.get('RQ_PATTERN_WINDOW', '8'))
PATTERN_PROBES = 1000
STALL_S = 0.038   # Linux's delayed ACK is 40 ms: a request held by Nagle takes at least that


@unittest.skipIf(harness.DIRECT, 'ferry-only: needs ferry in sentinel mode')
class RQPatternFailoverTest(unittest.TestCase):
    """RQ's calls per job (rq_pattern.py: BLMOVE, heartbeats, MULTI/EXEC on the
    worker's connection and on a new one per job, WATCH+MULTI/EXEC) from 3
    processes, without RQ's fork per job, so the rate is ferry's and Redis'.
    After a kill -9 failover the replica left behind has resynced partially, and
    Redis 7.0 leaves its connection to the new master without TCP_NODELAY: its
    ACKs wait on the master's delayed ACK (40 ms) unless ferry has the master
    send it something (fence.c, WAIT_NUDGE_MS). Measured before that: the rate
    fell to 30-45 % after the failover and about 2.5 % of single writes took
    40 ms or more; checked here: the rate stays within 25 % and at most 1 % of
    1 000 writes take 38 ms or more."""

    def test_kill9_keeps_the_rate_of_rqs_calls(self):
        topo = SentinelTopology()
        self.addCleanup(topo.stop)
        f = Ferry(None, sentinel=topo, conf={'upstream': {'hold_timeout_ms': 10000}})
        self.addCleanup(f.stop)
        c = f.client()
        c.rpush('rq:queue', *['job-%d' % i for i in range(60000)])
        stop_at = time.time() + 3 * PATTERN_WINDOW + 60
        procs = []
        for i in range(WORKERS):
            out = os.path.join(f.dir, 'rq-pattern-%d.log' % i)
            procs.append((harness._spawn(['/usr/bin/python3', os.path.join(HERE, 'rq_pattern.py'),
                                          str(f.port), 'w%d' % i, str(stop_at)], out, cwd=HERE),
                          out))

        def stop_workers():
            for p, _ in procs:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.wait()
        self.addCleanup(stop_workers)

        def finished():
            for _ in range(100):
                try:
                    return current_master(topo).client(socket_timeout=2).zcard('rq:finished')
                except Exception:  # noqa: BLE001 - the master may be moving
                    time.sleep(0.1)
            raise AssertionError('cannot read rq:finished from the master')

        series = []

        def rate(label):
            d0, t0 = finished(), time.monotonic()
            del series[:]
            while time.monotonic() - t0 < PATTERN_WINDOW:
                time.sleep(min(1.0, max(0.0, t0 + PATTERN_WINDOW - time.monotonic())))
                series.append((round(time.monotonic() - t0, 1), finished()))
            d1, dt = finished(), time.monotonic() - t0
            print('[rq pattern %s] %.1f jobs/s over %.1f s' % (label, (d1 - d0) / dt, dt),
                  flush=True)
            return (d1 - d0) / dt

        def diag():
            """What a slow window looked like: finished per second, each node's
            role and count, ferry's master view, the workers' last lines."""
            lines = ['finished per second: %r' % series]
            for r in topo.redis:
                if not r.running():
                    lines.append('node %d: not running' % r.port)
                    continue
                try:
                    cl = r.client(socket_timeout=1)
                    info = cl.info('replication')
                    lines.append('node %d: %s master_port=%s link=%s slaves=%s finished=%s' % (
                        r.port, info.get('role'), info.get('master_port'),
                        info.get('master_link_status'), info.get('connected_slaves'),
                        cl.zcard('rq:finished')))
                except Exception as e:  # noqa: BLE001 - a diagnostic only
                    lines.append('node %d: %r' % (r.port, e))
            lines.append('sentinels: %r' % (topo.sentinel_views(),))
            try:
                st = stats_json(f.stats_port)
                lines.append('ferry: %r %r' % (st.get('upstream'), st.get('durability')))
            except Exception as e:  # noqa: BLE001
                lines.append('ferry stats: %r' % (e,))
            for _, out in procs:
                try:
                    with open(out) as fh:
                        tail = fh.read().splitlines()[-3:]
                except OSError:
                    tail = []
                lines.append('%s: %r' % (os.path.basename(out), tail))
            lines += [ln for ln in f.log().splitlines()
                      if 'master' in ln and 'WAIT' not in ln and 'DEBUG' not in ln][-40:]
            return '\n'.join(lines)

        wait_until(lambda: finished() >= 30, timeout=60, interval=0.2, msg='jobs to finish')
        before = rate('before the kill')
        old = current_master(topo)
        old.kill()
        new_port = topo.wait_failover(old.port, timeout=30)
        # Sentinel sometimes elects twice after one kill (two sentinels win in
        # turn): the second switch demotes the first new master, which
        # Sentinel re-attaches as a replica only ~10 s later, and writes wait
        # for it (durability.replicas_ack_hold_ms; test_failover_paths c2).
        # The rate after is measured once the topology has settled.
        # A second election can also come later than wait_stable (a sentinel
        # that voted for the first leader tries again once failover-timeout
        # has passed): its new master has no replica until Sentinel
        # re-attaches the demoted one, and writes wait for it (replicas_ack).
        # That is not what this test measures: a window in which ferry's
        # master view moved is measured again (at most twice).
        def epoch():
            return stats_json(f.stats_port)['upstream']['epoch']

        # The bug this guards against slowed every window after the kill
        # (30-45 % of the rate before, or 0); one slow window among good
        # ones is the machine (seen in CI on 2 cores: 120.6 jobs/s before,
        # 63.9 after, ~60 in every second of that window, 55-111 in runs by
        # hand): the rate after is measured up to 3 times, and the best
        # window counts.
        new_port = topo.wait_stable(timeout=45)
        at_kill = finished()
        wait_until(lambda: finished() > at_kill + 30, timeout=60, interval=0.2,
                   msg='jobs to finish again on the new master %d' % new_port)
        time.sleep(1)
        after = 0.0
        for attempt in range(3):
            new_port = topo.wait_stable(timeout=45)
            e0 = epoch()
            now_rate = rate('after the kill')
            if epoch() != e0:
                print('[rq pattern] ferry\'s master view moved during the window (epoch %d -> '
                      '%d): measured again' % (e0, epoch()), flush=True)
                continue
            after = max(after, now_rate)
            if after >= before * (1 - MAX_DROP):
                break

        slow = 0
        for i in range(PATTERN_PROBES):
            t = time.monotonic()
            c.incr('rq:probe')
            slow += time.monotonic() - t >= STALL_S
        nudges = stats_json(f.stats_port)["durability"]["wait_nudges"]
        print('[rq pattern] %d of %d writes took %d ms or more after the failover; '
              '%d nudges' % (slow, PATTERN_PROBES, STALL_S * 1000, nudges), flush=True)
        self.assertLessEqual(slow, PATTERN_PROBES // 100,
                             'writes held by a replica\'s delayed ACK after the failover\n%s'
                             % diag())
        self.assertGreaterEqual(after, before * (1 - MAX_DROP),
                                '%.1f jobs/s before the kill -9 and %.1f after (more than %d %% '
                                'slower)\n%s' % (before, after, MAX_DROP * 100, diag()))


if __name__ == '__main__':
    unittest.main()
