"""A network partition in Sentinel mode: the master is cut off from its
replicas and from the sentinels that can elect a new one, while ferry still
reaches it.

Network (harness.NetLab, network namespaces joined by one bridge):

    zone m   the master and sentinel 0           (a node and its sentinel)
    zone r   both replicas, sentinels 1 and 2
    here     ferry and the test: reach both zones, before and after the cut

The cut drops every packet between m and r. Sentinels 1 and 2 see the master
down, elect a leader and promote a replica; sentinel 0 still names the old
master, which still answers ROLE master to ferry. With replicas_ack 1, writes
the isolated master takes cannot be confirmed by a replica, so ferry holds
their replies; at the switch it re-sends them to the new master.

Workload and accounting as in test_failover.py: 4 producers (LPUSH of unique
ids, acknowledged when LPUSH returns an integer) and 4 consumers (BRPOP)
through ferry. Asserted:
  - no acknowledged push lost, nothing delivered that was never pushed, no
    client error; a duplicate is allowed only where a partition explains it
    (a push re-sent after the cut, or an item popped on the isolated master,
    whose pop Sentinel's failover rolled back), at most twice each;
  - the write gap (longest gap between two acknowledged pushes) spans the
    switch and ends within SWITCH_SLACK_S of the first +switch-master a
    sentinel announced (seen by a subscriber of the test).

Skipped, with the reason printed, when not run as root or when `ip netns`
does not work (and with FERRY_TEST_DIRECT=1: there is no ferry to test).

SentinelQuorumTest plays the same situation from ferry's side with scripted
sentinels (FakeSentinel of test_sentinel_nonsense.py; no root needed):
  - ferry cut off from a majority of the sentinels keeps its master (the one
    sentinel it still reaches names another, even at a higher config epoch)
    and says so in its log (once), its stats and /healthz (200, DEGRADED);
  - during a failover, a master named at a higher config epoch by one
    sentinel is taken before a majority names it only when another sentinel
    backs the claim (here: the leader's +promoted-slave event); the claim
    alone, or with events of its own sentinel only, moves nothing.

Run:  python3 -m unittest test_partition -v                 (about 40 s)
      PARTITION_RUNS=3 python3 -m unittest test_partition.PartitionTest -v
          (median gap of 3 runs)
"""
import json
import os
import socket
import statistics
import sys
import threading
import time
import unittest

import harness
from harness import Ferry, NetLab, RedisServer, SentinelTopology, netns_unavailable, wait_until
from failover_load import Load
from test_failover import FERRY_CONF
from test_sentinel_nonsense import SILENT, FakeSentinel, cmdstats, master_fields

PRODUCERS = CONSUMERS = 4  # Load's defaults

RUNS = max(1, int(os.environ.get('PARTITION_RUNS', '1')))
SWITCH_SLACK_S = 0.300   # writes resume at most this long after Sentinel's switch
PRE_CUT = 2.0            # s of load before the cut
POST_SWITCH = 3.0        # s of load after service resumed
EVENTS = ('+sdown', '+odown', '+elected-leader', '+promoted-slave', '+switch-master',
          '+failover-end')


def now():
    return time.monotonic()


class SentinelEvents:
    """Every sentinel's failover events, as (monotonic time, sentinel index,
    event, payload), from one subscriber thread per sentinel."""

    def __init__(self, sentinels):
        self.sentinels = sentinels
        self.lock = threading.Lock()
        self.seen = []
        self.stopping = threading.Event()
        self.threads = []
        self.ready = 0

    def _run(self, i, s):
        c = s.client(socket_timeout=5)
        p = c.pubsub(ignore_subscribe_messages=True)
        p.subscribe(*EVENTS)
        with self.lock:
            self.ready += 1
        try:
            while not self.stopping.is_set():
                m = p.get_message(timeout=0.2)
                if m and m.get('type') == 'message':
                    with self.lock:
                        self.seen.append((now(), i, m['channel'], m['data']))
        except Exception:  # noqa: BLE001 - a sentinel went away: stop listening
            pass
        finally:
            try:
                p.close()
                c.close()
            except Exception:  # noqa: BLE001
                pass

    def start(self):
        for i, s in enumerate(self.sentinels):
            t = threading.Thread(target=self._run, args=(i, s), daemon=True,
                                 name='sentinel-events-%d' % i)
            t.start()
            self.threads.append(t)
        wait_until(lambda: self.ready == len(self.sentinels), timeout=10,
                   msg='event subscribers on every sentinel')
        return self

    def stop(self):
        self.stopping.set()
        for t in self.threads:
            t.join(5)

    def first(self, event, contains=None):
        """Time of the first `event` (whose payload contains `contains`)."""
        with self.lock:
            ts = [t for t, _, ev, data in self.seen
                  if ev == event and (contains is None or contains in data)]
        return min(ts) if ts else None

    def timeline(self, t0):
        with self.lock:
            rows = sorted(self.seen)
        return '\n'.join('  %+.3fs sentinel[%d] %s %s' % (t - t0, i, ev, data)
                         for t, i, ev, data in rows)


@unittest.skipIf(harness.DIRECT, 'ferry-only: needs ferry in sentinel mode')
class PartitionTest(unittest.TestCase):

    gaps = []

    @classmethod
    def setUpClass(cls):
        cls.why_not = netns_unavailable()
        if cls.why_not:
            print('test_partition: skipped: %s' % cls.why_not, file=sys.stderr, flush=True)

    def setUp(self):
        if self.why_not:
            self.skipTest(self.why_not)

    def diag(self, ferry, events, t0, res=None):
        text = '\n--- sentinel events ---\n' + events.timeline(t0)
        if res is not None:
            text += '\n' + res.summary('diag')
        lines = [ln for ln in ferry.log().splitlines()
                 if ' DEBUG ' not in ln and 'closed: client closed' not in ln]
        text += '\n--- ferry log (%s), last non-debug lines ---\n%s' % (
            ferry.log_path, '\n'.join(lines[-60:]))
        return text

    def run_once(self, k):
        lab = NetLab(['m', 'r'])
        self.addCleanup(lab.destroy)
        topo = SentinelTopology(redis_at=[lab.at('m'), lab.at('r'), lab.at('r')],
                                sentinels_at=[lab.at('m'), lab.at('r'), lab.at('r')],
                                replica_conf={'appendfsync': 'everysec'})
        self.addCleanup(topo.stop)
        ferry = Ferry(None, conf=FERRY_CONF, sentinel=topo)
        self.addCleanup(ferry.stop)
        events = SentinelEvents(topo.sentinels).start()
        self.addCleanup(events.stop)
        old = topo.redis[0]
        self.assertEqual(topo.master_port(), old.port)

        load = Load(ferry, 'part-%d' % k).start()
        self.addCleanup(lambda: (load.stop_producers.set(), load.stop_consumers.set()))
        time.sleep(PRE_CUT)
        t_cut = now()
        lab.cut('m', 'r')
        try:
            new_port = topo.wait_failover(old.port, timeout=30)
        except AssertionError as e:
            self.fail('%s%s' % (e, self.diag(ferry, events, t_cut)))
        new = topo.redis_by_port(new_port)
        new_addr = '%s %d' % (new.host, new.port)
        wait_until(lambda: events.first('+switch-master', new_addr), timeout=10,
                   msg='a +switch-master event naming %s' % new_addr)
        t_switch = events.first('+switch-master', new_addr)
        t_service = load.wait_service(t_switch, timeout=30)
        time.sleep(POST_SWITCH)
        res = load.finish(lambda: new)
        res.t_fault, res.t_recovered, res.t_service = t_cut, t_switch, t_service
        events.stop()

        acks = sorted(res.acked.values())
        before = [t for t in acks if t <= t_switch]
        after = [t for t in acks if t > t_switch]
        resume = (after[0] - t_switch) if after else float('inf')
        switch_gap = ((after[0] - before[-1]) * 1000) if before and after else float('inf')
        t_end = events.first('+failover-end')
        print(res.summary('partition run %d/%d' % (k + 1, RUNS)) +
              ' switch_master_at=+%.3fs failover_end_at=%s writes_resume_after_switch_ms=%.0f'
              % (t_switch - t_cut, '+%.3fs' % (t_end - t_cut) if t_end else 'none',
                 resume * 1000), flush=True)
        diag = self.diag(ferry, events, t_cut, res)

        with self.subTest(check='no client-visible error'):
            self.assertEqual(res.errors, [], 'client errors:\n%s%s' % (res.error_text(), diag))
        with self.subTest(check='threads finished'):
            self.assertEqual(res.stuck, [])
            self.assertIsNone(res.drain_error)
        with self.subTest(check='no acknowledged push lost'):
            self.assertEqual(res.lost, [], '%d acked id(s) neither delivered nor on the new '
                             'master:\n%s%s' % (len(res.lost), res.lost_text(), diag))
        with self.subTest(check='nothing delivered that was never pushed'):
            self.assertEqual(res.phantom, [])
        with self.subTest(check='duplicates only where the partition explains them'):
            def explained(item, n):
                firsts = [t for _, t in res.deliveries.get(item, [])]
                return n == 2 and (res.acked.get(item, 0) >= t_cut or
                                   any(t >= t_cut for t in firsts))
            bad = [i for i, n in res.duplicates.items() if not explained(i, n)]
            self.assertEqual(bad, [], 'duplicates not explained:\n%s%s' % (res.dup_text(), diag))
            ndup = sum(n - 1 for n in res.duplicates.values())
            self.assertLessEqual(ndup, PRODUCERS + CONSUMERS, res.dup_text() + diag)
        self.assertGreater(len(res.acked), 100, 'the workload barely ran' + diag)
        with self.subTest(check='writes resume within %d ms of the switch'
                          % (SWITCH_SLACK_S * 1000)):
            self.assertLessEqual(resume, SWITCH_SLACK_S,
                                 'first acknowledged push %.0f ms after the first +switch-master'
                                 % (resume * 1000) + diag)
            # the longest gap is the one across the switch, not another one
            self.assertGreaterEqual(switch_gap + 1, res.gap_ms, diag)
        return res.gap_ms, resume

    def test_partitioned_master(self):
        gaps, resumes = [], []
        for k in range(RUNS):
            with self.subTest(run=k + 1):
                try:
                    g, r = self.run_once(k)
                    gaps.append(g)
                    resumes.append(r * 1000)
                finally:
                    self.doCleanups()
        if RUNS > 1 and gaps:
            print('[partition] longest_gap_ms per run: %s, median %.0f; writes resumed after '
                  'the switch (ms): %s, median %.0f' % (
                      ', '.join('%.0f' % g for g in gaps), statistics.median(gaps),
                      ', '.join('%.0f' % r for r in resumes), statistics.median(resumes)),
                  flush=True)


# --------------------------------------------------------------------------
# the same from ferry's side, with scripted sentinels

QUORUM_CONF = {
    'upstream': {'hold_timeout_ms': 800, 'connect_timeout_ms': 500},
    'durability': {'replicas_ack': 0},   # these Redis nodes have no replica
}
DEGRADED_LOG = 'fewer than a majority'


class IdSentinel(FakeSentinel):
    """A FakeSentinel that answers SENTINEL MYID, as real sentinels do."""

    def __init__(self, myid, **kw):
        self.myid = myid
        super().__init__(**kw)

    def _answer(self, args):
        if [a.upper() for a in args[:2]] == ['SENTINEL', 'MYID']:
            return self.myid
        return super()._answer(args)


def http_get(port, path):
    """(status, body text) of GET path on the stats port."""
    with socket.create_connection(('127.0.0.1', port), timeout=5) as s:
        s.sendall(('GET %s HTTP/1.0\r\n\r\n' % path).encode())
        data = b''
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    head, _, body = data.partition(b'\r\n\r\n')
    return int(head.split()[1]), body.decode()


@unittest.skipIf(harness.DIRECT, 'ferry-only: scripted sentinels talk to ferry')
class SentinelQuorumTest(unittest.TestCase):

    def redis(self):
        r = RedisServer()
        self.addCleanup(r.kill)
        return r

    def sentinels(self, n, master):
        out = []
        for i in range(n):
            s = IdSentinel('%040x' % (i + 1), master=master)
            self.addCleanup(s.stop)
            out.append(s)
        return out

    def ferry(self, sentinels):
        sec = {'master': 'mq', 'addresses': [s.address for s in sentinels],
               'resolve_interval_ms': 200, 'timeout_ms': 500}
        f = Ferry(None, sentinel=sec, conf=QUORUM_CONF, wait='port')
        self.addCleanup(f.stop)
        return f

    def wait_up(self, f, srv, since=0, timeout=8.0):
        wait_until(lambda: '-> UP(127.0.0.1:%d' % srv.port in f.log()[since:], timeout=timeout,
                   msg='ferry to accept master %d' % srv.port)

    def push_lands_on(self, f, srv, key='q'):
        """A push through ferry lands on srv."""
        before = srv.client().llen(key)
        c = f.client(socket_timeout=6)
        try:
            self.assertEqual(c.lpush(key, 'item'), before + 1, f.log()[-3000:])
        finally:
            c.close()
        self.assertEqual(srv.client().llen(key), before + 1,
                         'the push did not land on %d\n%s' % (srv.port, f.log()[-3000:]))

    def asked(self, fakes, n):
        counts = [s.count('SENTINEL', 'MASTER') for s in fakes]
        wait_until(lambda: all(s.count('SENTINEL', 'MASTER') >= c + n
                               for s, c in zip(fakes, counts)),
                   timeout=10, msg='%d more poll rounds' % n)

    def stats(self, f):
        status, body = http_get(f.stats_port, '/stats')
        self.assertEqual(status, 200)
        return json.loads(body)['sentinels']

    def test_minority_keeps_the_master(self):
        real, other = self.redis(), self.redis()   # both say ROLE master
        good = master_fields('127.0.0.1', real.port, epoch=0)
        a, b, c = self.sentinels(3, good)
        f = self.ferry([a, b, c])
        self.wait_up(f, real)
        self.push_lands_on(f, real)
        self.assertTrue(self.stats(f)['sentinel_quorum_ok'])
        self.assertEqual(http_get(f.stats_port, '/healthz'),
                         (200, 'OK: master 127.0.0.1:%d is UP\n' % real.port))

        # ferry now reaches only c, which names another master, at a higher
        # config epoch too: 1 of 3 known is no majority, and nobody backs c
        mark = len(f.log())
        a.master = b.master = SILENT
        for epoch in (0, 5):
            c.master = master_fields('127.0.0.1', other.port, epoch=epoch)
            self.asked([c], 4)
            self.push_lands_on(f, real)
        wait_until(lambda: DEGRADED_LOG in f.log()[mark:], timeout=5,
                   msg='ferry to log that fewer than a majority answer')
        st = self.stats(f)
        self.assertEqual((st['sentinel_quorum_ok'], st['sentinels_reachable'],
                          st['sentinels_known']), (False, 1, 3), st)
        status, body = http_get(f.stats_port, '/healthz')
        self.assertEqual(status, 200, body)
        self.assertTrue(body.startswith('OK: master 127.0.0.1:%d is UP; DEGRADED: 1 of 3 known'
                                        % real.port), body)
        self.assertNotIn('cmdstat_lpush', cmdstats(other))
        self.assertNotIn('connecting to 127.0.0.1:%d' % other.port, f.log())
        self.assertEqual(f.log()[mark:].count(DEGRADED_LOG), 1, 'logged once per change')

        # the majority is back
        mark = len(f.log())
        a.master = b.master = c.master = good
        wait_until(lambda: self.stats(f)['sentinel_quorum_ok'], timeout=10,
                   msg='sentinel_quorum_ok again')
        self.assertIn('a majority: ferry follows', f.log()[mark:])
        self.assertEqual(http_get(f.stats_port, '/healthz'),
                         (200, 'OK: master 127.0.0.1:%d is UP\n' % real.port))
        self.push_lands_on(f, real)

    def test_higher_epoch_needs_a_second_sentinel(self):
        real, new = self.redis(), self.redis()
        a, b, c = self.sentinels(3, master_fields('127.0.0.1', real.port, epoch=0))
        f = self.ferry([a, b, c])
        self.wait_up(f, real)
        self.push_lands_on(f, real)

        # mid-failover: a (cut off) names the old master, b (the leader) names
        # it at the new epoch while failing it over, c names the promoted
        # replica at the new epoch; c's own events back nothing
        mark = len(f.log())
        b.master = master_fields('127.0.0.1', real.port, epoch=1,
                                 flags='master,failover_in_progress')
        c.master = master_fields('127.0.0.1', new.port, epoch=1)
        wait_until(lambda: c.n_subscribers() >= 1, timeout=5, msg='ferry listens to c')
        c.pmessage('+switch-master', 'mq 127.0.0.1 %d 127.0.0.1 %d' % (real.port, new.port))
        c.pmessage('+promoted-slave', 'slave 127.0.0.1:%d 127.0.0.1 %d @ mq 127.0.0.1 %d'
                   % (new.port, new.port, real.port))
        self.asked([a, b, c], 4)
        self.assertNotIn('connecting to 127.0.0.1:%d' % new.port, f.log(),
                         'one sentinel alone moved ferry')
        self.assertNotIn('cmdstat_lpush', cmdstats(new))

        # the leader announces the promotion: c's claim is backed
        wait_until(lambda: b.n_subscribers() >= 1, timeout=5, msg='ferry listens to b')
        b.pmessage('+promoted-slave', 'slave 127.0.0.1:%d 127.0.0.1 %d @ mq 127.0.0.1 %d'
                   % (new.port, new.port, real.port))
        self.wait_up(f, new, since=mark)
        self.assertIn('above the trusted 0', f.log()[mark:])
        self.push_lands_on(f, new)


if __name__ == '__main__':
    unittest.main()
