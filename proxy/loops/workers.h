/* workers.h - more event loops (workers: N). The main loop listens, runs
 * the Sentinel client, the stats port and the signals, and serves clients
 * like every loop; workers 1..N-1 are threads with a context of their own
 * (sessions, their own upstream and shared links to the master, held
 * requests). The main loop hands accepted clients round-robin to every loop
 * and tells each worker, through a mailbox read in order, of every change
 * Sentinel makes to the master view: a worker connects only to a master it
 * was told of. With workers: 1 nothing here runs (f->workers is NULL). */
#ifndef FERRY_WORKERS_H
#define FERRY_WORKERS_H

#include "ferry.h"

struct workers;
struct tk_relay;

/* What one loop reports on its tick, for the stats port. */
typedef struct worker_view {
    uint64_t clients;        /* sessions open */
    uint64_t clients_paused; /* of those, not read for backpressure */
    uint64_t held_bytes;     /* request bytes held for lack of a master */
    uint64_t memory;         /* bytes held for clients */
    uint64_t links;          /* links to Redis open */
    uint64_t pool;           /* idle dedicated links pooled */
    int up;                  /* its master view is UP */
    uint64_t epoch;          /* its master view's epoch */
    uint64_t commands;       /* requests parsed from its clients (commands_total) */
    char master[64];         /* the master it follows ("" if none) */
} worker_view;

/* What workers asks of the modules above it: workers relays between loops
 * and calls nothing of theirs by name. core fills one table per context
 * (f->workers_ops) at start-up. */
typedef struct workers_ops {
    /* core: set up a worker loop's context (as core_init_worker), close
     * every handle of it, free what outlives them once its loop ended.
     * Stopping one gracefully is f->stop. */
    int (*init)(ferry *f, uv_loop_t *loop, config *cfg, struct workers *wk, int index,
                uint64_t base_id);
    void (*close)(ferry *f);
    void (*release)(ferry *f);
    /* session: serve a client accepted on this loop, or handed over as fd. */
    int (*accept)(ferry *f, uv_stream_t *server, int is_unix);
    int (*accept_fd)(ferry *f, uv_os_sock_t fd, int is_unix);
    /* upstream: change this loop's master view; the master it follows. */
    void (*set_master)(struct upstream *up, const char *ip, int port, const char *why);
    void (*switch_master)(struct upstream *up, const char *reason);
    const char *(*master_name)(const struct upstream *up);
    /* sentinel: a round now; the replicas asked for an ACK now (a worker
     * asked). */
    void (*trigger_sentinel)(struct sentinel_client *sc);
    void (*ask_replica_acks)(struct sentinel_client *sc);
    /* outage: a worker's view of the main loop's store; a store operation
     * run on the main loop, its result back on the worker, one dropped. */
    void (*store_attach)(ferry *wf, ferry *main_ctx);
    void (*store_run)(ferry *f, void *op);
    void (*store_done)(ferry *f, void *op);
    void (*store_drop)(ferry *f, void *op);
    /* takeover: hand this loop's clients over, abort that, adopt one. */
    void (*hand_clients)(ferry *f, struct tk_relay *relay);
    void (*hand_abort)(ferry *f);
    int (*adopt)(ferry *f, int fd, char *frame, size_t len);
    /* A worker loop publishes its figures (its tick, the stats port's
     * request): what the modules above publish beside them. */
    void (*publish)(ferry *f);
} workers_ops;

/* Main loop, at the end of core_init: start cfg->workers - 1 worker loops,
 * each with a context of its own (set up by f->workers_ops->init). Returns
 * 0, or a negative error (logged; no worker is left running). Does nothing
 * with workers: 1. */
int workers_start(ferry *f);
/* The main loop's context (for a worker's set-up). */
ferry *workers_main_ctx(struct workers *wk);
/* Main loop: a client connects on server (a unix socket if is_unix): accept
 * it and hand it to the next loop in turn (this one included). Returns 0 or
 * a negative uv error. */
int workers_accept(ferry *f, uv_stream_t *server, int is_unix);
/* Main loop: stop every worker gracefully (what SIGTERM does) / at once. */
void workers_stop(ferry *f, const char *why);
void workers_close(ferry *f);
/* Main loop: workers whose loop still runs. */
int workers_running(ferry *f);
/* Main loop, once its own loop returned: wait for every worker and free
 * them (workers_close first if they might still run). */
void workers_join(ferry *f);

/* The master view as the Sentinel client on the main loop decides it:
 * applied to the main loop's upstream at once, and sent to every worker,
 * which applies it to its own, in the same order. */
void workers_switch(ferry *f, const char *why);
void workers_set_master(ferry *f, const char *ip, int port, const char *why);
void workers_fence_invalid(ferry *f);
void workers_keep_master(ferry *f);
/* How many replicas Sentinel lists, in any state (replicas.c follows each):
 * any of them may be promoted, so redo.c keeps a push until as many are
 * online past it. */
void workers_replicas_known(ferry *f, int n);
/* Takeover (takeover.c). Old process, main loop: every worker hands its
 * clients over through relay / stops doing so (aborted). New process, main
 * loop: fd, a client received with its state frame p[0..n), is adopted by
 * the next loop in turn (this one included); p's password bytes are wiped. */
struct tk_relay;
void workers_takeover_hand(ferry *f, struct tk_relay *relay);
void workers_takeover_abort(ferry *f);
void workers_adopt(ferry *f, int fd, char *p, size_t n);
/* A worker lost its master: the main loop's Sentinel client asks again. */
void workers_trigger_sentinel(ferry *f);
/* A worker's WAIT is slow: the main loop asks the replicas for an ACK. */
void workers_ask_replica_acks(ferry *f);

/* The fallback store (outage.c) lives on the main loop. A worker posts a
 * store operation to it (0, or -1 once the main loop reads no more: only
 * after every worker stopped); the main loop runs outage_remote_run. */
int workers_to_main(ferry *f, void *op);
/* Main loop: the result goes to worker index's mailbox (outage_remote_done
 * there; if the worker has closed, outage_remote_drop here). */
void workers_to_loop(ferry *f, int index, void *op);
/* Main loop: a store write; every worker re-dispatches what waits. */
void workers_wake(ferry *f);

/* Calls between loops (CLIENT LIST/KILL/UNBLOCK reach every client).
 * fn runs on loop index's thread with that loop's context, or with NULL
 * when that loop stopped reading before it ran (fn then only frees or
 * answers what arg holds). f is the calling thread's own loop: a call to
 * it runs at once. Returns 0, or -1 when that loop reads no more (fn is
 * not called; arg stays the caller's). */
typedef void (*workers_fn)(ferry *f, void *arg);
int workers_call(ferry *f, int index, workers_fn fn, void *arg);
/* The same, never at once, from a thread that has no loop context of its
 * own (a call told NULL): any is any loop's context, of which only the
 * shared workers are read. -1 with one loop. */
int workers_post(const ferry *any, int index, workers_fn fn, void *arg);
/* Loops running clients: 1 with workers: 1. */
int workers_loops(const ferry *f);
/* The loop whose ferry_next_id gave id (loop i gives ids i + k * loops). */
int workers_loop_of(const ferry *f, uint64_t id);

/* Every loop, on its tick: publish what the stats port and limits.max_memory
 * need to know of this loop, and learn the memory the other loops hold
 * (f->others_mem). */
void workers_tick(ferry *f);
/* Any loop: f's counters (live) with every other loop's added, each as of
 * its last tick (INFO answered by ferry). Gauges are f's own. */
void workers_totals(ferry *f, ferry_stats *st);
/* Any loop: f->held_bytes changed by delta (upstream.hold_max_bytes and
 * the peak of held bytes are for ferry as a whole). */
void workers_held_changed(ferry *f, int64_t delta);
/* Request bytes held for lack of a master by every loop, now. */
uint64_t workers_held(const ferry *f);
/* Main loop: ask every worker to publish its figures now; returns the
 * request's number (0: nothing to wait for, one loop). */
uint64_t workers_refresh(ferry *f);
/* Main loop: 1 once every worker has published for request gen (or no
 * longer reads its mail), else 0. */
int workers_refreshed(ferry *f, uint64_t gen);
/* Main loop: add every worker's counters (last published) to st (unless
 * NULL), and fill
 * views[0..n) with each loop's view (the main loop first). Returns the
 * number of loops (at most max). */
int workers_stats(ferry *f, ferry_stats *st, worker_view *views, int max);
/* Sessions open in all loops together (client.max_clients). */
uint64_t workers_clients(const ferry *f);
/* A session opened / closed on f (client.max_clients counts all loops). */
void workers_client_opened(ferry *f);
void workers_client_closed(ferry *f);
/* Close this loop's own handle of the mailbox (close_everything). */
void workers_loop_close(ferry *f);

#endif
