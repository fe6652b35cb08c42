"""scripts/rolling-restart against real processes: 1 master + 2 replicas + 3
sentinels (SentinelTopology) and ferry in Sentinel mode in front of them.

The script's restart hook calls back into this process (NodeRestarter): a
small helper script, written by the test, names the node on a unix socket,
and the test starts that harness RedisServer again exactly as it was started
(same redis-server argv, directory and config file, as Redis and Sentinel
rewrote it), so the harness keeps tracking the new process.

  RollingUnderLoadTest   all 3 nodes restarted under 4 producers and 4
                         consumers (failover_load.Load): no client error, no
                         acknowledged push lost, duplicates only from retried
                         unknown-outcome writes, and no queue command on a
                         restarted node while it claimed to be master (a
                         stale master); prints the script's step times, the
                         total and the longest write gap
  RollingChecksTest      --dry-run changes nothing; refusal to start on an
                         unhealthy topology; a SHUTDOWN refused by a replica
                         writing its initial AOF is retried; a node that does
                         not come back within --step-timeout stops the run

Run:  python3 -m unittest test_rolling_restart -v
Ferry-only (skipped with FERRY_TEST_DIRECT=1).
"""
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest

import harness
from failover_load import FAILOVER_CONF, AccountingChecks, Load, current_master, now
from harness import REPO, Ferry, SentinelTopology, wait_until

SCRIPT = os.path.join(REPO, 'scripts', 'rolling-restart')
SCRIPT_TIMEOUT = 150      # s, the whole script run under load
STEP_TIMEOUT = 30         # s, --step-timeout of the full run
PRE_LOAD = 2.0            # s of load before the script starts
POST_LOAD = 2.0           # s of load after it finished
QUEUE_COMMANDS = ('lpush', 'rpush', 'brpop', 'rpop', 'lpop', 'blpop')

# As test_failover: replicas_ack 1 so that an acknowledged write survives the
# failover whatever Redis' asynchronous replication does.
FERRY_CONF = FAILOVER_CONF

HOOK_SCRIPT = '''import socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.settimeout(%(timeout)d)
s.connect(%(path)r)
s.sendall(('%%s %%s\\n' %% (sys.argv[1], sys.argv[2])).encode())
reply = s.makefile().readline().strip()
print(reply)
sys.exit(0 if reply == 'OK' else 1)
'''


class NodeRestarter:
    """The test's end of the restart hook: .command is the --restart-cmd;
    each call starts the named node again (RedisServer.start with the config
    file as it is now) and answers OK once it answers PING."""

    def __init__(self, topo):
        self.topo = topo
        self.dir = tempfile.mkdtemp(prefix='ferry-rolling-')
        self.sock_path = os.path.join(self.dir, 'hook.sock')
        hook = os.path.join(self.dir, 'restart-node.py')
        with open(hook, 'w') as f:
            f.write(HOOK_SCRIPT % {'timeout': 60, 'path': self.sock_path})
        self.command = '%s %s {host} {port}' % (sys.executable, hook)
        self.restarts = []        # (port, monotonic time the node answered)
        self.errors = []
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.srv.bind(self.sock_path)
        self.srv.listen(4)
        self.srv.settimeout(0.2)
        self.thread = threading.Thread(target=self._serve, name='restarter', daemon=True)
        self.thread.start()

    def _serve(self):
        while not self.stopping.is_set():
            try:
                c, _ = self.srv.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            with c:
                c.settimeout(10)
                try:
                    host, port = c.makefile().readline().split()
                    reply = self._restart(int(port))
                except Exception as e:  # noqa: BLE001 - answered to the hook
                    reply = 'ERR %r' % (e,)
                    with self.lock:
                        self.errors.append(reply)
                try:
                    c.sendall((reply + '\n').encode())
                except OSError:
                    pass

    def _restart(self, port):
        node = self.topo.redis_by_port(port)
        if node is None:
            return 'ERR no node on port %d' % port
        # the script saw the port closed; the process may still be exiting
        node.proc.wait(timeout=15)
        node.start(write_conf=False)
        with self.lock:
            self.restarts.append((port, now()))
        return 'OK'

    def close(self):
        self.stopping.set()
        self.srv.close()
        self.thread.join(5)
        shutil.rmtree(self.dir, ignore_errors=True)


class StaleMasterWatch:
    """Polls every node (one INFO call: server, replication, commandstats).
    A process that was not running when the watch started and claims to be
    master before it was ever seen as a replica is a stale master: no queue
    command may reach it. (Once a replica, it also counts the commands of
    its master's stream, so it is no longer checked.)"""

    def __init__(self, topo, interval=0.1):
        self.topo = topo
        self.interval = interval
        self.initial = {}          # port -> run_id at the start
        self.claimed = {}          # run_id -> port: restarted, seen as master first
        self.checked_off = set()   # run_ids seen as replica
        self.commands = {}         # run_id -> {command: calls} while a stale master
        self.samples = 0
        for r in topo.redis:
            self.initial[r.port] = r.client(socket_timeout=10).info('server')['run_id']
        self.stop_ev = threading.Event()
        self.thread = threading.Thread(target=self._run, name='stale-watch', daemon=True)
        self.thread.start()

    def _sample(self, node):
        info = node.client(socket_timeout=1, socket_connect_timeout=1).execute_command(
            'INFO', 'server', 'replication', 'commandstats')
        rid = info.get('run_id')
        if rid in self.initial.values() or rid in self.checked_off:
            return
        if info.get('role') != 'master':
            self.checked_off.add(rid)
            return
        self.claimed[rid] = node.port
        for cmd in QUEUE_COMMANDS:
            st = info.get('cmdstat_' + cmd)
            if st and st.get('calls', 0):
                seen = self.commands.setdefault(rid, {})
                seen[cmd] = max(seen.get(cmd, 0), st['calls'])

    def _run(self):
        while not self.stop_ev.is_set():
            for node in list(self.topo.redis):
                try:
                    self._sample(node)
                except Exception:  # noqa: BLE001 - down or restarting
                    pass
            self.samples += 1
            self.stop_ev.wait(self.interval)

    def stop(self):
        self.stop_ev.set()
        self.thread.join(5)


def run_script(*args, timeout=SCRIPT_TIMEOUT):
    """Run scripts/rolling-restart; returns (exit code, output, seconds)."""
    t0 = now()
    p = subprocess.run([sys.executable, SCRIPT] + list(args), stdin=subprocess.DEVNULL,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout)
    return p.returncode, p.stdout.decode(errors='replace'), now() - t0


def topology_args(topo, ferry=None):
    args = ['--sentinel', ','.join(topo.sentinel_addresses()), '--master', topo.master_name]
    if ferry is not None:
        args += ['--ferry-stats', '127.0.0.1:%d' % ferry.stats_port]
    return args


def snapshot(topo):
    """{port: (run_id, role, master port or None)} of every node, and the
    sentinels' views."""
    nodes = {}
    for r in topo.redis:
        i = r.client(socket_timeout=10).info()
        nodes[r.port] = (i['run_id'], i['role'], i.get('master_port'))
    return nodes, topo.sentinel_views()


# --------------------------------------------------------------------------


@unittest.skipIf(harness.DIRECT, 'ferry-only: needs ferry in sentinel mode')
class RollingUnderLoadTest(AccountingChecks, unittest.TestCase):

    def test_rolling_restart_under_load(self):
        topo = SentinelTopology()
        self.addCleanup(topo.stop)
        ferry = Ferry(None, conf=FERRY_CONF, sentinel=topo)
        self.addCleanup(ferry.stop)
        restarter = NodeRestarter(topo)
        self.addCleanup(restarter.close)
        old_master = topo.master()
        watch = StaleMasterWatch(topo)
        self.addCleanup(watch.stop)
        load = Load(ferry, 'rolling', reconnect_every=50).start()
        self.addCleanup(load.stop)
        time.sleep(PRE_LOAD)

        t_start = now()
        rc, out, took = run_script(*topology_args(topo, ferry), '--restart-cmd',
                                   restarter.command, '--step-timeout', str(STEP_TIMEOUT))
        t_end = now()
        print('--- rolling-restart output ---\n' + out, flush=True)
        self.assertEqual(rc, 0, 'rolling-restart failed (exit %d):\n%s%s' % (
            rc, out, self.diag(topo, ferry)))
        time.sleep(POST_LOAD)
        res = load.finish(lambda: current_master(topo))
        watch.stop()
        res.t_fault = t_start
        steps = re.findall(r'  (step \d+/\d+: \S+ \S+): ([\d.]+)s \(([^)]*)\)', out)
        total = re.search(r'  total ([\d.]+)s', out)
        print(res.summary('rolling restart'), flush=True)
        print('[rolling restart] script %.2fs (its total %s); steps: %s; longest write gap '
              '%.0f ms at %s; stale-master samples %d, restarted nodes seen as master before '
              'replica: %r' % (took, total.group(1) if total else '?', '; '.join(
                  '%s %ss (%s)' % s for s in steps), res.gap_ms,
                  res.rel(res.gap_at) if res.gap_at else '-', watch.samples, watch.claimed),
              flush=True)

        with self.subTest(check='the script restarted every node once'):
            self.assertEqual(restarter.errors, [])
            self.assertEqual(sorted(p for p, _ in restarter.restarts),
                             sorted(r.port for r in topo.redis), out)
            self.assertEqual(len(steps), 3, out)
            self.assertIsNotNone(total, out)
            ports = [int(re.search(r':(\d+)$', s[0]).group(1)) for s in steps]
            self.assertEqual(ports[-1], old_master.port, 'the master goes last:\n' + out)
            for r in topo.redis:
                rid = r.client(socket_timeout=10).info('server')['run_id']
                self.assertNotEqual(rid, watch.initial[r.port], 'node %d not restarted' % r.port)
        with self.subTest(check='the master moved and the topology is whole'):
            port = topo.wait_stable(timeout=30)
            self.assertNotEqual(port, old_master.port)
        with self.subTest(check='no queue command reached a stale master'):
            self.assertGreater(watch.samples, 10)
            # the watch saw every restarted process (as a replica or a master)
            self.assertEqual(len(watch.checked_off | set(watch.claimed)), 3,
                             'restarted processes observed: %r / %r' % (
                                 watch.checked_off, watch.claimed))
            self.assertEqual(watch.commands, {}, 'queue commands executed on a restarted node '
                             'while it claimed to be master: %r%s' % (
                                 watch.commands, self.diag(topo, ferry, res)))
        self.check_accounting(res, topo, ferry)
        with self.subTest(check='service throughout'):
            n = res.load.acks_between(t_start, t_end)
            self.assertGreater(n, 100, 'only %d pushes acknowledged during the rolling '
                               'restart' % n)


@unittest.skipIf(harness.DIRECT, 'ferry-only: needs ferry in sentinel mode')
class RollingChecksTest(unittest.TestCase):
    """One topology for every check; each test leaves it whole."""

    @classmethod
    def setUpClass(cls):
        cls.topo = SentinelTopology()
        try:
            cls.ferry = Ferry(None, conf=FERRY_CONF, sentinel=cls.topo)
        except BaseException:
            cls.topo.stop()
            raise
        cls.restarter = NodeRestarter(cls.topo)

    @classmethod
    def tearDownClass(cls):
        cls.restarter.close()
        cls.ferry.stop()
        cls.topo.stop()

    def args(self, *extra):
        return topology_args(self.topo, self.ferry) + list(extra)

    def bring_back(self, node):
        """Start node again if it is down; wait for a whole topology."""
        if not node.running():
            node.proc.wait(timeout=15)
            node.start(write_conf=False)
        self.topo.wait_stable(timeout=30)
        self.topo.wait_sentinels_ready(2)

    def test_dry_run_changes_nothing(self):
        marker = os.path.join(self.restarter.dir, 'hook-ran')
        before = snapshot(self.topo)
        rc, out, _ = run_script(*self.args('--dry-run', '--restart-cmd', 'touch %s' % marker))
        print(out, flush=True)
        self.assertEqual(rc, 0, out)
        self.assertIn('dry run: nothing was changed', out)
        plan = re.findall(r'^\S+ rolling-restart:   (\d)\. (replica|master) 127\.0\.0\.1:(\d+)',
                          out, re.M)
        master = self.topo.master_port()
        self.assertEqual([p[1] for p in plan], ['replica', 'replica', 'master'], out)
        self.assertEqual(int(plan[-1][2]), master, out)
        rc, out, _ = run_script(*self.args('--dry-run', '--only', '127.0.0.1:%d' % master,
                                           '--restart-cmd', 'touch %s' % marker))
        self.assertEqual(rc, 0, out)
        plan = re.findall(r'^\S+ rolling-restart:   \d\. (\w+) ', out, re.M)
        self.assertEqual(plan, ['master'], out)
        after = snapshot(self.topo)
        self.assertEqual(after, before, 'the dry run changed the topology')
        self.assertFalse(os.path.exists(marker), 'the dry run ran the restart hook')

    def test_refuses_unhealthy_topology(self):
        replica = [r for r in self.topo.redis if r.port != self.topo.master_port()][0]
        self.addCleanup(self.bring_back, replica)
        replica.stop()
        before = {r.port: r.client(socket_timeout=10).info('server')['run_id']
                  for r in self.topo.redis if r.running()}
        rc, out, took = run_script(*self.args('--restart-cmd', self.restarter.command))
        print(out, flush=True)
        self.assertEqual(rc, 1, out)
        self.assertRegex(out, r'FAILED: refusing to start: the topology is not healthy')
        self.assertRegex(out, r'replica 127\.0\.0\.1:%d: (not reachable|the sentinels see it)'
                         % replica.port)
        self.assertNotIn('SHUTDOWN', out.split('refusing to start')[0])
        after = {r.port: r.client(socket_timeout=2).info('server')['run_id']
                 for r in self.topo.redis if r.running()}
        self.assertEqual(after, before, 'a refused run touched a node')
        self.assertFalse(replica.running())
        self.assertLess(took, 20)

    def test_shutdown_refused_is_retried(self):
        # A replica writing its initial AOF refuses SHUTDOWN ("Errors trying
        # to SHUTDOWN"): turn AOF off and on again with a slow rewrite (a
        # per-key delay) so that it is in that state when the script comes.
        master = self.topo.master()
        replica = [r for r in self.topo.redis if r is not master][0]
        self.addCleanup(self.bring_back, replica)
        mc = master.client(socket_timeout=5)
        mc.delete('slow')
        for n in range(30):
            mc.set('slow:%d' % n, 'x')
        rc_ = replica.client(socket_timeout=5)
        wait_until(lambda: rc_.dbsize() >= 30, timeout=10, msg='keys on the replica')
        rc_.config_set('rdb-key-save-delay', 100000)    # 0.1 s per key: a 3 s rewrite
        rc_.config_set('appendonly', 'no')
        rc_.config_set('appendonly', 'yes')
        rc, out, _ = run_script(*self.args('--only', '127.0.0.1:%d' % replica.port,
                                           '--restart-cmd', self.restarter.command,
                                           '--step-timeout', '30'))
        print(out, flush=True)
        self.assertEqual(rc, 0, out)
        self.assertRegex(out, r'127\.0\.0\.1:%d refused SHUTDOWN \(.*SHUTDOWN.*\); retrying'
                         % replica.port)
        self.assertIn('step 1/1: replica 127.0.0.1:%d done' % replica.port, out)
        for n in range(30):
            mc.delete('slow:%d' % n)

    def test_step_timeout_node_not_back(self):
        master_port = self.topo.master_port()
        before = {r.port: r.client(socket_timeout=2).info('server')['run_id']
                  for r in self.topo.redis}
        replicas = sorted(r.port for r in self.topo.redis if r.port != master_port)
        first = self.topo.redis_by_port(replicas[0])
        self.addCleanup(self.bring_back, first)
        rc, out, took = run_script(*self.args('--restart-cmd', 'true', '--step-timeout', '5'))
        print(out, flush=True)
        self.assertEqual(rc, 1, out)
        self.assertIn('FAILED: 127.0.0.1:%d did not come back within 5s of the restart hook'
                      % first.port, out)
        self.assertRegex(out, r'127\.0\.0\.1:%d is DOWN' % first.port)
        self.assertLess(took, 25)
        wait_until(lambda: not first.running(), timeout=5, msg='the replica exited')
        for r in self.topo.redis:
            if r is not first:
                self.assertEqual(r.client(socket_timeout=2).info('server')['run_id'],
                                 before[r.port], 'node %d was touched after the failure'
                                 % r.port)
        self.assertEqual(self.topo.master_port(), master_port)


if __name__ == '__main__':
    unittest.main()
