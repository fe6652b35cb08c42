/* session.c - one client connection. Requests are parsed into a queue in
 * arrival order; dispatch walks the queue, answers what ferry answers itself
 * and sends the rest to a link: the shared pipelined link for stateless
 * commands, or a dedicated link while the client holds connection state.
 * A session has requests in flight on one link at a time, and replies leave
 * strictly in request order, whichever link produced them.
 *
 *   requests:  [answered][sent][sent][held][held]...
 *                 ^flushed from the head      ^cursor: next to dispatch
 */
#include "session.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "log.h"
#include "upstream.h"

#define SESSION_READ_CHUNK (16 * 1024)
#define SESSION_MAX_RETRIES 3
#define CLIENT_KEEPALIVE_S 300
#define FERRY_REDIS_VERSION "7.0.0"

/* How a request is routed; decided when it is parsed, acted on in order. */
enum route {
    RT_SHARED = 0, /* stateless: shared link, or the dedicated one if pinned */
    RT_BLOCKING,   /* blocking call: a dedicated link for its duration */
    RT_MULTI,      /* MULTI: pin until EXEC/DISCARD */
    RT_EXEC,       /* EXEC or DISCARD: ends MULTI and WATCH */
    RT_WATCH,      /* WATCH: pin until EXEC/DISCARD/UNWATCH */
    RT_UNWATCH,    /* UNWATCH */
    RT_SELECT,     /* SELECT arg */
    RT_STICKY,     /* CLIENT SETNAME/TRACKING...: pinned for the session's life */
    RT_TUNNEL,     /* pub/sub, MONITOR, CLIENT REPLY: a raw tunnel from now on */
    RT_ERROR,      /* refused: the reply is already in r->reply */
    RT_AUTH,       /* AUTH: arg = auth result */
    RT_HELLO,      /* HELLO: arg = hello result */
    RT_QUIT,       /* QUIT */
    RT_RESET       /* RESET */
};

enum { AUTH_FAIL = 0, AUTH_OK = 1, AUTH_NOPASS = 2 };
enum {
    HELLO_OK = 0,
    HELLO_AUTH_OK = 1,
    HELLO_AUTH_FAIL = 2,
    HELLO_NOPROTO = 3,
    HELLO_BADPROTO = 4,
    HELLO_SYNTAX = 5
};

enum { DISPATCH_DONE = 0, DISPATCH_WAIT, DISPATCH_DOWN };

static void session_alloc_cb(uv_handle_t *h, size_t hint, uv_buf_t *b);
static void session_read_cb(uv_stream_t *st, ssize_t nread, const uv_buf_t *b);
static void session_write_cb(uv_write_t *w, int status);
static void session_close_cb(uv_handle_t *h);
static void session_process_input(session *s);
static void session_dispatch(session *s);
static void session_flush_answered(session *s);
static void session_mark_dirty(session *s);
static void session_maybe_release(session *s);
static void session_check_reading(session *s);

/* ------------------------------------------------------------ accept/close */

int session_accept(ferry *f, uv_stream_t *server, int is_unix)
{
    session *s = xcalloc(1, sizeof(*s));
    int rc;

    s->f = f;
    if (is_unix) {
        uv_pipe_init(f->loop, &s->io.pipe, 0);
    } else {
        uv_tcp_init(f->loop, &s->io.tcp);
    }
    s->io.h.data = s;
    rc = uv_accept(server, &s->io.s);
    if (rc < 0) {
        uv_close(&s->io.h, session_close_cb); /* initialised: freed once closed */
        return rc;
    }
    s->id = ++f->next_id;
    list_init(&s->node);
    list_init(&s->wait_node);
    list_init(&s->dirty_node);
    list_init(&s->requests);
    s->cursor = &s->requests;
    buf_init(&s->in);
    outq_init(&s->out);
    s->parser = resp_parser_new(&f->limits);
    s->authed = f->cfg->client_password == NULL;
    s->last_active_ms = uv_now(f->loop);
    list_add_tail(&f->sessions, &s->node);
    f->nclients++;
    f->stats.clients_total++;

    if (is_unix) {
        snprintf(s->peer, sizeof(s->peer), "unix");
    } else {
        struct sockaddr_storage ss;
        int len = sizeof(ss);
        char host[48] = "?";
        int port = 0;
        uv_tcp_nodelay(&s->io.tcp, 1);
        uv_tcp_keepalive(&s->io.tcp, 1, CLIENT_KEEPALIVE_S);
        if (uv_tcp_getpeername(&s->io.tcp, (struct sockaddr *)&ss, &len) == 0) {
            if (ss.ss_family == AF_INET) {
                struct sockaddr_in *in = (struct sockaddr_in *)&ss;
                uv_ip4_name(in, host, sizeof(host));
                port = ntohs(in->sin_port);
            } else if (ss.ss_family == AF_INET6) {
                struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)&ss;
                uv_ip6_name(in6, host, sizeof(host));
                port = ntohs(in6->sin6_port);
            }
        }
        snprintf(s->peer, sizeof(s->peer), "%s:%d", host, port);
    }
    log_debug("client %llu %s connected", (unsigned long long)s->id, s->peer);

    if (f->nclients > (uint64_t)f->cfg->max_clients) {
        f->stats.clients_rejected++;
        buf_append_str(&s->out.fill, "-ERR max number of clients reached\r\n");
        s->quitting = 1;
        session_mark_dirty(s);
        return 0;
    }
    rc = uv_read_start(&s->io.s, session_alloc_cb, session_read_cb);
    if (rc < 0) {
        session_close(s, uv_strerror(rc));
        return 0;
    }
    s->reading = 1;
    return 0;
}

/* Remove r from the session queue, keeping the cursor valid. */
static void session_unlink(session *s, request *r)
{
    if (s->cursor == &r->sq) {
        s->cursor = r->sq.next;
    }
    list_del(&r->sq);
    s->nrequests--;
}

/* Put s on the list of sessions waiting for a master (once). */
static void session_wait(session *s)
{
    if (!list_linked(&s->wait_node)) {
        list_add_tail(&s->f->waiting, &s->wait_node);
    }
}

/* What s holds for lack of a master; f->held_bytes is the sum over sessions.
 * Recomputed by dispatch whenever it finds no master. */
static void session_set_held(session *s, size_t held)
{
    s->f->held_bytes = s->f->held_bytes - s->held_bytes + held;
    s->held_bytes = held;
}

void session_close(session *s, const char *reason)
{
    ferry *f = s->f;
    if (s->closing) {
        return;
    }
    s->closing = 1;
    /* A client that simply hangs up is routine; anything else is news. */
    if (strcmp(reason, "client closed the connection") == 0) {
        log_debug("client %llu %s closed: %s", (unsigned long long)s->id, s->peer, reason);
    } else {
        log_info("client %llu %s closed: %s", (unsigned long long)s->id, s->peer, reason);
    }
    if (s->reading) {
        uv_read_stop(&s->io.s);
        s->reading = 0;
    }
    if (list_linked(&s->wait_node)) {
        list_del(&s->wait_node);
    }
    if (list_linked(&s->dirty_node)) {
        list_del(&s->dirty_node);
    }
    /* Requests on a link stay there, orphaned: the link drops their replies. */
    while (!list_empty(&s->requests)) {
        request *r = list_entry(list_first(&s->requests), request, sq);
        session_unlink(s, r);
        if (r->state == REQ_SENT) {
            r->s = NULL;
        } else {
            request_free(f, r);
        }
    }
    session_set_held(s, 0);
    if (s->dlink != NULL) {
        link *l = s->dlink;
        s->dlink = NULL;
        l->owner = NULL;
        /* A vanished consumer must not leave a BRPOP behind that would take
         * an item nobody receives: close a link with anything in flight. */
        if (l->npending > 0 || l->passthrough) {
            link_close(l, "its client left");
        } else {
            upstream_release(f->up, l);
        }
    }
    list_del(&s->node);
    f->nclients--;
    uv_close(&s->io.h, session_close_cb);
}

static void session_close_cb(uv_handle_t *h)
{
    session *s = h->data;
    resp_parser_free(s->parser);
    buf_free(&s->in);
    outq_free(&s->out);
    free(s->av);
    free(s->al);
    subs_free(&s->channels);
    subs_free(&s->patterns);
    subs_free(&s->shards);
    free(s);
}

/* ----------------------------------------------------------------- output */

static void session_mark_dirty(session *s)
{
    if (!s->closing && !list_linked(&s->dirty_node)) {
        list_add_tail(&s->f->dirty, &s->dirty_node);
    }
}

void session_flush_all(ferry *f)
{
    while (!list_empty(&f->dirty)) {
        list_node *n = list_first(&f->dirty);
        session *s = list_entry(n, session, dirty_node);
        list_del(n);
        int rc = outq_flush(&s->out, &s->io.s, session_write_cb);
        if (rc < 0) {
            session_close(s, uv_strerror(rc));
        } else if (rc == 1 && s->quitting && outq_len(&s->out) == 0) {
            session_close(s, "closed after reply");
        }
    }
}

static void session_write_cb(uv_write_t *w, int status)
{
    session *s = w->handle->data;
    outq_done(&s->out);
    if (s->closing) {
        return;
    }
    if (status < 0) {
        session_close(s, status == UV_EPIPE || status == UV_ECONNRESET
                             ? "connection reset by client"
                             : uv_strerror(status));
        return;
    }
    if (buf_used(&s->out.fill) > 0) {
        session_mark_dirty(s);
    } else if (s->quitting) {
        session_close(s, "closed after reply");
        return;
    }
    session_check_reading(s);
}

/* Mark r answered with these bytes; write it now if nothing precedes it. */
static void session_answer(session *s, request *r, const char *p, size_t n)
{
    r->state = REQ_ANSWERED;
    s->pending_bytes -=
        buf_used(&r->data) <= s->pending_bytes ? buf_used(&r->data) : s->pending_bytes;
    if (list_first(&s->requests) == &r->sq && buf_used(&r->reply) == 0) {
        buf_append(&s->out.fill, p, n);
        if (r->flags & REQ_F_QUIT) {
            s->quitting = 1;
        }
        session_unlink(s, r);
        request_free(s->f, r);
    } else {
        buf_clear(&r->reply);
        buf_append(&r->reply, p, n);
    }
}

static void session_answer_str(session *s, request *r, const char *text)
{
    session_answer(s, r, text, strlen(text));
}

/* Move every answered request at the head of the queue to the output. */
static void session_flush_answered(session *s)
{
    int wrote = 0;
    while (!s->quitting) {
        list_node *n = list_first(&s->requests);
        if (n == NULL) {
            break;
        }
        request *r = list_entry(n, request, sq);
        if (r->state != REQ_ANSWERED) {
            break;
        }
        buf_append(&s->out.fill, buf_head(&r->reply), buf_used(&r->reply));
        if (r->flags & REQ_F_QUIT) {
            s->quitting = 1;
        }
        session_unlink(s, r);
        request_free(s->f, r);
        wrote = 1;
    }
    if (wrote || buf_used(&s->out.fill) > 0) {
        session_mark_dirty(s);
    }
}

/* ------------------------------------------------------------------ input */

static void session_alloc_cb(uv_handle_t *h, size_t hint, uv_buf_t *b)
{
    session *s = h->data;
    buf_reserve(&s->in, SESSION_READ_CHUNK);
    b->base = s->in.data + s->in.len;
    b->len = s->in.cap - s->in.len;
}

static void session_read_cb(uv_stream_t *st, ssize_t nread, const uv_buf_t *b)
{
    session *s = st->data;
    if (s->closing) {
        return;
    }
    if (nread < 0) {
        session_close(s, nread == UV_EOF          ? "client closed the connection"
                         : nread == UV_ECONNRESET ? "connection reset by client"
                                                  : uv_strerror((int)nread));
        return;
    }
    if (nread == 0) {
        return;
    }
    s->in.len += (size_t)nread;
    s->last_active_ms = uv_now(s->f->loop);
    session_process_input(s);
}

static int arg_eq(const resp_arg *a, const char *lit)
{
    size_t n = strlen(lit);
    return a->len == n && strncasecmp(a->ptr, lit, n) == 0;
}

/* Parse a whole argument as a signed integer. Returns 0 or -1. */
static int arg_ll(const resp_arg *a, long long *out)
{
    char tmp[32];
    char *end;
    if (a->len == 0 || a->len >= sizeof(tmp)) {
        return -1;
    }
    memcpy(tmp, a->ptr, a->len);
    tmp[a->len] = '\0';
    long long v = strtoll(tmp, &end, 10);
    if (*end != '\0') {
        return -1;
    }
    *out = v;
    return 0;
}

static void set_error(request *r, const char *fmt, const char *what)
{
    char line[512];
    int n = snprintf(line, sizeof(line), fmt, what);
    if (n < 0) {
        n = 0;
    }
    if ((size_t)n >= sizeof(line)) {
        n = sizeof(line) - 1;
    }
    buf_clear(&r->reply);
    buf_append(&r->reply, line, (size_t)n);
    r->route = RT_ERROR;
}

static int password_ok(ferry *f, const resp_arg *user, const resp_arg *pass)
{
    const char *pw = f->cfg->client_password;
    if (pw == NULL) {
        return AUTH_NOPASS;
    }
    if (user != NULL && !arg_eq(user, "default")) {
        return AUTH_FAIL;
    }
    size_t n = strlen(pw);
    /* Compare without an early exit, so timing does not leak the prefix. */
    unsigned diff = (unsigned)(pass->len != n);
    for (size_t i = 0; i < pass->len; i++) {
        diff |= (unsigned)(unsigned char)(pass->ptr[i] ^ pw[i % (n ? n : 1)]);
    }
    return diff == 0 ? AUTH_OK : AUTH_FAIL;
}

static int is_enforced_param(const resp_arg *a)
{
    return arg_eq(a, "appendonly") || arg_eq(a, "appendfsync") ||
           arg_eq(a, "no-appendfsync-on-rewrite");
}

static int is_denied(ferry *f, const command *cmd)
{
    for (int i = 0; i < f->ndeny; i++) {
        if (f->deny[i] == cmd) {
            return 1;
        }
    }
    return 0;
}

/* Upper-case display name of a command: "CONFIG REWRITE". */
static void display_name(const command *cmd, char *out, size_t len)
{
    size_t i = 0;
    for (const char *p = cmd->name; *p != '\0' && i + 1 < len; p++) {
        out[i++] = *p == '|' ? ' ' : (char)(*p >= 'a' && *p <= 'z' ? *p - 32 : *p);
    }
    out[i] = '\0';
}

/* Rebuild a pub/sub tunnel on the current master. Returns 0 when no master
 * is UP yet (try again on wake-up). */
static int session_resubscribe(session *s)
{
    link *l = upstream_acquire(s->f->up, s);
    if (l == NULL) {
        return 0;
    }
    buf b;
    buf_init(&b);
    if (s->channels.n > 0) {
        subs_encode(&b, "SUBSCRIBE", &s->channels);
    }
    if (s->patterns.n > 0) {
        subs_encode(&b, "PSUBSCRIBE", &s->patterns);
    }
    if (s->shards.n > 0) {
        subs_encode(&b, "SSUBSCRIBE", &s->shards);
    }
    l->passthrough = 1;
    l->swallow = (int)(s->channels.n + s->patterns.n + s->shards.n);
    link_send_raw(l, buf_head(&b), buf_used(&b));
    buf_free(&b);
    s->dlink = l;
    s->resub = 0;
    log_info("client %llu: re-subscribed %zu channel(s), %zu pattern(s), %zu shard channel(s) on "
             "link %llu",
             (unsigned long long)s->id, s->channels.n, s->patterns.n, s->shards.n,
             (unsigned long long)l->id);
    return 1;
}

/* Decide how r is routed from its arguments (they are gone after this). */
static void session_classify(session *s, request *r, const resp_request *req)
{
    ferry *f = s->f;
    const resp_arg *argv = req->argv;
    size_t argc = req->argc;

    if (s->acap < argc) {
        s->acap = argc < 16 ? 16 : argc;
        s->av = xrealloc(s->av, s->acap * sizeof(*s->av));
        s->al = xrealloc(s->al, s->acap * sizeof(*s->al));
    }
    size_t nlook = argc < 2 ? argc : 2;
    for (size_t i = 0; i < nlook; i++) {
        s->av[i] = argv[i].ptr;
        s->al[i] = argv[i].len;
    }
    const command *cmd = command_lookup_argv(nlook, s->av, s->al);
    r->cmd = cmd;
    stats_count_command(&f->stats, cmd);
    if (cmd == NULL) {
        r->route = RT_SHARED; /* Redis answers unknown commands itself */
        return;
    }
    if (cmd->flags & CMD_F_WRITE) {
        r->flags |= REQ_F_WRITE;
    }
    if (f->ndeny > 0 && is_denied(f, cmd)) {
        char name[64];
        display_name(cmd, name, sizeof(name));
        set_error(r, "-ERR ferry: %s is not allowed through the proxy\r\n", name);
        f->stats.commands_denied++;
        return;
    }
    switch (cmd->cls) {
    case CMD_BLOCKING: {
        for (size_t i = 0; i < argc; i++) {
            s->av[i] = argv[i].ptr;
            s->al[i] = argv[i].len;
        }
        if (command_is_blocking(cmd, argc, s->av, s->al)) {
            r->route = RT_BLOCKING;
            r->flags |= REQ_F_BLOCKING;
        }
        return;
    }
    case CMD_PUBSUB:
        r->route = RT_TUNNEL;
        subs_track(&s->channels, &s->patterns, &s->shards, cmd->name, req);
        return;
    case CMD_TRANSACTION:
        if (strcmp(cmd->name, "multi") == 0) {
            r->route = RT_MULTI;
        } else if (strcmp(cmd->name, "exec") == 0 || strcmp(cmd->name, "discard") == 0) {
            r->route = RT_EXEC;
        } else if (strcmp(cmd->name, "watch") == 0) {
            r->route = RT_WATCH;
        } else {
            r->route = RT_UNWATCH;
        }
        return;
    case CMD_CONNSTATE:
        if (strcmp(cmd->name, "select") == 0) {
            long long db;
            if (argc != 2) {
                r->route = RT_SHARED; /* Redis answers the arity error */
            } else if (arg_ll(&argv[1], &db) != 0) {
                set_error(r, "-ERR value is not an integer or out of range\r\n%s", "");
            } else if (db < 0 || db > 0x7fffffff) {
                set_error(r, "-ERR DB index is out of range\r\n%s", "");
            } else {
                r->route = RT_SELECT;
                r->arg = db;
            }
        } else if (strcmp(cmd->name, "monitor") == 0 || strcmp(cmd->name, "client|reply") == 0) {
            r->route = RT_TUNNEL;
        } else {
            r->route = RT_STICKY;
        }
        return;
    case CMD_LOCAL:
        if (strcmp(cmd->name, "auth") == 0) {
            r->route = RT_AUTH;
            if (argc == 2) {
                r->arg = password_ok(f, NULL, &argv[1]);
            } else if (argc == 3) {
                r->arg = password_ok(f, &argv[1], &argv[2]);
            } else {
                set_error(r, "-ERR syntax error\r\n%s", "");
            }
        } else if (strcmp(cmd->name, "hello") == 0) {
            r->route = RT_HELLO;
            r->arg = HELLO_OK;
            if (argc >= 2) {
                long long ver;
                if (arg_ll(&argv[1], &ver) != 0) {
                    r->arg = HELLO_BADPROTO;
                    return;
                }
                if (ver != 2) {
                    r->arg = HELLO_NOPROTO;
                    return;
                }
                for (size_t i = 2; i < argc; i++) {
                    if (arg_eq(&argv[i], "auth") && i + 2 < argc) {
                        int ok = password_ok(f, &argv[i + 1], &argv[i + 2]);
                        r->arg = ok == AUTH_OK ? HELLO_AUTH_OK : HELLO_AUTH_FAIL;
                        i += 2;
                    } else if (arg_eq(&argv[i], "setname") && i + 1 < argc) {
                        i += 1;
                    } else {
                        r->arg = HELLO_SYNTAX;
                        return;
                    }
                }
            }
        } else if (strcmp(cmd->name, "quit") == 0) {
            r->route = RT_QUIT;
        } else {
            r->route = RT_RESET;
        }
        return;
    case CMD_DENIED:
    case CMD_STATELESS:
    default:
        break;
    }
    /* CONFIG SET of what ferry enforces is refused whatever the deny list says. */
    if (strcmp(cmd->name, "config|set") == 0) {
        for (size_t i = 2; i < argc; i += 2) {
            if (is_enforced_param(&argv[i])) {
                char what[64];
                snprintf(what, sizeof(what), "CONFIG SET %.*s",
                         (int)(argv[i].len < 40 ? argv[i].len : 40), argv[i].ptr);
                set_error(r,
                          "-ERR ferry: %s is not allowed through the proxy (ferry enforces "
                          "durability)\r\n",
                          what);
                f->stats.commands_denied++;
                return;
            }
        }
    }
}

/* Re-encode an inline command as multibulk for Redis. */
static void encode_inline(buf *b, const resp_request *req)
{
    buf_append_count(b, '*', req->argc);
    for (size_t i = 0; i < req->argc; i++) {
        buf_append_bulk(b, req->argv[i].ptr, req->argv[i].len);
    }
}

static void session_protocol_error(session *s, const char *msg)
{
    char line[256];
    int n = snprintf(line, sizeof(line), "-ERR %s\r\n", msg);
    log_info("client %llu %s: %s", (unsigned long long)s->id, s->peer, msg);
    s->f->stats.protocol_errors++;
    /* Replies to earlier requests still go out first. */
    request *r = request_new(s->f);
    r->s = s;
    r->seq = s->next_seq++;
    r->route = RT_ERROR;
    r->flags |= REQ_F_QUIT;
    buf_append(&r->reply, line, (size_t)(n < (int)sizeof(line) ? n : (int)sizeof(line) - 1));
    list_add_tail(&s->requests, &r->sq);
    s->nrequests++;
    if (s->cursor == &s->requests) {
        s->cursor = &r->sq;
    }
    if (s->reading) {
        uv_read_stop(&s->io.s);
        s->reading = 0;
    }
    buf_clear(&s->in);
}

static void session_process_input(session *s)
{
    ferry *f = s->f;
    int added = 0;

    while (buf_used(&s->in) > 0 && !s->quitting && !s->quit_seen) {
        resp_request req;
        int rc = resp_parse_request(s->parser, buf_head(&s->in), buf_used(&s->in), &req);
        if (rc == RESP_AGAIN) {
            if (buf_used(&s->in) > f->cfg->max_query_bytes) {
                session_protocol_error(
                    s, "ferry: query buffer limit reached (client.max_query_bytes)");
                added = 1;
            }
            break;
        }
        if (rc == RESP_ERR) {
            session_protocol_error(s, resp_parser_error(s->parser));
            added = 1;
            break;
        }
        if (req.argc == 0) {
            buf_consume(&s->in, req.len);
            continue;
        }
        request *r = request_new(f);
        r->s = s;
        r->seq = s->next_seq++;
        session_classify(s, r, &req);
        if (r->route != RT_ERROR && r->route != RT_AUTH && r->route != RT_HELLO &&
            r->route != RT_QUIT && r->route != RT_RESET) {
            if (req.is_inline) {
                encode_inline(&r->data, &req);
            } else {
                buf_append(&r->data, buf_head(&s->in), req.len);
            }
        }
        buf_consume(&s->in, req.len);
        f->stats.commands_total++;
        list_add_tail(&s->requests, &r->sq);
        s->nrequests++;
        s->pending_bytes += buf_used(&r->data);
        if (s->cursor == &s->requests) {
            s->cursor = &r->sq;
        }
        added = 1;
        if (r->route == RT_QUIT) {
            /* Nothing after QUIT is read: Redis closes right after it too. */
            buf_clear(&s->in);
            if (s->reading) {
                uv_read_stop(&s->io.s);
                s->reading = 0;
            }
            s->quit_seen = 1;
            break;
        }
    }
    if (buf_used(&s->in) == 0) {
        buf_shrink(&s->in, 1u << 20);
    }
    if (added) {
        session_dispatch(s);
    }
    session_check_reading(s);
}

/* Stop reading a client whose unanswered work or unread replies pile up;
 * resume once they have drained to half. */
static void session_check_reading(session *s)
{
    size_t limit = s->f->cfg->max_pending_bytes;
    size_t load = s->pending_bytes + outq_len(&s->out);
    if (s->closing || s->quitting || s->quit_seen || s->f->stopping) {
        return;
    }
    if (s->reading && load > limit) {
        uv_read_stop(&s->io.s);
        s->reading = 0;
    } else if (!s->reading && load <= limit / 2) {
        if (uv_read_start(&s->io.s, session_alloc_cb, session_read_cb) == 0) {
            s->reading = 1;
        }
        if (buf_used(&s->in) > 0) {
            session_process_input(s);
        }
    }
}

/* --------------------------------------------------------------- dispatch */

static int session_pinned(const session *s)
{
    return s->db != 0 || s->in_multi || s->watching || s->sticky || s->passthrough;
}

static void answer_hello(session *s, request *r)
{
    char line[512];
    switch (r->arg) {
    case HELLO_NOPROTO:
        session_answer_str(s, r, "-NOPROTO sorry, this protocol version is not supported.\r\n");
        return;
    case HELLO_BADPROTO:
        session_answer_str(s, r, "-ERR Protocol version is not an integer or out of range\r\n");
        return;
    case HELLO_SYNTAX:
        session_answer_str(s, r, "-ERR Syntax error in HELLO option\r\n");
        return;
    case HELLO_AUTH_FAIL:
        s->f->stats.auth_failures++;
        session_answer_str(s, r,
                           "-WRONGPASS invalid username-password pair or user is "
                           "disabled.\r\n");
        return;
    case HELLO_AUTH_OK:
        s->authed = 1;
        break;
    default:
        if (!s->authed) {
            session_answer_str(s, r,
                               "-NOAUTH HELLO must be called with the client already "
                               "authenticated, otherwise the HELLO <proto> AUTH <user> "
                               "<pass> option can be used to authenticate the client and "
                               "select the RESP protocol version at the same time\r\n");
            return;
        }
        break;
    }
    int n = snprintf(line, sizeof(line),
                     "*14\r\n$6\r\nserver\r\n$5\r\nredis\r\n$7\r\nversion\r\n$%zu\r\n%s\r\n"
                     "$5\r\nproto\r\n:2\r\n$2\r\nid\r\n:%llu\r\n$4\r\nmode\r\n$10\r\nstandalone\r\n"
                     "$4\r\nrole\r\n$6\r\nmaster\r\n$7\r\nmodules\r\n*0\r\n",
                     strlen(FERRY_REDIS_VERSION), FERRY_REDIS_VERSION, (unsigned long long)s->id);
    session_answer(s, r, line, (size_t)n);
}

/* Drop the dedicated link (RESET): pooled if it holds no state. */
static void session_drop_dlink(session *s)
{
    link *l = s->dlink;
    if (l == NULL) {
        return;
    }
    s->dlink = NULL;
    l->owner = NULL;
    if (l->passthrough || l->npending > 0 || l->db != 0 || s->in_multi || s->watching ||
        s->sticky) {
        link_close(l, "client reset its connection");
    } else {
        upstream_release(s->f->up, l);
    }
}

static int session_dispatch_one(session *s, request *r)
{
    ferry *f = s->f;
    const char *pw = f->cfg->client_password;

    if (s->tx_aborted && r->route != RT_QUIT && r->route != RT_AUTH && r->route != RT_RESET) {
        if (r->route == RT_EXEC) {
            s->tx_aborted = 0;
            session_answer_str(s, r,
                               "-EXECABORT Transaction discarded because the connection "
                               "to Redis was lost (ferry)\r\n");
        } else {
            session_answer_str(s, r,
                               "-ERR ferry: transaction aborted: the connection to Redis "
                               "was lost\r\n");
        }
        return DISPATCH_DONE;
    }
    if (pw != NULL && !s->authed && r->route != RT_AUTH && r->route != RT_HELLO &&
        r->route != RT_QUIT) {
        session_answer_str(s, r, "-NOAUTH Authentication required.\r\n");
        return DISPATCH_DONE;
    }
    if (f->cfg->require_aof && (r->flags & REQ_F_WRITE) && f->up->state == UP_UP &&
        !f->up->aof_ok) {
        char line[400];
        snprintf(line, sizeof(line),
                 "-ERR ferry: writes refused: durability (appendonly yes, "
                 "appendfsync always) is not enforced on the master: %s\r\n",
                 f->up->aof_error[0] ? f->up->aof_error : "not yet asserted");
        session_answer_str(s, r, line);
        return DISPATCH_DONE;
    }
    switch (r->route) {
    case RT_ERROR:
        r->state = REQ_ANSWERED; /* the reply was composed when it was parsed */
        s->pending_bytes -= buf_used(&r->data) <= s->pending_bytes ? buf_used(&r->data) : 0;
        f->stats.commands_local++;
        return DISPATCH_DONE;
    case RT_AUTH:
        f->stats.commands_local++;
        if (r->arg == AUTH_OK) {
            s->authed = 1;
            session_answer_str(s, r, "+OK\r\n");
        } else if (r->arg == AUTH_NOPASS) {
            session_answer_str(s, r,
                               "-ERR AUTH <password> called without any password "
                               "configured for the default user. Are you sure your "
                               "configuration is correct?\r\n");
        } else {
            f->stats.auth_failures++;
            session_answer_str(s, r,
                               "-WRONGPASS invalid username-password pair or user is "
                               "disabled.\r\n");
        }
        return DISPATCH_DONE;
    case RT_HELLO:
        f->stats.commands_local++;
        answer_hello(s, r);
        return DISPATCH_DONE;
    case RT_QUIT:
        f->stats.commands_local++;
        r->flags |= REQ_F_QUIT;
        session_answer_str(s, r, "+OK\r\n");
        return DISPATCH_DONE;
    case RT_RESET:
        if (s->inflight > 0) {
            return DISPATCH_WAIT;
        }
        f->stats.commands_local++;
        session_drop_dlink(s);
        s->db = 0;
        s->in_multi = s->watching = s->sticky = s->passthrough = s->tx_aborted = 0;
        s->authed = pw == NULL;
        session_answer_str(s, r, "+RESET\r\n");
        return DISPATCH_DONE;
    default:
        break;
    }

    if (s->dlink != NULL && s->dlink->state == LINK_CLOSING) {
        s->dlink = NULL;
    }
    if (s->dlink != NULL && !s->passthrough && s->dlink->epoch != f->up->epoch) {
        /* Lent by a master ferry has let go of (a blocked call draining). */
        if (s->inflight > 0 && s->flight_link == s->dlink) {
            return DISPATCH_WAIT;
        }
        link *old = s->dlink;
        s->dlink = NULL;
        upstream_release(f->up, old);
    }
    if (s->passthrough) {
        if (s->dlink == NULL && s->resub) {
            return DISPATCH_DOWN; /* held until the tunnel is rebuilt */
        }
        if (s->dlink == NULL) {
            session_answer_str(s, r, "-ERR ferry: the connection to Redis was lost\r\n");
            return DISPATCH_DONE;
        }
        link_send_raw(s->dlink, buf_head(&r->data), buf_used(&r->data));
        session_answer(s, r, "", 0);
        return DISPATCH_DONE;
    }

    int dedicated = session_pinned(s);
    switch (r->route) {
    case RT_BLOCKING:
    case RT_MULTI:
    case RT_WATCH:
    case RT_STICKY:
    case RT_TUNNEL:
        dedicated = 1;
        break;
    case RT_SELECT:
        if (r->arg == 0 && !dedicated) {
            session_answer_str(s, r, "+OK\r\n");
            return DISPATCH_DONE;
        }
        dedicated = 1;
        break;
    default:
        break;
    }
    if (r->route == RT_TUNNEL && s->inflight > 0) {
        return DISPATCH_WAIT; /* the tunnel starts once everything before is answered */
    }
    link *target;
    if (dedicated) {
        if (s->dlink == NULL) {
            s->dlink = upstream_acquire(f->up, s);
        }
        target = s->dlink;
    } else {
        target = upstream_shared(f->up, s->id);
    }
    if (target == NULL) {
        return DISPATCH_DOWN;
    }
    if (s->inflight > 0 && s->flight_link != target) {
        return DISPATCH_WAIT; /* never in flight on two links: ordering */
    }
    switch (r->route) {
    case RT_MULTI:
        s->in_multi = 1;
        break;
    case RT_EXEC:
        if (target == s->dlink) {
            s->in_multi = 0;
            s->watching = 0;
        }
        break;
    case RT_WATCH:
        s->watching = 1;
        break;
    case RT_UNWATCH:
        if (target == s->dlink && !s->in_multi) {
            s->watching = 0;
        }
        break;
    case RT_SELECT:
        s->db = (int)r->arg;
        target->db = (int)r->arg;
        break;
    case RT_STICKY:
        s->sticky = 1;
        break;
    case RT_TUNNEL:
        s->passthrough = 1;
        target->passthrough = 1;
        if (r->cmd == NULL || r->cmd->cls != CMD_PUBSUB) {
            s->tunnel_other = 1;
        }
        link_send_raw(target, buf_head(&r->data), buf_used(&r->data));
        session_answer(s, r, "", 0);
        return DISPATCH_DONE;
    default:
        break;
    }
    if (r->flags & REQ_F_REARM) {
        const char *expired = NULL;
        size_t before = buf_used(&r->data);
        int done = request_rearm_blocking(r, uv_now(f->loop), &expired);
        s->pending_bytes = s->pending_bytes + buf_used(&r->data) - before;
        r->flags &= ~REQ_F_REARM;
        if (done != 0) {
            session_answer_str(s, r, expired); /* its time ran out meanwhile */
            return DISPATCH_DONE;
        }
    }
    r->s = s;
    r->sent_ns = uv_hrtime();
    link_send(target, r);
    s->inflight++;
    s->flight_link = target;
    return DISPATCH_DONE;
}

static void session_dispatch(session *s)
{
    ferry *f = s->f;
    list_node *n = s->cursor;
    int rc = DISPATCH_DONE;

    if (s->closing) {
        return;
    }
    if (s->resub && !session_resubscribe(s)) {
        session_wait(s);
        return;
    }
    while (n != &s->requests) {
        request *r = list_entry(n, request, sq);
        if (r->state != REQ_HELD) {
            n = n->next;
            continue;
        }
        list_node *next = n->next; /* r may be written out and recycled */
        rc = session_dispatch_one(s, r);
        if (rc != DISPATCH_DONE) {
            if (rc == DISPATCH_DOWN && r->held_since == r->born && s->held_bytes == 0) {
                r->held_since = uv_now(f->loop);
            }
            break;
        }
        n = next;
    }
    s->cursor = n;
    if (rc == DISPATCH_DOWN) {
        session_wait(s);
        /* Account what is held, for the hold bound. */
        size_t held = 0;
        for (list_node *m = n; m != &s->requests; m = m->next) {
            request *r = list_entry(m, request, sq);
            if (r->state == REQ_HELD) {
                held += buf_used(&r->data);
            }
        }
        session_set_held(s, held);
        stats_held(&f->stats, f->held_bytes);
        if (f->held_bytes > f->cfg->hold_max_bytes) {
            /* Past the bound, the newest held requests are refused at once. */
            list_node *prev;
            for (list_node *m = s->requests.prev;
                 m != &s->requests && f->held_bytes > f->cfg->hold_max_bytes; m = prev) {
                request *r = list_entry(m, request, sq);
                prev = m->prev; /* r may be written out and recycled below */
                if (r->state == REQ_HELD) {
                    session_set_held(s, s->held_bytes - buf_used(&r->data));
                    f->stats.requests_tryagain++;
                    session_answer_str(s, r,
                                       "-TRYAGAIN ferry: no master and the hold buffer is "
                                       "full (upstream.hold_max_bytes)\r\n");
                }
            }
        }
    } else {
        if (list_linked(&s->wait_node)) {
            list_del(&s->wait_node);
        }
        session_set_held(s, 0);
    }
    session_flush_answered(s);
    session_maybe_release(s);
}

static void session_maybe_release(session *s)
{
    if (s->dlink == NULL || session_pinned(s)) {
        return;
    }
    if (s->inflight > 0 && s->flight_link == s->dlink) {
        return;
    }
    /* Held requests that need it again will borrow one from the pool. */
    link *l = s->dlink;
    s->dlink = NULL;
    upstream_release(s->f->up, l);
}

/* ------------------------------------------------------------ link events */

void session_on_reply(session *s, request *r, const char *p, size_t n)
{
    stats_observe_reply(&s->f->stats, r->born_ns, r->sent_ns, uv_hrtime(), n > 0 && p[0] == '-');
    s->inflight--;
    if (s->inflight == 0) {
        s->flight_link = NULL;
    }
    session_answer(s, r, p, n);
    session_flush_answered(s);
    if (s->inflight == 0) {
        session_dispatch(s);
    }
    session_check_reading(s);
}

void session_on_stream(session *s, const char *p, size_t n)
{
    if (s->closing) {
        return;
    }
    if (list_empty(&s->requests)) {
        buf_append(&s->out.fill, p, n);
    } else {
        /* Something answered by ferry is still queued: keep the order. */
        request *r = request_new(s->f);
        r->s = s;
        r->seq = s->next_seq++;
        r->state = REQ_ANSWERED;
        buf_append(&r->reply, p, n);
        list_add_tail(&s->requests, &r->sq);
        s->nrequests++;
        session_flush_answered(s);
    }
    session_mark_dirty(s);
}

void session_on_lost(session *s, request *r, const char *reason)
{
    ferry *f = s->f;
    char line[256];

    s->inflight--;
    if (s->inflight == 0) {
        s->flight_link = NULL;
    }
    if (s->in_multi || r->route == RT_MULTI || r->route == RT_EXEC || s->watching) {
        /* Nothing safe to replay inside a transaction: fail it clearly. */
        s->tx_aborted = s->in_multi || r->route == RT_MULTI || s->watching;
        if (r->route == RT_EXEC) {
            s->tx_aborted = 0;
        }
        s->in_multi = 0;
        s->watching = 0;
        f->stats.requests_failed++;
        snprintf(line, sizeof(line),
                 "-ERR ferry: the connection to Redis was lost inside a "
                 "transaction (%s)\r\n",
                 reason);
        session_answer_str(s, r, line);
        session_flush_answered(s);
        return;
    }
    if (r->flags & REQ_F_BLOCKING) {
        /* Re-issued with what is left of its timeout when it is sent again
         * (time held waiting for a master counts too). A read: it may be
         * re-issued after every failover. */
        r->flags |= REQ_F_REARM;
        r->retries = 0;
    }
    if (r->retries < SESSION_MAX_RETRIES) {
        r->retries++;
        r->state = REQ_HELD;
        r->held_since = uv_now(f->loop);
        f->stats.requests_retried++;
        request *c = s->cursor == &s->requests ? NULL : list_entry(s->cursor, request, sq);
        if (c == NULL || r->seq < c->seq) {
            s->cursor = &r->sq;
        }
        session_wait(s);
        log_debug("client %llu: request re-queued after lost link (%s)", (unsigned long long)s->id,
                  reason);
        return;
    }
    f->stats.requests_failed++;
    snprintf(line, sizeof(line), "-ERR ferry: request failed %d times: %s\r\n", r->retries + 1,
             reason);
    session_answer_str(s, r, line);
    session_flush_answered(s);
}

void session_on_link_closed(session *s, struct link *l, const char *reason)
{
    if (s->dlink != l) {
        return;
    }
    s->dlink = NULL;
    if (s->passthrough && !s->tunnel_other && !s->f->stopping) {
        /* Pub/sub survives a failover: subscribe again on the next master. */
        s->resub = 1;
        log_info("client %llu: pub/sub link lost (%s); will re-subscribe",
                 (unsigned long long)s->id, reason);
        session_wait(s);
        return;
    }
    if (s->passthrough) {
        /* MONITOR and CLIENT REPLY tunnels are not rebuilt: end it, after
         * what was already received is written. */
        s->quitting = 1;
        session_mark_dirty(s);
        log_info("client %llu: pass-through link lost (%s)", (unsigned long long)s->id, reason);
        return;
    }
    if (s->in_multi || s->watching) {
        s->tx_aborted = 1;
        s->in_multi = 0;
        s->watching = 0;
    }
    session_wait(s);
}

/* --------------------------------------------------------------- periodic */

void session_wake_all(ferry *f)
{
    list_node batch;
    list_init(&batch);
    /* Move the waiting list aside: dispatch may put sessions back on it. */
    if (list_empty(&f->waiting)) {
        return;
    }
    batch.next = f->waiting.next;
    batch.prev = f->waiting.prev;
    batch.next->prev = &batch;
    batch.prev->next = &batch;
    list_init(&f->waiting);
    while (!list_empty(&batch)) {
        list_node *n = list_first(&batch);
        session *s = list_entry(n, session, wait_node);
        list_del(n);
        session_dispatch(s);
    }
}

void session_tick(ferry *f, uint64_t now)
{
    const config *cfg = f->cfg;
    list_node *n, *t;

    /* Held requests past hold_timeout_ms get -TRYAGAIN. */
    list_foreach_safe(n, t, &f->waiting)
    {
        session *s = list_entry(n, session, wait_node);
        int answered = 0;
        list_node *next;
        for (list_node *m = s->cursor; m != &s->requests; m = next) {
            request *r = list_entry(m, request, sq);
            next = m->next; /* r may be written out and recycled below */
            if (r->state != REQ_HELD) {
                continue;
            }
            if (now - r->held_since < cfg->hold_timeout_ms) {
                break;
            }
            char line[128];
            snprintf(line, sizeof(line), "-TRYAGAIN ferry: no master for %llu ms\r\n",
                     (unsigned long long)(now - f->up->down_since_ms));
            f->stats.requests_tryagain++;
            session_answer_str(s, r, line);
            answered = 1;
        }
        if (answered) {
            session_dispatch(s);
        }
    }
    if (cfg->idle_timeout_ms > 0) {
        list_foreach_safe(n, t, &f->sessions)
        {
            session *s = list_entry(n, session, node);
            if (s->nrequests == 0 && !s->passthrough && s->inflight == 0 && !s->closing &&
                now - s->last_active_ms >= cfg->idle_timeout_ms) {
                session_close(s, "idle timeout (client.idle_timeout_ms)");
            }
        }
    }
}

void session_stop_all(ferry *f, int force)
{
    list_node *n, *t;
    list_foreach_safe(n, t, &f->sessions)
    {
        session *s = list_entry(n, session, node);
        if (s->reading) {
            uv_read_stop(&s->io.s);
            s->reading = 0;
        }
        int only_blocked = s->inflight > 0 && s->flight_link != NULL && s->flight_link == s->dlink;
        if (force || s->nrequests == 0 || s->passthrough || only_blocked) {
            if (outq_len(&s->out) == 0 || force) {
                session_close(s, force ? "ferry stopped (shutdown timeout)" : "ferry is stopping");
            } else {
                s->quitting = 1;
            }
        }
    }
}
