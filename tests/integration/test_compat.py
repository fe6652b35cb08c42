"""The compatibility matrix: every client the tests install runs the same
queue checks through ferry, in Sentinel mode (replicas_ack 1) and with a
fixed master.

Clients (columns): redis-py (Debian's python3-redis, RESP2), node-redis 6
with its default options (RESP3) and with `RESP: 2`, ioredis 6 (RESP2),
redis-cli (RESP2, and `-3` for RESP3) and redis-benchmark. Checks (rows):
FIFO, priority BRPOP, BZPOPMIN, a Lua delayed queue, LPOP with a count, a
pipeline, MULTI/EXEC, WATCH, pub/sub, SELECT, BLMOVE and a 1 MiB binary
value. Each check asserts what the client saw and what the master holds
afterwards (read on the master directly). A check a client cannot express
is skipped with the reason, and the matrix says n/a, never ok.

One test method per client; each check is a subTest, so a failure names the
client (method), the check and the mode (class). The RESP3 clients have
classes of their own (CompatResp3*): they need `HELLO 3`, which ferry
answers with -NOPROTO until it speaks RESP3, so today they fail there and
only there.

The module prints the matrix (client x check -> ok / FAIL / n/a, per mode)
when it ends; COMPAT_MATRIX=path also writes it as Markdown
(scripts/gen-compat-doc puts that into docs/compatibility.md). With FERRY_TEST_DIRECT=1
the same checks run against Redis directly, which validates the checks:
there every one passes.
"""

import hashlib
import json
import os
import queue
import shutil
import subprocess
import tempfile
import threading
import time
import unittest

import redis

from harness import DIRECT, wait_until
from modes import FixedMasterMode, SentinelMode, key_prefix, sentinel_first

HERE = os.path.dirname(os.path.abspath(__file__))
NODE_DRIVER = os.path.join(HERE, 'node', 'compat.js')
NODE_TIMEOUT = 60     # seconds for one node run (every check); the driver gives up after 50
CLI_TIMEOUT = 10      # seconds for one redis-cli or redis-benchmark run
WAIT = 5.0            # seconds to wait for a condition (a blocked pop, a message)

# (name, row title) in the matrix's order
CHECKS = [
    ('fifo', 'FIFO (LPUSH, RPOP)'),
    ('priority_brpop', 'priority BRPOP (key order, timeout, wake-up)'),
    ('bzpopmin', 'BZPOPMIN'),
    ('lua_delayed', 'Lua delayed queue (EVAL, SCRIPT LOAD, EVALSHA)'),
    ('lpop_count', 'LPOP with a count'),
    ('pipeline', 'pipeline'),
    ('multi', 'MULTI/EXEC'),
    ('watch', 'WATCH (abort, then commit)'),
    ('pubsub', 'pub/sub (SUBSCRIBE, PSUBSCRIBE)'),
    ('select', 'SELECT (database 3)'),
    ('blmove', 'BLMOVE (reliable queue)'),
    ('binary_1mb', '1 MiB binary value'),
]
CHECK_NAMES = [c for c, _ in CHECKS]

# (name, column title ({} is the installed version), RESP version it speaks)
CLIENTS = [
    ('redis-py', 'redis-py {}', 2),
    ('node-redis', 'node-redis {} (default: RESP3)', 3),
    ('node-redis-resp2', 'node-redis {} `RESP: 2`', 2),
    ('ioredis', 'ioredis {}', 2),
    ('redis-cli', 'redis-cli {}', 2),
    ('redis-cli-3', 'redis-cli {} `-3`', 3),
    ('redis-benchmark', 'redis-benchmark {}', 2),
]


def installed_version(client):
    """The version of client installed here, or '?'."""
    try:
        if client == 'redis-py':
            return redis.__version__
        if client.startswith('node-redis') or client == 'ioredis':
            pkg = 'ioredis' if client == 'ioredis' else 'redis'
            with open(os.path.join(HERE, 'node_modules', pkg, 'package.json')) as f:
                return json.load(f)['version']
        tool = 'redis-benchmark' if client == 'redis-benchmark' else 'redis-cli'
        out = subprocess.run([tool, '--version'], capture_output=True, text=True,
                             timeout=CLI_TIMEOUT).stdout.split()
        return out[1] if len(out) > 1 else '?'
    except (OSError, ValueError, KeyError, subprocess.SubprocessError):
        return '?'


# The delayed-queue script (node/compat.js holds the same text): moves the
# members of KEYS[1], a sorted set scored by due time, whose score is <=
# ARGV[1] onto the list KEYS[2], in due order, and returns them.
DELAYED_SCRIPT = '\n'.join([
    "local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1])",
    "for _, job in ipairs(due) do redis.call('LPUSH', KEYS[2], job) end",
    "if #due > 0 then redis.call('ZREM', KEYS[1], unpack(due)) end",
    'return due',
])
DELAYED_SHA = hashlib.sha1(DELAYED_SCRIPT.encode()).hexdigest()

# The 1 MiB value: every byte value, CR LF and NUL included, with no short
# period (node/compat.js builds the same).
BINARY_SIZE = 1 << 20
BINARY = bytes((i * 167 + (i >> 11)) & 0xff for i in range(BINARY_SIZE))
BINARY_SHA256 = hashlib.sha256(BINARY).hexdigest()

# (mode, client, check) -> 'ok' | 'FAIL' | 'FAIL (NOPROTO)' | 'n/a'
RESULTS = {}
FAIL_TEXT = {}   # (mode, client, check) -> first line of the failure


class NotExpressible(Exception):
    """The client has no way to run this check: the matrix says n/a."""


def expected(check, P, client):
    """What a client reports for check under key prefix P (redis-py, the
    Node.js clients and redis-cli report the same; redis-benchmark reports
    nothing and has checks of its own)."""
    if check == 'fifo':
        return {'pushes': [1, 2, 3, 4, 5], 'pops': ['a1', 'a2', 'a3']}
    if check == 'priority_brpop':
        return {'setup': [2, 1],
                'pops': [[P + ':high', 'h1'], [P + ':low', 'l1'], [P + ':low', 'l2']],
                'timeout': None, 'pushed_while_blocked': 1, 'woken': [P + ':low', 'l3']}
    if check == 'bzpopmin':
        e = {'added': 3, 'pops': [[P + ':z', 'a', 10.0], [P + ':z', 'b', 20.0]], 'timeout': None}
        if client.startswith('redis-cli'):
            # the score as it came on the wire: a bulk string in RESP2, a
            # double in RESP3
            e['score_types'] = ['number' if client == 'redis-cli-3' else 'string'] * 2
        return e
    if check == 'lua_delayed':
        return {'added': 3, 'due_eval': ['j1', 'j2'], 'sha': DELAYED_SHA,
                'due_evalsha': ['j3'], 'due_none': []}
    if check == 'lpop_count':
        return {'pushed': 5, 'first': ['a', 'b'], 'rest': ['c', 'd', 'e'], 'missing': None,
                'pushed_again': 2, 'one': ['f']}
    if check == 'pipeline':
        if client.startswith('redis-cli'):
            return {'pipe': 'errors: 0, replies: 200'}
        replies = []
        for i in range(100):
            replies += [i + 1, str(i)]
        return {'replies': replies}
    if check == 'multi':
        return {'exec': [1, 2, 1]}
    if check == 'watch':
        return {'read': 'v0', 'aborted': None, 'committed': ['OK', 1]}
    if check == 'pubsub':
        return {'published': [1, 1],
                'messages': [['message', P + ':ch', 'one'],
                             ['pmessage', P + ':news.*', P + ':news.x', 'two']],
                'published_after': [0, 0]}
    if check == 'select':
        return {'pushed': 2, 'popped': 'a'}
    if check == 'blmove':
        return {'pushed': 2, 'moved': 'j1', 'timeout': None, 'pushed_while_blocked': 1,
                'woken': 'j3', 'acked': 1}
    if check == 'binary_1mb':
        return {'set': 'OK', 'get_len': BINARY_SIZE, 'get_sha256': BINARY_SHA256, 'pushed': 1,
                'pop_len': BINARY_SIZE, 'pop_sha256': BINARY_SHA256}
    raise ValueError(check)


def blocked_clients(m):
    return m.info('clients')['blocked_clients']


def cli_quote(arg):
    """arg as one redis-cli input word (double-quoted, as sdssplitargs reads)."""
    out = ['"']
    for ch in arg:
        if ch in '"\\':
            out.append('\\' + ch)
        elif ' ' <= ch <= '~':
            out.append(ch)
        else:
            out.append('\\x%02x' % ord(ch))
    out.append('"')
    return ''.join(out)


def resp_encode(*args):
    out = [b'*%d\r\n' % len(args)]
    for a in args:
        a = a if isinstance(a, bytes) else str(a).encode()
        out.append(b'$%d\r\n%s\r\n' % (len(a), a))
    return b''.join(out)


class Lines:
    """A running redis-cli whose stdout lines are read by a thread."""

    def __init__(self, argv):
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
        self.q = queue.Queue()
        self.err = []
        self.pumps = [threading.Thread(target=self._pump, args=(self.proc.stdout, self.q.put),
                                       daemon=True),
                      threading.Thread(target=self._pump, args=(self.proc.stderr, self.err.append),
                                       daemon=True)]
        for t in self.pumps:
            t.start()

    @staticmethod
    def _pump(f, put):
        for line in f:
            put(line)

    def send(self, text):
        self.proc.stdin.write(text)
        self.proc.stdin.flush()

    def json(self, timeout=WAIT):
        """The next reply printed as JSON (redis-cli's banner lines skipped)."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError('redis-cli printed nothing in %.1f s (stderr %r)'
                                     % (timeout, ''.join(self.err)))
            try:
                line = self.q.get(timeout=left)
            except queue.Empty:
                continue
            if line.startswith('Reading messages'):
                continue
            return json.loads(line)

    def stop(self):
        """Ends redis-cli (SIGTERM, as Ctrl-C would) and reads what it
        printed to the end, so self.err is complete."""
        if self.proc.poll() is None:
            self.proc.terminate()
        try:
            self.proc.wait(CLI_TIMEOUT)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for t in self.pumps:
            t.join(WAIT)
        for f in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            try:
                f.close()
            except OSError:
                pass


class CompatChecks:
    """The checks, one method per client; the mode classes below run them."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.node = shutil.which('node')

    def mode(self):
        return ('Redis directly, ' if DIRECT else '') + self.MODE

    def m(self, db=0, binary=False):
        """A client on the master, for what Redis holds (one per kind and
        test)."""
        cache = self.__dict__.setdefault('_master_clients', {})
        if (db, binary) not in cache:
            c = redis.Redis(host='127.0.0.1', port=self.master().port, db=db,
                            decode_responses=not binary, socket_timeout=10)
            self.addCleanup(c.close)
            cache[(db, binary)] = c
        return cache[(db, binary)]

    # --- the runner ----------------------------------------------------------

    def run_client(self, client, observe):
        """Runs every check for client: observe(check, P) returns what the
        client saw (or raises NotExpressible); it must equal expected(), then
        the master must hold what the check leaves."""
        base = key_prefix(self)
        for check in CHECK_NAMES:
            P = '%s:%s' % (base, check)
            if getattr(self, 'HASH_TAG', False):
                P = '{%s}' % P   # a cluster: the check's keys in one slot, as its users do
            key = (self.mode(), client, check)
            with self.subTest(check=check):
                RESULTS[key] = 'FAIL'
                skip = getattr(self, 'SKIP_CHECKS', {}).get(check)
                if skip:
                    RESULTS[key] = 'n/a'
                    self.skipTest('%s: %s' % (check, skip))
                try:
                    try:
                        obs = observe(check, P)
                    except NotExpressible as e:
                        RESULTS[key] = 'n/a'
                        self.skipTest('%s cannot express %s: %s' % (client, check, e))
                    if obs is not None:
                        self.assertEqual(obs, expected(check, P, client))
                        self.check_master(check, P)
                except unittest.SkipTest:
                    raise
                except BaseException as e:
                    text = str(e)
                    if 'NOPROTO' in text:
                        RESULTS[key] = 'FAIL (NOPROTO)'
                    FAIL_TEXT[key] = text.strip().splitlines()[0][:200] if text.strip() else repr(e)
                    raise
                RESULTS[key] = 'ok'

    def check_master(self, check, P):
        """What the master holds after check ran under key prefix P."""
        m = self.m()
        if check == 'fifo':
            self.assertEqual(m.lrange(P + ':q', 0, -1), ['a5', 'a4'])
        elif check == 'priority_brpop':
            self.assertEqual(m.exists(P + ':high', P + ':low'), 0)
        elif check == 'bzpopmin':
            self.assertEqual(m.zrange(P + ':z', 0, -1, withscores=True), [('c', 30.0)])
        elif check == 'lua_delayed':
            self.assertEqual(m.exists(P + ':delayed'), 0)
            self.assertEqual(m.lrange(P + ':ready', 0, -1), ['j3', 'j2', 'j1'])
        elif check == 'lpop_count':
            self.assertEqual(m.lrange(P + ':q', 0, -1), ['g'])
        elif check == 'pipeline':
            self.assertEqual(m.lrange(P + ':p', 0, -1), [str(i) for i in range(100)])
        elif check == 'multi':
            self.assertEqual(m.lrange(P + ':q', 0, -1), ['b', 'a'])
            self.assertEqual(m.get(P + ':n'), '1')
        elif check == 'watch':
            self.assertEqual([m.get(P + ':w'), m.get(P + ':side')], ['mine', '1'])
        elif check == 'pubsub':
            self.assertEqual(m.pubsub_numsub(P + ':ch'), [(P + ':ch', 0)])
        elif check == 'select':
            self.assertEqual(self.m(db=3).lrange(P + ':q', 0, -1), ['b'])
            self.assertEqual(m.exists(P + ':q'), 0)
        elif check == 'blmove':
            self.assertEqual(m.lrange(P + ':q', 0, -1), ['j2'])
            self.assertEqual(m.lrange(P + ':work', 0, -1), ['j3'])
        elif check == 'binary_1mb':
            self.assertEqual(self.m(binary=True).get(P + ':bin'), BINARY)
            self.assertEqual(m.exists(P + ':bq'), 0)
        else:
            raise ValueError(check)

    def wait_blocked(self, base):
        wait_until(lambda: blocked_clients(self.m()) > base, timeout=WAIT,
                   msg='the blocking call to block in Redis')

    def settled_blocked(self):
        """Redis' blocked clients once no earlier call is still blocked
        there (a call whose timeout ferry answered may end on Redis a
        moment later: counted in the base, its end would hide the next)."""
        wait_until(lambda: blocked_clients(self.m()) == 0, timeout=WAIT,
                   msg='earlier blocking calls ended in Redis')
        return 0

    # --- redis-py --------------------------------------------------------------

    def redis_py(self, **kw):
        kw.setdefault('socket_timeout', 10)
        kw.setdefault('decode_responses', True)
        r = redis.Redis(host='127.0.0.1', port=self.ferry.port, **kw)
        self.addCleanup(r.close)
        return r

    def blocked_py(self, call, push):
        """call() on a thread (its own connection) until Redis counts it
        blocked, then push(); returns [push's reply, call's reply]."""
        base = self.settled_blocked()
        got = {}

        def run():
            try:
                got['value'] = call()
            except Exception as e:  # noqa: BLE001 - reported below
                got['error'] = e
        t = threading.Thread(target=run, daemon=True)
        t.start()
        try:
            self.wait_blocked(base)
            pushed = push()
        finally:
            t.join(WAIT * 2)
        if 'error' in got:
            raise got['error']
        self.assertFalse(t.is_alive(), 'the blocking call did not return')
        return [pushed, got['value']]

    def observe_redis_py(self, check, P):
        r = self.redis_py()
        pair = lambda v: list(v) if v is not None else None  # noqa: E731
        if check == 'fifo':
            return {'pushes': [r.lpush(P + ':q', v) for v in ('a1', 'a2', 'a3', 'a4', 'a5')],
                    'pops': [r.rpop(P + ':q') for _ in range(3)]}
        if check == 'priority_brpop':
            hi, lo = P + ':high', P + ':low'
            setup = [r.lpush(lo, 'l1', 'l2'), r.lpush(hi, 'h1')]
            pops = [pair(r.brpop([hi, lo], 1)) for _ in range(3)]
            timeout = r.brpop([hi, lo], 0.1)
            other = self.redis_py()
            pushed, woken = self.blocked_py(lambda: r.brpop([hi, lo], 5),
                                            lambda: other.lpush(lo, 'l3'))
            return {'setup': setup, 'pops': pops, 'timeout': timeout,
                    'pushed_while_blocked': pushed, 'woken': pair(woken)}
        if check == 'bzpopmin':
            z = P + ':z'
            added = r.zadd(z, {'c': 30, 'a': 10, 'b': 20})
            pops = [pair(r.bzpopmin(z, 1)) for _ in range(2)]
            return {'added': added, 'pops': pops, 'timeout': r.bzpopmin(P + ':none', 0.1)}
        if check == 'lua_delayed':
            keys = [P + ':delayed', P + ':ready']
            added = r.zadd(keys[0], {'j1': 100, 'j2': 200, 'j3': 300})
            due_eval = r.eval(DELAYED_SCRIPT, 2, *keys, 250)
            sha = r.script_load(DELAYED_SCRIPT)
            return {'added': added, 'due_eval': due_eval, 'sha': sha,
                    'due_evalsha': r.evalsha(sha, 2, *keys, 350),
                    'due_none': r.evalsha(sha, 2, *keys, 400)}
        if check == 'lpop_count':
            q = P + ':q'
            return {'pushed': r.rpush(q, 'a', 'b', 'c', 'd', 'e'), 'first': r.lpop(q, 2),
                    'rest': r.lpop(q, 10), 'missing': r.lpop(q, 2),
                    'pushed_again': r.rpush(q, 'f', 'g'), 'one': r.lpop(q, 1)}
        if check == 'pipeline':
            p = r.pipeline(transaction=False)
            for i in range(100):
                p.rpush(P + ':p', i)
                p.lindex(P + ':p', -1)
            return {'replies': p.execute()}
        if check == 'multi':
            p = r.pipeline(transaction=True)
            p.lpush(P + ':q', 'a').lpush(P + ':q', 'b').incr(P + ':n')
            return {'exec': p.execute()}
        if check == 'watch':
            k, side = P + ':w', P + ':side'
            other = self.redis_py()
            r.set(k, 'v0')
            with r.pipeline() as p:
                p.watch(k)
                read = p.get(k)
                other.set(k, 'theirs')
                p.multi()
                p.set(k, 'mine').incr(side)
                try:
                    aborted = p.execute()
                except redis.WatchError:
                    aborted = None   # redis-py reports a watch conflict this way
                p.watch(k)
                p.multi()
                p.set(k, 'mine').incr(side)
                committed = ['OK' if v is True else v for v in p.execute()]
            return {'read': read, 'aborted': aborted, 'committed': committed}
        if check == 'pubsub':
            return self.pubsub_py(r, P)
        if check == 'select':
            r3 = self.redis_py(db=3)
            return {'pushed': r3.rpush(P + ':q', 'a', 'b'), 'popped': r3.lpop(P + ':q')}
        if check == 'blmove':
            q, work = P + ':q', P + ':work'
            pushed = r.lpush(q, 'j1', 'j2')
            moved = r.blmove(q, work, 1, 'RIGHT', 'LEFT')
            timeout = r.blmove(P + ':empty', work, 0.1, 'RIGHT', 'LEFT')
            other = self.redis_py()
            pushed_while, woken = self.blocked_py(
                lambda: r.blmove(P + ':q2', work, 5, 'RIGHT', 'LEFT'),
                lambda: other.lpush(P + ':q2', 'j3'))
            return {'pushed': pushed, 'moved': moved, 'timeout': timeout,
                    'pushed_while_blocked': pushed_while, 'woken': woken,
                    'acked': r.lrem(work, 1, moved)}
        if check == 'binary_1mb':
            b = self.redis_py(decode_responses=False)
            ok = b.set(P + ':bin', BINARY)
            got = b.get(P + ':bin')
            pushed = b.rpush(P + ':bq', BINARY)
            popped = b.rpop(P + ':bq')
            return {'set': 'OK' if ok is True else ok,
                    'get_len': len(got), 'get_sha256': hashlib.sha256(got).hexdigest(),
                    'pushed': pushed,
                    'pop_len': len(popped), 'pop_sha256': hashlib.sha256(popped).hexdigest()}
        raise ValueError(check)

    def pubsub_py(self, r, P):
        ch, pat = P + ':ch', P + ':news.*'
        ps = self.redis_py().pubsub()
        self.addCleanup(ps.close)

        def next_messages(n, kinds):
            got = []
            deadline = time.monotonic() + WAIT
            while len(got) < n and time.monotonic() < deadline:
                m = ps.get_message(timeout=0.1)
                if m is not None and m['type'] in kinds:
                    got.append(m)
            return got
        ps.subscribe(ch)
        ps.psubscribe(pat)
        confirmed = next_messages(2, ('subscribe', 'psubscribe'))
        self.assertEqual(len(confirmed), 2, confirmed)
        published = [r.publish(ch, 'one'), r.publish(P + ':news.x', 'two')]
        messages = []
        for m in next_messages(2, ('message', 'pmessage')):
            if m['type'] == 'message':
                messages.append(['message', m['channel'], m['data']])
            else:
                messages.append(['pmessage', m['pattern'], m['channel'], m['data']])
        ps.unsubscribe(ch)
        ps.punsubscribe(pat)
        confirmed = next_messages(2, ('unsubscribe', 'punsubscribe'))
        self.assertEqual(len(confirmed), 2, confirmed)
        return {'published': published, 'messages': messages,
                'published_after': [r.publish(ch, 'lost'), r.publish(P + ':news.y', 'lost')]}

    # --- node-redis, ioredis -----------------------------------------------------

    def observe_node(self, client):
        """An observe function for client: its first call runs
        node/compat.js once (every check); a run that fails fails each check
        with its error."""
        run = {}

        def results():
            if not run:
                run['out'] = self.run_node(client)
            return run['out']

        def observe(check, P):
            out = results()
            if 'error' in out:
                self.fail(out['error'])
            got = out['results'][check]
            if 'error' in got:
                self.fail(got['error'])
            return got
        return observe

    def run_node(self, client):
        if self.node is None:
            return {'error': 'node is not installed: run scripts/setup'}
        pkg = 'ioredis' if client == 'ioredis' else 'redis'
        if not os.path.isdir(os.path.join(HERE, 'node_modules', pkg)):
            return {'error': '%s is missing from %s: run scripts/setup'
                    % (pkg, os.path.join(HERE, 'node_modules'))}
        try:
            skip = getattr(self, 'SKIP_CHECKS', {})
            only = [c for c in CHECK_NAMES if c not in skip] if skip else []
            env = dict(os.environ, COMPAT_HASH_TAG='1' if getattr(self, 'HASH_TAG', False) else '',
                       COMPAT_NODE_PORTS=','.join(str(p) for p in getattr(self, 'NODE_PORTS', ())))
            p = subprocess.run([self.node, NODE_DRIVER, str(self.ferry.port), client,
                                key_prefix(self)] + only, env=env,
                               capture_output=True, text=True, timeout=NODE_TIMEOUT, cwd=HERE)
        except subprocess.TimeoutExpired:
            return {'error': 'node %s ran past %d s' % (client, NODE_TIMEOUT)}
        try:
            out = json.loads(p.stdout.strip().splitlines()[-1])
        except (IndexError, ValueError):
            return {'error': 'node %s (exit %d) printed no JSON: %s %s' % (
                client, p.returncode, p.stdout[-1000:], p.stderr[-1000:])}
        if 'error' in out:
            out['error'] = 'node %s: %s %s' % (client, out['error'], p.stderr[-1000:])
        return out

    # --- redis-cli -----------------------------------------------------------------

    def cli_argv(self, client, raw=False):
        proto = '-3' if client == 'redis-cli-3' else '-2'
        # -2 sends nothing at connect: on the wire this is plain redis-cli;
        # --json only changes how replies are printed
        return ['redis-cli', '-p', str(self.ferry.port), proto, '--raw' if raw else '--json']

    def cli_run(self, client, args, stdin=None, raw=False, flags=()):
        argv = self.cli_argv(client, raw) + list(flags) + list(args)
        try:
            p = subprocess.run(argv, input=stdin, capture_output=True, timeout=CLI_TIMEOUT)
        except subprocess.TimeoutExpired as e:
            self.fail('%r got no answer in %d s; it printed %r' % (argv, CLI_TIMEOUT, e.stdout))
        err = p.stderr.decode(errors='replace')
        # redis-cli -3 falls back to RESP2 when HELLO 3 fails, saying so here
        self.assertEqual((p.returncode, err), (0, ''), '%r: %r' % (argv[5:], p.stdout[-300:]))
        return p.stdout

    def cli(self, client, *args, flags=()):
        """One command line; its reply as redis-cli --json printed it."""
        return json.loads(self.cli_run(client, [str(a) for a in args], flags=flags))

    def cli_script(self, client, lines, flags=()):
        """Commands typed on one connection (redis-cli reading its input);
        the replies in order."""
        text = ''.join(' '.join(cli_quote(str(a)) for a in cmd) + '\n' for cmd in lines)
        out = self.cli_run(client, [], stdin=text.encode(), flags=flags).decode()
        return [json.loads(l) for l in out.splitlines()]

    def cli_open(self, client, *args):
        lines = Lines(self.cli_argv(client) + [str(a) for a in args])
        self.addCleanup(lines.stop)
        return lines

    def cli_blocked(self, client, block_args, push_args):
        """A redis-cli blocked on block_args until Redis counts it, then
        push_args from another redis-cli; [push's reply, the blocked reply]."""
        base = self.settled_blocked()
        lines = self.cli_open(client, *block_args)
        self.wait_blocked(base)
        pushed = self.cli(client, *push_args)
        got = lines.json()
        lines.stop()
        self.assertEqual(''.join(lines.err), '')
        return [pushed, got]

    def observe_cli(self, client, check, P):
        if check == 'fifo':
            out = self.cli_script(client, [['LPUSH', P + ':q', v] for v in
                                           ('a1', 'a2', 'a3', 'a4', 'a5')] +
                                  [['RPOP', P + ':q']] * 3)
            return {'pushes': out[:5], 'pops': out[5:]}
        if check == 'priority_brpop':
            hi, lo = P + ':high', P + ':low'
            out = self.cli_script(client, [['LPUSH', lo, 'l1', 'l2'], ['LPUSH', hi, 'h1']] +
                                  [['BRPOP', hi, lo, 1]] * 3 + [['BRPOP', hi, lo, 0.1]])
            pushed, woken = self.cli_blocked(client, ['BRPOP', hi, lo, 5], ['LPUSH', lo, 'l3'])
            return {'setup': out[:2], 'pops': out[2:5], 'timeout': out[5],
                    'pushed_while_blocked': pushed, 'woken': woken}
        if check == 'bzpopmin':
            z = P + ':z'
            out = self.cli_script(client, [['ZADD', z, 30, 'c', 10, 'a', 20, 'b'],
                                           ['BZPOPMIN', z, 1], ['BZPOPMIN', z, 1],
                                           ['BZPOPMIN', P + ':none', 0.1]])
            pops = [o and [o[0], o[1], float(o[2])] for o in out[1:3]]
            types = [('string' if isinstance(o[2], str) else 'number') if o else None
                     for o in out[1:3]]
            return {'added': out[0], 'pops': pops, 'timeout': out[3], 'score_types': types}
        if check == 'lua_delayed':
            keys = [P + ':delayed', P + ':ready']
            added = self.cli(client, 'ZADD', keys[0], 100, 'j1', 200, 'j2', 300, 'j3')
            due_eval = self.cli(client, 'EVAL', DELAYED_SCRIPT, 2, *keys, 250)
            sha = self.cli(client, 'SCRIPT', 'LOAD', DELAYED_SCRIPT)
            return {'added': added, 'due_eval': due_eval, 'sha': sha,
                    'due_evalsha': self.cli(client, 'EVALSHA', sha, 2, *keys, 350),
                    'due_none': self.cli(client, 'EVALSHA', sha, 2, *keys, 400)}
        if check == 'lpop_count':
            q = P + ':q'
            out = self.cli_script(client, [['RPUSH', q, 'a', 'b', 'c', 'd', 'e'],
                                           ['LPOP', q, 2], ['LPOP', q, 10], ['LPOP', q, 2],
                                           ['RPUSH', q, 'f', 'g'], ['LPOP', q, 1]])
            return dict(zip(['pushed', 'first', 'rest', 'missing', 'pushed_again', 'one'], out))
        if check == 'pipeline':
            # --pipe: the whole input written at once, replies counted
            data = b''.join(resp_encode('RPUSH', P + ':p', i) + resp_encode('LINDEX', P + ':p', -1)
                            for i in range(100))
            argv = [a for a in self.cli_argv(client) if a != '--json'] + ['--pipe']
            p = subprocess.run(argv, input=data, capture_output=True, timeout=CLI_TIMEOUT)
            err = p.stderr.decode(errors='replace')
            self.assertEqual((p.returncode, err), (0, ''), p.stdout[-300:])
            return {'pipe': p.stdout.decode().strip().splitlines()[-1]}
        if check == 'multi':
            out = self.cli_script(client, [['MULTI'], ['LPUSH', P + ':q', 'a'],
                                           ['LPUSH', P + ':q', 'b'], ['INCR', P + ':n'],
                                           ['EXEC']])
            self.assertEqual(out[:4], ['OK', 'QUEUED', 'QUEUED', 'QUEUED'])
            return {'exec': out[4]}
        if check == 'watch':
            k, side = P + ':w', P + ':side'
            a = self.cli_open(client)
            a.send('SET %s v0\nWATCH %s\nGET %s\n' % (cli_quote(k), cli_quote(k), cli_quote(k)))
            self.assertEqual([a.json(), a.json()], ['OK', 'OK'])
            read = a.json()   # printed once the GET ran, so WATCH is in place
            self.assertEqual(self.cli(client, 'SET', k, 'theirs'), 'OK')
            tx = 'MULTI\nSET %s mine\nINCR %s\nEXEC\n' % (cli_quote(k), cli_quote(side))
            a.send(tx)
            out = [a.json() for _ in range(4)]
            self.assertEqual(out[:3], ['OK', 'QUEUED', 'QUEUED'])
            a.send('WATCH %s\n' % cli_quote(k) + tx)
            out2 = [a.json() for _ in range(5)]
            self.assertEqual(out2[:4], ['OK', 'OK', 'QUEUED', 'QUEUED'])
            a.stop()
            self.assertEqual(''.join(a.err), '')
            return {'read': read, 'aborted': out[3], 'committed': out2[4]}
        if check == 'pubsub':
            ch, pat = P + ':ch', P + ':news.*'
            m = self.m()
            patterns = m.pubsub_numpat()
            sub = self.cli_open(client, 'SUBSCRIBE', ch)
            psub = self.cli_open(client, 'PSUBSCRIBE', pat)
            self.assertEqual(sub.json(), ['subscribe', ch, 1])
            self.assertEqual(psub.json(), ['psubscribe', pat, 1])
            published = [self.cli(client, 'PUBLISH', ch, 'one'),
                         self.cli(client, 'PUBLISH', P + ':news.x', 'two')]
            messages = [sub.json(), psub.json()]
            for s in (sub, psub):
                s.stop()   # redis-cli leaves pub/sub by closing its connection
                self.assertEqual(''.join(s.err), '')
            # ferry drops the subscriptions of a client that closed
            wait_until(lambda: m.pubsub_numsub(ch) == [(ch, 0)] and m.pubsub_numpat() == patterns,
                       timeout=WAIT, msg='the subscriptions to end in Redis')
            return {'published': published, 'messages': messages,
                    'published_after': [self.cli(client, 'PUBLISH', ch, 'lost'),
                                        self.cli(client, 'PUBLISH', P + ':news.y', 'lost')]}
        if check == 'select':
            out = self.cli_script(client, [['RPUSH', P + ':q', 'a', 'b'], ['LPOP', P + ':q']],
                                  flags=['-n', '3'])
            return {'pushed': out[0], 'popped': out[1]}
        if check == 'blmove':
            q, work = P + ':q', P + ':work'
            out = self.cli_script(client, [['LPUSH', q, 'j1', 'j2'],
                                           ['BLMOVE', q, work, 'RIGHT', 'LEFT', 1],
                                           ['BLMOVE', P + ':empty', work, 'RIGHT', 'LEFT', 0.1]])
            pushed_while, woken = self.cli_blocked(
                client, ['BLMOVE', P + ':q2', work, 'RIGHT', 'LEFT', 5], ['LPUSH', P + ':q2', 'j3'])
            return {'pushed': out[0], 'moved': out[1], 'timeout': out[2],
                    'pushed_while_blocked': pushed_while, 'woken': woken,
                    'acked': self.cli(client, 'LREM', work, 1, out[1])}
        if check == 'binary_1mb':
            # -x: the last argument is read from standard input, byte for byte;
            # --raw prints a bulk reply as its bytes and a newline
            ok = json.loads(self.cli_run(client, ['SET', P + ':bin'], stdin=BINARY, flags=['-x']))
            got = self.cli_run(client, ['GET', P + ':bin'], raw=True)
            pushed = json.loads(self.cli_run(client, ['RPUSH', P + ':bq'], stdin=BINARY,
                                             flags=['-x']))
            popped = self.cli_run(client, ['RPOP', P + ':bq'], raw=True)
            self.assertTrue(got.endswith(b'\n') and popped.endswith(b'\n'))
            got, popped = got[:-1], popped[:-1]
            return {'set': ok, 'get_len': len(got), 'get_sha256': hashlib.sha256(got).hexdigest(),
                    'pushed': pushed, 'pop_len': len(popped),
                    'pop_sha256': hashlib.sha256(popped).hexdigest()}
        raise ValueError(check)

    # --- redis-benchmark -------------------------------------------------------------

    def bench(self, *args):
        """redis-benchmark with a custom command line: sends it exactly as
        often as -n says; exits non-zero on an error reply."""
        argv = ['redis-benchmark', '-p', str(self.ferry.port), '-q'] + [str(a) for a in args]
        p = subprocess.run(argv, capture_output=True, text=True, timeout=CLI_TIMEOUT * 3)
        self.assertEqual(p.returncode, 0, '%r: %s%s' % (argv[3:], p.stdout[-500:], p.stderr[-500:]))
        self.assertIn('requests per second', p.stdout)
        self.assertNotIn('rror', p.stdout + p.stderr)

    def observe_benchmark(self, check, P):
        """redis-benchmark sees no reply values: it runs the consumer side of
        each check (the items pushed on the master directly, since every
        request it sends is the same) and only what Redis holds afterwards
        is checked. Returns None (nothing to compare with expected())."""
        m = self.m()
        if check == 'fifo':
            m.lpush(P + ':q', 'a1', 'a2', 'a3', 'a4', 'a5')
            self.bench('-c', 1, '-n', 3, 'RPOP', P + ':q')
            self.assertEqual(m.lrange(P + ':q', 0, -1), ['a5', 'a4'])
        elif check == 'priority_brpop':
            m.lpush(P + ':low', 'l1', 'l2')
            m.lpush(P + ':high', 'h1')
            self.bench('-c', 1, '-n', 2, 'BRPOP', P + ':high', P + ':low', 1)
            self.assertEqual([m.exists(P + ':high'), m.lrange(P + ':low', 0, -1)], [0, ['l2']])
        elif check == 'bzpopmin':
            m.zadd(P + ':z', {'c': 30, 'a': 10, 'b': 20})
            self.bench('-c', 1, '-n', 2, 'BZPOPMIN', P + ':z', 1)
            self.assertEqual(m.zrange(P + ':z', 0, -1, withscores=True), [('c', 30.0)])
        elif check == 'lua_delayed':
            m.zadd(P + ':delayed', {'j1': 100, 'j2': 200, 'j3': 300})
            self.bench('-c', 1, '-n', 1, 'EVAL', DELAYED_SCRIPT, 2, P + ':delayed', P + ':ready',
                       250)
            self.assertEqual(m.zrange(P + ':delayed', 0, -1), ['j3'])
            self.assertEqual(m.lrange(P + ':ready', 0, -1), ['j2', 'j1'])
        elif check == 'lpop_count':
            m.rpush(P + ':q', 'a', 'b', 'c', 'd', 'e')
            self.bench('-c', 1, '-n', 2, 'LPOP', P + ':q', 2)
            self.assertEqual(m.lrange(P + ':q', 0, -1), ['e'])
        elif check == 'pipeline':
            # 4 connections, 16 requests in flight on each
            self.bench('-c', 4, '-P', 16, '-n', 160, 'RPUSH', P + ':p', 'x')
            self.assertEqual(m.llen(P + ':p'), 160)
            self.bench('-c', 4, '-P', 16, '-n', 64, 'RPOP', P + ':p')
            self.assertEqual(m.llen(P + ':p'), 96)
        elif check == 'multi':
            raise NotExpressible('it repeats one command; a transaction is several')
        elif check == 'watch':
            raise NotExpressible('it repeats one command; WATCH needs a sequence')
        elif check == 'pubsub':
            raise NotExpressible('it cannot subscribe')
        elif check == 'select':
            self.bench('--dbnum', 3, '-c', 1, '-n', 2, 'RPUSH', P + ':q', 'x')
            self.assertEqual(self.m(db=3).llen(P + ':q'), 2)
            self.assertEqual(m.exists(P + ':q'), 0)
        elif check == 'blmove':
            m.lpush(P + ':q', 'j1', 'j2')
            self.bench('-c', 1, '-n', 1, 'BLMOVE', P + ':q', P + ':work', 'RIGHT', 'LEFT', 1)
            self.assertEqual([m.lrange(P + ':q', 0, -1), m.lrange(P + ':work', 0, -1)],
                             [['j2'], ['j1']])
        elif check == 'binary_1mb':
            raise NotExpressible('its -d payload is a fixed filler, not bytes of our choice')
        else:
            raise ValueError(check)
        return None


class Resp2Checks(CompatChecks):
    """The RESP2 clients: all of them must pass through ferry."""

    def test_redis_py(self):
        self.run_client('redis-py', self.observe_redis_py)

    def test_node_redis_resp2(self):
        self.run_client('node-redis-resp2', self.observe_node('node-redis-resp2'))

    def test_ioredis(self):
        self.run_client('ioredis', self.observe_node('ioredis'))

    def test_redis_cli(self):
        self.run_client('redis-cli', lambda check, P: self.observe_cli('redis-cli', check, P))

    def test_redis_benchmark(self):
        self.run_client('redis-benchmark', self.observe_benchmark)


class Resp3Checks(CompatChecks):
    """The clients that ask for RESP3 (HELLO 3) when they connect."""

    def test_node_redis_default_resp3(self):
        # node-redis does not fall back: connecting fails unless HELLO 3 succeeds
        self.run_client('node-redis', self.observe_node('node-redis'))

    def test_redis_cli_resp3(self):
        # redis-cli -3 would fall back to RESP2; every run asserts it did not
        self.run_client('redis-cli-3', lambda check, P: self.observe_cli('redis-cli-3', check, P))


class CompatSentinel(SentinelMode, Resp2Checks, unittest.TestCase):
    pass


class CompatFixedMaster(FixedMasterMode, Resp2Checks, unittest.TestCase):
    pass


class CompatResp3Sentinel(SentinelMode, Resp3Checks, unittest.TestCase):
    pass


class CompatResp3FixedMaster(FixedMasterMode, Resp3Checks, unittest.TestCase):
    pass


# --- the matrix ----------------------------------------------------------------------

def _modes():
    seen = []
    for mode, _, _ in RESULTS:
        if mode not in seen:
            seen.append(mode)
    return seen


def matrix_text():
    """The matrix per mode, as plain text."""
    out = []
    width = max(len(c) for c in CHECK_NAMES)
    for mode in _modes():
        clients = [c for c, _, _ in CLIENTS if any((mode, c, k) in RESULTS for k in CHECK_NAMES)]
        out.append('compatibility matrix (%s):' % mode)
        out.append('  %-*s  %s' % (width, '', '  '.join('%-16s' % c for c in clients)))
        for check in CHECK_NAMES:
            cells = [RESULTS.get((mode, c, check), '-') for c in clients]
            out.append('  %-*s  %s' % (width, check, '  '.join('%-16s' % x for x in cells)))
        fails = sorted((k, v) for k, v in FAIL_TEXT.items() if k[0] == mode)
        for (_, client, check), text in fails:
            out.append('  FAIL %s, %s: %s' % (client, check, text))
    return '\n'.join(out)


def _cell(client, check, modes):
    got = [RESULTS.get((mode, client, check)) for mode in modes]
    if any(g is None for g in got):
        return 'not run'
    if all(g == 'n/a' for g in got):
        return 'n/a'
    if all(g == 'ok' for g in got):
        return 'ok'
    if all(g == 'FAIL (NOPROTO)' for g in got):
        return 'pending: RESP3'
    return ', '.join('%s %s' % (mode, g) for mode, g in zip(modes, got) if g != 'ok')


def matrix_markdown():
    """One table, both modes: a cell is ok only if it passed in every mode."""
    modes = _modes()
    lines = ['| check | %s |' % ' | '.join(t.format(installed_version(c)) for c, t, _ in CLIENTS),
             '| --- |%s' % (' --- |' * len(CLIENTS))]
    for check, title in CHECKS:
        lines.append('| %s | %s |' % (title, ' | '.join(_cell(c, check, modes)
                                                       for c, _, _ in CLIENTS)))
    where = 'Redis directly' if DIRECT else 'ferry'
    lines += ['', 'Run through %s, in these modes: %s.' % (where, ', '.join(modes) or 'none')]
    fails = [(k, v) for k, v in sorted(FAIL_TEXT.items()) if RESULTS.get(k) == 'FAIL']
    if fails:
        lines += ['', 'Failures:', '']
        lines += ['- %s, %s (%s): `%s`' % (client, check, mode, text.replace('`', "'"))
                  for (mode, client, check), text in fails]
    return '\n'.join(lines) + '\n'


def tearDownModule():
    if not RESULTS:
        return
    print('\n' + matrix_text())
    path = os.environ.get('COMPAT_MATRIX')
    if path:
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(path)))
        with os.fdopen(fd, 'w') as f:
            f.write(matrix_markdown())
        os.replace(tmp, path)


load_tests = sentinel_first

if __name__ == '__main__':
    unittest.main()
