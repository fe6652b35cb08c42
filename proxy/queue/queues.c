/* queues.c - queue depths (queues: in the configuration).
 *
 * Counting: router_classify hands every request to queues_count, which adds
 * one push or pop to the entry its key matches (f->stats, summed over the
 * loops when the stats are read).
 *
 * Sampling, main loop only, one round every queue_depths.interval_ms while
 * the master view is UP, on one of ferry's shared links:
 *
 *   SCAN <cursor> MATCH <glob> COUNT <keys_per_round>  (one glob at a time)
 *     -> the keys it names join 'pending'
 *   TYPE <key>, for at most keys_per_round pending keys
 *     -> LLEN / ZCARD / XLEN by type; "none" (the key is gone) drops it
 *
 * When a glob's cursor comes back to 0 its pass is over: keys of that glob
 * SCAN did not name in the pass are gone and are dropped. The master is
 * never asked for more than one SCAN and keys_per_round TYPE and length
 * calls a round; a lost link or a switch ends the round (its replies are
 * dropped) and the next one starts over on the new master.
 *
 * Cluster mode: a glob's pass is a SCAN of every shard's master in turn
 * (in the order of their first slots), and each TYPE and length call goes
 * to the master of its key's slot. A shard whose master is not up is
 * passed over in that pass, and then no key of the glob is dropped at its
 * end (they may be on that shard); a shard's master that changed starts
 * its SCAN over. */
#include "queues.h"

#include <hiredis/hiredis.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clustermap.h"
#include "glob.h"
#include "link.h"
#include "log.h"
#include "slot.h"
#include "upstream.h"

#define ROUND_SHIFT 24 /* request->arg: round << ROUND_SHIFT | index in the batch */

typedef struct qkey {
    char *key;           /* NUL-terminated (keys holding a NUL byte are skipped) */
    int queue;           /* entry of cfg->queues */
    int glob;            /* the glob of that entry SCAN found it with */
    const char *type;    /* "list", "zset", "stream", or NULL before the first sample */
    uint64_t length;     /* last sampled length */
    uint64_t sampled_ms; /* uv_now() of that sample, 0 = not yet */
    uint64_t seen_pass;  /* pass of its glob in which SCAN last named it */
} qkey;

struct queues {
    ferry *f;
    qkey *keys; /* tracked keys, at most queue_depths.max_keys */
    size_t nkeys, cap;
    char **pending; /* keys SCAN named, waiting for their TYPE */
    size_t npending, pending_cap;
    char **batch; /* this round's keys (index = request arg's low bits) */
    size_t nbatch;
    int cur_q, cur_g;                                         /* the glob being scanned */
    char cursor[32];                                          /* its SCAN cursor */
    uint64_t gpass[CONFIG_MAX_QUEUES][CONFIG_MAX_QUEUE_KEYS]; /* each glob's pass */
    int in_flight;                                            /* replies the round awaits */
    uint64_t round;                                           /* the round's number */
    uint64_t round_epoch;                                     /* master epoch it runs on */
    uint64_t next_round_ms;
    int active;
    uint64_t passes, keys_probed;
    int shard;               /* cluster mode: first slot of the shard SCAN is on, -1 none yet */
    int skipped;             /* cluster mode: a shard was passed over in this glob's pass */
    const upstream *scanned; /* cluster mode: the master view of the last SCAN */
};

/* ---------------------------------------------------------------- counting */

int queues_match(const config *cfg, const char *key, size_t len)
{
    for (int q = 0; q < cfg->nqueues; q++) {
        for (int g = 0; g < cfg->queues[q].nkeys; g++) {
            const char *p = cfg->queues[q].keys[g];
            if (glob_match(p, strlen(p), key, len)) {
                return q;
            }
        }
    }
    return -1;
}

/* The first key of argv[from..to) that is a queue's, or -1. */
static int match_any(const config *cfg, const resp_arg *argv, size_t from, size_t to)
{
    for (size_t i = from; i < to; i++) {
        int q = queues_match(cfg, argv[i].ptr, argv[i].len);
        if (q >= 0) {
            return q;
        }
    }
    return -1;
}

static void count(uint64_t *counters, int q)
{
    if (q >= 0 && q < CONFIG_MAX_QUEUES) {
        counters[q]++;
    }
}

/* The numkeys-prefixed keys of LMPOP/ZMPOP (at) and their blocking forms. */
static int match_numkeys(const config *cfg, const resp_arg *argv, size_t argc, size_t at)
{
    char tmp[24];
    if (at >= argc || argv[at].len == 0 || argv[at].len >= sizeof(tmp)) {
        return -1;
    }
    memcpy(tmp, argv[at].ptr, argv[at].len);
    tmp[argv[at].len] = '\0';
    char *end = NULL;
    unsigned long long n = strtoull(tmp, &end, 10);
    if (end == NULL || *end != '\0' || n == 0 || n > argc - at - 1) {
        return -1;
    }
    return match_any(cfg, argv, at + 1, at + 1 + (size_t)n);
}

void queues_count(ferry *f, const command *cmd, const resp_arg *argv, size_t argc)
{
    const config *cfg = f->cfg;
    const char *n = cmd->name;
    ferry_stats *st = &f->stats;

    if (cfg->nqueues == 0 || argc < 2) {
        return;
    }
    if (strcmp(n, "lpush") == 0 || strcmp(n, "rpush") == 0 || strcmp(n, "lpushx") == 0 ||
        strcmp(n, "rpushx") == 0 || strcmp(n, "zadd") == 0 || strcmp(n, "xadd") == 0) {
        count(st->queue_pushes, queues_match(cfg, argv[1].ptr, argv[1].len));
    } else if (strcmp(n, "lpop") == 0 || strcmp(n, "rpop") == 0 || strcmp(n, "zpopmin") == 0 ||
               strcmp(n, "zpopmax") == 0) {
        count(st->queue_pops, queues_match(cfg, argv[1].ptr, argv[1].len));
    } else if (strcmp(n, "blpop") == 0 || strcmp(n, "brpop") == 0 || strcmp(n, "bzpopmin") == 0 ||
               strcmp(n, "bzpopmax") == 0) {
        count(st->queue_pops, match_any(cfg, argv, 1, argc - 1));
    } else if (strcmp(n, "rpoplpush") == 0 || strcmp(n, "lmove") == 0 ||
               strcmp(n, "brpoplpush") == 0 || strcmp(n, "blmove") == 0) {
        count(st->queue_pops, queues_match(cfg, argv[1].ptr, argv[1].len));
        if (argc >= 3) {
            count(st->queue_pushes, queues_match(cfg, argv[2].ptr, argv[2].len));
        }
    } else if (strcmp(n, "lmpop") == 0 || strcmp(n, "zmpop") == 0) {
        count(st->queue_pops, match_numkeys(cfg, argv, argc, 1));
    } else if (strcmp(n, "blmpop") == 0 || strcmp(n, "bzmpop") == 0) {
        count(st->queue_pops, match_numkeys(cfg, argv, argc, 2));
    }
}

/* ---------------------------------------------------------------- sampling */

static qkey *find_key(struct queues *qs, const char *key)
{
    for (size_t i = 0; i < qs->nkeys; i++) {
        if (strcmp(qs->keys[i].key, key) == 0) {
            return &qs->keys[i];
        }
    }
    return NULL;
}

static void drop_key(struct queues *qs, qkey *k)
{
    free(k->key);
    *k = qs->keys[--qs->nkeys];
}

static void free_batch(struct queues *qs)
{
    for (size_t i = 0; i < qs->nbatch; i++) {
        free(qs->batch[i]);
    }
    qs->nbatch = 0;
}

/* A key SCAN named in the pass of glob (q, g). */
static void saw_key(struct queues *qs, const char *key, size_t len, int q, int g)
{
    if (strlen(key) != len) {
        return; /* a NUL byte in the name: not sampled */
    }
    qkey *k = find_key(qs, key);
    if (k == NULL) {
        if (qs->nkeys >= qs->f->cfg->queue_depths_max_keys) {
            return;
        }
        if (qs->nkeys == qs->cap) {
            qs->cap = qs->cap == 0 ? 64 : qs->cap * 2;
            qs->keys = xrealloc(qs->keys, qs->cap * sizeof(*qs->keys));
        }
        k = &qs->keys[qs->nkeys++];
        memset(k, 0, sizeof(*k));
        k->key = xstrdup(key);
        k->queue = q;
        k->glob = g;
    }
    if (k->queue == q && k->glob == g) {
        k->seen_pass = qs->gpass[q][g];
    }
    if (qs->npending == qs->pending_cap) {
        qs->pending_cap = qs->pending_cap == 0 ? 64 : qs->pending_cap * 2;
        qs->pending = xrealloc(qs->pending, qs->pending_cap * sizeof(*qs->pending));
    }
    qs->pending[qs->npending++] = xstrdup(key);
}

/* The pass of the current glob is over: drop its keys SCAN did not name,
 * and move on to the next glob. */
static void end_pass(struct queues *qs)
{
    const config *cfg = qs->f->cfg;
    int q = qs->cur_q, g = qs->cur_g;
    for (size_t i = qs->nkeys; i-- > 0 && !qs->skipped;) {
        qkey *k = &qs->keys[i];
        if (k->queue == q && k->glob == g && k->seen_pass != qs->gpass[q][g]) {
            drop_key(qs, k);
        }
    }
    qs->skipped = 0;
    qs->gpass[q][g]++;
    snprintf(qs->cursor, sizeof(qs->cursor), "0");
    if (++qs->cur_g >= cfg->queues[q].nkeys) {
        qs->cur_g = 0;
        if (++qs->cur_q >= cfg->nqueues) {
            qs->cur_q = 0;
            qs->passes++;
        }
    }
}

static void reply_arrived(struct queues *qs)
{
    if (qs->in_flight > 0 && --qs->in_flight == 0) {
        free_batch(qs);
    }
}

/* Is this reply of the round in flight, on the master it began on (cluster
 * mode: a TYPE or length from any master; a SCAN checks its own)? */
static struct queues *round_of(link *l, request *r, const char *reply)
{
    struct queues *qs = l->f->queues;
    if (qs == NULL || (uint64_t)r->arg >> ROUND_SHIFT != (qs->round & 0xffffffffu)) {
        return NULL;
    }
    if (l->f->cluster != NULL) {
        if (reply == NULL) {
            reply_arrived(qs);
            return NULL;
        }
        return qs;
    }
    if (reply == NULL || l->f->up == NULL || l->f->up->epoch != qs->round_epoch) {
        reply_arrived(qs); /* lost or stale: the round ends without it */
        return NULL;
    }
    return qs;
}

static void len_done(link *l, request *r, const char *reply, size_t len)
{
    struct queues *qs = round_of(l, r, reply);
    if (qs == NULL) {
        return;
    }
    size_t idx = (size_t)(r->arg & ((1ll << ROUND_SHIFT) - 1));
    if (idx < qs->nbatch && len > 1 && reply[0] == ':') {
        qkey *k = find_key(qs, qs->batch[idx]);
        if (k != NULL) {
            k->length = strtoull(reply + 1, NULL, 10);
            k->sampled_ms = uv_now(l->f->loop);
        }
    }
    reply_arrived(qs);
}

static void type_done(link *l, request *r, const char *reply, size_t len)
{
    struct queues *qs = round_of(l, r, reply);
    if (qs == NULL) {
        return;
    }
    size_t idx = (size_t)(r->arg & ((1ll << ROUND_SHIFT) - 1));
    if (idx < qs->nbatch && len > 1 && reply[0] == '+') {
        qkey *k = find_key(qs, qs->batch[idx]);
        const char *cmd = NULL;
        static const char *const types[][2] = {
            {"list", "LLEN"}, {"zset", "ZCARD"}, {"stream", "XLEN"}};
        for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); i++) {
            size_t tl = strlen(types[i][0]);
            if (len >= tl + 3 && memcmp(reply + 1, types[i][0], tl) == 0 && reply[1 + tl] == '\r') {
                cmd = types[i][1];
                if (k != NULL) {
                    k->type = types[i][0];
                }
            }
        }
        if (cmd != NULL && k != NULL) {
            const char *argv[2] = {cmd, qs->batch[idx]};
            qs->in_flight++;
            qs->keys_probed++;
            link_internal_sure(l, argv, 2, len_done, r->arg);
        } else if (k != NULL) {
            drop_key(qs, k); /* gone ("none"), or not a queue's type */
        }
    }
    reply_arrived(qs);
}

/* Cluster mode: a ready shared link to the master of key's slot, or NULL. */
static link *key_link(ferry *f, const char *key)
{
    upstream *up = clustermap_route(f->cluster, slot_of_key(key, strlen(key)));
    link *l = up != NULL && up->state == UP_UP ? upstream_shared(up, NULL, 0, 2) : NULL;
    return l != NULL && l->state == LINK_READY ? l : NULL;
}

/* Ask TYPE of up to keys_per_round pending keys (on l; cluster mode: each
 * on its slot's master, a key whose master is not up waits for its next
 * SCAN). */
static void probe_pending(struct queues *qs, link *l)
{
    size_t n = qs->npending;
    size_t max = qs->f->cfg->queue_depths_keys_per_round;
    if (n > max) {
        n = max;
    }
    free_batch(qs);
    if (n == 0) {
        return;
    }
    qs->batch = xrealloc(qs->batch, n * sizeof(*qs->batch));
    for (size_t i = 0; i < n; i++) {
        qs->batch[i] = qs->pending[i];
    }
    qs->nbatch = n;
    memmove(qs->pending, qs->pending + n, (qs->npending - n) * sizeof(*qs->pending));
    qs->npending -= n;
    for (size_t i = 0; i < n; i++) {
        const char *argv[2] = {"TYPE", qs->batch[i]};
        link *to = qs->f->cluster != NULL ? key_link(qs->f, qs->batch[i]) : l;
        if (to == NULL) {
            continue;
        }
        qs->in_flight++;
        link_internal_sure(to, argv, 2, type_done,
                           (long long)((qs->round & 0xffffffffu) << ROUND_SHIFT | i));
    }
}

/* Cluster mode: the SCAN of the current shard is over; the next shard, or
 * after the last one the end of the glob's pass. */
static void next_shard(struct queues *qs)
{
    int next = clustermap_next_first_slot(qs->f->cluster, qs->shard);
    snprintf(qs->cursor, sizeof(qs->cursor), "0");
    qs->scanned = NULL;
    if (next < 0) {
        end_pass(qs);
        next = clustermap_next_first_slot(qs->f->cluster, -1);
    }
    qs->shard = next;
}

static void scan_done(link *l, request *r, const char *reply, size_t len)
{
    struct queues *qs = round_of(l, r, reply);
    if (qs == NULL) {
        return;
    }
    if (l->f->cluster != NULL && (l->up != qs->scanned || l->up->epoch != qs->round_epoch)) {
        snprintf(qs->cursor, sizeof(qs->cursor), "0"); /* a new master: its SCAN starts over */
        qs->scanned = NULL;
        reply_arrived(qs);
        return;
    }
    redisReply *rr = link_parse_reply(reply, len);
    if (rr != NULL && rr->type == REDIS_REPLY_ARRAY && rr->elements == 2 &&
        rr->element[0]->type == REDIS_REPLY_STRING && rr->element[1]->type == REDIS_REPLY_ARRAY) {
        for (size_t i = 0; i < rr->element[1]->elements; i++) {
            const redisReply *e = rr->element[1]->element[i];
            if (e->type == REDIS_REPLY_STRING) {
                saw_key(qs, e->str, e->len, qs->cur_q, qs->cur_g);
            }
        }
        snprintf(qs->cursor, sizeof(qs->cursor), "%s", rr->element[0]->str);
        if (strcmp(qs->cursor, "0") == 0) {
            if (l->f->cluster != NULL) {
                next_shard(qs);
            } else {
                end_pass(qs);
            }
        }
        probe_pending(qs, l);
    } else {
        log_warn("queue depths: SCAN on %s failed: %.*s",
                 l->f->cluster != NULL ? l->up->name : l->f->up->name, (int)(len > 120 ? 120 : len),
                 reply);
    }
    if (rr != NULL) {
        freeReplyObject(rr);
    }
    reply_arrived(qs);
}

/* One round: pending keys first; a SCAN step only when none are left. */
static void start_round(struct queues *qs, link *l)
{
    const config *cfg = qs->f->cfg;
    char count[24];
    qs->round++;
    if (qs->f->cluster != NULL) {
        if (qs->npending > 0) {
            probe_pending(qs, NULL);
            return;
        }
        if (qs->shard < 0) {
            qs->shard = clustermap_next_first_slot(qs->f->cluster, -1);
        }
        upstream *up = qs->shard >= 0 ? clustermap_route(qs->f->cluster, qs->shard) : NULL;
        l = up != NULL && up->state == UP_UP ? upstream_shared(up, NULL, 0, 2) : NULL;
        if (l == NULL || l->state != LINK_READY) {
            if (qs->shard >= 0) {
                qs->skipped = 1; /* no master now: passed over, its keys kept */
                next_shard(qs);
            }
            return;
        }
        if (up != qs->scanned || up->epoch != qs->round_epoch) {
            snprintf(qs->cursor, sizeof(qs->cursor), "0");
        }
        qs->scanned = up;
        qs->round_epoch = up->epoch;
    } else {
        qs->round_epoch = qs->f->up->epoch;
    }
    if (qs->npending > 0) {
        probe_pending(qs, l);
        return;
    }
    snprintf(count, sizeof(count), "%zu", cfg->queue_depths_keys_per_round);
    const char *argv[6] = {"SCAN",  qs->cursor, "MATCH", cfg->queues[qs->cur_q].keys[qs->cur_g],
                           "COUNT", count};
    qs->in_flight++;
    link_internal_sure(l, argv, 6, scan_done,
                       (long long)((qs->round & 0xffffffffu) << ROUND_SHIFT));
}

void queues_tick(ferry *f, uint64_t now)
{
    struct queues *qs = f->queues;
    upstream *up = f->up;
    if (qs != NULL && !f->stopping && f->cluster != NULL) {
        /* Cluster mode: while any master is up; each call finds its own. */
        upstream *any = clustermap_route(f->cluster, -1);
        int usable = any != NULL && any->state == UP_UP;
        if (usable != qs->active) {
            qs->active = usable;
            log_info("queue depths: sampling %s",
                     usable ? "runs on the cluster's masters" : "paused (no master)");
        }
        if (usable && qs->in_flight == 0 && now >= qs->next_round_ms) {
            qs->next_round_ms = now + f->cfg->queue_depths_interval_ms;
            start_round(qs, NULL);
        }
        return;
    }
    if (qs == NULL || f->stopping || up == NULL) {
        return;
    }
    link *l = up->state == UP_UP ? upstream_shared(up, NULL, 0, 2) : NULL;
    int usable = l != NULL && l->state == LINK_READY;
    if (usable != qs->active) {
        qs->active = usable;
        log_info("queue depths: sampling %s", usable ? "runs on the master" : "paused (no master)");
        if (!usable) {
            for (size_t i = 0; i < qs->npending; i++) {
                free(qs->pending[i]);
            }
            qs->npending = 0;
            snprintf(qs->cursor, sizeof(qs->cursor), "0"); /* the new master starts over */
        }
    }
    if (!usable || qs->in_flight > 0 || now < qs->next_round_ms) {
        return;
    }
    if (qs->round_epoch != up->epoch) {
        snprintf(qs->cursor, sizeof(qs->cursor), "0");
    }
    qs->next_round_ms = now + f->cfg->queue_depths_interval_ms;
    start_round(qs, l);
}

void queues_open(ferry *f)
{
    if (f->cfg->nqueues == 0 || f->worker_index != 0) {
        return;
    }
    struct queues *qs = xcalloc(1, sizeof(*qs));
    qs->f = f;
    qs->shard = -1;
    snprintf(qs->cursor, sizeof(qs->cursor), "0");
    f->queues = qs;
}

void queues_free(ferry *f)
{
    struct queues *qs = f->queues;
    if (qs == NULL) {
        return;
    }
    for (size_t i = 0; i < qs->nkeys; i++) {
        free(qs->keys[i].key);
    }
    for (size_t i = 0; i < qs->npending; i++) {
        free(qs->pending[i]);
    }
    free_batch(qs);
    free(qs->batch);
    free(qs->pending);
    free(qs->keys);
    free(qs);
    f->queues = NULL;
}

size_t queues_nkeys(const ferry *f)
{
    return f->queues != NULL ? f->queues->nkeys : 0;
}

int queues_key(const ferry *f, size_t i, queue_key_view *v)
{
    const struct queues *qs = f->queues;
    if (qs == NULL || i >= qs->nkeys) {
        return 0;
    }
    const qkey *k = &qs->keys[i];
    v->key = k->key;
    v->queue = k->queue;
    v->type = k->type != NULL ? k->type : "";
    v->length = k->length;
    v->sampled_ms = k->sampled_ms;
    return 1;
}

void queues_sampler(const ferry *f, queue_sampler_view *v)
{
    const struct queues *qs = f->queues;
    memset(v, 0, sizeof(*v));
    if (qs != NULL) {
        v->active = qs->active;
        v->rounds = qs->round;
        v->passes = qs->passes;
        v->keys_probed = qs->keys_probed;
        v->epoch = qs->round_epoch;
    }
}
