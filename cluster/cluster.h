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

/* What the source has done, for stats. */
typedef struct cluster_counts {
    uint64_t rounds;      /* refresh rounds started */
    uint64_t answers;     /* trusted answers merged */
    uint64_t rejected;    /* answers refused: nonsense, or from a node flagged failed */
    uint64_t unreachable; /* nodes that did not answer in time or refused the connection */
    uint64_t changes;     /* times the map changed */
    uint64_t slots_moved; /* slots that changed owner, in total */
    char last_error[400]; /* why the last answer was refused, "" if none */
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
/* Refresh now (a MOVED, CLUSTERDOWN, a failed link); why is logged. When
 * a round is under way, another follows it. */
void cluster_refresh(cluster_source *cs, const char *why);
/* The trusted map (empty until a first answer), and the counts. */
const slotmap *cluster_map(const cluster_source *cs);
const cluster_counts *cluster_get_counts(const cluster_source *cs);
/* Close every connection (handles close on the loop); then free. */
void cluster_close(cluster_source *cs);
void cluster_free(cluster_source *cs); /* accepts NULL; after cluster_close and a loop turn */

#endif
