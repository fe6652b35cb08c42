"""ferry in front of a Redis Cluster restarted by a takeover
(`scripts/rolling-restart --ferry`): the new process takes over the
listening sockets and the clients of the running one.

  a. Under 2 producers (LPUSH) and 2 consumers (BRPOP with a 1 s timeout)
     on queue keys of every shard, each on one connection it keeps: the
     script restarts ferry; 0 client errors, 0 acknowledged pushes lost
     (popped, or still in the queues after the run), every client still on
     its own socket, and the process serving them is the new one. A client
     blocked in `BRPOP k 0` meanwhile gets the next item pushed after the
     takeover on its own socket; a subscribed client is closed (cluster
     mode does not hand a subscription over).
  b. A transaction pinned to a slot, open when the takeover starts, goes
     on until EXEC; its client is then handed over on its own socket.

One cluster (3 masters + 3 replicas) and one ferry for the class.

Run:  python3 -m unittest test_cluster_takeover -v
Ferry-only (skipped with FERRY_TEST_DIRECT=1); workers: FERRY_TEST_WORKERS
(default 1).
"""
import os
import shutil
import subprocess
import tempfile
import threading
import time
import unittest

import redis

import harness
from harness import FERRY_BIN, ClusterTopology, Ferry, wait_until
from test_cluster_split import spread_keys
from test_takeover import PidProc, read_pid, run_script

HOLD_MS = 20000
WORKERS = int(os.environ.get('FERRY_TEST_WORKERS', '1'))
RUN_BEFORE = 1.0   # s of load before the takeover
RUN_AFTER = 1.5    # s of load after it


class Worker(threading.Thread):
    """One client on one connection of its own (never re-opened): any error
    is counted, nothing is retried."""

    def __init__(self, ferry, name):
        super().__init__(daemon=True, name=name)
        self.conn = redis.Connection(host='127.0.0.1', port=ferry.port, socket_timeout=30)
        self.conn.connect()
        self.sockname = self.conn._sock.getsockname()
        self.stop = threading.Event()
        self.errors = []
        self.done = []

    def call(self, *args):
        self.conn.send_command(*args)
        return self.conn.read_response()

    def run(self):
        try:
            self.loop()
        except Exception as e:  # noqa: BLE001 - every error is a finding
            self.errors.append(repr(e))

    def still_connected(self):
        return (self.conn._sock is not None
                and self.conn._sock.getsockname() == self.sockname
                and self.call('PING') in (b'PONG', 'PONG'))


class Producer(Worker):
    def __init__(self, ferry, name, keys):
        super().__init__(ferry, name)
        self.keys = keys

    def loop(self):
        i = 0
        while not self.stop.is_set() and i < 100000:
            k = self.keys[i % len(self.keys)]
            v = '%s:%d' % (self.name, i)
            self.call('LPUSH', k, v)
            self.done.append(v)  # acknowledged
            i += 1


class Consumer(Worker):
    def __init__(self, ferry, name, keys):
        super().__init__(ferry, name)
        self.keys = keys

    def loop(self):
        i = 0
        while not self.stop.is_set() and i < 100000:
            r = self.call('BRPOP', self.keys[i % len(self.keys)], 1)
            if r is not None:
                self.done.append(r[1].decode())
            i += 1


@unittest.skipIf(harness.DIRECT, 'ferry-only')
class ClusterTakeoverTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix='ferry-ctakeover-')
        cls.cluster = ClusterTopology(masters=3, replicas=1, node_timeout_ms=2000)
        try:
            conf = {'workers': WORKERS,
                    'cluster': {'nodes': [cls.cluster.seeds()[0]], 'refresh_interval_ms': 200,
                                'timeout_ms': 1000},
                    'upstream': {'hold_timeout_ms': HOLD_MS},
                    'takeover': {'socket': os.path.join(cls.tmp, 'takeover.sock')}}
            cls.ferry = Ferry(None, wait='port', conf=conf)
            c = cls.ferry.client(socket_timeout=5)
            try:
                wait_until(lambda: all(c.set('probe:{%s}' % t, 1) for t in 'abc'),
                           timeout=20, interval=0.1, msg='ferry serving the cluster')
            finally:
                c.close()
        except BaseException:
            cls.cluster.stop()
            shutil.rmtree(cls.tmp, True)
            raise

    @classmethod
    def tearDownClass(cls):
        cls.ferry.stop()
        cls.cluster.stop()
        shutil.rmtree(cls.tmp, True)

    def test_takeover_by_script_under_load(self):
        ferry = self.ferry
        masters = self.cluster.masters()
        keys = spread_keys(self.cluster, "ctk:q", 2)
        self.assertEqual(len({self.cluster.master_of(self.cluster.keyslot(k)) for k in keys}),
                         len(masters))
        c = ferry.client(socket_timeout=5)
        c.delete(*keys)
        c.close()
        pidfile = os.path.join(self.tmp, 'ferry.pid')
        with open(pidfile, 'w') as f:
            f.write('%d\n' % ferry.pid)
        old_pid = ferry.pid

        # A client blocked with no timeout (its call is cancelled on its
        # shard's master and re-issued by the new process) and a
        # subscribed one (closed: cluster mode does not hand it over).
        blk = redis.Connection(host='127.0.0.1', port=ferry.port, socket_timeout=30)
        blk.connect()
        blk_name = blk._sock.getsockname()
        blk.send_command('BRPOP', 'ctk:blk', 0)
        sub = redis.Connection(host='127.0.0.1', port=ferry.port, socket_timeout=10)
        sub.connect()
        sub.send_command('SUBSCRIBE', 'ctk:ch')
        self.assertEqual(sub.read_response()[0], b'subscribe')

        producers = [Producer(ferry, 'p%d' % i, keys[i::2]) for i in range(2)]
        consumers = [Consumer(ferry, 'c%d' % i, keys[i::2]) for i in range(2)]
        workers = producers + consumers
        for w in workers:
            w.start()
        wait_until(lambda: all(len(p.done) > 10 for p in producers), timeout=10,
                   interval=0.05, msg='producers running')
        time.sleep(RUN_BEFORE)
        before = sum(len(p.done) for p in producers)
        t0 = time.monotonic()
        rc, out = run_script(['--ferry', '--ferry-instance',
                              '%s:%s' % (ferry.config_path, pidfile),
                              '--ferry-bin', FERRY_BIN, '--step-timeout', '30'])
        took = time.monotonic() - t0
        old_proc = ferry.proc
        try:
            old_rc = old_proc.wait(10)
        except subprocess.TimeoutExpired:
            old_rc = None
        new_pid = read_pid(pidfile)
        if new_pid != old_pid:
            ferry.proc, ferry.pid = PidProc(new_pid), new_pid  # the harness stops it
        self.assertEqual(rc, 0, out + '\n' + ferry.log()[-4000:])
        self.assertEqual(old_rc, 0)
        self.assertNotEqual(new_pid, old_pid)
        self.assertIsNone(ferry.proc.poll(), 'the new ferry is not running')

        mid = sum(len(p.done) for p in producers)
        wait_until(lambda: sum(len(p.done) for p in producers) > mid + 50, timeout=15,
                   interval=0.05, msg='producers going on after the takeover')
        time.sleep(RUN_AFTER)
        for w in workers:
            w.stop.set()
        for w in workers:
            w.join(35)
            self.assertFalse(w.is_alive(), w.name)

        errors = [(w.name, e) for w in workers for e in w.errors]
        self.assertEqual(errors, [])
        for w in workers:
            self.assertTrue(w.still_connected(), '%s lost its connection' % w.name)
        log = ferry.log()
        self.assertIn('handed over to the new process', log)
        with self.subTest(check='the blocked client gets the next item on its own socket'):
            c = ferry.client(socket_timeout=5)
            c.lpush('ctk:blk', 'x')
            c.close()
            self.assertEqual(blk.read_response(), [b'ctk:blk', b'x'])
            self.assertEqual(blk._sock.getsockname(), blk_name)
        with self.subTest(check='a subscribed client is closed, not left dangling'):
            with self.assertRaises(redis.ConnectionError):
                sub.read_response()
            self.assertIn('cluster mode: a subscribed client cannot be handed over', log)

        acked = [v for p in producers for v in p.done]
        popped = [v for cns in consumers for v in cns.done]
        d = ferry.client(socket_timeout=5)
        left = [v.decode() if isinstance(v, bytes) else v
                for k in keys for v in d.lrange(k, 0, -1)]
        d.close()
        seen = set(popped) | set(left)
        lost = [v for v in acked if v not in seen]
        dup = len(popped) + len(left) - len(seen)
        print('\n[cluster-takeover] script %.2fs; pushes acknowledged %d (%d before it), '
              'popped %d, left %d, lost %d, duplicates %d, client errors %d'
              % (took, len(acked), before, len(popped), len(left), len(lost), dup,
                 len(errors)), flush=True)
        self.assertEqual(lost, [])
        self.assertEqual(dup, 0)
        self.assertEqual(set(popped + left) - set(acked), set())

    def test_transaction_goes_on_until_exec(self):
        """A transaction pinned to a slot (MULTI open when the takeover
        starts) goes on in the old process until EXEC, then its client is
        handed over and serves a transaction pinned to another slot."""
        ferry = self.ferry
        pidfile = os.path.join(self.tmp, 'ferry.pid')
        with open(pidfile, 'w') as f:
            f.write('%d\n' % ferry.pid)
        old_pid = ferry.pid
        tx = redis.Connection(host='127.0.0.1', port=ferry.port, socket_timeout=30)
        tx.connect()
        name = tx._sock.getsockname()

        def call(*args):
            tx.send_command(*args)
            return tx.read_response()

        self.assertEqual(call('MULTI'), b'OK')
        self.assertEqual(call('SET', '{ctkA}x', 'before'), b'QUEUED')
        out = {}
        script = threading.Thread(target=lambda: out.update(zip(('rc', 'out'), run_script(
            ['--ferry', '--ferry-instance', '%s:%s' % (ferry.config_path, pidfile),
             '--ferry-bin', FERRY_BIN, '--step-timeout', '30']))), daemon=True)
        mark = 'the new process accepts; handing over'
        seen = ferry.log().count(mark)
        script.start()
        wait_until(lambda: ferry.log().count(mark) > seen,
                   timeout=20, interval=0.05, msg='the old process handing over')
        # Still the old process: the transaction reads on.
        self.assertEqual(call('SET', '{ctkA}y', 'during'), b'QUEUED')
        self.assertEqual(call('EXEC'), [b'OK', b'OK'])
        script.join(60)
        self.assertFalse(script.is_alive())
        new_pid = read_pid(pidfile)
        if new_pid != old_pid:
            ferry.proc, ferry.pid = PidProc(new_pid), new_pid
        self.assertEqual(out.get('rc'), 0, out.get('out', ''))
        self.assertNotEqual(new_pid, old_pid)
        # Handed over with no pin: a transaction on another slot.
        self.assertEqual(call('MULTI'), b'OK')
        self.assertEqual(call('SET', '{ctkB}z', 'after'), b'QUEUED')
        self.assertEqual(call('GET', '{ctkB}z'), b'QUEUED')
        self.assertEqual(call('EXEC'), [b'OK', b'after'])
        self.assertEqual(call('MGET', '{ctkA}x', '{ctkA}y'), [b'before', b'during'])
        self.assertEqual(tx._sock.getsockname(), name)


if __name__ == '__main__':
    unittest.main()
