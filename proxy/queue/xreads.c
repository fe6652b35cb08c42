/* xreads.c - consumer-group reads that survive the loss of their reply.
 *
 * XREADGROUP GROUP g c ... STREAMS k... > hands the consumer the next entries
 * of each stream and adds them to its pending entries list (PEL), which is
 * replicated with the read. A master can die after its replica got the read
 * and before the read's reply reached ferry. Sent again with '>', the read
 * takes the next entries, and the first read's entries stay pending for a
 * consumer that never got them (until XAUTOCLAIM, or a read of its history).
 * The offsets cannot tell (no reply, no offset after it), and the pending
 * list does not need them: it is the read's receipt, kept by Redis anyway.
 *
 * So a '>' read sent again (after its link was lost, its reply held for a
 * replica and dropped, or a refusal) first goes as its look: the same
 * XREADGROUP with each '>' replaced by the highest entry id this client was
 * handed from that stream for that group and consumer ("0" if none). A read
 * of its history answers at once with the consumer's pending entries after
 * that id: the lost read's, if the new master has it.
 *
 *   some found   they are the read's answer (streams with none left out,
 *                as a '>' read leaves them out); counted stream_reads_found
 *   none found   the '>' read goes as written (a blocking one with the time
 *                it has left): the entries it takes are the ones the first
 *                read took, if that read never reached the new master
 *
 * A read held for a verdict (answered by a master lost before a replica
 * confirmed it) is decided the same way, not by the offsets (router.c).
 *
 * The ids handed out are read from every XREADGROUP reply ferry answers,
 * one mark per (db, group, consumer, stream) in the session, at most
 * XMARKS_MAX (the least recently moved goes first). A consumer name two
 * clients use at once can make a look answer the other client's pending
 * entries (pending for that consumer all the same: delivered again, as
 * XAUTOCLAIM would); Redis' own advice is one name per consumer.
 *
 * Not for NOACK reads (nothing goes pending) nor inside MULTI. */
#include "xreads.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "resp.h"
#include "stats.h"
#include "tx.h"

#define XMARKS_MAX 32

typedef struct xmark {
    char *name; /* "<db>:<glen>:<group><clen>:<consumer><stream>" */
    size_t nlen;
    uint64_t ms, seq; /* the highest entry id handed out */
    uint64_t moved;   /* the marks' clock when it last moved */
} xmark;

struct xread_marks {
    xmark v[XMARKS_MAX];
    size_t n;
    uint64_t clock;
};

/* An XREADGROUP's arguments (command_xread_args), and whether some id is '>'. */
typedef struct xview {
    resp_arg *argv;
    size_t argc;
    xread_args x;
    int any_new;
} xview;

static int is_xreadgroup(const request *r)
{
    return r->cmd != NULL && strcmp(r->cmd->name, "xreadgroup") == 0;
}

static void view_free(xview *v)
{
    free(v->argv);
    v->argv = NULL;
}

/* 0 with v filled, or -1 (what Redis would refuse: sent as written). */
static int view_of(const request *r, xview *v)
{
    const char *p = buf_head(&r->data), *end = p + buf_used(&r->data);
    long long argc = resp_read_header(&p, end, '*');
    memset(v, 0, sizeof(*v));
    if (argc < 7 || argc > 1 << 20) {
        return -1;
    }
    v->argv = xcalloc((size_t)argc, sizeof(*v->argv));
    for (long long i = 0; i < argc; i++) {
        if (resp_read_bulk(&p, end, &v->argv[i].ptr, &v->argv[i].len) != 0) {
            view_free(v);
            return -1;
        }
    }
    v->argc = (size_t)argc;
    if (command_xread_args(1, v->argc, v->argv, &v->x) != 0 || v->x.claim) {
        /* (A read that claims idle entries of other consumers is not
         * looked at: what it took is not after one mark.) */
        view_free(v);
        return -1;
    }
    for (size_t k = 0; k < v->x.nkeys; k++) {
        const resp_arg *id = &v->argv[v->x.keys + v->x.nkeys + k];
        v->any_new |= id->len == 1 && id->ptr[0] == '>';
    }
    return 0;
}

/* ------------------------------------------------------------------ marks */

static void mark_name(const session *s, const xview *v, const char *stream, size_t slen, buf *out)
{
    char head[64];
    const resp_arg *g = &v->argv[v->x.group], *c = &v->argv[v->x.group + 1];
    int hn = snprintf(head, sizeof(head), "%d:%zu:", s->db, g->len);
    buf_append(out, head, (size_t)hn);
    buf_append(out, g->ptr, g->len);
    hn = snprintf(head, sizeof(head), "%zu:", c->len);
    buf_append(out, head, (size_t)hn);
    buf_append(out, c->ptr, c->len);
    buf_append(out, stream, slen);
}

static xmark *mark_find(const session *s, const buf *name)
{
    struct xread_marks *m = session_extra_r(s)->xmarks;
    for (size_t i = 0; m != NULL && i < m->n; i++) {
        if (m->v[i].nlen == buf_used(name) &&
            memcmp(m->v[i].name, buf_head(name), m->v[i].nlen) == 0) {
            return &m->v[i];
        }
    }
    return NULL;
}

/* "ms-seq" (or "ms") as two numbers; -1 if it is not an entry id. */
static int id_parse(const char *p, size_t n, uint64_t *ms, uint64_t *seq)
{
    uint64_t part[2] = {0, 0};
    int k = 0, digits = 0;
    for (size_t i = 0; i < n; i++) {
        if (p[i] == '-' && k == 0 && digits > 0) {
            k = 1;
            digits = 0;
        } else if (p[i] >= '0' && p[i] <= '9' && part[k] <= (UINT64_MAX - 9) / 10) {
            part[k] = part[k] * 10 + (uint64_t)(p[i] - '0');
            digits++;
        } else {
            return -1;
        }
    }
    if (digits == 0) {
        return -1;
    }
    *ms = part[0];
    *seq = part[1];
    return 0;
}

/* The stream handed out entry ms-seq: its mark moves up to it. */
static void mark_raise(session *s, const buf *name, uint64_t ms, uint64_t seq)
{
    xmark *x = mark_find(s, name);
    struct xread_marks *m = session_extra_r(s)->xmarks;
    if (x == NULL) {
        if (m == NULL) {
            m = session_extra_w(s)->xmarks = xcalloc(1, sizeof(*m));
        }
        if (m->n < XMARKS_MAX) {
            x = &m->v[m->n++];
        } else {
            x = &m->v[0];
            for (size_t i = 1; i < m->n; i++) {
                if (m->v[i].moved < x->moved) {
                    x = &m->v[i];
                }
            }
            free(x->name);
        }
        x->nlen = buf_used(name);
        x->name = xmalloc(x->nlen);
        memcpy(x->name, buf_head(name), x->nlen);
        x->ms = ms;
        x->seq = seq;
    } else if (ms > x->ms || (ms == x->ms && seq > x->seq)) {
        x->ms = ms;
        x->seq = seq;
    }
    x->moved = ++m->clock;
}

void xreads_forget(session *s)
{
    struct xread_marks *m = session_extra_r(s)->xmarks;
    for (size_t i = 0; m != NULL && i < m->n; i++) {
        free(m->v[i].name);
    }
    if (m != NULL) {
        free(m);
        s->extra->xmarks = NULL;
    }
}

/* ------------------------------------------------------------------- send */

int xreads_send(session *s, request *r, link *l)
{
    xview v;
    if (!is_xreadgroup(r) || tx_in_multi(s)) {
        return 0;
    }
    if (!(r->flags & REQ_F_XSENT)) {
        if (view_of(r, &v) == 0) {
            if (v.any_new && !v.x.noack) {
                r->flags |= REQ_F_XSENT; /* sent again, it looks first */
            }
            view_free(&v);
        }
        return 0;
    }
    if (view_of(r, &v) != 0) {
        return 0;
    }
    buf look, name;
    buf_init(&look);
    buf_init(&name);
    buf_append_count(&look, '*', v.argc);
    for (size_t i = 0; i < v.argc; i++) {
        const resp_arg *a = &v.argv[i];
        if (i < v.x.keys + v.x.nkeys || !(a->len == 1 && a->ptr[0] == '>')) {
            buf_append_bulk(&look, a->ptr, a->len);
            continue;
        }
        const resp_arg *key = &v.argv[i - v.x.nkeys];
        buf_clear(&name);
        mark_name(s, &v, key->ptr, key->len, &name);
        const xmark *x = mark_find(s, &name);
        char id[48];
        int n = x != NULL ? snprintf(id, sizeof(id), "%llu-%llu", (unsigned long long)x->ms,
                                     (unsigned long long)x->seq)
                          : snprintf(id, sizeof(id), "0");
        buf_append_bulk(&look, id, (size_t)n);
    }
    r->flags |= REQ_F_XLOOK;
    s->f->stats.stream_reads_looked++;
    link_send_as(l, r, buf_head(&look), buf_used(&look));
    buf_free(&look);
    buf_free(&name);
    view_free(&v);
    return 1;
}

/* ------------------------------------------------------------------ reply */

/* One value at *pp (before end): its end, or NULL if it is not whole. */
static const char *value_end(const char *p, const char *end)
{
    resp_scanner sc;
    size_t len;
    resp_scanner_init(&sc);
    if (resp_scan_reply(&sc, p, (size_t)(end - p), &len) != RESP_OK) {
        return NULL;
    }
    return p + len;
}

/* What a reply to XREADGROUP holds, stream by stream (RESP2 [[k, entries]...]
 * or RESP3 {k: entries}). each(k, entries' ids...) via the callback; the
 * count of streams with entries in *full, of streams in *all. -1 if the
 * reply is not one (an error, a null: nothing handed out). */
typedef void (*entry_fn)(void *arg, const char *key, size_t klen, const char *id, size_t idlen);

static int walk(const char *p, size_t n, entry_fn fn, void *arg, size_t *all, size_t *full)
{
    const char *end = p + n;
    int map = n > 0 && p[0] == '%';
    long long streams = resp_read_header(&p, end, map ? '%' : '*');
    *all = *full = 0;
    if (streams < 0) {
        return -1;
    }
    for (long long i = 0; i < streams; i++) {
        const char *key, *id;
        size_t klen, idlen;
        if ((!map && resp_read_header(&p, end, '*') != 2) ||
            resp_read_bulk(&p, end, &key, &klen) != 0) {
            return -1;
        }
        long long entries = resp_read_header(&p, end, '*');
        if (entries < 0) {
            return -1;
        }
        for (long long e = 0; e < entries; e++) {
            if (resp_read_header(&p, end, '*') != 2 || resp_read_bulk(&p, end, &id, &idlen) != 0 ||
                (p = value_end(p, end)) == NULL) {
                return -1;
            }
            if (fn != NULL) {
                fn(arg, key, klen, id, idlen);
            }
        }
        (*all)++;
        *full += entries > 0;
    }
    return p == end ? 0 : -1;
}

int xreads_again(session *s, request *r, const char *p, size_t n)
{
    size_t all, full;
    (void)s;
    if (!(r->flags & REQ_F_XLOOK) || walk(p, n, NULL, NULL, &all, &full) != 0 || full > 0) {
        return 0;
    }
    /* Nothing of the consumer's pending after what it was handed: the
     * first read never reached this master. Now the read itself. */
    r->flags &= ~(REQ_F_XLOOK | REQ_F_XSENT);
    if (r->flags & REQ_F_BLOCKING) {
        r->flags |= REQ_F_REARM;
    }
    return 1;
}

typedef struct raise_ctx {
    session *s;
    const xview *v;
    buf name;
} raise_ctx;

static void raise_one(void *arg, const char *key, size_t klen, const char *id, size_t idlen)
{
    raise_ctx *c = arg;
    uint64_t ms, seq;
    if (id_parse(id, idlen, &ms, &seq) != 0) {
        return;
    }
    buf_clear(&c->name);
    mark_name(c->s, c->v, key, klen, &c->name);
    mark_raise(c->s, &c->name, ms, seq);
}

/* A look's reply without its empty streams, in out. */
static void drop_empty(const char *p, size_t n, buf *out, size_t full)
{
    const char *end = p + n;
    int map = p[0] == '%';
    long long streams = resp_read_header(&p, end, map ? '%' : '*');
    buf_append_count(out, map ? '%' : '*', full);
    for (long long i = 0; i < streams; i++) {
        const char *at = p, *key;
        size_t klen;
        if (!map) {
            resp_read_header(&p, end, '*');
        }
        resp_read_bulk(&p, end, &key, &klen);
        int empty = p + 4 <= end && memcmp(p, "*0\r\n", 4) == 0;
        p = value_end(p, end);
        if (!empty) {
            buf_append(out, at, (size_t)(p - at));
        }
    }
}

int xreads_reply(session *s, request *r, const char *p, size_t n, buf *out)
{
    xview v;
    size_t all, full;
    if (!is_xreadgroup(r) || n == 0 || p[0] == '-') {
        return 0;
    }
    int look = (r->flags & REQ_F_XLOOK) != 0;
    r->flags &= ~(REQ_F_XLOOK | REQ_F_XSENT);
    if (view_of(r, &v) != 0) {
        return 0;
    }
    raise_ctx c;
    c.s = s;
    c.v = &v;
    buf_init(&c.name);
    int ok = walk(p, n, raise_one, &c, &all, &full) == 0;
    buf_free(&c.name);
    view_free(&v);
    if (!ok || !look) {
        return 0;
    }
    s->f->stats.stream_reads_found++;
    log_info("client %llu: an XREADGROUP sent again found what it had taken in the consumer's "
             "pending list (%zu of %zu streams): answered with it",
             (unsigned long long)s->id, full, all);
    if (full == all) {
        return 0;
    }
    drop_empty(p, n, out, full);
    return 1;
}
