"""One queue worker doing, per job, the Redis calls RQ 2.10 makes (as seen in
MONITOR on a direct Redis): the pop (BLMOVE into an intermediate list), reads
and heartbeats on the worker's own connection, a MULTI/EXEC that records the
execution, then a work horse's new connection with its MULTI/EXEC, a
WATCH+MULTI/EXEC that finishes the job, and the worker's closing MULTI/EXEC.
Without RQ's fork per job, so the job rate is set by ferry and Redis.

    rq_pattern.py PORT NAME STOP_AT_UNIX_TIME

Prints 'done N' at the end; errors are printed and the job is retried."""
import sys
import time

import redis

port, name, stop_at = int(sys.argv[1]), sys.argv[2], float(sys.argv[3])


def conn():
    return redis.Redis(port=port, socket_timeout=30, decode_responses=True)


w = conn()
ps = conn().pubsub()
ps.subscribe('rq:pubsub:' + name)
wk = 'rq:worker:' + name
done = 0
while time.time() < stop_at:
    try:
        job = w.blmove('rq:queue', 'rq:queue:intermediate', 1, 'RIGHT', 'LEFT')
        if job is None:
            continue
        w.hgetall('rq:job:' + job)
        w.hset(wk, 'last_heartbeat', time.time())
        w.expire(wk, 420)
        w.expire(wk + ':executions', 420)
        p = w.pipeline(transaction=True)
        for k in range(8):
            p.hset('rq:execution:' + job, 'f%d' % k, 1)
        p.execute()
        h = conn()  # the work horse
        p = h.pipeline(transaction=True)
        for k in range(7):
            p.hset('rq:job:' + job, 's%d' % k, 1)
        p.lrem('rq:queue:intermediate', 1, job)
        p.execute()
        h.hset('rq:job:' + job, 'status', 'finished')
        with h.pipeline(transaction=True) as p:
            p.watch('rq:job:' + job + ':dependents')
            p.smembers('rq:job:' + job + ':dependents')
            p.multi()
            for k in range(14):
                p.hset('rq:finish:' + job, 'f%d' % k, 1)
            p.zadd('rq:finished', {job: time.time()})
            p.execute()
        h.close()
        w.hset(wk, 'state', 'idle')
        w.hset(wk, 'current_job', '')
        p = w.pipeline(transaction=True)
        p.hset(wk, 'last_heartbeat', time.time())
        p.expire(wk, 420)
        p.exists('rq:suspended')
        p.execute()
        done += 1
    except redis.RedisError as e:
        print('error %r' % (e,), flush=True)
        time.sleep(0.05)
print('done %d' % done, flush=True)
