"""Redis refusing a request without applying it: when ferry holds and sends
it again, and when the refusal is Redis' own answer, passed on at once.

Fixed master:
- min-replicas-to-write with no replica, on a master ferry has used since it
  started: -NOREPLICAS is the master's own configuration, answered at once
  (as Redis answers it directly), one refused call per request;
- the same refusal on a master that has just come back (a switch): held,
  sent again with a back-off (few refused calls in Redis' errorstats), and
  answered -TRYAGAIN at upstream.hold_timeout_ms from the first refusal; a
  replica attaching in time lets the held write through;
- a master that turned replica: writes in flight (-READONLY) and a pop
  blocked there (-UNBLOCKED, the demotion) are held and end in -TRYAGAIN at
  the hold bound, each refused once;
- -UNBLOCKED that is no failover is passed on: the stream key of a blocked
  XREADGROUP deleted, and CLIENT UNBLOCK <id> ERROR (sent to Redis itself);
  neither starts a master switch.
Sentinel mode: the same pass-through cases on a Sentinel-managed master;
and after a kill -9 failover, the promoted master refusing writes until
Sentinel gives it its replica is held, never passed on.

Run:  python3 -m unittest test_refusals -v
Ferry-only (skipped with FERRY_TEST_DIRECT=1).
"""
import socket
import threading
import time
import unittest

from harness import (DIRECT, Ferry, RedisServer, RespError, SentinelTopology,
                     resp_encode, resp_read_reply, resp_send, wait_until)
from test_stats import stats_json

# An answer that needs no waiting (Redis' own refusal) comes within PROMPT_S,
# one held comes at HOLD_MS: both bound a hang, far apart (a few ms and the
# hold are what this machine takes; a loaded CI machine stretches the first).
PROMPT_S = 4.0
HOLD_MS = 6000       # upstream.hold_timeout_ms in these tests


def max_refusals(seconds):
    """Refused calls Redis may see for one request held this long: ferry
    backs off 20 ms doubling to 500 ms (6 calls in the first 0.6 s, then 2
    a second), plus slack; a hot loop makes about a hundred a second."""
    return int(8 + 2 * seconds)


MAX_REFUSED_PER_REQUEST = max_refusals(HOLD_MS / 1000)


def errorstat(server, name):
    """Redis' count of error replies with this prefix (INFO errorstats)."""
    v = server.client(socket_timeout=5).info('errorstats').get('errorstat_' + name)
    if isinstance(v, dict):
        return int(v.get('count', 0))
    return int(str(v).split('=', 1)[1].split(',')[0]) if v else 0


def refused(server, *names):
    """Redis' count of calls of these commands it refused (INFO commandstats'
    rejected_calls): the client's own, not ferry's heartbeat (an EVAL every
    quarter TTL), refused too while the master asks for more replicas."""
    info = server.client(socket_timeout=5).info('commandstats')
    return sum(int(info.get('cmdstat_' + n, {}).get('rejected_calls', 0)) for n in names)


def stat(f, section, name):
    return stats_json(f.stats_port)[section][name]


def connect(f):
    return f.raw(timeout=10)


def connect_direct(r):
    return socket.create_connection(('127.0.0.1', r.port), timeout=10)


def pipeline(s, cmds, timeout):
    """Send cmds in one write; read the replies (one deadline for all)."""
    resp_send(s, b''.join(resp_encode(c) for c in cmds))
    out = []
    deadline = time.monotonic() + timeout
    for _ in cmds:
        out.append(resp_read_reply(s, timeout=max(0.1, deadline - time.monotonic())))
    return out


def is_error(r, prefix):
    return isinstance(r, RespError) and str(r).startswith(prefix)


class Pending:
    """One request on its own connection, answered in the background."""

    def __init__(self, sock, cmd, timeout):
        self.sock, self.reply, self.t_reply = sock, None, None
        self.t0 = time.monotonic()
        resp_send(sock, cmd)
        self.thread = threading.Thread(target=self._read, args=(timeout,), daemon=True)
        self.thread.start()

    def _read(self, timeout):
        try:
            self.reply = resp_read_reply(self.sock, timeout=timeout)
        except Exception as e:  # noqa: BLE001 - a timeout is asserted on by the test
            self.reply = e
        self.t_reply = time.monotonic()

    def result(self, timeout=30):
        self.thread.join(timeout)
        took = (self.t_reply or time.monotonic()) - self.t0
        return self.reply, took

    def is_alive(self):
        return self.thread.is_alive()


def blocked_ids(server, cmd):
    """Redis' ids of the connections blocked in cmd (CLIENT LIST). A pop
    with its receipt is blocked in BLMOVE (receipts.c): blpop/brpop count
    it."""
    names = (cmd, 'blmove') if cmd in ('blpop', 'brpop') else (cmd,)
    out = []
    for c in server.client(socket_timeout=5).client_list():
        if c.get('cmd') in names and 'b' in c.get('flags', ''):
            out.append(c['id'])
    return out


class UnblockedChecks:
    """-UNBLOCKED that is no failover reaches the client as Redis gave it.
    The subclass provides self.ferry and self.master() (a RedisServer)."""

    def switches(self):
        return stat(self.ferry, 'failover', 'failovers')

    def test_stream_key_deleted_under_xreadgroup(self):
        c = self.ferry.client()
        key = 'ub:s:%s' % self.id()
        c.xgroup_create(key, 'g', id='$', mkstream=True)
        before = self.switches()
        p = Pending(connect(self.ferry), ['XREADGROUP', 'GROUP', 'g', 'c1', 'BLOCK', 10000,
                                          'STREAMS', key, '>'], 15)
        m = self.master()
        wait_until(lambda: blocked_ids(m, 'xreadgroup'), timeout=5,
                   msg='XREADGROUP blocked on the master')
        m.client(socket_timeout=5).delete(key)
        reply, took = p.result()
        self.assertTrue(is_error(reply, 'UNBLOCKED the stream key no longer exists'),
                        '%r after %.2fs\n%s' % (reply, took, self.ferry.log()[-3000:]))
        self.assertLess(took, PROMPT_S)
        self.assertEqual(self.switches(), before, 'no master switch for a deleted stream')

    def test_client_unblock_error(self):
        key = 'ub:l:%s' % self.id()
        before = self.switches()
        p = Pending(connect(self.ferry), ['BLPOP', key, 10], 15)
        m = self.master()
        ids = wait_until(lambda: blocked_ids(m, 'blpop'), timeout=5,
                         msg='BLPOP blocked on the master')
        self.assertEqual(len(ids), 1, ids)
        self.assertEqual(m.client(socket_timeout=5).execute_command(
            'CLIENT', 'UNBLOCK', ids[0], 'ERROR'), 1)
        reply, took = p.result()
        self.assertTrue(is_error(reply, 'UNBLOCKED client unblocked via CLIENT UNBLOCK'),
                        '%r after %.2fs\n%s' % (reply, took, self.ferry.log()[-3000:]))
        self.assertLess(took, PROMPT_S)
        self.assertEqual(self.switches(), before, 'no master switch for CLIENT UNBLOCK')
        # The session goes on: its next blocking call is served.
        self.assertEqual(self.ferry.client().lpush(key, 'x'), 1)
        self.assertEqual(self.ferry.client().blpop([key], 1), (key, 'x'))


@unittest.skipIf(DIRECT, 'ferry only')
class FixedUnblockedTest(UnblockedChecks, unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.redis = RedisServer()
        cls.ferry = Ferry(cls.redis, conf={'upstream': {'hold_timeout_ms': 10000}})

    @classmethod
    def tearDownClass(cls):
        cls.ferry.stop()
        cls.redis.stop()

    def master(self):
        return self.redis


@unittest.skipIf(DIRECT, 'ferry only')
class SentinelUnblockedTest(UnblockedChecks, unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.topo = SentinelTopology()
        try:
            cls.ferry = Ferry(sentinel=cls.topo, conf={'upstream': {'hold_timeout_ms': 10000}})
        except BaseException:
            cls.topo.stop()
            raise

    @classmethod
    def tearDownClass(cls):
        cls.ferry.stop()
        cls.topo.stop()

    def master(self):
        return self.topo.master()

    def test_noreplicas_of_the_masters_own_configuration(self):
        # The master asks for more good replicas than it has: Redis' own
        # answer to every write, passed on at once, each refused once.
        m = self.master()
        mc = m.client(socket_timeout=5)
        mc.config_set('min-replicas-to-write', 3)
        self.addCleanup(mc.config_set, 'min-replicas-to-write', 0)
        before = refused(m, 'set', 'lpush')
        s = connect(self.ferry)
        self.addCleanup(s.close)
        t0 = time.monotonic()
        replies = pipeline(s, [['SET', 'nr:a', '1'], ['LPUSH', 'nr:q', 'x'], ['GET', 'nr:a']],
                           timeout=5)
        took = time.monotonic() - t0
        self.assertTrue(is_error(replies[0], 'NOREPLICAS'), replies)
        self.assertTrue(is_error(replies[1], 'NOREPLICAS'), replies)
        self.assertIsNone(replies[2])
        self.assertLess(took, PROMPT_S)
        self.assertEqual(refused(m, 'set', 'lpush') - before, 2)


@unittest.skipIf(DIRECT, 'ferry only')
class SentinelFailoverNoReplicasTest(unittest.TestCase):
    def test_new_master_refusing_until_its_replica_is_back(self):
        # Every node asks for one good replica. After a kill -9 the promoted
        # master has none until Sentinel points the other replica at it: its
        # -NOREPLICAS then is part of the failover, held (with a back-off)
        # until the replica is back, never passed on; a transaction's too
        # (before: its queued command's refusal reached the client, its EXEC
        # answered EXECABORT), rebuilt on a new link once the back-off ran.
        topo = SentinelTopology(redis_conf={'min-replicas-to-write': 1,
                                            'min-replicas-max-lag': 10})
        self.addCleanup(topo.stop)
        f = Ferry(sentinel=topo, conf={'upstream': {'hold_timeout_ms': 20000}})
        self.addCleanup(f.stop)
        acked, errors, stop = [], [], threading.Event()

        def producer(tx):
            # tx: each push in a transaction (RQ's enqueue): its commands
            # refused at queue time would abort the EXEC (EXECABORT).
            c = f.client(socket_timeout=30)
            i = 0
            while not stop.is_set():
                item = '%s-%d' % ('t' if tx else 'p', i)
                i += 1
                try:
                    if tx:
                        p = c.pipeline(transaction=True)
                        p.hset('fo:job:%s' % item, 'status', 'queued')
                        p.lpush('fo:q', item)
                        p.execute()
                    else:
                        c.lpush('fo:q', item)
                    acked.append(item)
                except Exception as e:  # noqa: BLE001 - asserted below
                    errors.append(repr(e))
                    return

        threads = [threading.Thread(target=producer, args=(tx,), daemon=True)
                   for tx in (False, True)]
        for t in threads:
            t.start()
        self.addCleanup(stop.set)
        wait_until(lambda: len(acked) > 50, timeout=10, msg='writes to flow')
        old = topo.master()
        # One replica frozen: the other is promoted and stays without a
        # replica until the frozen one is thawed and Sentinel points it there.
        frozen = [r for r in topo.redis if r is not old][1]
        frozen.sigstop()
        self.addCleanup(frozen.sigcont)
        t_kill = time.monotonic()
        old.kill()
        new_port = topo.wait_failover(old.port, timeout=30)
        new = topo.redis_by_port(new_port)
        # The write in flight at the kill, sent again to the new master,
        # may find its receipt there (the old master replicated it): then
        # nothing is written and nothing refused, the push is answered from
        # the receipt and held on a WAIT until a replica has it. Either way
        # the new master is serving without a replica.
        wait_until(lambda: (errorstat(new, 'NOREPLICAS') > 0 or errors or
                            stat(f, 'durability', 'push_receipts_found') > 0),
                   timeout=10, msg='the new master to refuse a write (or to hold one '
                   'answered from its receipt)')
        t_refused = time.monotonic()
        time.sleep(1.0)
        frozen.sigcont()
        n = len(acked)
        wait_until(lambda: len(acked) > n or errors, timeout=30,
                   msg='writes to resume on the new master')
        held = time.monotonic() - t_refused
        wait_until(lambda: len(acked) > n + 50 or errors, timeout=10,
                   msg='writes to flow on the new master')
        stop.set()
        for t in threads:
            t.join(timeout=35)
        refused = errorstat(new, 'NOREPLICAS')
        since_kill = time.monotonic() - t_kill
        stats = new.client(socket_timeout=5).info('commandstats')
        rejected = {k[len('cmdstat_'):]: v.get('rejected_calls', 0) for k, v in stats.items()
                    if v.get('rejected_calls', 0)}
        print('\n[failover] rejected calls per command on the new master: %r' % rejected,
              flush=True)
        print('\n[failover] new master refused %d calls with NOREPLICAS in %.1f s held '
              '(%.1f s since the kill); %d writes acked' % (refused, held, since_kill, len(acked)),
              flush=True)
        self.assertEqual(errors, [], f.log()[-4000:])
        present = set(new.client().lrange('fo:q', 0, -1))
        self.assertEqual([a for a in acked if a not in present], [])
        # Refusals start when the new master serves, which the poll above
        # sees late on a loaded machine (32 in a run measured from the poll
        # against a bound of 31): counted from the kill, with the back-off's
        # 2 a second doubled. A hot loop makes about a hundred a second.
        # Three requests at a time: the plain push, and the transaction's
        # HSET and the LPUSH pipelined behind it (Redis refuses both before
        # the first refusal is read; they come back and wait together).
        self.assertLessEqual(refused, 3 * max_refusals(2 * since_kill))


@unittest.skipIf(DIRECT, 'ferry only')
class FixedNoReplicasTest(unittest.TestCase):
    def start(self, redis_conf, hold_ms=HOLD_MS):
        r = RedisServer(conf=redis_conf)
        self.addCleanup(r.kill)
        # NOREPLICAS of a master back from a switch is held for
        # durability.replicas_ack_hold_ms; every other refusal for
        # upstream.hold_timeout_ms (left at its 10 s default here)
        f = Ferry(r, conf={'durability': {'replicas_ack_hold_ms': hold_ms}})
        self.addCleanup(f.stop)
        return r, f

    def test_masters_own_configuration_is_answered_at_once(self):
        # min-replicas-to-write 1 and no replica on the master ferry has
        # used since it started: what Redis answers, ferry answers, at once
        # (it was retried in a hot loop that never ended).
        r, f = self.start({'min-replicas-to-write': 1}, hold_ms=10000)
        cmds = [['SET', 'nr:a', '1'], ['LPUSH', 'nr:q', 'x'],
                ['EVAL', "return redis.call('set', KEYS[1], '2')", 1, 'nr:b'],
                ['EVAL', "#!lua\nreturn redis.call('get', KEYS[1])", 1, 'nr:a'],
                ['EVAL', "#!lua flags=no-writes\nreturn redis.call('get', KEYS[1])", 1, 'nr:a'],
                ['GET', 'nr:a'], ['PING']]
        direct = connect_direct(r)
        self.addCleanup(direct.close)
        start = refused(r, 'set', 'lpush')
        expected = pipeline(direct, cmds, timeout=5)
        before = refused(r, 'set', 'lpush')
        self.assertGreater(before, start)
        s = connect(f)
        self.addCleanup(s.close)
        t0 = time.monotonic()
        try:
            got = pipeline(s, cmds, timeout=PROMPT_S + 5)
        except Exception as e:  # noqa: BLE001 - the hang this test is about
            self.fail('no answer within %.1fs (%s); Redis refused %d calls' % (
                time.monotonic() - t0, e, refused(r, 'set', 'lpush') - before))
        took = time.monotonic() - t0
        self.assertEqual([str(x) if isinstance(x, RespError) else x for x in got],
                         [str(x) if isinstance(x, RespError) else x for x in expected])
        self.assertTrue(is_error(got[0], 'NOREPLICAS'), got)
        self.assertLess(took, PROMPT_S)
        self.assertEqual(refused(r, 'set', 'lpush') - before, before - start,
                         'refused as often as when sent to Redis directly')
        self.assertEqual(stat(f, 'errors', 'requests_tryagain'), 0)

    def test_fresh_master_refusal_is_held_with_back_off(self):
        # A master that has just come back (restarted: a switch) refuses
        # writes until its replica is back: the write is held, sent again
        # with a back-off, and goes through once the replica is there.
        r, f = self.start({'min-replicas-to-write': 1, 'min-replicas-max-lag': 10,
                           'repl-diskless-sync-delay': 0}, hold_ms=15000)
        replica = RedisServer(conf={'replicaof': '127.0.0.1 %d' % r.port})
        self.addCleanup(replica.kill)
        c = f.client(socket_timeout=15)
        wait_until(lambda: r.client().info('replication').get('min_slaves_good_slaves') == 1,
                   timeout=10, msg='the replica to attach')
        self.assertTrue(c.set('fm:a', '1'))
        replica.kill()
        r.restart()
        wait_until(lambda: stat(f, 'upstream', 'upstream_state') == 'UP'
                   and stat(f, 'failover', 'failovers') >= 1, timeout=10,
                   msg='ferry UP again on the restarted master')
        before = errorstat(r, 'NOREPLICAS')
        p = Pending(connect(f), ['SET', 'fm:b', '2'], 15)
        wait_until(lambda: errorstat(r, 'NOREPLICAS') > before, timeout=5,
                   msg='Redis to refuse the first attempt')
        time.sleep(2.0)   # held, sent again now and then
        self.assertTrue(p.is_alive(), 'answered %r while no replica could confirm' % (p.reply,))
        refused = errorstat(r, 'NOREPLICAS') - before
        print('\n[back-off] a write held 2 s on a fresh master: %d refused calls' % refused,
              flush=True)
        replica.start()
        reply, took = p.result()
        self.assertEqual(reply, 'OK', '%r after %.2fs' % (reply, took))
        self.assertEqual(r.client().get('fm:b'), '2')
        self.assertLessEqual(refused, max_refusals(2.0),
                             '%d refused calls in 2 s: no back-off' % refused)

    def test_fresh_master_refusal_ends_at_the_hold_bound(self):
        r, f = self.start({'min-replicas-to-write': 1}, hold_ms=HOLD_MS)
        r.restart()
        wait_until(lambda: stat(f, 'upstream', 'upstream_state') == 'UP'
                   and stat(f, 'failover', 'failovers') >= 1, timeout=10,
                   msg='ferry UP again on the restarted master')
        before = errorstat(r, 'NOREPLICAS')
        s = connect(f)
        self.addCleanup(s.close)
        t0 = time.monotonic()
        got = pipeline(s, [['SET', 'hb:a', '1'], ['LPUSH', 'hb:q', 'x']], timeout=HOLD_MS / 1000 + 5)
        took = time.monotonic() - t0
        for x in got:
            self.assertTrue(is_error(x, 'TRYAGAIN ferry:'), got)
        self.assertGreaterEqual(took, HOLD_MS / 1000 - 0.1)
        self.assertLess(took, HOLD_MS / 1000 + 4.0)
        refused = errorstat(r, 'NOREPLICAS') - before
        print('\n[bound] 2 writes held %d ms: -TRYAGAIN after %.2fs, %d refused calls'
              % (HOLD_MS, took, refused), flush=True)
        self.assertLessEqual(refused, 2 * MAX_REFUSED_PER_REQUEST, refused)
        self.assertEqual(stat(f, 'errors', 'requests_tryagain'), 2)
        self.assertGreaterEqual(stat(f, 'errors', 'requests_refused'), 2)


@unittest.skipIf(DIRECT, 'ferry only')
class FixedMasterTurnedReplicaTest(unittest.TestCase):
    def test_readonly_and_unblocked_held_to_the_bound(self):
        # The fixed master becomes a replica of another node: writes in
        # flight are refused -READONLY, a pop blocked there -UNBLOCKED (the
        # demotion). Nothing was applied: held, and with no master back
        # within the hold bound, -TRYAGAIN; each refused once.
        other = RedisServer()
        self.addCleanup(other.kill)
        r = RedisServer()
        self.addCleanup(r.kill)
        f = Ferry(r, conf={'upstream': {'hold_timeout_ms': HOLD_MS}})
        self.addCleanup(f.stop)
        popper = Pending(connect(f), ['BLPOP', 'ro:q', 0], 15)
        wait_until(lambda: blocked_ids(r, 'blpop'), timeout=5, msg='BLPOP blocked')
        writers = []
        for i in range(4):
            s = connect(f)
            self.addCleanup(s.close)
            resp_send(s, b''.join(resp_encode('SET', 'ro:%d:%d' % (i, j), j) for j in range(5)))
            writers.append(s)
        # Turned replica while the writes may be in flight.
        self.assertEqual(r.client(socket_timeout=5).execute_command(
            'REPLICAOF', '127.0.0.1', other.port), 'OK')
        t0 = time.monotonic()
        tryagain = 0
        for s in writers:
            for _ in range(5):
                x = resp_read_reply(s, timeout=HOLD_MS / 1000 + 5)
                self.assertTrue(x == 'OK' or is_error(x, 'TRYAGAIN ferry:'), x)
                tryagain += x != 'OK'
        reply, took = popper.result()
        self.assertTrue(is_error(reply, 'TRYAGAIN ferry:'), reply)
        self.assertLess(time.monotonic() - t0, HOLD_MS / 1000 + 4.0)
        self.assertLessEqual(errorstat(r, 'READONLY'), 20, 'each write refused at most once')
        self.assertLessEqual(errorstat(r, 'UNBLOCKED'), 1)
        self.assertEqual(stat(f, 'errors', 'requests_tryagain'), tryagain + 1)
        self.assertEqual(stat(f, 'errors', 'requests_refused'),
                         errorstat(r, 'READONLY') + errorstat(r, 'UNBLOCKED'))


if __name__ == '__main__':
    unittest.main()
