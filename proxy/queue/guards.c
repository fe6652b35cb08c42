/* guards.c - queue guards: bounded queues (queues: max_length, on_full).
 *
 * A push (LPUSH, RPUSH, LPUSHX, RPUSHX) outside a transaction whose key
 * belongs to a queues: entry with max_length is not sent as the client
 * wrote it but as the guard script (guard_push.lua, embedded with its
 * SHA-1 at build time):
 *
 *   EVALSHA <sha1> 1 <key> <max_length> <push> - <values...>
 *
 * or, with the push's receipt (receipts.c, durability.push_receipts),
 *
 *   EVALSHA <sha1> 2 <key> <receipt> <max_length> <push> 0|1 <values...>
 *
 * The script reads LLEN and applies the push, or nothing, in one atomic
 * step: either Redis' own reply to the push (the new length) or
 * -QFULL ferry: queue <key> holds <n> items (max_length <m>).
 * Each link is sent SCRIPT LOAD before its first guarded push, so EVALSHA
 * finds the script on that connection's server; a NOSCRIPT all the same
 * (SCRIPT FLUSH) sends the push again as EVAL, which loads it.
 *
 * on_full: refuse passes -QFULL to the client. on_full: block holds the
 * push (as a refusal that applied nothing: the backlog's back-off and
 * upstream.hold_timeout_ms bound) and tries again until there is room;
 * meanwhile nothing else of that client is sent, so its order holds.
 *
 * The request keeps its original bytes (r->data): a retry after a lost
 * link builds the script call again, and the fallback store, while no
 * master is up, stores the push as the client wrote it. */
#include "guards.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "link.h"
#include "log.h"
#include "resp.h"
#include "queues.h"
#include "receipts.h"
#include "tx.h"

extern const char ferry_guard_push_lua[];
extern const size_t ferry_guard_push_lua_len;
extern const char ferry_guard_push_lua_sha1[];

/* The bounded queue entry r pushes to (its parts in *v), or -1. */
static int guarded_queue(const ferry *f, const request *r, push_view *v)
{
    const config *cfg = f->cfg;
    if (cfg->nqueues == 0 || r->route != RT_SHARED || request_push_view(r, v) != 0) {
        return -1;
    }
    int q = queues_match(cfg, v->key, v->klen);
    if (q < 0 || cfg->queues[q].max_length == 0) {
        return -1;
    }
    return q;
}

int guards_must_wait(session *s, const request *r)
{
    push_view v;
    if (s->inflight == 0) {
        s->guard_alone = 0;
        return 0;
    }
    if (s->guard_alone) {
        return 1;
    }
    int q = guarded_queue(s->f, r, &v);
    return q >= 0 && s->f->cfg->queues[q].on_full == ON_FULL_BLOCK && !tx_in_multi(s);
}

int guards_send(session *s, request *r, link *l)
{
    ferry *f = s->f;
    push_view v;
    char num[24];
    if (tx_in_multi(s)) {
        return 0; /* inside MULTI: sent as written (docs/queue-guards.md) */
    }
    int q = guarded_queue(f, r, &v);
    if (q < 0) {
        r->flags &= ~(REQ_F_GUARD | REQ_F_GUARD_EVAL);
        return 0;
    }
    const config_queue *cq = &f->cfg->queues[q];
    int eval = (r->flags & REQ_F_GUARD_EVAL) != 0;
    if (!eval && !l->guard_script) {
        const char *argv[3] = {"SCRIPT", "LOAD", ferry_guard_push_lua};
        link_internal(l, argv, 3, NULL, 0);
        l->guard_script = 1;
    }
    buf b, key;
    buf_init(&b);
    buf_init(&key);
    int before = 0;
    int rcpt = receipts_guarded_push(s, r, l, &key, &before);
    buf_append_count(&b, '*', v.nvalues + (rcpt ? 8 : 7));
    if (eval) {
        buf_append_bulk(&b, "EVAL", 4);
        buf_append_bulk(&b, ferry_guard_push_lua, ferry_guard_push_lua_len);
    } else {
        buf_append_bulk(&b, "EVALSHA", 7);
        buf_append_bulk(&b, ferry_guard_push_lua_sha1, strlen(ferry_guard_push_lua_sha1));
    }
    buf_append_bulk(&b, rcpt ? "2" : "1", 1);
    buf_append_bulk(&b, v.key, v.klen);
    if (rcpt) {
        buf_append_bulk(&b, buf_head(&key), buf_used(&key));
    }
    int n = snprintf(num, sizeof(num), "%llu", (unsigned long long)cq->max_length);
    buf_append_bulk(&b, num, (size_t)n);
    buf_append_bulk(&b, r->cmd->name, strlen(r->cmd->name));
    /* With a receipt sent before, the script looks for it first. */
    buf_append_bulk(&b, rcpt ? (before ? "1" : "0") : "-", 1);
    buf_append(&b, v.tail, v.tlen);
    buf_free(&key);
    r->flags |= REQ_F_GUARD;
    r->arg = q;
    if (cq->on_full == ON_FULL_BLOCK) {
        s->guard_alone = 1;
    }
    link_send_as(l, r, buf_head(&b), buf_used(&b));
    buf_free(&b);
    return 1;
}

static int starts(const char *p, size_t n, const char *lit)
{
    size_t m = strlen(lit);
    return n >= m && memcmp(p, lit, m) == 0;
}

guard_verdict guards_on_reply(session *s, request *r, const char *p, size_t n)
{
    ferry *f = s->f;
    if (!(r->flags & REQ_F_GUARD)) {
        return GUARD_PASS;
    }
    int q = (int)r->arg;
    if (q < 0 || q >= f->cfg->nqueues) {
        return GUARD_PASS;
    }
    if (starts(p, n, "-NOSCRIPT")) {
        if (r->flags & REQ_F_GUARD_EVAL) {
            return GUARD_PASS; /* not after an EVAL: Redis' answer */
        }
        r->flags |= REQ_F_GUARD_EVAL;
        log_info("queue guards: Redis lacked the guard script; client %llu's push sent as EVAL",
                 (unsigned long long)s->id);
        return GUARD_RESEND;
    }
    if (!starts(p, n, "-QFULL ferry: ")) {
        return GUARD_PASS;
    }
    if (f->cfg->queues[q].on_full == ON_FULL_BLOCK) {
        f->stats.queue_held_full[q]++;
        return GUARD_HOLD;
    }
    f->stats.queue_refused_full[q]++;
    return GUARD_PASS;
}
