/* multipop.h - cluster mode: a blocking pop whose keys live in several
 * slots (the priority pop, `BRPOP high mid low 0`: BLPOP, BRPOP, BZPOPMIN,
 * BZPOPMAX). A node would refuse it with CROSSSLOT; ferry serves it as
 * one server would:
 *
 *   1. the keys are tried in the client's order, one non-blocking pop at
 *      a time (LPOP, RPOP, ZPOPMIN, ZPOPMAX) on the master of each key's
 *      slot: the first key with an item answers, so a key earlier in the
 *      order wins even over a key of another shard;
 *   2. all empty: one blocking pop per slot (its keys, in order) on a
 *      dedicated link of that slot's master, with the client's timeout;
 *      the first item wins, the other pops are cancelled with CLIENT
 *      UNBLOCK (their Redis client id, asked on each link first);
 *   3. an item a cancelled pop took anyway (it was served before the
 *      UNBLOCK arrived) goes back to the end it came from (RPUSH after a
 *      BRPOP, LPUSH after a BLPOP, ZADD with its score after a BZPOP*):
 *      one item per call, nothing popped for nobody.
 *
 * With durability.replicas_ack, the pop that took the client's item and
 * each put-back are followed by a WAIT on the link that carried them; the
 * item is held until it answers (delivered unconfirmed past
 * durability.replicas_ack_hold_ms: never replaced by an error).
 *
 * Every pop all empty until the timeout: the null reply, as Redis. A pop
 * whose link is lost (a failover of its shard) is sent again with the
 * time it has left once its slot has a master. The router hands a request
 * over (multipop_start) and is called back (resume) once it is answered. */
#ifndef FERRY_MULTIPOP_H
#define FERRY_MULTIPOP_H

#include "command.h"
#include "ferry.h"
#include "session.h"

/* r->slot of a request served here (router_classify.c sets it). */
#define MULTIPOP_SLOT (-3)

/* Whether cmd, with keys of several slots, is served here. */
int multipop_handles(const command *cmd);
/* Serve r (a request of s classified MULTIPOP_SLOT; nothing else in
 * flight for s): r is SENT, off any link, until it is answered; then
 * resume(s) goes on with what s sent after it. */
void multipop_start(session *s, request *r, void (*resume)(session *s));

#endif
