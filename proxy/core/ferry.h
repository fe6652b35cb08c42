/* ferry.h - the one context struct every module hangs off, the request
 * object that travels from a client session to an upstream link and back,
 * error codes, and the allocation policy (abort on OOM).
 *
 *   client --> session: parse (resp), classify (command), queue in order
 *                 |  held requests (no link yet / link switch pending)
 *                 v
 *              dispatch --> shared link (pipelined, all sessions)
 *                       \-> dedicated link (blocking, MULTI, SELECT n, pub/sub)
 *   upstream reply scanner --> request answered --> session flushes replies
 *                                                   strictly in request order
 */
#ifndef FERRY_FERRY_H
#define FERRY_FERRY_H

#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "buf.h"
#include "command.h"
#include "config.h"
#include "list.h"
#include "resp.h"
#include "stats.h"

/* ferry's own error codes, below libuv's range (UV_EOF is -4095). */
enum ferry_err {
    FERRY_EPROTO = -5000,    /* protocol error from a peer */
    FERRY_ECONFIG = -5001,   /* bad configuration */
    FERRY_ETIMEDOUT = -5002, /* a named timeout expired */
    FERRY_EAUTH = -5003      /* Redis refused ferry's credentials */
};
const char *ferry_strerror(int err);

/* An invariant that holds in every build (release included): logs the
 * broken condition and aborts. */
#define ferry_assert(cond) ((cond) ? (void)0 : ferry_assert_fail(#cond, __FILE__, __LINE__))
void ferry_assert_fail(const char *what, const char *file, int line) __attribute__((noreturn));

/* Allocation: log and abort on OOM, so callers never check for NULL. */
void *xmalloc(size_t n);
void *xcalloc(size_t n, size_t size);
void *xrealloc(void *p, size_t n);
char *xstrdup(const char *s);
/* The n bytes at p as a NUL-terminated copy (bytes may include NULs). */
char *xstrndup(const char *p, size_t n);

struct session;
struct link;
struct request;
struct upstream;
struct sentinel_client;
struct stats_server;

/* Where a request is in its life. */
typedef enum req_state {
    REQ_HELD = 0, /* queued in its session, not sent yet (or again, after a lost link) */
    REQ_SENT,     /* written (or queued for writing) on a link, awaiting a reply */
    REQ_WAITING,  /* reply in r->reply, held until a WAIT says replicas have it */
    REQ_ANSWERED  /* reply known, waiting for earlier requests to be flushed */
} req_state;

/* How a listener's client arrived (server -> core -> workers -> session). */
enum {
    FERRY_ACCEPT_UNIX = 1,       /* a unix socket (else TCP) */
    FERRY_ACCEPT_TLS = 2,        /* on a listen_tls address: the session speaks TLS */
    FERRY_ACCEPT_INDEX_SHIFT = 8 /* with TLS: how >> this = its listen_tls entry */
};

#define REQ_F_INTERNAL (1u << 0) /* ferry's own (AUTH, PING, SELECT): no session */
#define REQ_F_QUIT (1u << 1)     /* close the client after this reply */
#define REQ_F_BLOCKING (1u << 2) /* may block on the server */
#define REQ_F_WRITE (1u << 3)    /* may modify data */
#define REQ_F_REARM (1u << 4)    /* blocking call to re-send with the time it has left */
#define REQ_F_ACK (1u << 5)      /* its reply waits for durability.replicas_ack (set when sent) */
#define REQ_F_TXLOG (1u << 6)    /* part of an open transaction: kept to rebuild it */
#define REQ_F_REFUSED (1u << 7)  /* refused by Redis without effect: held since then */
#define REQ_F_UNBLOCK                                                                              \
    (1u << 8)                  /* CLIENT UNBLOCK ... ERROR sent for this blocked call:             \
                                  its -UNBLOCKED is its reply (clients.c) */
#define REQ_F_SURE (1u << 9)   /* internal: done is called (reply NULL) if its link is lost */
#define REQ_F_GUARD (1u << 10) /* sent as the queue guard's script (guards.c); arg: its queue */
#define REQ_F_GUARD_EVAL (1u << 11) /* Redis lacked the script: sent as EVAL from now on */
#define REQ_F_VERDICT                                                                              \
    (1u << 12) /* a write (a pop, an EXEC) answered by a master lost before a replica              \
                  confirmed it: its reply kept in r->reply until the next master says              \
                  whether it has it (fence.c) */
#define REQ_F_LEASE_ACK (1u << 13)  /* an LREM sent as the leases' ack script (lease.c) */
#define REQ_F_LEASE_EVAL (1u << 14) /* Redis lacked the ack script: sent as EVAL from now on */
#define REQ_F_SCRIPT_AGAIN                                                                         \
    (1u << 15) /* an EVALSHA answered NOSCRIPT, sent again with its script loaded ahead            \
                  (scripts.c): once only */
#define REQ_F_RCPT (1u << 16)      /* a pop or push sent with its receipt (receipts.c): r->rcpt */
#define REQ_F_RCPT_EVAL (1u << 17) /* Redis lacked the receipt script: sent as EVAL from now on */
#define REQ_F_RCPT_PROBE                                                                           \
    (1u << 18) /* a pop sent again: as the receipt script, which answers the receipt's item if     \
                  the first move applied (a blocking one's move follows if it found nothing) */
#define REQ_F_XSENT                                                                                \
    (1u << 19) /* an XREADGROUP with a '>' id went out: sent again, it looks first (xreads.c) */
#define REQ_F_XLOOK                                                                                \
    (1u << 20) /* sent as its look: the consumer's pending entries after those it was handed */

#define REQ_F_RCPT_SCRIPT                                                                          \
    (1u << 21) /* a client's script in its receipt wrapper: its data released as a script's (no    \
                  undo: fence.c), its errors given the client's script's SHA1 back */
#define REQ_F_RCPT_NONE                                                                            \
    (1u << 22) /* no receipt from now on (Redis could not compile its script's wrapper) */

typedef void (*req_done_cb)(struct link *l, struct request *r, const char *reply, size_t len);
/* What became of a reply someone must know the fate of: written 1 once its
 * last byte was written to the client's socket, 0 if it never will be. */
typedef void (*req_sent_cb)(void *arg, int written);

typedef struct request {
    list_node sq;         /* in session->requests, in arrival order */
    list_node lq;         /* in link->pending while sent */
    list_node hq;         /* in its session's held list while held for lack of a master */
    struct session *s;    /* owner; NULL once the client is gone (reply discarded) */
    struct link *link;    /* link it was sent on, while SENT */
    req_state state;      /* see req_state */
    unsigned flags;       /* REQ_F_* */
    const command *cmd;   /* table entry, NULL for unknown commands */
    buf data;             /* the request as multibulk bytes (kept for retries) */
    buf reply;            /* reply bytes when answered out of order */
    uint64_t born;        /* uv_now() when parsed */
    uint64_t born_ns;     /* uv_hrtime() when parsed (latency stats) */
    uint64_t sent_ns;     /* uv_hrtime() when last sent to a link, 0 = never */
    long long br_lo;      /* the master's replication offset before it, -1 unknown (fence.c) */
    long long br_hi;      /* ... and after it (a ROLE behind its batch), -1 unknown */
    uint64_t br_epoch;    /* the master epoch of its bracket (REQ_F_VERDICT) */
    uint64_t rcpt;        /* its receipt's number, 0 none (receipts.c) */
    int rcpt_slot1;       /* cluster mode: 1 + the slot of an EXEC's receipt, 0 none */
    int db1;              /* 1 + the db its session was in when it was first sent; 0 not yet:
                             sent again, it goes to that db, whatever a SELECT behind it did */
    int retries;          /* times re-sent after a lost link */
    int refusals;         /* times Redis refused it without effect (REQ_F_REFUSED) */
    uint64_t retry_at;    /* refused: uv_now() before which it is not sent again */
    const char *refusal;  /* refused: the last refusal's name (READONLY...), static */
    uint64_t seq;         /* position in its session (orders requeues) */
    uint64_t held_since;  /* uv_now() when it last became HELD */
    uint64_t deadline;    /* blocking call: uv_now() when its own timeout ends, 0 = none */
    uint64_t due;         /* held: uv_now() of its next hold deadline (backlog.c) */
    size_t hpos;          /* held: 1-based position in f->held_heap, 0 = not in it */
    size_t held_charge;   /* held: bytes it counts in held_bytes */
    int route;            /* how the session routes it (session.c) */
    int slot;             /* cluster mode: the slot of its keys, -1 none (router_classify.c) */
    struct upstream *ask; /* cluster mode: a node answered ASK: the view it named, where r
                             goes next, after ASKING (router.c); NULL none */
    struct broadcast *bc; /* cluster mode: a command every master runs (SCRIPT LOAD...):
                             the masters that replied, their folded reply; NULL none */
    struct split *sp;     /* cluster mode: MGET, MSET, DEL... whose keys span slots, sent
                             one part per slot, the replies merged (split.c); NULL none */
    long long arg;        /* route argument (db for SELECT, auth result) */
    size_t charge;        /* bytes charged to its session's memory (session.c) */
    req_done_cb done;     /* internal requests: called with the reply */
    req_sent_cb written;  /* called once with the fate of its reply (a pop served from
                                the fallback store); NULL: nobody asks */
    void *written_arg;    /* for written */
} request;

typedef struct ferry {
    uv_loop_t *loop;                      /* this context's event loop */
    config *cfg;                          /* loaded configuration (owned by main) */
    struct tls_roles *tls;                /* TLS contexts, shared by every loop (owned by
                                             main; a role's field is NULL where it is off) */
    resp_limits limits;                   /* request parser limits from cfg */
    const command *deny[CONFIG_MAX_DENY]; /* resolved deny list */
    int ndeny;
    void *servers;                    /* listeners (server.c) */
    struct upstream *up;              /* the master and its links */
    struct sentinel_client *sentinel; /* Sentinel client, NULL with a fixed master */
    struct clustermap *cluster;       /* cluster mode (clustermap.c): the slot map's source
                                         and one master view per shard; NULL otherwise */
    struct outage *outage;            /* the fallback store's service, NULL if none */
    int wake_pending;                 /* dispatch waiting sessions at the next flush */
    list_node sessions;               /* every open session */
    list_node waiting;                /* sessions with held requests and no link */
    struct request **held_heap;       /* held requests, a min-heap by due (backlog.c) */
    size_t nheld;                     /* entries in held_heap */
    size_t held_cap;                  /* entries allocated in held_heap */
    list_node dirty;                  /* sessions with output to flush this turn */
    list_node dirty_links;            /* links with output to flush this turn */
    list_node free_reqs;              /* recycled request objects */
    size_t nfree_reqs;
    char *rbuf;            /* loop-wide read buffer: a session with nothing partial
                              kept reads here and copies only an incomplete request */
    resp_parser *parser;   /* parser of sessions with no partial request of their own */
    const char **av;       /* scratch for command lookups: argument pointers */
    size_t *al;            /* scratch: argument lengths */
    size_t acap;           /* entries allocated in av/al */
    uint64_t nclients;     /* sessions open */
    size_t held_bytes;     /* request bytes held for lack of a master */
    size_t clients_mem;    /* bytes held for clients, as allocated: sessions, their
                              requests, replies and buffers (limits.max_memory) */
    list_node over_soft;   /* sessions whose output is above their soft limit */
    list_node mem_paused;  /* sessions not read because ferry is over limits.max_memory */
    list_node partial;     /* sessions with an incomplete request, oldest first */
    list_node handshaking; /* TLS sessions whose handshake runs, oldest first */
    list_node idle;        /* sessions by last_active_ms, oldest first (idle_timeout_ms) */
    list_node watching;    /* sessions with replies whose writing someone waits for */
    uint64_t next_id;      /* ids for sessions and links: the last one given */
    uint64_t rcpt_next;    /* pop receipts: the last number given (receipts.c) */
    char rcpt_token[240];  /* pop receipts: this loop's part of their keys, "" not yet made */
    uint64_t id_step;      /* how far apart this loop's ids are: one per loop, so
                              ids are unique across loops (loop i gives i + k*n) */
    uint64_t started_ms;   /* uv_now() at start */
    uv_prepare_t flush;    /* writes everything queued in one turn */
    uv_timer_t tick;       /* timeouts, health pings, reconnects */
    uv_signal_t sig_term, sig_int, sig_hup;
    int stopping;           /* graceful shutdown in progress */
    uint64_t stop_deadline; /* uv_now() after which shutdown is forced */
    int exit_code;
    struct takeover *takeover;      /* takeover.c: socket, handover in progress */
    int handing_over;               /* sessions are being handed to a new process */
    int keep_paths;                 /* listeners handed over: leave their unix paths */
    int closed;                     /* every handle has been closed */
    struct workers *workers;        /* workers.c: every event loop, NULL with workers: 1 */
    int worker_index;               /* 0: the main loop; 1..: a worker's */
    size_t others_mem;              /* bytes the other loops held for clients at their
                                       last tick (limits.max_memory) */
    ferry_stats stats;              /* counters, declared in stats.h */
    struct stats_server *stats_srv; /* the stats port (stats.c), NULL if off */
    struct receipts *receipts;      /* receipts.c: receipts to put back, NULL none */
    struct instance *instance;      /* instance.c: the process's identity and heartbeat (the
                                       main loop's; a worker's points at it) */
    struct cl_part *unblock_later;  /* clients.c: CLIENT UNBLOCKs put off to the next tick */
    struct leases *leases;          /* leases (lease.c): the paused consumers on every loop,
                                       the expiry on the main loop; NULL if no queues:
                                       entry has processing */
    struct scripts *scripts;        /* scripts.c: the scripts clients loaded, one memory
                                       for every loop (created by the main loop's) */
    struct queues *queues;          /* queue depths sampler (queues.c), main loop, NULL if
                                       no queues: are configured */
    /* Upward calls of the lower modules, set by core at start-up: they call
     * nothing above them by name (see docs/architecture.md, "How a request travels"). */
    void (*unhold)(request *r); /* request_set_state: r leaves the hold (backlog) */
    /* backlog: a session whose held requests may go on goes back to the
     * router (router_dispatch). */
    void (*redispatch)(struct session *s);
    const struct link_ops *link_ops; /* what a link reports to its owners (link.h) */
    /* server: a listener accepted st (session or workers); a listener bound
     * by the ferry this one takes over, as a descriptor, or -1 (takeover). */
    int (*accept)(struct ferry *f, uv_stream_t *st, int is_unix);
    int (*claim_listener)(struct ferry *f, const config_addr *a);
    void (*stop)(struct ferry *f, const char *why); /* begin a graceful stop (core_stop) */
    const struct workers_ops *workers_ops;          /* what workers asks of the rest (workers.h) */
    const struct outage_ops *outage_ops;   /* what the outage reports to the router (outage.h) */
    const struct shard_ops *shard_ops;     /* what upstream and fence report upward (shard.h) */
    const struct session_ops *session_ops; /* what the router asks of the session (session.h) */
} ferry;

#define FERRY_READ_BUF (64 * 1024) /* bytes of f->rbuf */

/* A new id for a session, link or stats connection, unique in the process. */
static inline uint64_t ferry_next_id(ferry *f)
{
    f->next_id += f->id_step;
    return f->next_id;
}

/* Request objects (recycled through f->free_reqs). */
request *request_new(ferry *f);
/* The one setter of r->state; asserts the transition is legal:
 * HELD->SENT|ANSWERED, SENT->WAITING|ANSWERED|HELD, WAITING->ANSWERED|HELD.
 * A request that leaves HELD leaves the backlog (backlog.c) too, through
 * f->unhold. */
void request_set_state(request *r, req_state st);
/* Deadline of a blocking call from its timeout argument (uv_now() based),
 * 0 when it blocks forever or is not a blocking call. */
uint64_t request_block_deadline(const request *r, uint64_t now);
void request_free(ferry *f, request *r);
/* The reply a blocking call r gets when its timeout ends, in RESP2: a
 * null array, or a null bulk for BLMOVE and BRPOPLPUSH. */
const char *request_expired_reply(const request *r);
/* Rewrite a blocking request that is sent again so it waits only for what
 * is left of its timeout. Returns 0, or 1 with *expired set to the reply
 * its timeout produces (the time is up). */
int request_rearm_blocking(request *r, uint64_t now, const char **expired);
/* A reply that carries data taken out of Redis (a pop, a move, GETDEL, a
 * script's return value), as opposed to a mere acknowledgement (+OK, an
 * integer). EXEC's array acknowledges the writes it ran. */
int request_reply_is_data(const request *r, const char *p, size_t n);
/* r's reply (r->reply) carries data r took out of Redis: a data reply of a
 * command_takes_out command (a pop's item, not XADD's id). */
int request_reply_taken(const request *r);
/* r awaits the next master's verdict (REQ_F_VERDICT) with data it took out
 * of the lost master kept in r->reply: that data is delivered, never
 * replaced by an error or a timeout, unless the verdict proves the pop was
 * not applied (then it is sent again). Only a command that takes data
 * out (command_takes_out) has such data: another write's data reply (XADD's
 * id, a script's return value, which may be an add's new id) waits for its
 * verdict as any write does (bracket_delivers). */
int request_verdict_data(const request *r);

/* The parts of a push's multibulk bytes: its key and the values after it. */
typedef struct push_view {
    const char *key;  /* the key's bytes */
    size_t klen;      /* its length */
    const char *tail; /* the encoded values (each a $bulk), to the end */
    size_t tlen;      /* their length */
    size_t nvalues;   /* how many */
} push_view;
/* r is a push (LPUSH, RPUSH, LPUSHX, RPUSHX) with a key and values: 0,
 * its parts in *v; else -1 (Redis answers the arity error of one without). */
int request_push_view(const request *r, push_view *v);

#endif
