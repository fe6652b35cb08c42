"""Shared fixtures for ferry's integration tests (python3 + python3-redis).

Public API (other test files depend on it; keep it stable):

    free_port()                       -> unused 127.0.0.1 TCP port
    wait_until(pred, timeout=10.0, interval=0.02, msg='')
    RedisServer(conf=None, port=None, host='127.0.0.1', netns=None)
                                      .port .host .pid .dir .client() .stop() .kill() .log()
                                      .start() (again, same port/dir, after stop/kill)
    Ferry(redis, conf=None, extra_yaml='', wait='ping', wrap=None)
                                      (wrap: argv in front of ferry's, exec'ing it)
                                      .port .stats_port .pid .dir .config_path
                                      .client() .raw() .stop(sig) .kill() .log() .output()
    Ferry.check_config(path)          -> (exit code, stdout+stderr) of `ferry -t -c path`
    Ferry(None, sentinel=topology_or_section, ...)
                                      sentinel mode: no redis.address, a sentinel:
                                      section (master, addresses, resolve_interval_ms
                                      200, timeout_ms 500; conf overrides)
    RedisServer extras                .restart() .sigstop() .sigcont() .role()
                                      .start(write_conf=False) keeps a rewritten conf
    SentinelServer(master_name, master_port, ..., host='127.0.0.1', netns=None,
                   master_host='127.0.0.1')
                                      .port .host .pid .dir .client() .start() .stop() .kill()
                                      .log() .running()
    SentinelTopology(down_after_ms=1000, failover_timeout_ms=5000, master_name='mq',
                     redis_conf=None, replica_conf=None, redis_at=None, sentinels_at=None)
                                      1 master + 2 replicas + 3 sentinels, all in sync;
                                      redis_at / sentinels_at: (host, netns) per process;
                                      .redis .sentinels .master_name .master_port()
                                      .sentinel_addresses() .wait_failover(old_port)
                                      .restart_redis(i) .redis_by_port(p) .stop()
    ClusterTopology(masters=3, replicas=1, node_timeout_ms=2000, redis_conf=None)
                                      a Redis Cluster (redis-cli --cluster create),
                                      consistent on return: .nodes .seeds()
                                      .master_of(slot) .masters() .replicas_of(port)
                                      .kill_master(port) .wait_promoted(old_port)
                                      .reshard(from_port, to_port, n) .wait_consistent()
                                      .keyslot(key) .shards(port) .nodes_view(port)
    resp_send(sock, data)             send bytes (or a list of args, RESP-encoded)
    resp_read_reply(sock, timeout)    read exactly one reply, decoded (see below)
    resp_read_raw(sock, timeout)      read exactly one reply, as its raw bytes
    resp_encode(*args)                -> RESP array-of-bulk-strings bytes
    RespError                         returned (not raised) for '-' replies
    render_yaml(obj)                  -> YAML text for nested dicts/lists/scalars
    netns_unavailable()               -> why `ip netns` cannot be used here, or None
    NetLab(zones)                     network namespaces on one bridge (root only):
                                      .ip(zone) .netns(zone) .at(zone) .cut(a, b)
                                      .heal(a, b) .destroy(); this namespace (ferry,
                                      the test) reaches every zone at .ip(None)

host / netns (RedisServer, SentinelServer): the address a process binds (its
clients use it) and the network namespace it runs in (`ip netns exec`); the
defaults, 127.0.0.1 and this namespace, are what every other test uses.

Environment:
    FERRY_BIN          ferry binary (default <repo>/build/ferry)
    FERRY_TEST_DIRECT  =1: Ferry starts nothing and .port is the Redis port (to
                       validate tests against plain Redis; never used by CI)
    FERRY_TEST_KEEP    =1: keep temp dirs (logs, configs) after the run

Every process started here is killed at interpreter exit if a test forgot to
stop it (and, via PR_SET_PDEATHSIG, if the python process dies abruptly).
"""

import atexit
import copy
import ctypes
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

import redis

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FERRY_BIN = os.environ.get('FERRY_BIN') or os.path.join(REPO, 'build', 'ferry')
DIRECT = os.environ.get('FERRY_TEST_DIRECT') == '1'
# FERRY_TEST_WORKERS=N: every ferry this harness configures runs N event
# loops (workers: N), unless its test sets workers itself, so any suite runs
# with workers.
WORKERS = os.environ.get('FERRY_TEST_WORKERS')
KEEP = os.environ.get('FERRY_TEST_KEEP') == '1'
REDIS_SERVER = shutil.which('redis-server') or '/usr/bin/redis-server'
# FERRY_TEST_REDIS_TMPFS_MB=N: every RedisServer keeps its dir (AOF, config,
# log) on a tmpfs of its own, N MiB (root only), so a test can fill the disk
# under one node's AOF (RedisServer.fill_aof_disk). Read when a node is made.

STOP_TIMEOUT = 15.0   # seconds a process gets after SIGTERM before SIGKILL
START_TIMEOUT = 10.0  # seconds a process gets to answer PING after start

# --------------------------------------------------------------------------
# process registry and cleanup

_lock = threading.Lock()
_live = set()      # objects with _force_kill(), still possibly running
_tmpdirs = []      # temp dirs to remove at exit (unless FERRY_TEST_KEEP=1)
_mounts = []       # tmpfs mounts to unmount at exit (before the dirs go)
_ports_given = set()


def _register(obj):
    with _lock:
        _live.add(obj)


def _unregister(obj):
    with _lock:
        _live.discard(obj)


def mount_tmpfs(path, mb):
    """A tmpfs of mb MiB mounted at path (made if missing), unmounted at
    exit. Root only; raises with mount's words otherwise."""
    os.makedirs(path, exist_ok=True)
    p = subprocess.run(['mount', '-t', 'tmpfs', '-o', 'size=%dm,mode=0755' % mb, 'tmpfs', path],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True)
    if p.returncode != 0:
        raise RuntimeError('mount -t tmpfs on %s: %s' % (path, p.stdout.strip()))
    with _lock:
        _mounts.append(path)
    return path


def _mkdtemp(prefix):
    d = tempfile.mkdtemp(prefix=prefix)
    with _lock:
        _tmpdirs.append(d)
    return d


@atexit.register
def _cleanup():
    with _lock:
        live = list(_live)
    for obj in live:
        try:
            obj._force_kill()
        except Exception:
            pass
    with _lock:
        mounts = [] if KEEP else list(_mounts)   # kept: the processes left use them
    for m in mounts:
        subprocess.run(['umount', '-l', m], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    if not KEEP:
        for d in _tmpdirs:
            shutil.rmtree(d, ignore_errors=True)


def _on_sigterm(signum, frame):
    # e.g. from `timeout`: kill what we started, then die of SIGTERM as usual
    # (raising SystemExit would be caught by unittest as a test error).
    _cleanup()
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)


if threading.current_thread() is threading.main_thread():
    if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
        signal.signal(signal.SIGTERM, _on_sigterm)

try:
    _libc = ctypes.CDLL(None, use_errno=True)
except OSError:  # pragma: no cover
    _libc = None
_PR_SET_PDEATHSIG = 1


def _child_setup():
    # Runs in the child between fork and exec: die with the parent, and get
    # a process group of our own so terminal signals go to the runner only.
    os.setpgrp()
    if _libc is not None:
        _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def _spawn(argv, out_path, cwd=None, env=None):
    out = open(out_path, 'ab')
    try:
        return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, cwd=cwd, env=env,
                                preexec_fn=_child_setup, close_fds=True)
    finally:
        out.close()


def _terminate(proc, sig=signal.SIGTERM, timeout=STOP_TIMEOUT):
    """Send sig to proc, wait up to timeout, then SIGKILL. Returns the exit code
    (negative signal number if killed by a signal)."""
    if proc is None:
        return 0
    if proc.poll() is None:
        try:
            proc.send_signal(sig)
            if sig not in (signal.SIGKILL, signal.SIGSTOP, signal.SIGCONT):
                proc.send_signal(signal.SIGCONT)  # a SIGSTOPped process must see it now
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            try:
                proc.kill()
            except ProcessLookupError:
                pass
            proc.wait()
    return proc.returncode


_ADDR_IN_USE = 'address already in use'


def _wait_up(proc, check, what, timeout=START_TIMEOUT):
    """Poll check() like wait_until, but fail at once if proc exits."""
    def pred():
        if proc.poll() is not None:
            raise _Exited(proc.returncode)
        return check()
    try:
        return wait_until(pred, timeout=timeout, interval=0.02, msg=what)
    except _Exited as e:
        raise AssertionError('%s: process exited with code %s' % (what, e.args[0])) from None


class _Exited(BaseException):
    """Not an Exception: wait_until must not swallow it."""


def _size(path):
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def _read(path):
    try:
        with open(path, 'r', errors='replace') as f:
            return f.read()
    except OSError:
        return ''

# --------------------------------------------------------------------------
# small helpers


def free_port():
    """An unused loopback TCP port (not one handed out before in this run)."""
    for _ in range(100):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            s.bind(('127.0.0.1', 0))
            port = s.getsockname()[1]
        finally:
            s.close()
        with _lock:
            if port not in _ports_given:
                _ports_given.add(port)
                return port
    raise RuntimeError('free_port: no unused port found')


def wait_until(pred, timeout=10.0, interval=0.02, msg=''):
    """Call pred() until it returns something truthy (which is returned), or
    raise AssertionError(msg) after timeout seconds. Exceptions raised by pred
    count as 'not yet'; the last one is reported on timeout."""
    deadline = time.monotonic() + timeout
    last_exc = None
    while True:
        try:
            v = pred()
            if v:
                return v
            last_exc = None
        except Exception as e:  # noqa: BLE001 - polled, reported below
            last_exc = e
        if time.monotonic() >= deadline:
            text = 'timed out after %.1fs waiting for %s' % (
                timeout, msg or getattr(pred, '__name__', 'condition'))
            if last_exc is not None:
                text += ' (last error: %r)' % (last_exc,)
            raise AssertionError(text)
        time.sleep(interval)


def _yaml_scalar(v):
    if v is None:
        return 'null'
    if v is True:
        return 'true'
    if v is False:
        return 'false'
    if isinstance(v, (int, float)):
        return repr(v)
    return json.dumps(str(v))  # a JSON string is a valid double-quoted YAML scalar


def _yaml_key(k):
    k = str(k)
    return k if re.fullmatch(r'[A-Za-z_][A-Za-z0-9_.-]*', k) else json.dumps(k)


def render_yaml(obj, indent=0):
    """YAML text for nested dicts / lists / scalars (block style)."""
    pad = '  ' * indent
    lines = []
    if isinstance(obj, dict):
        if not obj:
            return pad + '{}\n'
        for k, v in obj.items():
            if isinstance(v, dict) and v:
                lines.append('%s%s:\n%s' % (pad, _yaml_key(k), render_yaml(v, indent + 1)))
            elif isinstance(v, (list, tuple)) and v:
                lines.append('%s%s:\n%s' % (pad, _yaml_key(k), render_yaml(v, indent + 1)))
            elif isinstance(v, dict):
                lines.append('%s%s: {}\n' % (pad, _yaml_key(k)))
            elif isinstance(v, (list, tuple)):
                lines.append('%s%s: []\n' % (pad, _yaml_key(k)))
            else:
                lines.append('%s%s: %s\n' % (pad, _yaml_key(k), _yaml_scalar(v)))
    elif isinstance(obj, (list, tuple)):
        if not obj:
            return pad + '[]\n'
        for v in obj:
            if isinstance(v, (dict, list, tuple)):
                sub = render_yaml(v, indent + 1)
                lines.append('%s- %s' % (pad, sub.lstrip(' ')))
            else:
                lines.append('%s- %s\n' % (pad, _yaml_scalar(v)))
    else:
        lines.append(pad + _yaml_scalar(obj) + '\n')
    return ''.join(lines)


def _merge(base, over):
    """Deep-merge over into base (in place). A None value deletes the key."""
    for k, v in over.items():
        if v is None:
            base.pop(k, None)
        elif isinstance(v, dict) and isinstance(base.get(k), dict):
            _merge(base[k], v)
        else:
            base[k] = v
    return base


def _needs_one_loop(c, extra_yaml):
    """The test sets workers itself (in extra YAML)."""
    return bool(re.search(r'^workers\s*:', extra_yaml or '', re.M))


def _port_of(addr):
    """Port of 'host:port' / '[v6]:port'; None for unix:/path or junk."""
    if not isinstance(addr, str) or addr.startswith('unix:'):
        return None
    m = re.search(r':(\d+)$', addr)
    return int(m.group(1)) if m else None

# --------------------------------------------------------------------------
# network namespaces (tests that cut the network)

IP_BIN = shutil.which('ip') or next((p for p in ('/usr/sbin/ip', '/sbin/ip', '/usr/bin/ip')
                                     if os.access(p, os.X_OK)), None)
_NETLAB_PREFIX = 'ferrylab-'   # namespace names: ferrylab-<pid>-<n>-<zone>


def _in_netns(netns, argv):
    """argv run inside network namespace netns (None: here). `ip netns exec`
    execs the program itself, so the pid is the program's."""
    return list(argv) if netns is None else [IP_BIN, 'netns', 'exec', netns] + list(argv)


def _ip(*args, check=True):
    p = subprocess.run([IP_BIN] + [str(a) for a in args], stdin=subprocess.DEVNULL,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=20)
    if check and p.returncode != 0:
        raise RuntimeError('ip %s: %s' % (' '.join(map(str, args)), p.stdout.decode().strip()))
    return p.stdout.decode()


def netns_unavailable():
    """Why network namespaces cannot be used here (a string), or None."""
    if os.geteuid() != 0:
        return 'not root (ip netns needs root)'
    if IP_BIN is None:
        return 'no ip command (iproute2) found'
    probe = '%sprobe-%d' % (_NETLAB_PREFIX, os.getpid())
    try:
        _ip('netns', 'add', probe)
    except (RuntimeError, OSError, subprocess.SubprocessError) as e:
        return 'ip netns add failed: %s' % e
    _ip('netns', 'del', probe, check=False)
    return None


class NetLab:
    """Network namespaces joined by one bridge, for tests that cut the network.

    NetLab(['m', 'r']) makes a namespace per zone, each with one address on a
    private /24 (lab.ip('m'), lab.netns('m')); this namespace gets the .1
    address on the same bridge, so the test and ferry reach every zone. The
    bridge lives in a hub namespace of its own: no forwarding or firewall of
    this namespace is involved, and deleting the hub removes every link.
    cut(a, b) drops all traffic between two zones (blackhole routes on both
    sides: open connections stall, as in a real partition); heal(a, b) undoes
    it. Names are unique per run (they carry the pid); destroy() removes
    everything, and runs at interpreter exit if a test forgot; namespaces left
    by a run whose process is gone are removed when the next lab starts.
    Needs root (see netns_unavailable())."""

    _count = 0

    def __init__(self, zones):
        NetLab._count += 1
        self.tag = '%s%d-%d' % (_NETLAB_PREFIX, os.getpid(), NetLab._count)
        self.hub = self.tag + '-hub'
        self.zones = list(zones)
        self.uplink = 'fl%dx%d' % (os.getpid(), NetLab._count)   # <= 15 characters
        self._ns = {}
        self._made = []   # namespaces created, hub first
        self.cuts = set()
        self._sweep()
        self.subnet = self._pick_subnet()
        _register(self)
        try:
            self._build()
        except BaseException:
            self.destroy()
            raise

    @staticmethod
    def _sweep():
        for line in _ip('netns', 'list', check=False).splitlines():
            name = line.split()[0] if line.split() else ''
            m = re.match(re.escape(_NETLAB_PREFIX) + r'(?:probe-)?(\d+)', name)
            if m and not os.path.exists('/proc/%s' % m.group(1)):
                _ip('netns', 'del', name, check=False)

    @staticmethod
    def _pick_subnet():
        used = _ip('-4', 'addr', check=False) + _ip('-4', 'route', 'show', 'table', 'all',
                                                    check=False)
        for _ in range(200):
            net = '10.%d.%d' % (200 + int.from_bytes(os.urandom(1), 'big') % 50,
                                int.from_bytes(os.urandom(1), 'big'))
            if net + '.' not in used:
                return net
        raise RuntimeError('NetLab: no free 10.x.y.0/24 found')

    def _build(self):
        self._made.append(self.hub)
        _ip('netns', 'add', self.hub)
        _ip('-n', self.hub, 'link', 'add', 'br0', 'type', 'bridge')
        _ip('-n', self.hub, 'link', 'set', 'br0', 'up')
        _ip('link', 'add', self.uplink, 'type', 'veth', 'peer', 'name', 'up0', 'netns', self.hub)
        _ip('-n', self.hub, 'link', 'set', 'up0', 'master', 'br0', 'up')
        _ip('addr', 'add', '%s.1/24' % self.subnet, 'dev', self.uplink)
        _ip('link', 'set', self.uplink, 'up')
        for i, z in enumerate(self.zones):
            ns = '%s-%s' % (self.tag, z)
            self._made.append(ns)
            _ip('netns', 'add', ns)
            self._ns[z] = ns
            _ip('-n', self.hub, 'link', 'add', 'z%d' % i, 'type', 'veth', 'peer', 'name',
                'eth0', 'netns', ns)
            _ip('-n', self.hub, 'link', 'set', 'z%d' % i, 'master', 'br0', 'up')
            _ip('-n', ns, 'link', 'set', 'lo', 'up')
            _ip('-n', ns, 'addr', 'add', '%s/24' % self.ip(z), 'dev', 'eth0')
            _ip('-n', ns, 'link', 'set', 'eth0', 'up')

    def ip(self, zone):
        """The address of zone (None: this namespace's end of the bridge)."""
        return '%s.%d' % (self.subnet, 1 if zone is None else self.zones.index(zone) + 2)

    def netns(self, zone):
        """The namespace name of zone (for RedisServer(netns=...) and the like)."""
        return self._ns[zone]

    def at(self, zone):
        """(host, netns) of zone, as SentinelTopology's redis_at/sentinels_at want."""
        return self.ip(zone), self.netns(zone)

    def cut(self, a, b):
        """Drop every packet between zones a and b, both ways."""
        for x, y in ((a, b), (b, a)):
            _ip('-n', self.netns(x), 'route', 'add', 'blackhole', '%s/32' % self.ip(y))
        self.cuts.add((a, b))

    def heal(self, a, b):
        for x, y in ((a, b), (b, a)):
            _ip('-n', self.netns(x), 'route', 'del', 'blackhole', '%s/32' % self.ip(y),
                check=False)
        self.cuts.discard((a, b))

    def destroy(self):
        """Remove the namespaces (stop what runs in them first: a namespace
        lives on while a process is inside) and, with the hub, every link."""
        for ns in reversed(self._made):
            _ip('netns', 'del', ns, check=False)
        self._made = []
        if self.uplink in _ip('link', 'show', check=False):
            _ip('link', 'del', self.uplink, check=False)
        _unregister(self)

    def _force_kill(self):
        self.destroy()

    def __repr__(self):
        return '<NetLab %s %s.0/24 zones=%r>' % (self.tag, self.subnet, self.zones)

# --------------------------------------------------------------------------
# RESP helpers for raw protocol tests


class RespError(Exception):
    """A '-' error reply. resp_read_reply returns it (does not raise it)."""

    def __eq__(self, other):
        return isinstance(other, RespError) and str(self) == str(other)

    def __hash__(self):
        return hash(str(self))


def resp_encode(*args):
    """Encode a command as a RESP array of bulk strings."""
    if len(args) == 1 and isinstance(args[0], (list, tuple)):
        args = args[0]
    out = [b'*%d\r\n' % len(args)]
    for a in args:
        if isinstance(a, str):
            a = a.encode()
        elif isinstance(a, (int, float)):
            a = str(a).encode()
        out.append(b'$%d\r\n%s\r\n' % (len(a), a))
    return b''.join(out)


def resp_send(sock, data):
    """Send raw bytes (str is utf-8 encoded; a list/tuple is resp_encode()d)."""
    if isinstance(data, (list, tuple)):
        data = resp_encode(*data)
    elif isinstance(data, str):
        data = data.encode()
    sock.sendall(data)


class _Reader:
    """Reads from a socket without ever consuming bytes past the current reply
    (MSG_PEEK for lines, exact-size recv for payloads), so raw recv() calls and
    further reads on the same socket see exactly what follows."""

    def __init__(self, sock, timeout):
        self.sock = sock
        self.deadline = time.monotonic() + timeout
        self.raw = bytearray()

    def _left(self):
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise socket.timeout('timed out reading a RESP reply')
        return left

    def line(self):
        buf = bytearray()
        while True:
            self.sock.settimeout(self._left())
            chunk = self.sock.recv(65536, socket.MSG_PEEK)
            if not chunk:
                raise ConnectionError('connection closed by peer (partial: %r)'
                                      % bytes(self.raw + buf))
            if buf.endswith(b'\r') and chunk.startswith(b'\n'):
                take = 1  # CRLF split across two reads
            else:
                i = chunk.find(b'\r\n')
                take = i + 2 if i >= 0 else len(chunk)
            got = self.exact_nocopy(take)
            buf += got
            if buf.endswith(b'\r\n'):
                self.raw += buf
                return bytes(buf[:-2])

    def exact_nocopy(self, n):
        buf = bytearray()
        while len(buf) < n:
            self.sock.settimeout(self._left())
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise ConnectionError('connection closed by peer (partial: %r)'
                                      % bytes(self.raw + buf))
            buf += chunk
        return bytes(buf)

    def exact(self, n):
        b = self.exact_nocopy(n)
        self.raw += b
        return b

    def reply(self):
        line = self.line()
        if not line:
            raise ValueError('protocol error: empty line')
        t, rest = line[:1], line[1:]
        if t == b'+':
            return rest.decode(errors='replace')
        if t == b'-':
            return RespError(rest.decode(errors='replace'))
        if t == b':':
            return int(rest)
        if t in (b'$', b'=', b'!'):  # bulk, RESP3 verbatim, RESP3 bulk error
            n = int(rest)
            if n < 0:
                return None
            data = self.exact(n + 2)
            if data[-2:] != b'\r\n':
                raise ValueError('protocol error: bulk not terminated by CRLF')
            if t == b'!':
                return RespError(data[:-2].decode(errors='replace'))
            return data[:-2]
        if t in (b'*', b'~', b'>'):  # array, RESP3 set, RESP3 push
            n = int(rest)
            if n < 0:
                return None
            return [self.reply() for _ in range(n)]
        if t == b'%':  # RESP3 map
            n = int(rest)
            return {_hashable(self.reply()): self.reply() for _ in range(n)}
        if t == b'|':  # RESP3 attribute: read and drop, then the real reply
            n = int(rest)
            for _ in range(2 * n):
                self.reply()
            return self.reply()
        if t == b'_':
            return None
        if t == b'#':
            return rest == b't'
        if t == b',':
            return float(rest)
        if t == b'(':
            return int(rest)
        raise ValueError('protocol error: unknown reply type %r in %r' % (t, line))


def _hashable(v):
    return tuple(v) if isinstance(v, list) else v


def _with_timeout(sock, timeout, fn):
    old = sock.gettimeout()
    try:
        return fn(_Reader(sock, timeout))
    finally:
        try:
            sock.settimeout(old)
        except OSError:
            pass


def resp_read_reply(sock, timeout=10.0):
    """Read exactly one reply and decode it: '+' -> str, '-' -> RespError
    (returned), ':' -> int, '$' -> bytes or None, '*' -> list or None (RESP3
    types too). Raises socket.timeout after timeout seconds, ConnectionError
    if the peer closes first. Consumes no byte beyond the reply."""
    return _with_timeout(sock, timeout, lambda r: r.reply())


def resp_read_raw(sock, timeout=10.0):
    """Like resp_read_reply but returns the reply's exact bytes."""
    def go(r):
        r.reply()
        return bytes(r.raw)
    return _with_timeout(sock, timeout, go)


def _ping(port=None, unix=None, timeout=2.0, password=None, username=None, host='127.0.0.1'):
    """True if a PING on a new connection gets +PONG (or, with a password
    configured but not given, -NOAUTH: the server did answer)."""
    if unix:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(timeout)
        s.connect(unix)
    else:
        s = socket.create_connection((host, port), timeout=timeout)
    try:
        if password is not None:
            args = ['AUTH', username, password] if username else ['AUTH', password]
            resp_send(s, args)
            r = resp_read_reply(s, timeout)
            if isinstance(r, RespError):
                raise AssertionError('AUTH failed: %s' % r)
        resp_send(s, b'PING\r\n')
        r = resp_read_reply(s, timeout)
        if r == 'PONG':
            return True
        if isinstance(r, RespError) and str(r).startswith('NOAUTH'):
            return True
        raise AssertionError('PING answered %r' % (r,))
    finally:
        s.close()

# --------------------------------------------------------------------------
# redis-server


def _redis_value(v):
    if v is True:
        return 'yes'
    if v is False:
        return 'no'
    v = str(v)
    return '""' if v == '' else v


class RedisServer:
    """A redis-server on 127.0.0.1:<free port> in a fresh temp dir.

    conf: redis.conf directives merged over the defaults; a value may be a
    list (directive repeated, e.g. 'save': ['900 1', '60 100']), True/False
    (yes/no) or None (drop a default). Values are written verbatim after the
    directive name, so 'save': '900 1' is two arguments.

    host: the address it binds (and clients use); netns: the name of a
    network namespace (`ip netns`) to run it in, None for this one. Both are
    for tests that cut the network (see NetLab)."""

    def __init__(self, conf=None, port=None, host='127.0.0.1', netns=None):
        self.host = host
        self.netns = netns
        self.dir = _mkdtemp('ferry-redis-')
        # The whole dir on a tmpfs of its own (FERRY_TEST_REDIS_TMPFS_MB):
        # Redis renames its AOF files from dir into its AOF folder, which
        # must be one file system.
        tmpfs_mb = int(os.environ.get('FERRY_TEST_REDIS_TMPFS_MB') or 0)
        self.on_tmpfs = tmpfs_mb > 0
        if self.on_tmpfs:
            mount_tmpfs(self.dir, tmpfs_mb)
        self.conf_path = os.path.join(self.dir, 'redis.conf')
        self.log_path = os.path.join(self.dir, 'redis.log')
        self.out_path = os.path.join(self.dir, 'redis.out')
        self.user_conf = dict(conf or {})
        self._fixed_port = port is not None or 'port' in self.user_conf
        self.port = int(self.user_conf.get('port') or port or free_port())
        self.proc = None
        self.pid = None
        self.start()

    def _conf(self):
        c = {
            'bind': self.host,
            'port': self.port,
            'daemonize': 'no',
            'dir': self.dir,
            'logfile': self.log_path,
            'loglevel': 'notice',
            'save': '',
            # ferry turns AOF on anyway; starting with it on spares Redis the
            # initial AOF rewrite, during which it refuses to exit on SIGTERM
            'appendonly': 'yes',
            'protected-mode': 'no',
            'enable-debug-command': 'yes',
            'enable-protected-configs': 'yes',
        }
        for k, v in self.user_conf.items():
            if v is None:
                c.pop(k, None)
            else:
                c[k] = v
        c['port'] = self.port
        lines = []
        for k, v in c.items():
            for item in (v if isinstance(v, (list, tuple)) else [v]):
                lines.append('%s %s' % (k, _redis_value(item)))
        return '\n'.join(lines) + '\n'

    def start(self, write_conf=True):
        """Start (or restart after stop/kill) on the same port and dir.
        write_conf=False reuses the config file as it is (Redis or Sentinel may
        have rewritten it, e.g. with CONFIG REWRITE after REPLICAOF)."""
        if self.proc is not None and self.proc.poll() is None:
            raise RuntimeError('redis-server already running (pid %d)' % self.proc.pid)
        for attempt in range(3):
            if write_conf or not os.path.exists(self.conf_path):
                with open(self.conf_path, 'w') as f:
                    f.write(self._conf())
            log_start = _size(self.log_path)
            self.proc = _spawn(_in_netns(self.netns, [REDIS_SERVER, self.conf_path]),
                               self.out_path, cwd=self.dir)
            self.pid = self.proc.pid
            _register(self)
            try:
                _wait_up(self.proc, self._up, 'redis-server PING on port %d' % self.port)
                return self
            except AssertionError as e:
                _terminate(self.proc, signal.SIGKILL)
                _unregister(self)
                newlog = self.log()[log_start:]
                if (not self._fixed_port and write_conf and attempt < 2
                        and _ADDR_IN_USE in newlog.lower()):
                    self.port = free_port()
                    continue
                raise AssertionError('%s\n--- redis log (%s) ---\n%s\n--- output ---\n%s' % (
                    e, self.log_path, newlog[-4000:], _read(self.out_path)[-2000:])) from None

    def _up(self):
        pw = self.user_conf.get('requirepass')
        return _ping(self.port, password=pw if pw else None, timeout=1.0, host=self.host)

    def running(self):
        return self.proc is not None and self.proc.poll() is None

    def client(self, **kw):
        kw.setdefault('socket_timeout', 10)
        kw.setdefault('socket_connect_timeout', 5)
        return redis.Redis(host=self.host, port=self.port, decode_responses=True, **kw)

    def stop(self):
        """SIGTERM, bounded wait, then SIGKILL. Returns the exit code."""
        rc = _terminate(self.proc, signal.SIGTERM)
        _unregister(self)
        return rc

    def kill(self):
        rc = _terminate(self.proc, signal.SIGKILL)
        _unregister(self)
        return rc

    def _force_kill(self):
        _terminate(self.proc, signal.SIGKILL)

    def restart(self):
        """Start again after kill/stop: same port, dir and config file (as
        Redis may have rewritten it), so AOF/RDB data is loaded again."""
        if self.running():
            self.kill()
        return self.start(write_conf=False)

    def sigstop(self):
        """Freeze the process (SIGSTOP); undo with sigcont()."""
        if self.running():
            os.kill(self.proc.pid, signal.SIGSTOP)

    def fill_aof_disk(self):
        """Fill the tmpfs under this node's AOF folder (made with
        FERRY_TEST_REDIS_TMPFS_MB) to the last byte: its next AOF write fails
        with ENOSPC (with appendfsync always Redis then exits). Undo with
        free_aof_disk(). Returns the bytes written."""
        if not self.on_tmpfs:
            raise RuntimeError('no tmpfs under the AOF (FERRY_TEST_REDIS_TMPFS_MB unset)')
        chunk, n = b'\0' * (1 << 20), 0
        with open(os.path.join(self.dir, 'filler'), 'wb', buffering=0) as f:
            for size in (1 << 20, 4096, 1):
                piece = chunk[:size]
                while True:
                    try:
                        n += f.write(piece)
                    except OSError:
                        break
        return n

    def free_aof_disk(self):
        if self.on_tmpfs:
            try:
                os.unlink(os.path.join(self.dir, 'filler'))
            except FileNotFoundError:
                pass

    def sigcont(self):
        if self.running():
            os.kill(self.proc.pid, signal.SIGCONT)

    def role(self, timeout=2.0):
        """First element of ROLE ('master', 'slave'), on a new connection."""
        c = self.client(socket_timeout=timeout, socket_connect_timeout=timeout)
        try:
            r = c.execute_command('ROLE')
            return r[0] if isinstance(r, (list, tuple)) else r
        finally:
            c.close()

    def log(self):
        return _read(self.log_path)

    def __repr__(self):
        return '<RedisServer %s:%s pid=%s>' % (self.host, self.port, self.pid)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()

# --------------------------------------------------------------------------
# redis-sentinel

REDIS_SENTINEL = shutil.which('redis-sentinel')


def _kv(flat):
    """['k1', 'v1', 'k2', 'v2'] (or a dict) -> dict."""
    if isinstance(flat, dict):
        return flat
    return {flat[i]: flat[i + 1] for i in range(0, len(flat) - 1, 2)}


def _sentinel_argv(conf_path):
    if REDIS_SENTINEL:
        return [REDIS_SENTINEL, conf_path]
    return [REDIS_SERVER, conf_path, '--sentinel']


class SentinelServer:
    """A redis-sentinel on 127.0.0.1:<free port> in a fresh temp dir, with its
    own (writable: Sentinel rewrites it) sentinel.conf monitoring one master.
    host / netns: as for RedisServer; master_host: the master's address."""

    def __init__(self, master_name, master_port, quorum=2, down_after_ms=1000,
                 failover_timeout_ms=5000, parallel_syncs=2, extra=None, host='127.0.0.1',
                 netns=None, master_host='127.0.0.1'):
        self.host = host
        self.netns = netns
        self.master_host = master_host
        self.dir = _mkdtemp('ferry-sentinel-')
        self.conf_path = os.path.join(self.dir, 'sentinel.conf')
        self.log_path = os.path.join(self.dir, 'sentinel.log')
        self.out_path = os.path.join(self.dir, 'sentinel.out')
        self.master_name = master_name
        self.master_port = master_port
        self.quorum = quorum
        self.down_after_ms = down_after_ms
        self.failover_timeout_ms = failover_timeout_ms
        self.parallel_syncs = parallel_syncs
        self.extra = list(extra or [])
        self.port = free_port()
        self.proc = None
        self.pid = None
        self._started_once = False
        self.start()

    def _conf(self):
        m = self.master_name
        lines = [
            'port %d' % self.port,
            'bind %s' % self.host,
            'daemonize no',
            'protected-mode no',
            'dir %s' % self.dir,
            'logfile %s' % self.log_path,
            'sentinel resolve-hostnames no',
            'sentinel monitor %s %s %d %d' % (m, self.master_host, self.master_port, self.quorum),
            'sentinel down-after-milliseconds %s %d' % (m, self.down_after_ms),
            'sentinel failover-timeout %s %d' % (m, self.failover_timeout_ms),
            'sentinel parallel-syncs %s %d' % (m, self.parallel_syncs),
        ] + self.extra
        return '\n'.join(lines) + '\n'

    def start(self):
        """Start; after stop/kill, restart on the same port with the config
        file as Sentinel last rewrote it (known master, replicas, epochs)."""
        if self.running():
            raise RuntimeError('redis-sentinel already running (pid %d)' % self.proc.pid)
        for attempt in range(3):
            if not self._started_once:
                with open(self.conf_path, 'w') as f:
                    f.write(self._conf())
            log_start = _size(self.log_path)
            self.proc = _spawn(_in_netns(self.netns, _sentinel_argv(self.conf_path)),
                               self.out_path, cwd=self.dir)
            self.pid = self.proc.pid
            _register(self)
            try:
                _wait_up(self.proc, self._up, 'redis-sentinel PING on port %d' % self.port)
                # TILT: a sentinel whose timer ran more than 2 s late (its
                # config file's fsync behind the appendfsync-always Redis
                # nodes of a busy test machine) stops acting for 30 s, and a
                # failover asked then waited 30 s (seen once: +try-failover
                # to +elected-leader 29.6 s apart: TILT's 30 s is the only
                # wait that long in a forced failover). 1 s here.
                self.command('SENTINEL', 'DEBUG', 'tilt-period', 1000)
                self._started_once = True
                return self
            except AssertionError as e:
                _terminate(self.proc, signal.SIGKILL)
                _unregister(self)
                newlog = self.log()[log_start:]
                if not self._started_once and attempt < 2 and _ADDR_IN_USE in newlog.lower():
                    self.port = free_port()
                    continue
                raise AssertionError('%s\n--- sentinel log (%s) ---\n%s\n--- output ---\n%s' % (
                    e, self.log_path, newlog[-4000:], _read(self.out_path)[-2000:])) from None

    def _up(self):
        return _ping(self.port, timeout=1.0, host=self.host)

    def running(self):
        return self.proc is not None and self.proc.poll() is None

    def client(self, **kw):
        kw.setdefault('socket_timeout', 2)
        kw.setdefault('socket_connect_timeout', 2)
        return redis.Redis(host=self.host, port=self.port, decode_responses=True, **kw)

    def command(self, *args, timeout=2.0):
        """One command on a new connection (raw reply, decoded strings)."""
        c = self.client(socket_timeout=timeout, socket_connect_timeout=timeout)
        try:
            return c.execute_command(*args)
        finally:
            c.close()

    def master_addr(self, timeout=2.0):
        """(host, port) this sentinel announces for the master, or None."""
        r = self.command('SENTINEL', 'GET-MASTER-ADDR-BY-NAME', self.master_name, timeout=timeout)
        if not r:
            return None
        return r[0], int(r[1])

    def replicas(self):
        return [_kv(x) for x in self.command('SENTINEL', 'REPLICAS', self.master_name)]

    def others(self):
        return [_kv(x) for x in self.command('SENTINEL', 'SENTINELS', self.master_name)]

    def stop(self):
        rc = _terminate(self.proc, signal.SIGTERM)
        _unregister(self)
        return rc

    def kill(self):
        rc = _terminate(self.proc, signal.SIGKILL)
        _unregister(self)
        return rc

    def _force_kill(self):
        _terminate(self.proc, signal.SIGKILL)

    def log(self):
        return _read(self.log_path)

    def __repr__(self):
        return '<SentinelServer %s:%s pid=%s>' % (self.host, self.port, self.pid)


def _flags_ok(info):
    flags = set(str(info.get('flags', '')).split(','))
    return not flags & {'s_down', 'o_down', 'disconnected'}


class SentinelTopology:
    """1 master + 2 replicas (appendonly yes, appendfsync always,
    repl-diskless-sync-delay 0 unless redis_conf/replica_conf say otherwise)
    watched by 3 sentinels (quorum 2).
    The constructor returns once the replicas are in sync and every sentinel
    sees 2 healthy replicas and the 2 other sentinels.

    redis_conf is merged over the defaults for every node, replica_conf over
    that for the replicas only. .redis[0] is the initial master.

    redis_at / sentinels_at: where each node / sentinel runs, a list of
    (host, netns) pairs (host: the address it binds, netns: a namespace name
    or None); by default every process binds 127.0.0.1 here."""

    SYNC_TIMEOUT = 20.0
    DISCOVERY_TIMEOUT = 20.0   # hello messages go out every 2 s

    def __init__(self, down_after_ms=1000, failover_timeout_ms=5000, master_name='mq',
                 redis_conf=None, replica_conf=None, nreplicas=2, nsentinels=3, quorum=2,
                 redis_at=None, sentinels_at=None, redis_cls=None, sentinel_cls=None):
        # redis_cls / sentinel_cls: subclasses of RedisServer / SentinelServer
        # to start instead (e.g. on TLS)
        redis_cls = redis_cls or RedisServer
        sentinel_cls = sentinel_cls or SentinelServer
        self.master_name = master_name
        here = ('127.0.0.1', None)
        redis_at = list(redis_at or [])
        redis_at += [here] * (nreplicas + 1 - len(redis_at))
        sentinels_at = list(sentinels_at or [])
        sentinels_at += [here] * (nsentinels - len(sentinels_at))
        self.down_after_ms = down_after_ms
        self.failover_timeout_ms = failover_timeout_ms
        self.redis = []
        self.sentinels = []
        _register(self)
        try:
            # repl-diskless-sync-delay 0: Redis' default (5 s) would delay
            # every full resync (initial sync, replica reconfiguration after a
            # failover) by 5 s; pass it in redis_conf to get it back.
            base = {'appendonly': 'yes', 'appendfsync': 'always',
                    'repl-diskless-sync-delay': 0}
            base.update(redis_conf or {})
            master = redis_cls(base, host=redis_at[0][0], netns=redis_at[0][1])
            self.redis.append(master)
            rconf = dict(base)
            rconf.update(replica_conf or {})
            rconf['replicaof'] = '%s %d' % (master.host, master.port)
            for host, netns in redis_at[1:nreplicas + 1]:
                self.redis.append(redis_cls(rconf, host=host, netns=netns))
            self.wait_replicas_synced(master, nreplicas)
            for host, netns in sentinels_at[:nsentinels]:
                self.sentinels.append(sentinel_cls(
                    master_name, master.port, quorum=quorum, down_after_ms=down_after_ms,
                    failover_timeout_ms=failover_timeout_ms, host=host, netns=netns,
                    master_host=master.host))
            self.wait_sentinels_ready(nreplicas)
        except BaseException:
            self.stop()
            raise

    # ---- readiness

    def wait_replicas_synced(self, master, n, timeout=None):
        """Until master has n connected replicas, each with master_link_status:up."""
        def synced():
            info = master.client(socket_timeout=2).info('replication')
            if info.get('role') != 'master' or info.get('connected_slaves', 0) < n:
                return False
            for r in self.redis:
                if r is master or not r.running():
                    continue
                ri = r.client(socket_timeout=2).info('replication')
                if ri.get('role') != 'slave' or ri.get('master_port') != master.port \
                        or ri.get('master_link_status') != 'up':
                    return False
            return True
        wait_until(synced, timeout=timeout or self.SYNC_TIMEOUT, interval=0.1,
                   msg='%d replica(s) in sync with master %d' % (n, master.port))

    def wait_sentinels_ready(self, nreplicas=2, timeout=None):
        """Until every running sentinel sees nreplicas healthy replicas and all
        other running sentinels."""
        live = [s for s in self.sentinels if s.running()]

        def ready():
            for s in live:
                reps = [r for r in s.replicas() if _flags_ok(r)
                        and r.get('master-link-status') == 'ok']
                others = [o for o in s.others() if _flags_ok(o)]
                if len(reps) < nreplicas or len(others) < len(live) - 1:
                    return False
            return True
        wait_until(ready, timeout=timeout or self.DISCOVERY_TIMEOUT, interval=0.2,
                   msg='sentinels to see %d replicas and each other' % nreplicas)

    # ---- queries

    def sentinel_addresses(self):
        return ['%s:%d' % (s.host, s.port) for s in self.sentinels]

    def master_port(self):
        """The master port announced by the first sentinel that answers."""
        last = None
        for s in self.sentinels:
            if not s.running():
                continue
            try:
                addr = s.master_addr()
                if addr:
                    return addr[1]
            except Exception as e:  # noqa: BLE001 - try the next one
                last = e
        raise AssertionError('no sentinel answered get-master-addr-by-name (last error: %r)'
                             % (last,))

    def redis_by_port(self, port):
        for r in self.redis:
            if r.port == port:
                return r
        return None

    def master(self):
        """The RedisServer the sentinels announce."""
        return self.redis_by_port(self.master_port())

    def sentinel_views(self):
        """{sentinel port: announced master port or an exception}."""
        out = {}
        for s in self.sentinels:
            if not s.running():
                continue
            try:
                addr = s.master_addr(timeout=1.0)
                out[s.port] = addr[1] if addr else None
            except Exception as e:  # noqa: BLE001
                out[s.port] = e
        return out

    def wait_failover(self, old_port, timeout=30.0):
        """Until a majority of all sentinels announce one master other than
        old_port and that node's ROLE says master; returns its port."""
        need = len(self.sentinels) // 2 + 1
        state = {}

        def moved():
            views = self.sentinel_views()
            state['views'] = views
            counts = {}
            for p in views.values():
                if isinstance(p, int) and p != old_port:
                    counts[p] = counts.get(p, 0) + 1
            for p, n in counts.items():
                node = self.redis_by_port(p)
                if n >= need and node is not None and node.running() and node.role(1.0) == 'master':
                    return p
            return None
        try:
            return wait_until(moved, timeout=timeout, interval=0.1,
                              msg='failover away from master %d' % old_port)
        except AssertionError as e:
            raise AssertionError('%s; sentinel views: %r' % (e, state.get('views'))) from None

    def wait_stable(self, timeout=30.0, nreplicas=None):
        """Until every running sentinel announces the same master, whose ROLE
        is master, and every other running node is its replica with the link
        up; returns the master port."""
        state = {}

        def stable():
            views = self.sentinel_views()
            state['views'] = views
            ports = set(views.values())
            if len(ports) != 1:
                return None
            p = ports.pop()
            node = self.redis_by_port(p) if isinstance(p, int) else None
            if node is None or not node.running():
                return None
            info = node.client(socket_timeout=1).info('replication')
            if info.get('role') != 'master':
                return None
            others = [r for r in self.redis if r is not node and r.running()]
            want = len(others) if nreplicas is None else nreplicas
            if info.get('connected_slaves', 0) < want:
                return None
            for r in others:
                ri = r.client(socket_timeout=1).info('replication')
                state['last'] = (r.port, ri.get('role'), ri.get('master_port'),
                                 ri.get('master_link_status'))
                if ri.get('role') != 'slave' or ri.get('master_port') != p \
                        or ri.get('master_link_status') != 'up':
                    return None
            return p
        try:
            return wait_until(stable, timeout=timeout, interval=0.2, msg='a stable topology')
        except AssertionError as e:
            raise AssertionError('%s; sentinel views: %r; last replica: %r' % (
                e, state.get('views'), state.get('last'))) from None

    # ---- faults

    def restart_redis(self, i):
        """Restart node i (killed or stopped) on its port/dir/config file."""
        return self.redis[i].restart()

    def failover(self, sentinel=0):
        """SENTINEL FAILOVER <master> sent to one sentinel."""
        return self.sentinels[sentinel].command('SENTINEL', 'FAILOVER', self.master_name)

    def logs(self, tail=3000):
        """Every process' log tail, for diagnostics."""
        parts = []
        for i, r in enumerate(self.redis):
            parts.append('--- redis[%d] port %d (%s) ---\n%s' % (i, r.port, r.log_path,
                                                                  r.log()[-tail:]))
        for i, s in enumerate(self.sentinels):
            parts.append('--- sentinel[%d] port %d (%s) ---\n%s' % (i, s.port, s.log_path,
                                                                     s.log()[-tail:]))
        return '\n'.join(parts)

    def stop(self):
        """SIGKILL every process (by pid)."""
        for s in self.sentinels:
            s.kill()
        for r in self.redis:
            r.kill()
        _unregister(self)

    def _force_kill(self):
        self.stop()

    def __repr__(self):
        return '<SentinelTopology redis=%s sentinels=%s>' % (
            [r.port for r in self.redis], [s.port for s in self.sentinels])

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()

# --------------------------------------------------------------------------
# Redis Cluster

REDIS_CLI = shutil.which('redis-cli') or '/usr/bin/redis-cli'
CLUSTER_SLOTS = 16384


def _free_cluster_port():
    """A free port p whose cluster bus port p + 10000 is free too."""
    for _ in range(200):
        p = free_port()
        if p + 10000 > 65535:
            continue
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            s.bind(('127.0.0.1', p + 10000))
        except OSError:
            continue
        finally:
            s.close()
        with _lock:
            if p + 10000 in _ports_given:
                continue
            _ports_given.add(p + 10000)
        return p
    raise RuntimeError('no free port pair for a cluster node')


def cluster_nodes_parse(text):
    """CLUSTER NODES text -> list of dicts: id, host, port, flags (set),
    master (id or None), epoch (configEpoch), link, slots (set of ints)."""
    out = []
    for line in text.splitlines():
        f = line.split()
        if len(f) < 8:
            continue
        addr = f[1].split('@')[0].split(',')[0]
        host, _, port = addr.rpartition(':')
        slots = set()
        for s in f[8:]:
            if s.startswith('['):
                continue  # a slot being migrated / imported
            a, _, b = s.partition('-')
            slots.update(range(int(a), int(b or a) + 1))
        out.append({'id': f[0], 'host': host, 'port': int(port) if port.isdigit() else 0,
                    'flags': set(f[2].split(',')), 'master': None if f[3] == '-' else f[3],
                    'epoch': int(f[6]), 'link': f[7], 'slots': slots})
    return out


class ClusterTopology:
    """A Redis Cluster of `masters` masters with `replicas` replicas each
    (default 3 + 3), every node `--cluster-enabled yes --cluster-node-timeout
    node_timeout_ms` on 127.0.0.1 with a free port (and free bus port), made
    with `redis-cli --cluster create ... --cluster-replicas N --cluster-yes`.
    The constructor returns once every node says cluster_state:ok and agrees
    on who serves each of the 16384 slots. Processes are stopped by pid.

    .nodes (RedisServer list) .node_by_port(p) .seeds() .master_of(slot)
    .masters() .replicas_of(port) .kill_master(port) -> its replica ports
    .wait_promoted(old_port) -> new master port .reshard(from_port, to_port, n)
    .wait_consistent() .keyslot(key) .shards(port) .nodes_view(port)
    .acl_setuser(*args) (on every node)"""

    READY_TIMEOUT = 30.0

    def __init__(self, masters=3, replicas=1, node_timeout_ms=2000, redis_conf=None):
        self.node_timeout_ms = node_timeout_ms
        self.nodes = []
        self._killed_slots = {}   # port -> the slots it served when kill_master ran
        _register(self)
        try:
            conf = {'cluster-enabled': 'yes', 'cluster-node-timeout': node_timeout_ms,
                    'appendonly': 'yes', 'appendfsync': 'always',
                    'repl-diskless-sync-delay': 0,
                    # a replica of a killed master is promoted without waiting
                    # for its data age (tests kill masters on purpose)
                    'cluster-replica-validity-factor': 0}
            conf.update(redis_conf or {})
            for _ in range(masters * (1 + replicas)):
                c = dict(conf)
                c['port'] = _free_cluster_port()
                c['cluster-config-file'] = 'nodes-%d.conf' % c['port']
                self.nodes.append(RedisServer(c))
            argv = [REDIS_CLI, '--cluster', 'create'] + self.seeds() + [
                '--cluster-replicas', str(replicas), '--cluster-yes']
            p = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, timeout=60)
            if p.returncode != 0:
                raise AssertionError('redis-cli --cluster create failed (%d):\n%s' % (
                    p.returncode, p.stdout.decode(errors='replace')[-3000:]))
            self.wait_consistent(timeout=self.READY_TIMEOUT)
            # every node's view names each replica's master only after
            # gossip: tests read replicas_of() from the first node's view
            want = masters * replicas
            wait_until(lambda: all(sum(1 for v in self.nodes_view(n.port)
                                       if v['master'] is not None) == want
                                   for n in self.nodes),
                       timeout=self.READY_TIMEOUT, interval=0.05,
                       msg='every node knowing the %d replica(s)' % want)
            # ... and every replica's link to its master up, its first sync
            # done: a master killed before that has a replica promoted
            # (cluster-replica-validity-factor 0) without what the master
            # acknowledged (replicas_ack 0: seen in CI, the first 20 pushes
            # of test_cluster_guards' kill gone).
            def synced(n):
                c = n.client(socket_timeout=2.0)
                try:
                    info = c.info('replication')
                finally:
                    c.close()
                return info.get('role') != 'slave' or info.get('master_link_status') == 'up'
            wait_until(lambda: all(synced(n) for n in self.nodes),
                       timeout=self.READY_TIMEOUT, interval=0.05,
                       msg='every replica synced with its master')
        except BaseException:
            self.stop()
            raise

    # ---- views

    def seeds(self):
        """Every node's 127.0.0.1:port (running or not)."""
        return ['127.0.0.1:%d' % n.port for n in self.nodes]

    def running(self):
        return [n for n in self.nodes if n.running()]

    def node_by_port(self, port):
        for n in self.nodes:
            if n.port == port:
                return n
        return None

    def command(self, port, *args, timeout=2.0):
        c = self.node_by_port(port).client(socket_timeout=timeout, socket_connect_timeout=timeout)
        try:
            return c.execute_command(*args)
        finally:
            c.close()

    def nodes_view(self, port):
        """CLUSTER NODES of the node on port, parsed (cluster_nodes_parse)."""
        return cluster_nodes_parse(self.command(port, 'CLUSTER', 'NODES'))

    def shards(self, port):
        """CLUSTER SHARDS of the node on port, as raw RESP (lists of pairs)."""
        s = socket.create_connection(('127.0.0.1', port), timeout=2.0)
        try:
            resp_send(s, ['CLUSTER', 'SHARDS'])
            return resp_read_reply(s, timeout=2.0)
        finally:
            s.close()

    def keyslot(self, key, port=None):
        """CLUSTER KEYSLOT key, asked of a running node."""
        port = port or self.running()[0].port
        return int(self.command(port, 'CLUSTER', 'KEYSLOT', key))

    def _slot_owners(self, port):
        """{slot: master port} as the node on port sees it."""
        owners = {}
        for n in self.nodes_view(port):
            if 'master' in n['flags'] and 'fail' not in n['flags']:
                for s in n['slots']:
                    owners[s] = n['port']
        return owners

    def master_of(self, slot):
        """The port of the master serving slot, as every running node agrees
        (wait_consistent first when the cluster just changed)."""
        return self._slot_owners(self.running()[0].port).get(slot)

    def masters(self):
        """Ports of the running masters that serve slots, sorted."""
        view = self.nodes_view(self.running()[0].port)
        return sorted(n['port'] for n in view
                      if 'master' in n['flags'] and 'fail' not in n['flags'] and n['slots'])

    def replicas_of(self, port):
        """Ports of the nodes replicating the master on port."""
        view = self.nodes_view(self.running()[0].port)
        ids = [n['id'] for n in view if n['port'] == port]
        return sorted(n['port'] for n in view if ids and n['master'] == ids[0])

    def wait_consistent(self, timeout=30.0):
        """Until every running node says cluster_state:ok, knows every other
        running node with its link connected, has no slot in migration and
        they all agree on the owner of each of the 16384 slots; returns the
        {slot: master port} map."""
        state = {}

        def ok():
            owners = None
            for n in self.running():
                info = self.command(n.port, 'CLUSTER', 'INFO')
                if 'cluster_state:ok' not in info:
                    state['last'] = (n.port, 'not ok')
                    return None
                text = self.command(n.port, 'CLUSTER', 'NODES')
                if '->-' in text or '-<-' in text:
                    state['last'] = (n.port, 'migrating')
                    return None
                alive = {m.port for m in self.running()}
                view = cluster_nodes_parse(text)
                for v in view:
                    if v['port'] in alive and ('fail' in v['flags'] or 'fail?' in v['flags']
                                               or v['link'] != 'connected'):
                        state['last'] = (n.port, 'sees %d as %s/%s' % (
                            v['port'], ','.join(sorted(v['flags'])), v['link']))
                        return None
                o = self._slot_owners(n.port)
                if len(o) != CLUSTER_SLOTS:
                    state['last'] = (n.port, '%d slots covered' % len(o))
                    return None
                if owners is not None and o != owners:
                    state['last'] = (n.port, 'disagrees')
                    return None
                owners = o
            return owners
        try:
            return wait_until(ok, timeout=timeout, interval=0.1, msg='a consistent cluster')
        except AssertionError as e:
            raise AssertionError('%s; last: %r\n%s' % (e, state.get('last'),
                                                        self.logs())) from None

    def acl_setuser(self, *args):
        """ACL SETUSER args on every running node, masters and replicas (ACL
        users are per node: a promoted replica must know them), kept in each
        node's config file (CONFIG REWRITE) for a restarted node."""
        for n in self.running():
            self.command(n.port, 'ACL', 'SETUSER', *args)
            self.command(n.port, 'CONFIG', 'REWRITE')

    # ---- faults and changes

    def kill_master(self, port):
        """kill -9 of the master on port; returns the ports of its replicas."""
        reps = self.replicas_of(port)
        view = self.nodes_view(self.running()[0].port)
        self._killed_slots[port] = set().union(*[v['slots'] for v in view if v['port'] == port])
        self.node_by_port(port).kill()
        return reps

    def wait_promoted(self, old_port, timeout=30.0):
        """After kill_master(old_port): until one of its replicas is a master
        serving its slots on every running node and the cluster is
        consistent; returns the new master's port."""
        old_slots = self._killed_slots.get(old_port)
        for n in ([] if old_slots else self.running()):
            for v in self.nodes_view(n.port):
                if v['port'] == old_port and v['slots']:
                    old_slots = v['slots']
            if old_slots:
                break
        assert old_slots, 'no running node knows slots of %d' % old_port
        deadline = time.monotonic() + timeout

        def moved():
            for n in self.running():
                o = self._slot_owners(n.port)
                if any(o.get(s) in (None, old_port) for s in old_slots):
                    return False
            return True
        wait_until(moved, timeout=timeout, interval=0.1,
                   msg='a replica of %d promoted on every node' % old_port)
        owners = self.wait_consistent(timeout=max(1.0, deadline - time.monotonic()))
        new = {owners[s] for s in old_slots}
        assert len(new) == 1 and old_port not in new, new
        return new.pop()

    def reshard(self, from_port, to_port, nslots, timeout=60.0):
        """Move nslots slots from the master on from_port to the one on
        to_port (`redis-cli --cluster reshard`); returns once consistent."""
        ids = {v['port']: v['id'] for v in self.nodes_view(from_port)}
        argv = [REDIS_CLI, '--cluster', 'reshard', '127.0.0.1:%d' % from_port,
                '--cluster-from', ids[from_port], '--cluster-to', ids[to_port],
                '--cluster-slots', str(nslots), '--cluster-yes']
        p = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, timeout=timeout)
        if p.returncode != 0:
            raise AssertionError('redis-cli --cluster reshard failed (%d):\n%s' % (
                p.returncode, p.stdout.decode(errors='replace')[-3000:]))
        return self.wait_consistent(timeout=timeout)

    def logs(self, tail=2000):
        return '\n'.join('--- node %d (%s) ---\n%s' % (n.port, n.log_path, n.log()[-tail:])
                         for n in self.nodes)

    def stop(self):
        """SIGKILL every node (by pid)."""
        for n in self.nodes:
            n.kill()
        _unregister(self)

    def _force_kill(self):
        self.stop()

    def __repr__(self):
        return '<ClusterTopology nodes=%s>' % [n.port for n in self.nodes]

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()

# --------------------------------------------------------------------------
# ferry


class Ferry:
    """ferry in front of a RedisServer (or of whatever conf names).

    conf is merged as nested dicts over the generated config; a None value
    removes a key (e.g. {'redis': None, 'sentinel': {...}}). extra_yaml is
    appended verbatim. wait: 'ping' (default: port accepts and PING through
    ferry answers), 'port' (port accepts only, e.g. when Redis is down) or
    None (don't wait). wrap: arguments in front of ferry's command line that
    exec it (its pid stays ferry's)."""

    def __init__(self, redis=None, conf=None, extra_yaml='', wait='ping', sentinel=None,
                 wrap=None):
        self.redis = redis
        # wrap: arguments run in front of ferry's command line, which they
        # must exec (e.g. to start it in a private mount namespace).
        self.wrap = list(wrap or [])
        # sentinel: a SentinelTopology (or anything with .master_name and
        # .sentinel_addresses()) or a dict used as the sentinel: section.
        self.sentinel = sentinel
        self.user_conf = conf or {}
        self.extra_yaml = extra_yaml
        self.wait = wait
        self.dir = _mkdtemp('ferry-')
        self.config_path = os.path.join(self.dir, 'ferry.yml')
        self.log_path = os.path.join(self.dir, 'ferry.log')
        self.out_path = os.path.join(self.dir, 'ferry.out')
        self.proc = None
        self.pid = None
        self.unix_path = None
        user_listen = 'listen' in self.user_conf
        user_stats = isinstance(self.user_conf.get('stats'), dict) and 'listen' in self.user_conf['stats']
        self._fixed_ports = user_listen and user_stats
        for attempt in range(3):
            self._write_config()
            if DIRECT:
                if redis is None and hasattr(sentinel, 'master_port'):
                    self.port = sentinel.master_port()
                    self.stats_port = None
                    return
                if redis is None:
                    raise RuntimeError('FERRY_TEST_DIRECT=1 needs a RedisServer')
                self.port = redis.port
                self.stats_port = None
                return
            try:
                self._start()
                return
            except _AddrInUse:
                if self._fixed_ports or attempt == 2:
                    raise AssertionError('ferry: address in use\n' + self._diag()) from None

    def _write_config(self):
        self.port = free_port()
        self.stats_port = free_port()
        c = {
            'listen': '127.0.0.1:%d' % self.port,
            'stats': {'listen': '127.0.0.1:%d' % self.stats_port},
            'log': {'level': 'debug', 'file': self.log_path},
        }
        if self.redis is not None:
            c['redis'] = {'address': '127.0.0.1:%d' % self.redis.port}
        elif self.sentinel is not None:
            c['sentinel'] = self._sentinel_section()
        _merge(c, copy.deepcopy(self.user_conf))
        if WORKERS and 'workers' not in c and not _needs_one_loop(c, self.extra_yaml):
            c['workers'] = int(WORKERS)
        listen = c.get('listen')
        first = listen[0] if isinstance(listen, list) and listen else listen
        self.port = _port_of(first)
        self.unix_path = first[5:] if isinstance(first, str) and first.startswith('unix:') else None
        stats = c.get('stats') if isinstance(c.get('stats'), dict) else {}
        self.stats_port = _port_of(stats.get('listen'))
        client = c.get('client') if isinstance(c.get('client'), dict) else {}
        self._password = client.get('password')
        self.conf = c
        text = '# generated by tests/integration/harness.py\n' + render_yaml(c)
        if self.extra_yaml:
            text += self.extra_yaml if self.extra_yaml.endswith('\n') else self.extra_yaml + '\n'
        with open(self.config_path, 'w') as f:
            f.write(text)

    def _sentinel_section(self):
        sec = {'resolve_interval_ms': 200, 'timeout_ms': 500}
        if isinstance(self.sentinel, dict):
            sec.update(copy.deepcopy(self.sentinel))
        else:
            sec = {'master': self.sentinel.master_name,
                   'addresses': list(self.sentinel.sentinel_addresses()), **sec}
        return sec

    def _start(self):
        if not os.access(FERRY_BIN, os.X_OK):
            raise RuntimeError('ferry binary not found or not executable: %s (set FERRY_BIN)' % FERRY_BIN)
        offsets = (_size(self.log_path), _size(self.out_path))
        self.proc = _spawn(self.wrap + [FERRY_BIN, '-c', self.config_path], self.out_path,
                           cwd=self.dir)
        self.pid = self.proc.pid
        _register(self)
        if not self.wait:
            return
        try:
            _wait_up(self.proc, self._up,
                     'ferry (pid %d) to answer on %s' % (self.pid, self.unix_path or self.port))
        except AssertionError as e:
            _terminate(self.proc, signal.SIGKILL)
            _unregister(self)
            diag = self._diag()
            new = self.log()[offsets[0]:] + self.output()[offsets[1]:]
            if _ADDR_IN_USE in new.lower():
                raise _AddrInUse() from None
            raise AssertionError('%s\n%s' % (e, diag)) from None

    def _up(self):
        if self.wait == 'port':
            s = self.raw(timeout=1.0)
            s.close()
            return True
        return _ping(self.port, unix=self.unix_path, timeout=2.0, password=self._password)

    def _diag(self):
        return '--- ferry config (%s) ---\n%s--- ferry log (%s) ---\n%s\n--- ferry stdout/stderr ---\n%s' % (
            self.config_path, _read(self.config_path), self.log_path, self.log()[-6000:],
            self.output()[-3000:])

    def running(self):
        return self.proc is not None and self.proc.poll() is None

    def client(self, **kw):
        kw.setdefault('socket_timeout', 10)
        kw.setdefault('socket_connect_timeout', 5)
        if self.unix_path and not DIRECT:
            return redis.Redis(unix_socket_path=self.unix_path, decode_responses=True, **kw)
        return redis.Redis(host='127.0.0.1', port=self.port, decode_responses=True, **kw)

    def raw(self, timeout=10.0):
        """A plain connected socket to ferry's (first) listen address."""
        if self.unix_path and not DIRECT:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.settimeout(timeout)
            s.connect(self.unix_path)
            return s
        s = socket.create_connection(('127.0.0.1', self.port), timeout=timeout)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return s

    def stop(self, sig=signal.SIGTERM, timeout=STOP_TIMEOUT):
        """Send sig, wait up to timeout, then SIGKILL. Returns the exit code
        (negative signal number if it died of a signal; 0 in direct mode)."""
        rc = _terminate(self.proc, sig, timeout)
        _unregister(self)
        return rc

    def kill(self):
        rc = _terminate(self.proc, signal.SIGKILL)
        _unregister(self)
        return rc

    def signal(self, sig):
        """Send a signal without waiting (e.g. SIGHUP for log reopen)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)

    def _force_kill(self):
        _terminate(self.proc, signal.SIGKILL)

    def log(self):
        """ferry's log file (log.file)."""
        return _read(self.log_path)

    def output(self):
        """What ferry wrote to stdout/stderr."""
        return _read(self.out_path)

    @staticmethod
    def check_config(path, timeout=30):
        """Run `ferry -t -c path`; returns (exit code, stdout+stderr text)."""
        p = subprocess.run([FERRY_BIN, '-t', '-c', path], stdin=subprocess.DEVNULL,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout)
        return p.returncode, p.stdout.decode(errors='replace')

    def __repr__(self):
        return '<Ferry port=%s pid=%s>' % (self.port, self.pid)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


class _AddrInUse(Exception):
    pass


__all__ = ['free_port', 'wait_until', 'RedisServer', 'SentinelServer', 'SentinelTopology', 'Ferry', 'resp_send', 'resp_read_reply',
           'resp_read_raw', 'resp_encode', 'RespError', 'render_yaml', 'REPO', 'FERRY_BIN', 'DIRECT',
           'NetLab', 'netns_unavailable', 'ClusterTopology', 'cluster_nodes_parse']

if __name__ == '__main__':  # pragma: no cover - manual smoke test
    r = RedisServer()
    print(r, r.client().ping())
    r.stop()
    sys.exit(0)
