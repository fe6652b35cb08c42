/* upstream.c - connections to the Redis master and the master view.
 *
 * Shared links pipeline the stateless commands of all sessions and match
 * replies to requests by order; dedicated links are lent to one session and
 * pooled afterwards. A new shared link authenticates, checks ROLE (a master
 * is only used when it says so itself) and asserts durability before it
 * carries a single client request.
 *
 * The master view is UP, SWITCHING or DOWN. At the first sign of a failover
 * (link error, READONLY/LOADING/MASTERDOWN, a Sentinel event) nothing new is
 * sent to the old master; links with requests in flight are fenced: a WAIT
 * follows what they carry, their replies are held until WAIT says a replica
 * has the writes, and writes it cannot confirm are retried on the next
 * master. Then the links close. */
#include "upstream.h"

#include <hiredis/hiredis.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "durable_link.h" /* durability (N13): INFO persistence decides */
#include "log.h"
#include "sentinel.h"
#include "server.h"
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
static void link_enforce(link *l);
static void link_wait(link *l, int fence);

/* ---------------------------------------------------------------- helpers */

const char *upstream_state_name(upstream_state st)
{
    switch (st) {
    case UP_UP:
        return "UP";
    case UP_SWITCHING:
        return "SWITCHING";
    default:
        return "DOWN";
    }
}

const char *upstream_name(const upstream *up)
{
    return up->target_set ? up->name : "";
}

/* Parse one complete reply (ferry's own requests only; not the hot path). */
static redisReply *parse_reply(const char *p, size_t n)
{
    void *reply = NULL;
    redisReader *rd = redisReaderCreate();
    if (rd == NULL) {
        return NULL;
    }
    if (redisReaderFeed(rd, p, n) != REDIS_OK || redisReaderGetReply(rd, &reply) != REDIS_OK) {
        reply = NULL;
    }
    redisReaderFree(rd);
    return reply;
}

/* Text of an error reply without the leading '-' and the CRLF. */
static void error_text(const char *p, size_t n, char *out, size_t len)
{
    size_t m = n >= 3 ? n - 3 : 0;
    if (m >= len) {
        m = len - 1;
    }
    memcpy(out, p + (n > 0), m);
    out[m] = '\0';
}

/* Redis refused because it is not (or not yet) a usable master: nothing was
 * applied, the request can go to the next master as it is. */
static int is_not_master_error(const char *p, size_t n)
{
    return n > 1 && p[0] == '-' &&
           ((n >= 9 && memcmp(p, "-READONLY", 9) == 0) ||
            (n >= 8 && memcmp(p, "-LOADING", 8) == 0) ||
            (n >= 11 && memcmp(p, "-MASTERDOWN", 11) == 0));
}

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
    up->state = UP_DOWN;
    up->down_since_ms = uv_now(f->loop);
    up->switch_started_ms = up->down_since_ms;
    up->backoff_ms = BACKOFF_MIN_MS;
    up->epoch = 0;
    snprintf(up->last_reason, sizeof(up->last_reason), "starting");
    up->replicas_ack = f->cfg->replicas_ack >= 0 ? f->cfg->replicas_ack : f->cfg->has_sentinel;
    if (f->cfg->has_sentinel) {
        up->sentinel_mode = 1;
        up->target_set = 0; /* Sentinel will name the master */
        return up;
    }
    if (resolve(up, &f->cfg->redis_addr) != 0) {
        free(up);
        return NULL;
    }
    up->target_set = 1;
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
    upstream_state old = up->state;
    if (st == UP_UP) {
        uint64_t took = now - up->switch_started_ms;
        log_info("master view: %s -> UP(%s, epoch %llu) after %llu ms: %s",
                 upstream_state_name(old), up->name, (unsigned long long)up->epoch,
                 (unsigned long long)took, reason);
        if (up->switches > 0) {
            up->last_switch_ms = took;
            if (took > up->longest_switch_ms) {
                up->longest_switch_ms = took;
            }
        }
        up->up_since_ms = now;
        up->backoff_ms = BACKOFF_MIN_MS;
        up->f->wake_pending = 1;
    } else {
        log_warn("master view: %s(%s) -> %s: %s", upstream_state_name(old),
                 up->target_set ? up->name : "none", upstream_state_name(st), reason);
        if (old == UP_UP) {
            up->down_since_ms = now;
            up->switch_started_ms = now;
            up->switches++;
            snprintf(up->last_reason, sizeof(up->last_reason), "%s", reason);
        }
    }
    up->state = st;
}

/* (Re)open every missing shared link. */
static void upstream_connect_shared(upstream *up)
{
    if (!up->target_set) {
        return;
    }
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
        if (l != NULL && l->state == LINK_READY && l->verified) {
            return l;
        }
    }
    return NULL;
}

static void select_done(link *l, request *r, const char *reply, size_t len)
{
    if (reply != NULL && len > 0 && reply[0] == '-') {
        char why[200];
        error_text(reply, len, why, sizeof(why));
        log_error("link %llu: SELECT refused by Redis: %s", (unsigned long long)l->id, why);
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
        if (l->state == LINK_READY && l->epoch == up->epoch) {
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
    if (l->state == LINK_READY && !l->passthrough && !l->fencing && l->npending == 0 &&
        l->db == 0 && l->epoch == up->epoch && up->state == UP_UP &&
        up->npool < up->f->cfg->pool_idle && !up->f->stopping) {
        list_add_head(&up->pool, &l->pool_node);
        up->npool++;
        return;
    }
    link_close(l, "released with connection state");
}

/* ------------------------------------------------------- link verification */

static void auth_done(link *l, request *r, const char *reply, size_t len)
{
    if (reply != NULL && len > 0 && reply[0] == '-') {
        char why[200];
        error_text(reply, len, why, sizeof(why));
        log_error("link %llu: Redis %s refused ferry's credentials: %s", (unsigned long long)l->id,
                  l->up->name, why);
        l->f->stats.upstream_errors++;
        link_close(l, "authentication failed");
    }
}

/* ROLE on the link itself: only a node that says it is a master is used. */
static void role_done(link *l, request *r, const char *reply, size_t len)
{
    upstream *up = l->up;
    redisReply *rr = parse_reply(reply, len);
    char role[32] = "?";
    if (rr != NULL && rr->type == REDIS_REPLY_ARRAY && rr->elements > 0 &&
        rr->element[0]->type == REDIS_REPLY_STRING) {
        snprintf(role, sizeof(role), "%s", rr->element[0]->str);
    } else if (rr != NULL && rr->type == REDIS_REPLY_ERROR) {
        snprintf(role, sizeof(role), "error");
    }
    freeReplyObject(rr);
    if (strcmp(role, "master") == 0) {
        if (l->kind == LINK_SHARED && !l->verified) {
            link_enforce(l); /* durability next, on a node that is a master */
        }
        return;
    }
    char why[400];
    snprintf(why, sizeof(why), "%s answers ROLE '%s', not master", up->name, role);
    log_warn("link %llu: %s", (unsigned long long)l->id, why);
    if (l->epoch == up->epoch && l->kind == LINK_SHARED) {
        if (up->state == UP_UP) {
            upstream_switch(up, why);
        }
        if (up->sentinel_mode) {
            up->target_set = 0; /* the next poll round names a master again */
        }
    }
    link_close(l, why);
}

static void enforce_done(link *l, request *r, const char *reply, size_t len)
{
    upstream *up = l->up;
    if (l->epoch != up->epoch) {
        return;
    }
    if (!l->verified && is_not_master_error(reply, len)) {
        /* Still loading its data (or not a master after all): not ready. */
        char why[200];
        error_text(reply, len, why, sizeof(why));
        log_info("link %llu: %s is not ready: %s", (unsigned long long)l->id, up->name, why);
        link_close(l, "master not ready");
        return;
    }
    if (reply != NULL && len > 0 && reply[0] == '-') {
        char why[200];
        error_text(reply, len, why, sizeof(why));
        if (up->aof_ok || up->aof_error[0] == '\0' || strcmp(up->aof_error, why) != 0) {
            log_error("durability: cannot enforce appendonly yes / appendfsync always on %s: %s",
                      up->name, why);
        } else {
            log_error("durability: still not enforced on %s: %s", up->name, why);
        }
        snprintf(up->aof_error, sizeof(up->aof_error), "%s", why);
        up->aof_ok = 0;
    } else {
        /* durability (N13): OK is not proof; durable_link.c reads INFO persistence next and
         * sets aof_ok, calling upstream_link_verified() once the master is trusted. */
        durable_link_after_set(l, r);
        return;
    }
    upstream_link_verified(l); /* durability (N13): was inline here */
}

/* durability (N13): called by enforce_done and durable_link.c. */
void upstream_link_verified(link *l)
{
    upstream *up = l->up;
    if (l->kind == LINK_SHARED && !l->verified && l->state == LINK_READY) {
        l->verified = 1;
        if (up->state != UP_UP) {
            upstream_set_state(up, UP_UP, "link connected, ROLE master, durability asserted");
        }
    }
}

static void link_enforce(link *l)
{
    const config *cfg = l->f->cfg;
    const char *argv[] = {cfg->config_command ? cfg->config_command : "CONFIG",
                          "SET",
                          "appendonly",
                          "yes",
                          "appendfsync",
                          "always",
                          "no-appendfsync-on-rewrite",
                          "no"};
    durable_link_before_set(l); /* durability (N13): INFO persistence before CONFIG SET */
    link_internal(l, argv, 8, enforce_done);
}

/* ------------------------------------------------------------------ links */

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
    l->epoch = up->epoch;
    l->state = LINK_CONNECTING;
    outq_init(&l->out);
    buf_init(&l->in);
    resp_scanner_init(&l->sc);
    list_init(&l->pending);
    list_init(&l->held);
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
    l->creq.data = l;
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
    log_debug("link %llu: connecting to %s (%s, epoch %llu)", (unsigned long long)l->id, up->name,
              kind == LINK_SHARED ? "shared" : "dedicated", (unsigned long long)l->epoch);
    /* Redis handles these before anything queued behind them. */
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
    if (kind == LINK_SHARED) {
        static const char *const role[] = {"ROLE"};
        link_internal(l, role, 1, role_done);
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
}

static void link_mark_dirty(link *l)
{
    if (!list_linked(&l->dirty_node)) {
        list_add_tail(&l->f->dirty_links, &l->dirty_node);
    }
}

static void link_internal(link *l, const char *const *argv, int argc, req_done_cb done)
{
    request *r = request_new(l->f);
    r->flags |= REQ_F_INTERNAL;
    r->done = done;
    buf_append_argv(&r->data, argc, argv);
    link_send(l, r);
}

void link_send(link *l, request *r)
{
    buf_append(&l->out.fill, buf_head(&r->data), buf_used(&r->data));
    r->state = REQ_SENT;
    r->link = l;
    list_add_tail(&l->pending, &r->lq);
    l->npending++;
    if ((r->flags & REQ_F_WRITE) && !(r->flags & REQ_F_INTERNAL) && l->up->replicas_ack > 0 &&
        !l->passthrough && (l->owner == NULL || !l->owner->in_multi)) {
        l->need_wait = 1;
    }
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
    if (l->need_wait && !l->fencing && (l->owner == NULL || !l->owner->in_multi)) {
        link_wait(l, 0); /* one WAIT covers every write in this batch */
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

/* A "subscribe"/"psubscribe"/"ssubscribe" confirmation (RESP2). */
static int is_subscribe_confirmation(const char *p, size_t n)
{
    static const char *const heads[] = {"*3\r\n$9\r\nsubscribe\r\n", "*3\r\n$10\r\npsubscribe\r\n",
                                        "*3\r\n$10\r\nssubscribe\r\n"};
    for (size_t i = 0; i < sizeof(heads) / sizeof(heads[0]); i++) {
        size_t m = strlen(heads[i]);
        if (n > m && memcmp(p, heads[i], m) == 0) {
            return 1;
        }
    }
    return 0;
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
        } else if (is_not_master_error(p, n)) {
            /* Nothing was applied: retry on the master that replaces this one. */
            char why[160];
            error_text(p, n, why, sizeof(why));
            r->retries--; /* refused, not lost: does not count as a retry */
            session_on_lost(r->s, r, why);
            if (l->epoch == l->up->epoch) {
                upstream_switch(l->up, why);
            }
        } else if (l->fencing ||
                   ((r->flags & REQ_F_WRITE) && l->up->replicas_ack > 0 && p[0] != '-')) {
            /* Held until a WAIT says enough replicas have it. */
            buf_clear(&r->reply);
            buf_append(&r->reply, p, n);
            r->link = l;
            if (list_empty(&l->held)) {
                l->held_since_ms = uv_now(l->f->loop);
            }
            list_add_tail(&l->held, &r->lq);
        } else {
            session_on_reply(r->s, r, p, n);
        }
        return;
    }
    if (l->passthrough && l->swallow > 0 && is_subscribe_confirmation(p, n)) {
        l->swallow--; /* ferry's own re-subscription, not the client's */
        return;
    }
    if (l->passthrough && l->owner != NULL) {
        session_on_stream(l->owner, p, n);
        return;
    }
    if (l->passthrough) {
        return; /* a tunnel whose client left: drop */
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
        snprintf(why, sizeof(why), "%s",
                 nread == UV_EOF ? "closed by Redis" : uv_strerror((int)nread));
        l->f->stats.upstream_errors++;
        if (l->epoch == l->up->epoch && l->up->state == UP_UP &&
            (l->kind == LINK_SHARED || l->npending > 0)) {
            /* A master connection broke: hold everything until we know
             * which master to use (Sentinel) or it is back (fixed). */
            char sw[500];
            snprintf(sw, sizeof(sw), "link %llu to %s: %s", (unsigned long long)l->id, l->up->name,
                     why);
            upstream_switch(l->up, sw);
        }
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
    log_info("link %llu to %s closed (%s, epoch %llu, %s, %zu pending): %s",
             (unsigned long long)l->id, up->name, l->kind == LINK_SHARED ? "shared" : "dedicated",
             (unsigned long long)l->epoch, was_ready ? "was connected" : "never connected",
             l->npending, reason);
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
    /* Replies held for a WAIT were never confirmed: retry those requests. */
    while (!list_empty(&l->held)) {
        request *r = list_entry(list_first(&l->held), request, lq);
        list_del(&r->lq);
        r->link = NULL;
        buf_clear(&r->reply);
        if (r->s == NULL) {
            request_free(f, r);
        } else {
            session_on_lost(r->s, r, reason);
        }
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
    f->wake_pending = 1;

    if (l->kind == LINK_SHARED && !f->stopping && l->epoch == up->epoch && l->slot >= 0) {
        int any = 0;
        for (int i = 0; i < up->nshared; i++) {
            if (up->shared[i] != NULL && up->shared[i]->state == LINK_READY &&
                up->shared[i]->verified) {
                any = 1;
            }
        }
        if (!any && up->state == UP_UP) {
            upstream_switch(up, reason);
        }
        uint64_t now = uv_now(f->loop);
        if (was_ready && l->verified) {
            up->next_connect_ms = now; /* a working link broke: retry at once */
        } else {
            up->next_connect_ms = now + up->backoff_ms;
            up->backoff_ms =
                up->backoff_ms * 2 > BACKOFF_MAX_MS ? BACKOFF_MAX_MS : up->backoff_ms * 2;
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

/* ----------------------------------------------------------------- fences */

/* A WAIT answered: every reply held on this link was sent before it. */
static void wait_done(link *l, request *w, const char *reply, size_t len)
{
    upstream *up = l->up;
    long long acked = -1;
    int fence = w->arg == 1;
    long long need = fence ? 1 : up->replicas_ack;
    if (l->fencing && !fence) {
        return; /* on an old master only the fence decides (its WAIT comes later) */
    }
    redisReply *rr = parse_reply(reply, len);
    if (rr != NULL && rr->type == REDIS_REPLY_INTEGER) {
        acked = rr->integer;
    }
    freeReplyObject(rr);
    if (fence) {
        log_info("link %llu: fence WAIT: %lld replica(s) have what the old master acknowledged%s",
                 (unsigned long long)l->id, acked,
                 up->fence_valid ? "" : " (too late: a replica was promoted; retrying)");
        if (!up->fence_valid) {
            /* The replica that confirmed may be resynced from the new master. */
            acked = 0;
        }
    } else if (acked < need && !list_empty(&l->held)) {
        uint64_t waited = uv_now(l->f->loop) - l->held_since_ms;
        if (waited < l->f->cfg->hold_timeout_ms && l->state == LINK_READY) {
            /* Replicas reattach after a failover: keep the replies and ask
             * again; the client sees latency, not an error. */
            log_debug("link %llu: WAIT %lld: %lld replica(s) so far after %llu ms; waiting on",
                      (unsigned long long)l->id, need, acked, (unsigned long long)waited);
            link_wait(l, 0);
            return;
        }
        log_warn("link %llu: WAIT %lld: only %lld replica(s) confirmed within %llu ms",
                 (unsigned long long)l->id, need, acked, (unsigned long long)waited);
    }
    while (!list_empty(&l->held)) {
        request *r = list_entry(list_first(&l->held), request, lq);
        list_del(&r->lq);
        r->link = NULL;
        if (r->s == NULL) {
            request_free(l->f, r);
            continue;
        }
        if (acked < need && (r->flags & REQ_F_WRITE)) {
            buf_clear(&r->reply);
            if (fence) {
                session_on_lost(r->s, r, "write not confirmed by a replica before the switch");
            } else {
                char line[200];
                snprintf(line, sizeof(line),
                         "-NOREPLICAS ferry: write applied on the master but "
                         "confirmed by %lld of %lld replica(s)\r\n",
                         acked < 0 ? 0 : acked, need);
                session_on_reply(r->s, r, line, strlen(line));
            }
            continue;
        }
        buf tmp = r->reply;
        buf_init(&r->reply);
        session_on_reply(r->s, r, tmp.data + tmp.pos, tmp.len - tmp.pos);
        buf_free(&tmp);
    }
    if (fence) {
        link_close(l, "old master let go after the fence");
    }
}

static void link_wait(link *l, int fence)
{
    char n[16], timeout[24];
    snprintf(n, sizeof(n), "%d", fence ? 1 : l->up->replicas_ack);
    snprintf(timeout, sizeof(timeout), "%llu",
             (unsigned long long)(fence ? l->f->cfg->fence_timeout_ms
                                        : l->f->cfg->replicas_ack_timeout_ms));
    const char *argv[] = {"WAIT", n, timeout};
    link_internal(l, argv, 3, wait_done);
    list_entry(l->pending.prev, request, lq)->arg = fence;
    l->need_wait = 0;
}

/* Hold what l has in flight until a replica confirms it, then let go. */
static void link_fence(link *l)
{
    upstream *up = l->up;

    l->fencing = 1;
    l->fence_started_ms = uv_now(l->f->loop);
    if (l->slot >= 0 && up->shared[l->slot] == l) {
        up->shared[l->slot] = NULL;
    }
    l->slot = -1;
    if (l->owner != NULL) {
        struct session *s = l->owner;
        l->owner = NULL;
        if (s->dlink == l) {
            s->dlink = NULL;
        }
    }
    link_wait(l, 1);
    log_info("link %llu: fencing %zu request(s) in flight on the old master",
             (unsigned long long)l->id, l->npending - 1);
}

static int link_has_blocking(const link *l)
{
    const list_node *n;
    list_foreach(n, &l->pending)
    {
        const request *r = list_entry(n, request, lq);
        if (r->flags & REQ_F_BLOCKING) {
            return 1;
        }
    }
    return 0;
}

void upstream_switch(upstream *up, const char *reason)
{
    list_node *n, *t;
    if (up->state != UP_UP) {
        return;
    }
    upstream_set_state(up, UP_SWITCHING, reason);
    up->fence_valid = 1;
    if (up->sentinel_mode) {
        up->target_set = 0;
        if (up->f->sentinel != NULL) {
            sentinel_trigger(up->f->sentinel);
        }
    } else {
        up->next_connect_ms = uv_now(up->f->loop) + up->backoff_ms;
    }
    up->epoch++; /* links of the old epoch never take a new request */
    list_foreach_safe(n, t, &up->links)
    {
        link *l = list_entry(n, link, node);
        if (l->state == LINK_CLOSING || l->fencing || l->draining) {
            continue;
        }
        size_t user = 0;
        list_node *m;
        list_foreach(m, &l->pending)
        {
            if (!(list_entry(m, request, lq)->flags & REQ_F_INTERNAL)) {
                user++;
            }
        }
        struct session *o = l->owner;
        int stateful = o != NULL && (o->in_multi || o->watching || l->passthrough);
        if (l->state == LINK_READY && user > 0 && !stateful && !link_has_blocking(l)) {
            link_fence(l);
        } else if (l->state == LINK_READY && !stateful && link_has_blocking(l)) {
            /* A pop the old master serves right now must still reach its
             * client: keep the link a moment, then re-issue the call. */
            l->draining = 1;
            l->drain_until_ms = uv_now(up->f->loop) + up->f->cfg->drain_ms;
            if (list_linked(&l->pool_node)) {
                list_del(&l->pool_node);
                up->npool--;
            }
        } else {
            link_close(l, "master switch");
        }
    }
}

void upstream_set_master(upstream *up, const char *ip, int port, const char *why)
{
    char name[300];
    snprintf(name, sizeof(name), strchr(ip, ':') ? "[%s]:%d" : "%s:%d", ip, port);
    int same = up->target_set && strcmp(name, up->name) == 0;
    if (same) {
        return; /* connected or connecting already */
    }
    if (up->state == UP_UP) {
        char sw[400];
        snprintf(sw, sizeof(sw), "Sentinel names a new master %s (%s)", name, why);
        upstream_switch(up, sw);
    }
    struct sockaddr_storage ss;
    if (server_numeric_addr(ip, port, &ss) != 0) {
        log_error("Sentinel named master '%s' port %d: not a numeric address", ip, port);
        return;
    }
    memcpy(&up->addr, &ss, sizeof(ss));
    up->is_unix = 0;
    up->fence_valid = 0; /* a new master: old confirmations no longer prove anything */
    if (strcmp(up->name, name) != 0) {
        up->backoff_ms = BACKOFF_MIN_MS; /* a refused node keeps its backoff */
        up->next_connect_ms = 0;
    }
    snprintf(up->name, sizeof(up->name), "%s", name);
    up->epoch++;
    up->target_set = 1;
    up->aof_ok = 0;
    log_info("master view: connecting to %s (epoch %llu): %s", up->name,
             (unsigned long long)up->epoch, why);
    /* Shared links of an older epoch are gone (closed or fencing). */
    for (int i = 0; i < up->nshared; i++) {
        if (up->shared[i] != NULL && up->shared[i]->epoch != up->epoch) {
            link_close(up->shared[i], "replaced by a new master");
        }
    }
    if (uv_now(up->f->loop) >= up->next_connect_ms) {
        upstream_connect_shared(up);
    }
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

    if (!f->stopping && up->target_set && now >= up->next_connect_ms) {
        int missing = 0;
        for (int i = 0; i < up->nshared; i++) {
            missing += up->shared[i] == NULL;
        }
        if (missing) {
            upstream_connect_shared(up);
        }
    }
    if (up->state == UP_UP && up->shared[0] != NULL && up->shared[0]->verified) {
        link *l = up->shared[0];
        if (now >= up->next_enforce_ms) {
            up->next_enforce_ms = now + cfg->enforce_interval_ms;
            link_enforce(l);
        }
        if (up->sentinel_mode && now >= up->next_role_ms) {
            static const char *const role[] = {"ROLE"};
            up->next_role_ms = now + cfg->sentinel_resolve_interval_ms;
            link_internal(l, role, 1, role_done);
        }
    }
    list_foreach_safe(n, t, &up->links)
    {
        link *l = list_entry(n, link, node);
        if (l->state == LINK_CLOSING) {
            continue;
        }
        if (l->state == LINK_CONNECTING && now - l->opened_ms >= cfg->connect_timeout_ms) {
            l->f->stats.upstream_errors++;
            link_close(l, "connect timeout");
            continue;
        }
        if (l->draining && now >= l->drain_until_ms) {
            int fences = 0;
            list_node *m;
            list_foreach(m, &up->links)
            {
                fences += list_entry(m, link, node)->fencing;
            }
            if (fences == 0 || now >= l->drain_until_ms + cfg->fence_timeout_ms) {
                link_close(l, "master switch: blocked call re-issued on the next master");
                continue;
            }
        }
        if (l->fencing && now - l->fence_started_ms >= cfg->fence_timeout_ms + 500) {
            link_close(l, "fence timeout: the old master does not answer");
            continue;
        }
        /* Keep idle links alive through Redis' own 'timeout' and NATs. A link
         * inside MULTI or in a pass-through tunnel must not see a stray PING. */
        if (l->state == LINK_READY && cfg->ping_interval_ms > 0 && l->npending == 0 &&
            !l->passthrough && !l->ping_pending && !l->fencing &&
            now - l->last_io_ms >= cfg->ping_interval_ms &&
            (l->owner == NULL || (!l->owner->in_multi))) {
            static const char *const argv[] = {"PING"};
            l->ping_pending = 1;
            link_internal(l, argv, 1, ping_done);
            l->last_io_ms = now;
        }
        /* A health PING unanswered for long means a frozen master. */
        if (l->state == LINK_READY && l->ping_pending && l->npending > 0 &&
            cfg->ping_interval_ms > 0 &&
            now - l->last_io_ms >= 3 * cfg->ping_interval_ms + cfg->connect_timeout_ms &&
            l->kind == LINK_SHARED) {
            link_close(l, "health check: no reply from Redis");
        }
    }
}
