"""Cluster rows of scripts/bench (--cluster): redis-benchmark directly against
one node of a Redis Cluster and through ferry in cluster mode.

A cluster of 3 masters and no replica (harness ClusterTopology: appendonly
yes, appendfsync always on every node, what ferry enforces), and a ferry
with `cluster: {nodes: [...]}`. redis-benchmark without -r uses one fixed
key per test (key:__rand_int__ for SET/GET, mylist for LPUSH/RPOP), so each
test's keys live in one slot: "direct" runs against the master serving that
slot (a node answers MOVED for any other), "ferry" against ferry, which
routes the same key to that master. Targets alternate within each round;
medians of requests/s and p50, and ferry's ratio to direct.

As a script: cluster_bench.py [--rounds N] [--tests lpush,rpop,set,get]
[--shapes "1:1 1:50 16:50"] [-n N] prints a markdown table (FERRY_BIN names
the binary)."""

import argparse
import statistics
import subprocess
import sys

from harness import ClusterTopology, Ferry

TEST_KEY = {'set': 'key:__rand_int__', 'get': 'key:__rand_int__', 'incr': 'counter:__rand_int__',
            'lpush': 'mylist', 'rpush': 'mylist', 'lpop': 'mylist', 'rpop': 'mylist',
            'sadd': 'myset', 'hset': 'myhash:__rand_int__', 'spop': 'myset'}


def bench(port, test, p, c, n):
    """(requests/s, p50 ms) of one redis-benchmark run."""
    out = subprocess.run(['redis-benchmark', '-h', '127.0.0.1', '-p', str(port), '-c', str(c),
                          '-n', str(n), '-P', str(p), '-t', test, '--csv'],
                         capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        sys.exit('cluster_bench: redis-benchmark failed: %s' % out.stderr[-500:])
    for line in out.stdout.splitlines():
        f = [x.strip('"') for x in line.split(',')]
        if len(f) >= 5 and f[0] != 'test':
            return float(f[1]), float(f[4])
    sys.exit('cluster_bench: no result in %r' % out.stdout[-500:])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--rounds', type=int, default=3)
    ap.add_argument('--tests', default='lpush,rpop,set,get')
    ap.add_argument('--shapes', default='1:1 1:50 16:50')
    ap.add_argument('-n', type=int, default=0)
    a = ap.parse_args()
    tests = [t for t in a.tests.split(',') if t]
    for t in tests:
        if t not in TEST_KEY:
            sys.exit('cluster_bench: test %s: its key is not known (%s)' %
                     (t, ','.join(sorted(TEST_KEY))))
    shapes = [tuple(int(x) for x in s.split(':')) for s in a.shapes.split()]
    cluster = ClusterTopology(masters=3, replicas=0)
    ferry = None
    try:
        ferry = Ferry(None, wait='port', conf={
            'cluster': {'nodes': cluster.seeds()}})
        owners = cluster.wait_consistent()
        rows = []
        for p, c in shapes:
            n = a.n or (200000 if p > 1 else 20000 if c == 1 else 100000)
            for t in tests:
                node = owners[cluster.keyslot(TEST_KEY[t])]
                runs = {'direct': [], 'ferry': []}
                for rnd in range(a.rounds):
                    order = ['direct', 'ferry'] if rnd % 2 == 0 else ['ferry', 'direct']
                    for target in order:
                        runs[target].append(bench(node if target == 'direct' else ferry.port,
                                                  t, p, c, n))
                        print('cluster_bench: round %d/%d %s -P %d -c %d: %s' % (
                            rnd + 1, a.rounds, t, p, c, target), file=sys.stderr)
                rows.append((t, p, c, node, runs))
        print('| test | -P | -c | target | rps | x direct | p50 ms |')
        print('|------|---:|---:|--------|----:|---------:|-------:|')
        for t, p, c, node, runs in rows:
            d = statistics.median(r[0] for r in runs['direct'])
            for target in ('direct', 'ferry'):
                rps = statistics.median(r[0] for r in runs[target])
                p50 = statistics.median(r[1] for r in runs[target])
                name = 'direct (node :%d)' % node if target == 'direct' else 'ferry (cluster)'
                print('| %s | %d | %d | %s | %.0f | %.2f | %.3f |' % (
                    t, p, c, name, rps, rps / d if d else 0, p50))
    finally:
        if ferry is not None:
            ferry.stop()
        cluster.stop()


if __name__ == '__main__':
    main()
