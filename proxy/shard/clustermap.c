/* clustermap.c - ferry in cluster mode (clustermap.h): the topology source
 * reports a changed map (on_map); each shard of the map gets a master view
 * of its own, matched to the one it had: the view already on that master's
 * address, else the view that served the shard's slots before (its master
 * failed over: the view is pointed at the promoted replica, as Sentinel
 * points the one view at a new master), else a new view. The router reads
 * slot_up[], which a MOVED corrects until the next map. The main loop also
 * feeds every shard's replicas of the map to a replicas table (replicas.h),
 * which enforces durability on them as Sentinel mode does. */
#include "clustermap.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cluster.h"
#include "log.h"
#include "replicas.h"
#include "tls.h"
#include "upstream.h"

#define CLUSTERMAP_MAX_VIEWS (SLOTMAP_MAX_SHARDS * 2) /* master views kept */

struct clustermap_snap {
    atomic_int refs; /* loops holding it */
    uint64_t gen;    /* 1, 2, ... in the order the main loop learned them */
    slotmap m;
};

/* One loop's per-shard figures, as of its last publish. */
typedef struct loop_shard_fig {
    int shard; /* its first slot (the label) */
    uint64_t routed, held, moved, asked, links;
} loop_shard_fig;

typedef struct loop_fig {
    int n; /* shards in fig[] */
    loop_shard_fig fig[SLOTMAP_MAX_SHARDS];
    uint64_t moved, asked, crossslot, splits, tryagain, clusterdown;
} loop_fig;

/* Every other loop's figures (the main loop's clustermap owns it). */
typedef struct clustermap_board {
    uv_mutex_t lock; /* guards loops[] */
    int nloops;      /* loops[1..nloops) are the workers' */
    loop_fig *loops;
} clustermap_board;

/* What the loops route by, of the last map the main loop applied: each
 * slot's shard and each shard's master. Nodes disagree for seconds about
 * the rest (a replica's health follows the replication offset each node
 * last heard from it; a replica re-pointed after a failover), so answers
 * in turn changed the map, each change went to every loop and undid the
 * MOVED corrections of its routing: such a change is kept in the source's
 * map (stats, replicas) and sent to no loop. */
typedef struct routing {
    int16_t owner[CLUSTER_SLOTS];
    int nshards;
    char master[SLOTMAP_MAX_SHARDS][300];
} routing;

struct clustermap {
    ferry *f;
    const clustermap_ops *ops;             /* the owner's */
    cluster_source *cs;                    /* the topology source (main loop only) */
    replicas *reps;                        /* durability on the replicas (main loop only) */
    clustermap_snap *snap;                 /* another loop: the map it follows */
    uint64_t gen;                          /* the map's gen (main loop: of the last sent) */
    clustermap_board *board;               /* every loop's figures (the main loop's) */
    upstream *views[CLUSTERMAP_MAX_VIEWS]; /* every master view made */
    int nviews;
    upstream *by_shard[SLOTMAP_MAX_SHARDS]; /* the view of each shard of the last map */
    int nshards;                            /* shards in the last map */
    int by_slot[SLOTMAP_MAX_SHARDS];        /* shard indexes in the order of their first slot */
    upstream *slot_up[CLUSTER_SLOTS];       /* the view serving each slot, NULL none */
    uint64_t moved, asked, crossslot;       /* redirects followed, refusals */
    uint64_t splits;                        /* requests split across slots (split.c) */
    uint64_t tryagain, clusterdown;         /* refusals held and sent again */
    routing *applied;                       /* main loop: the routing of the last map applied */
    uint64_t meta_changes;                  /* main loop: map changes that kept the routing */
};

/* The map the router follows: the source's on the main loop, the last
 * snapshot sent on another. */
static const slotmap *map_of(const clustermap *cm)
{
    return cm->cs != NULL ? cluster_map(cm->cs) : &cm->snap->m;
}

/* ==== the JSON document ==== */

static void json_str(buf *b, const char *s)
{
    buf_append_str(b, "\"");
    for (; *s != '\0'; s++) {
        unsigned char ch = (unsigned char)*s;
        char esc[8];
        if (ch == '"' || ch == '\\') {
            snprintf(esc, sizeof(esc), "\\%c", ch);
            buf_append_str(b, esc);
        } else if (ch < 0x20 || ch >= 0x7f) {
            snprintf(esc, sizeof(esc), "\\u%04x", ch);
            buf_append_str(b, esc);
        } else {
            buf_append(b, s, 1);
        }
    }
    buf_append_str(b, "\"");
}

static const char *health_name(int h)
{
    return h == SLOTMAP_FAILED ? "failed" : h == SLOTMAP_LOADING ? "loading" : "online";
}

static void json_node(buf *b, const slotmap_node *n)
{
    char tmp[64];
    buf_append_str(b, "{\"id\":");
    json_str(b, n->id);
    buf_append_str(b, ",\"host\":");
    json_str(b, n->host);
    snprintf(tmp, sizeof(tmp), ",\"port\":%d,\"health\":", n->port);
    buf_append_str(b, tmp);
    json_str(b, health_name(n->health));
    buf_append_str(b, "}");
}

/* The first slot of shard i of m, -1 if it has none. */
static int first_slot(const slotmap *m, int i)
{
    for (int s = 0; s < CLUSTER_SLOTS; s++) {
        if (m->owner[s] == i) {
            return s;
        }
    }
    return -1;
}

/* Requests held now for lack of the master of view up: those in this
 * loop's held heap that route there. */
static uint64_t held_for(const clustermap *cm, const upstream *up)
{
    uint64_t n = 0;
    for (size_t i = 0; i < cm->f->nheld; i++) {
        const request *r = cm->f->held_heap[i];
        const upstream *to = r->ask;
        if (to == NULL) {
            to = r->slot >= 0 && r->slot < CLUSTER_SLOTS ? cm->slot_up[r->slot] : NULL;
        }
        n += to == up;
    }
    return n;
}

/* Main loop: the other loops' figures of shard v->shard added to v's. */
static void add_others(const clustermap *cm, clustermap_shard_view *v)
{
    clustermap_board *b = cm->cs != NULL ? cm->board : NULL;
    if (b == NULL) {
        return;
    }
    uv_mutex_lock(&b->lock);
    for (int l = 1; l < b->nloops; l++) {
        const loop_fig *lf = &b->loops[l];
        for (int i = 0; i < lf->n; i++) {
            const loop_shard_fig *x = &lf->fig[i];
            if (x->shard == v->shard) {
                v->routed += x->routed;
                v->held += x->held;
                v->moved += x->moved;
                v->asked += x->asked;
                v->links += x->links;
                break;
            }
        }
    }
    uv_mutex_unlock(&b->lock);
}

int clustermap_nshards(const clustermap *cm)
{
    return map_of(cm)->nshards;
}

const upstream *clustermap_view(const clustermap *cm, int i)
{
    return i >= 0 && i < cm->nshards ? cm->by_shard[i] : NULL;
}

void clustermap_shard(const clustermap *cm, int i, uint64_t now, clustermap_shard_view *v)
{
    const slotmap *m = map_of(cm);
    const slotmap_shard *sh = &m->shards[i];
    const upstream *up = i < cm->nshards ? cm->by_shard[i] : NULL;
    memset(v, 0, sizeof(*v));
    v->shard = first_slot(m, i);
    snprintf(v->master, sizeof(v->master), strchr(sh->master.host, ':') ? "[%s]:%d" : "%s:%d",
             sh->master.host, sh->master.port);
    v->state = up != NULL ? upstream_state_name(up->state) : "DOWN";
    v->up = up != NULL && up->state == UP_UP;
    v->nslots = sh->nslots;
    v->nreplicas = sh->nreplicas;
    v->epoch = sh->epoch;
    v->since_switch_ms = -1;
    v->last_reason = "";
    if (up == NULL) {
        return;
    }
    v->switches = up->switches;
    v->routed = up->routed;
    v->held = held_for(cm, up);
    v->moved = up->moved;
    v->asked = up->asked;
    v->links = (uint64_t)up->nlinks;
    if (up->switches > 0 && now >= up->switch_started_ms) {
        v->since_switch_ms = (int64_t)(now - up->switch_started_ms);
    }
    v->not_up_ms = !v->up && now >= up->down_since_ms ? now - up->down_since_ms : 0;
    v->up_since_ms = up->up_since_ms;
    v->view_epoch = up->epoch;
    v->last_switch_ms = up->last_switch_ms;
    v->longest_ms = up->longest_switch_ms;
    v->last_reason = up->switches > 0 ? up->last_reason : "";
    v->aof_ok = up->aof_ok != 0;
    add_others(cm, v);
}

void clustermap_get_totals(const clustermap *cm, clustermap_totals *t)
{
    const slotmap *m = map_of(cm);
    static const cluster_counts none;
    const cluster_counts *k = cm->cs != NULL ? cluster_get_counts(cm->cs) : &none;
    memset(t, 0, sizeof(*t));
    t->shards = (uint64_t)m->nshards;
    for (int i = 0; i < m->nshards && i < cm->nshards; i++) {
        t->shards_up += cm->by_shard[i] != NULL && cm->by_shard[i]->state == UP_UP;
    }
    t->slots_covered = (uint64_t)slotmap_covered(m);
    t->rounds = k->rounds;
    t->answers = k->answers;
    t->rejected = k->rejected;
    t->unreachable = k->unreachable;
    t->changes = k->changes;
    t->slots_moved = k->slots_moved;
    t->refresh_master_lost = k->asked[CLUSTER_WHY_MASTER_LOST];
    t->refresh_moved = k->asked[CLUSTER_WHY_MOVED];
    t->refresh_clusterdown = k->asked[CLUSTER_WHY_CLUSTERDOWN];
    t->refresh_channel = k->asked[CLUSTER_WHY_CHANNEL];
    t->refresh_replay = k->asked[CLUSTER_WHY_REPLAY];
    t->refresh_unreachable = k->asked[CLUSTER_WHY_UNREACHABLE];
    t->refresh_deferred = k->deferred;
    t->meta_changes = cm->meta_changes;
    t->moved_followed = cm->moved;
    t->ask_followed = cm->asked;
    t->crossslot = cm->crossslot;
    t->splits = cm->splits;
    t->tryagain = cm->tryagain;
    t->clusterdown = cm->clusterdown;
    clustermap_board *b = cm->board;
    if (b != NULL) {
        uv_mutex_lock(&b->lock);
        for (int l = 1; l < b->nloops; l++) {
            t->moved_followed += b->loops[l].moved;
            t->ask_followed += b->loops[l].asked;
            t->crossslot += b->loops[l].crossslot;
            t->splits += b->loops[l].splits;
            t->tryagain += b->loops[l].tryagain;
            t->clusterdown += b->loops[l].clusterdown;
        }
        uv_mutex_unlock(&b->lock);
    }
    t->last_error = k->last_error;
}

void clustermap_json(const clustermap *cm, buf *b)
{
    const slotmap *m = map_of(cm);
    uint64_t now = uv_now(cm->f->loop);
    clustermap_totals t;
    char tmp[640];

    clustermap_get_totals(cm, &t);
    buf_append_str(b, "\"mode\":\"cluster\",\"routing\":true,\"cluster\":{\"shards\":[");
    for (int i = 0; i < m->nshards; i++) {
        const slotmap_shard *s = &m->shards[i];
        clustermap_shard_view v;
        clustermap_shard(cm, i, now, &v);
        snprintf(tmp, sizeof(tmp), "%s{\"shard\":%d,\"master\":", i > 0 ? "," : "", v.shard);
        buf_append_str(b, tmp);
        json_node(b, &s->master);
        snprintf(tmp, sizeof(tmp), ",\"epoch\":%llu,\"nslots\":%d,\"slots\":[",
                 (unsigned long long)s->epoch, s->nslots);
        buf_append_str(b, tmp);
        int first = 1;
        for (int lo = 0; lo < CLUSTER_SLOTS; lo++) {
            if (m->owner[lo] != i) {
                continue;
            }
            int hi = lo;
            while (hi + 1 < CLUSTER_SLOTS && m->owner[hi + 1] == i) {
                hi++;
            }
            snprintf(tmp, sizeof(tmp), "%s[%d,%d]", first ? "" : ",", lo, hi);
            buf_append_str(b, tmp);
            first = 0;
            lo = hi;
        }
        snprintf(tmp, sizeof(tmp),
                 "],\"state\":\"%s\",\"up\":%s,\"switches\":%llu,\"routed\":%llu,\"held\":%llu,"
                 "\"moved\":%llu,\"asked\":%llu,\"links\":%llu,\"not_up_ms\":%llu,"
                 "\"since_switch_ms\":",
                 v.state, v.up ? "true" : "false", (unsigned long long)v.switches,
                 (unsigned long long)v.routed, (unsigned long long)v.held,
                 (unsigned long long)v.moved, (unsigned long long)v.asked,
                 (unsigned long long)v.links, (unsigned long long)v.not_up_ms);
        buf_append_str(b, tmp);
        if (v.since_switch_ms < 0) {
            buf_append_str(b, "null");
        } else {
            snprintf(tmp, sizeof(tmp), "%lld", (long long)v.since_switch_ms);
            buf_append_str(b, tmp);
        }
        buf_append_str(b, ",\"replicas\":[");
        for (int r = 0; r < s->nreplicas; r++) {
            if (r > 0) {
                buf_append_str(b, ",");
            }
            json_node(b, &s->replicas[r]);
        }
        buf_append_str(b, "]}");
    }
    snprintf(tmp, sizeof(tmp),
             "],\"shards_up\":%llu,\"slots_covered\":%llu,\"rounds\":%llu,\"answers\":%llu,"
             "\"rejected\":%llu,\"unreachable\":%llu,\"changes\":%llu,\"slots_moved\":%llu,"
             "\"moved_followed\":%llu,\"ask_followed\":%llu,\"crossslot_refused\":%llu,"
             "\"splits\":%llu,\"tryagain_held\":%llu,\"clusterdown_held\":%llu,\"last_error\":",
             (unsigned long long)t.shards_up, (unsigned long long)t.slots_covered,
             (unsigned long long)t.rounds, (unsigned long long)t.answers,
             (unsigned long long)t.rejected, (unsigned long long)t.unreachable,
             (unsigned long long)t.changes, (unsigned long long)t.slots_moved,
             (unsigned long long)t.moved_followed, (unsigned long long)t.ask_followed,
             (unsigned long long)t.crossslot, (unsigned long long)t.splits,
             (unsigned long long)t.tryagain, (unsigned long long)t.clusterdown);
    buf_append_str(b, tmp);
    json_str(b, t.last_error);
    snprintf(tmp, sizeof(tmp),
             ",\"refresh_master_lost\":%llu,\"refresh_moved\":%llu,\"refresh_clusterdown\":%llu,"
             "\"refresh_channel\":%llu,\"refresh_replay\":%llu,\"refresh_unreachable\":%llu,"
             "\"refresh_deferred\":%llu,\"meta_changes\":%llu",
             (unsigned long long)t.refresh_master_lost, (unsigned long long)t.refresh_moved,
             (unsigned long long)t.refresh_clusterdown, (unsigned long long)t.refresh_channel,
             (unsigned long long)t.refresh_replay, (unsigned long long)t.refresh_unreachable,
             (unsigned long long)t.refresh_deferred, (unsigned long long)t.meta_changes);
    buf_append_str(b, tmp);
    buf_append_str(b, "}");
}

/* ==== the master views ==== */

static upstream *view_named(clustermap *cm, const char *name)
{
    for (int i = 0; i < cm->nviews; i++) {
        if (cm->views[i]->target_set && strcmp(upstream_name(cm->views[i]), name) == 0) {
            return cm->views[i];
        }
    }
    return NULL;
}

static upstream *view_new(clustermap *cm)
{
    if (cm->nviews == CLUSTERMAP_MAX_VIEWS) {
        return NULL;
    }
    upstream *up = upstream_new(cm->f); /* cluster mode: waits to be pointed at a master */
    if (up != NULL) {
        cm->views[cm->nviews++] = up;
    }
    return up;
}

static void node_name(const slotmap_node *n, char *out, size_t len)
{
    snprintf(out, len, strchr(n->host, ':') ? "[%s]:%d" : "%s:%d", n->host, n->port);
}

/* The channel of ferry's replicas_ack nudge (fence.c) on up, a master
 * serving slot: "__ferry:nudge{N}", the first N whose slot that is (a node
 * answers MOVED to a shard channel of another node's slot). */
static void nudge_channel_set(upstream *up, int slot)
{
    char name[sizeof(up->nudge_channel)];
    if (up->nudge_channel[0] != '\0' && up->nudge_slot == slot) {
        return;
    }
    for (unsigned n = 0; n < (1u << 22); n++) {
        int len = snprintf(name, sizeof(name), "__ferry:nudge{%u}", n);
        if (slot_of_key(name, (size_t)len) == slot) {
            memcpy(up->nudge_channel, name, (size_t)len + 1);
            up->nudge_slot = slot;
            up->nudge_by_wait = 0; /* refused (MOVED) on another channel: try this one */
            return;
        }
    }
}

/* Every shard of m gets a master view of this loop. */
static void apply_map(clustermap *cm, const slotmap *m)
{
    upstream *claim[SLOTMAP_MAX_SHARDS];
    int taken[CLUSTERMAP_MAX_VIEWS];
    memset(taken, 0, sizeof(taken));
    /* First the shards whose master has a view already (unchanged, or a
     * master that took slots)... */
    for (int i = 0; i < m->nshards; i++) {
        char name[300];
        node_name(&m->shards[i].master, name, sizeof(name));
        claim[i] = view_named(cm, name);
        for (int v = 0; claim[i] != NULL && v < cm->nviews; v++) {
            taken[v] |= cm->views[v] == claim[i];
        }
    }
    /* ... then a shard with a new master takes the view that served its
     * slots (a failover), or a new one. */
    for (int i = 0; i < m->nshards; i++) {
        if (claim[i] != NULL) {
            continue;
        }
        const slotmap_shard *sh = &m->shards[i];
        for (int s = 0; s < CLUSTER_SLOTS && claim[i] == NULL; s++) {
            if (m->owner[s] != i || cm->slot_up[s] == NULL) {
                continue;
            }
            for (int v = 0; v < cm->nviews; v++) {
                if (cm->views[v] == cm->slot_up[s] && !taken[v]) {
                    taken[v] = 1;
                    claim[i] = cm->views[v];
                    break;
                }
            }
        }
        if (claim[i] == NULL) {
            claim[i] = view_new(cm);
            if (claim[i] == NULL) {
                log_error("cluster: more than %d master views; shard of %s:%d not served",
                          CLUSTERMAP_MAX_VIEWS, sh->master.host, sh->master.port);
                continue;
            }
            taken[cm->nviews - 1] = 1;
        }
        char why[400];
        snprintf(why, sizeof(why), "the cluster map names %s:%d master of %d slot(s) (epoch %llu)",
                 sh->master.host, sh->master.port, sh->nslots, (unsigned long long)sh->epoch);
        upstream_set_master(claim[i], sh->master.host, sh->master.port, why);
    }
    int first[SLOTMAP_MAX_SHARDS];
    for (int i = 0; i < m->nshards; i++) {
        first[i] = -1;
    }
    for (int s = 0; s < CLUSTER_SLOTS; s++) {
        cm->slot_up[s] = m->owner[s] >= 0 ? claim[m->owner[s]] : NULL;
        if (m->owner[s] >= 0 && first[m->owner[s]] < 0) {
            first[m->owner[s]] = s;
        }
    }
    for (int i = 0; i < m->nshards; i++) {
        if (claim[i] != NULL && first[i] >= 0) {
            nudge_channel_set(claim[i], first[i]);
        }
    }
    memcpy(cm->by_shard, claim, sizeof(claim[0]) * (size_t)m->nshards);
    cm->nshards = m->nshards;
    /* A map's shards come in the order a node lists them (CLUSTER SHARDS
     * walks its node table), which differs between nodes and refreshes:
     * "the first shard" means the one with the lowest slots. */
    for (int i = 0; i < m->nshards; i++) {
        if (first[i] < 0) {
            first[i] = CLUSTER_SLOTS; /* a master without slots: last */
        }
        int j = i;
        for (; j > 0 && first[cm->by_slot[j - 1]] > first[i]; j--) {
            cm->by_slot[j] = cm->by_slot[j - 1];
        }
        cm->by_slot[j] = i;
    }
    cm->f->wake_pending = 1; /* requests held for a shard may go now */
}

static clustermap_snap *snap_new(void)
{
    clustermap_snap *snap = xmalloc(sizeof(*snap));
    atomic_init(&snap->refs, 1);
    snap->gen = 0;
    slotmap_init(&snap->m);
    return snap;
}

clustermap_snap *clustermap_snap_hold(clustermap_snap *snap)
{
    atomic_fetch_add(&snap->refs, 1);
    return snap;
}

void clustermap_snap_release(clustermap_snap *snap)
{
    if (snap != NULL && atomic_fetch_sub(&snap->refs, 1) == 1) {
        free(snap);
    }
}

uint64_t clustermap_gen(const clustermap *cm)
{
    return cm->gen;
}

/* Main loop: does m route differently from the last map applied? (It is
 * remembered if so.) */
static int routing_changed(clustermap *cm, const slotmap *m)
{
    routing *r = cm->applied;
    int same = cm->gen > 0 && r->nshards == m->nshards &&
               memcmp(r->owner, m->owner, sizeof(r->owner)) == 0;
    for (int i = 0; i < m->nshards; i++) {
        char name[sizeof(r->master[0])];
        node_name(&m->shards[i].master, name, sizeof(name));
        if (same && strcmp(name, r->master[i]) != 0) {
            same = 0;
        }
        memcpy(r->master[i], name, sizeof(name));
    }
    memcpy(r->owner, m->owner, sizeof(r->owner));
    r->nshards = m->nshards;
    return !same;
}

/* Main loop: the source's map changed. */
static void on_map(void *data, const slotmap *m, int moved)
{
    clustermap *cm = data;
    if (!routing_changed(cm, m)) {
        cm->meta_changes++;
        return;
    }
    apply_map(cm, m);
    cm->gen++;
    log_info("cluster: map of %d shard(s), %d slot(s) served, %d moved", m->nshards,
             slotmap_covered(m), moved);
    if (cm->board != NULL && cm->ops != NULL && cm->ops->publish != NULL) {
        clustermap_snap *snap = snap_new();
        snap->gen = cm->gen;
        snap->m = *m;
        cm->ops->publish(cm->f, snap);
        clustermap_snap_release(snap);
    }
}

void clustermap_apply(clustermap *cm, clustermap_snap *snap)
{
    if (cm->cs != NULL || snap->gen <= cm->gen || cm->f->closed) {
        clustermap_snap_release(snap);
        return;
    }
    clustermap_snap_release(cm->snap);
    cm->snap = snap;
    cm->gen = snap->gen;
    apply_map(cm, &snap->m);
    log_debug("cluster: loop %d follows map %llu of %d shard(s)", cm->f->worker_index,
              (unsigned long long)snap->gen, snap->m.nshards);
}

/* Why a refresh was asked, from its text: the callers above (router,
 * multipop, replay) and a worker loop's asks reach the main loop as text;
 * anything else is a shard's master view that lost its master. */
static cluster_why why_of(const char *why)
{
    static const struct {
        const char *prefix;
        cluster_why reason;
    } known[] = {
        {"MOVED ", CLUSTER_WHY_MOVED},
        {"a node answered CLUSTERDOWN", CLUSTER_WHY_CLUSTERDOWN},
        {"a node dropped a shard channel", CLUSTER_WHY_CHANNEL},
        {"a node redirected a fallback replay", CLUSTER_WHY_REPLAY},
    };
    for (size_t i = 0; i < sizeof(known) / sizeof(known[0]); i++) {
        if (strncmp(why, known[i].prefix, strlen(known[i].prefix)) == 0) {
            return known[i].reason;
        }
    }
    return CLUSTER_WHY_MASTER_LOST;
}

/* Ask the source for the map: this loop's, or the main loop's. */
static void refresh_source(clustermap *cm, const char *why)
{
    if (cm->cs != NULL) {
        cluster_refresh(cm->cs, why_of(why), why);
    } else if (cm->ops != NULL && cm->ops->refresh != NULL && !cm->f->closed) {
        cm->ops->refresh(cm->f, why);
    }
}

clustermap *clustermap_new(ferry *f, const clustermap_ops *ops)
{
    static const cluster_ops src_ops = {.on_map = on_map};
    clustermap *cm = xcalloc(1, sizeof(*cm));
    cm->f = f;
    cm->ops = ops;
    if (f->cfg->workers > 1) {
        cm->board = xcalloc(1, sizeof(*cm->board));
        uv_mutex_init(&cm->board->lock);
        cm->board->nloops = f->cfg->workers;
        cm->board->loops = xcalloc((size_t)f->cfg->workers, sizeof(loop_fig));
    }
    cm->applied = xcalloc(1, sizeof(*cm->applied));
    cm->cs = cluster_new(f->loop, f->cfg, f->tls != NULL ? f->tls->redis : NULL, &src_ops, cm);
    cm->reps = replicas_new(f, "the cluster map");
    return cm;
}

clustermap *clustermap_new_follower(ferry *f, const clustermap_ops *ops, clustermap *leader)
{
    clustermap *cm = xcalloc(1, sizeof(*cm));
    cm->f = f;
    cm->ops = ops;
    cm->snap = snap_new(); /* no shard until the first map comes */
    cm->board = leader != NULL ? leader->board : NULL;
    return cm;
}

void clustermap_publish(clustermap *cm)
{
    clustermap_board *b = cm->board;
    int l = cm->f->worker_index;
    if (cm->cs != NULL || b == NULL || l <= 0 || l >= b->nloops) {
        return;
    }
    /* Gathered first, copied under the lock. */
    loop_fig *mine = xcalloc(1, sizeof(*mine));
    const slotmap *m = map_of(cm);
    for (int i = 0; i < m->nshards && i < cm->nshards; i++) {
        const upstream *up = cm->by_shard[i];
        loop_shard_fig *x = &mine->fig[mine->n++];
        x->shard = first_slot(m, i);
        if (up != NULL) {
            x->routed = up->routed;
            x->held = held_for(cm, up);
            x->moved = up->moved;
            x->asked = up->asked;
            x->links = (uint64_t)up->nlinks;
        }
    }
    mine->moved = cm->moved;
    mine->asked = cm->asked;
    mine->crossslot = cm->crossslot;
    mine->splits = cm->splits;
    mine->tryagain = cm->tryagain;
    mine->clusterdown = cm->clusterdown;
    uv_mutex_lock(&b->lock);
    b->loops[l] = *mine;
    uv_mutex_unlock(&b->lock);
    free(mine);
}

/* Main loop: every replica of the map, to the replicas table, once a list
 * period (a replica promoted, or gone from the map, is dropped after a
 * while; its shard's master view checks it as a master). */
static void list_replicas(clustermap *cm, uint64_t now)
{
    const slotmap *m = map_of(cm);
    if (m->nshards == 0 || !replicas_list_due(cm->reps, now)) {
        return;
    }
    for (int i = 0; i < m->nshards; i++) {
        const slotmap_shard *sh = &m->shards[i];
        for (int r = 0; r < sh->nreplicas; r++) {
            replicas_learn_addr(cm->reps, sh->replicas[r].host, sh->replicas[r].port, now);
        }
    }
    replicas_listed(cm->reps, now);
}

void clustermap_tick(clustermap *cm, uint64_t now)
{
    if (!cm->f->closed && cm->cs != NULL) {
        cluster_tick(cm->cs, now);
        list_replicas(cm, now);
        replicas_tick(cm->reps, now);
    }
    for (int i = 0; i < cm->nviews; i++) {
        upstream_tick(cm->views[i], now);
    }
}

upstream *clustermap_route(clustermap *cm, int slot)
{
    if (slot >= 0 && slot < CLUSTER_SLOTS) {
        return cm->slot_up[slot];
    }
    for (int i = 0; i < cm->nshards; i++) {
        upstream *up = cm->by_shard[cm->by_slot[i]];
        if (up != NULL && up->state == UP_UP) {
            return up;
        }
    }
    return cm->nshards > 0 ? cm->by_shard[cm->by_slot[0]] : NULL;
}

void clustermap_moved(clustermap *cm, upstream *from, int slot, const char *host, int port)
{
    char name[300];
    snprintf(name, sizeof(name), strchr(host, ':') ? "[%s]:%d" : "%s:%d", host, port);
    cm->moved++;
    if (from != NULL) {
        from->moved++;
    }
    if (slot < 0 || slot >= CLUSTER_SLOTS) {
        return;
    }
    upstream *up = view_named(cm, name);
    if (up == NULL) {
        up = view_new(cm);
        if (up == NULL) {
            return;
        }
        upstream_set_master(up, host, port, "a node answered MOVED to it");
    }
    cm->slot_up[slot] = up;
    char why[400];
    snprintf(why, sizeof(why), "MOVED %d %s", slot, name);
    refresh_source(cm, why);
}

upstream *clustermap_ask(clustermap *cm, upstream *from, const char *host, int port)
{
    char name[300];
    snprintf(name, sizeof(name), strchr(host, ':') ? "[%s]:%d" : "%s:%d", host, port);
    cm->asked++;
    if (from != NULL) {
        from->asked++;
    }
    upstream *up = view_named(cm, name);
    if (up == NULL && (up = view_new(cm)) != NULL) {
        upstream_set_master(up, host, port, "a node answered ASK to it");
    }
    return up;
}

_Static_assert(CLUSTERMAP_MAX_VIEWS <= CLUSTERMAP_SEEN_BYTES * 8, "a seen bit per master view");

static int view_index(const clustermap *cm, const upstream *up)
{
    for (int i = 0; i < cm->nviews; i++) {
        if (cm->views[i] == up) {
            return i;
        }
    }
    return -1;
}

upstream *clustermap_unseen(const clustermap *cm, const unsigned char *seen)
{
    for (int i = 0; i < cm->nshards; i++) {
        int v = cm->by_shard[i] != NULL ? view_index(cm, cm->by_shard[i]) : -1;
        if (v >= 0 && !(seen[v / 8] & (1u << (v % 8)))) {
            return cm->by_shard[i];
        }
    }
    return NULL;
}

void clustermap_mark_seen(const clustermap *cm, const upstream *up, unsigned char *seen)
{
    int v = view_index(cm, up);
    if (v >= 0) {
        seen[v / 8] |= (unsigned char)(1u << (v % 8));
    }
}

int clustermap_first_slot(const clustermap *cm, int slot)
{
    const slotmap *m = map_of(cm);
    if (slot < 0 || slot >= CLUSTER_SLOTS || m->owner[slot] < 0) {
        return -1;
    }
    int s = 0;
    while (m->owner[s] != m->owner[slot]) {
        s++;
    }
    return s;
}

int clustermap_next_first_slot(const clustermap *cm, int slot)
{
    const slotmap *m = map_of(cm);
    unsigned char seen[SLOTMAP_MAX_SHARDS] = {0};
    for (int s = 0; s < CLUSTER_SLOTS; s++) {
        int o = m->owner[s];
        if (o < 0 || o >= SLOTMAP_MAX_SHARDS || seen[o]) {
            continue;
        }
        seen[o] = 1; /* s is the first slot of shard o */
        if (s > slot) {
            return s;
        }
    }
    return -1;
}

void clustermap_count_crossslot(clustermap *cm)
{
    cm->crossslot++;
}

void clustermap_count_split(clustermap *cm)
{
    cm->splits++;
}

void clustermap_count_held(clustermap *cm, int tryagain)
{
    if (tryagain) {
        cm->tryagain++;
    } else {
        cm->clusterdown++;
    }
}

void clustermap_refresh(clustermap *cm, const char *why)
{
    refresh_source(cm, why);
}

int clustermap_not_up(const clustermap *cm, char *first, size_t len)
{
    int n = 0;
    if (len > 0) {
        first[0] = '\0';
    }
    for (int i = 0; i < cm->nshards; i++) {
        const upstream *up = cm->by_shard[i];
        if (up == NULL || up->state != UP_UP) {
            if (n++ == 0 && len > 0) {
                snprintf(first, len, "%s", up != NULL ? upstream_name(up) : "(no view)");
            }
        }
    }
    return n;
}

const replicas *clustermap_replicas(const clustermap *cm)
{
    return cm != NULL ? cm->reps : NULL;
}

void clustermap_close(clustermap *cm)
{
    cluster_close(cm->cs);
    replicas_close(cm->reps);
    for (int i = 0; i < cm->nviews; i++) {
        upstream_close(cm->views[i]);
    }
}

void clustermap_free(clustermap *cm)
{
    if (cm == NULL) {
        return;
    }
    cluster_free(cm->cs);
    replicas_free(cm->reps);
    for (int i = 0; i < cm->nviews; i++) {
        upstream_free(cm->views[i]);
    }
    clustermap_snap_release(cm->snap);
    free(cm->applied);
    if (cm->cs != NULL && cm->board != NULL) { /* the main loop's, freed after the workers' */
        uv_mutex_destroy(&cm->board->lock);
        free(cm->board->loops);
        free(cm->board);
    }
    free(cm);
}

link *clustermap_key_link(ferry *f, const char *key, size_t klen, ident *id, uint64_t hint,
                          int proto)
{
    upstream *up =
        f->cluster != NULL ? clustermap_route(f->cluster, slot_of_key(key, klen)) : f->up;
    link *l = up != NULL && up->state == UP_UP ? upstream_shared(up, id, hint, proto) : NULL;
    return l != NULL && l->state == LINK_READY ? l : NULL;
}
