/* cluster.h - the topology source of a Redis Cluster, beside sentinel/: it
 * asks the seed nodes and every node of the map it trusts for CLUSTER NODES
 * and CLUSTER SHARDS (CLUSTER SLOTS where SHARDS is unknown) every
 * cluster.refresh_interval_ms and on demand, weighs each answer by the
 * config epochs (slotmap.h) and reports a changed map to its owner through
 * the callback the owner set. It calls nothing above it. */
#ifndef FERRY_CLUSTER_H
#define FERRY_CLUSTER_H

#include <stdint.h>
#include <uv.h>

#include "config.h"
#include "slotmap.h"

typedef struct cluster_source cluster_source;

/* What the owner hears; data is the owner's pointer given to cluster_new. */
typedef struct cluster_ops {
    /* The trusted map changed (slots moved, a master replaced, replicas,
     * health or an epoch changed); moved: slots that changed owner. m is
     * borrowed for the call. */
    void (*on_map)(void *data, const slotmap *m, int moved);
} cluster_ops;

/* Why the map is asked for before its interval (cluster_refresh). */
typedef enum cluster_why {
    CLUSTER_WHY_MASTER_LOST = 0, /* a shard's master view lost its master */
    CLUSTER_WHY_MOVED,           /* a node answered MOVED */
    CLUSTER_WHY_CLUSTERDOWN,     /* a node answered CLUSTERDOWN */
    CLUSTER_WHY_CHANNEL,         /* a node dropped a shard channel (its slot moved) */
    CLUSTER_WHY_REPLAY,          /* a node redirected a fallback replay script */
    CLUSTER_WHY_UNREACHABLE,     /* a master of the map did not answer a round */
    CLUSTER_NWHY
} cluster_why;

/* Rounds asked for start at least CLUSTER_ASK_MIN_MS apart; while they
 * move no slot the gap doubles, up to CLUSTER_ASK_MAX_MS (or the refresh
 * interval, if shorter); a round that moves slots brings it back. */
#define CLUSTER_ASK_MIN_MS 100
#define CLUSTER_ASK_MAX_MS 250

/* What the source has done, for stats. */
typedef struct cluster_counts {
    uint64_t rounds;              /* refresh rounds started */
    uint64_t answers;             /* trusted answers merged */
    uint64_t rejected;            /* answers refused: nonsense, or from a node flagged failed */
    uint64_t unreachable;         /* nodes that did not answer in time or refused the connection */
    uint64_t changes;             /* times the map changed */
    uint64_t slots_moved;         /* slots that changed owner, in total */
    uint64_t asked[CLUSTER_NWHY]; /* refreshes asked for, per reason */
    uint64_t deferred;            /* of them, left to a round under way or to the back-off */
    char last_error[400];         /* why the last answer was refused, "" if none */
} cluster_counts;

/* Start following the cluster of cfg->cluster_nodes (credentials from
 * redis.username / redis.password; over TLS with tls, redis.tls, unless
 * NULL); the first round starts at once. Returns a new source, never NULL
 * (unreachable nodes are retried). */
struct tls_conf;
cluster_source *cluster_new(uv_loop_t *loop, const config *cfg, struct tls_conf *tls,
                            const cluster_ops *ops, void *data);
/* Periodic (the owner's tick): starts a due round, times out slow nodes. */
void cluster_tick(cluster_source *cs, uint64_t now);
/* Refresh soon (a MOVED, CLUSTERDOWN, a failed link): at once when no
 * round ran for the back-off's gap (CLUSTER_ASK_MIN_MS), else when it has
 * passed; when a round is under way, another follows it, as far apart.
 * reason is counted, why logged. */
void cluster_refresh(cluster_source *cs, cluster_why reason, const char *why);
/* The trusted map (empty until a first answer), and the counts. */
const slotmap *cluster_map(const cluster_source *cs);
const cluster_counts *cluster_get_counts(const cluster_source *cs);
/* Close every connection (handles close on the loop); then free. */
void cluster_close(cluster_source *cs);
void cluster_free(cluster_source *cs); /* accepts NULL; after cluster_close and a loop turn */

#endif
