"""A throw-away PKI for the TLS tests, made with the openssl command line
into a temp dir (no network): a CA, a server certificate for 127.0.0.1 and
localhost (two: server, server2), a client certificate, expired ones of
both kinds, and a second CA with its own server and client certificates
(the "wrong CA")."""

import os
import shutil
import subprocess
import tempfile

OPENSSL = shutil.which('openssl') or 'openssl'


def _run(*args, cwd):
    p = subprocess.run([OPENSSL] + list(args), cwd=cwd, capture_output=True, text=True,
                       timeout=60)
    if p.returncode != 0:
        raise RuntimeError('openssl %s failed: %s' % (' '.join(args), p.stderr))


class Pki:
    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix='ferry-pki-')
        for ca in ('ca', 'otherca'):
            self._ca(ca)
        for name, ca in (('server', 'ca'), ('client', 'ca'), ('server2', 'ca'),
                         ('otherserver', 'otherca'), ('otherclient', 'otherca'),
                         ('expiredserver', 'ca'), ('expiredclient', 'ca')):
            self._leaf(name, ca, server=name.endswith('server') or name == 'server2',
                       days='-1' if name.startswith('expired') else '2')

    def path(self, name):
        return os.path.join(self.dir, name)

    def _ca(self, name):
        _run('req', '-x509', '-newkey', 'rsa:2048', '-nodes', '-days', '2',
             '-keyout', name + '.key', '-out', name + '.crt', '-subj', '/CN=ferry test ' + name,
             '-addext', 'basicConstraints=critical,CA:TRUE',
             '-addext', 'keyUsage=critical,keyCertSign,cRLSign', cwd=self.dir)

    def _leaf(self, name, ca, server, days):
        _run('req', '-newkey', 'rsa:2048', '-nodes', '-keyout', name + '.key',
             '-out', name + '.csr', '-subj', '/CN=' + name, cwd=self.dir)
        ext = os.path.join(self.dir, name + '.ext')
        with open(ext, 'w') as f:
            f.write('basicConstraints=CA:FALSE\n')
            if server:
                f.write('subjectAltName=IP:127.0.0.1,DNS:localhost\n'
                        'extendedKeyUsage=serverAuth,clientAuth\n')
            else:
                f.write('extendedKeyUsage=clientAuth\n')
        _run('x509', '-req', '-in', name + '.csr', '-CA', ca + '.crt', '-CAkey', ca + '.key',
             '-CAcreateserial', '-days', days, '-out', name + '.crt', '-extfile', ext,
             cwd=self.dir)

    def cleanup(self):
        shutil.rmtree(self.dir, ignore_errors=True)
