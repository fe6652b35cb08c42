"""TLS on every connection: ferry in front of a TLS-only Redis (`port 0`,
`tls-port`), clients on ferry's TLS listener (redis-cli --tls, redis-py
ssl=True, node-redis and ioredis), client certificates required and
refused, bad input on both kinds of port, and the stats. The certificates
are made per run with the openssl command (tls_certs.py)."""

import json
import os
import re
import shutil
import socket
import ssl
import subprocess
import threading
import time
import unittest

import redis

from harness import Ferry, RedisServer, free_port, resp_read_reply, resp_send, wait_until
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

    def _conf(self):
        text = super()._conf()
        lines = [l for l in text.splitlines() if not l.startswith('port ')]
        lines += ['port 0', 'tls-port %d' % self.port,
                  'tls-cert-file %s' % PKI.path('server.crt'),
                  'tls-key-file %s' % PKI.path('server.key'),
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
        wait_until(lambda: sub.get_message(timeout=0.2) is not None, 5, msg='subscribed')
        wait_until(lambda: c.publish('tls:ch', 'hello') == 1, 5, msg='one subscriber')
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
        master = TlsRedis()
        replica = TlsRedis({'replicaof': '127.0.0.1 %d' % master.port})
        try:
            m = master.client()
            m.execute_command('ACL', 'SETUSER', 'app', 'on', '>secret', '~*', '+@all')
            wait_until(lambda: m.info('replication').get('connected_slaves') == 1, 20,
                       msg='the replica attached over TLS')
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

    def check_refused(self, tls_section, expect):
        r = TlsRedis()
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

    def test_name_mismatch_with_verify_full(self):
        self.check_refused(redis_tls_section(server_name='redis.example.org'),
                           'certificate: hostname mismatch')

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
