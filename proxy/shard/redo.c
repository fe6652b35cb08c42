/* redo.c - acknowledged queue pushes kept until every replica has them, and
 * sent again to a promoted replica that lacks them (redo.h).
 *
 * One FIFO per master view, oldest first. An entry is one push as Redis
 * must run it again (its RESP bytes; an XADD's "*" id replaced by the id
 * its reply carried, so a redo makes the same entry), its db, the offsets
 * of its master around it (its bracket, fence.c) and that master's epoch.
 * Beside them, marks: an acknowledged write redo cannot send again (a
 * transaction's EXEC, a script, any other write): its bracket alone, so that
 * a failover's verdict can count what the new master lacks.
 * Three things remove entries: every replica that may be promoted has the
 * entry's offset (redo_replicas), the bound (durability.redo_max_bytes: the
 * oldest go first, pushes counted unprotected), and a failover's verdict
 * (redo_decide: on the new master, dropped; a push not on it or not known,
 * sent again, redo_send, and dropped once it answered; a mark, counted). */
#include "redo.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "bracket.h"
#include "log.h"
#include "shard.h"
#include "upstream.h"

typedef enum redo_state {
    REDO_KEPT = 0, /* waiting for the replicas (or a failover's verdict) */
    REDO_RESEND,   /* a failover decided: to be sent again to the new master */
    REDO_SENDING   /* sent again, its reply not in yet */
} redo_state;

typedef struct redo_entry {
    struct redo_entry *next;
    uint64_t seq;     /* its number in this FIFO (matches a reply to it) */
    uint64_t epoch;   /* the master epoch whose stream lo, hi are on (its replicas
                         hold it back) */
    long long lo, hi; /* its bracket on that master */
    int db;           /* the database it was written in */
    redo_state state; /* see redo_state; changed only by entry_set_state */
    int ambiguous;    /* the verdict could not place it (sent again all the same) */
    int mark;         /* a write not sent again: its bracket only (len 0) */
    size_t len;       /* bytes of the command */
    size_t after;     /* bytes that follow it, sent after it, their reply unread */
    char bytes[];     /* the command, RESP, then those */
} redo_entry;

typedef struct redo {
    redo_entry *head, *tail; /* oldest first */
    size_t n, bytes;         /* entries and their bytes (what the bound counts) */
    uint64_t next_seq;
    size_t inflight;            /* REDO_SENDING entries */
    void (*idle)(upstream *up); /* told when inflight falls to 0 */
    resp_parser *parser;        /* reads a push's key and XADD's id */
    int listed;                 /* replicas the master listed at the last INFO ... */
    uint64_t listed_epoch;      /* ... of this epoch (0: none read) */
    struct {
        uint64_t epoch;                           /* a master view's epoch (0: free) ... */
        char replid[BRACKET_REPLID_LEN + 1];      /* ... its master's replication id ... */
        char parent[BRACKET_REPLID_LEN + 1];      /* ... the history it forked from ("" none) */
        long long second;                         /* ... where: it holds the parent's up to
                                                     second - 1 ... */
        char addr[sizeof(((upstream *)0)->name)]; /* ... and its address */
    } forks[4];                                   /* the last masters read, by epoch */
    struct {
        char addr[80];    /* a replica of the master of epoch ... */
        uint64_t epoch;   /* ... (0: free) ... */
        long long offset; /* ... last listed online at this offset */
    } seen[8];
} redo;

#define ENTRY_COST(e) (sizeof(redo_entry) + (e)->len + (e)->after)

static void entry_set_state(redo_entry *e, redo_state st)
{
    e->state = st;
}

static redo *ctx(upstream *up)
{
    if (up->redo == NULL) {
        up->redo = xcalloc(1, sizeof(redo));
    }
    return up->redo;
}

static void gauges(upstream *up, long long dn, long long dbytes)
{
    up->f->stats.redo_kept = (uint64_t)((long long)up->f->stats.redo_kept + dn);
    up->f->stats.redo_kept_bytes = (uint64_t)((long long)up->f->stats.redo_kept_bytes + dbytes);
}

/* Unlink e (prev: the entry before it, NULL at the head) and free it. */
static void entry_drop(upstream *up, redo_entry *prev, redo_entry *e)
{
    redo *rd = up->redo;
    if (prev == NULL) {
        rd->head = e->next;
    } else {
        prev->next = e->next;
    }
    if (rd->tail == e) {
        rd->tail = prev;
    }
    if (e->state == REDO_SENDING && rd->inflight > 0) {
        rd->inflight--;
    }
    rd->n--;
    rd->bytes -= ENTRY_COST(e);
    gauges(up, -1, -(long long)ENTRY_COST(e));
    free(e);
}

/* ------------------------------------------------------------------ keep */

/* A queue push (what the fallback store takes: outage.c), by command. */
static int is_push(const char *name)
{
    return strcmp(name, "lpush") == 0 || strcmp(name, "rpush") == 0 ||
           strcmp(name, "lpushx") == 0 || strcmp(name, "rpushx") == 0 ||
           strcmp(name, "zadd") == 0 || strcmp(name, "xadd") == 0;
}

/* XADD key [NOMKSTREAM] [MAXLEN|MINID [=|~] threshold [LIMIT count]] id ...:
 * the index of its id, or 0. */
static size_t xadd_id_index(const resp_request *req)
{
    size_t i = 2;
    while (i < req->argc) {
        const resp_arg *a = &req->argv[i];
        if (resp_arg_is(a, "nomkstream")) {
            i++;
        } else if (resp_arg_is(a, "maxlen") || resp_arg_is(a, "minid")) {
            i++;
            if (i < req->argc &&
                (resp_arg_is(&req->argv[i], "=") || resp_arg_is(&req->argv[i], "~"))) {
                i++;
            }
            i++; /* the threshold */
            if (i < req->argc && resp_arg_is(&req->argv[i], "limit")) {
                i += 2;
            }
        } else {
            return i;
        }
    }
    return 0;
}

/* The bulk string of a reply (XADD's id), or NULL. */
static const char *reply_bulk(const char *p, size_t n, size_t *len)
{
    if (n < 4 || p[0] != '$') {
        return NULL;
    }
    const char *nl = memchr(p, '\n', n);
    if (nl == NULL) {
        return NULL;
    }
    long long l = strtoll(p + 1, NULL, 10);
    size_t head = (size_t)(nl - p) + 1;
    if (l <= 0 || head + (size_t)l > n) {
        return NULL;
    }
    *len = (size_t)l;
    return nl + 1;
}

static void entry_append(upstream *up, redo_entry *e)
{
    redo *rd = up->redo;
    size_t max = up->f->cfg->redo_max_bytes;
    /* The bound: the oldest kept ones go first (entries being sent again
     * are left alone: they are on their way). */
    redo_entry *prev = NULL, *x = rd->head;
    while (x != NULL && rd->bytes + ENTRY_COST(e) > max) {
        redo_entry *next = x->next;
        if (x->state == REDO_KEPT) {
            up->f->stats.redo_dropped_unprotected += !x->mark;
            entry_drop(up, prev, x);
        } else {
            prev = x;
        }
        x = next;
    }
    if (rd->bytes + ENTRY_COST(e) > max) {
        up->f->stats.redo_dropped_unprotected += !e->mark;
        free(e);
        return;
    }
    e->seq = ++rd->next_seq;
    e->next = NULL;
    if (rd->tail != NULL) {
        rd->tail->next = e;
    } else {
        rd->head = e;
    }
    rd->tail = e;
    rd->n++;
    rd->bytes += ENTRY_COST(e);
    gauges(up, 1, (long long)ENTRY_COST(e));
}

static void entry_init(redo_entry *e, const link *l, const request *r)
{
    e->epoch = l->epoch;
    e->lo = r->br_lo;
    e->hi = r->br_hi;
    e->db = l->db;
    e->state = REDO_KEPT;
    e->ambiguous = 0;
    e->mark = 0;
    e->after = 0;
}

/* Whether a WAIT that acked replicas confirmed reached every replica that
 * may be promoted: every one the master listed at the last INFO of epoch
 * (acked counts online ones only), and as many as Sentinel lists. */
static int all_have(const upstream *up, const redo *rd, uint64_t epoch, long long acked)
{
    return rd->listed_epoch == epoch && rd->listed > 0 && acked >= rd->listed &&
           acked >= up->replicas_known;
}

/* An acknowledged write redo cannot send again: its bracket, to count it if
 * the next master lacks it. */
static void keep_mark(link *l, const request *r)
{
    redo_entry *e = xmalloc(sizeof(*e));
    e->len = 0;
    entry_init(e, l, r);
    e->mark = 1;
    entry_append(l->up, e);
}

/* An acknowledged EXEC: kept as the session's receipts can send it again
 * (the transaction receipt script; shard_ops->redo_tx), else a mark. */
static void keep_tx(link *l, const request *r)
{
    const shard_ops *ops = l->f->shard_ops;
    buf cmd, after;
    buf_init(&cmd);
    buf_init(&after);
    if (r->s == NULL || ops->redo_tx == NULL || !ops->redo_tx(r->s, r, &cmd, &after)) {
        keep_mark(l, r);
    } else {
        redo_entry *e = xmalloc(sizeof(*e) + buf_used(&cmd) + buf_used(&after));
        memcpy(e->bytes, buf_head(&cmd), buf_used(&cmd));
        memcpy(e->bytes + buf_used(&cmd), buf_head(&after), buf_used(&after));
        entry_init(e, l, r);
        e->len = buf_used(&cmd);
        e->after = buf_used(&after);
        entry_append(l->up, e);
    }
    buf_free(&cmd);
    buf_free(&after);
}

/* A reply that says nothing was written: an error, or EXEC's nil (a
 * watched key changed). */
static int wrote_nothing(const char *p, size_t n)
{
    return n == 0 || p[0] == '-' || p[0] == '_' || (n >= 3 && memcmp(p, "*-1", 3) == 0);
}

void redo_keep(link *l, const request *r, const char *reply, size_t len, long long acked)
{
    upstream *up = l->up;
    const config *cfg = l->f->cfg;
    if (r->cmd == NULL || (r->flags & (REQ_F_INTERNAL | REQ_F_TXLOG)) ||
        !(r->flags & REQ_F_WRITE) || up->replicas_ack <= 0 || !cfg->offset_brackets ||
        wrote_nothing(reply, len)) {
        return;
    }
    int push = is_push(r->cmd->name) && config_fallback_command(cfg, r->cmd->name);
    if (!push && command_takes_out(r->cmd)) {
        return; /* a pop the next master lacks gives its item again: no loss */
    }
    if (r->br_hi < 0 || cfg->redo_max_bytes == 0 ||
        (l->epoch != up->epoch && up->heir_epoch > l->epoch)) {
        /* No offset after it (ROLE refused, a user's link): no replica's
         * offset can ever clear it; or an old master's link (a fence)
         * released it after the next master was read. */
        l->f->stats.redo_dropped_unprotected += push;
        return;
    }
    redo *rd = ctx(up);
    if (all_have(up, rd, l->epoch, acked)) {
        /* Its WAIT counted every replica the master listed a moment ago
         * (INFO replication, every ping interval) and Sentinel lists:
         * nothing to keep. */
        return;
    }
    if (!push) {
        if (strcmp(r->cmd->name, "exec") == 0) {
            keep_tx(l, r);
        } else {
            keep_mark(l, r);
        }
        return;
    }
    int xadd = strcmp(r->cmd->name, "xadd") == 0;
    if (!xadd && cfg->nfallback_keys == 0) {
        /* Nothing to read in it: its bytes as they are (one allocation,
         * one copy; r->data holds exactly this request). */
        size_t n = buf_used(&r->data);
        redo_entry *e = xmalloc(sizeof(*e) + n);
        memcpy(e->bytes, buf_head(&r->data), n);
        e->len = n;
        entry_init(e, l, r);
        entry_append(up, e);
        return;
    }
    if (rd->parser == NULL) {
        rd->parser = resp_parser_new(NULL);
    }
    resp_parser_reset(rd->parser);
    resp_request req;
    const char *p = buf_head(&r->data);
    size_t n = buf_used(&r->data);
    if (resp_parse_request(rd->parser, p, n, &req) != RESP_OK || req.argc < 3 || req.is_inline) {
        return;
    }
    if (!config_fallback_key(cfg, req.argv[1].ptr, req.argv[1].len)) {
        keep_mark(l, r); /* not a queue ferry sends again: counted if lost */
        return;
    }
    size_t idi = 0, idlen = 0;
    const char *id = NULL;
    if (xadd) {
        idi = xadd_id_index(&req);
        if (idi == 0 || idi >= req.argc) {
            return;
        }
        if (memchr(req.argv[idi].ptr, '*', req.argv[idi].len) != NULL) {
            /* "*" (or "ms-*"): the id Redis chose, so a redo makes the same entry. */
            id = reply_bulk(reply, len, &idlen);
            if (id == NULL) {
                return;
            }
        } else {
            idi = 0;
        }
    }
    redo_entry *e;
    if (id == NULL) {
        /* The request's bytes as they are (one copy, one allocation). */
        e = xmalloc(sizeof(*e) + req.len);
        memcpy(e->bytes, p, req.len);
        e->len = req.len;
    } else {
        buf b;
        buf_init(&b);
        buf_append_count(&b, '*', req.argc);
        for (size_t i = 0; i < req.argc; i++) {
            if (i == idi) {
                buf_append_bulk(&b, id, idlen);
            } else {
                buf_append_bulk(&b, req.argv[i].ptr, req.argv[i].len);
            }
        }
        e = xmalloc(sizeof(*e) + buf_used(&b));
        memcpy(e->bytes, buf_head(&b), buf_used(&b));
        e->len = buf_used(&b);
        buf_free(&b);
    }
    entry_init(e, l, r);
    entry_append(up, e);
}

/* -------------------------------------------------------------- confirmed */

void redo_replicas(upstream *up, long long min_offset, int listed)
{
    redo *rd = ctx(up);
    if (listed >= 0) {
        rd->listed = listed;
        rd->listed_epoch = up->epoch;
    }
    if (min_offset < 0 || listed < up->replicas_known) {
        /* A replica not online, or one Sentinel lists that the master does
         * not (stopped, restarting, cut off): it lacks what came since, and
         * Sentinel may still promote it. */
        return;
    }
    redo_entry *prev = NULL, *e = rd->head;
    while (e != NULL) {
        redo_entry *next = e->next;
        if (e->epoch == up->epoch && e->state == REDO_KEPT && e->hi <= min_offset) {
            entry_drop(up, prev, e);
        } else {
            prev = e;
        }
        e = next;
    }
}

void redo_replica_at(upstream *up, const char *addr, long long offset)
{
    redo *rd = ctx(up);
    size_t n = sizeof(rd->seen) / sizeof(rd->seen[0]), k = n, oldest = 0;
    for (size_t i = 0; i < n && k == n; i++) {
        if (strcmp(rd->seen[i].addr, addr) == 0) {
            k = i;
        } else if (rd->seen[i].epoch < rd->seen[oldest].epoch) {
            oldest = i;
        }
    }
    k = k < n ? k : oldest;
    snprintf(rd->seen[k].addr, sizeof(rd->seen[k].addr), "%s", addr);
    rd->seen[k].epoch = up->epoch;
    rd->seen[k].offset = offset;
}

/* ------------------------------------------------------- after a failover */

/* Note what the master of up's heir epoch forked from (its replid2 and
 * second_repl_offset), to place later what is written on its stream. */
static void fork_note(redo *rd, const upstream *up, const char *replid)
{
    size_t n = sizeof(rd->forks) / sizeof(rd->forks[0]);
    size_t slot = (size_t)(up->heir_epoch % n);
    rd->forks[slot].epoch = up->heir_epoch;
    snprintf(rd->forks[slot].replid, sizeof(rd->forks[slot].replid), "%s",
             replid != NULL ? replid : "");
    snprintf(rd->forks[slot].parent, sizeof(rd->forks[slot].parent), "%s", up->heir_replid2);
    rd->forks[slot].second = up->heir_second;
    memcpy(rd->forks[slot].addr, up->name, sizeof(rd->forks[slot].addr));
}

/* Whether the master of epoch (noted) was at another address than up's new
 * master: a node that shares no history with it is not that master
 * restarted from its AOF. */
static int other_node(const redo *rd, const upstream *up, uint64_t epoch)
{
    size_t slot = (size_t)(epoch % (sizeof(rd->forks) / sizeof(rd->forks[0])));
    return rd->forks[slot].epoch == epoch && rd->forks[slot].addr[0] != '\0' &&
           strcmp(rd->forks[slot].addr, up->name) != 0;
}

/* The fork noted for the master whose replication id is id, or -1. */
static int fork_of(const redo *rd, const char *id)
{
    for (int i = 0; i < (int)(sizeof(rd->forks) / sizeof(rd->forks[0])); i++) {
        if (rd->forks[i].epoch != 0 && strcmp(rd->forks[i].replid, id) == 0) {
            return i;
        }
    }
    return -1;
}

/* Another node than e's master, of no shared history, is up's new master:
 * it holds e if e lies before the offset it was last listed online at as a
 * replica there (its AOF has it); past that it may (it went on receiving
 * until it died, up to a ping interval later): ambiguous. */
static int seen_verdict(const redo *rd, const upstream *up, const redo_entry *e)
{
    for (size_t i = 0; i < sizeof(rd->seen) / sizeof(rd->seen[0]); i++) {
        if (rd->seen[i].epoch == e->epoch && strcmp(rd->seen[i].addr, up->name) == 0) {
            return e->hi <= rd->seen[i].offset ? BRACKET_APPLIED : BRACKET_AMBIGUOUS;
        }
    }
    return BRACKET_AMBIGUOUS;
}

/* Where the new master (its own id heir_replid, its replid2 and second in
 * h) stands on e, written on the stream of id (NULL unknown): a bracket
 * verdict, or -1 when they share no history ferry knows of. A stream that
 * is not the new master's may have forked from one that is (a master
 * promoted from a replica goes on from its old master's offsets): e is on
 * it if it lies before the fork, not if after. */
static int place(const redo *rd, const redo_entry *e, const char *heir_replid,
                 const bracket_heir *h, const char *id)
{
    int after_fork = 0, across = 0;
    for (size_t depth = 0; id != NULL && id[0] != '\0' && depth < 4; depth++) {
        int v = -1;
        if (heir_replid != NULL && strcmp(id, heir_replid) == 0) {
            v = BRACKET_APPLIED; /* the same node again: its stream goes on */
        } else if (h->replid2 != NULL && strcmp(id, h->replid2) == 0) {
            bracket b = {id, 1, e->lo, e->hi};
            v = bracket_decide(&b, h);
        }
        if (v >= 0) {
            return after_fork ? BRACKET_NOT_APPLIED : across ? BRACKET_AMBIGUOUS : v;
        }
        int k = fork_of(rd, id);
        if (k < 0 || rd->forks[k].parent[0] == '\0' || rd->forks[k].second <= 0) {
            break;
        }
        /* Its stream holds the parent's up to second - 1, then its own. */
        long long end = rd->forks[k].second - 1;
        after_fork |= e->lo >= end;
        across |= e->lo < end && e->hi > end;
        id = rd->forks[k].parent;
    }
    return -1;
}

void redo_decide(upstream *up, const char *heir_replid,
                 const char *(*replid_of)(const upstream *up, unsigned long long epoch))
{
    redo *rd = ctx(up);
    fork_note(rd, up, heir_replid);
    bracket_heir h = {up->heir_replid2[0] != '\0' ? up->heir_replid2 : NULL, up->heir_second};
    size_t applied = 0, resend = 0, ambiguous = 0, nohistory = 0, missing = 0, maybe = 0;
    redo_entry *prev = NULL, *e = rd->head;
    while (e != NULL) {
        redo_entry *next = e->next;
        if (e->epoch >= up->heir_epoch || e->state != REDO_KEPT) {
            prev = e;
            e = next;
            continue;
        }
        int v = place(rd, e, heir_replid, &h, replid_of(up, e->epoch));
        if (v < 0 && other_node(rd, up, e->epoch)) {
            /* Another node, restarted from its own AOF (promoted before it
             * resynced) or of a history ferry did not learn: it holds what
             * it last had as a replica (its AOF), it may lack the rest. At
             * least once: a duplicate rather than a loss. */
            v = seen_verdict(rd, up, e);
            if (v == BRACKET_APPLIED) {
                /* It has it; its offsets are not the old stream's. */
                applied += !e->mark;
                entry_drop(up, prev, e);
                e = next;
                continue;
            }
        }
        if (v < 0) {
            /* No history shared with the master that acknowledged it: a
             * node restarted from its AOF (every acknowledged push is in the
             * AOF of the master that acknowledged it), or a replication id
             * not learned. Nothing to compare: not sent again. */
            up->f->stats.redo_no_history += !e->mark;
            nohistory += !e->mark;
            entry_drop(up, prev, e);
            e = next;
            continue;
        }
        if (v == BRACKET_APPLIED) {
            /* On the new master, at the same offsets (its stream goes on
             * from the old one's): kept until every replica of its own has
             * it, as a second failover may promote one that lacks it (a
             * replica still resyncing from it). */
            applied += !e->mark;
            e->epoch = up->heir_epoch;
            prev = e;
            e = next;
            continue;
        }
        if (e->mark) {
            /* Acknowledged, and the new master lacks it (or may: the
             * boundary inside its bracket); ferry cannot write it again. */
            missing++;
            maybe += v == BRACKET_AMBIGUOUS;
            up->f->stats.acked_writes_missing++;
            entry_drop(up, prev, e);
            e = next;
            continue;
        }
        if (v == BRACKET_AMBIGUOUS) {
            /* At least once: a duplicate rather than a loss. */
            e->ambiguous = 1;
            ambiguous++;
        }
        resend++;
        entry_set_state(e, REDO_RESEND);
        prev = e;
        e = next;
    }
    if (applied + resend + nohistory > 0) {
        log_info("%sredo: %zu acknowledged push(es) of the old master: %zu on the new master "
                 "(it holds its stream up to %lld), %zu to send again (%zu it may have), %zu "
                 "of another history (not sent again)",
                 up->tag, applied + resend + nohistory, applied, up->heir_second - 1, resend,
                 ambiguous, nohistory);
    }
    if (missing > 0) {
        log_warn("%sredo: %zu acknowledged write(s) the new master lacks (%zu it may hold) "
                 "that ferry cannot send again (transactions, scripts, writes other than queue "
                 "pushes): lost (acked_writes_missing)",
                 up->tag, missing, maybe);
    }
}

static void resend_done(link *l, request *r, const char *reply, size_t len)
{
    upstream *up = l->up;
    redo *rd = up->redo;
    if (rd == NULL) {
        return;
    }
    redo_entry *prev = NULL, *e = rd->head;
    while (e != NULL && e->seq != (uint64_t)r->arg) {
        prev = e;
        e = e->next;
    }
    if (e == NULL) {
        return; /* freed meanwhile */
    }
    if (reply == NULL || link_reply_not_master(reply, len)) {
        /* The link was lost, or the node is no master after all: sent
         * again on the next verified link. */
        entry_set_state(e, REDO_RESEND);
        if (rd->inflight > 0 && --rd->inflight == 0 && rd->idle != NULL) {
            rd->idle(up);
        }
        return;
    }
    if (len > 0 && reply[0] == '-') {
        char why[200];
        link_error_text(reply, len, why, sizeof(why));
        up->f->stats.redo_errors++;
        log_error("%sredo: the new master refused an acknowledged push sent again: %s", up->tag,
                  why);
    } else {
        up->f->stats.redo_replayed++;
        up->f->stats.redo_ambiguous += e->ambiguous;
    }
    entry_drop(up, prev, e);
    if (rd->inflight == 0 && rd->idle != NULL) {
        rd->idle(up);
    }
}

int redo_send(link *l, void (*idle)(upstream *up))
{
    upstream *up = l->up;
    redo *rd = up->redo;
    if (rd == NULL) {
        return 0;
    }
    rd->idle = idle;
    size_t sent = 0;
    for (redo_entry *e = rd->head; e != NULL; e = e->next) {
        if (e->state != REDO_RESEND) {
            continue;
        }
        char db[16];
        if (e->db != 0) {
            snprintf(db, sizeof(db), "%d", e->db);
            const char *const sel[] = {"SELECT", db};
            link_internal(l, sel, 2, NULL, 0);
        }
        link_internal_bytes(l, e->bytes, e->len, resend_done, (long long)e->seq);
        if (e->after > 0) {
            link_internal_bytes(l, e->bytes + e->len, e->after, NULL, 0);
        }
        if (e->db != 0) {
            const char *const sel0[] = {"SELECT", "0"};
            link_internal(l, sel0, 2, NULL, 0);
        }
        entry_set_state(e, REDO_SENDING);
        rd->inflight++;
        sent++;
    }
    if (sent > 0) {
        log_info("%sredo: sending %zu acknowledged push(es) again before any client request",
                 up->tag, sent);
    }
    return rd->inflight > 0;
}

void redo_free(upstream *up)
{
    redo *rd = up->redo;
    if (rd == NULL) {
        return;
    }
    while (rd->head != NULL) {
        entry_drop(up, NULL, rd->head);
    }
    resp_parser_free(rd->parser);
    free(rd);
    up->redo = NULL;
}
