"""Jobs for test_rq_failover's RQ workers (imported by `rq worker` by name)."""


def noop(i):
    return i
