"""ACL identities through ferry (client.auth redis), in Sentinel mode and with
a fixed master: AUTH user pass and HELLO 3 AUTH user pass are checked by
Redis' ACL, and the client's commands then run as that user on links of
that user alone, so key patterns, command categories, Redis' own error
texts and ACL LOG apply as on Redis; users never get each other's (or
ferry's) permissions; after a kill -9 failover the user's links are opened
again, as the user, on the new master. The users are created with ACL
SETUSER on every Redis node (ACL is not replicated)."""

import socket
import threading
import unittest

from harness import Ferry, RespError, resp_encode, resp_read_reply, resp_send, wait_until
from modes import FixedMasterMode, SentinelMode, key_prefix, sentinel_first

NOKEY = RespError('NOPERM this user has no permissions to access one of the keys used as '
                  'arguments')
WRONGPASS = RespError('WRONGPASS invalid username-password pair or user is disabled.')
NOAUTH = RespError('NOAUTH Authentication required.')
TIMEOUT = 30


def nocmd(name):
    return RespError("NOPERM this user has no permissions to run the '%s' command" % name)


class AclSetup:
    """Users on every node: qu (queue:*), ou (other:*), both +@list (and
    +wait where ferry runs WAIT after writes: replicas_ack >= 1, the default
    with Sentinel); nw like qu but never +wait."""

    WAIT = False  # ferry runs WAIT after writes in this mode

    @classmethod
    def nodes(cls):
        topo = getattr(cls, 'topo', None)
        return [r for r in (topo.redis if topo is not None else [cls.redis]) if r.running()]

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        wait = ['+wait'] if cls.WAIT else []
        for node in cls.nodes():
            c = node.client()
            c.execute_command('ACL', 'SETUSER', 'qu', 'reset', 'on', '>qpass', '~queue:*',
                              '+@list', *wait)
            c.execute_command('ACL', 'SETUSER', 'ou', 'reset', 'on', '>opass', '~other:*',
                              '+@list', *wait)
            c.execute_command('ACL', 'SETUSER', 'nw', 'reset', 'on', '>npass', '~queue:*',
                              '+@list')
            # kept in the node's config file, so a restarted node has them
            c.execute_command('CONFIG', 'REWRITE')
            c.close()

    def setUp(self):
        # not the mode's default ferry: this one has Redis check AUTH
        conf = dict(self.FERRY_CONF)
        if isinstance(self, SentinelMode):
            self.ferry = Ferry(None, conf=conf, sentinel=self.topo)
        else:
            self.ferry = Ferry(self.redis, conf=conf)
        self.addCleanup(self.ferry.stop)

    FERRY_CONF = {'client': {'auth': 'redis'}}

    def raw(self):
        s = self.ferry.raw(timeout=TIMEOUT)
        self.addCleanup(s.close)
        return s

    def call(self, s, *args):
        resp_send(s, list(args))
        return resp_read_reply(s, TIMEOUT)

    def login(self, user, password):
        s = self.raw()
        self.assertEqual(self.call(s, 'AUTH', user, password), 'OK')
        return s

    def pipeline(self, s, *cmds):
        resp_send(s, b''.join(resp_encode(*c) for c in cmds))
        return [resp_read_reply(s, TIMEOUT) for _ in cmds]


class AclChecks(AclSetup):
    def test_user_limits_apply_as_on_redis(self):
        p = key_prefix(self)
        s = self.login('qu', 'qpass')
        self.assertEqual(self.call(s, 'LPUSH', 'queue:%s:a' % p, 'x'), 1)
        self.assertEqual(self.call(s, 'LPUSH', '%s:b' % p, 'x'), NOKEY)
        self.assertEqual(self.call(s, 'SET', 'queue:%s:c' % p, 'x'), nocmd('set'))
        # ferry's own credentials never serve the user
        self.assertEqual(self.call(s, 'CONFIG', 'GET', 'maxmemory'), nocmd('config|get'))
        self.assertEqual(self.call(s, 'RPOP', 'queue:%s:a' % p), b'x')
        self.assertEqual(self.call(s, 'LPUSH', 'queue:%s:a' % p, 'y'), 1)
        m = self.master().client()
        self.assertEqual(m.lrange('queue:%s:a' % p, 0, -1), ['y'])
        self.assertEqual(m.exists('%s:b' % p, 'queue:%s:c' % p), 0)

    def test_scripts_run_as_the_user(self):
        # A script runs on a link lent for its call: the user's own.
        p = key_prefix(self)
        s = self.login('qu', 'qpass')
        script = "return redis.call('LPUSH', KEYS[1], 'x')"
        self.assertEqual(self.call(s, 'EVAL', script, 1, 'queue:%s' % p), nocmd('eval'))
        self.assertEqual(self.call(s, 'FCALL_RO', 'nosuch', 0), nocmd('fcall_ro'))
        self.assertEqual(self.call(s, 'LPUSH', 'queue:%s' % p, 'y'), 1)
        self.assertEqual(self.master().client().lrange('queue:%s' % p, 0, -1), ['y'])

    def test_select_is_checked_by_redis(self):
        """ferry answers SELECT 0 itself for its own clients (shared links
        are in db 0); a Redis user's SELECT, 0 included, is Redis' to allow,
        with Redis' own error, and a refused SELECT changes nothing."""
        p = key_prefix(self)
        s = self.login('qu', 'qpass')
        direct = socket.create_connection(('127.0.0.1', self.master().port), timeout=TIMEOUT)
        self.addCleanup(direct.close)
        self.assertEqual(self.call(direct, 'AUTH', 'qu', 'qpass'), 'OK')
        for db in ('0', '3'):
            self.assertEqual(self.call(direct, 'SELECT', db), nocmd('select'))  # Redis itself
            self.assertEqual(self.pipeline(s, ('SELECT', db), ('LPUSH', 'queue:%s' % p, db)),
                             [nocmd('select'), 1 if db == '0' else 2])
        self.assertEqual(self.master().client().lrange('queue:%s' % p, 0, -1), ['3', '0'])
        # a user allowed to SELECT gets its OK, and its db, from Redis
        for node in self.nodes():
            node.client().execute_command('ACL', 'SETUSER', 'su', 'reset', 'on', '>spass',
                                          '~queue:*', '+@list', '+select',
                                          *(['+wait'] if self.WAIT else []))
        t = self.login('su', 'spass')
        self.assertEqual(self.pipeline(t, ('SELECT', '3'), ('LPUSH', 'queue:%s:s' % p, 'in3'),
                                       ('SELECT', '0'), ('LPUSH', 'queue:%s:s' % p, 'in0')),
                         ['OK', 1, 'OK', 1])
        self.assertEqual(self.master().client(db=3).lrange('queue:%s:s' % p, 0, -1), ['in3'])
        self.assertEqual(self.master().client().lrange('queue:%s:s' % p, 0, -1), ['in0'])

    def test_wrong_password_gets_redis_error(self):
        p = key_prefix(self)
        s = self.raw()
        self.assertEqual(self.call(s, 'AUTH', 'qu', 'wrong'), WRONGPASS)
        self.assertEqual(self.call(s, 'AUTH', 'nosuchuser', 'qpass'), WRONGPASS)
        self.assertEqual(self.call(s, 'LPUSH', 'queue:%s' % p, 'x'), NOAUTH)
        self.assertEqual(self.call(s, 'PING'), NOAUTH)
        # a failed AUTH leaves an authenticated connection as it was
        self.assertEqual(self.call(s, 'AUTH', 'qu', 'qpass'), 'OK')
        self.assertEqual(self.call(s, 'AUTH', 'ou', 'wrong'), WRONGPASS)
        self.assertEqual(self.call(s, 'LPUSH', 'queue:%s' % p, 'x'), 1)
        self.assertEqual(self.call(s, 'LPUSH', 'other:%s' % p, 'x'), NOKEY)
        self.assertEqual(self.master().client().exists('other:%s' % p), 0)
        # the error comes from Redis: it logged the failed attempt
        log = self.master().client().acl_log()
        self.assertTrue(any(e.get('reason') == 'auth' and e.get('username') == 'ou'
                            for e in log), log)

    def test_users_do_not_leak_permissions(self):
        p = key_prefix(self)
        rounds = 150
        results = {}

        def run(user, password):
            s = self.login(user, password)
            got = []
            for i in range(rounds):
                got.append(self.pipeline(s, ('LPUSH', 'queue:%s' % p, i),
                                         ('LPUSH', 'other:%s' % p, i)))
            results[user] = got

        threads = [threading.Thread(target=run, args=u)
                   for u in (('qu', 'qpass'), ('ou', 'opass'))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        self.assertEqual(sorted(results), ['ou', 'qu'])
        for i, (q, o) in enumerate(zip(results['qu'], results['ou'])):
            self.assertIsInstance(q[0], int, (i, q))
            self.assertEqual(q[1], NOKEY, (i, q))
            self.assertEqual(o[0], NOKEY, (i, o))
            self.assertIsInstance(o[1], int, (i, o))
        m = self.master().client()
        self.assertEqual(m.llen('queue:%s' % p), rounds)
        self.assertEqual(m.llen('other:%s' % p), rounds)
        # one connection changing user, pipelined: each command runs as the
        # user authenticated before it
        s = self.raw()
        got = self.pipeline(s, ('LPUSH', 'queue:%s' % p, 'z'), ('AUTH', 'qu', 'qpass'),
                            ('LPUSH', 'queue:%s:2' % p, 'a'), ('LPUSH', 'other:%s:2' % p, 'a'),
                            ('AUTH', 'ou', 'opass'), ('LPUSH', 'queue:%s:2' % p, 'b'),
                            ('LPUSH', 'other:%s:2' % p, 'b'), ('AUTH', 'qu', 'bad'),
                            ('LPUSH', 'other:%s:2' % p, 'c'))
        self.assertEqual(got, [NOAUTH, 'OK', 1, NOKEY, 'OK', NOKEY, 1, WRONGPASS, 2])
        self.assertEqual(m.lrange('queue:%s:2' % p, 0, -1), ['a'])
        self.assertEqual(m.lrange('other:%s:2' % p, 0, -1), ['c', 'b'])
        # a user's dedicated link (a blocking pop) is the user's too
        s = self.login('ou', 'opass')
        self.assertEqual(self.call(s, 'BLPOP', 'queue:%s' % p, '0.1'), NOKEY)
        self.assertEqual(self.call(s, 'BLPOP', 'other:%s:2' % p, '0.1'),
                         [b'other:%s:2' % p.encode(), b'c'])
        s = self.login('qu', 'qpass')
        self.assertEqual(self.call(s, 'BLPOP', 'other:%s:2' % p, '0.1'), NOKEY)

    def test_hello3_auth(self):
        p = key_prefix(self)
        s = self.raw()
        got = self.pipeline(s, ('HELLO', '3', 'AUTH', 'qu', 'qpass'),
                            ('LPUSH', 'queue:%s' % p, 'x'), ('LPUSH', '%s:b' % p, 'x'),
                            ('LRANGE', 'queue:%s' % p, '0', '-1'))
        hello = got[0]
        self.assertIsInstance(hello, dict, got)
        self.assertEqual(hello[b'proto'], 3)
        self.assertTrue(hello[b'proxy'].startswith(b'ferry'), hello)
        self.assertEqual(got[1:], [1, NOKEY, [b'x']])
        s2 = self.raw()
        self.assertEqual(self.call(s2, 'HELLO', '3', 'AUTH', 'qu', 'wrong'), WRONGPASS)
        self.assertEqual(self.call(s2, 'LPUSH', 'queue:%s' % p, 'y'), NOAUTH)
        # HELLO 2 AUTH as another user on the RESP3 connection
        hello = self.call(s, 'HELLO', '2', 'AUTH', 'ou', 'opass')
        self.assertIn(b'proto', hello)
        self.assertEqual(self.call(s, 'LPUSH', 'queue:%s' % p, 'y'), NOKEY)
        self.assertEqual(self.call(s, 'LPUSH', 'other:%s' % p, 'y'), 1)

    def test_acl_log_names_the_user(self):
        p = key_prefix(self)
        m = self.master().client()
        m.execute_command('ACL', 'LOG', 'RESET')
        s = self.login('qu', 'qpass')
        self.assertEqual(self.call(s, 'LPUSH', '%s:b' % p, 'x'), NOKEY)
        self.assertEqual(self.call(s, 'GET', 'queue:%s' % p), nocmd('get'))
        log = m.acl_log()
        self.assertTrue(any(e.get('username') == 'qu' and e.get('reason') == 'key'
                            and e.get('object') == '%s:b' % p for e in log), log)
        self.assertTrue(any(e.get('username') == 'qu' and e.get('reason') == 'command'
                            and e.get('object') == 'get' for e in log), log)

    def test_wait_permission(self):
        p = key_prefix(self)
        s = self.raw()
        r = self.call(s, 'AUTH', 'nw', 'npass')
        if self.WAIT:
            # ferry runs WAIT after the user's writes: a user who may not
            # run it is refused at AUTH, naming ferry and what it needs
            self.assertIsInstance(r, RespError)
            self.assertTrue(str(r).startswith('NOPERM ferry:'), r)
            self.assertIn('+wait', str(r))
            self.assertEqual(self.call(s, 'LPUSH', 'queue:%s' % p, 'x'), NOAUTH)
        else:
            self.assertEqual(r, 'OK')
            self.assertEqual(self.call(s, 'LPUSH', 'queue:%s' % p, 'x'), 1)
        # the users that may run WAIT get their writes confirmed as usual
        s = self.login('qu', 'qpass')
        self.assertEqual(self.call(s, 'LPUSH', 'queue:%s:ok' % p, 'x'), 1)

    def test_ferry_auth_default_unchanged(self):
        # client.auth ferry (the default): AUTH user pass is ferry's to check
        f = Ferry(None, sentinel=self.topo) if isinstance(self, SentinelMode) \
            else Ferry(self.redis)
        self.addCleanup(f.stop)
        s = f.raw(timeout=TIMEOUT)
        self.addCleanup(s.close)
        resp_send(s, ['AUTH', 'qu', 'qpass'])
        self.assertEqual(resp_read_reply(s, TIMEOUT),
                         RespError('ERR AUTH <password> called without any password configured '
                                   'for the default user. Are you sure your configuration is '
                                   'correct?'))
        resp_send(s, ['SET', '%s:k' % key_prefix(self), 'v'])
        self.assertEqual(resp_read_reply(s, TIMEOUT), 'OK')


class AclFailoverChecks(AclSetup):
    """The user's permissions on the master that replaces the lost one."""

    def kill_master(self):
        raise NotImplementedError

    def test_permissions_survive_kill9(self):
        p = key_prefix(self)
        s = self.login('qu', 'qpass')
        b = self.login('qu', 'qpass')
        self.assertEqual(self.call(s, 'LPUSH', 'queue:%s' % p, 'before'), 1)
        resp_send(b, ['BLPOP', 'queue:%s:wake' % p, '0'])
        old = self.master()
        self.kill_master()
        # held across the failover, then run as the user on the new master
        self.assertEqual(self.call(s, 'LPUSH', 'queue:%s' % p, 'after'), 2)
        self.assertEqual(self.call(s, 'LPUSH', '%s:b' % p, 'x'), NOKEY)
        self.assertEqual(self.call(s, 'SET', 'queue:%s:c' % p, 'x'), nocmd('set'))
        new = self.master()
        if isinstance(self, SentinelMode):
            self.assertNotEqual(new.port, old.port)
        m = new.client()
        self.assertEqual(m.lrange('queue:%s' % p, 0, -1), ['after', 'before'])
        log = m.acl_log()
        self.assertTrue(any(e.get('username') == 'qu' and e.get('object') == '%s:b' % p
                            for e in log), log)
        # the blocked pop was re-issued as the user: a push wakes it
        self.assertEqual(self.call(s, 'LPUSH', 'queue:%s:wake' % p, 'w'), 1)
        self.assertEqual(resp_read_reply(b, TIMEOUT), [b'queue:%s:wake' % p.encode(), b'w'])
        # new clients authenticate against the new master
        self.assertEqual(self.call(self.raw(), 'AUTH', 'qu', 'bad'), WRONGPASS)
        o = self.login('ou', 'opass')
        self.assertEqual(self.call(o, 'LPUSH', 'queue:%s' % p, 'x'), NOKEY)


class SentinelAcl(AclChecks, SentinelMode, unittest.TestCase):
    WAIT = True


class FixedMasterAcl(AclChecks, FixedMasterMode, unittest.TestCase):
    WAIT = False


class SentinelAclFailover(AclFailoverChecks, SentinelMode, unittest.TestCase):
    WAIT = True

    def kill_master(self):
        old = self.topo.master()
        old.kill()
        self.topo.wait_failover(old.port, timeout=TIMEOUT)


class FixedMasterAclFailover(AclFailoverChecks, FixedMasterMode, unittest.TestCase):
    WAIT = False
    FERRY_CONF = {'client': {'auth': 'redis'},
                  'fallback': {'path': 'fallback.db', 'after_ms': 300},
                  'upstream': {'hold_timeout_ms': 1500}}

    def kill_master(self):
        self.redis.kill()
        self.redis.start(write_conf=False)

    def test_no_master_to_check_credentials(self):
        """With no Redis, AUTH cannot be checked: ferry says so rather than
        accept; an ACL user's write is not taken by the fallback store."""
        p = key_prefix(self)
        s = self.login('qu', 'qpass')
        self.redis.kill()
        self.addCleanup(lambda: self.redis.running() or self.redis.start(write_conf=False))
        wait_until(lambda: b'"upstream_state":"DOWN"' in self.ferry_stats(), timeout=TIMEOUT,
                   msg='master view DOWN')
        r = self.call(self.raw(), 'AUTH', 'qu', 'qpass')
        self.assertIsInstance(r, RespError)
        self.assertTrue(str(r).startswith('ERR ferry: cannot check the credentials'), r)
        r = self.call(s, 'LPUSH', 'queue:%s' % p, 'x')
        self.assertIsInstance(r, RespError)
        self.assertTrue(str(r).startswith('TRYAGAIN ferry:'), r)
        self.redis.start(write_conf=False)
        self.assertEqual(self.call(s, 'LPUSH', 'queue:%s' % p, 'y'), 1)
        self.assertEqual(self.master().client().lrange('queue:%s' % p, 0, -1), ['y'])

    def ferry_stats(self):
        import socket
        c = socket.create_connection(('127.0.0.1', self.ferry.stats_port), timeout=5)
        try:
            out = b''
            while True:
                chunk = c.recv(65536)
                if not chunk:
                    return out.replace(b' ', b'')
                out += chunk
        finally:
            c.close()


load_tests = sentinel_first

if __name__ == '__main__':
    unittest.main()
