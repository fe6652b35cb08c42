/* replicas.c - durability on the replicas Sentinel (or the cluster map)
 * lists. Each replica has
 * one connection (sconn.c) and goes through enforcement rounds:
 *
 *   AUTH (redis credentials)   on connect
 *   INFO persistence           was AOF off? then the rewrite that follows
 *                              is the initial one
 *   CONFIG SET appendonly yes appendfsync always no-appendfsync-on-rewrite no
 *   CONFIG REWRITE             durability.persist_config, once per connection
 *   INFO persistence           the verdict (durable.c)
 *
 * A round runs on every connection (so a restarted replica that came back
 * with appendonly no is enforced as soon as it accepts connections, well
 * before Sentinel could promote it) and every enforce_interval_ms; while
 * the verdict waits for an initial AOF rewrite, INFO alone is asked again
 * every REPLICA_RECHECK_MS. A replica's history is never "settled": after a
 * full resync a replica restarts its AOF with a new initial rewrite that
 * INFO cannot tell from a routine one, so any rewrite counts against it. */
#include "replicas.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "durable.h"
#include "log.h"
#include "sconn.h"
#include "sentinel.h"
#include "server.h"
#include "tls.h"

#define REPLICAS_MAX 32             /* replicas followed at once */
#define REPLICA_RECHECK_MS 100      /* INFO again while a rewrite runs */
#define REPLICA_RETRY_MS 500        /* a failed round is run again after */
#define REPLICA_BACKOFF_MIN_MS 100  /* reconnect backoff, doubled per failure */
#define REPLICA_BACKOFF_MAX_MS 1000 /* ... up to this */
#define REPLICAS_LIST_MAX_MS 1000   /* SENTINEL REPLICAS at least this often */
#define REPLICAS_FORGET_ROUNDS                                                                     \
    3                         /* list periods unlisted (while sentinels answer)                    \
                                 before a replica is dropped */
#define REPLICA_ERROR_MAX 256 /* bytes of a last error, NUL included */

enum { K_AUTH = 1, K_PRE, K_SET, K_REWRITE, K_POST, K_ACK }; /* what a reply answers */

typedef struct replica {
    replicas *rs;                       /* owner */
    char addr[80];                      /* "ip:port", for logs and stats */
    struct sockaddr_storage sa;         /* resolved (Sentinel announces numeric) */
    sconn *c;                           /* the connection, NULL when down */
    int c_up;                           /* c is connected */
    uint64_t connect_started_ms;        /* c's connect began */
    uint64_t next_connect_ms;           /* reconnect backoff */
    uint64_t backoff_ms;                /* current backoff */
    uint64_t listed_ms;                 /* a sentinel last listed it */
    int round_open;                     /* replies of a round still due */
    uint64_t round_sent_ms;             /* when the open round was sent */
    uint64_t next_round_ms;             /* next round (full, or INFO alone) */
    uint64_t last_full_ms;              /* when the last full round was sent */
    int recheck;                        /* next round is INFO alone */
    durable_history hist;               /* of this round (UNKNOWN or WAS_OFF) */
    int set_ok;                         /* CONFIG SET answered OK in this round */
    char set_error[REPLICA_ERROR_MAX];  /* its refusal, if any */
    int persisted;                      /* CONFIG REWRITE done on this connection */
    int rewrite_logged;                 /* its refusal logged on this connection */
    int no_ack_ask;                     /* REPLCONF GETACK refused: not asked again */
    int enforced;                       /* see replica_view */
    uint64_t enforced_since_ms;         /* see replica_view */
    char last_error[REPLICA_ERROR_MAX]; /* see replica_view */
} replica;

struct replicas {
    ferry *f;                     /* context */
    const char *source;           /* who lists them, for logs */
    replica *nodes[REPLICAS_MAX]; /* followed replicas */
    int n;                        /* entries in nodes */
    uint64_t next_list_ms;        /* next SENTINEL REPLICAS */
    uint64_t last_answer_ms;      /* a sentinel last answered it */
    int full_logged;              /* REPLICAS_MAX reached (logged once) */
    int closing;                  /* replicas_close called */
};

static void replica_connect(replica *rp, uint64_t now);

/* ---------------------------------------------------------------- helpers */

static uint64_t list_period(const replicas *rs)
{
    uint64_t p = rs->f->cfg->enforce_interval_ms;
    return p < REPLICAS_LIST_MAX_MS ? p : REPLICAS_LIST_MAX_MS;
}

/* The replica is (no longer) enforced: log on change, keep the reason. */
static void set_failed(replica *rp, const char *why)
{
    if (rp->enforced || strcmp(rp->last_error, why) != 0) {
        if (rp->enforced) {
            log_warn("durability: replica %s is no longer enforced: %s", rp->addr, why);
        } else {
            log_info("durability: replica %s not enforced yet: %s", rp->addr, why);
        }
    }
    rp->enforced = 0;
    snprintf(rp->last_error, sizeof(rp->last_error), "%s", why);
}

static void set_enforced(replica *rp, uint64_t now)
{
    if (!rp->enforced) {
        log_info("durability: appendonly yes, appendfsync always asserted on replica %s; INFO "
                 "persistence: AOF on, no initial rewrite pending, last write ok",
                 rp->addr);
        rp->enforced_since_ms = now;
    }
    rp->enforced = 1;
    rp->last_error[0] = '\0';
}

/* ---------------------------------------------------------------- rounds */

static int rsend(replica *rp, int kind, int argc, const char *const *argv)
{
    if (sconn_send(rp->c, kind, argc, argv) != 0) {
        sconn_close(rp->c, "too many replies due");
        return -1;
    }
    return 0;
}

static void round_send(replica *rp, uint64_t now)
{
    const config *cfg = rp->rs->f->cfg;
    const char *cc = cfg->config_command ? cfg->config_command : "CONFIG";
    static const char *const info[] = {"INFO", "persistence"};
    rp->round_open = 1;
    rp->round_sent_ms = now;
    if (rp->recheck) {
        rsend(rp, K_POST, 2, info);
        return;
    }
    const char *set[] = {
        cc, "SET", "appendonly", "yes", "appendfsync", "always", "no-appendfsync-on-rewrite", "no"};
    const char *rewrite[] = {cc, "REWRITE"};
    rp->last_full_ms = now;
    rp->hist = DURABLE_UNKNOWN;
    rp->set_ok = 0;
    rp->set_error[0] = '\0';
    if (rsend(rp, K_PRE, 2, info) != 0 || rsend(rp, K_SET, 8, set) != 0) {
        return;
    }
    if (cfg->persist_config && !rp->persisted && rsend(rp, K_REWRITE, 2, rewrite) != 0) {
        return;
    }
    rsend(rp, K_POST, 2, info);
}

/* The round's last reply: the verdict, and when to look again. */
static void round_close(replica *rp, const redisReply *r, uint64_t now)
{
    const config *cfg = rp->rs->f->cfg;
    char why[REPLICA_ERROR_MAX];
    rp->round_open = 0;
    if (!rp->set_ok) {
        snprintf(why, sizeof(why), "CONFIG SET refused: %.200s", rp->set_error);
        set_failed(rp, why);
        rp->recheck = 0;
        rp->next_round_ms = now + REPLICA_RETRY_MS;
        return;
    }
    if (r->type != REDIS_REPLY_STRING) {
        snprintf(why, sizeof(why), "INFO persistence refused: %.200s",
                 r->type == REDIS_REPLY_ERROR && r->str ? r->str : "unexpected reply");
        set_failed(rp, why);
        rp->recheck = 0;
        rp->next_round_ms = now + REPLICA_RETRY_MS;
        return;
    }
    if (durable_check(r->str, r->len, rp->hist, why, DURABLE_WHY_MAX)) {
        set_enforced(rp, now);
        rp->recheck = 0;
        rp->next_round_ms = now + cfg->enforce_interval_ms;
        return;
    }
    set_failed(rp, why);
    /* INFO alone until the rewrite ends, with a full round each period. */
    rp->recheck = now - rp->last_full_ms < cfg->enforce_interval_ms;
    rp->next_round_ms = now + REPLICA_RECHECK_MS;
}

static void on_reply(sconn *c, void *data, int kind, redisReply *r)
{
    replica *rp = data;
    uint64_t now = uv_now(rp->rs->f->loop);
    if (rp->rs->closing || rp->c != c) {
        return;
    }
    switch (kind) {
    case K_AUTH:
        if (r->type == REDIS_REPLY_ERROR) {
            char why[REPLICA_ERROR_MAX];
            snprintf(why, sizeof(why), "AUTH refused: %.200s", r->str ? r->str : "");
            set_failed(rp, why);
            sconn_close(c, "authentication refused");
        }
        break;
    case K_PRE:
        if (r->type == REDIS_REPLY_STRING) {
            durable_info in;
            durable_parse(r->str, r->len, &in);
            if (in.aof_enabled == 0) {
                rp->hist = DURABLE_WAS_OFF;
                rp->persisted = 0; /* someone turned it off: write the file again */
                log_warn("durability: replica %s runs with appendonly no; enforcing", rp->addr);
            }
        }
        break;
    case K_SET:
        rp->set_ok = r->type == REDIS_REPLY_STATUS;
        if (!rp->set_ok) {
            snprintf(rp->set_error, sizeof(rp->set_error), "%.200s",
                     r->type == REDIS_REPLY_ERROR && r->str ? r->str : "unexpected reply");
        }
        break;
    case K_REWRITE:
        if (r->type == REDIS_REPLY_STATUS) {
            rp->persisted = 1;
            log_info("durability: settings written to the config file of replica %s "
                     "(CONFIG REWRITE)",
                     rp->addr);
        } else if (!rp->rewrite_logged) {
            rp->rewrite_logged = 1;
            log_warn("durability: CONFIG REWRITE refused by replica %s: %.200s (the settings "
                     "hold until it restarts)",
                     rp->addr, r->type == REDIS_REPLY_ERROR && r->str ? r->str : "?");
        }
        break;
    case K_POST:
        round_close(rp, r, now);
        break;
    case K_ACK:
        if (r->type == REDIS_REPLY_ERROR) {
            /* CLIENT REPLY or REPLCONF refused (ACL): replies of the three
             * commands may be due; start afresh, and ask no more. */
            rp->no_ack_ask = 1;
            log_warn("durability: replica %s refused to be asked for an ACK: %.200s", rp->addr,
                     r->str ? r->str : "");
            sconn_close(c, "asking for an ACK was refused");
        }
        break;
    default:
        break;
    }
}

static void on_state(sconn *c, void *data, int up, const char *why)
{
    replica *rp = data;
    replicas *rs = rp->rs;
    uint64_t now = uv_now(rs->f->loop);
    if (up) {
        const config *cfg = rs->f->cfg;
        rp->c_up = 1;
        rp->backoff_ms = REPLICA_BACKOFF_MIN_MS;
        rp->persisted = 0;
        rp->rewrite_logged = 0;
        rp->recheck = 0;
        log_debug("durability: connected to replica %s", rp->addr);
        if (cfg->redis_password != NULL) {
            const char *a3[] = {"AUTH", cfg->redis_username ? cfg->redis_username : "",
                                cfg->redis_password};
            const char *a2[] = {"AUTH", cfg->redis_password};
            if (cfg->redis_username != NULL ? rsend(rp, K_AUTH, 3, a3) : rsend(rp, K_AUTH, 2, a2)) {
                return;
            }
        }
        round_send(rp, now);
        return;
    }
    if (rp->c != c) {
        return;
    }
    rp->c = NULL;
    rp->c_up = 0;
    rp->round_open = 0;
    rp->next_connect_ms = now + rp->backoff_ms;
    rp->backoff_ms =
        rp->backoff_ms * 2 > REPLICA_BACKOFF_MAX_MS ? REPLICA_BACKOFF_MAX_MS : rp->backoff_ms * 2;
    if (!rs->closing) {
        char e[REPLICA_ERROR_MAX];
        snprintf(e, sizeof(e), "connection: %.200s", why);
        set_failed(rp, e);
    }
}

static void replica_connect(replica *rp, uint64_t now)
{
    rp->connect_started_ms = now;
    rp->c = sconn_open(rp->rs->f->loop, (const struct sockaddr *)&rp->sa,
                       rp->rs->f->tls != NULL ? rp->rs->f->tls->redis : NULL, 0, on_reply, on_state,
                       rp);
    if (rp->c == NULL) {
        rp->next_connect_ms = now + rp->backoff_ms;
        set_failed(rp, "connection: cannot start connecting");
    }
}

/* ---------------------------------------------------------------- table */

static void replica_drop(replicas *rs, int i)
{
    replica *rp = rs->nodes[i];
    log_info("durability: replica %s is no longer listed by %s; not followed any more", rp->addr,
             rs->source);
    if (rp->c != NULL) {
        sconn_close(rp->c, "no longer listed"); /* calls on_state at once; no callback after */
    }
    free(rp);
    rs->nodes[i] = rs->nodes[--rs->n];
}

static void learn_addr(replicas *rs, const char *ip, int p, uint64_t now)
{
    struct sockaddr_storage sa;
    if (ip == NULL || p < 0 || strlen(ip) > 63 || server_numeric_addr(ip, p, &sa) != 0) {
        return;
    }
    char addr[80];
    snprintf(addr, sizeof(addr), strchr(ip, ':') ? "[%s]:%d" : "%s:%d", ip, p);
    for (int i = 0; i < rs->n; i++) {
        if (strcmp(rs->nodes[i]->addr, addr) == 0) {
            rs->nodes[i]->listed_ms = now;
            return;
        }
    }
    if (rs->n >= REPLICAS_MAX) {
        if (!rs->full_logged) {
            log_warn("durability: more than %d replicas listed; %s is not enforced", REPLICAS_MAX,
                     addr);
            rs->full_logged = 1;
        }
        return;
    }
    replica *rp = xcalloc(1, sizeof(*rp));
    rp->rs = rs;
    snprintf(rp->addr, sizeof(rp->addr), "%s", addr);
    rp->sa = sa;
    rp->listed_ms = now;
    rp->backoff_ms = REPLICA_BACKOFF_MIN_MS;
    snprintf(rp->last_error, sizeof(rp->last_error), "not checked yet");
    rs->nodes[rs->n++] = rp;
    log_info("durability: following replica %s (listed by %s)", addr, rs->source);
    replica_connect(rp, now);
}

static void learn_one(replicas *rs, const redisReply *e, uint64_t now)
{
    learn_addr(rs, sconn_reply_field(e, "ip"), sconn_parse_port(sconn_reply_field(e, "port")), now);
}

/* -------------------------------------------------------------- interface */

replicas *replicas_new(ferry *f, const char *source)
{
    replicas *rs = xcalloc(1, sizeof(*rs));
    rs->f = f;
    rs->source = source;
    return rs;
}

void replicas_learn_addr(replicas *rs, const char *ip, int port, uint64_t now)
{
    if (rs == NULL || rs->closing) {
        return;
    }
    learn_addr(rs, ip, port, now);
}

void replicas_listed(replicas *rs, uint64_t now)
{
    if (rs != NULL && !rs->closing) {
        rs->last_answer_ms = now;
    }
}

int replicas_list_due(replicas *rs, uint64_t now)
{
    if (rs == NULL || rs->closing || now < rs->next_list_ms) {
        return 0;
    }
    rs->next_list_ms = now + list_period(rs);
    return 1;
}

void replicas_learn(replicas *rs, const redisReply *r, uint64_t now)
{
    if (rs == NULL || rs->closing || r->type != REDIS_REPLY_ARRAY) {
        return;
    }
    rs->last_answer_ms = now;
    for (size_t i = 0; i < r->elements && i < 2 * REPLICAS_MAX; i++) {
        learn_one(rs, r->element[i], now);
    }
}

void replicas_ask_acks(replicas *rs)
{
    static const char *const off[] = {"CLIENT", "REPLY", "OFF"};
    static const char *const getack[] = {"REPLCONF", "GETACK", "*"};
    static const char *const on[] = {"CLIENT", "REPLY", "ON"};
    if (rs == NULL || rs->closing) {
        return;
    }
    for (int i = 0; i < rs->n; i++) {
        replica *rp = rs->nodes[i];
        if (rp->c == NULL || !rp->c_up || rp->no_ack_ask) {
            continue;
        }
        if (sconn_send_noreply(rp->c, 3, off) == 0 && sconn_send_noreply(rp->c, 3, getack) == 0) {
            rsend(rp, K_ACK, 3, on);
        }
    }
}

void replicas_tick(replicas *rs, uint64_t now)
{
    const config *cfg;
    if (rs == NULL || rs->closing) {
        return;
    }
    cfg = rs->f->cfg;
    uint64_t forget = REPLICAS_FORGET_ROUNDS * list_period(rs) + cfg->sentinel_timeout_ms;
    for (int i = 0; i < rs->n; i++) {
        replica *rp = rs->nodes[i];
        if (rs->last_answer_ms > rp->listed_ms + forget) {
            replica_drop(rs, i);
            i--;
            continue;
        }
        if (rp->c == NULL) {
            if (now >= rp->next_connect_ms) {
                replica_connect(rp, now);
            }
            continue;
        }
        if (!rp->c_up) {
            if (now - rp->connect_started_ms >= cfg->connect_timeout_ms) {
                sconn_close(rp->c, "connect timeout");
            }
            continue;
        }
        if (rp->round_open) {
            if (now - rp->round_sent_ms >= cfg->connect_timeout_ms) {
                sconn_close(rp->c, "no answer within upstream.connect_timeout_ms");
            }
            continue;
        }
        if (now >= rp->next_round_ms) {
            round_send(rp, now);
        }
    }
}

void replicas_close(replicas *rs)
{
    if (rs == NULL || rs->closing) {
        return;
    }
    rs->closing = 1;
    for (int i = 0; i < rs->n; i++) {
        if (rs->nodes[i]->c != NULL) {
            sconn_close(rs->nodes[i]->c, "ferry is stopping");
        }
    }
}

void replicas_free(replicas *rs)
{
    if (rs == NULL) {
        return;
    }
    for (int i = 0; i < rs->n; i++) {
        free(rs->nodes[i]);
    }
    free(rs);
}

int replicas_count(const replicas *rs)
{
    return rs == NULL ? 0 : rs->n;
}

void replicas_get(const replicas *rs, int i, replica_view *out)
{
    const replica *rp = rs->nodes[i];
    out->addr = rp->addr;
    out->enforced = rp->enforced;
    out->enforced_since_ms = rp->enforced_since_ms;
    out->last_error = rp->last_error;
}
