/* durable_link.c - durability verified on a master link. On every
 * enforcement round (a new shared link, then every enforce_interval_ms)
 * the link carries, in order:
 *
 *   INFO persistence         (before: was AOF off?)       durable_link_before_set
 *   CONFIG SET appendonly .. (upstream.c, enforce_done)
 *   CONFIG REWRITE           (persist_config only)        durable_link_after_set
 *   INFO persistence         (the verdict, durable.c)
 *
 * A new link is verified only when the verdict trusts the node; until then
 * INFO is asked again every DURABLE_RECHECK_MS (the first time sooner) by a
 * one-shot timer that finds the link again by id and epoch, so a closed
 * link is never touched; after DURABLE_RECHECK_MAX re-checks the link is
 * closed and the reconnect starts over. On a link already verified, a bad verdict is
 * recorded (stats, log, require_aof) and the next period checks again. */
#include "durable_link.h"

#include <hiredis/hiredis.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "durable.h"
#include "log.h"

/* request->arg of ferry's INFO requests: the history, and the re-check
 * count above it. On the CONFIG SET request, DURABLE_WAS_OFF is set by the
 * INFO that ran before it. */
#define ARG_HIST_MASK 0x3
#define ARG_TRIES_SHIFT 4

typedef struct recheck {
    uv_timer_t timer; /* one-shot, DURABLE_RECHECK_MS */
    ferry *f;         /* context */
    uint64_t link_id; /* the link to check again, if still there */
    uint64_t epoch;   /* ... and still of this master */
    long long arg;    /* request->arg of the next INFO */
} recheck;

static void pre_done(link *l, request *r, const char *reply, size_t len);
static void post_done(link *l, request *r, const char *reply, size_t len);
static void rewrite_done(link *l, request *r, const char *reply, size_t len);

/* ---------------------------------------------------------------- helpers */

static void send_internal(link *l, int argc, const char *const *argv, req_done_cb done,
                          long long arg)
{
    request *r = request_new(l->f);
    r->flags |= REQ_F_INTERNAL;
    r->done = done;
    r->arg = arg;
    buf_append_argv(&r->data, argc, argv);
    link_send(l, r);
}

static void send_info(link *l, long long arg)
{
    static const char *const argv[] = {"INFO", "persistence"};
    send_internal(l, 2, argv, post_done, arg);
}

/* The reply parsed (returns new, free with freeReplyObject), or NULL. */
static redisReply *parse(const char *p, size_t n)
{
    void *reply = NULL;
    redisReader *rd = redisReaderCreate();
    if (rd == NULL) {
        return NULL;
    }
    if (redisReaderFeed(rd, p, n) != REDIS_OK || redisReaderGetReply(rd, &reply) != REDIS_OK) {
        reply = NULL;
    }
    redisReaderFree(rd);
    return reply;
}

/* Record a verdict on the master: log on change, keep the reason. */
static void note_untrusted(upstream *up, const char *why, int verified)
{
    if (up->aof_ok || strcmp(up->aof_error, why) != 0) {
        if (verified) {
            log_error("durability: master %s is no longer trusted: %s", up->name, why);
        } else {
            log_warn("durability: master %s not trusted yet: %s; re-checking every %d ms", up->name,
                     why, DURABLE_RECHECK_MS);
        }
    }
    up->aof_ok = 0;
    snprintf(up->aof_error, sizeof(up->aof_error), "%s", why);
}

/* ------------------------------------------------------------ the rounds */

void durable_link_before_set(link *l)
{
    static const char *const argv[] = {"INFO", "persistence"};
    send_internal(l, 2, argv, pre_done, 0);
}

/* Before CONFIG SET: AOF off means the rewrite that follows is the initial
 * one. The CONFIG SET request is next on the link (queued right after);
 * it carries that on to durable_link_after_set. */
static void pre_done(link *l, request *r, const char *reply, size_t len)
{
    upstream *up = l->up;
    if (l->epoch != up->epoch) {
        return;
    }
    redisReply *rr = parse(reply, len);
    int off = 0;
    if (rr != NULL && rr->type == REDIS_REPLY_STRING) {
        durable_info in;
        durable_parse(rr->str, rr->len, &in);
        off = in.aof_enabled == 0;
    }
    freeReplyObject(rr);
    if (!off) {
        return;
    }
    list_node *n = list_first(&l->pending);
    if (n != NULL) {
        request *set = list_entry(n, request, lq);
        if ((set->flags & REQ_F_INTERNAL) && set->done != NULL && set->done != pre_done) {
            set->arg |= DURABLE_WAS_OFF;
        }
    }
    if (up->aof_ok) {
        note_untrusted(up, "appendonly was off (aof_enabled:0); turned on again", l->verified);
    }
}

void durable_link_after_set(link *l, const request *set)
{
    upstream *up = l->up;
    const config *cfg = l->f->cfg;
    durable_history hist = DURABLE_UNKNOWN;
    if (set != NULL && (set->arg & ARG_HIST_MASK) == DURABLE_WAS_OFF) {
        hist = DURABLE_WAS_OFF;
    } else if (l->verified && up->aof_ok) {
        hist = DURABLE_SETTLED; /* a rewrite now is a routine one */
    }
    if (cfg->persist_config && (!l->verified || hist != DURABLE_SETTLED)) {
        const char *argv[] = {cfg->config_command ? cfg->config_command : "CONFIG", "REWRITE"};
        send_internal(l, 2, argv, rewrite_done, 0);
    }
    send_info(l, (long long)hist);
}

static void rewrite_done(link *l, request *r, const char *reply, size_t len)
{
    if (reply != NULL && len > 0 && reply[0] == '-') {
        size_t n = len >= 3 ? len - 3 : 0;
        log_warn("durability: CONFIG REWRITE refused by %s: %.*s (the settings hold until it "
                 "restarts)",
                 l->up->name, (int)(n > 200 ? 200 : n), reply + 1);
        return;
    }
    log_info("durability: settings written to the config file of master %s (CONFIG REWRITE)",
             l->up->name);
}

static void recheck_close_cb(uv_handle_t *h)
{
    free(h->data);
}

static void recheck_cb(uv_timer_t *t)
{
    recheck *rc = t->data;
    ferry *f = rc->f;
    upstream *up = f->up;
    uv_close((uv_handle_t *)t, recheck_close_cb);
    if (up == NULL || f->stopping || f->closed || up->epoch != rc->epoch) {
        return;
    }
    list_node *n;
    list_foreach(n, &up->links)
    {
        link *l = list_entry(n, link, node);
        if (l->id == rc->link_id) {
            if (l->state == LINK_READY && !l->verified) {
                send_info(l, rc->arg);
            }
            return;
        }
    }
}

/* After CONFIG SET: the verdict. */
static void post_done(link *l, request *r, const char *reply, size_t len)
{
    upstream *up = l->up;
    ferry *f = l->f;
    durable_history hist = (durable_history)(r->arg & ARG_HIST_MASK);
    long long tries = r->arg >> ARG_TRIES_SHIFT;
    char why[DURABLE_WHY_MAX + 64];

    if (l->epoch != up->epoch) {
        return;
    }
    redisReply *rr = parse(reply, len);
    if (rr == NULL || rr->type != REDIS_REPLY_STRING) {
        /* INFO refused or renamed: durability cannot be verified. As when
         * CONFIG is refused, the link is used and the failure is loud. */
        snprintf(why, sizeof(why), "INFO persistence refused: %.150s",
                 rr != NULL && rr->type == REDIS_REPLY_ERROR ? rr->str : "unexpected reply");
        freeReplyObject(rr);
        if (up->aof_ok || strcmp(up->aof_error, why) != 0) {
            log_error("durability: cannot verify %s: %s", up->name, why);
        }
        up->aof_ok = 0;
        snprintf(up->aof_error, sizeof(up->aof_error), "%s", why);
        upstream_link_verified(l);
        return;
    }
    int trusted = durable_check(rr->str, rr->len, hist, why, DURABLE_WHY_MAX);
    freeReplyObject(rr);
    if (trusted) {
        if (!up->aof_ok) {
            log_info("durability: appendonly yes, appendfsync always, no-appendfsync-on-rewrite no "
                     "asserted on %s; INFO persistence: AOF on, no initial rewrite pending, last "
                     "write ok",
                     up->name);
            up->aof_since_ms = uv_now(f->loop);
        }
        up->aof_ok = 1;
        up->aof_error[0] = '\0';
        upstream_link_verified(l);
        return;
    }
    note_untrusted(up, why, l->verified);
    if (l->verified) {
        return; /* in use already: the next period checks again */
    }
    if (tries >= DURABLE_RECHECK_MAX) {
        char reason[sizeof(why) + 64];
        snprintf(reason, sizeof(reason), "durability not verified after %d checks: %s",
                 DURABLE_RECHECK_MAX, why);
        link_close(l, reason);
        return;
    }
    recheck *rc = xcalloc(1, sizeof(*rc));
    rc->f = f;
    rc->link_id = l->id;
    rc->epoch = l->epoch;
    rc->arg = (long long)hist | ((tries + 1) << ARG_TRIES_SHIFT);
    uv_timer_init(f->loop, &rc->timer);
    rc->timer.data = rc;
    uv_timer_start(&rc->timer, recheck_cb,
                   tries == 0 ? DURABLE_RECHECK_FIRST_MS : DURABLE_RECHECK_MS, 0);
}
