/* broadcast.h - cluster mode: a command every master must run (SCRIPT LOAD,
 * SCRIPT FLUSH, SCRIPT EXISTS, FUNCTION LOAD/DELETE/FLUSH/RESTORE, FLUSHALL,
 * FLUSHDB) or whose answer is the whole keyspace's (KEYS, DBSIZE,
 * RANDOMKEY, INFO with its keyspace section) or the whole cluster's
 * (PUBSUB: a node knows only its own subscribers). The router sends it to
 * each master of the map in turn (clustermap_unseen) and folds their
 * replies here into the one the client gets: the first master's reply when
 * every master accepted it, the first error otherwise (the masters after
 * it are not asked), for SCRIPT EXISTS a 1 only where every master has the
 * script, KEYS' arrays joined, DBSIZE and PUBSUB NUMPAT summed, RANDOMKEY
 * the first master's key (the masters after it are not asked), INFO the
 * first master's with its Keyspace section summed over every master,
 * PUBSUB's channel lists merged and its counts summed. No I/O: replies are
 * pushed in. */
#ifndef FERRY_BROADCAST_H
#define FERRY_BROADCAST_H

#include <stddef.h>

#include "buf.h"
#include "clustermap.h"
#include "command.h"

/* How the masters' replies make the client's. */
typedef enum broadcast_kind {
    BCAST_NONE = 0, /* not a broadcast */
    BCAST_FIRST,    /* the first master's reply, or the first error */
    BCAST_AND,      /* SCRIPT EXISTS: an array of 0/1, AND of every master's */
    BCAST_CONCAT,   /* KEYS: every master's array, joined */
    BCAST_SUM,      /* DBSIZE, PUBSUB NUMPAT: the sum of every master's integer */
    BCAST_ANY,      /* RANDOMKEY: the first master's reply that is not nil */
    BCAST_INFO,     /* INFO: the first master's, its Keyspace section summed */
    BCAST_UNION,    /* PUBSUB CHANNELS, SHARDCHANNELS: every master's names, once each */
    BCAST_SUM_PAIRS /* PUBSUB NUMSUB, SHARDNUMSUB: name, count pairs, counts summed */
} broadcast_kind;

/* INFO's keyspace section summed: per db (0..BCAST_DBS-1), each field
 * ("keys", "expires"...) summed over the masters; avg_ttl weighted by
 * expires. */
#define BCAST_DBS 16
#define BCAST_FIELDS 6
typedef struct broadcast_db {
    int present;                          /* some master listed this db */
    int nfields;                          /* fields in name[] */
    char name[BCAST_FIELDS][16];          /* field names, in the first master's order */
    unsigned long long sum[BCAST_FIELDS]; /* their sums (avg_ttl: avg_ttl * expires) */
} broadcast_db;

typedef struct broadcast {
    broadcast_kind kind;                       /* how replies are folded */
    int answered;                              /* masters that replied so far */
    int failed;                                /* a master's error is the reply: stop */
    struct upstream *at;                       /* the master view it was last sent to */
    unsigned char seen[CLUSTERMAP_SEEN_BYTES]; /* master views that replied (clustermap.h) */
    buf reply;                                 /* the folded reply so far */
    long long count;                           /* KEYS: elements in body; DBSIZE: the sum */
    buf body;                                  /* KEYS: the elements joined; INFO: the
                                                  first master's reply */
    broadcast_db db[BCAST_DBS];                /* INFO: the keyspace summed */
} broadcast;

/* Whether cmd is broadcast to every master in cluster mode, and how. */
broadcast_kind broadcast_kind_of(const command *cmd);
/* INFO's arguments (argv[1..argc-1]): whether its reply has the keyspace
 * section (none, "keyspace", "default", "all", "everything"); only then is
 * INFO sent to every master. */
int broadcast_info_has_keyspace(size_t argc, const char *const *argv, const size_t *lens);
broadcast *broadcast_new(broadcast_kind kind);
void broadcast_free(broadcast *b); /* accepts NULL */
/* One master's reply (p, n: one complete RESP reply) folded into b->reply.
 * Returns 1 while the other masters are still to be asked, 0 once the
 * reply is final: a master's error (or replies that cannot be folded: a
 * ferry error says so), RANDOMKEY's first key. */
int broadcast_fold(broadcast *b, const char *p, size_t n);

#endif
