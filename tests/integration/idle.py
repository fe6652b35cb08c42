"""Idle connections and process memory, for the memory-bound tests and for
scripts/bench (which runs it as a script against ferry and nutcracker).

    rss_kib(pid)                  VmRSS of a process, KiB (/proc/PID/status)
    settled_rss_kib(pid)          the same once it has not changed for 0.5 s
                                  (at most 5 s): what idle clients cost, after
                                  the burst that opened them
    raise_nofile(n)               raise this process's soft RLIMIT_NOFILE to n
                                  (at most the hard limit); returns the new soft limit
    open_idle(port, n)            n connections that each sent one PING and read
                                  its +PONG; returns the sockets (caller closes)
    ping_all(socks)               one more PING on every socket; returns how many
                                  answered +PONG
    close_all(socks)

As a script: idle.py PID PORT N [--host H] [--batch B] -- opens N idle clients to PORT
and prints "rss_per_client_bytes <B>" for process PID (growth of its VmRSS
divided by N, measured after a warm-up of 50 clients, both once settled)."""

import argparse
import resource
import socket
import sys
import time

PING = b'*1\r\n$4\r\nPING\r\n'
PONG = b'+PONG\r\n'


def rss_kib(pid):
    with open('/proc/%d/status' % pid) as f:
        for line in f:
            if line.startswith('VmRSS:'):
                return int(line.split()[1])
    raise RuntimeError('no VmRSS for pid %d' % pid)


def settled_rss_kib(pid, quiet=0.5, most=5.0, step=0.1):
    """VmRSS once it has stayed the same for quiet seconds (at most most
    seconds from now): a proxy may give memory back a moment after a burst."""
    end = time.monotonic() + most
    last, since = rss_kib(pid), time.monotonic()
    while time.monotonic() < end and time.monotonic() - since < quiet:
        time.sleep(step)
        now = rss_kib(pid)
        if now != last:
            last, since = now, time.monotonic()
    return last


def raise_nofile(n):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = n if hard == resource.RLIM_INFINITY else min(n, hard)
    if soft != resource.RLIM_INFINITY and soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
        soft = want
    return soft


def _read_pong(s, deadline):
    got = b''
    while len(got) < len(PONG):
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError('no PONG within the deadline')
        s.settimeout(left)
        chunk = s.recv(len(PONG) - len(got))
        if not chunk:
            raise ConnectionError('closed before PONG (got %r)' % got)
        got += chunk
    if got != PONG:
        raise AssertionError('expected +PONG, got %r' % got)


def open_idle(port, n, host='127.0.0.1', batch=500, timeout=60.0):
    """Connect n clients in batches (each batch: connect all, PING all, read
    all), so the listen backlog never overflows."""
    deadline = time.monotonic() + timeout
    socks = []
    try:
        while len(socks) < n:
            group = []
            for _ in range(min(batch, n - len(socks))):
                s = socket.create_connection((host, port), timeout=10)
                group.append(s)
                socks.append(s)
            for s in group:
                s.sendall(PING)
            for s in group:
                _read_pong(s, deadline)
    except BaseException:
        close_all(socks)
        raise
    return socks


def ping_all(socks, batch=500, timeout=60.0):
    deadline = time.monotonic() + timeout
    ok = 0
    for i in range(0, len(socks), batch):
        group = socks[i:i + batch]
        for s in group:
            s.sendall(PING)
        for s in group:
            _read_pong(s, deadline)
            ok += 1
    return ok


def close_all(socks):
    for s in socks:
        try:
            s.close()
        except OSError:
            pass


def main():
    ap = argparse.ArgumentParser(description='RSS growth per idle client of a proxy')
    ap.add_argument('pid', type=int)
    ap.add_argument('port', type=int)
    ap.add_argument('n', type=int)
    ap.add_argument('--host', default='127.0.0.1')
    ap.add_argument('--batch', type=int, default=500,
                    help='clients connected and PINGed at a time (default 500)')
    a = ap.parse_args()
    raise_nofile(a.n + 200)
    warm = open_idle(a.port, 50, host=a.host)
    before = settled_rss_kib(a.pid)
    socks = open_idle(a.port, a.n, host=a.host, batch=a.batch)
    after = settled_rss_kib(a.pid)
    answered = ping_all(socks)
    close_all(socks)
    close_all(warm)
    if answered != a.n:
        sys.exit('only %d of %d idle clients answered' % (answered, a.n))
    print('rss_per_client_bytes %.0f' % ((after - before) * 1024.0 / a.n))


if __name__ == '__main__':
    main()
