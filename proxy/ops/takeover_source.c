/* takeover_source.c - the old process's side of a takeover (takeover.c
 * draws the conversation): answering a new process's HELLO with the
 * listening sockets and, once it accepts, handing every session over as it
 * becomes quiet - a blocked call first cancelled on Redis with CLIENT
 * UNBLOCK, a worker's sessions sent by the main loop through the relay - or
 * leaving it to SIGTERM's rules; an abort serves every client here again.
 * takeover.c holds the new process's side, the control connection's reader
 * and the handles both sides use (takeover_int.h). */
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#define link posix_link /* unistd.h's link(2) would clash with ferry's link type */
#include <unistd.h>
#undef link

#include "lease.h"
#include "link.h"
#include "log.h"
#include "receipts.h"
#include "router.h"
#include "server.h"
#include "session.h"
#include "takeover.h"
#include "takeover_int.h"
#include "upstream.h"
#include "workers.h"

#define TAKEOVER_CANCEL_TIMEOUT_MS 2000 /* CLIENT UNBLOCK unanswered: close the link */
#define TAKEOVER_UNBLOCK_RETRY_MS 20    /* CLIENT UNBLOCK found nothing blocked (yet) */

static void tk_scan_cb(uv_timer_t *t);
static void tk_scan(takeover *tk);
static void tk_return_calls(takeover *tk);

/* ------------------------------------------------------- old: the control */

void tk_listener_cb(uv_poll_t *h, int status, int events)
{
    takeover *tk = h->data;
    ferry *f = tk->f;
    int fd = accept(tk->lfd, NULL, NULL);
    if (fd < 0) {
        return;
    }
    fcntl(fd, F_SETFD, FD_CLOEXEC);
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    struct {
        pid_t pid;
        uid_t uid;
        gid_t gid;
    } cred; /* Linux's struct ucred (unix(7)), which glibc shows only with _GNU_SOURCE */
    socklen_t clen = sizeof(cred);
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &clen) != 0 ||
        (cred.uid != getuid() && cred.uid != 0)) {
        /* The socket file's mode keeps others out; this holds even if it
         * was changed. root may (it can read this process's memory anyway). */
        log_warn("takeover: a process of another user connected: refused");
        close(fd);
        return;
    }
    if (tk->phase != TK_IDLE || tk->cfd >= 0 || f->stopping || f->closed) {
        log_warn("takeover: a second process connected while %s: refused",
                 f->stopping ? "stopping" : "a takeover is in progress");
        close(fd);
        return;
    }
    tk->cfd = fd;
    tk->started_ms = uv_now(f->loop);
    tk->handed = tk->closed = 0;
    buf_clear(&tk->in.rx);
    tk->in.bad = 0;
    if (tk_watch(tk, fd, &tk->cpoll, tk_control_cb) < 0) {
        tk_unwatch(&tk->cpoll, &tk->cfd);
        return;
    }
    tk_set_phase(tk, TK_SRC_HELLO);
    log_info("takeover: a new process connected on %s", tk->lpath);
}

static int tk_send_listeners(takeover *tk)
{
    ferry *f = tk->f;
    int fds[TAKEOVER_MAX_INHERIT];
    const config_addr *addrs[2 * CONFIG_MAX_LISTEN];
    char name[320];
    buf b;
    int n = server_sockets(f, fds, addrs, 2 * CONFIG_MAX_LISTEN);
    int total = n;

    buf_init(&b);
    int sfd = stats_socket(f);
    tkw_put_u32(&b, (uint32_t)(n + (sfd >= 0) + (tk->lfd >= 0)));
    for (int i = 0; i < n; i++) {
        config_addr_str(addrs[i], name, sizeof(name));
        tkw_put_u32(&b, TK_L_CLIENT);
        tkw_put_bytes(&b, name, strlen(name));
    }
    if (sfd >= 0) {
        config_addr_str(&f->cfg->stats_listen, name, sizeof(name));
        tkw_put_u32(&b, TK_L_STATS);
        tkw_put_bytes(&b, name, strlen(name));
        fds[total++] = sfd;
    }
    if (tk->lfd >= 0) {
        tkw_put_u32(&b, TK_L_TAKEOVER);
        tkw_put_bytes(&b, tk->lpath, strlen(tk->lpath));
        fds[total++] = tk->lfd;
    }
    int rc = tkw_send(tk->cfd, TK_LISTENERS, &b, fds, total, TAKEOVER_SEND_TIMEOUT_MS);
    buf_free(&b);
    return rc;
}

/* Every loop: stop reading its clients and hand them over as they become
 * ready (tk_scan). */
static void tk_begin_handing(takeover *tk)
{
    ferry *f = tk->f;
    list_node *n;

    f->handing_over = 1;
    tk->handing_ms = uv_now(f->loop);
    tk->deadline_ms = tk->handing_ms + f->cfg->shutdown_timeout_ms;
    tk->handed = tk->closed = 0;
    tk_set_phase(tk, TK_SRC_HANDING);
    list_foreach(n, &f->sessions)
    {
        session *s = list_entry(n, session, node);
        if (s->tx == TX_NONE) {
            session_stop_reading(s); /* a transaction reads until it ends */
        }
    }
    tk->scan = xmalloc(sizeof(*tk->scan));
    uv_timer_init(f->loop, tk->scan);
    tk->scan->data = tk;
    uv_timer_start(tk->scan, tk_scan_cb, TAKEOVER_SCAN_MS, TAKEOVER_SCAN_MS);
    tk_scan(tk);
}

/* Main loop: the workers' sessions reach it through the relay. */
static void tk_relay_cb(uv_async_t *a);

static void tk_relay_open(takeover *tk)
{
    if (tk->relay != NULL) {
        return;
    }
    tk_relay *r = xcalloc(1, sizeof(*r));
    uv_mutex_init(&r->lock);
    uv_async_init(tk->f->loop, &r->async, tk_relay_cb);
    r->async.data = tk;
    uv_unref((uv_handle_t *)&r->async); /* the loop ends without it */
    r->open = 1;
    tk->relay = r;
}

/* The new process accepts on the listeners: stop accepting here and start
 * handing sessions over, in every loop. */
static void tk_start_handing(takeover *tk)
{
    ferry *f = tk->f;

    f->keep_paths = 1; /* the sockets live on in the new process */
    server_stop(f);
    stats_stop(f);
    tk->lpath_owned = 0;
    tk_unwatch(&tk->lpoll, &tk->lfd);
    log_info("takeover: the new process accepts; handing over %llu client(s)",
             (unsigned long long)workers_clients(f));
    if (f->workers != NULL) {
        tk_relay_open(tk);
        atomic_store(&tk->relay->closed, 0);
        workers_takeover_hand(f, tk->relay);
    }
    tk_begin_handing(tk);
}

void tk_source_frame(takeover *tk, int type, tkw_rd *p, int *fds, int nfds)
{
    tkw_close_fds(fds, nfds); /* the new process sends none */
    if (type == TK_HELLO && tk->phase == TK_SRC_HELLO) {
        size_t ml;
        const char *magic = tkw_get_bytes(p, &ml);
        uint32_t pid = tkw_get_u32(p);
        if (p->bad || ml != strlen(TAKEOVER_MAGIC) || memcmp(magic, TAKEOVER_MAGIC, ml) != 0) {
            tk_source_abort(tk, "the new process speaks another takeover protocol");
            return;
        }
        log_info("takeover: new process %u; sending the listening sockets", (unsigned)pid);
        int rc = tk_send_listeners(tk);
        if (rc < 0) {
            tk_source_abort(tk, uv_strerror(rc));
            return;
        }
        tk_set_phase(tk, TK_SRC_LISTENERS);
    } else if (type == TK_ACCEPTING && tk->phase == TK_SRC_LISTENERS) {
        tk_start_handing(tk);
    } else {
        tk_source_abort(tk, "unexpected frame from the new process");
    }
}

/* ----------------------------------------------------- old: the sessions */

static session *tk_session_find(ferry *f, uint64_t id)
{
    list_node *n;
    list_foreach(n, &f->sessions)
    {
        session *s = list_entry(n, session, node);
        if (s->id == id) {
            return s;
        }
    }
    return NULL;
}

static link *tk_link_find(upstream *up, uint64_t id)
{
    list_node *n;
    if (up == NULL) {
        return NULL;
    }
    list_foreach(n, &up->links)
    {
        link *l = list_entry(n, link, node);
        if (l->id == id) {
            return l->state == LINK_CLOSING ? NULL : l;
        }
    }
    return NULL;
}

static tk_cancel *tk_cancel_find(takeover *tk, uint64_t sid)
{
    for (size_t i = 0; i < tk->ncancels; i++) {
        if (tk->cancels[i].sid == sid) {
            return &tk->cancels[i];
        }
    }
    return NULL;
}

void tk_cancel_drop(takeover *tk, tk_cancel *c)
{
    request_free(tk->f, c->call);
    *c = tk->cancels[--tk->ncancels];
}

/* A copy of the blocking call r (enough to re-arm and re-issue it). */
static request *tk_copy_call(ferry *f, const request *r)
{
    request *c = request_new(f);
    c->cmd = r->cmd;
    c->flags = r->flags & REQ_F_BLOCKING;
    c->born = r->born;
    c->deadline = r->deadline;
    buf_append(&c->data, buf_head(&r->data), buf_used(&r->data));
    return c;
}

/* A null reply: the call timed out (CLIENT UNBLOCK ... TIMEOUT) with
 * nothing served. */
static int is_null_reply(const char *p, size_t n)
{
    return (n >= 3 && (memcmp(p, "*-1", 3) == 0 || memcmp(p, "$-1", 3) == 0)) ||
           (n >= 1 && p[0] == '_');
}

/* The dedicated link's reply to the call being cancelled. */
static void tk_call_done(link *l, request *r, const char *p, size_t n)
{
    ferry *f = l->f;
    takeover *tk = f->takeover;
    tk_cancel *c = tk != NULL ? tk_cancel_find(tk, (uint64_t)r->arg) : NULL;
    session *s = tk_session_find(f, (uint64_t)r->arg);

    if (c != NULL && s != NULL && is_null_reply(p, n)) {
        c->done = 1;
        log_debug("takeover: client %llu: blocked call cancelled on Redis",
                  (unsigned long long)s->id);
    } else {
        if (s != NULL) {
            /* Served before the cancel reached Redis: the client's reply. */
            receipts_reply_sent(f, r, p, n);
            session_on_stream(s, p, n);
            log_debug("takeover: client %llu: blocked call served while cancelling",
                      (unsigned long long)s->id);
            if (tk != NULL && tk->phase != TK_SRC_HANDING) {
                session_check_reading(s); /* aborted meanwhile: served here */
            }
        }
        if (c != NULL) {
            tk_cancel_drop(tk, c);
        }
    }
    link_close(l, "blocked call cancelled for a takeover");
    if (tk != NULL && tk->phase != TK_SRC_HANDING) {
        tk_return_calls(tk); /* aborted meanwhile: re-issued here */
    }
}

static void tk_unblock_done(link *sh, request *r, const char *p, size_t n)
{
    takeover *tk = sh->f->takeover;
    uint64_t sid = (uint64_t)r->arg;
    tk_cancel *c = tk != NULL ? tk_cancel_find(tk, sid) : NULL;
    if (c == NULL || c->done) {
        return;
    }
    c->asking = 0;
    if (n >= 2 && memcmp(p, ":1", 2) == 0) {
        return; /* the null reply is on its way on the dedicated link */
    }
    if (n >= 1 && p[0] == '-') {
        /* CLIENT UNBLOCK refused (renamed, ACL): closing the link cancels it. */
        char why[160];
        link_error_text(p, n, why, sizeof(why));
        log_warn("takeover: CLIENT UNBLOCK refused (%s): closing the blocked call's link", why);
        link *l = tk_link_find(c->up, c->lid);
        c->done = 1;
        if (l != NULL) {
            link_close(l, "blocked call cancelled for a takeover");
        }
        return;
    }
    /* :0 - not blocked (yet, or served already): ask again shortly. */
    c->next_try = uv_now(sh->f->loop) + TAKEOVER_UNBLOCK_RETRY_MS;
}

static void tk_ask_unblock(takeover *tk, tk_cancel *c, uint64_t now)
{
    (void)tk;
    /* RESP2: the answer (:1 / :0) reads the same in both protocols. Asked
     * on the master view the call's link belongs to (cluster mode: the
     * shard the call blocks on). */
    link *sh = c->up != NULL ? upstream_shared(c->up, &c->up->self, c->sid, 2) : NULL;
    if (sh == NULL) {
        c->next_try = now + TAKEOVER_UNBLOCK_RETRY_MS;
        return;
    }
    char id[32];
    snprintf(id, sizeof(id), "%lld", c->redis_id);
    const char *argv[] = {"CLIENT", "UNBLOCK", id, "TIMEOUT"};
    link_internal(sh, argv, 4, tk_unblock_done, (long long)c->sid);
    c->asking = 1;
}

/* Worker: queue a session's frame (moved out of *frame) and fd for the
 * main loop. */
static void tk_relay_post(tk_relay *r, buf *frame, int fd)
{
    tk_item *it = xcalloc(1, sizeof(*it));
    it->frame = *frame;
    buf_init(frame);
    it->fd = fd;
    uv_mutex_lock(&r->lock);
    if (!r->open) {
        /* The main loop is closing (forced): the client goes with it. */
        uv_mutex_unlock(&r->lock);
        close(fd);
        buf_free_secret(&it->frame);
        free(it);
        return;
    }
    if (r->tail == NULL) {
        r->head = it;
    } else {
        r->tail->next = it;
    }
    r->tail = it;
    uv_async_send(&r->async);
    uv_mutex_unlock(&r->lock);
}

tk_item *tk_relay_pop(tk_relay *r)
{
    uv_mutex_lock(&r->lock);
    tk_item *it = r->head;
    if (it != NULL) {
        r->head = it->next;
        if (r->head == NULL) {
            r->tail = NULL;
        }
    }
    uv_mutex_unlock(&r->lock);
    return it;
}

void tk_item_free(tk_item *it)
{
    if (it->fd >= 0) {
        close(it->fd);
    }
    buf_free_secret(&it->frame);
    free(it);
}

/* Main loop: send what the workers posted, in order. Once the control
 * connection is gone (an abort), a session posted is served here instead:
 * its frame is what the new process would have adopted it from. */
void tk_relay_drain(takeover *tk)
{
    ferry *f = tk->f;
    tk_item *it;
    while (tk->relay != NULL && (it = tk_relay_pop(tk->relay)) != NULL) {
        if (tk->cfd >= 0 && (tk->phase == TK_SRC_HANDING || tk->phase == TK_SRC_FINISHING)) {
            int rc =
                tkw_send(tk->cfd, TK_SESSION, &it->frame, &it->fd, 1, TAKEOVER_SEND_TIMEOUT_MS);
            if (rc == 0) {
                tk->handed++;
                tk_item_free(it);
                continue;
            }
            char why[160];
            snprintf(why, sizeof(why), "sending a worker's client: %s", uv_strerror(rc));
            if (tk->phase == TK_SRC_HANDING) {
                tk_source_abort(tk, why);
            } else {
                log_error("takeover: %s", why);
                tk_unwatch(&tk->cpoll, &tk->cfd);
            }
        }
        if (f->closed) {
            tk_item_free(it); /* closing: the client goes with this process */
            continue;
        }
        int fd = it->fd;
        it->fd = -1;
        takeover_adopt(f, fd, buf_head(&it->frame), buf_used(&it->frame));
        tk_item_free(it);
    }
}

static void tk_relay_cb(uv_async_t *a)
{
    tk_relay_drain(a->data);
}

static int tk_hand_bytes(takeover *tk, session *s, buf *callb, int64_t left);

/* Hand s over: its state, then the bytes the new process parses first
 * (call, re-armed with what is left of its timeout, then s's unparsed
 * input); s is closed here. Returns 0, or a negative error (the takeover
 * is aborted). */
static int tk_hand(takeover *tk, session *s, const request *call)
{
    ferry *f = tk->f;
    uint64_t now = uv_now(f->loop);
    int64_t left = -1;
    buf callb;

    buf_init(&callb);
    if (call != NULL) {
        const char *expired = NULL;
        request *c = tk_copy_call(f, call);
        if (request_rearm_blocking(c, now, &expired) == 1) {
            /* Its time ran out meanwhile: answered as Redis would. */
            request_free(f, c);
            if (call->s == s) {
                session_answer_str(s, (request *)call, expired);
                session_flush_answered(s);
            } else {
                session_on_stream(s, expired, strlen(expired));
            }
            return 0; /* handed over idle once that is written */
        }
        left = call->deadline == 0 ? 0 : (int64_t)(call->deadline > now ? call->deadline - now : 1);
        buf_append(&callb, buf_head(&c->data), buf_used(&c->data));
        request_free(f, c);
    }
    int rc = tk_hand_bytes(tk, s, &callb, left);
    buf_free(&callb);
    return rc;
}

/* Requests s's client sent that never reached Redis and were answered by
 * nobody: each held (no master now: an outage, a failover, a partition),
 * never sent, an ordinary command or a transaction's, with no part of a
 * reply and nothing riding on it (a store pop's fate, a split, a node's
 * ASK). Their bytes are what the client sent (inline ones as multibulk),
 * and they changed none of the session state that goes over: parsed there
 * again, they are the client's own requests to the new process. */
static int tk_all_unsent(const session *s)
{
    list_node *n;
    if (s->nrequests == 0 || s->inflight != 0 || s->tunnel != TUN_NONE) {
        return 0;
    }
    list_foreach(n, &s->requests)
    {
        const request *r = list_entry(n, request, sq);
        if (r->state != REQ_HELD || r->sent_ns != 0 || r->cmd == NULL ||
            (r->flags & (REQ_F_INTERNAL | REQ_F_BLOCKING | REQ_F_QUIT)) != 0 ||
            (r->cmd->cls != CMD_STATELESS && r->cmd->cls != CMD_TRANSACTION) ||
            buf_used(&r->reply) != 0 || r->written != NULL || r->sp != NULL || r->bc != NULL ||
            r->ask != NULL) {
            return 0;
        }
    }
    return 1;
}

/* s's requests, all unsent (tk_all_unsent), go over as bytes the new
 * process parses first: a client whose requests wait for a master is handed
 * over rather than kept until shutdown_timeout_ms closes it. */
static int tk_hand_unsent(takeover *tk, session *s)
{
    list_node *n;
    buf callb;
    buf_init(&callb);
    list_foreach(n, &s->requests)
    {
        const request *r = list_entry(n, request, sq);
        buf_append(&callb, buf_head(&r->data), buf_used(&r->data));
    }
    log_info("client %llu %s: %zu request(s) held for a master, never sent: handed over to "
             "be sent by the new process",
             (unsigned long long)s->id, session_peer(s), s->nrequests);
    int rc = tk_hand_bytes(tk, s, &callb, TKW_LEFT_UNSENT);
    buf_free(&callb);
    return rc;
}

/* tk_hand's second half: callb, the bytes parsed first there, and left,
 * what tkw_session carries for the new process' log. */
static int tk_hand_bytes(takeover *tk, session *s, buf *callb, int64_t left)
{
    ferry *f = tk->f;
    uint64_t now = uv_now(f->loop);
    buf b;
    uv_os_fd_t fd;

    if (uv_fileno(&s->io.h, &fd) != 0) {
        return 0;
    }
    buf_init(&b);
    tkw_session(&b, s, callb, left, now);
    if (tk->phase != TK_SRC_HANDING) {
        /* The takeover was aborted while s's call was being cancelled:
         * s is served here again, as the new process would have served
         * it (its call re-issued with what is left of its timeout). */
        int dup_fd = fcntl(fd, F_DUPFD_CLOEXEC, 0);
        lease_client_handed(s); /* its client stays connected */
        session_close(s, "takeover aborted: its blocked call is re-issued here");
        if (dup_fd >= 0) {
            takeover_adopt(f, dup_fd, buf_head(&b), buf_used(&b));
        }
        buf_free_secret(&b);
        return 0;
    }
    if (f->worker_index > 0) {
        /* The main loop sends it: a copy of the socket goes with the frame
         * (closing this one, below, sends nothing to the client). */
        int dup_fd = fcntl(fd, F_DUPFD_CLOEXEC, 0);
        if (dup_fd < 0) {
            buf_free_secret(&b);
            return 0; /* out of descriptors: tried again on the next scan */
        }
        tk_relay_post(tk->relay, &b, dup_fd);
        lease_client_handed(s); /* its client stays connected */
        tk->handed++;
        session_close(s, "handed over to the new process");
        return 0;
    }
    int rc = tkw_send(tk->cfd, TK_SESSION, &b, &fd, 1, TAKEOVER_SEND_TIMEOUT_MS);
    buf_free_secret(&b);
    if (rc < 0) {
        char why[160];
        snprintf(why, sizeof(why), "sending client %llu: %s", (unsigned long long)s->id,
                 uv_strerror(rc));
        tk_source_abort(tk, why);
        return rc;
    }
    tk->handed++;
    /* The socket lives on in the new process: closing this copy of it sends
     * nothing to the client. */
    lease_client_handed(s); /* its client stays connected */
    session_close(s, "handed over to the new process");
    return 0;
}

/* s's one blocking call r is in flight on its dedicated link: cancel it on
 * Redis before the session goes over. Returns what tk_hand returns. */
static int tk_cancel_call(takeover *tk, session *s, request *r, uint64_t now)
{
    link *l = s->dlink;
    if (l->state != LINK_READY || l->redis_id <= 0 ||
        upstream_shared(l->up, &l->up->self, s->id, 2) == NULL) {
        /* No way to ask Redis: closing the link (session_close) cancels it,
         * as when a client leaves. */
        return tk_hand(tk, s, r);
    }
    if (tk->ncancels == tk->capcancels) {
        tk->capcancels = tk->capcancels ? tk->capcancels * 2 : 16;
        tk->cancels = xrealloc(tk->cancels, tk->capcancels * sizeof(*tk->cancels));
    }
    tk_cancel *c = &tk->cancels[tk->ncancels++];
    memset(c, 0, sizeof(*c));
    c->sid = s->id;
    c->lid = l->id;
    c->up = l->up;
    c->redis_id = l->redis_id;
    c->call = tk_copy_call(tk->f, r);
    c->since = now;
    router_release_call(s, r);
    /* The reply to the call now comes to the takeover, not to s. */
    r->flags |= REQ_F_INTERNAL;
    r->done = tk_call_done;
    r->arg = (long long)s->id;
    upstream_disown(l);
    tk_ask_unblock(tk, c, now);
    return 0;
}

/* Nothing of s is half done: no transaction, no stream ferry cannot carry
 * (MONITOR), no output waiting to be written. */
static int tk_quiet(const session *s)
{
    return s->state == SESSION_OPEN && s->tx == TX_NONE && s->tunnel != TUN_OTHER &&
           outq_len(&s->out) == 0 && !outq_writing(&s->out);
}

/* Hand s over if it is ready (or start cancelling its blocked call).
 * Returns 0, or a negative error (the takeover was aborted). */
static int tk_try_session(takeover *tk, session *s, uint64_t now)
{
    if (s->state != SESSION_OPEN) {
        return 0; /* QUIT seen: it closes itself */
    }
    if (s->tx != TX_NONE) {
        /* A transaction (or a WATCH) goes on here until EXEC, DISCARD or
         * UNWATCH: reading continues until then. */
        session_check_reading(s);
        return 0;
    }
    session_stop_reading(s);
    if (s->tunnel == TUN_OTHER) {
        /* MONITOR or CLIENT REPLY: a stream ferry does not rebuild on
         * another link (as after a failover). It never becomes ready, so it
         * is closed now, after its replies, as SIGTERM does (rather than at
         * shutdown_timeout_ms). */
        tk->closed++;
        if (outq_len(&s->out) == 0) {
            session_close(s, "ferry restarted (takeover): a MONITOR or CLIENT REPLY stream "
                             "cannot be handed over");
        } else {
            log_info("client %llu %s: ferry restarted (takeover): a MONITOR or CLIENT REPLY "
                     "stream cannot be handed over: closed once its output is written",
                     (unsigned long long)s->id, session_peer(s));
            session_set_state(s, SESSION_QUITTING); /* closed once written */
        }
        return 0;
    }
    if (s->f->cluster != NULL && s->tunnel != TUN_NONE) {
        /* Cluster mode: a subscribed client's channels live on the node
         * its pub/sub is homed on (its shard channels on their slot's
         * master); the new process does not rebuild that home from what
         * it is handed, so the client is closed, as a MONITOR is, once its
         * output is written (it subscribes again on its new connection). */
        tk->closed++;
        if (outq_len(&s->out) == 0) {
            session_close(s, "ferry restarted (takeover): cluster mode: a subscribed client "
                             "cannot be handed over");
        } else {
            log_info("client %llu %s: ferry restarted (takeover): cluster mode: a subscribed "
                     "client cannot be handed over: closed once its output is written",
                     (unsigned long long)s->id, session_peer(s));
            session_set_state(s, SESSION_QUITTING); /* closed once written */
        }
        return 0;
    }
    if (s->out.tls != NULL) {
        /* TLS: the session's keys live in this process' OpenSSL state
         * (ferry does not use the kernel's TLS offload), so the client
         * cannot be handed over. It is closed once nothing of it is in
         * flight and its replies are written, as MONITOR is; a blocked call
         * is left to end by itself (data or its timeout): cancelling it
         * could take an item the client would never get. */
        if (tk_quiet(s) && s->nrequests == 0 && s->inflight == 0) {
            tk->closed++;
            session_close(s, "ferry restarted (takeover): a TLS client cannot be handed over");
        }
        return 0;
    }
    tk_cancel *c = tk_cancel_find(tk, s->id);
    if (c != NULL) {
        if (!c->done || !tk_quiet(s) || s->nrequests != 0 || s->inflight != 0) {
            return 0;
        }
        request *call = c->call;
        c->call = NULL;
        tk_cancel_drop(tk, c);
        int rc = tk_hand(tk, s, call);
        request_free(tk->f, call);
        return rc;
    }
    if (!tk_quiet(s)) {
        return 0;
    }
    if (s->nrequests == 0 && s->inflight == 0) {
        return tk_hand(tk, s, NULL);
    }
    if (tk_all_unsent(s)) {
        return tk_hand_unsent(tk, s);
    }
    if (s->nrequests == 1 && s->tunnel == TUN_NONE) {
        request *r = list_entry(list_first(&s->requests), request, sq);
        if (!(r->flags & REQ_F_BLOCKING)) {
            return 0;
        }
        if (r->state == REQ_HELD && s->inflight == 0) {
            return tk_hand(tk, s, r);
        }
        if (r->state == REQ_SENT && r->link != NULL && r->link == s->dlink && s->inflight == 1) {
            return tk_cancel_call(tk, s, r, now);
        }
    }
    return 0;
}

/* The takeover was aborted: every call cancelled on Redis (for the new
 * process to re-issue) is re-issued here; one still being cancelled is
 * when Redis answers (tk_call_done). */
static void tk_return_calls(takeover *tk)
{
    ferry *f = tk->f;
    for (size_t i = 0; i < tk->ncancels;) {
        tk_cancel *c = &tk->cancels[i];
        if (!c->done) {
            i++;
            continue;
        }
        session *s = tk_session_find(f, c->sid);
        request *call = c->call;
        c->call = NULL;
        tk_cancel_drop(tk, c); /* the last one takes its place */
        if (s == NULL || s->state != SESSION_OPEN) {
            request_free(f, call);
            continue;
        }
        if (!tk_quiet(s) || s->nrequests != 0 || s->inflight != 0) {
            /* It was not read since (reading stays stopped until then). */
            session_close(s, "takeover aborted: its blocked call cannot be re-issued");
        } else {
            tk_hand(tk, s, call);
            if (s->state == SESSION_OPEN) {
                session_check_reading(s); /* its time was up: answered */
            }
        }
        request_free(f, call);
    }
}

/* After an abort: read every client again, but one whose blocked call is
 * still being cancelled (its reply, or the call, comes first). */
static void tk_resume_reading(takeover *tk)
{
    list_node *n;
    tk->f->handing_over = 0;
    list_foreach(n, &tk->f->sessions)
    {
        session *s = list_entry(n, session, node);
        if (tk_cancel_find(tk, s->id) == NULL) {
            session_check_reading(s);
        }
    }
    tk_return_calls(tk);
}

/* Cancels that need a nudge: CLIENT UNBLOCK again, a client that left, or
 * no answer in time (the link is closed: that cancels the call too). */
static void tk_cancel_tick(takeover *tk, uint64_t now)
{
    ferry *f = tk->f;
    for (size_t i = 0; i < tk->ncancels;) {
        tk_cancel *c = &tk->cancels[i];
        if (c->done) {
            i++;
            continue;
        }
        session *s = tk_session_find(f, c->sid);
        if (s == NULL || now - c->since >= TAKEOVER_CANCEL_TIMEOUT_MS) {
            link *l = tk_link_find(c->up, c->lid);
            if (s != NULL) {
                log_warn("takeover: client %llu: CLIENT UNBLOCK unanswered for %d ms: closing "
                         "its link",
                         (unsigned long long)s->id, TAKEOVER_CANCEL_TIMEOUT_MS);
                c->done = 1;
            }
            if (l != NULL) {
                link_close(l, "blocked call cancelled for a takeover");
            }
            if (s == NULL) {
                tk_cancel_drop(tk, c);
                continue;
            }
        } else if (!c->asking && now >= c->next_try) {
            tk_ask_unblock(tk, c, now);
        }
        i++;
    }
}

void tk_finish_source(takeover *tk, const char *why)
{
    ferry *f = tk->f;
    list_node *n;
    list_foreach(n, &f->sessions)
    {
        /* Left to SIGTERM's rules (those already closing were counted). */
        tk->closed += list_entry(n, session, node)->state == SESSION_OPEN;
    }
    if (f->worker_index > 0) {
        atomic_fetch_add(&tk->relay->closed, tk->closed); /* for the main loop's DONE */
    }
    tk_set_phase(tk, TK_SRC_FINISHING);
    if (tk->scan != NULL) {
        uv_close((uv_handle_t *)tk->scan, tk_free_handle_cb);
        tk->scan = NULL;
    }
    f->stop(f, why);
}

static void tk_scan(takeover *tk)
{
    ferry *f = tk->f;
    uint64_t now = uv_now(f->loop);
    list_node *n, *t;

    if (tk->phase != TK_SRC_HANDING) {
        return;
    }
    if (f->stopping) {
        tk_finish_source(tk, "stopping");
        return;
    }
    tk_cancel_tick(tk, now);
    /* Least recently active first: the new process keeps its idle list
     * ordered by appending (session_adopt). */
    list_foreach_safe(n, t, &f->idle)
    {
        if (tk_try_session(tk, list_entry(n, session, idle_node), now) < 0) {
            return; /* aborted */
        }
    }
    if (f->worker_index > 0) {
        /* A worker: done once its own clients are over; the main loop
         * sends what it posted and tells the new process when all are. */
        if (f->nclients == 0) {
            log_info("takeover: loop %d: its %lu client(s) handed over in %llu ms", f->worker_index,
                     tk->handed, (unsigned long long)(now - tk->handing_ms));
            /* It waits for the main loop: stopped with every loop once all
             * are over (takeover_tick), or serving on if the takeover is
             * aborted (the main loop then serves what it posted). */
            uv_close((uv_handle_t *)tk->scan, tk_free_handle_cb);
            tk->scan = NULL;
        } else if (now >= tk->deadline_ms) {
            tk_finish_source(tk, "takeover: shutdown_timeout_ms reached");
        }
        return;
    }
    tk_relay_drain(tk);
    if (tk->phase != TK_SRC_HANDING) {
        return; /* aborted */
    }
    /* Every loop's clients gone: each worker posted its last one before
     * it closed it, so once the count reads 0 the relay has them all. */
    uint64_t left = workers_clients(f);
    if (left == 0) {
        tk_relay_drain(tk);
        if (tk->phase != TK_SRC_HANDING) {
            return;
        }
        log_info("takeover: all %lu client(s) handed over in %llu ms (%llu ms since the new "
                 "process connected)",
                 tk->handed, (unsigned long long)(now - tk->handing_ms),
                 (unsigned long long)(now - tk->started_ms));
        tk_finish_source(tk, "handed over to a new process");
    } else if (now >= tk->deadline_ms) {
        log_warn("takeover: %llu client(s) not handed over within shutdown_timeout_ms (%lu "
                 "were): closed after their replies",
                 (unsigned long long)left, tk->handed);
        tk_finish_source(tk, "takeover: shutdown_timeout_ms reached");
    }
}

static void tk_scan_cb(uv_timer_t *t)
{
    tk_scan(t->data);
}

void tk_source_abort(takeover *tk, const char *why)
{
    ferry *f = tk->f;
    int handing = tk->phase == TK_SRC_HANDING;

    log_error("takeover aborted: %s", why);
    tk_unwatch(&tk->cpoll, &tk->cfd);
    if (tk->scan != NULL) {
        uv_close((uv_handle_t *)tk->scan, tk_free_handle_cb);
        tk->scan = NULL;
    }
    tk_set_phase(tk, TK_IDLE);
    if (handing) {
        /* The listeners went to the new process: this one keeps the
         * clients it still has, and accepts no new ones. */
        log_error("takeover: this process no longer listens; %llu client(s) stay with it",
                  (unsigned long long)workers_clients(f));
        tk_resume_reading(tk);
        workers_takeover_abort(f);
        tk_relay_drain(tk); /* what the workers posted is served here */
    }
}

void takeover_worker_hand(ferry *f, tk_relay *relay)
{
    if (f->stopping || f->closed) {
        return; /* closing its clients already (SIGTERM's rules) */
    }
    if (f->takeover == NULL) {
        f->takeover = tk_new(f);
    }
    takeover *tk = f->takeover;
    if (tk->phase != TK_IDLE) {
        return;
    }
    tk->relay = relay;
    tk->started_ms = uv_now(f->loop);
    tk_begin_handing(tk);
}

void takeover_worker_abort(ferry *f)
{
    takeover *tk = f->takeover;
    if (tk == NULL || tk->phase != TK_SRC_HANDING) {
        return; /* done already: its clients are over, or closing */
    }
    if (tk->scan != NULL) {
        uv_close((uv_handle_t *)tk->scan, tk_free_handle_cb);
        tk->scan = NULL;
    }
    tk_set_phase(tk, TK_IDLE);
    tk_resume_reading(tk);
}
