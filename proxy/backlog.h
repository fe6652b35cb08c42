/* backlog.h - holding requests while there is no usable master: the list
 * of waiting sessions, the bound on held bytes, the hold timeout, the
 * deadlines of held blocking calls, and the wake-up once a master is UP. */
#ifndef FERRY_BACKLOG_H
#define FERRY_BACKLOG_H

#include "session.h"

/* s has held requests from its cursor on and no link for them: wait for a
 * master, account the held bytes and refuse the newest past the bound. */
void backlog_hold(session *s);
/* s holds nothing any more. */
void backlog_release(session *s);
/* Put s on the waiting list (dispatched again at the next wake-up). */
void backlog_wait(session *s);
/* Dispatch held requests of every waiting session (a master is back). */
void backlog_wake_all(ferry *f);
/* Periodic: hold timeouts (-TRYAGAIN) and held blocking calls whose own
 * timeout ran out (answered as Redis would on timeout). */
void backlog_tick(ferry *f, uint64_t now);

#endif
