/* upstream.h - the master view (UP / SWITCHING / DOWN, with one setter) and
 * the link pool: a few shared, pipelined links that carry every session's
 * stateless commands, dedicated links lent to one session while it holds
 * connection state (blocking call, MULTI, SELECT n, pub/sub) and pooled
 * afterwards, and a health probe that notices a frozen master under load.
 * Shared links and the pool are kept per identity: ferry's own credentials,
 * and (client.auth redis) each Redis ACL user a client authenticated as. */
#ifndef FERRY_UPSTREAM_H
#define FERRY_UPSTREAM_H

#include <netinet/in.h>
#include <sys/socket.h>

#include "ferry.h"
#include "link.h"

struct session;

/* Who a link is on Redis: ferry itself (redis.username/password), or a Redis
 * ACL user clients authenticated as (client.auth redis). Links never change
 * identity, so users share no connection with each other or with ferry. */
typedef struct ident {
    struct upstream *up;    /* the master view whose links these are */
    char *user;             /* Redis user name; NULL: ferry's own credentials */
    char *pass;             /* the user's password Redis last accepted (wiped when freed) */
    link *shared[2][64];    /* shared links by protocol (RESP2, RESP3) and slot */
    int want3;              /* a RESP3 client asked: keep the RESP3 set too */
    list_node pool[2];      /* idle dedicated links by protocol (RESP2, RESP3) */
    list_node node;         /* users: in up->idents */
    int refs;               /* users: sessions authenticated as it */
    int nlinks;             /* users: its links not yet freed */
    int rejected;           /* users: Redis refused pass on a new link */
    char error[200];        /* users: Redis' error then */
    uint64_t idle_since_ms; /* users: when refs last fell to 0 (or it was made) */
    uint64_t next_open_ms;  /* users: a link failed before it was READY: not reopened before */
} ident;

/* The master view (DESIGN.md "The master view and failover"). */
typedef enum upstream_state {
    UP_DOWN = 0,  /* no usable master for fallback.after_ms (or none yet): requests held */
    UP_SWITCHING, /* the old master is let go, the next one not verified yet: requests held */
    UP_UP         /* a verified master answers */
} upstream_state;

#define UPSTREAM_RECENT_SWITCHES 16 /* switches kept for the stats page */

/* One switch of the master view, for the timeline of recent failovers. */
typedef struct switch_record {
    uint64_t start_ms; /* uv_now() when the master was lost */
    uint64_t end_ms;   /* uv_now() when a master was UP again; 0 while in progress */
    int went_down;     /* it reached DOWN (fallback.after_ms without a master) */
    char reason[160];  /* why it started */
    char from[300];    /* the master that was lost */
    char to[300];      /* the master UP after it, "" while in progress */
} switch_record;

typedef struct upstream {
    ferry *f;                     /* context */
    struct sockaddr_storage addr; /* master address (TCP) */
    char path[108];               /* master address (unix socket) */
    int is_unix;
    const config_addr *host_name; /* a fixed master given by a name: resolved before
                                     every reconnect of the shared links; NULL if none */
    uv_getaddrinfo_t gai;         /* that resolution, while resolving */
    int resolving;                /* gai is in flight */
    int resolve_failing;          /* the last resolution failed (logged once) */
    char name[300];               /* for logs and stats */
    char tag[24];                 /* "worker N: " in a worker loop's logs, "" in the main one's */
    upstream_state state;         /* see upstream_state; changed only by upstream_set_state */
    ident self;                   /* ferry's own credentials: its shared links verify the master */
    list_node idents;             /* Redis ACL users clients authenticated as (client.auth redis) */
    int nshared;                  /* shared link slots per protocol and identity */
    list_node links;              /* every link */
    int npool;                    /* idle dedicated links pooled, every identity */
    int nreturning;               /* dedicated links given back, pooled once ferry's own
                                     requests on them answer (at most upstream.pool_idle) */
    uint64_t down_since_ms;       /* when it last went DOWN */
    uint64_t up_since_ms;         /* when it last came UP */
    uint64_t next_connect_ms;     /* reconnect backoff */
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
    switch_record recent[UPSTREAM_RECENT_SWITCHES]; /* ring of the last switches */
    uint64_t nrecent;                               /* switches recorded (ring index mod) */
    int replicas_ack;        /* replicas that must confirm a write (resolved) */
    int replicas_known;      /* replicas Sentinel lists, any state (workers_replicas_known);
                                0 unknown (fixed mode): redo.c counts those the master lists */
    uint64_t acks_asked_ms;  /* replicas last asked for an ACK (slow WAIT) */
    uv_timer_t nudge;        /* a late replicas_ack WAIT nudges the master (fence.c) */
    int nudge_state;         /* 0 no timer yet, 1 idle, 2 armed, -1 closed */
    int nudge_pending;       /* a nudge in flight on the probe link */
    int nudge_by_wait;       /* Redis refused SPUBLISH: nudge with WAIT */
    char nudge_channel[40];  /* cluster mode: the nudge's channel, of a slot this master
                                serves (clustermap.c); "" = __ferry:nudge */
    int nudge_slot;          /* that slot, when nudge_channel is set */
    int fence_valid;         /* no promotion seen since the switch began: a
                                replica's WAIT ack on the old master still counts */
    char replid[41];         /* the master's replication id (INFO replication), "" unknown */
    int repl_backlog;        /* it had a replication backlog then (its offset moves) */
    uint64_t replid_epoch;   /* the epoch replid was learned with a backlog in; 0 none */
    uint64_t replid_next_ms; /* when INFO replication may be asked again */
    int replid_pending;      /* INFO replication in flight on the probe link */
    char heir_replid2[41];   /* the current master's master_replid2 ("" none) ... */
    long long heir_second;   /* ... and second_repl_offset (-1 none) */
    uint64_t heir_epoch;     /* the epoch they were read in; 0 never */
    struct {
        uint64_t epoch;
        char replid[41];
        int backlog;
    } past[4]; /* the replication ids of the last masters, by epoch (fence.c) */
    struct bracket_unknown *unknown; /* requests of an older master whose outcome was
                                        unknown, awaiting the next master's verdict (fence.c) */
    size_t nunknown, unknown_cap;
    struct redo *redo;      /* acknowledged queue pushes not on every replica yet (redo.c) */
    uint64_t routed;        /* client requests sent to this master (router.c) */
    uint64_t moved, asked;  /* cluster mode: MOVED / ASK it answered, followed (clustermap.c) */
    link *probe;            /* health probe link, NULL while none */
    uint64_t next_probe_ms; /* next probe PING */
    uint64_t probe_ok_ms;   /* last probe answer (or UP time) */
} upstream;

/* Create the upstream for the configured master and start connecting (a
 * master given by a name is resolved first, without blocking). */
upstream *upstream_new(ferry *f);
/* Close every link (their pending requests are requeued or dropped) and
 * cancel a name resolution in flight. */
void upstream_close(upstream *up);
void upstream_free(upstream *up);

/* A connected shared link of identity id (NULL: ferry's own) speaking RESP
 * proto (hint spreads sessions), or NULL (a user's set, and the RESP3 set,
 * are opened at the first ask: the caller holds its request and is woken). */
link *upstream_shared(upstream *up, ident *id, uint64_t hint, int proto);
/* Lend a dedicated link to s (from the pool of s's identity or new, speaking
 * s's protocol, with s's db selected):
 * s->dlink and l->owner are set. NULL when no master is UP. Together with
 * upstream_return, the only place that ties a link to a session. */
link *upstream_lend(upstream *up, struct session *s);
/* s gives its dedicated link back: pooled if may_pool and it is clean and
 * idle, closed (with why) otherwise. */
void upstream_return(upstream *up, struct session *s, int may_pool, const char *why);
/* A dedicated link for ferry's own calls, lent to no session (cluster
 * mode's priority pop across slots): from the pool of ferry's identity or
 * new, speaking proto. NULL when no master is UP. */
link *upstream_borrow(upstream *up, int proto);
/* The same, of identity id (NULL: ferry's own; client.auth redis: a
 * client's user, whose pops then run as the user). */
link *upstream_borrow_as(upstream *up, ident *id, int proto);
/* A link from upstream_borrow is idle again: pooled when it is clean,
 * closed (with why) otherwise (a call still in flight on it). */
void upstream_put_back(link *l, const char *why);
/* A link given back with only ferry's own requests in flight (pool_give)
 * has them answered: pooled if still clean, else closed. */
void upstream_on_returned(link *l);
/* l no longer serves its owner (fenced or drained): untie them quietly. */
void upstream_disown(link *l);
/* l is closing: untie it from its owner, who is told (router_on_link_closed). */
void upstream_detach(link *l, const char *reason);

/* client.auth redis: the identity of Redis user 'user' (created with pass,
 * its links opened on demand, when it is not known yet). Never NULL. */
ident *upstream_ident(upstream *up, const char *user, size_t ulen, const char *pass, size_t plen);
/* The identity of anchor's user on view up: anchor on its own view (NULL:
 * ferry's own). Cluster mode has a master view per shard, each with its own
 * users and links: there it is that view's identity of the same user, made
 * when unknown, and given anchor's password (the one Redis last accepted
 * for a client of the user) when it differs. Never NULL for a user. */
ident *upstream_ident_on(upstream *up, ident *anchor);
/* A session authenticated as id (hold) or no longer (release; may be NULL). */
void upstream_ident_hold(ident *id);
void upstream_ident_release(upstream *up, ident *id);
/* Redis accepted pass for id on one of its links: links opened from now on
 * use it. */
void upstream_ident_set_pass(ident *id, const char *pass, size_t plen);
/* Redis refused the credentials of l's user when l was opened (why: its
 * words): its sessions are closed, as Redis closes a deleted user's. */
void upstream_ident_rejected(link *l, const char *why);

/* Events from links. */
void upstream_on_verified(upstream *up, link *l);      /* a shared link passed */
void upstream_on_not_master(link *l, const char *why); /* ROLE/READONLY/... */
void upstream_on_link_error(link *l, const char *why); /* read error, EOF, failed connect */
void upstream_on_link_closing(upstream *up, link *l);  /* leaves slot and pool */
void upstream_on_link_closed(upstream *up, link *l, int was_ready, const char *reason);

/* l is a link to the master ferry uses now, UP and settled: the one ferry
 * started with, or one UP for durability.replicas_ack_hold_ms since a switch
 * (its replicas have had time to attach). Its refusals are its own answers. */
int upstream_settled(const upstream *up, const link *l);

/* Periodic: reconnects, connect timeouts, health pings, fence timeouts,
 * durability enforcement and ROLE checks. */
void upstream_tick(upstream *up, uint64_t now);
/* Stop sending to the current master (a failover sign): held requests wait
 * for the next master; links in flight are fenced with WAIT or closed. */
void upstream_switch(upstream *up, const char *reason);
/* Connect at the next tick, back-off reset: another loop reached the master. */
void upstream_retry_now(upstream *up);
/* SWITCHING -> DOWN before fallback.after_ms (the hold buffer is full). */
void upstream_give_up(upstream *up, const char *why);
/* Sentinel named this master (ip is numeric). Connects and verifies it. */
void upstream_set_master(upstream *up, const char *ip, int port, const char *why);
/* The view is DOWN and has been for fallback.after_ms (at start-up too, so
 * a first master gets that long): ferry serves on its own meanwhile (the
 * fallback store; PING, ECHO and INFO). */
int upstream_down(const upstream *up);
/* "ip:port" of the current master target, "" when none. */
const char *upstream_name(const upstream *up);
/* The view's state as logs and the stats port write it (pure, so the
 * Sentinel client and stats name states without calling upstream.c). */
static inline const char *upstream_state_name(upstream_state st)
{
    switch (st) {
    case UP_UP:
        return "UP";
    case UP_SWITCHING:
        return "SWITCHING";
    default:
        return "DOWN";
    }
}

#endif
