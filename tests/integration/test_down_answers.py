"""While no master is usable (the master view DOWN), ferry answers PING,
ECHO and INFO itself, at once: health checks (redis-cli ping, redis-py's
health_check_interval, pools that test a connection before use) see a ferry
that serves (the fallback store takes queue writes meanwhile), not one that
times out after upstream.hold_timeout_ms. INFO then carries ferry's own
sections. Authentication still applies, and once a master is back the same
commands go to Redis again. Fixed mode, Sentinel mode, workers: 4."""

import os
import socket
import subprocess
import time
import unittest

import redis

from harness import (Ferry, RedisServer, SentinelTopology, free_port, resp_encode,
                     resp_read_raw, resp_read_reply, resp_send, wait_until)
from test_fallback import fallback_conf, pending, state

# seconds: an answer from ferry itself, not a hold (which lasts HOLD_MS). It
# bounds a hang, not a speed: ferry answers in about a millisecond, and the
# bound stays well under HOLD_MS so that a held answer still fails.
FAST = 4.0
HOLD_MS = 20000  # upstream.hold_timeout_ms: what a held PING would wait


def raw_conn(f, timeout=5):
    s = socket.create_connection(('127.0.0.1', f.port), timeout=timeout)
    return s


def raw(s, *cmd, timeout=5):
    resp_send(s, resp_encode(*cmd))
    return resp_read_raw(s, timeout=timeout)


def info_text(s, *args):
    resp_send(s, resp_encode('INFO', *args))
    return resp_read_reply(s, timeout=5).decode()


def info_sections(text):
    return [line[2:] for line in text.split('\r\n') if line.startswith('# ')]


def info_fields(text):
    out = {}
    for line in text.split('\r\n'):
        if line and not line.startswith('#') and ':' in line:
            k, v = line.split(':', 1)
            out[k] = v
    return out


def timed(fn, *a, **kw):
    t0 = time.monotonic()
    v = fn(*a, **kw)
    return v, time.monotonic() - t0


class DownAnswersTest(unittest.TestCase):
    """Fixed master with the fallback store, then without one."""

    def setUp(self):
        self.redis = RedisServer()
        self.addCleanup(self.redis.kill)
        self.path = os.path.join(self.redis.dir, 'ferry-fallback.db')

    def start_ferry(self, store=True, **conf):
        c = fallback_conf(self.path) if store else {
            'upstream': {'connect_timeout_ms': 500}, 'fallback': {'after_ms': 300}}
        c['upstream']['hold_timeout_ms'] = HOLD_MS
        for k, v in conf.items():
            c.setdefault(k, {}).update(v) if isinstance(v, dict) else c.__setitem__(k, v)
        f = Ferry(self.redis, conf=c)
        self.addCleanup(f.kill)
        return f

    def outage(self, f):
        self.redis.kill()
        wait_until(lambda: state(f) == 'DOWN', timeout=10, msg='master view DOWN')

    def test_ping_echo_info_while_down(self):
        f = self.start_ferry()
        c = f.client(socket_timeout=3)
        self.assertTrue(c.ping())
        self.outage(f)

        ok, took = timed(c.ping)
        self.assertTrue(ok)
        self.assertLess(took, FAST)
        s = raw_conn(f)
        self.addCleanup(s.close)
        # Redis' replies and arity errors, byte for byte.
        self.assertEqual(raw(s, 'PING'), b'+PONG\r\n')
        self.assertEqual(raw(s, 'ping', 'hello'), b'$5\r\nhello\r\n')
        self.assertEqual(raw(s, 'PING', 'a', 'b'),
                         b"-ERR wrong number of arguments for 'ping' command\r\n")
        self.assertEqual(raw(s, 'ECHO'), b"-ERR wrong number of arguments for 'echo' command\r\n")
        self.assertEqual(raw(s, 'echo', 'x', 'y'),
                         b"-ERR wrong number of arguments for 'echo' command\r\n")
        self.assertEqual(raw(s, 'ECHO', ''), b'$0\r\n\r\n')
        self.assertEqual(c.echo('hi there'), 'hi there')
        # Pipelined behind queue writes the store takes: answered in order.
        resp_send(s, resp_encode('LPUSH', 'q', 'a') + resp_encode('PING') +
                  resp_encode('LPUSH', 'q', 'b') + resp_encode('ECHO', 'e'))
        self.assertEqual([resp_read_raw(s) for _ in range(4)],
                         [b':1\r\n', b'+PONG\r\n', b':2\r\n', b'$1\r\ne\r\n'])

        # INFO: ferry's own sections.
        text, took = timed(info_text, s)
        self.assertLess(took, FAST)
        self.assertEqual(info_sections(text),
                         ['Server', 'Clients', 'Stats', 'Replication', 'Cluster', 'Ferry'])
        self.assertTrue(text.endswith('\r\n'), text[-20:])
        # With workers: N, other loops' counters reach INFO at their next tick.
        wait_until(lambda: c.info()['total_commands_processed'] > 10 and
                   c.info()['connected_clients'] >= 2, timeout=5,
                   msg='every loop\'s counters in INFO')
        info = c.info()
        self.assertEqual(info['redis_version'], '7.0.15')
        self.assertEqual(info['redis_mode'], 'standalone')
        self.assertTrue(info['ferry_version'])
        self.assertEqual(info['process_id'], f.pid)
        self.assertEqual(info['tcp_port'], f.port)
        self.assertGreaterEqual(info['uptime_in_seconds'], 0)
        self.assertGreaterEqual(info['connected_clients'], 2)
        self.assertGreater(info['total_commands_processed'], 10)
        self.assertGreaterEqual(info['total_connections_received'], 2)
        self.assertEqual(info['role'], 'master')
        self.assertEqual(info['connected_slaves'], 0)
        self.assertEqual(info['ferry_master_view'], 'down')
        self.assertEqual(info['cluster_enabled'], 0)
        self.assertEqual(info['ferry_master_mode'], 'fixed')
        self.assertEqual(info['ferry_master'], '127.0.0.1:%d' % self.redis.port)
        self.assertGreater(info['ferry_down_for_ms'], 0)
        self.assertEqual(info['ferry_fallback_store'], 'on')
        self.assertEqual(info['ferry_fallback_rows_pending'], 2)
        self.assertEqual(info['ferry_fallback_rows_pending'], pending(f))
        self.assertGreaterEqual(info['ferry_fallback_oldest_age_ms'], 0)
        self.assertNotIn('run_id', info)  # Redis' field: this INFO is ferry's

        self.assertEqual(info_sections(info_text(s, 'server')), ['Server'])
        self.assertEqual(info_sections(info_text(s, 'CLIENTS', 'ferry')),
                         ['Clients', 'Ferry'])
        for arg in ('all', 'everything', 'default'):
            self.assertEqual(info_sections(info_text(s, arg)),
                             ['Server', 'Clients', 'Stats', 'Replication', 'Cluster', 'Ferry'],
                             arg)
        # ferry cannot see Redis' keys: no Keyspace section (an empty one
        # would say the data set is empty); like any section it lacks, ''.
        self.assertEqual(raw(s, 'INFO', 'keyspace'), b'$0\r\n\r\n')
        self.assertEqual(raw(s, 'INFO', 'memory'), b'$0\r\n\r\n')
        self.assertEqual(raw(s, 'INFO', 'nosuch'), b'$0\r\n\r\n')
        # RESP3: a verbatim string, as Redis 7.0 sends INFO.
        raw(s, 'HELLO', '3')
        r3 = raw(s, 'INFO', 'replication')
        body = b'txt:# Replication\r\n'
        self.assertTrue(r3.startswith(b'='), r3)
        n = int(r3[1:r3.index(b'\r\n')])
        payload = r3[r3.index(b'\r\n') + 2:]
        self.assertEqual(len(payload), n + 2)
        self.assertTrue(payload.startswith(body), payload)
        self.assertIn(b'role:master\r\nconnected_slaves:0\r\nferry_master_view:down\r\n', payload)
        self.assertEqual(raw(s, 'INFO', 'keyspace'), b'=4\r\ntxt:\r\n')
        self.assertEqual(raw(s, 'PING'), b'+PONG\r\n')

        # The health checks users run.
        out = subprocess.run(['redis-cli', '-p', str(f.port), 'ping'], capture_output=True,
                             text=True, timeout=FAST * 4)
        self.assertEqual(out.stdout.strip(), 'PONG')
        hc = redis.Redis(port=f.port, health_check_interval=1, socket_timeout=3,
                         decode_responses=True)
        self.addCleanup(hc.close)
        self.assertEqual(hc.lpush('hq', 'first'), 1)
        time.sleep(1.2)  # the next command starts with redis-py's PING
        n, took = timed(hc.lpush, 'hq', 'second')
        self.assertEqual(n, 2)
        self.assertLess(took, FAST)

        # A master again: the same commands go to Redis.
        self.redis.start()
        wait_until(lambda: state(f) == 'UP', timeout=15, msg='UP again')
        wait_until(lambda: pending(f) == 0, timeout=15, msg='replay')
        # With workers: N, c's loop learns the view at its next tick.
        wait_until(lambda: 'run_id' in c.info(), timeout=5, msg="c's loop UP too")
        direct = self.redis.client()
        self.assertEqual(direct.info('commandstats').get('cmdstat_echo'), None)
        self.assertEqual(c.echo('back'), 'back')
        self.assertEqual(direct.info('commandstats')['cmdstat_echo']['calls'], 1)
        info = c.info()
        self.assertIn('run_id', info)
        self.assertNotIn('ferry_master_view', info)
        self.assertEqual(info['tcp_port'], self.redis.port)
        self.assertTrue(c.ping())

    def test_no_store(self):
        """Without a fallback store the view goes DOWN all the same: PING
        says ferry is there; INFO says the store is off."""
        f = self.start_ferry(store=False)
        c = f.client(socket_timeout=3)
        self.outage(f)
        ok, took = timed(c.ping)
        self.assertTrue(ok)
        self.assertLess(took, FAST)
        info = c.info()
        self.assertEqual(info['ferry_master_view'], 'down')
        self.assertEqual(info['ferry_fallback_store'], 'off')
        self.assertNotIn('ferry_fallback_rows_pending', info)

    def test_start_without_redis(self):
        """ferry started while no Redis is known (Sentinel mode, no sentinel
        reachable), no store: a PING sent at once waits fallback.after_ms for
        a first master, then ferry answers it. Fixed mode too."""
        sentinel = {'master': 'mq', 'addresses': ['127.0.0.1:%d' % free_port()]}
        self.redis.kill()
        for redis_srv, sn in ((None, sentinel), (self.redis, None)):
            f = Ferry(redis_srv, conf={'upstream': {'hold_timeout_ms': HOLD_MS,
                                                    'connect_timeout_ms': 500},
                                       'fallback': {'after_ms': 300}},
                      sentinel=sn, wait='port')
            self.addCleanup(f.kill)
            s = raw_conn(f)
            self.addCleanup(s.close)
            t0 = time.monotonic()
            self.assertEqual(raw(s, 'PING'), b'+PONG\r\n')
            self.assertLess(time.monotonic() - t0, 0.3 + 4 * FAST)
            self.assertEqual(info_fields(info_text(s, 'ferry'))['ferry_master_mode'],
                             'sentinel' if sn else 'fixed')

    def test_password_still_asked(self):
        """client.password: an unauthenticated client gets -NOAUTH while
        DOWN too, as Redis would answer it."""
        f = self.start_ferry(client={'password': 'sekret'})
        self.outage(f)
        s = raw_conn(f)
        self.addCleanup(s.close)
        self.assertEqual(raw(s, 'PING'), b'-NOAUTH Authentication required.\r\n')
        self.assertEqual(raw(s, 'INFO'), b'-NOAUTH Authentication required.\r\n')
        self.assertEqual(raw(s, 'AUTH', 'sekret'), b'+OK\r\n')
        self.assertEqual(raw(s, 'PING'), b'+PONG\r\n')

    def test_acl_users(self):
        """client.auth redis: an unauthenticated client gets -NOAUTH while
        DOWN; a client Redis authenticated before gets PING and ECHO from
        ferry, but not INFO (only Redis can say what its user may see): that
        waits for a master as any other command, -TRYAGAIN at the bound."""
        direct = self.redis.client()
        direct.execute_command('ACL', 'SETUSER', 'hu', 'on', '>hpass', '~*', '+@all')
        f = self.start_ferry(client={'auth': 'redis'}, upstream={'hold_timeout_ms': 1500})
        s = raw_conn(f)
        self.addCleanup(s.close)
        self.assertEqual(raw(s, 'AUTH', 'hu', 'hpass'), b'+OK\r\n')
        self.outage(f)
        anon = raw_conn(f)
        self.addCleanup(anon.close)
        self.assertEqual(raw(anon, 'PING'), b'-NOAUTH Authentication required.\r\n')
        self.assertEqual(raw(anon, 'INFO'), b'-NOAUTH Authentication required.\r\n')
        t0 = time.monotonic()
        self.assertEqual(raw(s, 'PING'), b'+PONG\r\n')
        self.assertEqual(raw(s, 'ECHO', 'u'), b'$1\r\nu\r\n')
        self.assertLess(time.monotonic() - t0, FAST)
        reply = raw(s, 'INFO')
        self.assertTrue(reply.startswith(b'-TRYAGAIN'), reply)
        self.assertGreaterEqual(time.monotonic() - t0, 1.0)

    def test_subscribed_ping(self):
        """A subscribed client's PING while DOWN: RESP2 gets Redis' pub/sub
        form (*2 pong <msg>), RESP3 a plain PONG; its subscriptions come
        back with the master."""
        f = self.start_ferry()
        s2 = raw_conn(f)
        self.addCleanup(s2.close)
        self.assertEqual(raw(s2, 'SUBSCRIBE', 'ch'),
                         b'*3\r\n$9\r\nsubscribe\r\n$2\r\nch\r\n:1\r\n')
        s3 = raw_conn(f)
        self.addCleanup(s3.close)
        raw(s3, 'HELLO', '3')
        self.assertEqual(raw(s3, 'SUBSCRIBE', 'ch'),
                         b'>3\r\n$9\r\nsubscribe\r\n$2\r\nch\r\n:1\r\n')
        self.outage(f)
        t0 = time.monotonic()
        self.assertEqual(raw(s2, 'PING'), b'*2\r\n$4\r\npong\r\n$0\r\n\r\n')
        self.assertEqual(raw(s2, 'PING', 'hc'), b'*2\r\n$4\r\npong\r\n$2\r\nhc\r\n')
        self.assertEqual(raw(s3, 'PING'), b'+PONG\r\n')
        self.assertEqual(raw(s3, 'ECHO', 'e3'), b'$2\r\ne3\r\n')
        self.assertLess(time.monotonic() - t0, 4 * FAST)
        self.redis.start()
        wait_until(lambda: state(f) == 'UP', timeout=15, msg='UP again')
        direct = self.redis.client()
        wait_until(lambda: direct.pubsub_numsub('ch') == [('ch', 2)], timeout=10,
                   msg='both subscribed again')
        direct.publish('ch', 'm')
        self.assertEqual(resp_read_raw(s2), b'*3\r\n$7\r\nmessage\r\n$2\r\nch\r\n$1\r\nm\r\n')
        self.assertEqual(resp_read_raw(s3), b'>3\r\n$7\r\nmessage\r\n$2\r\nch\r\n$1\r\nm\r\n')


class DownAnswersWorkersTest(unittest.TestCase):
    """workers: 4 - every loop answers, INFO counts every loop's clients."""

    WORKERS = 4

    def test_every_loop(self):
        r = RedisServer()
        self.addCleanup(r.kill)
        conf = fallback_conf(os.path.join(r.dir, 'ferry-fallback.db'))
        conf['upstream']['hold_timeout_ms'] = HOLD_MS
        conf['workers'] = self.WORKERS
        f = Ferry(r, conf=conf)
        self.addCleanup(f.kill)
        from test_stats import stats_json
        loops = lambda: stats_json(f.stats_port)['worker_loops']
        wait_until(lambda: sum(l['clients'] for l in loops()) == 0, timeout=10,
                   msg='no client left from the start-up check')
        cl = []
        for _ in range(self.WORKERS):
            c = f.client(socket_timeout=3)
            c.ping()
            cl.append(c)
        wait_until(lambda: [l['clients'] for l in loops()] == [1] * self.WORKERS,
                   timeout=10, msg='one client per loop')
        r.kill()
        wait_until(lambda: not any(l['upstream_up'] for l in loops()), timeout=10,
                   msg='every loop DOWN')
        wait_until(lambda: state(f) == 'DOWN', timeout=10, msg='DOWN')
        for i, c in enumerate(cl):
            ok, took = timed(c.ping)
            self.assertTrue(ok, i)
            self.assertLess(took, FAST, i)
            self.assertEqual(c.echo('loop%d' % i), 'loop%d' % i)
            self.assertEqual(c.lpush('wq', i), i + 1)
        for i, c in enumerate(cl):
            info = c.info()
            self.assertEqual(info['ferry_master_view'], 'down', i)
            self.assertEqual(info['connected_clients'], self.WORKERS, i)
            self.assertEqual(info['ferry_workers'], self.WORKERS, i)
            self.assertEqual(info['ferry_fallback_rows_pending'], self.WORKERS, i)
        # Counters are every loop's (each as of its last tick).
        wait_until(lambda: cl[0].info('stats')['total_commands_processed'] >= 5 * self.WORKERS,
                   timeout=5, msg='commands of every loop counted')
        r.start()
        wait_until(lambda: all(l['upstream_up'] for l in loops()), timeout=15, msg='UP')
        for c in cl:
            self.assertIn('run_id', c.info())


class DownAnswersSentinelTest(unittest.TestCase):
    """Sentinel mode, every Redis and every sentinel down."""

    def test_whole_outage(self):
        topo = SentinelTopology()
        self.addCleanup(topo.stop)
        conf = fallback_conf(os.path.join(topo.redis[0].dir, 'ferry-fallback.db'))
        conf['upstream']['hold_timeout_ms'] = HOLD_MS
        f = Ferry(None, conf=conf, sentinel=topo)
        self.addCleanup(f.kill)
        c = f.client(socket_timeout=3)
        self.assertTrue(c.ping())
        master = topo.master().port
        for sn in topo.sentinels:
            sn.kill()
        for rs in topo.redis:
            rs.kill()
        wait_until(lambda: state(f) == 'DOWN', timeout=15, msg='DOWN')
        ok, took = timed(c.ping)
        self.assertTrue(ok)
        self.assertLess(took, FAST)
        info = c.info()
        self.assertEqual(info['ferry_master_view'], 'down')
        self.assertEqual(info['ferry_master_mode'], 'sentinel')
        self.assertEqual(info['ferry_master'], '127.0.0.1:%d' % master)
        self.assertEqual(c.lpush('sq', 'x'), 1)
        for rs in topo.redis:
            rs.start()
        for sn in topo.sentinels:
            sn.start()
        wait_until(lambda: state(f) == 'UP', timeout=30, msg='UP again')
        # With workers: N, c's loop learns the view at its next tick.
        wait_until(lambda: 'run_id' in c.info(), timeout=5, msg="c's loop UP too")
        self.assertNotIn('ferry_master_view', c.info())


if __name__ == '__main__':
    unittest.main()
