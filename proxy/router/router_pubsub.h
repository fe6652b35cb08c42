/* router_pubsub.h - internal to the router: where a subscribed client's
 * link goes in cluster mode (router_pubsub.c). Nothing else includes it;
 * the contract is router.h. */
#ifndef FERRY_ROUTER_PUBSUB_H
#define FERRY_ROUTER_PUBSUB_H

#include "resp.h"
#include "session.h"

struct upstream;

/* Cluster mode, a (P|S)(UN)SUBSCRIBE being classified: its shard
 * channels' slot (CROSSSLOT across slots, as a node says), the slot the
 * session's subscriptions live on (set by its first pub/sub command: a
 * SSUBSCRIBE's slot, else -1 for any master), r->slot, and the session's
 * sets tracked. Returns 1 when r was refused (its reply composed). */
int router_pubsub_classify(session *s, request *r, const resp_request *req);
/* The master view a session's subscriptions go to: in cluster mode the
 * one serving its home slot (any UP master for -1), NULL while the map
 * still names the master that dropped its shard channels; else f->up. */
struct upstream *router_pubsub_view(session *s);
/* Cluster mode: p, n (a reply or push on a subscribed client's link) is
 * a node's sunsubscribe of a shard channel the client did not leave: the
 * node dropped it, its slot moved to another master. Returns 1 when every
 * shard channel of the client is in that slot (ferry subscribes them again
 * on the slot's new master; the client does not see it); else 0, the
 * channel forgotten: the client gets the node's sunsubscribe, as a
 * client of that node would. */
int router_pubsub_dropped(session *s, const char *p, size_t n);
/* Cluster mode, a subscribed RESP3 client's request r other than a
 * pub/sub one: 1 if its keys live on another shard than the client's
 * subscription link (it is refused: the link serves one node). */
int router_pubsub_elsewhere(session *s, const request *r);

#endif
