/* shard.h - what the shard side (the master view, upstream.c, and its
 * fences, fence.c) reports to the layers above it. It calls none of them
 * by name: core fills this table once per context (f->shard_ops). */
#ifndef FERRY_SHARD_H
#define FERRY_SHARD_H

#include "ferry.h"

struct link;
struct sentinel_client;

typedef struct shard_ops {
    /* router: a reply a fence held until its WAIT (or the refusal it made),
     * a request to send again (its write was not confirmed). */
    void (*on_reply)(struct session *s, request *r, const char *p, size_t n);
    void (*on_lost)(struct session *s, request *r, const char *reason);
    /* router: what a session holds on its dedicated link (an open MULTI,
     * state a new link would lose, a MULTI or WATCH a PING would break), and
     * that the link was closed under it. */
    int (*multi_open)(const struct session *s);
    int (*link_bound)(const struct session *s);
    int (*holds_state)(const struct session *s);
    void (*on_link_closed)(struct session *s, struct link *l, const char *reason);
    /* session: close a client Redis will not serve any more. */
    void (*close_session)(struct session *s, const char *reason);
    /* receipts: an acknowledged EXEC as it can be sent again to a promoted
     * replica that lacks it (redo.c): 1 with its bytes in cmd and what
     * follows it in after, 0 when it cannot be. */
    int (*redo_tx)(const struct session *s, const request *r, buf *cmd, buf *after);
    /* sentinel: ask for a round now; ask the replicas for an ACK now (a
     * replicas_ack WAIT is slow). Main loop. */
    void (*trigger_sentinel)(struct sentinel_client *sc);
    void (*ask_replica_acks)(struct sentinel_client *sc);
    /* cluster mode: ask the cluster for its slot map now (a shard's master
     * was lost). */
    void (*refresh_cluster)(ferry *f, const char *why);
} shard_ops;

#endif
