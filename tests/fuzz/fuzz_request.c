/* fuzz_request.c - libFuzzer target for the RESP request parser. The input
 * is parsed whole, split at one data-derived point, and in many small reads,
 * with default and with tiny limits; every way must give the same digest,
 * and every request must re-encode as multibulk and parse back unchanged. */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "resp.h"

/* What a run produced, folded so that two runs can be compared. */
typedef struct digest {
    uint64_t hash;   /* FNV-1a over results, arguments and error text */
    size_t requests; /* requests completed */
    size_t consumed; /* bytes they spanned */
    int failed;      /* ended with a protocol error */
} digest;

static void check(int ok)
{
    if (!ok) {
        abort();
    }
}

static void mix(digest *d, const void *p, size_t n)
{
    const unsigned char *b = p;
    size_t i;
    for (i = 0; i < n; i++) {
        d->hash = (d->hash ^ b[i]) * 1099511628211ULL;
    }
}

static void mix_size(digest *d, size_t v)
{
    mix(d, &v, sizeof(v));
}

static resp_parser *reencoder; /* parses re-encoded requests */

/* Encodes req as a multibulk request, parses it with a fresh parser and
 * checks that the same arguments come back. */
static void check_reencode(const resp_request *req)
{
    size_t cap = 32, len = 0, i;
    char *out;
    resp_parser *p;
    resp_request back;

    for (i = 0; i < req->argc; i++) {
        cap += req->argv[i].len + 32;
    }
    out = malloc(cap);
    check(out != NULL);
    len += (size_t)snprintf(out, cap, "*%zu\r\n", req->argc);
    for (i = 0; i < req->argc; i++) {
        len += (size_t)snprintf(out + len, cap - len, "$%zu\r\n", req->argv[i].len);
        memcpy(out + len, req->argv[i].ptr, req->argv[i].len);
        len += req->argv[i].len;
        memcpy(out + len, "\r\n", 2);
        len += 2;
    }
    /* default limits: inline arguments are not bound by the tiny ones;
     * one parser for all inputs, reset each time, keeps runs fast */
    if (reencoder == NULL) {
        reencoder = resp_parser_new(NULL);
    }
    p = reencoder;
    resp_parser_reset(p);
    if (req->argc > 0) {
        check(resp_parse_request(p, out, len, &back) == RESP_OK);
        check(back.len == len);
        check(back.argc == req->argc);
        for (i = 0; i < back.argc; i++) {
            check(back.argv[i].len == req->argv[i].len);
            check(memcmp(back.argv[i].ptr, req->argv[i].ptr, back.argv[i].len) == 0);
        }
    }
    free(out);
}

/* Feeds data in reads of the sizes next_read() picks, like ferry's read
 * path: unconsumed bytes are kept, new ones appended, and the buffer moves
 * on every read so stale pointers show up under ASan. */
static void run(resp_parser *p, const resp_limits *lim, const uint8_t *data, size_t size, int how,
                size_t cut, digest *d, int reencode)
{
    resp_limits eff = {RESP_DEFAULT_MAX_BULK_LEN, RESP_DEFAULT_MAX_ARGS,
                       RESP_DEFAULT_MAX_INLINE_LEN};
    char *buf = NULL;
    size_t len = 0, fed = 0;
    uint32_t roll = 2166136261u;

    if (lim != NULL) {
        eff = *lim;
    }
    resp_parser_reset(p);
    memset(d, 0, sizeof(*d));
    d->hash = 14695981039346656037ULL;
    while (!d->failed) {
        size_t n = size - fed;
        char *moved;
        if (how == 1 && fed < cut) {
            n = cut - fed;
        } else if (how == 2 && n > 0) {
            roll = (roll ^ data[fed]) * 16777619u;
            n = 1 + roll % 13 < n ? 1 + roll % 13 : n;
        }
        moved = malloc(len + n + 1);
        check(moved != NULL);
        if (len > 0) {
            memcpy(moved, buf, len);
        }
        if (n > 0) {
            memcpy(moved + len, data + fed, n);
        }
        free(buf);
        buf = moved;
        len += n;
        fed += n;

        for (;;) {
            resp_request req;
            size_t i, total = 0;
            int rc = resp_parse_request(p, buf, len, &req);
            if (rc == RESP_AGAIN) {
                break;
            }
            if (rc == RESP_ERR) {
                const char *e = resp_parser_error(p);
                check(e != NULL && e[0] != '\0');
                mix(d, e, strlen(e));
                check(resp_parse_request(p, buf, len, &req) == RESP_ERR);
                d->failed = 1;
                break;
            }
            check(rc == RESP_OK);
            check(req.len > 0 && req.len <= len);
            check(req.is_inline == (buf[0] != '*'));
            check(req.argc == 0 || req.argv != NULL);
            for (i = 0; i < req.argc; i++) {
                const resp_arg *a = &req.argv[i];
                total += a->len;
                if (!req.is_inline) {
                    check(a->ptr >= buf && a->ptr + a->len <= buf + req.len);
                    check(a->len <= eff.max_bulk_len);
                }
                mix_size(d, a->len);
                mix(d, a->ptr, a->len);
            }
            check(total <= req.len);
            check(req.is_inline || req.argc <= eff.max_args);
            check(!req.is_inline || req.len <= eff.max_inline_len + 1);
            mix_size(d, req.len);
            mix_size(d, req.argc);
            mix_size(d, (size_t)req.is_inline);
            if (reencode) {
                check_reencode(&req);
            }
            d->requests++;
            d->consumed += req.len;
            memmove(buf, buf + req.len, len - req.len);
            len -= req.len;
        }
        if (fed == size) {
            break;
        }
    }
    check(d->consumed <= size);
    if (!d->failed) {
        check(d->consumed + len == size);
    }
    free(buf);
}

static void same(const digest *a, const digest *b)
{
    check(a->hash == b->hash);
    check(a->requests == b->requests);
    check(a->consumed == b->consumed);
    check(a->failed == b->failed);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const resp_limits tiny = {16, 4, 32};
    const resp_limits *limits[2] = {NULL, &tiny};
    static resp_parser *parsers[2]; /* reused across inputs, reset per run */
    size_t cut = 0, i, k;

    for (i = 0; i < size && i < 8; i++) {
        cut = cut * 31 + data[i];
    }
    cut = size > 0 ? cut % (size + 1) : 0;

    for (k = 0; k < 2; k++) {
        digest whole, split, bits;
        if (parsers[k] == NULL) {
            parsers[k] = resp_parser_new(limits[k]);
        }
        run(parsers[k], limits[k], data, size, 0, 0, &whole, 1);
        run(parsers[k], limits[k], data, size, 1, cut, &split, 0);
        run(parsers[k], limits[k], data, size, 2, 0, &bits, 0);
        same(&whole, &split);
        same(&whole, &bits);
    }
    return 0;
}
