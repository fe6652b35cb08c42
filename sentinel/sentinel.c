/* sentinel.c - the Sentinel client. Talks to every configured sentinel (and
 * those it learns from SENTINEL SENTINELS) over hiredis' async API on libuv:
 * one connection polls SENTINEL MASTER, one listens to every event. A poll
 * round asks all sentinels at once; the master named by the answer with the
 * highest config epoch is accepted only if a majority of the sentinels that
 * answered name it and none of them reports it objectively down or failing
 * over. Events are hints that start a switch or a round early; the periodic
 * round is the truth. If no sentinel answers, ferry keeps its master. */
#include "sentinel.h"

#include <hiredis/adapters/libuv.h>
#include <hiredis/async.h>
#include <hiredis/hiredis.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "log.h"
#include "upstream.h"

#define SENTINEL_RECONNECT_MS 500
#define SENTINEL_DISCOVER_EVERY 10 /* rounds between SENTINEL SENTINELS */

typedef struct sentinel_node {
    sentinel_client *sc;          /* owner */
    char host[64];                /* address */
    int port;
    redisAsyncContext *cmd;       /* polling connection, NULL when down */
    redisAsyncContext *sub;       /* event connection, NULL when down */
    int cmd_up;                   /* cmd connected */
    int sub_up;                   /* sub connected */
    uint64_t cmd_started_ms;      /* cmd connect started */
    uint64_t sub_started_ms;      /* sub connect started */
    uint64_t next_connect_ms;     /* reconnect backoff */
    uint64_t asked_ms;            /* SENTINEL MASTER in flight since (0: none) */
    uint64_t asked_round;         /* round of the question in flight */
    uint64_t answered_round;      /* round of the last answer */
    int has_master;               /* last answer named a master */
    char ip[64];                  /* ... at this address */
    int mport;
    long long epoch;              /* its config epoch */
    int sdown, odown, failing;    /* its flags for that master */
    int learned;                  /* discovered, not configured */
} sentinel_node;

struct sentinel_client {
    ferry *f;                                /* context */
    sentinel_node *nodes[CONFIG_MAX_SENTINELS]; /* known sentinels */
    int n;
    uint64_t round;                          /* current poll round */
    uint64_t round_started_ms;
    int round_open;                          /* answers still expected */
    int round_again;                         /* a trigger arrived mid-round */
    uint64_t next_round_ms;                  /* next periodic round */
    int reachable;                           /* answered the last round */
    int all_down;                            /* none answered (logged once) */
    int closing;                             /* sentinel_close called */
};

static void node_connect(sentinel_node *nd, int sub, uint64_t now);
static void round_evaluate(sentinel_client *sc);
static void round_start(sentinel_client *sc, uint64_t now);

/* ---------------------------------------------------------------- nodes */

static sentinel_node *node_add(sentinel_client *sc, const char *host, int port, int learned)
{
    for (int i = 0; i < sc->n; i++) {
        if (sc->nodes[i]->port == port && strcmp(sc->nodes[i]->host, host) == 0) {
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
    nd->learned = learned;
    sc->nodes[sc->n++] = nd;
    if (learned) {
        log_info("sentinel: learned of sentinel %s:%d", host, port);
    }
    return nd;
}

static void auth_cb(redisAsyncContext *ac, void *reply, void *priv)
{
    sentinel_node *nd = priv;
    redisReply *r = reply;
    if (r != NULL && r->type == REDIS_REPLY_ERROR && !nd->sc->closing) {
        log_error("sentinel %s:%d refused ferry's credentials: %s", nd->host, nd->port, r->str);
    }
}

static void send_auth(sentinel_node *nd, redisAsyncContext *ac)
{
    const config *cfg = nd->sc->f->cfg;
    if (cfg->sentinel_password == NULL) {
        return;
    }
    if (cfg->sentinel_username != NULL) {
        redisAsyncCommand(ac, auth_cb, nd, "AUTH %s %s", cfg->sentinel_username,
                          cfg->sentinel_password);
    } else {
        redisAsyncCommand(ac, auth_cb, nd, "AUTH %s", cfg->sentinel_password);
    }
}

static void cmd_connect_cb(const redisAsyncContext *ac, int status)
{
    sentinel_node *nd = ac->data;
    if (status != REDIS_OK) {
        if (!nd->sc->closing) {
            log_debug("sentinel %s:%d: connect failed: %s", nd->host, nd->port, ac->errstr);
        }
        nd->cmd = NULL; /* hiredis frees it after this callback */
        nd->cmd_up = 0;
        return;
    }
    nd->cmd_up = 1;
    log_debug("sentinel %s:%d: connected", nd->host, nd->port);
}

static void cmd_disconnect_cb(const redisAsyncContext *ac, int status)
{
    sentinel_node *nd = ac->data;
    if (nd->cmd == ac) {
        nd->cmd = NULL;
        nd->cmd_up = 0;
        nd->asked_ms = 0;
        if (!nd->sc->closing) {
            log_info("sentinel %s:%d: connection lost", nd->host, nd->port);
        }
    }
}

static void sub_connect_cb(const redisAsyncContext *ac, int status)
{
    sentinel_node *nd = ac->data;
    if (status != REDIS_OK) {
        nd->sub = NULL;
        nd->sub_up = 0;
        return;
    }
    nd->sub_up = 1;
}

static void sub_disconnect_cb(const redisAsyncContext *ac, int status)
{
    sentinel_node *nd = ac->data;
    if (nd->sub == ac) {
        nd->sub = NULL;
        nd->sub_up = 0;
    }
}

/* Split s (modified) on spaces into at most max words. */
static int split_words(char *s, char **w, int max)
{
    int n = 0;
    char *save = NULL;
    for (char *t = strtok_r(s, " ", &save); t != NULL && n < max; t = strtok_r(NULL, " ", &save)) {
        w[n++] = t;
    }
    return n;
}

static int is_switch_event(const char *ev)
{
    static const char *const strong[] = {"+odown",        "+try-failover",   "+elected-leader",
                                         "+promoted-slave", "+switch-master", "+failover-end",
                                         "+convert-to-slave", "+reset-master", "+selected-slave",
                                         "+failover-end-for-timeout"};
    for (size_t i = 0; i < sizeof(strong) / sizeof(strong[0]); i++) {
        if (strcmp(ev, strong[i]) == 0) {
            return 1;
        }
    }
    return strncmp(ev, "+failover-state-", 16) == 0;
}

/* A Sentinel event: a hint that the master may be changing. */
static void event_cb(redisAsyncContext *ac, void *reply, void *priv)
{
    sentinel_node *nd = priv;
    sentinel_client *sc = nd->sc;
    redisReply *r = reply;
    if (r == NULL || sc->closing || r->type != REDIS_REPLY_ARRAY || r->elements != 4 ||
        r->element[0]->type != REDIS_REPLY_STRING || strcmp(r->element[0]->str, "pmessage") != 0 ||
        r->element[2]->type != REDIS_REPLY_STRING || r->element[3]->type != REDIS_REPLY_STRING) {
        return;
    }
    const char *ev = r->element[2]->str;
    if (ev[0] != '+' && ev[0] != '-') {
        return; /* __sentinel__:hello and the like */
    }
    char payload[512];
    char *w[16];
    snprintf(payload, sizeof(payload), "%s", r->element[3]->str);
    int nw = split_words(payload, w, 16);
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
    log_info("sentinel %s:%d: event %s %s", nd->host, nd->port, ev, r->element[3]->str);
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
        up->fence_valid = 0; /* a replica is (being) promoted */
    }
    char why[400];
    snprintf(why, sizeof(why), "Sentinel event %s %s", ev, r->element[3]->str);
    if (strcmp(ev, "+switch-master") == 0 && nw >= 5) {
        char to[300];
        snprintf(to, sizeof(to), "%s:%s", w[3], w[4]);
        if (strcmp(to, current) != 0) {
            upstream_switch(up, why);
        }
    } else if (is_switch_event(ev) && mentions) {
        upstream_switch(up, why);
    }
    sentinel_trigger(sc);
}

static void node_connect(sentinel_node *nd, int sub, uint64_t now)
{
    sentinel_client *sc = nd->sc;
    redisAsyncContext *ac = redisAsyncConnect(nd->host, nd->port);
    if (ac == NULL) {
        return;
    }
    if (ac->err) {
        log_debug("sentinel %s:%d: %s", nd->host, nd->port, ac->errstr);
        redisAsyncFree(ac);
        nd->next_connect_ms = now + SENTINEL_RECONNECT_MS;
        return;
    }
    ac->data = nd;
    if (redisLibuvAttach(ac, sc->f->loop) != REDIS_OK) {
        redisAsyncFree(ac);
        return;
    }
    if (sub) {
        nd->sub = ac;
        nd->sub_started_ms = now;
        redisAsyncSetConnectCallback(ac, sub_connect_cb);
        redisAsyncSetDisconnectCallback(ac, sub_disconnect_cb);
        send_auth(nd, ac);
        redisAsyncCommand(ac, event_cb, nd, "PSUBSCRIBE *");
    } else {
        nd->cmd = ac;
        nd->cmd_started_ms = now;
        redisAsyncSetConnectCallback(ac, cmd_connect_cb);
        redisAsyncSetDisconnectCallback(ac, cmd_disconnect_cb);
        send_auth(nd, ac);
    }
}

/* Drop a connection that stopped answering. Not called from its callbacks. */
static void node_drop(sentinel_node *nd, int sub, uint64_t now, const char *why)
{
    redisAsyncContext *ac = sub ? nd->sub : nd->cmd;
    if (ac == NULL) {
        return;
    }
    if (sub) {
        nd->sub = NULL;
        nd->sub_up = 0;
    } else {
        nd->cmd = NULL;
        nd->cmd_up = 0;
        nd->asked_ms = 0;
    }
    log_info("sentinel %s:%d: %s", nd->host, nd->port, why);
    nd->next_connect_ms = now + SENTINEL_RECONNECT_MS;
    redisAsyncFree(ac);
}

/* ---------------------------------------------------------------- rounds */

static void master_cb(redisAsyncContext *ac, void *reply, void *priv)
{
    sentinel_node *nd = priv;
    sentinel_client *sc = nd->sc;
    redisReply *r = reply;
    if (r == NULL || sc->closing) {
        return;
    }
    nd->asked_ms = 0;
    nd->answered_round = nd->asked_round;
    nd->has_master = 0;
    if (r->type == REDIS_REPLY_ARRAY) {
        const char *ip = NULL, *port = NULL, *epoch = NULL, *flags = NULL;
        for (size_t i = 0; i + 1 < r->elements; i += 2) {
            redisReply *k = r->element[i], *v = r->element[i + 1];
            if (k->type != REDIS_REPLY_STRING || v->type != REDIS_REPLY_STRING) {
                continue;
            }
            if (strcmp(k->str, "ip") == 0) {
                ip = v->str;
            } else if (strcmp(k->str, "port") == 0) {
                port = v->str;
            } else if (strcmp(k->str, "config-epoch") == 0) {
                epoch = v->str;
            } else if (strcmp(k->str, "flags") == 0) {
                flags = v->str;
            }
        }
        int p = port ? atoi(port) : 0;
        if (ip != NULL && p > 0 && p < 65536 && strlen(ip) < sizeof(nd->ip)) {
            nd->has_master = 1;
            snprintf(nd->ip, sizeof(nd->ip), "%s", ip);
            nd->mport = p;
            nd->epoch = epoch ? atoll(epoch) : 0;
            nd->sdown = flags && strstr(flags, "s_down") != NULL;
            nd->odown = flags && strstr(flags, "o_down") != NULL;
            nd->failing = flags && strstr(flags, "failover_in_progress") != NULL;
        } else {
            log_warn("sentinel %s:%d: SENTINEL MASTER reply without a usable address", nd->host,
                     nd->port);
        }
    } else if (r->type == REDIS_REPLY_ERROR) {
        log_warn("sentinel %s:%d: SENTINEL MASTER %s: %s", nd->host, nd->port,
                 sc->f->cfg->sentinel_master, r->str);
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

static void sentinels_cb(redisAsyncContext *ac, void *reply, void *priv)
{
    sentinel_node *nd = priv;
    redisReply *r = reply;
    if (r == NULL || nd->sc->closing || r->type != REDIS_REPLY_ARRAY) {
        return;
    }
    for (size_t i = 0; i < r->elements; i++) {
        redisReply *e = r->element[i];
        const char *ip = NULL, *port = NULL;
        if (e->type != REDIS_REPLY_ARRAY) {
            continue;
        }
        for (size_t j = 0; j + 1 < e->elements; j += 2) {
            if (e->element[j]->type != REDIS_REPLY_STRING ||
                e->element[j + 1]->type != REDIS_REPLY_STRING) {
                continue;
            }
            if (strcmp(e->element[j]->str, "ip") == 0) {
                ip = e->element[j + 1]->str;
            } else if (strcmp(e->element[j]->str, "port") == 0) {
                port = e->element[j + 1]->str;
            }
        }
        int p = port ? atoi(port) : 0;
        if (ip != NULL && p > 0 && p < 65536 && strlen(ip) < 64) {
            node_add(nd->sc, ip, p, 1);
        }
    }
}

static void round_start(sentinel_client *sc, uint64_t now)
{
    const config *cfg = sc->f->cfg;
    int asked = 0;
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
        if (redisAsyncCommand(nd->cmd, master_cb, nd, "SENTINEL MASTER %s",
                              cfg->sentinel_master) == REDIS_OK) {
            nd->asked_round = sc->round;
            nd->asked_ms = now;
            asked++;
            if (sc->round % SENTINEL_DISCOVER_EVERY == 1) {
                redisAsyncCommand(nd->cmd, sentinels_cb, nd, "SENTINEL SENTINELS %s",
                                  cfg->sentinel_master);
            }
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

/* Close a round: accept the master a majority of the answering sentinels
 * name (on a split, the one named at the highest config epoch is logged),
 * unless one of them sees it objectively down or failing over. */
static void round_evaluate(sentinel_client *sc)
{
    upstream *up = sc->f->up;
    sentinel_node *best = NULL, *top = NULL;
    int replies = 0, best_votes = 0, odown = 0, failing = 0, sdown = 0;

    sc->round_open = 0;
    for (int i = 0; i < sc->n; i++) {
        sentinel_node *nd = sc->nodes[i];
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
            votes += o->answered_round == sc->round && o->has_master && same_master(o, nd);
        }
        if (votes > best_votes || (votes == best_votes && best != NULL && nd->epoch > best->epoch)) {
            best = nd;
            best_votes = votes;
        }
    }
    sc->reachable = replies;
    if (replies == 0) {
        if (!sc->all_down) {
            log_warn("sentinel: all %d sentinel(s) unreachable; keeping master %s (%s)", sc->n,
                     up->epoch > 0 ? up->name : "none", upstream_state_name(up->state));
            sc->all_down = 1;
        }
        if (!up->target_set && up->epoch > 0) {
            /* Nobody to ask: go on with the last master Sentinel named, as
             * long as it says ROLE master itself. */
            log_warn("sentinel: no sentinel reachable; retrying the last known master %s",
                     up->name);
            up->target_set = 1;
        }
        return;
    }
    if (sc->all_down) {
        log_info("sentinel: %d of %d sentinel(s) reachable again", replies, sc->n);
        sc->all_down = 0;
    }
    if (best == NULL) {
        log_warn("sentinel: no sentinel knows master '%s'", sc->f->cfg->sentinel_master);
        return;
    }
    for (int i = 0; i < sc->n; i++) {
        sentinel_node *nd = sc->nodes[i];
        if (nd->answered_round == sc->round && nd->has_master && same_master(nd, best)) {
            odown += nd->odown;
            failing += nd->failing;
            sdown += nd->sdown;
        }
    }
    char name[300];
    snprintf(name, sizeof(name), strchr(best->ip, ':') ? "[%s]:%d" : "%s:%d", best->ip,
             best->mport);
    if (best_votes * 2 <= replies) {
        log_info("sentinel: no majority for a master yet (%s has %d of %d; highest config epoch "
                 "%lld names %s:%d)", name, best_votes, replies, top->epoch, top->ip, top->mport);
        return;
    }
    if (odown > 0 || failing > 0 || sdown * 2 > best_votes) {
        if (up->state == UP_UP && up->target_set && strcmp(up->name, name) == 0) {
            char why[400];
            snprintf(why, sizeof(why), "Sentinel reports master %s %s", name,
                     failing ? "failing over" : "down");
            upstream_switch(up, why);
        }
        return;
    }
    char why[200];
    snprintf(why, sizeof(why), "%d of %d sentinel(s) agree at config epoch %lld", best_votes,
             replies, best->epoch);
    upstream_set_master(up, best->ip, best->mport, why);
}

/* -------------------------------------------------------------- interface */

sentinel_client *sentinel_new(ferry *f)
{
    sentinel_client *sc = xcalloc(1, sizeof(*sc));
    sc->f = f;
    for (int i = 0; i < f->cfg->nsentinels; i++) {
        const config_addr *a = &f->cfg->sentinels[i];
        node_add(sc, a->host, a->port, 0);
    }
    log_info("sentinel: following master '%s' through %d sentinel(s)", f->cfg->sentinel_master,
             sc->n);
    uint64_t now = uv_now(f->loop);
    for (int i = 0; i < sc->n; i++) {
        node_connect(sc->nodes[i], 0, now);
        node_connect(sc->nodes[i], 1, now);
    }
    sc->next_round_ms = now; /* ask as soon as connections are up */
    return sc;
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
    for (int i = 0; i < sc->n; i++) {
        sentinel_node *nd = sc->nodes[i];
        if (nd->cmd == NULL && now >= nd->next_connect_ms) {
            node_connect(nd, 0, now);
        } else if (nd->cmd != NULL && !nd->cmd_up && now - nd->cmd_started_ms >= cfg->sentinel_timeout_ms) {
            node_drop(nd, 0, now, "connect timeout");
        } else if (nd->cmd != NULL && nd->asked_ms != 0 &&
                   now - nd->asked_ms >= cfg->sentinel_timeout_ms) {
            node_drop(nd, 0, now, "no answer within sentinel.timeout_ms");
        }
        if (nd->sub == NULL && now >= nd->next_connect_ms) {
            node_connect(nd, 1, now);
        } else if (nd->sub != NULL && !nd->sub_up && now - nd->sub_started_ms >= cfg->sentinel_timeout_ms) {
            node_drop(nd, 1, now, "event connection: connect timeout");
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
    for (int i = 0; i < sc->n; i++) {
        sentinel_node *nd = sc->nodes[i];
        redisAsyncContext *a = nd->cmd, *b = nd->sub;
        nd->cmd = nd->sub = NULL;
        if (a != NULL) {
            redisAsyncFree(a);
        }
        if (b != NULL) {
            redisAsyncFree(b);
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
    free(sc);
}

int sentinel_known(const sentinel_client *sc)
{
    return sc == NULL ? 0 : sc->n;
}

int sentinel_reachable(const sentinel_client *sc)
{
    return sc == NULL ? 0 : sc->reachable;
}
