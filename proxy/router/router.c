/* router.c - how each request of a session is served.
 *
 * Classification happens once, when a request is parsed: its command, if
 * it may write (scripts and functions count as writes unless read-only),
 * and its route. Dispatch walks the session's queue from the cursor, in
 * order: ferry answers AUTH/HELLO/QUIT/RESET and refusals itself; stateless
 * commands go to the shared link; a session holding connection state (a
 * blocking call, MULTI/WATCH, SELECT n, CLIENT SETNAME, a pub/sub tunnel)
 * uses its dedicated link. So does a script or function call, for its
 * duration (and its replicas_ack WAIT): one running past lua-time-limit
 * then holds only its own client, the others get Redis' -BUSY. A session never has requests in
 * flight on two links at once. With no master, requests stay held (backlog.c).
 *
 * A lost reply is retried by class (docs/failover.md, "Retry policy"): reads and
 * blocking calls are sent again (a blocking call with what is left of its
 * timeout); a refusal that applied nothing is sent again; a write whose
 * outcome is unknown is sent again (at-least-once), counted in
 * requests_retried_unknown. An open MULTI is rebuilt on the next link from
 * the commands Redis had queued; one under a WATCH that broke ends in the
 * null reply of a watch conflict (the transaction state machine: tx.c).
 *
 * Classification (router_classify, router_refuse) is router_classify.c's;
 * the r->arg encodings both files use are in router_int.h. HELLO, AUTH and
 * the connection settings kept from link to link are router_local.c's. */
#include "router.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "acl.h"
#include "backlog.h"
#include "bracket.h"
#include "broadcast.h"
#include "clients.h"
#include "clustermap.h"
#include "fence.h"
#include "guards.h"
#include "keyspace.h"
#include "lease.h"
#include "link.h"
#include "log.h"
#include "multipop.h"
#include "outage.h"
#include "router_int.h"
#include "router_local.h"
#include "router_pubsub.h"
#include "receipts.h"
#include "scripts.h"
#include "split.h"
#include "standin.h"
#include "tx.h"
#include "upstream.h"
#include "xreads.h"

#define ROUTER_MAX_RETRIES 3

enum { DISPATCH_ON = -1, DISPATCH_DONE = 0, DISPATCH_WAIT, DISPATCH_DOWN };

static int router_pinned(const session *s);
static void tracking_flush(session *s, const char *why);

/* ------------------------------------------------------------------ states */

/* The one setter of s->tunnel: NONE -> PUBSUB | OTHER, PUBSUB <-> PUBSUB_LOST,
 * anything -> NONE (RESET). */
static void router_set_tunnel(session *s, tunnel_state st)
{
    static const unsigned legal[] = {
        [TUN_NONE] = 1u << TUN_PUBSUB | 1u << TUN_OTHER,
        [TUN_PUBSUB] = 1u << TUN_PUBSUB_LOST,
        [TUN_PUBSUB_LOST] = 1u << TUN_PUBSUB,
        [TUN_OTHER] = 0,
    };
    if (s->tunnel == st) {
        return;
    }
    ferry_assert(st == TUN_NONE || (legal[s->tunnel] & (1u << st)));
    s->tunnel = st;
}

int router_link_bound(const session *s)
{
    return router_holds_state(s) || s->sticky || s->tunnel != TUN_NONE;
}

static int router_pinned(const session *s)
{
    return s->db != 0 || s->sticky || s->tunnel != TUN_NONE ||
           (s->tx != TX_NONE && s->tx != TX_WATCH_LOST && s->tx != TX_MULTI_WATCH_LOST);
}

void router_restore(session *s, const session_import *im)
{
    s->proto = im->proto;
    s->db = im->db;
    s->sticky = im->sticky;
    if (im->nsettings > 0) {
        buf_append(&session_extra_w(s)->sticky_log, im->settings, im->nsettings);
    }
    s->tracking = im->tracking;
    if (s->tracking) {
        tracking_flush(s, "taken over from another ferry process");
    }
    if (im->pubsub) {
        router_set_tunnel(s, TUN_PUBSUB);
        router_set_tunnel(s, TUN_PUBSUB_LOST); /* no link yet: subscribed again */
    }
}

void router_release_call(session *s, request *r)
{
    ferry_assert(r->s == s && r->state == REQ_SENT && s->inflight == 1);
    s->f->session_ops->unlink(s, r);
    s->pending_bytes -=
        buf_used(&r->data) <= s->pending_bytes ? buf_used(&r->data) : s->pending_bytes;
    s->inflight = 0;
    s->flight_link = NULL;
    r->s = NULL;
}

void router_forget(session *s)
{
    tx_forget(s);
    acl_forget(s);
}

/* ---------------------------------------------------------- local answers */

/* RESET: the connection goes back to a fresh one (db 0, no transaction,
 * no subscriptions, not authenticated when a password is set). */
static void do_reset(session *s, request *r)
{
    int stateful = s->db != 0 || s->sticky || s->tunnel != TUN_NONE || s->tx != TX_NONE;
    upstream_return(s->f->up, s, !stateful, "client reset its connection");
    s->db = 0;
    s->sticky = 0;
    tx_set(s, TX_NONE);
    router_set_tunnel(s, TUN_NONE);
    sub_sets_free(s->subs);
    s->subs = NULL;
    if (s->extra != NULL) {
        s->extra->ps_homed = 0;
        s->extra->ps_left = NULL;
        s->extra->ps_sunsub_owed = 0;
        buf_free(&s->extra->sticky_log);
    }
    s->authed = s->f->cfg->client_password == NULL && s->f->cfg->client_auth != CLIENT_AUTH_REDIS;
    acl_forget(s); /* client.auth redis: authenticate again, as Redis' default user would */
    s->proto = 2;  /* RESET goes back to RESP2, as on Redis */
    s->tracking = 0;
    s->f->session_ops->answer_str(s, r, "+RESET\r\n");
}

/* ----------------------------------------------------- connection settings */

/* Rebuild a pub/sub tunnel on the current master. Returns 0 when no master
 * is UP yet (try again on wake-up). */
static int router_resubscribe(session *s)
{
    upstream *up = router_pubsub_view(s);
    link *l = up != NULL ? router_lend(s, up) : NULL;
    if (l == NULL) {
        return 0;
    }
    if (s->extra != NULL) {
        s->extra->ps_left = NULL;
        s->extra->ps_sunsub_owed = 0; /* a new link owes no reply */
    }
    buf b;
    buf_init(&b);
    if (s->subs == NULL) {
        s->subs = sub_sets_new(); /* nothing to re-subscribe: the tunnel stays open */
    }
    const sub_sets *ss = s->subs;
    if (ss->channels.n > 0) {
        subs_encode(&b, "SUBSCRIBE", &ss->channels);
    }
    if (ss->patterns.n > 0) {
        subs_encode(&b, "PSUBSCRIBE", &ss->patterns);
    }
    if (ss->shards.n > 0) {
        subs_encode(&b, "SSUBSCRIBE", &ss->shards);
    }
    l->passthrough = s->proto == 2; /* RESP3: request/reply, with pushes out of band */
    l->swallow = (int)(ss->channels.n + ss->patterns.n + ss->shards.n);
    link_send_raw(l, buf_head(&b), buf_used(&b));
    buf_free(&b);
    router_set_tunnel(s, TUN_PUBSUB);
    log_info("client %llu: re-subscribed %zu channel(s), %zu pattern(s), %zu shard channel(s) on "
             "link %llu",
             (unsigned long long)s->id, ss->channels.n, ss->patterns.n, ss->shards.n,
             (unsigned long long)l->id);
    return 1;
}

/* ---------------------------------------------------------------- dispatch */

/* client.auth redis: AUTH (or HELLO ... AUTH) goes to Redis (acl.c). */
static int dispatch_acl(session *s, request *r)
{
    if (s->tx != TX_NONE || s->tunnel != TUN_NONE) {
        /* Its links are the user's: the state on them cannot follow. */
        s->f->session_ops->answer_str(
            s, r,
            "-ERR ferry: AUTH is not supported inside MULTI or WATCH, or on a "
            "subscribed, MONITOR or CLIENT REPLY connection, with client.auth "
            "redis\r\n");
        return DISPATCH_DONE;
    }
    switch (acl_dispatch(s, r)) {
    case ACL_WAIT:
        return DISPATCH_WAIT;
    case ACL_HOLD:
        return DISPATCH_DOWN;
    default:
        return DISPATCH_DONE;
    }
}

/* Redis accepted the user s authenticated as (acl.c): answer as AUTH or
 * HELLO does. A dedicated link of its former user is let go (the next one
 * is the new user's, with the client's settings restored on it). */
static void acl_accepted(session *s, request *r)
{
    if (s->dlink != NULL && s->dlink->who != acl_ident(s, s->dlink->up)) {
        int flush = s->tracking && s->proto == 3;
        upstream_return(s->f->up, s, 0, "its client authenticated as another user");
        if (flush) {
            static const char inval[] = ">2\r\n$10\r\ninvalidate\r\n_\r\n";
            s->f->session_ops->on_push(s, inval, sizeof(inval) - 1);
        }
    }
    if (r->route == RT_HELLO) {
        router_answer_hello(s, r);
    } else {
        router_answer_auth(s, r);
    }
}

/* The master view r goes to: in cluster mode the one serving its slot
 * (any UP one for a keyless command); until a map names it, the view
 * without a master, where it waits. */
static upstream *route_view(session *s, const request *r)
{
    ferry *f = s->f;
    if (f->cluster != NULL) {
        /* A broadcast goes to the masters that have not replied, in turn;
         * a transaction's commands to its slot (tx.c). */
        int at_dlink;
        int slot = tx_route_slot(s, r, &at_dlink);
        upstream *up = r->bc != NULL ? clustermap_unseen(f->cluster, r->bc->seen)
                       : at_dlink    ? s->dlink->up
                                     : clustermap_route(f->cluster, slot);
        if (up != NULL) {
            return up;
        }
    }
    return f->up;
}

/* The fallback store would serve s's next request (no master): a pop's data
 * awaiting a verdict is delivered undecided rather than held behind it. */
static int verdict_store_serves(session *s, upstream *up)
{
    return s->f->outage != NULL && s->tx == TX_NONE && s->ident == NULL && upstream_down(up);
}

/* A split request's part to send now (split.h): its bytes in r->data (the
 * client's memory counts the change) and its slot in r->slot. A node
 * refuses keys of two slots inside a transaction: so does ferry. */
static void split_prepare(session *s, request *r)
{
    if (s->tx != TX_NONE) {
        split_free(r->sp);
        r->sp = NULL;
        router_refuse(r, "-CROSSSLOT Keys in request don't hash to the same slot\r\n");
        clustermap_count_crossslot(s->f->cluster);
        return;
    }
    if (r->sp->built != (int)r->sp->next) {
        size_t before = buf_used(&r->data);
        split_encode(r->sp, &r->data);
        s->pending_bytes = s->pending_bytes + buf_used(&r->data) - before;
    }
    r->slot = split_slot(r->sp);
}

/* r is split and a part other than its last is in flight: what the client
 * sent after it goes once the last part is sent (a GET behind an MSET
 * reads what the MSET wrote). */
static int split_midway(const request *r)
{
    return r->sp != NULL && !r->sp->failed && r->sp->next + 1 < r->sp->nparts;
}

/* l was just lent for r: if it is a new connection (none idle in the
 * pool), count it under what r needed it for (the stats' links_opened_for_*). */
static void count_link_opened(ferry *f, const request *r, const link *l)
{
    if (l == NULL || l->state != LINK_CONNECTING) {
        return; /* taken from the pool */
    }
    switch (r->route) {
    case RT_BLOCKING:
        f->stats.links_opened_for_blocking++;
        break;
    case RT_SCRIPT:
        f->stats.links_opened_for_script++;
        break;
    case RT_MULTI:
    case RT_WATCH:
        f->stats.links_opened_for_transaction++;
        break;
    default:
        f->stats.links_opened_for_state++; /* SELECT, sticky settings, a tunnel, pinned */
        break;
    }
}

static int dispatch_one(session *s, request *r);

/* dispatch_one's steps, in order. Each answers DISPATCH_DONE, _WAIT or
 * _DOWN where it decides r's fate, or DISPATCH_ON: on to the next. */

/* The master view r goes to (*upp); a split's next part, a broadcast's
 * answer, a subscribed client's command of another shard. */
static int dispatch_view(session *s, request *r, upstream **upp)
{
    ferry *f = s->f;
    if (r->sp != NULL) {
        split_prepare(s, r);
    }
    /* Cluster mode, a subscribed client: its link is on one master, where
     * what it sends goes (router_pubsub.c). */
    int subscribed = f->cluster != NULL && s->dlink != NULL &&
                     (s->tunnel == TUN_PUBSUB || s->tunnel == TUN_PUBSUB_LOST);
    if (r->bc != NULL && (s->tx != TX_NONE || subscribed)) {
        /* Inside a transaction it runs where the transaction does. */
        broadcast_free(r->bc);
        r->bc = NULL;
    }
    if (r->bc != NULL && r->bc->answered > 0 &&
        clustermap_unseen(f->cluster, r->bc->seen) == NULL) {
        /* The map changed meanwhile: every master it names has replied. */
        f->session_ops->answer(s, r, buf_head(&r->bc->reply), buf_used(&r->bc->reply));
        return DISPATCH_DONE;
    }
    upstream *up = r->ask != NULL ? r->ask : route_view(s, r);
    *upp = up;
    if (subscribed && r->route != RT_TUNNEL && router_pubsub_elsewhere(s, r)) {
        /* RESP2 too, also once it unsubscribed from everything: its bytes
         * go through to that master, which would answer MOVED. */
        f->session_ops->answer_str(s, r,
                                   "-ERR ferry: cluster mode: a connection that subscribed runs "
                                   "commands on the master its subscriptions live on; keys of "
                                   "another shard on another connection, or after RESET\r\n");
        return DISPATCH_DONE;
    }
    if (subscribed) {
        up = s->dlink->up;
        *upp = up;
    }
    if (r->bc != NULL) {
        r->bc->at = up;
    }
    if (s->checking) {
        return DISPATCH_WAIT; /* the user it runs as is not known yet */
    }
    if (!(r->flags & REQ_F_VERDICT) && tx_after_refused_multi(s, r)) {
        return DISPATCH_DONE;
    }
    return DISPATCH_ON;
}

/* A reply a lost master gave before a replica confirmed it: delivered
 * once the next master is read and has the write, else sent again. */
static int dispatch_verdict(session *s, request *r, upstream *up)
{
    ferry *f = s->f;
    if ((r->flags & REQ_F_VERDICT) && (r->flags & (REQ_F_RCPT | REQ_F_XSENT)) &&
        up->state == UP_UP) {
        /* A pop with its receipt, answered by a master lost before a
         * replica confirmed it: sent again, it answers the item it took if
         * this master has the pop, else pops here (the item is still here):
         * Redis decides, not the offsets. The same for an XREADGROUP '>'
         * read: sent again, it looks first for the entries it took in the
         * consumer's pending list (xreads.c). With no master up, its data
         * waits below (delivered if the fallback store serves meanwhile). */
        r->flags &= ~REQ_F_VERDICT;
        buf_clear(&r->reply);
    }
    if ((r->flags & REQ_F_XSENT) && request_verdict_data(r)) {
        /* Entries a '>' read took: its look decides once a master is up,
         * not the offsets (the fallback store serves no stream). */
        return DISPATCH_DOWN;
    }
    if (r->flags & REQ_F_VERDICT) {
        /* Its reply came from a master lost before a replica confirmed it:
         * once the next master is read (before it is UP), deliver that reply
         * if the master has the write, else send it again. */
        int data = request_verdict_data(r);
        int v = fence_verdict(up, r, up->state == UP_UP || (data && verdict_store_serves(s, up)));
        if (v < 0 && data) {
            return DISPATCH_DOWN; /* its data held until the next master is read */
        }
        if (v >= 0) {
            r->flags &= ~REQ_F_VERDICT;
            if (fence_verdict_delivers(r, v)) {
                if (r->route == RT_EXEC) {
                    tx_forget(s); /* it ran: nothing to rebuild */
                }
                buf tmp = r->reply;
                buf_init(&r->reply);
                if (r->sp != NULL && split_fold(r->sp, buf_head(&tmp), buf_used(&tmp))) {
                    /* A split's part it has: on with the next part. */
                    buf_free(&tmp);
                    r->retries = 0;
                    r->refusals = 0;
                    r->flags &= ~REQ_F_REFUSED;
                    return dispatch_one(s, r);
                }
                if (r->sp != NULL) {
                    buf_free(&tmp);
                    tmp = r->sp->reply;
                    buf_init(&r->sp->reply);
                }
                /* A receipt's command the offsets proved applied (decided
                 * before this master was up): its receipt served too. */
                receipts_reply(f, r, buf_head(&tmp), buf_used(&tmp));
                s->f->session_ops->answer(s, r, buf_head(&tmp), buf_used(&tmp));
                buf_free(&tmp);
                return DISPATCH_DONE;
            }
            buf_clear(&r->reply);
        }
    }
    return DISPATCH_ON;
}

/* Refused before Redis: a client not authenticated, a write while
 * durability is not enforced. */
static int dispatch_refused_here(session *s, request *r, upstream *up)
{
    ferry *f = s->f;
    const char *pw = f->cfg->client_password;

    if ((pw != NULL || f->cfg->client_auth == CLIENT_AUTH_REDIS) && !s->authed &&
        r->route != RT_AUTH && r->route != RT_HELLO && r->route != RT_QUIT) {
        /* Redis refuses an EXEC in the words of an aborted transaction. */
        s->f->session_ops->answer_str(
            s, r,
            r->route == RT_EXEC
                ? "-EXECABORT Transaction discarded because of: NOAUTH Authentication required.\r\n"
                : "-NOAUTH Authentication required.\r\n");
        return DISPATCH_DONE;
    }
    if (f->cfg->require_aof && (r->flags & REQ_F_WRITE) && up->state == UP_UP && !up->aof_ok) {
        char line[400];
        snprintf(line, sizeof(line),
                 "-ERR ferry: writes refused: durability (appendonly yes, "
                 "appendfsync always) is not enforced on the master: %s\r\n",
                 up->aof_error[0] ? up->aof_error : "not yet asserted");
        s->f->session_ops->answer_str(s, r, line);
        return DISPATCH_DONE;
    }
    return DISPATCH_ON;
}

/* What ferry answers itself: AUTH, HELLO, QUIT, RESET, CLIENT, a
 * cluster transaction's own replies, the stand-in while no master. */
static int dispatch_local(session *s, request *r, upstream *up)
{
    ferry *f = s->f;
    switch (r->route) {
    case RT_ERROR:
        /* The reply was composed when it was parsed. */
        tx_on_refused_locally(s, r);
        request_set_state(r, REQ_ANSWERED);
        f->stats.commands_local++;
        return DISPATCH_DONE;
    case RT_AUTH:
        if (AUTH_RESULT(r) == AUTH_REDIS) {
            return dispatch_acl(s, r);
        }
        f->stats.commands_local++;
        router_answer_auth(s, r);
        return DISPATCH_DONE;
    case RT_HELLO:
        if (AUTH_RESULT(r) == HELLO_AUTH_REDIS) {
            return dispatch_acl(s, r);
        }
        f->stats.commands_local++;
        router_answer_hello(s, r);
        return DISPATCH_DONE;
    case RT_QUIT:
        f->stats.commands_local++;
        r->flags |= REQ_F_QUIT;
        s->f->session_ops->answer_str(s, r, "+OK\r\n");
        return DISPATCH_DONE;
    case RT_RESET:
        if (s->inflight > 0) {
            return DISPATCH_WAIT;
        }
        f->stats.commands_local++;
        do_reset(s, r);
        return DISPATCH_DONE;
    case RT_CLIENT:
        if (tx_in_multi(s)) {
            break; /* queued in the transaction on Redis, as before */
        }
        if (s->inflight > 0 && r->arg != CL_ID && r->arg != CL_INFO) {
            return DISPATCH_WAIT; /* what it sent before is done first */
        }
        clients_dispatch(s, r, router_dispatch);
        return DISPATCH_DONE;
    default:
        break;
    }
    if (tx_crossslot(s, r) || tx_answer(s, r) || tx_cluster_answer(s, r)) {
        return DISPATCH_DONE; /* cluster mode: a key of another slot, a MULTI with no slot yet */
    }
    if (s->tx == TX_NONE && s->tunnel == TUN_NONE && r->bc == NULL && upstream_down(up) &&
        standin_answer(s, r, 0)) {
        /* No master: ferry answers PING, ECHO and INFO itself (standin.c). */
        f->stats.commands_local++;
        return DISPATCH_DONE;
    }
    return DISPATCH_ON;
}

/* A session bound to a link: lent by another shard or an old master
 * (given back), a RESP3 subscriber, a tunnel (its bytes go through). */
static int dispatch_bound_link(session *s, request *r, upstream *up)
{
    if (s->dlink != NULL && s->tunnel == TUN_NONE && s->dlink->up != up) {
        /* Cluster mode: lent by another shard's master view. */
        if (s->inflight > 0 && s->flight_link == s->dlink) {
            return DISPATCH_WAIT;
        }
        /* A transaction there moves: closed, rebuilt here (tx.c). */
        upstream_return(up, s, !tx_on_move(s), "its client moved to another shard");
    }
    if (s->dlink != NULL && s->tunnel == TUN_NONE && s->dlink->epoch != up->epoch) {
        /* Lent by a master ferry has let go of (a blocked call draining). */
        if (s->inflight > 0 && s->flight_link == s->dlink) {
            return DISPATCH_WAIT;
        }
        upstream_return(up, s, 1, "lent by an old master");
    }
    /* A RESP3 client in pub/sub goes on issuing commands: its dedicated
     * link stays request/reply and the pushes come out of band. */
    int pubsub3 = s->proto == 3 && (s->tunnel == TUN_PUBSUB || s->tunnel == TUN_PUBSUB_LOST);
    if (pubsub3 && s->dlink == NULL) {
        return DISPATCH_DOWN; /* held until the subscriptions are rebuilt */
    }
    if (pubsub3 && r->route == RT_TUNNEL && r->cmd->cls != CMD_PUBSUB) {
        s->f->session_ops->answer_str(s, r,
                                      "-ERR ferry: MONITOR and CLIENT REPLY are not supported on a "
                                      "subscribed RESP3 connection\r\n");
        return DISPATCH_DONE;
    }
    if (s->tunnel != TUN_NONE && !pubsub3) {
        if (s->dlink == NULL && s->tunnel == TUN_PUBSUB_LOST) {
            return DISPATCH_DOWN; /* held until the tunnel is rebuilt */
        }
        if (s->dlink == NULL) {
            s->f->session_ops->answer_str(s, r, "-ERR ferry: the connection to Redis was lost\r\n");
            return DISPATCH_DONE;
        }
        link_send_raw(s->dlink, buf_head(&r->data), buf_used(&r->data));
        s->f->session_ops->answer(s, r, "", 0);
        return DISPATCH_DONE;
    }
    return DISPATCH_ON;
}

/* No master for fallback.after_ms: the fallback store serves r; a write
 * to a key whose rows are not replayed yet waits. */
static int dispatch_outage(session *s, request *r, upstream *up)
{
    ferry *f = s->f;
    if (f->outage != NULL && s->tx == TX_NONE) {
        /* No master for fallback.after_ms: the fallback store serves queue
         * commands; once a master is back, writes to keys not yet replayed
         * wait for their replay. It serves no client of a Redis ACL user:
         * without Redis nothing can say what the user may do. */
        if (s->ident == NULL && upstream_down(up)) {
            /* (At start-up the view is DOWN at once: the store waits
             * fallback.after_ms for a first master too.) */
            if (s->inflight > 0 && s->flight_link != NULL) {
                return DISPATCH_WAIT;
            }
            /* A pop sent before with its receipt, now served by the store:
             * the move it may have made on the lost master goes back to its
             * queue once a master is up (a copy: the store answers r). */
            request was = {.cmd = r->cmd, .flags = r->flags, .rcpt = r->rcpt};
            buf_init(&was.data);
            if (r->flags & REQ_F_RCPT) {
                buf_append(&was.data, buf_head(&r->data), buf_used(&r->data));
            }
            /* A push sent with its receipt and not answered may be on
             * Redis: the store holds its rows until the replay asks. A
             * write sent without one (a ZADD, a pop with no receipt), its
             * outcome unknown, is not the store's: taking it would apply it
             * twice (a member the master adds when it thaws, popped from
             * both) or take a second item; it stays held for Redis, whose
             * offsets decide it (fence.c). */
            buf held;
            buf_init(&held);
            int known = receipts_push_key(f, r, &held) == 0;
            int unknown = r->sent_ns != 0 && !(r->flags & (REQ_F_RCPT | REQ_F_REFUSED)) &&
                          (r->flags & REQ_F_WRITE);
            int rc = unknown
                         ? 0
                         : outage_dispatch(s, r, known ? buf_head(&held) : NULL, buf_used(&held));
            buf_free(&held);
            if (rc == 1) {
                receipts_undo(f, &was); /* (counts r's receipt let go: r's flag goes) */
                r->flags &= ~(REQ_F_RCPT | REQ_F_RCPT_PROBE);
            }
            buf_free(&was.data);
            if (rc != 0) {
                return rc == 1 ? DISPATCH_DONE : DISPATCH_DOWN;
            }
        } else if (up->state == UP_UP && outage_blocks(f, r)) {
            return DISPATCH_DOWN;
        }
    }
    return DISPATCH_ON;
}

/* Held before any link: refused by Redis (back-off), behind a
 * transaction or a guarded push, a paused consumer; a cluster priority
 * pop goes its own way (multipop.c). */
static int dispatch_held(session *s, request *r)
{
    ferry *f = s->f;
    switch (backlog_refused(s, r, uv_now(f->loop))) {
    case 1:
        return DISPATCH_DOWN; /* refused by Redis: sent again once its back-off ran */
    case 2:
        return DISPATCH_DONE; /* refused until the hold bound: -TRYAGAIN */
    default:
        break;
    }
    if (tx_must_wait(s, r)) {
        return DISPATCH_WAIT; /* a transaction pipelined behind another */
    }
    if (guards_must_wait(s, r)) {
        return DISPATCH_WAIT; /* a push that may be held for room goes alone */
    }
    uint64_t until;
    if (!(r->flags & REQ_F_REFUSED) && lease_paused(s, r, uv_now(f->loop), &until)) {
        /* Its consumer is paused (consumer_backoff): held like a refusal
         * until the pause ends, within the hold bound; a blocking pop ends
         * on its own timeout if that comes first. */
        r->flags |= REQ_F_REFUSED;
        r->held_since = uv_now(f->loop);
        r->refusals = 1;
        r->retry_at = until;
        r->refusal = "PAUSED";
        if (r->flags & REQ_F_BLOCKING) {
            r->flags |= REQ_F_REARM;
        }
        return DISPATCH_DOWN;
    }
    if (r->slot == MULTIPOP_SLOT && s->tx == TX_NONE) {
        /* Cluster mode: a blocking pop over keys of several slots. */
        if (s->inflight > 0) {
            return DISPATCH_WAIT; /* never in flight on two links: ordering */
        }
        multipop_start(s, r, router_dispatch);
        return DISPATCH_DONE;
    }
    return DISPATCH_ON;
}

/* RESP3: a SUBSCRIBE and the like confirm with push frames, no reply. */
static int push_sub(const session *s, const request *r)
{
    return r->route == RT_TUNNEL && s->proto == 3 && r->cmd->cls == CMD_PUBSUB;
}

/* The link r goes on (*targetp): the session's own (lent now if need
 * be) or a shared one; *aheadp: sent ahead of a MULTI being rebuilt. */
static int dispatch_target(session *s, request *r, upstream *up, link **targetp, int *aheadp)
{
    ferry *f = s->f;
    int dedicated = router_pinned(s);
    if (r->db1 == 0) {
        r->db1 = s->db + 1;
    }
    if (r->db1 - 1 != s->db && r->route != RT_SELECT) {
        dedicated = 1; /* sent again behind a SELECT sent after it: to its own db */
    }
    switch (r->route) {
    case RT_BLOCKING:
    case RT_SCRIPT:
    case RT_MULTI:
    case RT_WATCH:
    case RT_STICKY:
    case RT_TUNNEL:
        dedicated = 1;
        break;
    case RT_SELECT:
        if (SELECT_DB(r) == 0 && !dedicated && f->cfg->client_auth != CLIENT_AUTH_REDIS) {
            /* Shared links are in db 0. A Redis ACL user's SELECT 0 goes to
             * that user's shared link all the same (a no-op there): Redis
             * says whether the user may run SELECT at all. */
            s->f->session_ops->answer_str(s, r, "+OK\r\n");
            return DISPATCH_DONE;
        }
        if (SELECT_DB(r) == 0 && !dedicated) {
            break;
        }
        dedicated = 1;
        break;
    default:
        break;
    }
    if (r->route == RT_TUNNEL && s->inflight > 0 && !push_sub(s, r)) {
        return DISPATCH_WAIT; /* the tunnel starts once everything before is answered */
    }
    link *target;
    int ahead = tx_precedes(s, r); /* sent before the MULTI rebuilt: goes ahead of it */
    *aheadp = ahead;
    if (dedicated) {
        if (s->dlink == NULL) {
            if (s->inflight > 0) {
                return DISPATCH_WAIT; /* never in flight on two links: ordering */
            }
            if (ahead && s->tx == TX_MULTI_REBUILD) {
                s->tx_deferred = TX_DEFER_BEHIND;
            }
            count_link_opened(f, r, router_lend(s, up));
        } else if (s->tx_deferred && !ahead) {
            if (s->tx_deferred == TX_DEFER_BEHIND) {
                s->tx_deferred = 0; /* rebuilt now, behind them */
            }
            tx_on_lend(s, s->dlink); /* cluster mode: the MULTI ferry answered goes first */
        }
        target = s->dlink;
    } else {
        target = upstream_shared(up, acl_ident(s, up), s->id, s->proto);
    }
    if (target == NULL) {
        return DISPATCH_DOWN;
    }
    if (s->inflight > 0 && s->flight_link != target) {
        return DISPATCH_WAIT; /* never in flight on two links: ordering */
    }
    *targetp = target;
    return DISPATCH_ON;
}

/* r on its link: its flags, the transaction's log, a blocking pop's time
 * left, what must go ahead of it (SELECT, WAIT, SCRIPT LOAD, ASKING), the
 * rewrites (guards, lease, receipts, stream reads), or as it is. */
static int dispatch_send(session *s, request *r, upstream *up, link *target, int ahead)
{
    ferry *f = s->f;
    r->flags &= ~(REQ_F_ACK | REQ_F_TXLOG | REQ_F_UNBLOCK); /* UNBLOCK: asked of its last link */
    tx_on_send(s, r, up->replicas_ack > 0);
    switch (r->route) {
    case RT_SELECT:
        /* Pipelined commands behind it run in the new db: set it now, and
         * back to the one before if Redis refuses (NOPERM, out of range). */
        r->arg = SELECT_DB(r) | ((long long)s->db << 32);
        s->db = SELECT_DB(r);
        target->db = SELECT_DB(r);
        break;
    case RT_STICKY:
        s->sticky = 1;
        break;
    case RT_TUNNEL:
        router_set_tunnel(s, r->cmd != NULL && r->cmd->cls == CMD_PUBSUB ? TUN_PUBSUB : TUN_OTHER);
        if (push_sub(s, r)) {
            /* RESP3: Redis confirms with push frames, not a reply. */
            link_send_raw(target, buf_head(&r->data), buf_used(&r->data));
            s->f->session_ops->answer(s, r, "", 0);
            return DISPATCH_DONE;
        }
        target->passthrough = 1;
        link_send_raw(target, buf_head(&r->data), buf_used(&r->data));
        s->f->session_ops->answer(s, r, "", 0);
        return DISPATCH_DONE;
    default:
        break;
    }
    /* A command queued in a MULTI is covered by the WAIT after EXEC; any
     * other write gets its own. */
    if (tx_queue(s, r)) {
        receipts_tx_note(s, r);
    } else if ((r->flags & REQ_F_WRITE) && up->replicas_ack > 0 && r->route != RT_EXEC &&
               (!tx_in_multi(s) || ahead)) {
        r->flags |= REQ_F_ACK;
    }
    if (r->flags & REQ_F_REARM) {
        const char *expired = NULL;
        size_t before = buf_used(&r->data);
        int done = request_rearm_blocking(r, uv_now(f->loop), &expired);
        s->pending_bytes = s->pending_bytes + buf_used(&r->data) - before;
        r->flags &= ~REQ_F_REARM;
        if (done != 0 && !(r->flags & REQ_F_XSENT)) {
            /* (A '>' read sent before still looks for what it took: its
             * null comes after a look that found nothing, xreads.c.) */
            receipts_undo(f, r); /* a receipt move it may have made: undone */
            s->f->session_ops->answer_str(
                s, r, session_null(s, expired)); /* its time ran out meanwhile */
            return DISPATCH_DONE;
        }
    }
    if (f->cluster != NULL && keyspace_is_scan(r)) {
        /* Cluster mode: ferry's SCAN cursor becomes the node's. */
        size_t before = buf_used(&r->data);
        keyspace_scan_sending(r, up);
        s->pending_bytes = s->pending_bytes + buf_used(&r->data) - before;
    }
    if (r->route != RT_SELECT && target->kind == LINK_DEDICATED && target->db != r->db1 - 1) {
        /* Sent again after its link was lost, behind a SELECT the client
         * sent after it (already sent again, or lent in the session's db). */
        char db[16];
        snprintf(db, sizeof(db), "%d", r->db1 - 1);
        const char *argv[] = {"SELECT", db};
        link_internal(target, argv, 2, NULL, 0);
        target->db = r->db1 - 1;
    }
    r->s = s;
    r->sent_ns = uv_hrtime();
    if (r->route == RT_MULTI && target->need_wait && target->state != LINK_FENCING) {
        /* The WAIT owed for writes already sent goes before MULTI: after
         * it, Redis would queue the WAIT in the client's transaction. */
        fence_wait(target);
    }
    /* An EVALSHA of a script this link's server was not given: its SCRIPT
     * LOAD goes right ahead of it (scripts.c), before an ASKING. */
    scripts_ahead(s, r, target);
    if (r->ask != NULL) {
        /* The node a slot is migrating to serves this one command after
         * ASKING, on the same link, right before it. */
        static const char *const asking[] = {"ASKING"};
        link_internal(target, asking, 1, NULL, 0);
        r->ask = NULL;
    }
    if (!guards_send(s, r, target) && !lease_send(s, r, target) && !receipts_send(s, r, target) &&
        !xreads_send(s, r, target)) {
        link_send(target, r);
    }
    up->routed++; /* the shard's figure on the stats port (cluster mode) */
    s->inflight++;
    s->flight_link = target;
    if (split_midway(r)) {
        return DISPATCH_WAIT; /* what follows waits for its last part */
    }
    return DISPATCH_DONE;
}

static int dispatch_one(session *s, request *r)
{
    upstream *up = NULL;
    link *target = NULL;
    int ahead = 0, rc;
    if ((rc = dispatch_view(s, r, &up)) != DISPATCH_ON ||
        (rc = dispatch_verdict(s, r, up)) != DISPATCH_ON ||
        (rc = dispatch_refused_here(s, r, up)) != DISPATCH_ON ||
        (rc = dispatch_local(s, r, up)) != DISPATCH_ON ||
        (rc = dispatch_bound_link(s, r, up)) != DISPATCH_ON ||
        (rc = dispatch_outage(s, r, up)) != DISPATCH_ON ||
        (rc = dispatch_held(s, r)) != DISPATCH_ON ||
        (rc = dispatch_target(s, r, up, &target, &ahead)) != DISPATCH_ON) {
        return rc;
    }
    return dispatch_send(s, r, up, target, ahead);
}

/* Redis refused to take a client's name off a link: it must not be pooled. */
static void unname_done(link *l, request *r, const char *reply, size_t len)
{
    (void)r;
    if (reply != NULL && len > 0 && reply[0] == '-') {
        link_close(l, "its client's name could not be taken off");
    }
}

/* Give the dedicated link back once nothing needs it. */
static void router_maybe_return(session *s)
{
    if (s->dlink == NULL || router_pinned(s)) {
        return;
    }
    if (s->inflight > 0 && s->flight_link == s->dlink) {
        return;
    }
    if (s->dlink->client_set && !s->sticky) {
        /* Cluster mode: the client's name, set again on each link lent to
         * it (cluster_conn.c), comes off before the link is pooled, so no
         * other client gets it (else the link is closed, a new one opened
         * at the client's next call). */
        static const char *const unname[] = {"CLIENT", "SETNAME", ""};
        link_internal(s->dlink, unname, 3, unname_done, 0);
        s->dlink->client_set = 0;
    }
    /* Held requests that need it again will borrow one from the pool. */
    upstream_return(s->f->up, s, 1, "released with connection state");
}

/* A subscribed client whose subscriptions wait for a master while none is
 * usable: ferry answers the PINGs (RESP3: ECHO and INFO too) at the head of
 * what it sent, in order; the rest waits for the subscriptions. */
static void answer_down_lead(session *s)
{
    list_node *n = s->cursor;
    const upstream *v = router_pubsub_view(s); /* NULL: waiting for the map */
    if (s->tx != TX_NONE || (v != NULL && !upstream_down(v))) {
        return;
    }
    while (n != &s->requests) {
        request *r = list_entry(n, request, sq);
        list_node *next = n->next; /* r may be written out and recycled */
        if (r->state == REQ_HELD) {
            if (!standin_answer(s, r, s->proto == 2)) {
                break;
            }
            s->f->stats.commands_local++;
        }
        n = next;
    }
    s->cursor = n;
    s->f->session_ops->flush_answered(s);
}

void router_dispatch(session *s)
{
    list_node *n = s->cursor;
    int rc = DISPATCH_DONE;

    if (s->state == SESSION_CLOSING) {
        return;
    }
    if (s->tunnel == TUN_PUBSUB_LOST && s->dlink == NULL && !router_resubscribe(s)) {
        answer_down_lead(s);
        backlog_hold(s); /* what it sent meanwhile waits for the new tunnel */
        return;
    }
    while (n != &s->requests) {
        request *r = list_entry(n, request, sq);
        if ((r->state == REQ_SENT || r->state == REQ_WAITING) && split_midway(r)) {
            rc = DISPATCH_WAIT; /* what follows waits for the split's last part */
            break;
        }
        if (r->state != REQ_HELD) {
            n = n->next;
            continue;
        }
        list_node *next = n->next; /* r may be written out and recycled */
        rc = dispatch_one(s, r);
        if (rc != DISPATCH_DONE) {
            break;
        }
        n = next;
    }
    s->cursor = n;
    if (rc == DISPATCH_DOWN) {
        backlog_hold(s);
    } else {
        backlog_release(s);
    }
    s->f->session_ops->flush_answered(s);
    router_maybe_return(s);
}

/* ------------------------------------------------------------ link events */

/* A reply that carries nothing Redis wrote: a null (a pop that timed out,
 * a transaction aborted by WATCH) needs no replica to confirm it. */
static void note_flight_done(session *s)
{
    s->inflight--;
    if (s->inflight == 0) {
        s->flight_link = NULL;
        s->checking = 0; /* an AUTH check is alone in flight */
    }
}

static void requeue(session *s, request *r);

/* A guarded push (guards.c) Redis answered with NOSCRIPT, or found full on
 * a queue with on_full: block: nothing was applied; it goes back to be
 * sent again, at once (as EVAL) or after a short wait for room, within
 * upstream.hold_timeout_ms from the first time it found the queue full. */
static void guard_again(session *s, request *r, guard_verdict v)
{
    uint64_t now = uv_now(s->f->loop);
    note_flight_done(s);
    if (v == GUARD_HOLD) {
        if (!(r->flags & REQ_F_REFUSED)) {
            r->held_since = now;
            r->flags |= REQ_F_REFUSED;
        }
        r->refusals++;
        r->retry_at = now + ((uint64_t)10 << (r->refusals < 5 ? r->refusals - 1 : 4));
        r->refusal = "QFULL";
    }
    requeue(s, r);
}

/* r goes on to its next master (a broadcast's next one, a split's next
 * part): its hold, refusals and retries start again there, and it is sent
 * at once when nothing else of s is in flight, not at the next wake-up. */
static void next_step(session *s, request *r)
{
    r->retries = 0;
    r->refusals = 0;
    r->flags &= ~REQ_F_REFUSED;
    note_flight_done(s);
    requeue(s, r);
    if (s->inflight == 0) {
        router_dispatch(s);
    }
}

/* A command every master runs (cluster mode: SCRIPT LOAD...) answered by
 * one of them: its reply is folded in; then r is sent to the next master
 * that has not replied, unless a master refused it (its error is the
 * reply) or every master of the map has replied. Returns 1 when r goes
 * on to another master. */
static int broadcast_on_reply(session *s, request *r, const char *p, size_t n)
{
    broadcast *b = r->bc;
    int more = broadcast_fold(b, p, n);
    buf_clear(&r->reply); /* a reply that waited for a WAIT is folded in */
    clustermap_mark_seen(s->f->cluster, b->at, b->seen);
    if (!more || clustermap_unseen(s->f->cluster, b->seen) == NULL) {
        return 0;
    }
    next_step(s, r);
    return 1;
}

/* A split request's part answered (p, n): folded in. Returns 1 when r goes
 * on with its next part (sent at once when nothing else is in flight). */
static int split_on_reply(session *s, request *r, const char *p, size_t n)
{
    int more = split_fold(r->sp, p, n);
    buf_clear(&r->reply); /* a reply that waited for a WAIT is folded in */
    if (!more) {
        return 0;
    }
    next_step(s, r);
    return 1;
}

void router_on_reply(session *s, request *r, const char *p, size_t n)
{
    link *via = s->flight_link;
    if (scripts_on_reply(s, r, via, p, n)) {
        guard_again(s, r, GUARD_RESEND); /* the EVALSHA again, its script loaded ahead */
        return;
    }
    if (lease_noscript(r, p, n)) {
        guard_again(s, r, GUARD_RESEND); /* the ack again, as EVAL */
        return;
    }
    guard_verdict gv = guards_on_reply(s, r, p, n);
    if (gv != GUARD_PASS) {
        guard_again(s, r, gv);
        return;
    }
    if (receipts_again(s, r, p, n)) {
        guard_again(s, r, GUARD_RESEND); /* as EVAL, or the blocking move after its look */
        return;
    }
    if (xreads_again(s, r, p, n)) {
        guard_again(s, r, GUARD_RESEND); /* the '>' read, after a look that found nothing */
        return;
    }
    if (tx_refused_doomed(s, r, p, n)) {
        /* A command of a transaction refused by the cluster (CLUSTERDOWN,
         * MOVED...), or the EXEC of one rebuilt where Redis refused a
         * command: Redis aborted it; it is rebuilt on a new link. */
        router_on_refused(s, r, via, s->f->cluster != NULL ? REFUSAL_REDIRECT : REFUSAL_NOT_MASTER,
                          p, n);
        return;
    }
    if (r->bc != NULL && s->f->cluster != NULL) {
        if (broadcast_on_reply(s, r, p, n)) {
            return;
        }
        p = buf_head(&r->bc->reply);
        n = buf_used(&r->bc->reply);
    }
    if (r->sp != NULL) {
        if (split_on_reply(s, r, p, n)) {
            return;
        }
        p = buf_head(&r->sp->reply);
        n = buf_used(&r->sp->reply);
    }
    buf scanned; /* cluster mode: a SCAN's reply with ferry's cursor */
    buf_init(&scanned);
    if (s->f->cluster != NULL && keyspace_is_scan(r) &&
        keyspace_scan_reply(s->f->cluster, r,
                            via != NULL ? via->up : clustermap_route(s->f->cluster, r->slot), p, n,
                            &scanned)) {
        p = buf_head(&scanned);
        n = buf_used(&scanned);
    }
    stats_observe_reply(&s->f->stats, r->born_ns, r->sent_ns, uv_hrtime(), n > 0 && p[0] == '-');
    note_flight_done(s);
    if ((r->route == RT_AUTH && AUTH_RESULT(r) == AUTH_REDIS) ||
        (r->route == RT_HELLO && AUTH_RESULT(r) == HELLO_AUTH_REDIS)) {
        /* Redis' answer to a client's AUTH (acl.c). */
        if (acl_on_reply(s, r, via, p, n)) {
            acl_accepted(s, r);
        }
        buf_free(&scanned);
        s->f->session_ops->flush_answered(s);
        if (s->inflight == 0) {
            router_dispatch(s);
        }
        s->f->session_ops->check_reading(s);
        return;
    }
    receipts_reply(s->f, r, p, n);
    lease_on_reply(s, r, via, p, n);
    tx_on_reply(s, r, p, n);
    buf looked; /* a look's reply as the '>' read answers it */
    buf_init(&looked);
    if (xreads_reply(s, r, p, n, &looked)) {
        p = buf_head(&looked);
        n = buf_used(&looked);
    }
    if (r->route == RT_STICKY && n > 0 && p[0] == '+') {
        router_sticky_accepted(s, r);
    }
    if (r->route == RT_SELECT && n > 0 && p[0] == '-') {
        /* Refused: the link stays in the db it was in. */
        s->db = (int)(r->arg >> 32);
        if (via != NULL && via->db == SELECT_DB(r)) {
            via->db = s->db;
        }
    }
    s->f->session_ops->answer(s, r, p, n);
    buf_free(&looked);
    buf_free(&scanned);
    s->f->session_ops->flush_answered(s);
    if (s->inflight == 0) {
        router_dispatch(s);
    }
    s->f->session_ops->check_reading(s);
}

/* Put r back to be sent again, before anything not yet dispatched. A
 * request refused again and again keeps its first hold time, so the hold
 * bound still ends it. */
static void requeue(session *s, request *r)
{
    uint64_t now = uv_now(s->f->loop);
    request_set_state(r, REQ_HELD);
    if (!(r->flags & REQ_F_REFUSED)) {
        r->held_since = now;
    }
    request *c = s->cursor == &s->requests ? NULL : list_entry(s->cursor, request, sq);
    if (c == NULL || r->seq < c->seq) {
        s->cursor = &r->sq;
    }
    backlog_requeue(s, r);
}

void router_requeue(session *s, request *r)
{
    note_flight_done(s);
    requeue(s, r);
}

/* The wait before a refused request is sent again: doubling from
 * REFUSAL_BACKOFF_MIN_MS to REFUSAL_BACKOFF_MAX_MS, so a master that keeps
 * refusing sees a few calls per request over the hold, not a loop. */
#define REFUSAL_BACKOFF_MIN_MS 20
#define REFUSAL_BACKOFF_MAX_MS 500

static uint64_t refusal_backoff(int refusals)
{
    uint64_t ms = REFUSAL_BACKOFF_MIN_MS;
    for (int i = 1; i < refusals && ms < REFUSAL_BACKOFF_MAX_MS; i++) {
        ms *= 2;
    }
    return ms < REFUSAL_BACKOFF_MAX_MS ? ms : REFUSAL_BACKOFF_MAX_MS;
}

/* The name of Redis' refusal (its error code), for ferry's -TRYAGAIN. */
static const char *refusal_name(const char *p, size_t n)
{
    static const char *const names[] = {"READONLY",  "LOADING",    "MASTERDOWN",
                                        "UNBLOCKED", "NOREPLICAS", "MOVED",
                                        "ASK",       "TRYAGAIN",   "CLUSTERDOWN"};
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        size_t m = strlen(names[i]);
        if (n > m + 1 && memcmp(p + 1, names[i], m) == 0) {
            return names[i];
        }
    }
    return "refused";
}

/* A cluster node's redirect (cluster mode): MOVED names the node serving
 * the slot now: r goes there at once (the map is asked again); ASK (a slot
 * in migration) sends r once to the node it names, after ASKING, the map
 * unchanged; TRYAGAIN and CLUSTERDOWN are retried after the back-off,
 * within the hold bound, until the slot has settled. */
static void cluster_redirect(ferry *f, request *r, const link *l, const char *p, size_t n,
                             uint64_t now)
{
    char text[200];
    size_t m = n < sizeof(text) - 1 ? n : sizeof(text) - 1;
    memcpy(text, p, m);
    text[m] = '\0';
    int slot, port = 0;
    char host[128];
    char *colon = NULL;
    if (f->cluster == NULL) {
        return;
    }
    int moved = sscanf(text, "-MOVED %d %127[^ \r\n]", &slot, host) == 2;
    int ask = !moved && sscanf(text, "-ASK %d %127[^ \r\n]", &slot, host) == 2;
    if (moved || ask) {
        colon = strrchr(host, ':');
    }
    if (colon != NULL && sscanf(colon + 1, "%d", &port) == 1 && port > 0 && port < 65536) {
        *colon = '\0';
        if (host[0] == '[') {
            memmove(host, host + 1, strlen(host));
            host[strcspn(host, "]")] = '\0';
        }
        if (moved) {
            clustermap_moved(f->cluster, l != NULL ? l->up : NULL, slot, host, port);
        } else {
            r->ask = clustermap_ask(f->cluster, l != NULL ? l->up : NULL, host, port);
        }
        if (r->refusals <= 2) {
            r->retry_at = now; /* followed at once; a map going back and forth backs off */
        }
    } else if (strncmp(text, "-CLUSTERDOWN", 12) == 0) {
        clustermap_count_held(f->cluster, 0);
        clustermap_refresh(f->cluster, "a node answered CLUSTERDOWN");
    } else if (strncmp(text, "-TRYAGAIN", 9) == 0) {
        clustermap_count_held(f->cluster, 1);
    }
}

void router_on_refused(session *s, request *r, link *l, link_refusal why, const char *p, size_t n)
{
    ferry *f = s->f;
    uint64_t now = uv_now(f->loop);

    if (why == REFUSAL_NOREPLICAS && upstream_settled(f->up, l)) {
        /* Not a failover: the master ferry uses is configured to refuse
         * writes without enough good replicas (min-replicas-to-write).
         * That is Redis' answer. */
        router_on_reply(s, r, p, n);
        return;
    }
    note_flight_done(s);
    if ((r->flags & (REQ_F_REFUSED | REQ_F_BLOCKING)) == (REQ_F_REFUSED | REQ_F_BLOCKING) &&
        uv_hrtime() - r->sent_ns >= (uint64_t)REFUSAL_BACKOFF_MAX_MS * 1000000) {
        /* A call that blocked on Redis a while before it was refused (its
         * master turned replica): a new refusal, with a hold of its own. */
        r->flags &= ~REQ_F_REFUSED;
        r->refusals = 0;
    }
    if (!(r->flags & REQ_F_REFUSED)) {
        r->held_since = now;
        r->flags |= REQ_F_REFUSED;
    }
    r->refusals++;
    r->retry_at = now + refusal_backoff(r->refusals);
    r->refusal = refusal_name(p, n);
    if (why == REFUSAL_REDIRECT) {
        cluster_redirect(f, r, l, p, n, now);
    }
    f->stats.requests_refused++;
    if (r->flags & REQ_F_BLOCKING) {
        r->flags |= REQ_F_REARM;
    }
    if (r->route == RT_EXEC || (r->flags & REQ_F_TXLOG)) {
        /* Nothing was applied; the master is being let go with the link
         * that holds the transaction: rebuilt (or null, if watched). */
        tx_on_link_lost(s);
    }
    requeue(s, r);
    if ((r->route == RT_EXEC || (r->flags & REQ_F_TXLOG)) && s->dlink != NULL && s->dlink == l) {
        /* Redis aborted the transaction (a refused EXEC ends it, a refused
         * command dooms it: a cluster's redirect, a new master without its
         * replicas yet): what is still in flight on its link comes back,
         * and the transaction is rebuilt on a new one. */
        upstream_return(f->up, s, 0, "Redis refused a command of its transaction");
    }
    if (log_enabled(LOG_DEBUG)) {
        char text[160];
        link_error_text(p, n, text, sizeof(text));
        log_debug("client %llu: request refused by Redis (%s); held, refused %d time(s)",
                  (unsigned long long)s->id, text, r->refusals);
    }
}

/* ferry answers r, whose link was lost. Requests behind it may wait for
 * it to leave that link (never in flight on two links): the session is
 * dispatched again at the next wake-up, which the closing link asks for. */
static void answer_lost(session *s, request *r, const char *text)
{
    s->f->session_ops->answer_str(s, r, text);
    s->f->session_ops->flush_answered(s);
    backlog_wait(s);
}

void router_on_lost(session *s, request *r, const char *reason)
{
    ferry *f = s->f;
    char line[256];
    /* Applied on the lost master, its reply kept (fence.c): a plain write
     * sent again waits for the next master's verdict between that reply and
     * sending it again; anything else follows the policy below. */
    /* A pop's data kept the same way (a blocking one too) waits for the
     * verdict between delivering it and popping again. */
    int data = request_verdict_data(r);
    /* EXEC is one batch: decided as one write (an unwatched transaction is
     * rebuilt only if the next master does not have it). */
    int verdict = (r->flags & REQ_F_VERDICT) && r->route != RT_DISCARD && r->route != RT_MULTI &&
                  (r->route != RT_EXEC || s->tx == TX_EXEC_SENT) && !(r->flags & REQ_F_TXLOG) &&
                  (data || !(r->flags & REQ_F_BLOCKING)) && r->retries < ROUTER_MAX_RETRIES;

    if ((r->flags & REQ_F_VERDICT) && !verdict) {
        if (!SESSION_TX_RECEIPTED(s, r)) {
            f->stats.requests_ambiguous++; /* sent again undecided (a transaction...) */
        }
        if (data) {
            /* Data is never replaced by an error nor popped twice here. */
            r->flags &= ~REQ_F_VERDICT;
            note_flight_done(s);
            buf tmp = r->reply;
            buf_init(&r->reply);
            s->f->session_ops->answer(s, r, buf_head(&tmp), buf_used(&tmp));
            buf_free(&tmp);
            s->f->session_ops->flush_answered(s);
            backlog_wait(s);
            return;
        }
    }
    r->flags &= ~REQ_F_VERDICT;
    if (!verdict) {
        buf_clear(&r->reply);
    }
    note_flight_done(s);
    if (r->route == RT_DISCARD) {
        /* The transaction is gone with its link, as DISCARD asked. */
        answer_lost(s, r, "+OK\r\n");
        return;
    }
    if ((r->route == RT_MULTI || r->route == RT_EXEC || (r->flags & REQ_F_TXLOG)) &&
        s->tx != TX_NONE && s->tx != TX_WATCHING && s->tx != TX_WATCH_LOST) {
        /* Part of a transaction whose link broke. Unwatched, it is rebuilt
         * on the next link (an EXEC already sent is sent again: outcome
         * unknown, at-least-once); watched, it ends in the null reply of a
         * watch conflict. MULTI itself is answered by ferry: the rebuild
         * (or the lost watch) opens the transaction again. */
        tx_on_link_lost(s);
        if (r->route == RT_EXEC) {
            f->stats.requests_retried_unknown++;
            if (verdict) {
                r->flags |= REQ_F_VERDICT; /* dispatch_one: delivered or rebuilt */
            }
        }
        if (r->route == RT_MULTI) {
            answer_lost(s, r, "+OK\r\n");
        } else {
            requeue(s, r);
        }
        return;
    }
    if (r->flags & REQ_F_BLOCKING) {
        /* Re-issued with what is left of its timeout when it is sent again
         * (time held waiting for a master counts too). */
        r->flags |= REQ_F_REARM;
        r->retries = 0;
    }
    if (verdict) {
        r->flags |= REQ_F_VERDICT;
    }
    if (r->retries < ROUTER_MAX_RETRIES) {
        r->retries++;
        f->stats.requests_retried++;
        if ((r->flags & REQ_F_WRITE) && !(r->flags & REQ_F_BLOCKING)) {
            f->stats.requests_retried_unknown++;
        }
        requeue(s, r);
        log_debug("client %llu: request re-queued after lost link (%s)", (unsigned long long)s->id,
                  reason);
        return;
    }
    f->stats.requests_failed++;
    snprintf(line, sizeof(line), "-ERR ferry: request failed %d times: %s\r\n", r->retries + 1,
             reason);
    answer_lost(s, r, line);
}

/* What a tracking client cached may have changed unseen (its link is
 * gone): flush it all, as Redis does (an invalidate with a null key list);
 * tracking is turned on again on its next link. */
static void tracking_flush(session *s, const char *why)
{
    static const char flush[] = ">2\r\n$10\r\ninvalidate\r\n_\r\n";
    if (s->proto != 3) {
        return; /* RESP2 tracking (REDIRECT) is refused */
    }
    s->f->session_ops->on_push(s, flush, sizeof(flush) - 1);
    log_info("client %llu: tracking link lost (%s); cache flush sent", (unsigned long long)s->id,
             why);
}

int router_on_tunnel(session *s, const char *p, size_t n)
{
    if (s->dlink == NULL || s->tunnel != TUN_PUBSUB || !router_pubsub_dropped(s, p, n)) {
        return 0;
    }
    /* Cluster mode: a node dropped the client's shard channels (their slot
     * moved): subscribed again on the slot's new master once the map names
     * it. */
    session_extra_w(s)->ps_left = s->dlink->up;
    clustermap_refresh(s->f->cluster, "a node dropped a shard channel (its slot moved)");
    link_close(s->dlink, "its shard channels' slot moved to another master");
    return 1;
}

void router_on_link_closed(session *s, link *l, const char *reason)
{
    if (s->tracking && !s->f->stopping) {
        tracking_flush(s, reason);
    }
    if (s->tunnel == TUN_PUBSUB && !s->f->stopping) {
        /* Pub/sub survives a failover: subscribe again on the next master. */
        router_set_tunnel(s, TUN_PUBSUB_LOST);
        log_info("client %llu: pub/sub link lost (%s); will re-subscribe",
                 (unsigned long long)s->id, reason);
        backlog_wait(s);
        return;
    }
    if (s->tunnel != TUN_NONE) {
        /* MONITOR and CLIENT REPLY tunnels are not rebuilt: end it, after
         * what was already received is written. */
        s->f->session_ops->set_state(s, SESSION_QUITTING);
        s->f->session_ops->flush_answered(s);
        log_info("client %llu: pass-through link lost (%s)", (unsigned long long)s->id, reason);
        return;
    }
    tx_on_link_lost(s);
    backlog_wait(s);
}
