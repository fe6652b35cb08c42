/* takeover.c - restarting ferry without its clients noticing.
 *
 *   new process (ferry --takeover PATH)      old process (takeover.socket PATH)
 *   connect ------------- HELLO ------------->
 *           <------- LISTENERS + fds ---------  client listeners, stats, takeover
 *   accepts on them too; finds and
 *   verifies the master (at most
 *   TAKEOVER_READY_MS)                          its clients see nothing meanwhile
 *           ------------ ACCEPTING ---------->  closes its copies (stops accepting;
 *                                               the sockets never close: nothing
 *                                               is refused), stops reading clients
 *           <-------- SESSION + fd -----------  a session with nothing in flight
 *           <-------- SESSION + fd -----------  and no unwritten output, or blocked
 *           <-------- ...                       in a pop whose call it cancelled
 *           <------------ DONE ---------------  after closing the fallback store
 *   opens the store, listens on                 exits 0
 *   takeover.socket
 *
 * A frame (takeover_wire.c, with the session state it carries) is a
 * header (payload length, type | fd count << 16, both uint32 in
 * host order: both ends run on one machine) and a payload. Its fds ride
 * (SCM_RIGHTS) on the sendmsg that carries the header's first byte, so they
 * are in hand once the frame is complete; the receiver queues them in
 * arrival order. Raw sendmsg/recvmsg rather than libuv's IPC pipes (uv_write2
 * / uv_pipe_pending_*): the framing and which fd belongs to which frame stay
 * ours, and listening sockets of both kinds travel the same way. Received
 * sockets are opened with uv_tcp_open / uv_pipe_open; the control sockets
 * are watched with uv_poll. The old process's sends wait (poll) at most
 * TAKEOVER_SEND_TIMEOUT_MS: the new one reads in its loop, so they complete
 * at once unless it is stuck, and then the takeover is aborted.
 *
 * A blocked call (BRPOP q 0 in flight on a dedicated link) is cancelled on
 * the old process first: CLIENT UNBLOCK <id> TIMEOUT from a shared link. A
 * null reply on the dedicated link means nothing was popped, and the call is
 * re-issued by the new process with what is left of its timeout; anything
 * else is the call's own reply (Redis served it first), written to the
 * client before the session goes over idle. Without a client id or a shared
 * link, the dedicated link is closed instead, as when a client leaves.
 *
 * With workers: N, the main loop holds the takeover socket and the
 * conversation on both sides. Old process: on ACCEPTING it tells every
 * worker (workers_takeover_hand); each loop hands its own sessions over
 * with its own links (a blocked call is cancelled on that loop's upstream),
 * a worker posting each session's frame and a copy of its socket to the
 * relay (a queue under a mutex and a uv_async on the main loop), which the
 * main loop sends in the order posted. Every loop's clients gone and the
 * relay empty: all handed over. New process: ACCEPTING only once every
 * loop's master view is UP; each session received is adopted by the next
 * loop in turn (workers_adopt), its frame decoded there. The loop counts
 * of the two processes need not match.
 *
 * The two sides live in two files: this one holds the new process's side
 * (connect, receive the listeners and the sessions, wait for every loop's
 * master view to be UP), the control connection's reader and what both
 * sides share; takeover_source.c holds the old process's side (handing
 * sessions over, cancelling blocked calls, the workers' relay, the abort).
 * Their shared state and helpers: takeover_int.h. */
#include "takeover.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#define link posix_link /* unistd.h's link(2) would clash with ferry's link type */
#include <unistd.h>
#undef link

#include "clustermap.h"
#include "core.h"
#include "log.h"
#include "outage.h"
#include "takeover_int.h"
#include "upstream.h"
#include "workers.h"

#define TAKEOVER_READY_MS 5000 /* new: longest wait for a master before ACCEPTING */
_Static_assert(TAKEOVER_READY_MS <= TAKEOVER_HANDSHAKE_MS / 2,
               "the old process gives up on a handshake after TAKEOVER_HANDSHAKE_MS");

static void tk_ready_cb(uv_timer_t *t);
static void tk_sink_finish(takeover *tk, const char *why);

/* ------------------------------------------------------------------ phases */

static const char *tk_phase_name(tk_phase p)
{
    static const char *const names[] = {"IDLE",        "SRC_HELLO",     "SRC_LISTENERS",
                                        "SRC_HANDING", "SRC_FINISHING", "SINK_READYING",
                                        "SINK"};
    return names[p];
}

void tk_set_phase(takeover *tk, tk_phase p)
{
    static const unsigned legal[] = {
        [TK_IDLE] = 1u << TK_SRC_HELLO | 1u << TK_SRC_HANDING, /* the latter: a worker */
        [TK_SRC_HELLO] = 1u << TK_SRC_LISTENERS | 1u << TK_IDLE,
        [TK_SRC_LISTENERS] = 1u << TK_SRC_HANDING | 1u << TK_IDLE,
        [TK_SRC_HANDING] = 1u << TK_SRC_FINISHING | 1u << TK_IDLE,
        [TK_SRC_FINISHING] = 0,
        [TK_SINK_READYING] = 1u << TK_SINK | 1u << TK_IDLE,
        [TK_SINK] = 1u << TK_IDLE,
    };
    if (tk->phase == p) {
        return;
    }
    ferry_assert(legal[tk->phase] & (1u << p));
    log_debug("takeover: %s -> %s", tk_phase_name(tk->phase), tk_phase_name(p));
    tk->phase = p;
}

/* The new process, before it is done receiving. */
static int tk_is_sink(const takeover *tk)
{
    return tk->phase == TK_SINK_READYING || tk->phase == TK_SINK;
}

/* --------------------------------------------------------------- handles */

void tk_free_handle_cb(uv_handle_t *h)
{
    free(h);
}

int tk_watch(takeover *tk, int fd, uv_poll_t **hp, uv_poll_cb cb)
{
    uv_poll_t *h = xmalloc(sizeof(*h));
    int rc = uv_poll_init(tk->f->loop, h, fd);
    if (rc < 0) {
        free(h);
        return rc;
    }
    h->data = tk;
    *hp = h;
    return uv_poll_start(h, UV_READABLE, cb);
}

void tk_unwatch(uv_poll_t **hp, int *fd)
{
    if (*hp != NULL) {
        uv_close((uv_handle_t *)*hp, tk_free_handle_cb); /* stops it first */
        *hp = NULL;
    }
    if (*fd >= 0) {
        close(*fd);
        *fd = -1;
    }
}

takeover *tk_new(ferry *f)
{
    takeover *tk = xcalloc(1, sizeof(*tk));
    tk->f = f;
    tk->lfd = -1;
    tk->cfd = -1;
    buf_init(&tk->in.rx);
    return tk;
}

/* Listen on the unix socket path (a stale file is replaced). */
static int tk_listen(takeover *tk, const char *path)
{
    struct sockaddr_un sa;
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        return -errno;
    }
    memset(&sa, 0, sizeof(sa));
    sa.sun_family = AF_UNIX;
    snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
    unlink(path);
    /* Only ferry's own system user may connect (what comes over it: every
     * client connection, and client.auth redis users' passwords): the mode
     * is set before listen, so nobody connects meanwhile. */
    if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0 || chmod(path, 0600) != 0 ||
        listen(fd, 8) != 0) {
        int rc = -errno;
        close(fd);
        return rc;
    }
    snprintf(tk->lpath, sizeof(tk->lpath), "%s", path);
    tk->lpath_owned = 1;
    tk->lfd = fd;
    return tk_watch(tk, fd, &tk->lpoll, tk_listener_cb);
}

/* Listen for the next takeover: on the inherited socket when it is the
 * configured path, else on a fresh one. */
static void tk_listen_configured(takeover *tk)
{
    const char *path = tk->f->cfg->takeover_socket;
    for (int i = 0; i < tk->ninh; i++) {
        tk_inherited *in = &tk->inh[i];
        if (in->kind == TK_L_TAKEOVER && in->fd >= 0) {
            if (path != NULL && strcmp(in->name, path) == 0) {
                snprintf(tk->lpath, sizeof(tk->lpath), "%s", path);
                tk->lpath_owned = 1;
                tk->lfd = in->fd;
                in->fd = -1;
                if (tk_watch(tk, tk->lfd, &tk->lpoll, tk_listener_cb) == 0) {
                    log_info("takeover socket %s (inherited)", path);
                    return;
                }
            } else {
                close(in->fd);
                in->fd = -1;
            }
        }
    }
    if (path == NULL || tk->lfd >= 0) {
        return;
    }
    int rc = tk_listen(tk, path);
    if (rc < 0) {
        log_error("cannot listen on takeover socket %s: %s", path, uv_strerror(rc));
    } else {
        log_info("takeover socket %s", path);
    }
}

/* ------------------------------------------------------------- public API */

void takeover_sd_notify(const char *msg)
{
    const char *path = getenv("NOTIFY_SOCKET");
    struct sockaddr_un sa;
    size_t n;
    if (path == NULL || (path[0] != '/' && path[0] != '@')) {
        return;
    }
    n = strlen(path);
    if (n >= sizeof(sa.sun_path)) {
        return;
    }
    memset(&sa, 0, sizeof(sa));
    sa.sun_family = AF_UNIX;
    memcpy(sa.sun_path, path, n);
    if (path[0] == '@') {
        sa.sun_path[0] = '\0'; /* abstract namespace */
    }
    int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        return;
    }
    if (sendto(fd, msg, strlen(msg), MSG_NOSIGNAL, (struct sockaddr *)&sa,
               (socklen_t)(offsetof(struct sockaddr_un, sun_path) + n)) < 0) {
        log_warn("systemd notify (%s) failed: %s", msg, strerror(errno));
    }
    close(fd);
}

struct takeover *takeover_connect(const char *path, uint64_t timeout_ms, char *err, size_t errlen)
{
    struct sockaddr_un sa;
    uint64_t deadline = tkw_mono_ms() + timeout_ms;
    buf hello;

    if (strlen(path) >= sizeof(sa.sun_path)) {
        snprintf(err, errlen, "takeover socket path too long: %s", path);
        return NULL;
    }
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        snprintf(err, errlen, "socket: %s", strerror(errno));
        return NULL;
    }
    memset(&sa, 0, sizeof(sa));
    sa.sun_family = AF_UNIX;
    snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
    if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0) {
        snprintf(err, errlen,
                 "cannot connect to %s: %s (is a ferry running there with takeover.socket "
                 "set?)",
                 path, strerror(errno));
        close(fd);
        return NULL;
    }
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    takeover *tk = tk_new(NULL);
    tk->cfd = fd;
    tk->phase = TK_SINK_READYING;
    buf_init(&hello);
    tkw_put_bytes(&hello, TAKEOVER_MAGIC, strlen(TAKEOVER_MAGIC));
    tkw_put_u32(&hello, (uint32_t)getpid());
    int rc = tkw_send(fd, TK_HELLO, &hello, NULL, 0, timeout_ms);
    buf_free(&hello);
    if (rc == UV_EPIPE || rc == UV_ECONNRESET) {
        snprintf(err, errlen,
                 "%s: the running ferry refused the takeover (another one in progress, or it "
                 "is stopping)",
                 path);
        goto fail;
    }
    if (rc < 0) {
        snprintf(err, errlen, "%s: sending HELLO: %s", path, uv_strerror(rc));
        goto fail;
    }
    for (;;) {
        int type, fds[TAKEOVER_MAX_FDS], nfds;
        tkw_rd p;
        int fr = tkw_frame(&tk->in, &type, &p, fds, &nfds);
        if (fr < 0) {
            snprintf(err, errlen, "%s: protocol error from the running ferry", path);
            goto fail;
        }
        if (fr == 1) {
            if (type != TK_LISTENERS) {
                tkw_close_fds(fds, nfds);
                snprintf(err, errlen, "%s: unexpected frame %d from the running ferry", path, type);
                goto fail;
            }
            uint32_t count = tkw_get_u32(&p);
            for (uint32_t i = 0; i < count && (int)i < nfds; i++) {
                size_t nl;
                int kind = (int)tkw_get_u32(&p);
                const char *name = tkw_get_bytes(&p, &nl);
                if (p.bad || tk->ninh == TAKEOVER_MAX_INHERIT) {
                    close(fds[i]);
                    continue;
                }
                tk_inherited *in = &tk->inh[tk->ninh++];
                in->kind = kind;
                snprintf(in->name, sizeof(in->name), "%.*s", (int)nl, name);
                in->fd = fds[i];
            }
            tkw_close_fds(fds + count,
                          nfds - (int)(count < (uint32_t)nfds ? count : (uint32_t)nfds));
            tkw_consume(&tk->in, &p);
            return tk;
        }
        rc = tkw_recv(&tk->in, tk->cfd);
        if (rc == 0) {
            snprintf(err, errlen,
                     "%s: the running ferry closed the connection (another takeover in "
                     "progress, or it is stopping)",
                     path);
            goto fail;
        }
        if (rc == UV_EAGAIN) {
            uint64_t now = tkw_mono_ms();
            if (now >= deadline) {
                snprintf(err, errlen, "%s: no answer from the running ferry within %llu ms", path,
                         (unsigned long long)timeout_ms);
                goto fail;
            }
            struct pollfd pf = {.fd = fd, .events = POLLIN};
            poll(&pf, 1, (int)(deadline - now));
        } else if (rc < 0) {
            snprintf(err, errlen, "%s: %s", path, uv_strerror(rc));
            goto fail;
        }
    }
fail:
    close(fd);
    tkw_close_fds(tk->in.fdq, tk->in.nfdq);
    for (int i = 0; i < tk->ninh; i++) {
        close(tk->inh[i].fd);
    }
    buf_free(&tk->in.rx);
    free(tk);
    return NULL;
}

int takeover_claim_listener(ferry *f, const config_addr *a)
{
    char name[320];
    if (f == NULL || f->takeover == NULL || !tk_is_sink(f->takeover)) {
        return -1;
    }
    config_addr_str(a, name, sizeof(name));
    takeover *tk = f->takeover;
    for (int i = 0; i < tk->ninh; i++) {
        tk_inherited *in = &tk->inh[i];
        if (in->kind != TK_L_TAKEOVER && in->fd >= 0 && strcmp(in->name, name) == 0) {
            int fd = in->fd;
            in->fd = -1;
            log_info("listening on %s (inherited)", name);
            return fd;
        }
    }
    return -1;
}

int takeover_start(ferry *f)
{
    takeover *tk = f->takeover;
    char msg[64];

    if (tk != NULL && tk->phase == TK_SINK_READYING) {
        tk->f = f;
        tk->started_ms = uv_now(f->loop);
        for (int i = 0; i < tk->ninh; i++) {
            tk_inherited *in = &tk->inh[i];
            if (in->kind != TK_L_TAKEOVER && in->fd >= 0) {
                log_info("takeover: %s is not in this configuration: no longer served", in->name);
                close(in->fd);
                in->fd = -1;
            }
        }
        int rc = tk_watch(tk, tk->cfd, &tk->cpoll, tk_control_cb);
        if (rc < 0) {
            log_error("takeover: %s; continuing on the inherited listeners", uv_strerror(rc));
            tk_sink_finish(tk, "the control connection failed");
            snprintf(msg, sizeof(msg), "MAINPID=%d\nREADY=1", (int)getpid());
            takeover_sd_notify(msg);
            return 0;
        }
        /* The old process keeps serving until this one has a master: its
         * clients would otherwise wait here for the master to be found and
         * verified (tens of ms). */
        log_info("takeover: listening on the inherited sockets; waiting for a usable master "
                 "(at most %d ms) before taking the clients over",
                 TAKEOVER_READY_MS);
        tk->scan = xmalloc(sizeof(*tk->scan));
        uv_timer_init(f->loop, tk->scan);
        tk->scan->data = tk;
        uv_timer_start(tk->scan, tk_ready_cb, TAKEOVER_SCAN_MS, TAKEOVER_SCAN_MS);
        return 0;
    }
    takeover_sd_notify("READY=1");
    if (f->cfg->takeover_socket == NULL) {
        return 0;
    }
    tk = f->takeover = tk_new(f);
    int rc = tk_listen(tk, f->cfg->takeover_socket);
    if (rc < 0) {
        log_error("cannot listen on takeover socket %s: %s", f->cfg->takeover_socket,
                  uv_strerror(rc));
        return rc;
    }
    log_info("takeover socket %s", f->cfg->takeover_socket);
    return 0;
}

int takeover_store_free(const ferry *f)
{
    return f->takeover == NULL || !tk_is_sink(f->takeover);
}

/* ---------------------------------------------------- new: the sessions */

/* Every loop's master view is UP: the main loop's now, each worker's as
 * it published it on its last tick. */
static int tk_all_up(ferry *f)
{
    worker_view views[CONFIG_MAX_WORKERS];
    if (f->cluster != NULL) {
        /* Cluster mode: every shard of the map has its master view UP. */
        char first[128];
        return clustermap_nshards(f->cluster) > 0 &&
               clustermap_not_up(f->cluster, first, sizeof(first)) == 0;
    }
    if (f->up == NULL || f->up->state != UP_UP) {
        return 0;
    }
    int n = workers_stats(f, NULL, views, CONFIG_MAX_WORKERS);
    for (int i = 1; i < n; i++) {
        if (!views[i].up) {
            return 0;
        }
    }
    return 1;
}

/* New process, waiting for a usable master: once every loop's view is UP
 * (or after TAKEOVER_READY_MS, when its clients' requests are held as at any
 * start), tell the old process to hand the clients over. */
static void tk_ready_cb(uv_timer_t *t)
{
    takeover *tk = t->data;
    ferry *f = tk->f;
    uint64_t waited = uv_now(f->loop) - tk->started_ms;
    char msg[64];
    buf none;

    if (tk->phase != TK_SINK_READYING) {
        return;
    }
    int up = tk_all_up(f);
    if (!up && waited < TAKEOVER_READY_MS) {
        return;
    }
    uv_close((uv_handle_t *)tk->scan, tk_free_handle_cb);
    tk->scan = NULL;
    /* Before ACCEPTING: the old process may exit right after it, and systemd
     * must know the new main process by then (it reads notifications before
     * exits, so one sent first is seen first). */
    snprintf(msg, sizeof(msg), "MAINPID=%d\nREADY=1", (int)getpid());
    takeover_sd_notify(msg);
    buf_init(&none);
    int rc = tkw_send(tk->cfd, TK_ACCEPTING, &none, NULL, 0, TAKEOVER_SEND_TIMEOUT_MS);
    if (rc < 0) {
        log_error("takeover: %s; continuing on the inherited listeners", uv_strerror(rc));
        tk_sink_finish(tk, "the control connection failed");
    } else {
        tk_set_phase(tk, TK_SINK);
        if (up) {
            log_info("takeover: master UP after %llu ms; receiving clients",
                     (unsigned long long)waited);
        } else {
            log_warn("takeover: no usable master after %llu ms; receiving clients anyway (their "
                     "requests are held)",
                     (unsigned long long)waited);
        }
    }
}

static void tk_sink_finish(takeover *tk, const char *why)
{
    ferry *f = tk->f;
    tk_unwatch(&tk->cpoll, &tk->cfd);
    if (tk->scan != NULL) {
        uv_close((uv_handle_t *)tk->scan, tk_free_handle_cb);
        tk->scan = NULL;
    }
    tkw_close_fds(tk->in.fdq, tk->in.nfdq);
    tk->in.nfdq = 0;
    buf_free_secret(&tk->in.rx); /* what is left of the session frames */
    tk_set_phase(tk, TK_IDLE);
    log_info("takeover: %s: %lu client(s) received in %llu ms", why, tk->handed,
             (unsigned long long)(uv_now(f->loop) - tk->started_ms));
    if (f->outage == NULL && f->cfg->fallback_path != NULL && !f->stopping && !f->closed) {
        if (outage_open(f) < 0) {
            log_error("takeover: running without the fallback store");
        }
        f->wake_pending = 1;
    }
    if (!f->stopping && !f->closed) {
        tk_listen_configured(tk);
    }
}

/* ---------------------------------------------------------- the control */

void tk_control_cb(uv_poll_t *h, int status, int events)
{
    takeover *tk = h->data;
    int sink = tk_is_sink(tk);

    for (int rounds = 0; rounds < 64 && tk->cfd >= 0; rounds++) {
        int rc = status < 0 ? status : tkw_recv(&tk->in, tk->cfd);
        for (;;) {
            int type, fds[TAKEOVER_MAX_FDS], nfds;
            tkw_rd p;
            int fr = tkw_frame(&tk->in, &type, &p, fds, &nfds);
            if (fr == 0) {
                break;
            }
            if (fr < 0) {
                if (sink) {
                    log_error("takeover: protocol error from the old process");
                    tk_sink_finish(tk, "protocol error");
                } else {
                    tk_source_abort(tk, "protocol error from the new process");
                }
                return;
            }
            if (!sink) {
                tk_source_frame(tk, type, &p, fds, nfds);
                if (tk->cfd >= 0) {
                    tkw_consume(&tk->in, &p);
                }
            } else if (type == TK_SESSION) {
                tk->handed += nfds == 1;
                /* Adopted by the next loop in turn (this one without workers). */
                workers_adopt(tk->f, nfds >= 1 ? fds[0] : -1, (char *)p.p, p.n);
                tkw_close_fds(fds + 1, nfds - 1);
                tkw_consume(&tk->in, &p);
            } else if (type == TK_DONE) {
                tkw_close_fds(fds, nfds);
                uint32_t handed = tkw_get_u32(&p), closed = tkw_get_u32(&p);
                log_info("takeover: the old process is done (%u handed over, %u closed after "
                         "their replies)",
                         (unsigned)handed, (unsigned)closed);
                tkw_consume(&tk->in, &p);
                tk_sink_finish(tk, "complete");
                return;
            } else {
                tkw_close_fds(fds, nfds);
                tkw_consume(&tk->in, &p);
            }
            if (tk->cfd < 0) {
                return;
            }
        }
        if (rc == UV_EAGAIN) {
            return;
        }
        if (rc <= 0) {
            if (sink) {
                tk_sink_finish(tk, "the old process went away before it was done");
            } else if (tk->phase == TK_SRC_FINISHING) {
                tk_unwatch(&tk->cpoll, &tk->cfd);
            } else {
                tk_source_abort(tk, rc == 0 ? "the new process went away" : uv_strerror(rc));
            }
            return;
        }
    }
}

/* ------------------------------------------------------------- periodic */

void takeover_tick(ferry *f, uint64_t now)
{
    takeover *tk = f->takeover;
    if (tk == NULL) {
        return;
    }
    if ((tk->phase == TK_SRC_HELLO || tk->phase == TK_SRC_LISTENERS) &&
        now - tk->started_ms >= TAKEOVER_HANDSHAKE_MS) {
        tk_source_abort(tk, "the new process did not finish the handshake in time");
        return;
    }
    if (tk->phase == TK_SRC_HANDING && f->stopping) {
        tk_finish_source(tk, "stopping");
    }
}

void takeover_close(ferry *f)
{
    takeover *tk = f->takeover;
    if (tk == NULL) {
        return;
    }
    if (tk->relay != NULL && f->worker_index == 0) {
        /* Sessions the workers posted last, then no more. */
        tk_relay_drain(tk);
        uv_mutex_lock(&tk->relay->lock);
        int was = tk->relay->open;
        tk->relay->open = 0;
        uv_mutex_unlock(&tk->relay->lock);
        if (was) {
            uv_close((uv_handle_t *)&tk->relay->async, NULL);
        }
    }
    if (tk->phase == TK_SRC_FINISHING && tk->cfd >= 0) {
        buf b;
        buf_init(&b);
        if (tk->relay != NULL) {
            tk->closed += atomic_load(&tk->relay->closed);
        }
        tkw_put_u32(&b, (uint32_t)tk->handed);
        tkw_put_u32(&b, (uint32_t)tk->closed);
        log_info("takeover: done: %lu client(s) handed over, %lu closed after their replies; "
                 "fallback store released",
                 tk->handed, tk->closed);
        int rc = tkw_send(tk->cfd, TK_DONE, &b, NULL, 0, TAKEOVER_SEND_TIMEOUT_MS);
        buf_free(&b);
        if (rc < 0) {
            log_warn("takeover: telling the new process: %s", uv_strerror(rc));
        }
    }
    tk_unwatch(&tk->cpoll, &tk->cfd);
    if (tk->lpath_owned && tk->lfd >= 0) {
        unlink(tk->lpath);
    }
    tk_unwatch(&tk->lpoll, &tk->lfd);
    if (tk->scan != NULL) {
        uv_close((uv_handle_t *)tk->scan, tk_free_handle_cb);
        tk->scan = NULL;
    }
    tkw_close_fds(tk->in.fdq, tk->in.nfdq);
    tk->in.nfdq = 0;
    for (int i = 0; i < tk->ninh; i++) {
        if (tk->inh[i].fd >= 0) {
            close(tk->inh[i].fd);
            tk->inh[i].fd = -1;
        }
    }
    while (tk->ncancels > 0) {
        tk_cancel_drop(tk, &tk->cancels[tk->ncancels - 1]);
    }
}

void takeover_free(ferry *f)
{
    takeover *tk = f->takeover;
    if (tk == NULL) {
        return;
    }
    buf_free_secret(&tk->in.rx);
    free(tk->cancels);
    if (tk->relay != NULL && f->worker_index == 0) {
        /* Every worker has been joined, and the async closed. */
        tk_item *it;
        while ((it = tk_relay_pop(tk->relay)) != NULL) {
            tk_item_free(it);
        }
        uv_mutex_destroy(&tk->relay->lock);
        free(tk->relay);
    }
    free(tk);
    f->takeover = NULL;
}
