/* multipop.c - cluster mode: a blocking pop over keys of several slots
 * (the priority pop). See multipop.h for what it promises.
 *
 * One context per call. Replies of the links only record what they
 * carried and wake the call's timer; every step (sending, answering,
 * cancelling, pushing back, closing links) is taken from the timer, never
 * inside a link's own callback (but the replicas_ack WAIT behind a write,
 * which goes on that very link at once: the link may be gone by the
 * step). The context lives until every command it
 * sent has answered (or its link was lost) and every item taken for
 * nobody is back.
 *
 * durability.replicas_ack (as for a single-slot pop, fence.c): a reply
 * that took an item out of Redis is followed by a WAIT on the link that
 * carried it, and so is each put-back. The client's item is held until
 * the WAIT confirms it, then delivered; unconfirmed (fewer replicas within
 * durability.replicas_ack_hold_ms, WAIT refused, the link lost) it is
 * delivered all the same: data taken out of Redis is never replaced by an
 * error. A put-back unconfirmed is left where it is (logged); one whose
 * link was lost before its WAIT answered is pushed again (at least once,
 * as a push lost with its link). */
#include "multipop.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "clustermap.h"
#include "fence.h"
#include "link.h"
#include "log.h"
#include "resp.h"
#include "slot.h"
#include "upstream.h"

#define MP_RETRY_MS 20  /* a slot without a master, a redirect: asked again after */
#define MP_UNBLOCK_MS 2 /* a pop not blocked yet when cancelled: UNBLOCK again after */

typedef enum mp_kind { MP_LEFT = 0, MP_RIGHT, MP_ZMIN, MP_ZMAX } mp_kind;

/* The call's phases (mp_set_phase is the one setter):
 *   TRY -> BLOCK | DONE,  BLOCK -> DONE */
typedef enum mp_phase { MP_TRY = 0, MP_BLOCK, MP_DONE } mp_phase;

/* What a reply answers (a ticket's op). */
enum { OP_TRY = 0, OP_ID, OP_POP, OP_UNBLOCK, OP_PUSH, OP_ACK };

/* The replicas_ack WAIT behind a pop that took an item, or a put-back. */
enum { ACK_NONE = 0, ACK_OUT, ACK_DONE };
typedef struct mp_ack {
    int state;         /* ACK_* */
    fence_outcome out; /* ACK_DONE: how it ended */
    long long acked;   /* ACK_DONE: replicas that confirmed */
    int need;          /* replicas it asks for (its shard's replicas_ack) */
} mp_ack;

/* An item taken for nobody, to put back. */
typedef struct mp_item {
    int key;              /* index in the call's keys */
    char *val;            /* the value (a list) or the member (a sorted set) */
    size_t nval;          /* its length */
    char score[64];       /* a sorted set's score */
    int out;              /* its push is in flight */
    int back;             /* it is back in place */
    uint64_t since;       /* when it was taken */
    uint64_t retry_at;    /* not pushed again before */
    struct upstream *ask; /* an ASK named this node: pushed there once */
    char why[160];        /* why its last push failed */
    mp_ack ack;           /* the WAIT behind its push */
    struct mp_item *next;
} mp_item;

/* One slot's keys and its blocking pop. */
typedef struct mp_group {
    int slot;
    int *keys; /* indexes in the call's keys, in the client's order */
    int nkeys;
    link *l;            /* the dedicated link its pop is on; NULL none */
    long long redis_id; /* that link's client id on Redis, 0 unknown */
    int out;            /* its pop is in flight */
    int finished;       /* its pop ended (an item, nil, an error) or is given up */
    int cancel;         /* cancel it (the call is answered) */
    int unblock_out;    /* a CLIENT UNBLOCK for it is in flight */
    int no_unblock;     /* Redis refused CLIENT ID or UNBLOCK: cancelled by closing */
    uint64_t retry_at;  /* not sent (or unblocked) again before */
    upstream *ask;      /* an ASK named this node: sent there once */
    mp_ack ack;         /* the WAIT behind its pop's item: its link is kept until it answers */
    /* Its pop's last reply, recorded by the link's callback; read by the
     * step: 0 none, else what came. */
    int got;
    buf reply;
} mp_group;

enum { GOT_NONE = 0, GOT_REPLY, GOT_LOST };

typedef struct multipop {
    ferry *f;
    request *r; /* the client's call; NULL once answered */
    void (*resume)(session *s);
    uint64_t sid;
    mp_kind kind;
    int proto;
    int nkeys;
    char **key;
    size_t *klen;
    int *kslot;
    uint64_t deadline;   /* uv_now() the call times out, 0: never */
    uint64_t hold_since; /* a slot without a master since, 0 none */
    mp_phase phase;
    int next;          /* TRY: the key asked */
    int try_out;       /* TRY: its pop in flight */
    int try_got;       /* TRY: GOT_* */
    buf try_reply;     /* TRY: the reply */
    uint64_t try_at;   /* TRY: not asked again before */
    upstream *try_ask; /* TRY: an ASK named this node: asked there once */
    upstream *try_up;  /* TRY: the view its pop went to */
    mp_ack try_ack;    /* TRY: the WAIT behind the pop that took an item */
    mp_ack *held_ack;  /* the client's item waits for this WAIT; NULL none */
    buf held_reply;    /* that item's reply */
    mp_group *g;
    int ngroups;
    mp_item *items; /* taken for nobody, to put back */
    ident *who;     /* client.auth redis: the client's user (its pops run as it), NULL:
                       ferry's own; held, with its identities on other views (held[]) */
    ident **held;
    int nheld;
    int refs;    /* commands out (each has a ticket) */
    int closing; /* the timer handle is closing: freed in its callback */
    uv_timer_t timer;
} multipop;

typedef struct mp_ticket {
    multipop *mp;
    int op;
    int group;     /* OP_ID, OP_POP, OP_UNBLOCK, OP_ACK: the group (OP_ACK: -1 none) */
    mp_item *item; /* OP_PUSH, OP_ACK of a put-back */
    mp_ack *ack;   /* OP_ACK */
} mp_ticket;

static void mp_step(multipop *mp);
static void mp_done(link *l, request *q, const char *p, size_t n);

/* The connection id in HELLO's answer (a map or a flat array whose key
 * "id" is followed by an integer), 0 if none. */
static long long hello_id(const char *p, size_t n)
{
    static const char key[] = "\r\n$2\r\nid\r\n:";
    const size_t klen = sizeof(key) - 1;
    for (size_t i = 0; i + klen < n; i++) {
        if (memcmp(p + i, key, klen) == 0) {
            return strtoll(p + i + klen, NULL, 10);
        }
    }
    return 0;
}

/* --------------------------------------------------------------- helpers */

/* Who the call's pops run as on view up: the client's Redis user
 * (client.auth redis), on every shard, so a pop reaches no key its ACL
 * forbids; NULL: ferry's own. CLIENT UNBLOCK and the push back of an item
 * taken for nobody are ferry's own (the user took the item). */
static ident *mp_who(multipop *mp, upstream *up)
{
    if (mp->who == NULL) {
        return NULL;
    }
    ident *id = upstream_ident_on(up, mp->who);
    if (id == mp->who) {
        return id;
    }
    for (int i = 0; i < mp->nheld; i++) {
        if (mp->held[i] == id) {
            return id;
        }
    }
    mp->held = xrealloc(mp->held, (size_t)(mp->nheld + 1) * sizeof(*mp->held));
    upstream_ident_hold(id);
    mp->held[mp->nheld++] = id;
    return id;
}

int multipop_handles(const command *cmd)
{
    return cmd != NULL &&
           (strcmp(cmd->name, "blpop") == 0 || strcmp(cmd->name, "brpop") == 0 ||
            strcmp(cmd->name, "bzpopmin") == 0 || strcmp(cmd->name, "bzpopmax") == 0);
}

static void mp_set_phase(multipop *mp, mp_phase ph)
{
    static const unsigned legal[] = {
        [MP_TRY] = 1u << MP_BLOCK | 1u << MP_DONE,
        [MP_BLOCK] = 1u << MP_DONE,
        [MP_DONE] = 0,
    };
    if (mp->phase == ph) {
        return;
    }
    ferry_assert(legal[mp->phase] & (1u << ph));
    mp->phase = ph;
}

static void mp_timer_cb(uv_timer_t *t)
{
    mp_step(t->data);
}

/* Run the step after delay ms (0: at the next loop turn). An earlier
 * wake-up wins over a later one. */
static void mp_wake(multipop *mp, uint64_t delay)
{
    if (mp->closing) {
        return;
    }
    if (uv_is_active((uv_handle_t *)&mp->timer) && uv_timer_get_due_in(&mp->timer) <= delay) {
        return;
    }
    uv_timer_start(&mp->timer, mp_timer_cb, delay, 0);
}

static const char *const pop_name[] = {"LPOP", "RPOP", "ZPOPMIN", "ZPOPMAX"};
static const char *const bpop_name[] = {"BLPOP", "BRPOP", "BZPOPMIN", "BZPOPMAX"};

static int starts(const char *p, size_t n, const char *w)
{
    size_t m = strlen(w);
    return n >= m && memcmp(p, w, m) == 0;
}

/* Reads "-MOVED slot host:port" or "-ASK slot host:port" (word: "MOVED"
 * or "ASK"). Returns 1 with host and *port set. */
static int mp_redirect(const char *p, size_t n, const char *word, char *host, size_t hlen,
                       int *port)
{
    char text[200], h[128], fmt[40];
    int slot;
    size_t m = n < sizeof(text) - 1 ? n : sizeof(text) - 1;
    memcpy(text, p, m);
    text[m] = '\0';
    snprintf(fmt, sizeof(fmt), "-%s %%d %%127[^ \r\n]", word);
    if (sscanf(text, fmt, &slot, h) != 2) {
        return 0;
    }
    char *colon = strrchr(h, ':');
    if (colon == NULL || sscanf(colon + 1, "%d", port) != 1 || *port <= 0 || *port >= 65536) {
        return 0;
    }
    *colon = '\0';
    if (h[0] == '[') {
        memmove(h, h + 1, strlen(h));
        h[strcspn(h, "]")] = '\0';
    }
    snprintf(host, hlen, "%s", h);
    return 1;
}

/* A reply that says nothing was applied and the same command may go
 * again: a redirect, a master in the middle of a switch. MOVED: the map
 * learns it; ASK: *ask is the view of the node to send it to once, after
 * ASKING (NULL: where the slot is served). */
static int mp_refused(multipop *mp, upstream *from, int slot, const char *p, size_t n,
                      upstream **ask)
{
    char host[128];
    int port;
    *ask = NULL;
    if (starts(p, n, "-MOVED ")) {
        if (mp_redirect(p, n, "MOVED", host, sizeof(host), &port)) {
            clustermap_moved(mp->f->cluster, from, slot, host, port);
        }
        return 1;
    }
    if (starts(p, n, "-ASK ")) {
        if (mp_redirect(p, n, "ASK", host, sizeof(host), &port)) {
            *ask = clustermap_ask(mp->f->cluster, from, host, port);
        }
        return 1;
    }
    if (starts(p, n, "-CLUSTERDOWN")) {
        clustermap_refresh(mp->f->cluster, "a node answered CLUSTERDOWN");
        return 1;
    }
    return starts(p, n, "-TRYAGAIN") || link_reply_not_master(p, n);
}

/* Where a command for slot goes now: the node an ASK named (once), else
 * the slot's master; NULL while it has none that takes commands. */
static upstream *mp_target(multipop *mp, int slot, upstream *ask)
{
    upstream *up = ask != NULL ? ask : clustermap_route(mp->f->cluster, slot);
    return up != NULL && up->state == UP_UP ? up : NULL;
}

/* ASKING on l, right before the command an ASK sends there. */
static void mp_asking(link *l)
{
    static const char *const asking[] = {"ASKING"};
    link_internal(l, asking, 1, NULL, 0);
}

static void mp_send(multipop *mp, link *l, int op, int group, mp_item *item, const buf *cmd)
{
    mp_ticket *t = xcalloc(1, sizeof(*t));
    t->mp = mp;
    t->op = op;
    t->group = group;
    t->item = item;
    mp->refs++;
    link_internal_bytes(l, buf_head(cmd), buf_used(cmd), mp_done, (long long)(intptr_t)t);
}

/* ---------------------------------------------------------------- replies */

/* A reply that took an item out of Redis (not nil, not empty, no error). */
static int mp_carries_item(const char *p, size_t n)
{
    return p != NULL && n > 0 && p[0] != '-' && !starts(p, n, "$-1\r\n") &&
           !starts(p, n, "*-1\r\n") && !starts(p, n, "_\r\n") && !starts(p, n, "*0\r\n");
}

static void mp_ack_done(void *arg, fence_outcome out, long long acked)
{
    mp_ticket *t = arg;
    multipop *mp = t->mp;
    mp->refs--;
    t->ack->state = ACK_DONE;
    t->ack->out = out;
    t->ack->acked = acked;
    if (out == FENCE_LOST && t->group >= 0) {
        /* Its group's link is closing (freed before the step runs). */
        mp->g[t->group].l = NULL;
        mp->g[t->group].redis_id = 0;
    }
    mp_item *it = t->item;
    if (it != NULL) {
        it->out = 0;
        if (out == FENCE_LOST) {
            /* Applied on a master whose link is gone: pushed again (at
             * least once), as a push lost with its link. */
            snprintf(it->why, sizeof(it->why), "its link was lost before its WAIT answered");
            it->retry_at = uv_now(mp->f->loop) + MP_RETRY_MS;
        } else {
            if (out == FENCE_UNCONFIRMED) {
                mp->f->stats.multipop_unconfirmed++;
                log_warn("priority pop: an item put back to key %.*s is confirmed by %lld of %d "
                         "replica(s) (durability.replicas_ack)",
                         (int)mp->klen[it->key], mp->key[it->key], acked, t->ack->need);
            }
            it->back = 1; /* dropped by the step */
        }
    }
    free(t);
    mp_wake(mp, 0);
}

/* With durability.replicas_ack on l's shard: a WAIT behind what l carried
 * (a pop that took an item, a put-back), its outcome in *ack. Sent from
 * the reply's callback: the link that carried the write may be gone by
 * the step. Returns 1 if it is out. */
static int mp_ack_start(multipop *mp, link *l, mp_ack *ack, int group, mp_item *item)
{
    if (l == NULL || l->up->replicas_ack <= 0 || l->state == LINK_CLOSING || mp->f->closed) {
        ack->state = ACK_NONE;
        return 0;
    }
    mp_ticket *t = xcalloc(1, sizeof(*t));
    t->mp = mp;
    t->op = OP_ACK;
    t->group = group;
    t->item = item;
    t->ack = ack;
    ack->state = ACK_OUT;
    ack->need = l->up->replicas_ack;
    mp->refs++;
    fence_confirm(l, mp_ack_done, t);
    return 1;
}

static void mp_done(link *l, request *q, const char *p, size_t n)
{
    mp_ticket *t = (mp_ticket *)(intptr_t)q->arg;
    multipop *mp = t->mp;
    mp->refs--;
    switch (t->op) {
    case OP_TRY:
        mp->try_out = 0;
        mp->try_got = p == NULL ? GOT_LOST : GOT_REPLY;
        buf_clear(&mp->try_reply);
        buf_append(&mp->try_reply, p, n);
        if (mp_carries_item(p, n)) {
            mp_ack_start(mp, l, &mp->try_ack, -1, NULL);
        }
        break;
    case OP_ID:
        if (p != NULL && n > 1 && p[0] == ':') {
            mp->g[t->group].redis_id = strtoll(p + 1, NULL, 10);
        } else if (p != NULL && n > 1 && (p[0] == '*' || p[0] == '%') && hello_id(p, n) > 0) {
            mp->g[t->group].redis_id = hello_id(p, n); /* a user's HELLO */
        } else if (p != NULL) {
            mp->g[t->group].no_unblock = 1; /* no id: its link is closed to cancel */
            char why[200];
            link_error_text(p, n, why, sizeof(why));
            log_warn("priority pop: CLIENT ID refused (%s): a cancelled pop's connection is "
                     "closed instead",
                     why);
        }
        break;
    case OP_POP: {
        mp_group *g = &mp->g[t->group];
        g->out = 0;
        g->got = p == NULL ? GOT_LOST : GOT_REPLY;
        buf_clear(&g->reply);
        buf_append(&g->reply, p, n);
        if (mp_carries_item(p, n)) {
            mp_ack_start(mp, l, &g->ack, t->group, NULL);
        }
        break;
    }
    case OP_UNBLOCK: {
        mp_group *g = &mp->g[t->group];
        g->unblock_out = 0;
        if (p != NULL && n > 0 && p[0] == '-') {
            g->no_unblock = 1; /* refused (ACL): its link is closed instead */
            char why[200];
            link_error_text(p, n, why, sizeof(why));
            log_warn("priority pop: CLIENT UNBLOCK refused (%s): a cancelled pop's connection is "
                     "closed instead",
                     why);
        } else if (p == NULL || !starts(p, n, ":1")) {
            /* Not blocked yet (or served already): asked again while its
             * pop is out. */
            g->retry_at = uv_now(mp->f->loop) + MP_UNBLOCK_MS;
        }
        break;
    }
    case OP_PUSH: {
        mp_item *it = t->item;
        it->out = 0;
        if (p != NULL && n > 0 && p[0] == ':') {
            mp->f->stats.multipop_put_back++;
            if (mp_ack_start(mp, l, &it->ack, -1, it)) {
                it->out = 1; /* back once its WAIT answers */
            } else {
                it->back = 1; /* dropped by the step */
            }
        } else {
            /* Lost with its link (applied or not: sent again, at least
             * once), refused for now (sent again), or refused for good
             * (WRONGTYPE: the key changed meanwhile): sent again within
             * upstream.hold_timeout_ms, then given up and logged. */
            snprintf(it->why, sizeof(it->why), "its link was lost");
            if (p != NULL) {
                link_error_text(p, n, it->why, sizeof(it->why));
                if (p[0] == '-' && !mp_refused(mp, l->up, mp->kslot[it->key], p, n, &it->ask)) {
                    log_error("priority pop: putting back an item of key %.*s refused: %s",
                              (int)mp->klen[it->key], mp->key[it->key], it->why);
                }
            }
            it->retry_at = uv_now(mp->f->loop) + (it->ask != NULL ? 0 : MP_RETRY_MS);
        }
        break;
    }
    default:
        break;
    }
    free(t);
    mp_wake(mp, 0);
}

/* -------------------------------------------------------------- answering */

/* The client's call gets p[0..n); r is gone after it. */
static void mp_answer(multipop *mp, const char *p, size_t n)
{
    request *r = mp->r;
    mp->r = NULL;
    session *s = r->s;
    if (s == NULL) {
        request_free(mp->f, r); /* its client left */
        return;
    }
    s->inflight--;
    if (s->inflight == 0) {
        s->flight_link = NULL;
    }
    s->f->session_ops->answer(s, r, p, n);
    s->f->session_ops->flush_answered(s);
    if (s->inflight == 0) {
        mp->resume(s);
    }
    s->f->session_ops->check_reading(s);
}

static void mp_answer_str(multipop *mp, const char *text)
{
    mp_answer(mp, text, strlen(text));
}

/* The call is still waiting for its answer (no item held for it) and
 * its client is there. */
static int mp_waiting(multipop *mp)
{
    if (mp->r != NULL && mp->r->s == NULL) {
        request_free(mp->f, mp->r); /* its client left: nobody to pop for */
        mp->r = NULL;
    }
    return mp->r != NULL && mp->held_ack == NULL;
}

/* The client's item p[0..n): answered now, or, while ack is out (the WAIT
 * behind the pop that took it), held until it answers (mp_release). */
static void mp_answer_item(multipop *mp, const char *p, size_t n, mp_ack *ack)
{
    if (ack->state == ACK_NONE) {
        mp_answer(mp, p, n);
        return;
    }
    buf_clear(&mp->held_reply);
    buf_append(&mp->held_reply, p, n);
    mp->held_ack = ack;
}

/* The held item goes to the client once its WAIT answered (force: now,
 * ferry is closing). Confirmed or not, it is delivered: taken out of
 * Redis, it is never replaced by an error. */
static void mp_release(multipop *mp, int force)
{
    mp_ack *ack = mp->held_ack;
    if (ack == NULL || (ack->state == ACK_OUT && !force)) {
        return;
    }
    if (ack->state != ACK_DONE || ack->out != FENCE_CONFIRMED) {
        mp->f->stats.replies_unconfirmed++;
        mp->f->stats.multipop_unconfirmed++;
        log_warn("priority pop: releasing an item although %lld of %d replica(s) confirmed it%s",
                 ack->state == ACK_DONE ? ack->acked : 0, ack->need,
                 ack->state != ACK_DONE   ? " (ferry closing)"
                 : ack->out == FENCE_LOST ? " (its link was lost)"
                                          : "");
    }
    mp->held_ack = NULL;
    if (mp->r != NULL && mp->r->s != NULL) {
        mp_answer(mp, buf_head(&mp->held_reply), buf_used(&mp->held_reply));
    } else if (mp->r != NULL) {
        request_free(mp->f, mp->r); /* its client left meanwhile */
        mp->r = NULL;
    }
    buf_free(&mp->held_reply);
    buf_init(&mp->held_reply);
}

static void mp_keep_item(multipop *mp, int key, const char *val, size_t nval, const char *score,
                         size_t nscore)
{
    mp_item *it = xcalloc(1, sizeof(*it));
    it->key = key;
    it->val = xmalloc(nval > 0 ? nval : 1);
    memcpy(it->val, val, nval);
    it->nval = nval;
    if (score != NULL) {
        size_t m = nscore < sizeof(it->score) - 1 ? nscore : sizeof(it->score) - 1;
        memcpy(it->score, score, m);
    }
    it->since = uv_now(mp->f->loop);
    it->next = mp->items;
    mp->items = it;
    log_info("priority pop: an item of key %.*s taken by a cancelled pop goes back",
             (int)mp->klen[key], mp->key[key]);
}

static int mp_key_index(multipop *mp, const mp_group *g, const char *k, size_t n)
{
    for (int i = 0; i < g->nkeys; i++) {
        int ki = g->keys[i];
        if (mp->klen[ki] == n && memcmp(mp->key[ki], k, n) == 0) {
            return ki;
        }
    }
    return -1;
}

/* ------------------------------------------------------------- phase TRY */

/* The reply to the non-blocking pop of key mp->next. */
static void mp_try_reply(multipop *mp)
{
    const char *p = buf_head(&mp->try_reply);
    size_t n = buf_used(&mp->try_reply);
    int k = mp->next;
    uint64_t now = uv_now(mp->f->loop);
    mp->try_got = GOT_NONE;
    if (p == NULL || n == 0) {
        return;
    }
    if (p[0] == '-') {
        if (mp_refused(mp, mp->try_up, mp->kslot[k], p, n, &mp->try_ask)) {
            if (mp->hold_since == 0) {
                mp->hold_since = now; /* refused until the hold bound */
            }
            mp->try_at = mp->try_ask != NULL ? now : now + MP_RETRY_MS;
            return;
        }
        if (mp_waiting(mp)) {
            mp_answer(mp, p, n); /* WRONGTYPE...: as Redis answers it */
        }
        mp_set_phase(mp, MP_DONE);
        return;
    }
    mp->hold_since = 0;
    redisReply *rep = link_parse_reply(p, n);
    if (rep == NULL) {
        mp->try_at = now + MP_RETRY_MS;
        return;
    }
    buf out;
    buf_init(&out);
    int item = 0;
    if ((mp->kind == MP_LEFT || mp->kind == MP_RIGHT) && rep->type == REDIS_REPLY_STRING) {
        buf_append_count(&out, '*', 2);
        buf_append_bulk(&out, mp->key[k], mp->klen[k]);
        buf_append_bulk(&out, rep->str, rep->len);
        item = 1;
    } else if ((mp->kind == MP_ZMIN || mp->kind == MP_ZMAX) && rep->type == REDIS_REPLY_ARRAY &&
               rep->elements == 2 && rep->element[0]->type == REDIS_REPLY_STRING &&
               rep->element[1]->type == REDIS_REPLY_STRING) {
        buf_append_count(&out, '*', 3);
        buf_append_bulk(&out, mp->key[k], mp->klen[k]);
        buf_append_bulk(&out, rep->element[0]->str, rep->element[0]->len);
        if (mp->proto == 3) {
            buf_append(&out, ",", 1);
            buf_append(&out, rep->element[1]->str, rep->element[1]->len);
            buf_append(&out, "\r\n", 2);
        } else {
            buf_append_bulk(&out, rep->element[1]->str, rep->element[1]->len);
        }
        item = 1;
    }
    if (item) {
        if (mp_waiting(mp)) {
            mp_answer_item(mp, buf_head(&out), buf_used(&out), &mp->try_ack);
        } else if (mp->kind == MP_ZMIN || mp->kind == MP_ZMAX) {
            mp_keep_item(mp, k, rep->element[0]->str, rep->element[0]->len, rep->element[1]->str,
                         rep->element[1]->len);
        } else {
            mp_keep_item(mp, k, rep->str, rep->len, NULL, 0);
        }
        mp_set_phase(mp, MP_DONE);
    } else {
        mp->next++; /* empty: the next key in the client's order */
    }
    buf_free(&out);
    freeReplyObject(rep);
}

static void mp_try(multipop *mp, uint64_t now)
{
    if (mp->try_got != GOT_NONE) {
        if (mp->try_got == GOT_LOST) {
            mp->try_got = GOT_NONE;
            mp->try_at = now + MP_RETRY_MS;
        } else {
            mp_try_reply(mp);
        }
    }
    if (mp->phase != MP_TRY || mp->try_out) {
        return;
    }
    if (!mp_waiting(mp)) {
        mp_set_phase(mp, MP_DONE);
        return;
    }
    if (mp->next >= mp->nkeys) {
        mp_set_phase(mp, MP_BLOCK); /* every key empty: block on each slot */
        return;
    }
    if (now < mp->try_at) {
        mp_wake(mp, mp->try_at - now);
        return;
    }
    int k = mp->next;
    upstream *up = mp_target(mp, mp->kslot[k], mp->try_ask);
    link *l = up != NULL ? upstream_shared(up, mp_who(mp, up), mp->sid, mp->proto) : NULL;
    if (l == NULL) {
        if (mp->hold_since == 0) {
            mp->hold_since = now;
        }
        mp->try_ask = NULL; /* where the slot is served, next time */
        mp->try_at = now + MP_RETRY_MS;
        mp_wake(mp, MP_RETRY_MS);
        return;
    }
    if (mp->try_ask != NULL) {
        mp_asking(l);
        mp->try_ask = NULL;
    }
    mp->try_up = up;
    buf cmd;
    buf_init(&cmd);
    buf_append_count(&cmd, '*', 2);
    buf_append_bulk(&cmd, pop_name[mp->kind], strlen(pop_name[mp->kind]));
    buf_append_bulk(&cmd, mp->key[k], mp->klen[k]);
    mp->try_out = 1;
    mp_send(mp, l, OP_TRY, 0, NULL, &cmd);
    buf_free(&cmd);
}

/* ----------------------------------------------------------- phase BLOCK */

/* g is done with its link: back to the pool when it is clean (nothing in
 * flight on it, no CLIENT UNBLOCK for it still on its way: that one could
 * end the next borrower's call), else closed. */
static void mp_close_link(multipop *mp, mp_group *g, int reuse, const char *why)
{
    if (g->ack.state == ACK_OUT && !mp->f->closed) {
        return; /* the WAIT behind its item first: closed once it answered */
    }
    if (g->l != NULL) {
        link *l = g->l;
        g->l = NULL;
        g->redis_id = 0;
        if (l->state == LINK_CLOSING) {
            return;
        }
        if (reuse && !g->unblock_out && !g->out && !mp->f->closed && !mp->f->stopping) {
            upstream_put_back(l, why);
        } else {
            link_close(l, why);
        }
    }
}

/* Group gi's blocking pop answered p[0..n). */
static void mp_pop_reply(multipop *mp, int gi, uint64_t now)
{
    mp_group *g = &mp->g[gi];
    const char *p = buf_head(&g->reply);
    size_t n = buf_used(&g->reply);
    if (n > 0 && p[0] == '-') {
        upstream *from = g->l != NULL ? g->l->up : NULL;
        if (mp_refused(mp, from, g->slot, p, n, &g->ask)) {
            /* A redirect leaves its link as it was; a master that is not
             * one any more, not. */
            int redirect = p[1] == 'M' || p[1] == 'A';
            mp_close_link(mp, g, redirect, "priority pop: its master changed");
            g->retry_at = g->ask != NULL ? now : now + MP_RETRY_MS;
            return; /* sent again (cancelled: ended) */
        }
        g->finished = 1;
        if (!g->cancel && mp_waiting(mp)) {
            mp_answer(mp, p, n); /* WRONGTYPE...: as Redis answers it */
        }
        return;
    }
    redisReply *rep = link_parse_reply(p, n);
    int item = rep != NULL && rep->type == REDIS_REPLY_ARRAY && rep->elements >= 2 &&
               rep->element[0]->type == REDIS_REPLY_STRING &&
               rep->element[1]->type == REDIS_REPLY_STRING;
    g->finished = 1;
    if (item && mp_waiting(mp)) {
        mp_answer_item(mp, p, n, &g->ack); /* the first item wins: as Redis gave it */
    } else if (item) {
        int k = mp_key_index(mp, g, rep->element[0]->str, rep->element[0]->len);
        if (k < 0) {
            log_error("priority pop: an item of an unknown key %.*s cannot go back",
                      (int)rep->element[0]->len, rep->element[0]->str);
        } else if ((mp->kind == MP_ZMIN || mp->kind == MP_ZMAX) && rep->elements >= 3 &&
                   rep->element[2]->type == REDIS_REPLY_STRING) {
            mp_keep_item(mp, k, rep->element[1]->str, rep->element[1]->len, rep->element[2]->str,
                         rep->element[2]->len);
        } else if (mp->kind == MP_LEFT || mp->kind == MP_RIGHT) {
            mp_keep_item(mp, k, rep->element[1]->str, rep->element[1]->len, NULL, 0);
        } else {
            log_error("priority pop: an item of key %.*s without its score cannot go back",
                      (int)rep->element[0]->len, rep->element[0]->str);
        }
    }
    if (rep != NULL) {
        freeReplyObject(rep);
    }
}

static void mp_send_pop(multipop *mp, int gi, upstream *up, uint64_t now)
{
    mp_group *g = &mp->g[gi];
    char timeout[64] = "0";
    if (mp->deadline != 0) {
        if (now + 1 >= mp->deadline) {
            g->finished = 1; /* its time ran out meanwhile */
            return;
        }
        snprintf(timeout, sizeof(timeout), "%.3f", (double)(mp->deadline - now) / 1000.0);
    }
    if (g->l == NULL) {
        g->l = upstream_borrow_as(up, mp_who(mp, up), mp->proto);
        if (g->l == NULL) {
            g->retry_at = now + MP_RETRY_MS;
            return;
        }
        g->redis_id = g->l->redis_id; /* known on a link from the pool */
    }
    if (g->redis_id <= 0) {
        buf id;
        buf_init(&id);
        /* HELLO (no argument) for a user, who may not run CLIENT ID. */
        static const char *const argv[] = {"CLIENT", "ID"};
        static const char *const hello[] = {"HELLO"};
        if (mp->who != NULL) {
            buf_append_argv(&id, 1, hello);
        } else {
            buf_append_argv(&id, 2, argv);
        }
        mp_send(mp, g->l, OP_ID, gi, NULL, &id);
        buf_free(&id);
    }
    if (g->ask != NULL) {
        mp_asking(g->l); /* the slot is migrating: this pop goes to the node it named */
        g->ask = NULL;
    }
    buf cmd;
    buf_init(&cmd);
    buf_append_count(&cmd, '*', (size_t)g->nkeys + 2);
    buf_append_bulk(&cmd, bpop_name[mp->kind], strlen(bpop_name[mp->kind]));
    for (int i = 0; i < g->nkeys; i++) {
        buf_append_bulk(&cmd, mp->key[g->keys[i]], mp->klen[g->keys[i]]);
    }
    buf_append_bulk(&cmd, timeout, strlen(timeout));
    g->out = 1;
    mp_send(mp, g->l, OP_POP, gi, NULL, &cmd);
    buf_free(&cmd);
}

static void mp_unblock(multipop *mp, int gi, uint64_t now)
{
    mp_group *g = &mp->g[gi];
    if (g->no_unblock && g->l != NULL && !g->unblock_out) {
        /* Redis refuses ferry CLIENT ID or UNBLOCK: closing the link ends
         * the pop (an item Redis served it at that very moment is lost
         * with the link). */
        mp_close_link(mp, g, 0, "priority pop cancelled");
        return;
    }
    if (g->unblock_out || g->l == NULL || now < g->retry_at) {
        mp_wake(mp, g->retry_at > now ? g->retry_at - now : MP_UNBLOCK_MS);
        return;
    }
    if (g->redis_id <= 0) {
        mp_wake(mp, MP_UNBLOCK_MS); /* its CLIENT ID first */
        return;
    }
    link *sh = upstream_shared(g->l->up, NULL, mp->sid, 2);
    if (sh == NULL) {
        mp_wake(mp, MP_RETRY_MS);
        return;
    }
    char id[32];
    snprintf(id, sizeof(id), "%lld", g->redis_id);
    const char *argv[] = {"CLIENT", "UNBLOCK", id, "TIMEOUT"};
    buf cmd;
    buf_init(&cmd);
    buf_append_argv(&cmd, 4, argv);
    g->unblock_out = 1;
    mp_send(mp, sh, OP_UNBLOCK, gi, NULL, &cmd);
    buf_free(&cmd);
}

static void mp_block(multipop *mp, uint64_t now)
{
    int waiting = mp_waiting(mp);
    for (int i = 0; i < mp->ngroups; i++) {
        mp_group *g = &mp->g[i];
        if (g->got != GOT_NONE) {
            int lost = g->got == GOT_LOST;
            g->got = GOT_NONE;
            if (lost) {
                g->l = NULL; /* closed: its pop is sent again on a new one */
                g->redis_id = 0;
                g->retry_at = now + MP_RETRY_MS;
            } else {
                mp_pop_reply(mp, i, now);
            }
            waiting = mp_waiting(mp);
        }
    }
    for (int i = 0; i < mp->ngroups; i++) {
        mp_group *g = &mp->g[i];
        g->cancel = !waiting;
        if (g->finished) {
            mp_close_link(mp, g, 1, "priority pop done");
            continue;
        }
        if (g->out) {
            if (g->cancel) {
                mp_unblock(mp, i, now);
            }
            continue;
        }
        if (g->cancel || (mp->deadline != 0 && now + 1 >= mp->deadline)) {
            g->finished = 1; /* not sent again: nobody waits for it, or its time ran out */
            mp_close_link(mp, g, 1, "priority pop done");
            continue;
        }
        if (now < g->retry_at) {
            mp_wake(mp, g->retry_at - now);
            continue;
        }
        upstream *up = mp_target(mp, g->slot, g->ask);
        if (up == NULL) {
            g->retry_at = now + MP_RETRY_MS; /* held for its master */
            g->ask = NULL;
            mp_close_link(mp, g, 1, "priority pop: its master changed");
            mp_wake(mp, MP_RETRY_MS);
            continue;
        }
        if (g->l != NULL && g->l->up != up) {
            mp_close_link(mp, g, 1, "priority pop: its slot moved");
        }
        mp_send_pop(mp, i, up, now);
        if (g->finished) {
            mp_close_link(mp, g, 1, "priority pop timed out");
        }
    }
    int open = 0;
    for (int i = 0; i < mp->ngroups; i++) {
        open += !mp->g[i].finished;
    }
    if (open == 0) {
        if (mp_waiting(mp)) {
            mp_answer_str(mp, session_null(mp->r->s, "*-1\r\n")); /* timed out */
        }
        mp_set_phase(mp, MP_DONE);
    } else if (mp_waiting(mp) && mp->deadline != 0) {
        /* Redis times each pop out; a pop held for its master has none. */
        mp_wake(mp, mp->deadline > now ? mp->deadline - now + 50 : 50);
    } else if (mp_waiting(mp)) {
        mp_wake(mp, 200); /* notice a client that left */
    }
}

/* ------------------------------------------------------------- putting back */

/* Items taken for nobody go back to the end they came from. Returns how
 * many are still to go back. */
/* p[0..n) for a log line: printable ASCII as it is, the rest as \xNN; the
 * first 256 bytes, "..." after them. */
static void mp_escape(const char *p, size_t n, char *out, size_t len)
{
    size_t o = 0;
    for (size_t i = 0; i < n && i < 256 && o + 5 < len; i++) {
        unsigned char c = (unsigned char)p[i];
        if (c >= 0x20 && c < 0x7f && c != '\\' && c != '"') {
            out[o++] = (char)c;
        } else {
            o += (size_t)snprintf(out + o, len - o, "\\x%02x", c);
        }
    }
    if (n > 256 && o + 4 <= len) {
        memcpy(out + o, "...", 3);
        o += 3;
    }
    out[o] = '\0';
}

static int mp_put_back(multipop *mp, uint64_t now)
{
    int left = 0;
    mp_item **pp = &mp->items;
    while (*pp != NULL) {
        mp_item *it = *pp;
        if (it->back) {
            *pp = it->next;
            free(it->val);
            free(it);
            continue;
        }
        pp = &it->next;
        left++;
        if (it->out) {
            continue;
        }
        if (now - it->since >= mp->f->cfg->hold_timeout_ms) {
            /* Given up: logged with the item, for an operator to push. */
            int z = mp->kind == MP_ZMIN || mp->kind == MP_ZMAX;
            char val[4 * 256 + 4];
            mp_escape(it->val, it->nval, val, sizeof(val));
            log_error("priority pop: an item taken by a cancelled pop could not go back to key "
                      "%.*s within upstream.hold_timeout_ms (%s): %s%s%s%zu bytes: \"%s\"",
                      (int)mp->klen[it->key], mp->key[it->key], it->why[0] ? it->why : "no master",
                      z ? "score " : "", z ? it->score : "", z ? ", " : "", it->nval, val);
            it->back = 1;
            left--;
            continue;
        }
        if (now < it->retry_at) {
            mp_wake(mp, it->retry_at - now);
            continue;
        }
        upstream *up = mp_target(mp, mp->kslot[it->key], it->ask);
        link *l = up != NULL ? upstream_shared(up, NULL, mp->sid, 2) : NULL;
        if (l == NULL) {
            it->ask = NULL;
            it->retry_at = now + MP_RETRY_MS;
            mp_wake(mp, MP_RETRY_MS);
            continue;
        }
        if (it->ask != NULL) {
            mp_asking(l);
            it->ask = NULL;
        }
        buf cmd;
        buf_init(&cmd);
        static const char *const push[] = {"LPUSH", "RPUSH", "ZADD", "ZADD"};
        int z = mp->kind == MP_ZMIN || mp->kind == MP_ZMAX;
        buf_append_count(&cmd, '*', z ? 4 : 3);
        buf_append_bulk(&cmd, push[mp->kind], strlen(push[mp->kind]));
        buf_append_bulk(&cmd, mp->key[it->key], mp->klen[it->key]);
        if (z) {
            buf_append_bulk(&cmd, it->score, strlen(it->score));
        }
        buf_append_bulk(&cmd, it->val, it->nval);
        it->out = 1;
        mp_send(mp, l, OP_PUSH, 0, it, &cmd);
        buf_free(&cmd);
    }
    return left;
}

/* ------------------------------------------------------------------ life */

static void mp_closed(uv_handle_t *h)
{
    multipop *mp = h->data;
    for (int i = 0; i < mp->nkeys; i++) {
        free(mp->key[i]);
    }
    free(mp->key);
    free(mp->klen);
    free(mp->kslot);
    for (int i = 0; i < mp->ngroups; i++) {
        free(mp->g[i].keys);
        buf_free(&mp->g[i].reply);
    }
    free(mp->g);
    while (mp->items != NULL) {
        mp_item *it = mp->items;
        mp->items = it->next;
        free(it->val);
        free(it);
    }
    buf_free(&mp->try_reply);
    /* (ferry closing: the views and their identities are freed with it) */
    for (int i = 0; i < mp->nheld && !mp->f->closed; i++) {
        upstream_ident_release(mp->held[i]->up, mp->held[i]);
    }
    free(mp->held);
    if (mp->who != NULL && !mp->f->closed) {
        upstream_ident_release(mp->who->up, mp->who);
    }
    buf_free(&mp->held_reply);
    free(mp);
}

/* ferry is closing (its links are closed, its map is gone): nothing is
 * sent any more; what could not go back is logged. */
static void mp_abandon(multipop *mp)
{
    mp_item **pp = &mp->items;
    while (*pp != NULL) {
        mp_item *it = *pp;
        if (it->out) {
            pp = &it->next; /* its ticket comes back first */
            continue;
        }
        *pp = it->next;
        if (!it->back) {
            log_error("priority pop: ferry closing: an item of key %.*s taken by a cancelled "
                      "pop could not go back (%zu bytes)",
                      (int)mp->klen[it->key], mp->key[it->key], it->nval);
        }
        free(it->val);
        free(it);
    }
    mp_release(mp, 1); /* an item taken for the client goes to it */
    if (mp_waiting(mp)) {
        mp_answer_str(mp, "-ERR ferry: stopping\r\n");
    }
    for (int i = 0; i < mp->ngroups; i++) {
        mp->g[i].finished = 1;
        mp_close_link(mp, &mp->g[i], 0, "ferry closing");
    }
    mp_set_phase(mp, MP_DONE);
    if (mp->refs == 0 && mp->items == NULL) {
        mp->closing = 1;
        uv_close((uv_handle_t *)&mp->timer, mp_closed);
    }
}

static void mp_step(multipop *mp)
{
    if (mp->closing) {
        return;
    }
    uint64_t now = uv_now(mp->f->loop);
    if (mp->f->closed) {
        mp_abandon(mp);
        return;
    }
    if (mp->phase == MP_TRY) {
        mp_try(mp, now);
        if (mp->phase == MP_TRY && mp->hold_since != 0 && mp_waiting(mp) &&
            now - mp->hold_since >= mp->f->cfg->hold_timeout_ms) {
            mp_answer_str(mp, "-TRYAGAIN ferry: no master for a key of the call\r\n");
            mp_set_phase(mp, MP_DONE);
        }
    }
    if (mp->phase == MP_BLOCK) {
        mp_block(mp, now);
    }
    mp_release(mp, 0);
    int items = mp_put_back(mp, now);
    if (mp->phase == MP_DONE) {
        for (int i = 0; i < mp->ngroups; i++) {
            if (!mp->g[i].out) {
                mp_close_link(mp, &mp->g[i], 1, "priority pop done");
            }
        }
    }
    if (mp->phase == MP_DONE && mp->refs == 0 && items == 0) {
        for (int i = 0; i < mp->ngroups; i++) {
            mp_close_link(mp, &mp->g[i], 1, "priority pop done");
        }
        if (mp->r != NULL) {
            mp_answer_str(mp, "-ERR ferry: the priority pop ended without an answer\r\n");
        }
        mp->closing = 1;
        uv_close((uv_handle_t *)&mp->timer, mp_closed);
    }
}

/* The timeout as Redis reads it (a float of seconds, >= 0); -1 refused. */
static int mp_timeout(const resp_arg *a, double *t)
{
    char tmp[64];
    if (a->len == 0 || a->len >= sizeof(tmp)) {
        return -1;
    }
    memcpy(tmp, a->ptr, a->len);
    tmp[a->len] = '\0';
    char *end;
    *t = strtod(tmp, &end);
    if (*end != '\0' || isnan(*t) || isinf(*t)) {
        return -1;
    }
    return 0;
}

void multipop_start(session *s, request *r, void (*resume)(session *s))
{
    ferry *f = s->f;
    resp_parser *pp = resp_parser_new(NULL);
    resp_request req;
    double t = 0;
    const char *refused = NULL;
    if (resp_parse_request(pp, buf_head(&r->data), buf_used(&r->data), &req) != RESP_OK ||
        req.argc < 3) {
        refused = "-ERR ferry: the call could not be read again\r\n";
    } else if (mp_timeout(&req.argv[req.argc - 1], &t) != 0) {
        refused = "-ERR timeout is not a float or out of range\r\n";
    } else if (t < 0) {
        refused = "-ERR timeout is negative\r\n";
    }
    if (refused != NULL) {
        resp_parser_free(pp);
        f->session_ops->answer_str(s, r, refused); /* as a node answers it */
        return;
    }
    r->s = s;
    r->sent_ns = uv_hrtime();
    request_set_state(r, REQ_SENT);
    s->inflight++;
    s->flight_link = NULL; /* in flight off any link */

    multipop *mp = xcalloc(1, sizeof(*mp));
    mp->f = f;
    mp->r = r;
    mp->resume = resume;
    mp->sid = s->id;
    mp->proto = s->proto;
    if (s->ident != NULL) {
        mp->who = s->ident;
        upstream_ident_hold(mp->who);
    }
    buf_init(&mp->try_reply);
    buf_init(&mp->held_reply);
    uv_timer_init(f->loop, &mp->timer);
    mp->timer.data = mp;
    const char *name = r->cmd->name;
    mp->kind = strcmp(name, "blpop") == 0      ? MP_LEFT
               : strcmp(name, "brpop") == 0    ? MP_RIGHT
               : strcmp(name, "bzpopmin") == 0 ? MP_ZMIN
                                               : MP_ZMAX;
    {
        mp->deadline = t > 0 ? uv_now(f->loop) + (uint64_t)(t * 1000.0 + 0.5) : 0;
        if (mp->deadline == uv_now(f->loop)) {
            mp->deadline++; /* under a millisecond: not forever */
        }
        mp->nkeys = (int)req.argc - 2;
        mp->key = xcalloc((size_t)mp->nkeys, sizeof(*mp->key));
        mp->klen = xcalloc((size_t)mp->nkeys, sizeof(*mp->klen));
        mp->kslot = xcalloc((size_t)mp->nkeys, sizeof(*mp->kslot));
        mp->g = xcalloc((size_t)mp->nkeys, sizeof(*mp->g));
        for (int i = 0; i < mp->nkeys; i++) {
            const resp_arg *a = &req.argv[i + 1];
            mp->key[i] = xmalloc(a->len > 0 ? a->len : 1);
            memcpy(mp->key[i], a->ptr, a->len);
            mp->klen[i] = a->len;
            mp->kslot[i] = slot_of_key(a->ptr, a->len);
            int gi = 0;
            while (gi < mp->ngroups && mp->g[gi].slot != mp->kslot[i]) {
                gi++;
            }
            if (gi == mp->ngroups) {
                mp->g[gi].slot = mp->kslot[i];
                mp->g[gi].keys = xcalloc((size_t)mp->nkeys, sizeof(int));
                buf_init(&mp->g[gi].reply);
                mp->ngroups++;
            }
            mp->g[gi].keys[mp->g[gi].nkeys++] = i;
        }
        log_debug("client %llu: %s over %d key(s) in %d slot(s)", (unsigned long long)s->id,
                  bpop_name[mp->kind], mp->nkeys, mp->ngroups);
    }
    resp_parser_free(pp);
    f->stats.multipop_calls++;
    mp_wake(mp, 0); /* answered from the loop, never inside the dispatch */
}
