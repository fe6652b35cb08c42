/* fuzz_session.c - libFuzzer target for a whole ferry: clients, sessions,
 * the router, the backlog, the master view, fences and links, run from the
 * fuzz input against a fake Redis.
 *
 * ferry's own code runs unchanged. Every libuv call it makes for handles,
 * I/O, timers and the clock is wrapped at link time (-Wl,--wrap=uv_...,
 * listed in CMakeLists.txt) by the small fake loop below: no socket, no
 * thread, no real time. The loop keeps libuv's order (timers, prepare, I/O,
 * close callbacks; a write or connect still pending when its handle closes
 * ends with UV_ECANCELED before the close callback), and time moves only
 * when the input says so, so a run depends on its input alone.
 *
 * Input: byte 0 picks a configuration; then actions, each an opcode byte
 * and its operands (missing bytes read as 0): a client sends a command
 * (tagged: it carries a unique argument the fake Redis echoes) or raw
 * bytes, Redis answers (normally, with an error, or with raw bytes) or
 * closes a link, Redis refuses or swallows connects, time passes, a client
 * stops reading, goes away or connects. tests/fuzz/session_seeds.py writes
 * the seed corpus in this format.
 *
 * Checked after every step: what ferry writes to a client is whole RESP
 * replies, tagged replies come back in request order and once, and each
 * exactly where it belongs while a client sends only commands with one
 * reply each; what ferry writes to Redis is valid multibulk with at least
 * one argument; every session's memory and held bytes add up to ferry's
 * totals. At the end Redis heals, every such client gets every reply, then
 * ferry is stopped: every handle must be closed, no memory left counted,
 * nothing leaked (LeakSanitizer). */
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>

#include "core.h"
#include "ferry.h"
#include "link.h"
#include "log.h"
#include "session.h"
#include "tls.h"
#include "upstream.h"

#define MAX_CLIENTS 3
#define MAX_TURNS 256       /* loop turns per settle: more is a busy loop */
#define MAX_TIMER_FIRES 512 /* timer callbacks per time step */
#define DRAIN_ROUNDS 24     /* rounds of a healthy Redis at the end */
#define START_MS 1000000    /* the virtual clock at start */
#define TAG_LEAD "\xfeT"    /* tags start with this; raw input never holds 0xfe */

static int trace; /* FUZZ_SESSION_TRACE=1: print what happens (to read a crash) */

/* Print n bytes readably (trace only). */
static void trace_bytes(const char *who, const char *p, size_t n)
{
    fprintf(stderr, "  %s: ", who);
    for (size_t i = 0; i < n && i < 4000; i++) {
        unsigned char ch = (unsigned char)p[i];
        if (ch == '\r') {
            fputs("\\r", stderr);
        } else if (ch == '\n') {
            fputs("\\n", stderr);
        } else if (ch < 32 || ch > 126) {
            fprintf(stderr, "\\x%02x", ch);
        } else {
            fputc(ch, stderr);
        }
    }
    fprintf(stderr, "%s\n", n > 4000 ? "..." : "");
}

static void fail(const char *what)
{
    fprintf(stderr, "fuzz_session: invariant broken: %s\n", what);
    abort();
}

#define check(cond, what)                                                                          \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fail(what);                                                                            \
        }                                                                                          \
    } while (0)

/* ================================================================ fake loop */

typedef enum ep_kind {
    EP_OTHER = 0,
    EP_TIMER,
    EP_PREPARE,
    EP_LISTENER,
    EP_CLIENT,
    EP_LINK
} ep_kind;

typedef struct pending_write {
    uv_write_t *req; /* ferry's request, answered once */
    uv_write_cb cb;
} pending_write;

struct client;
struct rconn;

/* One handle ferry initialised (a fake libuv handle). */
typedef struct ep {
    uv_handle_t *h;
    ep_kind kind;
    int closing;           /* uv_close called: callbacks run at the end of the turn */
    uv_close_cb close_cb;  /* ferry's close callback */
    int active;            /* timer or prepare started */
    uv_timer_cb timer_cb;  /* timer */
    uint64_t due, repeat;  /* timer: when it fires, and again every repeat ms */
    uint64_t order;        /* timer: start order (ties fire in it) */
    uv_prepare_cb prep_cb; /* prepare */
    uv_connection_cb listen_cb;
    int reading; /* stream: uv_read_start active */
    uv_alloc_cb alloc_cb;
    uv_read_cb read_cb;
    uv_connect_t *creq; /* link: connect pending */
    uv_connect_cb connect_cb;
    int connected;
    pending_write *w; /* writes not completed, in order */
    size_t nw, capw;
    buf inbound;      /* bytes for ferry to read */
    int eof;          /* after inbound: EOF (1) or ECONNRESET (2) */
    int write_error;  /* writes fail with EPIPE */
    struct client *c; /* EP_CLIENT: its client */
    struct rconn *r;  /* EP_LINK: the fake Redis' end */
} ep;

static struct {
    ep **eps; /* every handle, in creation order */
    size_t n, cap;
    uint64_t now;         /* virtual uv_now() */
    uint64_t timer_order; /* start counter */
    int redis_mode;       /* REDIS_UP, REDIS_DOWN (connects refused), REDIS_FROZEN */
    struct client *accepting;
    size_t piece; /* bytes per read delivered to ferry (0 = all at once) */
    int did;      /* something happened this turn */
} L;

enum { REDIS_UP = 0, REDIS_DOWN, REDIS_FROZEN };

static ferry F;          /* the context under test */
static tls_roles no_tls; /* no TLS role: plain TCP everywhere */

static ep *ep_find(const void *h)
{
    for (size_t i = 0; i < L.n; i++) {
        if (L.eps[i]->h == h) {
            return L.eps[i];
        }
    }
    return NULL;
}

static ep *ep_get(const void *h)
{
    ep *e = ep_find(h);
    check(e != NULL, "libuv call on a handle that was never initialised");
    return e;
}

static ep *ep_new(void *h, ep_kind kind)
{
    check(ep_find(h) == NULL, "handle initialised twice");
    ep *e = calloc(1, sizeof(*e));
    check(e != NULL, "out of memory");
    e->h = h;
    e->kind = kind;
    buf_init(&e->inbound);
    if (L.n == L.cap) {
        L.cap = L.cap ? L.cap * 2 : 32;
        L.eps = realloc(L.eps, L.cap * sizeof(*L.eps));
        check(L.eps != NULL, "out of memory");
    }
    L.eps[L.n++] = e;
    return e;
}

static void ep_init_handle(uv_loop_t *loop, void *h, uv_handle_type type, ep_kind kind)
{
    uv_handle_t *hh = h;
    hh->loop = loop;
    hh->type = type;
    ep_new(h, kind);
}

/* --------------------------------------------------------- wrapped libuv */

uint64_t __wrap_uv_now(const uv_loop_t *loop);
uint64_t __wrap_uv_hrtime(void);
int __wrap_uv_timer_init(uv_loop_t *loop, uv_timer_t *h);
int __wrap_uv_timer_start(uv_timer_t *h, uv_timer_cb cb, uint64_t timeout, uint64_t repeat);
int __wrap_uv_timer_stop(uv_timer_t *h);
int __wrap_uv_prepare_init(uv_loop_t *loop, uv_prepare_t *h);
int __wrap_uv_prepare_start(uv_prepare_t *h, uv_prepare_cb cb);
int __wrap_uv_prepare_stop(uv_prepare_t *h);
int __wrap_uv_signal_init(uv_loop_t *loop, uv_signal_t *h);
int __wrap_uv_signal_start(uv_signal_t *h, uv_signal_cb cb, int signum);
int __wrap_uv_tcp_init(uv_loop_t *loop, uv_tcp_t *h);
int __wrap_uv_pipe_init(uv_loop_t *loop, uv_pipe_t *h, int ipc);
int __wrap_uv_tcp_nodelay(uv_tcp_t *h, int on);
int __wrap_uv_tcp_keepalive(uv_tcp_t *h, int on, unsigned int delay);
int __wrap_uv_tcp_getpeername(const uv_tcp_t *h, struct sockaddr *name, int *len);
int __wrap_uv_tcp_bind(uv_tcp_t *h, const struct sockaddr *addr, unsigned int flags);
int __wrap_uv_pipe_bind(uv_pipe_t *h, const char *name);
int __wrap_uv_listen(uv_stream_t *h, int backlog, uv_connection_cb cb);
int __wrap_uv_accept(uv_stream_t *server, uv_stream_t *client);
int __wrap_uv_tcp_connect(uv_connect_t *req, uv_tcp_t *h, const struct sockaddr *addr,
                          uv_connect_cb cb);
void __wrap_uv_pipe_connect(uv_connect_t *req, uv_pipe_t *h, const char *name, uv_connect_cb cb);
int __wrap_uv_read_start(uv_stream_t *h, uv_alloc_cb alloc_cb, uv_read_cb read_cb);
int __wrap_uv_read_stop(uv_stream_t *h);
int __wrap_uv_write(uv_write_t *req, uv_stream_t *h, const uv_buf_t bufs[], unsigned int nbufs,
                    uv_write_cb cb);
void __wrap_uv_close(uv_handle_t *h, uv_close_cb cb);
int __wrap_uv_run(uv_loop_t *loop, uv_run_mode mode);

uint64_t __wrap_uv_now(const uv_loop_t *loop)
{
    (void)loop;
    return L.now;
}

uint64_t __wrap_uv_hrtime(void)
{
    return L.now * 1000000;
}

int __wrap_uv_timer_init(uv_loop_t *loop, uv_timer_t *h)
{
    ep_init_handle(loop, h, UV_TIMER, EP_TIMER);
    return 0;
}

int __wrap_uv_timer_start(uv_timer_t *h, uv_timer_cb cb, uint64_t timeout, uint64_t repeat)
{
    ep *e = ep_get(h);
    if (e->closing) {
        return UV_EINVAL;
    }
    e->active = 1;
    e->timer_cb = cb;
    e->due = L.now + timeout;
    e->repeat = repeat;
    e->order = ++L.timer_order;
    return 0;
}

int __wrap_uv_timer_stop(uv_timer_t *h)
{
    ep_get(h)->active = 0;
    return 0;
}

int __wrap_uv_prepare_init(uv_loop_t *loop, uv_prepare_t *h)
{
    ep_init_handle(loop, h, UV_PREPARE, EP_PREPARE);
    return 0;
}

int __wrap_uv_prepare_start(uv_prepare_t *h, uv_prepare_cb cb)
{
    ep *e = ep_get(h);
    e->active = 1;
    e->prep_cb = cb;
    return 0;
}

int __wrap_uv_prepare_stop(uv_prepare_t *h)
{
    ep_get(h)->active = 0;
    return 0;
}

int __wrap_uv_signal_init(uv_loop_t *loop, uv_signal_t *h)
{
    ep_init_handle(loop, h, UV_SIGNAL, EP_OTHER);
    return 0;
}

int __wrap_uv_signal_start(uv_signal_t *h, uv_signal_cb cb, int signum)
{
    (void)cb;
    (void)signum;
    ep_get(h);
    return 0; /* no signal ever arrives */
}

int __wrap_uv_tcp_init(uv_loop_t *loop, uv_tcp_t *h)
{
    ep_init_handle(loop, h, UV_TCP, EP_OTHER);
    return 0;
}

int __wrap_uv_pipe_init(uv_loop_t *loop, uv_pipe_t *h, int ipc)
{
    (void)ipc;
    ep_init_handle(loop, h, UV_NAMED_PIPE, EP_OTHER);
    return 0;
}

int __wrap_uv_tcp_nodelay(uv_tcp_t *h, int on)
{
    (void)on;
    ep_get(h);
    return 0;
}

int __wrap_uv_tcp_keepalive(uv_tcp_t *h, int on, unsigned int delay)
{
    (void)on;
    (void)delay;
    ep_get(h);
    return 0;
}

int __wrap_uv_tcp_getpeername(const uv_tcp_t *h, struct sockaddr *name, int *len)
{
    struct sockaddr_in in;
    ep_get(h);
    memset(&in, 0, sizeof(in));
    in.sin_family = AF_INET;
    in.sin_port = htons(40000);
    in.sin_addr.s_addr = htonl(0x7f000001);
    check(*len >= (int)sizeof(in), "getpeername: short buffer");
    memcpy(name, &in, sizeof(in));
    *len = (int)sizeof(in);
    return 0;
}

int __wrap_uv_tcp_bind(uv_tcp_t *h, const struct sockaddr *addr, unsigned int flags)
{
    (void)addr;
    (void)flags;
    ep_get(h);
    return 0;
}

int __wrap_uv_pipe_bind(uv_pipe_t *h, const char *name)
{
    (void)name;
    ep_get(h);
    return 0;
}

int __wrap_uv_listen(uv_stream_t *h, int backlog, uv_connection_cb cb)
{
    ep *e = ep_get(h);
    (void)backlog;
    e->kind = EP_LISTENER;
    e->listen_cb = cb;
    return 0;
}

static void client_accepted(struct client *c, ep *e);

int __wrap_uv_accept(uv_stream_t *server, uv_stream_t *client)
{
    ep *ls = ep_get(server);
    ep *e = ep_get(client);
    check(ls->kind == EP_LISTENER, "accept on a handle that does not listen");
    check(L.accepting != NULL, "accept with no client connecting");
    e->kind = EP_CLIENT;
    e->connected = 1;
    client_accepted(L.accepting, e);
    L.accepting = NULL;
    return 0;
}

static struct rconn *rconn_new(void);

static void link_connecting(ep *e, uv_connect_t *req, uv_connect_cb cb)
{
    check(e->kind == EP_OTHER && e->creq == NULL, "connect on a used handle");
    e->kind = EP_LINK;
    e->creq = req;
    e->connect_cb = cb;
    req->handle = (uv_stream_t *)e->h;
    e->r = rconn_new();
}

int __wrap_uv_tcp_connect(uv_connect_t *req, uv_tcp_t *h, const struct sockaddr *addr,
                          uv_connect_cb cb)
{
    (void)addr;
    link_connecting(ep_get(h), req, cb);
    return 0;
}

void __wrap_uv_pipe_connect(uv_connect_t *req, uv_pipe_t *h, const char *name, uv_connect_cb cb)
{
    (void)name;
    link_connecting(ep_get(h), req, cb);
}

int __wrap_uv_read_start(uv_stream_t *h, uv_alloc_cb alloc_cb, uv_read_cb read_cb)
{
    ep *e = ep_get(h);
    if (e->closing) {
        return UV_EINVAL;
    }
    if (e->reading) {
        return UV_EALREADY;
    }
    check(e->connected, "read_start on a stream that is not connected");
    e->reading = 1;
    e->alloc_cb = alloc_cb;
    e->read_cb = read_cb;
    return 0;
}

int __wrap_uv_read_stop(uv_stream_t *h)
{
    ep_get(h)->reading = 0;
    return 0;
}

static void client_got(struct client *c, const char *p, size_t n);
static void redis_got(ep *e, const char *p, size_t n);

int __wrap_uv_write(uv_write_t *req, uv_stream_t *h, const uv_buf_t bufs[], unsigned int nbufs,
                    uv_write_cb cb)
{
    ep *e = ep_get(h);
    if (e->closing) {
        return UV_EBADF;
    }
    check(e->kind == EP_CLIENT || e->kind == EP_LINK, "write on a handle that is no stream");
    req->handle = h;
    req->cb = cb;
    if (e->nw == e->capw) {
        e->capw = e->capw ? e->capw * 2 : 4;
        e->w = realloc(e->w, e->capw * sizeof(*e->w));
        check(e->w != NULL, "out of memory");
    }
    e->w[e->nw].req = req;
    e->w[e->nw].cb = cb;
    e->nw++;
    for (unsigned int i = 0; i < nbufs; i++) {
        if (trace) {
            trace_bytes(e->kind == EP_CLIENT ? "to client" : "to redis", bufs[i].base, bufs[i].len);
        }
        if (e->kind == EP_CLIENT) {
            client_got(e->c, bufs[i].base, bufs[i].len);
        } else {
            redis_got(e, bufs[i].base, bufs[i].len);
        }
    }
    return 0;
}

void __wrap_uv_close(uv_handle_t *h, uv_close_cb cb)
{
    ep *e = ep_get(h);
    check(!e->closing, "uv_close called twice on one handle");
    e->closing = 1;
    e->close_cb = cb;
    e->active = 0;
    e->reading = 0;
}

/* ------------------------------------------------------------- loop turns */

static void client_closed(struct client *c);
static void rconn_free(struct rconn *r);

/* Close callbacks of the handles closed so far (libuv: the end of a turn). */
static void run_closing(void)
{
    size_t i = 0;
    while (i < L.n) {
        ep *e = L.eps[i];
        if (!e->closing) {
            i++;
            continue;
        }
        memmove(&L.eps[i], &L.eps[i + 1], (L.n - i - 1) * sizeof(*L.eps));
        L.n--;
        L.did = 1;
        if (e->creq != NULL) {
            uv_connect_t *req = e->creq;
            e->creq = NULL;
            e->connect_cb(req, UV_ECANCELED);
        }
        for (size_t k = 0; k < e->nw; k++) {
            e->w[k].cb(e->w[k].req, UV_ECANCELED);
        }
        if (e->c != NULL) {
            client_closed(e->c);
        }
        if (e->close_cb != NULL) {
            e->close_cb(e->h);
        }
        free(e->w);
        buf_free(&e->inbound);
        rconn_free(e->r);
        free(e);
    }
}

/* Hand ferry what e has for it to read, in pieces, while it reads. */
static void deliver(ep *e)
{
    while (e->reading && !e->closing && (buf_used(&e->inbound) > 0 || e->eof)) {
        uv_buf_t b = {0};
        e->alloc_cb(e->h, 65536, &b);
        L.did = 1;
        if (buf_used(&e->inbound) == 0) {
            int why = e->eof == 1 ? UV_EOF : UV_ECONNRESET;
            e->eof = 0;
            e->reading = 0; /* libuv stops reading at EOF */
            e->read_cb((uv_stream_t *)e->h, why, &b);
            return;
        }
        if (b.len == 0) {
            e->read_cb((uv_stream_t *)e->h, UV_ENOBUFS, &b);
            return;
        }
        size_t n = buf_used(&e->inbound);
        if (L.piece > 0 && n > L.piece) {
            n = L.piece;
        }
        if (n > b.len) {
            n = b.len;
        }
        memcpy(b.base, buf_head(&e->inbound), n);
        buf_consume(&e->inbound, n);
        e->read_cb((uv_stream_t *)e->h, (ssize_t)n, &b);
    }
}

static int client_reads(const struct client *c);

/* The I/O of one turn: connects, write completions, reads. */
static void run_io(void)
{
    for (size_t i = 0; i < L.n; i++) {
        ep *e = L.eps[i];
        if (e->closing) {
            continue;
        }
        if (e->kind == EP_LINK && e->creq != NULL && L.redis_mode != REDIS_FROZEN) {
            uv_connect_t *req = e->creq;
            e->creq = NULL;
            L.did = 1;
            e->connected = L.redis_mode == REDIS_UP;
            e->connect_cb(req, e->connected ? 0 : UV_ECONNREFUSED);
            continue;
        }
        int drains = e->kind == EP_LINK ? L.redis_mode != REDIS_FROZEN
                                        : e->kind == EP_CLIENT && client_reads(e->c);
        if (e->nw > 0 && drains) {
            /* Completions in order; a callback may queue a new write. */
            size_t n = e->nw;
            pending_write *done = malloc(n * sizeof(*done));
            check(done != NULL, "out of memory");
            memcpy(done, e->w, n * sizeof(*done));
            memmove(e->w, e->w + n, (e->nw - n) * sizeof(*e->w));
            e->nw -= n;
            L.did = 1;
            for (size_t k = 0; k < n; k++) {
                done[k].cb(done[k].req, e->write_error ? UV_EPIPE : 0);
            }
            free(done);
        }
        if (e->kind == EP_LINK && L.redis_mode == REDIS_FROZEN) {
            continue;
        }
        deliver(e);
    }
}

/* One turn of the loop; returns whether anything happened. */
static int turn(void)
{
    L.did = 0;
    for (size_t i = 0; i < L.n; i++) {
        ep *e = L.eps[i];
        if (e->kind == EP_PREPARE && e->active && !e->closing) {
            e->prep_cb((uv_prepare_t *)e->h);
        }
    }
    run_io();
    run_closing();
    return L.did;
}

static void settle(void);

/* Time passes: timers due fire once each, as after a stalled loop turn. */
static void advance(uint64_t ms)
{
    L.now += ms;
    for (int fired = 0; fired < MAX_TIMER_FIRES; fired++) {
        ep *next = NULL;
        for (size_t i = 0; i < L.n; i++) {
            ep *e = L.eps[i];
            if (e->kind == EP_TIMER && e->active && !e->closing && e->due <= L.now &&
                (next == NULL || e->due < next->due ||
                 (e->due == next->due && e->order < next->order))) {
                next = e;
            }
        }
        if (next == NULL) {
            break;
        }
        if (next->repeat > 0) {
            next->due = L.now + next->repeat;
        } else {
            next->active = 0;
        }
        next->timer_cb((uv_timer_t *)next->h);
    }
    settle();
}

static int loop_alive(void)
{
    for (size_t i = 0; i < L.n; i++) {
        const ep *e = L.eps[i];
        if (e->closing || e->active || e->nw > 0 || e->creq != NULL) {
            return 1;
        }
    }
    return 0;
}

/* core_run's loop: turns until nothing is left; time jumps to the next
 * timer when a turn does nothing. */
int __wrap_uv_run(uv_loop_t *loop, uv_run_mode mode)
{
    (void)loop;
    (void)mode;
    for (int i = 0; i < 4096 && loop_alive(); i++) {
        if (turn()) {
            continue;
        }
        uint64_t due = 0;
        int any = 0;
        for (size_t k = 0; k < L.n; k++) {
            const ep *e = L.eps[k];
            if (e->kind == EP_TIMER && e->active && (!any || e->due < due)) {
                due = e->due;
                any = 1;
            }
        }
        if (!any) {
            break; /* alive by a write or connect nobody completes: caught after */
        }
        advance(due > L.now ? due - L.now : 0);
    }
    return 0;
}

/* ================================================================ the input */

static const uint8_t *in_p;
static size_t in_left;

static uint8_t take(void)
{
    if (in_left == 0) {
        return 0;
    }
    in_left--;
    return *in_p++;
}

/* ================================================================= clients */

typedef struct client {
    ep *e;         /* its connection, NULL when none */
    uint64_t conn; /* connection number (in its tags) */
    int reading;   /* reads what ferry writes (write callbacks complete) */
    int exact;     /* sent only commands with one reply each: replies are matched */
    buf got;       /* replies not framed yet */
    resp_scanner sc;
    buf expect;     /* exact: the tag (0 = none) of each request, in order */
    size_t nreq;    /* requests sent */
    size_t nreply;  /* replies received */
    uint64_t last;  /* highest tag sequence received */
    size_t quit_at; /* requests up to its QUIT (ferry reads nothing after it); 0 = none */
} client;

static client C[MAX_CLIENTS];
static uint64_t next_conn, next_tag;

static int client_reads(const client *c)
{
    return c != NULL && c->reading;
}

/* Replies a client is due: one per request up to its QUIT. */
static size_t client_due(const client *c)
{
    return c->quit_at != 0 ? c->quit_at : c->nreq;
}

static void client_reset(client *c)
{
    buf_free(&c->got);
    buf_free(&c->expect);
    memset(c, 0, sizeof(*c));
}

static void client_accepted(client *c, ep *e)
{
    client_reset(c);
    c->e = e;
    c->conn = ++next_conn;
    c->reading = 1;
    /* Past client.max_clients it gets an error no request asked for. */
    c->exact = F.nclients + 1 <= (uint64_t)F.cfg->max_clients;
    resp_scanner_init(&c->sc);
    e->c = c;
}

static void client_closed(client *c)
{
    c->e = NULL;
}

/* Tag of a reply: a top-level bulk string "\xfeT<conn>:<seq>". Returns its
 * sequence and sets *conn, or 0. */
static uint64_t reply_tag(const char *p, size_t n, uint64_t *conn)
{
    size_t i = 1;
    if (n < 4 || p[0] != '$') {
        return 0;
    }
    while (i < n && p[i] != '\r') {
        i++;
    }
    i += 2;
    if (i + 2 > n || memcmp(p + i, TAG_LEAD, 2) != 0) {
        return 0;
    }
    unsigned long long a = 0, b = 0;
    char tmp[48];
    size_t m = n - i - 2 < sizeof(tmp) - 1 ? n - i - 2 : sizeof(tmp) - 1;
    memcpy(tmp, p + i + 2, m);
    tmp[m] = '\0';
    if (sscanf(tmp, "%llu:%llu", &a, &b) != 2) {
        return 0;
    }
    *conn = a;
    return b;
}

/* ferry wrote to a client: whole replies, tags in order. */
static void client_got(client *c, const char *p, size_t n)
{
    check(c != NULL, "write to a client stream with no client");
    buf_append(&c->got, p, n);
    for (;;) {
        size_t rl = 0;
        int rc = resp_scan_reply(&c->sc, buf_head(&c->got), buf_used(&c->got), &rl);
        check(rc != RESP_ERR, "ferry wrote a malformed reply to a client");
        if (rc == RESP_AGAIN) {
            break;
        }
        uint64_t conn = 0;
        uint64_t seq = reply_tag(buf_head(&c->got), rl, &conn);
        if (seq != 0) {
            check(conn == c->conn, "a client got a reply to another client's request");
            check(seq > c->last, "a tagged reply out of order or twice");
            c->last = seq;
        }
        if (c->exact) {
            check(c->nreply < client_due(c), "more replies than requests");
            uint64_t want;
            memcpy(&want, c->expect.data + c->nreply * sizeof(want), sizeof(want));
            check(seq == 0 || seq == want, "a reply in the place of another request's");
        }
        c->nreply++;
        buf_consume(&c->got, rl);
    }
    check(buf_used(&c->got) == 0, "ferry wrote part of a reply");
}

/* Queue bytes from a client (ferry reads them when it reads). */
static void client_send(client *c, const void *p, size_t n)
{
    if (c->e != NULL && !c->e->closing) {
        buf_append(&c->e->inbound, p, n);
    }
}

/* A command the harness builds. "T" is the tag, "K" a key, "C" a channel,
 * "N" a small number, "B" a large value; anything else is literal. */
typedef struct cmd_spec {
    const char *argv[7];
    int not_exact; /* more or fewer replies than one (tunnels) */
} cmd_spec;

static const cmd_spec CMDS[] = {
    {{"GET", "T"}, 0},
    {{"SET", "K", "T"}, 0},
    {{"LPUSH", "K", "T"}, 0},
    {{"RPUSH", "K", "T"}, 0},
    {{"ECHO", "T"}, 0},
    {{"INCR", "T"}, 0},
    {{"ZADD", "K", "1", "T"}, 0},
    {{"DEL", "T"}, 0},
    {{"EVAL", "return 1", "0", "T"}, 0},
    {{"EVAL", "#!lua flags=no-writes\nreturn 1", "0", "T"}, 0},
    {{"PUBLISH", "C", "T"}, 0},
    {{"XADD", "K", "*", "f", "T"}, 0},
    {{"SET", "K", "B"}, 0},
    {{"PING"}, 0},
    {{"PING", "T"}, 0},
    {{"MULTI"}, 0},
    {{"EXEC"}, 0},
    {{"DISCARD"}, 0},
    {{"WATCH", "K"}, 0},
    {{"UNWATCH"}, 0},
    {{"SELECT", "N"}, 0},
    {{"BLPOP", "K", "N"}, 0},
    {{"BRPOP", "K", "0"}, 0},
    {{"BLMOVE", "K", "d", "LEFT", "RIGHT", "N"}, 0},
    {{"BZPOPMIN", "K", "0.5"}, 0},
    {{"BRPOPLPUSH", "K", "d", "N"}, 0},
    {{"XREAD", "BLOCK", "N", "STREAMS", "K", "$"}, 0},
    {{"QUIT"}, 0},
    {{"RESET"}, 0},
    {{"HELLO", "N"}, 0},
    {{"HELLO", "2", "AUTH", "default", "pw"}, 0},
    {{"AUTH", "pw"}, 0},
    {{"AUTH", "wrong"}, 0},
    {{"CLIENT", "SETNAME", "x"}, 0},
    {{"CONFIG", "SET", "appendonly", "no"}, 0},
    {{"CONFIG", "GET", "maxmemory"}, 0},
    {{"SHUTDOWN"}, 0},
    {{"NOSUCHCOMMAND", "T"}, 0},
    {{"DBSIZE"}, 0},
    {{"WAIT", "1", "0"}, 0},
    {{"SUBSCRIBE", "C"}, 1},
    {{"PSUBSCRIBE", "c*"}, 1},
    {{"SSUBSCRIBE", "C"}, 1},
    {{"UNSUBSCRIBE"}, 1},
    {{"UNSUBSCRIBE", "C"}, 1},
    {{"PUNSUBSCRIBE"}, 1},
    {{"MONITOR"}, 1},
    {{"CLIENT", "REPLY", "OFF"}, 1},
    {{"CLIENT", "REPLY", "ON"}, 1},
};
#define NCMDS (sizeof(CMDS) / sizeof(CMDS[0]))

/* Append one command (multibulk, or inline when it can be) to b; returns its tag. */
static uint64_t build_cmd(client *c, buf *b, uint8_t which, uint8_t arg, int is_inline)
{
    const cmd_spec *spec = &CMDS[which % NCMDS];
    char tmp[7][64];
    const char *av[7];
    size_t al[7];
    int argc = 0;
    uint64_t tag = 0;
    static char big[6000];

    if (big[0] == '\0') {
        memset(big, 'v', sizeof(big));
    }
    for (; argc < 7 && spec->argv[argc] != NULL; argc++) {
        const char *a = spec->argv[argc];
        av[argc] = a;
        al[argc] = strlen(a);
        if (strcmp(a, "T") == 0) {
            tag = ++next_tag;
            al[argc] = (size_t)snprintf(tmp[argc], sizeof(tmp[argc]), TAG_LEAD "%llu:%llu",
                                        (unsigned long long)c->conn, (unsigned long long)tag);
            av[argc] = tmp[argc];
        } else if (strcmp(a, "K") == 0 || strcmp(a, "C") == 0) {
            al[argc] = (size_t)snprintf(tmp[argc], sizeof(tmp[argc]), "%c%d",
                                        a[0] == 'K' ? 'k' : 'c', arg % 3);
            av[argc] = tmp[argc];
        } else if (strcmp(a, "N") == 0) {
            al[argc] = (size_t)snprintf(tmp[argc], sizeof(tmp[argc]), "%d", (arg >> 2) % 4);
            av[argc] = tmp[argc];
        } else if (strcmp(a, "B") == 0) {
            av[argc] = big;
            al[argc] = 100 + (size_t)arg * 23;
        }
    }
    if (is_inline && strchr(av[0], '\n') == NULL) {
        for (int i = 0; i < argc; i++) {
            if (memchr(av[i], ' ', al[i]) != NULL || memchr(av[i], '\n', al[i]) != NULL) {
                is_inline = 0;
            }
        }
    }
    if (is_inline) {
        for (int i = 0; i < argc; i++) {
            if (i > 0) {
                buf_append(b, " ", 1);
            }
            buf_append(b, av[i], al[i]);
        }
        buf_append(b, "\r\n", 2);
    } else {
        buf_append_count(b, '*', (size_t)argc);
        for (int i = 0; i < argc; i++) {
            buf_append_bulk(b, av[i], al[i]);
        }
    }
    if (spec->not_exact) {
        c->exact = 0;
    }
    if (c->quit_at == 0 && strcmp(spec->argv[0], "QUIT") == 0) {
        c->quit_at = c->nreq + 1;
    }
    buf_append(&c->expect, &tag, sizeof(tag));
    c->nreq++;
    return tag;
}

static client *pick_client(uint8_t op)
{
    client *c = &C[(op >> 4) % MAX_CLIENTS];
    return c->e != NULL && !c->e->closing ? c : NULL;
}

static void connect_client(client *c)
{
    ep *ls = NULL;
    if (c->e != NULL) {
        return;
    }
    for (size_t i = 0; i < L.n; i++) {
        if (L.eps[i]->kind == EP_LISTENER && !L.eps[i]->closing) {
            ls = L.eps[i];
        }
    }
    if (ls == NULL) {
        return;
    }
    L.accepting = c;
    ls->listen_cb((uv_stream_t *)ls->h, 0);
    L.accepting = NULL;
}

/* ============================================================= fake Redis */

typedef struct rqcmd {
    size_t off; /* in rconn.in: its first byte */
    size_t argc;
} rqcmd;

typedef struct rconn {
    buf in;        /* every byte ferry wrote on this link */
    size_t parsed; /* commands end here */
    rqcmd *q;      /* parsed, not answered (from qhead) */
    size_t qhead, qn, qcap;
    int multi;  /* inside MULTI */
    int dirty;  /* MULTI: a command was refused, EXEC aborts */
    buf queued; /* MULTI: the replies EXEC returns */
    size_t nqueued;
    long long subs;  /* subscriptions */
    buf partial;     /* raw bytes written of a reply not complete yet */
    resp_scanner sc; /* frames raw bytes as ferry will */
    int garbled;     /* raw bytes ferry cannot frame were written */
    int monitor;
    int reply_off; /* CLIENT REPLY OFF; 2 = SKIP the next one */
} rconn;

static rconn *rconn_new(void)
{
    rconn *r = calloc(1, sizeof(*r));
    check(r != NULL, "out of memory");
    buf_init(&r->in);
    buf_init(&r->queued);
    buf_init(&r->partial);
    resp_scanner_init(&r->sc);
    return r;
}

static void rconn_free(rconn *r)
{
    if (r == NULL) {
        return;
    }
    buf_free(&r->in);
    buf_free(&r->queued);
    buf_free(&r->partial);
    free(r->q);
    free(r);
}

/* A decimal as Redis' string2ll reads it: no sign, no leading zero. */
static int redis_number(const char *p, size_t n, long long *out)
{
    long long v = 0;
    if (n == 0 || n > 18 || (n > 1 && p[0] == '0')) {
        return 0;
    }
    for (size_t i = 0; i < n; i++) {
        if (p[i] < '0' || p[i] > '9') {
            return 0;
        }
        v = v * 10 + (p[i] - '0');
    }
    *out = v;
    return 1;
}

/* A "<type><number>\r\n" line at p; returns its length, 0 if incomplete. */
static size_t redis_line(const char *p, size_t n, char type, long long *v)
{
    const char *cr = memchr(p, '\r', n);
    if (cr == NULL) {
        check(n < 32, "ferry wrote a malformed length line to Redis");
        return 0;
    }
    size_t len = (size_t)(cr - p);
    if (len + 2 > n) {
        return 0;
    }
    check(p[0] == type, "ferry wrote to Redis what is not multibulk");
    check(cr[1] == '\n', "ferry wrote a length line without CRLF to Redis");
    check(redis_number(p + 1, len - 1, v), "ferry wrote a length Redis does not read");
    return len + 2;
}

/* ferry wrote to a link: frame whole commands as Redis would. */
static void redis_got(ep *e, const char *p, size_t n)
{
    rconn *r = e->r;
    check(r != NULL, "write to a link with no Redis");
    buf_append(&r->in, p, n);
    for (;;) {
        const char *s = r->in.data + r->parsed;
        size_t left = r->in.len - r->parsed, pos;
        long long argc, len;
        if (left == 0) {
            return;
        }
        pos = redis_line(s, left, '*', &argc);
        if (pos == 0) {
            return;
        }
        check(argc > 0, "ferry sent Redis a command with no arguments");
        for (long long i = 0; i < argc; i++) {
            size_t m = redis_line(s + pos, left - pos, '$', &len);
            if (m == 0 || pos + m + (size_t)len + 2 > left) {
                return;
            }
            pos += m + (size_t)len;
            check(s[pos] == '\r' && s[pos + 1] == '\n', "ferry sent Redis a bulk without CRLF");
            pos += 2;
        }
        if (r->qn == r->qcap) {
            r->qcap = r->qcap ? r->qcap * 2 : 8;
            r->q = realloc(r->q, r->qcap * sizeof(*r->q));
            check(r->q != NULL, "out of memory");
        }
        r->q[r->qn].off = r->parsed;
        r->q[r->qn].argc = (size_t)argc;
        r->qn++;
        r->parsed += pos;
    }
}

/* Argument i of a framed command (its length lines were checked); ""
 * past the last. */
static const char *rarg(const rconn *r, const rqcmd *c, size_t i, size_t *len)
{
    if (i >= c->argc) {
        *len = 0;
        return "";
    }
    const char *p = r->in.data + c->off + 1;
    while (*p != '\r') {
        p++;
    }
    p += 2;
    for (size_t k = 0;; k++) {
        size_t l = 0;
        for (p++; *p != '\r'; p++) {
            l = l * 10 + (size_t)(*p - '0');
        }
        p += 2;
        if (k == i) {
            *len = l;
            return p;
        }
        p += l + 2;
    }
}

static int rarg_is(const rconn *r, const rqcmd *c, size_t i, const char *lit)
{
    size_t n;
    if (i >= c->argc) {
        return 0;
    }
    const char *p = rarg(r, c, i, &n);
    return n == strlen(lit) && strncasecmp(p, lit, n) == 0;
}

static void put_bulk(buf *b, const char *p, size_t n)
{
    buf_append_bulk(b, p, n);
}

static int is_blocking_name(const rconn *r, const rqcmd *c)
{
    static const char *const names[] = {"blpop",  "brpop",    "blmove",   "brpoplpush",
                                        "blmpop", "bzpopmin", "bzpopmax", "bzmpop"};
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        if (rarg_is(r, c, 0, names[i])) {
            return 1;
        }
    }
    return rarg_is(r, c, 0, "xread") && rarg_is(r, c, 1, "block");
}

/* MULTI, EXEC, DISCARD, WATCH: what Redis answers inside a MULTI itself. */
static int is_tx_control(const rconn *r, const rqcmd *c)
{
    return rarg_is(r, c, 0, "multi") || rarg_is(r, c, 0, "exec") || rarg_is(r, c, 0, "discard") ||
           rarg_is(r, c, 0, "watch");
}

static const char *const ERRORS[] = {
    "-ERR fake error\r\n",
    "-READONLY You can't write against a read only replica.\r\n",
    "-LOADING Redis is loading the dataset in memory\r\n",
    "-NOREPLICAS Not enough good replicas to write.\r\n",
    "-MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'.\r\n",
    "-UNBLOCKED client unblocked via CLIENT UNBLOCK\r\n",
    ":7\r\n",
    "$-1\r\n",
    "*-1\r\n",
    "*2\r\n$1\r\na\r\n*1\r\n:1\r\n",
};
#define NERRORS (sizeof(ERRORS) / sizeof(ERRORS[0]))

/* What Redis answers to c (variant picks among its answers); the reply
 * goes to out. Returns 0 when c blocks and may not be answered yet. */
static int redis_reply(ep *e, const rqcmd *c, uint8_t variant, int unblock, buf *out)
{
    rconn *r = e->r;
    size_t n;
    const char *a;

    if (rarg_is(r, c, 0, "subscribe") || rarg_is(r, c, 0, "psubscribe") ||
        rarg_is(r, c, 0, "ssubscribe") || rarg_is(r, c, 0, "unsubscribe") ||
        rarg_is(r, c, 0, "punsubscribe") || rarg_is(r, c, 0, "sunsubscribe")) {
        size_t nl;
        const char *name = rarg(r, c, 0, &nl);
        char lower[16];
        int un = rarg_is(r, c, 0, "unsubscribe") || rarg_is(r, c, 0, "punsubscribe") ||
                 rarg_is(r, c, 0, "sunsubscribe");
        for (size_t i = 0; i < nl && i < sizeof(lower) - 1; i++) {
            lower[i] = (char)(name[i] | 0x20);
        }
        if (c->argc == 1 && !un) {
            buf_append_str(out, "-ERR wrong number of arguments\r\n");
            return 1;
        }
        if (c->argc == 1) {
            /* Unsubscribe from all: one reply per subscription, or one with
             * a null channel when there is none. */
            long long k = r->subs > 0 ? r->subs : 1;
            int had = r->subs > 0;
            for (long long i = 0; i < k; i++) {
                r->subs = r->subs > 0 ? r->subs - 1 : 0;
                buf_append_str(out, "*3\r\n");
                put_bulk(out, lower, nl);
                buf_append_str(out, had ? "$2\r\nc0\r\n" : "$-1\r\n");
                buf_append_count(out, ':', (size_t)r->subs);
            }
            return 1;
        }
        for (size_t i = 1; i < c->argc; i++) {
            a = rarg(r, c, i, &n);
            r->subs = un ? (r->subs > 0 ? r->subs - 1 : 0) : r->subs + 1;
            buf_append_str(out, "*3\r\n");
            put_bulk(out, lower, nl);
            put_bulk(out, a, n);
            buf_append_count(out, ':', (size_t)r->subs);
        }
        return 1;
    }
    if (rarg_is(r, c, 0, "reset")) {
        r->multi = 0;
        r->dirty = 0;
        r->subs = 0;
        r->monitor = 0;
        r->reply_off = 0;
        buf_clear(&r->queued);
        r->nqueued = 0;
        buf_append_str(out, "+RESET\r\n");
        return 1;
    }
    if (r->subs > 0) {
        if (rarg_is(r, c, 0, "ping")) {
            buf_append_str(out, "*2\r\n$4\r\npong\r\n$0\r\n\r\n");
        } else if (rarg_is(r, c, 0, "quit")) {
            buf_append_str(out, "+OK\r\n");
        } else {
            buf_append_str(out, "-ERR Can't execute: only (P|S)SUBSCRIBE / (P|S)UNSUBSCRIBE / "
                                "PING / QUIT / RESET are allowed in this context\r\n");
        }
        return 1;
    }
    if (rarg_is(r, c, 0, "multi")) {
        buf_append_str(out, r->multi ? "-ERR MULTI calls can not be nested\r\n" : "+OK\r\n");
        r->multi = 1;
        return 1;
    }
    if (rarg_is(r, c, 0, "exec") || rarg_is(r, c, 0, "discard")) {
        if (!r->multi) {
            buf_append_str(out, "-ERR EXEC without MULTI\r\n");
        } else if (rarg_is(r, c, 0, "discard")) {
            buf_append_str(out, "+OK\r\n");
        } else if (r->dirty) {
            buf_append_str(out, "-EXECABORT Transaction discarded because of previous errors.\r\n");
        } else if (variant % 8 == 7) {
            buf_append_str(out, "*-1\r\n"); /* a WATCH conflict */
        } else {
            buf_append_count(out, '*', r->nqueued);
            buf_append(out, buf_head(&r->queued), buf_used(&r->queued));
        }
        r->multi = 0;
        r->dirty = 0;
        buf_clear(&r->queued);
        r->nqueued = 0;
        return 1;
    }
    if (rarg_is(r, c, 0, "watch") && r->multi) {
        buf_append_str(out, "-ERR WATCH inside MULTI is not allowed\r\n");
        return 1;
    }
    if (is_blocking_name(r, c) && !r->multi && !unblock) {
        return 0;
    }
    buf one;
    buf_init(&one);
    if (rarg_is(r, c, 0, "role")) {
        buf_append_str(&one, variant == 63 ? "*5\r\n$5\r\nslave\r\n$9\r\n127.0.0.1\r\n:6379\r\n"
                                             "$9\r\nconnected\r\n:0\r\n"
                                           : "*3\r\n$6\r\nmaster\r\n:0\r\n*0\r\n");
    } else if (rarg_is(r, c, 0, "info")) {
        static const char *const infos[] = {
            "# Persistence\r\nloading:0\r\naof_enabled:1\r\naof_rewrite_in_progress:0\r\n"
            "aof_rewrite_scheduled:0\r\naof_last_write_status:ok\r\n"
            "aof_last_bgrewrite_status:ok\r\n",
            "# Persistence\r\nloading:0\r\naof_enabled:0\r\naof_rewrite_in_progress:0\r\n"
            "aof_rewrite_scheduled:0\r\naof_last_write_status:ok\r\n"
            "aof_last_bgrewrite_status:ok\r\n",
            "# Persistence\r\nloading:0\r\naof_enabled:1\r\naof_rewrite_in_progress:1\r\n"
            "aof_rewrite_scheduled:0\r\naof_last_write_status:ok\r\n"
            "aof_last_bgrewrite_status:ok\r\n",
            "# Persistence\r\nloading:1\r\naof_enabled:1\r\n",
        };
        const char *t = infos[variant % 16 < 12 ? 0 : variant % 4];
        put_bulk(&one, t, strlen(t));
    } else if (rarg_is(r, c, 0, "wait")) {
        buf_append_str(&one, variant % 16 >= 13 ? ":0\r\n" : ":1\r\n");
    } else if (rarg_is(r, c, 0, "ping")) {
        if (c->argc > 1) {
            a = rarg(r, c, 1, &n);
            put_bulk(&one, a, n);
        } else {
            buf_append_str(&one, "+PONG\r\n");
        }
    } else if (rarg_is(r, c, 0, "monitor")) {
        r->monitor = 1;
        buf_append_str(&one, "+OK\r\n");
    } else if (rarg_is(r, c, 0, "quit")) {
        buf_append_str(&one, "+OK\r\n");
        e->eof = 1;
    } else if (rarg_is(r, c, 0, "blmove") || rarg_is(r, c, 0, "brpoplpush")) {
        buf_append_str(&one, variant & 1 ? "$-1\r\n" : "$1\r\nv\r\n");
    } else if (is_blocking_name(r, c)) {
        if (variant & 1) {
            buf_append_str(&one, "*-1\r\n");
        } else {
            a = rarg(r, c, 1, &n);
            buf_append_str(&one, "*2\r\n");
            put_bulk(&one, a, n);
            buf_append_str(&one, "$1\r\nv\r\n");
        }
    } else {
        int tagged = 0;
        for (size_t i = 1; i < c->argc && !tagged; i++) {
            a = rarg(r, c, i, &n);
            if (n > 2 && memcmp(a, TAG_LEAD, 2) == 0) {
                put_bulk(&one, a, n);
                tagged = 1;
            }
        }
        if (!tagged) {
            buf_append_str(&one, "+OK\r\n");
        }
    }
    if (r->multi && rarg_is(r, c, 0, "wait") && rarg_is(r, c, 2, "1000")) {
        /* ferry's own WAIT (a client of this harness sends WAIT 1 0) inside
         * the MULTI of a client that sent nothing raw. */
        const link *l = e->h->data;
        const ep *owner = l->owner != NULL ? ep_find(&l->owner->io.h) : NULL;
        check(owner == NULL || owner->c == NULL || !owner->c->exact,
              "ferry queued its own WAIT inside a client's MULTI");
    }
    if (r->multi && !rarg_is(r, c, 0, "watch") && !rarg_is(r, c, 0, "quit")) {
        buf_append(&r->queued, buf_head(&one), buf_used(&one));
        r->nqueued++;
        buf_append_str(out, "+QUEUED\r\n");
    } else {
        buf_append(out, buf_head(&one), buf_used(&one));
    }
    buf_free(&one);
    if (rarg_is(r, c, 0, "client") && rarg_is(r, c, 1, "reply")) {
        r->reply_off = rarg_is(r, c, 2, "off") ? 1 : rarg_is(r, c, 2, "skip") ? 2 : 0;
        if (r->reply_off != 0) {
            buf_clear(out); /* OFF and SKIP are not answered */
        }
    }
    return 1;
}

/* Answer up to n commands waiting on e. flavor: with (flavor & 3) == 0
 * the first gets an error or an odd reply instead, else flavor >> 2 picks
 * among its normal answers; the rest are answered normally. */
static void redis_answer(ep *e, size_t n, uint8_t flavor, int unblock)
{
    rconn *r = e->r;
    for (size_t i = 0; i < n && r->qhead < r->qn; i++) {
        if (e->closing || !e->connected || e->eof != 0 || buf_used(&r->partial) > 0) {
            return; /* gone, or in the middle of a raw reply */
        }
        const rqcmd *c = &r->q[r->qhead];
        buf out;
        buf_init(&out);
        const char *err = ERRORS[(flavor >> 2) % NERRORS];
        if (i == 0 && (flavor & 3) == 0 && r->subs == 0 &&
            (!r->multi || (err[0] == '-' && !is_tx_control(r, c)))) {
            /* Inside MULTI only an error: Redis refuses the command instead
             * of queuing it, and EXEC then aborts the transaction. */
            buf_append_str(&out, err);
            r->dirty |= r->multi;
        } else if (!redis_reply(e, c, (uint8_t)(i == 0 ? flavor >> 2 : 0), unblock, &out)) {
            buf_free(&out);
            return; /* blocked: later commands wait behind it */
        }
        r->qhead++;
        if (r->reply_off == 2 && !(rarg_is(r, c, 0, "client") && rarg_is(r, c, 1, "reply"))) {
            r->reply_off = 0;
            buf_clear(&out);
        } else if (r->reply_off == 1) {
            buf_clear(&out);
        }
        buf_append(&e->inbound, buf_head(&out), buf_used(&out));
        buf_free(&out);
    }
}

/* Redis writes raw bytes: what ferry will frame as whole replies answers
 * that many commands; an incomplete one waits for more raw bytes. */
static void redis_raw(ep *e, const char *p, size_t n)
{
    rconn *r = e->r;
    size_t off = 0, rl;
    if (e->closing || !e->connected || e->eof != 0) {
        return;
    }
    buf_append(&e->inbound, p, n);
    buf_append(&r->partial, p, n);
    while (!r->garbled) {
        int rc =
            resp_scan_reply(&r->sc, buf_head(&r->partial) + off, buf_used(&r->partial) - off, &rl);
        if (rc == RESP_AGAIN) {
            break;
        }
        if (rc == RESP_ERR) {
            r->garbled = 1; /* ferry closes the link when it reads this */
            break;
        }
        off += rl;
        if (r->qhead < r->qn) {
            r->qhead++;
        }
    }
    buf_consume(&r->partial, r->garbled ? buf_used(&r->partial) : off);
}

/* The links Redis sees, open ones only; pick one by a byte. */
static ep *pick_link(uint8_t b)
{
    size_t n = 0;
    for (size_t i = 0; i < L.n; i++) {
        n += L.eps[i]->kind == EP_LINK && !L.eps[i]->closing;
    }
    if (n == 0) {
        return NULL;
    }
    size_t k = b % n;
    for (size_t i = 0; i < L.n; i++) {
        if (L.eps[i]->kind == EP_LINK && !L.eps[i]->closing && k-- == 0) {
            return L.eps[i];
        }
    }
    return NULL;
}

/* =============================================================== invariants */

static void check_accounting(void)
{
    size_t mem = 0, held = 0;
    uint64_t n = 0;
    list_node *node, *m;
    list_foreach(node, &F.sessions)
    {
        session *s = list_entry(node, session, node);
        size_t req = 0, count = 0;
        uint64_t seq = 0;
        n++;
        check(s->state != SESSION_CLOSING, "a closing session is still listed");
        mem += session_mem(s);
        held += session_extra_r(s)->held_bytes;
        check(s->buf_mem == session_extra_r(s)->in.cap + outq_mem(&s->out),
              "a session's buffer memory is not what its buffers hold");
        list_foreach(m, &s->requests)
        {
            const request *r = list_entry(m, request, sq);
            check(r->s == s, "a queued request names another session");
            check(count == 0 || r->seq > seq, "a session's requests out of order");
            seq = r->seq;
            req += r->charge;
            count++;
        }
        check(count == s->nrequests, "a session's request count is off");
        check(req == s->req_mem, "a session's request memory is off");
    }
    check(n == F.nclients, "ferry's client count is off");
    check(mem == F.clients_mem, "ferry's client memory is not the sum of its sessions'");
    check(held == F.held_bytes, "ferry's held bytes are not the sum of its sessions'");
}

/* Run turns until nothing moves. */
static void settle(void)
{
    int i = 0;
    while (i < MAX_TURNS && turn()) {
        i++;
    }
    /* Every turn did something and nothing waits for time or input:
     * ferry spins (a real loop would burn a core doing this). */
    check(i < MAX_TURNS, "busy loop: ferry keeps acting with nothing new happening");
    if (!F.closed) {
        check_accounting();
    }
}

/* ================================================================== configs */

#define NCONFIGS 64
static config *configs[NCONFIGS];

static config *make_config(unsigned v)
{
    config *cfg = calloc(1, sizeof(*cfg));
    check(cfg != NULL, "out of memory");
    config_defaults(cfg);
    cfg->has_redis = 1;
    check(config_parse_addr("unix:/nonexistent/ferry-fuzz-redis.sock", &cfg->redis_addr) == 0,
          "redis address");
    cfg->stats_enabled = 0;
    cfg->max_clients = 2 + (v & 1);
    cfg->replicas_ack = (v >> 1) & 1;
    if (v & 4) { /* tight limits */
        cfg->max_pipeline = 4;
        cfg->max_pending_bytes = 3000;
        cfg->max_query_bytes = 1024;
        cfg->max_inline_len = 64;
        cfg->max_bulk_len = 2048;
        cfg->max_args = 8;
        cfg->output_limit.hard = 8192;
        cfg->output_limit.soft = 1024;
        cfg->output_limit.soft_seconds = 1;
        cfg->pubsub_output_limit.hard = 4096;
        cfg->pubsub_output_limit.soft = 1024;
        cfg->pubsub_output_limit.soft_seconds = 1;
        cfg->max_memory = 8000;
        cfg->request_timeout_ms = 500;
        cfg->idle_timeout_ms = 3000;
        cfg->hold_max_bytes = 300;
        cfg->hold_timeout_ms = 2000;
    }
    if (v & 8) {
        cfg->client_password = strdup("pw");
        cfg->redis_password = strdup("rpw");
    }
    if (v & 16) {
        cfg->shared_links = 2;
        cfg->require_aof = 1;
        cfg->persist_config = 1;
        cfg->health_timeout_ms = 0;
    }
    /* One configuration in 64 formats debug lines (to /dev/null): enough
     * to check them, and the rest run faster. */
    cfg->log_level = v == NCONFIGS - 1 ? LOG_DEBUG : LOG_ERROR + 1;
    return cfg;
}

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static struct sigaction fuzzer_sig[3]; /* SIGTERM, SIGINT, SIGHUP as libFuzzer set them */

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    trace = getenv("FUZZ_SESSION_TRACE") != NULL;
    /* Debug lines are formatted (and checked by the sanitizers) but go nowhere. */
    log_init(LOG_ERROR + 1, trace ? NULL : "/dev/null");
    for (unsigned v = 0; v < NCONFIGS; v++) {
        configs[v] = make_config(v);
    }
    /* ferry's close ignores the stop signals from then on (its process is
     * ending); this one goes on, with libFuzzer's handlers put back. */
    sigaction(SIGTERM, NULL, &fuzzer_sig[0]);
    sigaction(SIGINT, NULL, &fuzzer_sig[1]);
    sigaction(SIGHUP, NULL, &fuzzer_sig[2]);
    return 0;
}

/* ================================================================ the run */

static const uint64_t STEPS_MS[] = {1, 10, 50, 100, 250, 500, 1000, 2000, 5000, 12000};

static void step(uint8_t op)
{
    client *c = pick_client(op);
    ep *e;
    uint8_t a, b, k;

    if (trace) {
        fprintf(stderr, "op %u (client %u) at %llu ms\n", op % 16, (op >> 4) % MAX_CLIENTS,
                (unsigned long long)(L.now - START_MS));
    }
    switch (op % 16) {
    case 0:
    case 1: { /* a client sends one command */
        a = take();
        b = take();
        if (c != NULL) {
            buf cmd;
            buf_init(&cmd);
            build_cmd(c, &cmd, a, b, (b & 0x80) != 0);
            client_send(c, buf_head(&cmd), buf_used(&cmd));
            buf_free(&cmd);
        }
        break;
    }
    case 2: { /* a pipeline of commands in one write */
        k = take() % 8 + 1;
        buf cmd;
        buf_init(&cmd);
        for (uint8_t i = 0; i < k; i++) {
            a = take();
            b = take();
            if (c != NULL) {
                build_cmd(c, &cmd, a, b, (b & 0x80) != 0);
            }
        }
        if (c != NULL) {
            client_send(c, buf_head(&cmd), buf_used(&cmd));
        }
        buf_free(&cmd);
        break;
    }
    case 3: { /* a client sends raw bytes (never a tag: 0xfe is replaced) */
        char raw[256];
        k = take();
        for (uint8_t i = 0; i < k; i++) {
            raw[i] = (char)take();
            if ((uint8_t)raw[i] == 0xfe) {
                raw[i] = (char)0xfd;
            }
        }
        if (c != NULL && k > 0) {
            c->exact = 0;
            client_send(c, raw, k);
        }
        break;
    }
    case 4:
    case 5: /* Redis answers on one link */
        a = take();
        b = take();
        k = take();
        e = pick_link(a);
        if (e != NULL) {
            redis_answer(e, b % 4 + 1, k, (b & 4) != 0);
        }
        break;
    case 6: /* Redis answers everything it can, everywhere */
        for (size_t i = 0; i < L.n; i++) {
            if (L.eps[i]->kind == EP_LINK) {
                redis_answer(L.eps[i], SIZE_MAX, 1, (op & 0x10) != 0);
            }
        }
        break;
    case 7: { /* Redis writes raw bytes on one link (a reply or garbage) */
        char raw[256];
        a = take();
        k = take();
        for (uint8_t i = 0; i < k; i++) {
            raw[i] = (char)take();
            if ((uint8_t)raw[i] == 0xfe) {
                raw[i] = (char)0xfd;
            }
        }
        e = pick_link(a);
        if (e != NULL) {
            redis_raw(e, raw, k);
        }
        break;
    }
    case 8: /* Redis closes a link, or every link (the master goes away) */
        a = take();
        for (size_t i = 0; i < L.n; i++) {
            e = L.eps[i];
            if (e->kind == EP_LINK && (a >= 0xf0 || e == pick_link(a)) && e->eof == 0) {
                e->eof = (a & 1) + 1;
            }
        }
        break;
    case 9: /* Redis accepts, refuses or swallows new connections */
        L.redis_mode = take() % 3;
        break;
    case 10: /* time passes */
        advance(STEPS_MS[take() % (sizeof(STEPS_MS) / sizeof(STEPS_MS[0]))]);
        break;
    case 11: /* a client stops or starts reading its replies */
        if (c != NULL) {
            c->reading = !c->reading;
        }
        break;
    case 12: /* a client goes away: EOF, reset, or its writes fail */
        a = take();
        if (c != NULL) {
            if (a % 3 == 2) {
                c->e->write_error = 1;
            } else {
                c->e->eof = a % 3 + 1;
            }
        }
        break;
    case 13: /* a client connects */
        connect_client(&C[(op >> 4) % MAX_CLIENTS]);
        break;
    case 14: { /* Redis pushes a message on a subscribed or monitoring link */
        a = take();
        b = take();
        e = pick_link(a);
        if (e != NULL && e->connected && e->eof == 0 && (e->r->subs > 0 || e->r->monitor)) {
            size_t n = (size_t)b * b / 4 + 1;
            char *payload = malloc(n);
            check(payload != NULL, "out of memory");
            memset(payload, 'm', n);
            if (e->r->monitor) {
                buf_append_str(&e->inbound, "+1700000000.000000 [0 127.0.0.1:1] \"get\"\r\n");
            } else {
                buf_append_str(&e->inbound, "*3\r\n$7\r\nmessage\r\n$2\r\nc0\r\n");
                buf_append_bulk(&e->inbound, payload, n);
            }
            free(payload);
        }
        break;
    }
    case 15: /* reads come in pieces of this size (0: whole) */
        a = take();
        L.piece = a < 64 ? a : 0;
        break;
    }
    settle();
}

/* Redis heals and answers everything; every client reads. */
static void drain(void)
{
    L.redis_mode = REDIS_UP;
    for (int i = 0; i < MAX_CLIENTS; i++) {
        C[i].reading = 1;
    }
    for (int round = 0; round < DRAIN_ROUNDS; round++) {
        for (size_t i = 0; i < L.n; i++) {
            ep *e = L.eps[i];
            if (e->kind == EP_LINK && e->r->garbled + buf_used(&e->r->partial) > 0 && e->eof == 0) {
                e->eof = 1; /* Redis stopped mid-reply: the connection is broken */
            }
            if (e->kind == EP_LINK) {
                redis_answer(e, SIZE_MAX, 1, 1);
            }
        }
        settle();
        int done = 1;
        for (int i = 0; i < MAX_CLIENTS; i++) {
            const client *c = &C[i];
            if (c->e != NULL && c->exact && c->nreply < client_due(c)) {
                done = 0;
            }
        }
        if (done) {
            return;
        }
        advance(round < 8 ? 100 : 1000);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static uv_loop_t loop;
    config *cfg = configs[(size > 0 ? data[0] : 0) % NCONFIGS];

    in_p = size > 0 ? data + 1 : data;
    in_left = size > 0 ? size - 1 : 0;
    memset(&L, 0, sizeof(L));
    L.now = START_MS;
    next_conn = next_tag = 0;
    for (int i = 0; i < MAX_CLIENTS; i++) {
        client_reset(&C[i]);
    }
    log_init(trace ? LOG_DEBUG : cfg->log_level, NULL);

    check(core_init(&F, &loop, cfg, &no_tls, NULL) == 0, "core_init failed");
    connect_client(&C[0]);
    settle();
    while (in_left > 0) {
        step(take());
    }

    /* Every client that sent only one-reply commands and is still there
     * gets a reply to each once Redis is healthy. */
    drain();
    for (int i = 0; i < MAX_CLIENTS; i++) {
        const client *c = &C[i];
        if (trace) {
            fprintf(stderr, "client %d: %s, %zu requests, %zu replies, due %zu, %s\n", i,
                    c->e != NULL ? "connected" : "gone", c->nreq, c->nreply, client_due(c),
                    c->exact ? "exact" : "not exact");
        }
        if (trace && c->e != NULL) {
            const session *ss = c->e->h->data;
            list_node *m;
            fprintf(stderr, "  session %llu: state %d tx %d tunnel %d inflight %zu dlink %p\n",
                    (unsigned long long)ss->id, ss->state, ss->tx, ss->tunnel, ss->inflight,
                    (void *)ss->dlink);
            list_foreach(m, &ss->requests)
            {
                const request *r = list_entry(m, request, sq);
                fprintf(stderr, "  request %llu: state %d route %d %s\n",
                        (unsigned long long)r->seq, r->state, r->route,
                        r->cmd != NULL ? r->cmd->name : "?");
            }
        }
        if (c->e != NULL && c->exact) {
            check(c->nreply == client_due(c), "a request was never answered");
        }
    }

    /* Stop as SIGTERM does: the graceful path, then the forced one. */
    core_stop(&F, "end of input");
    settle();
    advance(50); /* one tick: closes everything if no client is left */
    if (!F.closed) {
        advance(cfg->shutdown_timeout_ms); /* the shutdown timeout */
    }
    check(F.closed, "ferry did not stop");
    sigaction(SIGTERM, &fuzzer_sig[0], NULL);
    sigaction(SIGINT, &fuzzer_sig[1], NULL);
    sigaction(SIGHUP, &fuzzer_sig[2], NULL);
    check(F.nclients == 0 && F.clients_mem == 0, "memory still counted for clients after stop");
    check(F.held_bytes == 0, "held bytes left after stop");
    core_run(&F);
    check(L.n == 0, "a handle was left open");
    for (int i = 0; i < MAX_CLIENTS; i++) {
        client_reset(&C[i]);
    }
    free(L.eps);
    L.eps = NULL;
    return 0;
}
