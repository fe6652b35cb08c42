/* workers.c - more event loops (workers: N).
 *
 *   main loop: listeners, Sentinel client, stats port, signals, its clients
 *      | accept -> round-robin: itself, worker 1, ..., worker N-1
 *      | master view (Sentinel) -> its own upstream, then every mailbox
 *      v
 *   worker i (thread, loop, context): its clients, its upstream and shared
 *      links; applies the mailbox in order (a client, a master named, a
 *      switch, stop); publishes its figures on its tick
 *
 * A mailbox is a list under a mutex and a uv_async_t on the worker's loop.
 * The main loop is the only writer of every mailbox, so a worker applies
 * the master view's changes in the order Sentinel's client made them, and
 * its upstream connects only to a master it was told of. Without Sentinel
 * (a fixed master) every loop's upstream follows that master by itself.
 *
 * The other way, a queue under a mutex and the main loop's uv_async_t: a
 * worker asks for a Sentinel round, or posts an operation for the fallback
 * store, which the main loop owns (outage.c); its result comes back in the
 * worker's mailbox (WM_STORE). A store write wakes every loop (a flag and
 * the async: blocked pops may be served now). */
#include "workers.h"

#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#define link posix_link /* unistd.h's link(2) would clash with ferry's link type */
#include <unistd.h>
#undef link

#include "log.h"
#include "server.h"
#include "session.h"
#include "upstream.h"

/* What a mailbox carries. */
typedef enum wmsg_kind {
    WM_ACCEPT = 0, /* a client socket (fd) to serve */
    WM_MASTER,     /* Sentinel named a master (ip, port, why) */
    WM_SWITCH,     /* stop sending to the current master (why) */
    WM_FENCE,      /* a replica is being promoted: fences on the old master count no more */
    WM_KEEP,       /* no majority of sentinels: go back to the last master, ROLE checked */
    WM_REPLICAS,   /* how many replicas Sentinel lists (port: the count) */
    WM_STOP,       /* graceful stop (why) */
    WM_CLOSE,      /* close everything now */
    WM_STORE,      /* the result of a fallback store operation (store) */
    WM_PUBLISH,    /* publish the figures now (gen): the stats port is answering */
    WM_TK_HAND,    /* takeover, old process: hand every client over through relay */
    WM_TK_ABORT,   /* takeover, old process: aborted, keep the clients left */
    WM_TK_ADOPT,   /* takeover, new process: a client (fd) with its state (frame) */
    WM_CALL        /* run fn(arg) on this loop (workers_call) */
} wmsg_kind;

typedef struct wmsg {
    struct wmsg *next; /* in the mailbox, oldest first */
    wmsg_kind kind;    /* see wmsg_kind */
    int fd;            /* WM_ACCEPT: the client socket, owned by the message */
    int is_unix;       /* WM_ACCEPT: FERRY_ACCEPT_* flags (a unix socket, TLS) */
    int port;          /* WM_MASTER */
    char ip[64];       /* WM_MASTER: numeric */
    char why[600];     /* WM_MASTER, WM_SWITCH, WM_STOP */
    void *store;       /* WM_STORE: owned by the message until applied */
    uint64_t gen;      /* WM_PUBLISH: the main loop's request number */
    workers_fn fn;     /* WM_CALL: what to run, and its argument */
    void *arg;

    /* A takeover's (takeover.c); WM_TK_ADOPT owns fd too. */
    struct tk_relay *relay; /* WM_TK_HAND: the main loop's */
    buf frame;              /* WM_TK_ADOPT: the session's state (wiped when freed) */
} wmsg;

/* A fallback store operation on its way to the main loop. */
typedef struct mmsg {
    struct mmsg *next;
    void *store;   /* outage.c's, or NULL for a call */
    workers_fn fn; /* a call (workers_call): what to run, and its argument */
    void *arg;
} mmsg;

typedef struct worker {
    struct workers *all; /* every loop */
    int index;           /* 1..n-1 */
    uv_loop_t loop;      /* its own loop */
    ferry f;             /* its own context */
    uv_thread_t thread;  /* runs the loop */
    uv_async_t async;    /* on loop: the mailbox has mail */
    uv_mutex_t lock;     /* guards the fields below */
    wmsg *head, *tail;   /* the mailbox */
    int open;            /* async may be sent (cleared before it closes) */
    ferry_stats *pub;    /* its counters at its last tick or WM_PUBLISH */
    uint64_t published;  /* gen of the last WM_PUBLISH applied */
    worker_view view;    /* its gauges at its last tick */
    atomic_int done;     /* its loop returned */
    atomic_int wake;     /* a store write: re-dispatch what waits */
} worker;

typedef struct workers {
    ferry *main_ctx;                       /* the main loop's context */
    int n;                                 /* loops, the main one included */
    worker *w[CONFIG_MAX_WORKERS];         /* [1..n) */
    uint64_t next;                         /* round-robin (main loop only) */
    uint64_t refresh_gen;                  /* last WM_PUBLISH sent (main loop only) */
    uv_async_t async;                      /* on the main loop: a worker asks
                                              for a Sentinel round, or posted
                                              a store operation */
    int async_open;                        /* async initialised, not closed */
    atomic_int sentinel_asked;             /* a worker lost its master */
    atomic_int acks_asked;                 /* a worker's WAIT is slow */
    uv_mutex_t qlock;                      /* guards the fields below */
    mmsg *qhead, *qtail;                   /* store operations for the main loop */
    int qopen;                             /* the main loop will read the queue */
    atomic_ullong clients;                 /* sessions open in all loops */
    atomic_ullong mem[CONFIG_MAX_WORKERS]; /* bytes each loop held for clients
                                              at its last tick */
    atomic_llong held;                     /* request bytes held for lack of a
                                              master, every loop (live) */
    uv_mutex_t publock;                    /* guards main_pub */
    ferry_stats *main_pub;                 /* the main loop's counters at its last
                                              tick (workers_totals) */
} workers;

static worker *self_of(ferry *f)
{
    workers *wk = f->workers;
    return wk != NULL && f->worker_index > 0 ? wk->w[f->worker_index] : NULL;
}

/* --------------------------------------------------------------- mailbox */

static void free_close_cb(uv_handle_t *h)
{
    free(h);
}

/* On f's thread: m was not applied (a result goes back to the store). */
static void msg_free(ferry *f, wmsg *m)
{
    if ((m->kind == WM_ACCEPT || m->kind == WM_TK_ADOPT) && m->fd >= 0) {
        close(m->fd);
    }
    if (m->kind == WM_STORE && m->store != NULL) {
        f->workers_ops->store_drop(f, m->store);
    }
    if (m->kind == WM_CALL && m->fn != NULL) {
        m->fn(NULL, m->arg); /* that loop reads no more: told with no context */
    }
    buf_free_secret(&m->frame); /* a client.auth redis user's password */
    free(m);
}

/* Append m to w's mailbox and wake w. Returns 0 (m is the mailbox's from
 * now on), or -1 when w reads no more (m stays the caller's). */
static int post_try(worker *w, wmsg *m)
{
    m->next = NULL;
    uv_mutex_lock(&w->lock);
    if (!w->open) {
        uv_mutex_unlock(&w->lock);
        return -1;
    }
    if (w->tail == NULL) {
        w->head = m;
    } else {
        w->tail->next = m;
    }
    w->tail = m;
    uv_async_send(&w->async);
    uv_mutex_unlock(&w->lock);
    return 0;
}

/* Main loop: append m to w's mailbox (m is the mailbox's from now on). */
static void post(worker *w, wmsg *m)
{
    if (post_try(w, m) != 0) {
        msg_free(w->all->main_ctx, m);
    }
}

/* Append q to the main loop's queue and wake it. Returns 0 (q is the
 * queue's from now on), or -1 when the main loop reads no more (q stays the
 * caller's). */
static int to_main(workers *wk, mmsg *q)
{
    uv_mutex_lock(&wk->qlock);
    if (!wk->qopen) {
        uv_mutex_unlock(&wk->qlock);
        return -1;
    }
    if (wk->qtail == NULL) {
        wk->qhead = q;
    } else {
        wk->qtail->next = q;
    }
    wk->qtail = q;
    uv_async_send(&wk->async);
    uv_mutex_unlock(&wk->qlock);
    return 0;
}

static wmsg *msg_new(wmsg_kind kind, const char *why)
{
    wmsg *m = xcalloc(1, sizeof(*m));
    m->kind = kind;
    m->fd = -1;
    if (why != NULL) {
        snprintf(m->why, sizeof(m->why), "%s", why);
    }
    return m;
}

static void post_all(ferry *f, wmsg_kind kind, const char *ip, int port, const char *why)
{
    workers *wk = f->workers;
    for (int i = 1; wk != NULL && f->worker_index == 0 && i < wk->n; i++) {
        wmsg *m = msg_new(kind, why);
        if (ip != NULL) {
            snprintf(m->ip, sizeof(m->ip), "%s", ip);
        }
        m->port = port;
        post(wk->w[i], m);
    }
}

static void keep_master(upstream *up, int quiet)
{
    if (!up->target_set && up->epoch > 0 && up->name[0] != '\0') {
        if (!quiet) {
            log_warn("sentinel: no majority of the sentinels reachable; retrying the last "
                     "known master %s",
                     up->name);
        }
        up->target_set = 1;
    }
}

static void publish(ferry *f, worker *w, uint64_t gen);

/* Worker loop: apply m. */
static void apply(worker *w, wmsg *m)
{
    ferry *f = &w->f;
    switch (m->kind) {
    case WM_ACCEPT:
        if (f->stopping || f->closed) {
            break; /* msg_free closes it */
        }
        if (f->workers_ops->accept_fd(f, m->fd, m->is_unix) == 0) {
            m->fd = -1; /* the session's */
        }
        break;
    case WM_MASTER:
        if (!f->closed) {
            f->workers_ops->set_master(f->up, m->ip, m->port, m->why);
        }
        break;
    case WM_SWITCH:
        if (!f->closed) {
            f->workers_ops->switch_master(f->up, m->why);
        }
        break;
    case WM_FENCE:
        f->up->fence_valid = 0;
        break;
    case WM_KEEP:
        keep_master(f->up, 1);
        break;
    case WM_REPLICAS:
        f->up->replicas_known = m->port;
        break;
    case WM_STOP:
        f->stop(f, m->why);
        break;
    case WM_CLOSE:
        w->all->main_ctx->workers_ops->close(f);
        break;
    case WM_STORE: {
        void *op = m->store;
        m->store = NULL;
        f->workers_ops->store_done(f, op);
        break;
    }
    case WM_PUBLISH:
        publish(f, w, m->gen);
        break;
    case WM_TK_HAND:
        f->workers_ops->hand_clients(f, m->relay);
        break;
    case WM_TK_ABORT:
        f->workers_ops->hand_abort(f);
        break;
    case WM_TK_ADOPT:
        f->workers_ops->adopt(f, m->fd, buf_head(&m->frame), buf_used(&m->frame));
        m->fd = -1; /* the session's, or closed */
        break;
    case WM_CALL: {
        workers_fn fn = m->fn;
        m->fn = NULL;
        fn(f->closed ? NULL : f, m->arg);
        break;
    }
    }
}

static void mail_cb(uv_async_t *a)
{
    worker *w = a->data;
    if (atomic_exchange(&w->wake, 0)) {
        w->f.wake_pending = 1; /* the flush at this turn's end re-dispatches */
    }
    uv_mutex_lock(&w->lock);
    wmsg *m = w->head;
    w->head = w->tail = NULL;
    uv_mutex_unlock(&w->lock);
    while (m != NULL) {
        wmsg *next = m->next;
        apply(w, m);
        msg_free(&w->f, m);
        m = next;
    }
}

/* Main loop: workers asked for a Sentinel round or posted store operations. */
static void trigger_cb(uv_async_t *a)
{
    workers *wk = a->data;
    ferry *f = wk->main_ctx;
    if (atomic_exchange(&wk->sentinel_asked, 0) && f->sentinel != NULL && !f->closed) {
        f->workers_ops->trigger_sentinel(f->sentinel);
    }
    if (atomic_exchange(&wk->acks_asked, 0) && f->sentinel != NULL && !f->closed) {
        f->workers_ops->ask_replica_acks(f->sentinel);
    }
    uv_mutex_lock(&wk->qlock);
    mmsg *q = wk->qhead;
    wk->qhead = wk->qtail = NULL;
    uv_mutex_unlock(&wk->qlock);
    while (q != NULL) {
        mmsg *next = q->next;
        if (q->fn != NULL) {
            q->fn(f->closed ? NULL : f, q->arg);
            free(q);
            q = next;
            continue;
        }
        f->workers_ops->store_run(f, q->store);
        free(q);
        q = next;
    }
}

/* ------------------------------------------------------------- lifecycle */

static void worker_run(void *arg)
{
    worker *w = arg;
    uv_run(&w->loop, UV_RUN_DEFAULT);
    w->all->main_ctx->workers_ops->release(&w->f);
    uv_mutex_lock(&w->lock);
    wmsg *m = w->head;
    w->head = w->tail = NULL;
    w->open = 0;
    uv_mutex_unlock(&w->lock);
    while (m != NULL) {
        wmsg *next = m->next;
        msg_free(&w->f, m);
        m = next;
    }
    int rc = uv_loop_close(&w->loop);
    if (rc != 0) {
        log_warn("worker %d: its loop closed with handles open: %s", w->index, uv_strerror(rc));
    }
    atomic_store(&w->done, 1);
    /* The main loop's tick sees it; a nudge makes it see it now. */
    uv_async_send(&w->all->async);
}

/* A worker whose thread never started: close its loop here. */
static void worker_discard(worker *w)
{
    w->all->main_ctx->workers_ops->close(&w->f);
    uv_run(&w->loop, UV_RUN_DEFAULT);
    w->all->main_ctx->workers_ops->release(&w->f);
    uv_loop_close(&w->loop);
    uv_mutex_destroy(&w->lock);
    free(w->pub);
    free(w);
}

ferry *workers_main_ctx(struct workers *wk)
{
    return wk->main_ctx;
}

int workers_start(ferry *f)
{
    const workers_ops *ops = f->workers_ops;
    int n = f->cfg->workers;
    if (n <= 1) {
        return 0;
    }
    workers *wk = xcalloc(1, sizeof(*wk));
    wk->main_ctx = f;
    wk->n = 1;
    f->workers = wk;
    f->worker_index = 0;
    /* Ids unique across loops from now on: loop i gives base + i + k * n. */
    uint64_t base_id = (f->next_id / (uint64_t)n + 1) * (uint64_t)n;
    f->id_step = (uint64_t)n;
    f->next_id = base_id;
    uv_mutex_init(&wk->qlock);
    uv_mutex_init(&wk->publock);
    wk->main_pub = xcalloc(1, sizeof(*wk->main_pub));
    wk->qopen = 1;
    uv_async_init(f->loop, &wk->async, trigger_cb);
    wk->async.data = wk;
    wk->async_open = 1;
    uv_unref((uv_handle_t *)&wk->async); /* the main loop ends without it */
    atomic_store(&wk->clients, f->nclients);
    for (int i = 1; i < n; i++) {
        worker *w = xcalloc(1, sizeof(*w));
        w->all = wk;
        w->index = i;
        w->pub = xcalloc(1, sizeof(*w->pub));
        uv_mutex_init(&w->lock);
        int rc = uv_loop_init(&w->loop);
        if (rc == 0) {
            rc = ops->init(&w->f, &w->loop, f->cfg, wk, i, base_id);
        }
        if (rc < 0) {
            log_error("worker %d: cannot start: %s", i, ferry_strerror(rc));
            uv_mutex_destroy(&w->lock);
            free(w->pub);
            free(w);
            workers_close(f);
            workers_join(f);
            return rc;
        }
        f->workers_ops->store_attach(&w->f, f); /* the main loop's store serves its clients too */
        uv_async_init(&w->loop, &w->async, mail_cb);
        w->async.data = w;
        w->open = 1;
        wk->w[i] = w; /* before its thread reads it (self_of) */
        rc = uv_thread_create(&w->thread, worker_run, w);
        if (rc < 0) {
            log_error("worker %d: cannot start its thread: %s", i, uv_strerror(rc));
            wk->w[i] = NULL;
            w->open = 0;
            uv_close((uv_handle_t *)&w->async, NULL);
            worker_discard(w);
            workers_close(f);
            workers_join(f);
            return rc;
        }
        wk->n = i + 1;
    }
    log_info("%d event loops serve clients (workers: %d)", n, n);
    return 0;
}

int workers_accept(ferry *f, uv_stream_t *server, int is_unix)
{
    workers *wk = f->workers;
    int i = (int)(wk->next++ % (uint64_t)wk->n);
    if (i == 0) {
        return f->workers_ops->accept(f, server, is_unix);
    }
    /* Accepted here, handed over as a descriptor of its own: the handle
     * that accepted it closes its copy on this loop. */
    server_io *tmp = xmalloc(sizeof(*tmp));
    if (is_unix & FERRY_ACCEPT_UNIX) {
        uv_pipe_init(f->loop, &tmp->pipe, 0);
    } else {
        uv_tcp_init(f->loop, &tmp->tcp);
    }
    uv_os_fd_t fd = -1;
    int rc = uv_accept(server, &tmp->s);
    if (rc == 0) {
        rc = uv_fileno(&tmp->h, &fd);
    }
    int dup_fd = -1;
    if (rc == 0) {
        dup_fd = fcntl(fd, F_DUPFD_CLOEXEC, 0);
        rc = dup_fd < 0 ? UV_EMFILE : 0;
    }
    uv_close(&tmp->h, free_close_cb);
    if (rc < 0) {
        return rc;
    }
    wmsg *m = msg_new(WM_ACCEPT, NULL);
    m->fd = dup_fd;
    m->is_unix = is_unix;
    post(wk->w[i], m);
    return 0;
}

void workers_takeover_hand(ferry *f, struct tk_relay *relay)
{
    workers *wk = f->workers;
    for (int i = 1; wk != NULL && f->worker_index == 0 && i < wk->n; i++) {
        wmsg *m = msg_new(WM_TK_HAND, NULL);
        m->relay = relay;
        post(wk->w[i], m);
    }
}

void workers_takeover_abort(ferry *f)
{
    post_all(f, WM_TK_ABORT, NULL, 0, NULL);
}

void workers_adopt(ferry *f, int fd, char *p, size_t n)
{
    workers *wk = f->workers;
    int i = wk != NULL ? (int)(wk->next++ % (uint64_t)wk->n) : 0;
    if (i == 0) {
        f->workers_ops->adopt(f, fd, p, n);
        return;
    }
    wmsg *m = msg_new(WM_TK_ADOPT, NULL);
    m->fd = fd;
    buf_reserve_secret(&m->frame, n); /* one block: no copy left behind */
    buf_append(&m->frame, p, n);
    explicit_bzero(p, n);
    post(wk->w[i], m);
}

void workers_stop(ferry *f, const char *why)
{
    post_all(f, WM_STOP, NULL, 0, why);
}

void workers_close(ferry *f)
{
    post_all(f, WM_CLOSE, NULL, 0, NULL);
}

int workers_running(ferry *f)
{
    workers *wk = f->workers;
    int n = 0;
    for (int i = 1; wk != NULL && f->worker_index == 0 && i < wk->n; i++) {
        n += !atomic_load(&wk->w[i]->done);
    }
    return n;
}

void workers_join(ferry *f)
{
    workers *wk = f->workers;
    if (wk == NULL || f->worker_index != 0) {
        return;
    }
    for (int i = 1; i < wk->n; i++) {
        worker *w = wk->w[i];
        uv_thread_join(&w->thread);
        uv_mutex_destroy(&w->lock);
        free(w->pub);
        free(w);
        wk->w[i] = NULL;
    }
    wk->n = 1;
    /* What workers posted once the main loop stopped reading: no store is
     * left to run it (outage_close came first); popped rows are logged. */
    uv_mutex_lock(&wk->qlock);
    mmsg *q = wk->qhead;
    wk->qhead = wk->qtail = NULL;
    wk->qopen = 0;
    uv_mutex_unlock(&wk->qlock);
    while (q != NULL) {
        mmsg *next = q->next;
        if (q->fn != NULL) {
            q->fn(NULL, q->arg); /* a call: told the main loop reads no more */
        } else {
            f->workers_ops->store_drop(f, q->store);
        }
        free(q);
        q = next;
    }
    if (wk->async_open) {
        wk->async_open = 0;
        uv_close((uv_handle_t *)&wk->async, NULL);
        uv_run(f->loop, UV_RUN_DEFAULT);
    }
    uv_mutex_destroy(&wk->qlock);
    uv_mutex_destroy(&wk->publock);
    free(wk->main_pub);
    f->workers = NULL;
    free(wk);
}

void workers_loop_close(ferry *f)
{
    worker *w = self_of(f);
    if (w == NULL) {
        return;
    }
    uv_mutex_lock(&w->lock);
    int was = w->open;
    w->open = 0;
    uv_mutex_unlock(&w->lock);
    if (was) {
        uv_close((uv_handle_t *)&w->async, NULL);
    }
}

/* ----------------------------------------------------------- master view */

void workers_switch(ferry *f, const char *why)
{
    f->workers_ops->switch_master(f->up, why);
    post_all(f, WM_SWITCH, NULL, 0, why);
}

void workers_set_master(ferry *f, const char *ip, int port, const char *why)
{
    f->workers_ops->set_master(f->up, ip, port, why);
    post_all(f, WM_MASTER, ip, port, why);
}

void workers_fence_invalid(ferry *f)
{
    f->up->fence_valid = 0;
    post_all(f, WM_FENCE, NULL, 0, NULL);
}

void workers_replicas_known(ferry *f, int n)
{
    f->up->replicas_known = n;
    post_all(f, WM_REPLICAS, NULL, n, NULL);
}

void workers_keep_master(ferry *f)
{
    keep_master(f->up, 0);
    post_all(f, WM_KEEP, NULL, 0, NULL);
}

void workers_ask_replica_acks(ferry *f)
{
    workers *wk = f->workers;
    if (wk != NULL && f->worker_index > 0) {
        atomic_store(&wk->acks_asked, 1);
        uv_async_send(&wk->async);
    }
}

void workers_trigger_sentinel(ferry *f)
{
    workers *wk = f->workers;
    if (wk != NULL && f->worker_index > 0) {
        atomic_store(&wk->sentinel_asked, 1);
        uv_async_send(&wk->async);
    }
}

/* ------------------------------------------------------ the fallback store */

int workers_to_main(ferry *f, void *op)
{
    workers *wk = f->workers;
    if (wk == NULL || f->worker_index == 0) {
        return -1;
    }
    mmsg *q = xcalloc(1, sizeof(*q));
    q->store = op;
    if (to_main(wk, q) != 0) {
        free(q);
        return -1;
    }
    return 0;
}

void workers_to_loop(ferry *f, int index, void *op)
{
    workers *wk = f->workers;
    ferry_assert(wk != NULL && f->worker_index == 0 && index > 0 && index < wk->n);
    wmsg *m = msg_new(WM_STORE, NULL);
    m->store = op;
    post(wk->w[index], m); /* a closed mailbox: msg_free drops it */
}

void workers_wake(ferry *f)
{
    workers *wk = f->workers;
    for (int i = 1; wk != NULL && f->worker_index == 0 && i < wk->n; i++) {
        worker *w = wk->w[i];
        if (atomic_exchange(&w->wake, 1)) {
            continue; /* a wake is on its way */
        }
        uv_mutex_lock(&w->lock);
        if (w->open) {
            uv_async_send(&w->async);
        }
        uv_mutex_unlock(&w->lock);
    }
}

/* ------------------------------------------------------ calls between loops */

int workers_loops(const ferry *f)
{
    return f->workers != NULL ? ((const workers *)f->workers)->n : 1;
}

int workers_loop_of(const ferry *f, uint64_t id)
{
    int n = workers_loops(f);
    return n > 1 ? (int)(id % (uint64_t)n) : 0;
}

int workers_call(ferry *f, int index, workers_fn fn, void *arg)
{
    if (f->workers == NULL || index == f->worker_index) {
        fn(f, arg);
        return 0;
    }
    return workers_post(f, index, fn, arg);
}

int workers_post(const ferry *any, int index, workers_fn fn, void *arg)
{
    workers *wk = any->workers;
    if (wk == NULL || index < 0 || index >= wk->n) {
        return -1;
    }
    if (index == 0) {
        mmsg *q = xcalloc(1, sizeof(*q));
        q->fn = fn;
        q->arg = arg;
        if (to_main(wk, q) != 0) {
            free(q);
            return -1;
        }
        return 0;
    }
    wmsg *m = msg_new(WM_CALL, NULL);
    m->fn = fn;
    m->arg = arg;
    if (post_try(wk->w[index], m) != 0) {
        free(m); /* arg stays the caller's */
        return -1;
    }
    return 0;
}

/* ------------------------------------------------------- stats and limits */

static void view_of(ferry *f, worker_view *v)
{
    const list_node *n;
    memset(v, 0, sizeof(*v));
    v->clients = f->nclients;
    list_foreach(n, &f->sessions)
    {
        const session *s = list_entry(n, session, node);
        v->clients_paused += (uint64_t)(!s->reading && s->state == SESSION_OPEN);
    }
    v->held_bytes = f->held_bytes;
    v->memory = f->clients_mem;
    v->commands = f->stats.commands_total;
    if (f->up != NULL) {
        v->links = (uint64_t)f->up->nlinks;
        v->pool = (uint64_t)f->up->npool;
        v->up = f->up->state == UP_UP;
        v->epoch = f->up->epoch;
        snprintf(v->master, sizeof(v->master), "%s", f->workers_ops->master_name(f->up));
    }
}

/* Any loop: say what its clients hold, learn what the others' hold
 * (limits.max_memory is for ferry as a whole). */
static void mem_exchange(ferry *f)
{
    workers *wk = f->workers;
    uint64_t others = 0;
    atomic_store_explicit(&wk->mem[f->worker_index], f->clients_mem, memory_order_relaxed);
    for (int i = 0; i < CONFIG_MAX_WORKERS; i++) {
        if (i != f->worker_index) {
            others += atomic_load_explicit(&wk->mem[i], memory_order_relaxed);
        }
    }
    f->others_mem = (size_t)others;
}

void workers_tick(ferry *f)
{
    workers *wk = f->workers;
    if (wk == NULL) {
        return;
    }
    mem_exchange(f);
    worker *w = self_of(f);
    if (w != NULL) {
        publish(f, w, 0);
    } else {
        uv_mutex_lock(&wk->publock);
        *wk->main_pub = f->stats;
        uv_mutex_unlock(&wk->publock);
    }
}

/* Worker loop: copy its counters and gauges where the main loop reads
 * them; gen > 0 answers the main loop's WM_PUBLISH of that number. */
static void publish(ferry *f, worker *w, uint64_t gen)
{
    worker_view v;
    if (gen > 0) {
        mem_exchange(f);
    }
    view_of(f, &v);
    if (f->workers_ops->publish != NULL) {
        f->workers_ops->publish(f); /* before the gen below says it is done */
    }
    uv_mutex_lock(&w->lock);
    *w->pub = f->stats;
    w->view = v;
    if (gen > w->published) {
        w->published = gen;
    }
    uv_mutex_unlock(&w->lock);
}

uint64_t workers_refresh(ferry *f)
{
    workers *wk = f->workers;
    if (wk == NULL || f->worker_index != 0 || wk->n < 2) {
        return 0;
    }
    uint64_t gen = ++wk->refresh_gen;
    for (int i = 1; i < wk->n; i++) {
        wmsg *m = msg_new(WM_PUBLISH, NULL);
        m->gen = gen;
        post(wk->w[i], m);
    }
    return gen;
}

int workers_refreshed(ferry *f, uint64_t gen)
{
    workers *wk = f->workers;
    for (int i = 1; gen > 0 && wk != NULL && f->worker_index == 0 && i < wk->n; i++) {
        worker *w = wk->w[i];
        uv_mutex_lock(&w->lock);
        /* A loop that no longer reads its mail has published its last. */
        int fresh = w->published >= gen || !w->open;
        uv_mutex_unlock(&w->lock);
        if (!fresh) {
            return 0;
        }
    }
    if (gen > 0 && wk != NULL && f->worker_index == 0) {
        mem_exchange(f); /* what the stats port shows, the main loop enforces */
    }
    return 1;
}

int workers_stats(ferry *f, ferry_stats *st, worker_view *views, int max)
{
    workers *wk = f->workers;
    int n = 0;
    if (max > 0) {
        view_of(f, &views[n++]);
    }
    for (int i = 1; wk != NULL && f->worker_index == 0 && i < wk->n; i++) {
        worker *w = wk->w[i];
        uv_mutex_lock(&w->lock);
        if (st != NULL) {
            stats_add(st, w->pub);
        }
        if (n < max) {
            views[n++] = w->view;
        }
        uv_mutex_unlock(&w->lock);
    }
    return n;
}

void workers_totals(ferry *f, ferry_stats *st)
{
    workers *wk = f->workers;
    *st = f->stats;
    if (wk == NULL) {
        return;
    }
    if (f->worker_index != 0) {
        uv_mutex_lock(&wk->publock);
        stats_add(st, wk->main_pub);
        uv_mutex_unlock(&wk->publock);
    }
    for (int i = 1; i < wk->n; i++) {
        worker *w = wk->w[i];
        if (i == f->worker_index || w == NULL) {
            continue;
        }
        uv_mutex_lock(&w->lock);
        stats_add(st, w->pub);
        uv_mutex_unlock(&w->lock);
    }
}

void workers_held_changed(ferry *f, int64_t delta)
{
    workers *wk = f->workers;
    if (wk != NULL) {
        atomic_fetch_add_explicit(&wk->held, delta, memory_order_relaxed);
    }
}

uint64_t workers_held(const ferry *f)
{
    const workers *wk = f->workers;
    if (wk == NULL) {
        return f->held_bytes;
    }
    long long v = atomic_load_explicit(&wk->held, memory_order_relaxed);
    return v > 0 ? (uint64_t)v : 0;
}

uint64_t workers_clients(const ferry *f)
{
    const workers *wk = f->workers;
    return wk != NULL ? (uint64_t)atomic_load(&wk->clients) : f->nclients;
}

void workers_client_opened(ferry *f)
{
    if (f->workers != NULL) {
        atomic_fetch_add(&f->workers->clients, 1);
    }
}

void workers_client_closed(ferry *f)
{
    if (f->workers != NULL) {
        atomic_fetch_sub(&f->workers->clients, 1);
    }
}
