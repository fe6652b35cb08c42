/* instance.c - receipts that outlive their process.
 *
 * A pop with its receipt leaves its item in a receipt key until the reply
 * reached the client (receipts.c). A ferry that dies (kill -9, OOM, a host
 * lost) in between leaves the item there, on nobody. So receipts are named
 * by the instance, a name stable across the restarts of one ferry
 * (instance.name, or derived from the host name and the listen address),
 * and the process (a token of its own):
 *
 *   ferry:rcpt:<name>:<process>.<loop>:<n>:<what>:<key>
 *
 * <what> is L or R for a pop (the end of <key> its item came from), P a
 * push, T a transaction: all a put-back needs, in the name the move itself
 * creates (the move stays one step, as cheap as the pop).
 *
 * While a process runs, its main loop keeps ferry:alive:<name> on the
 * master, holding its token with a TTL (instance.heartbeat_ttl_ms),
 * refreshed every quarter of it, and the name in the set ferry:instances
 * (instance_beat.lua). Then:
 *
 * - a process that finds its name held by another token waits: a process
 *   of this instance that died lets it expire within one TTL. Held longer,
 *   another live ferry has this name: this one stops as on SIGTERM and
 *   exits INSTANCE_EXIT_TAKEN, saying so. A takeover (--takeover) is the
 *   same instance: the new process takes the key over and the old one,
 *   handing over, refreshes it too.
 * - once the heartbeat is its own, a process settles its name's receipts
 *   left by earlier processes (not after a takeover: its predecessor's are
 *   live, served by it until it exits).
 * - every half TTL it looks through ferry:instances for names whose
 *   heartbeat expired; gone for half a TTL more (a live ferry reconnecting
 *   after a failover refreshes it by then), one claimer wins
 *   (instance_claim.lua, SET NX of ferry:claim:<name>) and settles their
 *   receipts.
 *
 * Settling (instance_settle.lua) goes one SCAN step per call, each atomic:
 * a pop's item back to the end of its queue it came from (counted
 * receipts_put_back, logged with its key: at least once, as its reply may
 * have reached the client just before the crash), a push's or a
 * transaction's receipt deleted (the write stands; a client that retried it
 * through another ferry sent a request of its own). A receipt of the
 * heartbeat's own process is never touched, so a peer and the instance
 * started again can settle at once: each receipt is settled once.
 *
 * Cluster mode: receipts are named after their key's {tag} (each in its
 * key's slot); the heartbeat, the registry and the claims are keys of the
 * tag {ferry} (ferry:{ferry}:alive:<name>...), on that slot's master; the
 * settling scans every shard in turn (docs/failover.md). */
#include "instance.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "buf.h"
#include "clustermap.h"
#include "link.h"
#include "log.h"
#include "resp.h"
#include "stats.h"
#include "upstream.h"

extern const char ferry_instance_beat_lua[];
extern const size_t ferry_instance_beat_lua_len;
extern const char ferry_instance_claim_lua[];
extern const size_t ferry_instance_claim_lua_len;
extern const char ferry_instance_settle_lua[];
extern const size_t ferry_instance_settle_lua_len;

#define NAME_LEN 160
#define SETTLE_COUNT 2000 /* keys one settle step asks SCAN to look at */
/* A dead process's push receipt is left this long rather than deleted: its
 * fallback store may hold the push's rows, replayed (when it starts again)
 * only where the receipt is missing. */
#define SETTLE_PUSH_TTL "86400000"

enum { CALL_BEAT = 1, CALL_MEMBERS, CALL_CLAIM, CALL_SETTLE, CALL_FORGET };

/* One per process, in the main loop's context (f->instance; each worker's
 * points at it and reads only name and owner, set before the loops run). */
struct instance {
    char name[NAME_LEN];
    char token[32];            /* this process's: pid and a clock, in hex */
    char owner[NAME_LEN + 40]; /* "<name>:<token>" */
    int adopted;               /* started by a takeover of this instance */
    uint64_t ttl_ms;
    uint64_t next_beat, next_sweep;
    uint64_t next_step;      /* a settle step refused (a master without its replicas): not before */
    uint64_t conflict_since; /* another token first seen in the heartbeat; 0 none */
    int beating;             /* a beat in flight */
    int held;                /* the heartbeat is this process's */
    int own_done;            /* the name's earlier processes' receipts settled */
    int busy;                /* a sweep, claim or settle step in flight */
    int refused;             /* another live process has the name: stopping */
    buf peers;               /* names still to look at, each NUL-terminated */
    size_t peer_at;
    char settling[NAME_LEN]; /* whose receipts ("" none) */
    int settle_own;
    int slot; /* cluster mode: the first slot of the shard scanned */
    char cursor[32];
    uint64_t put_back, deleted; /* by the settling under way */
};

static void derive_name(const config *cfg, char *out, size_t n)
{
    char host[256];
    size_t hlen = sizeof(host);
    const config_addr *a = cfg->nlisten > 0 ? &cfg->listen[0] : NULL;
    if (uv_os_gethostname(host, &hlen) != 0) {
        strcpy(host, "ferry");
    }
    if (a == NULL) {
        snprintf(out, n, "%.63s", host);
    } else if (a->is_unix) {
        snprintf(out, n, "%.63s-%.80s", host, a->path);
    } else {
        snprintf(out, n, "%.63s-%.60s-%d", host, a->host, a->port);
    }
    /* Only what a key name and a SCAN pattern take as it is. */
    for (char *c = out; *c != '\0'; c++) {
        if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') ||
              *c == '.' || *c == '_' || *c == '-')) {
            *c = '-';
        }
    }
}

struct instance *instance_new(const config *cfg, int adopted)
{
    struct instance *in = xcalloc(1, sizeof(*in));
    if (cfg->instance_name != NULL) {
        snprintf(in->name, sizeof(in->name), "%s", cfg->instance_name);
    } else {
        derive_name(cfg, in->name, sizeof(in->name));
    }
    snprintf(in->token, sizeof(in->token), "%x%llx", (unsigned)uv_os_getpid(),
             (unsigned long long)(uv_hrtime() / 1000 % 0xffffffffffull));
    snprintf(in->owner, sizeof(in->owner), "%s:%s", in->name, in->token);
    in->adopted = adopted;
    in->ttl_ms = cfg->instance_heartbeat_ttl_ms;
    buf_init(&in->peers);
    log_info("instance %s (process %s)%s", in->name, in->token,
             adopted ? ": taking over from a process of the same instance" : "");
    return in;
}

void instance_free(struct instance *in)
{
    if (in != NULL) {
        buf_free(&in->peers);
        free(in);
    }
}

const char *instance_own_name(const ferry *f)
{
    return f->instance != NULL ? f->instance->name : "";
}

const char *instance_receipt_owner(const ferry *f)
{
    return f->instance != NULL ? f->instance->owner : "";
}

static void on_reply(link *l, request *r, const char *p, size_t n);

/* ferry:<what>:<name> (what: alive, claim, gone); in cluster mode
 * ferry:{ferry}:<what>:<name>, in one slot with the registry. */
static void hb_key(const ferry *f, const char *what, const char *name, char *out, size_t n)
{
    snprintf(out, n, "ferry:%s%s:%s", f->cluster != NULL ? "{ferry}:" : "", what, name);
}

static const char *registry(const ferry *f)
{
    return f->cluster != NULL ? "ferry:{ferry}:instances" : "ferry:instances";
}

/* Where the heartbeat, the registry and the claims are: the master (the
 * one of their slot in cluster mode). */
static link *hb_link(ferry *f)
{
    return clustermap_key_link(f, "{ferry}", 7, NULL, 0, 2);
}

/* EVAL of lua with keys then args on l, its reply to on_reply. */
static void call(link *l, const char *lua, size_t lua_len, const char *const *keys, int nkeys,
                 const char *const *args, int nargs, int what)
{
    buf b;
    char num[16];
    buf_init(&b);
    buf_append_count(&b, '*', (size_t)(3 + nkeys + nargs));
    buf_append_bulk(&b, "EVAL", 4);
    buf_append_bulk(&b, lua, lua_len);
    buf_append_bulk(&b, num, (size_t)snprintf(num, sizeof(num), "%d", nkeys));
    for (int i = 0; i < nkeys; i++) {
        buf_append_bulk(&b, keys[i], strlen(keys[i]));
    }
    for (int i = 0; i < nargs; i++) {
        buf_append_bulk(&b, args[i], strlen(args[i]));
    }
    link_internal_bytes(l, buf_head(&b), buf_used(&b), on_reply, what);
    buf_free(&b);
}

static void beat(ferry *f, link *l)
{
    struct instance *in = f->instance;
    char alive[NAME_LEN + 24], ttl[24];
    hb_key(f, "alive", in->name, alive, sizeof(alive));
    snprintf(ttl, sizeof(ttl), "%llu", (unsigned long long)in->ttl_ms);
    /* A takeover's two processes are one instance: each refreshes it. */
    const char *force = in->adopted || f->handing_over ? "1" : "0";
    const char *keys[] = {alive, registry(f)};
    const char *args[] = {in->token, ttl, force, in->name};
    in->beating = 1;
    call(l, ferry_instance_beat_lua, ferry_instance_beat_lua_len, keys, 2, args, 4, CALL_BEAT);
}

/* The next SCAN step on the master (cluster mode: on the shard of
 * in->slot, its receipts in their keys' slots; the heartbeat on another
 * node, its token passed: this process's own, or none for a dead peer's). */
static void settle_step(ferry *f)
{
    struct instance *in = f->instance;
    char alive[NAME_LEN + 24], count[16];
    link *l = hb_link(f);
    if (f->cluster != NULL) {
        upstream *up = clustermap_route(f->cluster, in->slot);
        l = up != NULL && up->state == UP_UP ? upstream_shared(up, NULL, 0, 2) : NULL;
    }
    if (l == NULL || l->state != LINK_READY) {
        in->settling[0] = '\0'; /* no master now: from the start, later */
        return;
    }
    hb_key(f, "alive", in->settling, alive, sizeof(alive));
    snprintf(count, sizeof(count), "%d", SETTLE_COUNT);
    const char *keys[] = {alive};
    const char *own = in->settle_own ? in->token : "";
    const char *args[] = {
        in->settling, in->cursor, count, own, own, f->cluster != NULL ? "1" : "0", SETTLE_PUSH_TTL};
    in->busy = 1;
    call(l, ferry_instance_settle_lua, ferry_instance_settle_lua_len, keys,
         f->cluster != NULL ? 0 : 1, args, 7, CALL_SETTLE);
}

static void settle_start(ferry *f, const char *name, int own)
{
    struct instance *in = f->instance;
    snprintf(in->settling, sizeof(in->settling), "%s", name);
    in->settle_own = own;
    strcpy(in->cursor, "0");
    in->put_back = in->deleted = 0;
    in->slot = f->cluster != NULL ? clustermap_next_first_slot(f->cluster, -1) : 0;
    if (in->slot < 0) {
        in->settling[0] = '\0';
        return;
    }
    settle_step(f);
}

/* The claim script for name: 'claim' it, or it is 'done'. */
static void claim(ferry *f, link *l, const char *name, const char *how, int what)
{
    struct instance *in = f->instance;
    char alive[NAME_LEN + 24], key[NAME_LEN + 24], gone[NAME_LEN + 24], ttl[24], grace[24];
    hb_key(f, "alive", name, alive, sizeof(alive));
    hb_key(f, "claim", name, key, sizeof(key));
    hb_key(f, "gone", name, gone, sizeof(gone));
    /* Long enough to settle; a claimer that dies too lets it go. */
    snprintf(ttl, sizeof(ttl), "%llu", (unsigned long long)(in->ttl_ms * 4));
    snprintf(grace, sizeof(grace), "%llu", (unsigned long long)(in->ttl_ms / 2));
    const char *keys[] = {alive, key, registry(f), gone};
    const char *args[] = {in->token, ttl, name, how, grace};
    in->busy = 1;
    call(l, ferry_instance_claim_lua, ferry_instance_claim_lua_len, keys, 4, args, 5, what);
}

static void on_beat(ferry *f, const char *p, const char *end)
{
    struct instance *in = f->instance;
    long long n = resp_read_header(&p, end, '*');
    long long v = resp_read_header(&p, end, ':');
    const char *other = "";
    size_t olen = 0;
    if (n < 1 || v < 0) {
        log_warn("instance %s: the heartbeat was refused: %.*s", in->name,
                 (int)(end - p > 200 ? 200 : end - p), p);
        return;
    }
    if (v > 0) {
        if (in->conflict_since != 0) {
            log_info("instance %s: the heartbeat is this process's now", in->name);
        }
        in->held = 1;
        in->conflict_since = 0;
        return;
    }
    resp_read_bulk(&p, end, &other, &olen);
    uint64_t now = uv_now(f->loop);
    if (in->conflict_since == 0) {
        in->conflict_since = now;
        log_warn("instance %s: ferry:alive:%s is held by process %.*s: waiting for it to expire "
                 "(a process of this instance that died) for up to %llu ms",
                 in->name, in->name, (int)olen, other, (unsigned long long)in->ttl_ms);
        return;
    }
    if (now - in->conflict_since > in->ttl_ms + in->ttl_ms / 2) {
        log_error("instance %s: another live ferry (process %.*s) has this identity: it refreshed "
                  "its heartbeat for %llu ms; refusing to run (give each ferry its own "
                  "instance.name, or use --takeover to replace one)",
                  in->name, (int)olen, other, (unsigned long long)(now - in->conflict_since));
        /* Stopped as on SIGTERM, not exited: the pops it served meanwhile
         * are answered (their receipts deleted) or undone, not left under
         * a name whose live owner will not settle them. */
        in->refused = 1;
        f->exit_code = INSTANCE_EXIT_TAKEN;
        f->stop(f, "another live ferry has this instance.name");
    }
}

static void on_settle(ferry *f, const char *p, const char *end)
{
    struct instance *in = f->instance;
    const char *cur, *key;
    size_t clen, klen;
    long long n = resp_read_header(&p, end, '*');
    if (n < 2 || resp_read_bulk(&p, end, &cur, &clen) != 0 || clen >= sizeof(in->cursor)) {
        log_warn("instance %s: settling %s's receipts failed (tried again later): %.*s", in->name,
                 in->settling, (int)(end - p > 200 ? 200 : end - p), p);
        in->settling[0] = '\0';
        /* Tried again a heartbeat later, not at the next tick: a master
         * refusing writes (-NOREPLICAS until its replica is back) was sent
         * the settle script 20 times a second. */
        if (end > p && *p == '-') {
            in->next_step = uv_now(f->loop) + in->ttl_ms / 4;
        }
        return;
    }
    long long deleted = resp_read_header(&p, end, ':');
    in->deleted += deleted > 0 ? (uint64_t)deleted : 0;
    f->stats.receipts_settled_deleted += deleted > 0 ? (uint64_t)deleted : 0;
    for (long long i = 2; i < n && resp_read_bulk(&p, end, &key, &klen) == 0; i++) {
        in->put_back++;
        f->stats.receipts_put_back++;
        log_info("receipts: an item a dead process of instance %s had popped is put back to %.*s "
                 "(at least once: its reply may have reached its client)",
                 in->settling, (int)klen, key);
    }
    memcpy(in->cursor, cur, clen);
    in->cursor[clen] = '\0';
    if (strcmp(in->cursor, "0") != 0) {
        settle_step(f);
        return;
    }
    if (f->cluster != NULL && (in->slot = clustermap_next_first_slot(f->cluster, in->slot)) >= 0) {
        settle_step(f); /* the next shard, from its first key */
        return;
    }
    log_info("instance %s: receipts of %s settled: %llu item(s) put back, %llu push or "
             "transaction receipt(s) deleted",
             in->name, in->settle_own ? "this instance's earlier processes" : in->settling,
             (unsigned long long)in->put_back, (unsigned long long)in->deleted);
    link *l = hb_link(f);
    if (in->settle_own) {
        in->own_done = 1;
    } else if (l != NULL) {
        claim(f, l, in->settling, "done", CALL_FORGET);
    }
    in->settling[0] = '\0';
}

static void on_reply(link *l, request *r, const char *p, size_t n)
{
    struct instance *in = l->f->instance;
    ferry *f = l->f;
    int what = (int)r->arg;
    in->busy = what == CALL_BEAT ? in->busy : 0;
    if (what == CALL_BEAT) {
        in->beating = 0;
    }
    if (p == NULL) {
        in->settling[0] = '\0'; /* the link was lost: from the start, later */
        return;
    }
    const char *end = p + n;
    switch (what) {
    case CALL_BEAT:
        on_beat(f, p, end);
        break;
    case CALL_MEMBERS: {
        long long k = resp_read_header(&p, end, '*');
        const char *m;
        size_t mlen;
        buf_clear(&in->peers);
        in->peer_at = 0;
        for (long long i = 0; i < k && resp_read_bulk(&p, end, &m, &mlen) == 0; i++) {
            if (mlen < NAME_LEN && memchr(m, '\0', mlen) == NULL &&
                !(mlen == strlen(in->name) && memcmp(m, in->name, mlen) == 0)) {
                buf_append(&in->peers, m, mlen);
                buf_append(&in->peers, "", 1);
            }
        }
        break;
    }
    case CALL_CLAIM: {
        const char *name = buf_head(&in->peers) + in->peer_at;
        in->peer_at += strlen(name) + 1;
        if (resp_read_header(&p, end, ':') == 1) {
            f->stats.instances_claimed++;
            log_warn("instance %s: claimed instance %s (its heartbeat expired: the process died): "
                     "settling its receipts",
                     in->name, name);
            settle_start(f, name, 0);
        }
        break;
    }
    case CALL_SETTLE:
        on_settle(f, p, end);
        break;
    default:
        break;
    }
}

/* Whether this ferry makes receipts at all (receipts.c): without, it keeps
 * no heartbeat and claims nothing (no key of ferry's in Redis). */
static int receipts_on(const config *c)
{
    int ack = c->replicas_ack >= 0 ? c->replicas_ack : c->has_sentinel;
    return ack > 0 && (c->pop_receipts || c->push_receipts || c->script_receipts);
}

void instance_tick(ferry *f, uint64_t now)
{
    struct instance *in = f->instance;
    if (in == NULL || f->worker_index != 0 || in->refused || !receipts_on(f->cfg)) {
        return;
    }
    link *l = hb_link(f);
    if (l == NULL) {
        return;
    }
    if (!in->beating && now >= in->next_beat) {
        in->next_beat = now + in->ttl_ms / 4;
        beat(f, l);
    }
    if (!in->held || in->busy) {
        return;
    }
    if (!in->own_done && !in->adopted) {
        if (now < in->next_step) {
            return;
        }
        settle_start(f, in->name, 1);
    } else if (in->peer_at < buf_used(&in->peers)) {
        claim(f, l, buf_head(&in->peers) + in->peer_at, "claim", CALL_CLAIM);
    } else if (now >= in->next_sweep) {
        const char *members[] = {"SMEMBERS", registry(f)};
        in->next_sweep = now + in->ttl_ms / 2;
        in->busy = 1;
        link_internal_sure(l, members, 2, on_reply, CALL_MEMBERS);
    }
}
