/* upstream.c - connections to the Redis master. Shared links pipeline the
 * stateless commands of all sessions and match replies to requests by order;
 * dedicated links are lent to one session and pooled afterwards. Every link
 * authenticates itself first, is health-checked when idle, and goes through
 * one close path that hands its unanswered requests back to their sessions. */
#include "upstream.h"

#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "session.h"

#define LINK_READ_CHUNK (64 * 1024)
#define BACKOFF_MIN_MS 50
#define BACKOFF_MAX_MS 1000
#define LINK_KEEPALIVE_S 30

static link *link_new(upstream *up, link_kind kind);
static void link_connect_cb(uv_connect_t *req, int status);
static void link_alloc_cb(uv_handle_t *h, size_t hint, uv_buf_t *b);
static void link_read_cb(uv_stream_t *st, ssize_t nread, const uv_buf_t *b);
static void link_write_cb(uv_write_t *w, int status);
static void link_close_cb(uv_handle_t *h);
static void link_internal(link *l, const char *const *argv, int argc, req_done_cb done);
static void link_mark_dirty(link *l);
static void upstream_connect_shared(upstream *up);
static void upstream_set_state(upstream *up, upstream_state st, const char *reason);

/* ---------------------------------------------------------------- address */

static int resolve(upstream *up, const config_addr *a)
{
    memset(&up->addr, 0, sizeof(up->addr));
    if (a->is_unix) {
        up->is_unix = 1;
        snprintf(up->path, sizeof(up->path), "%s", a->path);
        snprintf(up->name, sizeof(up->name), "unix:%s", a->path);
        return 0;
    }
    struct addrinfo hints, *res = NULL;
    char port[16];
    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    snprintf(port, sizeof(port), "%d", a->port);
    int rc = getaddrinfo(a->host, port, &hints, &res);
    if (rc != 0 || res == NULL) {
        log_error("upstream: cannot resolve %s: %s", a->host, gai_strerror(rc));
        return -1;
    }
    memcpy(&up->addr, res->ai_addr, res->ai_addrlen);
    freeaddrinfo(res);
    if (strchr(a->host, ':') != NULL) {
        snprintf(up->name, sizeof(up->name), "[%s]:%d", a->host, a->port);
    } else {
        snprintf(up->name, sizeof(up->name), "%s:%d", a->host, a->port);
    }
    return 0;
}

/* ------------------------------------------------------------- lifecycle */

upstream *upstream_new(ferry *f)
{
    upstream *up = xcalloc(1, sizeof(*up));
    up->f = f;
    list_init(&up->links);
    list_init(&up->pool);
    up->nshared = f->cfg->shared_links;
    if (up->nshared < 1) {
        up->nshared = 1;
    }
    if (up->nshared > 64) {
        up->nshared = 64;
    }
    if (resolve(up, &f->cfg->redis_addr) != 0) {
        free(up);
        return NULL;
    }
    up->state = UP_DOWN;
    up->down_since_ms = uv_now(f->loop);
    up->backoff_ms = BACKOFF_MIN_MS;
    up->epoch = 1;
    upstream_connect_shared(up);
    return up;
}

void upstream_close(upstream *up)
{
    list_node *n, *t;
    list_foreach_safe(n, t, &up->links)
    {
        link *l = list_entry(n, link, node);
        if (l->state != LINK_CLOSING) {
            link_close(l, "ferry is stopping");
        }
    }
}

void upstream_free(upstream *up)
{
    free(up);
}

static void upstream_set_state(upstream *up, upstream_state st, const char *reason)
{
    if (up->state == st) {
        return;
    }
    uint64_t now = uv_now(up->f->loop);
    if (st == UP_UP) {
        log_info("master %s is UP (epoch %llu) after %llu ms: %s", up->name,
                 (unsigned long long)up->epoch, (unsigned long long)(now - up->down_since_ms),
                 reason);
        up->up_since_ms = now;
        up->backoff_ms = BACKOFF_MIN_MS;
    } else {
        log_warn("master %s is DOWN: %s", up->name, reason);
        up->down_since_ms = now;
    }
    up->state = st;
    if (st == UP_UP) {
        session_wake_all(up->f);
    }
}

/* (Re)open every missing shared link. */
static void upstream_connect_shared(upstream *up)
{
    for (int i = 0; i < up->nshared; i++) {
        if (up->shared[i] == NULL) {
            link *l = link_new(up, LINK_SHARED);
            if (l == NULL) {
                continue;
            }
            l->slot = i;
            up->shared[i] = l;
        }
    }
}

link *upstream_shared(upstream *up, uint64_t hint)
{
    if (up->state != UP_UP) {
        return NULL;
    }
    for (int i = 0; i < up->nshared; i++) {
        link *l = up->shared[(hint + (uint64_t)i) % (uint64_t)up->nshared];
        if (l != NULL && l->state == LINK_READY) {
            return l;
        }
    }
    return NULL;
}

static void select_done(link *l, request *r, const char *reply, size_t len)
{
    if (reply != NULL && len > 0 && reply[0] == '-') {
        log_error("link %llu: SELECT refused by Redis: %.*s", (unsigned long long)l->id,
                  (int)(len > 2 ? len - 2 : len), reply);
        link_close(l, "SELECT refused");
    }
}

link *upstream_acquire(upstream *up, struct session *s)
{
    link *l = NULL;
    if (up->state != UP_UP) {
        return NULL;
    }
    while (!list_empty(&up->pool)) {
        list_node *n = list_first(&up->pool);
        l = list_entry(n, link, pool_node);
        list_del(n);
        up->npool--;
        if (l->state == LINK_READY) {
            break;
        }
        link_close(l, "stale in pool");
        l = NULL;
    }
    if (l == NULL) {
        l = link_new(up, LINK_DEDICATED);
        if (l == NULL) {
            return NULL;
        }
    }
    l->owner = s;
    if (l->db != s->db) {
        char db[16];
        snprintf(db, sizeof(db), "%d", s->db);
        const char *argv[] = {"SELECT", db};
        link_internal(l, argv, 2, select_done);
        l->db = s->db;
    }
    log_debug("link %llu lent to client %llu", (unsigned long long)l->id,
              (unsigned long long)s->id);
    return l;
}

void upstream_release(upstream *up, link *l)
{
    l->owner = NULL;
    if (l->state == LINK_READY && !l->passthrough && l->npending == 0 && l->db == 0 &&
        up->npool < up->f->cfg->pool_idle && !up->f->stopping) {
        list_add_head(&up->pool, &l->pool_node);
        up->npool++;
        return;
    }
    link_close(l, "released with connection state");
}

/* ------------------------------------------------------------------ links */

static void auth_done(link *l, request *r, const char *reply, size_t len)
{
    if (reply != NULL && len > 0 && reply[0] == '-') {
        log_error("link %llu: Redis %s refused ferry's credentials: %.*s",
                  (unsigned long long)l->id, l->up->name, (int)(len > 2 ? len - 2 : len), reply);
        l->f->stats.upstream_errors++;
        link_close(l, "authentication failed");
    }
}

static link *link_new(upstream *up, link_kind kind)
{
    ferry *f = up->f;
    link *l = xcalloc(1, sizeof(*l));
    int rc;

    l->f = f;
    l->up = up;
    l->id = ++f->next_id;
    l->kind = kind;
    l->slot = -1;
    l->state = LINK_CONNECTING;
    outq_init(&l->out);
    buf_init(&l->in);
    resp_scanner_init(&l->sc);
    list_init(&l->pending);
    list_init(&l->pool_node);
    list_init(&l->dirty_node);
    l->opened_ms = l->last_io_ms = uv_now(f->loop);

    if (up->is_unix) {
        uv_pipe_init(f->loop, &l->io.pipe, 0);
        l->io.h.data = l;
        uv_pipe_connect(&l->creq, &l->io.pipe, up->path, link_connect_cb);
        rc = 0;
    } else {
        uv_tcp_init(f->loop, &l->io.tcp);
        l->io.h.data = l;
        uv_tcp_nodelay(&l->io.tcp, 1);
        rc = uv_tcp_connect(&l->creq, &l->io.tcp, (const struct sockaddr *)&up->addr,
                            link_connect_cb);
    }
    list_add_tail(&up->links, &l->node);
    up->nlinks++;
    f->stats.links_opened++;
    if (rc < 0) {
        log_error("link %llu: connect to %s failed: %s", (unsigned long long)l->id, up->name,
                  uv_strerror(rc));
        l->state = LINK_CLOSING;
        l->closing_cb_pending = 1;
        uv_close(&l->io.h, link_close_cb);
        return NULL;
    }
    l->creq.data = l;
    log_debug("link %llu: connecting to %s (%s)", (unsigned long long)l->id, up->name,
              kind == LINK_SHARED ? "shared" : "dedicated");
    /* Credentials go first: Redis handles them before anything queued behind. */
    const config *cfg = f->cfg;
    if (cfg->redis_password != NULL) {
        if (cfg->redis_username != NULL) {
            const char *argv[] = {"AUTH", cfg->redis_username, cfg->redis_password};
            link_internal(l, argv, 3, auth_done);
        } else {
            const char *argv[] = {"AUTH", cfg->redis_password};
            link_internal(l, argv, 2, auth_done);
        }
    }
    return l;
}

static void link_connect_cb(uv_connect_t *req, int status)
{
    link *l = req->data;
    upstream *up = l->up;

    if (l->state == LINK_CLOSING) {
        return;
    }
    if (status < 0) {
        char why[400];
        snprintf(why, sizeof(why), "connect to %s failed: %s", up->name, uv_strerror(status));
        l->f->stats.upstream_errors++;
        link_close(l, why);
        return;
    }
    if (!up->is_unix) {
        uv_tcp_keepalive(&l->io.tcp, 1, LINK_KEEPALIVE_S);
    }
    l->state = LINK_READY;
    l->last_io_ms = uv_now(l->f->loop);
    log_debug("link %llu: connected to %s", (unsigned long long)l->id, up->name);
    int rc = uv_read_start(&l->io.s, link_alloc_cb, link_read_cb);
    if (rc < 0) {
        link_close(l, uv_strerror(rc));
        return;
    }
    if (buf_used(&l->out.fill) > 0) {
        link_mark_dirty(l);
    }
    if (l->kind == LINK_SHARED) {
        upstream_set_state(up, UP_UP, "shared link connected");
    }
}

static void link_mark_dirty(link *l)
{
    if (!list_linked(&l->dirty_node)) {
        list_add_tail(&l->f->dirty_links, &l->dirty_node);
    }
}

/* Encode argv as a multibulk request into b. */
static void encode_argv(buf *b, const char *const *argv, int argc)
{
    char hdr[32];
    int n = snprintf(hdr, sizeof(hdr), "*%d\r\n", argc);
    buf_append(b, hdr, (size_t)n);
    for (int i = 0; i < argc; i++) {
        size_t len = strlen(argv[i]);
        n = snprintf(hdr, sizeof(hdr), "$%zu\r\n", len);
        buf_append(b, hdr, (size_t)n);
        buf_append(b, argv[i], len);
        buf_append(b, "\r\n", 2);
    }
}

static void link_internal(link *l, const char *const *argv, int argc, req_done_cb done)
{
    request *r = request_new(l->f);
    r->flags |= REQ_F_INTERNAL;
    r->done = done;
    encode_argv(&r->data, argv, argc);
    link_send(l, r);
}

void link_send(link *l, request *r)
{
    buf_append(&l->out.fill, buf_head(&r->data), buf_used(&r->data));
    r->state = REQ_SENT;
    r->link = l;
    list_add_tail(&l->pending, &r->lq);
    l->npending++;
    if (l->state == LINK_READY) {
        link_mark_dirty(l);
    }
}

void link_send_raw(link *l, const char *p, size_t n)
{
    buf_append(&l->out.fill, p, n);
    if (l->state == LINK_READY) {
        link_mark_dirty(l);
    }
}

void link_flush(link *l)
{
    if (l->state != LINK_READY) {
        return;
    }
    int rc = outq_flush(&l->out, &l->io.s, link_write_cb);
    if (rc < 0) {
        link_close(l, uv_strerror(rc));
    }
}

static void link_write_cb(uv_write_t *w, int status)
{
    link *l = w->handle->data;
    outq_done(&l->out);
    if (l->state == LINK_CLOSING) {
        return;
    }
    if (status < 0) {
        char why[128];
        snprintf(why, sizeof(why), "write error: %s", uv_strerror(status));
        l->f->stats.upstream_errors++;
        link_close(l, why);
        return;
    }
    l->last_io_ms = uv_now(l->f->loop);
    if (buf_used(&l->out.fill) > 0) {
        link_mark_dirty(l);
    }
}

static void link_alloc_cb(uv_handle_t *h, size_t hint, uv_buf_t *b)
{
    link *l = h->data;
    buf_reserve(&l->in, LINK_READ_CHUNK);
    b->base = l->in.data + l->in.len;
    b->len = l->in.cap - l->in.len;
}

/* One complete reply: to the oldest pending request, or down the tunnel. */
static void link_deliver(link *l, const char *p, size_t n)
{
    list_node *node = list_first(&l->pending);
    if (node != NULL) {
        request *r = list_entry(node, request, lq);
        list_del(node);
        l->npending--;
        r->link = NULL;
        if (r->flags & REQ_F_INTERNAL) {
            if (r->done != NULL) {
                r->done(l, r, p, n);
            }
            request_free(l->f, r);
        } else if (r->s == NULL) {
            request_free(l->f, r); /* the client left; drop the reply */
        } else {
            session_on_reply(r->s, r, p, n);
        }
        return;
    }
    if (l->passthrough && l->owner != NULL) {
        session_on_stream(l->owner, p, n);
        return;
    }
    link_close(l, "reply without a request (protocol desync)");
}

static void link_read_cb(uv_stream_t *st, ssize_t nread, const uv_buf_t *b)
{
    link *l = st->data;
    if (l->state == LINK_CLOSING) {
        return;
    }
    if (nread < 0) {
        char why[128];
        snprintf(why, sizeof(why), "%s", nread == UV_EOF ? "closed by Redis" : uv_strerror((int)nread));
        l->f->stats.upstream_errors++;
        link_close(l, why);
        return;
    }
    if (nread == 0) {
        return;
    }
    l->in.len += (size_t)nread;
    l->last_io_ms = uv_now(l->f->loop);
    for (;;) {
        size_t n = 0;
        int rc = resp_scan_reply(&l->sc, buf_head(&l->in), buf_used(&l->in), &n);
        if (rc == RESP_AGAIN) {
            break;
        }
        if (rc == RESP_ERR) {
            char why[200];
            snprintf(why, sizeof(why), "bad reply from Redis: %s", l->sc.errstr);
            link_close(l, why);
            return;
        }
        /* The reply stays valid: consuming only moves the cursor. */
        const char *p = buf_head(&l->in);
        buf_consume(&l->in, n);
        link_deliver(l, p, n);
        if (l->state == LINK_CLOSING) {
            return;
        }
    }
    buf_shrink(&l->in, 4 * LINK_READ_CHUNK);
}

void link_close(link *l, const char *reason)
{
    upstream *up = l->up;
    ferry *f = l->f;

    if (l->state == LINK_CLOSING) {
        return;
    }
    int was_ready = l->state == LINK_READY;
    l->state = LINK_CLOSING;
    log_info("link %llu to %s closed (%s, %s, %zu pending): %s", (unsigned long long)l->id,
             up->name, l->kind == LINK_SHARED ? "shared" : "dedicated",
             was_ready ? "was connected" : "never connected", l->npending, reason);
    if (list_linked(&l->dirty_node)) {
        list_del(&l->dirty_node);
    }
    if (list_linked(&l->pool_node)) {
        list_del(&l->pool_node);
        up->npool--;
    }
    if (l->slot >= 0 && up->shared[l->slot] == l) {
        up->shared[l->slot] = NULL;
    }
    /* Unanswered requests go back to their sessions, oldest first. */
    while (!list_empty(&l->pending)) {
        list_node *n = list_first(&l->pending);
        request *r = list_entry(n, request, lq);
        list_del(n);
        l->npending--;
        r->link = NULL;
        if (r->flags & REQ_F_INTERNAL) {
            request_free(f, r);
        } else if (r->s == NULL) {
            request_free(f, r);
        } else {
            session_on_lost(r->s, r, reason);
        }
    }
    if (l->owner != NULL) {
        struct session *s = l->owner;
        l->owner = NULL;
        session_on_link_closed(s, l, reason);
    }
    l->closing_cb_pending = 1;
    uv_close(&l->io.h, link_close_cb);

    if (l->kind == LINK_SHARED && !f->stopping) {
        int any = 0;
        for (int i = 0; i < up->nshared; i++) {
            if (up->shared[i] != NULL && up->shared[i]->state == LINK_READY) {
                any = 1;
            }
        }
        if (!any) {
            upstream_set_state(up, UP_DOWN, reason);
        }
        uint64_t now = uv_now(f->loop);
        if (was_ready) {
            up->next_connect_ms = now; /* a working link broke: retry at once */
        } else {
            up->next_connect_ms = now + up->backoff_ms;
            up->backoff_ms = up->backoff_ms * 2 > BACKOFF_MAX_MS ? BACKOFF_MAX_MS : up->backoff_ms * 2;
        }
    }
}

static void link_close_cb(uv_handle_t *h)
{
    link *l = h->data;
    upstream *up = l->up;
    list_del(&l->node);
    up->nlinks--;
    outq_free(&l->out);
    buf_free(&l->in);
    free(l);
}

/* --------------------------------------------------------------- periodic */

static void ping_done(link *l, request *r, const char *reply, size_t len)
{
    l->ping_pending = 0;
}

void upstream_tick(upstream *up, uint64_t now)
{
    ferry *f = up->f;
    const config *cfg = f->cfg;
    list_node *n, *t;

    if (!f->stopping && now >= up->next_connect_ms) {
        int missing = 0;
        for (int i = 0; i < up->nshared; i++) {
            missing += up->shared[i] == NULL;
        }
        if (missing) {
            upstream_connect_shared(up);
        }
    }
    list_foreach_safe(n, t, &up->links)
    {
        link *l = list_entry(n, link, node);
        if (l->state == LINK_CONNECTING && now - l->opened_ms >= cfg->connect_timeout_ms) {
            l->f->stats.upstream_errors++;
            link_close(l, "connect timeout");
            continue;
        }
        /* Keep idle links alive through Redis' own 'timeout' and NATs. A link
         * inside MULTI or in a pass-through tunnel must not see a stray PING. */
        if (l->state == LINK_READY && cfg->ping_interval_ms > 0 && l->npending == 0 &&
            !l->passthrough && !l->ping_pending && now - l->last_io_ms >= cfg->ping_interval_ms &&
            (l->owner == NULL || (!l->owner->in_multi))) {
            static const char *const argv[] = {"PING"};
            l->ping_pending = 1;
            link_internal(l, argv, 1, ping_done);
            l->last_io_ms = now;
        }
    }
}
