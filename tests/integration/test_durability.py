"""Durability settings ferry enforces (N13), with Redis credentials, a renamed
or disabled CONFIG command, durability.require_aof and durability.replicas_ack."""

import threading
import time
import unittest

from harness import Ferry, RedisServer, RespError, resp_read_reply, resp_send, wait_until
from test_stats import stats_json


class DurabilityTest(unittest.TestCase):
    def start(self, redis_conf=None, ferry_conf=None):
        r = RedisServer(conf=dict({'appendonly': 'no', 'appendfsync': 'everysec'},
                                  **(redis_conf or {})))
        self.addCleanup(r.kill)
        f = Ferry(r, conf=ferry_conf or {})
        self.addCleanup(f.stop)
        return r, f

    def raw(self, f, *args, timeout=10):
        s = f.raw()
        self.addCleanup(s.close)
        resp_send(s, list(args))
        return resp_read_reply(s, timeout)

    def test_enforced_with_redis_credentials(self):
        r, f = self.start({'requirepass': 'r3dis'},
                          {'redis': {'password': 'r3dis'},
                           'durability': {'enforce_interval_ms': 200}})
        c = f.client()
        self.assertEqual(c.rpush('jobs', 'a'), 1)
        direct = r.client(password='r3dis')
        self.assertEqual(direct.config_get('appendonly')['appendonly'], 'yes')
        self.assertEqual(direct.config_get('appendfsync')['appendfsync'], 'always')
        # an operator (not through ferry) weakens it: ferry asserts it again
        direct.config_set('appendfsync', 'no')
        wait_until(lambda: direct.config_get('appendfsync')['appendfsync'] == 'always',
                   timeout=5, msg='ferry to re-assert appendfsync always')
        self.assertTrue(stats_json(f.stats_port)['durability']['aof_enforced'])

    def test_wrong_redis_password_is_reported(self):
        r = RedisServer(conf={'requirepass': 'right'})
        self.addCleanup(r.kill)
        f = Ferry(r, conf={'redis': {'password': 'wrong'}, 'upstream': {'hold_timeout_ms': 500}},
                  wait='port')
        self.addCleanup(f.stop)
        reply = self.raw(f, 'PING')
        self.assertIsInstance(reply, RespError)
        self.assertTrue(str(reply).startswith('TRYAGAIN ferry: no master for'), reply)
        wait_until(lambda: "refused ferry's credentials" in f.log(), timeout=5,
                   msg='a log line about the refused credentials')

    def test_renamed_config_command(self):
        r, f = self.start({'rename-command': 'CONFIG MYCONFIG'},
                          {'durability': {'config_command': 'MYCONFIG'}})
        self.assertEqual(f.client().set('k', 'v'), True)
        direct = r.client()
        self.assertEqual(direct.execute_command('MYCONFIG', 'GET', 'appendfsync'),
                         ['appendfsync', 'always'])
        self.assertEqual(direct.execute_command('MYCONFIG', 'GET', 'appendonly'),
                         ['appendonly', 'yes'])
        # The renamed CONFIG is guarded as CONFIG is: no weakening through ferry.
        for name in ('MYCONFIG', 'myconfig'):
            for param, value in (('appendfsync', 'no'), ('appendonly', 'no')):
                reply = self.raw(f, name, 'SET', param, value)
                self.assertIsInstance(reply, RespError)
                self.assertIn('ferry', str(reply))
                self.assertIn('not allowed', str(reply))
        self.assertEqual(direct.execute_command('MYCONFIG', 'GET', 'appendfsync'),
                         ['appendfsync', 'always'])
        # Other settings still pass through the renamed command.
        self.assertEqual(self.raw(f, 'MYCONFIG', 'SET', 'maxmemory-policy', 'noeviction'), 'OK')

    def test_config_disabled_without_require_aof(self):
        r, f = self.start({'rename-command': 'CONFIG ""'},
                          {'durability': {'enforce_interval_ms': 200}})
        # writes are accepted, loudly: every period logs the error, stats show it
        self.assertEqual(f.client().set('k', 'v'), True)
        d = stats_json(f.stats_port)['durability']
        self.assertFalse(d['aof_enforced'])
        self.assertIn('CONFIG', d['durability_last_error'].upper())
        wait_until(lambda: f.log().count('durability:') >= 3, timeout=5,
                   msg='the enforcement error logged every period')

    def test_config_disabled_with_require_aof(self):
        r, f = self.start({'rename-command': 'CONFIG ""'},
                          {'durability': {'require_aof': True}})
        reply = self.raw(f, 'LPUSH', 'q', 'x')
        self.assertIsInstance(reply, RespError)
        self.assertTrue(str(reply).startswith('ERR ferry: writes refused: durability'), reply)
        self.assertEqual(self.raw(f, 'LLEN', 'q'), 0)   # reads still work
        self.assertEqual(r.client().llen('q'), 0)      # nothing reached Redis

    def test_replicas_ack_without_replicas(self):
        # A write is applied, but no replica confirms it: the client is told
        # so after durability.replicas_ack_hold_ms (not upstream.hold_timeout_ms,
        # 10 s here) instead of getting a plain acknowledgement.
        r, f = self.start(ferry_conf={'durability': {'replicas_ack': 1,
                                                     'replicas_ack_timeout_ms': 100,
                                                     'replicas_ack_hold_ms': 600}})
        t0 = time.monotonic()
        reply = self.raw(f, 'LPUSH', 'q', 'x')
        took = time.monotonic() - t0
        self.assertIsInstance(reply, RespError)
        self.assertTrue(str(reply).startswith('NOREPLICAS ferry:'), reply)
        self.assertGreaterEqual(took, 0.5)
        self.assertLess(took, 10)  # a bound on a hang: replicas_ack_hold_ms is 600 ms
        self.assertEqual(self.raw(f, 'GET', 'missing'), None)   # reads are not held

    def test_replicas_ack_with_a_replica(self):
        r, f = self.start(ferry_conf={'durability': {'replicas_ack': 1}})
        replica = RedisServer(conf={'replicaof': '127.0.0.1 %d' % r.port})
        self.addCleanup(replica.kill)
        wait_until(lambda: replica.client().info('replication')['master_link_status'] == 'up',
                   timeout=10, msg='replica in sync')
        c = f.client()
        for i in range(200):
            self.assertEqual(c.rpush('q', i), i + 1)
        # acknowledged means on the replica too
        self.assertEqual(replica.client().llen('q'), 200)

    def step_down_under_wait(self, call):
        """call(client) while ferry's WAIT for it is blocked on the master
        and the master is made a replica (then master again): returns
        call's reply (or exception) and the master's client."""
        r, f = self.start(ferry_conf={'durability': {'replicas_ack': 1,
                                                     'replicas_ack_timeout_ms': 20000,
                                                     'replicas_ack_data_hold_ms': 20000,
                                                     'replicas_ack_hold_ms': 20000},
                                      'upstream': {'hold_timeout_ms': 20000}})
        replica = RedisServer(conf={'replicaof': '127.0.0.1 %d' % r.port})
        self.addCleanup(replica.kill)
        direct = r.client()
        wait_until(lambda: replica.client().info('replication')['master_link_status'] == 'up',
                   timeout=10, msg='replica in sync')
        c = f.client(socket_timeout=30)
        self.assertEqual(c.rpush('q', 'a'), 1)
        replica.sigstop()
        self.addCleanup(replica.sigcont)
        got = {}

        def run():
            try:
                got['reply'] = call(c)
            except Exception as e:  # noqa: BLE001 - the reply under test
                got['reply'] = e
        t = threading.Thread(target=run)
        t.start()
        wait_until(lambda: direct.info('clients')['blocked_clients'] >= 1, timeout=10,
                   msg="ferry's WAIT blocked on the master")
        direct.execute_command('REPLICAOF', '127.0.0.1', replica.port)
        direct.execute_command('REPLICAOF', 'NO', 'ONE')
        replica.sigcont()
        t.join(timeout=40)
        self.assertFalse(t.is_alive(), 'the call was answered')
        return got.get('reply'), direct

    # A master made a replica while ferry's WAIT for a write is blocked on
    # it (a CLUSTER FAILOVER, a planned failover) answers the WAIT
    # "-UNBLOCKED ... instance state changed". That is a switch: the
    # write's fate is decided as for any switch (here: it is on the master,
    # master again, so it is acknowledged once), never passed to the client
    # as -NOREPLICAS (before: "NOREPLICAS ferry: ... Redis refused ferry's
    # WAIT (UNBLOCKED ...)" for a push that had applied).
    def test_master_stepping_down_under_wait_push(self):
        reply, direct = self.step_down_under_wait(lambda c: c.rpush('q', 'b'))
        self.assertEqual(reply, 2)
        self.assertEqual(direct.lrange('q', 0, -1), ['a', 'b'])

    def test_master_stepping_down_under_wait_pop(self):
        reply, direct = self.step_down_under_wait(lambda c: c.lpop('q'))
        self.assertEqual(reply, 'a')
        self.assertEqual(direct.llen('q'), 0)

    def test_master_stepping_down_under_wait_transaction(self):
        def tx(c):
            p = c.pipeline(transaction=True)
            p.rpush('q', 'b')
            p.lpop('q')
            return p.execute()
        reply, direct = self.step_down_under_wait(tx)
        self.assertEqual(reply, [2, 'a'])
        self.assertEqual(direct.lrange('q', 0, -1), ['b'])

if __name__ == '__main__':
    unittest.main()
