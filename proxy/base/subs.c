/* subs.c - the channels, patterns and shard channels a pub/sub client is
 * subscribed to, kept so ferry can subscribe it again on a new master. */
#include "subs.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ferry.h"

sub_sets *sub_sets_new(void)
{
    return xcalloc(1, sizeof(sub_sets));
}

void sub_sets_free(sub_sets *ss)
{
    if (ss == NULL) {
        return;
    }
    subs_free(&ss->channels);
    subs_free(&ss->patterns);
    subs_free(&ss->shards);
    free(ss);
}

static uint64_t subs_hash(const char *p, size_t n)
{
    uint64_t h = 1469598103934665603ULL; /* FNV-1a */
    for (size_t i = 0; i < n; i++) {
        h ^= (unsigned char)p[i];
        h *= 1099511628211ULL;
    }
    return h;
}

/* The slot holding the name, or the free slot where it would go. */
static size_t subs_find(const sub_set *set, const char *p, size_t n, uint64_t h)
{
    size_t mask = set->nslots - 1;
    size_t k = (size_t)h & mask;
    while (set->slot[k] != 0) {
        size_t i = set->slot[k] - 1;
        if (set->h[i] == h && set->l[i] == n && memcmp(set->v[i], p, n) == 0) {
            return k;
        }
        k = (k + 1) & mask;
    }
    return k;
}

/* Rebuild the index with nslots slots. */
static void subs_reindex(sub_set *set, size_t nslots)
{
    free(set->slot);
    set->slot = xcalloc(nslots, sizeof(*set->slot));
    set->nslots = nslots;
    for (size_t i = 0; i < set->n; i++) {
        size_t k = (size_t)set->h[i] & (nslots - 1);
        while (set->slot[k] != 0) {
            k = (k + 1) & (nslots - 1);
        }
        set->slot[k] = i + 1;
    }
}

int subs_has(const sub_set *set, const char *p, size_t n)
{
    return set->nslots > 0 && set->slot[subs_find(set, p, n, subs_hash(p, n))] != 0;
}

void subs_add(sub_set *set, const char *p, size_t n)
{
    uint64_t h = subs_hash(p, n);
    if (set->nslots > 0 && set->slot[subs_find(set, p, n, h)] != 0) {
        return;
    }
    if (set->n == set->cap) {
        set->cap = set->cap ? set->cap * 2 : 8;
        set->v = xrealloc(set->v, set->cap * sizeof(*set->v));
        set->l = xrealloc(set->l, set->cap * sizeof(*set->l));
        set->h = xrealloc(set->h, set->cap * sizeof(*set->h));
    }
    if ((set->n + 1) * 2 > set->nslots) {
        subs_reindex(set, set->nslots ? set->nslots * 2 : 16);
    }
    size_t i = set->n++;
    set->v[i] = xmalloc(n ? n : 1);
    memcpy(set->v[i], p, n);
    set->l[i] = n;
    set->h[i] = h;
    set->slot[subs_find(set, p, n, h)] = i + 1;
}

void subs_del(sub_set *set, const char *p, size_t n)
{
    if (set->nslots == 0) {
        return;
    }
    size_t mask = set->nslots - 1;
    size_t k = subs_find(set, p, n, subs_hash(p, n));
    if (set->slot[k] == 0) {
        return;
    }
    size_t i = set->slot[k] - 1;
    /* Free slot k, shifting back later entries of its probe run. */
    for (size_t j = (k + 1) & mask; set->slot[j] != 0; j = (j + 1) & mask) {
        size_t home = (size_t)set->h[set->slot[j] - 1] & mask;
        int between = k <= j ? (k < home && home <= j) : (k < home || home <= j);
        if (!between) {
            set->slot[k] = set->slot[j];
            k = j;
        }
    }
    set->slot[k] = 0;
    free(set->v[i]);
    size_t last = --set->n;
    if (i != last) {
        /* The last entry takes the freed position; its slot follows. */
        size_t kl = subs_find(set, set->v[last], set->l[last], set->h[last]);
        set->v[i] = set->v[last];
        set->l[i] = set->l[last];
        set->h[i] = set->h[last];
        set->slot[kl] = i + 1;
    }
}

void subs_clear(sub_set *set)
{
    for (size_t i = 0; i < set->n; i++) {
        free(set->v[i]);
    }
    set->n = 0;
    if (set->nslots > 0) {
        memset(set->slot, 0, set->nslots * sizeof(*set->slot));
    }
}

void subs_free(sub_set *set)
{
    subs_clear(set);
    free(set->v);
    free(set->l);
    free(set->h);
    free(set->slot);
    set->v = NULL;
    set->l = NULL;
    set->h = NULL;
    set->slot = NULL;
    set->cap = 0;
    set->nslots = 0;
}

void subs_track(sub_set *channels, sub_set *patterns, sub_set *shards, const char *cmd,
                const resp_request *req)
{
    sub_set *set;
    if (strcmp(cmd, "subscribe") == 0 || strcmp(cmd, "unsubscribe") == 0) {
        set = channels;
    } else if (strcmp(cmd, "psubscribe") == 0 || strcmp(cmd, "punsubscribe") == 0) {
        set = patterns;
    } else {
        set = shards;
    }
    int add = strstr(cmd, "unsubscribe") == NULL;
    if (!add && req->argc == 1) {
        subs_clear(set);
        return;
    }
    for (size_t i = 1; i < req->argc; i++) {
        if (add) {
            subs_add(set, req->argv[i].ptr, req->argv[i].len);
        } else {
            subs_del(set, req->argv[i].ptr, req->argv[i].len);
        }
    }
}

void subs_encode(buf *b, const char *verb, const sub_set *set)
{
    buf_append_count(b, '*', set->n + 1);
    buf_append_bulk(b, verb, strlen(verb));
    for (size_t i = 0; i < set->n; i++) {
        buf_append_bulk(b, set->v[i], set->l[i]);
    }
}
