/* slotmap.h - the slot map of a Redis Cluster: which shard (a master and its
 * replicas) serves each of the 16384 slots. Parsed from a node's CLUSTER
 * SHARDS (Redis 7) or CLUSTER SLOTS reply, with the masters' config epochs
 * from CLUSTER NODES (neither SHARDS nor SLOTS carries one), and merged into
 * the map ferry trusts by Redis' own rule: a slot changes owner only to a
 * master announced at a higher config epoch than its current owner's. Pure
 * data, no I/O: cluster.c does the talking. */
#ifndef FERRY_SLOTMAP_H
#define FERRY_SLOTMAP_H

#include <hiredis/hiredis.h>
#include <stddef.h>
#include <stdint.h>

#include "slot.h"

#define SLOTMAP_MAX_SHARDS 256 /* shards (masters serving slots) in one map */
#define SLOTMAP_MAX_REPLICAS 8 /* replicas kept per shard (more are counted, not kept) */
#define SLOTMAP_MAX_NODES 1024 /* lines of CLUSTER NODES read */
#define SLOTMAP_ID_LEN 40      /* a node id: 40 hex digits */
#define SLOTMAP_HOST_LEN 256   /* room for an address or a host name */

/* A node's health as the answering node sees it. */
enum { SLOTMAP_ONLINE = 0, SLOTMAP_LOADING, SLOTMAP_FAILED };

/* Flags of a CLUSTER NODES line (slotmap_nodes_parse). */
#define SLOTMAP_F_MYSELF 0x01u
#define SLOTMAP_F_MASTER 0x02u
#define SLOTMAP_F_REPLICA 0x04u
#define SLOTMAP_F_PFAIL 0x08u /* "fail?": one node's suspicion */
#define SLOTMAP_F_FAIL 0x10u  /* "fail": agreed by a majority of masters */
#define SLOTMAP_F_HANDSHAKE 0x20u
#define SLOTMAP_F_NOADDR 0x40u

typedef struct slotmap_node {
    char id[SLOTMAP_ID_LEN + 1]; /* node id, "" when the reply had none */
    char host[SLOTMAP_HOST_LEN]; /* where to connect: endpoint, else ip */
    int port;                    /* 1..65535 */
    int health;                  /* SLOTMAP_ONLINE / LOADING / FAILED */
} slotmap_node;

typedef struct slotmap_shard {
    slotmap_node master;                         /* serves the shard's slots */
    slotmap_node replicas[SLOTMAP_MAX_REPLICAS]; /* its replicas (the first ones) */
    int nreplicas;                               /* in replicas[] */
    uint64_t epoch;                              /* the master's configEpoch, 0 = unknown */
    int nslots;                                  /* slots it serves in this map */
} slotmap_shard;

typedef struct slotmap {
    int16_t owner[CLUSTER_SLOTS];             /* shard index per slot, -1 = none */
    slotmap_shard shards[SLOTMAP_MAX_SHARDS]; /* shards[0..nshards) */
    int nshards;
} slotmap;

/* One line of CLUSTER NODES. */
typedef struct slotmap_nodeinfo {
    char id[SLOTMAP_ID_LEN + 1];        /* node id */
    char master_id[SLOTMAP_ID_LEN + 1]; /* the master it replicates, "" for a master */
    unsigned flags;                     /* SLOTMAP_F_* */
    uint64_t epoch;                     /* configEpoch */
} slotmap_nodeinfo;

/* An empty map: no shard, every slot unowned. */
void slotmap_init(slotmap *m);

/* Parse a CLUSTER SHARDS / CLUSTER SLOTS reply into m (initialised first).
 * Shards whose master is missing or failed, and slots of no shard, are left
 * out. Returns 0, or -1 with err filled (wrong types, a slot out of range, a
 * missing field, too many shards): m is then empty. Never keeps r. tls: the
 * reply came over TLS, and the nodes are reached so: a SHARDS node's
 * "tls-port" is taken (Redis lists it with tls-cluster yes, beside "port",
 * the plain one, which a TLS-only node leaves out), else its "port". */
int slotmap_from_shards(slotmap *m, const redisReply *r, int tls, char *err, size_t errlen);
int slotmap_from_slots(slotmap *m, const redisReply *r, char *err, size_t errlen);

/* Parse CLUSTER NODES text (len bytes) into at most max entries; *n gets
 * the count. Returns 0, or -1 with err filled (a malformed line, no line
 * flagged myself, more than max lines). */
int slotmap_nodes_parse(const char *text, size_t len, slotmap_nodeinfo *out, int max, int *n,
                        char *err, size_t errlen);

/* Give every shard of m its master's config epoch from the answering node's
 * CLUSTER NODES, and mark a master flagged fail there as failed. Returns 0,
 * or -1 with err filled when a master with slots is not in nodes or has
 * epoch 0 (such a map cannot be weighed against another). */
int slotmap_set_epochs(slotmap *m, const slotmap_nodeinfo *nodes, int n, char *err, size_t errlen);

/* Merge a candidate map (with epochs) into cur: a slot moves to the
 * candidate's owner when cur has none, or when that owner's epoch is higher
 * than the current owner's; a shard's replicas and health are refreshed from
 * a candidate at an equal or higher epoch for the same master; slots the
 * candidate does not assign and failed masters' claims change nothing.
 * Shards left without slots are dropped. Returns the number of slots that
 * changed owner; *changed (may be NULL) is set to 1 when anything in cur
 * changed (owners, addresses, replicas, health, epochs). */
int slotmap_merge(slotmap *cur, const slotmap *cand, int *changed);

/* The shard serving slot, or NULL. */
const slotmap_shard *slotmap_shard_of(const slotmap *m, int slot);
/* Slots of m with an owner. */
int slotmap_covered(const slotmap *m);

#endif
