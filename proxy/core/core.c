/* core.c - the context's life: start-up, the per-turn flush that coalesces
 * every session's and link's output into one write each, the periodic tick
 * (timeouts, health pings, reconnects), signals and graceful shutdown. */
#include "core.h"

#include <signal.h>
#include <sys/resource.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backlog.h"
#include "clustermap.h"
#include "fence.h"
#include "instance.h"
#include "lease.h"
#include "link.h"
#include "log.h"
#include "outage.h"
#include "queues.h"
#include "clients.h"
#include "receipts.h"
#include "router.h"
#include "sentinel.h"
#include "server.h"
#include "shard.h"
#include "session.h"
#include "takeover.h"
#include "scripts.h"
#include "tls.h"
#include "upstream.h"
#include "workers.h"

#define TICK_MS 50
#define FLUSH_ROUNDS 8 /* flush rounds in one loop turn */
#define FD_RESERVE 256 /* descriptors beyond client.max_clients: links, listeners, logs */

/* Once per loop turn, right before it waits for I/O. Writes done at once
 * have no callback to come: what they set going (a client read again once
 * its replies left, sending on a link) is flushed in the same turn, in up
 * to FLUSH_ROUNDS rounds (the rest waits for the next turn, at the latest
 * the tick). */
static void flush_cb(uv_prepare_t *h)
{
    ferry *f = h->data;
    for (int round = 0; round < FLUSH_ROUNDS; round++) {
        if (f->wake_pending) {
            f->wake_pending = 0;
            backlog_wake_all(f);
        }
        receipts_flush(f);
        while (!list_empty(&f->dirty_links)) {
            list_node *n = list_first(&f->dirty_links);
            link *l = list_entry(n, link, dirty_node);
            list_del(n);
            link_flush(l);
        }
        session_flush_all(f);
        if (list_empty(&f->dirty_links) && !f->wake_pending) {
            break;
        }
    }
}

/* What the context owns outside any handle. */
static void core_free_buffers(ferry *f)
{
    while (!list_empty(&f->free_reqs)) {
        list_node *n = list_first(&f->free_reqs);
        request *r = list_entry(n, request, sq);
        list_del(n);
        buf_free(&r->data);
        buf_free(&r->reply);
        free(r);
    }
    f->nfree_reqs = 0;
    backlog_free(f);
    free(f->rbuf);
    f->rbuf = NULL;
    resp_parser_free(f->parser);
    f->parser = NULL;
    free(f->av);
    free(f->al);
    f->av = NULL;
    f->al = NULL;
    f->acap = 0;
}

static void close_everything(ferry *f)
{
    if (f->closed) {
        return;
    }
    f->closed = 1;
    workers_close(f); /* the main loop's workers close too */
    server_stop(f);
    stats_stop(f);
    session_stop_all(f, 1);
    if (f->sentinel != NULL) {
        sentinel_close(f->sentinel);
    }
    if (f->up != NULL) {
        upstream_close(f->up);
    }
    if (f->cluster != NULL) {
        clustermap_close(f->cluster);
    }
    outage_close(f);
    takeover_close(f); /* after the store: the next process may open it now */
    uv_prepare_stop(&f->flush);
    uv_timer_stop(&f->tick);
    uv_close((uv_handle_t *)&f->flush, NULL);
    uv_close((uv_handle_t *)&f->tick, NULL);
    if (f->worker_index == 0) {
        sigset_t set, old;
        core_stop_signals(&set);
        pthread_sigmask(SIG_BLOCK, &set, &old);
        uv_close((uv_handle_t *)&f->sig_term, NULL);
        uv_close((uv_handle_t *)&f->sig_int, NULL);
        uv_close((uv_handle_t *)&f->sig_hup, NULL);
        /* libuv puts back the default action once the last handle of a
         * signal is closed: a SIGTERM or a logrotate SIGHUP arriving while
         * the process winds down would then kill it with work unflushed
         * and a non-zero status. It is stopping anyway: ignore them. The
         * other threads never take these signals, and this one blocks them
         * meanwhile, so one sent in between waits and is then dropped. */
        signal(SIGTERM, SIG_IGN);
        signal(SIGINT, SIG_IGN);
        signal(SIGHUP, SIG_IGN);
        pthread_sigmask(SIG_SETMASK, &old, NULL);
    }
    workers_loop_close(f);
}

void core_close(ferry *f)
{
    close_everything(f);
}

static void tick_cb(uv_timer_t *h)
{
    ferry *f = h->data;
    uint64_t now = uv_now(f->loop);

    if (f->sentinel != NULL && !f->closed) {
        sentinel_tick(f->sentinel, now);
    }
    if (f->up != NULL) {
        upstream_tick(f->up, now);
    }
    if (f->cluster != NULL) {
        clustermap_tick(f->cluster, now);
    }
    outage_tick(f, now);
    queues_tick(f, now);
    lease_tick(f, now);
    receipts_tick(f);
    clients_tick(f);
    backlog_tick(f, now);
    session_tick(f, now);
    takeover_tick(f, now);
    workers_tick(f);
    if (f->stopping && !f->closed) {
        session_stop_all(f, 0);
        if (f->nclients == 0 && workers_running(f) == 0) {
            if (f->worker_index == 0) {
                log_info("all clients done; exiting");
            }
            close_everything(f);
        } else if (now >= f->stop_deadline) {
            log_warn("shutdown timeout: closing %llu client(s) with work in flight%s",
                     (unsigned long long)f->nclients,
                     workers_running(f) > 0 ? " and the workers still busy" : "");
            close_everything(f);
        }
    }
}

void core_stop(ferry *f, const char *why)
{
    if (f->stopping) {
        return;
    }
    log_info("stopping (%s): no new clients, finishing requests in flight", why);
    f->stopping = 1;
    f->stop_deadline = uv_now(f->loop) + f->cfg->shutdown_timeout_ms;
    server_stop(f);
    session_stop_all(f, 0);
    workers_stop(f, why);
}

void core_stop_signals(sigset_t *set)
{
    sigemptyset(set);
    sigaddset(set, SIGTERM);
    sigaddset(set, SIGINT);
    sigaddset(set, SIGHUP);
}

static void pool_noop(uv_work_t *w)
{
    (void)w;
}

static void pool_noop_done(uv_work_t *w, int status)
{
    (void)w;
    (void)status;
}

void core_threads_without_signals(void)
{
    sigset_t set;
    core_stop_signals(&set);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    /* libuv starts its whole threadpool at the first work request: start
     * it now, on a loop of its own, so its threads inherit the mask. */
    uv_loop_t tmp;
    uv_work_t w;
    if (uv_loop_init(&tmp) == 0) {
        if (uv_queue_work(&tmp, &w, pool_noop, pool_noop_done) == 0) {
            uv_run(&tmp, UV_RUN_DEFAULT);
        }
        uv_loop_close(&tmp);
    }
}

void core_signals_here(void)
{
    sigset_t set;
    core_stop_signals(&set);
    pthread_sigmask(SIG_UNBLOCK, &set, NULL);
}

static void signal_cb(uv_signal_t *h, int signum)
{
    ferry *f = h->data;
    if (signum == SIGHUP) {
        int rc = log_reopen();
        if (rc < 0) {
            log_error("SIGHUP: cannot reopen the log file: %s", uv_strerror(rc));
        } else {
            log_info("SIGHUP: log file reopened");
        }
        if (f->tls != NULL &&
            (f->tls->clients != NULL || f->tls->redis != NULL || f->tls->sentinel != NULL)) {
            /* New connections take the new files; open ones keep theirs. */
            char err[600];
            if (tls_roles_reload(f->tls, f->cfg, err, sizeof(err)) < 0) {
                log_error("SIGHUP: TLS files not reloaded, the old ones stay: %s", err);
            } else {
                log_info("SIGHUP: TLS certificates and keys reloaded");
            }
        }
        return;
    }
    if (f->stopping) {
        log_warn("second %s: exiting now", signum == SIGINT ? "SIGINT" : "SIGTERM");
        close_everything(f);
        return;
    }
    core_stop(f, signum == SIGINT ? "SIGINT" : "SIGTERM");
}

/* Each client is a descriptor: raise the soft RLIMIT_NOFILE (up to the hard
 * limit) so client.max_clients can be reached at all. */
static void raise_fd_limit(const config *cfg)
{
    struct rlimit rl;
    rlim_t want = (rlim_t)cfg->max_clients + FD_RESERVE;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur >= want) {
        return;
    }
    rlim_t old = rl.rlim_cur;
    rl.rlim_cur = rl.rlim_max != RLIM_INFINITY && rl.rlim_max < want ? rl.rlim_max : want;
    if (rl.rlim_cur > old && setrlimit(RLIMIT_NOFILE, &rl) == 0) {
        log_info("open files limit (RLIMIT_NOFILE) raised from %llu to %llu for "
                 "client.max_clients %d",
                 (unsigned long long)old, (unsigned long long)rl.rlim_cur, cfg->max_clients);
    }
    if (rl.rlim_cur < want) {
        log_warn("open files limit (RLIMIT_NOFILE) is %llu (hard limit): fewer than "
                 "client.max_clients %d clients can connect",
                 (unsigned long long)rl.rlim_cur, cfg->max_clients);
    }
}

/* What every loop's context needs: lists, buffers, the deny list, the
 * per-turn flush and the tick (not started). */
/* The upward calls of a link, wired to the modules above it. */
static const link_ops core_link_ops = {
    .auth_done = fence_auth_done,
    .user_auth_done = fence_user_auth_done,
    .verify = fence_verify,
    .wait = fence_wait,
    .bracket = fence_bracket_batch,
    .hold = fence_hold,
    .drop_held = fence_drop_held,
    .on_not_master = upstream_on_not_master,
    .on_error = upstream_on_link_error,
    .on_closing = upstream_on_link_closing,
    .detach = upstream_detach,
    .on_closed = upstream_on_link_closed,
    .on_returned = upstream_on_returned,
    .on_reply = router_on_reply,
    .on_refused = router_on_refused,
    .on_lost = router_on_lost,
    .reshape = receipts_reshape,
    .on_stream = session_on_stream,
    .on_push = session_on_push,
};

/* What workers asks of the modules above it. */
/* ---- cluster mode with workers: N (clustermap.h) ---- */

/* A worker loop: a map the main loop sent (arg holds a reference). */
static void cluster_map_on_loop(ferry *f, void *arg)
{
    if (f != NULL && f->cluster != NULL) {
        clustermap_apply(f->cluster, arg);
    } else {
        clustermap_snap_release(arg);
    }
}

/* Main loop: a new map to every worker loop, in their mailboxes' order. */
static void core_cluster_publish(ferry *f, clustermap_snap *snap)
{
    for (int i = 1; i < workers_loops(f); i++) {
        clustermap_snap_hold(snap);
        if (workers_call(f, i, cluster_map_on_loop, snap) != 0) {
            clustermap_snap_release(snap); /* that loop reads no more */
        }
    }
}

/* The main loop: a worker asked for the map (arg: why, allocated). */
static void cluster_refresh_on_main(ferry *f, void *arg)
{
    if (f != NULL && f->cluster != NULL) {
        clustermap_refresh(f->cluster, arg);
    }
    free(arg);
}

/* A worker loop: ask the main loop's source for the map now. */
static void core_cluster_refresh(ferry *f, const char *why)
{
    char *copy = xstrdup(why);
    if (workers_call(f, 0, cluster_refresh_on_main, copy) != 0) {
        free(copy); /* the main loop reads no more: ferry is stopping */
    }
}

static const clustermap_ops core_cluster_ops = {
    .publish = core_cluster_publish,
    .refresh = core_cluster_refresh,
};

/* A worker loop publishes its figures: its shards' too. */
static void core_publish(ferry *f)
{
    if (f->cluster != NULL) {
        clustermap_publish(f->cluster);
    }
}

static const workers_ops core_workers_ops = {
    .init = core_init_worker,
    .close = core_close,
    .release = core_release,
    .accept = session_accept,
    .accept_fd = session_accept_fd,
    .set_master = upstream_set_master,
    .switch_master = upstream_switch,
    .master_name = upstream_name,
    .trigger_sentinel = sentinel_trigger,
    .ask_replica_acks = sentinel_ask_replica_acks,
    .store_attach = outage_attach,
    .store_run = outage_remote_run,
    .store_done = outage_remote_done,
    .store_drop = outage_remote_drop,
    .hand_clients = takeover_worker_hand,
    .hand_abort = takeover_worker_abort,
    .adopt = takeover_adopt,
    .publish = core_publish,
};

/* What the outage reports to the router. */
static const outage_ops core_outage_ops = {
    .on_reply = router_on_reply,
    .requeue = router_requeue,
};

/* What the router and its helpers ask of the session. */
static const session_ops core_session_ops = {
    .answer = session_answer,
    .answer_str = session_answer_str,
    .flush_answered = session_flush_answered,
    .check_reading = session_check_reading,
    .on_push = session_on_push,
    .unlink = session_unlink,
    .set_state = session_set_state,
    .close = session_close,
};

/* A shard's master was lost (cluster mode): ask the cluster for its map. */
static void core_refresh_cluster(ferry *f, const char *why)
{
    if (f->cluster != NULL) {
        clustermap_refresh(f->cluster, why);
    }
}

/* What the shard side (upstream, fence) reports upward. */
static const shard_ops core_shard_ops = {
    .on_reply = router_on_reply,
    .on_lost = router_on_lost,
    .multi_open = router_multi_open,
    .link_bound = router_link_bound,
    .holds_state = router_holds_state,
    .on_link_closed = router_on_link_closed,
    .close_session = session_close,
    .redo_tx = receipts_tx_redo,
    .trigger_sentinel = sentinel_trigger,
    .ask_replica_acks = sentinel_ask_replica_acks,
    .refresh_cluster = core_refresh_cluster,
};

/* A client a listener accepted: to a loop of workers', or served here. */
static int core_accept(ferry *f, uv_stream_t *st, int is_unix)
{
    return f->workers != NULL ? workers_accept(f, st, is_unix) : session_accept(f, st, is_unix);
}

static void core_setup(ferry *f, uv_loop_t *loop, config *cfg)
{
    memset(f, 0, sizeof(*f));
    f->loop = loop;
    f->cfg = cfg;
    f->id_step = 1;
    f->unhold = backlog_forget;
    f->redispatch = router_dispatch;
    f->link_ops = &core_link_ops;
    f->accept = core_accept;
    f->claim_listener = takeover_claim_listener;
    f->stop = core_stop;
    f->workers_ops = &core_workers_ops;
    f->outage_ops = &core_outage_ops;
    f->shard_ops = &core_shard_ops;
    f->session_ops = &core_session_ops;
    loop->data = f;
    f->limits.max_bulk_len = cfg->max_bulk_len;
    f->limits.max_args = cfg->max_args;
    f->limits.max_inline_len = cfg->max_inline_len;
    list_init(&f->sessions);
    list_init(&f->waiting);
    list_init(&f->dirty);
    list_init(&f->dirty_links);
    list_init(&f->free_reqs);
    list_init(&f->over_soft);
    list_init(&f->mem_paused);
    list_init(&f->partial);
    list_init(&f->handshaking);
    list_init(&f->idle);
    list_init(&f->watching);
    f->rbuf = xmalloc(FERRY_READ_BUF);
    f->parser = resp_parser_new(&f->limits);
    f->started_ms = uv_now(loop);

    /* Resolve the deny list once; entries Redis 7.0 does not know are kept
     * out (a warning names them). */
    for (int i = 0; i < cfg->ndeny; i++) {
        const char *words[2];
        size_t lens[2];
        char tmp[128];
        snprintf(tmp, sizeof(tmp), "%s", cfg->deny[i]);
        char *sp = strchr(tmp, ' ');
        size_t n = 1;
        words[0] = tmp;
        if (sp != NULL) {
            *sp = '\0';
            words[1] = sp + 1;
            lens[1] = strlen(sp + 1);
            n = 2;
        }
        lens[0] = strlen(tmp);
        const command *c = command_lookup_argv(n, words, lens);
        if (c == NULL || (n == 2 && c->sub != NULL)) {
            log_warn("deny: '%s' is not a Redis 7.0 command; ignored", cfg->deny[i]);
            continue;
        }
        f->deny[f->ndeny++] = c;
    }

    uv_prepare_init(loop, &f->flush);
    f->flush.data = f;
    uv_prepare_start(&f->flush, flush_cb);
    uv_timer_init(loop, &f->tick);
    f->tick.data = f;
}

int core_init_worker(ferry *f, uv_loop_t *loop, config *cfg, struct workers *wk, int index,
                     uint64_t base_id)
{
    core_setup(f, loop, cfg);
    f->tls = workers_main_ctx(wk)->tls;         /* the contexts are every loop's */
    f->scripts = workers_main_ctx(wk)->scripts; /* one memory for every loop */
    f->instance = workers_main_ctx(wk)->instance;
    f->workers = wk;
    f->worker_index = index;
    f->id_step = (uint64_t)cfg->workers;
    f->next_id = base_id + (uint64_t)index; /* ids base + index + k * workers, k >= 1 */
    f->up = upstream_new(f);                /* with Sentinel: connects once told of a master */
    if (cfg->has_cluster) {
        /* Its shards' views follow the maps the main loop sends. */
        f->cluster = clustermap_new_follower(f, &core_cluster_ops, workers_main_ctx(wk)->cluster);
    }
    if (f->up == NULL) {
        close_everything(f);
        uv_run(loop, UV_RUN_DEFAULT);
        core_release(f);
        return FERRY_ECONFIG;
    }
    lease_open(f); /* the paused consumers (consumer_backoff), not the expiry */
    uv_timer_start(&f->tick, tick_cb, TICK_MS, TICK_MS);
    return 0;
}

int core_init(ferry *f, uv_loop_t *loop, config *cfg, struct tls_roles *roles, struct takeover *tk)
{
    core_setup(f, loop, cfg);
    f->tls = roles;
    f->scripts = scripts_new(cfg->scripts_remember_max_bytes);
    f->takeover = tk;
    f->instance = instance_new(cfg, tk != NULL);
    raise_fd_limit(cfg);
    uv_signal_init(loop, &f->sig_term);
    uv_signal_init(loop, &f->sig_int);
    uv_signal_init(loop, &f->sig_hup);
    f->sig_term.data = f->sig_int.data = f->sig_hup.data = f;
    uv_signal_start(&f->sig_term, signal_cb, SIGTERM);
    uv_signal_start(&f->sig_int, signal_cb, SIGINT);
    uv_signal_start(&f->sig_hup, signal_cb, SIGHUP);
    signal(SIGPIPE, SIG_IGN);

    int rc = server_start(f);
    if (rc == 0) {
        rc = stats_start(f);
    }
    if (rc == 0) {
        rc = takeover_start(f);
    }
    if (rc == 0 && takeover_store_free(f) && f->outage == NULL) {
        rc = outage_open(f); /* else once the process taken over has let go of it */
    }
    if (rc == 0) {
        f->up = upstream_new(f); /* a master name resolves later, off the loop */
        rc = f->up == NULL ? FERRY_ECONFIG : 0;
    }
    if (rc == 0 && cfg->has_cluster) {
        /* f->up stays without a master: what has no shard waits there.
         * Before the workers: theirs publish on its board. */
        f->cluster = clustermap_new(f, &core_cluster_ops);
    }
    if (rc == 0) {
        rc = workers_start(f); /* no worker is left running if it fails */
    }
    if (rc < 0) {
        close_everything(f);
        uv_run(loop, UV_RUN_DEFAULT);
        core_release(f);
        return rc;
    }
    if (cfg->has_sentinel) {
        f->sentinel = sentinel_new(f);
    }
    queues_open(f);
    lease_open(f);
    uv_timer_start(&f->tick, tick_cb, TICK_MS, TICK_MS);
    return 0;
}

int core_run(ferry *f)
{
    uv_run(f->loop, UV_RUN_DEFAULT);
    workers_join(f); /* their loops ended with the main one's */
    core_release(f);
    return f->exit_code;
}

void core_release(ferry *f)
{
    sentinel_free(f->sentinel);
    f->sentinel = NULL;
    clustermap_free(f->cluster);
    f->cluster = NULL;
    if (f->up != NULL) {
        upstream_free(f->up);
        f->up = NULL;
    }
    server_free(f);
    stats_free(f);
    queues_free(f);
    lease_free(f);
    receipts_free(f);
    clients_free(f);
    if (f->worker_index == 0) {
        scripts_free(f->scripts); /* the workers' loops have ended (workers_join) */
        instance_free(f->instance);
    }
    f->scripts = NULL;
    f->instance = NULL;
    core_free_buffers(f);
    takeover_free(f);
}
