/* broadcast.h - cluster mode: a command every master must run (SCRIPT LOAD,
 * SCRIPT FLUSH, SCRIPT EXISTS, FUNCTION LOAD/DELETE/FLUSH/RESTORE). The
 * router sends it to each master of the map in turn (clustermap_unseen) and
 * folds their replies here into the one the client gets: the first master's
 * reply when every master accepted it, the first error otherwise (the
 * masters after it are not asked), and for SCRIPT EXISTS a 1 only where
 * every master has the script. PUBSUB's answers are the cluster's: a node
 * knows only its own subscribers, so channel lists are merged and counts
 * summed over every master. No I/O: replies are pushed in. */
#ifndef FERRY_BROADCAST_H
#define FERRY_BROADCAST_H

#include <stddef.h>

#include "buf.h"
#include "clustermap.h"
#include "command.h"

/* How the masters' replies make the client's. */
typedef enum broadcast_kind {
    BCAST_NONE = 0,  /* not a broadcast */
    BCAST_FIRST,     /* the first master's reply, or the first error */
    BCAST_AND,       /* SCRIPT EXISTS: an array of 0/1, AND of every master's */
    BCAST_UNION,     /* PUBSUB CHANNELS, SHARDCHANNELS: every master's names, once each */
    BCAST_SUM_PAIRS, /* PUBSUB NUMSUB, SHARDNUMSUB: name, count pairs, counts summed */
    BCAST_SUM        /* PUBSUB NUMPAT: an integer, summed */
} broadcast_kind;

typedef struct broadcast {
    broadcast_kind kind;                       /* how replies are folded */
    int answered;                              /* masters that replied so far */
    int failed;                                /* a master's error is the reply: stop */
    struct upstream *at;                       /* the master view it was last sent to */
    unsigned char seen[CLUSTERMAP_SEEN_BYTES]; /* master views that replied (clustermap.h) */
    buf reply;                                 /* the folded reply so far */
} broadcast;

/* Whether cmd is broadcast to every master in cluster mode, and how. */
broadcast_kind broadcast_kind_of(const command *cmd);
broadcast *broadcast_new(broadcast_kind kind);
void broadcast_free(broadcast *b); /* accepts NULL */
/* One master's reply (p, n: one complete RESP reply) folded into b->reply.
 * Returns 1 while the other masters are still to be asked, 0 once a
 * master's error is the reply (or replies that cannot be folded: a
 * ferry error says so). */
int broadcast_fold(broadcast *b, const char *p, size_t n);

#endif
