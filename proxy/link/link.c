/* link.c - one connection to Redis: connect, write, frame replies and
 * deliver them in order to the requests they answer, and the one close
 * path. Policy (which link carries what, fencing, retries) lives in
 * upstream.c, fence.c and router.c. */
#include "link.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "tls.h"
#include "upstream.h" /* the link's pool and identity (fields only; calls go through link_ops) */

#define LINK_READ_CHUNK (64 * 1024)
#define LINK_KEEPALIVE_S 30
#define LINK_TLS_BATCH (16 * 1024) /* a TLS record's worth of plaintext (see link_flush) */

static void link_connect_cb(uv_connect_t *req, int status);
static void link_alloc_cb(uv_handle_t *h, size_t hint, uv_buf_t *b);
static void link_read_cb(uv_stream_t *st, ssize_t nread, const uv_buf_t *b);
static void link_write_cb(uv_write_t *w, int status);
static void link_wrote(link *l, int status);
static void link_close_cb(uv_handle_t *h);
static void link_mark_dirty(link *l);
static void link_client_id_done(link *l, request *r, const char *reply, size_t len);

/* ---------------------------------------------------------------- helpers */

#define DOWNGRADE_MAX_DEPTH 32

/* Line of the header at p[*at] (type byte excluded, CRLF not included). */
static int downgrade_line(const char *p, size_t n, size_t *at, const char **line, size_t *len)
{
    const char *cr = *at < n ? memchr(p + *at, '\r', n - *at) : NULL;
    if (cr == NULL || (size_t)(cr - p) + 1 >= n || cr[1] != '\n') {
        return -1;
    }
    *line = p + *at + 1;
    *len = (size_t)(cr - p) - *at - 1;
    *at = (size_t)(cr - p) + 2;
    return 0;
}

/* The length or count of a header line (strtoll's reading of at most 23
 * bytes of it: what does not parse reads as 0). */
static long long downgrade_count(const char *line, size_t len)
{
    char tmp[24];
    size_t tl = len < sizeof(tmp) - 1 ? len : sizeof(tmp) - 1;
    memcpy(tmp, line, tl);
    tmp[tl] = '\0';
    return strtoll(tmp, NULL, 10);
}

/* Append the RESP2 form of the RESP3 reply at p[*at] to out (maps and
 * attributes' pairs, sets and pushes as arrays; null, booleans, doubles, big
 * numbers and verbatim strings as RESP2 types; attributes dropped), so
 * hiredis 0.14, which reads RESP2 only, can parse ferry's own replies on a
 * RESP3 link. Returns 0, or -1 on malformed input. */
static int downgrade(const char *p, size_t n, size_t *at, buf *out, int depth)
{
    const char *line;
    size_t len;
    char type;
    long long cnt;

    if (depth > DOWNGRADE_MAX_DEPTH || *at >= n) {
        return -1;
    }
    type = p[*at];
    if (downgrade_line(p, n, at, &line, &len) != 0) {
        return -1;
    }
    switch (type) {
    case '+':
    case '-':
    case ':':
        buf_append(out, &type, 1);
        buf_append(out, line, len);
        buf_append(out, "\r\n", 2);
        return 0;
    case '_':
        buf_append_str(out, "$-1\r\n");
        return 0;
    case '#':
        buf_append_str(out, len == 1 && line[0] == 't' ? ":1\r\n" : ":0\r\n");
        return 0;
    case ',':
    case '(':
        buf_append_bulk(out, line, len);
        return 0;
    case '$':
    case '=':
    case '!': {
        cnt = downgrade_count(line, len);
        if (cnt < 0) {
            buf_append_str(out, "$-1\r\n");
            return 0;
        }
        if ((size_t)cnt > n - *at || n - *at - (size_t)cnt < 2) {
            return -1;
        }
        const char *data = p + *at;
        size_t dl = (size_t)cnt;
        *at += dl + 2;
        if (type == '=' && dl >= 4) {
            data += 4; /* "txt:" or "mkd:" */
            dl -= 4;
        }
        if (type == '!') {
            buf_append(out, "-", 1);
            buf_append(out, data, dl);
            buf_append(out, "\r\n", 2);
        } else {
            buf_append_bulk(out, data, dl);
        }
        return 0;
    }
    case '*':
    case '~':
    case '>':
    case '%':
    case '|': {
        cnt = downgrade_count(line, len);
        if (cnt < 0) {
            buf_append_str(out, "*-1\r\n");
            return 0;
        }
        if (type == '%' || type == '|') {
            cnt *= 2;
        }
        if (type == '|') {
            buf skip;
            buf_init(&skip);
            for (long long i = 0; i < cnt; i++) {
                if (downgrade(p, n, at, &skip, depth + 1) != 0) {
                    buf_free(&skip);
                    return -1;
                }
            }
            buf_free(&skip);
            return downgrade(p, n, at, out, depth + 1); /* the reply it annotates */
        }
        buf_append_count(out, '*', (size_t)cnt);
        for (long long i = 0; i < cnt; i++) {
            if (downgrade(p, n, at, out, depth + 1) != 0) {
                return -1;
            }
        }
        return 0;
    }
    default:
        return -1;
    }
}

redisReply *link_parse_reply(const char *p, size_t n)
{
    void *reply = NULL;
    buf resp2;
    buf_init(&resp2);
    if (n > 0 && p[0] != '\0' && strchr("*_#,(=!~>%|", p[0]) != NULL) {
        /* RESP3 (or an array that may hold RESP3 elements): as RESP2. */
        size_t at = 0;
        if (downgrade(p, n, &at, &resp2, 0) != 0) {
            buf_free(&resp2);
            return NULL;
        }
        p = buf_head(&resp2);
        n = buf_used(&resp2);
    }
    redisReader *rd = redisReaderCreate();
    if (rd == NULL) {
        buf_free(&resp2);
        return NULL;
    }
    if (redisReaderFeed(rd, p, n) != REDIS_OK || redisReaderGetReply(rd, &reply) != REDIS_OK) {
        reply = NULL;
    }
    redisReaderFree(rd);
    buf_free(&resp2);
    return reply;
}

void link_error_text(const char *p, size_t n, char *out, size_t len)
{
    size_t m = n >= 3 ? n - 3 : 0;
    if (m >= len) {
        m = len - 1;
    }
    memcpy(out, p + (n > 0), m);
    out[m] = '\0';
}

static int starts(const char *p, size_t n, const char *lit)
{
    size_t m = strlen(lit);
    return n >= m && memcmp(p, lit, m) == 0;
}

int link_reply_not_master(const char *p, size_t n)
{
    /* Redis 7.0's words when a master turned replica unblocks its blocked
     * clients (disconnectAllBlockedClients); its other UNBLOCKED replies
     * ("the stream key no longer exists", "client unblocked via CLIENT
     * UNBLOCK") are answers to the client. */
    static const char demoted[] = "-UNBLOCKED force unblock from blocking operation, instance "
                                  "state changed";
    return n > 1 && p[0] == '-' &&
           (starts(p, n, "-READONLY") || starts(p, n, "-LOADING") || starts(p, n, "-MASTERDOWN") ||
            starts(p, n, demoted));
}

link_refusal link_reply_refusal(const char *p, size_t n)
{
    if (n < 2 || p[0] != '-') {
        return REFUSAL_NONE;
    }
    if (link_reply_not_master(p, n)) {
        return REFUSAL_NOT_MASTER;
    }
    if (starts(p, n, "-MOVED ") || starts(p, n, "-ASK ") || starts(p, n, "-TRYAGAIN") ||
        starts(p, n, "-CLUSTERDOWN")) {
        return REFUSAL_REDIRECT;
    }
    /* (EXEC says it as the transaction's end: Redis 7.0's
     * execCommandAbort.) */
    return starts(p, n, "-NOREPLICAS ") ||
                   starts(p, n, "-EXECABORT Transaction discarded because of: NOREPLICAS ")
               ? REFUSAL_NOREPLICAS
               : REFUSAL_NONE;
}

static const char *link_state_name(link_state st)
{
    static const char *const names[] = {"CONNECTING", "VERIFYING", "READY",
                                        "FENCING",    "DRAINING",  "CLOSING"};
    return names[st];
}

void link_set_state(link *l, link_state st)
{
    static const unsigned legal[] = {
        [LINK_CONNECTING] = 1u << LINK_VERIFYING | 1u << LINK_READY | 1u << LINK_CLOSING,
        [LINK_VERIFYING] = 1u << LINK_READY | 1u << LINK_CLOSING,
        [LINK_READY] = 1u << LINK_FENCING | 1u << LINK_DRAINING | 1u << LINK_CLOSING,
        [LINK_FENCING] = 1u << LINK_CLOSING,
        [LINK_DRAINING] = 1u << LINK_CLOSING,
        [LINK_CLOSING] = 0,
    };
    ferry_assert(legal[l->state] & (1u << st));
    log_debug("link %llu: %s -> %s", (unsigned long long)l->id, link_state_name(l->state),
              link_state_name(st));
    l->state = st;
}

int link_connected(const link *l)
{
    return l->state != LINK_CONNECTING && l->state != LINK_CLOSING;
}

/* ------------------------------------------------------------- lifecycle */

link *link_new(upstream *up, link_kind kind, int proto, ident *id)
{
    ferry *f = up->f;
    link *l = xcalloc(1, sizeof(*l));
    int rc;

    l->f = f;
    l->up = up;
    l->id = ferry_next_id(f);
    l->kind = kind;
    l->slot = -1;
    l->repl_off = -1;
    l->epoch = up->epoch;
    l->proto = proto == 3 ? 3 : 2;
    l->who = id != NULL ? id : &up->self;
    if (l->who->user != NULL) {
        l->who->nlinks++; /* the identity outlives its links */
    }
    l->state = LINK_CONNECTING;
    outq_init(&l->out);
    buf_init(&l->in);
    buf_init(&l->gate);
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
        if (rc == 0 && f->tls != NULL && f->tls->redis != NULL) {
            /* redis.tls: the session starts once connected; what is
             * queued before then waits for its handshake. */
            char host[256] = "";
            if (up->host_name != NULL) {
                snprintf(host, sizeof(host), "%s", up->host_name->host);
            } else if (up->addr.ss_family == AF_INET6) {
                uv_ip6_name((const struct sockaddr_in6 *)&up->addr, host, sizeof(host));
            } else {
                uv_ip4_name((const struct sockaddr_in *)&up->addr, host, sizeof(host));
            }
            l->out.tls = tls_new_client(f->tls->redis, host);
            rc = l->out.tls == NULL ? UV_ENOMEM : 0;
        }
    }
    l->creq.data = l;
    list_add_tail(&up->links, &l->node);
    up->nlinks++;
    f->stats.links_opened++;
    if (kind == LINK_DEDICATED) {
        f->stats.links_opened_dedicated++;
    }
    if (rc < 0) {
        log_error("link %llu: connect to %s failed: %s", (unsigned long long)l->id, up->name,
                  uv_strerror(rc));
        link_set_state(l, LINK_CLOSING);
        l->closing_cb_pending = 1;
        uv_close(&l->io.h, link_close_cb);
        return NULL;
    }
    log_debug("link %llu: connecting to %s (%s, RESP%d, epoch %llu)", (unsigned long long)l->id,
              up->name,
              kind == LINK_SHARED  ? "shared"
              : kind == LINK_PROBE ? "probe"
                                   : "dedicated",
              l->proto, (unsigned long long)l->epoch);
    /* Redis handles these before anything queued behind them. */
    const config *cfg = f->cfg;
    if (l->who->user != NULL) {
        /* A client's ACL user: until Redis accepts its AUTH nothing else is
         * written, so no command of the user ever runs as anyone else. */
        const char *argv[] = {"HELLO", "3", "AUTH", l->who->user, l->who->pass};
        if (l->proto == 3) {
            link_internal(l, argv, 5, l->f->link_ops->user_auth_done, 0);
        } else {
            link_internal(l, argv + 2, 3, l->f->link_ops->user_auth_done, 0);
        }
        l->gated = 1;
    } else if (l->proto == 3) {
        /* HELLO 3 switches the protocol and authenticates in one step. */
        const char *argv[] = {"HELLO", "3", "AUTH",
                              cfg->redis_username != NULL ? cfg->redis_username : "default",
                              cfg->redis_password};
        link_internal(l, argv, cfg->redis_password != NULL ? 5 : 2, l->f->link_ops->auth_done, 0);
    } else if (cfg->redis_password != NULL) {
        if (cfg->redis_username != NULL) {
            const char *argv[] = {"AUTH", cfg->redis_username, cfg->redis_password};
            link_internal(l, argv, 3, l->f->link_ops->auth_done, 0);
        } else {
            const char *argv[] = {"AUTH", cfg->redis_password};
            link_internal(l, argv, 2, l->f->link_ops->auth_done, 0);
        }
    }
    if (kind == LINK_SHARED && l->who->user == NULL) {
        l->f->link_ops->verify(l); /* ROLE, then durability, before any client request */
    } else if (kind == LINK_DEDICATED) {
        /* Its id lets a takeover cancel a blocked call (CLIENT UNBLOCK)
         * and know whether it popped something first. HELLO (no argument:
         * changes nothing) tells it, and Redis lets every user run it,
         * where CLIENT ID would be refused to most client.auth redis users
         * (and each refusal land in ACL LOG). */
        static const char *const argv[] = {"HELLO"};
        link_internal(l, argv, 1, link_client_id_done, 0);
    }
    return l;
}

/* HELLO's answer, a map (RESP3) or a flat array (RESP2) of bulk-string
 * keys: the connection's id is the integer after the key "id". */
static void link_client_id_done(link *l, request *r, const char *reply, size_t len)
{
    static const char key[] = "\r\n$2\r\nid\r\n:";
    const size_t klen = sizeof(key) - 1;
    if (len == 0 || (reply[0] != '*' && reply[0] != '%')) {
        return;
    }
    for (size_t i = 0; i + klen < len; i++) {
        if (memcmp(reply + i, key, klen) == 0) {
            l->redis_id = strtoll(reply + i + klen, NULL, 10);
            return;
        }
    }
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
        /* A master that refuses connections is lost as one that breaks
         * them: otherwise a request waiting for a new dedicated link would
         * open another at every loop turn. */
        l->f->link_ops->on_error(l, why);
        link_close(l, why);
        return;
    }
    if (!up->is_unix) {
        uv_tcp_keepalive(&l->io.tcp, 1, LINK_KEEPALIVE_S);
    }
    link_set_state(l, l->kind == LINK_SHARED ? LINK_VERIFYING : LINK_READY);
    l->last_io_ms = uv_now(l->f->loop);
    log_debug("link %llu: connected to %s", (unsigned long long)l->id, up->name);
    int rc = l->paused ? 0 : uv_read_start(&l->io.s, link_alloc_cb, link_read_cb);
    if (rc < 0) {
        link_close(l, uv_strerror(rc));
        return;
    }
    if (buf_used(&l->out.fill) > 0 || l->out.tls != NULL) {
        link_mark_dirty(l); /* TLS: the flush sends the ClientHello */
    }
}

/* ------------------------------------------------------------------ output */

static void link_mark_dirty(link *l)
{
    if (!list_linked(&l->dirty_node)) {
        list_add_tail(&l->f->dirty_links, &l->dirty_node);
    }
}

/* Where bytes for Redis go: the output, or behind an unanswered user AUTH. */
static buf *link_out(link *l)
{
    return l->gated ? &l->gate : &l->out.fill;
}

static void link_queue_bytes(link *l, request *r, const char *p, size_t n)
{
    buf_append(link_out(l), p, n);
    if (l->out.tls != NULL && (r->flags & REQ_F_WRITE)) {
        l->tls_write_waits = 1; /* a write command, or a script that may write */
    }
    request_set_state(r, REQ_SENT);
    r->link = l;
    list_add_tail(&l->pending, &r->lq);
    l->npending++;
    if (link_connected(l)) {
        link_mark_dirty(l);
    }
}

static void link_queue(link *l, request *r)
{
    link_queue_bytes(l, r, buf_head(&r->data), buf_used(&r->data));
}

void link_open_gate(link *l)
{
    l->gated = 0;
    if (buf_used(&l->gate) > 0) {
        buf_append(&l->out.fill, buf_head(&l->gate), buf_used(&l->gate));
        if (link_connected(l)) {
            link_mark_dirty(l);
        }
    }
    buf_free(&l->gate);
}

void link_send_bytes(link *l, request *r, const char *p, size_t n)
{
    link_queue_bytes(l, r, p, n);
}

void link_internal(link *l, const char *const *argv, int argc, req_done_cb done, long long arg)
{
    request *r = request_new(l->f);
    r->flags |= REQ_F_INTERNAL;
    r->done = done;
    r->arg = arg;
    buf_append_argv(&r->data, argc, argv);
    link_queue(l, r);
}

void link_internal_sure(link *l, const char *const *argv, int argc, req_done_cb done, long long arg)
{
    request *r = request_new(l->f);
    r->flags |= REQ_F_INTERNAL | REQ_F_SURE;
    r->done = done;
    r->arg = arg;
    buf_append_argv(&r->data, argc, argv);
    link_queue(l, r);
}

void link_internal_raw(link *l, const char *p, size_t n, req_done_cb done)
{
    request *r = request_new(l->f);
    r->flags |= REQ_F_INTERNAL;
    r->done = done;
    buf_append(&r->data, p, n);
    link_queue(l, r);
}

void link_internal_bytes(link *l, const char *p, size_t n, req_done_cb done, long long arg)
{
    request *r = request_new(l->f);
    r->flags |= REQ_F_INTERNAL | REQ_F_SURE;
    r->done = done;
    r->arg = arg;
    buf_append(&r->data, p, n);
    link_queue(l, r);
}

size_t link_internal_each(link *l, const buf *b, req_done_cb done)
{
    const char *p = buf_head(b);
    size_t left = buf_used(b);
    resp_parser *pp = resp_parser_new(NULL);
    size_t n = 0;
    while (left > 0) {
        resp_request req;
        if (resp_parse_request(pp, p, left, &req) != RESP_OK) {
            break;
        }
        link_internal_raw(l, p, req.len, done);
        p += req.len;
        left -= req.len;
        n++;
    }
    resp_parser_free(pp);
    return n;
}

void link_send(link *l, request *r)
{
    link_queue(l, r);
    if (r->flags & REQ_F_ACK) {
        l->need_wait = 1;
        l->role_due = 1;
    }
}

void link_send_as(link *l, request *r, const char *p, size_t n)
{
    link_queue_bytes(l, r, p, n);
    if (r->flags & REQ_F_ACK) {
        l->need_wait = 1;
        l->role_due = 1;
    }
}

void link_send_raw(link *l, const char *p, size_t n)
{
    buf_append(link_out(l), p, n);
    if (link_connected(l)) {
        link_mark_dirty(l);
    }
}

/* Shared link on TLS: everything pending is written; what no batch in
 * flight holds is a new one (merged into the newest when two are in flight
 * already: a flush past a record's worth of bytes). While a user's AUTH
 * gates the link, what waits behind it is not written, so not counted. */
static void link_tls_batch_written(link *l)
{
    size_t inflight = 0;
    for (int i = 0; i < l->tls_nbatch; i++) {
        inflight += l->tls_batch[i];
    }
    if (l->npending <= inflight) {
        return;
    }
    if (l->tls_nbatch < LINK_TLS_INFLIGHT) {
        l->tls_batch[l->tls_nbatch++] = l->npending - inflight;
    } else {
        l->tls_batch[l->tls_nbatch - 1] += l->npending - inflight;
    }
}

/* The oldest batch in flight is answered: what queued meanwhile may go. */
static void link_tls_batch_answered(link *l)
{
    for (int i = 1; i < l->tls_nbatch; i++) {
        l->tls_batch[i - 1] = l->tls_batch[i];
    }
    l->tls_nbatch--;
    if (buf_used(&l->out.fill) > 0) {
        link_mark_dirty(l);
    }
}

void link_flush(link *l)
{
    if (!link_connected(l)) {
        return;
    }
    /* A shared link on TLS keeps at most two batches in flight: Redis reads
     * one TLS record of a connection per event loop turn (and with
     * appendfsync always, syncs once per turn), so many small records on
     * the one link all sessions share would each cost Redis a turn
     * (measured: SET at -c 50 fell to a fifth). With one batch at a time
     * Redis and ferry took turns idling (at -P 1 the next batch only formed
     * once the last was answered); with two, Redis works on one while the
     * next gathers. A write waiting makes it one: the second record would
     * be read (and synced) in a turn of its own, where, written once the
     * batch is answered, it goes with everything gathered meanwhile
     * (measured with scripts/bench --tls: SET at -P 1 -c 50 cost Redis
     * 10.1 us of CPU per request instead of 11.7). What queues meanwhile
     * goes in the next record, once the oldest batch is answered
     * (link_deliver marks the link), or at once past a record's worth of
     * bytes. */
    if (l->out.tls != NULL && l->kind == LINK_SHARED &&
        l->tls_nbatch >= (l->tls_write_waits ? 1 : LINK_TLS_INFLIGHT) &&
        buf_used(&l->out.fill) < LINK_TLS_BATCH) {
        return;
    }
    if (l->need_wait && l->state != LINK_FENCING && l->nwaits == 0) {
        /* One WAIT covers every write sent before it; while one is in
         * flight, later writes wait for the next (a WAIT blocks the link on
         * Redis: never two in a row). */
        l->f->link_ops->wait(l);
    } else if (l->role_due && l->state != LINK_FENCING) {
        l->f->link_ops->bracket(l);
    }
    int rc = outq_flush(&l->out, &l->io.s, link_write_cb);
    if (l->out.tls != NULL && l->kind == LINK_SHARED && rc >= 0 && buf_used(&l->out.fill) == 0 &&
        !l->gated) {
        link_tls_batch_written(l); /* everything pending is written */
        l->tls_write_waits = 0;
    }
    if (rc < 0 || rc == OUTQ_WRITTEN) {
        link_wrote(l, rc < 0 ? rc : 0);
    }
}

static void link_write_cb(uv_write_t *w, int status)
{
    link *l = w->handle->data;
    outq_done(&l->out, status);
    if (l->state == LINK_CLOSING) {
        return;
    }
    link_wrote(l, status);
}

/* A write ended (status < 0: it failed), in its callback or at once. */
static void link_wrote(link *l, int status)
{
    if (status < 0) {
        char why[128];
        snprintf(why, sizeof(why), "write error: %s", uv_strerror(status));
        l->f->stats.upstream_errors++;
        link_close(l, why);
        return;
    }
    l->last_io_ms = uv_now(l->f->loop);
    if (buf_used(&l->out.fill) > 0 || outq_tls_wants_flush(&l->out)) {
        link_mark_dirty(l);
    }
}

/* ------------------------------------------------------------------ input */

void link_pause(link *l, int paused)
{
    if (l->paused == paused || l->state == LINK_CLOSING) {
        return;
    }
    l->paused = paused;
    log_debug("link %llu: %s reading (its client's output)", (unsigned long long)l->id,
              paused ? "paused" : "resumed");
    if (!link_connected(l)) {
        return; /* the connect callback starts reading unless paused */
    }
    if (paused) {
        uv_read_stop(&l->io.s);
    } else {
        int rc = uv_read_start(&l->io.s, link_alloc_cb, link_read_cb);
        if (rc < 0) {
            link_close(l, uv_strerror(rc));
        }
    }
}

static void link_alloc_cb(uv_handle_t *h, size_t hint, uv_buf_t *b)
{
    link *l = h->data;
    buf_reserve(&l->in, LINK_READ_CHUNK);
    b->base = l->in.data + l->in.len;
    b->len = l->in.cap - l->in.len;
}

/* A "subscribe"/"psubscribe"/"ssubscribe" confirmation (RESP2, or a RESP3 push). */
static int is_subscribe_confirmation(const char *p, size_t n)
{
    static const char *const heads[] = {
        "*3\r\n$9\r\nsubscribe\r\n", "*3\r\n$10\r\npsubscribe\r\n", "*3\r\n$10\r\nssubscribe\r\n",
        ">3\r\n$9\r\nsubscribe\r\n", ">3\r\n$10\r\npsubscribe\r\n", ">3\r\n$10\r\nssubscribe\r\n"};
    for (size_t i = 0; i < sizeof(heads) / sizeof(heads[0]); i++) {
        if (starts(p, n, heads[i]) && n > strlen(heads[i])) {
            return 1;
        }
    }
    return 0;
}

/* A RESP3 push frame: never the reply to a request. On a dedicated link
 * it is its client's out-of-band data (pub/sub messages, CLIENT TRACKING
 * invalidations); on a shared link nobody asked for it. */
static void link_on_push(link *l, const char *p, size_t n)
{
    if (l->swallow > 0 && is_subscribe_confirmation(p, n)) {
        l->swallow--; /* ferry's own re-subscription, not the client's */
    } else if (l->kind == LINK_DEDICATED && l->owner != NULL) {
        if (l->passthrough) {
            l->f->link_ops->on_stream(l->owner, p, n);
        } else {
            l->f->link_ops->on_push(l->owner, p, n);
        }
    } else if (l->kind == LINK_DEDICATED) {
        log_debug("link %llu: push frame without a client dropped", (unsigned long long)l->id);
    } else {
        link_close(l, "push frame on a shared link (protocol error)");
    }
}

/* One complete reply: to the oldest pending request, or down the tunnel. */
static void link_deliver_as(link *l, const char *p, size_t n)
{
    if (p[0] == '>') {
        link_on_push(l, p, n);
        return;
    }
    list_node *node = list_first(&l->pending);
    if (node == NULL) {
        if (l->passthrough && l->swallow > 0 && is_subscribe_confirmation(p, n)) {
            l->swallow--; /* ferry's own re-subscription, not the client's */
        } else if (l->passthrough && l->owner != NULL) {
            l->f->link_ops->on_stream(l->owner, p, n);
        } else if (!l->passthrough) {
            link_close(l, "reply without a request (protocol desync)");
        }
        return; /* else a tunnel whose client left: drop */
    }
    request *r = list_entry(node, request, lq);
    link_refusal refusal;
    list_del(node);
    l->npending--;
    if (l->tls_nbatch > 0 && --l->tls_batch[0] == 0) {
        link_tls_batch_answered(l);
    }
    r->link = NULL;
    if (r->flags & REQ_F_INTERNAL) {
        if (r->done != NULL) {
            r->done(l, r, p, n);
        }
        request_free(l->f, r);
    } else if (r->s == NULL) {
        request_free(l->f, r); /* the client left; drop the reply */
    } else if ((r->flags & REQ_F_UNBLOCK) && starts(p, n, "-UNBLOCKED")) {
        /* The CLIENT UNBLOCK ... ERROR ferry sent for its client (clients.c)
         * ended the call: Redis' reply is the client's, not a failover's. */
        l->f->link_ops->on_reply(r->s, r, p, n);
    } else if ((refusal = link_reply_refusal(p, n)) == REFUSAL_NOT_MASTER) {
        /* Nothing was applied: retry on the master that replaces this one. */
        char why[160];
        link_error_text(p, n, why, sizeof(why));
        l->f->link_ops->on_refused(r->s, r, l, refusal, p, n);
        l->f->link_ops->on_not_master(l, why);
    } else if (refusal == REFUSAL_NOREPLICAS) {
        /* min-replicas-to-write refused it: nothing applied; the router
         * holds it or passes it on. Inside a transaction too: Redis has
         * doomed the transaction on this link (its EXEC answers
         * EXECABORT); held, it is rebuilt on another one (router.c). */
        l->f->link_ops->on_refused(r->s, r, l, refusal, p, n);
    } else if (refusal == REFUSAL_REDIRECT && l->f->cfg->has_cluster && !(r->flags & REQ_F_TXLOG)) {
        /* A cluster node sends the request elsewhere or asks for a retry:
         * nothing applied; the router re-routes it, the client never sees
         * it. (Only a cluster node says these: elsewhere they are answers.) */
        l->f->link_ops->on_refused(r->s, r, l, refusal, p, n);
    } else if (!l->f->link_ops->hold(l, r, p, n)) {
        l->f->link_ops->on_reply(r->s, r, p, n);
    }
}

/* One complete reply, put first as the client's command answers it when it
 * went as a receipt pop (receipts.c): whoever takes it sees that shape. */
static void link_deliver(link *l, const char *p, size_t n)
{
    request *r = list_empty(&l->pending) || p[0] == '>'
                     ? NULL
                     : list_entry(list_first(&l->pending), request, lq);
    buf shaped;
    buf_init(&shaped);
    if (r != NULL && (r->flags & REQ_F_RCPT) && l->f->link_ops->reshape(l, r, p, n, &shaped)) {
        p = buf_head(&shaped);
        n = buf_used(&shaped);
    }
    link_deliver_as(l, p, n);
    buf_free(&shaped);
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
        l->f->link_ops->on_error(l, why);
        link_close(l, why);
        return;
    }
    if (nread == 0) {
        return;
    }
    if (l->out.tls != NULL) {
        int was_ready = tls_ready(l->out.tls);
        if (outq_tls_input(&l->out, b->base, (size_t)nread, &l->in) < 0) {
            char why[600];
            snprintf(why, sizeof(why), "TLS to %s: %s", l->up->name, tls_error(l->out.tls));
            l->f->stats.upstream_errors++;
            l->f->link_ops->on_error(l, why);
            link_close(l, why);
            return;
        }
        if (!was_ready && tls_ready(l->out.tls)) {
            char how[120];
            log_debug("link %llu: TLS handshake with %s: %s", (unsigned long long)l->id,
                      l->up->name, tls_describe(l->out.tls, how, sizeof(how)));
        }
        if (outq_tls_wants_flush(&l->out)) {
            link_mark_dirty(l);
        }
    } else {
        l->in.len += (size_t)nread;
    }
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
    if (l->returning && l->npending == 0) {
        l->returning = 0;
        l->f->link_ops->on_returned(l); /* may close it */
        if (l->state == LINK_CLOSING) {
            return;
        }
    }
    buf_shrink(&l->in, 4 * LINK_READ_CHUNK);
}

/* ------------------------------------------------------------------ close */

void link_close(link *l, const char *reason)
{
    ferry *f = l->f;

    if (l->state == LINK_CLOSING) {
        return;
    }
    int was_ready = l->state == LINK_READY;
    int was_verified =
        l->kind == LINK_SHARED && l->state != LINK_CONNECTING && l->state != LINK_VERIFYING;
    int was_connected = link_connected(l);
    /* Requests still unanswered are sent again elsewhere: what of them the
     * kernel still holds (a partition, or a master that stopped reading)
     * must not reach Redis later, behind the copy sent again (a pop run
     * twice, the first item on nobody). Such a link is reset (RST, its
     * send queue dropped), not closed gracefully. */
    int reset = l->npending > 0 && l->io.h.type == UV_TCP && link_connected(l);
    link_set_state(l, LINK_CLOSING);
    log_info("link %llu to %s closed (%s%s%s, epoch %llu, %s, %zu pending): %s",
             (unsigned long long)l->id, l->up->name,
             l->kind == LINK_SHARED  ? "shared"
             : l->kind == LINK_PROBE ? "probe"
                                     : "dedicated",
             l->who->user != NULL ? " as user " : "", l->who->user != NULL ? l->who->user : "",
             (unsigned long long)l->epoch, was_connected ? "was connected" : "never connected",
             l->npending, reason);
    if (list_linked(&l->dirty_node)) {
        list_del(&l->dirty_node);
    }
    l->f->link_ops->on_closing(l->up, l);
    /* Replies held for a WAIT were never confirmed. */
    l->f->link_ops->drop_held(l, reason);
    /* Unanswered requests go back to their sessions, oldest first. */
    while (!list_empty(&l->pending)) {
        list_node *n = list_first(&l->pending);
        request *r = list_entry(n, request, lq);
        list_del(n);
        l->npending--;
        r->link = NULL;
        if ((r->flags & REQ_F_INTERNAL) || r->s == NULL) {
            if ((r->flags & REQ_F_SURE) && r->done != NULL) {
                r->done(l, r, NULL, 0);
            }
            request_free(f, r);
        } else {
            l->f->link_ops->on_lost(r->s, r, reason);
        }
    }
    l->f->link_ops->detach(l, reason);
    if (was_connected && !reset) {
        outq_tls_bye(&l->out, &l->io.s); /* TLS: close_notify */
    }
    l->closing_cb_pending = 1;
    if (!reset || uv_tcp_close_reset(&l->io.tcp, link_close_cb) != 0) {
        uv_close(&l->io.h, link_close_cb);
    }
    f->wake_pending = 1;
    l->f->link_ops->on_closed(l->up, l, was_ready && was_verified, reason);
}

static void link_close_cb(uv_handle_t *h)
{
    link *l = h->data;
    upstream *up = l->up;
    list_del(&l->node);
    up->nlinks--;
    if (l->who->user != NULL) {
        l->who->nlinks--;
    }
    outq_free(&l->out);
    buf_free(&l->in);
    buf_free(&l->gate);
    free(l->script_marks);
    free(l);
}
