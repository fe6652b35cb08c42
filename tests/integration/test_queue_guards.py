"""Queue guards: bounded queues (queues: max_length, on_full), in Sentinel mode
and with a fixed master (FERRY_TEST_WORKERS=4 runs them on four loops):

- on_full: refuse: 8 producers against a bound of 10 000 with no consumer:
  the list never holds more than the bound, every refused push got
  -QFULL ferry: queue <key> holds <n> items (max_length <m>) and is not in
  the list, every acknowledged one is; a push of several values that would
  pass the bound applies none of them; keys no entry bounds are unchanged;
  Redis' own errors (WRONGTYPE) come through;
- the guard's script is found again after SCRIPT FLUSH (NOSCRIPT: sent as
  EVAL);
- on_full: block: pushes wait for room and complete in order as a consumer
  frees it, pipelined ones too; with no room before upstream.hold_timeout_ms
  the push gets -TRYAGAIN naming QFULL and is not applied;
- refusals and holds are counted per queue on the stats port;
- a kill -9 of the master (Sentinel mode) under 4 producers: the bound
  holds on the new master, nothing acknowledged is lost;
- while no master is up, pushes go to the fallback store as written (the
  bound is not checked there); replayed, the list may pass its bound and
  later pushes are refused until consumers bring it under.

Run: python3 -m unittest test_queue_guards -v
"""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import urllib.request

import redis

import harness
from harness import FERRY_BIN, Ferry, RedisServer, SentinelTopology, wait_until
from modes import FixedMasterMode, SentinelMode, key_prefix, sentinel_first

BOUND = 10000
HERE = os.path.dirname(os.path.abspath(__file__))


WORKER = '''
import sys, time, redis
port, q, proc, n = int(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4])
c = redis.Redis(port=port, decode_responses=True, socket_timeout=10)
for _ in range(n):
    assert c.brpoplpush(q, proc, 5) is not None
print('ready %d' % n, flush=True)
time.sleep(120)
'''


def queues_yaml(entries):
    lines = ['queues:']
    for e in entries:
        lines.append('  - keys: %s' % json.dumps(e['keys']))
        for k in ('max_length', 'on_full', 'processing', 'lease_ms', 'max_attempts',
                  'dead_letter', 'consumer_backoff', 'lease_expire_on_disconnect'):
            if k in e:
                lines.append('    %s: %s' % (k, e[k]))
    return '\n'.join(lines) + '\n'


def tag(q):
    """The hash tag ferry's companions of queue q carry: q's own {tag}, else q."""
    i = q.find('{')
    j = q.find('}', i + 1) if i >= 0 else -1
    return q[i + 1:j] if j > i + 1 else q


def lkey(kind, proc, q=None):
    """ferry:<kind>:{T}:<proc>, the companion of processing list proc (of
    queue q, by default proc less its ':processing')."""
    if q is None:
        q = proc[:-len(':processing')]
    return 'ferry:%s:{%s}:%s' % (kind, tag(q), proc)


def crc16(data):
    """CRC16-CCITT (XMODEM), as Redis Cluster hashes keys."""
    crc = 0
    for b in data:
        crc ^= b << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) if crc & 0x8000 else crc << 1
            crc &= 0xffff
    return crc


def keyslot(key):
    """CLUSTER KEYSLOT key."""
    b = key.encode() if isinstance(key, str) else key
    i = b.find(b'{')
    if i >= 0:
        j = b.find(b'}', i + 1)
        if j > i + 1:
            b = b[i + 1:j]
    return crc16(b) % 16384


def stats(port):
    with urllib.request.urlopen('http://127.0.0.1:%d/stats' % port, timeout=5) as r:
        return json.loads(r.read().decode())


class Checks:
    # ---- leases

    def lease_entry(self, p, **kw):
        e = {'keys': p + ':*', 'processing': '"{key}:processing"', 'lease_ms': 1000,
             'max_attempts': 5}
        e.update(kw)
        return e

    def attempts(self, proc, item):
        return self.master().client().hget(lkey('attempts', proc), item)

    def test_lease_worker_killed(self):
        """lease_expire_on_disconnect: false: a killed worker's leases expire
        at their deadline, not before."""
        p = key_prefix(self)
        q, proc = p + ':q', p + ':q:processing'
        f = self.start([self.lease_entry(p, lease_expire_on_disconnect='false')])
        c = f.client()
        items = ['t%02d' % i for i in range(50)]
        c.lpush(q, *items)
        worker = subprocess.Popen(
            [sys.executable, '-c', WORKER, str(f.port), q, proc, '50'],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.addCleanup(lambda: worker.poll() is None and worker.kill())
        self.addCleanup(worker.stdout.close)
        self.addCleanup(worker.stderr.close)
        line = worker.stdout.readline().strip()
        self.assertEqual(line, 'ready 50', worker.stderr.read() if not line else line)
        t_ready = time.monotonic()
        m = self.master().client()
        self.assertEqual(m.llen(proc), 50)
        self.assertEqual(m.zcard(lkey('leases', proc)), 50)
        os.kill(worker.pid, signal.SIGKILL)
        worker.wait(10)
        wait_until(lambda: m.llen(q) == 50 and m.llen(proc) == 0, timeout=15,
                   msg='the 50 leased items back in the queue')
        self.assertGreaterEqual(time.monotonic() - t_ready, 0.9)
        self.assertEqual(sorted(m.lrange(q, 0, -1)), sorted(items))
        for it in items:
            self.assertEqual(self.attempts(proc, it), '2:R')
        self.assertEqual(m.zcard(lkey('leases', proc)), 0)
        st = stats(f.stats_port)['queues']['queues'][0]
        self.assertEqual(st['lease_expired'], 50, st)
        self.assertEqual(st['dead_lettered'], 0, st)

    def take_and_close(self, f, q, proc, n, ack=()):
        """A client takes n items with BRPOPLPUSH, acks those in ack (by
        position), closes its socket; returns (taken, the time it closed)."""
        c = f.client(socket_timeout=10)
        taken = [c.brpoplpush(q, proc, 2) for _ in range(n)]
        for i in ack:
            self.assertEqual(c.lrem(proc, 1, taken[i]), 1)
        m = self.master().client()
        wait_until(lambda: m.zcard(lkey('leases', proc)) == n - len(ack), timeout=5,
                   msg='every unacked item leased')
        c.connection_pool.disconnect()  # the socket closes
        return taken, time.monotonic()

    def test_lease_expired_on_disconnect(self):
        """A client that takes 20 items and closes its socket without acking:
        all 20 back in the queue at once (attempt 2), long before lease_ms."""
        p = key_prefix(self)
        q, proc = p + ':q', p + ':q:processing'
        f = self.start([self.lease_entry(p, lease_ms=30000)])
        m = self.master().client()
        items = ['d%02d' % i for i in range(20)]
        m.rpush(q, *items)
        taken, t_closed = self.take_and_close(f, q, proc, 20)
        self.assertEqual(sorted(taken), sorted(items))
        wait_until(lambda: m.llen(q) == 20 and m.llen(proc) == 0, timeout=15,
                   msg='the 20 items back in the queue')
        self.assertLess(time.monotonic() - t_closed, 15)  # long before lease_ms (30 s)
        self.assertEqual(sorted(m.lrange(q, 0, -1)), sorted(items))
        for it in items:
            self.assertEqual(self.attempts(proc, it), '2:R')
        self.assertEqual(m.zcard(lkey('leases', proc)), 0)
        self.assertEqual(m.hlen(lkey('consumer', proc)), 0)
        wait_until(lambda: stats(f.stats_port)['queues']['queues'][0]['lease_expired'] == 20,
                   timeout=5, msg='20 counted as expired')
        # Once: a deadline round later on finds nothing of them.
        time.sleep(0.3)
        self.assertEqual(m.llen(q), 20)

    def test_lease_disconnect_some_acked(self):
        """A client that acked 4 of 10 before closing: only the 6 unacked
        come back, each once."""
        p = key_prefix(self)
        q, proc = p + ':q', p + ':q:processing'
        f = self.start([self.lease_entry(p, lease_ms=30000)])
        m = self.master().client()
        items = ['s%02d' % i for i in range(10)]
        m.rpush(q, *items)
        taken, _ = self.take_and_close(f, q, proc, 10, ack=(0, 3, 5, 9))
        acked = {taken[i] for i in (0, 3, 5, 9)}
        wait_until(lambda: m.llen(q) == 6 and m.llen(proc) == 0, timeout=5,
                   msg='the 6 unacked items back in the queue')
        self.assertEqual(sorted(m.lrange(q, 0, -1)), sorted(set(items) - acked))
        for it in acked:
            self.assertIsNone(self.attempts(proc, it))

    def test_lease_disconnect_option_off(self):
        """lease_expire_on_disconnect: false: the items of a client that
        closed come back at lease_ms only."""
        p = key_prefix(self)
        q, proc = p + ':q', p + ':q:processing'
        f = self.start([self.lease_entry(p, lease_ms=2500, lease_expire_on_disconnect='false')])
        m = self.master().client()
        items = ['o%02d' % i for i in range(20)]
        m.rpush(q, *items)
        _, t_closed = self.take_and_close(f, q, proc, 20)
        time.sleep(1.0)  # what the option on would have brought back by now
        self.assertEqual(m.llen(proc), 20)
        self.assertEqual(m.llen(q), 0)
        wait_until(lambda: m.llen(q) == 20 and m.llen(proc) == 0, timeout=10,
                   msg='the 20 items back at their deadline')
        self.assertGreaterEqual(time.monotonic() - t_closed, 1.5)

    def test_lease_keys_one_slot(self):
        """Every key a lease script (take, ack, expiry at the deadline and at
        a disconnect) is given for queue {<p>}:1 hashes to the queue's slot,
        as Redis' MONITOR shows the calls ferry sends."""
        p = key_prefix(self)
        q = '{%s}:1' % p
        proc = q + ':processing'
        f = self.start([{'keys': '{%s}:*' % p, 'processing': '"{key}:processing"',
                         'lease_ms': 300}])
        port = self.master().port
        mon_path = os.path.join(f.dir, 'monitor.out')
        with open(mon_path, 'w') as out:
            mon = subprocess.Popen(['redis-cli', '-p', str(port), 'monitor'], stdout=out,
                                   stderr=subprocess.STDOUT)
        self.addCleanup(lambda: mon.poll() is None and mon.kill())
        wait_until(lambda: os.path.getsize(mon_path) > 0, timeout=5, msg='MONITOR started')
        m = self.master().client()
        m.rpush(q, 'a', 'b', 'c')
        c1 = f.client(socket_timeout=10)
        self.assertEqual(c1.brpoplpush(q, proc, 2), 'c')
        self.assertEqual(c1.rpoplpush(q, proc), 'b')
        self.assertEqual(c1.lrem(proc, 1, 'c'), 1)  # the ack
        wait_until(lambda: any(m.type(k) == 'zset' and m.zscore(k, 'b') is not None
                               for k in m.keys('ferry:leases:*')), timeout=5, msg='b leased')
        c1.connection_pool.disconnect()  # b expired at the disconnect
        wait_until(lambda: m.lrange(q, 0, -1) == ['a', 'b'], timeout=5, msg='b back')
        c2 = f.client(socket_timeout=10)
        self.assertEqual(c2.lmove(q, proc, 'LEFT', 'RIGHT'), 'a')
        wait_until(lambda: m.lrange(q, 0, -1) == ['a', 'b'], timeout=5,
                   msg='a back at its deadline')
        mon.terminate()
        mon.wait(5)
        with open(mon_path) as fh:
            lines = fh.read().splitlines()
        calls = []
        for ln in lines:
            args = [a.encode().decode('unicode_escape') for a in
                    re.findall(r'"((?:[^"\\]|\\.)*)"', ln)]
            if args and args[0].upper() in ('EVAL', 'EVALSHA') and proc in args:
                n = int(args[2])
                calls.append(args[3:3 + n])
        slot = keyslot(q)
        self.assertEqual(keyslot(proc), slot)
        self.assertTrue(calls)
        for keys in calls:
            self.assertEqual([keyslot(k) for k in keys], [slot] * len(keys), keys)
        self.assertEqual({len(k) for k in calls}, {4, 5, 8}, calls)  # take, ack, expiry
        # No script touches a key of another slot: the registry and the
        # paused consumers are plain commands.
        self.assertEqual(keyslot(lkey('leases', proc, q)), slot)

    def test_lease_dead_letter_once(self):
        p = key_prefix(self)
        q, proc, dead = p + ':q', p + ':q:processing', p + ':q:dead'
        f = self.start([self.lease_entry(p, lease_ms=300, max_attempts=3)])
        c = f.client(socket_timeout=10)
        c.lpush(q, 'bad')
        deliveries = 0
        m = self.master().client()
        for _ in range(10):  # bounded: more than max_attempts deliveries is a failure
            v = c.brpoplpush(q, proc, 2)
            if v is None:
                break
            self.assertEqual(v, 'bad')
            deliveries += 1
            self.assertEqual(self.attempts(proc, 'bad'), '%d:R' % deliveries)
        self.assertEqual(deliveries, 3)
        wait_until(lambda: m.llen(dead) == 1, timeout=5, msg='dead-lettered')
        time.sleep(0.7)  # two more lease periods: nothing else may move
        self.assertEqual(m.lrange(dead, 0, -1), ['bad'])
        self.assertEqual(m.llen(q), 0)
        self.assertEqual(m.llen(proc), 0)
        self.assertIsNone(self.attempts(proc, 'bad'))
        st = stats(f.stats_port)['queues']['queues'][0]
        self.assertEqual(st['dead_lettered'], 1, st)
        self.assertEqual(st['lease_expired'], 3, st)

    def test_lease_ack(self):
        p = key_prefix(self)
        q, proc = p + ':q', p + ':q:processing'
        f = self.start([self.lease_entry(p, lease_ms=300)])
        c = f.client(socket_timeout=10)
        c.rpush(q, 'a', 'b', 'c', 'd')
        got = [c.rpoplpush(q, proc), c.lmove(q, proc, 'LEFT', 'LEFT'),
               c.blmove(q, proc, 2, 'RIGHT', 'LEFT'), c.brpoplpush(q, proc, 2)]
        self.assertEqual(sorted(got), ['a', 'b', 'c', 'd'])
        m = self.master().client()
        self.assertEqual(m.zcard(lkey('leases', proc)), 4)
        self.assertEqual(self.attempts(proc, 'a'), '1:L')
        for it in got:
            self.assertEqual(c.lrem(proc, 1, it), 1)
        self.assertEqual(c.lrem(proc, 1, 'a'), 0)
        self.assertEqual(m.zcard(lkey('leases', proc)), 0)
        self.assertEqual(m.hlen(lkey('attempts', proc)), 0)
        time.sleep(0.8)  # past the lease: nothing comes back
        self.assertEqual(m.llen(q), 0)
        with self.assertRaises(redis.ResponseError):
            c.lrem(proc, 'x', 'a')
        # A move into another list is no lease.
        c.rpush(q, 'e')
        self.assertEqual(c.rpoplpush(q, p + ':other'), 'e')
        self.assertEqual(m.zcard(lkey('leases', p + ':other', p + ':q')), 0)

    def test_consumer_backoff(self):
        """A consumer whose leases expire after_failures times in a row has
        its next pop held pause_ms (others are not); one ack resets it."""
        p = key_prefix(self)
        q, proc = p + ':q', p + ':q:processing'
        f = self.start([self.lease_entry(p, lease_ms=200, max_attempts=100,
                                         consumer_backoff='{after_failures: 3, pause_ms: 6000}')],
                       conf={'upstream': {'hold_timeout_ms': 10000}})
        m = self.master().client()
        w1, w2 = f.client(socket_timeout=30), f.client(socket_timeout=30)
        w1.client_setname('w1')
        w2.client_setname('w2')
        m.rpush(q, *['j%d' % i for i in range(10)])

        def fail_once(c):
            self.assertIsNotNone(c.brpoplpush(q, proc, 2))
            wait_until(lambda: m.llen(proc) == 0, timeout=5, msg='the lease expired')

        # Two failures, one ack: the count starts again.
        fail_once(w1)
        fail_once(w1)
        self.assertEqual(m.hget('ferry:consumers:{%s}:failures' % q, 'w1'), '2')
        it = w1.brpoplpush(q, proc, 2)
        self.assertEqual(w1.lrem(proc, 1, it), 1)
        self.assertIsNone(m.hget('ferry:consumers:{%s}:failures' % q, 'w1'))
        fail_once(w1)
        fail_once(w1)
        self.assertIsNone(m.zscore('ferry:consumers:paused', 'w1'))
        # Not paused: at once. Bounds on a hang (a paused pop would wait
        # about pause_ms, 6 s), not speeds.
        t0 = time.monotonic()
        it = w1.brpoplpush(q, proc, 10)
        self.assertLess(time.monotonic() - t0, 2.5)  # not paused
        # The third failure in a row pauses w1.
        wait_until(lambda: m.llen(proc) == 0, timeout=5, msg='the lease expired')
        wait_until(lambda: m.zscore('ferry:consumers:paused', 'w1') is not None, timeout=5,
                   msg='w1 paused')
        wait_until(lambda: stats(f.stats_port)['queues']['consumers_paused'] == 1, timeout=5,
                   msg='ferry knows w1 is paused')
        sec, usec = m.time()
        left = m.zscore('ferry:consumers:paused', 'w1') - (sec * 1000 + usec // 1000)
        t0 = time.monotonic()
        self.assertIsNotNone(w2.brpoplpush(q, proc, 10))
        self.assertLess(time.monotonic() - t0, 2.5)  # w2 is not paused
        t0 = time.monotonic()
        it = w1.brpoplpush(q, proc, 15)
        took = (time.monotonic() - t0) * 1000
        self.assertIsNotNone(it)
        # Held until the pause ends (each loop learns of it within 200 ms + a tick).
        self.assertGreaterEqual(took, left - 500, (took, left))
        self.assertLess(took, left + 5000, (took, left))
        self.assertIn("consumer 'w1' paused for 6000 ms after 3 expired leases", f.log())

    def test_queues_report(self):
        """ferry --queues -c FILE prints what Redis holds for the entries."""
        p = key_prefix(self)
        q = p + ':q'
        f = self.start([self.lease_entry(p, max_length=100, lease_ms=60000)])
        c = f.client(socket_timeout=10)
        c.rpush(q, 'a', 'b', 'c')
        self.assertEqual(c.brpoplpush(q, q + ':processing', 2), 'c')
        run = subprocess.run([FERRY_BIN, '--queues', '-c', f.config_path], capture_output=True,
                             text=True, timeout=30)
        self.assertEqual(run.returncode, 0, run.stderr)
        lines = run.stdout.splitlines()
        self.assertTrue(lines[0].startswith('queues[0] keys=%s:* max_length=100 on_full=refuse '
                                            'processing={key}:processing lease_ms=60000 '
                                            'max_attempts=5 dead_letter={key}:dead' % p),
                        run.stdout)
        self.assertIn('  %s length=2 processing=1 leases_open=1 dead=0' % q, lines)
        self.assertIn('  %s length=1' % (q + ':processing'), ' '.join(lines))
        self.assertEqual(lines[-1], 'consumers paused:')

    def test_reliable_queue_ioredis(self):
        """The pattern with ioredis (node/clients.js reliable), unchanged."""
        node = shutil.which('node')
        self.assertIsNotNone(node, 'node is not installed: run scripts/setup')
        p = key_prefix(self)
        q, proc = p + ':q', p + ':q:processing'
        f = self.start([self.lease_entry(p, max_length=5, lease_ms=500)])
        run = subprocess.run([node, os.path.join(HERE, 'node', 'clients.js'), str(f.port),
                              'reliable', p], capture_output=True, text=True, timeout=60,
                             cwd=HERE)
        out = json.loads(run.stdout.strip().splitlines()[-1])
        self.assertEqual(run.returncode, 0, (out, run.stderr[-2000:]))
        self.assertEqual(out['pushed'], 5)
        self.assertEqual(out['full'], self.qfull(q, 5, 5))
        self.assertEqual(out['taken'], ['a', 'b', 'c'])
        self.assertEqual(out['acked'], [1, 1])
        m = self.master().client()
        wait_until(lambda: m.llen(proc) == 0 and m.llen(q) == 3, timeout=10,
                   msg='the unacked item back in the queue')
        self.assertEqual(m.lrange(q, 0, -1), ['e', 'd', 'c'])
        self.assertEqual(self.attempts(proc, 'c'), '2:R')
        self.assertIsNone(self.attempts(proc, 'a'))

    def start(self, entries, conf=None):
        """A ferry of this mode with these queues: entries (replacing the
        one setUp started)."""
        self.ferry.stop()
        if isinstance(self, SentinelMode):
            self.ferry = Ferry(None, sentinel=self.topo, conf=conf, extra_yaml=queues_yaml(entries))
        else:
            self.ferry = Ferry(self.redis, conf=conf, extra_yaml=queues_yaml(entries))
        self.addCleanup(self.ferry.stop)
        return self.ferry

    def qfull(self, key, n, m):
        return 'QFULL ferry: queue %s holds %d items (max_length %d)' % (key, n, m)

    def test_refuse_eight_producers(self):
        p = key_prefix(self)
        key = p + ':jobs'
        f = self.start([{'keys': p + ':*', 'max_length': BOUND}])
        acked, refused, other = [], [], []
        lock = threading.Lock()
        over = []

        def producer(n):
            c = f.client(socket_timeout=30)
            i = 0
            refusals = 0
            while refusals < 25 and i < BOUND:  # bounded: at most BOUND pushes each
                item = 'p%d-%d' % (n, i)
                i += 1
                try:
                    length = c.rpush(key, item)
                    with lock:
                        acked.append(item)
                        if length > BOUND:
                            over.append(length)
                except redis.ResponseError as e:
                    with lock:
                        if str(e).startswith('QFULL ferry: queue %s holds ' % key):
                            refused.append((item, str(e)))
                        else:
                            other.append(str(e))
                    refusals += 1

        threads = [threading.Thread(target=producer, args=(n,)) for n in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        self.assertFalse(any(t.is_alive() for t in threads), 'producers hung')
        self.assertEqual(other, [], self.diag())
        self.assertEqual(over, [])
        m = self.master().client()
        items = m.lrange(key, 0, -1)
        self.assertEqual(len(items), BOUND)
        self.assertEqual(len(acked), BOUND)
        self.assertEqual(sorted(x for x in items), sorted(acked))
        self.assertEqual(len(refused), 8 * 25)
        inside = set(x for x in items)
        for item, text in refused:
            self.assertNotIn(item, inside)
            self.assertEqual(text, self.qfull(key, BOUND, BOUND))
        st = stats(f.stats_port)
        q = st['queues']['queues'][0]
        self.assertEqual(q['refused_full'], 8 * 25, q)

    def test_refuse_applies_nothing(self):
        p = key_prefix(self)
        key, free = p + ':q', p + 'x:free'
        f = self.start([{'keys': p + ':*', 'max_length': 5}])
        c = f.client()
        self.assertEqual(c.lpush(key, 'a', 'b', 'c', 'd'), 4)
        with self.assertRaises(redis.ResponseError) as cm:
            c.lpush(key, 'e', 'f')
        self.assertEqual(str(cm.exception), self.qfull(key, 4, 5))
        self.assertEqual(c.lrange(key, 0, -1), ['d', 'c', 'b', 'a'])
        self.assertEqual(c.rpushx(key, 'e'), 5)
        with self.assertRaises(redis.ResponseError) as cm:
            c.rpushx(key, 'f')
        self.assertEqual(str(cm.exception), self.qfull(key, 5, 5))
        with self.assertRaises(redis.ResponseError) as cm:
            c.rpush(key, 'x', 'y', 'z', 'w', 'v', 'u')
        self.assertEqual(c.lrange(key, 0, -1), ['d', 'c', 'b', 'a', 'e'])
        # LPUSHX on a missing key applies nothing and is not refused.
        self.assertEqual(c.lpushx(p + ':none', *['v%d' % i for i in range(9)]), 0)
        # A key no entry bounds is unchanged.
        self.assertEqual(c.rpush(free, *['v%d' % i for i in range(20)]), 20)
        # Redis' own errors come through.
        c.set(p + ':str', 'x')
        with self.assertRaises(redis.ResponseError) as cm:
            c.lpush(p + ':str', 'v')
        self.assertTrue(str(cm.exception).startswith('WRONGTYPE'), str(cm.exception))
        with self.assertRaises(redis.ResponseError) as cm:
            c.execute_command('LPUSH', key)
        self.assertIn('wrong number of arguments', str(cm.exception))
        # Many values in one push (past Lua's unpack limit), under the bound.
        big = p + ':big'
        self.start([{'keys': p + ':*', 'max_length': 20000}])
        c = self.ferry.client()
        self.assertEqual(c.rpush(big, *range(12000)), 12000)
        self.assertEqual(c.lrange(big, 0, 2), ['0', '1', '2'])
        self.assertEqual(c.lrange(big, -1, -1), ['11999'])

    def test_script_flushed(self):
        p = key_prefix(self)
        key = p + ':q'
        f = self.start([{'keys': p + ':*', 'max_length': 3}])
        c = f.client()
        self.assertEqual(c.rpush(key, 'a'), 1)
        self.master().client().script_flush()
        self.assertEqual(c.rpush(key, 'b'), 2)
        self.assertEqual(c.rpush(key, 'c'), 3)
        with self.assertRaises(redis.ResponseError) as cm:
            c.rpush(key, 'd')
        self.assertEqual(str(cm.exception), self.qfull(key, 3, 3))
        self.assertEqual(self.master().client().lrange(key, 0, -1), ['a', 'b', 'c'])

    def test_lease_scripts_flushed(self):
        """The lease scripts go as EVALSHA; after SCRIPT FLUSH a NOSCRIPT sends
        each again as EVAL: the take still leases, the ack still acks (the
        client sees 1, not NOSCRIPT), a disconnect still expires."""
        p = key_prefix(self)
        q, proc = p + ':q', p + ':q:processing'
        f = self.start([self.lease_entry(p, lease_ms=30000)])
        m = self.master().client()
        m.rpush(q, 'a', 'b', 'c')
        c = f.client(socket_timeout=10)
        self.assertEqual(c.rpoplpush(q, proc), 'c')
        wait_until(lambda: m.zcard(lkey('leases', proc)) == 1, timeout=5, msg='c leased')
        m.script_flush()
        self.assertEqual(c.lrem(proc, 1, 'c'), 1)
        self.assertEqual(m.zcard(lkey('leases', proc)), 0)
        m.script_flush()
        self.assertEqual(c.rpoplpush(q, proc), 'b')
        wait_until(lambda: m.zcard(lkey('leases', proc)) == 1, timeout=5, msg='b leased')
        m.script_flush()
        c.connection_pool.disconnect()  # the socket closes
        wait_until(lambda: m.lrange(q, 0, -1) == ['a', 'b'] and m.llen(proc) == 0, timeout=5,
                   msg='b back at the disconnect: ' + '\n'.join(
                       ln for ln in f.log().splitlines() if 'lease' in ln or 'client' in ln)[-3000:])
        self.assertEqual(self.attempts(proc, 'b'), '2:R')
        self.assertIn('leases: Redis lacked the ack script', f.log())
        self.assertIn('leases: Redis lacked a lease script', f.log())

    def test_block_in_order(self):
        p = key_prefix(self)
        key = p + ':q'
        f = self.start([{'keys': p + ':*', 'max_length': 3, 'on_full': 'block'}],
                       conf={'upstream': {'hold_timeout_ms': 20000}})
        c = f.client(socket_timeout=30)
        self.assertEqual(c.rpush(key, 'i0', 'i1', 'i2'), 3)
        done = []

        def producer():
            pc = f.client(socket_timeout=30)
            for i in range(6):
                pc.rpush(key, 's%d' % i)
                done.append('s%d' % i)
            pipe = f.client(socket_timeout=30).pipeline(transaction=False)
            for i in range(6):
                pipe.rpush(key, 'b%d' % i)
            pipe.execute()
            done.append('pipeline')

        t = threading.Thread(target=producer)
        t.start()
        # Nothing passes the bound while nobody consumes.
        time.sleep(0.3)  # let the held push retry a few times; then check
        self.assertEqual(self.master().client().llen(key), 3)
        self.assertEqual(done, [])
        popped = []
        deadline = time.monotonic() + 30
        while len(popped) < 15 and time.monotonic() < deadline:
            v = c.lpop(key)
            if v is None:
                time.sleep(0.02)
                continue
            popped.append(v)
            self.assertLessEqual(self.master().client().llen(key), 3)
        t.join(30)
        self.assertFalse(t.is_alive())
        want = ['i0', 'i1', 'i2'] + ['s%d' % i for i in range(6)] + ['b%d' % i for i in range(6)]
        self.assertEqual(popped, want, self.diag())
        q = stats(f.stats_port)['queues']['queues'][0]
        self.assertGreater(q['held_full'], 0, q)
        self.assertEqual(q['refused_full'], 0, q)

    def test_block_bound(self):
        p = key_prefix(self)
        key = p + ':q'
        f = self.start([{'keys': p + ':*', 'max_length': 2, 'on_full': 'block'}],
                       conf={'upstream': {'hold_timeout_ms': 600}})
        c = f.client(socket_timeout=30)
        self.assertEqual(c.rpush(key, 'a', 'b'), 2)
        t0 = time.monotonic()
        with self.assertRaises(redis.ResponseError) as cm:
            c.rpush(key, 'c')
        took = time.monotonic() - t0
        self.assertTrue(str(cm.exception).startswith('TRYAGAIN ferry: refused by Redis (QFULL)'),
                        str(cm.exception))
        self.assertGreaterEqual(took, 0.5)
        self.assertLess(took, 5)
        self.assertEqual(self.master().client().lrange(key, 0, -1), ['a', 'b'])
        self.assertEqual(c.lpop(key), 'a')
        self.assertEqual(c.rpush(key, 'c'), 2)


class QueueGuardsOutageTest(unittest.TestCase):
    """While no master is up (DOWN), pushes to a bounded queue go to the
    fallback store as written: the bound is Redis' and is not checked there
    (fallback.max_bytes bounds the store). Replayed, the list may pass its
    bound; later pushes are refused until consumers bring it under."""

    def test_outage_pushes_stored_then_refused(self):
        r = RedisServer()
        self.addCleanup(r.kill)
        path = os.path.join(r.dir, 'ferry-fallback.db')
        conf = {'upstream': {'hold_timeout_ms': 20000, 'connect_timeout_ms': 500},
                'fallback': {'after_ms': 300, 'path': path}}
        f = Ferry(r, conf=conf, extra_yaml=queues_yaml([{'keys': 'g:*', 'max_length': 3}]))
        self.addCleanup(f.kill)
        c = f.client(socket_timeout=10)
        self.assertEqual(c.rpush('g:q', 'a', 'b', 'c'), 3)
        with self.assertRaises(redis.ResponseError):
            c.rpush('g:q', 'd')
        r.kill()
        wait_until(lambda: stats(f.stats_port)['upstream']['upstream_state'] == 'DOWN',
                   timeout=10, msg='master view DOWN')
        self.assertEqual(c.rpush('g:q', 'o1'), 1)  # the length of the store's part
        self.assertEqual(c.rpush('g:q', 'o2'), 2)
        r.start()
        wait_until(lambda: stats(f.stats_port)['fallback']['fallback_pending'] == 0,
                   timeout=15, msg='replay to finish')
        self.assertEqual(r.client().lrange('g:q', 0, -1), ['a', 'b', 'c', 'o1', 'o2'])
        # With workers: N, c's own loop learns that the master is back at its
        # next tick (the stats port speaks for the main loop): until then a
        # push is still the store's, as documented.
        wait_until(lambda: 'run_id' in c.info(), timeout=5, msg="c's loop UP too")
        with self.assertRaises(redis.ResponseError) as cm:
            c.rpush('g:q', 'late')
        self.assertEqual(str(cm.exception),
                         'QFULL ferry: queue g:q holds 5 items (max_length 3)')
        self.assertEqual(c.lpop('g:q', 3), ['a', 'b', 'c'])
        self.assertEqual(c.rpush('g:q', 'late'), 3)


class TwoFerriesLeaseTest(unittest.TestCase):
    """Two ferry instances on one Redis, both expiring leases: each of 50
    leases a killed worker held is expired by exactly one of them (the
    item back once, the counters of both sum to 50)."""

    def test_each_lease_expired_once(self):
        r = RedisServer()
        self.addCleanup(r.kill)
        entry = queues_yaml([{'keys': 'two:*', 'processing': '"{key}:processing"',
                              'lease_ms': 500, 'lease_expire_on_disconnect': 'false'}])
        fa = Ferry(r, extra_yaml=entry)
        self.addCleanup(fa.stop)
        fb = Ferry(r, extra_yaml=entry)
        self.addCleanup(fb.stop)
        q, proc = 'two:q', 'two:q:processing'
        items = ['t%02d' % i for i in range(50)]
        m = r.client()
        m.lpush(q, *items)
        workers = []
        for f, n in ((fa, 25), (fb, 25)):
            w = subprocess.Popen([sys.executable, '-c', WORKER, str(f.port), q, proc, str(n)],
                                 stdout=subprocess.PIPE, text=True)
            self.addCleanup(lambda w=w: w.poll() is None and w.kill())
            self.assertEqual(w.stdout.readline().strip(), 'ready %d' % n)
            workers.append(w)
        for w in workers:
            os.kill(w.pid, signal.SIGKILL)
            w.wait(10)
            w.stdout.close()
        wait_until(lambda: m.llen(q) == 50 and m.llen(proc) == 0, timeout=15,
                   msg='the 50 leased items back in the queue')
        time.sleep(1.2)  # two more lease periods on both ferries: nothing moves twice
        self.assertEqual(sorted(m.lrange(q, 0, -1)), sorted(items))
        expired = [stats(f.stats_port)['queues']['queues'][0]['lease_expired'] for f in (fa, fb)]
        self.assertEqual(sum(expired), 50, expired)


class LeaseTakeoverTest(unittest.TestCase):
    """A takeover hands a client holding 20 leases to the new process: it
    has not disconnected, so nothing is expired; its ack on the same socket
    after the takeover is an ack."""

    def test_takeover_expires_nothing(self):
        tmp = tempfile.mkdtemp(prefix='ferry-lease-takeover-')
        self.addCleanup(shutil.rmtree, tmp, True)
        sock_path = os.path.join(tmp, 'takeover.sock')
        r = RedisServer()
        self.addCleanup(r.kill)
        f = Ferry(r, conf={'takeover': {'socket': sock_path}},
                  extra_yaml=queues_yaml([{'keys': 'tko:*', 'processing': '"{key}:processing"',
                                           'lease_ms': 30000}]))
        self.addCleanup(f.stop)
        q, proc = 'tko:q', 'tko:q:processing'
        items = ['k%02d' % i for i in range(20)]
        m = r.client()
        m.rpush(q, *items)
        c = f.client(socket_timeout=10)
        taken = [c.brpoplpush(q, proc, 2) for _ in range(20)]
        wait_until(lambda: m.zcard(lkey('leases', proc)) == 20, timeout=5,
                   msg='20 leases')
        old = f.proc
        new = harness._spawn([FERRY_BIN, '-c', f.config_path, '--takeover', sock_path],
                             f.out_path)
        try:
            old_rc = old.wait(20)
        except subprocess.TimeoutExpired:
            old_rc = None
        f.proc, f.pid = new, new.pid
        self.assertEqual(old_rc, 0, '\n'.join(ln for ln in f.log().splitlines()
                                             if 'takeover' in ln or 'ERROR' in ln)[-3000:])
        self.assertIn('closed: handed over to the new process', f.log())
        # What a disconnect would have brought back within a second or so.
        time.sleep(1.5)
        self.assertEqual(m.llen(q), 0)
        self.assertEqual(m.llen(proc), 20)
        self.assertEqual(m.zcard(lkey('leases', proc)), 20)
        self.assertEqual(c.lrem(proc, 1, taken[0]), 1)  # the same socket, served by the new one
        self.assertEqual(m.zcard(lkey('leases', proc)), 19)


class QueueGuardsFailoverTest(unittest.TestCase):
    """kill -9 of the master (Sentinel mode) while 4 producers push against
    a bound: the list on the new master never passes the bound, every
    acknowledged push is there, and a refused push is absent unless its
    first attempt's reply was lost with the old master (a write re-sent with
    its outcome unknown: at most requests_retried_unknown of them)."""

    def test_kill9_master_while_bounded(self):
        topo = SentinelTopology()
        self.addCleanup(topo.stop)
        bound = 3000
        f = Ferry(None, sentinel=topo, conf={'upstream': {'hold_timeout_ms': 30000}},
                  extra_yaml=queues_yaml([{'keys': 'fo:*', 'max_length': bound}]))
        self.addCleanup(f.stop)
        key = 'fo:q'
        acked, refused, other = [], [], []
        lock = threading.Lock()

        def producer(n):
            c = f.client(socket_timeout=60)
            refusals = 0
            for i in range(bound):  # bounded; ends after 20 refusals
                item = 'p%d-%d' % (n, i)
                try:
                    c.rpush(key, item)
                    with lock:
                        acked.append(item)
                except redis.ResponseError as e:
                    with lock:
                        (refused if str(e).startswith('QFULL ferry: ') else other).append(
                            (item, str(e)))
                    refusals += 1
                    if refusals >= 20:
                        return
                except redis.RedisError as e:
                    with lock:
                        other.append((item, repr(e)))
                    return

        threads = [threading.Thread(target=producer, args=(n,)) for n in range(4)]
        for t in threads:
            t.start()
        wait_until(lambda: len(acked) >= bound // 3, timeout=60, msg='a third of the bound')
        old = topo.master()
        old.kill()
        topo.wait_failover(old.port, timeout=30)
        for t in threads:
            t.join(120)
        self.assertFalse(any(t.is_alive() for t in threads), 'producers hung')
        self.assertEqual(other, [], f.log()[-4000:])
        items = topo.master().client().lrange(key, 0, -1)
        self.assertLessEqual(len(items), bound)
        inside = set(items)
        self.assertEqual([a for a in acked if a not in inside], [])
        self.assertEqual(len(refused), 4 * 20)
        present = [it for it, _ in refused if it in inside]
        retried = stats(f.stats_port)['errors']['requests_retried_unknown']
        self.assertLessEqual(len(present), retried, (present, retried))


class LeaseFailoverTest(unittest.TestCase):
    """kill -9 of the master (Sentinel mode) while 4 workers take items
    with BRPOPLPUSH, ack most with LREM and let every fifth fail (its lease
    expires, max_attempts 3): every item ends acked once or dead-lettered
    once, none lost, none twice (an ack re-sent after its reply was lost
    with the master answers 0: counted apart, bounded by the re-sent
    writes)."""

    def test_kill9_master_while_leases_expire(self):
        topo = SentinelTopology()
        self.addCleanup(topo.stop)
        f = Ferry(None, sentinel=topo, conf={'upstream': {'hold_timeout_ms': 30000}},
                  extra_yaml=queues_yaml([{'keys': 'lf:*', 'processing': '"{key}:processing"',
                                           'lease_ms': 500, 'max_attempts': 3}]))
        self.addCleanup(f.stop)
        q, proc, dead = 'lf:q', 'lf:q:processing', 'lf:q:dead'
        items = ['i%03d' % i for i in range(300)]
        f.client().lpush(q, *items)
        acked, ack_zero, errors = [], [], []
        lock = threading.Lock()
        stop = threading.Event()

        def worker():
            c = f.client(socket_timeout=60)
            while not stop.is_set():
                try:
                    it = c.brpoplpush(q, proc, 1)
                    if it is None or int(it[1:]) % 5 == 0:
                        continue  # fails: its lease expires
                    n = c.lrem(proc, 1, it)
                    with lock:
                        (acked if n == 1 else ack_zero).append(it)
                except redis.RedisError as e:
                    with lock:
                        errors.append(repr(e))
                    return

        threads = [threading.Thread(target=worker) for _ in range(4)]
        for t in threads:
            t.start()
        self.addCleanup(stop.set)
        wait_until(lambda: len(acked) >= 60, timeout=60, msg='60 acks')
        old = topo.master()
        old.kill()
        topo.wait_failover(old.port, timeout=30)

        def settled():
            m = topo.master().client()
            return (m.llen(q) == 0 and m.llen(proc) == 0 and
                    len(set(acked) | set(ack_zero) | set(m.lrange(dead, 0, -1))) >= 300)
        try:
            wait_until(settled, timeout=90, interval=0.2, msg='every item acked or dead-lettered')
        except AssertionError:
            m = topo.master().client()
            lost = set(items) - set(acked) - set(ack_zero) - set(m.lrange(dead, 0, -1))
            raise AssertionError('not settled: acked %d, queue %r, processing %r, dead %d, '
                                 'leases %r, attempts %r, missing %r, errors %r\n%s' % (
                                     len(set(acked)), m.lrange(q, 0, -1), m.lrange(proc, 0, -1),
                                     m.llen(dead), m.zrange(lkey('leases', proc), 0, -1,
                                                            withscores=True),
                                     {k: m.hget(lkey('attempts', proc), k) for k in lost},
                                     sorted(lost), errors, f.log()[-3000:]))
        stop.set()
        for t in threads:
            t.join(60)
        self.assertEqual(errors, [], f.log()[-4000:])
        m = topo.master().client()
        deads = m.lrange(dead, 0, -1)
        self.assertEqual(len(acked), len(set(acked)), 'an item acked twice')
        self.assertEqual(len(deads), len(set(deads)), 'an item dead-lettered twice')
        self.assertEqual(set(acked) & set(deads), set())
        # An ack whose reply was lost with the master is sent again (its
        # outcome unknown: at-least-once) and then answers 0: the item was
        # acked once, by the first. Those are the only items neither counted
        # as acked nor dead-lettered, and no more than the writes re-sent.
        unknown = set(items) - set(acked) - set(deads)
        self.assertLessEqual(unknown, set(ack_zero))
        retried = stats(f.stats_port)['errors']['requests_retried_unknown']
        self.assertLessEqual(len(unknown), retried, (unknown, retried))
        self.assertEqual(sorted(deads), [it for it in items if int(it[1:]) % 5 == 0])
        self.assertEqual(m.llen(q), 0)
        self.assertEqual(m.llen(proc), 0)


class SentinelQueueGuards(SentinelMode, Checks, unittest.TestCase):
    pass


class FixedMasterQueueGuards(FixedMasterMode, Checks, unittest.TestCase):
    pass


load_tests = sentinel_first

if __name__ == '__main__':
    unittest.main()
