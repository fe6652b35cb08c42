"""Redis ACL users (client.auth: redis) in front of a Redis Cluster, checked
against a real 3 masters + 3 replicas cluster (harness ClusterTopology), one
cluster and one ferry per class. The users are made on every node, masters
and replicas (ACL users are per node: a promoted replica must know them).

  1. A user allowed ~app:* only writes app keys on every shard (read back on
     each key's master), and is refused, with the node's own NOPERM words,
     for other keys: single-key commands, MGET / MSET / DEL split across
     slots (the other key is left as it was), a priority pop across slots
     (the other key's item stays), a transaction.
  2. KEYS needs +keys (refused as a node refuses it); a user with it gets
     what the masters list for it; SCAN through ferry lists what the
     masters list for the user.
  3. A wrong password, or an unknown user, is refused with Redis' words.
     Pub/sub as the user: its channels only. With durability.replicas_ack
     the user's writes are confirmed by WAIT on the user's links; a user
     who may not run WAIT is refused at AUTH, as in Sentinel mode. A
     takeover hands the user's client over: it goes on as the user.
     A user missing on one shard's nodes: its client is closed when that
     shard's node refuses it (ferry logs why), nothing written there.
  4. kill -9 of the master that checks AUTH (slot 0's), then of another,
     under the user's writes on keys of every shard, a new client
     authenticating during each: 0 errors, every acknowledged write on the
     promoted replicas.

Run:  python3 -m unittest test_cluster_acl -v        (about 40 s)
Ferry-only (skipped with FERRY_TEST_DIRECT=1); FERRY_TEST_WORKERS=4 runs
its ferry with 4 event loops.
"""
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import unittest

import harness
from harness import ClusterTopology, Ferry, RespError, resp_read_reply, resp_send, wait_until
from test_cluster_keyspace import wait_all_up
from test_takeover import spawn_takeover

HOLD_MS = 30000
TIMEOUT = 30
USERS = (('app', 'apass', ['~app:*', '&app:*', '+@all', '-keys']),
         ('lister', 'lpass', ['~app:*', '+@all']),
         ('nw', 'npass', ['~app:*', '+@all', '-wait']))


def start_ferry(cluster, replicas_ack=None, takeover=None):
    conf = {'cluster': {'nodes': [cluster.seeds()[0]], 'refresh_interval_ms': 200,
                        'timeout_ms': 1000},
            'upstream': {'hold_timeout_ms': HOLD_MS},
            'client': {'auth': 'redis'}}
    if replicas_ack is not None:
        conf['durability'] = {'replicas_ack': replicas_ack}
    if takeover is not None:
        conf['takeover'] = {'socket': takeover}
    return Ferry(None, wait='port', conf=conf)


def make_users(cluster):
    for user, password, rules in USERS:
        cluster.acl_setuser(user, 'reset', 'on', '>' + password, *rules)


def keys_by_master(cluster, prefix, n=2):
    """{master port: [n keys of prefix whose slots it serves]}."""
    per = {m: [] for m in cluster.masters()}
    i = 0
    while min(len(v) for v in per.values()) < n and i < 10000:
        k = '%s%d' % (prefix, i)
        m = cluster.master_of(cluster.keyslot(k))
        if len(per[m]) < n:
            per[m].append(k)
        i += 1
    return per


class Conn:
    """A raw RESP connection (errors come back as RespError, Redis' words)."""

    def __init__(self, port, timeout=TIMEOUT):
        self.s = socket.create_connection(('127.0.0.1', port), timeout=timeout)

    def call(self, *args):
        resp_send(self.s, [a.decode() if isinstance(a, bytes) else str(a) for a in args])
        return resp_read_reply(self.s, TIMEOUT)

    def close(self):
        self.s.close()


@unittest.skipIf(harness.DIRECT, 'ferry-only: client.auth redis in cluster mode')
class ClusterAclTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.cluster = ClusterTopology()
        try:
            make_users(cls.cluster)
            cls.ferry = start_ferry(cls.cluster)
        except BaseException:
            cls.cluster.stop()
            raise
        # until ferry serves the user on every shard
        keys = keys_by_master(cls.cluster, 'app:probe:', 1)
        c = Conn(cls.ferry.port)
        try:
            wait_until(lambda: c.call('AUTH', 'app', 'apass') == 'OK' and
                       all(c.call('SET', k[0], 1) == 'OK' for k in keys.values()),
                       timeout=30, interval=0.2, msg='ferry serving user app on every shard')
        finally:
            c.close()

    @classmethod
    def tearDownClass(cls):
        cls.ferry.stop()
        cls.cluster.stop()

    def login(self, user='app', password='apass'):
        c = Conn(self.ferry.port)
        self.addCleanup(c.close)
        self.assertEqual(c.call('AUTH', user, password), 'OK')
        return c

    def node(self, port, user=None, password=None):
        """A raw connection to a node, as user when given."""
        c = Conn(port)
        self.addCleanup(c.close)
        if user is not None:
            self.assertEqual(c.call('AUTH', user, password), 'OK')
        return c

    def master_of(self, key):
        return self.cluster.master_of(self.cluster.keyslot(key))

    def node_says(self, key, *cmd, user='app', password='apass'):
        """What key's master answers user for cmd (a single-slot command)."""
        return self.node(self.master_of(key), user, password).call(*cmd)

    def test_writes_on_every_shard(self):
        c = self.login()
        per = keys_by_master(self.cluster, 'app:w:')
        self.assertEqual(len(per), 3)
        for port, keys in per.items():
            for k in keys:
                c.call('DEL', k)
                self.assertEqual(c.call('SET', k, 'v-' + k), 'OK')
                self.assertEqual(c.call('GET', k), b'v-' + k.encode())
                self.assertEqual(self.node(port).call('GET', k), b'v-' + k.encode())
                self.assertEqual(c.call('DEL', k), 1)
                self.assertEqual(c.call('LPUSH', k, 'a', 'b'), 2)
                self.assertEqual(self.node(port).call('LLEN', k), 2)
                self.assertEqual(c.call('RPOP', k), b'a')
        # a split across every shard, as the user
        flat = [k for keys in per.values() for k in keys]
        self.assertEqual(c.call('DEL', *flat), len(flat))
        args = [x for k in flat for x in (k, 'm-' + k)]
        self.assertEqual(c.call('MSET', *args), 'OK')
        self.assertEqual(c.call('MGET', *flat), [b'm-' + k.encode() for k in flat])

    def test_other_keys_refused(self):
        c = self.login()
        app = keys_by_master(self.cluster, 'app:r:', 1)
        other = keys_by_master(self.cluster, 'other:r:', 1)
        ports = sorted(app)
        for port in ports:
            self.node(port).call('SET', app[port][0], 'mine')
            self.node(port).call('SET', other[port][0], 'theirs')
        o = other[ports[0]][0]
        refused = self.node_says(o, 'GET', o)
        self.assertIsInstance(refused, RespError)
        self.assertTrue(str(refused).startswith('NOPERM'), refused)
        self.assertEqual(c.call('GET', o), refused)
        self.assertEqual(c.call('SET', o, 'x'), self.node_says(o, 'SET', o, 'x'))
        # splits across slots: the other key's part is refused as its master
        # refuses it, and the reply is that refusal, no data of it
        a0, o1 = app[ports[0]][0], other[ports[1]][0]
        self.assertNotEqual(self.cluster.keyslot(a0), self.cluster.keyslot(o1))
        self.assertEqual(c.call('MGET', a0, o1), self.node_says(o1, 'MGET', o1))
        self.assertEqual(c.call('DEL', a0, o1), self.node_says(o1, 'DEL', o1))
        self.assertEqual(c.call('MSET', a0, 'new', o1, 'new'),
                         self.node_says(o1, 'MSET', o1, 'new'))
        self.assertEqual(c.call('EXISTS', o1, a0), self.node_says(o1, 'EXISTS', o1))
        for port in ports:
            self.assertEqual(self.node(port).call('GET', other[port][0]), b'theirs')
        # a priority pop across slots: the other key's item stays
        a1, o2 = app[ports[1]][0], other[ports[2]][0]
        for k, port in ((a1, ports[1]), (o2, ports[2])):
            self.node(port).call('DEL', k)
        self.node(ports[2]).call('RPUSH', o2, 'item')
        got = c.call('BRPOP', a1, o2, 1)
        self.assertIsInstance(got, RespError)
        self.assertTrue(str(got).startswith('NOPERM'), got)
        self.assertEqual(self.node(ports[2]).call('LRANGE', o2, 0, -1), [b'item'])
        self.node(ports[1]).call('RPUSH', a1, 'mine')
        a2 = app[ports[2]][0]
        self.node(ports[2]).call('DEL', a2)
        self.assertEqual(c.call('BRPOP', a2, a1, 1), [a1.encode(), b'mine'])
        # a transaction: the command is refused when queued, EXEC aborts
        self.assertEqual(c.call('MULTI'), 'OK')
        queued = c.call('SET', o, 'x')
        self.assertIsInstance(queued, RespError)
        self.assertTrue(str(queued).startswith('NOPERM'), queued)
        self.assertTrue(str(c.call('EXEC')).startswith('EXECABORT'))
        self.assertEqual(c.call('MULTI'), 'OK')
        self.assertEqual(c.call('SET', a0, 'tx'), 'QUEUED')
        self.assertEqual(c.call('EXEC'), ['OK'])
        self.assertEqual(self.node(ports[0]).call('GET', a0), b'tx')
        self.assertEqual(self.node(ports[0]).call('GET', other[ports[0]][0]), b'theirs')

    def test_keys_and_scan(self):
        per = keys_by_master(self.cluster, 'app:k:')
        for port, keys in per.items():
            for k in keys:
                self.node(port).call('SET', k, 1)
                self.node(port).call('SET', 'other:' + k, 1)
        masters = sorted(per)
        # KEYS needs +keys: refused as a node refuses it
        c = self.login()
        self.assertEqual(c.call('KEYS', 'app:k:*'),
                         self.node(masters[0], 'app', 'apass').call('KEYS', 'app:k:*'))
        self.assertIsInstance(c.call('KEYS', 'app:k:*'), RespError)
        # with +keys: what every master lists for the user
        lc = self.login('lister', 'lpass')
        want = set()
        for port in masters:
            want |= set(self.node(port, 'lister', 'lpass').call('KEYS', '*k:*'))
        self.assertEqual(set(lc.call('KEYS', '*k:*')), want)
        self.assertTrue({k.encode() for keys in per.values() for k in keys} <= want)
        # SCAN: what every master's SCAN lists for the user
        want = set()
        for port in masters:
            n = self.node(port, 'app', 'apass')
            cursor = b'0'
            for _ in range(10000):
                cursor, batch = n.call('SCAN', cursor, 'MATCH', '*k:*', 'COUNT', 100)
                want |= set(batch)
                if cursor == b'0':
                    break
        got, cursor = set(), b'0'
        for _ in range(10000):
            cursor, batch = c.call('SCAN', cursor, 'MATCH', '*k:*', 'COUNT', 100)
            got |= set(batch)
            if cursor == b'0':
                break
        self.assertEqual(got, want)

    def test_priority_pop_blocks_as_user(self):
        """Every key empty: one blocking pop per shard, as the user; the
        first item wins and the other pops are cancelled (their ids from
        HELLO, which the user may run: no CLIENT ID refused)."""
        per = keys_by_master(self.cluster, 'app:pp:', 1)
        ports = sorted(per)
        keys = [per[p][0] for p in ports]
        for port, k in zip(ports, keys):
            self.node(port).call('DEL', k)
        c = self.login()

        def blocked_as_app(port):
            lst = self.node(port).call('CLIENT', 'LIST').decode()
            return [ln for ln in lst.splitlines() if 'cmd=brpop' in ln and ' user=app ' in ln]
        resp_send(c.s, ['BRPOP'] + keys + ['10'])
        wait_until(lambda: all(blocked_as_app(p) for p in ports), timeout=10, interval=0.05,
                   msg='a BRPOP blocked as app on every master')
        self.node(ports[1]).call('RPUSH', keys[1], 'won')
        self.assertEqual(resp_read_reply(c.s, TIMEOUT), [keys[1].encode(), b'won'])
        wait_until(lambda: not any(blocked_as_app(p) for p in ports), timeout=10,
                   interval=0.05, msg='the other pops cancelled')
        for port, k in zip(ports, keys):
            self.assertEqual(self.node(port).call('LLEN', k), 0)
        self.assertNotIn('CLIENT ID refused', self.ferry.log())

    def test_pubsub_as_user(self):
        port = self.cluster.masters()[0]
        sub = self.login()
        self.assertEqual(sub.call('SUBSCRIBE', 'app:ch'), [b'subscribe', b'app:ch', 1])
        pub = self.login()
        got = {}

        def publish_seen():
            self.assertIsInstance(pub.call('PUBLISH', 'app:ch', 'hello'), int)
            sub.s.settimeout(0.5)
            try:
                got['m'] = resp_read_reply(sub.s, 0.5)
            except (socket.timeout, TimeoutError):
                return False
            finally:
                sub.s.settimeout(TIMEOUT)
            return True
        wait_until(publish_seen, timeout=20, interval=0.1, msg='the message through ferry')
        self.assertEqual(got['m'], [b'message', b'app:ch', b'hello'])
        other = self.login()
        said = self.node(port, 'app', 'apass').call('SUBSCRIBE', 'other:ch')
        self.assertIsInstance(said, RespError)
        self.assertEqual(other.call('SUBSCRIBE', 'other:ch'), said)
        self.assertEqual(pub.call('PUBLISH', 'other:ch', 'x'),
                         self.node(port, 'app', 'apass').call('PUBLISH', 'other:ch', 'x'))

    def test_wait_on_user_links(self):
        f = start_ferry(self.cluster, replicas_ack=1)
        self.addCleanup(f.stop)
        c = Conn(f.port)
        self.addCleanup(c.close)
        wait_until(lambda: c.call('AUTH', 'app', 'apass') == 'OK', timeout=30, interval=0.2,
                   msg='ferry checking user app')
        per = keys_by_master(self.cluster, 'app:wait:', 1)

        def waits():
            return sum(self.cluster.node_by_port(p).client().info('commandstats')
                       .get('cmdstat_wait', {}).get('calls', 0) for p in per)
        before = waits()
        for port, (k,) in per.items():
            self.assertEqual(c.call('SET', k, 'w'), 'OK')
            self.assertEqual(self.node(port).call('GET', k), b'w')
        self.assertGreaterEqual(waits() - before, len(per))
        # a user who may not run WAIT is refused at AUTH, with ferry's words
        n = Conn(f.port)
        self.addCleanup(n.close)
        said = n.call('AUTH', 'nw', 'npass')
        self.assertIsInstance(said, RespError)
        self.assertTrue(str(said).startswith("NOPERM ferry: user 'nw' may not run WAIT"), said)

    def test_takeover_keeps_the_user(self):
        tmp = tempfile.mkdtemp(prefix='ferry-cacl-')
        self.addCleanup(shutil.rmtree, tmp, True)
        sock = os.path.join(tmp, 'takeover.sock')
        f = start_ferry(self.cluster, takeover=sock)
        self.addCleanup(f.stop)
        c = Conn(f.port)
        self.addCleanup(c.close)
        wait_until(lambda: c.call('AUTH', 'app', 'apass') == 'OK', timeout=30, interval=0.2,
                   msg='ferry checking user app')
        per = keys_by_master(self.cluster, 'app:tk:', 1)
        other = keys_by_master(self.cluster, 'other:tk:', 1)
        for port, (k,) in per.items():
            self.assertEqual(c.call('SET', k, 'before'), 'OK')
        new = spawn_takeover(f.config_path, sock, f.out_path)
        old = f.proc
        try:
            old_rc = old.wait(30)
        except subprocess.TimeoutExpired:
            old_rc = None
        f.proc, f.pid = new, new.pid  # the harness stops the new one
        self.assertEqual(old_rc, 0, f.log()[-3000:])
        # the same connection, served by the new process, as the same user
        for port, (k,) in per.items():
            self.assertEqual(c.call('SET', k, 'after'), 'OK')
            self.assertEqual(self.node(port).call('GET', k), b'after')
        for port, (k,) in other.items():
            self.assertEqual(c.call('SET', k, 'x'), self.node_says(k, 'SET', k, 'x'))
        self.assertIsNone(new.poll())

    def test_user_missing_on_a_shard(self):
        """A user an operator made on some nodes only: its client is closed
        when a node of its shard refuses the user (as Redis closes a
        deleted user's connections), and ferry's log says why."""
        missing = self.cluster.master_of(16383)
        self.assertNotEqual(missing, self.cluster.master_of(0))
        skip = [missing] + self.cluster.replicas_of(missing)
        for n in self.cluster.running():
            if n.port not in skip:
                self.cluster.command(n.port, 'ACL', 'SETUSER', 'half', 'reset', 'on', '>hpass',
                                     '~app:*', '+@all')
        # AUTH is checked on the UP shard with the lowest slots: slot 0's,
        # once every shard is UP.
        wait_all_up(self.ferry)
        c = self.login('half', 'hpass')
        k0 = keys_by_master(self.cluster, 'app:half:', 1)[self.cluster.master_of(0)][0]
        self.assertEqual(c.call('SET', k0, 1), 'OK')
        k1 = keys_by_master(self.cluster, 'app:half:', 1)[missing][0]
        with self.assertRaises((ConnectionError, OSError)):
            got = c.call('SET', k1, 1)
            self.fail('answered %r' % (got,))
        wait_until(lambda: "Redis refuses the credentials of user 'half'" in self.ferry.log(),
                   timeout=10, interval=0.1, msg="ferry's log naming user half")
        self.assertEqual(self.node(missing).call('EXISTS', k1), 0)

    def test_wrong_password(self):
        port = self.cluster.masters()[0]
        c = Conn(self.ferry.port)
        self.addCleanup(c.close)
        for user, password in (('app', 'nope'), ('nosuchuser', 'apass')):
            said = self.node(port).call('AUTH', user, password)
            self.assertIsInstance(said, RespError)
            self.assertEqual(c.call('AUTH', user, password), said)
        self.assertTrue(str(c.call('GET', 'app:x')).startswith('NOAUTH'))
        self.assertEqual(c.call('AUTH', 'app', 'apass'), 'OK')
        self.assertEqual(c.call('SET', 'app:x', 1), 'OK')


@unittest.skipIf(harness.DIRECT, 'ferry-only: client.auth redis in cluster mode')
class ClusterAclFailoverTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.cluster = ClusterTopology()
        try:
            make_users(cls.cluster)
            cls.ferry = start_ferry(cls.cluster)
        except BaseException:
            cls.cluster.stop()
            raise

    @classmethod
    def tearDownClass(cls):
        cls.ferry.stop()
        cls.cluster.stop()

    def test_kill_master_user_writes_resume(self):
        """kill -9 of the master of slot 0 (the shard ferry checks AUTH on
        first: the users' links of the AUTH check are on it), then of
        another shard's master, under the user's writes on every shard; a
        new client authenticates during each failover."""
        per = keys_by_master(self.cluster, 'app:f:', 3)
        keys = [k for ks in per.values() for k in ks]
        stop = threading.Event()
        lock = threading.Lock()
        errors, pushed = [], []
        since = {}  # key -> acknowledged pushes since the last kill

        def user_client():
            return self.ferry.client(username='app', password='apass',
                                     socket_timeout=HOLD_MS / 1000 + 10)

        c = user_client()
        wait_until(lambda: all(c.delete(k) >= 0 for k in keys), timeout=30, interval=0.2,
                   msg='ferry serving user app on every shard')
        c.close()

        def producer(idx):
            cl = user_client()
            n = 0
            try:
                while not stop.is_set():
                    k = keys[(n + idx) % len(keys)]
                    v = '%d:%d' % (idx, n)
                    n += 1
                    try:
                        cl.lpush(k, v)
                    except Exception as e:
                        with lock:
                            errors.append('push %s: %r' % (k, e))
                        return
                    with lock:
                        pushed.append((k, v))
                        since[k] = since.get(k, 0) + 1
                    time.sleep(0.005)
            finally:
                cl.close()

        threads = [threading.Thread(target=producer, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        owners = dict(per)
        try:
            wait_until(lambda: len(pushed) >= 100 or errors, timeout=30, interval=0.05,
                       msg='pushes before the kill')
            for victim in (self.cluster.master_of(0), self.cluster.master_of(16383)):
                with lock:
                    since.clear()
                self.cluster.kill_master(victim)
                # a new client authenticates meanwhile (checked by an UP master)
                late = user_client()
                self.assertTrue(late.ping())
                late.close()
                promoted = self.cluster.wait_promoted(victim)
                owners[promoted] = owners.pop(victim)
                # the user's writes on the failed shard resume on the promoted replica
                wait_until(lambda: errors or all(since.get(k, 0) >= 5 for k in owners[promoted]),
                           timeout=HOLD_MS / 1000, interval=0.05,
                           msg="the user's writes on the failed shard resuming")
        finally:
            stop.set()
            for t in threads:
                t.join(HOLD_MS / 1000 + 15)
        self.assertEqual(errors, [])
        lost = []
        for port, ks in owners.items():
            n = self.cluster.node_by_port(port).client(socket_timeout=5)
            for k in ks:
                have = set(n.lrange(k, 0, -1))
                lost += [(k, v) for (pk, v) in pushed if pk == k and v not in have]
            n.close()
        self.assertEqual(lost, [], '%d of %d acknowledged pushes lost' % (len(lost), len(pushed)))
        print('\n  %d acknowledged pushes as user app, 0 errors, %d lost, two masters killed'
              % (len(pushed), len(lost)))


if __name__ == '__main__':
    unittest.main()
