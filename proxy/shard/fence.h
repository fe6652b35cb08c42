/* fence.h - what makes a reply safe to release: the checks a new shared
 * link passes before it carries client requests (ROLE says master,
 * durability asserted), replicas_ack WAIT batching, and the fence at a
 * master switch (replies from the old master held until a replica is known
 * to have them). */
#ifndef FERRY_FENCE_H
#define FERRY_FENCE_H

#include "link.h"
#include "shard.h" /* what the shard side reports upward */

/* Start verifying a new shared link: ROLE, then durability enforcement;
 * the link becomes READY (and the master view UP) when both pass. */
void fence_verify(link *l);
/* Periodic checks on a verified shared link: ROLE and durability. */
void fence_recheck_role(link *l);
void fence_enforce(link *l);
/* The checks on a VERIFYING shared link passed: it carries client
 * requests now (READY) and the master view may go UP. */
void fence_link_verified(link *l);
/* Reply callback for ferry's AUTH on any link. */
void fence_auth_done(link *l, request *r, const char *reply, size_t len);
/* Reply callback for a user's AUTH on a new link of that user (client.auth
 * redis): accepted, the link carries the user's commands (a shared one is
 * READY: ferry's own links verified the master); refused, it closes. */
void fence_user_auth_done(link *l, request *r, const char *reply, size_t len);

/* With replicas_ack: learn the master's replication id (INFO replication)
 * on its probe link, once per master (again while it has no backlog). */
void fence_learn_replid(struct upstream *up, link *probe, uint64_t now);

/* l is lent to a client (a blocking pop, a script...): with replicas_ack a
 * ROLE goes ahead of what the client sends if l never had one, so the first
 * reply held on l has the lower end of its bracket (a shared link has it
 * from the ROLE that verified it; a pooled one from its last WAIT's). */
void fence_bracket_open(link *l);
void fence_bracket_batch(link *l);

/* r (REQ_F_VERDICT) is about to go to a master: its verdict (a
 * bracket_verdict, counted) once the next master was read, or with force
 * (no better will come); -1 not yet. */
int fence_verdict(struct upstream *up, const request *r, int force);
/* Whether r's held reply is delivered (1) or r is sent again (0) on
 * verdict v (bracket_delivers). */
int fence_verdict_delivers(const request *r, int v);
/* Free the records of requests awaiting a verdict (upstream_free). */
void fence_verdicts_free(struct upstream *up);

/* Queue one WAIT for every acknowledged write sent since the last one. */
void fence_wait(link *l);

/* How a fence_confirm ended. */
typedef enum fence_outcome {
    FENCE_CONFIRMED = 0, /* durability.replicas_ack replicas have it */
    FENCE_UNCONFIRMED,   /* fewer within durability.replicas_ack_hold_ms, or Redis refused WAIT */
    FENCE_LOST           /* l was lost before its WAIT answered: the outcome is unknown */
} fence_outcome;
typedef void (*fence_confirm_cb)(void *arg, fence_outcome o, long long acked);
/* With durability.replicas_ack: a WAIT on l for what ferry's own commands
 * sent on it so far wrote (internal commands, whose replies fence_hold
 * does not keep: the priority pop across slots, its put-backs). Asked
 * again while fewer replicas confirm, as long as wait_done would ask again
 * for a client's write; cb is called once, from l's reply or its close. */
void fence_confirm(link *l, fence_confirm_cb cb, void *arg);

/* Whether l's oldest WAIT in flight waits behind a client's blocking call
 * (a pop that blocked, sent in the same turn as the writes before it):
 * Redis runs it only once the call ends, so it is not late meanwhile (no
 * nudge, no ACK asked of the replicas). */
int fence_wait_queued(const link *l);
/* Stop the late-WAIT nudge of up for good (ferry is stopping). */
void fence_nudge_close(struct upstream *up);
/* A reply arrived for r: if it must wait for replicas (durability.replicas_ack,
 * or l is fencing), keep it (r becomes WAITING) and return 1; else return 0. */
int fence_hold(link *l, request *r, const char *p, size_t n);
/* Fence l at a master switch: a WAIT follows what it carries; replies wait
 * for it; then the link closes. The link leaves its slot and its owner. */
void fence_start(link *l);
/* l is closing: its held replies were never confirmed (retried or answered). */
void fence_drop_held(link *l, const char *reason);
/* Periodic: gives up on a fence the old master does not answer. Returns 1
 * if l was closed. */
int fence_check(link *l, uint64_t now);

#endif
