"""Durability that survives a restart (N13): ferry trusts a master only once
INFO persistence shows its AOF on and the initial rewrite finished,
durability.persist_config writes the settings to the node's config file, and
in Sentinel mode every replica Sentinel lists is made durable too, promptly
again after it restarts with appendonly no.

Run: python3 -m unittest test_durability_replicas -v
"""
import re
import socket
import threading
import time
import unittest

from harness import (DIRECT, Ferry, RedisServer, SentinelTopology, resp_read_reply, resp_send,
                     wait_until)
from test_stats import stats_json

ENFORCE_PROMPTLY_S = 3.0   # a restarted replica is durable again within this


def conf_lines(path):
    with open(path) as f:
        return [line.strip() for line in f]


def set_directive(path, name, value):
    """Replace every `name ...` line of a redis.conf (or append one)."""
    lines = conf_lines(path)
    out = [l for l in lines if not re.match(r'%s\s' % re.escape(name), l)]
    out.append('%s %s' % (name, value))
    with open(path, 'w') as f:
        f.write('\n'.join(out) + '\n')


def replica_stats(ferry, port):
    for r in stats_json(ferry.stats_port)['durability']['replicas']:
        if r['addr'] == '127.0.0.1:%d' % port:
            return r
    return None


@unittest.skipIf(DIRECT, 'ferry only')
class MasterTrustTest(unittest.TestCase):
    def test_initial_rewrite_in_progress_is_not_trusted(self):
        # A master with appendonly no and a data set whose initial AOF
        # rewrite is made slow (rdb-key-save-delay applies to the rewrite's
        # RDB preamble): CONFIG SET appendonly yes answers OK at once, but
        # until the rewrite ends a restart would lose what was acknowledged.
        r = RedisServer(conf={'appendonly': 'no', 'appendfsync': 'everysec'})
        self.addCleanup(r.kill)   # SIGTERM is refused during the initial rewrite
        direct = r.client()
        direct.execute_command('DEBUG', 'POPULATE', 50000, 'key', 10)
        direct.config_set('rdb-key-save-delay', 20)
        f = Ferry(r, conf={'upstream': {'hold_timeout_ms': 120000},
                           'durability': {'enforce_interval_ms': 200}}, wait='port')
        self.addCleanup(f.stop)

        # A write sent through ferry meanwhile is held, not forwarded.
        result = {}

        def writer():
            s = socket.create_connection(('127.0.0.1', f.port), timeout=5)
            try:
                resp_send(s, ['SET', 'during', 'x'])
                result['reply'] = resp_read_reply(s, timeout=120)
                # Ferry had forwarded it: the rewrite must be over by now.
                result['rewriting'] = r.client().info('persistence')['aof_rewrite_in_progress']
            except Exception as e:  # noqa: BLE001 - reported below
                result['error'] = e
            finally:
                s.close()
        t = threading.Thread(target=writer, daemon=True)
        t.start()

        # Sample ferry's view, then Redis': ferry UP while the rewrite still
        # runs afterwards would be a violation.
        held_while_rewriting = 0
        reasons = set()
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            st = stats_json(f.stats_port)
            info = direct.info('persistence')
            if info['aof_rewrite_in_progress'] == 1:
                self.assertFalse(st['upstream']['upstream_up'],
                                 'ferry trusted a master during its initial AOF rewrite')
                self.assertFalse(st['durability']['aof_enforced'])
                held_while_rewriting += 1
                reasons.add(st['durability']['durability_last_error'])
            elif info['aof_enabled'] == 1 and info['aof_rewrite_scheduled'] == 0:
                break
            time.sleep(0.05)
        self.assertGreaterEqual(held_while_rewriting, 3,
                                'the rewrite was too short to observe (%d samples)'
                                % held_while_rewriting)
        # The loop whose CONFIG SET started the rewrite knows it is the
        # initial one; with workers another loop may have sent it first and
        # says the rewrite may be the initial one: either way, not trusted.
        self.assertTrue(reasons & {'initial AOF rewrite in progress',
                                   'AOF rewrite in progress (it may be the initial one)'},
                        reasons)

        wait_until(lambda: stats_json(f.stats_port)['upstream']['upstream_up'], timeout=10,
                   msg='ferry to trust the master once its rewrite is done')
        t.join(30)
        self.assertNotIn('error', result)
        self.assertEqual(result.get('reply'), 'OK')
        self.assertEqual(result.get('rewriting'), 0)
        self.assertEqual(direct.get('during'), 'x')
        d = stats_json(f.stats_port)['durability']
        self.assertTrue(d['aof_enforced'])
        self.assertEqual(d['durability_last_error'], '')
        self.assertIn('not trusted yet: initial AOF rewrite in progress', f.log())

    def test_persist_config_rewrites_the_config_file(self):
        r = RedisServer(conf={'appendonly': 'no', 'appendfsync': 'everysec'})
        self.addCleanup(r.kill)
        f = Ferry(r, conf={'durability': {'persist_config': True}})
        self.addCleanup(f.stop)
        wait_until(lambda: stats_json(f.stats_port)['durability']['aof_enforced'], timeout=10,
                   msg='durability enforced and verified')
        lines = conf_lines(r.conf_path)
        self.assertIn('appendonly yes', lines)
        self.assertIn('appendfsync always', lines)
        self.assertNotIn('appendonly no', lines)
        self.assertIn('settings written to the config file', f.log())
        # Restarted from its file without ferry, the node is durable by itself.
        f.stop()
        r.stop()
        r.start(write_conf=False)
        direct = r.client()
        self.assertEqual(direct.config_get('appendonly')['appendonly'], 'yes')
        self.assertEqual(direct.config_get('appendfsync')['appendfsync'], 'always')

    def test_persist_config_refused_is_logged_not_fatal(self):
        # ferry's Redis user may CONFIG SET but not CONFIG REWRITE.
        r = RedisServer(conf={'appendonly': 'no',
                              'user': 'ferry on >pw ~* &* +@all -config|rewrite'})
        self.addCleanup(r.kill)
        f = Ferry(r, conf={'redis': {'username': 'ferry', 'password': 'pw'},
                           'durability': {'persist_config': True}})
        self.addCleanup(f.stop)
        wait_until(lambda: stats_json(f.stats_port)['durability']['aof_enforced'], timeout=10,
                   msg='durability enforced and verified')
        self.assertEqual(f.client().set('k', 'v'), True)
        self.assertIn('CONFIG REWRITE refused by', f.log())
        self.assertIn('appendonly no', conf_lines(r.conf_path))


@unittest.skipIf(DIRECT, 'ferry only')
class ReplicaDurabilityTest(unittest.TestCase):
    def test_restarted_replica_is_made_durable_promptly(self):
        topo = SentinelTopology()
        self.addCleanup(topo.stop)
        # A long period: only the reconnection can explain a prompt fix.
        f = Ferry(None, sentinel=topo, conf={'durability': {'enforce_interval_ms': 60000,
                                                            'persist_config': True}})
        self.addCleanup(f.stop)
        replica = topo.redis[1]

        def all_enforced():
            d = stats_json(f.stats_port)['durability']
            return (d['replicas_known'] == 2 and d['replicas_enforced'] == 2
                    and all(x['enforced'] for x in d['replicas']))
        wait_until(all_enforced, timeout=15, msg='both replicas listed and enforced')
        before = replica_stats(f, replica.port)
        self.assertGreater(before['enforced_since'], 0)
        self.assertEqual(before['last_error'], '')

        # The replica comes back from a config file that says appendonly no.
        replica.kill()
        set_directive(replica.conf_path, 'appendonly', 'no')
        set_directive(replica.conf_path, 'appendfsync', 'everysec')
        restarted_unix = int(time.time())
        replica.start(write_conf=False)
        t0 = time.monotonic()
        direct = replica.client()

        def durable():
            c = direct.config_get('append*')
            return c.get('appendonly') == 'yes' and c.get('appendfsync') == 'always'
        wait_until(durable, timeout=15, interval=0.01, msg='ferry to enforce the replica again')
        took = time.monotonic() - t0
        print('\nrestarted replica enforced again %.0f ms after it answered PING'
              % (took * 1000))
        self.assertLess(took, ENFORCE_PROMPTLY_S)
        self.assertEqual(direct.config_get('no-appendfsync-on-rewrite')
                         ['no-appendfsync-on-rewrite'], 'no')

        def enforced_again():
            x = replica_stats(f, replica.port)
            return x is not None and x['enforced'] and x['enforced_since'] >= restarted_unix - 1
        wait_until(enforced_again, timeout=15, msg='stats to show the replica enforced again')
        self.assertIn('durability: replica 127.0.0.1:%d runs with appendonly no' % replica.port,
                      f.log())
        # persist_config: the replica's own file says so again.
        wait_until(lambda: 'appendonly yes' in conf_lines(replica.conf_path), timeout=5,
                   msg='CONFIG REWRITE on the replica')
        self.assertIn('appendfsync always', conf_lines(replica.conf_path))


if __name__ == '__main__':
    unittest.main()
