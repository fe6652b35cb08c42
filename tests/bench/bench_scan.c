/* bench_scan.c - frames a few MB of typical Redis replies with ferry's reply
 * scanner and with hiredis' reader (no reply objects), fed in 16 KiB reads
 * like a socket delivers them, and prints the median throughput of 5 runs. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <hiredis/read.h>

#include "resp.h"

#define READ_SIZE (16 * 1024)            /* bytes per simulated socket read */
#define STREAM_SIZE (16UL * 1024 * 1024) /* approximate size of the reply stream */
#define RUNS 5
#define PASSES 10 /* times each run frames the stream, so a run lasts long enough to time */

/* A reply stream and how many replies it holds. */
typedef struct stream {
    char *data;     /* the replies back to back */
    size_t len;     /* bytes */
    size_t cap;     /* bytes allocated */
    size_t replies; /* replies in data */
} stream;

static void put(stream *s, const char *p, size_t n)
{
    if (s->len + n > s->cap) {
        s->cap = (s->len + n) * 2;
        s->data = realloc(s->data, s->cap);
        if (s->data == NULL) {
            abort();
        }
    }
    memcpy(s->data + s->len, p, n);
    s->len += n;
}

static void put_bulk(stream *s, size_t n)
{
    char head[32];
    static char payload[1000];
    int hl = snprintf(head, sizeof(head), "$%zu\r\n", n);

    if (payload[0] == '\0') {
        memset(payload, 'x', sizeof(payload));
    }
    put(s, head, (size_t)hl);
    put(s, payload, n);
    put(s, "\r\n", 2);
}

/* A mix of +OK, :123, $-1, bulks of 10/100/1000 bytes, arrays of 10 bulks. */
static void build(stream *s)
{
    static const size_t sizes[3] = {10, 100, 1000};
    uint32_t rng = 12345;
    while (s->len < STREAM_SIZE) {
        rng = rng * 1103515245u + 12345u;
        switch ((rng >> 16) % 7) {
        case 0:
            put(s, "+OK\r\n", 5);
            break;
        case 1:
            put(s, ":123\r\n", 6);
            break;
        case 2:
            put(s, "$-1\r\n", 5);
            break;
        case 3:
        case 4:
        case 5:
            put_bulk(s, sizes[(rng >> 8) % 3]);
            break;
        default: {
            int i;
            put(s, "*10\r\n", 5);
            for (i = 0; i < 10; i++) {
                put_bulk(s, sizes[(rng >> (8 + i)) % 2]);
            }
            break;
        }
        }
        s->replies++;
    }
}

static double now_sec(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Reads the stream into a buffer 16 KiB at a time, framing replies and
 * moving the unconsumed tail to the front after each read, as ferry does. */
static size_t run_scanner(const stream *s)
{
    size_t cap = 4 * READ_SIZE, used = 0, off = 0, fed = 0, count = 0;
    char *buf = malloc(cap);
    resp_scanner sc;

    if (buf == NULL) {
        abort();
    }
    resp_scanner_init(&sc);
    while (fed < s->len) {
        size_t n = s->len - fed < READ_SIZE ? s->len - fed : READ_SIZE;
        if (off > 0) {
            memmove(buf, buf + off, used - off);
            used -= off;
            off = 0;
        }
        if (used + n > cap) {
            cap = (used + n) * 2;
            buf = realloc(buf, cap);
            if (buf == NULL) {
                abort();
            }
        }
        memcpy(buf + used, s->data + fed, n);
        used += n;
        fed += n;
        for (;;) {
            size_t rl;
            int rc = resp_scan_reply(&sc, buf + off, used - off, &rl);
            if (rc == RESP_AGAIN) {
                break;
            }
            if (rc != RESP_OK) {
                fprintf(stderr, "scanner: %s\n", sc.errstr);
                exit(1);
            }
            off += rl;
            count++;
        }
    }
    free(buf);
    return count;
}

static size_t run_hiredis(const stream *s)
{
    redisReader *r = redisReaderCreateWithFunctions(NULL);
    size_t fed = 0, count = 0;

    if (r == NULL) {
        abort();
    }
    while (fed < s->len) {
        size_t n = s->len - fed < READ_SIZE ? s->len - fed : READ_SIZE;
        if (redisReaderFeed(r, s->data + fed, n) != REDIS_OK) {
            fprintf(stderr, "hiredis feed: %s\n", r->errstr);
            exit(1);
        }
        fed += n;
        for (;;) {
            void *reply = NULL;
            if (redisReaderGetReply(r, &reply) != REDIS_OK) {
                fprintf(stderr, "hiredis: %s\n", r->errstr);
                exit(1);
            }
            if (reply == NULL) {
                break;
            }
            count++;
        }
    }
    redisReaderFree(r);
    return count;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void bench(const char *name, size_t (*fn)(const stream *), const stream *s)
{
    double secs[RUNS];
    double med;
    int i;

    for (i = 0; i < RUNS; i++) {
        double t0 = now_sec();
        int pass;
        for (pass = 0; pass < PASSES; pass++) {
            size_t n = fn(s);
            if (n != s->replies) {
                fprintf(stderr, "%s framed %zu replies, expected %zu\n", name, n, s->replies);
                exit(1);
            }
        }
        secs[i] = (now_sec() - t0) / PASSES;
    }
    qsort(secs, RUNS, sizeof(secs[0]), cmp_double);
    med = secs[RUNS / 2];
    printf("%-22s %8.0f MB/s %11.0f replies/s  (median of %d runs, %.2f ms per pass)\n", name,
           (double)s->len / med / 1e6, (double)s->replies / med, RUNS, med * 1e3);
}

int main(void)
{
    stream s = {NULL, 0, 0, 0};

    build(&s);
    printf("stream: %.1f MB, %zu replies, %d-byte reads\n", (double)s.len / 1e6, s.replies,
           READ_SIZE);
    bench("resp_scan_reply", run_scanner, &s);
    bench("hiredis redisReader", run_hiredis, &s);
    free(s.data);
    return 0;
}
