"""Guards on the edges of the failover promise, with a fixed master:

- a master frozen under load (SIGSTOP while clients keep sending) is noticed
  by the health probe: clients wait, get -TRYAGAIN at the hold bound, and
  service resumes on SIGCONT with nothing acknowledged lost;
- Redis refusing a write for lack of replicas (min-replicas-to-write:
  -NOREPLICAS, nothing applied) on a master that has just come back is held
  and retried until a replica confirms (test_refusals has the rest: the
  master's own configuration answered at once, the back-off, the bound);
- RESET inside a pub/sub session forgets its subscriptions, so a later
  re-subscription (after the link is lost) does not bring them back.
"""

import threading
import time
import unittest

import redis

from harness import (Ferry, RedisServer, RespError, resp_read_reply, resp_send,
                     wait_until)
from test_stats import stats_json


class FrozenMasterTest(unittest.TestCase):
    def test_sigstop_under_load_then_sigcont(self):
        r = RedisServer()
        self.addCleanup(r.kill)
        f = Ferry(r, conf={'upstream': {'hold_timeout_ms': 1500, 'health_timeout_ms': 800,
                                        'ping_interval_ms': 200, 'connect_timeout_ms': 500,
                                        'fence_timeout_ms': 500}})
        self.addCleanup(f.stop)
        acked, errors, stop = [], [], threading.Event()

        def producer(n):
            c = f.client(socket_timeout=20)
            i = 0
            while not stop.is_set():
                item = 'p%d-%d' % (n, i)
                i += 1
                t0 = time.monotonic()
                try:
                    c.lpush('q', item)
                    acked.append(item)
                except redis.ResponseError as e:
                    errors.append((str(e), time.monotonic() - t0))
                except redis.TimeoutError as e:  # a hang: the bug this test is about
                    errors.append(('timeout: %s' % e, time.monotonic() - t0))
                    return

        threads = [threading.Thread(target=producer, args=(n,)) for n in range(4)]
        for t in threads:
            t.start()
        self.addCleanup(stop.set)
        wait_until(lambda: len(acked) > 200, timeout=10, msg='traffic to flow')
        r.sigstop()
        frozen_at = time.monotonic()
        try:
            wait_until(lambda: any('TRYAGAIN' in e for e, _ in errors), timeout=10,
                       msg='-TRYAGAIN at the hold bound while the master is frozen')
            self.assertFalse([e for e in errors if e[0].startswith('timeout')],
                             'a client hung instead of getting -TRYAGAIN')
            first = time.monotonic() - frozen_at
        finally:
            r.sigcont()
        n = len(acked)
        wait_until(lambda: len(acked) > n + 100, timeout=10, msg='service to resume on SIGCONT')
        stop.set()
        for t in threads:
            t.join(timeout=25)
        self.assertTrue(all('TRYAGAIN' in e for e, _ in errors), errors[:5])
        # Every acknowledged push is there (unknown outcomes may add duplicates).
        present = set(r.client().lrange('q', 0, -1))
        lost = [a for a in acked if a not in present]
        self.assertEqual(lost, [])
        self.assertLess(first, 8.0)
        self.assertIn('health probe', f.log())


class RefusedWriteTest(unittest.TestCase):
    def test_noreplicas_from_redis_is_retried(self):
        r = RedisServer(conf={'min-replicas-to-write': '1', 'min-replicas-max-lag': '10',
                              'repl-diskless-sync-delay': '0'})
        self.addCleanup(r.kill)
        f = Ferry(r, conf={'upstream': {'hold_timeout_ms': 8000}})
        self.addCleanup(f.stop)
        # With workers: every loop's master view UP before the restart, so
        # that each sees it come back (a loop that first connects after it
        # takes it for the master it started with).
        wait_until(lambda: all(w.get('upstream_up') for w in
                               stats_json(f.stats_port).get('worker_loops', [{}])),
                   timeout=10, msg="every loop's master view UP")
        # A master that comes back (a switch) may refuse writes until its
        # replicas are back: a failover, held. (The master ferry started
        # with refusing is its own configuration: answered at once.)
        r.restart()
        wait_until(lambda: f.client(socket_timeout=5).ping(), timeout=10,
                   msg='ferry UP again on the restarted master')
        result = {}

        def push():
            try:
                result['reply'] = f.client(socket_timeout=15).lpush('q', 'x')
            except Exception as e:  # noqa: BLE001 - recorded and asserted below
                result['reply'] = e

        t = threading.Thread(target=push)
        t.start()
        # Redis refuses with -NOREPLICAS; ferry must hold it, not answer.
        wait_until(lambda: r.client().info('commandstats').get('cmdstat_lpush', {})
                   .get('rejected_calls', 0) >= 1, timeout=5,
                   msg='Redis to refuse the first attempt')
        self.assertNotIn('reply', result)
        replica = RedisServer(conf={'replicaof': '127.0.0.1 %d' % r.port})
        self.addCleanup(replica.kill)
        t.join(timeout=15)
        self.assertEqual(result.get('reply'), 1)
        self.assertEqual(r.client().lrange('q', 0, -1), ['x'])


class ResetForgetsSubscriptionsTest(unittest.TestCase):
    def test_reset_then_link_lost(self):
        r = RedisServer()
        self.addCleanup(r.kill)
        f = Ferry(r)
        self.addCleanup(f.stop)
        s = f.raw()
        self.addCleanup(s.close)
        resp_send(s, ['SUBSCRIBE', 'old'])
        self.assertEqual(resp_read_reply(s), [b'subscribe', b'old', 1])
        resp_send(s, ['RESET'])
        self.assertEqual(resp_read_reply(s), 'RESET')
        resp_send(s, ['PING'])
        self.assertEqual(resp_read_reply(s), 'PONG')
        resp_send(s, ['SUBSCRIBE', 'new'])
        self.assertEqual(resp_read_reply(s), [b'subscribe', b'new', 1])
        # Lose the link: ferry re-subscribes what the client has now.
        r.kill()
        r.start()
        direct = r.client()
        wait_until(lambda: direct.pubsub_numsub('new')[0][1] == 1, timeout=10,
                   msg='ferry to re-subscribe the client')
        self.assertEqual(direct.pubsub_numsub('old')[0][1], 0)
        direct.publish('old', 'stale')
        direct.publish('new', 'fresh')
        self.assertEqual(resp_read_reply(s, timeout=5), [b'message', b'new', b'fresh'])


if __name__ == '__main__':
    unittest.main()
