/* receipts_tx.c - transactions that survive the loss of their reply: EXEC
 * run as one script that keeps its reply under a receipt (receipts.c has
 * the pops', pushes' and scripts' receipts this shares its names and
 * bookkeeping with). */
#include "receipts.h"
#include "receipts_int.h"

#include <stdio.h>
#include <string.h>

#include "config.h"
#include "link.h"
#include "resp.h"
#include "router.h"
#include "stats.h"
#include "tx.h"
#include "upstream.h"

/* ------------------------------------------------------- transactions
 *
 * A transaction with a push of a queue (RQ's enqueue: MULTI, HSET, RPUSH,
 * EXEC), or a pop of one (LPOP, RPOP inside MULTI), dies the same way: EXEC sent and unanswered
 * when the master died, the promoted replica may have it all, and rebuilt and sent again it would
 * push twice. Redis keeps no reply of a transaction, and nothing inside
 * MULTI can see another command's reply; a script can. So a transaction
 * whose every command answers the same in RESP2 and RESP3 and fits a Lua
 * number (the list below), unwatched, on ferry's own user, db 0 (cluster
 * mode: the receipt in the transaction's slot), with a push or a pop of a
 * key fallback.keys names, goes at EXEC as
 *
 *   DISCARD                               (the MULTI Redis queued: dropped)
 *   EVAL <receipt_tx> 1 <receipt> 0|1 <argc> <arg>... <argc> <arg>...
 *
 * the commands (kept as they were sent: the session's tx_cmds) run in turn in one
 * step, EXEC's reply kept under the receipt. What Redis refuses at queue
 * time (which aborts EXEC) it refuses the script for too, whole: a replica,
 * no good replicas, no memory (a write script); a wrong number of
 * arguments is caught here (EXEC goes as written). Sent again (its link
 * lost: the transaction rebuilt, then EXEC again), the script looks first
 * and answers the kept reply if the new master has the receipt. It is sent
 * whole each time (EVAL): no NOSCRIPT can reach a transaction. */

#define TXR_OTHER 1u     /* a command the script does not take: EXEC as written */
#define TXR_PUSH 2u      /* a push or a pop (LPOP, RPOP, ZPOP*) of a fallback.keys key */
#define TX_ARGS_MAX 7000 /* a command's arguments: Lua's unpack takes about 8 000 */

/* Commands the script runs as EXEC would: replies of integers within 2^53
 * (counts, lengths, 0 or 1), status, bulk strings or null, the same in both
 * protocols (no INCR: its integer can pass a Lua number; no map, double or
 * set replies). ZPOPMIN and ZPOPMAX only for a RESP2 client: a script reads
 * their scores as RESP2's strings, which RESP3 answers as doubles
 * (receipts_tx_note). */
static int tx_takes(const char *name)
{
    static const char *const names[] = {
        "lpush",     "rpush",   "lpushx", "rpushx",  "hset",     "hmset",     "hsetnx",  "hdel",
        "sadd",      "srem",    "zrem",   "set",     "setex",    "psetex",    "setnx",   "del",
        "unlink",    "exists",  "expire", "pexpire", "expireat", "pexpireat", "persist", "lrem",
        "ltrim",     "xadd",    "get",    "hget",    "llen",     "hlen",      "scard",   "zcard",
        "sismember", "hexists", "lpop",   "rpop",    "zpopmin",  "zpopmax"};
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        if (strcmp(name, names[i]) == 0) {
            return 1;
        }
    }
    return 0;
}

/* Whether s's transaction goes (or went) with its receipt: its EXEC is
 * decided by it, whatever the offsets say. */
static int tx_covered(const session *s)
{
    const ferry *f = s->f;
    /* (A CLIENT TRACKING session's EXEC goes as written: its reads are
     * tracked on its link either way, but that path is not tested.) */
    /* (Cluster mode: a transaction lives in one slot, its receipt too;
     * whether its shard asks replicas is known once it goes.) */
    return session_extra_r(s)->tx_rcpt == TXR_PUSH && f->cfg->push_receipts && s->db == 0 &&
           s->ident == NULL && !s->tracking &&
           (f->cluster != NULL ? f->cfg->replicas_ack != 0
                               : f->up != NULL && f->up->replicas_ack > 0);
}

void receipts_tx_note(session *s, const request *r)
{
    const char *p = buf_head(&r->data), *end = p + buf_used(&r->data);
    push_view pv;
    if ((session_extra_r(s)->tx_rcpt & TXR_OTHER) || r->seq <= session_extra_r(s)->tx_noted) {
        return; /* (a command sent again after a lost link is noted already) */
    }
    session_extra *x = session_extra_w(s);
    x->tx_noted = r->seq;
    long long argc = resp_read_header(&p, end, '*');
    int arity = r->cmd != NULL ? r->cmd->arity : 0;
    int zpop = r->cmd != NULL &&
               (strcmp(r->cmd->name, "zpopmin") == 0 || strcmp(r->cmd->name, "zpopmax") == 0);
    if (!s->f->cfg->push_receipts || r->cmd == NULL || !tx_takes(r->cmd->name) ||
        argc > TX_ARGS_MAX || (arity > 0 ? argc != arity : argc < -arity) ||
        (zpop && s->proto != 2)) {
        x->tx_rcpt |= TXR_OTHER;
        x->tx_receipted = 0;
        buf_free(&x->tx_cmds);
        return;
    }
    if (request_push_view(r, &pv) == 0 && config_fallback_key(s->f->cfg, pv.key, pv.klen)) {
        x->tx_rcpt |= TXR_PUSH;
    } else if ((strcmp(r->cmd->name, "lpop") == 0 || strcmp(r->cmd->name, "rpop") == 0 || zpop) &&
               argc >= 2) {
        /* A pop inside MULTI: sent again after a failover, the transaction
         * answers the items the first run took (kept under its receipt; a
         * sorted set's members with their scores, as RESP2 reads them). */
        const char *a, *key;
        size_t alen, klen;
        if (resp_read_bulk(&p, end, &a, &alen) == 0 && resp_read_bulk(&p, end, &key, &klen) == 0 &&
            config_fallback_key(s->f->cfg, key, klen)) {
            x->tx_rcpt |= TXR_PUSH;
        }
    }
    buf_append(&x->tx_cmds, buf_head(&r->data), buf_used(&r->data));
    x->tx_receipted = tx_covered(s);
}

/* The receipt script's arguments after its flag, from s's commands as they
 * were queued, appended to args; their count, or 0 (never: ferry wrote
 * them). */
static size_t tx_args(const session *s, buf *args)
{
    size_t argc = 0;
    const buf *cmds = &session_extra_r(s)->tx_cmds;
    const char *p = buf_head(cmds), *end = p + buf_used(cmds);
    while (p < end) {
        long long n = resp_read_header(&p, end, '*');
        const char *start = p, *a;
        size_t alen;
        char num[24];
        for (long long i = 0; i < n; i++) {
            if (resp_read_bulk(&p, end, &a, &alen) != 0) {
                n = -1;
                break;
            }
        }
        if (n <= 0) {
            return 0;
        }
        buf_append_bulk(args, num, (size_t)snprintf(num, sizeof(num), "%lld", n));
        buf_append(args, start, (size_t)(p - start));
        argc += 1 + (size_t)n;
    }
    return argc;
}

int receipts_tx_send(session *s, request *r, link *l)
{
    ferry *f = s->f;
    if (s->tx != TX_EXEC_SENT || !tx_covered(s) || l->up->replicas_ack <= 0 ||
        l->who->user != NULL ||
        (f->cluster != NULL && r->rcpt_slot1 == 0 && session_extra_r(s)->tx_pin == 0)) {
        return 0;
    }
    if (f->cluster != NULL && r->rcpt_slot1 == 0) {
        r->rcpt_slot1 = session_extra_r(s)->tx_pin; /* (1 + its slot) */
    }
    buf args, b, key;
    buf_init(&args);
    size_t argc = tx_args(s, &args);
    if (argc == 0) {
        buf_free(&args);
        return 0; /* EXEC as written */
    }
    if (r->rcpt == 0) {
        r->rcpt = ++f->rcpt_next;
        f->stats.transaction_receipts++;
    } else if (r->retries > 0 || (r->flags & REQ_F_RCPT)) {
        f->stats.transaction_receipts_resent++;
    }
    rcpt_view v;
    buf_init(&key);
    buf_init(&b);
    rcpt_of(f, r, &v);
    receipt_key(f, &v, r->rcpt, &key);
    /* Redis' MULTI ends here; the script follows, whole (EVAL). */
    static const char *const discard[] = {"DISCARD"};
    link_internal(l, discard, 1, NULL, 0);
    r->flags |= REQ_F_RCPT_EVAL;
    rcpt_script_head(l, r, 4, ferry_receipt_tx_lua, ferry_receipt_tx_lua_len, NULL, 5 + argc, &b);
    buf_append_bulk(&b, "1", 1);
    buf_append_bulk(&b, buf_head(&key), buf_used(&key));
    buf_append_bulk(&b, (r->flags & REQ_F_RCPT) ? "1" : "0", 1);
    buf_append(&b, buf_head(&args), buf_used(&args));
    rcpt_hold(f, r, REQ_F_RCPT_PROBE);
    link_send_as(l, r, buf_head(&b), buf_used(&b));
    buf_free(&b);
    buf_free(&key);
    buf_free(&args);
    return 1;
}

int receipts_tx_redo(const session *s, const request *r, buf *cmd, buf *after)
{
    ferry *f = s->f;
    /* EXEC_SENT: its reply not delivered yet, tx_cmds are still its own. */
    if (r->route != RT_EXEC || r->rcpt == 0 || !(r->flags & REQ_F_RCPT) || s->tx != TX_EXEC_SENT ||
        !session_extra_r(s)->tx_receipted) {
        return 0;
    }
    buf args, key;
    buf_init(&args);
    size_t argc = tx_args(s, &args);
    if (argc == 0) {
        buf_free(&args);
        return 0;
    }
    rcpt_view v;
    buf_init(&key);
    rcpt_of(f, r, &v);
    receipt_key(f, &v, r->rcpt, &key);
    /* Whole (EVAL: the next master may lack the script), flagged sent
     * before: where the next master has the transaction after all (its
     * history could not place it), the receipt answers and nothing runs
     * twice. */
    buf_append_count(cmd, '*', 5 + argc);
    buf_append_bulk(cmd, "EVAL", 4);
    buf_append_bulk(cmd, ferry_receipt_tx_lua, ferry_receipt_tx_lua_len);
    buf_append_bulk(cmd, "1", 1);
    buf_append_bulk(cmd, buf_head(&key), buf_used(&key));
    buf_append_bulk(cmd, "1", 1);
    buf_append(cmd, buf_head(&args), buf_used(&args));
    /* The receipt it leaves there: deleted once it ran. */
    buf_append_count(after, '*', 2);
    buf_append_bulk(after, "DEL", 3);
    buf_append_bulk(after, buf_head(&key), buf_used(&key));
    buf_free(&key);
    buf_free(&args);
    return 1;
}

/* The script's reply as EXEC's: {replies} or {replies, 1} (the receipt
 * held them) unwrapped; the script refused whole (no memory, no good
 * replicas, busy) in Redis' words for an EXEC it refuses. A master that
 * turned replica (READONLY...) is left as it is: the router sends the
 * transaction to the next master, as it does a refused command of it. */
int tx_reshape(ferry *f, const char *p, size_t n, buf *out)
{
    static const char abort_head[] = "-EXECABORT Transaction discarded because of: ";
    link_refusal why = link_reply_refusal(p, n);
    if (n > 1 && p[0] == '-' && (why == REFUSAL_NONE || why == REFUSAL_NOREPLICAS)) {
        buf_append(out, abort_head, sizeof(abort_head) - 1);
        buf_append(out, p + 1, n - 1);
        return 1;
    }
    if (n > 8 && memcmp(p, "*2\r\n", 4) == 0 && memcmp(p + n - 4, ":1\r\n", 4) == 0) {
        f->stats.transaction_receipts_found++;
        buf_append(out, p + 4, n - 8);
        return 1;
    }
    if (n > 4 && memcmp(p, "*1\r\n", 4) == 0) {
        buf_append(out, p + 4, n - 4);
        return 1;
    }
    return 0;
}
