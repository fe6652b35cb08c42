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
 * [key, item]) and the receipt is deleted (one DEL per loop turn for all
 * served in it; per receipt in cluster mode, where they span slots). A pop sent again after its
 * link was lost carries the same receipt and goes as the receipt script (receipt_pop.lua): the
 * receipt's item if the new master has it ({item}: counted pop_receipts_found), else the move; a
 * blocking pop's script cannot block: if it found nothing, the blocking move follows with the time
 * left.
 *
 * A pop ferry answers itself after its move may have applied (its timeout
 * ran out while held for a master, -TRYAGAIN) has its receipt moved back to
 * its queue, at the end it came from, on the next master: undone.
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

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "clustermap.h"
#include "config.h"
#include "lease.h"
#include "log.h"
#include "resp.h"
#include "router.h"
#include "stats.h"
#include "tx.h"
#include "upstream.h"

extern const char ferry_receipt_pop_lua[];
extern const size_t ferry_receipt_pop_lua_len;
extern const char ferry_receipt_pop_lua_sha1[];
extern const char ferry_receipt_push_lua[];
extern const size_t ferry_receipt_push_lua_len;
extern const char ferry_receipt_push_lua_sha1[];

/* A pop's or a push's parts, read from its multibulk bytes. */
typedef struct rcpt_view {
    const char *key, *timeout;
    size_t klen, tlen;
    const char *side; /* a pop: "LEFT" or "RIGHT" */
    int blocking;
    const char *push;     /* a push: its command (lpush, rpush, lpushx, rpushx, xadd); NULL a pop */
    const char *values;   /* a push: its values (XADD: all after the key), as bulk strings */
    size_t vlen, nvalues; /* their bytes and how many */
} rcpt_view;

/* BRPOP or BLPOP (of r's pops, the blocking ones start with b). */
static int blocking_pop(const request *r)
{
    return r->cmd != NULL && r->cmd->name[0] == 'b';
}

#define XADD_ARGS_MAX 7000 /* inside the script: Lua's unpack takes about 8 000 */

/* An XADD's key and the arguments after it (*v; 0), unless it has
 * NOMKSTREAM (its null reply has no receipt to keep) or too many (-1). */
static int xadd_of(const request *r, push_view *v)
{
    const char *p = buf_head(&r->data), *end = p + buf_used(&r->data), *a;
    size_t alen;
    long long argc = resp_read_header(&p, end, '*');
    if (argc < 5 || argc - 2 > XADD_ARGS_MAX || resp_read_bulk(&p, end, &a, &alen) != 0 ||
        resp_read_bulk(&p, end, &v->key, &v->klen) != 0) {
        return -1;
    }
    v->tail = p;
    v->tlen = (size_t)(end - p);
    v->nvalues = (size_t)argc - 2;
    for (long long i = 2; i < argc; i++) {
        if (resp_read_bulk(&p, end, &a, &alen) != 0 ||
            (alen == 10 && strncasecmp(a, "nomkstream", 10) == 0)) {
            return -1;
        }
    }
    return 0;
}

static int rcpt_of(const ferry *f, const request *r, rcpt_view *v)
{
    const char *name = r->cmd != NULL ? r->cmd->name : "";
    const char *p = buf_head(&r->data), *end = p + buf_used(&r->data), *cmd;
    size_t clen;
    long long want;
    push_view pv;
    v->push = NULL;
    if (strcmp(name, "xadd") == 0 ? xadd_of(r, &pv) == 0 : request_push_view(r, &pv) == 0) {
        v->push = name; /* as the script calls it */
        v->key = pv.key;
        v->klen = pv.klen;
        v->values = pv.tail;
        v->vlen = pv.tlen;
        v->nvalues = pv.nvalues;
        v->blocking = 0;
        v->side = NULL;
    } else {
        if (strcmp(name, "rpop") == 0 || strcmp(name, "lpop") == 0) {
            want = 2;
            v->blocking = 0;
        } else if (strcmp(name, "brpop") == 0 || strcmp(name, "blpop") == 0) {
            want = 3;
            v->blocking = 1;
        } else {
            return -1;
        }
        if (resp_read_header(&p, end, '*') != want || resp_read_bulk(&p, end, &cmd, &clen) != 0 ||
            resp_read_bulk(&p, end, &v->key, &v->klen) != 0) {
            return -1; /* a count, more keys: sent as written */
        }
        if (v->blocking && resp_read_bulk(&p, end, &v->timeout, &v->tlen) != 0) {
            return -1;
        }
        v->side = name[v->blocking] == 'r' ? "RIGHT" : "LEFT";
    }
    if (f->cluster != NULL) {
        /* The receipt goes in the key's slot: only where its tag is sure. */
        const char *tag;
        size_t tlen = lease_tag(v->key, v->klen, &tag);
        if (tlen == v->klen && (memchr(v->key, '{', v->klen) || memchr(v->key, '}', v->klen))) {
            return -1;
        }
    }
    return config_fallback_key(f->cfg, v->key, v->klen) ? 0 : -1;
}

static void receipt_key(ferry *f, const rcpt_view *v, uint64_t n, buf *out)
{
    char tail[24];
    if (f->rcpt_token[0] == '\0') {
        /* Unique across restarts and loops: the process, a clock, the loop. */
        snprintf(f->rcpt_token, sizeof(f->rcpt_token), "%x%llx.%d", (unsigned)uv_os_getpid(),
                 (unsigned long long)(uv_hrtime() / 1000 % 0xffffffffffull), f->worker_index);
    }
    buf_append(out, "ferry:rcpt:", 11);
    if (f->cluster != NULL) {
        const char *tag;
        size_t tlen = lease_tag(v->key, v->klen, &tag);
        buf_append(out, "{", 1);
        buf_append(out, tag, tlen);
        buf_append(out, "}:", 2);
    }
    buf_append_str(out, f->rcpt_token);
    char *p = buf_digits(tail + sizeof(tail), n);
    *--p = ':';
    buf_append(out, p, (size_t)(tail + sizeof(tail) - p));
}

/* A script on l: its SCRIPT LOAD queued once per link (bit: which one),
 * then EVALSHA; EVAL once Redis said it lacked it. Its head, in b. */
static void script_head(link *l, request *r, int bit, const char *lua, size_t lua_len,
                        const char *sha1, size_t argc, buf *b)
{
    int eval = (r->flags & REQ_F_RCPT_EVAL) != 0;
    if (!eval && !(l->receipt_script & bit)) {
        const char *argv[3] = {"SCRIPT", "LOAD", lua};
        link_internal(l, argv, 3, NULL, 0);
        l->receipt_script |= bit;
    }
    buf_append_count(b, '*', argc);
    if (eval) {
        buf_append_bulk(b, "EVAL", 4);
        buf_append_bulk(b, lua, lua_len);
    } else {
        buf_append_bulk(b, "EVALSHA", 7);
        buf_append_bulk(b, sha1, strlen(sha1));
    }
}

/* Whether r gets a receipt on l (1: its parts in *v, its key appended to
 * key, counted), else 0. */
static int receipt_claim(session *s, request *r, link *l, rcpt_view *v, buf *key)
{
    ferry *f = s->f;
    if (r->rcpt == 0 && (l->up->replicas_ack <= 0 || l->who->user != NULL || tx_in_multi(s) ||
                         s->db != 0 || (r->route != RT_SHARED && r->route != RT_BLOCKING))) {
        return 0;
    }
    if (rcpt_of(f, r, v) != 0 ||
        (r->rcpt == 0 && !(v->push != NULL ? f->cfg->push_receipts : f->cfg->pop_receipts))) {
        return 0;
    }
    if (r->rcpt == 0) {
        r->rcpt = ++f->rcpt_next;
        if (v->push != NULL) {
            f->stats.push_receipts++;
        } else {
            f->stats.pop_receipts++;
        }
    } else if (r->retries > 0) {
        if (v->push != NULL) {
            f->stats.push_receipts_resent++;
        } else {
            f->stats.pop_receipts_resent++;
        }
    }
    receipt_key(f, v, r->rcpt, key);
    return 1;
}

int receipts_guarded_push(session *s, request *r, link *l, buf *key, int *before)
{
    rcpt_view v;
    if (!receipt_claim(s, r, l, &v, key) || v.push == NULL) {
        return 0;
    }
    *before = (r->flags & REQ_F_RCPT) != 0;
    r->flags |= REQ_F_RCPT | REQ_F_RCPT_PROBE;
    return 1;
}

int receipts_send(session *s, request *r, link *l)
{
    rcpt_view v;
    buf key, b;
    buf_init(&key);
    if (!receipt_claim(s, r, l, &v, &key)) {
        buf_free(&key);
        return 0;
    }
    buf_init(&b);
    /* A pop sent before, its move may have applied: the script looks
     * first. A push is always the script (its reply kept in the receipt),
     * which looks first only if it was sent before. */
    int script = (r->flags & REQ_F_RCPT) != 0 || v.push != NULL;
    if (v.push != NULL) {
        script_head(l, r, 2, ferry_receipt_push_lua, ferry_receipt_push_lua_len,
                    ferry_receipt_push_lua_sha1, 7 + v.nvalues, &b);
        buf_append_bulk(&b, "2", 1);
        buf_append_bulk(&b, v.key, v.klen);
        buf_append_bulk(&b, buf_head(&key), buf_used(&key));
        buf_append_bulk(&b, v.push, strlen(v.push));
        /* Sent before: it may have applied, the script looks first. */
        buf_append_bulk(&b, (r->flags & REQ_F_RCPT) ? "1" : "0", 1);
        buf_append(&b, v.values, v.vlen);
    } else if (script) {
        script_head(l, r, 1, ferry_receipt_pop_lua, ferry_receipt_pop_lua_len,
                    ferry_receipt_pop_lua_sha1, 6, &b);
        buf_append_bulk(&b, "2", 1);
        buf_append_bulk(&b, v.key, v.klen);
        buf_append_bulk(&b, buf_head(&key), buf_used(&key));
        buf_append_bulk(&b, v.side, strlen(v.side));
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
    r->flags = (r->flags & ~REQ_F_RCPT_PROBE) | REQ_F_RCPT | (script ? REQ_F_RCPT_PROBE : 0);
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
                 (unsigned long long)s->id, strstr(r->cmd->name, "push") != NULL ? "push" : "pop");
        r->flags |= REQ_F_RCPT_EVAL;
        return 1;
    }
    if (script && blocking && is_null(p, n)) {
        /* No receipt, no item: now the blocking move, with its time left. */
        r->flags &= ~(REQ_F_RCPT | REQ_F_RCPT_PROBE);
        r->flags |= REQ_F_REARM;
        return 1;
    }
    return 0;
}

#define PUT_BACK_MAX 4096 /* receipts a loop keeps to put back; past it the oldest go */

typedef struct put_back {
    buf move; /* LMOVE <receipt> <key> LEFT <side>, as sent */
    char *key;
    size_t klen;
} put_back;

struct receipts {
    put_back *pb; /* receipts to put back, oldest first */
    size_t n, cap;
    buf dels; /* receipts served this turn, as DEL's arguments (not in cluster mode) */
    size_t ndels;
};

static struct receipts *receipts_of(ferry *f)
{
    if (f->receipts == NULL) {
        f->receipts = xcalloc(1, sizeof(*f->receipts));
        buf_init(&f->receipts->dels);
    }
    return f->receipts;
}

void receipts_flush(ferry *f)
{
    struct receipts *rc = f->receipts;
    if (rc == NULL || rc->ndels == 0) {
        return;
    }
    link *l = clustermap_key_link(f, "", 0, NULL, 0, 2); /* not in cluster mode: the master */
    if (l != NULL) {
        buf del;
        buf_init(&del);
        buf_append_count(&del, '*', rc->ndels + 1);
        buf_append_bulk(&del, "DEL", 3);
        buf_append(&del, buf_head(&rc->dels), buf_used(&rc->dels));
        link_internal_bytes(l, buf_head(&del), buf_used(&del), NULL, 0);
        buf_free(&del);
    }
    buf_clear(&rc->dels);
    rc->ndels = 0;
}

int receipts_reshape(link *l, request *r, const char *p, size_t n, buf *out)
{
    rcpt_view v;
    int blocking = blocking_pop(r);
    if (!(r->flags & REQ_F_RCPT) || n == 0 || (!blocking && !(n > 4 && p[0] == '*'))) {
        return 0; /* a pop's own move answers as the pop: nothing to put */
    }
    if (rcpt_of(l->f, r, &v) != 0) {
        return 0;
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

void receipts_reply(ferry *f, request *r, link *via, const char *p, size_t n)
{
    rcpt_view v;
    if (!(r->flags & REQ_F_RCPT) || n == 0 || is_null(p, n) || p[0] == '-' ||
        rcpt_of(f, r, &v) != 0) {
        return; /* nothing moved: no receipt */
    }
    if (f->cluster == NULL) {
        /* One DEL for every receipt served this turn (receipts_flush). */
        struct receipts *rc = receipts_of(f);
        buf key;
        buf_init(&key);
        receipt_key(f, &v, r->rcpt, &key);
        buf_append_bulk(&rc->dels, buf_head(&key), buf_used(&key));
        rc->ndels++;
        buf_free(&key);
        r->flags &= ~REQ_F_RCPT;
        return;
    }
    link *to = via != NULL && via->kind == LINK_SHARED && via->state == LINK_READY
                   ? via
                   : clustermap_key_link(f, v.key, v.klen, NULL, 0, 2);
    if (to == NULL) {
        return;
    }
    /* The item is on its way to the client: the receipt has served (on the
     * link the pop went on, or a blocking pop's master's shared one: the
     * receipt is in the pop's slot). */
    buf key, del;
    buf_init(&key);
    buf_init(&del);
    receipt_key(f, &v, r->rcpt, &key);
    buf_append_count(&del, '*', 2);
    buf_append_bulk(&del, "DEL", 3);
    buf_append_bulk(&del, buf_head(&key), buf_used(&key));
    link_internal_bytes(to, buf_head(&del), buf_used(&del), NULL, 0);
    buf_free(&del);
    buf_free(&key);
    r->flags &= ~REQ_F_RCPT;
}

/* ------------------------------------------------------------ put back */

static void put_back_send(ferry *f, put_back *b)
{
    link *l = clustermap_key_link(f, b->key, b->klen, NULL, 0, 2);
    if (l != NULL) {
        link_internal_bytes(l, buf_head(&b->move), buf_used(&b->move), NULL, 0);
        f->stats.pop_receipts_put_back++;
        buf_free(&b->move);
        free(b->key);
        b->key = NULL;
    }
}

void receipts_put_back(ferry *f, request *r)
{
    rcpt_view v;
    if (!(r->flags & REQ_F_RCPT) || rcpt_of(f, r, &v) != 0) {
        return;
    }
    r->flags &= ~(REQ_F_RCPT | REQ_F_RCPT_PROBE);
    if (v.push != NULL) {
        return; /* a push has nothing to put back (see the file's head) */
    }
    struct receipts *rc = receipts_of(f);
    if (rc->n == PUT_BACK_MAX) {
        log_warn("pop receipts: %d receipts wait for a master to be put back: the oldest "
                 "(its item in %s) is left there",
                 PUT_BACK_MAX, "ferry:rcpt:...");
        buf_free(&rc->pb[0].move);
        free(rc->pb[0].key);
        memmove(rc->pb, rc->pb + 1, (rc->n - 1) * sizeof(*rc->pb));
        rc->n--;
    }
    if (rc->n == rc->cap) {
        rc->cap = rc->cap ? rc->cap * 2 : 16;
        rc->pb = xrealloc(rc->pb, rc->cap * sizeof(*rc->pb));
    }
    put_back *b = &rc->pb[rc->n];
    buf key;
    buf_init(&key);
    buf_init(&b->move);
    receipt_key(f, &v, r->rcpt, &key);
    /* Back to the end it was taken from: the queue as it was. */
    buf_append_count(&b->move, '*', 5);
    buf_append_bulk(&b->move, "LMOVE", 5);
    buf_append_bulk(&b->move, buf_head(&key), buf_used(&key));
    buf_append_bulk(&b->move, v.key, v.klen);
    buf_append_bulk(&b->move, "LEFT", 4);
    buf_append_bulk(&b->move, v.side, strlen(v.side));
    buf_free(&key);
    b->key = xmalloc(v.klen + 1);
    memcpy(b->key, v.key, v.klen);
    b->klen = v.klen;
    put_back_send(f, b);
    if (b->key != NULL) {
        rc->n++; /* no master now: at a tick once there is one */
    }
}

void receipts_tick(ferry *f)
{
    struct receipts *rc = f->receipts;
    size_t keep = 0;
    if (rc == NULL) {
        return;
    }
    for (size_t i = 0; i < rc->n; i++) {
        put_back_send(f, &rc->pb[i]);
        if (rc->pb[i].key != NULL) {
            rc->pb[keep++] = rc->pb[i];
        }
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
        buf_free(&rc->pb[i].move);
        free(rc->pb[i].key);
    }
    free(rc->pb);
    buf_free(&rc->dels);
    free(rc);
    f->receipts = NULL;
}
