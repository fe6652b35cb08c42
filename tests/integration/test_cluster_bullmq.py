"""ferry in front of a Redis Cluster serves what BullMQ's QueueEvents and
Queue.getWorkers need, checked against a real 3 masters + 3 replicas cluster
(harness ClusterTopology), one cluster and one ferry per class:

  1. CLIENT SETNAME / GETNAME answered by ferry (the name kept per client
     connection), CLIENT LIST is ferry's own client list with that name.
  2. XREAD BLOCK on a stream is woken by an XADD sent through ferry on
     another connection; XREAD over streams of two slots: CROSSSLOT.
  3. BLMPOP / LMPOP / ZMPOP over keys of one slot are served, over keys of
     two slots refused with a node's CROSSSLOT.
  4. BullMQ with a {hash-tagged} prefix: a QueueEvents receives 'completed'
     for every job a Worker processed, and Queue.getWorkers() lists it.
  z. kill -9 of the master under an XREAD BLOCK: sent again to the promoted
     replica, woken by an XADD through ferry after the failover.

Run:  python3 -m unittest test_cluster_bullmq -v        (about 30 s)
Ferry-only (skipped with FERRY_TEST_DIRECT=1).
"""
import json
import os
import shutil
import subprocess
import threading
import time
import unittest

import redis

from harness import ClusterTopology
from test_cluster_route import start_ferry, wait_served

CROSSSLOT = "Keys in request don't hash to the same slot"


def _s(v):
    if isinstance(v, (list, tuple)):
        return [_s(x) for x in v]
    return v.decode() if isinstance(v, bytes) else v


@unittest.skipIf(os.environ.get('FERRY_TEST_DIRECT') == '1', 'ferry-only')
class ClusterBullMQTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.cluster = ClusterTopology(masters=3, replicas=1, node_timeout_ms=2000)
        try:
            cls.ferry = start_ferry(cls.cluster)
            wait_served(cls.ferry)
        except BaseException:
            cls.cluster.stop()
            raise

    @classmethod
    def tearDownClass(cls):
        rc = cls.ferry.stop()
        cls.cluster.stop()
        if rc != 0:
            raise AssertionError('ferry exited %r:\n%s' % (rc, cls.ferry.log()[-3000:]))

    def two_slots(self):
        """Two key names on different masters."""
        a = 'ev:{a}'
        for tag in 'bcdefghijklmnop':
            b = 'ev:{%s}' % tag
            if (self.cluster.master_of(self.cluster.keyslot(b)) !=
                    self.cluster.master_of(self.cluster.keyslot(a))):
                return a, b
        raise AssertionError('no two tags on two masters')

    def test_1_client_setname_getname_and_list(self):
        c = self.ferry.client(socket_timeout=10)
        other = self.ferry.client(socket_timeout=10)
        try:
            self.assertIsNone(c.client_getname())
            self.assertTrue(c.client_setname('ferry-one'))
            self.assertEqual(_s(c.client_getname()), 'ferry-one')
            self.assertTrue(c.client_setname('ferry-two'))
            self.assertEqual(_s(c.client_getname()), 'ferry-two')
            with self.assertRaises(redis.ResponseError) as e:
                c.execute_command('CLIENT', 'SETNAME', 'has space')
            self.assertIn('cannot contain spaces', str(e.exception))
            self.assertEqual(_s(c.client_getname()), 'ferry-two')
            other.ping()
            my_id = c.client_id()
            rows = c.client_list()
            mine = [r for r in rows if int(r['id']) == my_id]
            self.assertEqual(len(mine), 1, rows)
            self.assertEqual(mine[0]['name'], 'ferry-two')
            self.assertIn(other.client_id(), [int(r['id']) for r in rows])
            # the name goes with a blocking call's link and stays after it
            key = 'name:{n}'
            c.delete(key)
            self.assertIsNone(c.blpop([key], timeout=0.2))
            self.assertEqual(_s(c.client_getname()), 'ferry-two')
            # inside MULTI: ferry's answer aborts the transaction, nothing runs
            c.delete('tx:{n}')
            p = c.pipeline(transaction=True)
            p.set('tx:{n}', 1)
            p.execute_command('CLIENT', 'SETNAME', 'in-tx')
            with self.assertRaises(redis.ResponseError):
                p.execute()
            self.assertIsNone(c.get('tx:{n}'))
        finally:
            c.close()
            other.close()

    def test_2_xread_block_woken_by_an_xadd_through_ferry(self):
        key = 'ev:{stream}'
        c = self.ferry.client(socket_timeout=15)
        w = self.ferry.client(socket_timeout=15)
        try:
            c.delete(key)
            c.xadd(key, {'n': '0'})
            self.assertEqual(len(c.xread({key: '0'})), 1)  # not blocking: by slot
            self.assertTrue(c.client_setname('ev-reader'))
            got = {}

            def reader():
                got['r'] = c.xread({key: '$'}, block=10000)
            t = threading.Thread(target=reader)
            t0 = time.monotonic()
            t.start()
            deadline = time.monotonic() + 10
            blocked = False
            while time.monotonic() < deadline and not blocked:
                node = self.cluster.node_by_port(
                    self.cluster.master_of(self.cluster.keyslot(key))).client(socket_timeout=5)
                try:
                    # blocked on the slot's master, on a link carrying the
                    # client's name (ferry set it there)
                    blocked = any(r.get('name') == 'ev-reader' and r.get('cmd') == 'xread'
                                  for r in node.client_list())
                finally:
                    node.close()
                if not blocked:
                    time.sleep(0.05)
            self.assertTrue(blocked, 'XREAD BLOCK never blocked on the master of its slot')
            w.xadd(key, {'n': '1'})
            t.join(12)
            self.assertFalse(t.is_alive())
            self.assertLess(time.monotonic() - t0, 9)
            r = got['r']
            self.assertEqual(_s(r[0][0]), key)
            self.assertEqual(_s(r[0][1][0][1]), {'n': '1'})
            # XREADGROUP BLOCK by slot too
            c.xgroup_create(key, 'g', id='0')
            r = c.xreadgroup('g', 'c1', {key: '>'}, count=5, block=1000)
            self.assertEqual(len(r[0][1]), 2)
            a, b = self.two_slots()
            for cmd in (('XREAD', 'BLOCK', '100', 'STREAMS', a, b, '0', '0'),
                        ('XREAD', 'STREAMS', a, b, '0', '0')):
                with self.assertRaises(redis.ResponseError) as e:
                    c.execute_command(*cmd)
                self.assertIn(CROSSSLOT, str(e.exception))
        finally:
            c.close()
            w.close()

    def test_3_mpop_by_slot_crossslot_across(self):
        c = self.ferry.client(socket_timeout=10)
        try:
            k1, k2 = 'mp:{q}:1', 'mp:{q}:2'
            c.delete(k1, k2)
            c.rpush(k2, 'x', 'y')
            self.assertEqual(_s(c.execute_command('BLMPOP', '1', '2', k1, k2, 'LEFT')),
                             [k2, ['x']])
            self.assertEqual(_s(c.execute_command('LMPOP', '2', k1, k2, 'RIGHT')),
                             [k2, ['y']])
            z = 'mp:{q}:z'
            c.delete(z)
            c.zadd(z, {'m': 1})
            self.assertEqual(_s(c.execute_command('BZMPOP', '1', '2', k1, z, 'MIN')),
                             [z, [['m', '1']]])
            c.zadd(z, {'n': 2})
            self.assertEqual(_s(c.execute_command('ZMPOP', '1', z, 'MAX')), [z, [['n', '2']]])
            a, b = self.two_slots()
            for cmd in (('BLMPOP', '0.1', '2', a, b, 'LEFT'), ('LMPOP', '2', a, b, 'LEFT'),
                        ('BZMPOP', '0.1', '2', a, b, 'MIN'), ('ZMPOP', '2', a, b, 'MIN')):
                with self.assertRaises(redis.ResponseError) as e:
                    c.execute_command(*cmd)
                self.assertIn(CROSSSLOT, str(e.exception))
            # a numkeys Redis refuses: any master answers its error
            with self.assertRaises(redis.ResponseError) as e:
                c.execute_command('LMPOP', '0', k1, 'LEFT')
            self.assertIn('numkeys', str(e.exception))
        finally:
            c.close()

    def test_4_bullmq_queue_events_and_get_workers(self):
        self.cluster.wait_consistent()
        node = shutil.which('node')
        if node is None:
            raise AssertionError('node is not installed: run scripts/setup')
        here = os.path.dirname(os.path.abspath(__file__))
        jobs = 50
        p = subprocess.run([node, os.path.join(here, 'node', 'bullmq_events.js'),
                            str(self.ferry.port), str(jobs), '{bullev}'],
                           capture_output=True, text=True, timeout=60, cwd=here)
        line = (p.stdout.strip().splitlines() or [''])[-1]
        try:
            out = json.loads(line)
        except ValueError:
            self.fail('node printed no JSON (exit %d):\n%s\n%s' % (p.returncode, p.stdout,
                                                                   p.stderr[-3000:]))
        self.assertEqual(out['errors'], [], out)
        self.assertEqual((out['added'], out['completed']), (jobs, jobs), out)
        # the Worker's connections, by the name it set (CLIENT SETNAME
        # '<prefix>:<queue, base64>:w:<worker name>'), in ferry's CLIENT LIST
        self.assertTrue(out['workers'], out)
        self.assertTrue(all(w.startswith('{bullev}:') and w.endswith(':w:w-ferry')
                            for w in out['workers']), out)

    def test_z_xread_block_across_a_failover_of_its_shard(self):
        """Last: it kills a master. An XREAD BLOCK waiting on the killed
        master's slot is sent again to the promoted replica with the time it
        has left, and an XADD through ferry after the failover wakes it."""
        self.cluster.wait_consistent()
        key = 'ev:{fo}'
        victim = self.cluster.master_of(self.cluster.keyslot(key))
        c = self.ferry.client(socket_timeout=60)
        w = self.ferry.client(socket_timeout=60)
        try:
            c.delete(key)
            c.xadd(key, {'n': '0'})
            got = {}

            def reader():
                try:
                    got['r'] = c.xread({key: '$'}, block=40000)
                except Exception as e:  # noqa: BLE001 - reported below
                    got['e'] = e
            t = threading.Thread(target=reader)
            t.start()
            node = self.cluster.node_by_port(victim).client(socket_timeout=5)
            try:
                deadline = time.monotonic() + 10
                while (time.monotonic() < deadline and
                       node.info('clients')['blocked_clients'] < 1):
                    time.sleep(0.05)
                self.assertGreaterEqual(node.info('clients')['blocked_clients'], 1)
            finally:
                node.close()
            self.cluster.kill_master(victim)
            new = self.cluster.wait_promoted(victim, timeout=30)
            # the call blocks again on the promoted master, then an XADD wakes it
            node = self.cluster.node_by_port(new).client(socket_timeout=5)
            try:
                deadline = time.monotonic() + 30
                while (time.monotonic() < deadline and
                       node.info('clients')['blocked_clients'] < 1):
                    time.sleep(0.05)
                self.assertGreaterEqual(node.info('clients')['blocked_clients'], 1,
                                        'XREAD BLOCK not sent again to the promoted master')
            finally:
                node.close()
            self.assertTrue(w.xadd(key, {'n': 'after'}))
            t.join(40)
            self.assertFalse(t.is_alive(), 'XREAD BLOCK never woken')
            self.assertNotIn('e', got, got)
            r = got['r']
            self.assertEqual(_s(r[0][0]), key, r)
            self.assertEqual(_s(r[0][1][0][1]), {'n': 'after'}, (r, new))
        finally:
            c.close()
            w.close()


if __name__ == '__main__':
    unittest.main()
