"""The reliable-queue pattern as a load: P processes each take items with
BRPOPLPUSH from KEY into KEY:processing and ack each with LREM, N pairs in
all (KEY is filled with N items first, directly on Redis). Prints one line:
pairs/s, and the median and p99 of a pair's latency in ms. scripts/bench
runs it through a ferry with and without a lease on KEY.

    lease_bench.py FERRY_PORT REDIS_PORT KEY N [P]"""
import multiprocessing
import statistics
import sys
import time

import redis


def worker(port, key, n, out):
    c = redis.Redis(port=port, socket_timeout=30)
    proc = key + ':processing'
    lat = []
    for _ in range(n):
        t0 = time.perf_counter()
        item = c.brpoplpush(key, proc, 5)
        if item is None:
            break
        c.lrem(proc, 1, item)
        lat.append(time.perf_counter() - t0)
    out.put(lat)


def main():
    port, rport, key, n = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
    procs = int(sys.argv[5]) if len(sys.argv) > 5 else 8
    r = redis.Redis(port=rport)
    r.delete(key, key + ':processing')
    for i in range(0, n, 1000):
        r.rpush(key, *range(i, min(n, i + 1000)))
    out = multiprocessing.Queue()
    ps = [multiprocessing.Process(target=worker, args=(port, key, n // procs, out))
          for _ in range(procs)]
    t0 = time.perf_counter()
    for p in ps:
        p.start()
    lat = []
    for _ in ps:
        lat += out.get(timeout=300)
    secs = time.perf_counter() - t0
    for p in ps:
        p.join(30)
    lat.sort()
    print('%.0f %.3f %.3f' % (len(lat) / secs, statistics.median(lat) * 1000,
                              lat[int(len(lat) * 0.99) - 1] * 1000))


if __name__ == '__main__':
    main()
