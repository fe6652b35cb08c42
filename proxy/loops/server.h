/* server.h - the client listeners (TCP and unix sockets). */
#ifndef FERRY_SERVER_H
#define FERRY_SERVER_H

#include "ferry.h"

/* A stream handle that is a TCP or a unix socket. */
typedef union server_io {
    uv_handle_t h;
    uv_stream_t s;
    uv_tcp_t tcp;
    uv_pipe_t pipe;
} server_io;

/* Fill ss from a numeric IPv4 or IPv6 address (no name lookup). Returns 0
 * or a negative uv error. */
int server_numeric_addr(const char *ip, int port, struct sockaddr_storage *ss);
/* Look host:port up off the loop (any address family, a stream socket);
 * cb gets the answer with req->data = data. Returns 0 or a negative uv
 * error (cb is then not called). */
int server_resolve(uv_loop_t *loop, uv_getaddrinfo_t *req, uv_getaddrinfo_cb cb, const char *host,
                   int port, void *data);
/* In a lookup's callback: the first address of a successful answer into
 * ss. Frees res either way. Returns 0, or -1 when the lookup failed or
 * found nothing usable. */
int server_resolved_addr(int status, struct addrinfo *res, struct sockaddr_storage *ss);

/* Initialise io on loop (io->h.data = data), bind it to a and listen. The
 * handle is initialised, and must be closed, whether or not this succeeds.
 * Returns 0 or a negative uv error. */
int server_listen(uv_loop_t *loop, server_io *io, const config_addr *a, void *data, int backlog,
                  uv_connection_cb cb);

/* Bind and listen on every configured address. Returns 0, or a negative uv
 * error after logging which address failed (nothing is left open). */
int server_start(ferry *f);
/* Stop accepting (close the listeners). */
void server_stop(ferry *f);
/* The open listening sockets and their addresses, at most max (for a
 * takeover; the sockets stay ferry's). Returns how many. */
int server_sockets(ferry *f, int *fds, const config_addr **addrs, int max);
/* Free the listener table (after the loop closed the handles). */
void server_free(ferry *f);

#endif
