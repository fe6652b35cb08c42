/* upstream.h - links to the Redis master: a few shared, pipelined links that
 * carry every session's stateless commands, and dedicated links lent to one
 * session while it holds connection state (blocking call, MULTI, SELECT n,
 * pub/sub), pooled when that state ends. */
#ifndef FERRY_UPSTREAM_H
#define FERRY_UPSTREAM_H

#include <netinet/in.h>
#include <sys/socket.h>

#include "ferry.h"

typedef enum link_state {
    LINK_CONNECTING = 0, /* connect in progress; writes are queued */
    LINK_READY,          /* connected */
    LINK_CLOSING         /* closed, waiting for libuv's close callback */
} link_state;

typedef enum link_kind {
    LINK_SHARED = 0, /* pipelined for all sessions */
    LINK_DEDICATED   /* lent to one session (owner), or idle in the pool */
} link_kind;

typedef struct link {
    ferry *f;                  /* context */
    struct upstream *up;       /* owner */
    uint64_t id;               /* for logs */
    link_kind kind;            /* shared or dedicated */
    link_state state;          /* see link_state */
    union {
        uv_handle_t h;
        uv_stream_t s;
        uv_tcp_t tcp;
        uv_pipe_t pipe;
    } io;                      /* the connection */
    uv_connect_t creq;         /* connect request */
    outq out;                  /* bytes to Redis */
    buf in;                    /* bytes from Redis not yet framed */
    resp_scanner sc;           /* frames replies in 'in' */
    list_node pending;         /* requests awaiting a reply, in send order */
    size_t npending;           /* entries in pending */
    struct session *owner;     /* dedicated: the session it is lent to */
    int passthrough;           /* replies beyond pending go to owner as a stream */
    int db;                    /* database selected on this connection */
    int slot;                  /* shared: index in up->shared, else -1 */
    list_node node;            /* in up->links */
    list_node pool_node;       /* in up->pool while idle */
    list_node dirty_node;      /* in f->dirty_links while it has output */
    uint64_t opened_ms;        /* uv_now() at creation */
    uint64_t last_io_ms;       /* last read or write */
    int ping_pending;          /* a health PING is in flight */
    int closing_cb_pending;    /* uv_close called */
} link;

typedef enum upstream_state {
    UP_DOWN = 0, /* no shared link is connected */
    UP_UP        /* the master answers */
} upstream_state;

typedef struct upstream {
    ferry *f;                            /* context */
    struct sockaddr_storage addr;        /* master address (TCP) */
    char path[108];                      /* master address (unix socket) */
    int is_unix;
    char name[300];                      /* for logs and stats */
    upstream_state state;                /* see upstream_state */
    link *shared[64];                    /* shared links by slot */
    int nshared;
    list_node links;                     /* every link */
    list_node pool;                      /* idle dedicated links */
    int npool;
    uint64_t down_since_ms;              /* when it last went DOWN */
    uint64_t up_since_ms;                /* when it last came UP */
    uint64_t next_connect_ms;            /* reconnect backoff */
    uint64_t backoff_ms;
    uint64_t epoch;                      /* bumped on each new master */
    int nlinks;
} upstream;

/* Create the upstream for the configured master and start connecting.
 * Returns NULL and logs if the address cannot be resolved. */
upstream *upstream_new(ferry *f);
/* Close every link (their pending requests are requeued or dropped). */
void upstream_close(upstream *up);
void upstream_free(upstream *up);

/* A connected shared link for a session (hint spreads sessions), or NULL. */
link *upstream_shared(upstream *up, uint64_t hint);
/* Lend a dedicated link to s (from the pool or new), selecting s's db.
 * NULL when the master is down. */
link *upstream_acquire(upstream *up, struct session *s);
/* Take a dedicated link back: pooled if clean and idle, closed otherwise. */
void upstream_release(upstream *up, link *l);

/* Queue r on l (state becomes SENT, added to pending). */
void link_send(link *l, request *r);
/* Queue r's bytes without expecting a reply of its own (pass-through). */
void link_send_raw(link *l, const char *p, size_t n);
/* Write queued output now (called once per loop turn). */
void link_flush(link *l);
/* The one close path: requeue or fail pending requests, log reason. */
void link_close(link *l, const char *reason);

/* Periodic: reconnects, connect timeouts, health pings. */
void upstream_tick(upstream *up, uint64_t now);

#endif
