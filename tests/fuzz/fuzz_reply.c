/* fuzz_reply.c - libFuzzer target for the RESP reply scanner. The input is
 * framed whole, split at one data-derived point, and in many small reads;
 * every way must frame the same replies and end the same way, and each
 * framed reply must frame alone to exactly its own length. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "resp.h"

/* What a run produced, folded so that two runs can be compared. */
typedef struct digest {
    uint64_t hash;   /* FNV-1a over reply lengths and error text */
    size_t replies;  /* replies framed */
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

/* A framed reply, scanned again on its own in an exact-size copy. */
static void check_alone(const char *reply, size_t n)
{
    char *copy = malloc(n);
    resp_scanner s;
    size_t rl = 0;

    check(copy != NULL);
    memcpy(copy, reply, n);
    resp_scanner_init(&s);
    check(resp_scan_reply(&s, copy, n, &rl) == RESP_OK);
    check(rl == n);
    /* and one byte short it is incomplete */
    resp_scanner_init(&s);
    check(resp_scan_reply(&s, copy, n - 1, &rl) == RESP_AGAIN);
    free(copy);
}

/* Feeds data like ferry's read path: unconsumed bytes are kept and new
 * ones appended, and the buffer moves on every read. how: 0 whole, 1 split
 * at cut, 2 small reads of data-derived sizes. */
static void run(const uint8_t *data, size_t size, int how, size_t cut, digest *d, int alone)
{
    resp_scanner s;
    char *buf = NULL;
    size_t len = 0, fed = 0;
    uint32_t roll = 2166136261u;

    resp_scanner_init(&s);
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
            size_t rl = 0;
            int rc = resp_scan_reply(&s, buf, len, &rl);
            if (rc == RESP_AGAIN) {
                check(s.pos <= len);
                check(s.need > 0 && s.need <= RESP_MAX_REPLY_NEED);
                break;
            }
            if (rc == RESP_ERR) {
                check(s.err != 0 && s.errstr[0] != '\0');
                check(memchr(s.errstr, '\0', sizeof(s.errstr)) != NULL);
                mix(d, s.errstr, strlen(s.errstr));
                check(resp_scan_reply(&s, buf, len, &rl) == RESP_ERR);
                d->failed = 1;
                break;
            }
            check(rc == RESP_OK);
            check(rl >= 3 && rl <= len);
            check(s.pos == 0 && s.need == 0);
            if (alone) {
                check_alone(buf, rl);
            }
            mix(d, &rl, sizeof(rl));
            d->replies++;
            d->consumed += rl;
            memmove(buf, buf + rl, len - rl);
            len -= rl;
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
    check(a->replies == b->replies);
    check(a->consumed == b->consumed);
    check(a->failed == b->failed);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    digest whole, split, bits;
    size_t cut = 0, i;

    for (i = 0; i < size && i < 8; i++) {
        cut = cut * 31 + data[i];
    }
    cut = size > 0 ? cut % (size + 1) : 0;

    run(data, size, 0, 0, &whole, 1);
    run(data, size, 1, cut, &split, 0);
    run(data, size, 2, 0, &bits, 0);
    same(&whole, &split);
    same(&whole, &bits);
    return 0;
}
