/* server.c - listeners: accept client connections on TCP or unix sockets
 * and hand each to a new session. */
#include "server.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "log.h"

typedef struct listener {
    ferry *f;                /* context */
    server_io io;            /* listening socket */
    int is_unix;             /* pipe or tcp */
    int is_tls;              /* a listen_tls address: its clients speak TLS */
    int tls_index;           /* is_tls: its entry in listen_tls */
    const config_addr *addr; /* its configured address */
    char name[300];          /* address for logs */
    int open;                /* handle initialised and not closed */
} listener;

typedef struct servers {
    listener l[2 * CONFIG_MAX_LISTEN]; /* one per configured address: listen, then listen_tls */
    int n;
} servers;

static void server_close_cb(uv_handle_t *h)
{
    (void)h;
}

static void server_conn_cb(uv_stream_t *st, int status)
{
    listener *ls = st->data;
    if (status < 0) {
        log_warn("listener %s: accept failed: %s", ls->name, uv_strerror(status));
        return;
    }
    if (ls->f->stopping) {
        return;
    }
    int how = ls->is_unix ? FERRY_ACCEPT_UNIX : 0;
    if (ls->is_tls) {
        how |= FERRY_ACCEPT_TLS | (ls->tls_index << FERRY_ACCEPT_INDEX_SHIFT);
    }
    int rc = ls->f->accept(ls->f, st, how);
    if (rc < 0) {
        log_warn("listener %s: accept failed: %s", ls->name, uv_strerror(rc));
    }
}

int server_numeric_addr(const char *ip, int port, struct sockaddr_storage *ss)
{
    memset(ss, 0, sizeof(*ss));
    if (strchr(ip, ':') != NULL) {
        return uv_ip6_addr(ip, port, (struct sockaddr_in6 *)ss);
    }
    return uv_ip4_addr(ip, port, (struct sockaddr_in *)ss);
}

int server_resolve(uv_loop_t *loop, uv_getaddrinfo_t *req, uv_getaddrinfo_cb cb, const char *host,
                   int port, void *data)
{
    struct addrinfo hints;
    char text[16];
    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    snprintf(text, sizeof(text), "%d", port);
    req->data = data;
    return uv_getaddrinfo(loop, req, cb, host, text, &hints);
}

int server_resolved_addr(int status, struct addrinfo *res, struct sockaddr_storage *ss)
{
    int rc = -1;
    if (status == 0 && res != NULL && res->ai_addrlen <= sizeof(*ss)) {
        memset(ss, 0, sizeof(*ss));
        memcpy(ss, res->ai_addr, res->ai_addrlen);
        rc = 0;
    }
    uv_freeaddrinfo(res);
    return rc;
}

/* A unix stream socket bound to path (a stale socket file from an earlier
 * run is replaced), or a negative errno. */
static int unix_listen_socket(const char *path)
{
    struct sockaddr_un sa;
    int fd;
    if (strlen(path) >= sizeof(sa.sun_path)) {
        return UV_ENAMETOOLONG;
    }
    fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        return -errno;
    }
    memset(&sa, 0, sizeof(sa));
    sa.sun_family = AF_UNIX;
    memcpy(sa.sun_path, path, strlen(path));
    unlink(path);
    if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0) {
        int rc = -errno;
        close(fd);
        return rc;
    }
    return fd;
}

int server_listen(uv_loop_t *loop, server_io *io, const config_addr *a, void *data, int backlog,
                  uv_connection_cb cb)
{
    int rc;
    ferry *f = loop->data;
    int fd = f->claim_listener(f, a);
    if (fd >= 0) {
        /* Inherited from the ferry this one takes over: already bound. */
        if (a->is_unix) {
            uv_pipe_init(loop, &io->pipe, 0);
            rc = uv_pipe_open(&io->pipe, fd);
        } else {
            uv_tcp_init(loop, &io->tcp);
            rc = uv_tcp_open(&io->tcp, fd);
        }
        io->h.data = data;
        if (rc < 0) {
            close(fd);
            return rc;
        }
        return uv_listen(&io->s, backlog, cb);
    }
    if (a->is_unix) {
        /* Bound here rather than with uv_pipe_bind: libuv unlinks the path
         * of a pipe it bound when the handle closes, and a listener handed
         * over to a new process (takeover) must stay where it is. ferry
         * removes the path itself when it stops (server_stop, stats_stop). */
        uv_pipe_init(loop, &io->pipe, 0);
        io->h.data = data;
        fd = unix_listen_socket(a->path);
        if (fd < 0) {
            return fd;
        }
        rc = uv_pipe_open(&io->pipe, fd);
        if (rc < 0) {
            close(fd);
        }
    } else {
        struct sockaddr_storage ss;
        uv_tcp_init(loop, &io->tcp);
        io->h.data = data;
        rc = server_numeric_addr(a->host, a->port, &ss);
        if (rc == 0) {
            rc = uv_tcp_bind(&io->tcp, (const struct sockaddr *)&ss, 0);
        }
    }
    if (rc == 0) {
        rc = uv_listen(&io->s, backlog, cb);
    }
    return rc;
}

static int listen_one(ferry *f, listener *ls, const config_addr *a, int is_tls)
{
    ls->f = f;
    ls->is_unix = a->is_unix;
    ls->is_tls = is_tls;
    ls->addr = a;
    config_addr_str(a, ls->name, sizeof(ls->name));
    ls->open = 1;
    int rc = server_listen(f->loop, &ls->io, a, ls, 511, server_conn_cb);
    if (rc < 0) {
        log_error("cannot listen on %s: %s", ls->name, uv_strerror(rc));
        return rc;
    }
    log_info("listening on %s%s", ls->name, is_tls ? " (TLS)" : "");
    return 0;
}

int server_start(ferry *f)
{
    servers *sv = xcalloc(1, sizeof(*sv));
    f->servers = sv;
    int total = f->cfg->nlisten + f->cfg->nlisten_tls;
    for (int i = 0; i < total; i++) {
        int is_tls = i >= f->cfg->nlisten;
        const config_addr *a =
            is_tls ? &f->cfg->listen_tls[i - f->cfg->nlisten] : &f->cfg->listen[i];
        sv->l[i].tls_index = is_tls ? i - f->cfg->nlisten : 0;
        int rc = listen_one(f, &sv->l[i], a, is_tls);
        sv->n = i + 1;
        if (rc < 0) {
            server_stop(f);
            return rc;
        }
    }
    return 0;
}

void server_stop(ferry *f)
{
    servers *sv = f->servers;
    if (sv == NULL) {
        return;
    }
    for (int i = 0; i < sv->n; i++) {
        if (sv->l[i].open) {
            sv->l[i].open = 0;
            uv_close(&sv->l[i].io.h, server_close_cb);
            if (sv->l[i].is_unix && !f->keep_paths) {
                unlink(sv->l[i].addr->path);
            }
        }
    }
    sv->n = 0;
}

int server_sockets(ferry *f, int *fds, const config_addr **addrs, int max)
{
    servers *sv = f->servers;
    int n = 0;
    for (int i = 0; sv != NULL && i < sv->n && n < max; i++) {
        uv_os_fd_t fd;
        if (sv->l[i].open && uv_fileno(&sv->l[i].io.h, &fd) == 0) {
            fds[n] = fd;
            addrs[n++] = sv->l[i].addr;
        }
    }
    return n;
}

void server_free(ferry *f)
{
    free(f->servers);
    f->servers = NULL;
}
