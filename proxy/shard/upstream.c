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
#include "redo.h"
#include "log.h"
#include "router.h"
#include "server.h"
#include "session.h"
#include "tls.h"
#include "workers.h"

/* A replicas_ack WAIT unanswered this long has the replicas asked for an
 * ACK directly (shard_ops->ask_replica_acks); again at most this often. */
#define WAIT_SLOW_MS 50

#define BACKOFF_MIN_MS 50
#define BACKOFF_MAX_MS 1000
/* A Redis user no session is authenticated as keeps its links (and its
 * password) this long, so clients that connect, authenticate and leave in
 * turn do not open a link each. */
#define IDENT_LINGER_MS 10000
/* A user whose credentials Redis just refused is remembered this long, so
 * the clients waiting on that answer get it (and a retry with the same
 * password within it gets the same answer without a new link). */
#define IDENT_REJECTED_MS 1000
/* An idle pooled link above upstream.pool_idle is closed after this long. */
#define POOL_OVER_MS 2000

static void upstream_connect_shared(upstream *up, ident *id);
static void upstream_set_state(upstream *up, upstream_state st, const char *reason);
static void upstream_retarget(upstream *up, const char *why);

/* ---------------------------------------------------------------- helpers */

const char *upstream_name(const upstream *up)
{
    return up->target_set ? up->name : "";
}

/* ---------------------------------------------------------------- address */

static void addr_text(const struct sockaddr_storage *ss, char *out, size_t len)
{
    if (ss->ss_family == AF_INET6) {
        uv_ip6_name((const struct sockaddr_in6 *)ss, out, len);
    } else {
        uv_ip4_name((const struct sockaddr_in *)ss, out, len);
    }
}

/* The fixed master of the configuration: a unix path or a numeric address
 * is the target at once; a name is resolved first (upstream_resolve). */
static void fixed_target(upstream *up, const config_addr *a)
{
    if (a->is_unix) {
        up->is_unix = 1;
        snprintf(up->path, sizeof(up->path), "%s", a->path);
        snprintf(up->name, sizeof(up->name), "unix:%s", a->path);
        up->target_set = 1;
        return;
    }
    snprintf(up->name, sizeof(up->name), strchr(a->host, ':') ? "[%s]:%d" : "%s:%d", a->host,
             a->port);
    if (server_numeric_addr(a->host, a->port, &up->addr) == 0) {
        up->target_set = 1;
        return;
    }
    up->host_name = a; /* no target until it resolves */
}

static void resolved_cb(uv_getaddrinfo_t *req, int status, struct addrinfo *res)
{
    upstream *up = req->data;
    ferry *f = up->f;
    uint64_t now = uv_now(f->loop);
    struct sockaddr_storage ss;
    char at[64], was[64];

    up->resolving = 0;
    if (status == UV_EAI_CANCELED || f->stopping || f->closed) {
        uv_freeaddrinfo(res);
        return;
    }
    if (server_resolved_addr(status, res, &ss) < 0) {
        if (!up->resolve_failing) {
            log_warn("upstream: cannot resolve %s: %s; retrying", up->name,
                     status < 0 ? uv_strerror(status) : "no address");
        }
        up->resolve_failing = 1;
        up->next_connect_ms = now + up->backoff_ms;
        up->backoff_ms = up->backoff_ms * 2 > BACKOFF_MAX_MS ? BACKOFF_MAX_MS : up->backoff_ms * 2;
        return;
    }
    addr_text(&ss, at, sizeof(at));
    if (up->target_set && memcmp(&ss, &up->addr, sizeof(ss)) != 0) {
        char why[512];
        addr_text(&up->addr, was, sizeof(was));
        snprintf(why, sizeof(why), "%s now resolves to %s (was %s): a new master", up->name, at,
                 was);
        log_warn("upstream: %s", why);
        if (up->state == UP_UP) {
            upstream_switch(up, why);
        }
        memcpy(&up->addr, &ss, sizeof(ss));
        upstream_retarget(up, why);
    } else {
        if (!up->target_set || up->resolve_failing) {
            log_info("upstream: %s resolves to %s", up->name, at);
        }
        memcpy(&up->addr, &ss, sizeof(ss));
        up->target_set = 1;
    }
    up->resolve_failing = 0;
    upstream_connect_shared(up, &up->self);
}

/* A fixed master given by a name: resolve it again (off the loop) before
 * the shared links reconnect; resolved_cb connects them. */
static void upstream_resolve(upstream *up)
{
    const config_addr *a = up->host_name;
    if (up->resolving) {
        return;
    }
    int rc = server_resolve(up->f->loop, &up->gai, resolved_cb, a->host, a->port, up);
    if (rc < 0) {
        log_warn("upstream: cannot resolve %s: %s", up->name, uv_strerror(rc));
        up->next_connect_ms = uv_now(up->f->loop) + up->backoff_ms;
        return;
    }
    up->resolving = 1;
}

/* ------------------------------------------------------------- lifecycle */

upstream *upstream_new(ferry *f)
{
    upstream *up = xcalloc(1, sizeof(*up));
    up->f = f;
    if (f->worker_index > 0) {
        snprintf(up->tag, sizeof(up->tag), "worker %d: ", f->worker_index);
    }
    list_init(&up->links);
    list_init(&up->self.pool[0]);
    list_init(&up->self.pool[1]);
    list_init(&up->self.node);
    up->self.up = up;
    list_init(&up->idents);
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
    if (f->cfg->has_cluster) {
        up->target_set = 0; /* the cluster map will name the shard's master */
        snprintf(up->name, sizeof(up->name), "(no master yet)");
        return up;
    }
    fixed_target(up, &f->cfg->redis_addr);
    up->epoch = 1;
    if (up->host_name != NULL) {
        upstream_resolve(up);
    } else {
        upstream_connect_shared(up, &up->self);
    }
    return up;
}

void upstream_close(upstream *up)
{
    list_node *n, *t;
    fence_nudge_close(up);
    if (up->resolving) {
        uv_cancel((uv_req_t *)&up->gai); /* resolved_cb runs anyway and frees */
    }
    list_foreach_safe(n, t, &up->links)
    {
        link *l = list_entry(n, link, node);
        if (l->state != LINK_CLOSING) {
            link_close(l, "ferry is stopping");
        }
    }
}

static void ident_free(ident *id)
{
    list_del(&id->node);
    if (id->pass != NULL) {
        explicit_bzero(id->pass, strlen(id->pass));
    }
    free(id->pass);
    free(id->user);
    free(id);
}

void upstream_free(upstream *up)
{
    while (!list_empty(&up->idents)) {
        ident_free(list_entry(list_first(&up->idents), ident, node));
    }
    fence_verdicts_free(up);
    redo_free(up);
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
        log_info("%smaster view: %s -> UP(%s, epoch %llu) after %llu ms: %s", up->tag,
                 upstream_state_name(old), up->name, (unsigned long long)up->epoch,
                 (unsigned long long)took, reason);
        if (up->nrecent > 0) {
            switch_record *sw = &up->recent[(up->nrecent - 1) % UPSTREAM_RECENT_SWITCHES];
            if (sw->end_ms == 0) {
                sw->end_ms = now > sw->start_ms ? now : sw->start_ms + 1;
                snprintf(sw->to, sizeof(sw->to), "%s", up->name);
            }
        }
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
        log_warn("%smaster view: %s(%s) -> %s: %s", up->tag, upstream_state_name(old),
                 up->target_set ? up->name : "none", upstream_state_name(st), reason);
        if (old == UP_UP) {
            up->down_since_ms = now;
            up->switch_started_ms = now;
            up->switches++;
            snprintf(up->last_reason, sizeof(up->last_reason), "%s", reason);
            switch_record *sw = &up->recent[up->nrecent++ % UPSTREAM_RECENT_SWITCHES];
            memset(sw, 0, sizeof(*sw));
            sw->start_ms = now;
            snprintf(sw->reason, sizeof(sw->reason), "%s", reason);
            snprintf(sw->from, sizeof(sw->from), "%s", up->target_set ? up->name : "");
        }
        if (st == UP_DOWN && up->nrecent > 0) {
            switch_record *sw = &up->recent[(up->nrecent - 1) % UPSTREAM_RECENT_SWITCHES];
            sw->went_down |= sw->end_ms == 0;
        }
    }
    up->state = st;
}

/* Slots of ferry's own missing shared links (of the protocols in use). */
static int upstream_missing_shared(const upstream *up)
{
    int missing = 0;
    for (int p = 0; p < (up->self.want3 ? 2 : 1); p++) {
        for (int i = 0; i < up->nshared; i++) {
            missing += up->self.shared[p][i] == NULL;
        }
    }
    return missing;
}

/* (Re)open every missing shared link of id: the RESP2 set always, the RESP3
 * set once a RESP3 client asked for it. ferry's own are verified (ROLE,
 * durability: fence.c); a user's once Redis accepts its AUTH. */
static void upstream_connect_shared(upstream *up, ident *id)
{
    if (!up->target_set) {
        return;
    }
    for (int p = 0; p < (id->want3 ? 2 : 1); p++) {
        for (int i = 0; i < up->nshared; i++) {
            if (id->shared[p][i] == NULL) {
                link *l = link_new(up, LINK_SHARED, p + 2, id);
                if (l == NULL) {
                    continue;
                }
                l->slot = i;
                id->shared[p][i] = l;
            }
        }
    }
}

link *upstream_shared(upstream *up, ident *id, uint64_t hint, int proto)
{
    int p = proto == 3;
    if (id == NULL) {
        id = &up->self;
    }
    if (up->state != UP_UP) {
        return NULL;
    }
    int opened = 0;
    if (p == 1 && !id->want3) {
        id->want3 = 1;
        log_info("upstream: opening RESP3 shared links for RESP3 clients%s%s",
                 id->user != NULL ? " of user " : "", id->user != NULL ? id->user : "");
        upstream_connect_shared(up, id);
        opened = 1;
    }
    link *ready = NULL;
    int missing = 0;
    for (int i = 0; i < up->nshared; i++) {
        link *l = id->shared[p][(hint + (uint64_t)i) % (uint64_t)up->nshared];
        if (l != NULL && l->state == LINK_READY && ready == NULL) {
            ready = l;
        }
        missing += l == NULL;
    }
    /* ferry's own links are reopened by the tick (with backoff); a user's
     * when a client needs them, not before its backoff. */
    if (missing > 0 && !opened && id != &up->self && uv_now(up->f->loop) >= id->next_open_ms) {
        upstream_connect_shared(up, id);
    }
    return ready;
}

/* ------------------------------------------------------------- identities */

static ident *ident_find(upstream *up, const char *user, size_t ulen)
{
    list_node *n;
    list_foreach(n, &up->idents)
    {
        ident *id = list_entry(n, ident, node);
        if (strlen(id->user) == ulen && memcmp(id->user, user, ulen) == 0) {
            return id;
        }
    }
    return NULL;
}

void upstream_ident_set_pass(ident *id, const char *pass, size_t plen)
{
    if (id->pass != NULL && strlen(id->pass) == plen && memcmp(id->pass, pass, plen) == 0) {
        return;
    }
    if (id->pass != NULL) {
        explicit_bzero(id->pass, strlen(id->pass));
        free(id->pass);
    }
    id->pass = xstrndup(pass, plen);
}

ident *upstream_ident(upstream *up, const char *user, size_t ulen, const char *pass, size_t plen)
{
    ident *id = ident_find(up, user, ulen);
    if (id != NULL) {
        return id;
    }
    id = xcalloc(1, sizeof(*id));
    id->up = up;
    id->user = xstrndup(user, ulen);
    upstream_ident_set_pass(id, pass, plen);
    list_init(&id->pool[0]);
    list_init(&id->pool[1]);
    id->idle_since_ms = uv_now(up->f->loop);
    list_add_tail(&up->idents, &id->node);
    log_info("upstream: links for Redis user '%s' opened on demand", id->user);
    return id;
}

ident *upstream_ident_on(upstream *up, ident *anchor)
{
    if (anchor == NULL || anchor->user == NULL || anchor->up == up) {
        return anchor;
    }
    size_t plen = anchor->pass != NULL ? strlen(anchor->pass) : 0;
    ident *id = upstream_ident(up, anchor->user, strlen(anchor->user), anchor->pass, plen);
    if (id->pass != NULL && anchor->pass != NULL && strcmp(id->pass, anchor->pass) != 0) {
        /* Another client of the user authenticated with another password
         * since: the one Redis accepted last opens this view's links. */
        upstream_ident_set_pass(id, anchor->pass, plen);
        if (id->rejected) {
            id->rejected = 0;
            id->next_open_ms = 0;
            id->idle_since_ms = uv_now(up->f->loop);
        }
    }
    return id;
}

void upstream_ident_hold(ident *id)
{
    id->refs++;
}

void upstream_ident_release(upstream *up, ident *id)
{
    if (id == NULL) {
        return;
    }
    ferry_assert(id->refs > 0);
    if (--id->refs == 0) {
        id->idle_since_ms = uv_now(up->f->loop);
    }
}

/* Close every link of id that is not lent to a session. */
static void ident_close_links(upstream *up, ident *id, const char *why)
{
    list_node *n, *t;
    list_foreach_safe(n, t, &up->links)
    {
        link *l = list_entry(n, link, node);
        if (l->who == id && l->owner == NULL && l->state != LINK_CLOSING) {
            link_close(l, why);
        }
    }
}

void upstream_ident_rejected(link *l, const char *why)
{
    upstream *up = l->up;
    ident *id = l->who;
    ferry_assert(id->user != NULL);
    log_warn("link %llu: Redis refuses the credentials of user '%s': %s", (unsigned long long)l->id,
             id->user, why);
    id->rejected = 1;
    id->idle_since_ms = uv_now(up->f->loop);
    snprintf(id->error, sizeof(id->error), "%s", why);
    if (id->refs > 0) {
        /* Deleted, disabled or its password changed: its clients cannot be
         * served any more (Redis closes the connections of a deleted user). */
        char reason[300];
        snprintf(reason, sizeof(reason),
                 "Redis refuses the credentials of user '%s' on a new link: %s", id->user, why);
        list_node *n, *t;
        list_foreach_safe(n, t, &up->f->sessions)
        {
            session *s = list_entry(n, session, node);
            if (s->ident != NULL && s->ident->user != NULL &&
                strcmp(s->ident->user, id->user) == 0) {
                /* (cluster mode: its user on any shard's master view) */
                up->f->shard_ops->close_session(s, reason);
            }
        }
    }
    ident_close_links(up, id, "the user's credentials are refused");
}

/* Periodic: a user no session is authenticated as lets its links go after
 * IDENT_LINGER_MS (IDENT_REJECTED_MS once Redis refused it), and is
 * forgotten, its password wiped, once they are gone. */
static void ident_tick(upstream *up, uint64_t now)
{
    list_node *n, *t;
    list_foreach_safe(n, t, &up->idents)
    {
        ident *id = list_entry(n, ident, node);
        uint64_t keep = id->rejected ? IDENT_REJECTED_MS : IDENT_LINGER_MS;
        if (id->refs > 0 || now - id->idle_since_ms < keep) {
            continue;
        }
        ident_close_links(up, id, "no client is authenticated as its user");
        if (id->nlinks == 0) {
            log_info("upstream: Redis user '%s' forgotten (no client, no link)", id->user);
            ident_free(id);
        }
    }
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

/* An idle dedicated link of identity id speaking proto, from its pool or
 * new; NULL when no master is UP (or the connect failed at once). */
static link *pool_take(upstream *up, ident *id, int proto)
{
    link *l = NULL;
    list_node *pool = &id->pool[proto == 3];
    if (up->state != UP_UP) {
        return NULL;
    }
    while (!list_empty(pool)) {
        list_node *n = list_first(pool);
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
        l = link_new(up, LINK_DEDICATED, proto, id);
    }
    return l;
}

/* Whether everything in flight on l is ferry's own: the replicas_ack WAIT
 * and its ROLE behind a reply that needed no confirmation (a script's nil,
 * a pop that timed out), a receipt's clean-up, a SCRIPT LOAD. A client's
 * request still in flight (a blocked pop whose client left) is not. */
static int only_own_pending(const link *l)
{
    const list_node *n;
    list_foreach(n, &l->pending)
    {
        if (!(list_entry(n, request, lq)->flags & REQ_F_INTERNAL)) {
            return 0;
        }
    }
    return 1;
}

/* l is idle again: pooled if may_pool and it is clean, closed (with why)
 * otherwise. */
static void pool_give(upstream *up, link *l, int may_pool, const char *why)
{
    /* Pooled even past upstream.pool_idle: a link lent for each script call
     * and given back after it would otherwise be closed and opened again
     * at every call of many clients at once. The tick closes the links
     * above pool_idle that stayed idle POOL_OVER_MS (lent LIFO, the ones
     * not needed any more are those that stay idle). */
    int clean = may_pool && l->state == LINK_READY && !l->passthrough && list_empty(&l->held) &&
                l->db == 0 && !l->client_set && l->epoch == up->epoch && up->state == UP_UP &&
                up->f->cfg->pool_idle > 0 && !up->f->stopping && !l->who->rejected;
    if (clean && l->npending == 0) {
        list_add_head(&l->who->pool[l->proto == 3], &l->pool_node);
        l->pooled_ms = uv_now(up->f->loop);
        up->npool++;
        return;
    }
    if (clean && up->nreturning < up->f->cfg->pool_idle && only_own_pending(l)) {
        /* Its client is done with it and set nothing on it; what is in
         * flight is ferry's own and answers in a moment: pooled then
         * (upstream_on_returned), not closed and opened again for the next
         * call (a WAIT follows nearly every call with replicas_ack). At
         * most pool_idle wait so: WAITs slow for want of a replica (up to
         * replicas_ack_timeout_ms) would otherwise keep a link open per
         * call meanwhile. */
        l->returning = 1;
        up->nreturning++;
        log_debug("link %llu: given back with %zu of ferry's own request(s) in flight: pooled "
                  "once they are answered",
                  (unsigned long long)l->id, l->npending);
        return;
    }
    if (l->state != LINK_DRAINING && l->state != LINK_FENCING) {
        link_close(l, why);
    }
}

link *upstream_borrow(upstream *up, int proto)
{
    return pool_take(up, &up->self, proto);
}

link *upstream_borrow_as(upstream *up, ident *id, int proto)
{
    return pool_take(up, id != NULL ? id : &up->self, proto);
}

void upstream_put_back(link *l, const char *why)
{
    ferry_assert(l->owner == NULL && l->kind == LINK_DEDICATED);
    pool_give(l->up, l, 1, why);
}

link *upstream_lend(upstream *up, session *s)
{
    link *l =
        pool_take(up, s->ident != NULL ? upstream_ident_on(up, s->ident) : &up->self, s->proto);
    if (l == NULL) {
        return NULL;
    }
    lend(l, s);
    fence_bracket_open(l);
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
    up = l->up; /* the view that lent it (cluster mode: one view per shard) */
    /* What its client set on it (a name, tracking, a transaction, a
     * tunnel) would go to the next borrower: closed, whatever the caller
     * says (cluster mode: a client that moves to another shard). */
    if (may_pool && up->f->shard_ops->link_bound(s)) {
        may_pool = 0;
    }
    unlend(l);
    pool_give(up, l, may_pool, why);
}

void upstream_on_returned(link *l)
{
    l->up->nreturning--;
    /* Checked again: the master may have switched, ferry be stopping. */
    pool_give(l->up, l, 1, "given back: its master changed meanwhile");
}

void upstream_disown(link *l)
{
    unlend(l);
}

void upstream_detach(link *l, const char *reason)
{
    session *s = unlend(l);
    if (s != NULL) {
        l->f->shard_ops->on_link_closed(s, l, reason);
    }
}

/* ------------------------------------------------------------ link events */

void upstream_on_verified(upstream *up, link *l)
{
    if (up->state != UP_UP && l->who == &up->self) {
        upstream_set_state(up, UP_UP, "link connected, ROLE master, durability asserted");
    }
    up->f->wake_pending = 1; /* requests waiting for this protocol's links */
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

int upstream_settled(const upstream *up, const link *l)
{
    return l->epoch == up->epoch && up->state == UP_UP &&
           (up->switches == 0 ||
            uv_now(up->f->loop) - up->up_since_ms >= up->f->cfg->replicas_ack_hold_ms);
}

void upstream_on_link_error(link *l, const char *why)
{
    upstream *up = l->up;
    /* A user's link may be closed by Redis for the user alone (ACL DELUSER,
     * CLIENT KILL USER): only ferry's own links speak for the master. */
    if (l->epoch == up->epoch && up->state == UP_UP && l->who == &up->self &&
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
    if (l->returning) {
        l->returning = 0;
        up->nreturning--;
    }
    if (l->slot >= 0 && l->who->shared[l->proto == 3][l->slot] == l) {
        l->who->shared[l->proto == 3][l->slot] = NULL;
    }
    if (up->probe == l) {
        up->probe = NULL;
        up->nudge_pending = 0;
    }
}

void upstream_on_link_closed(upstream *up, link *l, int was_ready, const char *reason)
{
    ferry *f = up->f;
    if (l->kind != LINK_SHARED || f->stopping || l->epoch != up->epoch || l->slot < 0) {
        return;
    }
    if (l->who != &up->self) {
        if (!was_ready) {
            /* Not reopened at once: a refused connect would spin. */
            l->who->next_open_ms = uv_now(f->loop) + BACKOFF_MAX_MS;
        }
        return;
    }
    int any = 0;
    for (int i = 0; i < up->nshared; i++) {
        /* The RESP2 set is the one that is always there. */
        if (up->self.shared[0][i] != NULL && up->self.shared[0][i]->state == LINK_READY) {
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
            up->f->shard_ops->trigger_sentinel(up->f->sentinel);
        } else {
            workers_trigger_sentinel(up->f); /* a worker: the main loop asks */
        }
    } else {
        up->next_connect_ms = uv_now(up->f->loop) + up->backoff_ms;
        if (up->f->cfg->has_cluster) {
            /* Reconnects meanwhile; the map names a promoted replica. */
            up->f->shard_ops->refresh_cluster(up->f, reason);
        }
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
        /* A link with state is closed, so its owner hears of it (re-subscribes,
         * restores its settings, flushes a tracking cache): its requests are
         * retried by the retry policy. */
        int stateful =
            l->passthrough || (l->owner != NULL && l->f->shard_ops->link_bound(l->owner));
        /* Replies held for a WAIT count as in flight: closing the link
         * would leave their writes without the offset after them (the ROLE
         * queued beside that WAIT), so sent again undecided. */
        if (l->state == LINK_READY && (user > 0 || !list_empty(&l->held)) && !stateful &&
            !link_has_blocking(l)) {
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

/* A new master address is the target from now on (Sentinel named it, or
 * the name of a fixed master moved): confirmations from the old one prove
 * nothing, and no link of an older epoch takes a new request. */
static void upstream_retarget(upstream *up, const char *why)
{
    up->fence_valid = 0;
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
    up->epoch++;
    up->target_set = 1;
    up->aof_ok = 0;
    log_info("%smaster view: connecting to %s (epoch %llu): %s", up->tag, up->name,
             (unsigned long long)up->epoch, why);
    /* Shared links of an older epoch are gone (closed or fencing). */
    list_foreach_safe(n, t, &up->links)
    {
        link *l = list_entry(n, link, node);
        if (l->kind == LINK_SHARED && l->slot >= 0 && l->state != LINK_CLOSING &&
            l->epoch != up->epoch && l->who->shared[l->proto == 3][l->slot] == l) {
            link_close(l, "replaced by a new master");
        }
    }
    if (up->probe != NULL) {
        link_close(up->probe, "replaced by a new master");
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
        snprintf(sw, sizeof(sw), "%s names a new master %s (%s)",
                 up->f->cfg->has_cluster ? "the cluster map" : "Sentinel", name, why);
        upstream_switch(up, sw);
    }
    struct sockaddr_storage ss;
    if (server_numeric_addr(ip, port, &ss) != 0) {
        log_error("%s named master '%s' port %d: not a numeric address",
                  up->f->cfg->has_cluster ? "the cluster map" : "Sentinel", ip, port);
        return;
    }
    memcpy(&up->addr, &ss, sizeof(ss));
    up->is_unix = 0;
    if (strcmp(up->name, name) != 0) {
        up->backoff_ms = BACKOFF_MIN_MS; /* a refused node keeps its backoff */
        up->next_connect_ms = 0;
    }
    snprintf(up->name, sizeof(up->name), "%s", name);
    upstream_retarget(up, why);
    if (uv_now(up->f->loop) >= up->next_connect_ms) {
        upstream_connect_shared(up, &up->self);
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
        up->probe = p = link_new(up, LINK_PROBE, 2, NULL);
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
    fence_learn_replid(up, p, now);
}

int upstream_down(const upstream *up)
{
    return up->state == UP_DOWN &&
           uv_now(up->f->loop) - up->down_since_ms >= up->f->cfg->fallback_after_ms;
}

void upstream_retry_now(upstream *up)
{
    up->backoff_ms = BACKOFF_MIN_MS;
    up->next_connect_ms = 0;
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

    if (!f->stopping && (up->target_set || up->host_name != NULL) && now >= up->next_connect_ms &&
        upstream_missing_shared(up) > 0) {
        if (up->host_name != NULL) {
            upstream_resolve(up); /* every reconnect follows the name */
        } else {
            upstream_connect_shared(up, &up->self);
        }
    }
    ident_tick(up, now);
    if (up->state == UP_SWITCHING && now - up->switch_started_ms >= cfg->fallback_after_ms) {
        char why[160];
        snprintf(why, sizeof(why), "no usable master for %llu ms (fallback.after_ms)",
                 (unsigned long long)(now - up->switch_started_ms));
        upstream_set_state(up, UP_DOWN, why);
        f->wake_pending = 1; /* held queue writes may go to the fallback store now */
    }
    if (up->state == UP_UP && up->self.shared[0][0] != NULL &&
        up->self.shared[0][0]->state == LINK_READY) {
        link *l = up->self.shared[0][0];
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
    int wait_slow = 0;
    list_foreach_safe(n, t, &up->links)
    {
        link *l = list_entry(n, link, node);
        if (l->state == LINK_CLOSING) {
            continue;
        }
        /* redis.tls: a link of any kind whose handshake has not ended is
         * bounded as a connect is (a node that stalls mid-handshake). */
        int tls_stalled =
            l->out.tls != NULL && !tls_ready(l->out.tls) && l->state != LINK_CONNECTING;
        if ((l->state == LINK_CONNECTING || l->state == LINK_VERIFYING || tls_stalled) &&
            now - l->opened_ms >= cfg->connect_timeout_ms) {
            l->f->stats.upstream_errors++;
            if (tls_stalled) {
                tls_count_failure(l->out.tls, TLS_FAIL_TIMEOUT);
            }
            link_close(l, l->state == LINK_CONNECTING ? "connect timeout"
                          : tls_stalled ? "TLS handshake timeout (upstream.connect_timeout_ms)"
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
        if (list_linked(&l->pool_node) && up->npool > cfg->pool_idle &&
            now - l->pooled_ms >= POOL_OVER_MS) {
            link_close(l, "idle above upstream.pool_idle");
            continue;
        }
        if (fence_check(l, now)) {
            continue;
        }
        if (l->state == LINK_READY && l->nwaits > 0 && now - l->wait_sent_ms >= WAIT_SLOW_MS &&
            !fence_wait_queued(l)) {
            wait_slow = 1;
        }
        /* Keep idle links alive through Redis' own 'timeout' and NATs. A link
         * inside MULTI or in a pass-through tunnel must not see a stray PING. */
        if (l->state == LINK_READY && l->kind != LINK_PROBE && cfg->ping_interval_ms > 0 &&
            l->npending == 0 && !l->passthrough && !l->ping_pending &&
            now - l->last_io_ms >= cfg->ping_interval_ms &&
            (l->owner == NULL || !l->f->shard_ops->holds_state(l->owner))) {
            /* A user may not be allowed PING (and each refusal would land in
             * ACL LOG): HELLO with no argument runs for every user, and
             * changes nothing. */
            static const char *const ping[] = {"PING"};
            static const char *const hello[] = {"HELLO"};
            l->ping_pending = 1;
            l->ping_sent_ms = now;
            link_internal(l, l->who->user != NULL ? hello : ping, 1, ping_done, 0);
            l->last_io_ms = now;
        }
    }
    if (wait_slow && up->sentinel_mode && now - up->acks_asked_ms >= WAIT_SLOW_MS) {
        /* A replica Redis counts online may still not be sent the GETACK of
         * a WAIT: after a diskless full resync (the usual one for the
         * replica left behind by a failover) Redis streams nothing to it
         * until its next ACK, which comes once a second. Asked directly,
         * the replica sends that ACK now. */
        up->acks_asked_ms = now;
        log_debug("replicas_ack: a WAIT on %s is unanswered after %d ms; asking the replicas "
                  "for an ACK",
                  up->name, WAIT_SLOW_MS);
        if (f->sentinel != NULL) {
            f->shard_ops->ask_replica_acks(f->sentinel);
        } else {
            workers_ask_replica_acks(f); /* a worker: the main loop asks */
        }
    }
}
