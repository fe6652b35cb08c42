"""Requests held during an outage, for scripts/bench (HELD=1) and test_held.

    HeldClients(port, clients, n)   clients connections; n RPUSH requests in
                                    all, round-robin, client c pushing
                                    0, 1, 2... to its own key (fixed size)
        .send(chunk)                write every request, chunk per write
        .read_all(deadline)         read every reply; returns them per client
        .request_bytes              size of one request
    check_in_order(replies)         RPUSH replies of each client are :1, :2, ...
    cpu_ns(pid)                     CPU time of a process's main thread (the loop)
    held_stats(stats_port)          ferry's upstream and errors stats sections
    hold_release(n, ...)            hold n requests with no master, then start it:
                                    {'hold': ns/request, 'release': ns/request}
    bound_timeout(n, ...)           n requests against a hold bound of n/2, then
                                    the hold timeout: {'bound':..., 'timeout':...}

As a script: held.py N [N ...] [--clients C] [--chunk K] prints a markdown
table of ferry's CPU time per request (hold, bound, timeout, release) for
each N, measured on a ferry with a fixed master that is down at first
(FERRY_BIN names the binary)."""

import argparse
import json
import os
import selectors
import socket
import time
import urllib.request

from harness import Ferry, RedisServer, free_port, wait_until

KEY_FMT = 'held:%04d'
VAL_FMT = '%09d'


def _encode(*args):
    out = [b'*%d\r\n' % len(args)]
    for a in args:
        a = a.encode() if isinstance(a, str) else a
        out.append(b'$%d\r\n%s\r\n' % (len(a), a))
    return b''.join(out)


def cpu_ns(pid):
    """CPU time (ns) of the main thread of pid: ferry's event loop."""
    with open('/proc/%d/schedstat' % pid) as f:
        return int(f.read().split()[0])


def held_stats(stats_port):
    with urllib.request.urlopen('http://127.0.0.1:%d/stats' % stats_port, timeout=5) as r:
        d = json.load(r)
    out = {}
    for sec in d.values():
        if isinstance(sec, dict):
            out.update(sec)
    return out


class HeldClients:
    def __init__(self, port, clients, n):
        self.socks = []
        for _ in range(clients):
            s = socket.create_connection(('127.0.0.1', port), timeout=10)
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.socks.append(s)
        self.n = n
        self.counts = [n // clients + (1 if c < n % clients else 0) for c in range(clients)]
        self.request_bytes = len(_encode('RPUSH', KEY_FMT % 0, VAL_FMT % 0))

    def send(self, chunk=1):
        """Every request, round-robin over the clients, chunk requests per
        write (1: one write per request, as a client sending commands one at
        a time does)."""
        nxt = [0] * len(self.socks)
        left = self.n
        while left > 0:
            for c, s in enumerate(self.socks):
                k = min(chunk, self.counts[c] - nxt[c])
                if k <= 0:
                    continue
                s.sendall(b''.join(_encode('RPUSH', KEY_FMT % c, VAL_FMT % (nxt[c] + j))
                                   for j in range(k)))
                nxt[c] += k
                left -= k

    def read_all(self, deadline):
        """Every reply line of every client (these replies are one line each)."""
        sel = selectors.DefaultSelector()
        bufs = [b''] * len(self.socks)
        replies = [[] for _ in self.socks]
        for c, s in enumerate(self.socks):
            s.setblocking(False)
            sel.register(s, selectors.EVENT_READ, c)
        pending = sum(1 for c in range(len(self.socks)) if self.counts[c] > 0)
        try:
            while pending > 0:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError('replies: %s of %s' % (
                        [len(r) for r in replies], self.counts))
                for key, _ in sel.select(min(left, 1.0)):
                    c = key.data
                    chunk = key.fileobj.recv(1 << 20)
                    if not chunk:
                        raise ConnectionError('client %d closed after %d of %d replies' % (
                            c, len(replies[c]), self.counts[c]))
                    lines = (bufs[c] + chunk).split(b'\r\n')
                    bufs[c] = lines.pop()
                    replies[c].extend(lines)
                    if len(replies[c]) >= self.counts[c]:
                        sel.unregister(key.fileobj)
                        pending -= 1
        finally:
            sel.close()
            for s in self.socks:
                s.setblocking(True)
        return replies

    def close(self):
        for s in self.socks:
            s.close()


def check_in_order(replies, counts):
    """Each client's RPUSH replies are :1 .. :count (its own key, in order).
    Returns None or a description of the first difference."""
    for c, got in enumerate(replies):
        want = [b':%d' % (i + 1) for i in range(counts[c])]
        if got != want:
            for i, (g, w) in enumerate(zip(got, want)):
                if g != w:
                    return 'client %d reply %d: %r, want %r' % (c, i, g, w)
            return 'client %d: %d replies, want %d' % (c, len(got), len(want))
    return None


def _ferry_conf(dead_port, n, extra=None):
    conf = {
        'redis': {'address': '127.0.0.1:%d' % dead_port},
        'log': {'level': 'warn'},
        'client': {'max_pipeline': n + 16, 'max_pending_bytes': '4gb'},
        'upstream': {'connect_timeout_ms': 200, 'hold_timeout_ms': 600000,
                     'ping_interval_ms': 0},
    }
    for k, v in (extra or {}).items():
        conf.setdefault(k, {}).update(v)
    return conf


def hold_release(n, clients=10, chunk=1, timeout=300.0):
    """n requests held by a ferry whose master is down, then the master
    starts. Returns ferry CPU ns per request for 'hold' and 'release', the
    wall seconds of each, and 'order' (None when every client got its
    replies in order)."""
    dead = free_port()
    f = Ferry(None, conf=_ferry_conf(dead, n), wait='port')
    hc = None
    redis = None
    try:
        hc = HeldClients(f.port, clients, n)
        want_bytes = n * hc.request_bytes
        c0, t0 = cpu_ns(f.pid), time.monotonic()
        hc.send(chunk)
        wait_until(lambda: held_stats(f.stats_port)['held_bytes'] == want_bytes,
                   timeout=timeout, interval=0.05, msg='%d requests held' % n)
        c1, t1 = cpu_ns(f.pid), time.monotonic()
        redis = RedisServer(port=dead)
        replies = hc.read_all(time.monotonic() + timeout)
        c2, t2 = cpu_ns(f.pid), time.monotonic()
        return {'hold': (c1 - c0) / n, 'release': (c2 - c1) / n, 'hold_s': t1 - t0,
                'release_s': t2 - t1, 'order': check_in_order(replies, hc.counts)}
    finally:
        if hc is not None:
            hc.close()
        f.stop()
        if redis is not None:
            redis.stop()


def bound_timeout(n, clients=10, chunk=1, hold_ms=4000, timeout=300.0):
    """n requests against a hold bound of n/2 requests' bytes (half held,
    the newest half refused -TRYAGAIN at once), then the held half answered
    -TRYAGAIN at upstream.hold_timeout_ms. Returns ferry CPU ns per request
    for 'bound' (per request sent) and 'timeout' (per request timed out,
    every reply written), and whether the hold bound was reached before the
    hold timeout ('clean')."""
    dead = free_port()
    per = len(_encode('RPUSH', KEY_FMT % 0, VAL_FMT % 0))
    held_n = n // 2
    f = Ferry(None, conf=_ferry_conf(dead, n, {'upstream': {
        'hold_max_bytes': held_n * per, 'hold_timeout_ms': hold_ms}}), wait='port')
    hc = None
    try:
        hc = HeldClients(f.port, clients, n)
        c0 = cpu_ns(f.pid)
        t0 = time.monotonic()
        hc.send(chunk)

        def bounded():
            st = held_stats(f.stats_port)
            return st['requests_tryagain'] >= n - held_n and st['held_bytes'] == held_n * per
        wait_until(bounded, timeout=timeout, interval=0.05, msg='hold bound reached')
        c1 = cpu_ns(f.pid)
        clean = time.monotonic() - t0 < hold_ms / 1000.0 * 0.8
        replies = hc.read_all(time.monotonic() + timeout)
        c2 = cpu_ns(f.pid)
        tryagain = sum(1 for r in replies for line in r if line.startswith(b'-TRYAGAIN'))
        return {'bound': (c1 - c0) / n, 'timeout': (c2 - c1) / held_n, 'clean': clean,
                'answered': tryagain}
    finally:
        if hc is not None:
            hc.close()
        f.stop()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('n', type=int, nargs='+')
    ap.add_argument('--clients', type=int, default=10)
    ap.add_argument('--chunk', type=int, default=1)
    a = ap.parse_args()
    rows = []
    for n in a.n:
        hr = hold_release(n, a.clients, a.chunk)
        bt = bound_timeout(n, a.clients, a.chunk)
        if hr['order'] is not None:
            raise SystemExit('held.py: replies out of order: %s' % hr['order'])
        if bt['answered'] != n:
            raise SystemExit('held.py: %d of %d answered -TRYAGAIN' % (bt['answered'], n))
        rows.append((n, hr, bt))
    print('| held requests | hold µs/req | evict at bound µs/req | timeout µs/req | '
          'release µs/req |')
    print('|---:|---:|---:|---:|---:|')
    for n, hr, bt in rows:
        print('| %d | %.2f | %.2f%s | %.2f | %.2f |' % (
            n, hr['hold'] / 1000, bt['bound'] / 1000, '' if bt['clean'] else ' (!)',
            bt['timeout'] / 1000, hr['release'] / 1000))


if __name__ == '__main__':
    main()
