/* subs.h - what a pub/sub client is subscribed to (to re-subscribe it after
 * a failover). Sets of names compared byte for byte: an array in
 * subscription order plus a hash index, so adding, removing and finding a
 * name costs O(1) on average whatever the number of subscriptions. */
#ifndef FERRY_SUBS_H
#define FERRY_SUBS_H

#include <stddef.h>
#include <stdint.h>

#include "buf.h"
#include "resp.h"

typedef struct sub_set {
    char **v;      /* names (heap, not NUL-terminated: see l) */
    size_t *l;     /* their lengths */
    uint64_t *h;   /* their hashes */
    size_t n;      /* entries */
    size_t cap;    /* allocated in v, l and h */
    size_t *slot;  /* index, linear probing: 0 = free, else position in v + 1 */
    size_t nslots; /* a power of two, at least twice n; 0 = no index yet */
} sub_set;

/* A pub/sub client's three sets, allocated at its first subscription. */
typedef struct sub_sets {
    sub_set channels; /* SUBSCRIBE */
    sub_set patterns; /* PSUBSCRIBE */
    sub_set shards;   /* SSUBSCRIBE */
} sub_sets;

/* Returns new empty sets (abort on OOM). */
sub_sets *sub_sets_new(void);
void sub_sets_free(sub_sets *ss); /* accepts NULL */

/* Add a name (copied) unless present. */
void subs_add(sub_set *set, const char *p, size_t n);
/* 1 if the name is in the set. */
int subs_has(const sub_set *set, const char *p, size_t n);
void subs_del(sub_set *set, const char *p, size_t n);
void subs_clear(sub_set *set);
void subs_free(sub_set *set); /* leaves an empty, reusable set */
/* Apply a SUBSCRIBE/UNSUBSCRIBE (P.., S..) request named cmd (lowercase). */
void subs_track(sub_set *channels, sub_set *patterns, sub_set *shards, const char *cmd,
                const resp_request *req);
/* Append "<verb> name..." as a multibulk request to b. */
void subs_encode(buf *b, const char *verb, const sub_set *set);

#endif
