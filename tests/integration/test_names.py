"""Host names are resolved off the event loop, again at every (re)connect:

- a fixed master given by a name follows the name: once it resolves to
  another Redis and the old one is gone, ferry reconnects to the new one
  and the held write lands there;
- a fixed master whose name does not resolve at start: ferry starts,
  logs it, and serves once the name resolves;
- a sentinel listed by a name that does not resolve at start is kept
  (ferry starts and logs it) and looked up again until it resolves, then
  used: here it is the only sentinel configured, so ferry finds its master
  through it or not at all.

ferry runs in a private mount namespace (unshare -m) whose /etc/hosts and
/etc/nsswitch.conf (hosts from files only) are bind mounts of files the
test rewrites in place, so ferry's own getaddrinfo sees a name move. Needs
root and unshare(1); skipped otherwise.
"""

import os
import shutil
import subprocess
import tempfile
import unittest

from harness import (Ferry, RedisServer, RespError, SentinelTopology, free_port,
                     resp_read_reply, resp_send, wait_until)

MASTER_NAME = 'ferry-master.test'
SENTINEL_NAME = 'ferry-sentinel.test'

# Run by /bin/sh inside the new mount namespace: bind the two files over
# the system's, then become ferry (same pid).
_MOUNT_AND_EXEC = ('h=$1; n=$2; shift 2; mount --bind "$h" /etc/hosts && '
                   'mount --bind "$n" /etc/nsswitch.conf && exec "$@"')


class HostsFile:
    """An /etc/hosts (and an nsswitch.conf) for ferry's mount namespace."""

    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix='ferry-hosts-')
        self.hosts = os.path.join(self.dir, 'hosts')
        self.nss = os.path.join(self.dir, 'nsswitch.conf')
        with open(self.nss, 'w') as f:
            f.write('hosts: files\n')
        self.set({})

    def set(self, names):
        """names: {name: ip}. Written in place: the bind mount shows the
        same file."""
        with open(self.hosts, 'w') as f:
            f.write('127.0.0.1 localhost\n')
            for name, ip in names.items():
                f.write('%s %s\n' % (ip, name))

    def wrap(self):
        return ['unshare', '-m', '--propagation', 'private', '--', '/bin/sh', '-c',
                _MOUNT_AND_EXEC, 'sh', self.hosts, self.nss]

    def remove(self):
        shutil.rmtree(self.dir, ignore_errors=True)


def namespaces_unavailable():
    """None, or why a private mount namespace with a bind mount cannot be had."""
    if os.geteuid() != 0:
        return 'needs root (mount --bind in a private mount namespace)'
    if shutil.which('unshare') is None:
        return 'unshare(1) is not installed'
    h = HostsFile()
    try:
        h.set({'probe.test': '127.0.0.3'})
        p = subprocess.run(h.wrap() + ['getent', 'hosts', 'probe.test'], capture_output=True,
                           timeout=10, text=True)
        if p.returncode != 0 or '127.0.0.3' not in p.stdout:
            return 'private mount namespace unavailable: %s' % (p.stderr.strip() or p.returncode)
    finally:
        h.remove()
    return None


SKIP = namespaces_unavailable()


@unittest.skipIf(SKIP, SKIP)
class SentinelByName(unittest.TestCase):
    def test_unresolvable_sentinel_is_kept_and_used_once_it_resolves(self):
        topo = SentinelTopology(nreplicas=0)
        self.addCleanup(topo.stop)
        hosts = HostsFile()
        self.addCleanup(hosts.remove)
        s0 = topo.sentinels[0]
        f = Ferry(None, sentinel={'master': topo.master_name,
                                  'addresses': ['%s:%d' % (SENTINEL_NAME, s0.port)]},
                  conf={'upstream': {'hold_timeout_ms': 300},
                        'durability': {'replicas_ack': 0}},
                  wait='port', wrap=hosts.wrap())
        self.addCleanup(f.stop)
        wait_until(lambda: 'cannot resolve %s' % SENTINEL_NAME in f.log(), timeout=10,
                   msg='a log line for the sentinel that does not resolve')
        # No master without it: a request is held, then refused at the bound.
        s = f.raw()
        self.addCleanup(s.close)
        resp_send(s, ['PING'])
        r = resp_read_reply(s, timeout=10)
        self.assertIsInstance(r, RespError, 'PING answered %r with no sentinel reachable' % (r,))
        self.assertTrue(str(r).startswith('TRYAGAIN'), r)
        self.assertTrue(f.running())
        # Looked up again until it resolves: then ferry finds its master.
        hosts.set({SENTINEL_NAME: '127.0.0.1'})

        def pong():
            resp_send(s, ['PING'])
            return resp_read_reply(s, timeout=10) == 'PONG'
        wait_until(pong, timeout=20, interval=0.2, msg='PONG once the sentinel resolves\n' +
                   f.log()[-3000:])
        self.assertIn('through 1 sentinel(s)', f.log())
        c = f.client()
        c.set('names:x', 'through the sentinel')
        self.assertEqual(topo.master().client().get('names:x'), 'through the sentinel')
        self.assertIn('%s:%d: resolves to 127.0.0.1' % (SENTINEL_NAME, s0.port), f.log())


@unittest.skipIf(SKIP, SKIP)
class FixedMasterByName(unittest.TestCase):
    def test_fixed_master_follows_its_name(self):
        port = free_port()
        a = RedisServer(port=port)
        self.addCleanup(a.kill)
        hosts = HostsFile()
        self.addCleanup(hosts.remove)
        hosts.set({MASTER_NAME: '127.0.0.1'})
        f = Ferry(None, conf={'redis': {'address': '%s:%d' % (MASTER_NAME, port)},
                              'upstream': {'connect_timeout_ms': 500, 'hold_timeout_ms': 20000}},
                  wrap=hosts.wrap())
        self.addCleanup(f.stop)
        c = f.client(socket_timeout=30)
        c.set('names:k', 'on a')
        self.assertEqual(a.client().get('names:k'), 'on a')
        # The name moves to another Redis (same port, another loopback
        # address), then the old one dies: the write is held until ferry
        # reconnects, to wherever the name points now.
        b = RedisServer(port=port, host='127.0.0.2')
        self.addCleanup(b.kill)
        hosts.set({MASTER_NAME: '127.0.0.2'})
        a.kill()
        c.set('names:k', 'on b')
        self.assertEqual(b.client().get('names:k'), 'on b')
        self.assertIn('%s:%d resolves to 127.0.0.1' % (MASTER_NAME, port), f.log())
        self.assertIn('now resolves to 127.0.0.2 (was 127.0.0.1)', f.log())

    def test_fixed_master_name_that_resolves_later(self):
        r = RedisServer()
        self.addCleanup(r.kill)
        hosts = HostsFile()
        self.addCleanup(hosts.remove)
        f = Ferry(None, conf={'redis': {'address': '%s:%d' % (MASTER_NAME, r.port)},
                              'upstream': {'hold_timeout_ms': 300}},
                  wait='port', wrap=hosts.wrap())
        self.addCleanup(f.stop)
        wait_until(lambda: 'cannot resolve %s' % MASTER_NAME in f.log(), timeout=10,
                   msg='a log line for the master name that does not resolve')
        s = f.raw()
        self.addCleanup(s.close)
        resp_send(s, ['PING'])
        reply = resp_read_reply(s, timeout=10)
        self.assertTrue(str(reply).startswith('TRYAGAIN'), reply)
        hosts.set({MASTER_NAME: '127.0.0.1'})

        def pong():
            resp_send(s, ['PING'])
            return resp_read_reply(s, timeout=10) == 'PONG'
        wait_until(pong, timeout=20, interval=0.2, msg='PONG once the name resolves\n' +
                   f.log()[-3000:])


def load_tests(loader, tests, pattern):
    suite = unittest.TestSuite()
    for cls in (SentinelByName, FixedMasterByName):  # Sentinel mode first
        suite.addTests(loader.loadTestsFromTestCase(cls))
    return suite


if __name__ == '__main__':
    unittest.main()
