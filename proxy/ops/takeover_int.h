/* takeover_int.h - internal to the takeover: the state and the helpers
 * that takeover.c (the new process's side, the control connection, what
 * both sides share) and takeover_source.c (the old process's side) have in
 * common. Nothing else includes it; the takeover's contract is takeover.h. */
#ifndef FERRY_TAKEOVER_INT_H
#define FERRY_TAKEOVER_INT_H

#include <stdatomic.h>
#include <stdint.h>

#include "ferry.h"
#include "takeover_wire.h"

#define TAKEOVER_SEND_TIMEOUT_MS 5000 /* one frame's send, old process */
#define TAKEOVER_SCAN_MS 5            /* handover scan period while handing over */
#define TAKEOVER_MAX_INHERIT (2 * CONFIG_MAX_LISTEN + 2) /* listen, listen_tls, stats, ... */

enum { TK_L_CLIENT = 0, TK_L_STATS, TK_L_TAKEOVER };

/* Legal moves (tk_set_phase asserts them):
 *   IDLE -> SRC_HELLO -> SRC_LISTENERS -> SRC_HANDING -> SRC_FINISHING
 *   IDLE -> SRC_HANDING (a worker's, told by the main loop)
 *   SRC_HELLO, SRC_LISTENERS, SRC_HANDING -> IDLE (aborted)
 *   SINK -> IDLE (all received, or the old process is gone: this process
 *   may be taken over in turn) */
typedef enum tk_phase {
    TK_IDLE = 0,      /* listening on takeover.socket (or not at all) */
    TK_SRC_HELLO,     /* old: a new process connected; waiting for its HELLO */
    TK_SRC_LISTENERS, /* old: listeners sent; waiting for ACCEPTING */
    TK_SRC_HANDING,   /* old: handing sessions over */
    TK_SRC_FINISHING, /* old: the rest closes after its replies (SIGTERM's rules) */
    TK_SINK_READYING, /* new: listeners received; waiting for a usable master */
    TK_SINK           /* new: receiving sessions */
} tk_phase;

typedef struct tk_inherited {
    int kind;       /* TK_L_* */
    char name[320]; /* address as config_addr_str writes it, or the takeover path */
    int fd;         /* -1 once claimed or closed */
} tk_inherited;

/* A session whose blocked call is being cancelled on Redis. */
typedef struct tk_cancel {
    uint64_t sid;        /* the session */
    uint64_t lid;        /* the dedicated link the call is on */
    struct upstream *up; /* the master view that link belongs to (cluster: its shard's) */
    long long redis_id;  /* that link's CLIENT ID */
    request *call;       /* copy of the call, to re-issue (owned) */
    uint64_t since;      /* uv_now() when the cancel began */
    uint64_t next_try;   /* when to send CLIENT UNBLOCK (again) */
    int asking;          /* a CLIENT UNBLOCK is in flight */
    int done;            /* Redis let go of it without popping: hand it over */
} tk_cancel;

/* A session a worker handed over: its frame and a copy of its socket. */
typedef struct tk_item {
    struct tk_item *next; /* in the relay, oldest first */
    buf frame;            /* TK_SESSION payload (carries a password: wiped) */
    int fd;               /* the client socket, owned by the item */
} tk_item;

/* Old process with workers: the sessions the workers hand over, on their
 * way to the main loop, which alone writes on the control connection. */
typedef struct tk_relay {
    uv_mutex_t lock; /* guards head, tail, open */
    tk_item *head, *tail;
    int open;            /* async may be sent (cleared before it closes) */
    uv_async_t async;    /* on the main loop: items posted */
    atomic_ulong closed; /* sessions the workers left to SIGTERM's rules */
} tk_relay;

typedef struct takeover {
    ferry *f;         /* context */
    tk_relay *relay;  /* old, with workers: owned by the main loop's, borrowed by a
                         worker's (which exists only while it hands over) */
    tk_phase phase;   /* see tk_phase; changed only by tk_set_phase */
    int lfd;          /* takeover.socket listener, -1 */
    uv_poll_t *lpoll; /* watches lfd (freed in its close callback) */
    char lpath[108];  /* its path, "" when none */
    int lpath_owned;  /* unlink lpath when closing (not once handed over) */
    int cfd;          /* the control connection, -1 */
    uv_poll_t *cpoll; /* watches cfd */
    uv_timer_t *scan; /* handover scan while SRC_HANDING */
    tkw_rx in;        /* control bytes and fds received, not yet framed */
    tk_inherited inh[TAKEOVER_MAX_INHERIT]; /* new: listeners received */
    int ninh;
    tk_cancel *cancels; /* old: blocked calls being cancelled */
    size_t ncancels, capcancels;
    uint64_t started_ms;  /* the takeover began */
    uint64_t handing_ms;  /* old: uv_now() when the new process said ACCEPTING */
    uint64_t deadline_ms; /* SRC_HANDING: then the rest is closed after replies */
    unsigned long handed; /* old: sessions sent; new: sessions received */
    unsigned long closed; /* old: sessions left to SIGTERM's rules */
} takeover;

/* takeover.c: the phase's one setter (asserts the legal moves). */
void tk_set_phase(takeover *tk, tk_phase p);
/* takeover.c: a heap handle's close callback (frees it). */
void tk_free_handle_cb(uv_handle_t *h);
/* takeover.c: watch fd for reading with cb (*hp is freed once unwatched). */
int tk_watch(takeover *tk, int fd, uv_poll_t **hp, uv_poll_cb cb);
/* takeover.c: stop watching and close the fd; both set to none. */
void tk_unwatch(uv_poll_t **hp, int *fd);
/* takeover.c: a takeover in IDLE (f may be NULL until takeover_start). */
takeover *tk_new(ferry *f);
/* takeover.c: frames on the control connection, either side. */
void tk_control_cb(uv_poll_t *h, int status, int events);

/* takeover_source.c: a new process connects on takeover.socket. */
void tk_listener_cb(uv_poll_t *h, int status, int events);
/* takeover_source.c: a frame from the new process (fds: closed, it sends none). */
void tk_source_frame(takeover *tk, int type, tkw_rd *p, int *fds, int nfds);
/* takeover_source.c: give up; the clients not handed over yet stay here. */
void tk_source_abort(takeover *tk, const char *why);
/* takeover_source.c: the rest closes after its replies (SIGTERM's rules). */
void tk_finish_source(takeover *tk, const char *why);
/* takeover_source.c, main loop: send (after an abort: serve) what workers posted. */
void tk_relay_drain(takeover *tk);
/* takeover_source.c: the relay's oldest item (returned, owned), or NULL. */
tk_item *tk_relay_pop(tk_relay *r);
/* takeover_source.c: close an item's socket and wipe its frame. */
void tk_item_free(tk_item *it);
/* takeover_source.c: forget cancel c (the last one takes its place). */
void tk_cancel_drop(takeover *tk, tk_cancel *c);

#endif
