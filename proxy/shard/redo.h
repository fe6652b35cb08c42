/* redo.h - acknowledged queue pushes that not every replica has yet.
 *
 * With durability.replicas_ack N, a push is acknowledged once N replicas
 * confirmed it; another replica may still lack it, and Sentinel may promote
 * that one (it ranks replicas by an offset up to a second old). Each master
 * view (upstream) keeps a copy of every acknowledged queue push (LPUSH,
 * RPUSH, LPUSHX, RPUSHX, ZADD, XADD with the id its reply carried, a
 * transaction as its receipt script) with its offset bracket, until every
 * replica that may be promoted has it: the master lists as many replicas as
 * Sentinel does (up->replicas_known), each online past it. After a
 * failover, the new master's master_replid2 and second_repl_offset tell
 * which of them it lacks: those are sent to it again, in order, before the
 * view carries any client request; those it has wait for its own replicas.
 * Other acknowledged writes are kept as their bracket, to count those a new
 * master lacks (acked_writes_missing).
 * Owned by fence.c; calls only the link and the bottom. */
#ifndef FERRY_REDO_H
#define FERRY_REDO_H

#include <stddef.h>

#include "link.h"

struct upstream;

/* r's reply (reply, len) was released after its replicas_ack WAIT on l,
 * which acked replicas confirmed: keep a copy of r if it is a queue push
 * (or an EXEC that went with its receipt: shard_ops->redo_tx) with a known
 * bracket that not every replica confirmed, its bracket alone if it is
 * another write. */
void redo_keep(link *l, const request *r, const char *reply, size_t len, long long acked);

/* INFO replication of up's current master: every replica it lists is
 * online at min_offset or past it (-1: none listed, or one not online); it
 * lists listed replicas (-1 unknown): drop what they all have when they are
 * as many as Sentinel lists. */
void redo_replicas(struct upstream *up, long long min_offset, int listed);

/* INFO replication of up's current master lists replica addr ("ip:port")
 * online at offset: a node promoted later with no shared history (started
 * again from its AOF) holds that master's stream at least up to there. */
void redo_replica_at(struct upstream *up, const char *addr, long long offset);

/* The new master's heir info is in up (heir_replid2, heir_second,
 * heir_epoch), heir_replid is its own replication id: decide every entry of
 * an older master: on it (kept for its replicas), not on it or the boundary
 * inside its bracket (to be sent again, redo_send; a bracket alone:
 * counted missing), of a history it does not share (a node restarted from
 * its AOF: dropped, counted). replid_of gives the replication id learned
 * for an epoch (NULL unknown). */
void redo_decide(struct upstream *up, const char *heir_replid,
                 const char *(*replid_of)(const struct upstream *up, unsigned long long epoch));

/* Send on l (a verifying link of ferry's own) what redo_decide left to send
 * again and is not in flight. idle is called (with up) when nothing is in
 * flight any more. Returns 1 while something is in flight (the caller
 * waits for idle before l carries client requests), 0 otherwise. */
int redo_send(link *l, void (*idle)(struct upstream *up));

/* Free everything up kept (upstream_free). */
void redo_free(struct upstream *up);

#endif
