/* session.c - one client connection: reads and parses its requests into
 * a queue in arrival order, hands them to the router, and writes replies
 * back strictly in request order, whichever link produced them.
 *
 *   requests:  [answered][sent][sent][held][held]...
 *                 ^flushed from the head      ^cursor: next to dispatch
 */
#include "session.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif

#include "acl.h"
#include "backlog.h"
#include "lease.h"
#include "link.h"
#include "log.h"
#include "receipts.h"
#include "router.h"
#include "tls.h"
#include "upstream.h"
#include "workers.h"
#include "xreads.h"

#define SESSION_READ_CHUNK (16 * 1024)
#define CLIENT_KEEPALIVE_S 300

static void session_alloc_cb(uv_handle_t *h, size_t hint, uv_buf_t *b);
static void session_read_cb(uv_stream_t *st, ssize_t nread, const uv_buf_t *b);
static void session_write_cb(uv_write_t *w, int status);
static void session_wrote(session *s, int status);
static void session_close_cb(uv_handle_t *h);
static void session_settle_watches(session *s, int closing);
static void session_process_input(session *s, buf *in);
static void session_mark_dirty(session *s);
static void session_output_grew(session *s);
static void session_touch(session *s);
static void session_output_shrank(session *s);
static void session_charge(session *s, request *r, size_t n);
static void session_count_buffers(session *s);
static void session_check_tunnel(session *s);
static void session_note_partial(session *s, int incomplete, int new_request);
static void session_tls_input(session *s, const char *p, size_t n);

/* ------------------------------------------------------------ accept/close */

/* A session for a client socket of this kind: its handle is initialised
 * (the caller attaches the socket to it, and closes it on failure). */
static session *session_new(ferry *f, int is_unix)
{
    session *s = xcalloc(1, sizeof(*s));
    s->f = f;
    if (is_unix) {
        uv_pipe_init(f->loop, &s->io.pipe, 0);
    } else {
        uv_tcp_init(f->loop, &s->io.tcp);
    }
    s->io.h.data = s;
    return s;
}

/* The client's address for logs, kept as numbers (session_peer). */
static void session_peer_name(session *s, int is_unix)
{
    struct sockaddr_storage ss;
    int len = sizeof(ss);
    session_addr *a = &s->peer;
    memset(a, 0, sizeof(*a));
    if (is_unix) {
        a->kind = SESSION_ADDR_UNIX;
        return;
    }
    if (uv_tcp_getpeername(&s->io.tcp, (struct sockaddr *)&ss, &len) == 0) {
        if (ss.ss_family == AF_INET) {
            struct sockaddr_in *in = (struct sockaddr_in *)&ss;
            a->kind = SESSION_ADDR_IP4;
            memcpy(a->ip, &in->sin_addr, 4);
            a->port = ntohs(in->sin_port);
        } else if (ss.ss_family == AF_INET6) {
            struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)&ss;
            a->kind = SESSION_ADDR_IP6;
            memcpy(a->ip, &in6->sin6_addr, 16);
            a->port = ntohs(in6->sin6_port);
        }
    }
}

/* Everything a session with a connected socket needs, whether accepted
 * here or taken over from another process: id, lists, buffers, memory
 * accounting, the idle clock, socket options. */
static void session_register(session *s, int is_unix)
{
    ferry *f = s->f;
    s->id = ferry_next_id(f);
    list_init(&s->node);
    list_init(&s->dirty_node);
    list_init(&s->requests);
    s->cursor = &s->requests;
    outq_init(&s->out);
    s->authed = f->cfg->client_password == NULL && f->cfg->client_auth != CLIENT_AUTH_REDIS;
    s->proto = 2;
    s->last_active_ms = uv_now(f->loop);
    s->opened_ms = s->last_active_ms;
    list_add_tail(&f->idle, &s->idle_node);
    list_add_tail(&f->sessions, &s->node);
    f->nclients++;
    workers_client_opened(f);
    f->clients_mem += sizeof(*s);
    f->stats.clients_total++;
    session_peer_name(s, is_unix);
    if (!is_unix) {
        uv_tcp_nodelay(&s->io.tcp, 1);
        uv_tcp_keepalive(&s->io.tcp, 1, CLIENT_KEEPALIVE_S);
    }
}

/* Move node n (of a session, at node_off) in the list head, kept oldest
 * first by the uint64_t at time_off, to its place. A session taken over
 * from another process brings clocks that began before now; walking from
 * the newest end is short when they arrive in that list's order. */
static void session_place_by_time(list_node *head, list_node *n, size_t node_off, size_t time_off)
{
    const char *me = (const char *)n - node_off;
    uint64_t t = *(const uint64_t *)(me + time_off);
    list_node *p;
    list_del(n);
    for (p = head->prev; p != head; p = p->prev) {
        const char *other = (const char *)p - node_off;
        if (*(const uint64_t *)(other + time_off) <= t) {
            break;
        }
    }
    list_add_tail(p->next, n); /* right after p */
}

/* Start reading s. Returns 0, or closes s and returns the error. */
static int session_start_reading(session *s)
{
    int rc = uv_read_start(&s->io.s, session_alloc_cb, session_read_cb);
    if (rc < 0) {
        session_close(s, uv_strerror(rc));
        return rc;
    }
    s->reading = 1;
    return 0;
}

/* A new client's socket is s's: count it, refuse it past
 * client.max_clients (all loops together), or start reading it. how:
 * FERRY_ACCEPT_* flags. */
static int session_begin(session *s, int how)
{
    ferry *f = s->f;
    session_register(s, how & FERRY_ACCEPT_UNIX);
    log_debug("client %llu %s connected%s", (unsigned long long)s->id, session_peer(s),
              how & FERRY_ACCEPT_TLS ? " (TLS)" : "");
    if (how & FERRY_ACCEPT_TLS) {
        /* Its handshake must end within tls.handshake_timeout_ms. */
        s->out.tls = f->tls != NULL && f->tls->clients != NULL
                         ? tls_new_server(f->tls->clients, how >> FERRY_ACCEPT_INDEX_SHIFT)
                         : NULL;
        if (s->out.tls == NULL) {
            session_close(s, "cannot start a TLS session");
            return 0;
        }
        list_add_tail(&f->handshaking, &session_extra_w(s)->tls_node);
    } else {
        s->fresh = 1;
    }

    if (workers_clients(f) > (uint64_t)f->cfg->max_clients) {
        f->stats.clients_rejected++;
        buf_append_str(&s->out.fill, "-ERR max number of clients reached\r\n");
        session_set_state(s, SESSION_QUITTING);
        session_output_grew(s);
        return 0;
    }
    session_start_reading(s);
    return 0;
}

int session_accept(ferry *f, uv_stream_t *server, int how)
{
    session *s = session_new(f, how & FERRY_ACCEPT_UNIX);
    int rc = uv_accept(server, &s->io.s);
    if (rc < 0) {
        uv_close(&s->io.h, session_close_cb); /* initialised: freed once closed */
        return rc;
    }
    return session_begin(s, how);
}

int session_accept_fd(ferry *f, uv_os_sock_t fd, int how)
{
    int is_unix = how & FERRY_ACCEPT_UNIX;
    session *s = session_new(f, is_unix);
    int rc = is_unix ? uv_pipe_open(&s->io.pipe, fd) : uv_tcp_open(&s->io.tcp, fd);
    if (rc < 0) {
        uv_close(&s->io.h, session_close_cb); /* fd is not the handle's: the caller's */
        return rc;
    }
    return session_begin(s, how);
}

int session_adopt(ferry *f, uv_os_sock_t fd, session_import *im)
{
    session *s = session_new(f, im->is_unix);
    uint64_t now = uv_now(f->loop);
    int rc = im->is_unix ? uv_pipe_open(&s->io.pipe, fd) : uv_tcp_open(&s->io.tcp, fd);
    if (rc < 0) {
        uv_close(&s->io.h, session_close_cb); /* fd is not the handle's: the caller's */
        return rc;
    }
    /* Already connected: max_clients does not apply (refusing it now would
     * be an error the client never saw from the process it connected to). */
    session_register(s, im->is_unix);
    s->authed = im->authed;
    char why[300];
    if (acl_adopt(s, im, why, sizeof(why)) < 0) {
        /* Nothing of it runs as anyone else: it connects and authenticates
         * again, as after Redis closed a deleted user's connection. */
        session_close(s, why);
        return 0;
    }
    /* The idle clock goes on where it was. */
    s->last_active_ms = now >= im->idle_ms ? now - im->idle_ms : 0;
    session_place_by_time(&f->idle, &s->idle_node, offsetof(session, idle_node),
                          offsetof(session, last_active_ms));
    s->subs = im->subs;
    im->subs = NULL;
    router_restore(s, im);
    log_debug("client %llu %s taken over (db %d%s, %zu byte(s) to parse)",
              (unsigned long long)s->id, session_peer(s), s->db, im->pubsub ? ", subscribed" : "",
              im->ninput);
    if (session_start_reading(s) < 0) {
        return 0;
    }
    if (im->ninput > 0) {
        session_extra *x = session_extra_w(s);
        buf_append(&x->in, im->input, im->ninput);
        session_process_input(s, &x->in); /* dispatches (and re-subscribes) too */
        if (list_linked(&x->partial_node) && im->partial_ms > 0) {
            /* client.request_timeout_ms: the request began arriving then. */
            x->partial_since_ms = now >= im->partial_ms ? now - im->partial_ms : 0;
            session_place_by_time(&f->partial, &x->partial_node,
                                  offsetof(session_extra, partial_node),
                                  offsetof(session_extra, partial_since_ms));
        }
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
    s->req_mem -= r->charge;
    s->f->clients_mem -= r->charge;
    r->charge = 0;
}

/* Append r to s's queue and charge its memory (object and buffers as allocated). */
static void session_enqueue(session *s, request *r)
{
    list_add_tail(&s->requests, &r->sq);
    s->nrequests++;
    session_charge(s, r, sizeof(*r) + r->data.cap + r->reply.cap);
}

int session_over_memory(const ferry *f)
{
    return f->cfg->max_memory > 0 && f->clients_mem + f->others_mem > f->cfg->max_memory;
}

/* Charge n more bytes of r to s (and to ferry's total). */
static void session_charge(session *s, request *r, size_t n)
{
    r->charge += n;
    s->req_mem += n;
    s->f->clients_mem += n;
}

/* Recount the storage of s's buffers (O(1)): call after they change. */
static void session_count_buffers(session *s)
{
    size_t now = session_extra_r(s)->in.cap + outq_mem(&s->out);
    s->f->clients_mem = s->f->clients_mem - s->buf_mem + now;
    s->buf_mem = now;
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
        log_debug("client %llu %s closed: %s", (unsigned long long)s->id, session_peer(s), reason);
    } else {
        log_info("client %llu %s closed: %s", (unsigned long long)s->id, session_peer(s), reason);
    }
    /* Replies the socket took are written; the others never will be. */
    session_settle_watches(s, 1);
    if (s->reading) {
        uv_read_stop(&s->io.s);
        s->reading = 0;
    }
    backlog_release(s);
    lease_client_gone(s);    /* before its requests go: the link is still the same */
    receipts_client_gone(s); /* its pops undone, for the same reason */
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
    if (s->extra != NULL) {
        session_extra *x = s->extra;
        if (list_linked(&x->soft_node)) {
            list_del(&x->soft_node);
        }
        if (list_linked(&x->mem_node)) {
            list_del(&x->mem_node);
        }
        if (list_linked(&x->partial_node)) {
            list_del(&x->partial_node);
        }
        if (list_linked(&x->tls_node)) {
            list_del(&x->tls_node);
        }
        f->clients_mem -= sizeof(*x);
    }
    list_del(&s->idle_node);
    f->nclients--;
    workers_client_closed(f);
    f->clients_mem -= sizeof(*s) + s->buf_mem; /* its requests were uncharged above */
    s->buf_mem = 0;
    outq_tls_bye(&s->out, &s->io.s); /* TLS: close_notify */
    uv_close(&s->io.h, session_close_cb);
}

static void session_close_cb(uv_handle_t *h)
{
    session *s = h->data;
    outq_free(&s->out);
    sub_sets_free(s->subs);
    xreads_forget(s);
    if (s->extra != NULL) {
        resp_parser_free(s->extra->parser);
        buf_free(&s->extra->in);
        buf_free(&s->extra->sticky_log);
        free(s->extra->ident_on); /* its identities were let go (acl_forget) */
        free(s->extra);
    }
    free(s);
}

/* ----------------------------------------------------------------- output */

/* A reply whose writing someone waits for (request.written): told once
 * the bytes handed to the socket reach end, or, never written, when the
 * session closes first. */
typedef struct write_watch {
    list_node node; /* in s->watches, in output order */
    uint64_t end;   /* outq_end() just after the reply was queued */
    req_sent_cb cb; /* from the request */
    void *arg;
} write_watch;

/* r's reply was just queued in s's output: its writing is watched. */
static void session_watch(session *s, request *r)
{
    if (r->written == NULL) {
        return;
    }
    write_watch *w = xmalloc(sizeof(*w));
    w->end = outq_end(&s->out);
    w->cb = r->written;
    w->arg = r->written_arg;
    r->written = NULL;
    session_extra *x = session_extra_w(s);
    list_add_tail(&x->watches, &w->node);
    if (!list_linked(&x->watch_node)) {
        list_add_tail(&s->f->watching, &x->watch_node);
    }
}

/* Tell the watchers of replies the socket has taken whole; closing: tell
 * the others theirs never will be. */
static void session_settle_watches(session *s, int closing)
{
    list_node *n;
    session_extra *x = s->extra;
    if (x == NULL || list_empty(&x->watches)) {
        return;
    }
    uint64_t sent = outq_sent(&s->out, &s->io.s);
    while ((n = list_first(&x->watches)) != NULL) {
        write_watch *w = list_entry(n, write_watch, node);
        int written = w->end <= sent;
        if (!written && !closing) {
            break;
        }
        list_del(n);
        w->cb(w->arg, written);
        free(w);
    }
    if (list_empty(&x->watches) && list_linked(&x->watch_node)) {
        list_del(&x->watch_node);
    }
}

static void session_mark_dirty(session *s)
{
    if (s->state != SESSION_CLOSING && !list_linked(&s->dirty_node)) {
        list_add_tail(&s->f->dirty, &s->dirty_node);
    }
}

/* The output limit that applies to s: pub/sub clients have their own. */
static const config_output_limit *session_output_limit(const session *s)
{
    const config *cfg = s->f->cfg;
    return s->tunnel == TUN_PUBSUB || s->tunnel == TUN_PUBSUB_LOST ? &cfg->pubsub_output_limit
                                                                   : &cfg->output_limit;
}

/* Bytes queued for the client. Replies waiting for earlier ones are not
 * output yet: client.max_pipeline and client.max_pending_bytes bound them. */
static size_t session_output_bytes(const session *s)
{
    return outq_len(&s->out);
}

/* Close s for the output limit it hit (Redis' client-output-buffer-limit). */
static void session_close_at_limit(session *s)
{
    const config_output_limit *lim = session_output_limit(s);
    const char *key = lim == &s->f->cfg->pubsub_output_limit ? "client.pubsub_output_limit"
                                                             : "client.output_limit";
    char why[200];
    if (session_extra_r(s)->limit_hit == OUT_LIMIT_HARD) {
        snprintf(why, sizeof(why), "output buffer limit reached: %s.hard %zu bytes (%zu queued)",
                 key, lim->hard, session_output_bytes(s));
    } else {
        snprintf(why, sizeof(why),
                 "output buffer limit reached: %s.soft %zu bytes for %zu seconds (%zu queued)", key,
                 lim->soft, lim->soft_seconds, session_output_bytes(s));
    }
    s->f->stats.clients_output_limit_closed++;
    session_close(s, why);
}

/* Output was queued: recount, and note a limit crossed. Closing waits for
 * the flush (callers are in the middle of dispatching). */
/* s read a request or got a reply: its idle clock (client.idle_timeout_ms)
 * starts again. Most recent last, so f->idle stays ordered. */
static void session_touch(session *s)
{
    if (!list_linked(&s->idle_node)) {
        return; /* closing */
    }
    s->last_active_ms = uv_now(s->f->loop);
    list_del(&s->idle_node);
    list_add_tail(&s->f->idle, &s->idle_node);
}

static void session_output_grew(session *s)
{
    const config_output_limit *lim = session_output_limit(s);
    size_t out = session_output_bytes(s);
    session_touch(s);
    session_count_buffers(s);
    if (lim->hard > 0 && out >= lim->hard && session_extra_r(s)->limit_hit == 0) {
        session_extra_w(s)->limit_hit = OUT_LIMIT_HARD;
    }
    if (lim->soft > 0 && out > lim->soft && session_extra_r(s)->soft_since_ms == 0) {
        session_extra *x = session_extra_w(s);
        x->soft_since_ms = uv_now(s->f->loop);
        list_add_tail(&s->f->over_soft, &x->soft_node);
    }
    session_mark_dirty(s);
}

/* Output was written (or dropped): recount, and leave the soft list. */
static void session_output_shrank(session *s)
{
    session_extra *x = s->extra;
    session_count_buffers(s);
    if (x != NULL && x->soft_since_ms != 0 &&
        session_output_bytes(s) <= session_output_limit(s)->soft) {
        x->soft_since_ms = 0;
        list_del(&x->soft_node);
    }
}

void session_flush_all(ferry *f)
{
    while (!list_empty(&f->dirty)) {
        list_node *n = list_first(&f->dirty);
        session *s = list_entry(n, session, dirty_node);
        list_del(n);
        if (session_extra_r(s)->limit_hit != 0) {
            session_close_at_limit(s);
            continue;
        }
        int rc = outq_flush(&s->out, &s->io.s, session_write_cb);
        if (rc < 0 || rc == OUTQ_WRITTEN) {
            session_wrote(s, rc < 0 ? rc : 0);
        } else if (rc == OUTQ_STARTED) {
            session_settle_watches(s, 0); /* libuv wrote what the socket took at once */
        } else if (rc == OUTQ_IDLE && s->state == SESSION_QUITTING && outq_len(&s->out) == 0) {
            session_close(s, "closed after reply");
        }
    }
}

static void session_write_cb(uv_write_t *w, int status)
{
    session *s = w->handle->data;
    outq_done(&s->out, status);
    if (s->state == SESSION_CLOSING) {
        return;
    }
    session_wrote(s, status);
}

/* A write ended (status < 0: it failed), in its callback or at once. */
static void session_wrote(session *s, int status)
{
    if (status >= 0) {
        session_settle_watches(s, 0);
    }
    session_output_shrank(s);
    session_check_tunnel(s);
    if (status < 0) {
        session_close(s, status == UV_EPIPE || status == UV_ECONNRESET
                             ? "connection reset by client"
                             : uv_strerror(status));
        return;
    }
    if (buf_used(&s->out.fill) > 0 || outq_tls_wants_flush(&s->out)) {
        session_mark_dirty(s); /* TLS: or records of its own (tickets) came meanwhile */
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
        session_watch(s, r);
        if (r->flags & REQ_F_QUIT) {
            session_set_state(s, SESSION_QUITTING);
        }
        session_unlink(s, r);
        request_free(s->f, r);
    } else {
        size_t cap = r->reply.cap;
        buf_clear(&r->reply);
        buf_append(&r->reply, p, n);
        if (r->reply.cap > cap) {
            session_charge(s, r, r->reply.cap - cap);
        }
    }
    session_output_grew(s);
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
        session_watch(s, r);
        if (r->flags & REQ_F_QUIT) {
            session_set_state(s, SESSION_QUITTING);
        }
        session_unlink(s, r);
        request_free(s->f, r);
        wrote = 1;
    }
    if (wrote || buf_used(&s->out.fill) > 0) {
        session_output_grew(s);
    }
}

/* ------------------------------------------------------------------ input */

static void session_alloc_cb(uv_handle_t *h, size_t hint, uv_buf_t *b)
{
    session *s = h->data;
    (void)hint;
    if (buf_used(&session_extra_r(s)->in) == 0 || s->out.tls != NULL) {
        /* TLS: the ciphertext goes to the loop's buffer, the plaintext
         * into s->extra->in. */
        /* Nothing kept: read into the loop's buffer (libuv pairs each
         * alloc_cb with its read_cb, so one buffer serves every session). */
        b->base = s->f->rbuf;
        b->len = FERRY_READ_BUF;
        return;
    }
    buf *in = &s->extra->in; /* it holds bytes: s has its extra state */
    buf_reserve(in, SESSION_READ_CHUNK);
    b->base = in->data + in->len;
    b->len = in->cap - in->len;
}

/* Whether a connection's first bytes p[0..n) open a TLS handshake: a
 * handshake record (0x16) of TLS 1.0 to 1.3 (0x03 0x01..0x04; 0x03 0x00
 * too, SSL 3.0). No RESP request starts with 0x16 (a control character). */
static int is_tls_hello(const unsigned char *p, size_t n)
{
    return n >= 1 && p[0] == 0x16 && (n < 2 || p[1] == 0x03) && (n < 3 || p[2] <= 0x04);
}

static void session_read_cb(uv_stream_t *st, ssize_t nread, const uv_buf_t *b)
{
    session *s = st->data;
    if (s->state == SESSION_CLOSING) {
        return;
    }
    if (nread < 0) {
        if (s->out.tls != NULL && !tls_ready(s->out.tls)) {
            tls_count_failure(s->out.tls, TLS_FAIL_CLOSED);
            log_info("client %llu %s: TLS handshake failed: the client closed the connection",
                     (unsigned long long)s->id, session_peer(s));
        }
        session_close(s, nread == UV_EOF          ? "client closed the connection"
                         : nread == UV_ECONNRESET ? "connection reset by client"
                                                  : uv_strerror((int)nread));
        return;
    }
    if (nread == 0) {
        return;
    }
    session_touch(s);
    if (s->out.tls != NULL) {
        session_tls_input(s, b->base, (size_t)nread);
        return;
    }
    if (s->fresh) {
        s->fresh = 0;
        if (is_tls_hello((const unsigned char *)b->base, (size_t)nread)) {
            s->f->stats.clients_tls_on_plain_port++;
            log_info("client %llu %s: TLS handshake on a plain port (TLS is served on "
                     "listen_tls); closed",
                     (unsigned long long)s->id, session_peer(s));
            session_close(s, "TLS handshake on a plain port");
            return;
        }
    }
    if (b->base == s->f->rbuf) {
        buf view = {.data = b->base, .pos = 0, .len = (size_t)nread, .cap = FERRY_READ_BUF};
        session_process_input(s, &view);
    } else {
        s->extra->in.len += (size_t)nread;
        session_process_input(s, &s->extra->in);
    }
}

/* TLS: ciphertext read from the client; what it decrypts to is parsed
 * from s->extra->in. A TLS error before the handshake ended is counted and
 * logged (plain RESP on a TLS port, a refused certificate, ...). */
static void session_tls_input(session *s, const char *p, size_t n)
{
    int was_ready = tls_ready(s->out.tls);
    int rc = outq_tls_input(&s->out, p, n, &session_extra_w(s)->in);
    if (!was_ready && tls_ready(s->out.tls)) {
        char how[120];
        list_del(&s->extra->tls_node); /* linked at accept */
        log_debug("client %llu %s: TLS handshake done: %s", (unsigned long long)s->id,
                  session_peer(s), tls_describe(s->out.tls, how, sizeof(how)));
    }
    if (rc < 0) {
        char why[300];
        snprintf(why, sizeof(why), "%s%s", was_ready ? "TLS: " : "TLS handshake failed: ",
                 rc == TLS_EOF ? "close_notify" : tls_error(s->out.tls));
        if (!was_ready) {
            log_info("client %llu %s: %s", (unsigned long long)s->id, session_peer(s), why);
        }
        session_close(s, rc == TLS_EOF ? "client closed the connection" : why);
        return;
    }
    if (outq_tls_wants_flush(&s->out)) {
        session_mark_dirty(s);
    }
    if (buf_used(&s->extra->in) > 0) {
        session_process_input(s, &s->extra->in);
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
    log_info("client %llu %s: %s", (unsigned long long)s->id, session_peer(s), msg);
    s->f->stats.protocol_errors++;
    /* Replies to earlier requests still go out first. */
    request *r = request_new(s->f);
    r->s = s;
    r->seq = s->next_seq++;
    r->flags |= REQ_F_QUIT;
    session_enqueue(s, r);
    session_answer(s, r, line, (size_t)(n < (int)sizeof(line) ? n : (int)sizeof(line) - 1));
    if (s->reading) {
        uv_read_stop(&s->io.s);
        s->reading = 0;
    }
    if (s->state == SESSION_OPEN) {
        session_set_state(s, SESSION_QUIT_SEEN);
    }
}

/* Parse what `in` holds (the session's own buffer, or a view of the loop's
 * read buffer) into requests. What is left unparsed ends up in s->extra->in,
 * with the parser state of an incomplete request in s->extra->parser. */
static void session_process_input(session *s, buf *in)
{
    ferry *f = s->f;
    int added = 0;
    int rc = RESP_OK;
    resp_parser *p = session_extra_r(s)->parser != NULL ? s->extra->parser : f->parser;

    while (buf_used(in) > 0 && s->state == SESSION_OPEN) {
        resp_request req;
        if (s->nrequests >= f->cfg->max_pipeline) {
            break; /* the rest waits in s->extra->in until replies are read (max_pipeline) */
        }
        rc = resp_parse_request(p, buf_head(in), buf_used(in), &req);
        if (rc == RESP_AGAIN) {
            if (buf_used(in) > f->cfg->max_query_bytes) {
                session_protocol_error(
                    s, "ferry: query buffer limit reached (client.max_query_bytes)");
                buf_clear(in);
                added = 1;
            }
            break;
        }
        if (rc == RESP_ERR) {
            session_protocol_error(s, resp_parser_error(p));
            buf_clear(in);
            added = 1;
            break;
        }
        if (req.argc == 0) {
            buf_consume(in, req.len);
            continue;
        }
        request *r = request_new(f);
        r->s = s;
        r->seq = s->next_seq++;
        int local = router_classify(s, r, &req);
        if (!local && s->tx == TX_NONE && session_over_memory(f)) {
            /* New work is refused; what was accepted goes on. A transaction
             * under way is let through (it is bounded by max_pipeline). */
            router_refuse(r, "-OOM ferry: memory limit reached (limits.max_memory)\r\n");
            f->stats.requests_oom++;
            local = 1;
        }
        if (!local) {
            if (req.is_inline) {
                encode_inline(&r->data, &req);
            } else {
                buf_append(&r->data, buf_head(in), req.len);
            }
            r->deadline = request_block_deadline(r, uv_now(f->loop));
        }
        int is_quit = r->cmd != NULL && strcmp(r->cmd->name, "quit") == 0;
        buf_consume(in, req.len);
        f->stats.commands_total++;
        session_enqueue(s, r);
        s->pending_bytes += buf_used(&r->data);
        if (s->cursor == &s->requests) {
            s->cursor = &r->sq;
        }
        added = 1;
        if (is_quit) {
            /* Nothing after QUIT is read: Redis closes right after it too. */
            buf_clear(in);
            if (s->reading) {
                uv_read_stop(&s->io.s);
                s->reading = 0;
            }
            session_set_state(s, SESSION_QUIT_SEEN);
            break;
        }
    }
    session_extra *x = s->extra;
    if ((x == NULL || in != &x->in) && buf_used(in) > 0) {
        /* in is the loop's buffer, not inside x; same prefix: parser offsets hold */
        x = session_extra_w(s);
        buf_append(&x->in, buf_head(in), buf_used(in));
    }
    size_t left = x != NULL ? buf_used(&x->in) : 0;
    if (left == 0) {
        if (x != NULL) {
            buf_free(&x->in);
            resp_parser_free(x->parser); /* it holds no partial request any more */
            x->parser = NULL;
        }
        if (p == f->parser && rc != RESP_OK) {
            resp_parser_reset(p); /* the shared parser is left clean for the next session */
        }
    } else if (rc == RESP_AGAIN && p == f->parser) {
        /* The incomplete request's parser state goes with the session. */
        x->parser = p;
        f->parser = resp_parser_new(&f->limits);
    }
    session_count_buffers(s);
    session_note_partial(s, rc == RESP_AGAIN && left > 0, added);
    if (added) {
        router_dispatch(s);
    }
    session_check_reading(s);
}

/* client.request_timeout_ms: a request must arrive whole within it from its
 * first byte. Sessions with an incomplete request are kept oldest first, so
 * the tick looks only at those whose time is up. A new request begins when
 * earlier ones were parsed from the same input (new_request). */
static void session_note_partial(session *s, int incomplete, int new_request)
{
    ferry *f = s->f;
    session_extra *x = s->extra;
    if (!incomplete || !s->reading || f->cfg->request_timeout_ms == 0) {
        if (x != NULL && list_linked(&x->partial_node)) {
            list_del(&x->partial_node);
            x->partial_since_ms = 0;
        }
        return;
    }
    x = session_extra_w(s);
    if (list_linked(&x->partial_node) && !new_request) {
        return; /* the same request, still arriving */
    }
    if (list_linked(&x->partial_node)) {
        list_del(&x->partial_node);
    }
    x->partial_since_ms = uv_now(f->loop);
    list_add_tail(&f->partial, &x->partial_node);
}

/* Stop reading a client whose memory (client.max_pending_bytes: requests,
 * replies and buffers as allocated) or requests in flight
 * (client.max_pipeline) pile up; resume once both have drained to half. */
void session_check_reading(session *s)
{
    const config *cfg = s->f->cfg;
    size_t limit = cfg->max_pending_bytes;
    size_t load = session_mem(s);
    /* While sessions are handed to a new process (takeover_source.c), only
     * one in a transaction reads: it goes over once the transaction has
     * ended. */
    if (s->state != SESSION_OPEN || s->f->stopping || (s->f->handing_over && s->tx == TX_NONE)) {
        return;
    }
    /* Over limits.max_memory, the clients holding more than the average
     * are no longer read (their replies still go out). The average is over
     * every loop's clients: with workers, a loop may hold one client only. */
    uint64_t everyone = workers_clients(s->f);
    int big = session_over_memory(s->f) && everyone > 0 &&
              load > (s->f->clients_mem + s->f->others_mem) / everyone;
    if (big && !list_linked(&session_extra_r(s)->mem_node)) {
        list_add_tail(&s->f->mem_paused, &session_extra_w(s)->mem_node);
    }
    if (s->reading && (load > limit || s->nrequests >= cfg->max_pipeline || big)) {
        uv_read_stop(&s->io.s);
        s->reading = 0;
        session_note_partial(s, 0, 0); /* not read: the rest cannot arrive */
    } else if (!s->reading && !big && load <= limit / 2 && s->nrequests <= cfg->max_pipeline / 2) {
        if (list_linked(&session_extra_r(s)->mem_node)) {
            list_del(&s->extra->mem_node);
        }
        if (uv_read_start(&s->io.s, session_alloc_cb, session_read_cb) == 0) {
            s->reading = 1;
        }
        if (buf_used(&session_extra_r(s)->in) > 0) {
            session_process_input(s, &s->extra->in);
        }
    }
}

/* ------------------------------------------------------------ link events */

void session_on_stream(session *s, const char *p, size_t n)
{
    if (s->state == SESSION_CLOSING || router_on_tunnel(s, p, n)) {
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
        session_enqueue(s, r);
        session_flush_answered(s);
    }
    session_output_grew(s);
    session_check_tunnel(s);
}

void session_on_push(session *s, const char *p, size_t n)
{
    if (s->state == SESSION_CLOSING || router_on_tunnel(s, p, n)) {
        return;
    }
    /* Redis wrote the push after the replies to what it answered already
     * and before the replies still to come: it goes ahead of the first
     * request not answered yet (in flight or held), or last. */
    list_node *at = &s->requests;
    list_node *node;
    list_foreach(node, &s->requests)
    {
        request *q = list_entry(node, request, sq);
        if (q->state == REQ_SENT || q->state == REQ_HELD) {
            at = node;
            break;
        }
    }
    if (list_empty(&s->requests)) {
        buf_append(&s->out.fill, p, n);
    } else {
        request *r = request_new(s->f);
        r->s = s;
        r->seq = at == &s->requests ? s->next_seq++ : list_entry(at, request, sq)->seq;
        request_set_state(r, REQ_ANSWERED);
        buf_append(&r->reply, p, n);
        list_add_tail(at, &r->sq); /* just before at */
        s->nrequests++;
        session_charge(s, r, sizeof(*r) + r->data.cap + r->reply.cap);
        session_flush_answered(s);
    }
    session_output_grew(s);
}

/* A tunnel's stream has no request to stop reading: its link stops reading
 * from Redis while the client's memory is over client.max_pending_bytes (a
 * pub/sub client is normally closed at its output limit first). */
static void session_check_tunnel(session *s)
{
    link *l = s->dlink;
    size_t limit = s->f->cfg->max_pending_bytes;
    if (s->tunnel == TUN_NONE || l == NULL || session_extra_r(s)->limit_hit != 0) {
        return;
    }
    if (!l->paused && session_mem(s) > limit) {
        link_pause(l, 1);
    } else if (l->paused && session_mem(s) <= limit / 2) {
        link_pause(l, 0);
    }
}

/* --------------------------------------------------------------- periodic */

/* After a burst (many requests in flight at once, their buffers and
 * replies) the allocator keeps the pages they used, in pieces between the
 * sessions that stayed: idle clients would go on paying for them. Once the
 * memory held for this loop's clients has settled (the same at two ticks)
 * an eighth below its peak since the last return, and 1 MiB at least, the
 * free pages go back to the system (glibc's malloc_trim), at most once a
 * second. Per loop thread: each has its own clients (malloc_trim itself
 * covers every arena). */
static void session_return_memory(ferry *f, uint64_t now)
{
#ifdef __GLIBC__
    static _Thread_local size_t peak, prev;
    static _Thread_local uint64_t last_ms;
    size_t held = f->clients_mem;
    int settled = held == prev;
    prev = held;
    if (held > peak) {
        peak = held;
    }
    if (!settled || peak - held < ((size_t)1 << 20) || peak - held < peak / 8 ||
        now - last_ms < 1000) {
        return;
    }
    malloc_trim(0);
    peak = held;
    last_ms = now;
#else
    (void)f;
    (void)now;
#endif
}

void session_tick(ferry *f, uint64_t now)
{
    const config *cfg = f->cfg;
    list_node *n, *t;

    session_return_memory(f, now);

    /* Memory fell back under limits.max_memory: those paused for it are
     * looked at again (the rest of their input may now be parsed). */
    if (!session_over_memory(f) && !list_empty(&f->mem_paused)) {
        list_node todo; /* a session may be paused again while this runs */
        list_init(&todo);
        while ((n = list_first(&f->mem_paused)) != NULL) {
            list_del(n);
            list_add_tail(&todo, n);
        }
        while ((n = list_first(&todo)) != NULL) {
            list_del(n);
            session_check_reading(list_entry(n, session_extra, mem_node)->s);
        }
    }
    /* Replies someone waits for that the socket took part by part (libuv
     * calls back only once a whole write is done). */
    list_foreach_safe(n, t, &f->watching)
    {
        session_settle_watches(list_entry(n, session_extra, watch_node)->s, 0);
    }
    /* Oldest incomplete request first: stop at the first still in time. */
    while (cfg->request_timeout_ms > 0 && (n = list_first(&f->partial)) != NULL) {
        session *s = list_entry(n, session_extra, partial_node)->s;
        if (now - s->extra->partial_since_ms < cfg->request_timeout_ms) {
            break;
        }
        f->stats.clients_request_timeout++;
        session_close(s, "request timeout: a request did not arrive whole within "
                         "client.request_timeout_ms");
    }
    /* TLS handshakes, oldest first: one that runs past
     * tls.handshake_timeout_ms is closed, as a request that never ends. */
    while ((n = list_first(&f->handshaking)) != NULL) {
        session *s = list_entry(n, session_extra, tls_node)->s;
        if (now - s->opened_ms < cfg->tls_handshake_timeout_ms) {
            break;
        }
        tls_count_failure(s->out.tls, TLS_FAIL_TIMEOUT);
        log_info("client %llu %s: TLS handshake failed: not finished within "
                 "tls.handshake_timeout_ms",
                 (unsigned long long)s->id, session_peer(s));
        session_close(s, "TLS handshake timeout (tls.handshake_timeout_ms)");
    }
    /* Only the clients above a soft output limit are looked at. */
    list_foreach_safe(n, t, &f->over_soft)
    {
        session *s = list_entry(n, session_extra, soft_node)->s;
        if (now - s->extra->soft_since_ms >= session_output_limit(s)->soft_seconds * 1000) {
            s->extra->limit_hit = OUT_LIMIT_SOFT;
            session_close_at_limit(s);
        }
    }
    /* Least recently active first: stop at the first still in time. A client
     * busy with a request, blocked or subscribed is not idle: its idle clock
     * starts again now. */
    while (cfg->idle_timeout_ms > 0 && (n = list_first(&f->idle)) != NULL) {
        session *s = list_entry(n, session, idle_node);
        if (now - s->last_active_ms < cfg->idle_timeout_ms) {
            break;
        }
        if (s->nrequests == 0 && s->tunnel == TUN_NONE && s->inflight == 0 &&
            s->state == SESSION_OPEN) {
            session_close(s, "idle timeout (client.idle_timeout_ms)");
        } else {
            s->last_active_ms = now;
            list_del(n);
            list_add_tail(&f->idle, n);
        }
    }
}

/* s waits for a script or function call on its dedicated link: its reply
 * comes as it would on the shared link (a blocking call's may never). */
static int script_in_flight(session *s)
{
    list_node *n;
    list_foreach(n, &s->requests)
    {
        const request *r = list_entry(n, request, sq);
        if (r->state == REQ_SENT && r->route == RT_SCRIPT) {
            return 1;
        }
    }
    return 0;
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
        int only_blocked = s->inflight > 0 && s->flight_link != NULL &&
                           s->flight_link == s->dlink && !script_in_flight(s);
        if (force || s->nrequests == 0 || s->tunnel != TUN_NONE || only_blocked) {
            if (outq_len(&s->out) == 0 || force) {
                session_close(s, force ? "ferry stopped (shutdown timeout)" : "ferry is stopping");
            } else if (s->state != SESSION_CLOSING) {
                session_set_state(s, SESSION_QUITTING);
            }
        }
    }
}
