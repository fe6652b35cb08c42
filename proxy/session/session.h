/* session.h - one client connection: reads and parses its requests, keeps
 * them in arrival order, and writes replies back strictly in that order
 * whatever link served them. How each request is served is router.c's job;
 * holding while there is no master is backlog.c's. */
#ifndef FERRY_SESSION_H
#define FERRY_SESSION_H

#include <stdio.h>

#include "ferry.h"
#include "subs.h"

struct link;

/* Legal moves (session_set_state asserts them):
 *   OPEN -> QUIT_SEEN | QUITTING | CLOSING;  QUIT_SEEN -> QUITTING | CLOSING;
 *   QUITTING -> CLOSING */
typedef enum session_state {
    SESSION_OPEN = 0,  /* reading and answering */
    SESSION_QUIT_SEEN, /* QUIT parsed (or a protocol error): read nothing more */
    SESSION_QUITTING,  /* close once the output is written */
    SESSION_CLOSING    /* session_close called; freed in the close callback */
} session_state;

/* A transaction's state (tx_set in tx.c is its one setter). "LOST" states:
 * the link carrying it broke; a MULTI is rebuilt on the next link from the
 * commands already queued, unless a WATCH was in force, in which case EXEC
 * answers the null reply of a watch conflict. */
typedef enum tx_state {
    TX_NONE = 0,         /* no transaction */
    TX_WATCHING,         /* WATCH in force on the dedicated link, no MULTI */
    TX_WATCH_LOST,       /* WATCH was in force, its link broke: EXEC gets null */
    TX_MULTI,            /* MULTI open on the dedicated link */
    TX_MULTI_WATCHING,   /* MULTI open after WATCH */
    TX_MULTI_REBUILD,    /* MULTI open, its link broke: rebuilt from tx_log on the next */
    TX_MULTI_WATCH_LOST, /* MULTI open after a lost WATCH: answered by ferry, EXEC gets null */
    TX_EXEC_SENT,        /* EXEC in flight (retried if its link breaks: outcome unknown) */
    TX_EXEC_SENT_WATCHED /* EXEC of a watched MULTI in flight (null if its link breaks) */
} tx_state;

/* Pass-through tunnels (router_set_tunnel is its one setter). */
typedef enum tunnel_state {
    TUN_NONE = 0,    /* ordinary request/reply */
    TUN_PUBSUB,      /* subscribed: a raw tunnel, rebuilt after a failover */
    TUN_PUBSUB_LOST, /* its link broke: re-subscribe once a master is UP */
    TUN_OTHER        /* MONITOR or CLIENT REPLY: a raw tunnel, not rebuilt */
} tunnel_state;

/* What a session needs only once it does more than read requests and write
 * their replies: a request arriving in pieces (its bytes and parser state),
 * replies someone waits to see written, output past its limits, a read
 * paused for limits.max_memory, a TLS session, a Redis user on other
 * shards, held requests, a transaction, connection settings, leases,
 * XREADGROUP marks, cluster pub/sub. An idle client has none (10 000 idle
 * clients each keep only their session): session_extra_w allocates it on
 * first need, and it goes with the session; session_extra_r reads an
 * all-zero one meanwhile, so a reset or a close allocates nothing. */
typedef struct session_extra {
    struct session *s;         /* whose it is (the nodes below are on ferry's lists) */
    buf in;                    /* bytes read, not yet parsed (no storage when empty) */
    resp_parser *parser;       /* own parser while in holds a partial request (NULL: f->parser) */
    list_node watches;         /* replies whose writing someone waits for (r->written), in
                                  output order */
    list_node watch_node;      /* in f->watching while watches is not empty */
    uint64_t soft_since_ms;    /* output above its soft limit since then; 0 = not above */
    list_node soft_node;       /* in f->over_soft while soft_since_ms is set */
    list_node mem_node;        /* in f->mem_paused while not read for limits.max_memory */
    list_node tls_node;        /* in f->handshaking while its TLS handshake runs */
    uint64_t partial_since_ms; /* an incomplete request began arriving then (0 = none) */
    list_node partial_node;    /* in f->partial while partial_since_ms is set */
    struct ident **ident_on;   /* cluster mode: the same user on the other shards' master
                                  views it sent to, each held (acl.c) */
    int nident_on;             /* entries in ident_on */
    int ident_on_cap;          /* its room */
    int limit_hit;             /* OUT_LIMIT_HARD/SOFT: closed at the next flush; 0 = none */
    buf sticky_log; /* CLIENT SETNAME/TRACKING... Redis accepted: replayed on a new link */
    struct lease_held *leases_held; /* leases it took and has not acked (lease.c); NULL: none */
    struct xread_marks *xmarks;     /* the entry ids its XREADGROUPs were handed (xreads.c) */
    /* Cluster mode's pub/sub (router_pubsub.c). */
    struct upstream *ps_left; /* the master view that dropped its shard channels (their
                                 slot moved), until the map names another */
    size_t ps_sunsub_owed;    /* sunsubscribe replies its own SUNSUBSCRIBEs are still owed
                                 (any other is a node dropping a channel) */
    int ps_slot;              /* the slot whose master its subscriptions live on (its first
                                 SSUBSCRIBE's), -1: any master */
    uint8_t ps_homed;         /* its first pub/sub command set ps_slot */
    /* Its requests held for lack of a master (backlog.c). */
    list_node wait_node; /* in f->waiting while held requests lack a link */
    list_node held;      /* its requests held for lack of a master, via r->hq */
    uint64_t held_upto;  /* holding: 1 + seq of the newest request looked at;
                            0 = not holding */
    size_t held_bytes;   /* request bytes held without a link */
    /* Its transaction (tx.c, receipts.c): set once it sends MULTI or WATCH. */
    buf tx_log;            /* the commands Redis answered +QUEUED in the open MULTI */
    buf tx_cmds;           /* its commands as sent, while they may go as that script */
    uint64_t tx_noted;     /* the last of them noted there (its seq) */
    uint64_t tx_seq;       /* the seq of the MULTI that opened its transaction */
    int tx_pin;            /* cluster mode: 1 + the slot its transaction is pinned to
                              (WATCH's key, or the first key inside MULTI); 0: none yet */
    uint8_t tx_writes;     /* one of them may write: EXEC is a write */
    uint8_t tx_dirty;      /* ferry refused a command inside it: EXEC gets -EXECABORT */
    uint8_t tx_spoiled;    /* cluster mode: the cluster refused a rebuilt command: the
                              transaction on its link is aborted, rebuilt on another */
    uint8_t tx_rcpt;       /* what its open MULTI holds, for a receipt at EXEC
                              (receipts_tx_note: a push of a queue, or a command the
                              receipt script does not take) */
    uint8_t tx_receipted;  /* its transaction goes with its receipt at EXEC (receipts.c):
                              decided by it, not by offsets (SESSION_TX_RECEIPTED) */
    uint8_t multi_refused; /* cluster mode: ferry refused its MULTI: what follows is
                              refused too, until EXEC (-EXECABORT) or DISCARD */
} session_extra;

/* A client's address, kept as numbers (a string would take 64 bytes of
 * every idle client); session_peer writes it out. */
typedef struct session_addr {
    uint8_t kind;   /* SESSION_ADDR_* */
    uint16_t port;  /* host order */
    uint8_t ip[16]; /* 4 bytes (IPv4) or 16 (IPv6), network order */
} session_addr;

#define SESSION_ADDR_UNKNOWN 0 /* getpeername failed: written "?:0" */
#define SESSION_ADDR_IP4 1
#define SESSION_ADDR_IP6 2
#define SESSION_ADDR_UNIX 3 /* a unix socket: written "unix" */

typedef struct session {
    ferry *f;            /* context */
    uint64_t id;         /* for logs and CLIENT-like output */
    session_addr peer;   /* client address, for logs (session_peer) */
    session_state state; /* see session_state; changed only by session_set_state (here: it
                            fills the room session_addr leaves before the handle) */
    union {
        uv_handle_t h;
        uv_stream_t s;
        uv_tcp_t tcp;
        uv_pipe_t pipe;
    } io;                     /* the client connection */
    list_node node;           /* in f->sessions */
    list_node dirty_node;     /* in f->dirty while it has output to write */
    session_extra *extra;     /* what only some clients need; NULL: none yet (see above) */
    outq out;                 /* replies to the client (no storage when empty) */
    list_node requests;       /* every unanswered or unflushed request, in order */
    list_node *cursor;        /* first request dispatch has not handled yet */
    size_t nrequests;         /* entries in requests */
    size_t pending_bytes;     /* request bytes not yet answered (backpressure) */
    size_t req_mem;           /* bytes charged for its requests and stored replies, as allocated */
    size_t buf_mem;           /* bytes allocated for its input and output buffers (last counted) */
    struct link *dlink;       /* dedicated link lent to this session (upstream_lend) */
    struct link *flight_link; /* the one link its in-flight requests are on */
    size_t inflight;          /* requests sent and not answered */
    sub_sets *subs;           /* what it subscribed to; NULL until its first SUBSCRIBE */
    struct ident *ident;      /* client.auth redis: the Redis user it runs as (acl.c), on
                                 the master view that checked its AUTH */
    uint64_t last_active_ms;  /* last read from the client, or last found busy (idle clock) */
    uint64_t opened_ms;       /* uv_now() when it connected (CLIENT LIST age=) */
    const command *last_cmd;  /* the last command parsed from it (CLIENT LIST cmd=) */
    list_node idle_node;      /* in f->idle, ordered by last_active_ms */
    uint64_t next_seq;        /* sequence for the next request */
    tx_state tx;              /* see tx_state */
    tunnel_state tunnel;      /* see tunnel_state */
    int db;                   /* database selected (non-zero pins a link) */
    /* Flags and small counts, a byte each (10 000 idle clients keep them all). */
    uint8_t tx_deferred; /* cluster mode: its MULTI, answered by ferry, is sent with
                            the first command on the link of that command's shard */
    uint8_t sticky;      /* CLIENT SETNAME/TRACKING...: pinned for life */
    uint8_t authed;      /* AUTH accepted (or no password configured) */
    uint8_t checking;    /* its AUTH is being checked by Redis: nothing after it goes out */
    uint8_t reading;     /* uv_read_start active */
    uint8_t fresh;       /* accepted on a plain listener, nothing read yet: its first
                            bytes are checked for a TLS ClientHello */
    uint8_t proto;       /* RESP version the client speaks: 2, or 3 after HELLO 3 */
    uint8_t tracking;    /* CLIENT TRACKING is on (router.c): flushed when its link is lost */
    uint8_t guard_alone; /* a push to an on_full: block queue is in flight: nothing else
                            is sent until it is answered (guards.c) */
} session;

/* s's client address as text ("10.0.0.1:5000", "::1:5000", "unix"), for logs and
 * CLIENT LIST. The text lives in one of a few buffers of the calling
 * thread, reused in turn: good for the arguments of one call. */
static inline const char *session_peer(const session *s)
{
    static _Thread_local char ring[4][56];
    static _Thread_local unsigned next;
    char *out = ring[next++ % 4];
    char host[48] = "?";
    const session_addr *a = &s->peer;
    if (a->kind == SESSION_ADDR_UNIX) {
        return "unix";
    }
    if (a->kind == SESSION_ADDR_IP4 || a->kind == SESSION_ADDR_IP6) {
        uv_inet_ntop(a->kind == SESSION_ADDR_IP4 ? AF_INET : AF_INET6, a->ip, host, sizeof(host));
    }
    snprintf(out, sizeof(ring[0]), "%s:%d", host, a->port);
    return out;
}

/* s's extra state for reading: an all-zero one when it has none (its
 * lists then read as unlinked through list_linked; list_empty is no test). */
static inline const session_extra *session_extra_r(const session *s)
{
    static const session_extra none;
    return s->extra != NULL ? s->extra : &none;
}

/* s's extra state for writing, allocated (and charged) on first need. */
static inline session_extra *session_extra_w(session *s)
{
    if (s->extra == NULL) {
        session_extra *x = xcalloc(1, sizeof(*x));
        x->s = s;
        list_init(&x->watches);
        list_init(&x->watch_node);
        list_init(&x->soft_node);
        list_init(&x->mem_node);
        list_init(&x->tls_node);
        list_init(&x->partial_node);
        list_init(&x->wait_node);
        list_init(&x->held);
        s->extra = x;
        s->f->clients_mem += sizeof(*x);
    }
    return s->extra;
}

/* What the router and its helpers (router.c, tx.c, acl.c, clients.c,
 * backlog.c, standin.c) ask of the session above them: they call no
 * function of session.c by name. core fills this table once per context
 * (f->session_ops) with the session_* functions of the same names. */
typedef struct session_ops {
    void (*answer)(session *s, request *r, const char *p, size_t n);
    void (*answer_str)(session *s, request *r, const char *text);
    void (*flush_answered)(session *s);
    void (*check_reading)(session *s);
    void (*on_push)(session *s, const char *p, size_t n);
    void (*unlink)(session *s, request *r);
    void (*set_state)(session *s, session_state st);
    void (*close)(session *s, const char *reason);
} session_ops;

#define OUT_LIMIT_HARD 1 /* s->limit_hit: queued output reached the hard limit */
#define OUT_LIMIT_SOFT 2 /* ... stayed above the soft limit for soft_seconds */

/* Accept a client from a listening stream (how: FERRY_ACCEPT_* flags; with
 * FERRY_ACCEPT_TLS the session speaks TLS). Returns 0 or a negative uv error. */
int session_accept(ferry *f, uv_stream_t *server, int how);
/* Serve fd, a client socket just accepted by another loop (workers.c).
 * Returns 0 (fd is the session's) or a negative uv error (fd stays the
 * caller's). */
int session_accept_fd(ferry *f, uv_os_sock_t fd, int how);

/* A client connection handed over by another ferry process (takeover.c),
 * with the state its session had there. */
typedef struct session_import {
    int is_unix;          /* unix socket, else TCP */
    int db;               /* database selected */
    int authed;           /* AUTH accepted */
    const char *user;     /* client.auth redis: the Redis user it runs as, */
    size_t nuser;         /* NULL when none; borrowed */
    const char *pass;     /* the password Redis last accepted for user there, */
    size_t npass;         /* to open the user's links with; borrowed */
    int pubsub;           /* subscribed: re-subscribe to subs */
    int proto;            /* RESP version it speaks: 2, or 3 (HELLO 3) */
    int sticky;           /* pinned for life (CLIENT SETNAME/TRACKING...) */
    int tracking;         /* CLIENT TRACKING on: its cache is flushed first */
    const char *settings; /* connection settings Redis accepted (sticky_log), */
    size_t nsettings;     /* replayed on its next link; borrowed */
    const char *input;    /* bytes to parse first (the blocked call to re-issue, then */
    size_t ninput;        /* the unparsed input, a partial request included); borrowed */
    sub_sets *subs;       /* its subscriptions, or NULL; moved into the session (NULLed) */
    uint64_t idle_ms;     /* time since it was last active (client.idle_timeout_ms) */
    uint64_t partial_ms;  /* age of the incomplete request in input (request_timeout_ms) */
} session_import;

/* Open a session on fd, a connected client socket, restoring im's state.
 * Returns 0 (fd is the session's) or a negative uv error (fd stays the
 * caller's). */
int session_adopt(ferry *f, uv_os_sock_t fd, session_import *im);
/* Read nothing more from s until session_check_reading resumes it. */
void session_stop_reading(session *s);
/* The one close path: logs reason, detaches in-flight requests, frees later. */
void session_close(session *s, const char *reason);
/* The one setter of s->state (asserts the move is legal). */
void session_set_state(session *s, session_state st);

/* Mark r answered with these bytes (copied); written once all before it are. */
void session_answer(session *s, request *r, const char *p, size_t n);
void session_answer_str(session *s, request *r, const char *text);
/* Move every answered request at the head of the queue to the output. */
void session_flush_answered(session *s);
/* Bytes from a pass-through tunnel, kept in order with ferry's own replies. */
void session_on_stream(session *s, const char *p, size_t n);
/* A RESP3 push frame for s (out of band): written after every reply Redis
 * sent before it, ahead of the requests it has not answered yet. */
void session_on_push(session *s, const char *p, size_t n);
/* The null reply in s's protocol: "_" in RESP3, resp2 (a "$-1" or "*-1"
 * line) in RESP2. */
static inline const char *session_null(const session *s, const char *resp2)
{
    return s->proto == 3 ? "_\r\n" : resp2;
}
/* Stop reading a client whose work piles up; resume when it drains. */
void session_check_reading(session *s);
/* Remove r from the queue, keeping the dispatch cursor valid. */
void session_unlink(session *s, request *r);

/* Write queued output of every session marked dirty. */
void session_flush_all(ferry *f);
/* Bytes this client holds, as allocated (session, requests, buffers). */
static inline size_t session_mem(const session *s)
{
    return sizeof(*s) + (s->extra != NULL ? sizeof(*s->extra) : 0) + s->req_mem + s->buf_mem;
}
/* Ferry holds more than limits.max_memory for its clients. */
int session_over_memory(const ferry *f);
/* Periodic: idle clients, soft output limits. */
void session_tick(ferry *f, uint64_t now);
/* Graceful stop: stop reading; close sessions with nothing in flight. */
void session_stop_all(ferry *f, int force);

/* r, part of s's transaction (MULTI, a queued command, EXEC), is decided by
 * the transaction's receipt (receipts.c), not by offsets: not ambiguous. */
#define SESSION_TX_RECEIPTED(s, r)                                                                 \
    ((s) != NULL && session_extra_r(s)->tx_receipted &&                                            \
     (((r)->flags & REQ_F_TXLOG) || (r)->route == RT_MULTI || (r)->route == RT_EXEC))

#endif
