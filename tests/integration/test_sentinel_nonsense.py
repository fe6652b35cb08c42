"""A sentinel that says nonsense must neither crash ferry nor make it use a
wrong master.

FakeSentinel is a small threaded TCP server on a loopback port that speaks
just enough RESP to read ferry's commands (AUTH, PSUBSCRIBE *, SENTINEL
MASTER <name>, SENTINEL SENTINELS <name>) and answer them as a test scripts
it. Against it:

  1. SENTINEL MASTER answered with garbage of every kind (errors, wrong
     types, broken addresses, truncated or invalid RESP, a close, silence):
     ferry stays up, holds requests and answers them -TRYAGAIN after
     upstream.hold_timeout_ms, no write reaches any Redis, and its log names
     the sentinel.
  2. Garbage on the event (pub/sub) connection: ferry survives and keeps
     serving the master the sentinel names.
  3. Three fake sentinels: a 2-of-3 majority naming a real Redis wins over a
     third one that names another address or talks nonsense; a three-way
     split names no master at all.
  4. A node the sentinels name that says ROLE slave is never used.

Run:  python3 -m unittest test_sentinel_nonsense -v        (about a minute)

Cases once found broken are kept with the reason in their docstring (ferry
aborted inside hiredis' async layer, or trusted a sloppily parsed port or
address, or counted one sentinel under several addresses).
Ferry-only (skipped with FERRY_TEST_DIRECT=1).
"""
import select
import socket
import threading
import time
import unittest

import harness
from harness import (Ferry, RedisServer, RespError, free_port, resp_read_reply, resp_send,
                     wait_until)

MASTER = 'mq'
HOLD_MS = 800
TRYAGAIN_PREFIX = 'TRYAGAIN ferry: no master for'

FERRY_CONF = {
    'upstream': {'hold_timeout_ms': HOLD_MS, 'connect_timeout_ms': 500},
    # the real Redis here has no replica: don't wait for one on each write
    'durability': {'replicas_ack': 0},
}

# --------------------------------------------------------------------------
# RESP building blocks for scripted replies


class Err(str):
    """An error reply (-<text>)."""


class Raw(bytes):
    """Bytes sent verbatim."""


def enc(v):
    """RESP2 encoding of nested lists / str / bytes / int / None / Err / Raw."""
    if isinstance(v, Raw):
        return bytes(v)
    if isinstance(v, Err):
        return b'-' + v.encode() + b'\r\n'
    if v is None:
        return b'$-1\r\n'
    if isinstance(v, bool):
        v = int(v)
    if isinstance(v, int):
        return b':%d\r\n' % v
    if isinstance(v, str):
        v = v.encode()
    if isinstance(v, (bytes, bytearray)):
        return b'$%d\r\n%s\r\n' % (len(v), bytes(v))
    if isinstance(v, (list, tuple)):
        return b'*%d\r\n' % len(v) + b''.join(enc(x) for x in v)
    raise TypeError('cannot encode %r' % (v,))


def master_fields(ip, port, epoch=0, flags='master', name=MASTER):
    """A SENTINEL MASTER reply as redis-sentinel 7 shapes it (flat pairs)."""
    return [
        'name', name, 'ip', ip, 'port', str(port), 'runid', 'f' * 40, 'flags', flags,
        'link-pending-commands', '0', 'link-refcount', '1', 'last-ping-sent', '0',
        'last-ok-ping-reply', '100', 'last-ping-reply', '100',
        'down-after-milliseconds', '1000', 'info-refresh', '500', 'role-reported', 'master',
        'role-reported-time', '10000', 'config-epoch', str(epoch), 'num-slaves', '0',
        'num-other-sentinels', '2', 'quorum', '2', 'failover-timeout', '5000',
        'parallel-syncs', '1',
    ]


def replace_field(fields, key, value):
    out = list(fields)
    i = out.index(key)
    out[i + 1] = value
    return out


def drop_fields(fields, *keys):
    out = []
    for i in range(0, len(fields), 2):
        if fields[i] not in keys:
            out += fields[i:i + 2]
    return out


# Actions a script may return instead of a reply
CLOSE = 'close'      # close the connection at once
SILENT = 'silent'    # read the command, never answer


class Partial:
    """Send data, wait delay seconds, then close the connection."""

    def __init__(self, data, delay=0.2):
        self.data = data
        self.delay = delay


# --------------------------------------------------------------------------
# the fake sentinel


class FakeSentinel:
    """A threaded TCP server on 127.0.0.1:<free port> playing a sentinel.

    master(args) / sentinels(args): scripts for SENTINEL MASTER / SENTINEL
    SENTINELS; each returns a value for enc(), a Raw, CLOSE, SILENT or a
    Partial (a non-callable is used as the reply itself). on_accept: None or
    CLOSE (close every new connection before reading anything). Connections
    that sent PSUBSCRIBE are event connections; publish() writes raw bytes to
    all of them."""

    def __init__(self, master=None, sentinels=None, on_accept=None):
        self.master = master if master is not None else Err('ERR No such master with that name')
        self.sentinels = sentinels if sentinels is not None else []
        self.on_accept = on_accept
        self.lock = threading.Lock()
        self.commands = []        # [(connection number, [args as str])]
        self.accepted = 0
        self.conns = []
        self.subscribers = []
        self.stopping = False
        self.lsock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.lsock.bind(('127.0.0.1', 0))
        self.lsock.listen(64)
        self.port = self.lsock.getsockname()[1]
        self.threads = []
        t = threading.Thread(target=self._accept_loop, name='fake-sentinel-%d' % self.port,
                             daemon=True)
        t.start()
        self.threads.append(t)

    @property
    def address(self):
        return '127.0.0.1:%d' % self.port

    # ---- scripts

    def _script(self, script, args):
        return script(args) if callable(script) else script

    def _answer(self, args):
        cmd = [a.upper() for a in args[:2]]
        if cmd[:1] == ['AUTH']:
            return Raw(b'+OK\r\n')
        if cmd == ['SENTINEL', 'MASTER']:
            return self._script(self.master, args)
        if cmd == ['SENTINEL', 'SENTINELS']:
            return self._script(self.sentinels, args)
        if cmd[:1] == ['PING']:
            return Raw(b'+PONG\r\n')
        return Err('ERR unknown command')

    # ---- queries

    def count(self, *prefix):
        """How many commands received start with prefix (case-insensitive)."""
        want = [p.upper() for p in prefix]
        with self.lock:
            return sum(1 for _, a in self.commands if [x.upper() for x in a[:len(want)]] == want)

    def n_subscribers(self):
        with self.lock:
            return len(self.subscribers)

    def publish(self, data):
        """Write raw bytes (or an enc()-able value) to every event connection."""
        if not isinstance(data, (bytes, bytearray)):
            data = enc(data)
        with self.lock:
            subs = list(self.subscribers)
        for s in subs:
            try:
                s.sendall(data)
            except OSError:
                pass

    def pmessage(self, channel, payload, pattern='*'):
        self.publish(['pmessage', pattern, channel, payload])

    # ---- server

    def _accept_loop(self):
        while not self.stopping:
            try:
                r, _, _ = select.select([self.lsock], [], [], 0.1)
                if not r:
                    continue
                c, _ = self.lsock.accept()
            except (OSError, ValueError):
                return
            with self.lock:
                if self.stopping:
                    c.close()
                    return
                self.accepted += 1
                n = self.accepted
                self.conns.append(c)
            if self.on_accept == CLOSE:
                self._close(c)
                continue
            t = threading.Thread(target=self._serve, args=(c, n), daemon=True,
                                 name='fake-sentinel-%d-conn-%d' % (self.port, n))
            t.start()
            with self.lock:
                self.threads.append(t)

    def _close(self, c):
        with self.lock:
            if c in self.subscribers:
                self.subscribers.remove(c)
        try:
            c.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        c.close()

    def _serve(self, c, n):
        buf = b''
        try:
            while not self.stopping:
                r, _, _ = select.select([c], [], [], 0.2)
                if not r:
                    continue
                data = c.recv(65536)
                if not data:
                    break
                buf += data
                while True:
                    args, buf = _parse_command(buf)
                    if args is None:
                        break
                    with self.lock:
                        self.commands.append((n, args))
                    if args and args[0].upper() == 'PSUBSCRIBE':
                        with self.lock:
                            self.subscribers.append(c)
                        c.sendall(enc(['psubscribe', args[1] if len(args) > 1 else '*', 1]))
                        continue
                    action = self._answer(args)
                    if action == CLOSE:
                        return
                    if action == SILENT:
                        continue
                    if isinstance(action, Partial):
                        c.sendall(action.data)
                        time.sleep(action.delay)
                        return
                    c.sendall(enc(action))
        except (OSError, ValueError):
            pass
        finally:
            self._close(c)

    def stop(self):
        with self.lock:
            self.stopping = True
            conns = list(self.conns)
        for t in self.threads[:1]:
            t.join(2.0)   # the accept loop: gone within 0.1 s
        try:
            self.lsock.close()
        except OSError:
            pass
        for c in conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            try:
                c.close()
            except OSError:
                pass
        for t in list(self.threads):
            t.join(2.0)

    def __repr__(self):
        return '<FakeSentinel port=%d>' % self.port


def _parse_command(buf):
    """One RESP multibulk command (as hiredis sends them) from buf: (args,
    rest), or (None, buf) if incomplete. Raises ValueError on junk."""
    if not buf:
        return None, buf
    if buf[:1] != b'*':
        i = buf.find(b'\r\n')
        if i < 0:
            return None, buf
        return buf[:i].decode(errors='replace').split(), buf[i + 2:]
    i = buf.find(b'\r\n')
    if i < 0:
        return None, buf
    n = int(buf[1:i])
    pos = i + 2
    args = []
    for _ in range(n):
        j = buf.find(b'\r\n', pos)
        if j < 0:
            return None, buf
        if buf[pos:pos + 1] != b'$':
            raise ValueError('expected a bulk string')
        ln = int(buf[pos + 1:j])
        start = j + 2
        if len(buf) < start + ln + 2:
            return None, buf
        args.append(buf[start:start + ln].decode(errors='replace'))
        pos = start + ln + 2
    return args, buf[pos:]

# --------------------------------------------------------------------------
# helpers


def cmdstats(server):
    """INFO commandstats of a RedisServer as {command: calls + rejected + failed}."""
    out = {}
    for k, v in server.client(socket_timeout=2).info('commandstats').items():
        out[k] = int(v.get('calls', 0)) + int(v.get('rejected_calls', 0)) + \
            int(v.get('failed_calls', 0))
    return out


@unittest.skipIf(harness.DIRECT, 'ferry-only: fake sentinels talk to ferry')
class Base(unittest.TestCase):

    def fake(self, **kw):
        f = FakeSentinel(**kw)
        self.addCleanup(f.stop)
        return f

    def redis(self, conf=None):
        r = RedisServer(conf)
        self.addCleanup(r.kill)
        return r

    def ferry(self, sentinels):
        sec = {'master': MASTER, 'addresses': [s.address for s in sentinels],
               'resolve_interval_ms': 200, 'timeout_ms': 500}
        f = Ferry(None, sentinel=sec, conf=FERRY_CONF, wait='port')
        self.addCleanup(self._stop_ferry, f)
        return f

    def _stop_ferry(self, f):
        f.stop()

    def assert_alive(self, f, what=''):
        if not f.running():
            self.fail('ferry died (%s), exit code %s\n--- log tail ---\n%s\n--- output ---\n%s'
                      % (what, f.proc.returncode, f.log()[-3000:], f.output()[-3000:]))

    def assert_clean_exit(self, f):
        self.assert_alive(f, 'before SIGTERM')
        rc = f.stop()
        out = f.output()
        self.assertNotRegex(out, 'AddressSanitizer|runtime error|LeakSanitizer')
        self.assertEqual(rc, 0, 'ferry exit code %s\n%s' % (rc, out[-3000:]))

    def wait_asked(self, fakes, n=2, timeout=30.0):
        """Until each fake sentinel got n SENTINEL MASTER questions."""
        wait_until(lambda: all(s.count('SENTINEL', 'MASTER') >= n for s in fakes),
                   timeout=timeout, msg='ferry to ask SENTINEL MASTER %d times' % n)

    def call(self, f, *args, timeout=20.0):
        """One command on a new raw connection: (reply, seconds taken)."""
        s = f.raw(timeout=timeout)
        try:
            t0 = time.monotonic()
            resp_send(s, list(args))
            r = resp_read_reply(s, timeout)
            return r, time.monotonic() - t0
        finally:
            s.close()

    def assert_tryagain(self, f, key='q'):
        """A write is held, then answered -TRYAGAIN after the hold bound."""
        r, took = self.call(f, 'LPUSH', key, 'x')
        self.assertIsInstance(r, RespError, 'LPUSH answered %r, want -TRYAGAIN\n%s'
                              % (r, f.log()[-3000:]))
        self.assertTrue(str(r).startswith(TRYAGAIN_PREFIX), repr(r))
        self.assertGreaterEqual(took, HOLD_MS / 1000.0 * 0.9, 'answered before the hold bound')
        # a bound on a hang (held for good), not a speed
        self.assertLess(took, HOLD_MS / 1000.0 + 10.0, 'held far past the hold bound')

    def assert_no_lpush(self, *servers):
        for srv in servers:
            st = cmdstats(srv)
            self.assertNotIn('cmdstat_lpush', st, 'port %d got LPUSH: %r' % (srv.port, st))

    def assert_serves(self, f, srv, key='q'):
        """A push through ferry lands on srv (its LLEN shows it), a pop
        through ferry takes it back."""
        before = srv.client().llen(key)
        c = f.client(socket_timeout=6)
        try:
            self.assertEqual(c.lpush(key, 'item'), before + 1)
            self.assertEqual(srv.client().llen(key), before + 1,
                             'the push through ferry did not land on port %d' % srv.port)
            self.assertEqual(c.lpop(key), 'item')
            self.assertEqual(srv.client().llen(key), before)
        finally:
            c.close()

    def wait_up(self, f, srv, timeout=8.0):
        """Until ferry's log says its master view is UP on srv."""
        wait_until(lambda: '-> UP(127.0.0.1:%d' % srv.port in f.log(), timeout=timeout,
                   msg='ferry to accept master %d' % srv.port)


# --------------------------------------------------------------------------
# 1. SENTINEL MASTER nonsense

# Cases that broke ferry once (kept as regressions; reason in the docstring).
FIXED_BUGS = {
    # hiredis 0.14 asserts on a reply nobody asked for: SIGABRT
    'extra_reply': 'unsolicited reply on the command connection aborts ferry '
                   '(hiredis async.c:478 assertion)',
    # atoi(): 2^32 + P wraps to P, trailing junk is ignored
    'port_wraps_32bit': 'port "2^32+P" is read as P (atoi wraps): ferry uses the node at P',
    'port_trailing_junk': 'port "Pabc" is read as P: ferry uses the node at P',
    # a bulk string is used up to its first NUL byte
    'ip_embedded_nul': 'ip "127.0.0.1\\0junk" is used as 127.0.0.1',
    # the trailing key of an odd-length reply is ignored, the pairs before it used
    'odd_length_dangling_key': 'an odd-length reply with usable ip/port pairs is accepted',
}


def nonsense_cases():
    """name -> (builder(port of a real Redis) -> script, on_accept)."""
    def good(p):
        return master_fields('127.0.0.1', p)

    def with_field(k, v):
        return lambda p: replace_field(good(p), k, v(p) if callable(v) else v)
    return {
        'error': (lambda p: Err('ERR No such master with that name'), None),
        'integer': (lambda p: 42, None),
        'nil': (lambda p: None, None),
        'nil_array': (lambda p: Raw(b'*-1\r\n'), None),
        'empty_array': (lambda p: [], None),
        'status_reply': (lambda p: Raw(b'+OK\r\n'), None),
        # 'name' key dropped: odd length, every pair after it misaligned
        'odd_length_array': (lambda p: good(p)[1:], None),
        'odd_length_dangling_key': (lambda p: good(p) + ['ip'], None),
        'no_ip_no_port': (lambda p: drop_fields(good(p), 'ip', 'port'), None),
        'no_port': (lambda p: drop_fields(good(p), 'port'), None),
        'no_ip': (lambda p: drop_fields(good(p), 'ip'), None),
        'port_0': (with_field('port', '0'), None),
        'port_70000': (with_field('port', '70000'), None),
        'port_abc': (with_field('port', 'abc'), None),
        'port_negative': (with_field('port', '-1'), None),
        'port_empty': (with_field('port', ''), None),
        'port_integer_type': (with_field('port', lambda p: p), None),
        'port_wraps_32bit': (with_field('port', lambda p: str(2 ** 32 + p)), None),
        'port_trailing_junk': (with_field('port', lambda p: '%dabc' % p), None),
        'ip_not_an_ip': (with_field('ip', 'not-an-ip'), None),
        'ip_200_chars': (with_field('ip', 'x' * 200), None),
        'ip_200_digits_dots': (with_field('ip', '1.' * 100), None),
        'ip_empty': (with_field('ip', ''), None),
        'ip_nil': (with_field('ip', None), None),
        'ip_embedded_nul': (with_field('ip', '127.0.0.1\x00junk'), None),
        'nested_array': (lambda p: [good(p)], None),
        'nested_values': (lambda p: ['ip', ['127.0.0.1'], 'port', [str(p)], 'flags', ['master']],
                          None),
        'huge_bulk_then_close': (lambda p: Partial(b'*40\r\n$4\r\nname\r\n$999999999\r\nmq'),
                                 None),
        'huge_array_then_close': (lambda p: Partial(b'*100000\r\n$4\r\nname\r\n'), None),
        'truncated_reply_then_close': (lambda p: Partial(enc(good(p))[:-7]), None),
        'random_bytes': (lambda p: Raw(bytes(range(256)) + b'\r\n\x00\xff\xfe junk\r\n'), None),
        'bad_bulk_length': (lambda p: Raw(b'$abc\r\nhello\r\n'), None),
        'extra_error_reply': (lambda p: Raw(enc(Err('ERR no such master')) + b'-ERR again\r\n'),
                              None),
        'extra_reply': (lambda p: Raw(enc(Err('ERR no such master')) + b'+OK\r\n'), None),
        'close_on_question': (lambda p: CLOSE, None),
        'close_on_accept': (lambda p: CLOSE, CLOSE),
        'never_answers': (lambda p: SILENT, None),
    }


class MasterReplyNonsenseTest(Base):
    """One ferry, one fake sentinel answering SENTINEL MASTER and SENTINEL
    SENTINELS with nonsense. A real Redis (master) listens on the port a
    well-formed reply would name; it must get no write."""

    def run_case(self, name):
        build, on_accept = nonsense_cases()[name]
        real = self.redis()
        script = build(real.port)
        fake = self.fake(master=script, sentinels=script, on_accept=on_accept)
        f = self.ferry([fake])
        if on_accept == CLOSE:
            wait_until(lambda: fake.accepted >= 4, timeout=8, msg='ferry to reconnect')
        else:
            self.wait_asked([fake], n=2)
        self.assert_alive(f, name)
        self.assert_tryagain(f)
        self.assert_alive(f, name)
        self.assert_no_lpush(real)
        log = f.log()
        self.assertIn(':%d' % fake.port, log, 'the log never names the sentinel')
        self.assertNotIn('-> UP(', log, 'ferry accepted a master')
        self.assert_clean_exit(f)


def _add_case(name):
    def test(self):
        self.run_case(name)
    test.__name__ = 'test_%s' % name
    test.__doc__ = 'SENTINEL MASTER answered: %s' % name.replace('_', ' ')
    if name in FIXED_BUGS:
        test.__doc__ += ' [regression: %s]' % FIXED_BUGS[name]
    setattr(MasterReplyNonsenseTest, 'test_%s' % name, test)


for _name in nonsense_cases():
    _add_case(_name)
del _name

# --------------------------------------------------------------------------
# 2. event (pub/sub) nonsense


def pm(channel, payload, pattern='*'):
    return ['pmessage', pattern, channel, payload]


# Garbage ferry survives: one ferry gets all of it, in this order.
SURVIVABLE_EVENTS = [
    ('wrong arity 2', ['pmessage', '*']),
    ('wrong arity 3', ['pmessage', '*', '+odown']),
    ('wrong arity 5', ['pmessage', '*', '+odown', 'master mq 127.0.0.1 1', 'extra']),
    ('channel integer', ['pmessage', '*', 5, 'master mq 127.0.0.1 1']),
    ('channel nil', ['pmessage', '*', None, 'master mq 127.0.0.1 1']),
    ('payload integer', pm('+switch-master', 7)),
    ('payload nil', pm('+switch-master', None)),
    ('payload array', pm('+switch-master', ['mq', '127.0.0.1', '1', '127.0.0.1', '2'])),
    ('payload empty', pm('+odown', '')),
    ('channel empty', pm('', 'master mq 127.0.0.1 1')),
    ('switch-master name only', pm('+switch-master', 'mq')),
    ('switch-master 3 words', pm('+switch-master', 'mq 127.0.0.1 1')),
    ('switch-master 4 words', pm('+switch-master', 'mq 127.0.0.1 1 127.0.0.1')),
    ('switch-master to nonsense', pm('+switch-master', 'mq 127.0.0.1 1 not-an-ip 0')),
    ('switch-master spaces', pm('+switch-master', '     ')),
    ('odown too many words', pm('+odown', 'master mq ' + ' '.join(['w'] * 2000))),
    ('sdown 100 kB payload', pm('+sdown', 'x' * 100000 + ' @ mq 127.0.0.1 1')),
    ('@ at the end', pm('+sdown', 'slave a b c @')),
    ('@ @ @', pm('+odown', '@ @ @ @ mq')),
    ('binary payload', pm('+odown', b'master mq \x00\xff\r\n 1')),
    ('not a plus event', pm('__sentinel__:hello', 'garbage,,,,,,')),
    ('message kind', ['message', 'chan', 'hello']),
    ('unknown kind', ['hello', '*', 'x', 'y']),
    ('subscribe kind', ['psubscribe', 'other', 3]),
    ('status reply', Raw(b'+OK\r\n')),
    ('integer reply', Raw(b':1\r\n')),
    ('nil reply', Raw(b'$-1\r\n')),
]


class EventNonsenseTest(Base):
    """The fake sentinel names a real Redis correctly on its command
    connection and sends garbage on the event connection."""

    def setup_up(self):
        real = self.redis()
        fake = self.fake(master=master_fields('127.0.0.1', real.port))
        f = self.ferry([fake])
        wait_until(lambda: fake.n_subscribers() >= 1, timeout=8, msg='ferry to PSUBSCRIBE')
        self.wait_up(f, real)
        self.assert_serves(f, real)
        return real, fake, f

    def test_garbage_events(self):
        real, fake, f = self.setup_up()
        for what, msg in SURVIVABLE_EVENTS:
            fake.publish(msg)
            time.sleep(0.02)
            self.assert_alive(f, 'after event: %s' % what)
        time.sleep(0.5)
        self.assert_alive(f, 'after all events')
        # whatever the events made of the master view, the next rounds bring
        # the master the sentinel names back, and nothing else
        self.wait_up(f, real)
        self.assert_serves(f, real)
        # the event connection still works: a well-formed event is logged
        wait_until(lambda: fake.n_subscribers() >= 1, timeout=5, msg='an event connection')
        fake.pmessage('+sdown', 'slave 127.0.0.1:1 127.0.0.1 1 @ mq 127.0.0.1 %d' % real.port)
        wait_until(lambda: 'event +sdown slave 127.0.0.1:1 ' in f.log(), timeout=5,
                   msg='ferry to log a well-formed event')
        connects = [ln for ln in f.log().splitlines() if 'master view: connecting to' in ln]
        self.assertTrue(connects)
        for ln in connects:
            self.assertIn('connecting to 127.0.0.1:%d ' % real.port, ln)
        self.assert_clean_exit(f)

    def crash_case(self, msg, then=None):
        real, fake, f = self.setup_up()
        fake.publish(msg)
        if then is not None:
            time.sleep(0.2)
            fake.publish(then)
        time.sleep(0.5)
        self.assert_alive(f)
        self.assert_serves(f, real)
        self.assert_clean_exit(f)

    def test_event_one_element_array(self):
        """[known ferry bug] *1 pmessage aborts ferry: hiredis async.c:378
        assertion `reply->elements >= 2`."""
        self.crash_case(Raw(b'*1\r\n$8\r\npmessage\r\n'))

    def test_event_kind_not_a_string(self):
        """[known ferry bug] a message whose first element is an integer aborts
        ferry: hiredis async.c:379 assertion."""
        self.crash_case([1, '*', '+odown', 'master mq 127.0.0.1 1'])

    def test_event_pattern_not_a_string(self):
        """[known ferry bug] a pmessage whose pattern is nil aborts ferry:
        hiredis async.c:389 assertion."""
        self.crash_case(['pmessage', None, '+odown', 'master mq 127.0.0.1 1'])

    def test_event_punsubscribe_then_message(self):
        """[known ferry bug] a fake 'punsubscribe * 0' takes hiredis out of
        subscribed mode; the next message aborts ferry: hiredis async.c:478
        assertion."""
        self.crash_case(['punsubscribe', '*', 0], then=pm('+odown', 'master mq 127.0.0.1 1'))

# --------------------------------------------------------------------------
# 3. three sentinels: majority, minority, split


class MajorityTest(Base):

    def test_majority_wins_over_other_address(self):
        real = self.redis()
        other = self.redis()   # a real master too: a wrong choice would work
        good = master_fields('127.0.0.1', real.port, epoch=0)
        a, b = self.fake(master=good), self.fake(master=good)
        c = self.fake(master=master_fields('127.0.0.1', other.port, epoch=7))
        f = self.ferry([a, b, c])
        self.wait_up(f, real)
        self.assert_serves(f, real)
        self.wait_asked([a, b, c], n=4)  # a few more rounds change nothing
        self.assert_serves(f, real)
        self.assert_no_lpush(other)
        self.assertNotIn('connecting to 127.0.0.1:%d' % other.port, f.log())
        self.assert_clean_exit(f)

    def test_majority_wins_over_nonsense(self):
        real = self.redis()
        good = master_fields('127.0.0.1', real.port, epoch=0)
        scripts = {
            'random bytes': Raw(b'\x00\x01garbage\r\n'),
            'error': Err('ERR No such master with that name'),
            'never answers': SILENT,
            'address without port': drop_fields(good, 'port'),
        }
        for what, script in scripts.items():
            with self.subTest(third=what):
                a, b = self.fake(master=good), self.fake(master=good)
                c = self.fake(master=script, sentinels=script)
                f = self.ferry([a, b, c])
                self.wait_up(f, real)
                self.assert_serves(f, real)
                self.assert_clean_exit(f)
                for x in (a, b, c):
                    x.stop()

    def test_split_accepts_no_master(self):
        # Three real masters, each named by one sentinel (the real one at the
        # highest config epoch): no majority, so no master, and no write
        # anywhere.
        nodes = [self.redis() for _ in range(3)]
        fakes = [self.fake(master=master_fields('127.0.0.1', n.port, epoch=e))
                 for n, e in zip(nodes, (9, 0, 0))]
        f = self.ferry(fakes)
        self.wait_asked(fakes, n=3)
        self.assert_tryagain(f)
        self.assert_alive(f)
        self.assert_no_lpush(*nodes)
        self.assertIn('no majority for a master', f.log())
        self.assertNotIn('-> UP(', f.log())
        self.assert_clean_exit(f)

    def test_minority_cannot_outvote_by_aliases(self):
        """[known ferry bug] A sentinel's SENTINEL SENTINELS reply adds voters
        with no check: the minority sentinel lists itself as 127.1,
        2130706433, localhost and 0x7f000001 and then wins 5 of 7 votes;
        ferry switches to the master only it names."""
        real = self.redis()
        other = self.redis()
        good = master_fields('127.0.0.1', real.port)
        a, b = self.fake(master=good), self.fake(master=good)
        c = self.fake(master=master_fields('127.0.0.1', other.port))
        c.sentinels = [['name', 'x%d' % i, 'ip', ip, 'port', str(c.port), 'flags', 'sentinel']
                       for i, ip in enumerate(['127.1', '2130706433', 'localhost',
                                               '0x7f000001'])]
        f = self.ferry([a, b, c])
        self.wait_up(f, real)
        # SENTINEL SENTINELS goes out every 10th round (200 ms apart)
        wait_until(lambda: c.count('SENTINEL', 'SENTINELS') >= 1 and
                   c.count('SENTINEL', 'MASTER') >= 6, timeout=10, msg='a discovery round')
        deadline = time.monotonic() + 3.0
        while time.monotonic() < deadline:
            self.assert_serves(f, real)
            time.sleep(0.2)
        self.assert_no_lpush(other)
        self.assert_clean_exit(f)

# --------------------------------------------------------------------------
# 4. the named node is a replica


class RoleCheckTest(Base):

    def test_replica_is_refused(self):
        nowhere = free_port()   # nothing listens: the replica stays a replica
        replica = self.redis({'replicaof': '127.0.0.1 %d' % nowhere})
        self.assertEqual(replica.role(), 'slave')
        named = master_fields('127.0.0.1', replica.port, epoch=3)
        fakes = [self.fake(master=named) for _ in range(3)]
        f = self.ferry(fakes)
        self.wait_asked(fakes, n=3)
        wait_until(lambda: "answers ROLE 'slave'" in f.log(), timeout=8,
                   msg='ferry to check ROLE on the named node')
        self.assert_tryagain(f)
        self.assert_tryagain(f, key='other')
        self.assert_alive(f)
        self.assert_no_lpush(replica)
        self.assertEqual(replica.client().llen('q'), 0)
        self.assertNotIn('-> UP(', f.log())
        self.assert_clean_exit(f)


if __name__ == '__main__':
    unittest.main()
