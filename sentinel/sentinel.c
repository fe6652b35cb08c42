/* sentinel.c - the Sentinel client. Talks to every configured sentinel (and
 * those it learns from SENTINEL SENTINELS) over two connections each (sconn.c):
 * one polls SENTINEL MASTER, one listens to every event. A poll round asks
 * all sentinels at once; a master is accepted when a majority of the KNOWN
 * sentinels name it and none of them reports it objectively down or failing
 * over, or, during a failover, when it is announced at a config epoch above
 * the one ferry trusts and a second sentinel backs the claim (see
 * epoch_candidate). Sentinels are counted once each (by SENTINEL MYID), so
 * one sentinel cannot vote under several addresses. Events are hints that
 * start a switch or a round early; the periodic round is the truth. With
 * fewer than a majority reachable, ferry keeps its master as long as ROLE
 * says master. A sentinel that says nonsense gets its connection closed and
 * a log line; nothing else. A sentinel configured by a host name is looked
 * up off the loop before every connect; one that does not resolve is kept
 * (it counts among the known) and looked up again. */
#include "sentinel.h"

#include <errno.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "log.h"
#include "replicas.h" /* durability on the replicas (N13) */
#include "sconn.h"
#include "server.h"
#include "tls.h"
#include "upstream.h"
#include "workers.h"

#define SENTINEL_RECONNECT_MS 500
#define SENTINEL_DISCOVER_EVERY 10  /* rounds between SENTINEL SENTINELS */
#define SENTINEL_EVENT_TTL_MS 30000 /* how long a promotion event backs a claim */

enum { K_AUTH = 1, K_MYID, K_MASTER, K_SENTINELS, K_REPLICAS }; /* what a reply answers */

typedef struct sentinel_node {
    sentinel_client *sc; /* owner */
    char host[64];       /* address as configured or learned */
    int port;
    struct sockaddr_storage addr; /* resolved (numeric, or the last lookup of a name) */
    int named;                    /* configured by a host name: resolved before each connect */
    int resolved;                 /* addr holds an address */
    int resolving;                /* gai is in flight */
    int resolve_failing;          /* the last lookup failed (logged once) */
    uv_getaddrinfo_t gai;         /* the lookup of a name */
    char myid[48];                /* SENTINEL MYID, "" until known */
    sconn *cmd;                   /* polling connection, NULL when down */
    sconn *sub;                   /* event connection, NULL when down */
    int cmd_up;                   /* cmd connected */
    uint64_t cmd_started_ms;      /* cmd connect started */
    uint64_t sub_started_ms;      /* sub connect started */
    uint64_t next_connect_ms;     /* reconnect backoff */
    uint64_t asked_ms;            /* SENTINEL MASTER in flight since (0: none) */
    uint64_t asked_round;         /* round of the question in flight */
    uint64_t answered_round;      /* round of the last answer */
    int has_master;               /* last answer named a master */
    char ip[64];                  /* ... at this address */
    int mport;
    long long epoch;           /* its config epoch */
    int sdown, odown, failing; /* its flags for that master */
    int learned;               /* discovered, not configured */
    char ev_ip[64];            /* last master it announced by event (+switch-master
                                  or +promoted-slave), "" if none */
    int ev_port;
    uint64_t ev_ms; /* ... received then */
} sentinel_node;

struct sentinel_client {
    ferry *f;                                   /* context */
    sentinel_node *nodes[CONFIG_MAX_SENTINELS]; /* known sentinels */
    int n;
    uint64_t round; /* current poll round */
    uint64_t round_started_ms;
    int round_open;          /* answers still expected */
    int round_again;         /* a trigger arrived mid-round */
    uint64_t next_round_ms;  /* next periodic round */
    int reachable;           /* answered the last round */
    int known;               /* known sentinels, each counted once (by MYID) */
    int all_down;            /* none answered (logged once) */
    int quorum;              /* a majority of the known answered: 1 yes, 0 no,
                                -1 not known yet (start-up) */
    long long trusted_epoch; /* config epoch of the master last accepted, -1 none */
    int closing;             /* sentinel_close called */
    replicas *replicas;      /* durability on the replicas Sentinel lists */
    int replicas_told;       /* their count as every loop was last told it (-1 never) */
};

static void round_evaluate(sentinel_client *sc);

/* ---------------------------------------------------------------- helpers */

/* A strict dotted-quad or IPv6 literal (uv_ip4_addr accepts less strict). */
static int strict_ip(const char *ip)
{
    unsigned char tmp[16];
    return uv_inet_pton(strchr(ip, ':') ? AF_INET6 : AF_INET, ip, tmp) == 0;
}

/* Node i repeats a sentinel already counted (same SENTINEL MYID). */
static int node_is_alias(const sentinel_client *sc, int i)
{
    const sentinel_node *nd = sc->nodes[i];
    if (nd->myid[0] == '\0') {
        return 0;
    }
    for (int j = 0; j < i; j++) {
        if (strcmp(sc->nodes[j]->myid, nd->myid) == 0) {
            return 1;
        }
    }
    return 0;
}

/* ---------------------------------------------------------------- nodes */

static sentinel_node *node_add(sentinel_client *sc, const char *host, int port, int learned)
{
    struct sockaddr_storage ss;
    int named = server_numeric_addr(host, port, &ss) != 0;
    if (named && learned) {
        return NULL; /* Sentinel announces numeric addresses */
    }
    for (int i = 0; i < sc->n; i++) {
        const sentinel_node *o = sc->nodes[i];
        if (o->port == port &&
            (strcmp(o->host, host) == 0 ||
             (!named && o->resolved && memcmp(&o->addr, &ss, sizeof(ss)) == 0))) {
            return NULL;
        }
    }
    if (sc->n >= CONFIG_MAX_SENTINELS) {
        return NULL;
    }
    sentinel_node *nd = xcalloc(1, sizeof(*nd));
    nd->sc = sc;
    snprintf(nd->host, sizeof(nd->host), "%s", host);
    nd->port = port;
    nd->addr = ss;
    nd->named = named; /* a name is looked up before each connect (node_open) */
    nd->resolved = !named;
    nd->learned = learned;
    sc->nodes[sc->n++] = nd;
    if (learned) {
        log_info("sentinel: learned of sentinel %s:%d", host, port);
    }
    return nd;
}

static void send_auth(sentinel_node *nd, sconn *c)
{
    const config *cfg = nd->sc->f->cfg;
    if (cfg->sentinel_password == NULL) {
        return;
    }
    if (cfg->sentinel_username != NULL) {
        const char *argv[] = {"AUTH", cfg->sentinel_username, cfg->sentinel_password};
        sconn_send(c, K_AUTH, 3, argv);
    } else {
        const char *argv[] = {"AUTH", cfg->sentinel_password};
        sconn_send(c, K_AUTH, 2, argv);
    }
}

static void split_words(char *s, char **w, int max, int *n)
{
    char *save = NULL;
    *n = 0;
    for (char *t = strtok_r(s, " ", &save); t != NULL && *n < max; t = strtok_r(NULL, " ", &save)) {
        w[(*n)++] = t;
    }
}

static int is_switch_event(const char *ev)
{
    static const char *const strong[] = {"+odown",
                                         "+try-failover",
                                         "+elected-leader",
                                         "+promoted-slave",
                                         "+switch-master",
                                         "+failover-end",
                                         "+convert-to-slave",
                                         "+reset-master",
                                         "+selected-slave",
                                         "+failover-end-for-timeout"};
    for (size_t i = 0; i < sizeof(strong) / sizeof(strong[0]); i++) {
        if (strcmp(ev, strong[i]) == 0) {
            return 1;
        }
    }
    return strncmp(ev, "+failover-state-", 16) == 0;
}

/* A Sentinel event: a hint that the master may be changing. Anything not
 * shaped like ["pmessage", pattern, channel, payload] is ignored. */
static void on_event(sentinel_node *nd, const redisReply *r)
{
    sentinel_client *sc = nd->sc;
    const char *kind, *ev, *text;
    if (r->type != REDIS_REPLY_ARRAY || r->elements != 4 ||
        (kind = sconn_reply_text(r->element[0])) == NULL || strcmp(kind, "pmessage") != 0 ||
        (ev = sconn_reply_text(r->element[2])) == NULL ||
        r->element[3]->type != REDIS_REPLY_STRING || r->element[3]->len > 400) {
        return;
    }
    text = r->element[3]->str;
    if (ev[0] != '+' && ev[0] != '-') {
        return; /* __sentinel__:hello and the like */
    }
    char payload[512];
    char *w[16];
    int nw;
    snprintf(payload, sizeof(payload), "%s", text);
    split_words(payload, w, 16, &nw);
    const char *name = NULL;
    if (strcmp(ev, "+switch-master") == 0) {
        name = nw > 0 ? w[0] : NULL;
    } else if (nw >= 2 && strcmp(w[0], "master") == 0) {
        name = w[1];
    } else {
        for (int i = 0; i + 1 < nw; i++) {
            if (strcmp(w[i], "@") == 0) {
                name = w[i + 1];
            }
        }
    }
    const config *cfg = sc->f->cfg;
    if (name == NULL || strcmp(name, cfg->sentinel_master) != 0) {
        return;
    }
    upstream *up = sc->f->up;
    log_info("sentinel %s:%d: event %s %s", nd->host, nd->port, ev, text);
    /* A new master announced ("+switch-master <name> <old ip> <old port> <new
     * ip> <new port>", "+promoted-slave slave <ip:port> <ip> <port> @ ..."):
     * kept to back another sentinel's claim (epoch_candidate). */
    const char *eip = NULL, *eport = NULL;
    if (strcmp(ev, "+switch-master") == 0 && nw >= 5) {
        eip = w[3];
        eport = w[4];
    } else if (strcmp(ev, "+promoted-slave") == 0 && nw >= 4) {
        eip = w[2];
        eport = w[3];
    }
    if (eip != NULL && sconn_parse_port(eport) > 0 && strlen(eip) < sizeof(nd->ev_ip) &&
        strict_ip(eip)) {
        snprintf(nd->ev_ip, sizeof(nd->ev_ip), "%s", eip);
        nd->ev_port = sconn_parse_port(eport);
        nd->ev_ms = uv_now(sc->f->loop);
    }
    char current[300] = "";
    if (up->target_set) {
        snprintf(current, sizeof(current), "%s", up->name);
    }
    /* "<type> <name> <ip> <port> [@ <master> <ip> <port>]": the instance the
     * event is about is words 2 and 3, whatever master follows the '@'. */
    int mentions = 0;
    if (nw >= 4 && current[0] != '\0') {
        char a[300];
        snprintf(a, sizeof(a), "%s:%s", w[2], w[3]);
        mentions = strcmp(a, current) == 0;
    }
    if (strcmp(ev, "+promoted-slave") == 0 || strcmp(ev, "+switch-master") == 0 ||
        strcmp(ev, "+failover-state-send-slaveof-noone") == 0 ||
        strcmp(ev, "+failover-state-wait-promotion") == 0) {
        workers_fence_invalid(sc->f); /* a replica is (being) promoted */
    }
    char why[600];
    snprintf(why, sizeof(why), "Sentinel event %s %s", ev, text);
    if (strcmp(ev, "+switch-master") == 0 && nw >= 5) {
        char to[300];
        snprintf(to, sizeof(to), "%s:%s", w[3], w[4]);
        if (strcmp(to, current) != 0) {
            workers_switch(sc->f, why);
        }
    } else if (is_switch_event(ev) && mentions) {
        workers_switch(sc->f, why);
    }
    sentinel_trigger(sc);
}

/* SENTINEL MASTER: a flat list of field/value pairs. */
static void on_master(sentinel_node *nd, const redisReply *r)
{
    sentinel_client *sc = nd->sc;
    nd->asked_ms = 0;
    nd->answered_round = nd->asked_round;
    nd->has_master = 0;
    if (r->type == REDIS_REPLY_ERROR) {
        log_warn("sentinel %s:%d: SENTINEL MASTER %s: %s", nd->host, nd->port,
                 sc->f->cfg->sentinel_master, r->str);
    } else if (r->type != REDIS_REPLY_ARRAY || r->elements % 2 != 0) {
        log_warn("sentinel %s:%d: SENTINEL MASTER answered with a reply of the wrong shape",
                 nd->host, nd->port);
    } else {
        const char *ip = NULL, *port = NULL, *epoch = NULL, *flags = NULL, *k, *v;
        int bad = 0;
        for (size_t i = 0; i + 1 < r->elements; i += 2) {
            if ((k = sconn_reply_text(r->element[i])) == NULL ||
                (v = sconn_reply_text(r->element[i + 1])) == NULL) {
                bad = 1;
                break;
            }
            if (strcmp(k, "ip") == 0) {
                ip = v;
            } else if (strcmp(k, "port") == 0) {
                port = v;
            } else if (strcmp(k, "config-epoch") == 0) {
                epoch = v;
            } else if (strcmp(k, "flags") == 0) {
                flags = v;
            }
        }
        int p = sconn_parse_port(port);
        struct sockaddr_storage ss;
        if (bad || ip == NULL || p < 0 || strlen(ip) >= sizeof(nd->ip) || !strict_ip(ip) ||
            server_numeric_addr(ip, p, &ss) != 0) {
            log_warn("sentinel %s:%d: SENTINEL MASTER reply without a usable address "
                     "(ip %.64s, port %.16s)",
                     nd->host, nd->port, ip ? ip : "missing", port ? port : "missing");
        } else {
            char *end = NULL;
            errno = 0;
            long long e = epoch ? strtoll(epoch, &end, 10) : 0;
            nd->has_master = 1;
            snprintf(nd->ip, sizeof(nd->ip), "%s", ip);
            nd->mport = p;
            nd->epoch = (epoch && (errno != 0 || *end != '\0')) ? 0 : e;
            nd->sdown = flags && strstr(flags, "s_down") != NULL;
            nd->odown = flags && strstr(flags, "o_down") != NULL;
            nd->failing = flags && strstr(flags, "failover_in_progress") != NULL;
        }
    }
    if (!sc->round_open || nd->answered_round != sc->round) {
        return;
    }
    for (int i = 0; i < sc->n; i++) {
        if (sc->nodes[i]->asked_round == sc->round && sc->nodes[i]->asked_ms != 0) {
            return; /* still waiting for someone */
        }
    }
    round_evaluate(sc);
}

static void on_sentinels(sentinel_node *nd, const redisReply *r)
{
    if (r->type != REDIS_REPLY_ARRAY) {
        return;
    }
    for (size_t i = 0; i < r->elements && i < CONFIG_MAX_SENTINELS; i++) {
        const char *ip = sconn_reply_field(r->element[i], "ip");
        int p = sconn_parse_port(sconn_reply_field(r->element[i], "port"));
        if (ip != NULL && p > 0 && strlen(ip) < 64 && strict_ip(ip)) {
            node_add(nd->sc, ip, p, 1);
        }
    }
}

/* Every loop's master view learns how many replicas Sentinel lists when
 * that changes: any of them may be promoted, so redo.c keeps an
 * acknowledged push until as many replicas are online past it. */
static void replicas_tell(sentinel_client *sc)
{
    int n = replicas_count(sc->replicas);
    if (n != sc->replicas_told) {
        sc->replicas_told = n;
        workers_replicas_known(sc->f, n);
    }
}

static void cmd_reply(sconn *c, void *data, int kind, redisReply *r)
{
    sentinel_node *nd = data;
    if (nd->sc->closing) {
        return;
    }
    switch (kind) {
    case K_AUTH:
        if (r->type == REDIS_REPLY_ERROR) {
            log_error("sentinel %s:%d refused ferry's credentials: %s", nd->host, nd->port, r->str);
        }
        break;
    case K_MYID: {
        const char *id;
        if ((id = sconn_reply_text(r)) != NULL && strlen(id) < sizeof(nd->myid)) {
            snprintf(nd->myid, sizeof(nd->myid), "%s", id);
        }
        break;
    }
    case K_MASTER:
        on_master(nd, r);
        break;
    case K_SENTINELS:
        on_sentinels(nd, r);
        break;
    case K_REPLICAS:
        replicas_learn(nd->sc->replicas, r, uv_now(nd->sc->f->loop));
        replicas_tell(nd->sc);
        break;
    default:
        break;
    }
}

static void cmd_state(sconn *c, void *data, int up, const char *why)
{
    sentinel_node *nd = data;
    if (up) {
        nd->cmd_up = 1;
        log_debug("sentinel %s:%d: connected", nd->host, nd->port);
        send_auth(nd, c);
        static const char *const myid[] = {"SENTINEL", "MYID"};
        sconn_send(c, K_MYID, 2, myid);
        return;
    }
    if (nd->cmd == c) {
        nd->cmd = NULL;
        nd->cmd_up = 0;
        nd->asked_ms = 0;
        nd->next_connect_ms = uv_now(nd->sc->f->loop) + SENTINEL_RECONNECT_MS;
        if (!nd->sc->closing) {
            log_info("sentinel %s:%d: connection closed: %s", nd->host, nd->port, why);
        }
    }
}

static void sub_reply(sconn *c, void *data, int kind, redisReply *r)
{
    sentinel_node *nd = data;
    if (!nd->sc->closing) {
        on_event(nd, r);
    }
}

static void sub_state(sconn *c, void *data, int up, const char *why)
{
    sentinel_node *nd = data;
    if (up) {
        static const char *const sub[] = {"PSUBSCRIBE", "*"};
        send_auth(nd, c);
        sconn_send(c, 0, 2, sub);
        return;
    }
    if (nd->sub == c) {
        nd->sub = NULL;
        if (!nd->sc->closing) {
            log_debug("sentinel %s:%d: event connection closed: %s", nd->host, nd->port, why);
        }
    }
}

static void node_connect(sentinel_node *nd, int sub, uint64_t now)
{
    uv_loop_t *loop = nd->sc->f->loop;
    ferry *f = nd->sc->f;
    sconn *c = sconn_open(loop, (const struct sockaddr *)&nd->addr,
                          f->tls != NULL ? f->tls->sentinel : NULL, sub,
                          sub ? sub_reply : cmd_reply, sub ? sub_state : cmd_state, nd);
    if (c == NULL) {
        nd->next_connect_ms = now + SENTINEL_RECONNECT_MS;
        return;
    }
    if (sub) {
        nd->sub = c;
        nd->sub_started_ms = now;
    } else {
        nd->cmd = c;
        nd->cmd_started_ms = now;
    }
}

static void node_resolved_cb(uv_getaddrinfo_t *req, int status, struct addrinfo *res)
{
    sentinel_node *nd = req->data;
    sentinel_client *sc = nd->sc;
    uint64_t now = uv_now(sc->f->loop);
    struct sockaddr_storage ss;
    char at[64];

    nd->resolving = 0;
    if (status == UV_EAI_CANCELED || sc->closing) {
        uv_freeaddrinfo(res);
        return;
    }
    if (server_resolved_addr(status, res, &ss) < 0) {
        if (!nd->resolve_failing) {
            log_warn("sentinel %s:%d: cannot resolve %s: %s; kept, and looked up again every "
                     "%d ms",
                     nd->host, nd->port, nd->host, status < 0 ? uv_strerror(status) : "no address",
                     SENTINEL_RECONNECT_MS);
        }
        nd->resolve_failing = 1;
        nd->next_connect_ms = now + SENTINEL_RECONNECT_MS;
        return;
    }
    if (!nd->resolved || nd->resolve_failing || memcmp(&ss, &nd->addr, sizeof(ss)) != 0) {
        if (ss.ss_family == AF_INET6) {
            uv_ip6_name((const struct sockaddr_in6 *)&ss, at, sizeof(at));
        } else {
            uv_ip4_name((const struct sockaddr_in *)&ss, at, sizeof(at));
        }
        log_info("sentinel %s:%d: resolves to %s", nd->host, nd->port, at);
    }
    nd->addr = ss;
    nd->resolved = 1;
    nd->resolve_failing = 0;
    if (nd->cmd == NULL) {
        node_connect(nd, 0, now);
    }
    if (nd->sub == NULL) {
        node_connect(nd, 1, now);
    }
}

/* Open nd's command (sub = 0) or event connection. A sentinel given by a
 * name is looked up first, off the loop, at every (re)connect;
 * node_resolved_cb opens what is missing. */
static void node_open(sentinel_node *nd, int sub, uint64_t now)
{
    if (!nd->named) {
        node_connect(nd, sub, now);
        return;
    }
    if (nd->resolving) {
        return;
    }
    int rc = server_resolve(nd->sc->f->loop, &nd->gai, node_resolved_cb, nd->host, nd->port, nd);
    if (rc < 0) {
        log_warn("sentinel %s:%d: cannot resolve %s: %s", nd->host, nd->port, nd->host,
                 uv_strerror(rc));
        nd->next_connect_ms = now + SENTINEL_RECONNECT_MS;
        return;
    }
    nd->resolving = 1;
}

/* ---------------------------------------------------------------- rounds */

static void round_start(sentinel_client *sc, uint64_t now)
{
    const config *cfg = sc->f->cfg;
    int asked = 0;
    int list = replicas_list_due(sc->replicas, now); /* durability on the replicas */
    sc->round++;
    sc->round_open = 1;
    sc->round_again = 0;
    sc->round_started_ms = now;
    sc->next_round_ms = now + cfg->sentinel_resolve_interval_ms;
    for (int i = 0; i < sc->n; i++) {
        sentinel_node *nd = sc->nodes[i];
        if (nd->cmd == NULL || !nd->cmd_up) {
            continue;
        }
        const char *argv[] = {"SENTINEL", "MASTER", cfg->sentinel_master};
        if (sconn_send(nd->cmd, K_MASTER, 3, argv) != 0) {
            continue;
        }
        nd->asked_round = sc->round;
        nd->asked_ms = now;
        asked++;
        if (sc->round % SENTINEL_DISCOVER_EVERY == 1) {
            const char *sv[] = {"SENTINEL", "SENTINELS", cfg->sentinel_master};
            sconn_send(nd->cmd, K_SENTINELS, 3, sv);
        }
        if (list) {
            const char *rv[] = {"SENTINEL", "REPLICAS", cfg->sentinel_master};
            sconn_send(nd->cmd, K_REPLICAS, 3, rv);
        }
    }
    if (asked == 0) {
        round_evaluate(sc);
    }
}

static int same_master(const sentinel_node *a, const sentinel_node *b)
{
    return a->mport == b->mport && strcmp(a->ip, b->ip) == 0;
}

/* a and b are one sentinel: the same node, or the same SENTINEL MYID. */
static int same_sentinel(const sentinel_node *a, const sentinel_node *b)
{
    return a == b || (a->myid[0] != '\0' && strcmp(a->myid, b->myid) == 0);
}

/* Node i answered this round and is counted (not a second address of a
 * sentinel already counted). */
static int node_answered(const sentinel_client *sc, int i)
{
    return sc->nodes[i]->answered_round == sc->round && !node_is_alias(sc, i);
}

/* The sentinel neither sees the master it names down nor fails it over. */
static int node_clean(const sentinel_node *nd)
{
    return !nd->sdown && !nd->odown && !nd->failing;
}

/* During a failover the majority lags: the leader reports the old address
 * until the failover ends (+failover-end), and a sentinel cut off with the
 * old master goes on naming it. Config epochs only grow through a majority
 * vote, so a master announced at a config epoch above the one ferry trusts
 * is taken before a majority names it when:
 *  - the sentinel naming it reports it clean (not down, not failing over);
 *  - no answering sentinel names another address, clean, at that epoch or
 *    above (the leader naming the old one while failing it over does not);
 *  - another sentinel (another MYID) backs it: names it at that epoch too,
 *    or announced it by event (+switch-master to it, +promoted-slave of it)
 *    within SENTINEL_EVENT_TTL_MS;
 * and, as for every master, ROLE on it says master (upstream.c). So one
 * sentinel alone, lying or behind, cannot move ferry. Returns the claim (its
 * node) or NULL; writes how it was backed to why. */
static sentinel_node *epoch_candidate(sentinel_client *sc, uint64_t now, char *why, size_t len)
{
    sentinel_node *cand = NULL;
    if (sc->trusted_epoch < 0) {
        return NULL; /* nothing trusted yet: a majority only */
    }
    for (int i = 0; i < sc->n; i++) {
        sentinel_node *nd = sc->nodes[i];
        if (node_answered(sc, i) && nd->has_master && node_clean(nd) &&
            nd->epoch > sc->trusted_epoch && (cand == NULL || nd->epoch > cand->epoch)) {
            cand = nd;
        }
    }
    if (cand == NULL) {
        return NULL;
    }
    for (int i = 0; i < sc->n; i++) {
        sentinel_node *o = sc->nodes[i];
        if (node_answered(sc, i) && o->has_master && node_clean(o) && o->epoch >= cand->epoch &&
            !same_master(o, cand)) {
            log_info("sentinel: config epoch %lld names both %s:%d (sentinel %s:%d) and %s:%d "
                     "(sentinel %s:%d); waiting for a majority",
                     cand->epoch, cand->ip, cand->mport, cand->host, cand->port, o->ip, o->mport,
                     o->host, o->port);
            return NULL;
        }
    }
    for (int i = 0; i < sc->n; i++) {
        sentinel_node *o = sc->nodes[i];
        if (same_sentinel(o, cand) || o->myid[0] == '\0') {
            continue;
        }
        if (node_answered(sc, i) && o->has_master && node_clean(o) && same_master(o, cand) &&
            o->epoch == cand->epoch) {
            snprintf(why, len, "sentinels %s:%d and %s:%d name it", cand->host, cand->port, o->host,
                     o->port);
            return cand;
        }
        if (o->ev_ms != 0 && now - o->ev_ms <= SENTINEL_EVENT_TTL_MS && o->ev_port == cand->mport &&
            strcmp(o->ev_ip, cand->ip) == 0) {
            snprintf(why, len, "sentinel %s:%d names it, sentinel %s:%d announced it by event",
                     cand->host, cand->port, o->host, o->port);
            return cand;
        }
    }
    return NULL;
}

/* Log once per change whether a majority of the known sentinels answers. */
static void quorum_note(sentinel_client *sc, int ok, int replies, int need, uint64_t now)
{
    const upstream *up = sc->f->up;
    if (ok == sc->quorum) {
        return;
    }
    if (!ok && sc->quorum < 0 && now - sc->f->started_ms < sc->f->cfg->sentinel_timeout_ms) {
        return; /* still connecting at start-up */
    }
    if (ok) {
        if (sc->quorum == 0) {
            log_info("sentinel: %d of %d known sentinel(s) reachable again, a majority: ferry "
                     "follows Sentinel's choice again",
                     replies, sc->known);
        }
    } else {
        log_warn("sentinel: only %d of %d known sentinel(s) reachable, fewer than a majority "
                 "(%d): keeping master %s while it answers ROLE master; a new master only if "
                 "announced at a higher config epoch and backed by a second sentinel",
                 replies, sc->known, need, up->epoch > 0 ? up->name : "(none yet)");
    }
    sc->quorum = ok;
}

/* No majority of the known sentinels answers: keep the master ferry has
 * (upstream.c re-checks ROLE on it periodically), or go back to it after a
 * switch, ROLE checked again on the new link. */
static void keep_master(sentinel_client *sc)
{
    workers_keep_master(sc->f); /* every loop's upstream */
}

static void accept_master(sentinel_client *sc, const sentinel_node *nd, long long epoch,
                          const char *why)
{
    sc->trusted_epoch = epoch;
    workers_set_master(sc->f, nd->ip, nd->mport, why); /* every loop's upstream */
}

/* Close a round: accept the master a majority of the known sentinels name
 * (on a split, the one named at the highest config epoch is logged), unless
 * one of them sees it objectively down or failing over; or the claim that
 * epoch_candidate backs, when its config epoch is higher. */
static void round_evaluate(sentinel_client *sc)
{
    upstream *up = sc->f->up;
    uint64_t now = uv_now(sc->f->loop);
    sentinel_node *best = NULL, *top = NULL;
    int replies = 0, known = 0, best_votes = 0, odown = 0, failing = 0, sdown = 0;
    long long best_epoch = 0;

    sc->round_open = 0;
    for (int i = 0; i < sc->n; i++) {
        sentinel_node *nd = sc->nodes[i];
        if (node_is_alias(sc, i)) {
            continue;
        }
        known++;
        if (nd->answered_round != sc->round) {
            continue;
        }
        replies++;
        if (!nd->has_master) {
            continue;
        }
        if (top == NULL || nd->epoch > top->epoch) {
            top = nd;
        }
        int votes = 0;
        for (int j = 0; j < sc->n; j++) {
            sentinel_node *o = sc->nodes[j];
            votes += node_answered(sc, j) && o->has_master && same_master(o, nd);
        }
        if (votes > best_votes ||
            (votes == best_votes && best != NULL && nd->epoch > best->epoch)) {
            best = nd;
            best_votes = votes;
        }
    }
    int need = known / 2 + 1;
    sc->reachable = replies;
    sc->known = known;
    quorum_note(sc, replies >= need, replies, need, now);
    if (replies == 0) {
        if (!sc->all_down) {
            log_warn("sentinel: all %d sentinel(s) unreachable; keeping master %s (%s)", known,
                     up->epoch > 0 ? up->name : "none", upstream_state_name(up->state));
            sc->all_down = 1;
        }
        keep_master(sc);
        return;
    }
    if (sc->all_down) {
        log_info("sentinel: %d of %d sentinel(s) reachable again", replies, known);
        sc->all_down = 0;
    }
    char backing[300] = "";
    sentinel_node *cand = epoch_candidate(sc, now, backing, sizeof(backing));
    char why[500];
    if (best != NULL && best_votes >= need) {
        for (int i = 0; i < sc->n; i++) {
            sentinel_node *nd = sc->nodes[i];
            if (node_answered(sc, i) && nd->has_master && same_master(nd, best)) {
                odown += nd->odown;
                failing += nd->failing;
                sdown += nd->sdown;
                best_epoch = nd->epoch > best_epoch ? nd->epoch : best_epoch;
            }
        }
        int clean = odown == 0 && failing == 0 && sdown * 2 <= best_votes;
        if (clean && (cand == NULL || best_epoch >= cand->epoch)) {
            snprintf(why, sizeof(why), "%d of %d known sentinel(s) agree at config epoch %lld",
                     best_votes, known, best_epoch);
            accept_master(sc, best, best_epoch, why);
            return;
        }
        if (!clean && cand == NULL) {
            char name[300];
            snprintf(name, sizeof(name), strchr(best->ip, ':') ? "[%s]:%d" : "%s:%d", best->ip,
                     best->mport);
            if (up->state == UP_UP && up->target_set && strcmp(up->name, name) == 0) {
                snprintf(why, sizeof(why), "Sentinel reports master %s %s", name,
                         failing ? "failing over" : "down");
                workers_switch(sc->f, why);
            }
            return;
        }
    }
    if (cand != NULL) {
        int votes = 0;
        for (int i = 0; i < sc->n; i++) {
            votes +=
                node_answered(sc, i) && sc->nodes[i]->has_master && same_master(sc->nodes[i], cand);
        }
        snprintf(why, sizeof(why),
                 "announced at config epoch %lld, above the trusted %lld: %s (%d of %d known "
                 "sentinel(s) name it so far)",
                 cand->epoch, sc->trusted_epoch, backing, votes, known);
        accept_master(sc, cand, cand->epoch, why);
        return;
    }
    if (best == NULL) {
        log_warn("sentinel: no sentinel knows master '%s'", sc->f->cfg->sentinel_master);
    } else {
        log_info("sentinel: no majority for a master yet (%s:%d has %d of %d known sentinel(s), "
                 "%d answered; highest config epoch %lld names %s:%d)",
                 best->ip, best->mport, best_votes, known, replies, top->epoch, top->ip,
                 top->mport);
    }
    if (replies < need) {
        keep_master(sc);
    }
}

/* -------------------------------------------------------------- interface */

sentinel_client *sentinel_new(ferry *f)
{
    sentinel_client *sc = xcalloc(1, sizeof(*sc));
    sc->f = f;
    sc->quorum = -1;
    sc->trusted_epoch = -1;
    for (int i = 0; i < f->cfg->nsentinels; i++) {
        const config_addr *a = &f->cfg->sentinels[i];
        node_add(sc, a->host, a->port, 0);
    }
    log_info("sentinel: following master '%s' through %d sentinel(s)", f->cfg->sentinel_master,
             sc->n);
    uint64_t now = uv_now(f->loop);
    for (int i = 0; i < sc->n; i++) {
        node_open(sc->nodes[i], 0, now);
        node_open(sc->nodes[i], 1, now);
    }
    sc->next_round_ms = now; /* ask as soon as connections are up */
    sc->replicas = replicas_new(f, "Sentinel");
    sc->replicas_told = -1;
    return sc;
}

void sentinel_ask_replica_acks(sentinel_client *sc)
{
    if (sc != NULL && !sc->closing) {
        replicas_ask_acks(sc->replicas);
    }
}

void sentinel_trigger(sentinel_client *sc)
{
    if (sc->closing) {
        return;
    }
    if (sc->round_open) {
        sc->round_again = 1;
        return;
    }
    sc->next_round_ms = 0;
}

void sentinel_tick(sentinel_client *sc, uint64_t now)
{
    const config *cfg = sc->f->cfg;
    if (sc->closing) {
        return;
    }
    replicas_tick(sc->replicas, now); /* may forget one */
    replicas_tell(sc);
    for (int i = 0; i < sc->n; i++) {
        sentinel_node *nd = sc->nodes[i];
        if (nd->cmd == NULL && now >= nd->next_connect_ms) {
            node_open(nd, 0, now);
        } else if (nd->cmd != NULL && !nd->cmd_up &&
                   now - nd->cmd_started_ms >= cfg->sentinel_timeout_ms) {
            sconn_close(nd->cmd, "connect timeout");
        } else if (nd->cmd != NULL && nd->asked_ms != 0 &&
                   now - nd->asked_ms >= cfg->sentinel_timeout_ms) {
            sconn_close(nd->cmd, "no answer within sentinel.timeout_ms");
        }
        if (nd->sub == NULL && now >= nd->next_connect_ms) {
            node_open(nd, 1, now);
        } else if (nd->sub != NULL && !sconn_up(nd->sub) &&
                   now - nd->sub_started_ms >= cfg->sentinel_timeout_ms) {
            sconn_close(nd->sub, "connect timeout");
        }
    }
    if (sc->round_open && now - sc->round_started_ms >= cfg->sentinel_timeout_ms) {
        round_evaluate(sc);
    }
    if (!sc->round_open && (now >= sc->next_round_ms || sc->round_again)) {
        int any = 0;
        for (int i = 0; i < sc->n; i++) {
            any |= sc->nodes[i]->cmd_up;
        }
        /* Right after start-up, wait for connections rather than report
         * everything unreachable. */
        if (any || now - sc->f->started_ms >= cfg->sentinel_timeout_ms || sc->round > 0) {
            round_start(sc, now);
        }
    }
}

void sentinel_close(sentinel_client *sc)
{
    if (sc == NULL || sc->closing) {
        return;
    }
    sc->closing = 1;
    replicas_close(sc->replicas);
    for (int i = 0; i < sc->n; i++) {
        sentinel_node *nd = sc->nodes[i];
        if (nd->resolving) {
            uv_cancel((uv_req_t *)&nd->gai); /* node_resolved_cb runs anyway */
        }
        if (nd->cmd != NULL) {
            sconn_close(nd->cmd, "ferry is stopping");
        }
        if (nd->sub != NULL) {
            sconn_close(nd->sub, "ferry is stopping");
        }
    }
}

void sentinel_free(sentinel_client *sc)
{
    if (sc == NULL) {
        return;
    }
    for (int i = 0; i < sc->n; i++) {
        free(sc->nodes[i]);
    }
    replicas_free(sc->replicas);
    free(sc);
}

int sentinel_known(const sentinel_client *sc)
{
    if (sc == NULL) {
        return 0;
    }
    return sc->known > 0 ? sc->known : sc->n; /* counted once by MYID after a round */
}

int sentinel_reachable(const sentinel_client *sc)
{
    return sc == NULL ? 0 : sc->reachable;
}

const replicas *sentinel_replicas(const sentinel_client *sc)
{
    return sc == NULL ? NULL : sc->replicas;
}

int sentinel_quorum_ok(const sentinel_client *sc)
{
    return sc != NULL && sc->quorum == 1;
}
