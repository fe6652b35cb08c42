/* tls.c - OpenSSL sessions on memory BIOs for ferry's streams: the
 * contexts of each role (client listener, Redis nodes, sentinels), their
 * reload, and one connection's encrypt/decrypt steps. Renegotiation is
 * refused, TLS 1.2 is the oldest protocol offered. */
#include "tls.h"

#include <arpa/inet.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ferry.h"

enum { ROLE_SERVER = 0, ROLE_PEER };

struct tls_conf {
    int role;           /* ROLE_* */
    pthread_mutex_t mu; /* guards ctx (loops make sessions while a reload swaps it) */
    SSL_CTX *ctx;       /* the current context; sessions hold their own reference */
    char *server_name;  /* ROLE_PEER: SNI and the name verified, NULL = the host */
    int verify;         /* ROLE_PEER: TLS_VERIFY_* */
    tls_figures fig;    /* counted with atomic adds (every loop counts here) */
    tls_figures per[CONFIG_MAX_LISTEN]; /* ROLE_SERVER: each listen_tls entry's share */
};

struct tls {
    tls_conf *conf;   /* its role (figures) */
    tls_figures *per; /* its listener's figures too, or NULL */
    SSL *ssl;         /* the session */
    BIO *rbio;        /* ciphertext from the peer, read by OpenSSL */
    BIO *wbio;        /* ciphertext for the peer, written by OpenSSL */
    int done;         /* the handshake finished (and was counted) */
    int failed;       /* a failure was counted */
    char err[200];    /* the last error, for logs */
};

static const char *const fail_names[TLS_NFAIL] = {"timeout", "not_tls", "certificate", "protocol",
                                                  "closed"};

const char *tls_fail_name(tls_fail why)
{
    return (unsigned)why < TLS_NFAIL ? fail_names[why] : "?";
}

static void count(uint64_t *v)
{
    __atomic_fetch_add(v, 1, __ATOMIC_RELAXED);
}

/* OpenSSL's queued errors as one line into err (and clears them). */
static void ssl_errors(char *err, size_t errlen, const char *what)
{
    unsigned long e;
    size_t at = (size_t)snprintf(err, errlen, "%s", what);
    while ((e = ERR_get_error()) != 0 && at + 2 < errlen) {
        char one[160];
        ERR_error_string_n(e, one, sizeof(one));
        at += (size_t)snprintf(err + at, errlen - at, ": %s", one);
    }
    ERR_clear_error();
}

/* Oldest and newest protocol from "TLSv1.2 TLSv1.3" (checked by config). */
static void protocols(const char *s, int *min, int *max)
{
    int has12 = s == NULL || strstr(s, "TLSv1.2") != NULL;
    int has13 = s == NULL || strstr(s, "TLSv1.3") != NULL;
    *min = has12 ? TLS1_2_VERSION : TLS1_3_VERSION;
    *max = has13 ? TLS1_3_VERSION : TLS1_2_VERSION;
}

static void ctx_common(SSL_CTX *ctx)
{
    SSL_CTX_set_options(ctx, SSL_OP_NO_RENEGOTIATION | SSL_OP_NO_COMPRESSION);
    SSL_CTX_set_mode(ctx, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER |
                              SSL_MODE_RELEASE_BUFFERS);
}

/* Certificate and key into ctx. Returns 0 or -1 with err filled. */
static int load_pair(SSL_CTX *ctx, const char *cert, const char *key, char *err, size_t errlen)
{
    char what[600];
    if (SSL_CTX_use_certificate_chain_file(ctx, cert) != 1) {
        snprintf(what, sizeof(what), "cannot load certificate %s", cert);
        ssl_errors(err, errlen, what);
        return -1;
    }
    if (SSL_CTX_use_PrivateKey_file(ctx, key, SSL_FILETYPE_PEM) != 1) {
        snprintf(what, sizeof(what), "cannot load key %s", key);
        ssl_errors(err, errlen, what);
        return -1;
    }
    if (SSL_CTX_check_private_key(ctx) != 1) {
        snprintf(what, sizeof(what), "key %s does not match certificate %s", key, cert);
        ssl_errors(err, errlen, what);
        return -1;
    }
    return 0;
}

static int load_ca(SSL_CTX *ctx, const char *ca, char *err, size_t errlen)
{
    char what[600];
    if (SSL_CTX_load_verify_locations(ctx, ca, NULL) != 1) {
        snprintf(what, sizeof(what), "cannot load CA certificates %s", ca);
        ssl_errors(err, errlen, what);
        return -1;
    }
    return 0;
}

static SSL_CTX *server_ctx(const config *cfg, char *err, size_t errlen)
{
    SSL_CTX *ctx = SSL_CTX_new(TLS_server_method());
    if (ctx == NULL) {
        ssl_errors(err, errlen, "cannot make a TLS context");
        return NULL;
    }
    ctx_common(ctx);
    SSL_CTX_set_options(ctx, SSL_OP_CIPHER_SERVER_PREFERENCE);
    int min, max;
    protocols(cfg->tls_protocols, &min, &max);
    SSL_CTX_set_min_proto_version(ctx, min);
    SSL_CTX_set_max_proto_version(ctx, max);
    /* Sessions resume (a cache for TLS 1.2 ids, tickets for both). */
    SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_SERVER);
    SSL_CTX_set_session_id_context(ctx, (const unsigned char *)"ferry", 5);
    if (load_pair(ctx, cfg->tls_cert_file, cfg->tls_key_file, err, errlen) < 0) {
        goto fail;
    }
    if (cfg->tls_ca_cert_file != NULL && load_ca(ctx, cfg->tls_ca_cert_file, err, errlen) < 0) {
        goto fail;
    }
    if (cfg->tls_ca_cert_file != NULL && cfg->tls_auth_clients != TLS_AUTH_NO) {
        STACK_OF(X509_NAME) *names = SSL_load_client_CA_file(cfg->tls_ca_cert_file);
        if (names != NULL) {
            SSL_CTX_set_client_CA_list(ctx, names);
        }
    }
    SSL_CTX_set_verify(ctx,
                       cfg->tls_auth_clients == TLS_AUTH_YES
                           ? SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT
                       : cfg->tls_auth_clients == TLS_AUTH_OPTIONAL ? SSL_VERIFY_PEER
                                                                    : SSL_VERIFY_NONE,
                       NULL);
    if (cfg->tls_ciphers != NULL && SSL_CTX_set_cipher_list(ctx, cfg->tls_ciphers) != 1) {
        ssl_errors(err, errlen, "tls.ciphers: no cipher usable");
        goto fail;
    }
    if (cfg->tls_ciphersuites != NULL &&
        SSL_CTX_set_ciphersuites(ctx, cfg->tls_ciphersuites) != 1) {
        ssl_errors(err, errlen, "tls.ciphersuites: no cipher suite usable");
        goto fail;
    }
    return ctx;
fail:
    SSL_CTX_free(ctx);
    return NULL;
}

static SSL_CTX *peer_ctx(const config_tls_peer *p, char *err, size_t errlen)
{
    SSL_CTX *ctx = SSL_CTX_new(TLS_client_method());
    if (ctx == NULL) {
        ssl_errors(err, errlen, "cannot make a TLS context");
        return NULL;
    }
    ctx_common(ctx);
    SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
    if (p->cert_file != NULL && load_pair(ctx, p->cert_file, p->key_file, err, errlen) < 0) {
        goto fail;
    }
    if (p->ca_cert_file != NULL) {
        if (load_ca(ctx, p->ca_cert_file, err, errlen) < 0) {
            goto fail;
        }
    } else if (SSL_CTX_set_default_verify_paths(ctx) != 1) {
        ssl_errors(err, errlen, "cannot load the system's CA certificates");
        goto fail;
    }
    SSL_CTX_set_verify(ctx, p->verify == TLS_VERIFY_NONE ? SSL_VERIFY_NONE : SSL_VERIFY_PEER, NULL);
    return ctx;
fail:
    SSL_CTX_free(ctx);
    return NULL;
}

static tls_conf *conf_new(int role, SSL_CTX *ctx)
{
    tls_conf *c = xcalloc(1, sizeof(*c));
    c->role = role;
    c->ctx = ctx;
    pthread_mutex_init(&c->mu, NULL);
    return c;
}

tls_conf *tls_conf_server(const config *cfg, char *err, size_t errlen)
{
    SSL_CTX *ctx = server_ctx(cfg, err, errlen);
    return ctx != NULL ? conf_new(ROLE_SERVER, ctx) : NULL;
}

tls_conf *tls_conf_client(const config_tls_peer *p, char *err, size_t errlen)
{
    SSL_CTX *ctx = peer_ctx(p, err, errlen);
    if (ctx == NULL) {
        return NULL;
    }
    tls_conf *c = conf_new(ROLE_PEER, ctx);
    c->server_name = p->server_name != NULL ? xstrdup(p->server_name) : NULL;
    c->verify = p->verify;
    return c;
}

int tls_conf_reload(tls_conf *c, const config *cfg, const config_tls_peer *p, char *err,
                    size_t errlen)
{
    SSL_CTX *ctx = c->role == ROLE_SERVER ? server_ctx(cfg, err, errlen) : peer_ctx(p, err, errlen);
    if (ctx == NULL) {
        count(&c->fig.reload_failures);
        return -1;
    }
    pthread_mutex_lock(&c->mu);
    SSL_CTX *old = c->ctx;
    c->ctx = ctx;
    pthread_mutex_unlock(&c->mu);
    SSL_CTX_free(old); /* open sessions keep their own reference */
    count(&c->fig.reloads);
    return 0;
}

void tls_conf_free(tls_conf *c)
{
    if (c == NULL) {
        return;
    }
    SSL_CTX_free(c->ctx);
    pthread_mutex_destroy(&c->mu);
    free(c->server_name);
    free(c);
}

static void figures_copy(tls_figures *from, tls_figures *out)
{
    uint64_t *src = (uint64_t *)from, *dst = (uint64_t *)out;
    for (size_t i = 0; i < sizeof(*out) / sizeof(uint64_t); i++) {
        dst[i] = __atomic_load_n(&src[i], __ATOMIC_RELAXED);
    }
}

void tls_conf_figures(tls_conf *c, tls_figures *out)
{
    figures_copy(&c->fig, out);
}

void tls_conf_listener_figures(tls_conf *c, int listener, tls_figures *out)
{
    if (listener >= 0 && listener < CONFIG_MAX_LISTEN) {
        figures_copy(&c->per[listener], out);
    } else {
        memset(out, 0, sizeof(*out));
    }
}

void tls_conf_count(tls_conf *c, tls_fail why)
{
    if ((unsigned)why < TLS_NFAIL) {
        count(&c->fig.failures[why]);
    }
}

int tls_roles_load(tls_roles *r, const config *cfg, char *err, size_t errlen)
{
    char why[400];
    memset(r, 0, sizeof(*r));
    if (cfg->nlisten_tls > 0 && (r->clients = tls_conf_server(cfg, why, sizeof(why))) == NULL) {
        snprintf(err, errlen, "tls: %s", why);
        return -1;
    }
    if (cfg->redis_tls.enabled &&
        (r->redis = tls_conf_client(&cfg->redis_tls, why, sizeof(why))) == NULL) {
        snprintf(err, errlen, "redis.tls: %s", why);
        tls_roles_free(r);
        return -1;
    }
    if (cfg->sentinel_tls.enabled &&
        (r->sentinel = tls_conf_client(&cfg->sentinel_tls, why, sizeof(why))) == NULL) {
        snprintf(err, errlen, "sentinel.tls: %s", why);
        tls_roles_free(r);
        return -1;
    }
    return 0;
}

int tls_roles_reload(tls_roles *r, const config *cfg, char *err, size_t errlen)
{
    char why[400];
    int rc = 0;
    err[0] = '\0';
    if (r->clients != NULL && tls_conf_reload(r->clients, cfg, NULL, why, sizeof(why)) < 0) {
        snprintf(err, errlen, "tls: %s", why);
        rc = -1;
    }
    if (r->redis != NULL && tls_conf_reload(r->redis, cfg, &cfg->redis_tls, why, sizeof(why)) < 0 &&
        rc == 0) {
        snprintf(err, errlen, "redis.tls: %s", why);
        rc = -1;
    }
    if (r->sentinel != NULL &&
        tls_conf_reload(r->sentinel, cfg, &cfg->sentinel_tls, why, sizeof(why)) < 0 && rc == 0) {
        snprintf(err, errlen, "sentinel.tls: %s", why);
        rc = -1;
    }
    return rc;
}

void tls_roles_free(tls_roles *r)
{
    tls_conf_free(r->clients);
    tls_conf_free(r->redis);
    tls_conf_free(r->sentinel);
    memset(r, 0, sizeof(*r));
}

/* ------------------------------------------------------------- sessions */

static tls *session_new(tls_conf *c)
{
    pthread_mutex_lock(&c->mu);
    SSL *ssl = SSL_new(c->ctx);
    pthread_mutex_unlock(&c->mu);
    if (ssl == NULL) {
        ERR_clear_error();
        return NULL;
    }
    tls *t = xcalloc(1, sizeof(*t));
    t->conf = c;
    t->ssl = ssl;
    t->rbio = BIO_new(BIO_s_mem());
    t->wbio = BIO_new(BIO_s_mem());
    if (t->rbio == NULL || t->wbio == NULL) {
        BIO_free(t->rbio);
        BIO_free(t->wbio);
        SSL_free(ssl);
        free(t);
        ERR_clear_error();
        return NULL;
    }
    BIO_set_mem_eof_return(t->rbio, -1); /* empty: "retry", not end of file */
    BIO_set_mem_eof_return(t->wbio, -1);
    SSL_set_bio(ssl, t->rbio, t->wbio);
    return t;
}

tls *tls_new_server(tls_conf *c, int listener)
{
    tls *t = session_new(c);
    if (t != NULL) {
        SSL_set_accept_state(t->ssl);
        if (listener >= 0 && listener < CONFIG_MAX_LISTEN) {
            t->per = &c->per[listener];
        }
    }
    return t;
}

tls *tls_new_client(tls_conf *c, const char *host)
{
    tls *t = session_new(c);
    if (t == NULL) {
        return NULL;
    }
    SSL_set_connect_state(t->ssl);
    const char *name = c->server_name != NULL ? c->server_name : host;
    unsigned char ip[16];
    int is_ip = inet_pton(AF_INET, name, ip) == 1 || inet_pton(AF_INET6, name, ip) == 1;
    if (!is_ip) {
        SSL_set_tlsext_host_name(t->ssl, name); /* SNI is for names only */
    }
    if (c->verify == TLS_VERIFY_FULL) {
        X509_VERIFY_PARAM *vp = SSL_get0_param(t->ssl);
        if (is_ip) {
            X509_VERIFY_PARAM_set1_ip_asc(vp, name);
        } else {
            X509_VERIFY_PARAM_set_hostflags(vp, X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS);
            SSL_set1_host(t->ssl, name);
        }
    }
    ERR_clear_error();
    return t;
}

void tls_free(tls *t)
{
    if (t == NULL) {
        return;
    }
    SSL_free(t->ssl); /* frees both BIOs */
    free(t);
}

/* The handshake just finished: count it once. */
static void check_done(tls *t)
{
    if (!t->done && SSL_is_init_finished(t->ssl)) {
        t->done = 1;
        count(&t->conf->fig.handshakes);
        if (t->per != NULL) {
            count(&t->per->handshakes);
        }
        if (SSL_session_reused(t->ssl)) {
            count(&t->conf->fig.resumed);
            if (t->per != NULL) {
                count(&t->per->resumed);
            }
        }
    }
}

static tls_fail classify(tls *t, unsigned long e)
{
    if (SSL_get_verify_result(t->ssl) != X509_V_OK) {
        return TLS_FAIL_CERT;
    }
    if (ERR_GET_LIB(e) != ERR_LIB_SSL) {
        return TLS_FAIL_PROTOCOL;
    }
    switch (ERR_GET_REASON(e)) {
    case SSL_R_WRONG_VERSION_NUMBER:
    case SSL_R_HTTP_REQUEST:
    case SSL_R_HTTPS_PROXY_REQUEST:
    case SSL_R_UNKNOWN_PROTOCOL:
    case SSL_R_PACKET_LENGTH_TOO_LONG:
        return TLS_FAIL_NOT_TLS;
    case SSL_R_CERTIFICATE_VERIFY_FAILED:
    case SSL_R_PEER_DID_NOT_RETURN_A_CERTIFICATE:
    case SSL_R_TLSV1_ALERT_UNKNOWN_CA:
    case SSL_R_SSLV3_ALERT_BAD_CERTIFICATE:
    case SSL_R_SSLV3_ALERT_CERTIFICATE_UNKNOWN:
    case SSL_R_SSLV3_ALERT_CERTIFICATE_EXPIRED:
    case SSL_R_TLSV13_ALERT_CERTIFICATE_REQUIRED:
        return TLS_FAIL_CERT;
    default:
        return TLS_FAIL_PROTOCOL;
    }
}

/* An SSL call returned rc: 0 to retry later, or TLS_ERR / TLS_EOF. */
static int outcome(tls *t, int rc)
{
    int e = SSL_get_error(t->ssl, rc);
    check_done(t);
    if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE) {
        return 0;
    }
    if (e == SSL_ERROR_ZERO_RETURN) {
        snprintf(t->err, sizeof(t->err), "close_notify from the peer");
        return TLS_EOF;
    }
    unsigned long first = ERR_peek_error();
    tls_count_failure(t, classify(t, first));
    long vr = SSL_get_verify_result(t->ssl);
    if (vr != X509_V_OK) {
        snprintf(t->err, sizeof(t->err), "certificate: %s", X509_verify_cert_error_string(vr));
        ERR_clear_error();
    } else if (first != 0) {
        ssl_errors(t->err, sizeof(t->err), "TLS");
    } else {
        snprintf(t->err, sizeof(t->err), "TLS error %d", e);
    }
    return TLS_ERR;
}

void tls_put(tls *t, const char *p, size_t n)
{
    while (n > 0) {
        int chunk = n > (1u << 30) ? 1 << 30 : (int)n;
        int w = BIO_write(t->rbio, p, chunk);
        if (w <= 0) {
            return; /* a memory BIO fails only when memory does: ferry aborts first */
        }
        p += w;
        n -= (size_t)w;
    }
}

ssize_t tls_read(tls *t, char *dst, size_t cap)
{
    if (cap > (1u << 30)) {
        cap = 1u << 30;
    }
    ERR_clear_error();
    int rc = SSL_read(t->ssl, dst, (int)cap);
    if (rc > 0) {
        check_done(t);
        return rc;
    }
    return outcome(t, rc);
}

ssize_t tls_write(tls *t, const char *p, size_t n)
{
    if (n == 0) {
        return 0;
    }
    if (n > (1u << 30)) {
        n = 1u << 30;
    }
    ERR_clear_error();
    int rc = SSL_write(t->ssl, p, (int)n);
    if (rc > 0) {
        check_done(t);
        return rc;
    }
    rc = outcome(t, rc);
    return rc == TLS_EOF ? TLS_ERR : rc;
}

size_t tls_pending(const tls *t)
{
    return BIO_ctrl_pending(t->wbio);
}

size_t tls_take(tls *t, char *dst, size_t cap)
{
    int chunk = cap > (1u << 30) ? 1 << 30 : (int)cap;
    int n = chunk > 0 ? BIO_read(t->wbio, dst, chunk) : 0;
    return n > 0 ? (size_t)n : 0;
}

void tls_bye(tls *t)
{
    if (t->done && !(SSL_get_shutdown(t->ssl) & SSL_SENT_SHUTDOWN)) {
        ERR_clear_error();
        SSL_shutdown(t->ssl);
        ERR_clear_error();
    }
}

int tls_ready(const tls *t)
{
    return t->done;
}

const char *tls_error(const tls *t)
{
    return t->err[0] != '\0' ? t->err : "TLS error";
}

void tls_count_failure(tls *t, tls_fail why)
{
    if (!t->done && !t->failed && (unsigned)why < TLS_NFAIL) {
        t->failed = 1;
        tls_conf_count(t->conf, why);
        if (t->per != NULL) {
            count(&t->per->failures[why]);
        }
    }
}

const char *tls_describe(const tls *t, char *out, size_t len)
{
    snprintf(out, len, "%s/%s", SSL_get_version(t->ssl), SSL_get_cipher_name(t->ssl));
    return out;
}
