/* backlog.h - holding requests while there is no usable master: the list
 * of waiting sessions, each session's held requests, the bound on held
 * bytes, one deadline heap for hold timeouts and the own timeouts of held
 * blocking calls, and the wake-up once a master is UP. */
#ifndef FERRY_BACKLOG_H
#define FERRY_BACKLOG_H

#include "session.h"

/* Dispatch found no master for s's request at its cursor: s waits for one,
 * its held requests (from the cursor on) are accounted and get deadlines,
 * and the newest are refused past upstream.hold_max_bytes. */
void backlog_hold(session *s);
/* s holds nothing any more (and is no longer waiting). */
void backlog_release(session *s);
/* Put s on the waiting list (dispatched again at the next wake-up). */
void backlog_wait(session *s);
/* r, sent before, is held again (requeued): s waits for a dispatch. */
void backlog_requeue(session *s, request *r);
/* r leaves the backlog (it was sent or answered): called by its one state
 * setter, request_set_state. */
void backlog_forget(request *r);
/* Before r, which Redis refused (router_on_refused), goes out again: 0 it
 * may; 1 not yet (its back-off runs: dispatch holds it); 2 it was answered
 * -TRYAGAIN (upstream.hold_timeout_ms since its first refusal). 0 for a
 * request never refused. */
int backlog_refused(session *s, request *r, uint64_t now);
/* Dispatch held requests of every waiting session (a master is back). */
void backlog_wake_all(ferry *f);
/* Periodic: hold timeouts (-TRYAGAIN) and held blocking calls whose own
 * timeout ran out (answered as Redis would on timeout); only what is due. */
void backlog_tick(ferry *f, uint64_t now);
/* Free the deadline heap (nothing may be held any more). */
void backlog_free(ferry *f);

#endif
