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

void subs_add(sub_set *set, const char *p, size_t n)
{
    for (size_t i = 0; i < set->n; i++) {
        if (set->l[i] == n && memcmp(set->v[i], p, n) == 0) {
            return;
        }
    }
    if (set->n == set->cap) {
        set->cap = set->cap ? set->cap * 2 : 8;
        set->v = xrealloc(set->v, set->cap * sizeof(*set->v));
        set->l = xrealloc(set->l, set->cap * sizeof(*set->l));
    }
    set->v[set->n] = xmalloc(n ? n : 1);
    memcpy(set->v[set->n], p, n);
    set->l[set->n++] = n;
}

void subs_del(sub_set *set, const char *p, size_t n)
{
    for (size_t i = 0; i < set->n; i++) {
        if (set->l[i] == n && memcmp(set->v[i], p, n) == 0) {
            free(set->v[i]);
            set->v[i] = set->v[set->n - 1];
            set->l[i] = set->l[set->n - 1];
            set->n--;
            return;
        }
    }
}

void subs_clear(sub_set *set)
{
    for (size_t i = 0; i < set->n; i++) {
        free(set->v[i]);
    }
    set->n = 0;
}

void subs_free(sub_set *set)
{
    subs_clear(set);
    free(set->v);
    free(set->l);
    set->v = NULL;
    set->l = NULL;
    set->cap = 0;
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
