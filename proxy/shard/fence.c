/* fence.c - when a reply may be released, and when a master may be used.
 *
 * Verification: a new shared link asks ROLE (only a node that says it is a
 * master is used) and asserts durability (CONFIG SET appendonly yes,
 * appendfsync always) before it carries a client request, so "durable
 * before the first write" holds by the order on that one connection.
 *
 * replicas_ack: acknowledged writes sent in one loop turn are followed by
 * one WAIT; their replies are kept (REQ_WAITING) until it answers.
 *
 * The fence: at a master switch, a link with requests in flight gets a
 * WAIT 1 behind them; replies are released only if a replica confirmed and
 * no replica was promoted meanwhile; writes it cannot confirm are retried
 * on the next master. Then the link closes.
 *
 * Offset brackets (bracket.h): with replicas_ack, a ROLE goes before each
 * replicas_ack WAIT, so every held write reply gets the master's replication
 * offset before it (lo: the last ROLE answered on its link before its reply)
 * and after it (hi: the ROLE behind its batch); the master's replication id
 * is read once per master (INFO replication on the probe link). */
#include "fence.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bracket.h"
#include "durable_link.h"
#include "log.h"
#include "redo.h"
#include "router.h"
#include "session.h"
#include "upstream.h"

#define FENCE_ARG 1              /* request arg of a fence WAIT (a replicas_ack WAIT has 0) */
#define FENCE_BUSY_RETRY_MS 1000 /* durability asked again after a -BUSY */

static void enforce_done(link *l, request *r, const char *reply, size_t len);
static void replid_done(link *l, request *r, const char *reply, size_t len);
static void wait_done(link *l, request *w, const char *reply, size_t len);

/* ------------------------------------------------------------ verification */

void fence_auth_done(link *l, request *r, const char *reply, size_t len)
{
    if (reply != NULL && len > 0 && reply[0] == '-') {
        char why[200];
        link_error_text(reply, len, why, sizeof(why));
        log_error("link %llu: Redis %s refused ferry's credentials: %s", (unsigned long long)l->id,
                  l->up->name, why);
        l->f->stats.upstream_errors++;
        link_close(l, "authentication failed");
    }
}

void fence_user_auth_done(link *l, request *r, const char *reply, size_t len)
{
    if (len == 0 || reply[0] == '-') {
        char why[200];
        link_error_text(reply, len, why, sizeof(why));
        if (len >= 10 && memcmp(reply, "-WRONGPASS", 10) == 0) {
            /* The user is unknown, disabled, or the password wrong. */
            upstream_ident_rejected(l, why);
            link_close(l, "Redis refused the user's credentials");
        } else {
            /* Not about the user (max clients, ...): this link only. */
            log_warn("link %llu: Redis answered the AUTH of user '%s' with: %s",
                     (unsigned long long)l->id, l->who->user, why);
            l->f->stats.upstream_errors++;
            link_close(l, "the user's AUTH failed");
        }
        return;
    }
    link_open_gate(l);
    if (l->kind == LINK_SHARED) {
        /* No ROLE or durability checks as the user: ferry's own shared
         * links verified this master (epoch) before the view went UP. */
        fence_link_verified(l);
    }
}

/* -BUSY: the node runs a script or function past lua-time-limit (on some
 * client's dedicated link) and answers nothing else until it ends. */
static int reply_is_busy(const char *reply, size_t len)
{
    return reply != NULL && len >= 5 && memcmp(reply, "-BUSY", 5) == 0 &&
           (len == 5 || reply[5] == ' ' || reply[5] == '\r');
}

/* The master's replication offset from a ROLE reply's bytes, or -1: a
 * master's starts "*3\r\n$6\r\nmaster\r\n:<offset>\r\n" (read without building
 * the reply: one per batch of writes). */
static long long role_reply_offset(const char *p, size_t n)
{
    static const char head[] = "*3\r\n$6\r\nmaster\r\n:";
    size_t h = sizeof(head) - 1;
    long long off = 0;
    size_t i = h;
    if (n < h + 3 || memcmp(p, head, h) != 0) {
        return -1;
    }
    for (; i < n && p[i] >= '0' && p[i] <= '9' && i - h < 19; i++) {
        off = off * 10 + (p[i] - '0');
    }
    return i > h && i + 1 < n && p[i] == '\r' && p[i + 1] == '\n' ? off : -1;
}

/* A ROLE answered on l with offset off: every reply held on l arrived before
 * it, so off is at or past the end of what each wrote (its hi); later
 * replies get off as their lo. */
static void bracket_close(link *l, long long off)
{
    if (off < 0) {
        return;
    }
    /* Replies are held in the order they arrived and each ROLE closes all
     * before it: the open ones are the tail. */
    for (list_node *n = l->held.prev; n != &l->held; n = n->prev) {
        request *r = list_entry(n, request, lq);
        if (r->br_hi >= 0) {
            break;
        }
        r->br_hi = off;
        if (r->br_lo >= 0 && r->br_lo <= off) {
            l->f->stats.brackets++;
            l->f->stats.bracket_bytes += (uint64_t)(off - r->br_lo);
        } else {
            l->f->stats.brackets_open++;
        }
    }
    l->repl_off = off;
}

/* The ROLE beside a replicas_ack WAIT. */
static void bracket_role_done(link *l, request *r, const char *reply, size_t len)
{
    (void)r;
    if (reply == NULL || len == 0) {
        return;
    }
    if (reply[0] == '-') {
        if (!reply_is_busy(reply, len) && !l->role_refused) {
            char why[200];
            link_error_text(reply, len, why, sizeof(why));
            log_warn("link %llu: Redis refused ferry's ROLE (%s): no offset brackets on it",
                     (unsigned long long)l->id, why);
            l->role_refused = 1;
        }
        return;
    }
    bracket_close(l, role_reply_offset(reply, len));
}

/* Brackets need ROLE on the link: only on ferry's own links (a link
 * opened as a client's Redis user, client.auth redis, may not be allowed
 * ROLE, and every refusal would land in that user's ACL LOG). */
static int brackets_on(const link *l)
{
    return l->up->replicas_ack > 0 && l->f->cfg->offset_brackets && !l->role_refused &&
           l->who->user == NULL;
}

/* A ROLE for the offset at this point of l's stream (bracket_role_done). */
static void bracket_role(link *l)
{
    static const char *const role[] = {"ROLE"};
    link_internal(l, role, 1, bracket_role_done, 0);
    l->f->stats.bracket_roles++;
}

/* Writes went out while a WAIT is in flight (they wait behind it on Redis,
 * and their WAIT goes after it answers): a ROLE right behind them, so their
 * replies arrive with the offset after them even if the master dies before
 * their WAIT is sent. */
void fence_bracket_batch(link *l)
{
    l->role_due = 0;
    if (brackets_on(l)) {
        bracket_role(l);
    }
}

void fence_bracket_open(link *l)
{
    if (brackets_on(l) && l->repl_off < 0) {
        bracket_role(l);
    }
}

/* ------------------------------------------------- verdicts after a failover */

/* What today's policy does with a request whose outcome became unknown. */
enum {
    UNKNOWN_RESENT = 0, /* a write re-sent (its held reply dropped, or no reply) */
    UNKNOWN_DELIVERED   /* a pop's data delivered unconfirmed */
};

#define UNKNOWN_MAX 65536 /* records kept awaiting a verdict; past it: ambiguous */

typedef struct bracket_unknown {
    char replid[BRACKET_REPLID_LEN + 1]; /* its master's, "" unknown */
    int backlog;
    long long lo, hi;
    uint64_t epoch; /* its link's */
    int fate;       /* UNKNOWN_* */
} bracket_unknown;

static void verdict_count(ferry *f, const bracket_unknown *u, const upstream *up)
{
    bracket b = {u->replid[0] != '\0' ? u->replid : NULL, u->backlog, u->lo, u->hi};
    bracket_heir h = {up->heir_replid2[0] != '\0' ? up->heir_replid2 : NULL, up->heir_second};
    bracket_verdict v = bracket_decide(&b, &h);
    if (v == BRACKET_APPLIED) {
        f->stats.decided_applied++;
        f->stats.duplicates_known += u->fate == UNKNOWN_RESENT;
    } else if (v == BRACKET_NOT_APPLIED) {
        f->stats.decided_not_applied++;
        f->stats.duplicates_known += u->fate == UNKNOWN_DELIVERED;
    } else {
        f->stats.requests_ambiguous++;
    }
    log_info("%sunknown outcome (%s): bracket %lld..%lld, next master holds up to %lld: %s",
             up->tag, u->fate == UNKNOWN_RESENT ? "write re-sent" : "data delivered", u->lo, u->hi,
             up->heir_second - 1, bracket_verdict_name(v));
}

/* The next master's replid2 and second_repl_offset are known: decide every
 * request of an older master recorded so far. */
static void verdicts_run(upstream *up)
{
    size_t keep = 0;
    for (size_t i = 0; i < up->nunknown; i++) {
        if (up->unknown[i].epoch < up->heir_epoch) {
            verdict_count(up->f, &up->unknown[i], up);
        } else {
            up->unknown[keep++] = up->unknown[i];
        }
    }
    up->nunknown = keep;
}

/* r, sent on l, ends with an unknown outcome on l's master (fate: what the
 * retry policy does with it). Client writes and pops only. */
static void unknown_record(link *l, const request *r, long long lo, long long hi, int fate)
{
    upstream *up = l->up;
    if (r->s == NULL || (r->flags & (REQ_F_INTERNAL | REQ_F_RCPT | REQ_F_XSENT)) ||
        !(r->flags & REQ_F_WRITE) || up->replicas_ack <= 0 || SESSION_TX_RECEIPTED(r->s, r)) {
        /* a pop or push with its receipt, a transaction with one, a '>'
         * read: the next master decides it (receipts.c, xreads.c) */
        return;
    }
    if (up->nunknown >= UNKNOWN_MAX) {
        l->f->stats.requests_ambiguous++;
        return;
    }
    if (up->nunknown == up->unknown_cap) {
        up->unknown_cap = up->unknown_cap ? up->unknown_cap * 2 : 64;
        up->unknown = xrealloc(up->unknown, up->unknown_cap * sizeof(*up->unknown));
    }
    bracket_unknown *u = &up->unknown[up->nunknown++];
    int known = up->replid_epoch == l->epoch && up->replid_epoch != 0;
    snprintf(u->replid, sizeof(u->replid), "%s", known ? up->replid : "");
    u->backlog = known && up->repl_backlog;
    u->lo = lo;
    u->hi = hi;
    u->epoch = l->epoch;
    u->fate = fate;
    if (up->heir_epoch > l->epoch) {
        verdicts_run(up); /* the next master was read before this link let go */
    }
}

/* The replication id learned for the master of epoch (NULL unknown). */
static const char *past_replid(const upstream *up, uint64_t epoch, int *backlog)
{
    size_t slot = (size_t)(epoch % (sizeof(up->past) / sizeof(up->past[0])));
    if (epoch != 0 && up->past[slot].epoch == epoch) {
        *backlog = up->past[slot].backlog;
        return up->past[slot].replid;
    }
    *backlog = 0;
    return NULL;
}

/* The replication id of the master of epoch, NULL unknown or without a
 * backlog (redo.c's verdicts). */
static const char *replid_of_epoch(const upstream *up, unsigned long long epoch)
{
    int backlog;
    const char *id = past_replid(up, (uint64_t)epoch, &backlog);
    return id != NULL && backlog ? id : NULL;
}

/* A write answered by l's master is not confirmed and l is lost: keep its
 * reply for the next master's verdict if its bracket can give one (1). */
static int verdict_keep(link *l, request *r)
{
    int backlog;
    /* Either end may decide: a known hi can prove it applied, a known lo
     * that it was not (a ROLE lost with the master leaves hi unknown). */
    if (r->s == NULL || !(r->flags & REQ_F_WRITE) || l->up->replicas_ack <= 0 ||
        (r->br_hi < 0 && r->br_lo < 0) || past_replid(l->up, l->epoch, &backlog) == NULL) {
        return 0;
    }
    r->br_epoch = l->epoch;
    r->flags |= REQ_F_VERDICT;
    return 1;
}

int fence_verdict(upstream *up, const request *r, int force)
{
    if (up->heir_epoch <= r->br_epoch && !force) {
        return -1; /* the next master is not read yet */
    }
    bracket_verdict v = BRACKET_AMBIGUOUS;
    if (up->heir_epoch > r->br_epoch) {
        int backlog;
        const char *id = past_replid(up, r->br_epoch, &backlog);
        bracket b = {id, backlog, r->br_lo, r->br_hi};
        bracket_heir h = {up->heir_replid2[0] != '\0' ? up->heir_replid2 : NULL, up->heir_second};
        v = bracket_decide(&b, &h);
    }
    int data = request_verdict_data(r); /* a pop's item */
    int made = !data && request_reply_is_data(r, buf_head(&r->reply), buf_used(&r->reply));
    if (v == BRACKET_APPLIED) {
        up->f->stats.decided_applied++;
    } else if (v == BRACKET_NOT_APPLIED) {
        up->f->stats.decided_not_applied++;
    } else {
        up->f->stats.requests_ambiguous++;
    }
    const char *fate;
    if (data) {
        /* A pop's data: delivered unless proven not popped on the next
         * master, where the item still is: then popped again there. */
        fate = v == BRACKET_NOT_APPLIED ? " (its data dropped, the pop sent again)"
                                        : " (its data delivered)";
    } else if (made) {
        /* A write's data (XADD's id, a script's value): as any write. */
        fate = v == BRACKET_APPLIED ? " (its reply delivered, not sent again)"
                                    : " (its reply dropped, sent again)";
    } else {
        fate = v == BRACKET_APPLIED ? " (its reply delivered, not sent again)" : " (sent again)";
    }
    uint64_t now = uv_hrtime();
    log_info("%sunconfirmed %s: bracket %lld..%lld, next master holds up to %lld: %s%s "
             "(sent %llu ms ago)",
             up->tag,
             r->route == RT_SCRIPT ? "script"
             : data                ? "pop"
                                   : "write",
             r->br_lo, r->br_hi, up->heir_second - 1, bracket_verdict_name(v), fate,
             (unsigned long long)(r->sent_ns != 0 && now >= r->sent_ns
                                      ? (now - r->sent_ns) / 1000000
                                      : 0));
    return (int)v;
}

int fence_verdict_delivers(const request *r, int v)
{
    return bracket_delivers((bracket_verdict)v, request_verdict_data(r));
}

void fence_verdicts_free(upstream *up)
{
    free(up->unknown);
    up->unknown = NULL;
    up->nunknown = up->unknown_cap = 0;
}

/* ROLE on the link itself: only a node that says it is a master is used. */
static void role_done(link *l, request *r, const char *reply, size_t len)
{
    upstream *up = l->up;
    if (reply_is_busy(reply, len)) {
        /* Busy is no answer to ROLE: a verified master stays in use (the
         * re-check comes again); a new link tries again once it is over. */
        if (l->state == LINK_VERIFYING) {
            log_info("link %llu: %s is busy running a script", (unsigned long long)l->id, up->name);
            link_close(l, "master busy running a script");
        }
        return;
    }
    redisReply *rr = link_parse_reply(reply, len);
    char role[32] = "?";
    if (rr != NULL && rr->type == REDIS_REPLY_ARRAY && rr->elements > 0 &&
        rr->element[0]->type == REDIS_REPLY_STRING) {
        snprintf(role, sizeof(role), "%s", rr->element[0]->str);
    } else if (rr != NULL && rr->type == REDIS_REPLY_ERROR) {
        snprintf(role, sizeof(role), "error");
    }
    freeReplyObject(rr);
    bracket_close(l, role_reply_offset(reply, len));
    if (strcmp(role, "master") == 0) {
        if (l->state == LINK_VERIFYING) {
            if (up->replicas_ack > 0 && up->heir_epoch != up->epoch) {
                /* What it shares with the master before it, read before
                 * the link is READY: before any held request goes to it. */
                static const char *const info[] = {"INFO", "replication"};
                link_internal_sure(l, info, 2, replid_done, 1);
            }
            fence_enforce(l); /* durability next, on a node that is a master */
        }
        return;
    }
    char why[400];
    snprintf(why, sizeof(why), "%s answers ROLE '%s', not master", up->name, role);
    log_warn("link %llu: %s", (unsigned long long)l->id, why);
    upstream_on_not_master(l, why);
    link_close(l, why);
}

void fence_verify(link *l)
{
    static const char *const role[] = {"ROLE"};
    link_internal(l, role, 1, role_done, 0);
}

void fence_recheck_role(link *l)
{
    fence_verify(l);
}

static void enforce_done(link *l, request *r, const char *reply, size_t len)
{
    upstream *up = l->up;
    if (l->epoch != up->epoch) {
        return;
    }
    if (l->state == LINK_VERIFYING && link_reply_not_master(reply, len)) {
        /* Still loading its data (or not a master after all): not ready. */
        char why[200];
        link_error_text(reply, len, why, sizeof(why));
        log_info("link %llu: %s is not ready: %s", (unsigned long long)l->id, up->name, why);
        link_close(l, "master not ready");
        return;
    }
    if (reply_is_busy(reply, len)) {
        /* Busy running a script: it said neither yes nor no. A new link
         * tries again once it is over; the periodic round asks again soon. */
        if (l->state == LINK_VERIFYING) {
            link_close(l, "master busy running a script");
        } else {
            up->next_enforce_ms = uv_now(l->f->loop) + FENCE_BUSY_RETRY_MS;
        }
        return;
    }
    if (reply != NULL && len > 0 && reply[0] == '-') {
        char why[200];
        link_error_text(reply, len, why, sizeof(why));
        if (up->aof_ok || up->aof_error[0] == '\0' || strcmp(up->aof_error, why) != 0) {
            log_error("durability: cannot enforce appendonly yes / appendfsync always on %s: %s",
                      up->name, why);
        } else {
            log_error("durability: still not enforced on %s: %s", up->name, why);
        }
        snprintf(up->aof_error, sizeof(up->aof_error), "%s", why);
        up->aof_ok = 0;
    } else {
        /* OK is not proof: durable_link.c reads INFO persistence next, sets
         * aof_ok and calls fence_link_verified once the node is trusted. */
        durable_link_after_set(l, r);
        return;
    }
    fence_link_verified(l);
}

static void redo_idle(upstream *up);

void fence_link_verified(link *l)
{
    if (l->state != LINK_VERIFYING) {
        return;
    }
    /* Acknowledged pushes this master lacks go first, on ferry's own
     * link; no link of the view carries a client request before they are
     * answered (redo_idle). */
    if (l->who->user == NULL && redo_send(l, redo_idle)) {
        l->redo_wait = 1;
        return;
    }
    l->redo_wait = 0;
    link_set_state(l, LINK_READY);
    upstream_on_verified(l->up, l);
}

/* The pushes sent again are answered: the links that waited go on. */
static void redo_idle(upstream *up)
{
    for (int guard = 0; guard < 1024; guard++) {
        link *w = NULL;
        list_node *n;
        list_foreach(n, &up->links)
        {
            link *l = list_entry(n, link, node);
            if (l->redo_wait && l->state == LINK_VERIFYING) {
                w = l;
                break;
            }
        }
        if (w == NULL) {
            return;
        }
        w->redo_wait = 0;
        fence_link_verified(w);
        if (w->redo_wait) {
            return; /* it sends what a lost link left unanswered: wait again */
        }
    }
}

void fence_enforce(link *l)
{
    const config *cfg = l->f->cfg;
    const char *argv[] = {cfg->config_command ? cfg->config_command : "CONFIG",
                          "SET",
                          "appendonly",
                          "yes",
                          "appendfsync",
                          "always",
                          "no-appendfsync-on-rewrite",
                          "no"};
    durable_link_before_set(l); /* INFO persistence before CONFIG SET */
    link_internal(l, argv, 8, enforce_done, 0);
}

/* ------------------------------------------------------------ replicas_ack */

/* The value of "field:" in an INFO reply, copied into out; 0 if absent. */
static int info_field(const char *info, const char *field, char *out, size_t outlen)
{
    size_t flen = strlen(field);
    for (const char *p = info; p != NULL && *p != '\0';) {
        if (strncmp(p, field, flen) == 0 && p[flen] == ':') {
            const char *v = p + flen + 1;
            size_t n = strcspn(v, "\r\n");
            if (n >= outlen) {
                return 0;
            }
            memcpy(out, v, n);
            out[n] = '\0';
            return 1;
        }
        p = strchr(p, '\n');
        p = p != NULL ? p + 1 : NULL;
    }
    return 0;
}

/* The lowest offset of the replicas INFO replication lists
 * ("slaveN:ip=..,port=..,state=online,offset=N,lag.."), -1 if none, or if
 * one of them is not online: a replica waiting for or loading a full resync
 * still holds its old data set, and Sentinel may promote it as it is.
 * Each online one's offset is told to redo (redo_replica_at). */
static long long replicas_min_of(upstream *up, const char *info, int *listed)
{
    long long min = -1;
    int behind = 0;
    *listed = 0;
    for (const char *p = info; p != NULL && *p != '\0';) {
        if (strncmp(p, "slave", 5) == 0 && p[5] >= '0' && p[5] <= '9') {
            size_t n = strcspn(p, "\r\n");
            (*listed)++;
            const char *st = strstr(p, "state=");
            const char *off = strstr(p, "offset=");
            if (st != NULL && off != NULL && (size_t)(st - p) < n && (size_t)(off - p) < n &&
                strncmp(st + 6, "online", 6) == 0) {
                char *end = NULL;
                long long o = strtoll(off + 7, &end, 10);
                if (end != off + 7 && o >= 0 && (min < 0 || o < min)) {
                    min = o;
                }
                const char *ip = strstr(p, "ip="), *port = strstr(p, "port=");
                if (end != off + 7 && o >= 0 && ip != NULL && port != NULL &&
                    (size_t)(ip - p) < n && (size_t)(port - p) < n) {
                    char addr[80];
                    int iplen = (int)strcspn(ip + 3, ",\r\n");
                    long pn = strtol(port + 5, NULL, 10);
                    const char *fmt =
                        memchr(ip + 3, ':', (size_t)iplen) ? "[%.*s]:%ld" : "%.*s:%ld";
                    snprintf(addr, sizeof(addr), fmt, iplen, ip + 3, pn);
                    redo_replica_at(up, addr, o);
                }
            } else {
                behind = 1;
            }
        }
        p = strchr(p, '\n');
        p = p != NULL ? p + 1 : NULL;
    }
    return behind ? -1 : min;
}

static void replid_done(link *l, request *r, const char *reply, size_t len)
{
    upstream *up = l->up;
    if (r->arg == 0) {
        up->replid_pending = 0;
    }
    if (reply == NULL || l->epoch != up->epoch) {
        return;
    }
    redisReply *rr = link_parse_reply(reply, len);
    char id[64] = "", backlog[8] = "", role[16] = "", id2[64] = "", second[32] = "";
    long long replicas_min = -1;
    int listed = -1;
    if (rr != NULL && rr->type == REDIS_REPLY_STRING) {
        replicas_min = replicas_min_of(up, rr->str, &listed);
        info_field(rr->str, "role", role, sizeof(role));
        info_field(rr->str, "master_replid", id, sizeof(id));
        info_field(rr->str, "repl_backlog_active", backlog, sizeof(backlog));
        info_field(rr->str, "master_replid2", id2, sizeof(id2));
        info_field(rr->str, "second_repl_offset", second, sizeof(second));
    } else if (len > 0 && reply[0] == '-') {
        char why[200];
        link_error_text(reply, len, why, sizeof(why));
        log_warn("link %llu: Redis refused ferry's INFO replication: %s", (unsigned long long)l->id,
                 why);
    }
    freeReplyObject(rr);
    if (strcmp(role, "master") != 0 || strlen(id) != sizeof(up->replid) - 1) {
        return; /* asked again later */
    }
    if (up->heir_epoch != up->epoch) {
        /* What this master shares with the one before it: the verdicts on
         * requests whose outcome a failover left unknown. */
        char *end = NULL;
        long long s = strtoll(second, &end, 10);
        up->heir_replid2[0] = '\0';
        if (strlen(id2) == sizeof(up->heir_replid2) - 1) {
            memcpy(up->heir_replid2, id2, sizeof(up->heir_replid2));
        }
        up->heir_second = end != NULL && end != second && *end == '\0' ? s : -1;
        up->heir_epoch = up->epoch;
        verdicts_run(up);
        redo_decide(up, id, replid_of_epoch); /* sent again by fence_link_verified */
    }
    redo_replicas(up, replicas_min, listed);
    if (up->replid_epoch == up->epoch && strcmp(up->replid, id) == 0) {
        return; /* asked again for the replicas' offsets (redo): known */
    }
    memcpy(up->replid, id, sizeof(up->replid)); /* 40 characters and the NUL: checked above */
    up->repl_backlog = strcmp(backlog, "1") == 0;
    if (up->repl_backlog) {
        /* Its id changes only when its backlog is freed or made: then the
         * new master's replid2 will not match, and brackets say ambiguous. */
        up->replid_epoch = up->epoch;
        size_t slot = (size_t)(up->epoch % (sizeof(up->past) / sizeof(up->past[0])));
        up->past[slot].epoch = up->epoch;
        memcpy(up->past[slot].replid, up->replid, sizeof(up->past[slot].replid));
        up->past[slot].backlog = 1;
        log_info("%smaster %s: replication id %s", up->tag, up->name, up->replid);
    }
}

void fence_learn_replid(upstream *up, link *probe, uint64_t now)
{
    /* Once learned, asked again every ping interval: the replicas' offsets
     * tell when every one has the acknowledged pushes kept, and how many
     * replicas a WAIT must count for a push not to be kept at all (redo.c). */
    if (up->replicas_ack <= 0 || up->replid_pending || now < up->replid_next_ms) {
        return;
    }
    static const char *const info[] = {"INFO", "replication"};
    up->replid_pending = 1;
    /* Without a backlog yet (no replica attached so far), ask again later. */
    up->replid_next_ms =
        now + (up->f->cfg->ping_interval_ms > 0 ? up->f->cfg->ping_interval_ms : 1000);
    link_internal_sure(probe, info, 2, replid_done, 0);
}

/* Redis 7.0 gives a replica's connection to its master TCP_NODELAY only when
 * it makes a new master client, at a full resync. After a partial resync (the
 * usual one for the replica left behind by a failover) the replica's ACKs go
 * out under Nagle's algorithm: an ACK waits until the one before it is
 * acknowledged, and the master, with nothing to send while every writer waits
 * on its WAIT, acknowledges only when its delayed-ACK timer fires (40 ms on
 * Linux). Measured after a kill -9 failover: about 1 replicas_ack WAIT in 8
 * took 40-50 ms (none before it), and a queue worker doing ten of them per
 * job fell to 40 % of its rate for good. So a WAIT unanswered for
 * WAIT_NUDGE_MS has the master send its replicas a few bytes, which carry the
 * acknowledgement the replica's held ACK waits for: SPUBLISH on a channel of
 * ferry's own (replicated, matched by no pattern subscription, no data
 * changed, answered at once), on the probe link, at most once per
 * WAIT_NUDGE_MS. Where Redis refuses it (ACL), WAIT for more replicas than
 * exist with a 1 ms timeout, which has Redis send its replicas GETACK; that
 * form blocks the probe link until Redis next wakes, so it helps less. */
#define WAIT_NUDGE_MS 2

static void nudge_done(link *l, request *r, const char *reply, size_t len)
{
    (void)r;
    upstream *up = l->up;
    up->nudge_pending = 0;
    if (len > 0 && reply[0] == '-' && !up->nudge_by_wait) {
        char why[200];
        link_error_text(reply, len, why, sizeof(why));
        log_warn("replicas_ack: Redis refused SPUBLISH to ferry's nudge channel (%s); a late WAIT "
                 "is nudged with WAIT instead (allow ferry's user +spublish and &__ferry:*)",
                 why);
        up->nudge_by_wait = 1;
    }
}

static void nudge_cb(uv_timer_t *t);

static void nudge_arm(upstream *up, uint64_t after_ms)
{
    if (up->nudge_state == 0) {
        uv_timer_init(up->f->loop, &up->nudge);
        up->nudge.data = up;
        up->nudge_state = 1;
    }
    if (up->nudge_state == 1) {
        up->nudge_state = 2;
        uv_timer_start(&up->nudge, nudge_cb, after_ms, 0);
    }
}

static void nudge_cb(uv_timer_t *t)
{
    upstream *up = t->data;
    uint64_t now = uv_now(up->f->loop);
    uint64_t oldest = 0;
    int late = 0;
    list_node *n;

    up->nudge_state = 1;
    list_foreach(n, &up->links)
    {
        link *l = list_entry(n, link, node);
        if (l->state == LINK_READY && l->nwaits > 0 && !fence_wait_queued(l) &&
            (!late || l->wait_sent_ms < oldest)) {
            oldest = l->wait_sent_ms;
            late = 1;
        }
    }
    if (!late) {
        return; /* every WAIT answered: the next one arms the timer again */
    }
    if (now - oldest < WAIT_NUDGE_MS) {
        nudge_arm(up, WAIT_NUDGE_MS - (now - oldest));
        return;
    }
    link *p = up->probe;
    if (p != NULL && p->state == LINK_READY && !up->nudge_pending) {
        /* A cluster node takes a shard channel of its own slots only. */
        const char *const spublish[] = {
            "SPUBLISH", up->nudge_channel[0] != '\0' ? up->nudge_channel : "__ferry:nudge", "1"};
        static const char *const wait[] = {"WAIT", "1000000", "1"};
        up->nudge_pending = 1;
        up->f->stats.wait_nudges++;
        link_internal(p, up->nudge_by_wait ? wait : spublish, 3, nudge_done, 0);
    }
    nudge_arm(up, WAIT_NUDGE_MS);
}

void fence_nudge_close(upstream *up)
{
    if (up->nudge_state > 0) {
        uv_timer_stop(&up->nudge);
        uv_close((uv_handle_t *)&up->nudge, NULL);
    }
    up->nudge_state = -1;
}

static void fence_send_wait(link *l, int fence)
{
    char n[16], timeout[24];
    snprintf(n, sizeof(n), "%d", fence ? 1 : l->up->replicas_ack);
    /* Not longer than a data reply may be held: it is released at a WAIT's
     * answer (release_data). */
    uint64_t wait_ms = l->f->cfg->replicas_ack_timeout_ms;
    if (wait_ms > l->f->cfg->replicas_ack_data_hold_ms) {
        wait_ms = l->f->cfg->replicas_ack_data_hold_ms;
    }
    snprintf(timeout, sizeof(timeout), "%llu",
             (unsigned long long)(fence ? l->f->cfg->fence_timeout_ms : wait_ms));
    const char *argv[] = {"WAIT", n, timeout};
    l->role_due = 0;
    if (brackets_on(l)) {
        /* The offset after this batch (its brackets' hi); beside the
         * WAIT, not behind it, so no other writes of the wait widen it.
         * Before a fence WAIT too: an old master that still answers (a
         * planned failover) closes the brackets of what it holds. */
        bracket_role(l);
    }
    link_internal(l, argv, 3, wait_done, fence ? FENCE_ARG : 0);
    l->nwaits++;
    l->need_wait = 0;
    if (!fence) {
        l->wait_sent_ms = uv_now(l->f->loop);
        nudge_arm(l->up, WAIT_NUDGE_MS);
    }
}

void fence_wait(link *l)
{
    fence_send_wait(l, 0);
}

/* A fence_confirm in flight. */
typedef struct fence_confirm_ctx {
    fence_confirm_cb cb;
    void *arg;
    uint64_t since; /* its first WAIT was sent */
} fence_confirm_ctx;

static void confirm_done(link *l, request *w, const char *reply, size_t len);

static void confirm_send(link *l, fence_confirm_ctx *c)
{
    char n[16], timeout[24];
    snprintf(n, sizeof(n), "%d", l->up->replicas_ack);
    snprintf(timeout, sizeof(timeout), "%llu",
             (unsigned long long)l->f->cfg->replicas_ack_timeout_ms);
    const char *argv[] = {"WAIT", n, timeout};
    link_internal_sure(l, argv, 3, confirm_done, (long long)(intptr_t)c);
    if (l->nwaits++ == 0) {
        l->wait_sent_ms = uv_now(l->f->loop);
    }
    nudge_arm(l->up, WAIT_NUDGE_MS);
}

void fence_confirm(link *l, fence_confirm_cb cb, void *arg)
{
    fence_confirm_ctx *c = xcalloc(1, sizeof(*c));
    c->cb = cb;
    c->arg = arg;
    c->since = uv_now(l->f->loop);
    confirm_send(l, c);
}

static void confirm_done(link *l, request *w, const char *reply, size_t len)
{
    fence_confirm_ctx *c = (fence_confirm_ctx *)(intptr_t)w->arg;
    long long need = l->up->replicas_ack;
    long long acked = -1;
    fence_outcome o;

    l->nwaits--;
    if (reply == NULL) {
        o = FENCE_LOST;
    } else if (len > 0 && reply[0] == '-') {
        char why[200];
        link_error_text(reply, len, why, sizeof(why));
        log_warn("link %llu: Redis refused ferry's WAIT: %s", (unsigned long long)l->id, why);
        o = FENCE_UNCONFIRMED; /* asking again cannot help */
    } else {
        redisReply *rr = link_parse_reply(reply, len);
        if (rr != NULL && rr->type == REDIS_REPLY_INTEGER) {
            acked = rr->integer;
        }
        freeReplyObject(rr);
        uint64_t waited = uv_now(l->f->loop) - c->since;
        if (acked >= need) {
            o = FENCE_CONFIRMED;
        } else if (waited < l->f->cfg->replicas_ack_hold_ms && l->state == LINK_READY) {
            /* Replicas reattach after a failover: ask again, as for a
             * client's write (wait_done). */
            log_debug("link %llu: WAIT %lld: %lld replica(s) so far after %llu ms; waiting on",
                      (unsigned long long)l->id, need, acked, (unsigned long long)waited);
            confirm_send(l, c);
            return;
        } else {
            log_warn("link %llu: WAIT %lld: only %lld replica(s) confirmed within %llu ms",
                     (unsigned long long)l->id, need, acked, (unsigned long long)waited);
            o = FENCE_UNCONFIRMED;
        }
    }
    if (reply != NULL && l->need_wait && l->state == LINK_READY && l->nwaits == 0) {
        fence_wait(l); /* client writes sent while this WAIT was in flight */
    }
    c->cb(c->arg, o, acked < 0 ? 0 : acked);
    free(c);
}

/* A null reply: nothing was written (a pop that timed out or found
 * nothing, a transaction aborted by WATCH), so no replica need confirm it. */
static int reply_is_null(const char *p, size_t n)
{
    return (n == 5 && (memcmp(p, "$-1\r\n", 5) == 0 || memcmp(p, "*-1\r\n", 5) == 0)) ||
           (n == 3 && memcmp(p, "_\r\n", 3) == 0);
}

/* Data taken out of Redis is never replaced by an error: losing the
 * acknowledgement is recoverable, losing the item is not. */
static int reply_carries_data(const request *r, const char *p, size_t n)
{
    return request_reply_is_data(r, p, n);
}

int fence_wait_queued(const link *l)
{
    const list_node *n;
    list_foreach(n, &l->pending)
    {
        const request *r = list_entry(n, request, lq);
        if (r->done == wait_done || r->done == confirm_done) {
            return 0;
        }
        if ((r->flags & (REQ_F_BLOCKING | REQ_F_INTERNAL)) == REQ_F_BLOCKING) {
            return 1;
        }
    }
    return 0;
}

int fence_hold(link *l, request *r, const char *p, size_t n)
{
    if ((r->flags & REQ_F_BLOCKING) && l->nwaits > 0 && !fence_wait_queued(l)) {
        /* The blocking call a WAIT waited behind has ended: Redis runs the
         * WAIT now, so its time (the nudge, WAIT_SLOW_MS) starts now. */
        l->wait_sent_ms = uv_now(l->f->loop);
        nudge_arm(l->up, WAIT_NUDGE_MS);
    }
    if (reply_is_null(p, n) || p[0] == '-') {
        return 0; /* nothing written (or refused): no WAIT needed */
    }
    if (l->state != LINK_FENCING && !(r->flags & REQ_F_ACK)) {
        return 0;
    }
    buf_clear(&r->reply);
    buf_append(&r->reply, p, n);
    r->br_lo = l->repl_off; /* a ROLE answered before this reply was sent before it */
    r->br_hi = -1;
    request_set_state(r, REQ_WAITING);
    r->link = l;
    if (list_empty(&l->held)) {
        l->held_since_ms = uv_now(l->f->loop);
    }
    list_add_tail(&l->held, &r->lq);
    return 1;
}

/* A reply a client that gives up on it would take data out of Redis with:
 * a pop, a move, a group's read or claim, or a script's or function's data
 * (ferry cannot tell what a script took: N4's delayed queue takes an item).
 * Not a write's own data (XADD's id, SET ... GET): its client loses nothing. */
static int data_taken(const request *r, const char *p, size_t n)
{
    const char *name = r->cmd != NULL ? r->cmd->name : "";
    int script =
        strcmp(name, "eval") == 0 || strcmp(name, "evalsha") == 0 || strcmp(name, "fcall") == 0;
    return (command_takes_out(r->cmd) || script) && reply_carries_data(r, p, n);
}

/* Held past durability.replicas_ack_data_hold_ms while the replicas stay
 * short: a reply that carries data taken out of Redis with nothing to undo
 * it is delivered unconfirmed. Its client would give up on it first (Jedis
 * waits 2 s, Sidekiq 1 s) and the data would be on nobody; delivered, it is
 * at worst seen twice if this master dies before a replica has the write. A
 * pop with its receipt stays held: undone if its client leaves
 * (receipts.c). Acknowledgements wait for replicas_ack_hold_ms. */
static void release_data(link *l, long long acked, long long need)
{
    uint64_t now = uv_hrtime(), bound = l->f->cfg->replicas_ack_data_hold_ms * 1000000ull;
    list_node out, *n, *next;
    list_init(&out);
    list_foreach_safe(n, next, &l->held)
    {
        request *r = list_entry(n, request, lq);
        const char *p = buf_head(&r->reply);
        size_t len = buf_used(&r->reply);
        if (r->s != NULL && (!(r->flags & REQ_F_RCPT) || (r->flags & REQ_F_RCPT_SCRIPT)) &&
            (r->flags & REQ_F_WRITE) && now - r->sent_ns >= bound && data_taken(r, p, len)) {
            list_del(&r->lq);
            list_add_tail(&out, &r->lq);
        }
    }
    /* Taken off the link first: a reply delivered may end its session, and
     * with it the link (a dedicated one) and what it still holds. */
    while (!list_empty(&out)) {
        request *r = list_entry(list_first(&out), request, lq);
        list_del(&r->lq);
        r->link = NULL;
        if (r->s == NULL) {
            request_free(l->f, r); /* its client left meanwhile */
            continue;
        }
        l->f->stats.replies_unconfirmed++;
        log_warn("link %llu: releasing a reply that carries data after %llu ms although %lld of "
                 "%lld replica(s) confirmed it (durability.replicas_ack_data_hold_ms)",
                 (unsigned long long)l->id, (unsigned long long)((now - r->sent_ns) / 1000000),
                 acked < 0 ? 0 : acked, need);
        buf tmp = r->reply;
        buf_init(&r->reply);
        l->f->shard_ops->on_reply(r->s, r, tmp.data + tmp.pos, tmp.len - tmp.pos);
        buf_free(&tmp);
    }
}

/* A WAIT answered: every reply held on this link was sent before it. */
static void wait_done(link *l, request *w, const char *reply, size_t len)
{
    upstream *up = l->up;
    long long acked = -1;
    int fence = w->arg == FENCE_ARG;
    long long need = fence ? 1 : up->replicas_ack;

    l->nwaits--;
    if (l->state == LINK_FENCING && !fence) {
        return; /* on an old master only the fence decides (its WAIT comes later) */
    }
    if (!fence && link_reply_not_master(reply, len)) {
        /* The master stepped down under the WAIT (a CLUSTER FAILOVER, a
         * planned Sentinel failover: "-UNBLOCKED ... instance state
         * changed"): a switch, not a refusal. The replies it holds are
         * decided as any the switch finds in flight (the fence, then the
         * next master's verdict), never passed on as -NOREPLICAS. */
        char why[200];
        link_error_text(reply, len, why, sizeof(why));
        log_info("link %llu: WAIT answered '%s': the master stepped down",
                 (unsigned long long)l->id, why);
        upstream_on_not_master(l, why);
        if (l->state == LINK_READY && !list_empty(&l->held)) {
            fence_start(l); /* the view had switched already: fence it still */
        }
        return;
    }
    redisReply *rr = link_parse_reply(reply, len);
    if (rr != NULL && rr->type == REDIS_REPLY_INTEGER) {
        acked = rr->integer;
    }
    freeReplyObject(rr);
    log_debug("link %llu: %s WAIT %lld answered %lld after %llu ms", (unsigned long long)l->id,
              fence ? "fence" : "replicas_ack", need, acked,
              (unsigned long long)((uv_hrtime() - w->born_ns) / 1000000));
    /* Refused (a user without +wait, client.auth redis): asking again
     * cannot help; the writes stay unconfirmed. */
    char refused[200] = "";
    if (len > 0 && reply[0] == '-') {
        link_error_text(reply, len, refused, sizeof(refused));
        log_warn("link %llu: Redis refused ferry's WAIT: %s", (unsigned long long)l->id, refused);
    }
    if (fence) {
        log_info("link %llu: fence WAIT: %lld replica(s) have what the old master acknowledged%s",
                 (unsigned long long)l->id, acked,
                 up->fence_valid ? "" : " (too late: a replica was promoted; retrying)");
        if (!up->fence_valid) {
            /* The replica that confirmed may be resynced from the new master. */
            acked = 0;
        }
    } else if (acked < need && !list_empty(&l->held)) {
        uint64_t waited = uv_now(l->f->loop) - l->held_since_ms;
        int in_multi = l->owner != NULL && l->f->shard_ops->multi_open(l->owner);
        if (refused[0] == '\0' && waited < l->f->cfg->replicas_ack_hold_ms &&
            l->state == LINK_READY && !in_multi) {
            /* Replicas reattach after a failover: keep the replies and ask
             * again; the client sees latency, not an error. */
            log_debug("link %llu: WAIT %lld: %lld replica(s) so far after %llu ms; waiting on",
                      (unsigned long long)l->id, need, acked, (unsigned long long)waited);
            release_data(l, acked, need);
            if (l->state == LINK_READY) {
                fence_send_wait(l, 0);
            }
            return;
        }
        log_warn("link %llu: WAIT %lld: only %lld replica(s) confirmed within %llu ms",
                 (unsigned long long)l->id, need, acked, (unsigned long long)waited);
    }
    /* A pop the fence saw on fewer replicas than Sentinel lists: the one
     * promoted may lack it (a planned failover picks any of them, and the
     * old master took writes until then), and the item would be popped
     * there again. The next master's verdict decides, where it can. */
    long long every = up->replicas_known > need ? up->replicas_known : need;
    while (!list_empty(&l->held)) {
        request *r = list_entry(list_first(&l->held), request, lq);
        list_del(&r->lq);
        r->link = NULL;
        if (r->s == NULL) {
            request_free(l->f, r);
            continue;
        }
        if (fence && acked >= need && acked < every && (r->flags & REQ_F_WRITE) &&
            command_takes_out(r->cmd) &&
            reply_carries_data(r, buf_head(&r->reply), buf_used(&r->reply)) && verdict_keep(l, r)) {
            l->f->shard_ops->on_lost(r->s, r,
                                     "pop confirmed by some replicas, not all, before the switch");
            continue;
        }
        if (acked < need && (r->flags & REQ_F_WRITE) &&
            reply_carries_data(r, buf_head(&r->reply), buf_used(&r->reply)) &&
            (!fence || command_takes_out(r->cmd))) {
            if (fence && verdict_keep(l, r)) {
                /* Its data stays with it until the next master is read:
                 * delivered, unless the pop is proven not applied there
                 * (then popped again: the item is still there). */
                l->f->shard_ops->on_lost(r->s, r,
                                         "pop not confirmed by a replica before the switch");
                continue;
            }
            /* The item is out of Redis: deliver it (at worst it is seen twice). */
            l->f->stats.replies_unconfirmed++;
            if (fence) {
                unknown_record(l, r, r->br_lo, r->br_hi, UNKNOWN_DELIVERED);
            }
            log_warn("link %llu: releasing a reply that carries data although %lld of %lld "
                     "replica(s) confirmed it",
                     (unsigned long long)l->id, acked < 0 ? 0 : acked, need);
        } else if (acked < need && (r->flags & REQ_F_WRITE)) {
            if (fence && verdict_keep(l, r)) {
                /* Its reply stays with it: sent again only if the next
                 * master does not have it (router_on_lost, dispatch). */
                l->f->shard_ops->on_lost(r->s, r,
                                         "write not confirmed by a replica before the switch");
                continue;
            }
            buf_clear(&r->reply);
            if (fence) {
                unknown_record(l, r, r->br_lo, r->br_hi, UNKNOWN_RESENT);
                l->f->shard_ops->on_lost(r->s, r,
                                         "write not confirmed by a replica before the switch");
            } else {
                char line[400];
                if (refused[0] != '\0') {
                    snprintf(line, sizeof(line),
                             "-NOREPLICAS ferry: write applied on the master but not "
                             "confirmed: Redis refused ferry's WAIT (%s)\r\n",
                             refused);
                } else {
                    snprintf(line, sizeof(line),
                             "-NOREPLICAS ferry: write applied on the master but "
                             "confirmed by %lld of %lld replica(s)\r\n",
                             acked < 0 ? 0 : acked, need);
                }
                l->f->shard_ops->on_reply(r->s, r, line, strlen(line));
            }
            continue;
        }
        buf tmp = r->reply;
        buf_init(&r->reply);
        /* Confirmed by replicas_ack replica(s), maybe not by all: a queue
         * push is kept until every replica has it (redo.c). */
        redo_keep(l, r, tmp.data + tmp.pos, tmp.len - tmp.pos, acked);
        l->f->shard_ops->on_reply(r->s, r, tmp.data + tmp.pos, tmp.len - tmp.pos);
        buf_free(&tmp);
    }
    if (fence) {
        link_close(l, "old master let go after the fence");
    } else if (l->need_wait && l->state == LINK_READY) {
        fence_wait(l); /* for the writes sent while this WAIT was in flight */
    }
}

void fence_drop_held(link *l, const char *reason)
{
    list_node *n;
    /* Sent and never answered (the link's close re-sends them next): only
     * the last offset read before them is known. */
    list_foreach(n, &l->pending)
    {
        unknown_record(l, list_entry(n, request, lq), l->repl_off, -1, UNKNOWN_RESENT);
    }
    while (!list_empty(&l->held)) {
        request *r = list_entry(list_first(&l->held), request, lq);
        list_del(&r->lq);
        r->link = NULL;
        if (r->s == NULL) {
            request_free(l->f, r);
        } else if (verdict_keep(l, r)) {
            /* Its reply stays with it until the next master is read
             * (fence_verdict): a pop's data delivered unless the pop is
             * proven not there, anything else sent again unless proven
             * applied. */
            l->f->shard_ops->on_lost(r->s, r, reason);
        } else if (request_reply_taken(r)) {
            /* Taken out of Redis already: deliver it, never pop again. (A
             * write's data, an XADD's id, a script's return value: sent
             * again, as any write.) */
            l->f->stats.replies_unconfirmed++;
            unknown_record(l, r, r->br_lo, r->br_hi, UNKNOWN_DELIVERED);
            buf tmp = r->reply;
            buf_init(&r->reply);
            l->f->shard_ops->on_reply(r->s, r, tmp.data + tmp.pos, tmp.len - tmp.pos);
            buf_free(&tmp);
        } else {
            unknown_record(l, r, r->br_lo, r->br_hi, UNKNOWN_RESENT);
            buf_clear(&r->reply);
            l->f->shard_ops->on_lost(r->s, r, reason);
        }
    }
}

/* ------------------------------------------------------------------ fence */

void fence_start(link *l)
{
    uint64_t now = uv_now(l->f->loop);
    link_set_state(l, LINK_FENCING);
    l->fence_started_ms = now;
    /* WAITs already queued ahead of the fence answer first: the old master
     * gets their time too before it is given up on. */
    l->fence_deadline_ms = now + l->f->cfg->fence_timeout_ms + 500 +
                           (uint64_t)l->nwaits * l->f->cfg->replicas_ack_timeout_ms;
    upstream_disown(l);
    size_t inflight = l->npending;
    fence_send_wait(l, 1);
    log_info("link %llu: fencing %zu request(s) in flight on the old master",
             (unsigned long long)l->id, inflight);
}

int fence_check(link *l, uint64_t now)
{
    if (l->state == LINK_FENCING && now >= l->fence_deadline_ms) {
        link_close(l, "fence timeout: the old master does not answer");
        return 1;
    }
    return 0;
}
