/* tls.h - TLS on ferry's own streams: OpenSSL sessions on memory BIOs.
 * Ciphertext read from a socket is put in, plaintext comes out; plaintext
 * to send goes in, ciphertext to write comes out. No I/O here: the owner's
 * libuv stream, its buffers and its output queue (buf.c) stay as they are.
 *
 * A tls_conf is one role's settings (a client listener, the Redis nodes,
 * the sentinels) and its OpenSSL context; it is shared by every loop and
 * reloaded in place (new sessions take the new context, open ones keep
 * theirs). A tls is one connection's session, used on one loop only. */
#ifndef FERRY_TLS_H
#define FERRY_TLS_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "config.h"

typedef struct tls_conf tls_conf;
typedef struct tls tls;

/* Why a handshake failed (the stats' failure reasons). */
typedef enum tls_fail {
    TLS_FAIL_TIMEOUT = 0, /* not finished within tls.handshake_timeout_ms */
    TLS_FAIL_NOT_TLS,     /* the peer does not speak TLS (plain RESP, HTTP) */
    TLS_FAIL_CERT,        /* a certificate missing, refused or unverifiable */
    TLS_FAIL_PROTOCOL,    /* any other TLS error (version, cipher, bad record) */
    TLS_FAIL_CLOSED,      /* the peer closed the connection mid-handshake */
    TLS_NFAIL
} tls_fail;

/* A role's figures (all loops together). */
typedef struct tls_figures {
    uint64_t handshakes;          /* finished */
    uint64_t resumed;             /* of those, sessions resumed */
    uint64_t failures[TLS_NFAIL]; /* by tls_fail */
    uint64_t reloads;             /* certificate reloads that took */
    uint64_t reload_failures;     /* reloads refused (the old files stay) */
} tls_figures;

/* The names of the failure reasons, for stats ("timeout", "not_tls", ...). */
const char *tls_fail_name(tls_fail why);

/* A client listener's settings from cfg (tls.*), or a peer role's
 * (redis.tls, sentinel.tls). NULL with err filled when a file does not
 * load or a setting is refused. */
tls_conf *tls_conf_server(const config *cfg, char *err, size_t errlen);
tls_conf *tls_conf_client(const config_tls_peer *p, char *err, size_t errlen);
/* Load the files again: a listener's from cfg, a peer role's from p (the
 * name checked and verify mode stay as made). Returns 0, or -1 with err
 * filled and the context unchanged. */
int tls_conf_reload(tls_conf *c, const config *cfg, const config_tls_peer *p, char *err,
                    size_t errlen);
void tls_conf_free(tls_conf *c);
/* The role's figures, summed now; and a client listener's own (its index
 * among listen_tls, as given to tls_new_server). */
void tls_conf_figures(tls_conf *c, tls_figures *out);
void tls_conf_listener_figures(tls_conf *c, int listener, tls_figures *out);
/* Count a failure that the owner saw (TLS_FAIL_TIMEOUT, TLS_FAIL_CLOSED). */
void tls_conf_count(tls_conf *c, tls_fail why);

/* Every role's settings, made at start-up and shared by every loop. */
typedef struct tls_roles {
    tls_conf *clients;  /* listen_tls, NULL if none */
    tls_conf *redis;    /* redis.tls, NULL: plain TCP to the Redis nodes */
    tls_conf *sentinel; /* sentinel.tls, NULL: plain TCP to the sentinels */
} tls_roles;
/* Make the roles cfg asks for (the files are loaded: ferry -t checks
 * them). Returns 0, or -1 with err filled and nothing made. */
int tls_roles_load(tls_roles *r, const config *cfg, char *err, size_t errlen);
/* Reload every role's files; each one that fails keeps its old ones.
 * Returns 0, or -1 with err naming the first failure. */
int tls_roles_reload(tls_roles *r, const config *cfg, char *err, size_t errlen);
void tls_roles_free(tls_roles *r);

/* A session: a server side one (accepting a client on listen_tls entry
 * listener, whose figures it counts in too), or a client side one to host
 * (the address' host: SNI and name checks use server_name if set, else
 * host). NULL if OpenSSL cannot make one. */
tls *tls_new_server(tls_conf *c, int listener);
tls *tls_new_client(tls_conf *c, const char *host);
void tls_free(tls *t);

enum {
    TLS_ERR = -1, /* a TLS error: tls_error says what; close the connection */
    TLS_EOF = -2  /* the peer sent close_notify */
};

/* Ciphertext read from the socket. */
void tls_put(tls *t, const char *p, size_t n);
/* Plaintext out, at most cap bytes: > 0 bytes, 0 when more ciphertext is
 * needed (the handshake may have produced output: see tls_pending), or
 * TLS_ERR / TLS_EOF. */
ssize_t tls_read(tls *t, char *dst, size_t cap);
/* Plaintext in: bytes taken (> 0), 0 while the handshake still needs the
 * peer (keep them and try again after the next read), or TLS_ERR. */
ssize_t tls_write(tls *t, const char *p, size_t n);
/* Ciphertext waiting to be written to the socket, and taking it. */
size_t tls_pending(const tls *t);
size_t tls_take(tls *t, char *dst, size_t cap);
/* Queue a close_notify (once the handshake is done; no-op otherwise). */
void tls_bye(tls *t);
/* 1 once the handshake finished. */
int tls_ready(const tls *t);
/* The last error's text, for logs. */
const char *tls_error(const tls *t);
/* Count a failure of this session's handshake (once per session). */
void tls_count_failure(tls *t, tls_fail why);
/* Protocol and cipher of a finished handshake ("TLSv1.3/TLS_AES_256_GCM_SHA384"). */
const char *tls_describe(const tls *t, char *out, size_t len);

#endif
