/* tx.h - a session's MULTI/EXEC/WATCH state machine, for router.c (internal):
 * the one setter of s->tx, what each transaction command does to it, the
 * log of queued commands a transaction is rebuilt from, and where a lost
 * link leaves it. router.c stays the dispatcher and calls these at its
 * steps; the states are listed in session.h (tx_state). */
#ifndef FERRY_TX_H
#define FERRY_TX_H

#include "router.h"

struct link;

/* The one setter of s->tx. */
void tx_set(session *s, tx_state st);
/* MULTI was given and neither EXEC nor DISCARD yet, whatever its link. */
int tx_in_multi(const session *s);

/* r was sent before the MULTI of s's transaction, which its link's loss
 * left to rebuild (or to end in a watch conflict): sent again, it goes
 * ahead of the rebuilt MULTI, outside the transaction. */
int tx_precedes(const session *s, const request *r);

/* s->tx_deferred: the rebuilt MULTI waits behind requests sent before it
 * (tx_precedes); 1 is cluster mode's MULTI answered by ferry. */
#define TX_DEFER_BEHIND 2
/* session_extra tx_dirty, why EXEC aborts. FERRY: ferry refused a command of the
 * transaction (Redis never saw it, or the transaction was rebuilt on a link
 * whose Redis did not): ferry answers EXEC. REDIS: Redis refused one on the
 * link the transaction is open on: EXEC goes to Redis, which aborts it in
 * its own words (while a script still runs: "-EXECABORT ... because of:
 * BUSY ..."; else "... because of previous errors."). */
#define TX_DIRTY_FERRY 1
#define TX_DIRTY_REDIS 2
/* ferry refused r itself (RT_ERROR): inside a MULTI, EXEC aborts. */
void tx_on_refused_locally(session *s, request *r);
/* ferry answered MULTI r itself with an error: what follows is refused
 * until EXEC (-EXECABORT) or DISCARD. */
void tx_on_multi_refused(session *s, request *r);
/* Answers r if it follows such a MULTI (returns 1); 0: dispatch it. */
int tx_after_refused_multi(session *s, request *r);
/* Before r is routed: ferry answers it for the transaction (EXECABORT
 * after a refusal, a lost WATCH). Returns 1 when r is answered. */
int tx_answer(session *s, request *r);
/* r (MULTI or WATCH) starts a transaction behind an EXEC still in flight:
 * it waits for that EXEC's reply. */
int tx_must_wait(const session *s, const request *r);
/* r is about to be sent: MULTI, EXEC, DISCARD, WATCH and UNWATCH move the
 * state; an EXEC of writes is a write, acknowledged by replicas when ack. */
void tx_on_send(session *s, request *r, int ack);
/* r is queued in the open MULTI: flagged so that Redis' +QUEUED keeps it
 * in the log. Returns 1 when it is. */
int tx_queue(session *s, request *r);
/* Redis answered r: a queued command joins the log, an EXEC ends it. */
void tx_on_reply(session *s, request *r, const char *p, size_t n);
/* The link carrying the transaction is gone: WATCH is lost, a MULTI is
 * rebuilt on the next link (or lost with its WATCH). */
void tx_on_link_lost(session *s);
/* s is lent a new dedicated link l: a MULTI being rebuilt is sent on it. */
void tx_on_lend(session *s, struct link *l);
/* Cluster mode: the slot r goes to while s is in a transaction (the one
 * it is pinned to, or r's own, which pins it); *where_dlink set: r is
 * keyless and goes where the transaction's link is. */
int tx_route_slot(const session *s, const request *r, int *where_dlink);
/* Cluster mode: r's keys are not in the transaction's slot: answered
 * -CROSSSLOT (inside MULTI, EXEC then aborts). Returns 1 when answered. */
int tx_crossslot(session *s, request *r);
/* Cluster mode: MULTI with no slot yet is answered by ferry and sent with
 * the first command; WATCH inside MULTI gets Redis' error from ferry.
 * Returns 1 when r is answered. */
int tx_cluster_answer(session *s, request *r);
/* Cluster mode: the transaction leaves its link for another shard's: it
 * is rebuilt there (a WATCH is lost). Returns 1 when the link carried
 * one (it must be closed, not pooled). */
int tx_on_move(session *s);
/* Redis doomed the transaction r is part of: in cluster mode a command
 * refused by the cluster (CLUSTERDOWN, TRYAGAIN, MOVED); in any mode the
 * EXEC of one rebuilt where Redis refused a command (a redirect, READONLY,
 * a new master's NOREPLICAS): nothing of it applies. */
int tx_refused_doomed(const session *s, const request *r, const char *p, size_t n);
/* The session is closing. */
void tx_forget(session *s);

#endif
