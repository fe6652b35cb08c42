"""N11: many concurrent clients pushing and popping one queue through ferry:
every pushed id is popped exactly once (no loss, no duplicate, no foreign id).

Run: FERRY_TEST_DIRECT=1 python3 -m unittest test_concurrency -v  (plain Redis)
     python3 -m unittest test_concurrency -v                       (through ferry)
"""
import random
import resource
import threading
import time
import unittest

import harness
from harness import Ferry, RedisServer

NCLIENTS = 500
OPS_PER_CLIENT = 40
TEST_BUDGET = 110.0     # seconds for the whole test (must stay < 120)


def raise_fd_limit(want):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= want:
        return soft
    new = want if hard == resource.RLIM_INFINITY else min(want, hard)
    resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
    return new


class TestConcurrentQueue(unittest.TestCase):
    def setUp(self):
        # test process: NCLIENTS client sockets (+ Redis and ferry are children
        # and inherit the limit: Redis needs ~NCLIENTS+ for ferry's dedicated
        # BRPOP links, ferry needs 2x for client + upstream sockets)
        limit = raise_fd_limit(4 * NCLIENTS + 1024)
        self.assertGreaterEqual(limit, 2 * NCLIENTS + 256, 'fd limit too low: %s' % limit)
        self.redis = RedisServer({'maxclients': 4 * NCLIENTS, 'tcp-backlog': 1024})
        self.addCleanup(self.redis.stop)
        self.ferry = Ferry(self.redis)
        self.addCleanup(self.ferry.stop)

    def test_n11_500_clients_push_pop_exactly_once(self):
        t0 = time.monotonic()
        deadline = t0 + TEST_BUDGET
        pushed = [[] for _ in range(NCLIENTS)]   # ids whose LPUSH was acknowledged
        popped = [[] for _ in range(NCLIENTS)]   # ids returned by RPOP/BRPOP
        errors = []
        stats = {'rpop': 0, 'brpop': 0, 'brpop_timeout': 0, 'rpop_nil': 0}
        stats_lock = threading.Lock()
        start = threading.Barrier(NCLIENTS + 1, timeout=60)

        def client_main(n):
            rnd = random.Random(1000 + n)
            c = None
            local = dict.fromkeys(stats, 0)
            try:
                # its own connection (own pool, one connection)
                c = self.ferry.client(socket_timeout=30, socket_connect_timeout=30)
                c.ping()                 # connect before the start line
                start.wait()
                seq = 0
                for _ in range(OPS_PER_CLIENT):
                    if time.monotonic() > deadline:
                        raise AssertionError('client %d: out of time' % n)
                    r = rnd.random()
                    if r < 0.55:
                        ident = 'id:%d:%d' % (n, seq)
                        seq += 1
                        c.lpush('q', ident)          # raises on error: not logged
                        pushed[n].append(ident)
                    elif r < 0.775:
                        v = c.rpop('q')
                        local['rpop'] += 1
                        if v is None:
                            local['rpop_nil'] += 1
                        else:
                            popped[n].append(v)
                    else:
                        v = c.brpop('q', timeout=1)
                        local['brpop'] += 1
                        if v is None:
                            local['brpop_timeout'] += 1
                        else:
                            if v[0] != 'q':
                                raise AssertionError('BRPOP returned key %r' % (v[0],))
                            popped[n].append(v[1])
            except threading.BrokenBarrierError as e:
                errors.append((n, e))
            except Exception as e:  # noqa: BLE001 - collected and reported
                errors.append((n, e))
                try:
                    start.abort()
                except Exception:
                    pass
            finally:
                with stats_lock:
                    for k, v in local.items():
                        stats[k] += v
                if c is not None:
                    c.close()

        threads = [threading.Thread(target=client_main, args=(n,), daemon=True,
                                    name='client-%d' % n) for n in range(NCLIENTS)]
        old_stack = threading.stack_size(256 * 1024)
        try:
            for t in threads:
                t.start()
        finally:
            threading.stack_size(old_stack)
        try:
            start.wait()
        except threading.BrokenBarrierError:
            pass
        for t in threads:
            t.join(max(0.1, deadline - time.monotonic()))
        alive = [t.name for t in threads if t.is_alive()]
        self.assertEqual(alive, [], 'clients still running after %.0fs' % TEST_BUDGET)
        self.assertEqual(errors[:5], [], '%d client(s) failed' % len(errors))

        # drain what is left
        c = self.ferry.client(socket_timeout=30)
        self.addCleanup(c.close)
        rest = []
        while True:
            batch = c.rpop('q', 1000)
            if not batch:
                break
            rest.extend(batch)
        self.assertEqual(c.llen('q'), 0)

        all_pushed = [i for p in pushed for i in p]
        all_popped = [i for p in popped for i in p] + rest
        self.assertEqual(len(all_pushed), len(set(all_pushed)))
        foreign = set(all_popped) - set(all_pushed)
        self.assertEqual(foreign, set(), 'popped ids never pushed')
        seen = set()
        dups = set()
        for i in all_popped:
            if i in seen:
                dups.add(i)
            seen.add(i)
        self.assertEqual(dups, set(), 'ids popped more than once')
        lost = set(all_pushed) - seen
        self.assertEqual(lost, set(), 'pushed ids never popped')
        self.assertEqual(len(all_popped), len(all_pushed))
        # FIFO per producer: in the drained rest (oldest first), each client's
        # ids appear in the order it pushed them
        for n in range(NCLIENTS):
            mine = [i for i in rest if i.startswith('id:%d:' % n)]
            seqs = [int(i.rsplit(':', 1)[1]) for i in mine]
            self.assertEqual(seqs, sorted(seqs), 'drain order for client %d' % n)
        self.assertGreater(len(all_pushed), NCLIENTS * OPS_PER_CLIENT * 0.4)
        self.assertGreater(stats['brpop'] - stats['brpop_timeout'], 0)
        self.assertLess(time.monotonic() - t0, 120)


if __name__ == '__main__':
    unittest.main()
