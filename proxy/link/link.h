/* link.h - one connection to Redis: connect, write, frame replies with
 * ferry's scanner and deliver each to the request it answers (or down a
 * pass-through tunnel), and the one close path. What a link is used for
 * (shared, lent to a session, fenced, drained) is decided by upstream.c,
 * router.c and fence.c; the link only moves bytes and keeps its state. */
#ifndef FERRY_LINK_H
#define FERRY_LINK_H

#include <hiredis/hiredis.h>

#include "ferry.h"

struct upstream;
struct ident;

/* Legal moves (link_set_state asserts them):
 *   CONNECTING -> VERIFYING (shared) | READY (dedicated, probe) | CLOSING
 *   VERIFYING  -> READY | CLOSING
 *   READY      -> FENCING | DRAINING | CLOSING
 *   FENCING, DRAINING -> CLOSING */
typedef enum link_state {
    LINK_CONNECTING = 0, /* connect in progress; writes are queued */
    LINK_VERIFYING,      /* shared: connected; AUTH, ROLE, durability in flight */
    LINK_READY,          /* connected (and verified, if shared): carries client requests */
    LINK_FENCING,        /* old master: replies held until the fence WAIT confirms them */
    LINK_DRAINING,       /* old master: a blocked call may still be served until drain_until_ms */
    LINK_CLOSING         /* closed, waiting for libuv's close callback */
} link_state;

/* Batches (TLS records) a shared link on TLS keeps in flight (link.c: link_flush). */
#define LINK_TLS_INFLIGHT 2

typedef enum link_kind {
    LINK_SHARED = 0, /* pipelined for all sessions */
    LINK_DEDICATED,  /* lent to one session (owner), or idle in the pool */
    LINK_PROBE       /* health probe: PING only, never a client request */
} link_kind;

typedef struct link {
    ferry *f;            /* context */
    struct upstream *up; /* owner */
    uint64_t id;         /* for logs */
    link_kind kind;      /* see link_kind */
    link_state state;    /* see link_state; changed only by link_set_state */
    union {
        uv_handle_t h;
        uv_stream_t s;
        uv_tcp_t tcp;
        uv_pipe_t pipe;
    } io;                       /* the connection */
    uv_connect_t creq;          /* connect request */
    outq out;                   /* bytes to Redis */
    buf in;                     /* bytes from Redis not yet framed */
    resp_scanner sc;            /* frames replies in 'in' */
    list_node pending;          /* requests awaiting a reply, in send order */
    size_t npending;            /* entries in pending */
    struct session *owner;      /* dedicated: the session it is lent to (upstream.c sets it) */
    int returning;              /* dedicated, given back with only ferry's own requests in
                                   flight: pooled once they are answered (upstream.c) */
    int client_set;             /* dedicated: settings of its client were restored on it
                                   (router_lend): never pooled until taken off (router.c) */
    int passthrough;            /* replies beyond pending go to owner as a stream */
    int db;                     /* database selected on this connection */
    int slot;                   /* shared: index in up->shared, else -1 */
    list_node node;             /* in up->links */
    list_node pool_node;        /* in up->pool while idle */
    uint64_t pooled_ms;         /* when it last went into the pool */
    list_node dirty_node;       /* in f->dirty_links while it has output */
    uint64_t opened_ms;         /* uv_now() at creation */
    uint64_t last_io_ms;        /* last read or write */
    int ping_pending;           /* a keep-alive or probe PING is in flight */
    uint64_t ping_sent_ms;      /* when it was sent */
    int closing_cb_pending;     /* uv_close called */
    uint64_t epoch;             /* master epoch the link belongs to */
    uint64_t fence_started_ms;  /* FENCING: when it began */
    uint64_t fence_deadline_ms; /* FENCING: when the old master is given up on */
    list_node held;             /* REQ_WAITING requests whose replies wait for a WAIT */
    int need_wait;              /* writes sent since the last WAIT (replicas_ack) */
    int nwaits;                 /* WAITs in flight on this link */
    int role_due;               /* writes sent since the last ROLE (offset brackets) */
    uint64_t held_since_ms;     /* when the oldest held reply arrived */
    uint64_t wait_sent_ms;      /* when the last replicas_ack WAIT was queued */
    long long repl_off;         /* the master's replication offset from the last ROLE answered
                                   here, -1 unknown (fence.c: offset brackets) */
    int role_refused;           /* Redis refused ROLE on it: no brackets here */
    int redo_wait;              /* verified, waiting for the redo's pushes sent again to be
                                   answered before it carries client requests (fence.c) */
    uint64_t drain_until_ms;    /* DRAINING: then it is closed and the call re-issued */
    int swallow;                /* internal replies to drop in a tunnel (re-subscription) */
    int paused;                 /* not reading: its tunnel's client does not read (link_pause) */
    long long redis_id;         /* dedicated: its client id on Redis, from HELLO (for CLIENT
                                   UNBLOCK); 0 unknown */
    int proto;                  /* RESP version spoken on it: 2, or 3 after HELLO 3 */
    struct ident *who;          /* who it is on Redis: ferry's own, or a client's ACL user */
    int gated;                  /* a user's AUTH is unanswered: nothing else is written */
    buf gate;                   /* bytes queued behind that AUTH (written once Redis accepts) */
    int guard_script;           /* the queue guards' SCRIPT LOAD was queued on it (guards.c) */
    int receipt_script; /* receipts' SCRIPT LOADs queued on it: 1 pop, 2 push, 4 several keys' pop
                         */
    /* Shared link on TLS: requests still unanswered of each batch in
     * flight, oldest first, and how many are in flight (link_flush). */
    size_t tls_batch[LINK_TLS_INFLIGHT];
    int tls_nbatch;
    int tls_write_waits; /* TLS: a write is queued and not yet written (link_flush) */
    int lease_scripts;   /* the leases' SCRIPT LOADs were queued on it (lease.c) */
    void *script_marks;  /* scripts.c: the remembered scripts its server was given (plain
                            memory, freed with the link) */
} link;

/* Open a link of this kind to up's current target speaking RESP proto (2 or
 * 3: AUTH, or HELLO 3 with AUTH, queued first) as identity id (ferry's own
 * credentials, or a Redis user: then nothing but that AUTH is written until
 * Redis accepts it, so no command ever runs as anyone else). Returns NULL
 * (logged, handle closing) if connect fails at once. */
link *link_new(struct upstream *up, link_kind kind, int proto, struct ident *id);
/* Redis accepted the user's AUTH: write what was queued behind it. */
void link_open_gate(link *l);
/* The one setter of l->state: asserts the move is legal, logs it at debug. */
void link_set_state(link *l, link_state st);
/* Connected: bytes queued now are written this turn. */
int link_connected(const link *l);

/* Queue r on l (its state becomes SENT, it joins pending). */
void link_send(link *l, request *r);
/* Queue r on l with these bytes in place of r->data (a check ferry runs
 * for r: the AUTH of a HELLO, a WAIT probe). */
void link_send_bytes(link *l, request *r, const char *p, size_t n);
/* link_send with these bytes in place of r->data (a client's push sent as
 * the queue guard's script): a write waits for its replicas_ack WAIT. */
void link_send_as(link *l, request *r, const char *p, size_t n);
/* Queue one of ferry's own commands; done (may be NULL) gets its reply. The
 * request's arg is set to arg. */
void link_internal(link *l, const char *const *argv, int argc, req_done_cb done, long long arg);
/* link_internal, and done is called with a NULL reply if l is lost first. */
void link_internal_sure(link *l, const char *const *argv, int argc, req_done_cb done,
                        long long arg);
/* Queue already-encoded bytes as one of ferry's own commands (one reply). */
void link_internal_raw(link *l, const char *p, size_t n, req_done_cb done);
/* link_internal_raw, with arg, and done called with a NULL reply if l is
 * lost first (as link_internal_sure). */
void link_internal_bytes(link *l, const char *p, size_t n, req_done_cb done, long long arg);
/* Send every request encoded in b on l as one of ferry's own (done gets
 * each reply). Returns how many. */
size_t link_internal_each(link *l, const buf *b, req_done_cb done);
/* Queue r's bytes without expecting a reply of its own (pass-through). */
void link_send_raw(link *l, const char *p, size_t n);
/* Stop (paused 1) or resume (0) reading from Redis: backpressure for a
 * tunnel whose client does not read its stream. */
void link_pause(link *l, int paused);
/* Write queued output now (called once per loop turn). */
void link_flush(link *l);
/* The one close path: held and pending requests go back to their sessions
 * (retried or answered), the owner is told, the reason is logged. */
void link_close(link *l, const char *reason);

/* Helpers for ferry's own replies (not the hot path). RESP3 replies are
 * read as their RESP2 form (hiredis 0.14 reads RESP2 only). */
redisReply *link_parse_reply(const char *p, size_t n); /* returns new, or NULL */
void link_error_text(const char *p, size_t n, char *out, size_t len);
/* Redis refused without applying anything because it is not (or no longer)
 * a usable master: READONLY, LOADING, MASTERDOWN, and the UNBLOCKED of a
 * blocked call whose master turned replica (not Redis' other UNBLOCKED: a
 * deleted stream key, CLIENT UNBLOCK ... ERROR, which are answers). */
int link_reply_not_master(const char *p, size_t n);

/* How Redis refused a request without applying it, if it did. */
typedef enum link_refusal {
    REFUSAL_NONE = 0,
    REFUSAL_NOT_MASTER, /* link_reply_not_master */
    REFUSAL_NOREPLICAS, /* min-replicas-to-write: fewer good replicas than it asks */
    REFUSAL_REDIRECT    /* cluster mode: MOVED, ASK, TRYAGAIN, CLUSTERDOWN (nothing applied) */
} link_refusal;
link_refusal link_reply_refusal(const char *p, size_t n);

/* What a link reports upward. link.c calls nothing above it by name: its
 * owners' functions come through this table, which core sets once per
 * context (f->link_ops). The shard side (fence, upstream) learns of the
 * link's life, the router and the session of what Redis answered. */
typedef struct link_ops {
    /* fence: AUTH/HELLO replies, the check of a new shared link, a WAIT due,
     * a reply held for its WAIT (1) or not (0), held replies dropped. */
    req_done_cb auth_done;
    req_done_cb user_auth_done;
    void (*verify)(link *l);
    void (*wait)(link *l);
    void (*bracket)(link *l); /* writes sent behind a WAIT in flight: their ROLE */
    int (*hold)(link *l, request *r, const char *p, size_t n);
    void (*drop_held)(link *l, const char *reason);
    /* upstream: the link is not on a master, failed, leaves its pool, has
     * closed. */
    void (*on_not_master)(link *l, const char *why);
    void (*on_error)(link *l, const char *why);
    void (*on_closing)(struct upstream *up, link *l);
    void (*detach)(link *l, const char *reason);
    void (*on_closed)(struct upstream *up, link *l, int was_ready, const char *reason);
    /* upstream: a link given back while ferry's own requests were in
     * flight on it (l->returning) has none left. */
    void (*on_returned)(link *l);
    /* router: a client request's reply, a refusal, a request lost with the
     * link (to be sent again). */
    void (*on_reply)(struct session *s, request *r, const char *p, size_t n);
    void (*on_refused)(struct session *s, request *r, link *l, link_refusal why, const char *p,
                       size_t n);
    void (*on_lost)(struct session *s, request *r, const char *reason);
    /* receipts: a reply put as the client's command answers it (1, in out). */
    int (*reshape)(link *l, request *r, const char *p, size_t n, buf *out);
    /* session: bytes of a dedicated link's stream (MONITOR, SUBSCRIBE) and
     * RESP3 pushes, for its owner. */
    void (*on_stream)(struct session *s, const char *p, size_t n);
    void (*on_push)(struct session *s, const char *p, size_t n);
} link_ops;

#endif
