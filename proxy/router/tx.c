/* tx.c - a session's MULTI/EXEC/WATCH state machine (see tx.h).
 *
 * Redis keeps a transaction on one connection: ferry follows it on the
 * session's dedicated link. Commands Redis answers +QUEUED are logged, so
 * that an open MULTI whose link breaks is rebuilt on the next one (an EXEC
 * already sent is sent again: outcome unknown, at-least-once); a
 * transaction under a WATCH that broke ends in the null reply of a watch
 * conflict, answered by ferry without Redis. */
#include "tx.h"
#include "upstream.h"

#include <stdio.h>
#include <string.h>

#include "clustermap.h"
#include "link.h"
#include "log.h"

static const char *tx_name(tx_state st)
{
    static const char *const names[] = {"NONE",
                                        "WATCHING",
                                        "WATCH_LOST",
                                        "MULTI",
                                        "MULTI_WATCHING",
                                        "MULTI_REBUILD",
                                        "MULTI_WATCH_LOST",
                                        "EXEC_SENT",
                                        "EXEC_SENT_WATCHED"};
    return names[st];
}

/* Every state may return to NONE (EXEC answered, DISCARD, RESET); the
 * other moves are listed here. */
void tx_set(session *s, tx_state st)
{
    static const unsigned legal[] = {
        [TX_NONE] = 1u << TX_WATCHING | 1u << TX_MULTI | 1u << TX_MULTI_REBUILD, /* cluster */
        [TX_WATCHING] = 1u << TX_WATCH_LOST | 1u << TX_MULTI_WATCHING,
        [TX_WATCH_LOST] = 1u << TX_MULTI_WATCH_LOST,
        [TX_MULTI] = 1u << TX_MULTI_REBUILD | 1u << TX_EXEC_SENT,
        [TX_MULTI_WATCHING] = 1u << TX_MULTI_WATCH_LOST | 1u << TX_EXEC_SENT_WATCHED,
        [TX_MULTI_REBUILD] = 1u << TX_MULTI,
        [TX_MULTI_WATCH_LOST] = 0,
        [TX_EXEC_SENT] = 1u << TX_MULTI_REBUILD,
        [TX_EXEC_SENT_WATCHED] = 1u << TX_MULTI_WATCH_LOST,
    };
    if (s->tx == st) {
        return;
    }
    ferry_assert(st == TX_NONE || (legal[s->tx] & (1u << st)));
    log_debug("client %llu: transaction %s -> %s", (unsigned long long)s->id, tx_name(s->tx),
              tx_name(st));
    if (st == TX_NONE) {
        s->tx_deferred = 0;
    }
    if (st == TX_NONE && s->extra != NULL) {
        /* (a session that never had a transaction has nothing to reset) */
        session_extra *x = s->extra;
        x->tx_writes = 0;
        x->tx_dirty = 0;
        x->tx_pin = 0;
        x->tx_spoiled = 0;
        x->tx_rcpt = 0;
        x->tx_receipted = 0;
        x->tx_noted = 0;
        x->tx_seq = 0;
        buf_free(&x->tx_cmds);
        buf_clear(&x->tx_log);
        buf_shrink(&x->tx_log, 4096);
    }
    if (st == TX_MULTI_REBUILD && session_extra_r(s)->tx_dirty == TX_DIRTY_REDIS) {
        /* the next link's Redis never saw the refusal */
        session_extra_w(s)->tx_dirty = TX_DIRTY_FERRY;
    }
    s->tx = st;
}

int router_holds_state(const session *s)
{
    return s->tx == TX_WATCHING || s->tx == TX_MULTI || s->tx == TX_MULTI_WATCHING;
}

int router_multi_open(const session *s)
{
    return s->tx == TX_MULTI || s->tx == TX_MULTI_WATCHING;
}

int tx_precedes(const session *s, const request *r)
{
    return (s->tx == TX_MULTI_REBUILD || s->tx == TX_MULTI_WATCH_LOST) &&
           r->seq < session_extra_r(s)->tx_seq;
}

int tx_in_multi(const session *s)
{
    return s->tx == TX_MULTI || s->tx == TX_MULTI_WATCHING || s->tx == TX_MULTI_REBUILD ||
           s->tx == TX_MULTI_WATCH_LOST;
}

/* ferry answered MULTI itself with an error (cluster mode refuses it; no
 * master within the hold bound): a client that pipelined MULTI, its
 * commands and EXEC must not have the commands run one by one outside any
 * transaction (or be taken by the fallback store). Until EXEC or DISCARD
 * they are refused too; EXEC answers -EXECABORT and DISCARD +OK, as for a
 * transaction Redis aborted. (A MULTI Redis itself refuses keeps Redis'
 * meaning: what follows runs.) */
void tx_on_multi_refused(session *s, request *r)
{
    session_extra_w(s)->multi_refused = 1;
    log_debug("client %llu: MULTI refused by ferry: what follows is refused up to EXEC or DISCARD",
              (unsigned long long)s->id);
    (void)r;
}

int tx_after_refused_multi(session *s, request *r)
{
    if (!session_extra_r(s)->multi_refused) {
        return 0;
    }
    /* By name: cluster mode has refused EXEC and DISCARD too (RT_ERROR). */
    const char *name = r->cmd != NULL ? r->cmd->name : "";
    if (strcmp(name, "exec") == 0) {
        session_extra_w(s)->multi_refused = 0;
        s->f->session_ops->answer_str(
            s, r, "-EXECABORT Transaction discarded because of previous errors.\r\n");
        return 1;
    }
    if (strcmp(name, "discard") == 0) {
        session_extra_w(s)->multi_refused = 0;
        s->f->session_ops->answer_str(s, r, "+OK\r\n");
        return 1;
    }
    switch (r->route) {
    case RT_RESET:
    case RT_QUIT:
        session_extra_w(s)->multi_refused = 0;
        return 0;
    case RT_MULTI:
        return 0; /* refused again, or opens the transaction now */
    default:
        s->f->stats.commands_denied++;
        s->f->session_ops->answer_str(s, r,
                                      "-ERR ferry: not run: it follows a MULTI ferry refused "
                                      "(EXEC or DISCARD ends it)\r\n");
        return 1;
    }
}

/* The transaction is aborted at EXEC, as Redis aborts one after refusing a
 * command; a command Redis never allows in a transaction gets Redis' own
 * words. */
void tx_on_refused_locally(session *s, request *r)
{
    static const char no_multi[] = "-ERR Command not allowed inside a transaction\r\n";
    static const char ours[] = "-ERR ferry";
    if (r->cmd != NULL && strcmp(r->cmd->name, "multi") == 0 && buf_used(&r->reply) >= 10 &&
        memcmp(buf_head(&r->reply), ours, sizeof(ours) - 1) == 0) {
        tx_on_multi_refused(s, r); /* ferry's refusal, not an error Redis would give */
    }
    if (!tx_in_multi(s)) {
        return;
    }
    session_extra_w(s)->tx_dirty = TX_DIRTY_FERRY;
    if (r->cmd != NULL && (r->cmd->flags & CMD_F_NO_MULTI)) {
        buf_clear(&r->reply);
        buf_append(&r->reply, no_multi, sizeof(no_multi) - 1);
    }
}

/* A transaction whose WATCH broke with its link: nothing goes to Redis;
 * queued commands are acknowledged and EXEC answers the null reply of a
 * watch conflict, so the client takes its normal retry path. */
static void answer_watch_lost(session *s, request *r)
{
    switch (r->route) {
    case RT_EXEC:
        tx_set(s, TX_NONE);
        s->f->stats.transactions_watch_lost++;
        s->f->session_ops->answer_str(s, r, session_null(s, "*-1\r\n"));
        break;
    case RT_DISCARD:
        tx_set(s, TX_NONE);
        s->f->session_ops->answer_str(s, r, "+OK\r\n");
        break;
    case RT_MULTI:
        s->f->session_ops->answer_str(s, r, "-ERR MULTI calls can not be nested\r\n");
        break;
    case RT_WATCH:
        s->f->session_ops->answer_str(s, r, "-ERR WATCH inside MULTI is not allowed\r\n");
        break;
    default:
        s->f->session_ops->answer_str(s, r, "+QUEUED\r\n");
        break;
    }
}

int tx_answer(session *s, request *r)
{
    if (r->route == RT_EXEC && session_extra_r(s)->tx_dirty && tx_in_multi(s)) {
        /* As Redis does after refusing a command inside the transaction. */
        static const char *const discard[] = {"DISCARD"};
        if (session_extra_r(s)->tx_dirty == TX_DIRTY_REDIS && s->dlink != NULL &&
            (s->tx == TX_MULTI || s->tx == TX_MULTI_WATCHING)) {
            return 0; /* Redis knows it: its EXECABORT says why (BUSY...) */
        }
        if (s->dlink != NULL && (s->tx == TX_MULTI || s->tx == TX_MULTI_WATCHING)) {
            link_internal(s->dlink, discard, 1, NULL, 0);
        }
        tx_set(s, TX_NONE);
        s->f->session_ops->answer_str(
            s, r, "-EXECABORT Transaction discarded because of previous errors.\r\n");
        return 1;
    }
    if (s->tx == TX_MULTI_WATCH_LOST && !tx_precedes(s, r)) {
        answer_watch_lost(s, r);
        return 1;
    }
    if (s->tx == TX_MULTI_WATCH_LOST && r->route == RT_WATCH) {
        /* Its own WATCH, sent again ahead of the lost transaction: the
         * watch is lost anyway (EXEC answers the conflict); sent, it would
         * stay on the link for whoever has it next. */
        s->f->session_ops->answer_str(s, r, "+OK\r\n");
        return 1;
    }
    if (s->tx == TX_WATCH_LOST) {
        if (r->route == RT_MULTI) {
            tx_set(s, TX_MULTI_WATCH_LOST);
            s->f->session_ops->answer_str(s, r, "+OK\r\n");
            return 1;
        }
        if (r->route == RT_WATCH) {
            s->f->session_ops->answer_str(s, r, "+OK\r\n"); /* EXEC fails anyway */
            return 1;
        }
        if (r->route == RT_UNWATCH) {
            tx_set(s, TX_NONE);
            s->f->session_ops->answer_str(s, r, "+OK\r\n");
            return 1;
        }
        if (r->route == RT_EXEC || r->route == RT_DISCARD) {
            tx_set(s, TX_NONE); /* without MULTI: Redis answers the error */
        }
    }
    return 0;
}

int tx_must_wait(const session *s, const request *r)
{
    /* The state is tracked for one transaction at a time, so a new one
     * starts once the EXEC before it is answered (else ferry would take the
     * new MULTI or WATCH for none and put its own WAIT or PING in it, or
     * pool the link). */
    return (r->route == RT_MULTI || r->route == RT_WATCH) &&
           (s->tx == TX_EXEC_SENT || s->tx == TX_EXEC_SENT_WATCHED);
}

void tx_on_send(session *s, request *r, int ack)
{
    if (s->f->cluster != NULL && session_extra_r(s)->tx_pin == 0 && r->slot >= 0 &&
        (tx_in_multi(s) ? r->route != RT_WATCH : r->route == RT_WATCH)) {
        /* The transaction's slot: WATCH's keys, or the first keys inside
         * MULTI (a keyless command before them went along). */
        session_extra_w(s)->tx_pin = r->slot + 1;
        log_debug("client %llu: transaction pinned to slot %d", (unsigned long long)s->id, r->slot);
    }
    switch (r->route) {
    case RT_MULTI:
        if (s->tx == TX_NONE || s->tx == TX_WATCHING) {
            tx_set(s, s->tx == TX_NONE ? TX_MULTI : TX_MULTI_WATCHING);
            session_extra_w(s)->tx_seq = r->seq;
        }
        break;
    case RT_EXEC:
        if (tx_in_multi(s)) {
            /* One WAIT after EXEC covers the whole transaction. */
            if (session_extra_r(s)->tx_writes) {
                r->flags |= REQ_F_WRITE;
                if (ack) {
                    r->flags |= REQ_F_ACK;
                }
            }
            tx_set(s, s->tx == TX_MULTI_WATCHING ? TX_EXEC_SENT_WATCHED : TX_EXEC_SENT);
        }
        break;
    case RT_DISCARD:
        if (tx_in_multi(s)) {
            tx_set(s, TX_NONE);
        }
        break;
    case RT_WATCH:
        if (s->tx == TX_NONE) {
            tx_set(s, TX_WATCHING);
        }
        break;
    case RT_UNWATCH:
        if (s->tx == TX_WATCHING) {
            tx_set(s, TX_NONE);
        }
        break;
    default:
        break;
    }
}

int tx_queue(session *s, request *r)
{
    if (!tx_in_multi(s) || tx_precedes(s, r) || r->route == RT_MULTI || r->route == RT_EXEC ||
        r->route == RT_DISCARD || r->route == RT_WATCH) {
        return 0;
    }
    r->flags |= REQ_F_TXLOG; /* queued: kept to rebuild the transaction */
    if (r->flags & REQ_F_WRITE) {
        session_extra_w(s)->tx_writes = 1;
    }
    return 1;
}

void tx_on_reply(session *s, request *r, const char *p, size_t n)
{
    int open = s->tx == TX_MULTI || s->tx == TX_MULTI_WATCHING || s->tx == TX_EXEC_SENT ||
               s->tx == TX_EXEC_SENT_WATCHED;
    if ((r->flags & REQ_F_TXLOG) && n > 0 && p[0] == '-' && open) {
        /* Redis refused it and aborts EXEC: so must the transaction
         * rebuilt on another link (after a failover; cluster mode: moved
         * to its first key's shard), which lacks it. */
        if (!session_extra_r(s)->tx_dirty) {
            session_extra_w(s)->tx_dirty = TX_DIRTY_REDIS;
        }
    }
    if ((r->flags & REQ_F_TXLOG) && n > 0 && p[0] == '+' && open) {
        /* Queued by Redis (EXEC may be on its way already): kept, so a
         * transaction whose link breaks is rebuilt with every command. */
        buf_append(&session_extra_w(s)->tx_log, buf_head(&r->data), buf_used(&r->data));
    }
    if (r->route == RT_EXEC && (s->tx == TX_EXEC_SENT || s->tx == TX_EXEC_SENT_WATCHED)) {
        tx_set(s, TX_NONE);
    }
}

/* The state a transaction goes to when the link carrying it breaks. */
static tx_state tx_after_loss(tx_state st)
{
    switch (st) {
    case TX_WATCHING:
        return TX_WATCH_LOST;
    case TX_MULTI:
    case TX_EXEC_SENT:
        return TX_MULTI_REBUILD;
    case TX_MULTI_WATCHING:
    case TX_EXEC_SENT_WATCHED:
        return TX_MULTI_WATCH_LOST;
    default:
        return st;
    }
}

void tx_on_link_lost(session *s)
{
    tx_set(s, tx_after_loss(s->tx));
}

/* Replies to the rebuilt MULTI and its commands are dropped (the client
 * had its +QUEUED already). */
static void tx_rebuilt_cb(link *l, request *r, const char *reply, size_t len)
{
    session *s = l->owner;
    link_refusal refusal = link_reply_refusal(reply, len);
    if (s != NULL &&
        ((s->f->cluster != NULL && refusal == REFUSAL_REDIRECT) || refusal == REFUSAL_NOT_MASTER ||
         (refusal == REFUSAL_NOREPLICAS && !upstream_settled(l->up, l)))) {
        /* CLUSTERDOWN, TRYAGAIN, MOVED; READONLY, LOADING; a new master
         * without its replicas yet: Redis aborts the transaction; its EXEC
         * is refused and the transaction rebuilt again. */
        session_extra_w(s)->tx_spoiled = 1;
    }
    if (len > 0 && reply[0] == '-') {
        char why[200];
        link_error_text(reply, len, why, sizeof(why));
        log_warn("link %llu: rebuilding a transaction: Redis refused a queued command: %s",
                 (unsigned long long)l->id, why);
    }
}

/* Rebuild an open MULTI on a new dedicated link: MULTI and every command
 * Redis had queued (its tx_log), sent as ferry's own requests. */
void tx_on_lend(session *s, link *l)
{
    static const char multi[] = "*1\r\n$5\r\nMULTI\r\n";
    if (s->tx != TX_MULTI_REBUILD || s->tx_deferred == TX_DEFER_BEHIND) {
        return;
    }
    link_internal_raw(l, multi, sizeof(multi) - 1, tx_rebuilt_cb);
    size_t n = link_internal_each(l, &session_extra_r(s)->tx_log, tx_rebuilt_cb);
    tx_set(s, TX_MULTI);
    session_extra_w(s)->tx_spoiled = 0;
    if (s->tx_deferred) {
        /* Cluster mode: opened (or moved to its first key's shard), not
         * rebuilt after a failure. */
        s->tx_deferred = 0;
        log_debug("client %llu: transaction opened on link %llu (%zu command(s) queued before)",
                  (unsigned long long)s->id, (unsigned long long)l->id, n);
        return;
    }
    s->f->stats.transactions_rebuilt++;
    log_info("client %llu: transaction rebuilt on link %llu (%zu command(s) queued again)",
             (unsigned long long)s->id, (unsigned long long)l->id, n);
}

void tx_forget(session *s)
{
    tx_set(s, TX_NONE);
    if (s->extra != NULL) {
        buf_free(&s->extra->tx_log);
    }
}

/* ---------------------------------------------------------- cluster mode
 *
 * A transaction lives on one node: it is pinned to the slot of WATCH's
 * keys or of the first keys inside MULTI. MULTI alone is answered by
 * ferry and sent with the first command, on the link of that command's
 * shard; keyless commands before any key go to any master, and the
 * transaction moves (closed there, rebuilt from its log) when its first
 * key lives elsewhere. */

/* The states in which s's next requests belong to its transaction. */
static int tx_holds_slot(const session *s)
{
    switch (s->tx) {
    case TX_WATCHING:
    case TX_WATCH_LOST:
    case TX_MULTI:
    case TX_MULTI_WATCHING:
    case TX_MULTI_REBUILD:
    case TX_MULTI_WATCH_LOST:
        return 1;
    default:
        return 0;
    }
}

int tx_route_slot(const session *s, const request *r, int *where_dlink)
{
    *where_dlink = 0;
    if (!tx_holds_slot(s)) {
        return r->slot;
    }
    if (session_extra_r(s)->tx_pin > 0) {
        return session_extra_r(s)->tx_pin - 1;
    }
    if (r->slot >= 0 && r->route != RT_WATCH) {
        return r->slot; /* its first key: the transaction goes there */
    }
    *where_dlink = s->dlink != NULL; /* keyless: where it is already */
    return -1;
}

int tx_crossslot(session *s, request *r)
{
    int pin = session_extra_r(s)->tx_pin;
    if (s->f->cluster == NULL || pin == 0 || r->slot < 0 || r->slot == pin - 1 ||
        !tx_holds_slot(s) || (r->route == RT_WATCH && tx_in_multi(s))) {
        return 0;
    }
    if (tx_in_multi(s)) {
        /* EXEC aborts, as a node's EXEC after a refusal */
        session_extra_w(s)->tx_dirty = TX_DIRTY_FERRY;
    }
    clustermap_count_crossslot(s->f->cluster);
    s->f->session_ops->answer_str(s, r,
                                  "-CROSSSLOT Keys in request don't hash to the same slot\r\n");
    return 1;
}

int tx_cluster_answer(session *s, request *r)
{
    if (s->f->cluster != NULL && r->route == RT_WATCH && tx_in_multi(s)) {
        /* Redis' answer (the transaction goes on); sent, it would reach a
         * node that may not serve the key and answers MOVED instead. */
        s->f->session_ops->answer_str(s, r, "-ERR WATCH inside MULTI is not allowed\r\n");
        return 1;
    }
    if (s->f->cluster == NULL || r->route != RT_MULTI || s->tx != TX_NONE) {
        return 0;
    }
    tx_set(s, TX_MULTI_REBUILD); /* an empty log: MULTI goes with the first command */
    session_extra_w(s)->tx_seq = r->seq;
    s->tx_deferred = 1;
    s->f->session_ops->answer_str(s, r, "+OK\r\n");
    return 1;
}

int tx_on_move(session *s)
{
    int carried = s->tx != TX_NONE;
    if (carried && session_extra_r(s)->tx_pin == 0) {
        s->tx_deferred = 1; /* to its first key's shard: not a failure */
    }
    tx_on_link_lost(s);
    return carried;
}

int tx_refused_doomed(const session *s, const request *r, const char *p, size_t n)
{
    if (!((r->flags & REQ_F_TXLOG) || r->route == RT_EXEC)) {
        return 0;
    }
    return (s->f->cluster != NULL && link_reply_refusal(p, n) == REFUSAL_REDIRECT) ||
           (r->route == RT_EXEC && session_extra_r(s)->tx_spoiled);
}
