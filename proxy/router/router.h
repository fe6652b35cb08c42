/* router.h - how each request of a session is served: classified when it
 * is parsed (command class, write or not, route), then dispatched in order
 * to ferry itself, the shared link, the session's dedicated link, or the
 * backlog when there is no master. Owns the session's connection state
 * (transaction, tunnel, db) and the retry policy for a lost reply. */
#ifndef FERRY_ROUTER_H
#define FERRY_ROUTER_H

#include "link.h"
#include "session.h"

struct link;

/* r->route: how a request is routed; decided when it is parsed
 * (router_classify), acted on in order (router.c, tx.c). */
enum route {
    RT_SHARED = 0, /* stateless: shared link, or the dedicated one if pinned */
    RT_BLOCKING,   /* blocking call: a dedicated link for its duration */
    RT_SCRIPT,     /* script or function call: a dedicated link for its duration */
    RT_MULTI,      /* MULTI */
    RT_EXEC,       /* EXEC */
    RT_DISCARD,    /* DISCARD */
    RT_WATCH,      /* WATCH */
    RT_UNWATCH,    /* UNWATCH */
    RT_SELECT,     /* SELECT arg */
    RT_STICKY,     /* CLIENT SETNAME/TRACKING...: pinned for the session's life */
    RT_TUNNEL,     /* pub/sub, MONITOR, CLIENT REPLY: a raw tunnel from now on */
    RT_ERROR,      /* refused: the reply is already in r->reply */
    RT_AUTH,       /* AUTH: arg = auth result */
    RT_HELLO,      /* HELLO: arg = hello result */
    RT_QUIT,       /* QUIT */
    RT_RESET,      /* RESET */
    RT_CLIENT      /* CLIENT ID/INFO/LIST/KILL/UNBLOCK: ferry's clients (clients.c), arg CL_* */
};

/* Decide how r is routed from its parsed arguments (gone after this).
 * Returns 1 when ferry answers r itself (its bytes need not be kept). */
int router_classify(session *s, request *r, const resp_request *req);
/* Refuse a classified request with this error line (answered by ferry, in
 * order, when dispatched). */
void router_refuse(request *r, const char *line);
/* Dispatch s's requests from the cursor on, in order, as far as they can go. */
void router_dispatch(session *s);

/* Events from links and fences. */
void router_on_reply(session *s, request *r, const char *p, size_t n);
/* Redis refused r on link l without applying it (p, n: its reply): held and
 * sent again with a back-off until upstream.hold_timeout_ms from the first
 * refusal; a NOREPLICAS of a settled master (its own configuration) is
 * answered as Redis gave it. */
void router_on_refused(session *s, request *r, struct link *l, link_refusal why, const char *p,
                       size_t n);
/* r's reply was lost with its link: retried or answered by the retry policy. */
void router_on_lost(session *s, request *r, const char *reason);
/* s's dedicated link is gone (its requests were handed back first). */
void router_on_link_closed(session *s, struct link *l, const char *reason);
/* What a subscribed client's link brought (p, n: one reply or push):
 * 1 when it is not the client's (cluster mode: a node dropped its shard
 * channels, their slot moved; ferry subscribes them again elsewhere). */
int router_on_tunnel(session *s, const char *p, size_t n);

/* r was in flight off any link (the fallback store) and must wait again. */
void router_requeue(session *s, request *r);
/* s holds state on its dedicated link that a fence or a PING would break
 * (an open MULTI or a WATCH in force). */
int router_holds_state(const session *s);
/* A session taken over from another ferry process: protocol, db selected,
 * connection settings (replayed on its next link) and, when pubsub,
 * subscribed to s's sets (re-subscribed at its next dispatch); a tracking
 * client is sent a cache flush, as when its link is lost. */
void router_restore(session *s, const session_import *im);
/* Takeover: s stops waiting for r, its one blocking call in flight on its
 * dedicated link; r stays on the link with no session (r->s is NULL). */
void router_release_call(session *s, request *r);
/* s's dedicated link carries state a fence would lose unseen: a
 * transaction, connection settings (CLIENT SETNAME/TRACKING), pub/sub. */
int router_link_bound(const session *s);
/* s has sent MULTI on its dedicated link and not EXEC yet: a command ferry
 * adds there (WAIT, PING) would be queued in the transaction. */
int router_multi_open(const session *s);
/* Forget s's connection state (the session is closing). */
void router_forget(session *s);

#endif
