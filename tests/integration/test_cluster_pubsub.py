"""Pub/sub through ferry in front of a Redis Cluster, checked against a real
3 masters + 3 replicas cluster (harness ClusterTopology, node-timeout 2 s),
one cluster and one ferry for the class:

  1. SUBSCRIBE / PSUBSCRIBE through ferry: a message published through
     ferry and one published on each master directly (a cluster carries
     PUBLISH to every node) reach the subscriber.
  2. SSUBSCRIBE on channels of two shards from two clients: each gets the
     SPUBLISH of its own channel (through ferry and on the owner node);
     SSUBSCRIBE across slots gets a node's own CROSSSLOT; a connection's
     shard channels live on one shard (ferry's error otherwise).
  3. PUBSUB CHANNELS / NUMSUB / NUMPAT / SHARDCHANNELS / SHARDNUMSUB: the
     cluster's figures, summed or merged over every master.
  4. RESP3: the subscription's messages come as push frames, and the client
     runs commands while subscribed.
  4b. A reshard moves a shard channel's slot: the node drops the channel
     (its sunsubscribe never reaches the client), ferry subscribes it again
     on the slot's new master, and SPUBLISH after the move arrives.
  4c. durability.replicas_ack: a late WAIT has each shard's master send its
     replicas a few bytes with ferry's own SPUBLISH, on a channel of a slot
     that master serves (a node answers MOVED for another slot's channel).
  5. kill -9 of the master the subscription is on (a RESP2 and a RESP3
     subscriber), a publisher through ferry numbering its messages: the
     subscribers are subscribed again on another master; what was published
     while they had no subscription is counted (printed), one window, and
     every message after it arrives, in order.
  6. kill -9 of the master of a shard channel's slot: the subscription comes
     back on the promoted replica; SPUBLISH after it arrives.

Run:  python3 -m unittest test_cluster_pubsub -v        (about 20 s)
Ferry-only (skipped with FERRY_TEST_DIRECT=1); cluster mode runs one event
loop (workers: 1), so FERRY_TEST_WORKERS is not applied here.
"""
import json
import threading
import time
import unittest
import urllib.request

import redis

import harness
from harness import ClusterTopology, Ferry, RespError, resp_read_reply, resp_send, wait_until

REFRESH_MS = 200
HOLD_MS = 30000


def slot_of(name):
    """The cluster's slot of a name without a {tag} (CRC16/XMODEM % 16384)."""
    crc = 0
    for byte in name.encode():
        crc ^= byte << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021 if crc & 0x8000 else crc << 1) & 0xffff
    return crc % 16384


def dec(x):
    if isinstance(x, bytes):
        return x.decode()
    if isinstance(x, list):
        return [dec(e) for e in x]
    if isinstance(x, dict):
        return {dec(k): dec(v) for k, v in x.items()}
    return x


def read(sock, timeout=5):
    return dec(resp_read_reply(sock, timeout))


@unittest.skipIf(harness.DIRECT, 'ferry in cluster mode only')
class ClusterPubSubTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.cluster = ClusterTopology()
        try:
            conf = {'workers': 1,
                    'cluster': {'nodes': [cls.cluster.seeds()[0]],
                                'refresh_interval_ms': REFRESH_MS, 'timeout_ms': 1000},
                    'upstream': {'hold_timeout_ms': HOLD_MS}}
            cls.ferry = Ferry(None, wait='port', conf=conf)
            c = cls.ferry.client(socket_timeout=5)
            try:
                wait_until(lambda: c.set('probe:{a}', 1) and c.set('probe:{b}', 1) and
                           c.set('probe:{c}', 1), timeout=20, interval=0.1,
                           msg='ferry serving the cluster')
            finally:
                c.close()
        except BaseException:
            cls.cluster.stop()
            raise

    @classmethod
    def tearDownClass(cls):
        cls.ferry.stop()
        cls.cluster.stop()

    def raw(self):
        s = self.ferry.raw()
        self.addCleanup(s.close)
        return s

    def node(self, port):
        c = self.cluster.node_by_port(port).client(socket_timeout=5)
        self.addCleanup(c.close)
        return c

    def channels_of_two_shards(self, prefix):
        """Two channel names whose slots are served by two different masters."""
        a = prefix + ':0'
        ma = self.cluster.master_of(self.cluster.keyslot(a))
        for i in range(1, 1000):
            b = '%s:%d' % (prefix, i)
            if self.cluster.master_of(self.cluster.keyslot(b)) != ma:
                return a, b
        self.fail('no channel of another shard')

    def home_of(self, channel, sharded=False):
        """The master whose PUBSUB (SHARD)NUMSUB counts a subscriber of
        channel (asked of each master directly); None if none does."""
        sub = 'SHARDNUMSUB' if sharded else 'NUMSUB'
        for port in self.cluster.masters():
            try:
                got = self.cluster.command(port, 'PUBSUB', sub, channel)
            except (redis.ConnectionError, redis.TimeoutError):
                continue   # the master just killed
            if int(got[1]) > 0:
                return port
        return None

    def test_1_subscribe_gets_what_ferry_and_nodes_publish(self):
        sub = self.raw()
        resp_send(sub, ['SUBSCRIBE', 'news'])
        self.assertEqual(read(sub), ['subscribe', 'news', 1])
        resp_send(sub, ['PSUBSCRIBE', 'ev.*'])
        self.assertEqual(read(sub), ['psubscribe', 'ev.*', 2])
        pub = self.ferry.client(socket_timeout=10)
        self.addCleanup(pub.close)
        # PUBLISH through ferry goes to one master; the cluster bus carries
        # it to the subscriber's node (a node counts only its own receivers)
        pub.publish('news', 'via-ferry')
        self.assertEqual(read(sub), ['message', 'news', 'via-ferry'])
        for port in self.cluster.masters():
            self.node(port).publish('ev.%d' % port, 'direct')
            self.assertEqual(read(sub), ['pmessage', 'ev.*', 'ev.%d' % port, 'direct'])
        self.assertIsNotNone(self.home_of('news'))
        resp_send(sub, ['UNSUBSCRIBE', 'news'])
        self.assertEqual(read(sub), ['unsubscribe', 'news', 1])
        resp_send(sub, ['PING'])
        self.assertEqual(read(sub), ['pong', ''])

    def test_2_ssubscribe_on_two_shards(self):
        a, b = self.channels_of_two_shards('sch')
        sa, sb = self.raw(), self.raw()
        resp_send(sa, ['SSUBSCRIBE', a])
        self.assertEqual(read(sa), ['ssubscribe', a, 1])
        resp_send(sb, ['SSUBSCRIBE', b])
        self.assertEqual(read(sb), ['ssubscribe', b, 1])
        # each subscription lives on its channel's master
        self.assertEqual(self.home_of(a, True), self.cluster.master_of(self.cluster.keyslot(a)))
        self.assertEqual(self.home_of(b, True), self.cluster.master_of(self.cluster.keyslot(b)))
        pub = self.ferry.client(socket_timeout=10)
        self.addCleanup(pub.close)
        self.assertEqual(pub.execute_command('SPUBLISH', a, 'to-a'), 1)
        self.assertEqual(pub.execute_command('SPUBLISH', b, 'to-b'), 1)
        self.assertEqual(read(sa), ['smessage', a, 'to-a'])
        self.assertEqual(read(sb), ['smessage', b, 'to-b'])
        owner_b = self.node(self.cluster.master_of(self.cluster.keyslot(b)))
        self.assertEqual(owner_b.execute_command('SPUBLISH', b, 'direct-b'), 1)
        self.assertEqual(read(sb), ['smessage', b, 'direct-b'])
        # channels of two slots in one SSUBSCRIBE: the node's own error
        node = self.node(self.cluster.masters()[0])
        with self.assertRaises(redis.ResponseError) as want:
            node.execute_command('SSUBSCRIBE', a, b)
        s3 = self.raw()
        resp_send(s3, ['SSUBSCRIBE', a, b])
        got = read(s3)
        self.assertIsInstance(got, RespError)
        self.assertTrue(str(want.exception).startswith('CROSSSLOT'), str(want.exception))
        self.assertEqual(str(got), str(want.exception))
        # no channel: the node's arity error, and the connection chose no
        # master: it may still subscribe to any shard's channel
        with self.assertRaises(redis.ResponseError) as want:
            node.execute_command('SSUBSCRIBE')
        s4 = self.raw()
        resp_send(s4, ['SSUBSCRIBE'])
        got = read(s4)
        self.assertIsInstance(got, RespError)
        self.assertEqual(str(got), 'ERR ' + str(want.exception))   # redis-py drops 'ERR '
        resp_send(s4, ['SSUBSCRIBE', b])
        self.assertEqual(read(s4), ['ssubscribe', b, 1])
        self.assertEqual(pub.execute_command('SPUBLISH', b, 'to-s4'), 2)
        self.assertEqual(read(s4), ['smessage', b, 'to-s4'])
        self.assertEqual(read(sb), ['smessage', b, 'to-s4'])
        # a connection's shard channels live on one shard
        resp_send(sa, ['SSUBSCRIBE', b])
        got = read(sa)
        self.assertIsInstance(got, RespError)
        self.assertIn('cluster mode', str(got))
        # and that connection still serves its own channel
        self.assertEqual(pub.execute_command('SPUBLISH', a, 'again'), 1)
        self.assertEqual(read(sa), ['smessage', a, 'again'])
        # the client's own SUNSUBSCRIBE, pipelined with a SSUBSCRIBE of the
        # same channel, is answered as by a node (ferry tells it from a node
        # dropping the channel)
        sa.sendall(b'*2\r\n$12\r\nSUNSUBSCRIBE\r\n$%d\r\n%s\r\n'
                   b'*2\r\n$10\r\nSSUBSCRIBE\r\n$%d\r\n%s\r\n'
                   % (len(a), a.encode(), len(a), a.encode()))
        self.assertEqual(read(sa), ['sunsubscribe', a, 0])
        self.assertEqual(read(sa), ['ssubscribe', a, 1])
        self.assertEqual(pub.execute_command('SPUBLISH', a, 'still'), 1)
        self.assertEqual(read(sa), ['smessage', a, 'still'])
        resp_send(sa, ['SUNSUBSCRIBE', a])
        self.assertEqual(read(sa), ['sunsubscribe', a, 0])

    def test_3_pubsub_introspection(self):
        a, b = self.channels_of_two_shards('intro')
        subs = []
        for argv in (['SUBSCRIBE', 'intro-plain'], ['PSUBSCRIBE', 'intro.*'],
                     ['SSUBSCRIBE', a], ['SSUBSCRIBE', b]):
            s = self.raw()
            resp_send(s, argv)
            self.assertEqual(read(s)[0], argv[0].lower())
            subs.append(s)
        c = self.ferry.client(socket_timeout=10)
        self.addCleanup(c.close)
        self.assertIn('intro-plain', dec(c.execute_command('PUBSUB', 'CHANNELS', 'intro*')))
        self.assertEqual(dec(c.execute_command('PUBSUB', 'NUMSUB', 'intro-plain', 'none')),
                         ['intro-plain', 1, 'none', 0])
        self.assertGreaterEqual(c.execute_command('PUBSUB', 'NUMPAT'), 1)
        # shard channels are on two masters: ferry answers for the cluster
        self.assertEqual(sorted(dec(c.execute_command('PUBSUB', 'SHARDCHANNELS', 'intro*'))),
                         sorted([a, b]))
        self.assertEqual(dec(c.execute_command('PUBSUB', 'SHARDNUMSUB', a, b, 'none')),
                         [a, 1, b, 1, 'none', 0])

    def test_4_resp3_pushes(self):
        s = self.raw()
        resp_send(s, ['HELLO', '3'])
        self.assertEqual(read(s)['proto'], 3)
        resp_send(s, ['SUBSCRIBE', 'r3'])
        self.assertEqual(read(s), ['subscribe', 'r3', 1])
        pub = self.ferry.client(socket_timeout=10)
        self.addCleanup(pub.close)
        pub.publish('r3', 'hello')
        self.assertEqual(read(s), ['message', 'r3', 'hello'])
        # RESP3: commands go on while subscribed
        resp_send(s, ['PING'])
        self.assertEqual(read(s), 'PONG')
        resp_send(s, ['PUBLISH', 'r3', 'self'])
        got = [read(s), read(s)]
        self.assertIn(['message', 'r3', 'self'], got)

    def test_4b_slot_move_resubscribes(self):
        self.cluster.wait_consistent()
        src, dst = self.cluster.masters()[0], self.cluster.masters()[1]
        view = [v for v in self.cluster.nodes_view(src) if v['port'] == src][0]
        first = min(view['slots'])   # the slot a reshard of 1 slot moves
        ch = next(c for c in ('mv:%d' % i for i in range(200000)) if slot_of(c) == first)
        self.assertEqual(self.cluster.keyslot(ch), first)
        sub, sub3 = self.raw(), self.raw()
        resp_send(sub3, ['HELLO', '3'])
        self.assertEqual(read(sub3)['proto'], 3)
        for x in (sub, sub3):
            resp_send(x, ['SSUBSCRIBE', ch])
            self.assertEqual(read(x), ['ssubscribe', ch, 1])
        pub = self.ferry.client(socket_timeout=10)
        self.addCleanup(pub.close)
        self.assertEqual(pub.execute_command('SPUBLISH', ch, 'before'), 2)
        for x in (sub, sub3):
            self.assertEqual(read(x), ['smessage', ch, 'before'])
        self.cluster.reshard(src, dst, 1)
        self.assertEqual(self.cluster.master_of(first), dst)
        # subscribed again on the new master: a SPUBLISH there reaches it
        wait_until(lambda: pub.execute_command('SPUBLISH', ch, 'probe') == 2, timeout=10,
                   interval=0.1, msg='the shard channel subscribed on its new master')
        self.assertEqual(self.home_of(ch, True), dst)
        self.assertEqual(pub.execute_command('SPUBLISH', ch, 'after'), 2)
        for x in (sub, sub3):
            got = []
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and (not got or got[-1] != ['smessage', ch, 'after']):
                got.append(read(x))
            # only messages: the node's sunsubscribe and ferry's own
            # ssubscribe never reach the client
            self.assertTrue(all(m[0] == 'smessage' for m in got), got)
            self.assertEqual(got[-1], ['smessage', ch, 'after'])
            resp_send(x, ['SUNSUBSCRIBE', ch])
            self.assertEqual(read(x), ['sunsubscribe', ch, 0])

    def test_4c_replicas_ack_nudge_on_each_shard(self):
        self.cluster.wait_consistent()
        conf = {'workers': 1,
                'cluster': {'nodes': [self.cluster.seeds()[0]],
                            'refresh_interval_ms': REFRESH_MS, 'timeout_ms': 1000},
                'upstream': {'hold_timeout_ms': HOLD_MS},
                'durability': {'replicas_ack': 1}}
        f = Ferry(None, wait='port', conf=conf)
        self.addCleanup(f.stop)
        c = f.client(socket_timeout=30)
        self.addCleanup(c.close)

        def nudges():
            url = 'http://127.0.0.1:%d/stats' % f.stats_port
            with urllib.request.urlopen(url, timeout=5) as r:
                return json.loads(r.read())['durability']['wait_nudges']

        for m in self.cluster.masters():
            k = next(k for k in ('nudge:%d' % i for i in range(10000))
                     if self.cluster.master_of(self.cluster.keyslot(k)) == m)
            wait_until(lambda: c.set(k, 'first'), timeout=20, interval=0.1,
                       msg='ferry serving %s' % k)
            before = nudges()
            replica = self.cluster.node_by_port(self.cluster.replicas_of(m)[0])
            replica.sigstop()   # its acknowledgements wait: the WAIT is late
            done = []
            t = threading.Thread(target=lambda: done.append(c.set(k, 'second')))
            try:
                t.start()
                wait_until(lambda: nudges() > before, timeout=10, msg='a nudge of %d' % m)
            finally:
                replica.sigcont()
                t.join(timeout=30)
            self.assertEqual(done, [True])
        # every master took ferry's SPUBLISH (none answered MOVED)
        self.assertEqual([line for line in f.log().splitlines()
                          if "refused SPUBLISH to ferry's nudge channel" in line], [])

    def count_lost_around_a_kill(self, channel, publish, subscribe, sharded):
        """Subscribe to channel through ferry (a RESP2 and a RESP3
        connection), publish numbered messages through ferry every 10 ms,
        kill -9 the master the subscriptions are on. Each subscriber gets
        the messages in order, once each; what it lost is one window around
        the kill, and every message published once the subscriptions were
        back arrived. Prints the counts."""
        subs = []
        for proto in (2, 3):
            sub = self.raw()
            if proto == 3:
                resp_send(sub, ['HELLO', '3'])
                self.assertEqual(read(sub)['proto'], 3)
            resp_send(sub, subscribe)
            self.assertEqual(read(sub)[0], subscribe[0].lower())
            subs.append((proto, sub))
        home = wait_until(lambda: self.home_of(channel, sharded), timeout=5,
                          msg='the subscription on a master')
        stop = threading.Event()
        published, errors = [], []

        def publisher():
            c = self.ferry.client(socket_timeout=HOLD_MS / 1000 + 10)
            n = 0
            try:
                while not stop.is_set():
                    try:
                        c.execute_command(publish, channel, str(n))
                    except Exception as e:  # noqa: BLE001 - counted, asserted below
                        errors.append(repr(e))
                        return
                    published.append(n)
                    n += 1
                    time.sleep(0.01)
            finally:
                c.close()

        t = threading.Thread(target=publisher)
        t.start()
        try:
            wait_until(lambda: len(published) >= 20, timeout=10, msg='publishing')
            self.cluster.kill_master(home)
            t_kill = time.monotonic()
            wait_until(lambda: self.home_of(channel, sharded) not in (None, home), timeout=30,
                       interval=0.05, msg='the subscription on another master')
            t_back = time.monotonic()
            self.cluster.wait_promoted(home, timeout=30)
            mark = len(published)
            wait_until(lambda: len(published) >= mark + 20, timeout=20, msg='publishing after')
        finally:
            stop.set()
            t.join(timeout=HOLD_MS / 1000 + 20)
        self.assertEqual(errors, [])
        for proto, sub in subs:
            received = []
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and (not received or received[-1] != published[-1]):
                m = read(sub, 10)
                self.assertEqual(m[0], 'smessage' if sharded else 'message', m)
                received.append(int(m[-1]))
            self.assertEqual(received[-1], published[-1])
            self.assertEqual(received, sorted(set(received)), 'in order, once each')
            lost = sorted(set(published) - set(received))
            print('\n%s (RESP%d): %d published, %d received, %d lost %s; subscribed again '
                  '%.2f s after the kill' % (subscribe[0], proto, len(published), len(received),
                                             len(lost), lost, t_back - t_kill))
            # one window around the kill
            self.assertEqual(lost, list(range(lost[0], lost[-1] + 1)) if lost else [])
            self.assertTrue(set(published[mark:]) <= set(received))

    def test_5_kill_the_subscribers_master(self):
        self.cluster.wait_consistent()
        self.count_lost_around_a_kill('kill-news', 'PUBLISH', ['SUBSCRIBE', 'kill-news'], False)

    def test_6_kill_the_shard_channels_master(self):
        self.cluster.wait_consistent()
        # a shard that still has a replica (test 5 left one without)
        ch = next(c for c in ('kill-shard:%d' % i for i in range(1000))
                  if self.cluster.replicas_of(self.cluster.master_of(self.cluster.keyslot(c))))
        self.count_lost_around_a_kill(ch, 'SPUBLISH', ['SSUBSCRIBE', ch], True)


if __name__ == '__main__':
    unittest.main()
