/* outage.h - the queue while no Redis master is usable (N14): eligible
 * writes go to the fallback store (fallback.c) and are acknowledged once
 * committed, pops on keys with fallback rows are served from it, blocked
 * pops are woken by fallback writes; once a master is UP again the rows are
 * replayed, in order and exactly once, before new writes reach their keys. */
#ifndef FERRY_OUTAGE_H
#define FERRY_OUTAGE_H

#include "session.h"

struct outage;

/* What the outage reports to the router, which it does not call by name:
 * a request's reply from the store, a blocked pop that must wait again.
 * core sets the table once per context (f->outage_ops). */
typedef struct outage_ops {
    void (*on_reply)(session *s, request *r, const char *p, size_t n);
    void (*requeue)(session *s, request *r);
} outage_ops;

/* Open the store named by fallback.path (none: returns 0, f->outage NULL).
 * Returns 0 or a negative error, logged (another ferry holds the file...). */
int outage_open(ferry *f);
/* Stop replaying and close the store (waits for the commit in flight). */
void outage_close(ferry *f);

/* The master view is DOWN: r is served from the store if it is eligible
 * (returns 1: answered or in flight on the store), else 0. A blocking pop
 * on an eligible key with no rows stays held (returns 2: wait). rcpt (NULL:
 * none) is a push's receipt key when it was sent with it to a master that
 * did not answer: its rows are held for the replay, which asks Redis
 * whether that push applied (fallback_push_held). */
int outage_dispatch(session *s, request *r, const char *rcpt, size_t rcptlen);
/* A master is UP: 1 if r writes to a key whose fallback rows are not
 * replayed yet (it waits), else 0. */
int outage_blocks(ferry *f, const request *r);
/* r is a held blocking pop the store serves while DOWN: it waits on the
 * store (its own timeout applies, not the hold timeout). */
int outage_waits(ferry *f, const request *r);

/* workers: N. The main loop owns the store and the replay; a worker loop
 * gets a view of it (wf->outage) that serves its clients the same way and
 * has the main loop run the store operations. Called by workers_start
 * before the worker's thread starts; nothing if main has no store. */
void outage_attach(ferry *wf, ferry *main_ctx);
/* Main loop: run a store operation a worker posted (workers_to_main). */
void outage_remote_run(ferry *f, void *op);
/* Worker loop: the result of its operation (its mailbox). */
void outage_remote_done(ferry *f, void *op);
/* On f's thread: a result no request can take any more (its worker
 * closed): popped rows go back to the store, on the main loop. */
void outage_remote_drop(ferry *f, void *op);

/* Periodic: start or continue the replay when a master is UP (replay.c). */
void outage_tick(ferry *f, uint64_t now);
/* Any loop: rows pending in the fallback store and the oldest one's age
 * (as of the last commit). Returns 0, or -1 when there is no store. */
int outage_backlog(ferry *f, uint64_t *rows, uint64_t *oldest_age_ms);
/* Figures for the stats port. */
void outage_stats(ferry *f, ferry_stats *st);
/* Main loop: rows of key pending in the store (0 without a store). */
uint64_t outage_key_rows(ferry *f, const char *key, size_t keylen);

#endif
