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
    ferry *f;            /* context */
    struct upstream *up; /* owner */
    uint64_t id;         /* for logs */
    link_kind kind;      /* shared or dedicated */
    link_state state;    /* see link_state */
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
    int verified;              /* shared: ROLE said master and durability was asserted */
    uint64_t epoch;            /* master epoch the link belongs to */
    int fencing;               /* master switch: replies held until WAIT confirms them */
    uint64_t fence_started_ms; /* when fencing began */
    list_node held;            /* answered requests whose replies wait for a WAIT */
    int need_wait;             /* writes sent since the last WAIT (replicas_ack) */
    uint64_t held_since_ms;    /* when the oldest held reply arrived */
    int draining;              /* old master: a blocked call may still be served */
    uint64_t drain_until_ms;   /* then it is closed and the call re-issued */
    int swallow;               /* re-subscribe confirmations to drop (tunnel rebuilt) */
} link;

/* The master view (DESIGN.md "The master view and failover"). */
typedef enum upstream_state {
    UP_DOWN = 0,  /* no master known or reachable: requests are held */
    UP_SWITCHING, /* the old master is being let go: requests are held */
    UP_UP         /* a verified master answers */
} upstream_state;

typedef struct upstream {
    ferry *f;                     /* context */
    struct sockaddr_storage addr; /* master address (TCP) */
    char path[108];               /* master address (unix socket) */
    int is_unix;
    char name[300];       /* for logs and stats */
    upstream_state state; /* see upstream_state */
    link *shared[64];     /* shared links by slot */
    int nshared;
    list_node links; /* every link */
    list_node pool;  /* idle dedicated links */
    int npool;
    uint64_t down_since_ms;   /* when it last went DOWN */
    uint64_t up_since_ms;     /* when it last came UP */
    uint64_t next_connect_ms; /* reconnect backoff */
    uint64_t backoff_ms;
    uint64_t epoch; /* bumped on each new master */
    int nlinks;
    int sentinel_mode;          /* the master comes from Sentinel */
    int target_set;             /* an address to connect to is known */
    int aof_ok;                 /* appendonly/appendfsync asserted on this master */
    uint64_t aof_since_ms;      /* when they were last asserted */
    char aof_error[256];        /* last enforcement error, "" if none */
    uint64_t next_enforce_ms;   /* next periodic enforcement */
    uint64_t next_role_ms;      /* next periodic ROLE check */
    uint64_t switches;          /* master switches started */
    uint64_t switch_started_ms; /* when the current switch began */
    uint64_t last_switch_ms;    /* duration of the last completed switch */
    uint64_t longest_switch_ms; /* longest completed switch */
    char last_reason[160];      /* why the last switch started */
    int replicas_ack;           /* replicas that must confirm a write (resolved) */
    int fence_valid;            /* no promotion seen since the switch began: a
                                   replica's WAIT ack on the old master still counts */
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

/* Periodic: reconnects, connect timeouts, health pings, fence timeouts,
 * durability enforcement and ROLE checks. */
void upstream_tick(upstream *up, uint64_t now);
/* Stop sending to the current master (a failover sign): held requests wait
 * for the next master; links in flight are fenced with WAIT or closed. */
void upstream_switch(upstream *up, const char *reason);
/* Sentinel named this master (ip is numeric). Connects and verifies it. */
void upstream_set_master(upstream *up, const char *ip, int port, const char *why);
/* "ip:port" of the current master target, "" when none. */
const char *upstream_name(const upstream *up);
const char *upstream_state_name(upstream_state st);

#endif
