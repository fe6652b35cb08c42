#!/usr/bin/python3
"""Write the seed corpus of fuzz_session (tests/fuzz/corpus/session/).

An input is a configuration byte, then actions: an opcode byte (low 4 bits:
the action, high bits: which client) and its operands. The encoding is
fuzz_session.c's step(); the names below follow it. Run from anywhere:
    tests/fuzz/session_seeds.py
"""
import os

# Configuration bits (make_config in fuzz_session.c).
MAX3 = 1  # client.max_clients 3 instead of 2
ACK = 2  # durability.replicas_ack 1
TIGHT = 4  # small limits: pipeline, output, memory, hold, timeouts
AUTH = 8  # client and Redis passwords
TWO = 16  # two shared links, require_aof, persist_config, no probe
DEBUG = 32  # debug logging (formatted, discarded)

# Command indexes (CMDS in fuzz_session.c).
GET, SET, LPUSH, RPUSH, ECHO, INCR, ZADD, DEL, EVAL, EVAL_RO, PUBLISH, XADD, SET_BIG = range(13)
PING, PING_T, MULTI, EXEC, DISCARD, WATCH, UNWATCH, SELECT, BLPOP, BRPOP = range(13, 23)
BLMOVE, BZPOPMIN, BRPOPLPUSH, XREAD, QUIT, RESET, HELLO, HELLO_AUTH = range(23, 31)
AUTH_OK, AUTH_BAD, SETNAME, CONFIG_SET, CONFIG_GET, SHUTDOWN, UNKNOWN, DBSIZE, WAIT = range(31, 40)
SUBSCRIBE, PSUBSCRIBE, SSUBSCRIBE, UNSUB_ALL, UNSUB, PUNSUB_ALL, MONITOR = range(40, 47)
REPLY_OFF, REPLY_ON = range(47, 49)


def op(code, client=0):
    return bytes([code | (client << 4)])


def cmd(which, arg=0, client=0, inline=False):
    return op(0, client) + bytes([which, arg | (0x80 if inline else 0)])


def pipeline(cmds, client=0):
    out = op(2, client) + bytes([len(cmds) - 1])
    for which, arg in cmds:
        out += bytes([which, arg])
    return out


def raw(data, client=0):
    return op(3, client) + bytes([len(data)]) + data


def answer(link=0, n=4, flavor=1, unblock=False):
    return op(4) + bytes([link, (n - 1) | (4 if unblock else 0), flavor])


def error(link, which):
    """Answer one command with ERRORS[which] (fuzz_session.c)."""
    return op(4) + bytes([link, 0, which << 2])


def answer_all(unblock=True):
    return op(6, 1 if unblock else 0)


def redis_raw(data, link=0):
    return op(7) + bytes([link, len(data)]) + data


def close_links(all_links=True, reset=False):
    return op(8) + bytes([(0xf0 if all_links else 0) | (1 if reset else 0)])


UP, DOWN, FROZEN = 0, 1, 2


def mode(m):
    return op(9) + bytes([m])


STEPS = [1, 10, 50, 100, 250, 500, 1000, 2000, 5000, 12000]


def time(ms):
    return op(10) + bytes([STEPS.index(ms)])


def toggle_reading(client=0):
    return op(11, client)


def gone(how=0, client=0):
    return op(12, client) + bytes([how])


def connect(client):
    return op(13, client)


def publish(link=0, size=0):
    return op(14) + bytes([link, size])


def pieces(n):
    return op(15) + bytes([n])


READY = answer_all() * 3  # ROLE, INFO + CONFIG SET, INFO: the link is verified

SEEDS = {
    "basic": bytes([0]) + READY + cmd(SET) + cmd(GET, 1) + answer_all(),
    "held_then_up": bytes([0]) + cmd(SET) + cmd(LPUSH, 2) + READY + answer_all(),
    "inline": bytes([0]) + READY + cmd(SET, 1, inline=True) + cmd(PING, inline=True) + answer_all(),
    "pipeline": bytes([0]) + READY + pipeline([(SET, 0), (GET, 1), (INCR, 2), (ECHO, 3), (DEL, 0)])
    + answer(n=2) + answer(n=3),
    "failover": bytes([0]) + READY + cmd(SET) + cmd(GET) + close_links() + mode(DOWN) + time(100)
    + mode(UP) + time(1000) + READY + answer_all(),
    "refused_readonly": bytes([0]) + READY + cmd(SET) + error(0, 1) + time(100) + READY + answer_all(),
    "multi_exec": bytes([0]) + READY + cmd(MULTI) + cmd(SET) + cmd(INCR) + answer_all() + cmd(EXEC)
    + answer_all(),
    "multi_lost": bytes([0]) + READY + cmd(MULTI) + cmd(SET) + answer_all() + close_links()
    + time(100) + READY + cmd(EXEC) + answer_all() * 4,
    "watch_lost": bytes([0]) + READY + cmd(WATCH) + answer_all() + close_links() + cmd(MULTI)
    + cmd(SET) + cmd(EXEC) + time(100) + READY + answer_all(),
    "blocking_switch": bytes([0]) + READY + cmd(BLPOP, 4) + answer_all(False) + close_links(False)
    + time(250) + time(1000) + READY + answer_all(),
    "blocking_answered": bytes([0]) + READY + cmd(BRPOP) + cmd(BLMOVE) + answer_all(False)
    + answer_all(True) + answer_all(True),
    "subscribe": bytes([0]) + READY + cmd(SUBSCRIBE) + cmd(PSUBSCRIBE) + answer_all()
    + publish(1, 10) + cmd(PING) + answer_all() + cmd(UNSUB_ALL) + answer_all(),
    "subscribe_failover": bytes([0]) + READY + cmd(SUBSCRIBE) + answer_all() + close_links()
    + time(100) + READY + answer_all() + publish(1, 3),
    "monitor": bytes([0]) + READY + cmd(MONITOR) + answer_all() + publish(1, 0) + cmd(RESET)
    + answer_all(),
    "client_reply_off": bytes([0]) + READY + cmd(REPLY_OFF) + cmd(SET) + cmd(REPLY_ON) + answer_all(),
    "slow_reader_tight": bytes([TIGHT]) + READY + toggle_reading() + pipeline([(SET_BIG, 200)] * 4)
    + answer_all() + pipeline([(GET, 0)] * 8) + answer_all() + time(2000),
    "subscriber_not_reading": bytes([TIGHT]) + READY + cmd(SUBSCRIBE) + answer_all()
    + toggle_reading() + publish(1, 200) * 3 + time(2000),
    "max_pipeline_tight": bytes([TIGHT]) + READY + pipeline([(INCR, i) for i in range(8)])
    + answer(n=2) + answer(n=4) + answer_all(),
    "hold_timeout_tight": bytes([TIGHT]) + mode(DOWN) + cmd(SET) + cmd(SET_BIG, 50) + time(1000)
    + time(2000) + time(2000),
    "slowloris_tight": bytes([TIGHT]) + READY + raw(b"*2\r\n$3\r\nGET\r\n$1") + time(500)
    + time(500),
    "idle_tight": bytes([TIGHT]) + READY + cmd(PING) + answer_all() + time(5000),
    "memory_tight": bytes([TIGHT | MAX3]) + READY + connect(1) + toggle_reading()
    + pipeline([(SET_BIG, 255)] * 3) + cmd(SET, 0, client=1) + answer_all() + time(100),
    "protocol_error": bytes([0]) + READY + cmd(SET) + raw(b"*1\r\n$x\r\n") + answer_all(),
    "raw_inline": bytes([0]) + READY + raw(b'SET k "a b" \'c\'\r\nPING\r\n') + answer_all(),
    "raw_reply": bytes([0]) + READY + cmd(GET) + redis_raw(b"$3\r\nabc\r\n") + cmd(GET)
    + redis_raw(b"*2\r\n$1\r") + redis_raw(b"\na\r\n:1\r\n"),
    "raw_garbage": bytes([0]) + READY + cmd(GET) + redis_raw(b"?what\r\n") + time(100) + READY
    + answer_all(),
    "reply_pieces": bytes([0]) + pieces(1) + READY + cmd(SET) + cmd(GET) + answer_all(),
    "frozen_master": bytes([0]) + READY + cmd(SET) + mode(FROZEN) + time(1000) + time(5000)
    + time(5000) + mode(UP) + time(1000) + READY + answer_all(),
    "dedicated_connect_refused": bytes([0]) + READY + mode(DOWN) + cmd(BLPOP) + time(100)
    + mode(UP) + time(1000) + READY + answer_all(),
    "discard_lost_then_watch": bytes([0]) + READY + pipeline([(DISCARD, 0), (WATCH, 0)])
    + close_links() + time(1000) + READY + answer_all(),
    "connect_refused": bytes([0]) + mode(DOWN) + cmd(GET) + time(100) + time(250) + time(500)
    + mode(UP) + time(1000) + READY + answer_all(),
    "replicas_ack": bytes([ACK]) + READY + cmd(SET) + cmd(LPUSH) + answer_all() + answer_all(),
    "replicas_ack_write_then_multi": bytes([ACK]) + READY + cmd(SELECT, 4) + answer_all()
    + pipeline([(SET, 0), (MULTI, 0)]) + answer_all() + answer_all() + cmd(SET) + cmd(EXEC)
    + answer_all() * 3,
    "two_transactions_pipelined": bytes([ACK]) + READY
    + pipeline([(MULTI, 0), (SET, 0), (EXEC, 0), (MULTI, 0), (SET, 1)]) + answer_all() * 2
    + cmd(EXEC) + answer_all() * 2,
    "noreplicas_in_multi": bytes([0]) + READY + cmd(MULTI) + cmd(SET) + answer(1, n=1)
    + error(1, 3) + cmd(EXEC) + answer_all() + cmd(MULTI) + cmd(EXEC) + answer_all(),
    "replicas_ack_fence": bytes([ACK]) + READY + cmd(SET) + answer(n=1) + error(0, 1)
    + answer_all() + time(1000) + READY + answer_all(),
    "auth": bytes([AUTH]) + answer_all() + READY + cmd(GET) + cmd(AUTH_BAD) + cmd(AUTH_OK)
    + cmd(GET) + cmd(HELLO_AUTH) + answer_all(),
    "two_links_require_aof": bytes([TWO]) + READY + answer_all() * 2 + cmd(SET) + cmd(GET)
    + answer_all(),
    "aof_off_recheck": bytes([0]) + answer_all() + answer(n=2, flavor=1 | (13 << 2)) + time(10)
    + time(100) + answer_all() + cmd(SET) + answer_all(),
    "role_slave": bytes([0]) + answer(n=1, flavor=1 | (63 << 2)) + time(100) + READY + cmd(GET)
    + answer_all(),
    "select_db": bytes([0]) + READY + cmd(SELECT, 4) + cmd(SET) + answer_all() + cmd(SELECT, 0)
    + answer_all(),
    "quit_reset": bytes([0]) + READY + cmd(SETNAME) + cmd(RESET) + cmd(GET) + answer_all()
    + cmd(QUIT) + answer_all(),
    "local_answers": bytes([0]) + cmd(HELLO, 8) + cmd(HELLO, 12) + cmd(CONFIG_SET) + cmd(SHUTDOWN)
    + cmd(AUTH_OK) + READY + cmd(UNKNOWN) + cmd(CONFIG_GET) + answer_all(),
    "three_clients": bytes([MAX3]) + READY + connect(1) + connect(2) + cmd(SET, 0, 0)
    + cmd(GET, 0, 1) + cmd(BLPOP, 0, 2) + answer_all(False) + answer_all(),
    "too_many_clients": bytes([0]) + connect(1) + connect(2) + READY + cmd(PING, 0, 2),
    "client_gone": bytes([0]) + READY + cmd(BLPOP) + cmd(SET) + gone(0) + answer_all(),
    "client_write_error": bytes([0]) + READY + cmd(GET) + gone(2) + answer_all(),
    "scripts": bytes([ACK]) + READY + cmd(EVAL) + cmd(EVAL_RO) + cmd(XADD) + cmd(PUBLISH)
    + answer_all() * 2,
    "debug_log": bytes([DEBUG | ACK]) + READY + cmd(SET) + close_links() + time(100) + READY
    + answer_all(),
}


def main():
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus", "session")
    os.makedirs(out, exist_ok=True)
    for name, data in SEEDS.items():
        with open(os.path.join(out, name), "wb") as f:
            f.write(data)
    print(f"{len(SEEDS)} seeds in {out}")


if __name__ == "__main__":
    main()
