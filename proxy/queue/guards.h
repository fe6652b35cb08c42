/* guards.h - queue guards (queues: max_length, on_full), for the router: a
 * push to a bounded list is sent as one Lua script that checks the bound
 * and applies the push atomically (EVALSHA, EVAL after a NOSCRIPT); its
 * -QFULL is the client's answer (on_full: refuse) or holds the push until
 * there is room (on_full: block, bounded by upstream.hold_timeout_ms). */
#ifndef FERRY_GUARDS_H
#define FERRY_GUARDS_H

#include <stddef.h>

#include "router.h"

struct link;

/* What the router does with a guarded push's reply. */
typedef enum guard_verdict {
    GUARD_PASS = 0, /* the client's reply, as Redis gave it */
    GUARD_RESEND,   /* NOSCRIPT: send it again at once (as EVAL) */
    GUARD_HOLD      /* full, on_full block: hold it and try again later */
} guard_verdict;

/* r (not inside a transaction) is about to be sent on l: a push to a
 * bounded list is queued on l as the guard script in place of r->data.
 * Returns 1 when it was (link_send must not be called), 0 otherwise. */
int guards_send(session *s, request *r, struct link *l);
/* r is a push to a list with on_full: block, or one such is in flight for
 * s: r waits until what s has in flight is answered, so that a push held
 * for room keeps its client's order. */
int guards_must_wait(session *s, const request *r);
/* Redis answered r (sent by guards_send when REQ_F_GUARD is set). */
guard_verdict guards_on_reply(session *s, request *r, const char *p, size_t n);

#endif
