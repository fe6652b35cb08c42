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
 * of the two processes need not match. */
#include "takeover.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdatomic.h>
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

#include "core.h"
#include "link.h"
#include "log.h"
#include "outage.h"
#include "router.h"
#include "server.h"
#include "session.h"
#include "takeover_wire.h"
#include "upstream.h"
#include "workers.h"

#define TAKEOVER_SEND_TIMEOUT_MS 5000   /* one frame's send, old process */
#define TAKEOVER_CANCEL_TIMEOUT_MS 2000 /* CLIENT UNBLOCK unanswered: close the link */
#define TAKEOVER_UNBLOCK_RETRY_MS 20    /* CLIENT UNBLOCK found nothing blocked (yet) */
#define TAKEOVER_SCAN_MS 5              /* handover scan period while handing over */
#define TAKEOVER_READY_MS 5000          /* new: longest wait for a master before ACCEPTING */
_Static_assert(TAKEOVER_READY_MS <= TAKEOVER_HANDSHAKE_MS / 2,
               "the old process gives up on a handshake after TAKEOVER_HANDSHAKE_MS");
#define TAKEOVER_MAX_INHERIT (CONFIG_MAX_LISTEN + 2)

enum { TK_L_CLIENT = 0, TK_L_STATS, TK_L_TAKEOVER };

/* Legal moves (tk_set_phase asserts them):
 *   IDLE -> SRC_HELLO -> SRC_LISTENERS -> SRC_HANDING -> SRC_FINISHING
 *   IDLE -> SRC_HANDING (a worker's, told by the main loop)
 *   SRC_HELLO, SRC_LISTENERS, SRC_HANDING -> IDLE (aborted)
 *   SINK -> IDLE (all received, or the old process is gone: this process
 *   may be taken over in turn) */
typedef enum tk_phase {
    TK_IDLE = 0,      /* listening on takeover.socket (or not at all) */
    TK_SRC_HELLO,     /* old: a new process connected; waiting for its HELLO */
    TK_SRC_LISTENERS, /* old: listeners sent; waiting for ACCEPTING */
    TK_SRC_HANDING,   /* old: handing sessions over */
    TK_SRC_FINISHING, /* old: the rest closes after its replies (SIGTERM's rules) */
    TK_SINK_READYING, /* new: listeners received; waiting for a usable master */
    TK_SINK           /* new: receiving sessions */
} tk_phase;

typedef struct tk_inherited {
    int kind;       /* TK_L_* */
    char name[320]; /* address as config_addr_str writes it, or the takeover path */
    int fd;         /* -1 once claimed or closed */
} tk_inherited;

/* A session whose blocked call is being cancelled on Redis. */
typedef struct tk_cancel {
    uint64_t sid;       /* the session */
    uint64_t lid;       /* the dedicated link the call is on */
    long long redis_id; /* that link's CLIENT ID */
    request *call;      /* copy of the call, to re-issue (owned) */
    uint64_t since;     /* uv_now() when the cancel began */
    uint64_t next_try;  /* when to send CLIENT UNBLOCK (again) */
    int asking;         /* a CLIENT UNBLOCK is in flight */
    int done;           /* Redis let go of it without popping: hand it over */
} tk_cancel;

/* A session a worker handed over: its frame and a copy of its socket. */
typedef struct tk_item {
    struct tk_item *next; /* in the relay, oldest first */
    buf frame;            /* TK_SESSION payload (carries a password: wiped) */
    int fd;               /* the client socket, owned by the item */
} tk_item;

/* Old process with workers: the sessions the workers hand over, on their
 * way to the main loop, which alone writes on the control connection. */
typedef struct tk_relay {
    uv_mutex_t lock; /* guards head, tail, open */
    tk_item *head, *tail;
    int open;            /* async may be sent (cleared before it closes) */
    uv_async_t async;    /* on the main loop: items posted */
    atomic_ulong closed; /* sessions the workers left to SIGTERM's rules */
} tk_relay;

typedef struct takeover {
    ferry *f;         /* context */
    tk_relay *relay;  /* old, with workers: owned by the main loop's, borrowed by a
                         worker's (which exists only while it hands over) */
    tk_phase phase;   /* see tk_phase; changed only by tk_set_phase */
    int lfd;          /* takeover.socket listener, -1 */
    uv_poll_t *lpoll; /* watches lfd (freed in its close callback) */
    char lpath[108];  /* its path, "" when none */
    int lpath_owned;  /* unlink lpath when closing (not once handed over) */
    int cfd;          /* the control connection, -1 */
    uv_poll_t *cpoll; /* watches cfd */
    uv_timer_t *scan; /* handover scan while SRC_HANDING */
    tkw_rx in;        /* control bytes and fds received, not yet framed */
    tk_inherited inh[TAKEOVER_MAX_INHERIT]; /* new: listeners received */
    int ninh;
    tk_cancel *cancels; /* old: blocked calls being cancelled */
    size_t ncancels, capcancels;
    uint64_t started_ms;  /* the takeover began */
    uint64_t handing_ms;  /* old: uv_now() when the new process said ACCEPTING */
    uint64_t deadline_ms; /* SRC_HANDING: then the rest is closed after replies */
    unsigned long handed; /* old: sessions sent; new: sessions received */
    unsigned long closed; /* old: sessions left to SIGTERM's rules */
} takeover;

static void tk_control_cb(uv_poll_t *h, int status, int events);
static void tk_listener_cb(uv_poll_t *h, int status, int events);
static void tk_scan_cb(uv_timer_t *t);
static void tk_ready_cb(uv_timer_t *t);
static void tk_scan(takeover *tk);
static void tk_source_abort(takeover *tk, const char *why);
static void tk_sink_finish(takeover *tk, const char *why);
static void tk_return_calls(takeover *tk);

/* ------------------------------------------------------------------ phases */

static const char *tk_phase_name(tk_phase p)
{
    static const char *const names[] = {"IDLE",        "SRC_HELLO",     "SRC_LISTENERS",
                                        "SRC_HANDING", "SRC_FINISHING", "SINK_READYING",
                                        "SINK"};
    return names[p];
}

static void tk_set_phase(takeover *tk, tk_phase p)
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

static void tk_free_handle_cb(uv_handle_t *h)
{
    free(h);
}

static int tk_watch(takeover *tk, int fd, uv_poll_t **hp, uv_poll_cb cb)
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

static void tk_unwatch(uv_poll_t **hp, int *fd)
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

static takeover *tk_new(ferry *f)
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

/* ------------------------------------------------------- old: the control */

static void tk_listener_cb(uv_poll_t *h, int status, int events)
{
    takeover *tk = h->data;
    ferry *f = tk->f;
    int fd = accept(tk->lfd, NULL, NULL);
    if (fd < 0) {
        return;
    }
    fcntl(fd, F_SETFD, FD_CLOEXEC);
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    struct {
        pid_t pid;
        uid_t uid;
        gid_t gid;
    } cred; /* Linux's struct ucred (unix(7)), which glibc shows only with _GNU_SOURCE */
    socklen_t clen = sizeof(cred);
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &clen) != 0 ||
        (cred.uid != getuid() && cred.uid != 0)) {
        /* The socket file's mode keeps others out; this holds even if it
         * was changed. root may (it can read this process's memory anyway). */
        log_warn("takeover: a process of another user connected: refused");
        close(fd);
        return;
    }
    if (tk->phase != TK_IDLE || tk->cfd >= 0 || f->stopping || f->closed) {
        log_warn("takeover: a second process connected while %s: refused",
                 f->stopping ? "stopping" : "a takeover is in progress");
        close(fd);
        return;
    }
    tk->cfd = fd;
    tk->started_ms = uv_now(f->loop);
    tk->handed = tk->closed = 0;
    buf_clear(&tk->in.rx);
    tk->in.bad = 0;
    if (tk_watch(tk, fd, &tk->cpoll, tk_control_cb) < 0) {
        tk_unwatch(&tk->cpoll, &tk->cfd);
        return;
    }
    tk_set_phase(tk, TK_SRC_HELLO);
    log_info("takeover: a new process connected on %s", tk->lpath);
}

static int tk_send_listeners(takeover *tk)
{
    ferry *f = tk->f;
    int fds[TAKEOVER_MAX_INHERIT];
    const config_addr *addrs[CONFIG_MAX_LISTEN];
    char name[320];
    buf b;
    int n = server_sockets(f, fds, addrs, CONFIG_MAX_LISTEN);
    int total = n;

    buf_init(&b);
    int sfd = stats_socket(f);
    tkw_put_u32(&b, (uint32_t)(n + (sfd >= 0) + (tk->lfd >= 0)));
    for (int i = 0; i < n; i++) {
        config_addr_str(addrs[i], name, sizeof(name));
        tkw_put_u32(&b, TK_L_CLIENT);
        tkw_put_bytes(&b, name, strlen(name));
    }
    if (sfd >= 0) {
        config_addr_str(&f->cfg->stats_listen, name, sizeof(name));
        tkw_put_u32(&b, TK_L_STATS);
        tkw_put_bytes(&b, name, strlen(name));
        fds[total++] = sfd;
    }
    if (tk->lfd >= 0) {
        tkw_put_u32(&b, TK_L_TAKEOVER);
        tkw_put_bytes(&b, tk->lpath, strlen(tk->lpath));
        fds[total++] = tk->lfd;
    }
    int rc = tkw_send(tk->cfd, TK_LISTENERS, &b, fds, total, TAKEOVER_SEND_TIMEOUT_MS);
    buf_free(&b);
    return rc;
}

/* Every loop: stop reading its clients and hand them over as they become
 * ready (tk_scan). */
static void tk_begin_handing(takeover *tk)
{
    ferry *f = tk->f;
    list_node *n;

    f->handing_over = 1;
    tk->handing_ms = uv_now(f->loop);
    tk->deadline_ms = tk->handing_ms + f->cfg->shutdown_timeout_ms;
    tk->handed = tk->closed = 0;
    tk_set_phase(tk, TK_SRC_HANDING);
    list_foreach(n, &f->sessions)
    {
        session *s = list_entry(n, session, node);
        if (s->tx == TX_NONE) {
            session_stop_reading(s); /* a transaction reads until it ends */
        }
    }
    tk->scan = xmalloc(sizeof(*tk->scan));
    uv_timer_init(f->loop, tk->scan);
    tk->scan->data = tk;
    uv_timer_start(tk->scan, tk_scan_cb, TAKEOVER_SCAN_MS, TAKEOVER_SCAN_MS);
    tk_scan(tk);
}

/* Main loop: the workers' sessions reach it through the relay. */
static void tk_relay_cb(uv_async_t *a);

static void tk_relay_open(takeover *tk)
{
    if (tk->relay != NULL) {
        return;
    }
    tk_relay *r = xcalloc(1, sizeof(*r));
    uv_mutex_init(&r->lock);
    uv_async_init(tk->f->loop, &r->async, tk_relay_cb);
    r->async.data = tk;
    uv_unref((uv_handle_t *)&r->async); /* the loop ends without it */
    r->open = 1;
    tk->relay = r;
}

/* The new process accepts on the listeners: stop accepting here and start
 * handing sessions over, in every loop. */
static void tk_start_handing(takeover *tk)
{
    ferry *f = tk->f;

    f->keep_paths = 1; /* the sockets live on in the new process */
    server_stop(f);
    stats_stop(f);
    tk->lpath_owned = 0;
    tk_unwatch(&tk->lpoll, &tk->lfd);
    log_info("takeover: the new process accepts; handing over %llu client(s)",
             (unsigned long long)workers_clients(f));
    if (f->workers != NULL) {
        tk_relay_open(tk);
        atomic_store(&tk->relay->closed, 0);
        workers_takeover_hand(f, tk->relay);
    }
    tk_begin_handing(tk);
}

static void tk_source_frame(takeover *tk, int type, tkw_rd *p, int *fds, int nfds)
{
    tkw_close_fds(fds, nfds); /* the new process sends none */
    if (type == TK_HELLO && tk->phase == TK_SRC_HELLO) {
        size_t ml;
        const char *magic = tkw_get_bytes(p, &ml);
        uint32_t pid = tkw_get_u32(p);
        if (p->bad || ml != strlen(TAKEOVER_MAGIC) || memcmp(magic, TAKEOVER_MAGIC, ml) != 0) {
            tk_source_abort(tk, "the new process speaks another takeover protocol");
            return;
        }
        log_info("takeover: new process %u; sending the listening sockets", (unsigned)pid);
        int rc = tk_send_listeners(tk);
        if (rc < 0) {
            tk_source_abort(tk, uv_strerror(rc));
            return;
        }
        tk_set_phase(tk, TK_SRC_LISTENERS);
    } else if (type == TK_ACCEPTING && tk->phase == TK_SRC_LISTENERS) {
        tk_start_handing(tk);
    } else {
        tk_source_abort(tk, "unexpected frame from the new process");
    }
}

/* ----------------------------------------------------- old: the sessions */

static session *tk_session_find(ferry *f, uint64_t id)
{
    list_node *n;
    list_foreach(n, &f->sessions)
    {
        session *s = list_entry(n, session, node);
        if (s->id == id) {
            return s;
        }
    }
    return NULL;
}

static link *tk_link_find(ferry *f, uint64_t id)
{
    list_node *n;
    if (f->up == NULL) {
        return NULL;
    }
    list_foreach(n, &f->up->links)
    {
        link *l = list_entry(n, link, node);
        if (l->id == id) {
            return l->state == LINK_CLOSING ? NULL : l;
        }
    }
    return NULL;
}

static tk_cancel *tk_cancel_find(takeover *tk, uint64_t sid)
{
    for (size_t i = 0; i < tk->ncancels; i++) {
        if (tk->cancels[i].sid == sid) {
            return &tk->cancels[i];
        }
    }
    return NULL;
}

static void tk_cancel_drop(takeover *tk, tk_cancel *c)
{
    request_free(tk->f, c->call);
    *c = tk->cancels[--tk->ncancels];
}

/* A copy of the blocking call r (enough to re-arm and re-issue it). */
static request *tk_copy_call(ferry *f, const request *r)
{
    request *c = request_new(f);
    c->cmd = r->cmd;
    c->flags = r->flags & REQ_F_BLOCKING;
    c->born = r->born;
    c->deadline = r->deadline;
    buf_append(&c->data, buf_head(&r->data), buf_used(&r->data));
    return c;
}

/* A null reply: the call timed out (CLIENT UNBLOCK ... TIMEOUT) with
 * nothing served. */
static int is_null_reply(const char *p, size_t n)
{
    return (n >= 3 && (memcmp(p, "*-1", 3) == 0 || memcmp(p, "$-1", 3) == 0)) ||
           (n >= 1 && p[0] == '_');
}

/* The dedicated link's reply to the call being cancelled. */
static void tk_call_done(link *l, request *r, const char *p, size_t n)
{
    ferry *f = l->f;
    takeover *tk = f->takeover;
    tk_cancel *c = tk != NULL ? tk_cancel_find(tk, (uint64_t)r->arg) : NULL;
    session *s = tk_session_find(f, (uint64_t)r->arg);

    if (c != NULL && s != NULL && is_null_reply(p, n)) {
        c->done = 1;
        log_debug("takeover: client %llu: blocked call cancelled on Redis",
                  (unsigned long long)s->id);
    } else {
        if (s != NULL) {
            /* Served before the cancel reached Redis: the client's reply. */
            session_on_stream(s, p, n);
            log_debug("takeover: client %llu: blocked call served while cancelling",
                      (unsigned long long)s->id);
            if (tk != NULL && tk->phase != TK_SRC_HANDING) {
                session_check_reading(s); /* aborted meanwhile: served here */
            }
        }
        if (c != NULL) {
            tk_cancel_drop(tk, c);
        }
    }
    link_close(l, "blocked call cancelled for a takeover");
    if (tk != NULL && tk->phase != TK_SRC_HANDING) {
        tk_return_calls(tk); /* aborted meanwhile: re-issued here */
    }
}

static void tk_unblock_done(link *sh, request *r, const char *p, size_t n)
{
    takeover *tk = sh->f->takeover;
    uint64_t sid = (uint64_t)r->arg;
    tk_cancel *c = tk != NULL ? tk_cancel_find(tk, sid) : NULL;
    if (c == NULL || c->done) {
        return;
    }
    c->asking = 0;
    if (n >= 2 && memcmp(p, ":1", 2) == 0) {
        return; /* the null reply is on its way on the dedicated link */
    }
    if (n >= 1 && p[0] == '-') {
        /* CLIENT UNBLOCK refused (renamed, ACL): closing the link cancels it. */
        char why[160];
        link_error_text(p, n, why, sizeof(why));
        log_warn("takeover: CLIENT UNBLOCK refused (%s): closing the blocked call's link", why);
        link *l = tk_link_find(sh->f, c->lid);
        c->done = 1;
        if (l != NULL) {
            link_close(l, "blocked call cancelled for a takeover");
        }
        return;
    }
    /* :0 - not blocked (yet, or served already): ask again shortly. */
    c->next_try = uv_now(sh->f->loop) + TAKEOVER_UNBLOCK_RETRY_MS;
}

static void tk_ask_unblock(takeover *tk, tk_cancel *c, uint64_t now)
{
    ferry *f = tk->f;
    /* RESP2: the answer (:1 / :0) reads the same in both protocols. */
    link *sh = f->up != NULL ? upstream_shared(f->up, &f->up->self, c->sid, 2) : NULL;
    if (sh == NULL) {
        c->next_try = now + TAKEOVER_UNBLOCK_RETRY_MS;
        return;
    }
    char id[32];
    snprintf(id, sizeof(id), "%lld", c->redis_id);
    const char *argv[] = {"CLIENT", "UNBLOCK", id, "TIMEOUT"};
    link_internal(sh, argv, 4, tk_unblock_done, (long long)c->sid);
    c->asking = 1;
}

/* Worker: queue a session's frame (moved out of *frame) and fd for the
 * main loop. */
static void tk_relay_post(tk_relay *r, buf *frame, int fd)
{
    tk_item *it = xcalloc(1, sizeof(*it));
    it->frame = *frame;
    buf_init(frame);
    it->fd = fd;
    uv_mutex_lock(&r->lock);
    if (!r->open) {
        /* The main loop is closing (forced): the client goes with it. */
        uv_mutex_unlock(&r->lock);
        close(fd);
        buf_free_secret(&it->frame);
        free(it);
        return;
    }
    if (r->tail == NULL) {
        r->head = it;
    } else {
        r->tail->next = it;
    }
    r->tail = it;
    uv_async_send(&r->async);
    uv_mutex_unlock(&r->lock);
}

static tk_item *tk_relay_pop(tk_relay *r)
{
    uv_mutex_lock(&r->lock);
    tk_item *it = r->head;
    if (it != NULL) {
        r->head = it->next;
        if (r->head == NULL) {
            r->tail = NULL;
        }
    }
    uv_mutex_unlock(&r->lock);
    return it;
}

static void tk_item_free(tk_item *it)
{
    if (it->fd >= 0) {
        close(it->fd);
    }
    buf_free_secret(&it->frame);
    free(it);
}

/* Main loop: send what the workers posted, in order. Once the control
 * connection is gone (an abort), a session posted is served here instead:
 * its frame is what the new process would have adopted it from. */
static void tk_relay_drain(takeover *tk)
{
    ferry *f = tk->f;
    tk_item *it;
    while (tk->relay != NULL && (it = tk_relay_pop(tk->relay)) != NULL) {
        if (tk->cfd >= 0 && (tk->phase == TK_SRC_HANDING || tk->phase == TK_SRC_FINISHING)) {
            int rc =
                tkw_send(tk->cfd, TK_SESSION, &it->frame, &it->fd, 1, TAKEOVER_SEND_TIMEOUT_MS);
            if (rc == 0) {
                tk->handed++;
                tk_item_free(it);
                continue;
            }
            char why[160];
            snprintf(why, sizeof(why), "sending a worker's client: %s", uv_strerror(rc));
            if (tk->phase == TK_SRC_HANDING) {
                tk_source_abort(tk, why);
            } else {
                log_error("takeover: %s", why);
                tk_unwatch(&tk->cpoll, &tk->cfd);
            }
        }
        if (f->closed) {
            tk_item_free(it); /* closing: the client goes with this process */
            continue;
        }
        int fd = it->fd;
        it->fd = -1;
        takeover_adopt(f, fd, buf_head(&it->frame), buf_used(&it->frame));
        tk_item_free(it);
    }
}

static void tk_relay_cb(uv_async_t *a)
{
    tk_relay_drain(a->data);
}

/* Hand s over: its state, then the bytes the new process parses first
 * (call, re-armed with what is left of its timeout, then s's unparsed
 * input); s is closed here. Returns 0, or a negative error (the takeover
 * is aborted). */
static int tk_hand(takeover *tk, session *s, const request *call)
{
    ferry *f = tk->f;
    uint64_t now = uv_now(f->loop);
    int64_t left = -1;
    buf b, callb;
    uv_os_fd_t fd;

    buf_init(&callb);
    if (call != NULL) {
        const char *expired = NULL;
        request *c = tk_copy_call(f, call);
        if (request_rearm_blocking(c, now, &expired) == 1) {
            /* Its time ran out meanwhile: answered as Redis would. */
            request_free(f, c);
            if (call->s == s) {
                session_answer_str(s, (request *)call, expired);
                session_flush_answered(s);
            } else {
                session_on_stream(s, expired, strlen(expired));
            }
            return 0; /* handed over idle once that is written */
        }
        left = call->deadline == 0 ? 0 : (int64_t)(call->deadline > now ? call->deadline - now : 1);
        buf_append(&callb, buf_head(&c->data), buf_used(&c->data));
        request_free(f, c);
    }
    if (uv_fileno(&s->io.h, &fd) != 0) {
        buf_free(&callb);
        return 0;
    }
    buf_init(&b);
    tkw_session(&b, s, &callb, left, now);
    buf_free(&callb);
    if (tk->phase != TK_SRC_HANDING) {
        /* The takeover was aborted while s's call was being cancelled:
         * s is served here again, as the new process would have served
         * it (its call re-issued with what is left of its timeout). */
        int dup_fd = fcntl(fd, F_DUPFD_CLOEXEC, 0);
        session_close(s, "takeover aborted: its blocked call is re-issued here");
        if (dup_fd >= 0) {
            takeover_adopt(f, dup_fd, buf_head(&b), buf_used(&b));
        }
        buf_free_secret(&b);
        return 0;
    }
    if (f->worker_index > 0) {
        /* The main loop sends it: a copy of the socket goes with the frame
         * (closing this one, below, sends nothing to the client). */
        int dup_fd = fcntl(fd, F_DUPFD_CLOEXEC, 0);
        if (dup_fd < 0) {
            buf_free_secret(&b);
            return 0; /* out of descriptors: tried again on the next scan */
        }
        tk_relay_post(tk->relay, &b, dup_fd);
        tk->handed++;
        session_close(s, "handed over to the new process");
        return 0;
    }
    int rc = tkw_send(tk->cfd, TK_SESSION, &b, &fd, 1, TAKEOVER_SEND_TIMEOUT_MS);
    buf_free_secret(&b);
    if (rc < 0) {
        char why[160];
        snprintf(why, sizeof(why), "sending client %llu: %s", (unsigned long long)s->id,
                 uv_strerror(rc));
        tk_source_abort(tk, why);
        return rc;
    }
    tk->handed++;
    /* The socket lives on in the new process: closing this copy of it sends
     * nothing to the client. */
    session_close(s, "handed over to the new process");
    return 0;
}

/* s's one blocking call r is in flight on its dedicated link: cancel it on
 * Redis before the session goes over. Returns what tk_hand returns. */
static int tk_cancel_call(takeover *tk, session *s, request *r, uint64_t now)
{
    link *l = s->dlink;
    if (l->state != LINK_READY || l->redis_id <= 0 ||
        upstream_shared(tk->f->up, &tk->f->up->self, s->id, 2) == NULL) {
        /* No way to ask Redis: closing the link (session_close) cancels it,
         * as when a client leaves. */
        return tk_hand(tk, s, r);
    }
    if (tk->ncancels == tk->capcancels) {
        tk->capcancels = tk->capcancels ? tk->capcancels * 2 : 16;
        tk->cancels = xrealloc(tk->cancels, tk->capcancels * sizeof(*tk->cancels));
    }
    tk_cancel *c = &tk->cancels[tk->ncancels++];
    memset(c, 0, sizeof(*c));
    c->sid = s->id;
    c->lid = l->id;
    c->redis_id = l->redis_id;
    c->call = tk_copy_call(tk->f, r);
    c->since = now;
    router_release_call(s, r);
    /* The reply to the call now comes to the takeover, not to s. */
    r->flags |= REQ_F_INTERNAL;
    r->done = tk_call_done;
    r->arg = (long long)s->id;
    upstream_disown(l);
    tk_ask_unblock(tk, c, now);
    return 0;
}

/* Nothing of s is half done: no transaction, no stream ferry cannot carry
 * (MONITOR), no output waiting to be written. */
static int tk_quiet(const session *s)
{
    return s->state == SESSION_OPEN && s->tx == TX_NONE && s->tunnel != TUN_OTHER &&
           outq_len(&s->out) == 0 && !s->out.writing;
}

/* Hand s over if it is ready (or start cancelling its blocked call).
 * Returns 0, or a negative error (the takeover was aborted). */
static int tk_try_session(takeover *tk, session *s, uint64_t now)
{
    if (s->state != SESSION_OPEN) {
        return 0; /* QUIT seen: it closes itself */
    }
    if (s->tx != TX_NONE) {
        /* A transaction (or a WATCH) goes on here until EXEC, DISCARD or
         * UNWATCH: reading continues until then. */
        session_check_reading(s);
        return 0;
    }
    session_stop_reading(s);
    if (s->tunnel == TUN_OTHER) {
        /* MONITOR or CLIENT REPLY: a stream ferry does not rebuild on
         * another link (as after a failover). It never becomes ready, so it
         * is closed now, after its replies, as SIGTERM does (rather than at
         * shutdown_timeout_ms). */
        tk->closed++;
        if (outq_len(&s->out) == 0) {
            session_close(s, "ferry restarted (takeover): a MONITOR or CLIENT REPLY stream "
                             "cannot be handed over");
        } else {
            log_info("client %llu %s: ferry restarted (takeover): a MONITOR or CLIENT REPLY "
                     "stream cannot be handed over: closed once its output is written",
                     (unsigned long long)s->id, s->peer);
            session_set_state(s, SESSION_QUITTING); /* closed once written */
        }
        return 0;
    }
    tk_cancel *c = tk_cancel_find(tk, s->id);
    if (c != NULL) {
        if (!c->done || !tk_quiet(s) || s->nrequests != 0 || s->inflight != 0) {
            return 0;
        }
        request *call = c->call;
        c->call = NULL;
        tk_cancel_drop(tk, c);
        int rc = tk_hand(tk, s, call);
        request_free(tk->f, call);
        return rc;
    }
    if (!tk_quiet(s)) {
        return 0;
    }
    if (s->nrequests == 0 && s->inflight == 0) {
        return tk_hand(tk, s, NULL);
    }
    if (s->nrequests == 1 && s->tunnel == TUN_NONE) {
        request *r = list_entry(list_first(&s->requests), request, sq);
        if (!(r->flags & REQ_F_BLOCKING)) {
            return 0;
        }
        if (r->state == REQ_HELD && s->inflight == 0) {
            return tk_hand(tk, s, r);
        }
        if (r->state == REQ_SENT && r->link != NULL && r->link == s->dlink && s->inflight == 1) {
            return tk_cancel_call(tk, s, r, now);
        }
    }
    return 0;
}

/* The takeover was aborted: every call cancelled on Redis (for the new
 * process to re-issue) is re-issued here; one still being cancelled is
 * when Redis answers (tk_call_done). */
static void tk_return_calls(takeover *tk)
{
    ferry *f = tk->f;
    for (size_t i = 0; i < tk->ncancels;) {
        tk_cancel *c = &tk->cancels[i];
        if (!c->done) {
            i++;
            continue;
        }
        session *s = tk_session_find(f, c->sid);
        request *call = c->call;
        c->call = NULL;
        tk_cancel_drop(tk, c); /* the last one takes its place */
        if (s == NULL || s->state != SESSION_OPEN) {
            request_free(f, call);
            continue;
        }
        if (!tk_quiet(s) || s->nrequests != 0 || s->inflight != 0) {
            /* It was not read since (reading stays stopped until then). */
            session_close(s, "takeover aborted: its blocked call cannot be re-issued");
        } else {
            tk_hand(tk, s, call);
            if (s->state == SESSION_OPEN) {
                session_check_reading(s); /* its time was up: answered */
            }
        }
        request_free(f, call);
    }
}

/* After an abort: read every client again, but one whose blocked call is
 * still being cancelled (its reply, or the call, comes first). */
static void tk_resume_reading(takeover *tk)
{
    list_node *n;
    tk->f->handing_over = 0;
    list_foreach(n, &tk->f->sessions)
    {
        session *s = list_entry(n, session, node);
        if (tk_cancel_find(tk, s->id) == NULL) {
            session_check_reading(s);
        }
    }
    tk_return_calls(tk);
}

/* Cancels that need a nudge: CLIENT UNBLOCK again, a client that left, or
 * no answer in time (the link is closed: that cancels the call too). */
static void tk_cancel_tick(takeover *tk, uint64_t now)
{
    ferry *f = tk->f;
    for (size_t i = 0; i < tk->ncancels;) {
        tk_cancel *c = &tk->cancels[i];
        if (c->done) {
            i++;
            continue;
        }
        session *s = tk_session_find(f, c->sid);
        if (s == NULL || now - c->since >= TAKEOVER_CANCEL_TIMEOUT_MS) {
            link *l = tk_link_find(f, c->lid);
            if (s != NULL) {
                log_warn("takeover: client %llu: CLIENT UNBLOCK unanswered for %d ms: closing "
                         "its link",
                         (unsigned long long)s->id, TAKEOVER_CANCEL_TIMEOUT_MS);
                c->done = 1;
            }
            if (l != NULL) {
                link_close(l, "blocked call cancelled for a takeover");
            }
            if (s == NULL) {
                tk_cancel_drop(tk, c);
                continue;
            }
        } else if (!c->asking && now >= c->next_try) {
            tk_ask_unblock(tk, c, now);
        }
        i++;
    }
}

static void tk_finish_source(takeover *tk, const char *why)
{
    ferry *f = tk->f;
    list_node *n;
    list_foreach(n, &f->sessions)
    {
        /* Left to SIGTERM's rules (those already closing were counted). */
        tk->closed += list_entry(n, session, node)->state == SESSION_OPEN;
    }
    if (f->worker_index > 0) {
        atomic_fetch_add(&tk->relay->closed, tk->closed); /* for the main loop's DONE */
    }
    tk_set_phase(tk, TK_SRC_FINISHING);
    if (tk->scan != NULL) {
        uv_close((uv_handle_t *)tk->scan, tk_free_handle_cb);
        tk->scan = NULL;
    }
    core_stop(f, why);
}

static void tk_scan(takeover *tk)
{
    ferry *f = tk->f;
    uint64_t now = uv_now(f->loop);
    list_node *n, *t;

    if (tk->phase != TK_SRC_HANDING) {
        return;
    }
    if (f->stopping) {
        tk_finish_source(tk, "stopping");
        return;
    }
    tk_cancel_tick(tk, now);
    /* Least recently active first: the new process keeps its idle list
     * ordered by appending (session_adopt). */
    list_foreach_safe(n, t, &f->idle)
    {
        if (tk_try_session(tk, list_entry(n, session, idle_node), now) < 0) {
            return; /* aborted */
        }
    }
    if (f->worker_index > 0) {
        /* A worker: done once its own clients are over; the main loop
         * sends what it posted and tells the new process when all are. */
        if (f->nclients == 0) {
            log_info("takeover: loop %d: its %lu client(s) handed over in %llu ms", f->worker_index,
                     tk->handed, (unsigned long long)(now - tk->handing_ms));
            /* It waits for the main loop: stopped with every loop once all
             * are over (takeover_tick), or serving on if the takeover is
             * aborted (the main loop then serves what it posted). */
            uv_close((uv_handle_t *)tk->scan, tk_free_handle_cb);
            tk->scan = NULL;
        } else if (now >= tk->deadline_ms) {
            tk_finish_source(tk, "takeover: shutdown_timeout_ms reached");
        }
        return;
    }
    tk_relay_drain(tk);
    if (tk->phase != TK_SRC_HANDING) {
        return; /* aborted */
    }
    /* Every loop's clients gone: each worker posted its last one before
     * it closed it, so once the count reads 0 the relay has them all. */
    uint64_t left = workers_clients(f);
    if (left == 0) {
        tk_relay_drain(tk);
        if (tk->phase != TK_SRC_HANDING) {
            return;
        }
        log_info("takeover: all %lu client(s) handed over in %llu ms (%llu ms since the new "
                 "process connected)",
                 tk->handed, (unsigned long long)(now - tk->handing_ms),
                 (unsigned long long)(now - tk->started_ms));
        tk_finish_source(tk, "handed over to a new process");
    } else if (now >= tk->deadline_ms) {
        log_warn("takeover: %llu client(s) not handed over within shutdown_timeout_ms (%lu "
                 "were): closed after their replies",
                 (unsigned long long)left, tk->handed);
        tk_finish_source(tk, "takeover: shutdown_timeout_ms reached");
    }
}

static void tk_scan_cb(uv_timer_t *t)
{
    tk_scan(t->data);
}

static void tk_source_abort(takeover *tk, const char *why)
{
    ferry *f = tk->f;
    int handing = tk->phase == TK_SRC_HANDING;

    log_error("takeover aborted: %s", why);
    tk_unwatch(&tk->cpoll, &tk->cfd);
    if (tk->scan != NULL) {
        uv_close((uv_handle_t *)tk->scan, tk_free_handle_cb);
        tk->scan = NULL;
    }
    tk_set_phase(tk, TK_IDLE);
    if (handing) {
        /* The listeners went to the new process: this one keeps the
         * clients it still has, and accepts no new ones. */
        log_error("takeover: this process no longer listens; %llu client(s) stay with it",
                  (unsigned long long)workers_clients(f));
        tk_resume_reading(tk);
        workers_takeover_abort(f);
        tk_relay_drain(tk); /* what the workers posted is served here */
    }
}

void takeover_worker_hand(ferry *f, tk_relay *relay)
{
    if (f->stopping || f->closed) {
        return; /* closing its clients already (SIGTERM's rules) */
    }
    if (f->takeover == NULL) {
        f->takeover = tk_new(f);
    }
    takeover *tk = f->takeover;
    if (tk->phase != TK_IDLE) {
        return;
    }
    tk->relay = relay;
    tk->started_ms = uv_now(f->loop);
    tk_begin_handing(tk);
}

void takeover_worker_abort(ferry *f)
{
    takeover *tk = f->takeover;
    if (tk == NULL || tk->phase != TK_SRC_HANDING) {
        return; /* done already: its clients are over, or closing */
    }
    if (tk->scan != NULL) {
        uv_close((uv_handle_t *)tk->scan, tk_free_handle_cb);
        tk->scan = NULL;
    }
    tk_set_phase(tk, TK_IDLE);
    tk_resume_reading(tk);
}

/* ---------------------------------------------------- new: the sessions */

/* Every loop's master view is UP: the main loop's now, each worker's as
 * it published it on its last tick. */
static int tk_all_up(ferry *f)
{
    worker_view views[CONFIG_MAX_WORKERS];
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

static void tk_control_cb(uv_poll_t *h, int status, int events)
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
