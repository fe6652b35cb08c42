/* lease.c - leases and dead letters (queues: processing, lease_ms,
 * max_attempts, dead_letter); the keys it keeps in Redis are in lease.h.
 *
 * Recording. A move into a processing list answers the client the item it
 * moved. Before that reply is passed on, ferry queues the lease script
 * (lease it if it is still in the processing list, with the deadline from
 * Redis' TIME) on the shared link the move came on, or for a blocking move
 * (on a dedicated link) on a shared one: an ack that overtakes it leaves
 * the item out of the list, and the script leases nothing. Blocking moves are not rewritten: the
 * pop itself stays Redis' own, and its timeout its own. A lease lost between the two (ferry killed,
 * the link lost) is found by the expiry: an item in a processing list without a lease is given one
 * then.
 *
 * Ack. LREM <processing> <count> <item> is sent as the ack script: the same
 * LREM, and when no copy of the item is left in the list, the lease and the
 * attempt count go with it, in one step.
 *
 * Expiry. The main loop, every lease_ms / 4 (50 ms to 1 s), reads the
 * registry of processing lists and runs the expiry script on each: it takes
 * (or renews) ferry:leases:lock for this ferry, or does nothing if another
 * ferry holds it; then, for at most BATCH leases past their deadline, takes
 * the item out of the processing list and puts it back at the end of its
 * queue it was taken from with its attempt count raised, or past
 * max_attempts into dead_letter; the lease goes in the same step, so each
 * lease is expired once, whichever ferry runs it and across a failover
 * (the script's effects are replicated as one).
 *
 * Cluster mode. Every key a script touches is in the queue key's slot
 * (config.c refuses templates that would move the processing list or the
 * dead letter out of it), so each call goes to the shared link of that
 * slot's master: the lease and the ack with the move and the LREM they
 * follow, each expiry call to the master of its processing list's slot,
 * with the lock of its queue's tag there. The registry and the paused
 * consumers are one key each, on their own slot's master; the expiry
 * keeps the registry's last members, and runs on them while that master
 * is not up (a shard failing stops the expiry of its own lists only). */
#include "lease.h"

#include <hiredis/hiredis.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "clients.h"
#include "clustermap.h"
#include "link.h"
#include "log.h"
#include "queues.h"
#include "tx.h"
#include "upstream.h"

#define BATCH 100 /* leases expired per processing list and round */
#define REGISTRY "ferry:leases:registry"
#define PAUSED "ferry:consumers:paused"
#define MAX_PAUSED 64 /* paused consumers a loop keeps */
#define PAUSE_POLL_MS 200
#define MAX_ARGS 8
#define MAX_UNREG 64 /* cluster mode: processing lists a loop still has to register */

/* The scripts (lease_take.lua, lease_ack.lua, lease_expire.lua), embedded
 * with their SHA-1s: sent as EVALSHA after SCRIPT LOAD on each link, as EVAL
 * after a NOSCRIPT (SCRIPT FLUSH). */
extern const char ferry_lease_take_lua[], ferry_lease_ack_lua[], ferry_lease_expire_lua[];
extern const size_t ferry_lease_take_lua_len, ferry_lease_ack_lua_len, ferry_lease_expire_lua_len;
extern const char ferry_lease_take_lua_sha1[], ferry_lease_ack_lua_sha1[],
    ferry_lease_expire_lua_sha1[];

typedef enum { S_TAKE, S_ACK, S_EXPIRE } lease_script;

static const char *const script_body[] = {ferry_lease_take_lua, ferry_lease_ack_lua,
                                          ferry_lease_expire_lua};
static const char *const script_sha[] = {ferry_lease_take_lua_sha1, ferry_lease_ack_lua_sha1,
                                         ferry_lease_expire_lua_sha1};

/* KEYS: paused. Returns {consumer, ms left, ...} of the consumers paused
 * now (and forgets the pauses that ended). */
static const char paused_lua[] =
    "local t = redis.call('TIME')\n"
    "local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)\n"
    "redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)\n"
    "local r = redis.call('ZRANGEBYSCORE', KEYS[1], now, '+inf', 'WITHSCORES')\n"
    "for i = 2, #r, 2 do r[i] = tostring(tonumber(r[i]) - now) end\n"
    "return r\n";

typedef struct paused_consumer {
    char name[128]; /* CLIENT SETNAME, else its address */
    uint64_t until; /* uv_now() when its pause ends */
} paused_consumer;

struct leases {
    ferry *f;
    int expires; /* this loop runs the expiry (the main loop) */
    int backoff; /* an entry has consumer_backoff: poll the paused ones */
    paused_consumer paused[MAX_PAUSED];
    int npaused;
    uint64_t next_poll_ms;
    int poll_in_flight;
    char owner[64];    /* this ferry's name on the lock */
    uint64_t interval; /* ms between rounds */
    uint64_t next_ms;  /* next round */
    uint64_t round;    /* rounds started */
    int in_flight;     /* replies the round awaits */
    int logged_other;  /* another ferry holds the lock (logged once) */
    char **known;      /* cluster mode: the registry's members as last read */
    size_t *knownlen;  /* their lengths */
    size_t nknown;
    char *unreg[MAX_UNREG]; /* cluster mode: lists whose SADD did not land yet */
    size_t unreglen[MAX_UNREG];
    int nunreg;
    uint64_t refused_log_ms; /* cluster mode: uv_now() an expiry refusal was last logged */
    char reg[256];           /* the processing list this loop last put in the registry */
    size_t reglen;
    uint64_t reg_at; /* uv_now() then */
};

/* One lease a client took (lease_expire_on_disconnect): its processing
 * list, item and consumer name, one after the other in bytes. */
typedef struct held_lease {
    int e;       /* the queues entry */
    size_t plen; /* processing list */
    size_t ilen; /* item */
    size_t wlen; /* consumer name */
    char *bytes;
} held_lease;

/* The leases a session took and has not acked (its leases_held), in memory only:
 * a ferry killed loses them, and their deadline applies. */
struct lease_held {
    held_lease *v;
    size_t n, cap;
    size_t bytes; /* of the items and names kept */
};

#define MAX_HELD 4096          /* leases remembered per client; more: the deadline only */
#define MAX_HELD_BYTES 1048576 /* their bytes per client */

/* ------------------------------------------------------------ scripts */

/* The head of a call of script w with nargs arguments after the script:
 * EVALSHA (SCRIPT LOAD of the three queued first on a link that was not
 * sent them), or EVAL when eval. */
static void script_head(buf *b, link *l, lease_script w, size_t nargs, int eval)
{
    if (!eval && !l->lease_scripts) {
        for (int i = 0; i < 3; i++) {
            const char *argv[3] = {"SCRIPT", "LOAD", script_body[i]};
            link_internal(l, argv, 3, NULL, 0);
        }
        l->lease_scripts = 1;
    }
    buf_append_count(b, '*', nargs + 2);
    if (eval) {
        buf_append_bulk(b, "EVAL", 4);
        buf_append_bulk(b, script_body[w], strlen(script_body[w]));
    } else {
        buf_append_bulk(b, "EVALSHA", 7);
        buf_append_bulk(b, script_sha[w], strlen(script_sha[w]));
    }
}

static int is_noscript(const char *reply, size_t len)
{
    return reply != NULL && len >= 9 && memcmp(reply, "-NOSCRIPT", 9) == 0;
}

/* r, ferry's own EVALSHA of script w, found no script (SCRIPT FLUSH): sent
 * again on l as EVAL, which loads it. Returns 1 when it was. */
static int again_as_eval(link *l, request *r, lease_script w, req_done_cb done)
{
    static const char head[] = "$7\r\nEVALSHA\r\n$40\r\n";
    const char *p = buf_head(&r->data), *end = p + buf_used(&r->data);
    const char *nl = memchr(p, '\n', (size_t)(end - p));
    if (nl == NULL) {
        return 0;
    }
    const char *at = nl + 1;
    if ((size_t)(end - at) < sizeof(head) - 1 + 42 || memcmp(at, head, sizeof(head) - 1) != 0) {
        return 0; /* already an EVAL: Redis' answer stands */
    }
    const char *rest = at + sizeof(head) - 1 + 42;
    buf b;
    buf_init(&b);
    buf_append(&b, p, (size_t)(at - p));
    buf_append_bulk(&b, "EVAL", 4);
    buf_append_bulk(&b, script_body[w], strlen(script_body[w]));
    buf_append(&b, rest, (size_t)(end - rest));
    log_info("leases: Redis lacked a lease script on link %llu: sent as EVAL",
             (unsigned long long)l->id);
    link_internal_bytes(l, buf_head(&b), buf_used(&b), done, r->arg);
    buf_free(&b);
    return 1;
}

static void take_done(link *l, request *r, const char *reply, size_t len)
{
    if (is_noscript(reply, len)) {
        again_as_eval(l, r, S_TAKE, take_done);
    } else if (reply != NULL && len > 0 && reply[0] == '-') {
        log_warn("leases: a lease refused by Redis: %.*s (the expiry leases the item later)",
                 (int)(len > 160 ? 160 : len), reply);
    }
}

int lease_noscript(request *r, const char *p, size_t n)
{
    if (!(r->flags & REQ_F_LEASE_ACK) || (r->flags & REQ_F_LEASE_EVAL) || !is_noscript(p, n)) {
        return 0;
    }
    r->flags |= REQ_F_LEASE_EVAL;
    log_info("leases: Redis lacked the ack script; an ack sent again as EVAL");
    return 1;
}

/* ------------------------------------------------------------ key names */

/* The arguments of r's multibulk bytes: at most MAX_ARGS; returns argc. */
static size_t args_of(const request *r, const char **av, size_t *al)
{
    const char *p = buf_head(&r->data), *end = p + buf_used(&r->data);
    long long argc = 0;
    size_t n = 0;
    if (p >= end || *p != '*') {
        return 0;
    }
    for (p++; p < end && *p >= '0' && *p <= '9'; p++) {
        argc = argc * 10 + (*p - '0');
        if (argc > 1000000) {
            return 0;
        }
    }
    p += 2;
    for (long long i = 0; i < argc && i < MAX_ARGS; i++) {
        long long len = 0;
        if (p >= end || *p != '$') {
            return 0;
        }
        for (p++; p < end && *p >= '0' && *p <= '9'; p++) {
            len = len * 10 + (*p - '0');
            if (len > (1ll << 40)) {
                return 0;
            }
        }
        p += 2;
        if (end - p < len + 2) {
            return 0;
        }
        av[n] = p;
        al[n] = (size_t)len;
        n++;
        p += len + 2;
    }
    return argc > MAX_ARGS ? 0 : n;
}

/* template with {key} replaced by key[0..klen), into out (NUL-terminated);
 * returns its length, or 0 if it does not fit. */
static size_t apply(const char *tpl, const char *key, size_t klen, char *out, size_t cap)
{
    const char *at = strstr(tpl, "{key}");
    size_t pre = (size_t)(at - tpl), post = strlen(at + 5);
    if (pre + klen + post + 1 > cap) {
        return 0;
    }
    memcpy(out, tpl, pre);
    memcpy(out + pre, key, klen);
    memcpy(out + pre + klen, at + 5, post + 1);
    return pre + klen + post;
}

/* The entry with leases whose processing template names p[0..plen), and
 * its queue key in *q, *qlen (inside p); -1 if none. */
static int entry_of_processing(const config *cfg, const char *p, size_t plen, const char **q,
                               size_t *qlen)
{
    for (int i = 0; i < cfg->nqueues; i++) {
        const char *tpl = cfg->queues[i].processing;
        if (tpl == NULL) {
            continue;
        }
        const char *at = strstr(tpl, "{key}");
        size_t pre = (size_t)(at - tpl), post = strlen(at + 5);
        if (plen <= pre + post || memcmp(p, tpl, pre) != 0 ||
            memcmp(p + plen - post, at + 5, post) != 0) {
            continue;
        }
        if (queues_match(cfg, p + pre, plen - pre - post) == i) {
            *q = p + pre;
            *qlen = plen - pre - post;
            return i;
        }
    }
    return -1;
}

/* Who s is for the back-off: its CLIENT SETNAME, else its address. */
static void consumer_of(const session *s, char *out, size_t len)
{
    clients_session_name(s, out, len);
    if (out[0] == '\0') {
        snprintf(out, len, "%s", session_peer(s));
    }
}

size_t lease_tag(const char *q, size_t qlen, const char **tag)
{
    const char *open = memchr(q, '{', qlen);
    if (open != NULL) {
        const char *close = memchr(open + 1, '}', qlen - (size_t)(open + 1 - q));
        if (close != NULL && close > open + 1) {
            *tag = open + 1;
            return (size_t)(close - open - 1);
        }
    }
    *tag = q;
    return qlen;
}

void lease_key(buf *out, const char *kind, const char *q, size_t qlen, const char *p, size_t plen)
{
    const char *tag;
    size_t tlen = lease_tag(q, qlen, &tag);
    buf_append(out, "ferry:", 6);
    buf_append(out, kind, strlen(kind));
    buf_append(out, ":{", 2);
    buf_append(out, tag, tlen);
    buf_append(out, "}", 1);
    if (p != NULL) {
        buf_append(out, ":", 1);
        buf_append(out, p, plen);
    }
}

/* The companions of processing list p of queue q: the leases zset, the
 * attempts hash and the consumer map (item -> who holds it). */
static void companions(const char *q, size_t qlen, const char *p, size_t plen, buf *leases,
                       buf *attempts, buf *cons)
{
    lease_key(leases, "leases", q, qlen, p, plen);
    lease_key(attempts, "attempts", q, qlen, p, plen);
    lease_key(cons, "consumer", q, qlen, p, plen);
}

static int is_move(const command *cmd)
{
    return cmd != NULL &&
           (strcmp(cmd->name, "rpoplpush") == 0 || strcmp(cmd->name, "brpoplpush") == 0 ||
            strcmp(cmd->name, "lmove") == 0 || strcmp(cmd->name, "blmove") == 0);
}

/* ------------------------------------------------------------ recording */

/* Cluster mode: p to register again (a loop's tick does). */
static void unreg_add(struct leases *ls, const char *p, size_t plen)
{
    for (int i = 0; i < ls->nunreg; i++) {
        if (ls->unreglen[i] == plen && memcmp(ls->unreg[i], p, plen) == 0) {
            return;
        }
    }
    if (ls->nunreg == MAX_UNREG) {
        log_warn("leases: %d processing lists wait for the registry's master; %.*s is "
                 "registered at its next lease",
                 MAX_UNREG, (int)(plen > 200 ? 200 : plen), p);
        return;
    }
    ls->unreg[ls->nunreg] = xmalloc(plen + 1);
    memcpy(ls->unreg[ls->nunreg], p, plen);
    ls->unreglen[ls->nunreg++] = plen;
}

static void cluster_register(ferry *f, const char *p, size_t plen);

/* Cluster mode: the registry's SADD answered (NULL: its link was lost). */
static void unreg_done(link *l, request *r, const char *reply, size_t len)
{
    const char *av[MAX_ARGS];
    size_t al[MAX_ARGS];
    (void)len;
    if (l->f->leases != NULL && (reply == NULL || reply[0] != ':') && args_of(r, av, al) == 3) {
        unreg_add(l->f->leases, av[2], al[2]);
    }
}

/* Cluster mode: SADD p to the registry on its slot's master, kept to send
 * again until that master took it (its master down, the link lost, MOVED:
 * the registry is the only way the expiry learns of p). */
static void cluster_register(ferry *f, const char *p, size_t plen)
{
    link *l = clustermap_key_link(f, REGISTRY, strlen(REGISTRY), NULL, 0, 2);
    if (l == NULL) {
        if (f->leases != NULL) {
            unreg_add(f->leases, p, plen);
        }
        return;
    }
    buf b;
    buf_init(&b);
    buf_append_count(&b, '*', 3);
    buf_append_bulk(&b, "SADD", 4);
    buf_append_bulk(&b, REGISTRY, strlen(REGISTRY));
    buf_append_bulk(&b, p, plen);
    link_internal_bytes(l, buf_head(&b), buf_used(&b), unreg_done, 0);
    buf_free(&b);
}

/* Processing list p goes in the registry the expiry reads, before its first
 * lease (SADD on l, ahead of the lease script; again after a second, or
 * for another list: the registry stays right if someone deletes it). The
 * registry is one key for all queues: a command of its own, outside the
 * scripts, whose keys all stay in their queue's slot. */
static void lease_register(struct leases *ls, link *l, const char *p, size_t plen)
{
    uint64_t now = uv_now(l->f->loop);
    if (ls != NULL && plen == ls->reglen && memcmp(p, ls->reg, plen) == 0 &&
        now < ls->reg_at + 1000) {
        return;
    }
    if (l->f->cluster != NULL) {
        /* The registry's own slot: another master, as a rule, so not
         * ordered with the lease: kept until Redis took it (below). */
        cluster_register(l->f, p, plen);
        if (ls != NULL && plen <= sizeof(ls->reg)) {
            memcpy(ls->reg, p, plen);
            ls->reglen = plen;
            ls->reg_at = now;
        }
        return;
    }
    buf b;
    buf_init(&b);
    buf_append_count(&b, '*', 3);
    buf_append_bulk(&b, "SADD", 4);
    buf_append_bulk(&b, REGISTRY, strlen(REGISTRY));
    buf_append_bulk(&b, p, plen);
    link_internal_raw(l, buf_head(&b), buf_used(&b), NULL);
    buf_free(&b);
    if (ls != NULL && plen <= sizeof(ls->reg)) {
        memcpy(ls->reg, p, plen);
        ls->reglen = plen;
        ls->reg_at = now;
    }
}

/* s took item from entry e's processing list p, as consumer who. */
static void held_add(session *s, int e, const char *p, size_t plen, const char *item, size_t ilen,
                     const char *who)
{
    struct lease_held *h = session_extra_r(s)->leases_held;
    size_t wlen = strlen(who);
    if (h == NULL) {
        h = session_extra_w(s)->leases_held = xcalloc(1, sizeof(*h));
    }
    if (h->n == MAX_HELD || h->bytes + plen + ilen + wlen > MAX_HELD_BYTES) {
        return; /* its deadline expires it */
    }
    if (h->n == h->cap) {
        h->cap = h->cap == 0 ? 16 : h->cap * 2;
        h->v = xrealloc(h->v, h->cap * sizeof(*h->v));
    }
    held_lease *hl = &h->v[h->n++];
    hl->e = e;
    hl->plen = plen;
    hl->ilen = ilen;
    hl->wlen = wlen;
    hl->bytes = xmalloc(plen + ilen + wlen + 1);
    memcpy(hl->bytes, p, plen);
    memcpy(hl->bytes + plen, item, ilen);
    memcpy(hl->bytes + plen + ilen, who, wlen + 1);
    h->bytes += plen + ilen + wlen;
}

/* s acked item in processing list p: it no longer holds it. */
static void held_drop(session *s, const char *p, size_t plen, const char *item, size_t ilen)
{
    struct lease_held *h = session_extra_r(s)->leases_held;
    for (size_t i = 0; h != NULL && i < h->n;) {
        held_lease *hl = &h->v[i];
        if (hl->plen == plen && hl->ilen == ilen && memcmp(hl->bytes, p, plen) == 0 &&
            memcmp(hl->bytes + plen, item, ilen) == 0) {
            h->bytes -= hl->plen + hl->ilen + hl->wlen;
            free(hl->bytes);
            h->v[i] = h->v[--h->n];
        } else {
            i++;
        }
    }
}

static void held_free(session *s)
{
    struct lease_held *h = session_extra_r(s)->leases_held;
    for (size_t i = 0; h != NULL && i < h->n; i++) {
        free(h->v[i].bytes);
    }
    if (h != NULL) {
        free(h->v);
        free(h);
        s->extra->leases_held = NULL;
    }
}

void lease_on_reply(session *s, request *r, link *l, const char *p, size_t n)
{
    const config *cfg = s->f->cfg;
    const char *av[MAX_ARGS];
    size_t al[MAX_ARGS];
    const char *q;
    size_t qlen;
    if (cfg->nqueues == 0 || !is_move(r->cmd) || n < 4 || p[0] != '$' || p[1] == '-' ||
        tx_in_multi(s)) {
        return;
    }
    size_t argc = args_of(r, av, al);
    if (argc < 3) {
        return;
    }
    if (l == NULL || l->kind != LINK_SHARED) {
        /* A blocking move's dedicated link goes back to its pool now (or is
         * closed with what is queued on it): the lease goes on a shared
         * link (cluster mode: of the processing list's slot). An ack that
         * gets there first leaves nothing to lease. */
        l = s->f->cluster != NULL
                ? clustermap_key_link(s->f, av[2], al[2], s->ident, s->id, s->proto)
                : upstream_shared(s->f->up, s->ident, s->id, s->proto);
    }
    if (l == NULL || l->state != LINK_READY) {
        return; /* the expiry leases it when it finds it */
    }
    int e = entry_of_processing(cfg, av[2], al[2], &q, &qlen);
    if (e < 0 || qlen != al[1] || memcmp(q, av[1], qlen) != 0) {
        return; /* not from its queue into its processing list */
    }
    /* The item: "$<len>\r\n<item>\r\n". */
    const char *crlf = memchr(p, '\r', n);
    if (crlf == NULL) {
        return;
    }
    const char *item = crlf + 2;
    size_t ilen = (size_t)strtoull(p + 1, NULL, 10);
    if (item + ilen + 2 > p + n) {
        return;
    }
    const char *side = "R";
    if ((strcmp(r->cmd->name, "lmove") == 0 || strcmp(r->cmd->name, "blmove") == 0) && argc >= 4 &&
        al[3] == 4 && strncasecmp(av[3], "left", 4) == 0) {
        side = "L";
    }
    char ms[24];
    snprintf(ms, sizeof(ms), "%llu", (unsigned long long)cfg->queues[e].lease_ms);
    char who[128];
    consumer_of(s, who, sizeof(who));
    buf leases, attempts, cons, b;
    buf_init(&leases);
    buf_init(&attempts);
    buf_init(&cons);
    buf_init(&b);
    companions(av[1], al[1], av[2], al[2], &leases, &attempts, &cons);
    lease_register(s->f->leases, l, av[2], al[2]);
    script_head(&b, l, S_TAKE, 9, 0);
    buf_append_bulk(&b, "4", 1);
    buf_append_bulk(&b, av[2], al[2]);
    buf_append_bulk(&b, buf_head(&leases), buf_used(&leases));
    buf_append_bulk(&b, buf_head(&attempts), buf_used(&attempts));
    buf_append_bulk(&b, buf_head(&cons), buf_used(&cons));
    buf_append_bulk(&b, item, ilen);
    buf_append_bulk(&b, ms, strlen(ms));
    buf_append_bulk(&b, side, 1);
    buf_append_bulk(&b, who, strlen(who));
    link_internal_raw(l, buf_head(&b), buf_used(&b), take_done);
    buf_free(&b);
    buf_free(&cons);
    buf_free(&leases);
    buf_free(&attempts);
    if (cfg->queues[e].expire_on_disconnect) {
        held_add(s, e, av[2], al[2], item, ilen, who);
    }
}

/* ------------------------------------------------------------------ ack */

int lease_send(session *s, request *r, link *l)
{
    const config *cfg = s->f->cfg;
    const char *av[MAX_ARGS];
    size_t al[MAX_ARGS];
    const char *q;
    size_t qlen;
    if (cfg->nqueues == 0 || r->cmd == NULL || strcmp(r->cmd->name, "lrem") != 0 ||
        r->route != RT_SHARED || tx_in_multi(s)) {
        return 0;
    }
    if (args_of(r, av, al) != 4 || entry_of_processing(cfg, av[1], al[1], &q, &qlen) < 0) {
        return 0;
    }
    char who[128];
    consumer_of(s, who, sizeof(who));
    buf leases, attempts, cons, fails, b;
    buf_init(&leases);
    buf_init(&attempts);
    buf_init(&cons);
    buf_init(&fails);
    buf_init(&b);
    companions(q, qlen, av[1], al[1], &leases, &attempts, &cons);
    lease_key(&fails, "consumers", q, qlen, NULL, 0);
    buf_append(&fails, ":failures", 9);
    r->flags |= REQ_F_LEASE_ACK;
    script_head(&b, l, S_ACK, 9, (r->flags & REQ_F_LEASE_EVAL) != 0);
    buf_append_bulk(&b, "5", 1);
    buf_append_bulk(&b, av[1], al[1]);
    buf_append_bulk(&b, buf_head(&leases), buf_used(&leases));
    buf_append_bulk(&b, buf_head(&attempts), buf_used(&attempts));
    buf_append_bulk(&b, buf_head(&cons), buf_used(&cons));
    buf_append_bulk(&b, buf_head(&fails), buf_used(&fails));
    buf_append_bulk(&b, av[2], al[2]);
    buf_append_bulk(&b, av[3], al[3]);
    buf_append_bulk(&b, who, strlen(who));
    link_send_as(l, r, buf_head(&b), buf_used(&b));
    buf_free(&b);
    buf_free(&cons);
    buf_free(&leases);
    buf_free(&attempts);
    buf_free(&fails);
    held_drop(s, av[1], al[1], av[3], al[3]);
    return 1;
}

/* --------------------------------------------------------------- expiry */

static void round_reply(struct leases *ls)
{
    if (ls->in_flight > 0) {
        ls->in_flight--;
    }
}

/* What an expiry call (a round's, or a client's that hung up) did for entry e. */
static void expire_result(link *l, int e, const char *reply, size_t len)
{
    struct leases *ls = l->f->leases;
    if (reply == NULL || e < 0 || e >= l->f->cfg->nqueues) {
        return;
    }
    redisReply *rr = link_parse_reply(reply, len);
    if (rr == NULL) {
        return;
    }
    if (rr->type == REDIS_REPLY_ARRAY && rr->elements >= 4) {
        for (size_t i = 4; i + 1 < rr->elements; i += 2) {
            if (rr->element[i]->type == REDIS_REPLY_STRING &&
                rr->element[i + 1]->type == REDIS_REPLY_STRING) {
                /* The pause is kept in one set for every queue (polled by
                 * every loop), outside the script: its keys stay in the
                 * queue's slot. */
                const char *argv[4] = {"ZADD", PAUSED, rr->element[i + 1]->str,
                                       rr->element[i]->str};
                link *pl = l->f->cluster != NULL
                               ? clustermap_key_link(l->f, PAUSED, strlen(PAUSED), NULL, 0, 2)
                               : l;
                if (pl != NULL) {
                    link_internal(pl, argv, 4, NULL, 0);
                }
                log_warn("leases: consumer '%.*s' paused for %llu ms after %llu expired leases "
                         "in a row (queues[%d].consumer_backoff)",
                         (int)(rr->element[i]->len > 120 ? 120 : rr->element[i]->len),
                         rr->element[i]->str,
                         (unsigned long long)l->f->cfg->queues[e].backoff_pause_ms,
                         (unsigned long long)l->f->cfg->queues[e].backoff_after, e);
            }
        }
        long long v[4];
        for (int i = 0; i < 4; i++) {
            v[i] = rr->element[i]->type == REDIS_REPLY_INTEGER ? rr->element[i]->integer : 0;
        }
        if (v[0] < 0) {
            if (!ls->logged_other) {
                log_info("leases: another ferry expires leases (it holds the lock of queues[%d])",
                         e);
                ls->logged_other = 1;
            }
        } else {
            ferry_stats *st = &l->f->stats;
            ls->logged_other = 0;
            st->queue_lease_expired[e] += (uint64_t)(v[0] + v[1]);
            st->queue_dead_lettered[e] += (uint64_t)v[1];
            st->queue_lease_orphans[e] += (uint64_t)v[2];
            if (v[0] + v[1] + v[2] > 0) {
                log_info("leases: %lld item(s) back in their queue, %lld dead-lettered, %lld "
                         "found without a lease (queues[%d])",
                         v[0], v[1], v[2], e);
            }
        }
    } else if (rr->type == REDIS_REPLY_ERROR) {
        /* Cluster mode: a shard failing answers every round (CLUSTERDOWN,
         * TRYAGAIN...): once a second is enough. */
        uint64_t now = uv_now(l->f->loop);
        if (l->f->cluster == NULL || ls == NULL || now >= ls->refused_log_ms + 1000) {
            if (ls != NULL) {
                ls->refused_log_ms = now;
            }
            log_warn("leases: expiry refused by Redis: %.*s", (int)(len > 160 ? 160 : len), reply);
        }
    }
    freeReplyObject(rr);
}

static void expire_done(link *l, request *r, const char *reply, size_t len)
{
    struct leases *ls = l->f->leases;
    if (ls == NULL) {
        return;
    }
    if (is_noscript(reply, len) && again_as_eval(l, r, S_EXPIRE, expire_done)) {
        return; /* still in flight */
    }
    round_reply(ls);
    expire_result(l, (int)r->arg, reply, len);
}

/* The expiry of a client's leases when it hung up. */
static void gone_done(link *l, request *r, const char *reply, size_t len)
{
    if (is_noscript(reply, len) && again_as_eval(l, r, S_EXPIRE, gone_done)) {
        return;
    }
    if (l->f->leases != NULL) {
        expire_result(l, (int)r->arg, reply, len);
    }
}

/* Queue the expiry script for entry e's processing list p (queue q, dead
 * letter dead) on l: a round when who is NULL, else the n items of it[]
 * (lengths il[]) consumer who took, when it hung up. */
static void expire_call(link *l, int e, const char *p, size_t plen, const char *q, size_t qlen,
                        const char *dead, const char *who, const char *const *it, const size_t *il,
                        size_t n, req_done_cb done)
{
    struct leases *ls = l->f->leases;
    const config_queue *cq = &l->f->cfg->queues[e];
    char ttl[24], batch[24], maxa[24], lease[24], after[24], pause[24];
    snprintf(ttl, sizeof(ttl), "%llu", (unsigned long long)(ls->interval * 4 + 1000));
    snprintf(batch, sizeof(batch), "%d", BATCH);
    snprintf(maxa, sizeof(maxa), "%llu", (unsigned long long)cq->max_attempts);
    snprintf(lease, sizeof(lease), "%llu", (unsigned long long)cq->lease_ms);
    snprintf(after, sizeof(after), "%llu", (unsigned long long)cq->backoff_after);
    snprintf(pause, sizeof(pause), "%llu", (unsigned long long)cq->backoff_pause_ms);
    buf leases, attempts, cons, lock, fails, b;
    buf_init(&leases);
    buf_init(&attempts);
    buf_init(&cons);
    buf_init(&lock);
    buf_init(&fails);
    buf_init(&b);
    companions(q, qlen, p, plen, &leases, &attempts, &cons);
    lease_key(&lock, "leases", q, qlen, NULL, 0);
    buf_append(&lock, ":lock", 5);
    lease_key(&fails, "consumers", q, qlen, NULL, 0);
    buf_append(&fails, ":failures", 9);
    script_head(&b, l, S_EXPIRE, 16 + (who != NULL ? 1 + n : 0), 0);
    buf_append_bulk(&b, "8", 1);
    buf_append_bulk(&b, p, plen);
    buf_append_bulk(&b, buf_head(&leases), buf_used(&leases));
    buf_append_bulk(&b, buf_head(&attempts), buf_used(&attempts));
    buf_append_bulk(&b, q, qlen);
    buf_append_bulk(&b, dead, strlen(dead));
    buf_append_bulk(&b, buf_head(&lock), buf_used(&lock));
    buf_append_bulk(&b, buf_head(&cons), buf_used(&cons));
    buf_append_bulk(&b, buf_head(&fails), buf_used(&fails));
    buf_append_bulk(&b, ls->owner, strlen(ls->owner));
    buf_append_bulk(&b, ttl, strlen(ttl));
    buf_append_bulk(&b, batch, strlen(batch));
    buf_append_bulk(&b, maxa, strlen(maxa));
    buf_append_bulk(&b, lease, strlen(lease));
    buf_append_bulk(&b, after, strlen(after));
    buf_append_bulk(&b, pause, strlen(pause));
    if (who != NULL) {
        buf_append_bulk(&b, who, strlen(who));
        for (size_t i = 0; i < n; i++) {
            buf_append_bulk(&b, it[i], il[i]);
        }
    }
    link_internal_bytes(l, buf_head(&b), buf_used(&b), done, e);
    buf_free(&b);
    buf_free(&lock);
    buf_free(&fails);
    buf_free(&cons);
    buf_free(&leases);
    buf_free(&attempts);
}

/* A round's expiry call for each processing list names[i] (lengths
 * lens[i]): on l, or in cluster mode on the master of its slot (a list
 * whose shard has no master now waits for the next round). */
static void expire_lists(ferry *f, link *l, char *const *names, const size_t *lens, size_t n)
{
    struct leases *ls = f->leases;
    const config *cfg = f->cfg;
    for (size_t i = 0; i < n; i++) {
        const char *q;
        size_t qlen;
        char dead[1024];
        int e = entry_of_processing(cfg, names[i], lens[i], &q, &qlen);
        if (e < 0 || apply(cfg->queues[e].dead_letter, q, qlen, dead, sizeof(dead)) == 0) {
            continue;
        }
        link *to = f->cluster != NULL ? clustermap_key_link(f, names[i], lens[i], NULL, 0, 2) : l;
        if (to == NULL) {
            continue;
        }
        ls->in_flight++;
        expire_call(to, e, names[i], lens[i], q, qlen, dead, NULL, NULL, NULL, 0, expire_done);
    }
}

static void forget_known(struct leases *ls)
{
    for (size_t i = 0; i < ls->nknown; i++) {
        free(ls->known[i]);
    }
    free(ls->known);
    free(ls->knownlen);
    ls->known = NULL;
    ls->knownlen = NULL;
    ls->nknown = 0;
}

static void registry_done(link *l, request *r, const char *reply, size_t len)
{
    ferry *f = l->f;
    struct leases *ls = f->leases;
    (void)r;
    if (ls == NULL) {
        return;
    }
    round_reply(ls);
    if (reply == NULL || l->state != LINK_READY) {
        if (f->cluster != NULL && !f->stopping) {
            expire_lists(f, NULL, ls->known, ls->knownlen, ls->nknown);
        }
        return;
    }
    redisReply *rr = link_parse_reply(reply, len);
    if (rr == NULL) {
        return;
    }
    if (rr->type == REDIS_REPLY_ARRAY) {
        size_t n = 0;
        char **names = xcalloc(rr->elements + 1, sizeof(*names));
        size_t *lens = xcalloc(rr->elements + 1, sizeof(*lens));
        for (size_t i = 0; i < rr->elements; i++) {
            const redisReply *p = rr->element[i];
            if (p->type == REDIS_REPLY_STRING) {
                names[n] = xmalloc(p->len + 1);
                memcpy(names[n], p->str, p->len);
                names[n][p->len] = '\0';
                lens[n++] = p->len;
            }
        }
        expire_lists(f, l, names, lens, n);
        /* Cluster mode: kept for rounds while the registry's master is not up. */
        forget_known(ls);
        ls->known = names;
        ls->knownlen = lens;
        ls->nknown = n;
        if (f->cluster == NULL) {
            forget_known(ls);
        }
    }
    freeReplyObject(rr);
}

void lease_client_gone(session *s)
{
    ferry *f = s->f;
    struct lease_held *h = session_extra_r(s)->leases_held;
    const config *cfg = f->cfg;
    if (h == NULL) {
        return;
    }
    link *l = NULL; /* cluster mode: each processing list's own master, below */
    int cluster = f->cluster != NULL;
    if (f->leases != NULL && !f->stopping && !cluster && f->up != NULL && f->up->state == UP_UP) {
        l = upstream_shared(f->up, s->ident, s->id, s->proto);
    }
    if (f->leases == NULL || f->stopping || (!cluster && (l == NULL || l->state != LINK_READY))) {
        if (h->n > 0) {
            log_info("leases: client %llu %s left holding %zu lease(s); no master to expire them "
                     "now: their deadline does",
                     (unsigned long long)s->id, session_peer(s), h->n);
        }
        held_free(s);
        return;
    }
    const char *it[BATCH];
    size_t il[BATCH];
    /* One call per processing list and consumer, of at most BATCH items. */
    while (h->n > 0) {
        const held_lease *first = &h->v[h->n - 1];
        const char *q;
        size_t qlen, n = 0;
        char dead[1024];
        int e = entry_of_processing(cfg, first->bytes, first->plen, &q, &qlen);
        if (e < 0 || apply(cfg->queues[e].dead_letter, q, qlen, dead, sizeof(dead)) == 0) {
            h->n--;
            free(h->v[h->n].bytes);
            continue;
        }
        for (size_t i = h->n; i-- > 0 && n < BATCH;) {
            const held_lease *hl = &h->v[i];
            if (hl->plen == first->plen && hl->wlen == first->wlen &&
                memcmp(hl->bytes, first->bytes, hl->plen) == 0 &&
                memcmp(hl->bytes + hl->plen + hl->ilen, first->bytes + first->plen + first->ilen,
                       hl->wlen) == 0) {
                it[n] = hl->bytes + hl->plen;
                il[n] = hl->ilen;
                n++;
            }
        }
        link *to = f->cluster != NULL ? clustermap_key_link(f, first->bytes, first->plen, s->ident,
                                                            s->id, s->proto)
                                      : l;
        if (to != NULL) {
            log_debug("leases: client %llu %s left holding %zu lease(s) of %.*s: expired now",
                      (unsigned long long)s->id, session_peer(s), n,
                      (int)(first->plen > 200 ? 200 : first->plen), first->bytes);
            expire_call(to, e, first->bytes, first->plen, q, qlen, dead,
                        first->bytes + first->plen + first->ilen, it, il, n, gone_done);
        } else {
            log_info("leases: client %llu %s left holding %zu lease(s) of %.*s; no master to "
                     "expire them now: their deadline does",
                     (unsigned long long)s->id, session_peer(s), n,
                     (int)(first->plen > 200 ? 200 : first->plen), first->bytes);
        }
        /* Those n go: the same matches, dropped from the end. */
        char *pkey = xmalloc(first->plen + first->wlen + 1);
        size_t plen = first->plen, wlen = first->wlen;
        memcpy(pkey, first->bytes, plen);
        memcpy(pkey + plen, first->bytes + first->plen + first->ilen, wlen);
        for (size_t i = h->n, dropped = 0; i-- > 0 && dropped < n;) {
            held_lease *hl = &h->v[i];
            if (hl->plen == plen && hl->wlen == wlen && memcmp(hl->bytes, pkey, plen) == 0 &&
                memcmp(hl->bytes + hl->plen + hl->ilen, pkey + plen, wlen) == 0) {
                free(hl->bytes);
                h->v[i] = h->v[--h->n];
                dropped++;
            }
        }
        free(pkey);
    }
    held_free(s);
}

void lease_client_handed(session *s)
{
    held_free(s);
}

static void paused_done(link *l, request *r, const char *reply, size_t len)
{
    struct leases *ls = l->f->leases;
    (void)r;
    if (ls == NULL) {
        return;
    }
    ls->poll_in_flight = 0;
    if (reply == NULL) {
        return;
    }
    redisReply *rr = link_parse_reply(reply, len);
    if (rr == NULL) {
        return;
    }
    if (rr->type == REDIS_REPLY_ARRAY) {
        uint64_t now = uv_now(l->f->loop);
        ls->npaused = 0;
        for (size_t i = 0; i + 1 < rr->elements && ls->npaused < MAX_PAUSED; i += 2) {
            const redisReply *n = rr->element[i], *left = rr->element[i + 1];
            if (n->type != REDIS_REPLY_STRING || left->type != REDIS_REPLY_STRING) {
                continue;
            }
            paused_consumer *pc = &ls->paused[ls->npaused++];
            snprintf(pc->name, sizeof(pc->name), "%.*s", (int)n->len, n->str);
            pc->until = now + strtoull(left->str, NULL, 10);
        }
    }
    freeReplyObject(rr);
}

int lease_paused(session *s, const request *r, uint64_t now, uint64_t *until)
{
    struct leases *ls = s->f->leases;
    const config *cfg = s->f->cfg;
    const char *av[MAX_ARGS];
    size_t al[MAX_ARGS];
    if (ls == NULL || !ls->backoff || ls->npaused == 0 || r->cmd == NULL) {
        return 0;
    }
    const char *n = r->cmd->name;
    if (!is_move(r->cmd) && strcmp(n, "lpop") != 0 && strcmp(n, "rpop") != 0 &&
        strcmp(n, "blpop") != 0 && strcmp(n, "brpop") != 0) {
        return 0;
    }
    if (args_of(r, av, al) < 2) {
        return 0;
    }
    int e = queues_match(cfg, av[1], al[1]);
    if (e < 0 || cfg->queues[e].backoff_after == 0) {
        return 0;
    }
    char who[128];
    consumer_of(s, who, sizeof(who));
    for (int i = 0; i < ls->npaused; i++) {
        if (ls->paused[i].until > now && strcmp(ls->paused[i].name, who) == 0) {
            *until = ls->paused[i].until;
            return 1;
        }
    }
    return 0;
}

size_t lease_npaused(const ferry *f, uint64_t now)
{
    const struct leases *ls = f->leases;
    size_t n = 0;
    for (int i = 0; ls != NULL && i < ls->npaused; i++) {
        n += ls->paused[i].until > now;
    }
    return n;
}

void lease_tick(ferry *f, uint64_t now)
{
    struct leases *ls = f->leases;
    link *l = NULL;
    if (ls == NULL || f->stopping) {
        return;
    }
    if (f->cluster == NULL) {
        upstream *up = f->up;
        if (up == NULL || up->state != UP_UP) {
            return;
        }
        l = upstream_shared(up, NULL, 0, 2);
        if (l == NULL || l->state != LINK_READY) {
            return;
        }
    }
    if (f->cluster != NULL && ls->nunreg > 0 &&
        clustermap_key_link(f, REGISTRY, strlen(REGISTRY), NULL, 0, 2) != NULL) {
        int n = ls->nunreg;
        char *names[MAX_UNREG];
        size_t lens[MAX_UNREG];
        memcpy(names, ls->unreg, sizeof(names[0]) * (size_t)n);
        memcpy(lens, ls->unreglen, sizeof(lens[0]) * (size_t)n);
        ls->nunreg = 0;
        for (int i = 0; i < n; i++) {
            cluster_register(f, names[i], lens[i]);
            free(names[i]);
        }
    }
    /* Cluster mode: the paused set and the registry each on their slot's master. */
    link *pl = f->cluster != NULL ? clustermap_key_link(f, PAUSED, strlen(PAUSED), NULL, 0, 2) : l;
    if (ls->backoff && pl != NULL && !ls->poll_in_flight && now >= ls->next_poll_ms) {
        const char *argv[4] = {"EVAL", paused_lua, "1", PAUSED};
        ls->next_poll_ms = now + PAUSE_POLL_MS;
        ls->poll_in_flight = 1;
        link_internal_sure(pl, argv, 4, paused_done, 0);
    }
    if (!ls->expires || ls->in_flight > 0 || now < ls->next_ms) {
        return;
    }
    link *rl =
        f->cluster != NULL ? clustermap_key_link(f, REGISTRY, strlen(REGISTRY), NULL, 0, 2) : l;
    if (rl == NULL && ls->nknown == 0) {
        return;
    }
    ls->next_ms = now + ls->interval;
    ls->round++;
    if (rl == NULL) {
        /* The registry's master is not up: the lists it named last time. */
        expire_lists(f, NULL, ls->known, ls->knownlen, ls->nknown);
        return;
    }
    const char *argv[2] = {"SMEMBERS", REGISTRY};
    ls->in_flight++;
    link_internal_sure(rl, argv, 2, registry_done, 0);
}

void lease_open(ferry *f)
{
    const config *cfg = f->cfg;
    uint64_t interval = 1000;
    int any = 0, backoff = 0;
    for (int i = 0; i < cfg->nqueues; i++) {
        if (cfg->queues[i].processing != NULL) {
            any = 1;
            backoff |= cfg->queues[i].backoff_after > 0;
            if (cfg->queues[i].lease_ms / 4 < interval) {
                interval = cfg->queues[i].lease_ms / 4;
            }
        }
    }
    if (!any) {
        return;
    }
    struct leases *ls = xcalloc(1, sizeof(*ls));
    ls->f = f;
    ls->expires = f->worker_index == 0;
    ls->backoff = backoff;
    ls->interval = interval < 50 ? 50 : interval;
    char host[64];
    size_t hl = sizeof(host);
    if (uv_os_gethostname(host, &hl) != 0) {
        snprintf(host, sizeof(host), "?");
    }
    snprintf(ls->owner, sizeof(ls->owner), "%.32s:%ld:%llu", host, (long)uv_os_getpid(),
             (unsigned long long)uv_hrtime());
    f->leases = ls;
}

void lease_free(ferry *f)
{
    if (f->leases != NULL) {
        forget_known(f->leases);
        for (int i = 0; i < f->leases->nunreg; i++) {
            free(f->leases->unreg[i]);
        }
    }
    free(f->leases);
    f->leases = NULL;
}
