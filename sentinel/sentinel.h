/* sentinel.h - finding and watching the master through Redis Sentinel: every
 * configured (and discovered) sentinel is polled with SENTINEL MASTER and
 * watched over pub/sub; a master is accepted when a majority of the known
 * sentinels name it and none of its supporters reports it down or failing
 * over, or when it is announced at a higher config epoch than the one ferry
 * trusts and a second sentinel backs the claim. ROLE is then checked on the
 * very link ferry uses (upstream.c). With fewer than a majority reachable,
 * ferry keeps its master while ROLE says master. */
#ifndef FERRY_SENTINEL_H
#define FERRY_SENTINEL_H

#include <stdint.h>

#include "ferry.h"

typedef struct sentinel_client sentinel_client;

/* Start talking to the configured sentinels. Never fails (unreachable
 * sentinels are retried); returns a new client. */
sentinel_client *sentinel_new(ferry *f);
/* Periodic: reconnects, timeouts, poll rounds. */
void sentinel_tick(sentinel_client *sc, uint64_t now);
/* Start a poll round as soon as possible (a failover sign was seen). */
void sentinel_trigger(sentinel_client *sc);
/* A WAIT on the master is slow: ask every replica followed for durability
 * to send its master an ACK now (replicas_ask_acks). */
void sentinel_ask_replica_acks(sentinel_client *sc);
/* Close every connection (their handles close on the loop). */
void sentinel_close(sentinel_client *sc);
void sentinel_free(sentinel_client *sc); /* accepts NULL */
/* Sentinels known (configured and discovered, each counted once by MYID) /
 * answering in the last round. */
int sentinel_known(const sentinel_client *sc);
int sentinel_reachable(const sentinel_client *sc);
/* The replicas whose durability is enforced (replicas.h), NULL if none. */
struct replicas;
const struct replicas *sentinel_replicas(const sentinel_client *sc);
/* 1 while a majority of the known sentinels answered the last round, else 0
 * (0 too before the first round and for NULL). */
int sentinel_quorum_ok(const sentinel_client *sc);

#endif
