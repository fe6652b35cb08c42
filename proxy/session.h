/* session.h - one client connection: parses its requests, routes each to a
 * link (or answers it itself), and writes replies back strictly in request
 * order whatever link served them. */
#ifndef FERRY_SESSION_H
#define FERRY_SESSION_H

#include "ferry.h"
#include "subs.h"

struct link;

typedef struct session {
    ferry *f;      /* context */
    uint64_t id;   /* for logs and CLIENT-like output */
    char peer[64]; /* client address, for logs */
    union {
        uv_handle_t h;
        uv_stream_t s;
        uv_tcp_t tcp;
        uv_pipe_t pipe;
    } io;                     /* the client connection */
    list_node node;           /* in f->sessions */
    list_node wait_node;      /* in f->waiting while held requests lack a link */
    list_node dirty_node;     /* in f->dirty while it has output to write */
    resp_parser *parser;      /* request parser (sticky errors) */
    buf in;                   /* bytes read, not yet parsed */
    outq out;                 /* replies to the client */
    list_node requests;       /* every unanswered or unflushed request, in order */
    list_node *cursor;        /* first request dispatch has not handled yet */
    size_t nrequests;         /* entries in requests */
    size_t pending_bytes;     /* request bytes not yet answered (backpressure) */
    size_t held_bytes;        /* request bytes held without a link */
    struct link *dlink;       /* dedicated link lent to this session, or NULL */
    struct link *flight_link; /* the one link its in-flight requests are on */
    size_t inflight;          /* requests sent and not answered */
    int db;                   /* database selected (non-zero pins a link) */
    int in_multi;             /* MULTI sent, EXEC/DISCARD not yet */
    int watching;             /* WATCH sent, not yet cleared */
    int tx_aborted;           /* link lost mid-transaction: refuse until EXEC */
    int sticky;               /* CLIENT SETNAME/TRACKING...: pinned for life */
    int passthrough;          /* pub/sub or MONITOR: a raw tunnel from now on */
    int tunnel_other;         /* the tunnel is MONITOR or CLIENT REPLY (not rebuilt) */
    int resub;                /* tunnel lost: re-subscribe once a master is UP */
    sub_set channels;         /* SUBSCRIBE */
    sub_set patterns;         /* PSUBSCRIBE */
    sub_set shards;           /* SSUBSCRIBE */
    int authed;               /* AUTH accepted (or no password configured) */
    int reading;              /* uv_read_start active */
    int quitting;             /* close once the output is written */
    int quit_seen;            /* QUIT parsed: read nothing more */
    int closing;              /* session_close called */
    uint64_t last_active_ms;  /* last read from the client */
    uint64_t next_seq;        /* sequence for the next request */
    const char **av;          /* scratch: argument pointers for lookups */
    size_t *al;               /* scratch: argument lengths */
    size_t acap;              /* entries allocated in av/al */
} session;

/* Accept a client from a listening stream. Returns 0 or a negative uv error. */
int session_accept(ferry *f, uv_stream_t *server, int is_unix);
/* The one close path: logs reason, detaches in-flight requests, frees later. */
void session_close(session *s, const char *reason);

/* Called by links. */
void session_on_reply(session *s, request *r, const char *p, size_t n);
void session_on_stream(session *s, const char *p, size_t n);
/* A link lost r (sent, no reply): retry it or answer it with an error. */
void session_on_lost(session *s, request *r, const char *reason);
/* The session's dedicated link is gone. */
void session_on_link_closed(session *s, struct link *l, const char *reason);

/* Dispatch held requests of every waiting session (a link became ready). */
void session_wake_all(ferry *f);
/* Write queued output of every session marked dirty. */
void session_flush_all(ferry *f);
/* Periodic: hold timeouts, idle clients. */
void session_tick(ferry *f, uint64_t now);
/* Graceful stop: stop reading; close sessions with nothing in flight. */
void session_stop_all(ferry *f, int force);

#endif
