"""A producer/consumer workload through ferry and its exact accounting, shared
by the failover tests (test_failover, test_failover_paths).

Load runs `producers` threads that each write unique ids, one call at a time,
and `consumers` threads that take them out; an id counts as acknowledged only
when its write got the reply is_ack() accepts. The plain workload is LPUSH /
BRPOP on one list; a subclass changes the command path by overriding push(),
is_ack(), pop(), after_pop(), drained() and remaining().

After the fault, finish() stops the producers, lets the consumers drain, and
returns a Result: every acknowledged id must be delivered or still queued on
the current master, duplicates only where a retry explains them, and no
client may have seen an error (AccountingChecks.check_accounting).
"""
import re
import threading
import time

from harness import wait_until

# The ferry config of the failover tests (merged over by a scenario's own;
# never changed in place). replicas_ack 1: without a replica acknowledging
# each write, a write acknowledged by a master that dies (kill -9) or is
# demoted (SIGSTOP) can be lost by Redis' asynchronous replication whatever
# ferry does. hold_timeout_ms 30 s, Sentinel's own worst case here: a
# failover whose election split the votes is tried again only after 2 x
# failover_timeout (10 s), and requests held past 10 s were answered
# TRYAGAIN (seen once in a CI run: "no master for 10035 ms"). A scenario
# about the hold bound sets its own.
FAILOVER_CONF = {
    'upstream': {'hold_timeout_ms': 30000},
    'durability': {
        'require_aof': True,
        'replicas_ack': 1,
        'replicas_ack_timeout_ms': 1000,
        'enforce_interval_ms': 500,
    },
}


def each_run(tc, runs, fn):
    """fn(k, cleanups) for k in range(runs), each a subTest of tc with fresh
    processes: what fn appended to cleanups runs in reverse order however the
    run ended. Returns what the runs that finished returned."""
    results = []
    for k in range(runs):
        cleanups = []
        with tc.subTest(run=k + 1):
            try:
                results.append(fn(k, cleanups))
            finally:
                for c in reversed(cleanups):
                    try:
                        c()
                    except Exception:  # noqa: BLE001
                        pass
    return results


def now():
    return time.monotonic()


def merged(base, over):
    """base with over merged in, one level of dicts deep (copies, no aliasing)."""
    out = {}
    for k, v in base.items():
        out[k] = dict(v) if isinstance(v, dict) else v
    for k, v in (over or {}).items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k].update(v)
        else:
            out[k] = v
    return out


def current_master(topo):
    """The RedisServer that is master now: as the sentinels announce it (and
    ROLE confirms), or, with no sentinel left, the only running node whose
    ROLE says master."""
    try:
        node = topo.master()
        if node is not None and node.running() and node.role() == 'master':
            return node
    except Exception:  # noqa: BLE001 - sentinels may all be down
        pass
    masters = []
    for r in topo.redis:
        if r.running():
            try:
                if r.role() == 'master':
                    masters.append(r)
            except Exception:  # noqa: BLE001
                pass
    if len(masters) != 1:
        raise AssertionError('cannot tell the current master: ROLE master on %r' % masters)
    return masters[0]


def sentinel_config_epoch(topo):
    """The highest config epoch any sentinel reports for the master: 0 before
    any failover, 1 after the first."""
    best = 0
    for sn in topo.sentinels:
        try:
            info = sn.client(socket_timeout=2).sentinel_master(topo.master_name)
            best = max(best, int(info.get('config-epoch', 0)))
        except Exception:  # noqa: BLE001 - a dead sentinel says nothing
            pass
    return best


def is_int(r):
    return isinstance(r, int) and not isinstance(r, bool)


# --------------------------------------------------------------------------
# the workload


class Load:
    """Producers and consumers through ferry; see the module docstring.

    key: the list of the plain workload; client_kw: extra redis-py client
    arguments (e.g. db=3); client_timeout bounds every call, join_timeout
    (> client_timeout) every thread join, drain_timeout the final drain."""

    def __init__(self, ferry, tag, reconnect_every=None, key='q', producers=4, consumers=4,
                 push_interval=0.002, client_timeout=30, drain_timeout=30.0,
                 join_timeout=45.0, client_kw=None):
        self.ferry = ferry
        self.tag = tag
        self.reconnect_every = reconnect_every
        self.key = key
        self.producers = producers
        self.consumers = consumers
        self.push_interval = push_interval
        self.client_timeout = client_timeout
        self.drain_timeout = drain_timeout
        self.join_timeout = join_timeout
        self.client_kw = dict(client_kw or {})
        self.lock = threading.Lock()
        self.attempted = set()
        self.acked = {}        # id -> monotonic time of the acknowledgement
        self.unknown = set()   # sent, but no acknowledging reply (error)
        self.delivered = []    # (id, monotonic time, consumer index)
        self.errors = []       # (monotonic time, thread, repr(exception))
        self.stop_producers = threading.Event()
        self.stop_consumers = threading.Event()
        self.threads_p = []
        self.threads_c = []
        self.t_start = None
        self.t_stop = None

    # ---- the command path (override in a subclass)

    def push(self, c, item):
        """Write item; returns the reply (raises on a client error)."""
        return c.lpush(self.key, item)

    def is_ack(self, reply):
        """True if reply acknowledges the write."""
        return is_int(reply)

    def pop(self, c, i):
        """Take items out (consumer i); returns the ids received."""
        r = c.brpop(self.key, timeout=1)
        return [r[1]] if r else []

    def after_pop(self, c, i):
        """Runs after the ids pop() returned are recorded (e.g. XACK)."""

    def drained(self, master):
        """True once nothing is left to deliver on master (a RedisServer)."""
        return self.master_client(master).llen(self.key) == 0

    def remaining(self, master):
        """The ids still queued on master, after the consumers stopped."""
        return self.master_client(master, socket_timeout=5).lrange(self.key, 0, -1)

    def master_client(self, master, socket_timeout=2):
        kw = {k: v for k, v in self.client_kw.items() if k == 'db'}
        return master.client(socket_timeout=socket_timeout, **kw)

    # ---- the threads

    def _error(self, who, e):
        with self.lock:
            self.errors.append((now(), who, repr(e)))

    def client(self):
        return self.ferry.client(socket_timeout=self.client_timeout, socket_connect_timeout=5,
                                 **self.client_kw)

    def _producer(self, i):
        who = 'producer-%d' % i
        c = None
        n = 0
        while not self.stop_producers.is_set():
            try:
                if c is None:
                    c = self.client()
                item = '%s-p%d-%d' % (self.tag, i, n)
                n += 1
                with self.lock:
                    self.attempted.add(item)
                try:
                    r = self.push(c, item)
                except Exception as e:  # noqa: BLE001 - recorded, fails the test
                    with self.lock:
                        self.unknown.add(item)
                    self._error(who, e)
                    c.close()
                    c = None
                    time.sleep(0.05)
                    continue
                t = now()
                if self.is_ack(r):
                    with self.lock:
                        self.acked[item] = t
                else:
                    with self.lock:
                        self.unknown.add(item)
                    self._error(who, AssertionError('the write answered %r' % (r,)))
                if self.reconnect_every and n % self.reconnect_every == 0:
                    c.close()
                    c = None
                time.sleep(self.push_interval)
            except Exception as e:  # noqa: BLE001 - e.g. connect failed
                self._error(who, e)
                c = None
                time.sleep(0.05)
        if c is not None:
            c.close()

    def _consumer(self, i):
        who = 'consumer-%d' % i
        c = None
        while not self.stop_consumers.is_set():
            try:
                if c is None:
                    c = self.client()
                items = self.pop(c, i)
                if items:
                    t = now()
                    with self.lock:
                        self.delivered.extend((item, t, i) for item in items)
                self.after_pop(c, i)
            except Exception as e:  # noqa: BLE001 - recorded, fails the test
                self._error(who, e)
                if c is not None:
                    c.close()
                c = None
                time.sleep(0.05)
        if c is not None:
            c.close()

    def start(self):
        self.t_start = now()
        for i in range(self.consumers):
            t = threading.Thread(target=self._consumer, args=(i,), name='consumer-%d' % i,
                                 daemon=True)
            t.start()
            self.threads_c.append(t)
        for i in range(self.producers):
            t = threading.Thread(target=self._producer, args=(i,), name='producer-%d' % i,
                                 daemon=True)
            t.start()
            self.threads_p.append(t)
        return self

    def stop(self):
        """Ask every thread to stop (no join): for cleanups."""
        self.stop_producers.set()
        self.stop_consumers.set()

    def acks_between(self, t0, t1):
        with self.lock:
            return sum(1 for t in self.acked.values() if t0 <= t < t1)

    def acks_per_producer(self):
        per = [0] * self.producers
        with self.lock:
            for item in self.acked:
                m = re.search(r'-p(\d+)-\d+$', item)
                if m and int(m.group(1)) < self.producers:
                    per[int(m.group(1))] += 1
        return per

    def wait_service(self, since, timeout=30.0):
        """Until a push is acknowledged after `since` (monotonic); returns the
        time of that acknowledgement, or None after timeout."""
        def first():
            with self.lock:
                late = [t for t in self.acked.values() if t > since]
            return min(late) if late else None
        try:
            return wait_until(first, timeout=timeout, interval=0.05, msg='an ack')
        except AssertionError:
            return None

    def finish(self, master_fn):
        """Stop producers, let consumers drain what is queued on the master
        that master_fn() returns (a RedisServer), stop consumers; returns the
        Result."""
        self.stop_producers.set()
        self.t_stop = now()
        stuck = []
        for t in self.threads_p:
            t.join(self.join_timeout)
            if t.is_alive():
                stuck.append(t.name)
        drain_error = None
        try:
            wait_until(lambda: self.drained(master_fn()), timeout=self.drain_timeout,
                       interval=0.1, msg='consumers to drain what %s queued' % self.tag)
        except AssertionError as e:
            drain_error = str(e)
        self.stop_consumers.set()
        for t in self.threads_c:
            t.join(self.join_timeout)
            if t.is_alive():
                stuck.append(t.name)
        master = master_fn()
        return Result(self, self.remaining(master), master, stuck, drain_error)


class Result:
    def __init__(self, load, remaining, master, stuck, drain_error):
        with load.lock:
            self.acked = dict(load.acked)
            self.unknown = set(load.unknown)
            self.attempted = set(load.attempted)
            self.delivered = list(load.delivered)
            self.errors = list(load.errors)
        self.load = load
        self.remaining = list(remaining)
        self.master_port = master.port
        self.stuck = stuck
        self.drain_error = drain_error
        self.t_fault = None
        self.t_recovered = None
        self.t_service = None
        count = {}
        self.deliveries = {}
        for item, t, ci in self.delivered:
            count[item] = count.get(item, 0) + 1
            self.deliveries.setdefault(item, []).append((ci, t))
        for item in self.remaining:
            count[item] = count.get(item, 0) + 1
        self.count = count
        self.lost = sorted((i for i in self.acked if i not in count), key=self.acked.get)
        self.duplicates = {i: n for i, n in count.items() if n > 1}
        self.phantom = sorted(i for i in count if i not in self.attempted)
        times = sorted(self.acked.values())
        self.gap_ms = 0.0
        self.gap_at = None
        for a, b in zip(times, times[1:]):
            if (b - a) * 1000 > self.gap_ms:
                self.gap_ms = (b - a) * 1000
                self.gap_at = a

    def rel(self, t):
        base = self.t_fault if self.t_fault is not None else self.load.t_start
        return '%+.3fs' % (t - base)

    def summary(self, name):
        extra = ''
        if self.t_fault is not None and self.t_recovered is not None:
            extra = ' sentinel_failover=%.2fs' % (self.t_recovered - self.t_fault)
        if self.t_fault is not None and self.t_service is not None:
            extra += ' first_ack_after_failover=%s' % self.rel(self.t_service)
        if self.gap_at is not None:
            extra += ' gap_starts_at=%s' % self.rel(self.gap_at)
        return ('[%s] acked=%d delivered=%d remaining=%d unknown=%d longest_gap_ms=%.0f '
                'errors=%d lost=%d duplicates=%d phantom=%d%s' % (
                    name, len(self.acked), len(self.delivered), len(self.remaining),
                    len(self.unknown), self.gap_ms, len(self.errors), len(self.lost),
                    sum(n - 1 for n in self.duplicates.values()), len(self.phantom), extra))

    def error_text(self, limit=30):
        lines = ['%s %s: %s' % (self.rel(t), who, e) for t, who, e in self.errors[:limit]]
        if len(self.errors) > limit:
            lines.append('... %d more' % (len(self.errors) - limit))
        return '\n'.join(lines)

    def lost_text(self, limit=20):
        return '\n'.join('%s acked at %s' % (i, self.rel(self.acked[i]))
                         for i in self.lost[:limit])

    def dup_text(self, limit=20):
        lines = []
        for item, n in list(self.duplicates.items())[:limit]:
            dl = ', '.join('consumer-%d at %s' % (ci, self.rel(t))
                           for ci, t in self.deliveries.get(item, []))
            state = ('acked at %s' % self.rel(self.acked[item]) if item in self.acked
                     else 'NOT acked (write errored)' if item in self.unknown else 'never acked')
            lines.append('%s seen %d times: delivered [%s], %d still queued; %s' % (
                item, n, dl, self.remaining.count(item), state))
        return '\n'.join(lines)


# --------------------------------------------------------------------------
# the checks (a mixin for unittest.TestCase)


class AccountingChecks:
    """Assertions over a Result, as subTests of the calling test."""

    def diag(self, topo, ferry, res=None):
        views = {}
        try:
            views = topo.sentinel_views()
        except Exception:  # noqa: BLE001
            pass
        text = '\nsentinel views: %r; redis ports %r' % (views, [r.port for r in topo.redis])
        if res is not None:
            text += '\n' + res.summary('diag')
        for r in topo.redis:
            try:
                info = r.client(socket_timeout=1).info('replication')
                text += '\nredis %d: role %s, connected_slaves %s, min_slaves_good_slaves %s, ' \
                        'master_link_status %s' % (r.port, info.get('role'),
                                                   info.get('connected_slaves'),
                                                   info.get('min_slaves_good_slaves'),
                                                   info.get('master_link_status'))
            except Exception as e:  # noqa: BLE001 - a dead node says why
                text += '\nredis %d: %r' % (r.port, e)
        log = ferry.log().splitlines()
        # A blocking pop's link released every second fills the tail: left out.
        lines = [ln for ln in log if ' DEBUG ' not in ln
                 and not re.search(r'client \d+ .*closed: client closed', ln)
                 and 'released with connection state' not in ln]
        text += '\n--- ferry log (%s), last non-debug lines ---\n%s' % (
            ferry.log_path, '\n'.join(lines[-60:]))
        debug = [ln for ln in log if ' DEBUG ' in ln and ('refused' in ln or 'WAIT' in ln)]
        text += '\n--- its last refusals and WAITs ---\n%s' % '\n'.join(debug[-25:])
        out = ferry.output()
        if out.strip():
            text += '\n--- ferry stdout/stderr ---\n' + out[-2000:]
        return text

    def check_accounting(self, res, topo, ferry, min_acked=100):
        """The exact-accounting assertions shared by every load scenario."""
        if res.errors:
            print('client errors:\n' + res.error_text(), flush=True)
        with self.subTest(check='no client-visible error'):
            self.assertEqual(res.errors, [], 'client errors:\n%s%s' % (
                res.error_text(), self.diag(topo, ferry, res)))
        with self.subTest(check='threads finished'):
            self.assertEqual(res.stuck, [], 'threads still inside a call after %ss'
                             % res.load.join_timeout)
            self.assertIsNone(res.drain_error)
        with self.subTest(check='no acknowledged push lost'):
            self.assertEqual(res.lost, [], '%d acked id(s) neither delivered nor queued on '
                             'master %d:\n%s%s' % (len(res.lost), res.master_port, res.lost_text(),
                                                   self.diag(topo, ferry, res)))
        with self.subTest(check='no duplicate but unknown-outcome retries'):
            # ferry re-sends a write whose reply the failover swallowed (it
            # cannot know whether the old master applied it): at-least-once.
            # Such a duplicate is explained only if the push was in flight at
            # the fault, i.e. acknowledged after it, and delivered twice; a
            # synchronous producer has at most one push in flight, so there
            # are at most one per producer. Anything else is a bug.
            ndup = sum(n - 1 for n in res.duplicates.values())
            if ndup:
                print('duplicates:\n' + res.dup_text(), flush=True)
            t_fault = res.t_fault if res.t_fault is not None else float('inf')
            unexplained = [i for i, n in res.duplicates.items()
                           if n != 2 or i not in res.acked or res.acked[i] < t_fault]
            self.assertEqual(unexplained, [], 'duplicates not explained by a retry:\n%s%s' % (
                res.dup_text(), self.diag(topo, ferry, res)))
            self.assertLessEqual(ndup, res.load.producers, 'duplicates (at most one per '
                                 'producer):\n%s%s' % (res.dup_text(),
                                                       self.diag(topo, ferry, res)))
        with self.subTest(check='nothing delivered that was never pushed'):
            self.assertEqual(res.phantom, [])
        self.assertGreater(len(res.acked), min_acked, 'the workload barely ran'
                           + self.diag(topo, ferry, res))

    def check_consumers_after(self, res, t_recovered, topo, ferry):
        """Consumers (the same threads, blocked across the failover) received
        items pushed after the recovery, before the producers stopped."""
        with self.subTest(check='consumers keep receiving after the failover'):
            self.assertIsNotNone(res.t_service, 'no push acknowledged within 30 s of the '
                                 'sentinels\' failover' + self.diag(topo, ferry, res))
            t_recovered = max(t_recovered, res.t_service)
            late = {i for i, t in res.acked.items() if t >= t_recovered}
            per = [0] * res.load.consumers
            for item, t, ci in res.delivered:
                if item in late and t < res.load.t_stop:
                    per[ci] += 1
            self.assertTrue(late, 'no push was acknowledged after the failover'
                            + self.diag(topo, ferry, res))
            self.assertTrue(all(n > 0 for n in per),
                            'items delivered after the failover, per consumer: %r' % per
                            + self.diag(topo, ferry, res))
