/* replay.c - the fallback store's rows back to Redis once a master is UP
 * again; outage.c serves the queue from the store while none is, and both
 * share struct outage (outage_int.h). The main loop alone replays.
 *
 * Once a master is UP (durability asserted), rows are read in id order and
 * applied per key by one Lua script that also records, in the same atomic
 * step, the last row id applied for that key in a ferry-owned hash
 * (ferry:fallback:<host>:<path>). A script run twice (a crash, a lost
 * reply, a failover) applies nothing the second time; a failover that loses
 * the script's effect loses the marker with it. Rows are deleted only once
 * Redis acknowledged them (and replicas_ack confirmed them). Until a key's
 * rows are replayed, new writes to that key wait (outage_blocks). A key
 * Redis refuses (WRONGTYPE) is logged and retried with back-off; other keys
 * go on.
 *
 * A key skipped in a pass (refused and in back-off, or held, below) stays
 * skipped until the pass ends (the cursor back at 0): its later rows must
 * not be replayed before its earlier ones, whose ids the marker would then
 * pass over.
 *
 * With durability.replicas_ack, a round's rows are deleted only once every
 * replica attached to the master (INFO replication's connected_slaves, any
 * state) confirmed them, not just replicas_ack of them: Sentinel may
 * promote any of them (it ranks by offsets up to a second old), and rows
 * deleted while the promoted one lacked them would be lost with it. Until
 * then they stay and are replayed again (the marker applies nothing
 * twice). A replica that confirms nothing for durability.replicas_ack_hold_ms
 * no longer holds deletes back (logged, counted as a replay error); every
 * replica confirming a round again restores the rule.
 *
 * Rows taken by a pop whose reply is not written yet (its client reads
 * slowly, or the master came back in between) hold their key back: the
 * reply is written (the rows are deleted) or never (they are back in the
 * queue), usually within milliseconds, and the key is replayed after. A key
 * held for REPLAY_TAKEN_WAIT_MS is replayed with its taken rows: never
 * lost, and the consumer that may still get them is counted
 * (fallback_replayed_taken) and logged.
 *
 * Cluster mode: one store for the whole cluster; a row's slot is its key's.
 * A round goes to one shard's master (the shard of the first key of the
 * batch whose master is UP), the batch's other keys are skipped for the
 * pass, and each key goes to the master serving its slot in the map now
 * (a key moved while it had rows: its new owner). The marker is one hash
 * per slot whose hash tag hashes to that slot (marker_name): a node runs a
 * script only on keys of one slot, and a reshard moves the marker with the
 * slot's keys. A script answered MOVED, ASK, CLUSTERDOWN or TRYAGAIN
 * applied nothing: its key waits for the next pass and the map is asked
 * again. */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "slot.h"
#include "clustermap.h"
#include "fallback.h"
#include "link.h"
#include "log.h"
#include "outage.h"
#include "outage_int.h"
#include "upstream.h"

#define REPLAY_BATCH 256              /* rows read per round */
#define REPLAY_ROUND_TIMEOUT_MS 30000 /* a round whose link broke is abandoned */
#define REPLAY_BACKOFF_MIN_MS 100
#define REPLAY_BACKOFF_MAX_MS 10000
#define REPLAY_TAKEN_WAIT_MS 1000 /* longest a key waits for its taken rows' replies */
#define REPLAY_IDLE_PASS_MS 1000  /* cluster mode: after a pass that applied nothing */

/* The replay script: KEYS[1] the marker hash, KEYS[2] the queue key,
 * KEYS[3..] the receipt keys of the held pushes among the rows; ARGV[1] the
 * last row id of this group, ARGV[2] '1' when the key's rows may go on in
 * the next round, then id, kind, member, score and receipt (an index in
 * KEYS, 0 none) per row. Checks the type first so a refused key applies
 * nothing. A held row (a push sent with its receipt to a master that did
 * not answer, then taken by the store) is pushed only where Redis lacks
 * the receipt: there, that push applied. Its receipt is deleted with the
 * push's last row (kept when the round may end inside it). */
static const char replay_script[] =
    "local done = tonumber(redis.call('HGET', KEYS[1], KEYS[2]) or '0')\n"
    "if done >= tonumber(ARGV[1]) then return 0 end\n"
    "local want = ARGV[4] == '3' and 'zset' or 'list'\n"
    "local t = redis.call('TYPE', KEYS[2]).ok\n"
    "if t ~= 'none' and t ~= want then\n"
    "  return redis.error_reply('WRONGTYPE ferry replay: ' .. KEYS[2] .. ' holds a ' .. t)\n"
    "end\n"
    "local n, held, last = 0, {}, 0\n"
    "for i = 3, #ARGV, 5 do\n"
    "  local r = tonumber(ARGV[i + 4])\n"
    "  last = r\n"
    "  if tonumber(ARGV[i]) > done then\n"
    "    if r > 0 and held[r] == nil then held[r] = redis.call('EXISTS', KEYS[r]) == 1 end\n"
    "    if r == 0 or not held[r] then\n"
    "      local k = ARGV[i + 1]\n"
    "      if k == '1' then redis.call('LPUSH', KEYS[2], ARGV[i + 2])\n"
    "      elseif k == '2' then redis.call('RPUSH', KEYS[2], ARGV[i + 2])\n"
    "      else redis.call('ZADD', KEYS[2], ARGV[i + 3], ARGV[i + 2]) end\n"
    "      n = n + 1\n"
    "    end\n"
    "  end\n"
    "end\n"
    "for r in pairs(held) do\n"
    "  if r ~= last or ARGV[2] ~= '1' then redis.call('DEL', KEYS[r]) end\n"
    "end\n"
    "redis.call('HSET', KEYS[1], KEYS[2], ARGV[1])\n"
    "return n\n";

static void replay_next(struct outage *o);

/* it is one of grp's key's rows. */
static int item_in(const fallback_item *it, const replay_group *grp)
{
    return it->keylen == grp->keylen && memcmp(it->key, grp->key, grp->keylen) == 0;
}

/* 1 + the place of it's receipt key among held[0..n), 0 if not there. */
static size_t held_index(const fallback_item **held, size_t n, const fallback_item *it)
{
    for (size_t h = 0; h < n; h++) {
        if (held[h]->rcptlen == it->rcptlen && memcmp(held[h]->rcpt, it->rcpt, it->rcptlen) == 0) {
            return h + 1;
        }
    }
    return 0;
}

/* The marker hash of a key's slot: Sentinel and fixed mode, the one hash
 * (o->marker); cluster mode, one per slot, its hash tag hashing to the
 * slot, so the script's two keys are on one node and the marker moves with
 * its slot in a reshard. The tag is slot_tag_key's, the smallest number
 * whose decimal digits hash to the slot: the same in every ferry and after
 * every restart, so a marker is found again. */
static void marker_name(const struct outage *o, int slot, char *out, size_t len)
{
    char tag[16];
    if (!o->f->cfg->has_cluster || slot_tag_key(slot, tag, sizeof(tag)) < 0) {
        snprintf(out, len, "%s", o->marker);
    } else {
        snprintf(out, len, "ferry:fallback:%s%s", tag, o->marker);
    }
}

static refused_key *refused_find(struct outage *o, const char *key, size_t len)
{
    for (refused_key *k = o->refused; k != NULL; k = k->next) {
        if (k->keylen == len && memcmp(k->key, key, len) == 0) {
            return k;
        }
    }
    return NULL;
}

static replay_key *key_find(replay_key *list, const char *key, size_t len)
{
    for (replay_key *k = list; k != NULL; k = k->next) {
        if (k->keylen == len && memcmp(k->key, key, len) == 0) {
            return k;
        }
    }
    return NULL;
}

static replay_key *key_add(replay_key **list, const char *key, size_t len, uint64_t now)
{
    replay_key *k = xcalloc(1, sizeof(*k));
    k->key = xstrndup(key, len);
    k->keylen = len;
    k->since_ms = now;
    k->next = *list;
    *list = k;
    return k;
}

/* Drop the keys not seen since pass (all of them: pass UINT64_MAX). */
static void keys_drop_older(replay_key **list, uint64_t pass)
{
    while (*list != NULL) {
        replay_key *k = *list;
        if (k->pass < pass) {
            *list = k->next;
            free(k->key);
            free(k);
        } else {
            list = &k->next;
        }
    }
}

void replay_free_keys(struct outage *o)
{
    keys_drop_older(&o->skipped, UINT64_MAX);
    keys_drop_older(&o->held, UINT64_MAX);
    while (o->shorts != NULL) {
        replay_short *sh = o->shorts;
        o->shorts = sh->next;
        free(sh);
    }
}

/* The replicas' record of up (made at its first round; views live until
 * ferry closes). */
static replay_short *short_of(struct outage *o, const upstream *up)
{
    for (replay_short *sh = o->shorts; sh != NULL; sh = sh->next) {
        if (sh->up == up) {
            return sh;
        }
    }
    replay_short *sh = xcalloc(1, sizeof(*sh));
    sh->up = up;
    sh->next = o->shorts;
    o->shorts = sh;
    return sh;
}

/* A new pass over the store: from the first row, no key skipped; keys not
 * seen holding taken rows in the pass that ends wait afresh next time. */
static void pass_restart(struct outage *o)
{
    o->cursor = 0;
    o->pass_applied = 0;
    keys_drop_older(&o->skipped, UINT64_MAX);
    keys_drop_older(&o->held, o->pass);
    o->pass++;
}

/* Does the replay leave key's rows of this batch for a later pass? It has
 * taken (the items of the batch say so: any_taken) and was skipped in this
 * pass, refused and in back-off, or held for taken rows not long enough. */
static int key_skipped(struct outage *o, const char *key, size_t len, int any_taken, uint64_t now)
{
    if (key_find(o->skipped, key, len) != NULL) {
        return 1;
    }
    refused_key *rk = refused_find(o, key, len);
    int skip = rk != NULL && now < rk->next_ms;
    if (!skip && any_taken) {
        replay_key *h = key_find(o->held, key, len);
        if (h == NULL) {
            h = key_add(&o->held, key, len, now);
        }
        h->pass = o->pass;
        skip = now - h->since_ms < REPLAY_TAKEN_WAIT_MS;
    }
    if (skip) {
        key_add(&o->skipped, key, len, now)->pass = o->pass;
    }
    return skip;
}

static void round_reset(struct outage *o)
{
    for (size_t i = 0; i < o->ngroups; i++) {
        free(o->groups[i].key);
    }
    o->ngroups = 0;
    o->rstate = REPLAY_IDLE;
}

/* The round's rows stay in the store and are read again from the first
 * row: a later round must not apply a key's later rows before these (the
 * marker would then pass over them). */
static void round_fail(struct outage *o, const char *why)
{
    uint64_t now = uv_now(o->f->loop);
    o->replay_errors++;
    log_warn("fallback replay: round abandoned (%s); retried", why);
    round_reset(o);
    pass_restart(o);
    o->next_round_ms = now + REPLAY_BACKOFF_MIN_MS * 5;
}

static void delete_done(void *arg, int status, const char *errstr, const fallback_result *res)
{
    struct outage *o = arg;
    if (status < 0) {
        log_error("fallback replay: rows replayed but not deleted: %s (they will be skipped by "
                  "the marker when replayed again)",
                  errstr);
    } else {
        o->replayed += (uint64_t)res->count;
        o->f->stats.fallback_replayed += (uint64_t)res->count;
    }
    if (--o->deletes_left == 0) {
        round_reset(o);
        outage_wake_loops(o->f); /* writes waiting on replayed keys, on every loop */
        replay_next(o);
    }
}

/* Every script of the round answered and (with replicas_ack) a WAIT said
 * replicas have them: delete the applied rows. */
static void round_finish(struct outage *o, int confirmed)
{
    uint64_t now = uv_now(o->f->loop);
    if (!confirmed) {
        round_fail(o, "replicas did not confirm the replayed rows");
        return;
    }
    o->rstate = REPLAY_DELETING;
    o->deletes_left = 1;
    for (size_t i = 0; i < o->ngroups; i++) {
        replay_group *g = &o->groups[i];
        if (g->status == 1) {
            o->deletes_left++;
            fallback_delete_key_upto(o->fb, g->key, g->keylen, g->last_id, delete_done, o);
            refused_key *k = refused_find(o, g->key, g->keylen);
            if (k != NULL) {
                k->next_ms = now; /* it went through: no more back-off */
            }
        }
    }
    o->deletes_left--;
    if (o->deletes_left == 0) {
        round_reset(o);
        replay_next(o);
    }
}

static void script_done(link *l, request *r, const char *reply, size_t len)
{
    struct outage *o = l->f->outage;
    if (o == NULL || o->rstate != REPLAY_APPLYING ||
        (uint64_t)(r->arg >> 20) != (o->round & 0xffffffffffULL)) {
        return;
    }
    replay_group *g = &o->groups[r->arg & 0xfffff];
    if (len > 0 && reply[0] == '-') {
        char why[300];
        uint64_t now = uv_now(l->f->loop);
        link_error_text(reply, len, why, sizeof(why));
        g->status = -1;
        if (l->f->cluster != NULL &&
            (strncmp(why, "MOVED ", 6) == 0 || strncmp(why, "ASK ", 4) == 0 ||
             strncmp(why, "CLUSTERDOWN", 11) == 0 || strncmp(why, "TRYAGAIN", 8) == 0)) {
            /* Not the key's fault: its slot moves, or the node does not
             * serve it yet (a restarted master before the cluster is ok).
             * Its rows stay and go, at the next pass, to the master the map
             * names then (a key's marker moves with its slot); until then
             * its later rows must wait too. */
            if (key_find(o->skipped, g->key, g->keylen) == NULL) {
                key_add(&o->skipped, g->key, g->keylen, now)->pass = o->pass;
            }
            clustermap_refresh(l->f->cluster, "a node redirected a fallback replay script");
            log_warn("fallback replay: %zu row(s) of key '%.*s' not applied: %s; retried at the "
                     "next pass",
                     g->rows, (int)(g->keylen < 100 ? g->keylen : 100), g->key, why);
            return;
        }
        o->replay_errors++;
        refused_key *k = refused_find(o, g->key, g->keylen);
        if (k == NULL) {
            k = xcalloc(1, sizeof(*k));
            k->key = xmalloc(g->keylen + 1);
            memcpy(k->key, g->key, g->keylen);
            k->keylen = g->keylen;
            k->next = o->refused;
            o->refused = k;
        }
        k->backoff_ms = k->backoff_ms == 0 ? REPLAY_BACKOFF_MIN_MS : k->backoff_ms * 2;
        if (k->backoff_ms > REPLAY_BACKOFF_MAX_MS) {
            k->backoff_ms = REPLAY_BACKOFF_MAX_MS;
        }
        k->next_ms = now + k->backoff_ms;
        log_error("fallback replay: Redis refused %zu row(s) of key '%.*s' (rows up to %lld): %s; "
                  "retried in %llu ms",
                  g->rows, (int)(g->keylen < 100 ? g->keylen : 100), g->key, (long long)g->last_id,
                  why, (unsigned long long)k->backoff_ms);
    } else {
        g->status = 1;
        o->pass_applied = 1;
    }
}

static void round_end_done(link *l, request *r, const char *reply, size_t len)
{
    struct outage *o = l->f->outage;
    if (o == NULL || o->rstate != REPLAY_APPLYING ||
        (uint64_t)r->arg != (o->round & 0xffffffffffULL)) {
        return;
    }
    long long acked = 0;
    int need = l->up->replicas_ack;
    if (need <= 0) {
        round_finish(o, 1);
        return;
    }
    redisReply *rr = link_parse_reply(reply, len);
    if (rr != NULL && rr->type == REDIS_REPLY_INTEGER) {
        acked = rr->integer;
    }
    freeReplyObject(rr);
    if (acked >= o->round_need) {
        if (acked >= o->round_all) {
            short_of(o, l->up)->since = 0; /* every replica again */
        }
        round_finish(o, 1);
        return;
    }
    if (acked >= need) {
        /* Applied and confirmed as a client's write would be, but some
         * replica lacks it: the rows stay until it has them. */
        char why[128];
        uint64_t now = uv_now(l->f->loop);
        replay_short *sh = short_of(o, l->up);
        if (sh->since == 0) {
            sh->since = now;
        }
        snprintf(why, sizeof(why), "confirmed by %lld of the master's %d replica(s)", acked,
                 o->round_need);
        round_fail(o, why);
        return;
    }
    round_finish(o, 0);
}

/* connected_slaves of an INFO replication reply, -1 if absent. */
static int info_replicas(const char *reply, size_t len)
{
    static const char field[] = "connected_slaves:";
    const char *p = reply, *end = reply + len;
    if (len == 0 || (reply[0] != '$' && reply[0] != '=')) {
        return -1; /* an error (INFO denied to ferry's user...), or not a bulk */
    }
    while (p < end) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        const char *eol = nl != NULL ? nl : end;
        if ((size_t)(eol - p) > sizeof(field) - 1 && memcmp(p, field, sizeof(field) - 1) == 0) {
            int n = 0;
            for (const char *q = p + sizeof(field) - 1; q < eol && *q >= '0' && *q <= '9'; q++) {
                n = n * 10 + (*q - '0');
                if (n > 100000) {
                    return -1;
                }
            }
            return n;
        }
        p = eol + 1;
    }
    return -1;
}

/* The master's replicas, asked before the round's scripts: the WAIT that
 * closes the round (after the scripts, queued now) asks for all of them. */
static void round_info_done(link *l, request *r, const char *reply, size_t len)
{
    struct outage *o = l->f->outage;
    if (o == NULL || o->rstate != REPLAY_APPLYING ||
        (uint64_t)r->arg != (o->round & 0xffffffffffULL)) {
        return;
    }
    int need = l->up->replicas_ack;
    int all = info_replicas(reply, len);
    uint64_t now = uv_now(l->f->loop);
    o->round_all = all > need ? all : need;
    o->round_need = o->round_all;
    replay_short *sh = short_of(o, l->up);
    if (sh->since != 0 && now - sh->since >= l->f->cfg->replicas_ack_hold_ms &&
        o->round_all > need) {
        /* until a WAIT finds every replica caught up again */
        if (!sh->logged) {
            sh->logged = 1;
            log_warn("fallback replay: %d replica(s) of the master confirmed no round for %llu ms: "
                     "rows are deleted once %d confirm them, until every replica does again",
                     o->round_all - need, (unsigned long long)(now - sh->since), need);
        }
        o->round_need = need;
    }
    if (sh->since == 0) {
        sh->logged = 0;
    }
    char n[16], t[24];
    snprintf(n, sizeof(n), "%d", o->round_need);
    snprintf(t, sizeof(t), "%llu", (unsigned long long)l->f->cfg->replicas_ack_timeout_ms);
    const char *argv[] = {"WAIT", n, t};
    link_internal(l, argv, 3, round_end_done, r->arg);
}

/* Rows read: group them by key (id order kept within a key) and send one
 * script per key, then a WAIT (or a PING) that closes the round. */
static void read_done(void *arg, int status, const char *errstr, const fallback_result *res)
{
    struct outage *o = arg;
    ferry *f = o->f;
    upstream *up = f->cluster != NULL ? NULL : f->up;
    uint64_t now = uv_now(f->loop);
    link *l = up != NULL ? upstream_shared(up, NULL, 0, 2) : NULL;

    if (status < 0 || (f->cluster == NULL && (l == NULL || up->epoch != o->round_epoch))) {
        round_fail(o, status < 0 ? errstr : "no master");
        return;
    }
    if (res->nitems == 0) {
        round_reset(o);
        if (fallback_rows(o->fb) == 0) {
            log_info("fallback replay: done, %llu row(s) replayed so far",
                     (unsigned long long)o->replayed);
            o->announced = 0;
        }
        /* Cluster mode: a pass that applied nothing (every key's shard
         * down) is not started again at once. */
        int idle = f->cluster != NULL && !o->pass_applied;
        pass_restart(o); /* start over: refused keys' rows, once their back-off ends */
        o->next_round_ms = now + (idle ? REPLAY_IDLE_PASS_MS : REPLAY_BACKOFF_MIN_MS);
        return;
    }
    o->cursor = res->items[res->nitems - 1].id;
    o->ngroups = 0;
    /* Which keys' rows go this round: a key with taken rows, refused or
     * already skipped in this pass waits for the next pass. */
    char *skip = xcalloc(res->nitems, 1);
    for (size_t i = 0; i < res->nitems; i++) {
        const fallback_item *it = &res->items[i];
        int seen = 0, any_taken = 0;
        for (size_t j = 0; j < res->nitems; j++) {
            const fallback_item *o2 = &res->items[j];
            if (o2->keylen == it->keylen && memcmp(o2->key, it->key, it->keylen) == 0) {
                seen |= j < i;
                any_taken |= o2->taken;
            }
        }
        if (seen) {
            continue; /* decided with the key's first row */
        }
        int skipped = key_skipped(o, it->key, it->keylen, any_taken, now);
        size_t taken = 0;
        for (size_t j = i; j < res->nitems; j++) {
            const fallback_item *o2 = &res->items[j];
            if (o2->keylen == it->keylen && memcmp(o2->key, it->key, it->keylen) == 0) {
                skip[j] = (char)skipped;
                taken += !skipped && o2->taken;
            }
        }
        if (taken > 0) {
            f->stats.fallback_replayed_taken += taken;
            log_warn("fallback replay: %zu row(s) of key '%.*s' replayed while the replies of the "
                     "pops that took them were not written for %d ms: their consumer may get them "
                     "twice",
                     taken, (int)(it->keylen < 100 ? it->keylen : 100), it->key,
                     REPLAY_TAKEN_WAIT_MS);
        }
    }
    if (f->cluster != NULL) {
        /* One shard per round (its link carries the scripts and the WAIT):
         * the shard of the first key to go whose master is UP; the other
         * keys wait for the next pass, as skipped ones do. A key goes to
         * its slot's master in the map now (a moved key: its new owner). */
        for (size_t i = 0; i < res->nitems; i++) {
            const fallback_item *it = &res->items[i];
            if (skip[i]) {
                continue;
            }
            upstream *v = clustermap_route(f->cluster, slot_of_key(it->key, it->keylen));
            if (up == NULL && v != NULL && v->state == UP_UP &&
                (l = upstream_shared(v, NULL, 0, 2)) != NULL) {
                up = v;
            }
            if (v != NULL && v == up) {
                continue;
            }
            if (key_find(o->skipped, it->key, it->keylen) == NULL) {
                key_add(&o->skipped, it->key, it->keylen, now)->pass = o->pass;
            }
            for (size_t j = i; j < res->nitems; j++) {
                const fallback_item *o2 = &res->items[j];
                if (o2->keylen == it->keylen && memcmp(o2->key, it->key, it->keylen) == 0) {
                    skip[j] = 1;
                }
            }
        }
        o->round_up = up;
        o->round_epoch = up != NULL ? up->epoch : 0;
    }
    for (size_t i = 0; i < res->nitems; i++) {
        const fallback_item *it = &res->items[i];
        if (skip[i]) {
            continue;
        }
        size_t g;
        for (g = 0; g < o->ngroups; g++) {
            if (o->groups[g].keylen == it->keylen &&
                memcmp(o->groups[g].key, it->key, it->keylen) == 0) {
                break;
            }
        }
        if (g == o->ngroups) {
            if (o->ngroups == o->gcap) {
                o->gcap = o->gcap ? o->gcap * 2 : 16;
                o->groups = xrealloc(o->groups, o->gcap * sizeof(*o->groups));
            }
            replay_group *ng = &o->groups[o->ngroups++];
            memset(ng, 0, sizeof(*ng));
            ng->key = xmalloc(it->keylen + 1);
            memcpy(ng->key, it->key, it->keylen);
            ng->keylen = it->keylen;
            ng->slot = f->cluster != NULL ? slot_of_key(it->key, it->keylen) : -1;
        }
        o->groups[g].last_id = it->id;
        o->groups[g].rows++;
    }
    if (o->ngroups == 0) {
        free(skip);
        round_reset(o);
        replay_next(o);
        return;
    }
    if (up->replicas_ack > 0) {
        /* its reply queues the WAIT that closes the round */
        static const char *const argv[] = {"INFO", "replication"};
        link_internal(l, argv, 2, round_info_done, (long long)(o->round & 0xffffffffffULL));
    }
    /* One script per key: its rows in id order. */
    const fallback_item *tail = &res->items[res->nitems - 1];
    for (size_t g = 0; g < o->ngroups; g++) {
        replay_group *grp = &o->groups[g];
        buf b;
        char num[32];
        /* The held pushes' receipts: the script's keys from the third on. */
        const fallback_item **held = xcalloc(grp->rows, sizeof(*held));
        size_t nheld = 0;
        for (size_t i = 0; i < res->nitems; i++) {
            const fallback_item *it = &res->items[i];
            if (!skip[i] && it->rcpt != NULL && item_in(it, grp) &&
                held_index(held, nheld, it) == 0) {
                held[nheld++] = it;
            }
        }
        buf_init(&b);
        buf_append_count(&b, '*', 7 + nheld + 5 * grp->rows);
        buf_append_bulk(&b, "EVAL", 4);
        buf_append_bulk(&b, replay_script, sizeof(replay_script) - 1);
        snprintf(num, sizeof(num), "%zu", 2 + nheld);
        buf_append_bulk(&b, num, strlen(num));
        char marker[600];
        marker_name(o, grp->slot, marker, sizeof(marker));
        buf_append_bulk(&b, marker, strlen(marker));
        buf_append_bulk(&b, grp->key, grp->keylen);
        for (size_t h = 0; h < nheld; h++) {
            buf_append_bulk(&b, held[h]->rcpt, held[h]->rcptlen);
        }
        snprintf(num, sizeof(num), "%lld", (long long)grp->last_id);
        buf_append_bulk(&b, num, strlen(num));
        /* A full batch ending in this key's rows may end inside a push. */
        int more = res->nitems >= REPLAY_BATCH && item_in(tail, grp);
        buf_append_bulk(&b, more ? "1" : "0", 1);
        for (size_t i = 0; i < res->nitems; i++) {
            const fallback_item *it = &res->items[i];
            if (skip[i] || !item_in(it, grp)) {
                continue;
            }
            snprintf(num, sizeof(num), "%lld", (long long)it->id);
            buf_append_bulk(&b, num, strlen(num));
            snprintf(num, sizeof(num), "%d", it->kind);
            buf_append_bulk(&b, num, strlen(num));
            buf_append_bulk(&b, it->member, it->memberlen);
            snprintf(num, sizeof(num), "%.17g", it->score);
            buf_append_bulk(&b, num, strlen(num));
            size_t h = it->rcpt != NULL ? held_index(held, nheld, it) : 0;
            snprintf(num, sizeof(num), "%zu", h > 0 ? h + 2 : 0);
            buf_append_bulk(&b, num, strlen(num));
        }
        free(held);
        link_internal_raw(l, buf_head(&b), buf_used(&b), script_done);
        list_entry(l->pending.prev, request, lq)->arg =
            (long long)(((o->round & 0xffffffffffULL) << 20) | g);
        buf_free(&b);
    }
    if (up->replicas_ack <= 0) {
        static const char *const argv[] = {"PING"};
        link_internal(l, argv, 1, round_end_done, (long long)(o->round & 0xffffffffffULL));
    }
    free(skip);
    o->rstate = REPLAY_APPLYING;
}

static void replay_next(struct outage *o)
{
    ferry *f = o->f;
    /* Cluster mode: some shard's master is UP (read_done picks the round's). */
    upstream *up = f->cluster != NULL ? clustermap_route(f->cluster, -1) : f->up;
    uint64_t now = uv_now(f->loop);
    if (o->rstate != REPLAY_IDLE || up == NULL || up->state != UP_UP ||
        atomic_load(&o->sh->pending_ops) > 0 || fallback_rows(o->fb) == 0 ||
        now < o->next_round_ms || upstream_shared(up, NULL, 0, 2) == NULL) {
        return;
    }
    o->round++;
    o->round_started = now;
    o->round_up = up;
    o->round_epoch = up->epoch;
    o->rstate = REPLAY_READING;
    if (!o->announced) {
        o->announced = 1;
        log_info("fallback replay: %llu row(s) pending, replaying to %s",
                 (unsigned long long)fallback_rows(o->fb),
                 f->cluster != NULL ? "the masters of their keys' slots" : upstream_name(up));
    }
    fallback_read(o->fb, o->cursor, REPLAY_BATCH, read_done, o);
}

void outage_tick(ferry *f, uint64_t now)
{
    struct outage *o = f->outage;
    if (o == NULL) {
        return;
    }
    if (o->remote) {
        /* The main loop replays. Its master is back: this loop's view,
         * DOWN still, connects now rather than at the end of its back-off
         * (its clients' writes wait for it meanwhile, outage_dispatch). */
        int owner = atomic_load(&o->sh->owner_up);
        if (owner && !o->owner_seen && f->up != NULL && f->up->state == UP_DOWN) {
            upstream_retry_now(f->up);
        }
        o->owner_seen = owner;
        return;
    }
    /* Before replay_next: a worker's writes stop going to the store before
     * the first replayed row reaches Redis. */
    atomic_store(&o->sh->owner_up, f->cluster == NULL && f->up != NULL && f->up->state == UP_UP);
    if (o->rstate == REPLAY_APPLYING &&
        ((o->round_up != NULL && o->round_up->epoch != o->round_epoch) ||
         now - o->round_started >= REPLAY_ROUND_TIMEOUT_MS)) {
        /* The link carrying the round broke: its scripts are idempotent
         * (the marker), so the rows are simply read and sent again. */
        round_fail(o, "the link to the master changed during the round");
    }
    replay_next(o);
}
