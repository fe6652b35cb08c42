/* upstream.c - the master view and the link pool.
 *
 * The master view is UP, SWITCHING or DOWN, changed only by
 * upstream_set_state. At the first sign of a failover (link error,
 * READONLY/LOADING/MASTERDOWN/UNBLOCKED, a Sentinel event) nothing new is
 * sent to the old master: links with requests in flight are fenced
 * (fence.c), links with a blocked call drain a moment, the rest close.
 * Shared links pipeline the stateless commands of all sessions; dedicated
 * links are lent to one session (upstream_lend / upstream_return) and
 * pooled afterwards. */
#include "upstream.h"

#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "fence.h"
#include "log.h"
#include "router.h"
#include "sentinel.h"
#include "server.h"
#include "session.h"

#define BACKOFF_MIN_MS 50
#define BACKOFF_MAX_MS 1000

static void upstream_connect_shared(upstream *up);
static void upstream_set_state(upstream *up, upstream_state st, const char *reason);

/* ---------------------------------------------------------------- helpers */

const char *upstream_state_name(upstream_state st)
{
    switch (st) {
    case UP_UP:
        return "UP";
    case UP_SWITCHING:
        return "SWITCHING";
    default:
        return "DOWN";
    }
}

const char *upstream_name(const upstream *up)
{
    return up->target_set ? up->name : "";
}

/* ---------------------------------------------------------------- address */

static int resolve(upstream *up, const config_addr *a)
{
    memset(&up->addr, 0, sizeof(up->addr));
    if (a->is_unix) {
        up->is_unix = 1;
        snprintf(up->path, sizeof(up->path), "%s", a->path);
        snprintf(up->name, sizeof(up->name), "unix:%s", a->path);
        return 0;
    }
    struct addrinfo hints, *res = NULL;
    char port[16];
    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    snprintf(port, sizeof(port), "%d", a->port);
    int rc = getaddrinfo(a->host, port, &hints, &res);
    if (rc != 0 || res == NULL) {
        log_error("upstream: cannot resolve %s: %s", a->host, gai_strerror(rc));
        return -1;
    }
    memcpy(&up->addr, res->ai_addr, res->ai_addrlen);
    freeaddrinfo(res);
    if (strchr(a->host, ':') != NULL) {
        snprintf(up->name, sizeof(up->name), "[%s]:%d", a->host, a->port);
    } else {
        snprintf(up->name, sizeof(up->name), "%s:%d", a->host, a->port);
    }
    return 0;
}

/* ------------------------------------------------------------- lifecycle */

upstream *upstream_new(ferry *f)
{
    upstream *up = xcalloc(1, sizeof(*up));
    up->f = f;
    list_init(&up->links);
    list_init(&up->pool);
    up->nshared = f->cfg->shared_links;
    if (up->nshared < 1) {
        up->nshared = 1;
    }
    if (up->nshared > 64) {
        up->nshared = 64;
    }
    up->state = UP_DOWN;
    up->down_since_ms = uv_now(f->loop);
    up->switch_started_ms = up->down_since_ms;
    up->backoff_ms = BACKOFF_MIN_MS;
    up->epoch = 0;
    snprintf(up->last_reason, sizeof(up->last_reason), "starting");
    up->replicas_ack = f->cfg->replicas_ack >= 0 ? f->cfg->replicas_ack : f->cfg->has_sentinel;
    if (f->cfg->has_sentinel) {
        up->sentinel_mode = 1;
        up->target_set = 0; /* Sentinel will name the master */
        return up;
    }
    if (resolve(up, &f->cfg->redis_addr) != 0) {
        free(up);
        return NULL;
    }
    up->target_set = 1;
    up->epoch = 1;
    upstream_connect_shared(up);
    return up;
}

void upstream_close(upstream *up)
{
    list_node *n, *t;
    list_foreach_safe(n, t, &up->links)
    {
        link *l = list_entry(n, link, node);
        if (l->state != LINK_CLOSING) {
            link_close(l, "ferry is stopping");
        }
    }
}

void upstream_free(upstream *up)
{
    free(up);
}

static void upstream_set_state(upstream *up, upstream_state st, const char *reason)
{
    static const unsigned legal[] = {
        [UP_DOWN] = 1u << UP_UP,
        [UP_SWITCHING] = 1u << UP_UP | 1u << UP_DOWN,
        [UP_UP] = 1u << UP_SWITCHING,
    };
    if (up->state == st) {
        return;
    }
    ferry_assert(legal[up->state] & (1u << st));
    uint64_t now = uv_now(up->f->loop);
    upstream_state old = up->state;
    if (st == UP_UP) {
        uint64_t took = now - up->switch_started_ms;
        log_info("master view: %s -> UP(%s, epoch %llu) after %llu ms: %s",
                 upstream_state_name(old), up->name, (unsigned long long)up->epoch,
                 (unsigned long long)took, reason);
        if (up->switches > 0) {
            up->last_switch_ms = took;
            if (took > up->longest_switch_ms) {
                up->longest_switch_ms = took;
            }
        }
        up->up_since_ms = now;
        up->backoff_ms = BACKOFF_MIN_MS;
        up->f->wake_pending = 1;
    } else {
        log_warn("master view: %s(%s) -> %s: %s", upstream_state_name(old),
                 up->target_set ? up->name : "none", upstream_state_name(st), reason);
        if (old == UP_UP) {
            up->down_since_ms = now;
            up->switch_started_ms = now;
            up->switches++;
            snprintf(up->last_reason, sizeof(up->last_reason), "%s", reason);
        }
    }
    up->state = st;
}

/* (Re)open every missing shared link. */
static void upstream_connect_shared(upstream *up)
{
    if (!up->target_set) {
        return;
    }
    for (int i = 0; i < up->nshared; i++) {
        if (up->shared[i] == NULL) {
            link *l = link_new(up, LINK_SHARED);
            if (l == NULL) {
                continue;
            }
            l->slot = i;
            up->shared[i] = l;
        }
    }
}

link *upstream_shared(upstream *up, uint64_t hint)
{
    if (up->state != UP_UP) {
        return NULL;
    }
    for (int i = 0; i < up->nshared; i++) {
        link *l = up->shared[(hint + (uint64_t)i) % (uint64_t)up->nshared];
        if (l != NULL && l->state == LINK_READY) {
            return l;
        }
    }
    return NULL;
}

/* --------------------------------------------------------- lending links */

/* The only two functions that tie and untie a session and a link. */
static void lend(link *l, session *s)
{
    ferry_assert(l->owner == NULL && s->dlink == NULL);
    l->owner = s;
    s->dlink = l;
    log_debug("link %llu lent to client %llu", (unsigned long long)l->id,
              (unsigned long long)s->id);
}

static session *unlend(link *l)
{
    session *s = l->owner;
    if (s != NULL) {
        ferry_assert(s->dlink == l);
        s->dlink = NULL;
        l->owner = NULL;
    }
    return s;
}

static void select_done(link *l, request *r, const char *reply, size_t len)
{
    if (reply != NULL && len > 0 && reply[0] == '-') {
        char why[200];
        link_error_text(reply, len, why, sizeof(why));
        log_error("link %llu: SELECT refused by Redis: %s", (unsigned long long)l->id, why);
        link_close(l, "SELECT refused");
    }
}

link *upstream_lend(upstream *up, session *s)
{
    link *l = NULL;
    if (up->state != UP_UP) {
        return NULL;
    }
    while (!list_empty(&up->pool)) {
        list_node *n = list_first(&up->pool);
        l = list_entry(n, link, pool_node);
        list_del(n);
        up->npool--;
        if (l->state == LINK_READY && l->epoch == up->epoch) {
            break;
        }
        link_close(l, "stale in pool");
        l = NULL;
    }
    if (l == NULL) {
        l = link_new(up, LINK_DEDICATED);
        if (l == NULL) {
            return NULL;
        }
    }
    lend(l, s);
    if (l->db != s->db) {
        char db[16];
        snprintf(db, sizeof(db), "%d", s->db);
        const char *argv[] = {"SELECT", db};
        link_internal(l, argv, 2, select_done, 0);
        l->db = s->db;
    }
    return l;
}

void upstream_return(upstream *up, session *s, int may_pool, const char *why)
{
    link *l = s->dlink;
    if (l == NULL) {
        return;
    }
    unlend(l);
    if (may_pool && l->state == LINK_READY && !l->passthrough && l->npending == 0 &&
        list_empty(&l->held) && l->db == 0 && l->epoch == up->epoch && up->state == UP_UP &&
        up->npool < up->f->cfg->pool_idle && !up->f->stopping) {
        list_add_head(&up->pool, &l->pool_node);
        up->npool++;
        return;
    }
    if (l->state != LINK_DRAINING && l->state != LINK_FENCING) {
        link_close(l, why);
    }
}

void upstream_disown(link *l)
{
    unlend(l);
}

void upstream_detach(link *l, const char *reason)
{
    session *s = unlend(l);
    if (s != NULL) {
        router_on_link_closed(s, l, reason);
    }
}

/* ------------------------------------------------------------ link events */

void upstream_on_verified(upstream *up, link *l)
{
    if (up->state != UP_UP) {
        upstream_set_state(up, UP_UP, "link connected, ROLE master, durability asserted");
    }
}

void upstream_on_not_master(link *l, const char *why)
{
    upstream *up = l->up;
    if (l->epoch != up->epoch) {
        return;
    }
    if (up->state == UP_UP) {
        upstream_switch(up, why);
    }
    if (l->kind == LINK_SHARED && up->sentinel_mode) {
        up->target_set = 0; /* the next poll round names a master again */
    }
}

void upstream_on_link_error(link *l, const char *why)
{
    upstream *up = l->up;
    if (l->epoch == up->epoch && up->state == UP_UP &&
        (l->kind != LINK_DEDICATED || l->npending > 0 || l->state == LINK_CONNECTING)) {
        /* A master connection broke: hold everything until we know which
         * master to use (Sentinel) or it is back (fixed). */
        char sw[500];
        snprintf(sw, sizeof(sw), "link %llu to %s: %s", (unsigned long long)l->id, up->name, why);
        upstream_switch(up, sw);
    }
}

void upstream_on_link_closing(upstream *up, link *l)
{
    if (list_linked(&l->pool_node)) {
        list_del(&l->pool_node);
        up->npool--;
    }
    if (l->slot >= 0 && up->shared[l->slot] == l) {
        up->shared[l->slot] = NULL;
    }
    if (up->probe == l) {
        up->probe = NULL;
    }
}

void upstream_on_link_closed(upstream *up, link *l, int was_ready, const char *reason)
{
    ferry *f = up->f;
    if (l->kind != LINK_SHARED || f->stopping || l->epoch != up->epoch || l->slot < 0) {
        return;
    }
    int any = 0;
    for (int i = 0; i < up->nshared; i++) {
        if (up->shared[i] != NULL && up->shared[i]->state == LINK_READY) {
            any = 1;
        }
    }
    if (!any && up->state == UP_UP) {
        upstream_switch(up, reason);
    }
    uint64_t now = uv_now(f->loop);
    if (was_ready) {
        up->next_connect_ms = now; /* a working link broke: retry at once */
    } else {
        up->next_connect_ms = now + up->backoff_ms;
        up->backoff_ms = up->backoff_ms * 2 > BACKOFF_MAX_MS ? BACKOFF_MAX_MS : up->backoff_ms * 2;
    }
}

/* ----------------------------------------------------------------- switch */

static int link_has_blocking(const link *l)
{
    const list_node *n;
    list_foreach(n, &l->pending)
    {
        const request *r = list_entry(n, request, lq);
        if (r->flags & REQ_F_BLOCKING) {
            return 1;
        }
    }
    return 0;
}

static int link_deadline_passed(const link *l, uint64_t now)
{
    const list_node *n;
    list_foreach(n, &l->pending)
    {
        const request *r = list_entry(n, request, lq);
        if ((r->flags & REQ_F_BLOCKING) && r->deadline != 0 && now >= r->deadline) {
            return 1;
        }
    }
    return 0;
}

void upstream_switch(upstream *up, const char *reason)
{
    list_node *n, *t;
    if (up->state != UP_UP) {
        return;
    }
    upstream_set_state(up, UP_SWITCHING, reason);
    up->fence_valid = 1;
    if (up->sentinel_mode) {
        up->target_set = 0;
        if (up->f->sentinel != NULL) {
            sentinel_trigger(up->f->sentinel);
        }
    } else {
        up->next_connect_ms = uv_now(up->f->loop) + up->backoff_ms;
    }
    up->epoch++; /* links of the old epoch never take a new request */
    list_foreach_safe(n, t, &up->links)
    {
        link *l = list_entry(n, link, node);
        if (l->state == LINK_CLOSING || l->state == LINK_FENCING || l->state == LINK_DRAINING) {
            continue;
        }
        size_t user = 0;
        list_node *m;
        list_foreach(m, &l->pending)
        {
            if (!(list_entry(m, request, lq)->flags & REQ_F_INTERNAL)) {
                user++;
            }
        }
        int stateful = l->passthrough || (l->owner != NULL && router_holds_state(l->owner));
        if (l->state == LINK_READY && user > 0 && !stateful && !link_has_blocking(l)) {
            fence_start(l);
        } else if (l->state == LINK_READY && !stateful && link_has_blocking(l)) {
            /* A pop the old master serves right now must still reach its
             * client: keep the link a moment, then re-issue the call. */
            link_set_state(l, LINK_DRAINING);
            l->drain_until_ms = uv_now(up->f->loop) + up->f->cfg->drain_ms;
            if (list_linked(&l->pool_node)) {
                list_del(&l->pool_node);
                up->npool--;
            }
        } else {
            link_close(l, "master switch");
        }
    }
}

void upstream_set_master(upstream *up, const char *ip, int port, const char *why)
{
    char name[300];
    snprintf(name, sizeof(name), strchr(ip, ':') ? "[%s]:%d" : "%s:%d", ip, port);
    int same = up->target_set && strcmp(name, up->name) == 0;
    if (same) {
        return; /* connected or connecting already */
    }
    if (up->state == UP_UP) {
        char sw[400];
        snprintf(sw, sizeof(sw), "Sentinel names a new master %s (%s)", name, why);
        upstream_switch(up, sw);
    }
    struct sockaddr_storage ss;
    if (server_numeric_addr(ip, port, &ss) != 0) {
        log_error("Sentinel named master '%s' port %d: not a numeric address", ip, port);
        return;
    }
    memcpy(&up->addr, &ss, sizeof(ss));
    up->is_unix = 0;
    up->fence_valid = 0; /* a new master: old confirmations no longer prove anything */
    /* ... so a fence still waiting on the old master would only end in a
     * retry: let its requests go to the new master now. */
    list_node *n, *t;
    list_foreach_safe(n, t, &up->links)
    {
        link *l = list_entry(n, link, node);
        if (l->state == LINK_FENCING) {
            link_close(l, "a new master is named: the fence no longer counts");
        }
    }
    if (strcmp(up->name, name) != 0) {
        up->backoff_ms = BACKOFF_MIN_MS; /* a refused node keeps its backoff */
        up->next_connect_ms = 0;
    }
    snprintf(up->name, sizeof(up->name), "%s", name);
    up->epoch++;
    up->target_set = 1;
    up->aof_ok = 0;
    log_info("master view: connecting to %s (epoch %llu): %s", up->name,
             (unsigned long long)up->epoch, why);
    /* Shared links of an older epoch are gone (closed or fencing). */
    for (int i = 0; i < up->nshared; i++) {
        if (up->shared[i] != NULL && up->shared[i]->epoch != up->epoch) {
            link_close(up->shared[i], "replaced by a new master");
        }
    }
    if (up->probe != NULL) {
        link_close(up->probe, "replaced by a new master");
    }
    if (uv_now(up->f->loop) >= up->next_connect_ms) {
        upstream_connect_shared(up);
    }
}

/* --------------------------------------------------------------- periodic */

static void ping_done(link *l, request *r, const char *reply, size_t len)
{
    l->ping_pending = 0;
}

static void probe_done(link *l, request *r, const char *reply, size_t len)
{
    l->ping_pending = 0;
    l->up->probe_ok_ms = uv_now(l->f->loop);
}

/* The health probe: its own connection, so its PING never waits behind
 * client traffic, and any answer (even -BUSY) proves the master alive. */
static void upstream_probe(upstream *up, uint64_t now)
{
    const config *cfg = up->f->cfg;
    if (cfg->health_timeout_ms == 0 || cfg->ping_interval_ms == 0) {
        return;
    }
    if (up->state != UP_UP) {
        if (up->probe != NULL) {
            link_close(up->probe, "master view not UP");
        }
        return;
    }
    if (up->probe_ok_ms < up->up_since_ms) {
        up->probe_ok_ms = up->up_since_ms;
    }
    if (now - up->probe_ok_ms >= cfg->health_timeout_ms) {
        char why[400];
        snprintf(why, sizeof(why), "health probe: no reply from %s for %llu ms (frozen master?)",
                 up->name, (unsigned long long)(now - up->probe_ok_ms));
        up->f->stats.upstream_errors++;
        upstream_switch(up, why);
        return;
    }
    link *p = up->probe;
    if (p == NULL) {
        if (now < up->next_probe_ms) {
            return;
        }
        up->probe = p = link_new(up, LINK_PROBE);
        if (p == NULL) {
            up->next_probe_ms = now + cfg->ping_interval_ms;
            return;
        }
    }
    if (!p->ping_pending && now >= up->next_probe_ms) {
        static const char *const argv[] = {"PING"};
        p->ping_pending = 1;
        p->ping_sent_ms = now;
        up->next_probe_ms = now + cfg->ping_interval_ms;
        link_internal(p, argv, 1, probe_done, 0);
    }
}

void upstream_give_up(upstream *up, const char *why)
{
    if (up->state == UP_SWITCHING) {
        upstream_set_state(up, UP_DOWN, why);
        up->f->wake_pending = 1; /* held queue writes may go to the fallback store now */
    }
}

void upstream_tick(upstream *up, uint64_t now)
{
    ferry *f = up->f;
    const config *cfg = f->cfg;
    list_node *n, *t;

    if (!f->stopping && up->target_set && now >= up->next_connect_ms) {
        int missing = 0;
        for (int i = 0; i < up->nshared; i++) {
            missing += up->shared[i] == NULL;
        }
        if (missing) {
            upstream_connect_shared(up);
        }
    }
    if (up->state == UP_SWITCHING && now - up->switch_started_ms >= cfg->fallback_after_ms) {
        char why[160];
        snprintf(why, sizeof(why), "no usable master for %llu ms (fallback.after_ms)",
                 (unsigned long long)(now - up->switch_started_ms));
        upstream_set_state(up, UP_DOWN, why);
        f->wake_pending = 1; /* held queue writes may go to the fallback store now */
    }
    if (up->state == UP_UP && up->shared[0] != NULL && up->shared[0]->state == LINK_READY) {
        link *l = up->shared[0];
        if (now >= up->next_enforce_ms) {
            up->next_enforce_ms = now + cfg->enforce_interval_ms;
            fence_enforce(l);
        }
        if (up->sentinel_mode && now >= up->next_role_ms) {
            up->next_role_ms = now + cfg->sentinel_resolve_interval_ms;
            fence_recheck_role(l);
        }
    }
    if (!f->stopping) {
        upstream_probe(up, now);
    }
    list_foreach_safe(n, t, &up->links)
    {
        link *l = list_entry(n, link, node);
        if (l->state == LINK_CLOSING) {
            continue;
        }
        if ((l->state == LINK_CONNECTING || l->state == LINK_VERIFYING) &&
            now - l->opened_ms >= cfg->connect_timeout_ms) {
            l->f->stats.upstream_errors++;
            link_close(l, l->state == LINK_CONNECTING ? "connect timeout"
                                                      : "verify timeout (ROLE/CONFIG unanswered)");
            continue;
        }
        if (l->state == LINK_DRAINING && link_deadline_passed(l, now)) {
            /* The call's own timeout ran out: cancel it on the old master
             * (closing the connection) and answer it as Redis would. */
            link_close(l, "master switch: blocked call timed out while draining");
            continue;
        }
        if (l->state == LINK_DRAINING && now >= l->drain_until_ms) {
            int fences = 0;
            list_node *m;
            list_foreach(m, &up->links)
            {
                fences += list_entry(m, link, node)->state == LINK_FENCING;
            }
            if (fences == 0 || now >= l->drain_until_ms + cfg->fence_timeout_ms) {
                link_close(l, "master switch: blocked call re-issued on the next master");
                continue;
            }
        }
        if (fence_check(l, now)) {
            continue;
        }
        /* Keep idle links alive through Redis' own 'timeout' and NATs. A link
         * inside MULTI or in a pass-through tunnel must not see a stray PING. */
        if (l->state == LINK_READY && l->kind != LINK_PROBE && cfg->ping_interval_ms > 0 &&
            l->npending == 0 && !l->passthrough && !l->ping_pending &&
            now - l->last_io_ms >= cfg->ping_interval_ms &&
            (l->owner == NULL || !router_holds_state(l->owner))) {
            static const char *const argv[] = {"PING"};
            l->ping_pending = 1;
            l->ping_sent_ms = now;
            link_internal(l, argv, 1, ping_done, 0);
            l->last_io_ms = now;
        }
    }
}
