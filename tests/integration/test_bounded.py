"""ferry stays bounded under hostile load (a memory bound, not a timing):

- 10 000 idle clients (each has sent one PING) cost at most 2 KiB of ferry's
  RSS each, while 50 active clients keep being served.
"""

import json
import sys
import threading
import time
import unittest
import urllib.request

from harness import Ferry, RedisServer, resp_encode, wait_until
import idle

N_IDLE = 10000
N_ACTIVE = 50
MAX_IDLE_BYTES = 2048


def stats_json(port):
    with urllib.request.urlopen('http://127.0.0.1:%d/stats' % port, timeout=5) as r:
        return json.load(r)


def read_exact_replies(sock, n, deadline):
    """Read n simple replies (one line each: +OK, :N, $-1 or a short bulk)."""
    data = b''
    out = []
    while len(out) < n:
        while True:
            i = data.find(b'\r\n')
            if i < 0:
                break
            line = data[:i]
            if line.startswith(b'$') and line != b'$-1':
                blen = int(line[1:])
                if len(data) < i + 2 + blen + 2:
                    break
                out.append(data[i + 2:i + 2 + blen])
                data = data[i + 2 + blen + 2:]
            else:
                out.append(line)
                data = data[i + 2:]
            if len(out) == n:
                break
        if len(out) == n:
            break
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError('%d of %d replies' % (len(out), n))
        sock.settimeout(left)
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError('closed after %d of %d replies' % (len(out), n))
        data += chunk
    return out


class ActiveClients:
    """N_ACTIVE connections, each doing rounds of LPUSH x3 + RPOP x3 on its
    own key, every reply checked."""

    def __init__(self, f, n):
        self.socks = [f.raw() for _ in range(n)]
        self.rounds = 0
        self.errors = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        try:
            while not self.stop.is_set():
                for i, s in enumerate(self.socks):
                    key = 'active:%d' % i
                    s.sendall(b''.join([resp_encode('LPUSH', key, 'a'),
                                        resp_encode('LPUSH', key, 'b'),
                                        resp_encode('LPUSH', key, 'c'),
                                        resp_encode('RPOP', key), resp_encode('RPOP', key),
                                        resp_encode('RPOP', key)]))
                for s in self.socks:
                    got = read_exact_replies(s, 6, time.monotonic() + 20)
                    if got != [b':1', b':2', b':3', b'a', b'b', b'c']:
                        raise AssertionError('unexpected replies %r' % got)
                self.rounds += 1
        except Exception as e:  # noqa: BLE001 - asserted by the test
            self.errors.append(e)

    def close(self):
        self.stop.set()
        self.thread.join(timeout=30)
        idle.close_all(self.socks)


class IdleClientsTest(unittest.TestCase):
    def test_10000_idle_clients_cost_at_most_2k_each(self):
        need = N_IDLE + N_ACTIVE + 300
        if idle.raise_nofile(need) < need:
            self.skipTest('RLIMIT_NOFILE hard limit below %d' % need)
        r = RedisServer()
        self.addCleanup(r.kill)
        f = Ferry(r, conf={'client': {'max_clients': N_IDLE + N_ACTIVE + 100},
                           'log': {'level': 'info'}})
        self.addCleanup(f.stop)

        active = ActiveClients(f, N_ACTIVE)
        self.addCleanup(active.close)
        active.thread.start()
        wait_until(lambda: active.rounds >= 20 or active.errors, timeout=30,
                   msg='active clients to warm up')
        self.assertEqual(active.errors, [])
        before = idle.rss_kib(f.pid)

        socks = idle.open_idle(f.port, N_IDLE)
        self.addCleanup(idle.close_all, socks)
        after = idle.rss_kib(f.pid)
        per_client = (after - before) * 1024.0 / N_IDLE
        sys.stderr.write('\n  ferry RSS %d -> %d KiB: %.0f bytes per idle client\n'
                         % (before, after, per_client))

        # The active clients keep being served alongside them...
        rounds = active.rounds
        wait_until(lambda: active.rounds >= rounds + 3 or active.errors, timeout=30,
                   msg='active clients to go on with 10 000 idle ones open')
        self.assertEqual(active.errors, [])
        self.assertEqual(stats_json(f.stats_port)['curr_connections'], N_IDLE + N_ACTIVE)
        # ... and every idle client still answers.
        self.assertEqual(idle.ping_all(socks), N_IDLE)
        self.assertLessEqual(per_client, MAX_IDLE_BYTES)


if __name__ == '__main__':
    unittest.main()
