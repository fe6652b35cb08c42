/* stats_port.c - the stats port: a listener on ferry's loop that answers a
 * silent (plain) connection with the JSON document, nutcracker style, and an
 * HTTP GET with /metrics, /stats or /healthz, or / (the live page:
 * proxy/ops/page.html, built in, which polls /stats; a text summary inside it
 * serves a browser without JavaScript). The figures are stats.c's.
 *
 *   accept --> READING --(200 ms of silence, or not HTTP)--> JSON --+
 *                 \--(GET request line + headers)--> route ---------+
 *                                                                   v
 *              closed <--(peer EOF or linger timeout)-- LINGERING <-- WRITING
 *
 * A request that asks for it (Connection: keep-alive, as browsers send) is
 * answered with the connection kept: WRITING goes back to READING, where
 * the next request is awaited for STATS_KEEPALIVE_MS and silence never
 * means a plain connection again. The page's polls then reuse one
 * connection: a browser's spare connection, opened ahead and left silent,
 * would get the plain JSON and fail the request it is later used for.
 */
#include "stats.h"
#include "stats_int.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "clustermap.h"
#include "ferry.h"
#include "lease.h"
#include "log.h"
#include "outage.h"
#include "queues.h"
#include "replicas.h"
#include "sentinel.h"
#include "server.h"
#include "session.h"
#include "tls.h"
#include "upstream.h"
#include "workers.h"

#define STATS_MAX_CONNS 64            /* stats connections open at once */
#define STATS_MAX_REQUEST 8192        /* bytes of an HTTP request line and headers */
#define STATS_PLAIN_WAIT_MS 200       /* silence after which a connection is plain */
#define STATS_REQUEST_TIMEOUT_MS 5000 /* an HTTP request must be complete by then */
#define STATS_WRITE_TIMEOUT_MS 5000   /* the response must be written by then */
#define STATS_LINGER_MS 1000          /* after the response, wait this long for EOF */
#define STATS_KEEPALIVE_MS 5000       /* a kept connection waits this long for a request */
#define STATS_GATHER_MS 100           /* at most this long for every loop's figures */
#define STATS_GATHER_POLL_MS 1        /* how often a gathering request looks */

/* The page (generated from proxy/ops/page.html at build time). */
extern const char ferry_page_html[];
extern const size_t ferry_page_html_len;
#define PAGE_SUMMARY_MARK "<!--FERRY_SUMMARY-->"

/* Where a stats connection is; see the diagram above. */
typedef enum sconn_state {
    SCONN_READING = 0, /* waiting for a request, or for silence */
    SCONN_GATHERING,   /* a request for figures waits for every loop to publish */
    SCONN_WRITING,     /* the response is being written */
    SCONN_LINGERING,   /* written and shut down; reading until the peer closes */
    SCONN_CLOSING      /* uv_close called on its handles */
} sconn_state;

struct stats_server;

typedef struct sconn {
    struct stats_server *sv; /* the port it came in on */
    uint64_t id;             /* for logs */
    char peer[64];           /* peer address, for logs */
    union {
        uv_handle_t h;
        uv_stream_t s;
        uv_tcp_t tcp;
        uv_pipe_t pipe;
    } io;               /* the connection */
    uv_timer_t timer;   /* plain-wait, request, write and linger timeouts */
    uv_write_t wreq;    /* the response write */
    uv_shutdown_t sreq; /* half-close after the response */
    list_node node;     /* in sv->conns until closed */
    buf in;             /* request bytes (bounded by STATS_MAX_REQUEST) */
    buf out;            /* the response, alive until the write callback */
    sconn_state state;  /* see sconn_state; set by sconn_set_state only */
    int route;          /* SCONN_GATHERING: what to answer (sconn_route) */
    uint64_t gen;       /* SCONN_GATHERING: the workers' publish request */
    uint64_t deadline;  /* SCONN_GATHERING: answer with what is there by then */
    int http_wait;      /* a partial HTTP request got the longer timeout */
    int keep_alive;     /* the request being answered asked to keep the connection */
    int kept;           /* it carried a request already: silence is not plain */
    int nhandles;       /* handles not yet closed (freed at 0) */
} sconn;

typedef struct stats_server {
    ferry *f;        /* context */
    server_io io;    /* listening socket */
    int is_unix;     /* pipe or tcp */
    int open;        /* listener initialised and not closed */
    char name[300];  /* address, for logs */
    list_node conns; /* open sconns */
    int nconns;      /* entries in conns */
} stats_server;

static void sconn_close(sconn *c, const char *reason);
static void sconn_close_cb(uv_handle_t *h);
static void sconn_alloc_cb(uv_handle_t *h, size_t hint, uv_buf_t *b);
static void sconn_read_cb(uv_stream_t *st, ssize_t nread, const uv_buf_t *b);
static void sconn_timer_cb(uv_timer_t *t);
static void sconn_write_cb(uv_write_t *w, int status);
static void sconn_shutdown_cb(uv_shutdown_t *r, int status);

/* ------------------------------------------------------------ stats port */

static void sconn_set_state(sconn *c, sconn_state st)
{
    c->state = st;
}

static void sconn_close(sconn *c, const char *reason)
{
    if (c->state == SCONN_CLOSING) {
        return;
    }
    sconn_set_state(c, SCONN_CLOSING);
    log_debug("stats %llu %s closed: %s", (unsigned long long)c->id, c->peer, reason);
    uv_timer_stop(&c->timer);
    list_del(&c->node);
    c->sv->nconns--;
    uv_close(&c->io.h, sconn_close_cb);
    uv_close((uv_handle_t *)&c->timer, sconn_close_cb);
}

static void sconn_close_cb(uv_handle_t *h)
{
    sconn *c = h->data;
    if (--c->nhandles > 0) {
        return;
    }
    buf_free(&c->in);
    buf_free(&c->out);
    free(c);
}

/* Send c->out, then half-close and linger until the peer closes (closing
 * with unread bytes would reset the connection and could lose the reply). */
static void sconn_send(sconn *c)
{
    uv_buf_t b = uv_buf_init(c->out.data, (unsigned)c->out.len);
    sconn_set_state(c, SCONN_WRITING);
    buf_clear(&c->in);
    uv_timer_start(&c->timer, sconn_timer_cb, STATS_WRITE_TIMEOUT_MS, 0);
    c->wreq.data = c;
    int rc = uv_write(&c->wreq, &c->io.s, &b, 1, sconn_write_cb);
    if (rc < 0) {
        sconn_close(c, uv_strerror(rc));
    }
}

static void sconn_write_cb(uv_write_t *w, int status)
{
    sconn *c = w->data;
    if (c->state == SCONN_CLOSING) {
        return;
    }
    if (status < 0) {
        sconn_close(c, uv_strerror(status));
        return;
    }
    buf_free(&c->out);
    if (c->keep_alive) {
        c->keep_alive = 0;
        c->kept = 1;
        c->http_wait = 0;
        sconn_set_state(c, SCONN_READING);
        uv_timer_start(&c->timer, sconn_timer_cb, STATS_KEEPALIVE_MS, 0);
        return;
    }
    sconn_set_state(c, SCONN_LINGERING);
    c->sreq.data = c;
    int rc = uv_shutdown(&c->sreq, &c->io.s, sconn_shutdown_cb);
    if (rc < 0) {
        sconn_close(c, uv_strerror(rc));
        return;
    }
    uv_timer_start(&c->timer, sconn_timer_cb, STATS_LINGER_MS, 0);
}

static void sconn_shutdown_cb(uv_shutdown_t *r, int status)
{
    sconn *c = r->data;
    if (c->state != SCONN_CLOSING && status < 0) {
        sconn_close(c, uv_strerror(status));
    }
}

/* Answer a plain connection: the JSON document, no HTTP header. */
static void sconn_reply_plain(sconn *c)
{
    buf_clear(&c->out);
    stats_render_json(c->sv->f, &c->out);
    log_debug("stats %llu %s: plain connection, JSON sent", (unsigned long long)c->id, c->peer);
    sconn_send(c);
}

static void sconn_reply_http(sconn *c, int code, const char *ctype, const buf *body)
{
    const char *reason = code == 200   ? "OK"
                         : code == 400 ? "Bad Request"
                         : code == 404 ? "Not Found"
                         : code == 405 ? "Method Not Allowed"
                         : code == 431 ? "Request Header Fields Too Large"
                                       : "Service Unavailable";
    buf_clear(&c->out);
    stats_printf(&c->out,
                 "HTTP/1.%d %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n"
                 "Cache-Control: no-store\r\nConnection: %s\r\n\r\n",
                 c->keep_alive, code, reason, ctype, buf_used(body),
                 c->keep_alive ? "keep-alive" : "close");
    buf_append(&c->out, buf_head(body), buf_used(body));
    sconn_send(c);
}

/* /healthz: 200 while the master is UP and ferry is not stopping (the body
 * says DEGRADED when fewer than a majority of the sentinels answer). */
static int healthz(ferry *f, buf *body)
{
    const upstream *up = f->up;
    if (f->stopping) {
        buf_append_str(body, "STOPPING: ferry is shutting down\n");
        return 503;
    }
    if (up == NULL) {
        buf_append_str(body, "DOWN: no master configured\n");
        return 503;
    }
    if (f->cluster != NULL) {
        return stats_cluster_healthz(f, body);
    }
    if (up->state == UP_UP && f->sentinel != NULL && !sentinel_quorum_ok(f->sentinel)) {
        /* Still serving, but a failover could not be followed now. */
        stats_printf(body,
                     "OK: master %s is UP; DEGRADED: %d of %d known sentinel(s) reachable, "
                     "fewer than a majority: ferry keeps this master while it answers ROLE "
                     "master\n",
                     upstream_name(up), sentinel_reachable(f->sentinel),
                     sentinel_known(f->sentinel));
        return 200;
    }
    if (up->state == UP_UP) {
        stats_printf(body, "OK: master %s is UP\n", upstream_name(up));
        return 200;
    }
    stats_printf(body, "%s: master %s for %llu ms: %s\n", upstream_state_name(up->state),
                 up->target_set ? upstream_name(up) : "(none known)",
                 (unsigned long long)(uv_now(f->loop) - up->down_since_ms),
                 up->switches > 0 ? up->last_reason : "not connected yet");
    if (f->outage != NULL) {
        ferry_stats st;
        memset(&st, 0, sizeof(st));
        outage_stats(f, &st);
        stats_printf(body, "fallback store: %s, %llu row(s) pending%s\n",
                     up->state == UP_DOWN ? "taking queue writes" : "standing by",
                     (unsigned long long)st.fallback_pending,
                     st.fallback_commit_errors > 0 ? ", commit errors seen (see log)" : "");
    }
    return 503;
}

/* Append s to b with &, < and > escaped (text inside the page's <pre>). */
static void html_escape(buf *b, const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (s[i] == '&') {
            buf_append_str(b, "&amp;");
        } else if (s[i] == '<') {
            buf_append_str(b, "&lt;");
        } else if (s[i] == '>') {
            buf_append_str(b, "&gt;");
        } else {
            buf_append(b, &s[i], 1);
        }
    }
}

/* The figures in a few lines of text, for the page without JavaScript. */
static void page_summary(ferry *f, buf *text)
{
    ferry_stats *st = xmalloc(sizeof(*st));
    queue_key_view v;
    healthz(f, text);
    stats_take(f, st);
    stats_printf(text, "epoch %llu, %llu failover(s)", (unsigned long long)st->epoch,
                 (unsigned long long)st->failovers);
    if (st->failovers > 0) {
        stats_printf(text, ", the last one %llu ms: %s", (unsigned long long)st->failover_last_ms,
                     st->failover_last_reason);
    }
    buf_append_str(text, "\n");
    stats_printf(text, "clients %llu, commands %llu, held bytes %llu, loops %llu\n",
                 (unsigned long long)st->curr_connections, (unsigned long long)st->commands_total,
                 (unsigned long long)st->held_bytes, (unsigned long long)st->workers);
    stats_printf(text, "AOF asserted on the master: %s; replicas enforced %llu of %llu\n",
                 st->aof_enforced ? "yes" : "no", (unsigned long long)st->replicas_enforced,
                 (unsigned long long)st->replicas_known);
    if (st->sentinels_configured > 0) {
        stats_printf(text, "sentinels reachable %llu of %llu known: quorum %s\n",
                     (unsigned long long)st->sentinels_reachable,
                     (unsigned long long)st->sentinels_known,
                     st->sentinel_quorum_ok ? "OK" : "LOST");
    }
    stats_printf(text, "fallback store: %llu row(s) pending, oldest %llu ms, %llu replayed\n",
                 (unsigned long long)st->fallback_pending,
                 (unsigned long long)st->fallback_oldest_ms,
                 (unsigned long long)st->fallback_replayed);
    stats_printf(text, "memory held for clients %llu of %llu bytes (0 = no limit)\n",
                 (unsigned long long)st->memory_clients, (unsigned long long)st->max_memory);
    if (f->cluster != NULL) {
        stats_cluster_text(f, text);
    }
    for (size_t i = 0; queues_key(f, i, &v) && i < 50; i++) {
        stats_printf(text, "queue %s (%s): %llu\n", v.key, v.type, (unsigned long long)v.length);
    }
    free(st);
}

/* GET /: the built-in page with the text summary in its <noscript>. */
static void render_page(ferry *f, buf *body)
{
    const char *mark = strstr(ferry_page_html, PAGE_SUMMARY_MARK);
    if (mark == NULL) {
        buf_append(body, ferry_page_html, ferry_page_html_len);
        return;
    }
    buf text;
    buf_init(&text);
    page_summary(f, &text);
    buf_append(body, ferry_page_html, (size_t)(mark - ferry_page_html));
    html_escape(body, buf_head(&text), buf_used(&text));
    const char *rest = mark + strlen(PAGE_SUMMARY_MARK);
    buf_append(body, rest, ferry_page_html_len - (size_t)(rest - ferry_page_html));
    buf_free(&text);
}

/* What a request asks for. */
enum {
    ROUTE_PLAIN = 0, /* not HTTP: the JSON figures, as is */
    ROUTE_METRICS,   /* GET /metrics */
    ROUTE_STATS,     /* GET /stats */
    ROUTE_HEALTHZ,   /* GET /healthz */
    ROUTE_PAGE,      /* GET /: the live page */
    ROUTE_NOT_GET,   /* 405 */
    ROUTE_UNKNOWN    /* 404 */
};

/* The route of a complete request: method and target are NUL-terminated. */
static int sconn_route(sconn *c, const char *method, char *target)
{
    char *q = strchr(target, '?');
    if (q != NULL) {
        *q = '\0';
    }
    log_debug("stats %llu %s: %s %s", (unsigned long long)c->id, c->peer, method, target);
    if (strcmp(method, "GET") != 0) {
        return ROUTE_NOT_GET;
    }
    if (strcmp(target, "/metrics") == 0) {
        return ROUTE_METRICS;
    }
    if (strcmp(target, "/stats") == 0) {
        return ROUTE_STATS;
    }
    if (strcmp(target, "/healthz") == 0) {
        return ROUTE_HEALTHZ;
    }
    if (strcmp(target, "/") == 0 || strcmp(target, "/index.html") == 0) {
        return ROUTE_PAGE;
    }
    return ROUTE_UNKNOWN;
}

static void sconn_answer(sconn *c, int route)
{
    ferry *f = c->sv->f;
    buf body;
    int code = 200;
    const char *ctype = "text/plain; charset=utf-8";

    if (route == ROUTE_PLAIN) {
        sconn_reply_plain(c);
        return;
    }
    buf_init(&body);
    switch (route) {
    case ROUTE_METRICS:
        ctype = "text/plain; version=0.0.4; charset=utf-8";
        stats_render_prometheus(f, &body);
        break;
    case ROUTE_STATS:
        ctype = "application/json";
        stats_render_json(f, &body);
        break;
    case ROUTE_HEALTHZ:
        code = healthz(f, &body);
        break;
    case ROUTE_PAGE:
        ctype = "text/html; charset=utf-8";
        render_page(f, &body);
        break;
    case ROUTE_NOT_GET:
        code = 405;
        buf_append_str(&body, "only GET is supported\n");
        break;
    default:
        code = 404;
        buf_append_str(&body, "not found; try /, /metrics, /stats or /healthz\n");
        break;
    }
    sconn_reply_http(c, code, ctype, &body);
    buf_free(&body);
}

/* Figures come from every loop: each worker publishes its counters on its
 * tick, so a reply read at once could miss up to a tick of their commands.
 * Ask every worker to publish now and answer once all have (within
 * STATS_GATHER_MS; past it, with what they last published). */
static void sconn_gather(sconn *c, int route)
{
    ferry *f = c->sv->f;
    uint64_t gen = 0;
    if (route == ROUTE_PLAIN || route == ROUTE_METRICS || route == ROUTE_STATS ||
        route == ROUTE_PAGE) {
        gen = workers_refresh(f);
    }
    if (gen == 0) {
        sconn_answer(c, route);
        return;
    }
    sconn_set_state(c, SCONN_GATHERING);
    c->route = route;
    c->gen = gen;
    c->deadline = uv_now(f->loop) + STATS_GATHER_MS;
    uv_timer_start(&c->timer, sconn_timer_cb, STATS_GATHER_POLL_MS, STATS_GATHER_POLL_MS);
}

enum { PARSE_MORE = 0, PARSE_PLAIN, PARSE_HTTP };

/* Do the headers in [p, end) hold "Connection: keep-alive"? */
static int wants_keep_alive(const char *p, const char *end)
{
    static const char name[] = "connection:";
    while (p < end) {
        const char *eol = memchr(p, '\n', (size_t)(end - p));
        if (eol == NULL) {
            eol = end;
        }
        size_t len = (size_t)(eol - p);
        if (len > sizeof(name) - 1 && strncasecmp(p, name, sizeof(name) - 1) == 0) {
            const char *v = p + sizeof(name) - 1;
            while (v < eol && (*v == ' ' || *v == '\t')) {
                v++;
            }
            size_t vlen = (size_t)(eol - v);
            if (vlen > 0 && v[vlen - 1] == '\r') {
                vlen--;
            }
            return vlen == 10 && strncasecmp(v, "keep-alive", 10) == 0;
        }
        p = eol + 1;
    }
    return 0;
}

/* Look at what was read: not an HTTP request line (plain), an incomplete
 * one (more), or a complete request (its line is then split in place). */
static int sconn_parse(sconn *c, char **method, char **target)
{
    char *p = c->in.data;
    size_t n = c->in.len;
    size_t i = 0;

    while (i < n && p[i] >= 'A' && p[i] <= 'Z') {
        i++;
    }
    if (i == n) {
        return i <= 16 ? PARSE_MORE : PARSE_PLAIN;
    }
    if (i == 0 || i > 16 || p[i] != ' ') {
        return PARSE_PLAIN;
    }
    char *nl = memchr(p, '\n', n);
    if (nl == NULL) {
        return PARSE_MORE;
    }
    char *line_end = nl > p && nl[-1] == '\r' ? nl - 1 : nl;
    char *t = p + i + 1;
    if (t >= line_end || *t != '/') {
        return PARSE_PLAIN;
    }
    char *sp = memchr(t, ' ', (size_t)(line_end - t));
    int has_version = sp != NULL;
    if (has_version) {
        size_t vlen = (size_t)(line_end - (sp + 1));
        if (vlen < 5 || memcmp(sp + 1, "HTTP/", 5) != 0) {
            return PARSE_PLAIN;
        }
        /* HTTP/1.x: wait for the blank line that ends the headers. */
        const char *rest = nl + 1;
        size_t left = n - (size_t)(rest - p);
        int done =
            (left >= 1 && rest[0] == '\n') || (left >= 2 && rest[0] == '\r' && rest[1] == '\n');
        for (size_t k = 0; !done && k + 1 < left; k++) {
            if (rest[k] == '\n' && (rest[k + 1] == '\n' ||
                                    (rest[k + 1] == '\r' && k + 2 < left && rest[k + 2] == '\n'))) {
                done = 1;
            }
        }
        if (!done) {
            return PARSE_MORE;
        }
    }
    c->keep_alive = has_version && wants_keep_alive(nl + 1, p + n);
    p[i] = '\0';
    if (has_version) {
        *sp = '\0';
    } else {
        *line_end = '\0'; /* HTTP/0.9 style "GET /path": answered at once */
    }
    *method = p;
    *target = t;
    return PARSE_HTTP;
}

static void sconn_process(sconn *c)
{
    char *method = NULL, *target = NULL;
    int rc = sconn_parse(c, &method, &target);

    if (rc == PARSE_PLAIN) {
        sconn_gather(c, ROUTE_PLAIN);
    } else if (rc == PARSE_HTTP) {
        sconn_gather(c, sconn_route(c, method, target));
    } else if (c->in.len >= STATS_MAX_REQUEST) {
        buf body;
        buf_init(&body);
        buf_append_str(&body, "request too large\n");
        sconn_reply_http(c, 431, "text/plain; charset=utf-8", &body);
        buf_free(&body);
    }
}

static void sconn_alloc_cb(uv_handle_t *h, size_t hint, uv_buf_t *b)
{
    sconn *c = h->data;
    if (c->state != SCONN_READING) {
        buf_clear(&c->in); /* what follows the request is read and dropped */
    }
    buf_reserve(&c->in, 1024);
    size_t room = c->in.cap - c->in.len;
    if (c->state == SCONN_READING && c->in.len + room > STATS_MAX_REQUEST) {
        room = STATS_MAX_REQUEST - c->in.len;
    }
    b->base = c->in.data + c->in.len;
    b->len = room;
}

static void sconn_read_cb(uv_stream_t *st, ssize_t nread, const uv_buf_t *b)
{
    sconn *c = st->data;
    if (c->state == SCONN_CLOSING) {
        return;
    }
    if (nread < 0) {
        sconn_close(c, nread == UV_EOF ? "peer closed the connection" : uv_strerror((int)nread));
        return;
    }
    if (nread == 0 || c->state != SCONN_READING) {
        return;
    }
    c->in.len += (size_t)nread;
    sconn_process(c);
}

static void sconn_timer_cb(uv_timer_t *t)
{
    sconn *c = t->data;
    switch (c->state) {
    case SCONN_READING:
        if (c->kept) {
            sconn_close(c, c->in.len == 0 ? "keep-alive idle" : "request timeout");
        } else if (c->in.len == 0) {
            sconn_gather(c, ROUTE_PLAIN);
        } else if (!c->http_wait) {
            c->http_wait = 1;
            uv_timer_start(&c->timer, sconn_timer_cb,
                           STATS_REQUEST_TIMEOUT_MS - STATS_PLAIN_WAIT_MS, 0);
        } else {
            sconn_close(c, "request timeout");
        }
        return;
    case SCONN_GATHERING:
        if (workers_refreshed(c->sv->f, c->gen) || uv_now(c->sv->f->loop) >= c->deadline) {
            uv_timer_stop(&c->timer);
            sconn_answer(c, c->route);
        }
        return;
    case SCONN_WRITING:
        sconn_close(c, "write timeout");
        return;
    case SCONN_LINGERING:
        sconn_close(c, "done");
        return;
    case SCONN_CLOSING:
        return;
    }
}

static void stats_conn_cb(uv_stream_t *st, int status)
{
    stats_server *sv = st->data;
    ferry *f = sv->f;

    if (status < 0) {
        log_warn("stats %s: accept failed: %s", sv->name, uv_strerror(status));
        return;
    }
    sconn *c = xcalloc(1, sizeof(*c));
    c->sv = sv;
    c->id = ferry_next_id(f);
    snprintf(c->peer, sizeof(c->peer), "%s", sv->is_unix ? "unix" : "?");
    if (sv->is_unix) {
        uv_pipe_init(f->loop, &c->io.pipe, 0);
    } else {
        uv_tcp_init(f->loop, &c->io.tcp);
    }
    uv_timer_init(f->loop, &c->timer);
    c->io.h.data = c;
    c->timer.data = c;
    c->nhandles = 2;
    buf_init(&c->in);
    buf_init(&c->out);
    list_add_tail(&sv->conns, &c->node);
    sv->nconns++;

    int rc = uv_accept(st, &c->io.s);
    if (rc < 0) {
        sconn_close(c, uv_strerror(rc));
        return;
    }
    if (!sv->is_unix) {
        struct sockaddr_storage ss;
        int len = sizeof(ss);
        char host[48] = "?";
        if (uv_tcp_getpeername(&c->io.tcp, (struct sockaddr *)&ss, &len) == 0) {
            if (ss.ss_family == AF_INET6) {
                uv_ip6_name((struct sockaddr_in6 *)&ss, host, sizeof(host));
                snprintf(c->peer, sizeof(c->peer), "[%s]:%d", host,
                         ntohs(((struct sockaddr_in6 *)&ss)->sin6_port));
            } else {
                uv_ip4_name((struct sockaddr_in *)&ss, host, sizeof(host));
                snprintf(c->peer, sizeof(c->peer), "%s:%d", host,
                         ntohs(((struct sockaddr_in *)&ss)->sin_port));
            }
        }
    }
    if (sv->nconns > STATS_MAX_CONNS) {
        sconn_close(c, "too many stats connections");
        return;
    }
    log_debug("stats %llu %s connected", (unsigned long long)c->id, c->peer);
    rc = uv_read_start(&c->io.s, sconn_alloc_cb, sconn_read_cb);
    if (rc < 0) {
        sconn_close(c, uv_strerror(rc));
        return;
    }
    uv_timer_start(&c->timer, sconn_timer_cb, STATS_PLAIN_WAIT_MS, 0);
}

int stats_start(ferry *f)
{
    const config *cfg = f->cfg;
    const config_addr *a = &cfg->stats_listen;
    int rc;

    if (!cfg->stats_enabled) {
        return 0;
    }
    stats_server *sv = xcalloc(1, sizeof(*sv));
    f->stats_srv = sv;
    sv->f = f;
    list_init(&sv->conns);
    config_addr_str(a, sv->name, sizeof(sv->name));
    sv->is_unix = a->is_unix;
    sv->open = 1;
    rc = server_listen(f->loop, &sv->io, a, sv, 128, stats_conn_cb);
    if (rc < 0) {
        log_error("cannot listen on %s (stats): %s", sv->name, uv_strerror(rc));
        stats_stop(f);
        return rc;
    }
    log_info("stats on %s", sv->name);
    return 0;
}

void stats_stop(ferry *f)
{
    stats_server *sv = f->stats_srv;
    list_node *n, *t;

    if (sv == NULL) {
        return;
    }
    if (sv->open) {
        sv->open = 0;
        uv_close(&sv->io.h, NULL);
        if (sv->is_unix && !f->keep_paths) {
            remove(f->cfg->stats_listen.path);
        }
    }
    list_foreach_safe(n, t, &sv->conns)
    {
        sconn_close(list_entry(n, sconn, node), "ferry is stopping");
    }
}

int stats_socket(ferry *f)
{
    stats_server *sv = f->stats_srv;
    uv_os_fd_t fd;
    if (sv == NULL || !sv->open || uv_fileno(&sv->io.h, &fd) != 0) {
        return -1;
    }
    return fd;
}

void stats_free(ferry *f)
{
    free(f->stats_srv);
    f->stats_srv = NULL;
}
