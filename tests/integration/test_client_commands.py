"""Every client of ferry has its own id: CLIENT ID, HELLO, CLIENT INFO,
CLIENT LIST name ferry's clients, and CLIENT UNBLOCK / CLIENT KILL act on
them with Redis' replies.

Run: FERRY_TEST_DIRECT=1 python3 -m unittest test_client_commands -v  (plain Redis)
     python3 -m unittest test_client_commands -v                       (through ferry)
     FERRY_TEST_WORKERS=4 python3 -m unittest test_client_commands -v  (4 loops: the
     connections of one test land on different loops)
"""
import socket
import time
import unittest

import harness
from harness import Ferry, RedisServer, RespError, resp_encode, resp_read_reply, wait_until
from modes import FixedMasterMode, SentinelMode, key_prefix, sentinel_first

DIRECT = harness.DIRECT


class Conn:
    """A raw RESP connection: send now, read later (a blocked call)."""

    def __init__(self, ferry):
        self.sock = ferry.raw()

    def send(self, *args):
        self.sock.sendall(resp_encode(*args))

    def read(self, timeout=10.0):
        return resp_read_reply(self.sock, timeout)

    def call(self, *args, timeout=10.0):
        self.send(*args)
        return self.read(timeout)

    def local_addr(self):
        ip, port = self.sock.getsockname()[:2]
        return '%s:%d' % (ip, port)

    def closed(self, timeout=5.0):
        """True once the peer closed this connection."""
        self.sock.settimeout(timeout)
        try:
            return self.sock.recv(1) == b''
        except (ConnectionError, socket.timeout):
            return False

    def close(self):
        self.sock.close()


def parse_line(line):
    """One CLIENT LIST / CLIENT INFO line as a dict."""
    out = {}
    for field in line.split(' '):
        k, _, v = field.partition('=')
        out[k] = v
    return out


def lines_of(reply):
    text = reply.decode() if isinstance(reply, bytes) else reply
    if text.startswith('txt:'):
        text = text[4:]
    return [parse_line(ln) for ln in text.split('\n') if ln]


def unblock_checked(tc, a, b, aid, reason):
    """b unblocks a (CLIENT UNBLOCK aid [reason]): 1 for b; for a, the error
    reply of an ERROR unblock, else the null reply of a timeout."""
    args = ['CLIENT', 'UNBLOCK', aid] + ([reason] if reason else [])
    tc.assertEqual(b.call(*args), 1)
    got = a.read()
    if reason == 'ERROR':
        tc.assertEqual(got, RespError('UNBLOCKED client unblocked via CLIENT UNBLOCK'))
    else:
        tc.assertIsNone(got)


class Checks:
    def conn(self):
        c = Conn(self.ferry)
        self.addCleanup(c.close)
        return c

    def key(self, name):
        return '%s.%s' % (key_prefix(self), name)

    def redis_ids(self):
        """Ids of the clients on the master now (Redis' own)."""
        return {int(d['id']) for d in lines_of(self.master().client().execute_command(
            'CLIENT', 'LIST'))}

    def wait_blocked(self, before):
        """Until a client of the master not among `before` is blocked there
        (not one an earlier test left behind, still being closed)."""
        m = self.master()

        def blocked():
            return any('b' in d['flags'] and int(d['id']) not in before
                       for d in lines_of(m.client().execute_command('CLIENT', 'LIST')))
        wait_until(blocked, 10, msg='no new client blocked on the master')

    def test_every_client_has_its_own_id(self):
        conns = [self.conn() for _ in range(8)]
        ids = [c.call('CLIENT', 'ID') for c in conns]
        self.assertTrue(all(isinstance(i, int) and i > 0 for i in ids), ids)
        self.assertEqual(len(set(ids)), len(ids), ids)
        for c, i in zip(conns, ids):
            hello = c.call('HELLO')
            got = dict(zip(hello[0::2], hello[1::2]))[b'id']
            self.assertEqual(got, i)
            self.assertEqual(c.call('CLIENT', 'ID'), i)  # stable

    def _unblock(self, pop, reason, proto=2):
        k = self.key('l')
        a, b = self.conn(), self.conn()
        if proto == 3:
            a.call('HELLO', '3')
        aid = a.call('CLIENT', 'ID')
        before = self.redis_ids()
        if pop == 'BLPOP':
            a.send('BLPOP', k, 0)
        else:
            a.send('BLMPOP', 0, 1, k, 'RIGHT')
        self.wait_blocked(before)
        unblock_checked(self, a, b, aid, reason)
        # Nothing was left blocked to pop an item for nobody.
        b.call('LPUSH', k, 'x')
        time.sleep(0.2)
        self.assertEqual(b.call('LLEN', k), 1)
        # The unblocked client goes on as before.
        self.assertEqual(a.call('LPOP', k), b'x')
        self.assertEqual(b.call('CLIENT', 'UNBLOCK', aid), 0)

    def test_unblock_default(self):
        self._unblock('BLPOP', None)

    def test_unblock_timeout(self):
        self._unblock('BLPOP', 'TIMEOUT')

    def test_unblock_error(self):
        self._unblock('BLPOP', 'ERROR')

    def test_unblock_blmpop_error(self):
        self._unblock('BLMPOP', 'ERROR')

    def test_unblock_resp3_null(self):
        self._unblock('BLPOP', 'TIMEOUT', proto=3)

    def test_unblock_errors(self):
        c = self.conn()
        myid = c.call('CLIENT', 'ID')
        self.assertEqual(c.call('CLIENT', 'UNBLOCK', 'asd'),
                         RespError('ERR value is not an integer or out of range'))
        self.assertEqual(c.call('CLIENT', 'UNBLOCK', myid, 'SOON'),
                         RespError('ERR CLIENT UNBLOCK reason should be TIMEOUT or ERROR'))
        self.assertEqual(c.call('CLIENT', 'UNBLOCK', myid), 0)
        self.assertEqual(c.call('CLIENT', 'UNBLOCK', 987654321), 0)

    def test_client_list_and_info(self):
        a, b = self.conn(), self.conn()
        aid, bid = a.call('CLIENT', 'ID'), b.call('CLIENT', 'ID')
        b.call('CLIENT', 'SETNAME', 'bee')
        listed = {int(d['id']): d for d in lines_of(a.call('CLIENT', 'LIST'))}
        self.assertIn(aid, listed)
        self.assertIn(bid, listed)
        self.assertEqual(listed[aid]['addr'], a.local_addr())
        self.assertEqual(listed[bid]['addr'], b.local_addr())
        self.assertEqual(listed[bid]['name'], 'bee')
        self.assertEqual(listed[aid]['cmd'], 'client|list')
        for field in ('laddr', 'fd', 'age', 'idle', 'flags', 'db', 'sub', 'psub', 'multi',
                      'user', 'redir', 'resp'):
            self.assertIn(field, listed[aid])
        info = lines_of(a.call('CLIENT', 'INFO'))
        self.assertEqual(len(info), 1)
        self.assertEqual(int(info[0]['id']), aid)
        self.assertEqual(info[0]['addr'], a.local_addr())
        self.assertEqual(info[0]['cmd'], 'client|info')
        one = lines_of(a.call('CLIENT', 'LIST', 'ID', bid, 987654321))
        self.assertEqual([int(d['id']) for d in one], [bid])
        self.assertEqual(a.call('CLIENT', 'LIST', 'ID', 'x'), RespError('ERR Invalid client ID'))
        self.assertEqual(a.call('CLIENT', 'LIST', 'TYPE', 'bogus'),
                         RespError("ERR Unknown client type 'bogus'"))
        self.assertEqual(a.call('CLIENT', 'LIST', 'FOO'), RespError('ERR syntax error'))
        # RESP3: a verbatim string
        a.call('HELLO', '3')
        a.send('CLIENT', 'INFO')
        self.assertEqual(a.sock.recv(5, socket.MSG_PEEK)[:1], b'=')
        self.assertEqual(int(lines_of(a.read())[0]['resp']), 3)

    def test_client_list_type_pubsub(self):
        a, b = self.conn(), self.conn()
        bid = b.call('CLIENT', 'ID')
        b.call('SUBSCRIBE', self.key('ch'))
        ids = [int(d['id']) for d in lines_of(a.call('CLIENT', 'LIST', 'TYPE', 'pubsub'))]
        self.assertEqual(ids, [bid])
        d = lines_of(a.call('CLIENT', 'LIST', 'ID', bid))[0]
        self.assertEqual(d['sub'], '1')
        self.assertIn('P', d['flags'])
        normal = [int(d['id']) for d in lines_of(a.call('CLIENT', 'LIST', 'TYPE', 'normal'))]
        self.assertNotIn(bid, normal)
        self.assertEqual(a.call('CLIENT', 'LIST', 'TYPE', 'master'), b'')

    def test_client_kill_id(self):
        a, b = self.conn(), self.conn()
        aid, bid = a.call('CLIENT', 'ID'), b.call('CLIENT', 'ID')
        self.assertEqual(a.call('CLIENT', 'KILL', 'ID', bid), 1)
        self.assertTrue(b.closed())
        self.assertEqual(a.call('CLIENT', 'KILL', 'ID', bid), 0)
        self.assertEqual(a.call('CLIENT', 'KILL', 'ID', aid), 0)  # SKIPME yes
        self.assertEqual(a.call('CLIENT', 'KILL', 'ID', 0),
                         RespError('ERR client-id should be greater than 0'))
        self.assertEqual(a.call('CLIENT', 'KILL', 'ID', aid, 'SKIPME', 'maybe'),
                         RespError('ERR syntax error'))
        self.assertEqual(a.call('CLIENT', 'KILL', 'TYPE', 'bogus'),
                         RespError("ERR Unknown client type 'bogus'"))
        self.assertEqual(a.call('CLIENT', 'KILL', 'ID', aid, 'SKIPME', 'no'), 1)
        self.assertTrue(a.closed())

    def test_client_kill_addr(self):
        a, b, c = self.conn(), self.conn(), self.conn()
        self.assertEqual(a.call('CLIENT', 'KILL', 'ADDR', b.local_addr()), 1)
        self.assertTrue(b.closed())
        self.assertEqual(a.call('CLIENT', 'KILL', c.local_addr()), 'OK')  # the old form
        self.assertTrue(c.closed())
        self.assertEqual(a.call('CLIENT', 'KILL', c.local_addr()),
                         RespError('ERR No such client'))
        self.assertEqual(a.call('PING'), 'PONG')

    def test_client_kill_laddr_and_user(self):
        a, b, c = self.conn(), self.conn(), self.conn()
        b.call('PING')
        c.call('PING')
        laddr = lines_of(a.call('CLIENT', 'INFO'))[0]['laddr']
        self.assertEqual(laddr, '127.0.0.1:%d' % self.ferry.port)
        # Every client but a (SKIPME yes) on that address: b and c at least.
        self.assertGreaterEqual(a.call('CLIENT', 'KILL', 'LADDR', laddr, 'USER', 'default'), 2)
        self.assertTrue(b.closed())
        self.assertTrue(c.closed())
        self.assertEqual(a.call('PING'), 'PONG')

    def test_kill_blocked_client_leaves_nothing_blocked(self):
        k = self.key('l')
        a, b = self.conn(), self.conn()
        aid = a.call('CLIENT', 'ID')
        before = self.redis_ids()
        a.send('BLPOP', k, 0)
        self.wait_blocked(before)
        self.assertEqual(b.call('CLIENT', 'KILL', 'ID', aid), 1)
        self.assertTrue(a.closed())
        m = self.master()
        wait_until(lambda: int(m.client().info('clients')['blocked_clients']) == 0, 10,
                   msg='the killed client left a blocked call on Redis')
        b.call('LPUSH', k, 'x')
        self.assertEqual(b.call('LLEN', k), 1)


class SentinelClientCommands(SentinelMode, Checks, unittest.TestCase):
    pass


class FixedMasterClientCommands(FixedMasterMode, Checks, unittest.TestCase):
    pass


@unittest.skipIf(DIRECT, 'ferry holds the call; plain Redis has no backlog')
class HeldClientUnblock(unittest.TestCase):
    """A blocked call ferry holds for lack of a master is unblocked by
    ferry itself."""

    def setUp(self):
        self.redis = RedisServer()
        self.addCleanup(self.redis.stop)
        self.ferry = Ferry(self.redis, conf={'upstream': {'hold_timeout_ms': 30000}})
        self.addCleanup(self.ferry.stop)

    def _held(self, reason):
        a, b = Conn(self.ferry), Conn(self.ferry)
        self.addCleanup(a.close)
        self.addCleanup(b.close)
        aid = a.call('CLIENT', 'ID')
        self.redis.stop()
        a.send('BLPOP', 'held.l', 0)
        time.sleep(0.3)
        unblock_checked(self, a, b, aid, reason)
        self.assertEqual(b.call('CLIENT', 'UNBLOCK', aid), 0)

    def test_held_unblock_timeout(self):
        self._held(None)

    def test_held_unblock_error(self):
        self._held('ERROR')


@unittest.skipIf(DIRECT, 'plain Redis has no fallback store')
class StoreClientUnblock(unittest.TestCase):
    """A blocking pop waiting on the fallback store (no Redis at all) is
    unblocked by ferry, and the pop takes nothing from the store."""

    def setUp(self):
        from test_fallback import fallback_conf, state
        self.redis = RedisServer()
        self.addCleanup(self.redis.kill)
        path = self.redis.dir + '/ferry-fallback.db'
        self.ferry = Ferry(self.redis, conf=fallback_conf(path))
        self.addCleanup(self.ferry.kill)
        self.redis.kill()
        wait_until(lambda: state(self.ferry) == 'DOWN', timeout=10, msg='master view DOWN')

    def _store(self, reason):
        a, b = Conn(self.ferry), Conn(self.ferry)
        self.addCleanup(a.close)
        self.addCleanup(b.close)
        aid = a.call('CLIENT', 'ID')
        self.assertEqual(b.call('LPUSH', 'other', 'o'), 1)  # served by the store
        a.send('BRPOP', 'store.l', 0)
        time.sleep(0.5)
        unblock_checked(self, a, b, aid, reason)
        # Nothing is left waiting to pop the next push for nobody.
        self.assertEqual(b.call('LPUSH', 'store.l', 'x'), 1)
        self.assertEqual(a.call('RPOP', 'store.l'), b'x')

    def test_store_unblock_timeout(self):
        self._store('TIMEOUT')

    def test_store_unblock_error(self):
        self._store('ERROR')


@unittest.skipIf(DIRECT, 'plain Redis has one thread')
class ClientJobsAcrossLoops(unittest.TestCase):
    """CLIENT LIST / KILL from clients on four loops at once: each answer
    is put together on the asking client's loop from every loop's part,
    complete, and comes back (a part merged on the wrong thread once lost
    counts and left the asker waiting for ever)."""

    def setUp(self):
        self.redis = RedisServer()
        self.addCleanup(self.redis.stop)
        self.ferry = Ferry(self.redis, conf={'workers': 4})
        self.addCleanup(self.ferry.stop)

    def test_concurrent_lists_are_whole(self):
        import threading
        conns = [Conn(self.ferry) for _ in range(8)]
        for c in conns:
            self.addCleanup(c.close)
        ids = {c.call('CLIENT', 'ID') for c in conns}
        bad = []

        def worker(c):
            try:
                for _ in range(300):
                    got = {int(d['id']) for d in lines_of(c.call('CLIENT', 'LIST', timeout=5.0))}
                    if got != ids:
                        bad.append(sorted(got ^ ids))
                        return
            except Exception as e:  # a timeout or a garbled answer
                bad.append(repr(e)[:300])
                return
        threads = [threading.Thread(target=worker, args=(c,)) for c in conns]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        self.assertFalse(any(t.is_alive() for t in threads))
        self.assertEqual(bad, [])
        # Kills from every loop at once: each victim closed, each count 1.
        victims = [Conn(self.ferry) for _ in range(8)]
        vids = [v.call('CLIENT', 'ID') for v in victims]
        for c, vid in zip(conns, vids):
            c.send('CLIENT', 'KILL', 'ID', vid)
        self.assertEqual([c.read(5.0) for c in conns], [1] * 8)
        self.assertTrue(all(v.closed() for v in victims))
        self.assertEqual(conns[0].call('PING'), 'PONG')


load_tests = sentinel_first

if __name__ == '__main__':
    unittest.main()
