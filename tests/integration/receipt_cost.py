"""What a pop receipt costs Redis itself, without ferry in between: the
CPU time a master (appendonly yes, appendfsync always) and its replica
spend per pop, for the shapes a receipt can take. One connection sends
batches of BATCH commands (a pipelined consumer's shape) on a queue filled
first; Redis' own CPU time (utime + stime from /proc) is read around them.

    rpop        RPOP q                          (no receipt)
    one-list    LMOVE q <one list> RIGHT LEFT   (the floor of any receipt:
                                                 the item kept, no key made)
    key-per-pop LMOVE q <new key> RIGHT LEFT, then one DEL of the batch's
                keys (durability.pop_receipts as built: a key per pop)

Run: python3 receipt_cost.py [N] [--rounds R]    (N pops per shape, 200000)
Prints a markdown table: the medians over the rounds, shapes in turn."""
import argparse
import socket
import statistics
import time

from harness import RedisServer, resp_encode as enc, wait_until

BATCH = 800  # -P 16 -c 50 in flight


class Conn:
    def __init__(self, port):
        self.s = socket.create_connection(('127.0.0.1', port), timeout=30)
        self.f = self.s.makefile('rb')

    def reply(self):
        line = self.f.readline()
        if line[:1] == b'$' and int(line[1:]) >= 0:
            self.f.read(int(line[1:]) + 2)
        elif line[:1] == b'*':
            for _ in range(max(0, int(line[1:]))):
                self.reply()
        elif line[:1] == b'-':
            raise RuntimeError(line.decode().strip())

    def run(self, cmds):
        self.s.sendall(b''.join(cmds))
        for _ in cmds:
            self.reply()


def cpu_ticks(pid):
    with open('/proc/%d/stat' % pid) as fh:
        v = fh.read().rsplit(')', 1)[1].split()
    return int(v[11]) + int(v[12])


def shape_cmds(shape, n0):
    if shape == 'rpop':
        return [enc('RPOP', 'q')] * BATCH
    if shape == 'one-list':
        return [enc('LMOVE', 'q', 'rcpt', 'RIGHT', 'LEFT')] * BATCH
    keys = ['rcpt:%d' % (n0 + i) for i in range(BATCH)]
    return [enc('LMOVE', 'q', k, 'RIGHT', 'LEFT') for k in keys] + [enc('DEL', *keys)]


def measure(conn, master, replica, shape, n):
    hz = 100.0
    t0, r0, w0 = cpu_ticks(master.pid), cpu_ticks(replica.pid), time.monotonic()
    done = 0
    while done < n:
        conn.run(shape_cmds(shape, done))
        done += BATCH
    wall = time.monotonic() - w0
    us = lambda t: t / hz * 1e6 / done
    return us(cpu_ticks(master.pid) - t0), us(cpu_ticks(replica.pid) - r0), done / wall


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('n', nargs='?', type=int, default=200000)
    ap.add_argument('--rounds', type=int, default=3)
    a = ap.parse_args()
    shapes = ['rpop', 'one-list', 'key-per-pop']
    conf = {'appendfsync': 'always', 'auto-aof-rewrite-percentage': 0}
    master = RedisServer(conf=conf)
    replica = RedisServer(conf=dict(conf, replicaof='127.0.0.1 %d' % master.port))
    try:
        c = master.client()
        wait_until(lambda: c.info('replication')['connected_slaves'] == 1, timeout=20,
                   msg='replica attached')
        need = a.n * len(shapes) * a.rounds
        for i in range(0, need, 100000):
            c.eval("for i=1,ARGV[1] do redis.call('RPUSH','q','item-payload-'..i) end", 0,
                   min(100000, need - i))
        wait_until(lambda: replica.client().llen('q') == need, timeout=60,
                   msg='replica has the queue')
        conn = Conn(master.port)
        res = {s: [] for s in shapes}
        for _ in range(a.rounds):
            for s in shapes:
                res[s].append(measure(conn, master, replica, s, a.n))
        base = statistics.median(m for m, _, _ in res['rpop'])
        print('| shape | master CPU us/pop | x RPOP | replica CPU us/pop | pops/s (one connection) |')
        print('|---|---:|---:|---:|---:|')
        for s in shapes:
            m = statistics.median(x[0] for x in res[s])
            print('| %s | %.2f | %.2f | %.2f | %.0f |' % (
                s, m, m / base, statistics.median(x[1] for x in res[s]),
                statistics.median(x[2] for x in res[s])))
    finally:
        replica.stop()
        master.stop()


if __name__ == '__main__':
    main()
