"""python3 parallel.py [--streams N] [--alone MOD,...] MOD...: the test
modules (or module.Class names) on N streams at once, each module in a
process of its own (timed.py), taken from one queue longest first; the
--alone ones after that, one at a time (what measures speed or load, or
spends a whole core). Every test starts its own Redis, sentinels and ferry
on ports of its own, so modules do not share anything but the machine.

Prints each module's output once it is done, then the modules by time;
exit status 0 only when every module passed. Most of a failover suite's
time is waiting for Sentinel (test_failover_paths: 170 s of wall time for
44 s of CPU), which is why two streams fit on two cores."""
import argparse
import os
import queue
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))

# Longest first, so the streams end together (seconds, measured; a module
# not named here counts as 30).
WEIGHT = {
    'test_takeover': 150, 'test_failover_paths': 170, 'test_fallback': 160,
    'test_queue_guards': 120, 'test_tls': 110, 'test_cluster_route': 90,
    'test_sentinel_nonsense': 80, 'test_partition': 80, 'test_failover': 80,
    'test_rolling_restart': 70, 'test_protocol': 50, 'test_bounded': 60,
    'test_docs': 60, 'test_cluster_ops': 60,
}


def weight(mod):
    return WEIGHT.get(mod.split('.')[0], 30)


def run(mod, timeout):
    t0 = time.monotonic()
    try:
        p = subprocess.run([sys.executable, os.path.join(HERE, 'timed.py'), mod], cwd=HERE,
                           stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, timeout=timeout)
        rc, out = p.returncode, p.stdout.decode(errors='replace')
    except subprocess.TimeoutExpired as e:
        rc, out = 124, (e.stdout or b'').decode(errors='replace') + '\n%s: timed out\n' % mod
    return rc, out, time.monotonic() - t0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--streams', type=int, default=2)
    ap.add_argument('--alone', default='')
    ap.add_argument('--timeout', type=int, default=1200, help='seconds per module')
    ap.add_argument('modules', nargs='+')
    a = ap.parse_args()
    alone = [m for m in a.alone.split(',') if m]
    shared = sorted((m for m in a.modules if m not in alone), key=weight, reverse=True)
    alone = [m for m in alone if m in a.modules]
    todo = queue.Queue()
    for m in shared:
        todo.put(m)
    results = {}
    lock = threading.Lock()

    def stream():
        while True:
            try:
                m = todo.get_nowait()
            except queue.Empty:
                return
            rc, out, secs = run(m, a.timeout)
            with lock:
                results[m] = (rc, secs)
                print('\n######## %s: %s in %.0f s ########\n%s' % (
                    m, 'ok' if rc == 0 else 'FAILED (exit %d)' % rc, secs, out), flush=True)

    t0 = time.monotonic()
    threads = [threading.Thread(target=stream) for _ in range(max(1, a.streams))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for m in alone:
        rc, out, secs = run(m, a.timeout)
        results[m] = (rc, secs)
        print('\n######## %s (alone): %s in %.0f s ########\n%s' % (
            m, 'ok' if rc == 0 else 'FAILED (exit %d)' % rc, secs, out), flush=True)
    print('\n==== modules by time (s) ====')
    for m, (rc, secs) in sorted(results.items(), key=lambda kv: -kv[1][1]):
        print('%8.0f  %-40s %s' % (secs, m, 'ok' if rc == 0 else 'FAILED'))
    failed = sorted(m for m, (rc, _) in results.items() if rc != 0)
    print('==== %d module(s) in %.0f s on %d stream(s); failed: %s ====' % (
        len(results), time.monotonic() - t0, a.streams, ', '.join(failed) or 'none'))
    sys.exit(1 if failed else 0)


if __name__ == '__main__':
    main()
