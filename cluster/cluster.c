/* cluster.c - following a Redis Cluster's slot map (cluster.h).
 *
 * A round asks every seed node and every node of the trusted map, each on a
 * connection of its own (a probe), for CLUSTER NODES then CLUSTER SHARDS:
 *
 *   probe: [resolve] -> connect -> AUTH? -> NODES -> SHARDS (or SLOTS) -> close
 *
 * Each answer is weighed on its own, as it comes (slotmap_merge): a node
 * the last trusted views flag failed is not heard, and a slot moves only
 * to a master at a higher config epoch. A round ends when every probe has
 * closed; a probe that fails to reach a master of the map makes the next
 * round come soon instead of a full interval later.
 *
 * Rounds asked for (cluster_refresh: every MOVED, every CLUSTERDOWN, every
 * master lost, from every loop) are spaced by a back-off: while the cluster
 * stays down, each held request asks again at each retry, and a round was
 * started the moment the one before ended, for as long as it lasted. */
#include "cluster.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "log.h"
#include "sconn.h"

#define CLUSTER_MAX_PROBES 64     /* nodes asked in one round */
#define CLUSTER_MAX_FAILED 64     /* node ids remembered as flagged failed */
#define CLUSTER_FAST_RETRY_MS 100 /* next round after a master did not answer */

enum { K_AUTH = 1, K_NODES, K_SHARDS, K_SLOTS };

typedef struct probe probe;

struct cluster_source {
    uv_loop_t *loop;                                     /* the owner's loop */
    const config *cfg;                                   /* borrowed, outlives the source */
    struct tls_conf *tls;                                /* redis.tls (borrowed), NULL: plain */
    cluster_ops ops;                                     /* the owner's callbacks */
    void *data;                                          /* the owner's pointer for them */
    slotmap map;                                         /* the trusted map */
    slotmap scratch;                                     /* an answer being weighed */
    cluster_counts counts;                               /* for stats */
    probe *probes[CLUSTER_MAX_PROBES];                   /* this round's, NULL when done */
    int nprobes;                                         /* slots used in probes[] this round */
    int live;                                            /* probes not yet closed */
    int again;                                           /* a refresh was asked during the round */
    int asked;                                           /* the next round is one asked for */
    int on_demand;                                       /* the round under way was asked for */
    int round_moved;                                     /* the round under way moved slots */
    uint64_t last_round_ms;                              /* when the last round started */
    uint64_t ask_gap_ms;                                 /* rounds asked for: this far apart */
    int closed;                                          /* cluster_close was called */
    uint64_t next_round_ms;                              /* when the next round is due */
    char failed[CLUSTER_MAX_FAILED][SLOTMAP_ID_LEN + 1]; /* flagged fail by the last view */
    int nfailed;
};

struct probe {
    cluster_source *cs;          /* NULL once detached (cluster_close) */
    int index;                   /* in cs->probes */
    char host[SLOTMAP_HOST_LEN]; /* where */
    int port;
    int master;              /* a master of the trusted map */
    sconn *c;                /* the connection, NULL while resolving */
    uv_getaddrinfo_t gai;    /* resolving a host name */
    int resolving;           /* gai is in flight */
    uint64_t started_ms;     /* for the timeout */
    int answered;            /* a trusted or refused answer came */
    slotmap_nodeinfo *nodes; /* its CLUSTER NODES, parsed */
    int nnodes;
};

static void round_start(cluster_source *cs, uint64_t now);

/* The back-off's longest gap: CLUSTER_ASK_MAX_MS, or the refresh interval
 * if shorter (a round asked for never waits longer than the next regular
 * one would). */
static uint64_t ask_gap_max(const cluster_source *cs)
{
    uint64_t iv = cs->cfg->cluster_refresh_interval_ms;
    uint64_t max = iv < CLUSTER_ASK_MAX_MS ? iv : CLUSTER_ASK_MAX_MS;
    return max > CLUSTER_ASK_MIN_MS ? max : CLUSTER_ASK_MIN_MS;
}

/* A round is wanted by at (an ask, a master that did not answer), but not
 * before the back-off's gap after the last one began. */
static void want_round(cluster_source *cs, uint64_t at)
{
    uint64_t earliest = cs->last_round_ms + cs->ask_gap_ms;
    if (at < earliest) {
        at = earliest;
    }
    if (at < cs->next_round_ms) {
        cs->next_round_ms = at;
        cs->asked = 1;
    }
}

/* Every probe of the round closed: the back-off learns from it (a round
 * asked for that moved no slot doubles the gap; one that moved slots resets
 * it: a change of replicas or health, which nodes disagree about for
 * seconds, is no sign that the asks are being answered), and a round asked
 * for meanwhile starts once its gap allows. */
static void round_end(cluster_source *cs, uint64_t now)
{
    if (cs->round_moved) {
        cs->ask_gap_ms = CLUSTER_ASK_MIN_MS;
    } else if (cs->on_demand) {
        uint64_t max = ask_gap_max(cs);
        cs->ask_gap_ms = cs->ask_gap_ms * 2 < max ? cs->ask_gap_ms * 2 : max;
    }
    if (cs->again) {
        cs->again = 0;
        want_round(cs, now);
    }
    if (cs->asked && now >= cs->next_round_ms) {
        round_start(cs, now);
    }
}

/* ==== helpers ==== */

static void probe_free(probe *p)
{
    free(p->nodes);
    free(p);
}

/* The probe is done: out of the round (its connection closes by itself). */
static void probe_done(probe *p)
{
    cluster_source *cs = p->cs;
    if (cs == NULL) {
        return;
    }
    cs->probes[p->index] = NULL;
    cs->live--;
    p->cs = NULL;
    if (cs->live == 0 && !cs->closed) {
        round_end(cs, uv_now(cs->loop));
    }
}

static void refuse(cluster_source *cs, probe *p, const char *why)
{
    cs->counts.rejected++;
    p->answered = 1;
    snprintf(cs->counts.last_error, sizeof(cs->counts.last_error), "%.200s:%d: %.150s", p->host,
             p->port, why);
    log_warn("cluster: answer of %s:%d ignored: %s", p->host, p->port, why);
}

static int is_failed(const cluster_source *cs, const char *id)
{
    for (int i = 0; i < cs->nfailed; i++) {
        if (strcmp(cs->failed[i], id) == 0) {
            return 1;
        }
    }
    return 0;
}

static const slotmap_nodeinfo *myself(const probe *p)
{
    for (int i = 0; i < p->nnodes; i++) {
        if (p->nodes[i].flags & SLOTMAP_F_MYSELF) {
            return &p->nodes[i];
        }
    }
    return NULL;
}

/* ==== answers ==== */

static void on_nodes(cluster_source *cs, probe *p, const redisReply *r)
{
    char err[200];
    if (r->type != REDIS_REPLY_STRING && r->type != REDIS_REPLY_STATUS) {
        refuse(cs, p,
               r->type == REDIS_REPLY_ERROR ? "CLUSTER NODES answered an error"
                                            : "CLUSTER NODES is not text");
        sconn_close(p->c, "refused");
        return;
    }
    if (p->nodes == NULL) {
        p->nodes = malloc(sizeof(*p->nodes) * SLOTMAP_MAX_NODES);
        if (p->nodes == NULL) {
            sconn_close(p->c, "out of memory");
            return;
        }
    }
    if (slotmap_nodes_parse(r->str, r->len, p->nodes, SLOTMAP_MAX_NODES, &p->nnodes, err,
                            sizeof(err)) != 0) {
        refuse(cs, p, err);
        sconn_close(p->c, "refused");
        return;
    }
    const slotmap_nodeinfo *me = myself(p);
    if (is_failed(cs, me->id)) {
        refuse(cs, p, "the cluster flags this node failed");
        sconn_close(p->c, "refused");
        return;
    }
    if (me->flags & (SLOTMAP_F_HANDSHAKE | SLOTMAP_F_NOADDR)) {
        refuse(cs, p, "the node is not a settled member of the cluster");
        sconn_close(p->c, "refused");
    }
}

/* Remember which nodes a trusted view flags failed. */
static void learn_failed(cluster_source *cs, const probe *p)
{
    cs->nfailed = 0;
    for (int i = 0; i < p->nnodes && cs->nfailed < CLUSTER_MAX_FAILED; i++) {
        if (p->nodes[i].flags & SLOTMAP_F_FAIL) {
            memcpy(cs->failed[cs->nfailed++], p->nodes[i].id, SLOTMAP_ID_LEN + 1);
        }
    }
}

static void on_map_reply(cluster_source *cs, probe *p, int kind, const redisReply *r)
{
    char err[200];
    int rc, changed = 0;
    if (p->nnodes == 0) {
        return; /* NODES was refused: the connection is closing */
    }
    if (kind == K_SHARDS && r->type == REDIS_REPLY_ERROR) {
        /* before Redis 7: no CLUSTER SHARDS */
        const char *argv[] = {"CLUSTER", "SLOTS"};
        if (sconn_send(p->c, K_SLOTS, 2, argv) != 0) {
            sconn_close(p->c, "cannot send CLUSTER SLOTS");
        }
        return;
    }
    rc = kind == K_SHARDS ? slotmap_from_shards(&cs->scratch, r, cs->tls != NULL, err, sizeof(err))
                          : slotmap_from_slots(&cs->scratch, r, err, sizeof(err));
    if (rc == 0) {
        rc = slotmap_set_epochs(&cs->scratch, p->nodes, p->nnodes, err, sizeof(err));
    }
    p->answered = 1;
    if (rc != 0) {
        refuse(cs, p, err);
        sconn_close(p->c, "refused");
        return;
    }
    cs->counts.answers++;
    learn_failed(cs, p);
    int moved = slotmap_merge(&cs->map, &cs->scratch, &changed);
    if (changed) {
        cs->round_moved |= moved > 0;
        cs->counts.changes++;
        cs->counts.slots_moved += (uint64_t)moved;
        log_info("cluster: map from %s:%d: %d shard(s), %d slot(s) covered, %d moved", p->host,
                 p->port, cs->map.nshards, slotmap_covered(&cs->map), moved);
        if (cs->ops.on_map != NULL) {
            cs->ops.on_map(cs->data, &cs->map, moved);
        }
    }
    sconn_close(p->c, "done");
}

static void reply_cb(sconn *c, void *data, int kind, redisReply *r)
{
    probe *p = data;
    cluster_source *cs = p->cs;
    if (cs == NULL) {
        return;
    }
    switch (kind) {
    case K_AUTH:
        if (r->type == REDIS_REPLY_ERROR) {
            refuse(cs, p, "AUTH refused");
            sconn_close(c, "AUTH refused");
        }
        break;
    case K_NODES:
        on_nodes(cs, p, r);
        break;
    case K_SHARDS:
    case K_SLOTS:
        on_map_reply(cs, p, kind, r);
        break;
    default:
        sconn_close(c, "unexpected reply");
        break;
    }
}

static void state_cb(sconn *c, void *data, int up, const char *why)
{
    probe *p = data;
    cluster_source *cs = p->cs;
    if (up) {
        if (cs == NULL) {
            sconn_close(c, "closing");
            return;
        }
        const config *cfg = cs->cfg;
        if (cfg->redis_password != NULL) {
            const char *argv[3] = {"AUTH", cfg->redis_username, cfg->redis_password};
            if (cfg->redis_username != NULL) {
                sconn_send(c, K_AUTH, 3, argv);
            } else {
                argv[1] = cfg->redis_password;
                sconn_send(c, K_AUTH, 2, argv);
            }
        }
        const char *nodes[] = {"CLUSTER", "NODES"};
        const char *shards[] = {"CLUSTER", "SHARDS"};
        if (sconn_send(c, K_NODES, 2, nodes) != 0 || sconn_send(c, K_SHARDS, 2, shards) != 0) {
            sconn_close(c, "cannot send");
        }
        return;
    }
    /* gone: freed by sconn after this call */
    p->c = NULL;
    if (cs != NULL) {
        if (!p->answered) {
            cs->counts.unreachable++;
            log_debug("cluster: %s:%d did not answer: %s", p->host, p->port, why);
            if (p->master && !cs->closed) {
                cs->counts.asked[CLUSTER_WHY_UNREACHABLE]++;
                want_round(cs, uv_now(cs->loop) + CLUSTER_FAST_RETRY_MS);
            }
        }
        probe_done(p);
    }
    probe_free(p);
}

static void probe_connect(probe *p, const struct sockaddr *sa)
{
    cluster_source *cs = p->cs;
    p->c = sconn_open(cs->loop, sa, cs->tls, 0, reply_cb, state_cb, p);
    if (p->c == NULL) {
        cs->counts.unreachable++;
        probe_done(p);
        probe_free(p);
    }
}

static void resolved_cb(uv_getaddrinfo_t *req, int status, struct addrinfo *res)
{
    probe *p = req->data;
    p->resolving = 0;
    if (p->cs == NULL || status < 0 || res == NULL) {
        if (p->cs != NULL) {
            p->cs->counts.unreachable++;
            log_debug("cluster: cannot resolve %s: %s", p->host,
                      status < 0 ? uv_strerror(status) : "no address");
            probe_done(p);
        }
        uv_freeaddrinfo(res);
        probe_free(p);
        return;
    }
    probe_connect(p, res->ai_addr);
    uv_freeaddrinfo(res);
}

/* Ask host:port in this round (once per round). */
static void probe_start(cluster_source *cs, const char *host, int port, int master, uint64_t now)
{
    if (host[0] == '\0' || port <= 0 || cs->nprobes >= CLUSTER_MAX_PROBES) {
        return;
    }
    for (int i = 0; i < cs->nprobes; i++) {
        probe *q = cs->probes[i];
        if (q != NULL && q->port == port && strcasecmp(q->host, host) == 0) {
            q->master |= master;
            return;
        }
    }
    probe *p = calloc(1, sizeof(*p));
    if (p == NULL) {
        return;
    }
    p->cs = cs;
    p->index = cs->nprobes;
    snprintf(p->host, sizeof(p->host), "%s", host);
    p->port = port;
    p->master = master;
    p->started_ms = now;
    cs->probes[cs->nprobes++] = p;
    cs->live++;

    struct sockaddr_storage ss;
    if (uv_ip4_addr(host, port, (struct sockaddr_in *)&ss) == 0 ||
        uv_ip6_addr(host, port, (struct sockaddr_in6 *)&ss) == 0) {
        probe_connect(p, (const struct sockaddr *)&ss);
        return;
    }
    char portstr[16];
    struct addrinfo hints;
    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    snprintf(portstr, sizeof(portstr), "%d", port);
    p->gai.data = p;
    p->resolving = 1;
    if (uv_getaddrinfo(cs->loop, &p->gai, resolved_cb, host, portstr, &hints) != 0) {
        p->resolving = 0;
        cs->counts.unreachable++;
        probe_done(p);
        probe_free(p);
    }
}

/* ==== rounds ==== */

static void round_start(cluster_source *cs, uint64_t now)
{
    const slotmap *m = &cs->map;
    cs->counts.rounds++;
    cs->nprobes = 0;
    cs->next_round_ms = now + cs->cfg->cluster_refresh_interval_ms;
    cs->on_demand = cs->asked;
    cs->asked = 0;
    cs->round_moved = 0;
    cs->last_round_ms = now;
    /* A probe may finish inside probe_start (a failed connect): count the
     * round as live until every probe is started. */
    cs->live++;
    for (int k = 0; k < m->nshards; k++) {
        probe_start(cs, m->shards[k].master.host, m->shards[k].master.port, 1, now);
    }
    for (int k = 0; k < m->nshards; k++) {
        for (int i = 0; i < m->shards[k].nreplicas; i++) {
            probe_start(cs, m->shards[k].replicas[i].host, m->shards[k].replicas[i].port, 0, now);
        }
    }
    for (int i = 0; i < cs->cfg->ncluster_nodes; i++) {
        probe_start(cs, cs->cfg->cluster_nodes[i].host, cs->cfg->cluster_nodes[i].port, 0, now);
    }
    cs->live--;
}

cluster_source *cluster_new(uv_loop_t *loop, const config *cfg, struct tls_conf *tls,
                            const cluster_ops *ops, void *data)
{
    cluster_source *cs = calloc(1, sizeof(*cs));
    if (cs == NULL) {
        abort(); /* ferry's OOM policy: no start without memory */
    }
    cs->loop = loop;
    cs->cfg = cfg;
    cs->tls = tls;
    if (ops != NULL) {
        cs->ops = *ops;
    }
    cs->data = data;
    slotmap_init(&cs->map);
    slotmap_init(&cs->scratch);
    cs->ask_gap_ms = CLUSTER_ASK_MIN_MS;
    log_info("cluster: learning the slot map from %d seed node(s)", cfg->ncluster_nodes);
    round_start(cs, uv_now(loop));
    return cs;
}

void cluster_tick(cluster_source *cs, uint64_t now)
{
    if (cs == NULL || cs->closed) {
        return;
    }
    for (int i = 0; i < cs->nprobes; i++) {
        probe *p = cs->probes[i];
        if (p != NULL && p->c != NULL && now - p->started_ms >= cs->cfg->cluster_timeout_ms) {
            sconn_close(p->c, "timeout");
        }
    }
    if (cs->live == 0 && now >= cs->next_round_ms) {
        round_start(cs, now);
    }
}

void cluster_refresh(cluster_source *cs, cluster_why reason, const char *why)
{
    if (cs == NULL || cs->closed) {
        return;
    }
    uint64_t now = uv_now(cs->loop);
    cs->counts.asked[reason < CLUSTER_NWHY ? reason : CLUSTER_WHY_MASTER_LOST]++;
    if (cs->live > 0) {
        cs->again = 1; /* asked of a round under way: it may not know yet */
        cs->counts.deferred++;
        return;
    }
    want_round(cs, now);
    if (now >= cs->next_round_ms) {
        log_debug("cluster: refresh: %s", why);
        round_start(cs, now);
    } else {
        cs->counts.deferred++;
    }
}

const slotmap *cluster_map(const cluster_source *cs)
{
    return &cs->map;
}

const cluster_counts *cluster_get_counts(const cluster_source *cs)
{
    return &cs->counts;
}

void cluster_close(cluster_source *cs)
{
    if (cs == NULL || cs->closed) {
        return;
    }
    cs->closed = 1;
    for (int i = 0; i < cs->nprobes; i++) {
        probe *p = cs->probes[i];
        if (p == NULL) {
            continue;
        }
        if (p->resolving) {
            /* its callback frees it (canceled or not) */
            uv_cancel((uv_req_t *)&p->gai);
            probe_done(p);
        } else if (p->c != NULL) {
            sconn_close(p->c, "ferry is stopping");
        }
    }
}

void cluster_free(cluster_source *cs)
{
    free(cs);
}
