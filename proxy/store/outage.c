/* outage.c - the queue while no Redis master is usable (N14).
 *
 * While the master view is DOWN, eligible writes (LPUSH, RPUSH, ZADD
 * without NX/XX/GT/LT/INCR, database 0, keys matching fallback.keys) are
 * committed to the fallback store and acknowledged only then; pops on keys
 * with rows in the store are served from it; a blocking pop on an eligible
 * key waits for a fallback write (or its own timeout). A push answers the
 * length of the key's part in the store: Redis' part is out of reach.
 *
 * The replay of the stored rows, once a master is UP again, is
 * replay.c's; both files share the state in outage_int.h.
 *
 * More event loops (workers: N): the main loop owns the store (one SQLite
 * file, one lock) and the replay. A worker loop has a view of it (remote):
 * it decides what the store serves exactly as the main loop does, reading
 * the store's row index (fallback_key_rows, locked inside the store) and
 * the count of client operations in flight on any loop (shared, atomic),
 * so outage_blocks stays per key and a blocked pop waits, held, on its own
 * loop (woken by every store write, on every loop, and by the tick). Only
 * the store operations themselves hop threads: a worker posts a copy of the
 * operation to the main loop (workers_to_main), the main loop runs it on
 * the store and posts the result, rows deep-copied, back to the worker's
 * mailbox (workers_to_loop), where the usual callback answers the request
 * in its session's order. A request whose client left stays alive until
 * its result is back (as on one loop); popped rows nobody can take any
 * more - the client left, the worker closed, its mailbox is gone - are put
 * back in the store by the main loop, as one loop does for a vanished
 * client of a pop.
 *
 * A pop's rows are only taken in the store (fallback_pop); the request
 * carries them to its session (request.written), which says once the
 * reply was written to the client's socket - the rows are deleted
 * (fallback_confirm) - or that it never will be - the client left first:
 * they are back where they were (fallback_release). From a worker, that
 * word goes to the main loop like any store operation; a kill of ferry in
 * between leaves them taken, and the next open puts them back. */
#include "outage.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/time.h>

#include "clustermap.h"
#include "fallback.h"
#include "link.h"
#include "log.h"
#include "outage_int.h"
#include "upstream.h"
#include "workers.h"

/* A store operation a worker loop asked the main loop to run. The worker
 * fills the request, the main loop the result; each hand-off goes through a
 * mutex-guarded queue, so one thread at a time touches it (node, cb and arg
 * are the worker's alone). */
typedef enum remote_kind { RO_PUSH = 0, RO_POP, RO_MOVE, RO_CONFIRM, RO_RELEASE } remote_kind;

typedef struct remote_op {
    list_node node;  /* worker: in its outage's remote_ops while it waits for the result */
    ferry *main_ctx; /* the main loop's context */
    int loop;        /* the worker's index */
    fallback_cb cb;  /* worker: gets the result; NULL once nobody waits for it */
    void *arg;       /* for cb */
    int awaited;     /* a result goes back (set once, before it is sent); confirms
                        and releases have none */
    remote_kind kind;
    int how;      /* push: enum fallback_kind; pop, move: enum fallback_end */
    int to;       /* move: FB_LPUSH or FB_RPUSH */
    size_t count; /* pop: most rows */
    char *key;    /* push, pop: the key; move: the source */
    size_t keylen;
    char *dst; /* move: the destination; push: a held push's receipt key, or NULL */
    size_t dstlen;
    size_t n;       /* push: members */
    int64_t *ids;   /* confirm, release: the taken rows */
    size_t nids;    /* confirm, release */
    char **members; /* push: copies */
    size_t *lens;   /* push */
    double *scores; /* push */
    int answered;   /* the main loop ran it: the result below holds */
    int returned;   /* handed back to the main loop undelivered */
    int status;     /* 0 or a negative error */
    char errstr[160];
    int64_t rcount;       /* fallback_result.count */
    fallback_item *items; /* deep copies: item.key owns key and member */
    size_t nitems;
} remote_op;

/* A client request in flight on the store. */
typedef struct store_op {
    ferry *f;
    outage_shared *sh; /* pending_ops */
    request *r;
    int kind;       /* what was asked: a fallback_kind for pushes, else 0 */
    int end;        /* pops: enum fallback_end */
    int blocking;   /* BLPOP & co: reply with the key, requeue on 0 rows */
    int with_count; /* LPOP key count: reply an array */
    int zset;       /* ZPOP: members with scores */
    int move;       /* LMOVE & co: reply the moved element (bulk) */
    char *key;      /* pops: the key popped (for the reply and push-back) */
    size_t keylen;
    uint64_t start_ns; /* uv_hrtime() when submitted */
} store_op;

/* ----------------------------------------------------------------- helpers */

static int arg_double(const resp_arg *a, double *out)
{
    char tmp[64], *end;
    if (a->len == 0 || a->len >= sizeof(tmp)) {
        return -1;
    }
    memcpy(tmp, a->ptr, a->len);
    tmp[a->len] = '\0';
    if (strcasecmp(tmp, "+inf") == 0 || strcasecmp(tmp, "inf") == 0) {
        *out = 1.0 / 0.0;
        return 0;
    }
    if (strcasecmp(tmp, "-inf") == 0) {
        *out = -1.0 / 0.0;
        return 0;
    }
    *out = strtod(tmp, &end);
    return *end == '\0' && *out == *out ? 0 : -1;
}

static int arg_count(const resp_arg *a, size_t *out)
{
    char tmp[32], *end;
    if (a->len == 0 || a->len >= sizeof(tmp)) {
        return -1;
    }
    memcpy(tmp, a->ptr, a->len);
    tmp[a->len] = '\0';
    long long v = strtoll(tmp, &end, 10);
    if (*end != '\0' || v <= 0) {
        return -1;
    }
    *out = (size_t)v;
    return 0;
}

static void append_double(buf *b, double d, int proto)
{
    char tmp[64];
    if (d == 1.0 / 0.0) {
        snprintf(tmp, sizeof(tmp), "inf");
    } else if (d == -1.0 / 0.0) {
        snprintf(tmp, sizeof(tmp), "-inf");
    } else {
        snprintf(tmp, sizeof(tmp), "%.17g", d);
    }
    if (proto == 3) {
        buf_append(b, ",", 1); /* RESP3 double */
        buf_append_str(b, tmp);
        buf_append(b, "\r\n", 2);
        return;
    }
    buf_append_bulk(b, tmp, strlen(tmp));
}

/* -------------------------------------------------------------- open/close */

static void shared_unref(outage_shared *sh)
{
    if (atomic_fetch_sub(&sh->refs, 1) == 1) {
        uv_mutex_destroy(&sh->lock);
        free(sh);
    }
}

int outage_open(ferry *f)
{
    const config *cfg = f->cfg;
    char err[256], host[128] = "localhost";
    size_t hlen = sizeof(host);
    struct outage *o;
    if (cfg->fallback_path == NULL) {
        return 0;
    }
    o = xcalloc(1, sizeof(*o));
    o->f = f;
    list_init(&o->remote_ops);
    int rc = fallback_open(f->loop, cfg->fallback_path, cfg->fallback_max_bytes, &o->fb, err,
                           sizeof(err));
    if (rc < 0) {
        log_error("fallback store %s: %s", cfg->fallback_path, err);
        free(o);
        return rc;
    }
    o->sh = xcalloc(1, sizeof(*o->sh));
    uv_mutex_init(&o->sh->lock);
    o->sh->fb = o->fb;
    atomic_init(&o->sh->pending_ops, 0);
    atomic_init(&o->sh->refs, 1);
    if (uv_os_gethostname(host, &hlen) != 0) {
        snprintf(host, sizeof(host), "localhost");
    }
    if (cfg->has_cluster) {
        /* One marker hash per slot: "ferry:fallback:{<tag>}" then this part. */
        snprintf(o->marker, sizeof(o->marker), ":%s:%s", host, cfg->fallback_path);
    } else {
        snprintf(o->marker, sizeof(o->marker), "ferry:fallback:%s:%s", host, cfg->fallback_path);
    }
    f->outage = o;
    log_info("fallback store %s open: %llu row(s) pending replay", cfg->fallback_path,
             (unsigned long long)fallback_rows(o->fb));
    fallback_stats fs;
    fallback_get_stats(o->fb, &fs);
    if (fs.released > 0) {
        log_warn("fallback store: %llu row(s) popped before ferry last stopped, their replies "
                 "not known written, are back in the queue (a consumer may get them twice)",
                 (unsigned long long)fs.released);
    }
    if (cfg->client_auth == CLIENT_AUTH_REDIS) {
        log_warn("fallback store: client.auth redis: it serves no client while Redis is down "
                 "(without Redis no ACL says what a user may do); it still replays its rows");
    }
    return 0;
}

void outage_attach(ferry *wf, ferry *main_ctx)
{
    struct outage *mo = main_ctx->outage;
    if (mo == NULL || wf->outage != NULL) {
        return;
    }
    struct outage *o = xcalloc(1, sizeof(*o));
    o->f = wf;
    o->sh = mo->sh;
    atomic_fetch_add(&o->sh->refs, 1);
    o->remote = 1;
    o->main_ctx = main_ctx;
    list_init(&o->remote_ops);
    snprintf(o->marker, sizeof(o->marker), "%s", mo->marker);
    wf->outage = o;
}

static void op_answer(store_op *op, const char *p, size_t n);
static void op_free(store_op *op);

void outage_close(ferry *f)
{
    struct outage *o = f->outage;
    if (o == NULL) {
        return;
    }
    f->outage = NULL;
    if (o->remote) {
        /* The worker closes (its sessions are closed): its operations still
         * on the main loop lose their requests; a result that comes back
         * with popped rows is put back in the store there (cb NULL). */
        while (!list_empty(&o->remote_ops)) {
            remote_op *ro = list_entry(list_first(&o->remote_ops), remote_op, node);
            list_del(&ro->node);
            store_op *op = ro->arg;
            ro->cb = NULL;
            ro->arg = NULL;
            atomic_fetch_sub(&op->sh->pending_ops, 1);
            op_answer(op, "-ERR ferry: closing\r\n", 21);
            op_free(op);
        }
        shared_unref(o->sh);
        free(o);
        return;
    }
    uv_mutex_lock(&o->sh->lock);
    o->sh->fb = NULL; /* no loop reads its index any more */
    uv_mutex_unlock(&o->sh->lock);
    fallback_close(o->fb); /* callbacks run: op->sh is still held */
    shared_unref(o->sh);
    for (size_t i = 0; i < o->ngroups; i++) {
        free(o->groups[i].key);
    }
    free(o->groups);
    while (o->refused != NULL) {
        refused_key *k = o->refused;
        o->refused = k->next;
        free(k->key);
        free(k);
    }
    replay_free_keys(o);
    free(o);
}

/* ------------------------------------------------------------ store access */

/* Every loop may ask for the rows pending (the index is locked inside the
 * store); a worker's view holds the shared lock so the store stays open
 * while it asks. */
static uint64_t store_key_count(struct outage *o, const char *key, size_t len,
                                uint64_t (*count)(const fallback *, const char *, size_t))
{
    if (!o->remote) {
        return count(o->fb, key, len);
    }
    uv_mutex_lock(&o->sh->lock);
    uint64_t n = o->sh->fb != NULL ? count(o->sh->fb, key, len) : 0;
    uv_mutex_unlock(&o->sh->lock);
    return n;
}

/* Rows of key not replayed yet, taken ones included: writes to it wait. */
static uint64_t store_key_rows(struct outage *o, const char *key, size_t len)
{
    return store_key_count(o, key, len, fallback_key_rows);
}

/* Rows of key a pop may take now. */
static uint64_t store_key_ready(struct outage *o, const char *key, size_t len)
{
    return store_key_count(o, key, len, fallback_key_ready);
}

static uint64_t store_rows(struct outage *o)
{
    if (!o->remote) {
        return fallback_rows(o->fb);
    }
    uv_mutex_lock(&o->sh->lock);
    uint64_t n = o->sh->fb != NULL ? fallback_rows(o->sh->fb) : 0;
    uv_mutex_unlock(&o->sh->lock);
    return n;
}

static void remote_free(remote_op *ro)
{
    free(ro->key);
    free(ro->dst);
    for (size_t i = 0; i < ro->n; i++) {
        free(ro->members[i]);
    }
    free(ro->members);
    free(ro->lens);
    free(ro->scores);
    free(ro->ids);
    for (size_t i = 0; i < ro->nitems; i++) {
        free((char *)ro->items[i].key); /* owns key and member */
    }
    free(ro->items);
    free(ro);
}

static remote_op *remote_new(struct outage *o, remote_kind kind, const char *key, size_t keylen,
                             fallback_cb cb, void *arg)
{
    remote_op *ro = xcalloc(1, sizeof(*ro));
    list_init(&ro->node);
    ro->main_ctx = o->main_ctx;
    ro->loop = o->f->worker_index;
    ro->cb = cb;
    ro->arg = arg;
    ro->awaited = cb != NULL;
    ro->kind = kind;
    ro->key = xstrndup(key, keylen);
    ro->keylen = keylen;
    return ro;
}

/* Worker: hand ro to the main loop; a result is awaited if it has a cb. */
static void remote_send(struct outage *o, remote_op *ro)
{
    if (ro->awaited) {
        list_add_tail(&o->remote_ops, &ro->node);
    }
    if (workers_to_main(o->f, ro) < 0) {
        /* Not while this worker runs: outage_close answers it. */
        log_error("fallback store: an operation could not reach the main loop");
        if (!ro->awaited) {
            remote_free(ro); /* a confirm or release: the rows stay taken until a restart */
        }
    }
}

/* The store operations a client request needs, on the loop's own store or,
 * from a worker, on the main loop's. */
static void store_push(struct outage *o, int kind, const char *key, size_t keylen,
                       const char *const *m, const size_t *l, const double *sc, size_t n,
                       const char *rcpt, size_t rcptlen, fallback_cb cb, void *arg)
{
    if (!o->remote) {
        if (rcpt != NULL) {
            fallback_push_held(o->fb, kind, key, keylen, m, l, n, rcpt, rcptlen, cb, arg);
        } else {
            fallback_push(o->fb, kind, key, keylen, m, l, sc, n, cb, arg);
        }
        return;
    }
    remote_op *ro = remote_new(o, RO_PUSH, key, keylen, cb, arg);
    ro->how = kind;
    if (rcpt != NULL) {
        ro->dst = xstrndup(rcpt, rcptlen);
        ro->dstlen = rcptlen;
    }
    ro->n = n;
    ro->members = xcalloc(n, sizeof(*ro->members));
    ro->lens = xcalloc(n, sizeof(*ro->lens));
    ro->scores = xcalloc(n, sizeof(*ro->scores));
    for (size_t i = 0; i < n; i++) {
        ro->members[i] = xstrndup(m[i], l[i]);
        ro->lens[i] = l[i];
        ro->scores[i] = sc != NULL ? sc[i] : 0;
    }
    remote_send(o, ro);
}

static void store_pop(struct outage *o, int end, const char *key, size_t keylen, size_t count,
                      fallback_cb cb, void *arg)
{
    if (!o->remote) {
        fallback_pop(o->fb, end, key, keylen, count, cb, arg);
        return;
    }
    remote_op *ro = remote_new(o, RO_POP, key, keylen, cb, arg);
    ro->how = end;
    ro->count = count;
    remote_send(o, ro);
}

static void store_move(struct outage *o, int end, const char *src, size_t srclen, int to,
                       const char *dst, size_t dstlen, fallback_cb cb, void *arg)
{
    if (!o->remote) {
        fallback_move(o->fb, end, src, srclen, to, dst, dstlen, cb, arg);
        return;
    }
    remote_op *ro = remote_new(o, RO_MOVE, src, srclen, cb, arg);
    ro->how = end;
    ro->to = to;
    ro->dst = xstrndup(dst, dstlen);
    ro->dstlen = dstlen;
    remote_send(o, ro);
}

/* Main loop: taken rows deleted, their replies written: writes waiting for
 * their keys' rows (a master is back) may go on. A failure leaves them
 * taken: the next open puts them back (delivered twice, not lost). */
static void confirm_done(void *arg, int status, const char *errstr, const fallback_result *res)
{
    ferry *f = arg;
    if (status < 0) {
        log_error("fallback store: rows whose replies were written could not be deleted: %s "
                  "(they are back in the queue after a restart)",
                  errstr);
        return;
    }
    if (res->count > 0 && f->outage != NULL &&
        (f->cluster != NULL || (f->up != NULL && f->up->state == UP_UP))) {
        outage_wake_loops(f);
    }
}

/* Main loop: taken rows back in the queue, their replies never written:
 * blocked pops on every loop may take them. */
static void release_done(void *arg, int status, const char *errstr, const fallback_result *res)
{
    ferry *f = arg;
    if (status < 0) {
        log_error("fallback store: rows whose replies were not written could not be put back "
                  "now: %s (they are, once ferry restarts)",
                  errstr);
        return;
    }
    if (res->count > 0 && f->outage != NULL) {
        log_debug("fallback store: %lld popped row(s) back in the queue: their replies were "
                  "never written",
                  (long long)res->count);
        outage_wake_loops(f);
    }
}

/* The rows a pop took, told what became of the reply carrying them: written
 * (deleted) or never (back where they were); on the loop's own store, or
 * from a worker through the main loop's. */
static void store_settle(struct outage *o, int written, const int64_t *ids, size_t n)
{
    if (o == NULL || n == 0) {
        return; /* the store closed: they stay taken, and go back when it opens */
    }
    if (!o->remote) {
        if (written) {
            fallback_confirm(o->fb, ids, n, confirm_done, o->f);
        } else {
            fallback_release(o->fb, ids, n, release_done, o->f);
        }
        return;
    }
    remote_op *ro = remote_new(o, written ? RO_CONFIRM : RO_RELEASE, "", 0, NULL, NULL);
    ro->ids = xmalloc(n * sizeof(*ro->ids));
    memcpy(ro->ids, ids, n * sizeof(*ro->ids));
    ro->nids = n;
    remote_send(o, ro);
}

/* The same for rows as a pop's result lists them. */
static void store_settle_items(struct outage *o, int written, const fallback_item *items, size_t n)
{
    int64_t *ids = xcalloc(n ? n : 1, sizeof(*ids));
    for (size_t i = 0; i < n; i++) {
        ids[i] = items[i].id;
    }
    store_settle(o, written, ids, n);
    free(ids);
}

/* Rows a pop took, carried by its reply to the session (request.written). */
typedef struct taken_rows {
    ferry *f;      /* the loop of the session that writes the reply */
    size_t n;      /* rows */
    int64_t ids[]; /* their ids */
} taken_rows;

/* request.written: the reply carrying t's rows was written, or never will be. */
static void taken_written(void *arg, int written)
{
    taken_rows *t = arg;
    store_settle(t->f->outage, written, t->ids, t->n);
    free(t);
}

/* Blocked pops on every loop may be served now. */
void outage_wake_loops(ferry *f)
{
    f->wake_pending = 1;
    workers_wake(f);
}

/* Main loop: a result no worker can take (the client left, the worker
 * closed): popped rows go back to the store, as for a vanished client of a
 * pop on one loop (a move left its element in the store: nothing to undo). */
static void remote_orphan(struct outage *o, remote_op *ro)
{
    if (ro->answered && ro->status == 0 && ro->kind == RO_POP && ro->nitems > 0) {
        /* Back where they were; with the store closed, when it opens. */
        store_settle_items(o, 0, ro->items, ro->nitems);
    }
    remote_free(ro);
}

/* Main loop: the store ran a worker's operation. */
static void remote_done(void *arg, int status, const char *errstr, const fallback_result *res)
{
    remote_op *ro = arg;
    ferry *f = ro->main_ctx;
    ro->answered = 1;
    ro->status = status;
    if (status < 0) {
        snprintf(ro->errstr, sizeof(ro->errstr), "%s", errstr != NULL ? errstr : "error");
    }
    ro->rcount = res->count;
    if (res->nitems > 0) {
        ro->items = xcalloc(res->nitems, sizeof(*ro->items));
        for (size_t i = 0; i < res->nitems; i++) {
            const fallback_item *it = &res->items[i];
            fallback_item *c = &ro->items[i];
            char *blk = xmalloc(it->keylen + it->memberlen + 1);
            memcpy(blk, it->key, it->keylen);
            memcpy(blk + it->keylen, it->member, it->memberlen);
            *c = *it;
            c->key = blk;
            c->member = blk + it->keylen;
        }
        ro->nitems = res->nitems;
    }
    if (status == 0 && ro->kind == RO_PUSH) {
        outage_wake_loops(f);
    }
    workers_to_loop(f, ro->loop, ro); /* undeliverable: outage_remote_drop */
}

void outage_remote_run(ferry *f, void *p)
{
    remote_op *ro = p;
    struct outage *o = f->outage;
    if (ro->returned) {
        remote_orphan(o, ro);
        return;
    }
    if (o == NULL) {
        if (!ro->awaited) {
            remote_free(ro); /* a confirm or release: the rows go back when the store opens */
            return;
        }
        fallback_result none = {0, NULL, 0};
        remote_done(ro, UV_ECANCELED, "fallback store closed", &none);
        return;
    }
    /* Nobody waits for a confirm or a release (the operations without a
     * result): the store copies what it needs. */
    switch (ro->kind) {
    case RO_PUSH:
        if (ro->dst != NULL) {
            fallback_push_held(o->fb, ro->how, ro->key, ro->keylen,
                               (const char *const *)ro->members, ro->lens, ro->n, ro->dst,
                               ro->dstlen, remote_done, ro);
        } else {
            fallback_push(o->fb, ro->how, ro->key, ro->keylen, (const char *const *)ro->members,
                          ro->lens, ro->scores, ro->n, remote_done, ro);
        }
        break;
    case RO_POP:
        fallback_pop(o->fb, ro->how, ro->key, ro->keylen, ro->count, remote_done, ro);
        break;
    case RO_MOVE:
        fallback_move(o->fb, ro->how, ro->key, ro->keylen, ro->to, ro->dst, ro->dstlen, remote_done,
                      ro);
        break;
    case RO_CONFIRM:
    case RO_RELEASE:
        store_settle(o, ro->kind == RO_CONFIRM, ro->ids, ro->nids);
        break;
    }
    if (!ro->awaited) {
        remote_free(ro);
    }
}

void outage_remote_done(ferry *f, void *p)
{
    remote_op *ro = p;
    if (ro->cb == NULL || !list_linked(&ro->node)) {
        outage_remote_drop(f, ro);
        return;
    }
    list_del(&ro->node);
    fallback_result res = {ro->rcount, ro->items, ro->nitems};
    ro->cb(ro->arg, ro->status, ro->status < 0 ? ro->errstr : NULL, &res);
    remote_free(ro);
}

void outage_remote_drop(ferry *f, void *p)
{
    remote_op *ro = p;
    if (f->worker_index == 0) {
        remote_orphan(f->outage, ro);
        return;
    }
    ro->returned = 1;
    if (workers_to_main(f, ro) < 0) {
        remote_orphan(NULL, ro); /* every loop has stopped: no store to put rows back in */
    }
}

/* ------------------------------------------------------------- client path */

static store_op *op_new(session *s, request *r)
{
    store_op *op = xcalloc(1, sizeof(*op));
    op->f = s->f;
    op->sh = s->f->outage->sh;
    op->r = r;
    op->start_ns = uv_hrtime();
    r->s = s;
    r->sent_ns = uv_hrtime();
    request_set_state(r, REQ_SENT);
    s->inflight++;
    s->flight_link = NULL; /* in flight on the store */
    atomic_fetch_add(&op->sh->pending_ops, 1);
    return op;
}

static void op_free(store_op *op)
{
    free(op->key);
    free(op);
}

/* The op is done: the request is answered (or freed if its client left). */
static void op_answer(store_op *op, const char *p, size_t n)
{
    request *r = op->r;
    if (r->s == NULL) {
        request_free(op->f, r);
    } else {
        op->f->outage_ops->on_reply(r->s, r, p, n);
    }
}

static void push_done(void *arg, int status, const char *errstr, const fallback_result *res)
{
    store_op *op = arg;
    ferry *f = op->f;
    char line[300];
    atomic_fetch_sub(&op->sh->pending_ops, 1);
    if (status < 0) {
        if (f->outage != NULL) {
            f->outage->store_errors++;
        }
        log_error("fallback store: a write was not committed: %s", errstr);
        snprintf(line, sizeof(line),
                 "-ERR ferry: no Redis master and the fallback store failed: %s (not "
                 "acknowledged)\r\n",
                 errstr);
    } else {
        snprintf(line, sizeof(line), ":%lld\r\n", (long long)res->count);
        f->stats.fallback_written++;
        stats_observe(&f->stats.fallback_commit_seconds, (uv_hrtime() - op->start_ns) / 1000);
    }
    op_answer(op, line, strlen(line));
    outage_wake_loops(f); /* blocked pops may be served now */
    op_free(op);
}

static void pop_done(void *arg, int status, const char *errstr, const fallback_result *res)
{
    store_op *op = arg;
    ferry *f = op->f;
    request *r = op->r;
    buf b;
    atomic_fetch_sub(&op->sh->pending_ops, 1);
    if (status < 0) {
        char line[300];
        snprintf(line, sizeof(line),
                 "-ERR ferry: no Redis master and the fallback store failed: %s\r\n", errstr);
        op_answer(op, line, strlen(line));
        op_free(op);
        return;
    }
    if (r->s == NULL && res->nitems > 0 && !op->move) {
        /* Items popped for a client that left: back where they were (a
         * move left its element in the store: nothing to undo). */
        store_settle_items(f->outage, 0, res->items, res->nitems);
        request_free(f, r);
        op_free(op);
        return;
    }
    if (res->nitems == 0 && op->blocking && r->s != NULL) {
        r->s->f->outage_ops->requeue(r->s, r); /* another consumer was first: wait again */
        op_free(op);
        return;
    }
    f->stats.fallback_popped += res->nitems;
    buf_init(&b);
    int proto = r->s != NULL ? r->s->proto : 2;
    if (res->nitems == 0 && op->zset && !op->blocking) {
        buf_append_str(&b, "*0\r\n"); /* ZPOPMIN/ZPOPMAX on nothing: empty array */
    } else if (res->nitems == 0) {
        buf_append_str(&b, proto == 3                   ? "_\r\n"
                           : op->with_count || op->zset ? "*-1\r\n"
                                                        : "$-1\r\n");
    } else if (op->move) {
        buf_append_bulk(&b, res->items[0].member, res->items[0].memberlen);
    } else if (op->blocking) {
        buf_append_count(&b, '*', op->zset ? 3 : 2);
        buf_append_bulk(&b, op->key, op->keylen);
        buf_append_bulk(&b, res->items[0].member, res->items[0].memberlen);
        if (op->zset) {
            append_double(&b, res->items[0].score, proto);
        }
    } else if (op->zset && proto == 3 && op->with_count) {
        /* RESP3 ZPOPMIN key count: one [member, score] pair per item. */
        buf_append_count(&b, '*', res->nitems);
        for (size_t i = 0; i < res->nitems; i++) {
            buf_append_count(&b, '*', 2);
            buf_append_bulk(&b, res->items[i].member, res->items[i].memberlen);
            append_double(&b, res->items[i].score, proto);
        }
    } else if (op->zset) {
        buf_append_count(&b, '*', res->nitems * 2);
        for (size_t i = 0; i < res->nitems; i++) {
            buf_append_bulk(&b, res->items[i].member, res->items[i].memberlen);
            append_double(&b, res->items[i].score, proto);
        }
    } else if (op->with_count) {
        buf_append_count(&b, '*', res->nitems);
        for (size_t i = 0; i < res->nitems; i++) {
            buf_append_bulk(&b, res->items[i].member, res->items[i].memberlen);
        }
    } else {
        buf_append_bulk(&b, res->items[0].member, res->items[0].memberlen);
    }
    if (res->nitems > 0 && !op->move) {
        /* The rows are taken: deleted once this reply is written to the
         * client's socket, back in the queue if it never is. */
        taken_rows *t = xmalloc(sizeof(*t) + res->nitems * sizeof(t->ids[0]));
        t->f = f;
        t->n = res->nitems;
        for (size_t i = 0; i < res->nitems; i++) {
            t->ids[i] = res->items[i].id;
        }
        r->written = taken_written;
        r->written_arg = t;
    }
    op_answer(op, buf_head(&b), buf_used(&b));
    buf_free(&b);
    op_free(op);
}

/* Parse r's bytes (kept for retries) into req; p must be freed by the caller. */
static resp_parser *parse(const request *r, resp_request *req)
{
    resp_parser *p = resp_parser_new(NULL);
    if (resp_parse_request(p, buf_head(&r->data), buf_used(&r->data), req) != RESP_OK) {
        resp_parser_free(p);
        return NULL;
    }
    return p;
}

static int dispatch_push(session *s, request *r, const resp_request *req, int kind,
                         const char *rcpt, size_t rcptlen)
{
    ferry *f = s->f;
    size_t first = 2, n;
    if (kind == FB_ZADD) {
        /* Options that need the old value are not served; CH is. */
        for (; first < req->argc; first++) {
            const resp_arg *a = &req->argv[first];
            if (resp_arg_is(a, "nx") || resp_arg_is(a, "xx") || resp_arg_is(a, "gt") ||
                resp_arg_is(a, "lt") || resp_arg_is(a, "incr")) {
                return 0;
            }
            if (!resp_arg_is(a, "ch")) {
                break;
            }
        }
        if (req->argc - first < 2 || (req->argc - first) % 2 != 0) {
            return 0; /* Redis' syntax error: left for Redis */
        }
        n = (req->argc - first) / 2;
    } else {
        if (req->argc < 3) {
            return 0;
        }
        n = req->argc - 2;
    }
    const char **m = xcalloc(n, sizeof(*m));
    size_t *l = xcalloc(n, sizeof(*l));
    double *sc = xcalloc(n, sizeof(*sc));
    for (size_t i = 0; i < n; i++) {
        if (kind == FB_ZADD) {
            if (arg_double(&req->argv[first + 2 * i], &sc[i]) != 0) {
                free(m);
                free(l);
                free(sc);
                return 0; /* not a float: Redis' error later */
            }
            m[i] = req->argv[first + 2 * i + 1].ptr;
            l[i] = req->argv[first + 2 * i + 1].len;
        } else {
            m[i] = req->argv[2 + i].ptr;
            l[i] = req->argv[2 + i].len;
        }
    }
    store_op *op = op_new(s, r);
    op->kind = kind;
    store_push(f->outage, kind, req->argv[1].ptr, req->argv[1].len, m, l, sc, n,
               kind != FB_ZADD ? rcpt : NULL, rcptlen, push_done, op);
    free(m);
    free(l);
    free(sc);
    return 1;
}

static int dispatch_pop(session *s, request *r, const resp_request *req, int end, int blocking,
                        int zset)
{
    ferry *f = s->f;
    struct outage *o = f->outage;
    size_t count = 1, nkeys = 1;
    int with_count = 0;
    if (!f->cfg->fallback_serve_pops || req->argc < 2) {
        return 0;
    }
    if (blocking) {
        nkeys = req->argc - 2; /* BLPOP k1 .. kn timeout */
        if (req->argc < 3) {
            return 0;
        }
    } else if (req->argc == 3) {
        if (arg_count(&req->argv[2], &count) != 0) {
            return 0;
        }
        with_count = 1;
    } else if (req->argc != 2) {
        return 0;
    }
    int eligible = 0;
    for (size_t i = 1; i <= nkeys; i++) {
        const resp_arg *k = &req->argv[i];
        if (!config_fallback_key(f->cfg, k->ptr, k->len)) {
            continue;
        }
        eligible = 1;
        if (store_key_ready(o, k->ptr, k->len) == 0) {
            continue;
        }
        store_op *op = op_new(s, r);
        op->end = end;
        op->blocking = blocking;
        op->with_count = with_count;
        op->zset = zset;
        op->key = xmalloc(k->len + 1);
        memcpy(op->key, k->ptr, k->len);
        op->keylen = k->len;
        store_pop(o, end, k->ptr, k->len, count, pop_done, op);
        return 1;
    }
    return blocking && eligible ? 2 : 0;
}

/* LMOVE src dst from to / BLMOVE ... timeout / RPOPLPUSH src dst /
 * BRPOPLPUSH src dst timeout: both keys must be queue keys. */
static int dispatch_move(session *s, request *r, const resp_request *req, int blocking, int lmove)
{
    ferry *f = s->f;
    struct outage *o = f->outage;
    int end = FB_TAIL, to = FB_LPUSH;
    size_t want = lmove ? 5 + (size_t)blocking : 3 + (size_t)blocking;
    if (!f->cfg->fallback_serve_pops || req->argc != want) {
        return 0;
    }
    const resp_arg *src = &req->argv[1], *dst = &req->argv[2];
    if (lmove) {
        if (resp_arg_is(&req->argv[3], "left")) {
            end = FB_HEAD;
        } else if (!resp_arg_is(&req->argv[3], "right")) {
            return 0;
        }
        if (resp_arg_is(&req->argv[4], "right")) {
            to = FB_RPUSH;
        } else if (!resp_arg_is(&req->argv[4], "left")) {
            return 0;
        }
    }
    if (!config_fallback_key(f->cfg, src->ptr, src->len) ||
        !config_fallback_key(f->cfg, dst->ptr, dst->len)) {
        return 0;
    }
    if (store_key_ready(o, src->ptr, src->len) == 0) {
        return blocking ? 2 : 0;
    }
    store_op *op = op_new(s, r);
    op->move = 1;
    op->blocking = blocking;
    op->end = end;
    store_move(o, end, src->ptr, src->len, to, dst->ptr, dst->len, pop_done, op);
    return 1;
}

int outage_owner_up(const struct outage *o)
{
    return o->remote && atomic_load(&o->sh->owner_up);
}

int outage_dispatch(session *s, request *r, const char *rcpt, size_t rcptlen)
{
    ferry *f = s->f;
    resp_request req;
    int rc = 0;
    if (f->outage == NULL || r->cmd == NULL || s->db != 0 || outage_owner_up(f->outage)) {
        return 0; /* (a worker's master view lags the main loop's: held for Redis) */
    }
    const char *name = r->cmd->name;
    int push = strcmp(name, "lpush") == 0   ? FB_LPUSH
               : strcmp(name, "rpush") == 0 ? FB_RPUSH
               : strcmp(name, "zadd") == 0  ? FB_ZADD
                                            : 0;
    int end = -1, blocking = 0, zset = 0;
    if (strcmp(name, "lpop") == 0 || strcmp(name, "blpop") == 0) {
        end = FB_HEAD;
    } else if (strcmp(name, "rpop") == 0 || strcmp(name, "brpop") == 0) {
        end = FB_TAIL;
    } else if (strcmp(name, "zpopmin") == 0 || strcmp(name, "bzpopmin") == 0) {
        end = FB_MIN;
        zset = 1;
    } else if (strcmp(name, "zpopmax") == 0 || strcmp(name, "bzpopmax") == 0) {
        end = FB_MAX;
        zset = 1;
    }
    int move = strcmp(name, "lmove") == 0 || strcmp(name, "blmove") == 0           ? 2
               : strcmp(name, "rpoplpush") == 0 || strcmp(name, "brpoplpush") == 0 ? 1
                                                                                   : 0;
    if ((!push && end < 0 && !move) || !config_fallback_command(f->cfg, name)) {
        return 0;
    }
    blocking = name[0] == 'b';
    resp_parser *p = parse(r, &req);
    if (p == NULL) {
        return 0;
    }
    if (push) {
        if (req.argc >= 2 && config_fallback_key(f->cfg, req.argv[1].ptr, req.argv[1].len)) {
            rc = dispatch_push(s, r, &req, push, rcpt, rcptlen);
        }
    } else if (move) {
        rc = dispatch_move(s, r, &req, blocking, move == 2);
    } else {
        rc = dispatch_pop(s, r, &req, end, blocking, zset);
    }
    resp_parser_free(p);
    return rc;
}

upstream *outage_view(ferry *f, const request *r)
{
    upstream *up = f->cluster != NULL && r != NULL ? clustermap_route(f->cluster, r->slot) : NULL;
    return up != NULL ? up : f->up;
}

int outage_waits(ferry *f, const request *r)
{
    struct outage *o = f->outage;
    upstream *up = outage_view(f, r);
    return o != NULL && up != NULL && up->state == UP_DOWN && !outage_owner_up(o) &&
           uv_now(f->loop) - up->down_since_ms >= f->cfg->fallback_after_ms &&
           (r->flags & REQ_F_BLOCKING) && f->cfg->fallback_serve_pops && r->cmd != NULL &&
           (strcmp(r->cmd->name, "blpop") == 0 || strcmp(r->cmd->name, "brpop") == 0 ||
            strcmp(r->cmd->name, "bzpopmin") == 0 || strcmp(r->cmd->name, "bzpopmax") == 0 ||
            strcmp(r->cmd->name, "blmove") == 0 || strcmp(r->cmd->name, "brpoplpush") == 0);
}

int outage_blocks(ferry *f, const request *r)
{
    struct outage *o = f->outage;
    resp_request req;
    int blocked = 0;
    if (o == NULL || !(r->flags & REQ_F_WRITE) || r->cmd == NULL || r->cmd->first_key != 1) {
        return 0;
    }
    /* Client operations in flight on any loop's behalf count: a commit in
     * flight may still add rows to any key. */
    size_t pending = atomic_load(&o->sh->pending_ops);
    if (pending == 0 && store_rows(o) == 0) {
        return 0;
    }
    resp_parser *p = parse(r, &req);
    if (p == NULL) {
        return 0;
    }
    if (req.argc >= 2 && config_fallback_key(f->cfg, req.argv[1].ptr, req.argv[1].len)) {
        blocked = pending > 0 || store_key_rows(o, req.argv[1].ptr, req.argv[1].len) > 0;
    }
    resp_parser_free(p);
    return blocked;
}

int outage_backlog(ferry *f, uint64_t *rows, uint64_t *oldest_age_ms)
{
    struct outage *o = f->outage;
    int64_t oldest = 0;
    if (o == NULL) {
        return -1;
    }
    *rows = 0;
    *oldest_age_ms = 0;
    if (!o->remote) {
        *rows = fallback_rows(o->fb);
        oldest = fallback_oldest(o->fb);
    } else {
        uv_mutex_lock(&o->sh->lock);
        if (o->sh->fb != NULL) {
            *rows = fallback_rows(o->sh->fb);
            oldest = fallback_oldest(o->sh->fb);
        }
        uv_mutex_unlock(&o->sh->lock);
    }
    if (*rows > 0 && oldest > 0) {
        struct timeval tv;
        gettimeofday(&tv, NULL);
        int64_t now_ms = (int64_t)tv.tv_sec * 1000 + tv.tv_usec / 1000;
        *oldest_age_ms = now_ms > oldest ? (uint64_t)(now_ms - oldest) : 0;
    }
    return 0;
}

uint64_t outage_key_rows(ferry *f, const char *key, size_t keylen)
{
    struct outage *o = f->outage;
    return o != NULL && !o->remote && o->fb != NULL ? fallback_key_rows(o->fb, key, keylen) : 0;
}

void outage_stats(ferry *f, ferry_stats *st)
{
    struct outage *o = f->outage;
    fallback_stats fs;
    if (o == NULL || o->remote) {
        return; /* the store's figures are the main loop's, once */
    }
    fallback_get_stats(o->fb, &fs);
    st->fallback_pending = fs.rows;
    st->fallback_bytes = fs.bytes;
    if (fs.oldest_ms > 0) {
        struct timeval tv;
        gettimeofday(&tv, NULL);
        int64_t now_ms = (int64_t)tv.tv_sec * 1000 + tv.tv_usec / 1000;
        st->fallback_oldest_ms = now_ms > fs.oldest_ms ? (uint64_t)(now_ms - fs.oldest_ms) : 0;
    }
    st->fallback_commits = fs.commits;
    st->fallback_commit_errors = fs.commit_errors;
    st->fallback_replay_errors = o->replay_errors;
    st->fallback_taken = fs.taken;
    st->fallback_returned = fs.released;
}
