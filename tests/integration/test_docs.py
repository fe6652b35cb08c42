"""Every command in README.md and docs/*.md is run by a test.

The convention for the Markdown files:
  - every fenced block names its language;
  - ```sh, ```bash and ```shell blocks hold commands: each line is one
    (a line ending in a backslash goes on with the next), `#` lines are
    comments;
  - ```console blocks hold `$ command` lines, each followed by its output;
  - any other block (yaml, json, text, ...) holds no command.
  - Examples use the ports of `scripts/up`: master 6379, replicas 6381 and
    6382, sentinels 26379 to 26381 (master name mq), ferry 6380, stats 22222.

Each command is either
  - mapped, in MAPPED below, to the test (module.Class.test_name) or the
    test script (a path, which must mention the command's program) that
    runs it; or
  - run here, in document order: DocsCommandsTest starts `scripts/up` (the
    README's own command) in a scratch copy of the repository's layout
    (symlinks; its run/ is the scratch one) on free ports, then runs every
    command of docs/*.md that is not mapped, then the README's, with
    `bash -c` in that copy, each port of scripts/up replaced by the one
    chosen for this run (the number as a whole word), `ferry` on PATH being
    FERRY_BIN. A console block's output must match (after the same port
    replacement); a few commands are followed by a wait for what they start
    (WAIT_AFTER) and a few outputs must contain a text (EXPECT, polled).

DocsMapTest fails when a doc has a command that is neither mapped nor run
here (a command run here is listed in RUN_HERE), when a mapped test does
not exist, and when a mapping names a command no doc has any more. It also
checks every relative link between the documents.
"""
import glob
import importlib
import json
import os
import re
import shutil
import socket
import subprocess
import tempfile
import time
import unittest
import urllib.request

import harness

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), '..', '..'))
COMMAND_LANGS = ('sh', 'bash', 'shell')
CONSOLE_LANGS = ('console',)

# scripts/up's default ports, as the documents write them, and its env names.
UP_PORTS = {'REDIS_PORT': [6379], 'REPLICA_PORTS': [6381, 6382],
            'SENTINEL_PORTS': [26379, 26380, 26381], 'FERRY_PORT': [6380],
            'STATS_PORT': [22222]}

# Commands run by another test: the command (comment stripped, spaces
# squeezed) -> 'module.Class.test' or a repository path that runs it.
MAPPED = {
    # README: the CI entry point runs scripts/test.
    'scripts/test': '.ci/run',
    # docs/compatibility.md: the redis suite (its sources are not shipped:
    # scripts/test runs the suite when REDIS_SUITE_DIR names a checkout).
    'git clone --depth 1 --branch 7.0.15 https://github.com/redis/redis.git /tmp/redis-7.0.15':
        'tests/redis-suite/run',
    'tests/redis-suite/run --both /tmp/redis-7.0.15': 'scripts/test',
    # README: scripts/chaos, short seeds of both modes in CI.
    'scripts/chaos --minutes 30 --ferries 2 --calm --seed 1':
        'test_chaos.ChaosSeedsTest.test_sentinel_two_ferries',
    'scripts/chaos --mode cluster --minutes 30 --calm --seed 2':
        'test_chaos.ChaosSeedsTest.test_cluster',
    # docs/fuzzing.md: scripts/test's fuzz stage runs scripts/fuzz.
    'scripts/fuzz': 'scripts/test',
    'scripts/fuzz session --seconds 600': 'scripts/test',
    'nice -n 10 scripts/fuzz request --runs 10000000 --fresh': 'scripts/test',
    # docs/operations.md, the package: tests/package/run builds, installs,
    # checks and purges it (systemd is not running there: the unit's
    # commands are run by test_takeover.TakeoverSystemdReloadTest).
    'cmake -S . -B build && cmake --build build -j': 'tests/package/run',
    '(cd build && cpack -G DEB)': 'tests/package/run',
    'dpkg -i build/ferry_*_amd64.deb': 'tests/package/run',
    'systemctl enable --now ferry': 'tests/package/run',
    # The same by hand: the install steps tests/package/run checks the
    # package for (files, modes, user); the unit's lines: test_takeover.
    'install -m 0755 build/ferry /usr/local/bin/ferry': 'tests/package/run',
    'useradd --system --no-create-home --shell /usr/sbin/nologin ferry': 'tests/package/run',
    'install -d -m 0755 /etc/ferry': 'tests/package/run',
    'install -m 0640 -g ferry config/ferry.yml /etc/ferry/ferry.yml': 'tests/package/run',
    'install -m 0644 scripts/ferry.service /etc/systemd/system/ferry.service':
        'tests/package/run',
    'systemctl daemon-reload': 'tests/package/run',
    # The stats port: a silent plain connection (nc is not installed by
    # scripts/setup; the bash form below is run here).
    'nc 127.0.0.1 22222 </dev/null | python3 -m json.tool':
        'test_stats.StatsTest.test_plain_connection_gets_json',
    # Rolling restarts of Redis (35 s on scripts/up: too long for this test;
    # the dry runs and the ferry restart of the same block are run here).
    'scripts/rolling-restart --local': 'test_rolling_restart.RollingUnderLoadTest.test_rolling_restart_under_load',
    'export REDIS_PASSWORD=...':
        'test_rolling_restart.RollingUnderLoadTest.test_rolling_restart_under_load',
    'scripts/rolling-restart --sentinel 10.0.0.1:26379,10.0.0.2:26379,10.0.0.3:26379 --master mq '
    '--ferry-stats 10.0.1.1:22222,10.0.1.2:22222 --restart-cmd '
    "'ssh {host} sudo systemctl start redis-server@{port}' --step-timeout 600":
        'test_rolling_restart.RollingUnderLoadTest.test_rolling_restart_under_load',
    'ssh 10.0.1.1 sudo systemctl reload ferry':
        'test_takeover.TakeoverSystemdReloadTest.test_reload_is_a_takeover',
    'ssh 10.0.1.2 sudo systemctl reload ferry':
        'test_takeover.TakeoverSystemdReloadTest.test_reload_is_a_takeover',
    'scripts/rolling-restart --ferry --ferry-instance /etc/ferry/ferry.yml:/run/ferry/ferry.pid '
    '--ferry-bin /usr/local/bin/ferry':
        'test_takeover.TakeoverScriptTest.test_takeover_by_script_under_load',
    # Rolling restarts of a Redis Cluster (cluster nodes, not the topology
    # scripts/up starts here by default).
    'scripts/rolling-restart --cluster --local --dry-run':
        'test_cluster_reshard.ClusterRollingRestartTest.test_1_dry_run_changes_nothing',
    'scripts/rolling-restart --cluster 10.0.0.1:7000,10.0.0.2:7000 '
    '--ferry-stats 10.0.1.1:22222,10.0.1.2:22222 --restart-cmd '
    "'ssh {host} sudo systemctl start redis-server@{port}'":
        'test_cluster_reshard.ClusterRollingRestartTest.test_2_rolling_restart_under_load',
    # Restarting ferry: a takeover by hand and under systemd.
    'ferry -c /etc/ferry/ferry.yml --takeover /run/ferry/takeover.sock':
        'test_takeover.TakeoverUnderLoadTest.test_takeover_under_load',
    'systemctl reload ferry': 'test_takeover.TakeoverSystemdReloadTest.test_reload_is_a_takeover',
    "/bin/sh -c 'old=$MAINPID; /usr/local/bin/ferry -c /etc/ferry/ferry.yml --takeover "
    "/run/ferry/takeover.sock </dev/null & new=$$!; while kill -0 \"$$old\" 2>/dev/null; do "
    "kill -0 \"$$new\" 2>/dev/null || exit 1; sleep 0.1; done; kill -0 \"$$new\"'":
        'test_takeover.TakeoverSystemdReloadTest.test_reload_is_a_takeover',
    'sudo -u ferry /usr/local/bin/ferry -t -c /etc/ferry/ferry.yml':
        'test_takeover.TakeoverSystemdReloadTest.test_reload_is_a_takeover',
    "sudo -u ferry sh -c 'old=PID; /usr/local/bin/ferry -c /etc/ferry/ferry.yml --takeover "
    "/run/ferry/takeover.sock </dev/null & new=$!; while kill -0 \"$old\" 2>/dev/null; do "
    "kill -0 \"$new\" 2>/dev/null || exit 1; sleep 0.1; done; kill -0 \"$new\"'":
        'test_takeover.TakeoverSystemdReloadTest.test_reload_is_a_takeover',
    'echo $?': 'test_takeover.TakeoverSystemdReloadTest.test_reload_is_a_takeover',
    # docs/cluster.md: a cluster topology instead of the Sentinel one.
    'scripts/up --cluster': 'test_cluster_ops.ClusterUpScriptTest.test_up_cluster_then_down',
    "curl -s 127.0.0.1:22222/metrics | grep '^ferry_cluster_shard_up'":
        'test_cluster_ops.ClusterUpScriptTest.test_up_cluster_then_down',
}

# After these commands (regex on the command as written), wait for what
# they started before the next one: name -> (regex, what to wait for).
WAIT_AFTER = [
    (r'sentinel failover mq$', 'failover'),
    (r'SENTINEL RESET mq$', 'sentinel_reset'),
    (r'shutdown nosave', 'redis_down'),
    (r'redis-server run/redis-\$p/redis.conf', 'redis_up'),
    (r'rolling-restart --ferry --local$', 'ferry_up'),
]

# (file, command, nth occurrence in that file from 1) -> text its output
# must contain; the command is run again until it does (bounded).
EXPECT = {
    ('README.md', 'redis-cli -p 6380 brpop jobs 0', 1): 'hello',
    ('README.md', 'redis-cli -p 6380 ping', 1): 'PONG',
    ('README.md', 'curl -s 127.0.0.1:22222/healthz', 1): 'OK: master',
    ('README.md', 'curl -s 127.0.0.1:22222/metrics | grep ferry_failovers_total', 1):
        'ferry_failovers_total',
    ('README.md', 'redis-cli -p 6380 lrange jobs 0 -1', 1): 'after-failover',
    ('README.md', 'curl -s 127.0.0.1:22222/healthz', 2): 'row(s) pending',
    ('README.md', 'ferry --fallback-dump -c run/ferry.yml', 1): 'during-outage',
    ('README.md', 'redis-cli -p 6380 lrange jobs 0 -1', 2): 'during-outage',
    ('docs/operations.md', 'exec 3<>/dev/tcp/127.0.0.1/22222 && cat <&3', 1): '"service"',
    ('docs/operations.md', 'curl -si http://127.0.0.1:22222/healthz', 1): '200',
    ('docs/operations.md', "curl -s http://127.0.0.1:22222/ | sed -n "
     "'/<pre id=\"summary\">/,/<\\/pre>/p'", 1): '<pre id="summary">',
    ('docs/operations.md', 'redis-cli -p 26379 SENTINEL REPLICAS mq', 1): 'slave',
    ('docs/operations.md', 'scripts/rolling-restart --local --dry-run', 1): 'dry run',
    ('docs/operations.md', 'scripts/rolling-restart --ferry --local --dry-run', 1): 'dry run',
}
EXPECT_TIMEOUT = 30.0
COMMAND_TIMEOUT = 60


def normalize(cmd):
    """A command as MAPPED spells it: trailing comment off, spaces squeezed."""
    out, quote, i = [], None, 0
    while i < len(cmd):
        ch = cmd[i]
        if quote:
            if ch == quote:
                quote = None
        elif ch in '\'"':
            quote = ch
        elif ch == '#' and (i == 0 or cmd[i - 1] in ' \t'):
            break
        out.append(ch)
        i += 1
    return ' '.join(''.join(out).split())


def doc_files():
    return ['README.md'] + sorted(os.path.relpath(p, REPO)
                                  for p in glob.glob(os.path.join(REPO, 'docs', '*.md')))


def blocks(path):
    """(language, first line number, lines) of each fenced block."""
    with open(os.path.join(REPO, path)) as f:
        lines = f.read().split('\n')
    out, i = [], 0
    while i < len(lines):
        m = re.match(r'^(`{3,})(.*)$', lines[i])
        if m:
            fence, lang = m.group(1), m.group(2).strip()
            j = i + 1
            while j < len(lines) and not lines[j].startswith(fence):
                j += 1
            out.append((lang, i + 1, lines[i + 1:j]))
            i = j
        i += 1
    return out


def commands(path):
    """Each command of a document: dict(file, line, cmd, key, output)."""
    out = []
    for lang, first, body in blocks(path):
        if lang in COMMAND_LANGS:
            cur, start = '', None
            for n, line in enumerate(body):
                if not cur and (not line.strip() or line.lstrip().startswith('#')):
                    continue
                if not cur:
                    start = first + 1 + n
                text = line.rstrip()
                if text.endswith('\\'):
                    cur += text[:-1] + ' '
                    continue
                cur += text
                out.append({'file': path, 'line': start, 'cmd': cur.strip(), 'output': None})
                cur = ''
        elif lang in CONSOLE_LANGS:
            for n, line in enumerate(body):
                if line.startswith('$ '):
                    out.append({'file': path, 'line': first + 1 + n, 'cmd': line[2:].strip(),
                                'output': []})
                elif out and out[-1]['output'] is not None and out[-1]['file'] == path:
                    out[-1]['output'].append(line)
    seen = {}
    for c in out:
        c['key'] = normalize(c['cmd'])
        seen[c['key']] = seen.get(c['key'], 0) + 1
        c['nth'] = seen[c['key']]
    return out


def all_commands():
    return [c for p in doc_files() for c in commands(p)]


def run_here(c):
    return c['key'] not in MAPPED


def github_anchor(title):
    a = re.sub(r'[^\w\- ]', '', title.strip().lower())
    return a.replace(' ', '-')


class DocsMapTest(unittest.TestCase):
    """The documents' commands against MAPPED; links between documents."""

    def test_every_block_names_its_language(self):
        for path in doc_files():
            for lang, line, _ in blocks(path):
                with self.subTest(file=path, line=line):
                    self.assertTrue(lang, '%s:%d: a fenced block without a language '
                                    '(sh/console for commands, text/yaml/... otherwise)'
                                    % (path, line))

    def test_console_lines_are_commands(self):
        # A ```sh block must not hold "$ command" lines (that is ```console).
        for path in doc_files():
            for lang, line, body in blocks(path):
                if lang in COMMAND_LANGS:
                    for n, text in enumerate(body):
                        self.assertFalse(text.startswith('$ '), '%s:%d: "$ " in a ```%s block: '
                                         'use ```console' % (path, line + 1 + n, lang))

    def test_mapped_tests_exist(self):
        for cmd, target in sorted(MAPPED.items()):
            with self.subTest(cmd=cmd):
                if '/' in target or target.startswith('.'):
                    path = os.path.join(REPO, target)
                    self.assertTrue(os.path.isfile(path) and os.access(path, os.X_OK),
                                    'no test script %s' % target)
                else:
                    mod, cls, meth = target.split('.')
                    m = importlib.import_module(mod)
                    self.assertTrue(hasattr(getattr(m, cls, None), meth), 'no test %s' % target)

    def test_every_mapping_is_used(self):
        keys = {c['key'] for c in all_commands()}
        for cmd in MAPPED:
            self.assertIn(cmd, keys, 'MAPPED names a command no document has: %r' % cmd)

    def test_every_command_is_run_or_mapped(self):
        # What is not mapped is run by DocsCommandsTest; it must be a command
        # that test can run against scripts/up's topology: no host other
        # than 127.0.0.1, no path of an installed ferry.
        for c in all_commands():
            if not run_here(c):
                continue
            with self.subTest(file=c['file'], line=c['line']):
                self.assertNotRegex(c['cmd'], r'\b10\.\d+\.\d+\.\d+|/etc/ferry|/usr/local|sudo |'
                                    r'systemctl|dpkg|ssh ',
                                    '%s:%d: %r is neither mapped (MAPPED in test_docs.py) nor '
                                    'runnable against scripts/up' % (c['file'], c['line'], c['cmd']))

    def test_links_resolve(self):
        for path in doc_files():
            with open(os.path.join(REPO, path)) as f:
                text = f.read()
            for m in re.finditer(r'\]\(([^)\s]+)\)', text):
                link = m.group(1)
                if re.match(r'^[a-z]+:', link):
                    continue
                target, _, anchor = link.partition('#')
                dest = os.path.normpath(os.path.join(os.path.dirname(path), target)) if target \
                    else path
                with self.subTest(file=path, link=link):
                    self.assertTrue(os.path.exists(os.path.join(REPO, dest)), link)
                    if anchor and dest.endswith('.md'):
                        with open(os.path.join(REPO, dest)) as f:
                            heads = [github_anchor(h) for h in
                                     re.findall(r'(?m)^#{1,6} (.*)$', f.read())]
                        self.assertIn(anchor, heads, link)


@unittest.skipIf(harness.DIRECT, 'runs scripts/up with ferry')
class DocsCommandsTest(unittest.TestCase):
    """Runs every command of the documents that is not mapped (see above)."""

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix='ferry-docs-')
        self.addCleanup(shutil.rmtree, self.tmp, True)
        self.root = os.path.join(self.tmp, 'repo')
        os.mkdir(self.root)
        for name in ('scripts', 'config', 'tests', 'contrib', 'man', 'docs', 'cmake'):
            os.symlink(os.path.join(REPO, name), os.path.join(self.root, name))
        os.mkdir(os.path.join(self.root, 'build'))
        os.symlink(harness.FERRY_BIN, os.path.join(self.root, 'build', 'ferry'))
        bindir = os.path.join(self.tmp, 'bin')
        os.mkdir(bindir)
        os.symlink(harness.FERRY_BIN, os.path.join(bindir, 'ferry'))
        self.ports, self.env = {}, dict(os.environ, PATH=bindir + ':' + os.environ['PATH'],
                                        UP_SKIP_SETUP='1', FERRY_BIN=harness.FERRY_BIN,
                                        UP_TIMEOUT='60')
        for var, defaults in UP_PORTS.items():
            new = [harness.free_port() for _ in defaults]
            self.ports.update(zip(defaults, new))
            self.env[var] = ' '.join(map(str, new))
        self.addCleanup(self.down)

    def down(self):
        subprocess.run([os.path.join(self.root, 'scripts', 'down')], cwd=self.root, env=self.env,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=60)

    def subst(self, text):
        for old, new in self.ports.items():
            text = re.sub(r'(?<![\d.])%d(?!\d)' % old, str(new), text)
        return text

    def sh(self, cmd, timeout=COMMAND_TIMEOUT):
        p = subprocess.run(['bash', '-c', cmd], cwd=self.root, env=self.env,
                           stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, timeout=timeout)
        return p.returncode, p.stdout.decode(errors='replace')

    def cli(self, port, *args):
        rc, out = self.sh('redis-cli -p %d %s' % (port, ' '.join(args)), timeout=10)
        return out.strip()

    def healthz(self):
        try:
            with urllib.request.urlopen('http://127.0.0.1:%d/healthz' % self.ports[22222],
                                        timeout=2) as r:
                return r.read().decode()
        except OSError as e:
            return getattr(e, 'read', lambda: str(e).encode())().decode(errors='replace')

    def wait(self, what):
        redis = [self.ports[p] for p in (6379, 6381, 6382)]
        s0 = self.ports[26379]
        if what == 'failover':
            harness.wait_until(lambda: str(self.master_before[1]) not in
                               self.cli(s0, 'sentinel get-master-addr-by-name mq')
                               and self.healthz().startswith('OK'),
                               timeout=30, msg='the failover, then ferry UP')
        elif what == 'sentinel_reset':
            def healthy_replicas():
                lines = self.cli(s0, 'sentinel replicas mq').split('\n')
                return sum(1 for a, b in zip(lines, lines[1:]) if a == 'flags' and b == 'slave')
            harness.wait_until(lambda: healthy_replicas() == 2, timeout=30,
                               msg='the sentinel lists both replicas again')
        elif what == 'redis_down':
            harness.wait_until(lambda: all('PONG' not in self.cli(p, 'ping') for p in redis),
                               timeout=20, msg='every Redis stopped')
        elif what == 'redis_up':
            harness.wait_until(lambda: all('PONG' in self.cli(p, 'ping') for p in redis),
                               timeout=20, msg='every Redis answering')
        elif what == 'ferry_up':
            harness.wait_until(lambda: 'PONG' in self.cli(self.ports[6380], 'ping'),
                               timeout=20, msg='ferry answering after its takeover')

    def run_one(self, c):
        cmd = self.subst(c['cmd'])
        if re.search(r'sentinel failover mq$', c['cmd']):
            self.master_before = self.cli(self.ports[26379],
                                          'sentinel get-master-addr-by-name mq').split()
        want = EXPECT.get((c['file'], c['key'], c['nth']))
        deadline = time.monotonic() + EXPECT_TIMEOUT
        while True:
            rc, out = self.sh(cmd)
            ok = rc == 0 and (want is None or self.subst(want) in out)
            if ok or c['output'] is not None or want is None or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        where = '%s:%d: %s' % (c['file'], c['line'], cmd)
        if c['output'] is not None:
            got = out.rstrip('\n').split('\n') if out.strip() else []
            self.assertEqual(got, [self.subst(l) for l in c['output']], where)
        else:
            self.assertEqual(rc, 0, '%s\n%s' % (where, out))
            if want is not None:
                self.assertIn(self.subst(want), out, where)
        for pattern, what in WAIT_AFTER:
            if re.search(pattern, c['cmd']):
                self.wait(what)
        print('[docs] %s:%d ok: %s' % (c['file'], c['line'], c['cmd']), flush=True)

    def test_documented_commands(self):
        t0 = time.monotonic()
        readme = [c for c in commands('README.md') if run_here(c)]
        self.assertEqual(readme[0]['key'], 'scripts/up', 'the README starts with scripts/up')
        self.run_one(readme[0])
        for path in doc_files()[1:]:
            for c in commands(path):
                if run_here(c):
                    self.run_one(c)
        for c in readme[1:]:
            self.run_one(c)
        print('[docs] %d commands run in %.1fs' % (
            sum(1 for c in all_commands() if run_here(c)), time.monotonic() - t0), flush=True)


if __name__ == '__main__':
    unittest.main()
