/* rewrite.h - the rewriters: what a client's request may be sent as on its
 * way to Redis, one table with one interface (rewrite.c).
 *
 *   guards    a push to a bounded queue: the guard script (guards.c)
 *   lease     an ack (LREM) of a leased queue: the ack script (lease.c)
 *   receipts  a pop, a push, a transaction or a script with its receipt
 *             (receipts.c)
 *   xreads    an XREADGROUP '>' sent before: its look first (xreads.c)
 *
 * Each says when it applies (its send sends r as something else, or passes
 * it on), what a reply means (again: r goes again, now or held), what the
 * client's reply is and what is kept of it (reply), and what undoes the
 * request when its client is gone (client_gone). A link lost with r on it
 * needs nothing of them: r keeps what it was sent with (its flags, its
 * receipt) and goes again through the same table. */
#ifndef FERRY_REWRITE_H
#define FERRY_REWRITE_H

#include <stddef.h>

#include "buf.h"
#include "ferry.h"
#include "session.h"

struct link;

typedef enum rewrite_verdict {
    REWRITE_PASS = 0, /* the reply stands */
    REWRITE_RESEND,   /* r goes again at once (as EVAL, its look done...) */
    REWRITE_HOLD      /* r goes again later (a full queue: on_full block) */
} rewrite_verdict;

typedef struct rewriter {
    const char *name;
    /* r about to go on l: 1 when sent as rewritten (nothing else sends
     * it), 0 passed on. */
    int (*send)(session *s, request *r, struct link *l);
    /* Redis answered r (p, n): whether r goes again. NULL: never. */
    rewrite_verdict (*again)(session *s, request *r, const char *p, size_t n);
    /* r's reply is final: what it keeps of it; 1 with the client's reply
     * in out (reshaped), else 0. NULL: nothing. */
    int (*reply)(session *s, request *r, struct link *via, const char *p, size_t n, buf *out);
    /* s's client is gone, its requests not let go yet. NULL: nothing. */
    void (*client_gone)(session *s);
} rewriter;

/* The first rewriter that sends r on l (1), else 0: send it as written. */
int rewrite_send(session *s, request *r, struct link *l);
/* The first verdict other than REWRITE_PASS, in the table's order. */
rewrite_verdict rewrite_again(session *s, request *r, const char *p, size_t n);
/* Every rewriter's reply, in the table's order; 1 with the client's reply
 * in out (the last that reshaped it; only one ever does), else 0. */
int rewrite_reply(session *s, request *r, struct link *via, const char *p, size_t n, buf *out);
/* Every rewriter's client_gone (session.c, as s closes). */
void rewrite_client_gone(session *s);

#endif
