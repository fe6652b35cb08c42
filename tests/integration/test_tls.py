"""TLS on every connection: ferry in front of a TLS-only Redis (`port 0`,
`tls-port`), clients on ferry's TLS listener (redis-cli --tls, redis-py
ssl=True, node-redis and ioredis), client certificates required and
refused, bad input on both kinds of port, and the stats. The certificates
are made per run with the openssl command (tls_certs.py)."""

import json
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import threading
import time
import unittest

import redis

import harness
from failover_load import FAILOVER_CONF, AccountingChecks, Load, current_master, merged, now
from failover_load import sentinel_config_epoch
from harness import (Ferry, RedisServer, SentinelServer, SentinelTopology, free_port,
                     resp_read_reply, resp_send, wait_until)
from tls_certs import Pki

HERE = os.path.dirname(os.path.abspath(__file__))
PKI = None
CLI_TIMEOUT = 10


def setUpModule():
    global PKI
    PKI = Pki()


def tearDownModule():
    if PKI is not None:
        PKI.cleanup()


def tls_context(ca='ca.crt', cert='client.crt', key='client.key', check_hostname=True):
    ctx = ssl.create_default_context(cafile=PKI.path(ca))
    ctx.check_hostname = check_hostname
    if cert is not None:
        ctx.load_cert_chain(PKI.path(cert), PKI.path(key))
    return ctx


def tls_ping(port, timeout=2.0, **kw):
    raw = socket.create_connection(('127.0.0.1', port), timeout=timeout)
    s = tls_context(**kw).wrap_socket(raw, server_hostname='127.0.0.1')
    try:
        s.sendall(b'PING\r\n')
        return s.recv(64) == b'+PONG\r\n'
    finally:
        s.close()


class TlsRedis(RedisServer):
    """redis-server on TLS only: `port 0`, `tls-port` the port the harness
    picked, client certificates required (Redis' default)."""

    cert = 'server'  # its certificate and key in the PKI

    def _conf(self):
        text = super()._conf()
        lines = [l for l in text.splitlines() if not l.startswith('port ')]
        lines += ['port 0', 'tls-port %d' % self.port,
                  'tls-cert-file %s' % PKI.path(self.cert + '.crt'),
                  'tls-key-file %s' % PKI.path(self.cert + '.key'),
                  'tls-ca-cert-file %s' % PKI.path('ca.crt'),
                  'tls-replication yes']
        return '\n'.join(lines) + '\n'

    def _up(self):
        return tls_ping(self.port, timeout=1.0)

    def client(self, **kw):
        kw.setdefault('socket_timeout', 10)
        return redis.Redis(host='127.0.0.1', port=self.port, decode_responses=True, ssl=True,
                           ssl_ca_certs=PKI.path('ca.crt'), ssl_certfile=PKI.path('client.crt'),
                           ssl_keyfile=PKI.path('client.key'), **kw)


class TlsSentinel(SentinelServer):
    """redis-sentinel on TLS only, reaching the Redis nodes (and the other
    sentinels) over TLS with the same certificate."""

    def _conf(self):
        text = super()._conf()
        lines = [l for l in text.splitlines() if not l.startswith('port ')]
        lines = ['port 0', 'tls-port %d' % self.port,
                 'tls-cert-file %s' % PKI.path('server.crt'),
                 'tls-key-file %s' % PKI.path('server.key'),
                 'tls-ca-cert-file %s' % PKI.path('ca.crt'),
                 'tls-replication yes'] + lines
        return '\n'.join(lines) + '\n'

    def _up(self):
        return tls_ping(self.port, timeout=1.0)

    def client(self, **kw):
        kw.setdefault('socket_timeout', 2)
        kw.setdefault('socket_connect_timeout', 2)
        return redis.Redis(host='127.0.0.1', port=self.port, decode_responses=True, ssl=True,
                           ssl_ca_certs=PKI.path('ca.crt'), ssl_certfile=PKI.path('client.crt'),
                           ssl_keyfile=PKI.path('client.key'), **kw)


class ExpiredTlsRedis(TlsRedis):
    """A TLS Redis whose certificate has expired."""

    cert = 'expiredserver'

    def _up(self):
        raw = socket.create_connection(('127.0.0.1', self.port), timeout=1.0)
        ctx = tls_context(check_hostname=False)
        ctx.verify_mode = ssl.CERT_NONE
        s = ctx.wrap_socket(raw)
        try:
            s.sendall(b'PING\r\n')
            return s.recv(64) == b'+PONG\r\n'
        finally:
            s.close()


def redis_tls_section(**over):
    sec = {'ca_cert_file': PKI.path('ca.crt'), 'cert_file': PKI.path('client.crt'),
           'key_file': PKI.path('client.key')}
    sec.update(over)
    return sec


def listener_section(**over):
    sec = {'cert_file': PKI.path('server.crt'), 'key_file': PKI.path('server.key'),
           'ca_cert_file': PKI.path('ca.crt'), 'auth_clients': 'optional'}
    sec.update(over)
    return sec


def stats_json(port):
    s = socket.create_connection(('127.0.0.1', port), timeout=5)
    data = b''
    while True:
        chunk = s.recv(65536)
        if not chunk:
            break
        data += chunk
    s.close()
    return json.loads(data.decode())


class UpstreamTls(unittest.TestCase):
    """Plain clients through ferry to a TLS-only Redis: every link kind."""

    @classmethod
    def setUpClass(cls):
        cls.redis = TlsRedis()
        cls.ferry = Ferry(cls.redis, conf={
            'redis': {'tls': redis_tls_section()},
            'upstream': {'health_timeout_ms': 2000},
        })

    @classmethod
    def tearDownClass(cls):
        cls.ferry.stop()
        cls.redis.stop()

    def test_commands_of_every_link_kind(self):
        c = self.ferry.client(socket_timeout=5)
        # shared link (its verification: ROLE, durability) and plain commands
        self.assertTrue(c.set('tls:k', 'v'))
        self.assertEqual(c.get('tls:k'), 'v')
        big = 'x' * (3 * 1024 * 1024)  # several TLS records each way
        c.set('tls:big', big)
        self.assertEqual(c.get('tls:big'), big)
        # a pipeline of many writes
        p = c.pipeline(transaction=False)
        for i in range(2000):
            p.rpush('tls:q', i)
        self.assertEqual(p.execute()[-1], 2000)
        # a dedicated link: a blocking pop, a transaction
        self.assertEqual(c.brpop('tls:q', 1), ('tls:q', '1999'))
        with c.pipeline(transaction=True) as t:
            t.incr('tls:n')
            t.incr('tls:n')
            self.assertEqual(t.execute(), [1, 2])
        # pub/sub on its own link
        sub = self.ferry.client(socket_timeout=5).pubsub()
        sub.subscribe('tls:ch')
        wait_until(lambda: sub.get_message(timeout=0.2) is not None, 30, msg='subscribed')
        wait_until(lambda: c.publish('tls:ch', 'hello') == 1, 30, msg='one subscriber')
        msg = None
        deadline = time.time() + 5
        while msg is None and time.time() < deadline:
            msg = sub.get_message(timeout=0.5)
        self.assertEqual(msg and msg['data'], 'hello')
        sub.close()
        # what Redis holds, read directly over TLS
        self.assertEqual(self.redis.client().get('tls:k'), 'v')
        # ferry's durability settings went over TLS too
        self.assertEqual(self.redis.client().config_get('appendfsync')['appendfsync'], 'always')

    def test_redis_cli_plain_to_ferry(self):
        out = subprocess.run(['redis-cli', '-p', str(self.ferry.port)],
                             input='SET tls:cli 1\nINCR tls:cli\nGET tls:cli\n',
                             capture_output=True, text=True, timeout=CLI_TIMEOUT)
        self.assertEqual(out.stdout.split(), ['OK', '2', '2'], out.stderr)

    def test_probe_link_over_tls(self):
        # the health probe (upstream.health_timeout_ms) keeps answering: no
        # freeze logged, and its links are TLS ones (Redis sees no plain port)
        c = self.ferry.client(socket_timeout=5)
        t0 = time.time()
        while time.time() - t0 < 3:
            self.assertEqual(c.ping(), True)
            time.sleep(0.2)
        log = self.ferry.log()
        self.assertNotIn('frozen', log)
        self.assertNotIn('TLS to', log)  # no TLS error on any link
        probe = re.search(r'link (\d+): connecting to \S+ \(probe', log)
        self.assertIsNotNone(probe, 'no probe link in the log')
        self.assertIn('link %s: TLS handshake with' % probe.group(1), log)


class UpstreamTlsAclAndWait(unittest.TestCase):
    """client.auth redis (links per ACL user) and replicas_ack (WAIT) over
    TLS: a TLS replica replicates over TLS (tls-replication yes)."""

    def test_acl_user_links_and_wait(self):
        # repl-diskless-sync-delay 0: Redis' default (5 s) keeps a replica
        # that just attached in wait_bgsave, unable to confirm, for 5 s.
        master = TlsRedis({'repl-diskless-sync-delay': 0})
        replica = TlsRedis({'replicaof': '127.0.0.1 %d' % master.port})
        try:
            m = master.client()
            m.execute_command('ACL', 'SETUSER', 'app', 'on', '>secret', '~*', '+@all')
            wait_until(lambda: (m.info('replication').get('slave0') or {}).get('state') == 'online',
                       20, msg='the replica attached over TLS and in sync')
            f = Ferry(master, conf={'redis': {'tls': redis_tls_section()},
                                    'client': {'auth': 'redis'},
                                    'durability': {'replicas_ack': 1}})
            try:
                c = f.client(username='app', password='secret', socket_timeout=5)
                self.assertEqual(c.acl_whoami(), 'app')
                self.assertEqual(c.rpush('tls:acl', 'a'), 1)
                self.assertEqual(c.blpop('tls:acl', 1), ('tls:acl', 'a'))
                bad = f.client(username='app', password='wrong', socket_timeout=5)
                with self.assertRaisesRegex(redis.exceptions.ResponseError, 'WRONGPASS'):
                    bad.ping()
                # acknowledged after WAIT 1: the replica has it
                self.assertEqual(c.incr('tls:acked'), 1)
                self.assertEqual(replica.client().get('tls:acked'), '1')
            finally:
                f.stop()
        finally:
            replica.stop()
            master.stop()


class UpstreamTlsRefusals(unittest.TestCase):
    """A Redis whose certificate ferry must not trust: the link is refused
    with a log line naming the reason, and nothing is sent in clear."""

    def check_refused(self, tls_section, expect, server_cls=TlsRedis):
        r = server_cls()
        f = Ferry(r, conf={'redis': {'tls': tls_section}}, wait='port')
        try:
            try:
                wait_until(lambda: expect in f.log(), 10, msg='log line %r' % expect)
            except AssertionError as e:
                raise AssertionError('%s\n--- ferry log ---\n%s' % (e, f.log()[-3000:])) from None
            c = f.client(socket_timeout=3)
            with self.assertRaises(redis.exceptions.RedisError):
                c.ping()
        finally:
            f.stop()
            r.stop()

    def test_wrong_ca(self):
        self.check_refused(redis_tls_section(ca_cert_file=PKI.path('otherca.crt')),
                           ': certificate: self-signed certificate in certificate chain')

    def test_expired_certificate(self):
        self.check_refused(redis_tls_section(), ': certificate: certificate has expired',
                           server_cls=ExpiredTlsRedis)

    def test_name_mismatch_with_verify_full(self):
        self.check_refused(redis_tls_section(server_name='redis.example.org'),
                           'certificate: hostname mismatch')

    def test_node_that_stalls_mid_handshake(self):
        # accepts connections and never answers: each link is closed at
        # upstream.connect_timeout_ms, logged and counted
        srv = socket.socket()
        srv.bind(('127.0.0.1', 0))
        srv.listen(64)
        port = srv.getsockname()[1]
        held, stop = [], threading.Event()

        def accept():
            srv.settimeout(0.2)
            while not stop.is_set():
                try:
                    held.append(srv.accept()[0])
                except socket.timeout:
                    pass
        th = threading.Thread(target=accept)
        th.start()
        f = Ferry(None, conf={'redis': {'address': '127.0.0.1:%d' % port,
                                        'tls': redis_tls_section()},
                              'upstream': {'connect_timeout_ms': 500}}, wait='port')
        try:
            wait_until(lambda: 'TLS handshake timeout (upstream.connect_timeout_ms)' in f.log(),
                       10, msg='the stalled handshake closed')
            wait_until(lambda: tls_stats(f)['tls_upstream_failures'] >= 1, 30,
                       msg='counted')
            self.assertEqual(tls_stats(f)['tls_upstream_handshakes'], 0)
        finally:
            f.stop()
            stop.set()
            th.join(5)
            for c in held:
                c.close()
            srv.close()

    def test_verify_ca_accepts_other_name(self):
        r = TlsRedis()
        f = Ferry(r, conf={'redis': {'tls': redis_tls_section(server_name='redis.example.org',
                                                              verify='ca')}})
        try:
            self.assertTrue(f.client(socket_timeout=5).ping())
        finally:
            f.stop()
            r.stop()

    def test_no_client_certificate(self):
        # Redis requires one (tls-auth-clients yes): its refusal is logged
        sec = redis_tls_section()
        del sec['cert_file'], sec['key_file']
        self.check_refused(sec, 'TLS to 127.0.0.1')


def tls_port_of(f):
    return int(f.conf['listen_tls'].rsplit(':', 1)[1])


def ferry_with_listener(redis_server, tls_over=None, extra=None):
    """A ferry with a plain and a TLS listener in front of redis_server."""
    conf = {'listen_tls': '127.0.0.1:%d' % free_port(),
            'tls': listener_section(**(tls_over or {}))}
    conf.update(extra or {})
    return Ferry(redis_server, conf=conf)


def tls_client(f, **kw):
    kw.setdefault('socket_timeout', 5)
    kw.setdefault('ssl_ca_certs', PKI.path('ca.crt'))
    return redis.Redis(host='127.0.0.1', port=tls_port_of(f), ssl=True, decode_responses=True,
                       **kw)


def tls_stats(f):
    return stats_json(f.stats_port)['tls']


class ListenerTls(unittest.TestCase):
    """Clients on ferry's TLS listener, beside the plain one."""

    @classmethod
    def setUpClass(cls):
        cls.redis = RedisServer()
        cls.ferry = ferry_with_listener(cls.redis, {'handshake_timeout_ms': 700})

    @classmethod
    def tearDownClass(cls):
        cls.ferry.stop()
        cls.redis.stop()

    def test_redis_py_ssl(self):
        c = tls_client(self.ferry)
        self.assertTrue(c.ping())
        big = 'y' * (2 * 1024 * 1024 + 17)
        c.set('tlsl:big', big)
        self.assertEqual(c.get('tlsl:big'), big)
        p = c.pipeline(transaction=False)
        for i in range(3000):
            p.rpush('tlsl:q', i)
        self.assertEqual(p.execute()[-1], 3000)
        self.assertEqual(c.blpop('tlsl:q', 1), ('tlsl:q', '0'))
        self.assertEqual(self.redis.client().llen('tlsl:q'), 2999)
        # the plain listener still serves
        self.assertEqual(self.ferry.client().get('tlsl:big'), big)
        # a client certificate is accepted too (auth_clients optional)
        c2 = tls_client(self.ferry, ssl_certfile=PKI.path('client.crt'),
                        ssl_keyfile=PKI.path('client.key'))
        self.assertEqual(c2.llen('tlsl:q'), 2999)

    def test_pubsub_over_tls(self):
        sub = tls_client(self.ferry).pubsub()
        sub.subscribe('tlsl:ch')
        wait_until(lambda: sub.get_message(timeout=0.2) is not None, 30, msg='subscribed')
        wait_until(lambda: self.ferry.client().publish('tlsl:ch', 'm1') == 1, 30)
        msg = None
        deadline = time.time() + 5
        while msg is None and time.time() < deadline:
            msg = sub.get_message(timeout=0.5)
        self.assertEqual(msg and msg['data'], 'm1')
        sub.close()

    def test_redis_cli_tls(self):
        out = subprocess.run(['redis-cli', '--tls', '--cacert', PKI.path('ca.crt'),
                              '-p', str(tls_port_of(self.ferry))],
                             input='SET tlsl:cli 5\nINCR tlsl:cli\nGET tlsl:cli\n',
                             capture_output=True, text=True, timeout=CLI_TIMEOUT)
        self.assertEqual(out.stdout.split(), ['OK', '6', '6'], out.stderr)

    def test_node_clients(self):
        node = shutil.which('node')
        self.assertIsNotNone(node, 'node is not installed: run scripts/setup')
        p = subprocess.run([node, os.path.join(HERE, 'node', 'tls.js'),
                            str(tls_port_of(self.ferry)), PKI.path('ca.crt'), 'tlsnode'],
                           capture_output=True, text=True, timeout=60, cwd=HERE)
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        out = json.loads(p.stdout.strip().splitlines()[-1])
        self.assertEqual(out['ioredis_get'], 'v1')
        self.assertEqual(out['ioredis_pipeline_last'], 500)
        self.assertEqual(out['ioredis_brpop'], ['tlsnode:ioq', '499'])
        self.assertEqual(out['node_redis_get'], 'v2')
        self.assertEqual(out['node_redis_exec'], [1, 2])
        self.assertEqual(self.redis.client().llen('tlsnode:ioq'), 499)

    def test_session_resumed(self):
        before = tls_stats(self.ferry)
        ctx = tls_context(cert=None)
        raw = socket.create_connection(('127.0.0.1', tls_port_of(self.ferry)), timeout=5)
        s = ctx.wrap_socket(raw, server_hostname='localhost')
        s.sendall(b'PING\r\n')
        self.assertEqual(s.recv(64), b'+PONG\r\n')  # the ticket came before the reply
        sess = s.session
        s.close()
        raw = socket.create_connection(('127.0.0.1', tls_port_of(self.ferry)), timeout=5)
        s = ctx.wrap_socket(raw, server_hostname='localhost', session=sess)
        s.sendall(b'PING\r\n')
        self.assertEqual(s.recv(64), b'+PONG\r\n')
        self.assertTrue(s.session_reused)
        s.close()
        after = tls_stats(self.ferry)
        self.assertEqual(after['tls_handshakes'] - before['tls_handshakes'], 2)
        self.assertEqual(after['tls_sessions_resumed'] - before['tls_sessions_resumed'], 1)

    def check_others_fine(self):
        c = tls_client(self.ferry)
        self.assertTrue(c.set('tlsl:still', 'ok'))
        self.assertEqual(self.ferry.client().get('tlsl:still'), 'ok')

    def wait_stat(self, name, before, what):
        try:
            wait_until(lambda: tls_stats(self.ferry)[name] == before[name] + 1, 30,
                       msg='%s counted' % name)
        except AssertionError as e:
            raise AssertionError('%s\n%s' % (e, self.ferry.log()[-3000:])) from None
        wait_until(lambda: what in self.ferry.log(), 30, msg='log line %r' % what)

    def test_plain_resp_on_tls_port(self):
        before = tls_stats(self.ferry)
        s = socket.create_connection(('127.0.0.1', tls_port_of(self.ferry)), timeout=5)
        resp_send(s, ['SET', 'tlsl:plain', 'x'])
        s.settimeout(5)
        data = b''
        try:
            while True:
                chunk = s.recv(4096)
                if not chunk:
                    break
                data += chunk
        except ConnectionResetError:
            pass
        s.close()
        self.assertNotIn(b'+OK', data)  # closed, nothing served in clear
        self.wait_stat('tls_failed_not_tls', before, 'TLS handshake failed: TLS')
        self.assertIsNone(self.redis.client().get('tlsl:plain'))
        self.check_others_fine()

    def test_stalled_handshake(self):
        before = tls_stats(self.ferry)
        s = socket.create_connection(('127.0.0.1', tls_port_of(self.ferry)), timeout=5)
        s.sendall(b'\x16\x03\x01\x02\x00\x01')  # a ClientHello's first bytes, then nothing
        t0 = time.time()
        s.settimeout(30)
        self.assertEqual(s.recv(100), b'')  # ferry closed it
        self.assertLess(time.time() - t0, 10)  # handshake_timeout_ms is 700: not never
        s.close()
        self.wait_stat('tls_failed_timeout', before, 'not finished within tls.handshake_timeout_ms')
        self.check_others_fine()

    def test_client_trusting_another_ca(self):
        before = tls_stats(self.ferry)
        with self.assertRaises(redis.exceptions.ConnectionError):
            tls_client(self.ferry, ssl_ca_certs=PKI.path('otherca.crt')).ping()
        self.wait_stat('tls_failed_certificate', before, 'TLS handshake failed')
        self.check_others_fine()

    def test_tls_to_plain_port(self):
        # a TLS client on the plain port: closed at its ClientHello, with one
        # log line and a count; nothing written back; the rest undisturbed
        clients = stats_json(self.ferry.stats_port)['clients']
        before = clients.get('clients_tls_on_plain_port', 0)
        with self.assertRaises(redis.exceptions.ConnectionError):
            redis.Redis(host='127.0.0.1', port=self.ferry.port, ssl=True,
                        ssl_ca_certs=PKI.path('ca.crt'), socket_timeout=5).ping()
        # the ClientHello of Python's ssl module, sent on a bare socket
        ctx = ssl.create_default_context(cafile=PKI.path('ca.crt'))
        bio_in, bio_out = ssl.MemoryBIO(), ssl.MemoryBIO()
        tls = ctx.wrap_bio(bio_in, bio_out, server_hostname='localhost')
        with self.assertRaises(ssl.SSLWantReadError):
            tls.do_handshake()
        hello = bio_out.read()
        self.assertEqual(hello[:2], b'\x16\x03')
        s = socket.create_connection(('127.0.0.1', self.ferry.port), timeout=5)
        s.sendall(hello)
        data = b''
        try:
            for _ in range(100):
                chunk = s.recv(4096)
                if not chunk:
                    break
                data += chunk
        except ConnectionResetError:
            pass
        s.close()
        self.assertEqual(data, b'')  # closed: no RESP error sent into a TLS handshake
        wait_until(lambda: stats_json(self.ferry.stats_port)['clients']
                   ['clients_tls_on_plain_port'] == before + 2, 30,
                   msg='clients_tls_on_plain_port counted twice')
        self.assertIn('TLS handshake on a plain port', self.ferry.log())
        self.check_others_fine()


class ClusterTls(unittest.TestCase):
    """Cluster mode over TLS: a TLS-only cluster (port 0, tls-port,
    tls-cluster yes) whose slot map ferry learns through redis.tls."""

    def test_map_of_a_tls_only_cluster(self):
        nodes = []
        f = None
        try:
            for _ in range(3):
                port = harness._free_cluster_port()
                nodes.append(TlsRedis({'port': port, 'cluster-enabled': 'yes',
                                       'tls-cluster': 'yes',
                                       'cluster-config-file': 'nodes-%d.conf' % port}))
            seeds = ['127.0.0.1:%d' % n.port for n in nodes]
            p = subprocess.run([harness.REDIS_CLI, '--tls', '--cacert', PKI.path('ca.crt'),
                                '--cert', PKI.path('client.crt'), '--key',
                                PKI.path('client.key'), '--cluster', 'create'] + seeds +
                               ['--cluster-yes'], stdin=subprocess.DEVNULL,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=60)
            self.assertEqual(p.returncode, 0, p.stdout.decode(errors='replace')[-2000:])

            def ok():
                return all('cluster_state:ok' in n.client().execute_command('CLUSTER', 'INFO')
                           for n in nodes)
            wait_until(ok, 30, msg='cluster_state:ok on every node')
            f = Ferry(None, wait=None, conf={
                'cluster': {'nodes': [seeds[0]], 'refresh_interval_ms': 200, 'timeout_ms': 1000},
                'redis': {'tls': redis_tls_section()}})

            def learned():
                doc = stats_json(f.stats_port)['cluster']
                owned = sum(hi - lo + 1 for sh in doc['shards'] for lo, hi in sh['slots'])
                ports = sorted(sh['master']['port'] for sh in doc['shards'])
                return owned == 16384 and ports == sorted(n.port for n in nodes)
            try:
                wait_until(learned, 15, msg='the TLS cluster map learned')
            except AssertionError as e:
                raise AssertionError('%s\n%s' % (e, f.log()[-3000:])) from None
            self.routes_over_tls(f, nodes)
        finally:
            if f is not None:
                f.stop()
            for n in nodes:
                n.stop()


    def routes_over_tls(self, f, nodes):
        """Commands through ferry reach the master of their slot over TLS:
        every key is on the node the map names (read there directly), the
        keys cover every master, and a blocking pop is served on its slot."""
        doc = stats_json(f.stats_port)['cluster']
        owner = {}
        for sh in doc['shards']:
            for lo, hi in sh['slots']:
                owner[(lo, hi)] = sh['master']['port']

        def port_of(slot):
            return next(p for (lo, hi), p in owner.items() if lo <= slot <= hi)
        by_port = {n.port: n for n in nodes}
        c = f.client(socket_timeout=10)
        seen = set()
        for i in range(60):
            key = 'tls:k%d' % i
            self.assertTrue(c.set(key, 'v%d' % i))
            slot = nodes[0].client().execute_command('CLUSTER', 'KEYSLOT', key)
            node = by_port[port_of(slot)]
            self.assertEqual(node.client().get(key), 'v%d' % i,
                             '%s (slot %d) not on %d' % (key, slot, node.port))
            self.assertEqual(c.get(key), 'v%d' % i)
            seen.add(node.port)
        self.assertEqual(seen, set(by_port), 'keys reached only %r' % sorted(seen))
        self.assertEqual(c.lpush('tls:q{a}', 'x'), 1)
        self.assertEqual(c.brpop('tls:q{a}', 2), ('tls:q{a}', 'x'))
        self.assertIsNone(c.brpop('tls:q{b}', 1))
        st = tls_stats(f)
        self.assertGreaterEqual(st['tls_upstream_handshakes'], len(nodes))
        self.assertEqual(st['tls_upstream_failures'], 0)


class TwoTlsListeners(unittest.TestCase):
    """Two listen_tls addresses: each counts its own handshakes and failures."""

    def test_figures_per_listener(self):
        r = RedisServer()
        a, b = free_port(), free_port()
        f = Ferry(r, conf={'listen_tls': ['127.0.0.1:%d' % a, '127.0.0.1:%d' % b],
                           'tls': listener_section()})
        try:
            for _ in range(2):
                c = redis.Redis(host='127.0.0.1', port=b, ssl=True, socket_timeout=5,
                                ssl_ca_certs=PKI.path('ca.crt'))
                self.assertTrue(c.ping())
                c.close()
            s = socket.create_connection(('127.0.0.1', a), timeout=5)
            resp_send(s, ['PING'])
            s.settimeout(5)
            try:
                while s.recv(4096):
                    pass
            except ConnectionResetError:
                pass
            s.close()

            def per():
                return {l['address']: l for l in tls_stats(f)['tls_listeners']}
            wait_until(lambda: per()['127.0.0.1:%d' % a]['failed']['not_tls'] == 1, 30,
                       msg='the plain client counted on its listener')
            la, lb = per()['127.0.0.1:%d' % a], per()['127.0.0.1:%d' % b]
            self.assertEqual((la['handshakes'], lb['handshakes']), (0, 2))
            self.assertEqual(lb['failed'], {'timeout': 0, 'not_tls': 0, 'certificate': 0,
                                            'protocol': 0, 'closed': 0})
            st = tls_stats(f)
            self.assertEqual((st['tls_handshakes'], st['tls_failed_not_tls']), (2, 1))
        finally:
            f.stop()
            r.stop()


class ListenerClientCerts(unittest.TestCase):
    """auth_clients yes: a client certificate from the CA is required."""

    @classmethod
    def setUpClass(cls):
        cls.redis = RedisServer()
        cls.ferry = ferry_with_listener(cls.redis, {'auth_clients': 'yes'})

    @classmethod
    def tearDownClass(cls):
        cls.ferry.stop()
        cls.redis.stop()

    def test_required_and_refused(self):
        before = tls_stats(self.ferry)
        ok = tls_client(self.ferry, ssl_certfile=PKI.path('client.crt'),
                        ssl_keyfile=PKI.path('client.key'))
        self.assertTrue(ok.set('tlsc:k', '1'))
        with self.assertRaises(redis.exceptions.ConnectionError):
            tls_client(self.ferry).ping()  # no certificate
        with self.assertRaises(redis.exceptions.ConnectionError):
            tls_client(self.ferry, ssl_certfile=PKI.path('otherclient.crt'),
                       ssl_keyfile=PKI.path('otherclient.key')).ping()  # another CA's
        with self.assertRaises(redis.exceptions.ConnectionError):
            tls_client(self.ferry, ssl_certfile=PKI.path('expiredclient.crt'),
                       ssl_keyfile=PKI.path('expiredclient.key')).ping()  # expired
        try:
            # (redis-py tries a refused connection more than once)
            wait_until(lambda: tls_stats(self.ferry)['tls_failed_certificate']
                       >= before['tls_failed_certificate'] + 3, 30, msg='three refusals counted')
        except AssertionError as e:
            raise AssertionError('%s: %r\n%s' % (e, tls_stats(self.ferry),
                                                  self.ferry.log()[-3000:])) from None
        self.assertEqual(tls_stats(self.ferry)['tls_handshakes'], before['tls_handshakes'] + 1)
        log = self.ferry.log()
        self.assertIn('TLS handshake failed: certificate: certificate has expired', log)
        self.assertIn('TLS handshake failed: certificate', log)
        self.assertEqual(ok.get('tlsc:k'), '1')


class TlsLoad(Load):
    """failover_load's workload, its clients on ferry's TLS listener."""

    def client(self):
        return tls_client(self.ferry, socket_timeout=self.client_timeout,
                          socket_connect_timeout=5, **self.client_kw)


@unittest.skipIf(harness.DIRECT, 'ferry-only: needs ferry in sentinel mode')
class SentinelTls(AccountingChecks, unittest.TestCase):
    """Everything on TLS: Redis nodes (TLS-only, tls-replication), sentinels
    (TLS-only), ferry's links to both and its clients. A kill -9 of the
    master under load: no client error, nothing acknowledged lost."""

    def test_kill9_master_everything_on_tls(self):
        for attempt in (1, 2):
            cleanups = []
            try:
                topo = SentinelTopology(redis_cls=TlsRedis, sentinel_cls=TlsSentinel,
                                        replica_conf={'appendfsync': 'everysec'})
                cleanups.append(topo.stop)
                ferry = Ferry(None, sentinel=topo, conf=merged(FAILOVER_CONF, {
                    'redis': {'tls': redis_tls_section()},
                    'sentinel': {'tls': redis_tls_section()},
                    'listen_tls': '127.0.0.1:%d' % free_port(),
                    'tls': listener_section(),
                }))
                cleanups.append(ferry.stop)
                load = TlsLoad(ferry, 'tls-kill9-%d' % attempt).start()
                cleanups.append(lambda: (load.stop_producers.set(), load.stop_consumers.set()))
                time.sleep(3.0)
                old = topo.master()
                t_fault = now()
                old.kill()
                new_port = topo.wait_failover(old.port, timeout=30)
                t_rec = now()
                t_service = load.wait_service(t_rec)
                time.sleep(4.0)
                res = load.finish(lambda: current_master(topo))
                epoch = sentinel_config_epoch(topo)
                if epoch > 1 and attempt == 1:
                    print('\n[tls kill9] Sentinel failed over twice (config epoch %d): running '
                          'again on fresh processes' % epoch, flush=True)
                    continue
                self.assertLessEqual(epoch, 1, 'Sentinel failed over more than once in two runs')
                res.t_fault, res.t_recovered, res.t_service = t_fault, t_rec, t_service
                print(res.summary('tls kill9'), flush=True)
                self.check_accounting(res, topo, ferry)
                self.check_consumers_after(res, t_rec, topo, ferry)
                st = tls_stats(ferry)
                self.assertGreater(st['tls_handshakes'], 0)
                self.assertGreater(st['tls_upstream_handshakes'], 0)
                self.assertIn('UP(127.0.0.1:%d' % new_port, ferry.log())
                return
            finally:
                for c in reversed(cleanups):
                    try:
                        c()
                    except Exception:  # noqa: BLE001
                        pass


def peer_cn(f):
    """The CN of the certificate ferry's TLS listener shows a new client."""
    raw = socket.create_connection(('127.0.0.1', tls_port_of(f)), timeout=5)
    s = tls_context(cert=None).wrap_socket(raw, server_hostname='localhost')
    try:
        return dict(x[0] for x in s.getpeercert()['subject'])['commonName']
    finally:
        s.close()


class ReloadAndTakeover(unittest.TestCase):
    """SIGHUP reloads the certificate files (new connections take them,
    open ones keep theirs, a bad file is refused); a takeover closes TLS
    clients after their replies and hands the plain ones over."""

    def test_sighup_reload_under_load(self):
        r = RedisServer()
        d = tempfile.mkdtemp(prefix='ferry-tls-reload-', dir=PKI.dir)
        cert, key = os.path.join(d, 'cert.pem'), os.path.join(d, 'key.pem')
        shutil.copy(PKI.path('server.crt'), cert)
        shutil.copy(PKI.path('server.key'), key)
        f = ferry_with_listener(r, {'cert_file': cert, 'key_file': key})
        try:
            self.assertEqual(peer_cn(f), 'server')
            errors, stop, done = [], threading.Event(), [0]

            def worker():
                c = tls_client(f)  # one connection for the whole run
                while not stop.is_set():
                    try:
                        c.incr('tlsr:n')
                        done[0] += 1
                    except Exception as e:  # noqa: BLE001
                        errors.append(repr(e))
                        return
            th = threading.Thread(target=worker)
            th.start()
            wait_until(lambda: done[0] > 50, 10, msg='load running')
            shutil.copy(PKI.path('server2.crt'), cert)
            shutil.copy(PKI.path('server2.key'), key)
            f.signal(signal.SIGHUP)
            wait_until(lambda: 'SIGHUP: TLS certificates and keys reloaded' in f.log(), 30,
                       msg='the reload logged')
            self.assertEqual(peer_cn(f), 'server2')
            with open(key, 'w') as fh:
                fh.write('not a key\n')
            f.signal(signal.SIGHUP)
            wait_until(lambda: 'SIGHUP: TLS files not reloaded, the old ones stay' in f.log(), 30,
                       msg='the refusal logged')
            self.assertEqual(peer_cn(f), 'server2')
            n = done[0]
            wait_until(lambda: done[0] > n + 50, 10, msg='load still running')
            stop.set()
            th.join(10)
            self.assertEqual(errors, [])
            self.assertEqual(int(r.client().get('tlsr:n')), done[0])
            st = tls_stats(f)
            self.assertEqual((st['tls_reloads'], st['tls_reload_failures']), (1, 1))
        finally:
            f.stop()
            r.stop()

    def test_takeover_closes_tls_clients(self):
        r = RedisServer()
        sock = os.path.join(tempfile.mkdtemp(prefix='ferry-tls-tk-', dir=PKI.dir), 'tk.sock')
        f = ferry_with_listener(r, extra={'takeover': {'socket': sock}})
        new = None
        try:
            plain = f.raw()
            resp_send(plain, ['SET', 'tlst:k', 'before'])
            self.assertEqual(resp_read_reply(plain), 'OK')
            raw = socket.create_connection(('127.0.0.1', tls_port_of(f)), timeout=10)
            t = tls_context(cert=None).wrap_socket(raw, server_hostname='localhost')
            t.sendall(b'PING\r\n')
            self.assertEqual(t.recv(64), b'+PONG\r\n')
            new = harness._spawn([harness.FERRY_BIN, '-c', f.config_path, '--takeover', sock],
                                 os.path.join(f.dir, 'new.out'))
            old_rc = f.proc.wait(20)
            self.assertEqual(old_rc, 0)
            self.assertEqual(t.recv(64), b'')  # closed by the old process
            t.close()
            self.assertIn('a TLS client cannot be handed over', f.log())
            resp_send(plain, ['GET', 'tlst:k'])  # the plain one was handed over
            self.assertEqual(resp_read_reply(plain), b'before')
            plain.close()
            c = tls_client(f)  # the TLS listener is the new process' now
            self.assertEqual(c.get('tlst:k'), 'before')
        finally:
            if new is not None:
                harness._terminate(new)
            f.stop()
            r.stop()


class ConfigChecks(unittest.TestCase):
    def write(self, text):
        d = PKI.dir
        path = os.path.join(d, 'check-%d.yml' % free_port())
        with open(path, 'w') as f:
            f.write(text)
        return path

    def test_ferry_t_loads_the_files(self):
        ok = self.write('redis: {address: "127.0.0.1:6379", tls: {ca_cert_file: %s}}\n'
                        'listen_tls: 127.0.0.1:7443\n'
                        'tls: {cert_file: %s, key_file: %s, ca_cert_file: %s}\n'
                        % (PKI.path('ca.crt'), PKI.path('server.crt'), PKI.path('server.key'),
                           PKI.path('ca.crt')))
        rc, out = Ferry.check_config(ok)
        self.assertEqual(rc, 0, out)
        missing = self.write('redis: {address: "127.0.0.1:6379", tls: {ca_cert_file: /nonexistent/ca.crt}}\n')
        rc, out = Ferry.check_config(missing)
        self.assertNotEqual(rc, 0)
        self.assertIn('redis.tls: cannot load CA certificates /nonexistent/ca.crt', out)
        mismatch = self.write('redis: {address: "127.0.0.1:6379"}\nlisten_tls: 127.0.0.1:7443\n'
                              'tls: {cert_file: %s, key_file: %s, auth_clients: no}\n'
                              % (PKI.path('server.crt'), PKI.path('client.key')))
        rc, out = Ferry.check_config(mismatch)
        self.assertNotEqual(rc, 0)
        self.assertIn('cannot load key %s' % PKI.path('client.key'), out)
        nokey = self.write('redis: {address: "127.0.0.1:6379"}\nlisten_tls: 127.0.0.1:7443\n')
        rc, out = Ferry.check_config(nokey)
        self.assertNotEqual(rc, 0)
        self.assertIn('listen_tls needs tls.cert_file and tls.key_file', out)
        noca = self.write('redis: {address: "127.0.0.1:6379"}\nlisten_tls: 127.0.0.1:7443\n'
                          'tls: {cert_file: %s, key_file: %s}\n'
                          % (PKI.path('server.crt'), PKI.path('server.key')))
        rc, out = Ferry.check_config(noca)
        self.assertNotEqual(rc, 0)
        self.assertIn('tls.auth_clients yes needs tls.ca_cert_file', out)
        badproto = self.write('redis: {address: "127.0.0.1:6379"}\n'
                              'tls: {protocols: "TLSv1.1"}\n')
        rc, out = Ferry.check_config(badproto)
        self.assertNotEqual(rc, 0)
        self.assertIn('TLSv1.2 and/or TLSv1.3', out)
        badverify = self.write('redis: {address: "127.0.0.1:6379", tls: {verify: maybe}}\n')
        rc, out = Ferry.check_config(badverify)
        self.assertNotEqual(rc, 0)
        self.assertIn('full, ca or none', out)


if __name__ == '__main__':
    unittest.main()
