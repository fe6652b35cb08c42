/* fuzz_tls.c - libFuzzer target for ferry's TLS read path (proxy/base/tls.c and
 * outq_tls_input in buf.c): what a socket hands to a TLS session, in
 * data-derived splits.
 *
 * Bit 1 of the first byte picks the case:
 *  - clear: the rest is raw bytes from a "client" to a server session (a
 *    ClientHello, garbage, plain RESP): fed in random splits, it must end
 *    in an error or a wait, never a crash, and never any plaintext;
 *  - set: a real client session does the handshake with the server, then
 *    sends the bytes after the second as application data; its records
 *    reach the server in random splits, one byte of them (placed by the
 *    second byte) flipped when bit 0 is set. The server must deliver
 *    exactly the data (unflipped), or a prefix of it and then an error or a
 *    wait (flipped): never a byte the client did not send.
 * The certificate is made once, in memory, and written to a temp dir. */
#include <openssl/ec.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "buf.h"
#include "config.h"
#include "tls.h"

static tls_conf *server_conf;
static tls_conf *client_conf;

static void check(int ok)
{
    if (!ok) {
        abort();
    }
}

/* A self-signed P-256 certificate and its key, as PEM files in dir. */
static void make_cert(const char *dir, char *cert, char *key, size_t len)
{
    EVP_PKEY *pk = EVP_EC_gen("P-256");
    X509 *x = X509_new();
    check(pk != NULL && x != NULL);
    ASN1_INTEGER_set(X509_get_serialNumber(x), 1);
    X509_gmtime_adj(X509_getm_notBefore(x), 0);
    X509_gmtime_adj(X509_getm_notAfter(x), 86400);
    X509_set_pubkey(x, pk);
    X509_NAME *name = X509_get_subject_name(x);
    X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC, (const unsigned char *)"fuzz", -1, -1, 0);
    X509_set_issuer_name(x, name);
    check(X509_sign(x, pk, EVP_sha256()) > 0);
    snprintf(cert, len, "%s/cert.pem", dir);
    snprintf(key, len, "%s/key.pem", dir);
    FILE *f = fopen(cert, "w");
    check(f != NULL && PEM_write_X509(f, x) == 1);
    fclose(f);
    f = fopen(key, "w");
    check(f != NULL && PEM_write_PrivateKey(f, pk, NULL, NULL, 0, NULL, NULL) == 1);
    fclose(f);
    X509_free(x);
    EVP_PKEY_free(pk);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    char dir[] = "/tmp/ferry-fuzz-tls-XXXXXX";
    char cert[128], key[128], err[512];
    check(mkdtemp(dir) != NULL);
    make_cert(dir, cert, key, sizeof(cert));
    config cfg;
    memset(&cfg, 0, sizeof(cfg));
    cfg.tls_cert_file = cert;
    cfg.tls_key_file = key;
    cfg.tls_protocols = "TLSv1.2 TLSv1.3";
    cfg.tls_auth_clients = TLS_AUTH_NO;
    server_conf = tls_conf_server(&cfg, err, sizeof(err));
    config_tls_peer peer;
    memset(&peer, 0, sizeof(peer));
    peer.verify = TLS_VERIFY_NONE;
    peer.ca_cert_file = cert;
    client_conf = tls_conf_client(&peer, err, sizeof(err));
    check(server_conf != NULL && client_conf != NULL);
    unlink(cert);
    unlink(key);
    rmdir(dir);
    return 0;
}

/* A small PRNG for the split sizes (xorshift). */
static uint32_t next(uint32_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 17;
    *s ^= *s << 5;
    return *s;
}

/* Ciphertext one side has for the other, moved across. */
static size_t pump(tls *from, tls *to)
{
    char b[4096];
    size_t moved = 0, n;
    while ((n = tls_take(from, b, sizeof(b))) > 0) {
        tls_put(to, b, n);
        moved += n;
    }
    return moved;
}

/* Feed p in random splits to the server queue q; plaintext into in.
 * Returns the first error, or 0. */
static int feed(outq *q, const uint8_t *p, size_t n, uint32_t seed, buf *in)
{
    uint32_t s = seed | 1;
    size_t at = 0;
    while (at < n) {
        size_t step = 1 + next(&s) % 700;
        if (step > n - at) {
            step = n - at;
        }
        int rc = outq_tls_input(q, (const char *)p + at, step, in);
        if (rc < 0) {
            return rc;
        }
        at += step;
    }
    return 0;
}

static void raw_case(const uint8_t *data, size_t size)
{
    outq q;
    buf in;
    outq_init(&q);
    buf_init(&in);
    q.tls = tls_new_server(server_conf, 0);
    check(q.tls != NULL);
    uint32_t seed = size > 0 ? data[0] * 2654435761u : 7;
    int rc = feed(&q, data, size, seed, &in);
    check(rc == 0 || rc == TLS_ERR || rc == TLS_EOF);
    check(buf_used(&in) == 0); /* no handshake: nothing is plaintext */
    char b[512];
    while (tls_take(q.tls, b, sizeof(b)) > 0) {
    }
    buf_free(&in);
    outq_free(&q);
}

static void session_case(const uint8_t *data, size_t size)
{
    int flip = size > 0 && (data[0] & 1);
    size_t flip_at = size > 1 ? data[1] : 0;
    const uint8_t *payload = size > 2 ? data + 2 : data;
    size_t plen = size > 2 ? size - 2 : 0;
    outq q;
    buf in;
    outq_init(&q);
    buf_init(&in);
    q.tls = tls_new_server(server_conf, 0);
    tls *c = tls_new_client(client_conf, "localhost");
    check(q.tls != NULL && c != NULL);
    /* the handshake, in memory */
    char scratch[64];
    for (int round = 0; round < 8 && !(tls_ready(c) && tls_ready(q.tls)); round++) {
        tls_read(c, scratch, sizeof(scratch));
        pump(c, q.tls);
        check(tls_read(q.tls, scratch, sizeof(scratch)) == 0);
        pump(q.tls, c);
    }
    tls_read(c, scratch, sizeof(scratch)); /* the tickets */
    check(tls_ready(c) && tls_ready(q.tls));
    /* the client's records */
    size_t at = 0;
    while (at < plen) {
        ssize_t w = tls_write(c, (const char *)payload + at, plen - at);
        check(w > 0);
        at += (size_t)w;
    }
    size_t clen = tls_pending(c);
    uint8_t *ct = malloc(clen > 0 ? clen : 1);
    check(ct != NULL && tls_take(c, (char *)ct, clen) == clen);
    if (flip && clen > 0) {
        ct[(flip_at * 131) % clen] ^= (uint8_t)(1u << (flip_at % 8));
    }
    int rc = feed(&q, ct, clen, (uint32_t)(plen * 40503u + flip_at), &in);
    check(buf_used(&in) <= plen && memcmp(buf_head(&in), payload, buf_used(&in)) == 0);
    if (!flip || clen == 0) {
        check(rc == 0 && buf_used(&in) == plen);
    } else {
        check(rc == 0 || rc == TLS_ERR); /* a flipped length waits for more */
    }
    free(ct);
    tls_free(c);
    buf_free(&in);
    outq_free(&q);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0 || (data[0] & 2) == 0) {
        raw_case(size > 0 ? data + 1 : data, size > 0 ? size - 1 : 0);
    } else {
        session_case(data, size);
    }
    return 0;
}
