/* test_outq.c - unit tests for the output queue of proxy/base/buf.c on a real
 * socket pair: a write the socket takes whole is done at once (no callback,
 * no storage kept), a write larger than the socket buffer goes on in
 * flight with its callback and arrives whole and in order (the bytes the
 * socket took so far counted as they go), and a write to a peer that left
 * fails at once with the error. */

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "buf.h"

#define BIG (4u << 20)   /* far more than a socket buffer holds */
#define MAX_TURNS 100000 /* bound on loop turns while draining */

typedef struct pair {
    uv_loop_t loop;
    uv_pipe_t pipe; /* our end, written through the outq */
    int peer;       /* the other end, read directly (non-blocking) */
    outq q;
    int callbacks; /* write callbacks seen */
    int status;    /* the last callback's status */
} pair;

static void write_cb(uv_write_t *w, int status)
{
    pair *p = w->handle->data;
    outq_done(&p->q, status);
    p->callbacks++;
    p->status = status;
}

static void pair_open(pair *p)
{
    int fds[2];
    memset(p, 0, sizeof(*p));
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
    int small = 16 * 1024;
    assert_int_equal(setsockopt(fds[0], SOL_SOCKET, SO_SNDBUF, &small, sizeof(small)), 0);
    assert_int_equal(fcntl(fds[1], F_SETFL, fcntl(fds[1], F_GETFL) | O_NONBLOCK), 0);
    assert_int_equal(uv_loop_init(&p->loop), 0);
    assert_int_equal(uv_pipe_init(&p->loop, &p->pipe, 0), 0);
    assert_int_equal(uv_pipe_open(&p->pipe, fds[0]), 0);
    p->pipe.data = p;
    p->peer = fds[1];
    outq_init(&p->q);
}

static void pair_close(pair *p)
{
    uv_close((uv_handle_t *)&p->pipe, NULL);
    assert_int_equal(uv_run(&p->loop, UV_RUN_DEFAULT), 0);
    assert_int_equal(uv_loop_close(&p->loop), 0);
    outq_free(&p->q);
    if (p->peer >= 0) {
        close(p->peer);
    }
}

/* Read what the peer has; returns the bytes read. */
static size_t peer_read(pair *p, unsigned char *to, size_t cap)
{
    size_t got = 0;
    while (got < cap) {
        ssize_t n = read(p->peer, to + got, cap - got);
        if (n <= 0) {
            assert_true(n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK));
            break;
        }
        got += (size_t)n;
    }
    return got;
}

static void test_small_write_done_at_once(void **state)
{
    (void)state;
    pair p;
    pair_open(&p);
    buf_append_str(&p.q.fill, "+PONG\r\n");
    assert_int_equal(outq_flush(&p.q, (uv_stream_t *)&p.pipe, write_cb), OUTQ_WRITTEN);
    assert_int_equal(outq_writing(&p.q), 0);
    assert_null(p.q.fill.data); /* nothing queued: no storage kept */
    assert_null(p.q.w);         /* nor a write request and its buffer */
    assert_int_equal(outq_len(&p.q), 0);
    assert_int_equal(outq_sent(&p.q, (uv_stream_t *)&p.pipe), 7);
    assert_int_equal(outq_end(&p.q), 7);
    uv_run(&p.loop, UV_RUN_NOWAIT);
    assert_int_equal(p.callbacks, 0); /* no write request, no callback */
    unsigned char got[16];
    assert_int_equal(peer_read(&p, got, sizeof(got)), 7);
    assert_memory_equal(got, "+PONG\r\n", 7);
    /* Nothing queued: nothing to do. */
    assert_int_equal(outq_flush(&p.q, (uv_stream_t *)&p.pipe, write_cb), OUTQ_IDLE);
    pair_close(&p);
}

static void test_big_write_in_flight_arrives_in_order(void **state)
{
    (void)state;
    pair p;
    pair_open(&p);
    unsigned char *want = malloc(2 * BIG);
    unsigned char *got = malloc(2 * BIG);
    assert_non_null(want);
    assert_non_null(got);
    for (size_t i = 0; i < 2 * BIG; i++) {
        want[i] = (unsigned char)(i * 7 + i / 4099);
    }
    buf_append(&p.q.fill, want, BIG);
    assert_int_equal(outq_flush(&p.q, (uv_stream_t *)&p.pipe, write_cb), OUTQ_STARTED);
    assert_int_equal(outq_writing(&p.q), 1);
    /* The socket took what its buffers hold: counted, though the write
     * goes on. */
    uint64_t sent = outq_sent(&p.q, (uv_stream_t *)&p.pipe);
    assert_true(sent > 0 && sent < BIG);
    /* More bytes while the write is in flight wait for its callback. */
    buf_append(&p.q.fill, want + BIG, BIG);
    assert_int_equal(outq_end(&p.q), 2 * BIG);
    assert_int_equal(outq_flush(&p.q, (uv_stream_t *)&p.pipe, write_cb), OUTQ_IDLE);
    size_t have = 0;
    int turns = 0;
    while (have < 2 * BIG && turns++ < MAX_TURNS) {
        have += peer_read(&p, got + have, 2 * BIG - have);
        uv_run(&p.loop, UV_RUN_NOWAIT);
        int rc = outq_flush(&p.q, (uv_stream_t *)&p.pipe, write_cb);
        assert_true(rc == OUTQ_STARTED || rc == OUTQ_IDLE || rc == OUTQ_WRITTEN);
        uint64_t now = outq_sent(&p.q, (uv_stream_t *)&p.pipe);
        assert_true(now >= sent && now >= have && now <= outq_end(&p.q)); /* never backwards */
        sent = now;
    }
    assert_int_equal(have, 2 * BIG);
    assert_int_equal(outq_sent(&p.q, (uv_stream_t *)&p.pipe), 2 * BIG);
    assert_int_equal(p.q.written, 2 * BIG);
    assert_memory_equal(got, want, 2 * BIG);
    assert_true(p.callbacks >= 1);
    assert_int_equal(p.status, 0);
    assert_int_equal(outq_len(&p.q), 0);
    free(want);
    free(got);
    pair_close(&p);
}

static void test_write_to_departed_peer_fails_at_once(void **state)
{
    (void)state;
    pair p;
    pair_open(&p);
    close(p.peer);
    p.peer = -1;
    buf_append_str(&p.q.fill, "+OK\r\n");
    int rc = outq_flush(&p.q, (uv_stream_t *)&p.pipe, write_cb);
    assert_true(rc == UV_EPIPE || rc == UV_ECONNRESET);
    uv_run(&p.loop, UV_RUN_NOWAIT);
    assert_int_equal(p.callbacks, 0);
    pair_close(&p);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN); /* as ferry: a write to a closed socket fails with EPIPE */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_small_write_done_at_once),
        cmocka_unit_test(test_big_write_in_flight_arrives_in_order),
        cmocka_unit_test(test_write_to_departed_peer_fails_at_once),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
