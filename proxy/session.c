/* session.c - one client connection: reads and parses its requests into
 * a queue in arrival order, hands them to the router, and writes replies
 * back strictly in request order, whichever link produced them.
 *
 *   requests:  [answered][sent][sent][held][held]...
 *                 ^flushed from the head      ^cursor: next to dispatch
 */
#include "session.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "backlog.h"
#include "log.h"
#include "router.h"
#include "upstream.h"

#define SESSION_READ_CHUNK (16 * 1024)
#define CLIENT_KEEPALIVE_S 300

static void session_alloc_cb(uv_handle_t *h, size_t hint, uv_buf_t *b);
static void session_read_cb(uv_stream_t *st, ssize_t nread, const uv_buf_t *b);
static void session_write_cb(uv_write_t *w, int status);
static void session_close_cb(uv_handle_t *h);
static void session_process_input(session *s);
static void session_mark_dirty(session *s);

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
        session_set_state(s, SESSION_QUITTING);
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

int session_adopt(ferry *f, uv_os_sock_t fd, session_import *im)
{
    session *s = xcalloc(1, sizeof(*s));
    int rc;

    s->f = f;
    if (im->is_unix) {
        uv_pipe_init(f->loop, &s->io.pipe, 0);
        rc = uv_pipe_open(&s->io.pipe, fd);
    } else {
        uv_tcp_init(f->loop, &s->io.tcp);
        rc = uv_tcp_open(&s->io.tcp, fd);
    }
    s->io.h.data = s;
    if (rc < 0) {
        uv_close(&s->io.h, session_close_cb); /* fd is not the handle's: the caller's */
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
    s->authed = im->authed;
    s->last_active_ms = uv_now(f->loop);
    list_add_tail(&f->sessions, &s->node);
    f->nclients++;
    snprintf(s->peer, sizeof(s->peer), "%s", im->peer);
    if (!im->is_unix) {
        uv_tcp_nodelay(&s->io.tcp, 1);
        uv_tcp_keepalive(&s->io.tcp, 1, CLIENT_KEEPALIVE_S);
    }
    s->channels = im->channels;
    s->patterns = im->patterns;
    s->shards = im->shards;
    memset(&im->channels, 0, sizeof(im->channels));
    memset(&im->patterns, 0, sizeof(im->patterns));
    memset(&im->shards, 0, sizeof(im->shards));
    router_restore(s, im->db, im->pubsub);
    log_debug("client %llu %s taken over (db %d%s, %zu byte(s) to parse)",
              (unsigned long long)s->id, s->peer, s->db, im->pubsub ? ", subscribed" : "",
              im->ninput);
    rc = uv_read_start(&s->io.s, session_alloc_cb, session_read_cb);
    if (rc < 0) {
        session_close(s, uv_strerror(rc));
        return 0;
    }
    s->reading = 1;
    buf_append(&s->in, im->input, im->ninput);
    if (buf_used(&s->in) > 0) {
        session_process_input(s); /* dispatches (and re-subscribes) too */
    } else if (im->pubsub) {
        router_dispatch(s);
    }
    return 0;
}

void session_stop_reading(session *s)
{
    if (s->reading) {
        uv_read_stop(&s->io.s);
        s->reading = 0;
    }
}

static const char *session_state_name(session_state st)
{
    static const char *const names[] = {"OPEN", "QUIT_SEEN", "QUITTING", "CLOSING"};
    return names[st];
}

void session_set_state(session *s, session_state st)
{
    static const unsigned legal[] = {
        [SESSION_OPEN] = 1u << SESSION_QUIT_SEEN | 1u << SESSION_QUITTING | 1u << SESSION_CLOSING,
        [SESSION_QUIT_SEEN] = 1u << SESSION_QUITTING | 1u << SESSION_CLOSING,
        [SESSION_QUITTING] = 1u << SESSION_CLOSING,
        [SESSION_CLOSING] = 0,
    };
    if (s->state == st) {
        return;
    }
    ferry_assert(legal[s->state] & (1u << st));
    log_debug("client %llu: %s -> %s", (unsigned long long)s->id, session_state_name(s->state),
              session_state_name(st));
    s->state = st;
}

void session_unlink(session *s, request *r)
{
    if (s->cursor == &r->sq) {
        s->cursor = r->sq.next;
    }
    list_del(&r->sq);
    s->nrequests--;
}

void session_close(session *s, const char *reason)
{
    ferry *f = s->f;
    if (s->state == SESSION_CLOSING) {
        return;
    }
    session_set_state(s, SESSION_CLOSING);
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
    backlog_release(s);
    if (list_linked(&s->dirty_node)) {
        list_del(&s->dirty_node);
    }
    /* Requests on a link stay there, orphaned: the link drops their replies. */
    while (!list_empty(&s->requests)) {
        request *r = list_entry(list_first(&s->requests), request, sq);
        session_unlink(s, r);
        if (r->state == REQ_SENT || r->state == REQ_WAITING) {
            r->s = NULL;
        } else {
            request_free(f, r);
        }
    }
    /* A vanished consumer must not leave a BRPOP behind that would take an
     * item nobody receives: a link with anything in flight or any state is
     * closed, not pooled. */
    upstream_return(f->up, s,
                    !router_holds_state(s) && s->tunnel == TUN_NONE && !s->sticky && s->db == 0,
                    "its client left");
    router_forget(s);
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
    if (s->state != SESSION_CLOSING && !list_linked(&s->dirty_node)) {
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
        } else if (rc == 1 && s->state == SESSION_QUITTING && outq_len(&s->out) == 0) {
            session_close(s, "closed after reply");
        }
    }
}

static void session_write_cb(uv_write_t *w, int status)
{
    session *s = w->handle->data;
    outq_done(&s->out);
    if (s->state == SESSION_CLOSING) {
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
    } else if (s->state == SESSION_QUITTING) {
        session_close(s, "closed after reply");
        return;
    }
    session_check_reading(s);
}

void session_answer(session *s, request *r, const char *p, size_t n)
{
    request_set_state(r, REQ_ANSWERED);
    s->pending_bytes -=
        buf_used(&r->data) <= s->pending_bytes ? buf_used(&r->data) : s->pending_bytes;
    if (list_first(&s->requests) == &r->sq && buf_used(&r->reply) == 0) {
        buf_append(&s->out.fill, p, n);
        if (r->flags & REQ_F_QUIT) {
            session_set_state(s, SESSION_QUITTING);
        }
        session_unlink(s, r);
        request_free(s->f, r);
    } else {
        buf_clear(&r->reply);
        buf_append(&r->reply, p, n);
    }
}

void session_answer_str(session *s, request *r, const char *text)
{
    session_answer(s, r, text, strlen(text));
}

void session_flush_answered(session *s)
{
    int wrote = 0;
    while (s->state != SESSION_QUITTING && s->state != SESSION_CLOSING) {
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
            session_set_state(s, SESSION_QUITTING);
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
    if (s->state == SESSION_CLOSING) {
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
    r->flags |= REQ_F_QUIT;
    list_add_tail(&s->requests, &r->sq);
    s->nrequests++;
    session_answer(s, r, line, (size_t)(n < (int)sizeof(line) ? n : (int)sizeof(line) - 1));
    if (s->reading) {
        uv_read_stop(&s->io.s);
        s->reading = 0;
    }
    if (s->state == SESSION_OPEN) {
        session_set_state(s, SESSION_QUIT_SEEN);
    }
    buf_clear(&s->in);
}

static void session_process_input(session *s)
{
    ferry *f = s->f;
    int added = 0;

    while (buf_used(&s->in) > 0 && s->state == SESSION_OPEN) {
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
        if (!router_classify(s, r, &req)) {
            if (req.is_inline) {
                encode_inline(&r->data, &req);
            } else {
                buf_append(&r->data, buf_head(&s->in), req.len);
            }
            r->deadline = request_block_deadline(r, uv_now(f->loop));
        }
        int is_quit = r->cmd != NULL && strcmp(r->cmd->name, "quit") == 0;
        buf_consume(&s->in, req.len);
        f->stats.commands_total++;
        list_add_tail(&s->requests, &r->sq);
        s->nrequests++;
        s->pending_bytes += buf_used(&r->data);
        if (s->cursor == &s->requests) {
            s->cursor = &r->sq;
        }
        added = 1;
        if (is_quit) {
            /* Nothing after QUIT is read: Redis closes right after it too. */
            buf_clear(&s->in);
            if (s->reading) {
                uv_read_stop(&s->io.s);
                s->reading = 0;
            }
            session_set_state(s, SESSION_QUIT_SEEN);
            break;
        }
    }
    if (buf_used(&s->in) == 0) {
        buf_shrink(&s->in, 1u << 20);
    }
    if (added) {
        router_dispatch(s);
    }
    session_check_reading(s);
}

/* Stop reading a client whose unanswered work or unread replies pile up;
 * resume once they have drained to half. */
void session_check_reading(session *s)
{
    size_t limit = s->f->cfg->max_pending_bytes;
    size_t load = s->pending_bytes + outq_len(&s->out);
    if (s->state != SESSION_OPEN || s->f->stopping || (s->f->handing_over && s->tx == TX_NONE)) {
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

/* ------------------------------------------------------------ link events */

void session_on_stream(session *s, const char *p, size_t n)
{
    if (s->state == SESSION_CLOSING) {
        return;
    }
    if (list_empty(&s->requests)) {
        buf_append(&s->out.fill, p, n);
    } else {
        /* Something answered by ferry is still queued: keep the order. */
        request *r = request_new(s->f);
        r->s = s;
        r->seq = s->next_seq++;
        request_set_state(r, REQ_ANSWERED);
        buf_append(&r->reply, p, n);
        list_add_tail(&s->requests, &r->sq);
        s->nrequests++;
        session_flush_answered(s);
    }
    session_mark_dirty(s);
}

/* --------------------------------------------------------------- periodic */

void session_tick(ferry *f, uint64_t now)
{
    const config *cfg = f->cfg;
    list_node *n, *t;

    if (cfg->idle_timeout_ms > 0) {
        list_foreach_safe(n, t, &f->sessions)
        {
            session *s = list_entry(n, session, node);
            if (s->nrequests == 0 && s->tunnel == TUN_NONE && s->inflight == 0 &&
                s->state == SESSION_OPEN && now - s->last_active_ms >= cfg->idle_timeout_ms) {
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
        if (force || s->nrequests == 0 || s->tunnel != TUN_NONE || only_blocked) {
            if (outq_len(&s->out) == 0 || force) {
                session_close(s, force ? "ferry stopped (shutdown timeout)" : "ferry is stopping");
            } else if (s->state != SESSION_CLOSING) {
                session_set_state(s, SESSION_QUITTING);
            }
        }
    }
}
