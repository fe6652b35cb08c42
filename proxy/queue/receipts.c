/* receipts.c - pops and pushes that survive the loss of their reply
 * (durability.pop_receipts, durability.push_receipts).
 *
 * A master can die after its replica received a pop and before the pop's
 * reply reached ferry (Redis writes its replicas' stream and its clients'
 * replies in the same turn, in no fixed order; a reply behind a large one
 * waits for later turns). Sent again, the pop takes another item, and the
 * one the first took is on nobody: lost. Offsets cannot tell (no reply, no
 * offset after it). So with replicas_ack, a pop of a key fallback.keys
 * names, on ferry's own links and outside MULTI, is not sent as written:
 *
 *   RPOP k / LPOP k         LMOVE k <receipt> RIGHT|LEFT LEFT
 *   BRPOP k t / BLPOP k t   BLMOVE k <receipt> RIGHT|LEFT LEFT t
 *
 * The receipt is a key of this one request (ferry:rcpt:<loop>:<n>; in
 * cluster mode ferry:rcpt:{<k's tag>}:<loop>:<n>, on k's slot): the move
 * leaves the item there, replicated with the pop itself. Once the reply is
 * in, the client gets it (a blocking move's reply put back as BRPOP's
 * [key, item]) and the receipt is deleted at the next loop turn, once the
 * reply is written (one DEL for all served in a turn; per receipt in
 * cluster mode, where they span slots). A pop sent again after its
 * link was lost carries the same receipt and goes as the receipt script (receipt_pop.lua): the
 * receipt's item if the new master has it ({item}: counted pop_receipts_found), else the move; a
 * blocking pop's script cannot block: if it found nothing, the blocking move follows with the time
 * left.
 *
 * A blocking pop of several keys (BRPOP k1 k2 ... t: N2's priority pop)
 * goes first as a try (receipt_mpop.lua): the first key in the client's
 * order with an item, moved into that key's own receipt (one per key of the
 * request), answered [key, item]; sent again, the receipts looked at first.
 * Every key empty, the pop goes as written with the time it has left (no
 * command of Redis blocks on several keys and moves): its reply lost is
 * decided by the offsets, as before.
 *
 * A script that may write and names a queue key (EVAL, EVALSHA of a body
 * ferry knows) runs inside a wrapper that keeps its reply under a receipt
 * (receipt_wrap.c): it dies and is sent again as a push does.
 *
 * A pop ferry answers itself after its move may have applied (its timeout
 * ran out while held for a master, -TRYAGAIN) has its receipt moved back to
 * its queue, at the end it came from, on the next master: undone. So does a
 * pop whose client left before its reply was written (held for its WAIT
 * past the client's read timeout, or still in flight): receipts_client_gone.
 *
 * A push (LPUSH, RPUSH, LPUSHX, RPUSHX, XADD of a key fallback.keys names) dies
 * the same way: sent and unanswered when the master died, the promoted
 * replica may have it, and sent again it would be there twice. So it goes,
 * every time, as the push receipt script (receipt_push.lua): the push and
 * its reply (the list's length, XADD's id) kept under its receipt in one
 * step; the push sent again answers that reply ({reply}: push_receipts_found) if
 * the new master has the receipt, else pushes. Its receipt is deleted as a
 * pop's. A push ferry answers itself (-TRYAGAIN, the fallback store) has
 * nothing put back: the client was told it may not have applied.
 *
 * Database 0 only: ferry's shared links stay in it (another database's
 * session has its own link), and the receipt's DEL or put-back goes on them.
 *
 * The request keeps its original bytes (r->data): the fallback store and a
 * retry see the client's pop. */
#include "receipts.h"
#include "receipts_int.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clustermap.h"
#include "config.h"
#include "instance.h"
#include "log.h"
#include "receipt_wrap.h"
#include "resp.h"
#include "router.h"
#include "scripts.h"
#include "stats.h"
#include "tx.h"
#include "upstream.h"

/* r's receipt is no more its request's (served: its DEL queued; put back;
 * nothing moved). */
static void rcpt_let_go(ferry *f, request *r)
{
    if (r->flags & REQ_F_RCPT) {
        f->stats.receipts_held--;
    }
    r->flags &= ~(REQ_F_RCPT | REQ_F_RCPT_PROBE);
}

/* v's script (EVAL's body, or the body ferry remembers for EVALSHA's
 * SHA1) in its receipt wrapper, in out (0); -1 when ferry does not know
 * the body or it is not to be wrapped (receipt_wrap.c). */
static int script_wrapped(const ferry *f, const rcpt_view *v, buf *out)
{
    buf body;
    int rc = -1;
    buf_init(&body);
    if (!v->sha) {
        rc = receipt_wrap(v->src, v->srclen, out);
    } else if (scripts_body(f->scripts, v->src, v->srclen, &body)) {
        rc = receipt_wrap(buf_head(&body), buf_used(&body), out);
    }
    buf_free(&body);
    return rc;
}

/* v's script sent as its wrapper (w) with the receipt (key): EVALSHA of
 * the wrapper, loaded on l first (scripts.c's marks), or EVAL once Redis
 * said it lacked it; the receipt a key more, '1' an argument more when it
 * was sent before (it looks first). In b. */
static void script_send(ferry *f, const request *r, link *l, const rcpt_view *v, const buf *key,
                        const buf *w, buf *b)
{
    char sha[41], nkeys[24];
    int eval = (r->flags & REQ_F_RCPT_EVAL) != 0;
    if (!eval) {
        scripts_sha1_hex(buf_head(w), buf_used(w), sha);
        eval = !scripts_load_on(f->scripts, l, sha, buf_head(w), buf_used(w));
    }
    buf_append_count(b, '*', (size_t)(3 + v->nkeys + 1 + v->nargs + 1));
    if (eval) {
        buf_append_bulk(b, "EVAL", 4);
        buf_append_bulk(b, buf_head(w), buf_used(w));
    } else {
        buf_append_bulk(b, "EVALSHA", 7);
        buf_append_bulk(b, sha, 40);
    }
    snprintf(nkeys, sizeof(nkeys), "%lld", v->nkeys + 1);
    buf_append_bulk(b, nkeys, strlen(nkeys));
    buf_append(b, v->keys, v->keyslen);
    buf_append_bulk(b, buf_head(key), buf_used(key));
    buf_append(b, v->args, v->argslen);
    buf_append_bulk(b, (r->flags & REQ_F_RCPT) ? "1" : "0", 1);
}

/* Whether r gets a receipt on l (1: its parts in *v, its key appended to
 * key, counted), else 0. */
static int receipt_claim(session *s, request *r, link *l, rcpt_view *v, buf *key, buf *wrapped)
{
    ferry *f = s->f;
    if ((r->flags & REQ_F_RCPT_NONE) ||
        (r->rcpt == 0 &&
         (l->up->replicas_ack <= 0 || l->who->user != NULL || tx_in_multi(s) || s->db != 0 ||
          (r->route != RT_SHARED && r->route != RT_BLOCKING && r->route != RT_SCRIPT)))) {
        return 0;
    }
    if (rcpt_of(f, r, v) != 0 || (r->rcpt == 0 && (r->route == RT_SCRIPT) != v->script)) {
        return 0;
    }
    if (r->rcpt == 0 && !(v->script         ? f->cfg->script_receipts
                          : v->push != NULL ? f->cfg->push_receipts
                                            : f->cfg->pop_receipts)) {
        return 0;
    }
    if (v->zset && s->proto != 2) {
        /* The script answers RESP2's flat pairs; RESP3 has doubles (and
         * pairs of pairs with a count): sent as written. */
        return 0;
    }
    if (v->script && (wrapped == NULL || script_wrapped(f, v, wrapped) != 0)) {
        return 0;
    }
    uint64_t *count, *resent;
    if (v->script) {
        count = &f->stats.script_receipts;
        resent = &f->stats.script_receipts_resent;
    } else if (v->push != NULL) {
        count = &f->stats.push_receipts;
        resent = &f->stats.push_receipts_resent;
    } else {
        count = &f->stats.pop_receipts;
        resent = &f->stats.pop_receipts_resent;
    }
    if (r->rcpt == 0) {
        r->rcpt = ++f->rcpt_next;
        (*count)++;
    } else if (r->retries > 0) {
        (*resent)++;
    }
    receipt_key(f, v, r->rcpt, key);
    return 1;
}

int receipts_guarded_push(session *s, request *r, link *l, buf *key, int *before)
{
    rcpt_view v;
    if (!receipt_claim(s, r, l, &v, key, NULL) || v.push == NULL) {
        return 0;
    }
    *before = (r->flags & REQ_F_RCPT) != 0;
    rcpt_hold(s->f, r, REQ_F_RCPT_PROBE);
    return 1;
}

int receipts_send(session *s, request *r, link *l)
{
    rcpt_view v;
    buf key, b;
    if (r->route == RT_EXEC) {
        return receipts_tx_send(s, r, l);
    }
    buf_init(&key);
    buf_init(&b);
    if (!receipt_claim(s, r, l, &v, &key, &b)) {
        buf_free(&key);
        buf_free(&b);
        return 0;
    }
    if (v.multi) {
        /* The try: the first key with an item, moved into its receipt;
         * sent before, the receipts looked at first (receipt_mpop.lua). */
        rcpt_script_head(l, r, 4, ferry_receipt_mpop_lua, ferry_receipt_mpop_lua_len,
                         ferry_receipt_mpop_lua_sha1, (size_t)(3 + 2 * v.nkeys + 4), &b);
        char nkeys[24];
        snprintf(nkeys, sizeof(nkeys), "%lld", 2 * v.nkeys);
        buf_append_bulk(&b, nkeys, strlen(nkeys));
        buf_append(&b, v.keys, v.keyslen);
        for (long long i = 0; i < v.nkeys; i++) {
            buf rk;
            buf_init(&rk);
            multi_receipt_key(s->f, &v, r->rcpt, i, &rk);
            buf_append_bulk(&b, buf_head(&rk), buf_used(&rk));
            buf_free(&rk);
        }
        buf_append_bulk(&b, v.side, strlen(v.side));
        buf_append_bulk(&b, (r->flags & REQ_F_RCPT) ? "1" : "0", 1);
        buf_append_bulk(&b, v.count != NULL ? v.count : "", v.clen);
        buf_append_bulk(&b, v.shaped ? "1" : "0", 1);
        rcpt_hold(s->f, r, REQ_F_RCPT_PROBE);
        link_send_as(l, r, buf_head(&b), buf_used(&b));
        buf_free(&b);
        buf_free(&key);
        return 1;
    }
    if (v.script) {
        buf w = b;
        buf_init(&b);
        script_send(s->f, r, l, &v, &key, &w, &b);
        buf_free(&w);
        rcpt_hold(s->f, r, REQ_F_RCPT_PROBE);
        r->flags |= REQ_F_RCPT_SCRIPT;
        link_send_as(l, r, buf_head(&b), buf_used(&b));
        buf_free(&b);
        buf_free(&key);
        return 1;
    }
    /* A pop sent before, its move may have applied: the script looks
     * first. A push is always the script (its reply kept in the receipt),
     * which looks first only if it was sent before. */
    int script = (r->flags & REQ_F_RCPT) != 0 || v.push != NULL || v.count != NULL || v.zset;
    if (v.push != NULL) {
        rcpt_script_head(l, r, 2, ferry_receipt_push_lua, ferry_receipt_push_lua_len,
                         ferry_receipt_push_lua_sha1, 7 + v.nvalues, &b);
        buf_append_bulk(&b, "2", 1);
        buf_append_bulk(&b, v.key, v.klen);
        buf_append_bulk(&b, buf_head(&key), buf_used(&key));
        buf_append_bulk(&b, v.push, strlen(v.push));
        /* Sent before: it may have applied, the script looks first. */
        buf_append_bulk(&b, (r->flags & REQ_F_RCPT) ? "1" : "0", 1);
        buf_append(&b, v.values, v.vlen);
    } else if (script) {
        /* A batch pop or a sorted set's is always the script: no command
         * of Redis moves several items, or a member, into another key. */
        rcpt_script_head(l, r, 1, ferry_receipt_pop_lua, ferry_receipt_pop_lua_len,
                         ferry_receipt_pop_lua_sha1, 7, &b);
        buf_append_bulk(&b, "2", 1);
        buf_append_bulk(&b, v.key, v.klen);
        buf_append_bulk(&b, buf_head(&key), buf_used(&key));
        buf_append_bulk(&b, v.side, strlen(v.side));
        buf_append_bulk(&b, v.count != NULL ? v.count : "", v.clen);
    } else {
        /* The first send: Redis' own move, as cheap as the pop. */
        buf_append_count(&b, '*', v.blocking ? 6 : 5);
        buf_append_bulk(&b, v.blocking ? "BLMOVE" : "LMOVE", v.blocking ? 6 : 5);
        buf_append_bulk(&b, v.key, v.klen);
        buf_append_bulk(&b, buf_head(&key), buf_used(&key));
        buf_append_bulk(&b, v.side, strlen(v.side));
        buf_append_bulk(&b, "LEFT", 4);
        if (v.blocking) {
            buf_append_bulk(&b, v.timeout, v.tlen);
        }
    }
    rcpt_hold(s->f, r, script ? REQ_F_RCPT_PROBE : 0);
    link_send_as(l, r, buf_head(&b), buf_used(&b));
    buf_free(&b);
    buf_free(&key);
    return 1;
}

static int is_null(const char *p, size_t n)
{
    return (n == 5 && (memcmp(p, "$-1\r\n", 5) == 0 || memcmp(p, "*-1\r\n", 5) == 0)) ||
           (n == 3 && memcmp(p, "_\r\n", 3) == 0);
}

int receipts_again(session *s, request *r, const char *p, size_t n)
{
    if (!(r->flags & REQ_F_RCPT)) {
        return 0;
    }
    int script = (r->flags & REQ_F_RCPT_PROBE) != 0;
    int blocking = blocking_pop(r);
    if (script && !(r->flags & REQ_F_RCPT_EVAL) && n >= 9 && memcmp(p, "-NOSCRIPT", 9) == 0) {
        log_info("receipts: Redis lacked the receipt script; client %llu's %s sent as EVAL",
                 (unsigned long long)s->id, r->cmd->name);
        r->flags |= REQ_F_RCPT_EVAL;
        return 1;
    }
    if ((r->flags & REQ_F_RCPT_SCRIPT) && n >= 27 &&
        memcmp(p, "-ERR Error compiling script", 27) == 0) {
        /* Nothing ran: sent as written, Redis says what is wrong with it. */
        log_info("receipts: client %llu's script does not compile in its receipt wrapper: sent "
                 "as written",
                 (unsigned long long)s->id);
        rcpt_let_go(s->f, r);
        r->flags = (r->flags & ~REQ_F_RCPT_SCRIPT) | REQ_F_RCPT_NONE;
        return 1;
    }
    if (script && blocking && is_null(p, n)) {
        /* No receipt, no item: now the blocking move, with its time left;
         * a priority pop's, the pop as written (nothing blocks on several
         * keys and moves: a reply it loses is decided by the offsets). */
        rcpt_view v;
        rcpt_let_go(s->f, r);
        if (rcpt_of(s->f, r, &v) == 0 && v.multi) {
            r->flags |= REQ_F_RCPT_NONE;
        }
        r->flags |= REQ_F_REARM;
        return 1;
    }
    return 0;
}

#define PUT_BACK_MAX 4096            /* receipts a loop keeps to put back; past it the oldest go */
#define PUT_BACK_KEEP_MS 20000       /* a put-back sent is sent again on a next master this long */
#define PUT_BACK_AGAIN_MS 500        /* ... and, when its move may still come, to the same master */
#define PUT_BACK_SETTLE_MS 2000      /* ... until this long after the master first answered one */
#define PUT_BACK_AGAIN_MAX_MS 600000 /* ... or at most this long (a master that never answers) */

/* A receipt to move back to its queue (a pop's), or to delete (a push's or
 * a transaction's whose client left: nothing will send it again). Sent, it
 * is kept a while: a master that dies before its replica got the move back
 * may leave the receipt, item in it, on the replica it promotes; the move
 * is sent again there. It cannot apply twice: the first emptied the receipt
 * (a key never used again), so a second finds nothing to move. */
typedef struct put_back {
    buf move; /* LMOVE <receipt> <key> LEFT <side>, or DEL <receipt>, as sent */
    char *key;
    size_t klen;
    uint64_t epoch;       /* the master epoch it was last sent to, 0 not sent yet */
    uint64_t sent_ms;     /* uv_now() when first sent */
    uint64_t last_ms;     /* uv_now() when last sent */
    int again;            /* its move may reach Redis after it: sent again while kept */
    int outstanding;      /* again: the last one sent is not answered yet */
    uint64_t serial;      /* again: what its answer names (put_back_answered) */
    uint64_t answered_ms; /* again: uv_now() when the master first answered one, 0 not yet */
} put_back;

#define RECENT_MAX 16384 /* receipts a generation keeps to delete again on a next master */
#define RECENT_MS 10000  /* a generation's span */

struct receipts {
    put_back *pb; /* receipts to put back, oldest first */
    size_t n, cap;
    buf dels; /* receipts served before this turn, as DEL's arguments (not in cluster mode) */
    size_t ndels;
    /* Receipts served this turn: deleted at the next flush, once their
     * replies are written (session_flush_all follows receipts_flush). A DEL
     * sent before the reply would leave the item on nobody if ferry died in
     * between (kill -9 under load). */
    buf turn;
    size_t nturn;
    /* The same in cluster mode, where each DEL goes to its key's master:
     * pairs of bulk strings, the receipt and the queue key it came from. */
    buf cturn, cdels;
    size_t ncturn, ncdels;
    /* Receipts deleted lately ([0] since recent_at, [1] the span before),
     * as DEL's arguments: a DEL sent to a master in its last moments may
     * not have reached its replicas, so the next master may still hold the
     * receipt; they are deleted there again (del_epoch: the master's epoch
     * the DELs went to). A receipt key is never used twice: a late DEL
     * deletes nothing else. */
    buf recent[2];
    size_t nrecent[2];
    uint64_t recent_at, del_epoch;
    /* Cluster mode: the same per receipt, with the shard link's master and
     * epoch its DEL went to, oldest first; receipts_tick deletes one again
     * where its key's master is another one, or the same one again after
     * its links were lost (a DEL on a reset link may never have run). */
    struct cluster_recent *crecent;
    size_t ncrecent, crecent_cap;
    uint64_t serial; /* the last put-back's (put_back_answered) */
};

struct cluster_recent {
    char *keys;        /* the receipt, then its queue key */
    size_t rlen, qlen; /* their bytes */
    const void *up;    /* the master its DEL went to (compared, never followed) */
    uint64_t epoch;    /* that master's epoch then */
    uint64_t at;       /* when (uv_now) */
};

static struct receipts *receipts_of(ferry *f)
{
    if (f->receipts == NULL) {
        f->receipts = xcalloc(1, sizeof(*f->receipts));
        buf_init(&f->receipts->dels);
        buf_init(&f->receipts->turn);
        buf_init(&f->receipts->cturn);
        buf_init(&f->receipts->cdels);
        buf_init(&f->receipts->recent[0]);
        buf_init(&f->receipts->recent[1]);
    }
    return f->receipts;
}

static void send_del(link *l, const buf *keys, size_t n)
{
    buf del;
    buf_init(&del);
    buf_append_count(&del, '*', n + 1);
    buf_append_bulk(&del, "DEL", 3);
    buf_append(&del, buf_head(keys), buf_used(keys));
    link_internal_bytes(l, buf_head(&del), buf_used(&del), NULL, 0);
    buf_free(&del);
}

/* l, the master, is a new one: the receipts deleted lately on the one
 * before are deleted here too. */
static void recent_again(ferry *f, struct receipts *rc, link *l)
{
    if (rc->del_epoch == l->epoch) {
        return;
    }
    size_t n = rc->nrecent[0] + rc->nrecent[1];
    if (rc->del_epoch != 0 && n > 0) {
        for (int g = 1; g >= 0; g--) {
            if (rc->nrecent[g] > 0) {
                send_del(l, &rc->recent[g], rc->nrecent[g]);
            }
        }
        f->stats.receipts_deleted_again += n;
        log_info("receipts: %zu receipt(s) deleted lately on the master before deleted again on "
                 "this one (a DEL may have died with that master)",
                 n);
    }
    rc->del_epoch = l->epoch;
}

static void dels_send(ferry *f, struct receipts *rc)
{
    link *l = clustermap_key_link(f, "", 0, NULL, 0, 2); /* not in cluster mode: the master */
    if (l == NULL) {
        return; /* kept for the next master */
    }
    recent_again(f, rc, l);
    send_del(l, &rc->dels, rc->ndels);
    f->stats.receipts_held -= rc->ndels;
    uint64_t now = uv_now(f->loop);
    if (now - rc->recent_at >= RECENT_MS || rc->nrecent[0] + rc->ndels > RECENT_MAX) {
        buf t = rc->recent[1];
        rc->recent[1] = rc->recent[0];
        rc->nrecent[1] = rc->nrecent[0];
        rc->recent[0] = t;
        buf_clear(&rc->recent[0]);
        rc->nrecent[0] = 0;
        rc->recent_at = now;
    }
    buf_append(&rc->recent[0], buf_head(&rc->dels), buf_used(&rc->dels));
    rc->nrecent[0] += rc->ndels;
    buf_clear(&rc->dels);
    rc->ndels = 0;
}

static void cluster_recent_free(struct cluster_recent *e)
{
    free(e->keys);
}

static void cluster_recent_add(ferry *f, struct receipts *rc, const char *rkey, size_t rlen,
                               const char *qkey, size_t qlen, const link *l)
{
    uint64_t now = uv_now(f->loop);
    size_t drop = 0;
    /* The oldest out once past two spans, or past the bound. */
    while (drop < rc->ncrecent &&
           (now - rc->crecent[drop].at >= 2 * RECENT_MS || rc->ncrecent - drop >= 2 * RECENT_MAX)) {
        cluster_recent_free(&rc->crecent[drop++]);
    }
    if (drop > 0) {
        memmove(rc->crecent, rc->crecent + drop, (rc->ncrecent - drop) * sizeof(*rc->crecent));
        rc->ncrecent -= drop;
    }
    if (rc->ncrecent == rc->crecent_cap) {
        rc->crecent_cap = rc->crecent_cap ? rc->crecent_cap * 2 : 64;
        rc->crecent = xrealloc(rc->crecent, rc->crecent_cap * sizeof(*rc->crecent));
    }
    struct cluster_recent *e = &rc->crecent[rc->ncrecent++];
    e->keys = xmalloc(rlen + qlen + 1);
    memcpy(e->keys, rkey, rlen);
    memcpy(e->keys + rlen, qkey, qlen);
    e->rlen = rlen;
    e->qlen = qlen;
    e->up = l->up;
    e->epoch = l->epoch;
    e->at = now;
}

/* Cluster mode: a receipt deleted lately whose key's master is now
 * another one, or the same one on new links, deleted there again. */
static void cluster_recent_again(ferry *f, struct receipts *rc)
{
    size_t again = 0;
    for (size_t i = 0; i < rc->ncrecent; i++) {
        struct cluster_recent *e = &rc->crecent[i];
        link *l = clustermap_key_link(f, e->keys + e->rlen, e->qlen, NULL, 0, 2);
        if (l == NULL || (l->up == e->up && l->epoch == e->epoch)) {
            continue;
        }
        buf del;
        buf_init(&del);
        buf_append_count(&del, '*', 2);
        buf_append_bulk(&del, "DEL", 3);
        buf_append_bulk(&del, e->keys, e->rlen);
        link_internal_bytes(l, buf_head(&del), buf_used(&del), NULL, 0);
        buf_free(&del);
        e->up = l->up;
        e->epoch = l->epoch;
        again++;
    }
    if (again > 0) {
        f->stats.receipts_deleted_again += again;
        log_info("receipts: %zu receipt(s) deleted lately on a shard's master before deleted "
                 "again on its master now (a DEL may have died with a link)",
                 again);
    }
}

/* Cluster mode: each receipt of rc->cdels deleted on its queue key's
 * master; those whose master is not known now wait for the next flush. */
static void cluster_dels_send(ferry *f, struct receipts *rc)
{
    const char *p = buf_head(&rc->cdels), *end = p + buf_used(&rc->cdels);
    buf keep, del;
    size_t kept = 0;
    buf_init(&keep);
    buf_init(&del);
    for (size_t i = 0; i < rc->ncdels; i++) {
        const char *rkey, *qkey;
        size_t rlen, qlen;
        if (resp_read_bulk(&p, end, &rkey, &rlen) != 0 ||
            resp_read_bulk(&p, end, &qkey, &qlen) != 0) {
            break; /* (never: written by receipts_reply) */
        }
        link *l = clustermap_key_link(f, qkey, qlen, NULL, 0, 2);
        if (l == NULL) {
            buf_append_bulk(&keep, rkey, rlen);
            buf_append_bulk(&keep, qkey, qlen);
            kept++;
            continue;
        }
        buf_clear(&del);
        buf_append_count(&del, '*', 2);
        buf_append_bulk(&del, "DEL", 3);
        buf_append_bulk(&del, rkey, rlen);
        link_internal_bytes(l, buf_head(&del), buf_used(&del), NULL, 0);
        f->stats.receipts_held--;
        cluster_recent_add(f, rc, rkey, rlen, qkey, qlen, l);
    }
    buf_free(&del);
    buf_free(&rc->cdels);
    rc->cdels = keep;
    rc->ncdels = kept;
}

void receipts_flush(ferry *f)
{
    struct receipts *rc = f->receipts;
    if (rc == NULL) {
        return;
    }
    if (rc->ndels > 0) {
        dels_send(f, rc);
    }
    if (rc->ncdels > 0) {
        cluster_dels_send(f, rc);
    }
    if (rc->ncturn > 0) {
        buf_append(&rc->cdels, buf_head(&rc->cturn), buf_used(&rc->cturn));
        rc->ncdels += rc->ncturn;
        buf_clear(&rc->cturn);
        rc->ncturn = 0;
    }
    if (rc->nturn > 0) {
        buf_append(&rc->dels, buf_head(&rc->turn), buf_used(&rc->turn));
        rc->ndels += rc->nturn;
        buf_clear(&rc->turn);
        rc->nturn = 0;
    }
}

int receipts_reshape(link *l, request *r, const char *p, size_t n, buf *out)
{
    rcpt_view v;
    int blocking = blocking_pop(r);
    if ((r->flags & REQ_F_RCPT) && r->route == RT_EXEC) {
        return tx_reshape(l->f, p, n, out);
    }
    if (!(r->flags & REQ_F_RCPT) || n == 0 || rcpt_of(l->f, r, &v) != 0) {
        return 0;
    }
    if (v.script) {
        /* Its reply is the client's script's; an error names its SHA1. */
        char sha[41];
        if (p[0] != '-' || (v.sha && v.srclen != 40)) {
            return 0;
        }
        if (v.sha) {
            for (int i = 0; i < 40; i++) {
                sha[i] = (char)tolower((unsigned char)v.src[i]);
            }
            sha[40] = '\0';
        } else {
            scripts_sha1_hex(v.src, v.srclen, sha);
        }
        return receipt_wrap_error(p, n, sha, out);
    }
    if (v.multi) {
        /* {key, item, 1}, {key, member, score, 1}, LMPOP's and ZMPOP's
         * {key, {items}, 1}: the receipt held it; without the 1, as the
         * pop answers. */
        int wide = v.zset && !v.shaped;
        const char *head = wide ? "*4\r\n" : "*3\r\n";
        if (n > 8 && memcmp(p, head, 4) == 0 && memcmp(p + n - 4, ":1\r\n", 4) == 0) {
            l->f->stats.pop_receipts_found++;
            buf_append(out, wide ? "*3\r\n" : "*2\r\n", 4);
            buf_append(out, p + 4, n - 8);
            return 1;
        }
        if (v.shaped && n == 5 && memcmp(p, "$-1\r\n", 5) == 0) {
            buf_append(out, "*-1\r\n", 5); /* LMPOP's nil, as Redis says it */
            return 1;
        }
        return 0;
    }
    if (v.zset) {
        /* {{member, score...}}: the receipt held them. */
        if (n > 5 && memcmp(p, "*1\r\n*", 5) == 0) {
            l->f->stats.pop_receipts_found++;
            buf_append(out, p + 4, n - 4);
            return 1;
        }
        return 0;
    }
    if (v.count != NULL) {
        /* A batch pop: {{items}} the receipt held them; nil (no key) as
         * the pop says it (RESP2's null array). */
        if (n > 5 && memcmp(p, "*1\r\n*", 5) == 0) {
            l->f->stats.pop_receipts_found++;
            buf_append(out, p + 4, n - 4);
            return 1;
        }
        if (n == 5 && memcmp(p, "$-1\r\n", 5) == 0) {
            buf_append(out, "*-1\r\n", 5);
            return 1;
        }
        return 0;
    }
    if (!blocking && !(n > 4 && p[0] == '*')) {
        return 0; /* a pop's own move answers as the pop: nothing to put */
    }
    const char *item = p;
    size_t ilen = n;
    if (n > 4 && memcmp(p, "*1\r\n", 4) == 0) {
        /* {item}: the receipt held it (the first pop applied, its reply
         * lost); {length}: a push's, the same way. */
        if (v.push != NULL) {
            l->f->stats.push_receipts_found++;
        } else {
            l->f->stats.pop_receipts_found++;
        }
        item = p + 4;
        ilen = n - 4;
    }
    if (v.blocking && item[0] == '$' && !is_null(item, ilen)) {
        /* BLMOVE answers the item; BRPOP/BLPOP answer [key, item]. */
        buf_append_count(out, '*', 2);
        buf_append_bulk(out, v.key, v.klen);
        buf_append(out, item, ilen);
        return 1;
    }
    if (v.blocking && ilen == 5 && memcmp(item, "$-1\r\n", 5) == 0) {
        buf_append(out, "*-1\r\n", 5); /* its timeout, as BRPOP says it in RESP2 */
        return 1;
    }
    if (item != p) {
        buf_append(out, item, ilen);
        return 1;
    }
    return 0;
}

/* ------------------------------------------------------------ put back */

/* A move back that may come before its move was answered (or lost with
 * its link): from the first answer on, the master reads what it had
 * waiting (a frozen master, thawed), so the move back goes on a little
 * longer only. */
static void put_back_answered(link *l, request *r, const char *reply, size_t len)
{
    struct receipts *rc = l->f->receipts;
    (void)len;
    for (size_t i = 0; rc != NULL && i < rc->n; i++) {
        put_back *b = &rc->pb[i];
        if (b->again && b->serial == (uint64_t)r->arg) {
            b->outstanding = 0;
            if (reply != NULL && b->answered_ms == 0) {
                b->answered_ms = uv_now(l->f->loop);
            }
            return;
        }
    }
}

/* Whether b, sent to l's master before, goes there again (see again). */
static int put_back_again(const put_back *b, uint64_t now)
{
    return b->again && !b->outstanding && now - b->last_ms >= PUT_BACK_AGAIN_MS &&
           (b->answered_ms == 0 || now - b->answered_ms < PUT_BACK_SETTLE_MS);
}

/* b sent on via, or on its key's master when via is NULL; kept until the
 * tick lets it go (see struct put_back). */
static void put_back_send(ferry *f, put_back *b, link *via)
{
    link *l = via != NULL ? via : clustermap_key_link(f, b->key, b->klen, NULL, 0, 2);
    uint64_t now = uv_now(f->loop);
    if (l == NULL || (l->epoch == b->epoch && !put_back_again(b, now))) {
        return;
    }
    b->last_ms = now;
    b->outstanding = b->again;
    link_internal_bytes(l, buf_head(&b->move), buf_used(&b->move),
                        b->again ? put_back_answered : NULL, (long long)b->serial);
    if (b->epoch == 0) {
        f->stats.receipts_held--; /* held since put_back_add */
    }
    if (b->epoch != 0 && b->epoch != l->epoch) {
        log_info("receipts: a receipt moved back (or deleted) on the master before sent again to "
                 "this one (it may have died with that master)");
    } else {
        b->sent_ms = uv_now(f->loop);
    }
    b->epoch = l->epoch;
}

static void put_back_free(ferry *f, put_back *b)
{
    if (b->epoch == 0) {
        f->stats.receipts_held--; /* never sent: left in Redis (logged) */
    }
    buf_free(&b->move);
    free(b->key);
}

/* What undoes r's receipt (v, its parts): the move of its items back to
 * the end of its queue they came from (the queue as it was), or a push's
 * DEL. */
static void put_back_move(ferry *f, const rcpt_view *v, uint64_t rcpt, buf *move)
{
    buf key;
    buf_init(&key);
    receipt_key(f, v, rcpt, &key);
    if (v->multi) {
        /* Each key's receipt back to its key (one holds the item). */
        /* (LMPOP's several items: in the order taken, the last goes back
         * first, as a batch pop's) */
        static const char each[] =
            "local n = #KEYS / 2 for i = 1, n do "
            "if ARGV[1] == 'MIN' or ARGV[1] == 'MAX' then "
            "local r = redis.call('ZRANGE', KEYS[n + i], 0, -1, 'WITHSCORES') "
            "for j = 1, #r, 2 do redis.call('ZADD', KEYS[i], r[j + 1], r[j]) end "
            "redis.call('DEL', KEYS[n + i]) "
            "else while redis.call('LMOVE', KEYS[n + i], KEYS[i], 'RIGHT', ARGV[1]) do end end "
            "end return n";
        char nkeys[24];
        snprintf(nkeys, sizeof(nkeys), "%lld", 2 * v->nkeys);
        buf_append_count(move, '*', (size_t)(4 + 2 * v->nkeys));
        buf_append_bulk(move, "EVAL", 4);
        buf_append_bulk(move, each, sizeof(each) - 1);
        buf_append_bulk(move, nkeys, strlen(nkeys));
        buf_append(move, v->keys, v->keyslen);
        for (long long i = 0; i < v->nkeys; i++) {
            buf rk;
            buf_init(&rk);
            multi_receipt_key(f, v, rcpt, i, &rk);
            buf_append_bulk(move, buf_head(&rk), buf_used(&rk));
            buf_free(&rk);
        }
        buf_append_bulk(move, v->side, strlen(v->side));
    } else if (v->push != NULL) {
        buf_append_count(move, '*', 2);
        buf_append_bulk(move, "DEL", 3);
        buf_append_bulk(move, buf_head(&key), buf_used(&key));
    } else if (v->zset) {
        /* Each member back with its score. */
        static const char members[] =
            "local r = redis.call('ZRANGE', KEYS[1], 0, -1, 'WITHSCORES') "
            "for i = 1, #r, 2 do redis.call('ZADD', KEYS[2], r[i + 1], r[i]) "
            "end redis.call('DEL', KEYS[1]) return #r / 2";
        buf_append_count(move, '*', 5);
        buf_append_bulk(move, "EVAL", 4);
        buf_append_bulk(move, members, sizeof(members) - 1);
        buf_append_bulk(move, "2", 1);
        buf_append_bulk(move, buf_head(&key), buf_used(&key));
        buf_append_bulk(move, v->key, v->klen);
    } else if (v->count != NULL) {
        /* A batch's items, the last taken first: each back where it was. */
        static const char every[] = "local n = 0 while redis.call('LMOVE', KEYS[1], KEYS[2], "
                                    "'RIGHT', ARGV[1]) do n = n + 1 end return n";
        buf_append_count(move, '*', 6);
        buf_append_bulk(move, "EVAL", 4);
        buf_append_bulk(move, every, sizeof(every) - 1);
        buf_append_bulk(move, "2", 1);
        buf_append_bulk(move, buf_head(&key), buf_used(&key));
        buf_append_bulk(move, v->key, v->klen);
        buf_append_bulk(move, v->side, strlen(v->side));
    } else {
        buf_append_count(move, '*', 5);
        buf_append_bulk(move, "LMOVE", 5);
        buf_append_bulk(move, buf_head(&key), buf_used(&key));
        buf_append_bulk(move, v->key, v->klen);
        buf_append_bulk(move, "LEFT", 4);
        buf_append_bulk(move, v->side, strlen(v->side));
    }
    buf_free(&key);
}

/* move (put_back_move's; taken) sent on via or key's master, now or once
 * there is one. */
static void put_back_queue(ferry *f, buf *move, const char *key, size_t klen, link *via, int again)
{
    struct receipts *rc = receipts_of(f);
    if (rc->n == PUT_BACK_MAX) {
        if (rc->pb[0].epoch == 0) {
            log_warn("pop receipts: %d receipts wait for a master to be put back: the oldest "
                     "(its item in %s) is left there",
                     PUT_BACK_MAX, "ferry:rcpt:...");
        }
        put_back_free(f, &rc->pb[0]);
        memmove(rc->pb, rc->pb + 1, (rc->n - 1) * sizeof(*rc->pb));
        rc->n--;
    }
    if (rc->n == rc->cap) {
        rc->cap = rc->cap ? rc->cap * 2 : 16;
        rc->pb = xrealloc(rc->pb, rc->cap * sizeof(*rc->pb));
    }
    put_back *b = &rc->pb[rc->n++];
    b->move = *move;
    buf_init(move);
    b->key = xmalloc(klen + 1);
    memcpy(b->key, key, klen);
    b->klen = klen;
    b->epoch = 0;
    b->sent_ms = 0;
    b->last_ms = 0;
    b->again = again;
    b->outstanding = 0;
    b->serial = ++rc->serial;
    b->answered_ms = 0;
    f->stats.receipts_held++; /* until sent (put_back_send) */
    put_back_send(f, b, via);
}

/* r's receipt undone (put_back_move), on via or its key's master. */
static void put_back_add(ferry *f, request *r, const rcpt_view *v, link *via, int again)
{
    buf move;
    buf_init(&move);
    put_back_move(f, v, r->rcpt, &move);
    put_back_queue(f, &move, v->key, v->klen, via, again);
}

/* ---------------------------------------------------------- served
 *
 * A receipt has served once its reply is in: the item (or the push's
 * reply) is on its way to the client. Its DEL waits for that reply to be
 * handed to the client's socket (the request's written watch, session.c),
 * then goes at the next flush: a DEL sent before would leave the item on
 * nobody if ferry died in between (kill -9 under load). A reply never
 * written (its client left in the very turn its reply came in, or with it
 * still queued behind a slow read) undoes the pop instead, as a client
 * gone before its reply came in does (receipts_client_gone): the item
 * goes back to its queue. */

typedef struct served {
    ferry *f;
    buf rkeys; /* the receipts' keys, as bulk strings (a priority pop's: one per key) */
    size_t nrkeys;
    buf qkey; /* the queue's key (its master in cluster mode) */
    buf undo; /* put_back_move's */
    int pop;
} served;

/* A served receipt's DEL queued for the next flush: one DEL for every
 * receipt served in a turn; in cluster mode one per receipt, to its key's
 * master (the receipt is in the pop's slot). Held until sent (dels_send,
 * cluster_dels_send). */
static void served_del(ferry *f, const char *rkey, size_t rlen, const char *qkey, size_t qlen)
{
    struct receipts *rc = receipts_of(f);
    if (f->cluster == NULL) {
        buf_append_bulk(&rc->turn, rkey, rlen);
        rc->nturn++;
        return;
    }
    buf_append_bulk(&rc->cturn, rkey, rlen);
    buf_append_bulk(&rc->cturn, qkey, qlen);
    rc->ncturn++;
}

/* Every receipt of rkeys (bulk strings) deleted at the next flush. */
static void served_dels(ferry *f, const buf *rkeys, const char *qkey, size_t qlen)
{
    const char *p = buf_head(rkeys), *end = p + buf_used(rkeys), *k;
    size_t klen;
    while (p < end && resp_read_bulk(&p, end, &k, &klen) == 0) {
        served_del(f, k, klen, qkey, qlen);
    }
}

/* The fate of a served receipt's reply (a req_sent_cb). */
static void served_written(void *arg, int written)
{
    served *sv = arg;
    ferry *f = sv->f;
    if (written) {
        served_dels(f, &sv->rkeys, buf_head(&sv->qkey), buf_used(&sv->qkey));
    } else {
        f->stats.receipts_held -= sv->nrkeys; /* held by put_back_queue now */
        if (sv->pop) {
            f->stats.pops_undone++;
            log_info("receipts: a pop's reply came in and was never written (its client left "
                     "first): undone, its item(s) moved back to %.*s",
                     (int)buf_used(&sv->qkey), buf_head(&sv->qkey));
        }
        put_back_queue(f, &sv->undo, buf_head(&sv->qkey), buf_used(&sv->qkey), NULL, 0);
    }
    buf_free(&sv->rkeys);
    buf_free(&sv->qkey);
    buf_free(&sv->undo);
    free(sv);
}

/* Whether r's reply p says its receipt served (1: its parts in *v). */
static int served_view(ferry *f, const request *r, const char *p, size_t n, rcpt_view *v)
{
    /* A script's: whatever it answers (its wrapper keeps even a null). */
    return (r->flags & REQ_F_RCPT) && n > 0 && rcpt_of(f, r, v) == 0 &&
           (v->script ||
            (!is_null(p, n) && p[0] != '-' && !(n == 4 && memcmp(p, "*0\r\n", 4) == 0)));
}

/* r's receipts' keys (a priority pop's several) as bulk strings; how many. */
static size_t served_keys(ferry *f, const request *r, const rcpt_view *v, buf *out)
{
    buf k;
    buf_init(&k);
    size_t n = 0;
    for (long long i = 0; i < (v->multi ? v->nkeys : 1); i++) {
        buf_clear(&k);
        if (v->multi) {
            multi_receipt_key(f, v, r->rcpt, i, &k);
        } else {
            receipt_key(f, v, r->rcpt, &k);
        }
        buf_append_bulk(out, buf_head(&k), buf_used(&k));
        n++;
    }
    buf_free(&k);
    return n;
}

void receipts_reply(ferry *f, request *r, const char *p, size_t n)
{
    rcpt_view v;
    if (!served_view(f, r, p, n, &v)) {
        return; /* nothing moved: no receipt */
    }
    served *sv = xcalloc(1, sizeof(*sv));
    sv->f = f;
    sv->pop = v.push == NULL;
    buf_init(&sv->rkeys);
    buf_init(&sv->qkey);
    buf_init(&sv->undo);
    sv->nrkeys = served_keys(f, r, &v, &sv->rkeys);
    buf_append(&sv->qkey, v.key, v.klen);
    put_back_move(f, &v, r->rcpt, &sv->undo);
    rcpt_let_go(f, r);
    f->stats.receipts_held += sv->nrkeys; /* until their DELs or the undoing are sent */
    if (r->written != NULL) {
        served_written(sv, 1); /* (never: a receipt's reply has no other watcher) */
        return;
    }
    r->written = served_written;
    r->written_arg = sv;
}

void receipts_reply_sent(ferry *f, request *r, const char *p, size_t n)
{
    rcpt_view v;
    if (!served_view(f, r, p, n, &v)) {
        return;
    }
    buf keys;
    buf_init(&keys);
    size_t nkeys = served_keys(f, r, &v, &keys);
    rcpt_let_go(f, r);
    f->stats.receipts_held += nkeys; /* until their DELs are sent */
    served_dels(f, &keys, v.key, v.klen);
    buf_free(&keys);
}

int receipts_push_key(ferry *f, const request *r, buf *out)
{
    rcpt_view v;
    if (!(r->flags & REQ_F_RCPT) || r->rcpt == 0 || rcpt_of(f, r, &v) != 0 || v.push == NULL ||
        v.script || strcmp(v.push, "exec") == 0) {
        return -1;
    }
    receipt_key(f, &v, r->rcpt, out);
    return 0;
}

void receipts_undo(ferry *f, request *r)
{
    rcpt_view v;
    if (!(r->flags & REQ_F_RCPT) || rcpt_of(f, r, &v) != 0) {
        return;
    }
    rcpt_let_go(f, r);
    if (v.push != NULL) {
        return; /* a push has nothing to put back (see the file's head) */
    }
    f->stats.pop_receipts_put_back++;
    put_back_add(f, r, &v, NULL, 0);
}

/* r, a pop with its receipt whose client is gone: undone, if its move may
 * have applied. Where the move is still on its way, the move back must
 * reach Redis after it: behind it on its shared link; a blocking move on
 * its own link is ended first (CLIENT KILL, on a shared link to the same
 * master, then the move back there: Redis frees a killed client at once,
 * so the move is done or never will be). A push or a transaction stands
 * (its client was told nothing either way, as with any write whose reply
 * it lost); its receipt is deleted the same way, or nothing would. */
static void client_gone(session *s, request *r)
{
    ferry *f = s->f;
    rcpt_view v;
    link *l = r->state == REQ_SENT ? r->link : NULL, *via = NULL;
    int again = 0;
    if (rcpt_of(f, r, &v) != 0) {
        return;
    }
    const char *p = buf_head(&r->reply);
    size_t n = buf_used(&r->reply);
    if (r->state == REQ_ANSWERED ||
        (v.push == NULL && r->state == REQ_WAITING && (is_null(p, n) || (n > 0 && p[0] == '-')))) {
        return; /* its receipt served (deleted) already, or nothing taken */
    }
    if (l != NULL && l->state == LINK_READY && l->kind == LINK_SHARED) {
        via = l;
    } else if (l != NULL && l->state == LINK_READY && l->redis_id > 0 && l->epoch == l->up->epoch &&
               (via = upstream_shared(l->up, &l->up->self, s->id, 2)) != NULL) {
        char id[24];
        snprintf(id, sizeof(id), "%lld", l->redis_id);
        const char *argv[] = {"CLIENT", "KILL", "ID", id};
        link_internal(via, argv, 4, NULL, 0);
    } else if (l != NULL) {
        /* Its own link, and its Redis id not known (the master has not
         * answered its HELLO: frozen, or slow), or a link on its way out:
         * nothing orders the move back after the move, which Redis may
         * still run when it reads that link. The move back is sent again
         * every PUT_BACK_AGAIN_MS while kept; a move later than that
         * stays. */
        again = 1;
        log_info("receipts: client %llu left with a request on a link Redis may still read: its "
                 "receipt is moved back (or deleted) now and again for %d s",
                 (unsigned long long)s->id, PUT_BACK_KEEP_MS / 1000);
    }
    rcpt_let_go(f, r);
    if (v.push == NULL) {
        f->stats.pops_undone++;
    }
    put_back_add(f, r, &v, via, again);
}

void receipts_client_gone(session *s)
{
    list_node *n;
    uint64_t undone = s->f->stats.pops_undone;
    list_foreach(n, &s->requests)
    {
        request *r = list_entry(n, request, sq);
        if (r->flags & REQ_F_RCPT) {
            client_gone(s, r);
        }
    }
    if (s->f->stats.pops_undone != undone) {
        log_info("client %llu left before the reply of %llu pop(s) was written: undone, the "
                 "item(s) moved back to their queue",
                 (unsigned long long)s->id, (unsigned long long)(s->f->stats.pops_undone - undone));
    }
}

void receipts_tick(ferry *f)
{
    struct receipts *rc = f->receipts;
    size_t keep = 0;
    instance_tick(f, uv_now(f->loop));
    if (rc == NULL) {
        return;
    }
    if (f->cluster == NULL && rc->del_epoch != 0) {
        link *l = clustermap_key_link(f, "", 0, NULL, 0, 2);
        if (l != NULL) {
            recent_again(f, rc, l);
        }
    } else if (f->cluster != NULL) {
        cluster_recent_again(f, rc);
    }
    uint64_t now = uv_now(f->loop);
    for (size_t i = 0; i < rc->n; i++) {
        put_back *b = &rc->pb[i];
        if (b->epoch != 0 && now - b->sent_ms >= PUT_BACK_KEEP_MS &&
            (!b->again || now - b->sent_ms >= PUT_BACK_AGAIN_MAX_MS ||
             (b->answered_ms != 0 && now - b->answered_ms >= PUT_BACK_SETTLE_MS))) {
            put_back_free(f, b);
            continue;
        }
        put_back_send(f, b, NULL); /* not sent yet, or a new master since */
        rc->pb[keep++] = *b;
    }
    rc->n = keep;
}

void receipts_free(ferry *f)
{
    struct receipts *rc = f->receipts;
    if (rc == NULL) {
        return;
    }
    for (size_t i = 0; i < rc->n; i++) {
        put_back_free(f, &rc->pb[i]);
    }
    free(rc->pb);
    buf_free(&rc->dels);
    buf_free(&rc->turn);
    buf_free(&rc->cturn);
    buf_free(&rc->cdels);
    buf_free(&rc->recent[0]);
    buf_free(&rc->recent[1]);
    for (size_t i = 0; i < rc->ncrecent; i++) {
        cluster_recent_free(&rc->crecent[i]);
    }
    free(rc->crecent);
    free(rc);
    f->receipts = NULL;
}
