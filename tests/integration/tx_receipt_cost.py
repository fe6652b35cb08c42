"""What a transaction receipt costs (durability.push_receipts on an RQ-like
enqueue): CLIENTS connections through ferry (Sentinel mode, one replica,
replicas_ack 1) each send N / CLIENTS transactions in turn, each one round
trip of MULTI, HSET of a 200-byte job, RPUSH of its id, EXEC; the same with
push_receipts off, ROUNDS times each, in turn. Prints transactions per second
and the master's CPU time per transaction (INFO cpu, user + sys).

Run: python3 tx_receipt_cost.py [N] [CLIENTS] [ROUNDS]    (4000 16 2)"""
import socket
import sys
import threading
import time

from harness import Ferry, SentinelTopology, resp_encode, resp_read_reply
from test_stats import stats_json


def cpu(server):
    i = server.client().info('cpu')
    return i['used_cpu_user'] + i['used_cpu_sys']


def run(ferry, n, clients):
    def work(k):
        s = socket.create_connection(('127.0.0.1', ferry.port), timeout=30)
        for i in range(n // clients):
            s.sendall(resp_encode('MULTI') +
                      resp_encode('HSET', 'job:%d:%d' % (k, i), 'status', 'queued', 'data',
                                  'x' * 200) +
                      resp_encode('RPUSH', 'q:c', '%d-%d' % (k, i)) + resp_encode('EXEC'))
            for _ in range(4):
                resp_read_reply(s)
        s.close()
    threads = [threading.Thread(target=work, args=(k,)) for k in range(clients)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.monotonic() - t0


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 4000
    clients = int(sys.argv[2]) if len(sys.argv) > 2 else 16
    rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 2
    topo = SentinelTopology(nreplicas=1)
    try:
        for _ in range(rounds):
            for receipts in (False, True):
                f = Ferry(None, sentinel=topo, conf={'durability': {'push_receipts': receipts},
                                                      'fallback': {'keys': ['q:*']}})
                try:
                    m = topo.master()
                    c0 = cpu(m)
                    took = run(f, n, clients)
                    used = cpu(m) - c0
                    made = stats_json(f.stats_port)['durability']['transaction_receipts']
                    print('push_receipts %-5s: %d transactions in %.2f s, %.0f/s; master CPU '
                          '%.1f us each; with a receipt: %d'
                          % (receipts, n, took, n / took, used / n * 1e6, made), flush=True)
                    m.client().flushall()
                finally:
                    f.stop()
    finally:
        topo.stop()


if __name__ == '__main__':
    main()
