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
#include "fence.h"
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

static void send_info(link *l, long long arg)
{
    static const char *const argv[] = {"INFO", "persistence"};
    link_internal(l, argv, 2, post_done, arg);
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
    link_internal(l, argv, 2, pre_done, 0);
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
    redisReply *rr = link_parse_reply(reply, len);
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
        note_untrusted(up, "appendonly was off (aof_enabled:0); turned on again",
                       (l->state != LINK_VERIFYING));
    }
}

void durable_link_after_set(link *l, const request *set)
{
    upstream *up = l->up;
    const config *cfg = l->f->cfg;
    durable_history hist = DURABLE_UNKNOWN;
    if (set != NULL && (set->arg & ARG_HIST_MASK) == DURABLE_WAS_OFF) {
        hist = DURABLE_WAS_OFF;
    } else if ((l->state != LINK_VERIFYING) && up->aof_ok) {
        hist = DURABLE_SETTLED; /* a rewrite now is a routine one */
    }
    if (cfg->persist_config && (l->state == LINK_VERIFYING || hist != DURABLE_SETTLED)) {
        const char *argv[] = {cfg->config_command ? cfg->config_command : "CONFIG", "REWRITE"};
        link_internal(l, argv, 2, rewrite_done, 0);
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
            if (l->state == LINK_VERIFYING) {
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
    redisReply *rr = link_parse_reply(reply, len);
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
        fence_link_verified(l);
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
        fence_link_verified(l);
        return;
    }
    note_untrusted(up, why, (l->state != LINK_VERIFYING));
    if ((l->state != LINK_VERIFYING)) {
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
