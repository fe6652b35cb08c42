/* outage_int.h - internal to the outage: the state that outage.c (the
 * queue served from the fallback store, the workers' remote view of it)
 * and replay.c (its rows back to Redis) share. Nothing else includes it;
 * the contract is outage.h. */
#ifndef FERRY_OUTAGE_INT_H
#define FERRY_OUTAGE_INT_H

#include <stdatomic.h>
#include <stdint.h>

#include "fallback.h"
#include "ferry.h"

/* A key Redis refused during replay: retried after a back-off. */
typedef struct refused_key {
    char *key;
    size_t keylen;
    uint64_t next_ms;    /* not before */
    uint64_t backoff_ms; /* current back-off */
    struct refused_key *next;
} refused_key;

/* A key the replay holds back: for the rest of a pass (o->skipped), or
 * while pops' replies carrying its rows are unwritten (o->held). */
typedef struct replay_key {
    char *key;
    size_t keylen;
    uint64_t since_ms; /* held: first seen with taken rows */
    uint64_t pass;     /* the pass it was last seen in */
    struct replay_key *next;
} replay_key;

/* A master view's replicas confirming the replay's rounds (replay.c);
 * one per view (cluster mode: per shard), made at its first round. */
typedef struct replay_short {
    const struct upstream *up;
    uint64_t since; /* rounds confirmed by replicas_ack but not by every
                       replica since (0: the last one was) */
    int logged;     /* the end of that wait was logged */
    struct replay_short *next;
} replay_short;

/* One key's rows in a replay round. */
typedef struct replay_group {
    char *key;
    size_t keylen;
    int64_t last_id; /* highest row id of the key in this round */
    size_t rows;
    int status; /* 0 pending, 1 applied, -1 refused */
    int slot;   /* cluster mode: the key's slot (its marker hash's) */
} replay_group;

typedef enum replay_state {
    REPLAY_IDLE = 0, /* nothing in flight */
    REPLAY_READING,  /* fallback_read in flight */
    REPLAY_APPLYING, /* scripts (and the closing WAIT/PING) in flight on a link */
    REPLAY_DELETING  /* fallback deletes in flight */
} replay_state;

/* What every loop's outage shares (workers: N): the store's lifetime and
 * the client operations in flight on any loop. */
typedef struct outage_shared {
    uv_mutex_t lock;           /* guards fb */
    fallback *fb;              /* the main loop's store; NULL once it closes */
    atomic_size_t pending_ops; /* client operations submitted, not answered yet */
    atomic_int refs;           /* the main loop's outage and each worker's */
    atomic_int owner_up;       /* the main loop's master view is UP (not cluster
                                  mode): a worker whose own view is still DOWN
                                  holds its writes for Redis, not the store */
} outage_shared;

struct outage {
    ferry *f;                  /* context */
    fallback *fb;              /* the store (NULL in a worker's view) */
    outage_shared *sh;         /* shared with the other loops */
    int remote;                /* a worker's view: the main loop runs its store operations */
    ferry *main_ctx;           /* remote: the main loop's context */
    list_node remote_ops;      /* remote: operations waiting for their result */
    char marker[512];          /* the marker hash's name in Redis (cluster mode: its part
                                  after the slot's hash tag, see replay.c) */
    struct upstream *round_up; /* the master view the round is sent to */
    replay_state rstate;       /* see replay_state */
    uint64_t round;            /* generation of the current round */
    uint64_t round_started;    /* uv_now() */
    uint64_t round_epoch;      /* master epoch the round was sent on */
    replay_group *groups;      /* the round's keys */
    size_t ngroups;
    size_t gcap;
    size_t deletes_left;         /* deletes in flight */
    int64_t cursor;              /* read rows after this id (rows of refused keys stay) */
    uint64_t pass;               /* passes over the store (the cursor back at 0) */
    int pass_applied;            /* cluster mode: a round of this pass applied rows */
    replay_key *skipped;         /* keys whose rows wait for the next pass */
    replay_key *held;            /* keys with rows taken by pops (their replies unwritten) */
    uint64_t next_round_ms;      /* back-off after a failed round */
    int round_need;              /* replicas the round's WAIT asks for (replay.c) */
    int round_all;               /* replicas attached to the master at the round */
    struct replay_short *shorts; /* per master view (cluster mode: per shard) */
    refused_key *refused;        /* keys in back-off */
    uint64_t replayed;           /* rows replayed since start */
    uint64_t replay_errors;      /* refusals and failed rounds */
    uint64_t store_errors;       /* client writes the store could not take */
    int announced;               /* the replay was logged (reset once the store is empty) */
    int owner_seen;              /* remote: sh->owner_up at the last tick */
};

/* A worker's view while the main loop has a master (its own view may
 * still be DOWN, waiting for its reconnect back-off): the store serves
 * nothing there, or a write would wait in the store behind a master that
 * is back (outage.c). */
int outage_owner_up(const struct outage *o);

/* outage.c: blocked pops on every loop may be served now. */
void outage_wake_loops(ferry *f);
/* replay.c: free the keys the replay holds back (at close). */
void replay_free_keys(struct outage *o);
/* outage.c: the master view serving r (cluster mode: its slot's). */
struct upstream *outage_view(ferry *f, const request *r);

#endif
