/* replicas.h - durability enforced on every replica its owner lists
 * (Sentinel mode: SENTINEL REPLICAS <master>; cluster mode: each shard's
 * replicas in the slot map, fed by clustermap.c), so that a promoted replica is durable from
 * its first write: the same CONFIG SET as on the master, then INFO
 * persistence judged by durable.c. Each replica keeps one connection; it is
 * enforced on every (re)connection (a restarted replica comes back as it was
 * configured) and every durability.enforce_interval_ms. */
#ifndef FERRY_REPLICAS_H
#define FERRY_REPLICAS_H

#include <hiredis/hiredis.h>
#include <stdint.h>

#include "ferry.h"

typedef struct replicas replicas;

/* One replica as the stats port shows it (borrowed until the next tick). */
typedef struct replica_view {
    const char *addr;           /* "ip:port" as Sentinel or the map announces it */
    int enforced;               /* settings asserted and INFO persistence trusted */
    uint64_t enforced_since_ms; /* uv_now() when it last became enforced */
    const char *last_error;     /* why it is not enforced, "" when it is */
} replica_view;

/* A new, empty table; source names who lists the replicas, for logs
 * ("Sentinel", "the cluster map"; a static string). */
replicas *replicas_new(ferry *f, const char *source);
/* 1 when SENTINEL REPLICAS should be asked on this poll round (then not
 * again for a while), else 0. */
int replicas_list_due(replicas *rs, uint64_t now);
/* A sentinel's answer to SENTINEL REPLICAS: new replicas are added and
 * connected to, listed ones are kept. Replies of any other shape are
 * ignored. */
void replicas_learn(replicas *rs, const redisReply *r, uint64_t now);
/* A list of the replicas from another source (the cluster map): call
 * replicas_learn_addr for each numeric ip and port listed, then
 * replicas_listed once the list is complete (a replica left out of the
 * lists for a while is dropped, as with Sentinel). */
void replicas_learn_addr(replicas *rs, const char *ip, int port, uint64_t now);
void replicas_listed(replicas *rs, uint64_t now);
/* Periodic: connects, enforcement rounds, timeouts, replicas no sentinel
 * lists any more are dropped. */
void replicas_tick(replicas *rs, uint64_t now);
/* Ask every connected replica to send its master an ACK now: REPLCONF
 * GETACK, which a replica obeys from any client and answers nothing to,
 * between CLIENT REPLY OFF and ON. A master that counts a replica online
 * but streams nothing to it until its next ACK (after a diskless full
 * resync) answers a WAIT at once instead of after the replica's periodic
 * ACK, once a second. */
void replicas_ask_acks(replicas *rs);
/* Close every connection (ferry is stopping). */
void replicas_close(replicas *rs);
void replicas_free(replicas *rs); /* accepts NULL; after replicas_close */

/* For the stats port: how many replicas, and replica i. */
int replicas_count(const replicas *rs);
void replicas_get(const replicas *rs, int i, replica_view *out);

#endif
