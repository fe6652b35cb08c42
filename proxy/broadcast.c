/* broadcast.c - the replies of every master to one command, folded into
 * the client's (broadcast.h). */
#include "broadcast.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ferry.h"
#include "subs.h"

broadcast_kind broadcast_kind_of(const command *cmd)
{
    static const char *const first[] = {"script|load",     "script|flush",   "function|load",
                                        "function|delete", "function|flush", "function|restore"};
    if (cmd == NULL) {
        return BCAST_NONE;
    }
    if (strcmp(cmd->name, "script|exists") == 0) {
        return BCAST_AND;
    }
    if (strcmp(cmd->name, "pubsub|channels") == 0 ||
        strcmp(cmd->name, "pubsub|shardchannels") == 0) {
        return BCAST_UNION;
    }
    if (strcmp(cmd->name, "pubsub|numsub") == 0 || strcmp(cmd->name, "pubsub|shardnumsub") == 0) {
        return BCAST_SUM_PAIRS;
    }
    if (strcmp(cmd->name, "pubsub|numpat") == 0) {
        return BCAST_SUM;
    }
    for (size_t i = 0; i < sizeof(first) / sizeof(first[0]); i++) {
        if (strcmp(cmd->name, first[i]) == 0) {
            return BCAST_FIRST;
        }
    }
    return BCAST_NONE;
}

broadcast *broadcast_new(broadcast_kind kind)
{
    broadcast *b = xcalloc(1, sizeof(*b));
    b->kind = kind;
    buf_init(&b->reply);
    return b;
}

void broadcast_free(broadcast *b)
{
    if (b == NULL) {
        return;
    }
    buf_free(&b->reply);
    free(b);
}

/* A non-negative decimal up to "\r\n" at p (at most end): its value, and
 * *next past the "\r\n". -1 if it is not one. */
static long long read_count(const char *p, const char *end, const char **next)
{
    long long v = 0;
    const char *q = p;
    while (q < end && *q >= '0' && *q <= '9' && v < (1LL << 40)) {
        v = v * 10 + (*q - '0');
        q++;
    }
    if (q == p || end - q < 2 || q[0] != '\r' || q[1] != '\n') {
        return -1;
    }
    *next = q + 2;
    return v;
}

/* SCRIPT EXISTS' reply: an array of integers 0 or 1. Its count, and the
 * values in *out (malloc'd, NULL for none); -1 if it is not that. */
static long long read_flags(const char *p, size_t n, unsigned char **out)
{
    const char *end = p + n, *q;
    *out = NULL;
    if (n < 1 || p[0] != '*') {
        return -1;
    }
    long long count = read_count(p + 1, end, &q);
    if (count < 0 || count > (long long)n) {
        return -1;
    }
    unsigned char *v = count > 0 ? xmalloc((size_t)count) : NULL;
    for (long long i = 0; i < count; i++) {
        long long x;
        if (q >= end || *q != ':' || (x = read_count(q + 1, end, &q)) < 0 || x > 1) {
            free(v);
            return -1;
        }
        v[i] = (unsigned char)x;
    }
    if (q != end) {
        free(v);
        return -1;
    }
    *out = v;
    return count;
}

/* b->reply AND the array p, n, element by element. */
static int fold_and(broadcast *b, const char *p, size_t n)
{
    unsigned char *have, *got;
    long long nh = read_flags(buf_head(&b->reply), buf_used(&b->reply), &have);
    long long ng = read_flags(p, n, &got);
    int ok = nh >= 0 && nh == ng;
    if (ok) {
        buf_clear(&b->reply);
        buf_append_count(&b->reply, '*', (size_t)nh);
        for (long long i = 0; i < nh; i++) {
            buf_append_str(&b->reply, have[i] && got[i] ? ":1\r\n" : ":0\r\n");
        }
    }
    free(have);
    free(got);
    return ok;
}

/* One element of a flat array: a bulk string (p, n) or an integer (v). */
typedef struct elem {
    int bulk;
    const char *p;
    size_t n;
    long long v;
} elem;

/* A flat array of bulk strings and non-negative integers (what PUBSUB
 * answers): its count, the elements in *out (malloc'd, NULL for none,
 * pointing into p); -1 if it is not that. */
static long long read_elems(const char *p, size_t n, elem **out)
{
    const char *end = p + n, *q;
    *out = NULL;
    if (n < 1 || p[0] != '*') {
        return -1;
    }
    long long count = read_count(p + 1, end, &q);
    if (count < 0 || count > (long long)n) {
        return -1;
    }
    elem *v = count > 0 ? xcalloc((size_t)count, sizeof(*v)) : NULL;
    for (long long i = 0; i < count; i++) {
        long long x;
        char type = q < end ? *q : '\0';
        if ((type != ':' && type != '$') || (x = read_count(q + 1, end, &q)) < 0) {
            free(v);
            return -1;
        }
        v[i].bulk = type == '$';
        v[i].v = x;
        if (v[i].bulk) {
            if (end - q < x + 2 || q[x] != '\r' || q[x + 1] != '\n') {
                free(v);
                return -1;
            }
            v[i].p = q;
            v[i].n = (size_t)x;
            q += x + 2;
        }
    }
    if (q != end) {
        free(v);
        return -1;
    }
    *out = v;
    return count;
}

static void append_elem(buf *b, const elem *e)
{
    if (e->bulk) {
        buf_append_bulk(b, e->p, e->n);
    } else {
        char line[32];
        snprintf(line, sizeof(line), ":%lld\r\n", e->v);
        buf_append_str(b, line);
    }
}

/* PUBSUB CHANNELS / SHARDCHANNELS: b->reply's names, then those of p, n
 * not in it. */
static int fold_union(broadcast *b, const char *p, size_t n)
{
    elem *have, *got;
    long long nh = read_elems(buf_head(&b->reply), buf_used(&b->reply), &have);
    long long ng = read_elems(p, n, &got);
    int ok = nh >= 0 && ng >= 0;
    for (long long i = 0; ok && i < nh; i++) {
        ok = have[i].bulk;
    }
    for (long long i = 0; ok && i < ng; i++) {
        ok = got[i].bulk;
    }
    if (ok) {
        sub_set seen = {0};
        buf out;
        buf_init(&out);
        for (long long i = 0; i < nh; i++) {
            subs_add(&seen, have[i].p, have[i].n);
        }
        for (long long i = 0; i < ng; i++) {
            subs_add(&seen, got[i].p, got[i].n);
        }
        buf_append_count(&out, '*', seen.n);
        for (size_t i = 0; i < seen.n; i++) {
            buf_append_bulk(&out, seen.v[i], seen.l[i]);
        }
        subs_free(&seen);
        buf_free(&b->reply);
        b->reply = out;
    }
    free(have);
    free(got);
    return ok;
}

/* PUBSUB NUMSUB / SHARDNUMSUB: the same names in the same order, each
 * followed by its count: the counts are summed. */
static int fold_sum_pairs(broadcast *b, const char *p, size_t n)
{
    elem *have, *got;
    long long nh = read_elems(buf_head(&b->reply), buf_used(&b->reply), &have);
    long long ng = read_elems(p, n, &got);
    int ok = nh >= 0 && nh == ng && nh % 2 == 0;
    for (long long i = 0; ok && i < nh; i += 2) {
        ok = have[i].bulk && got[i].bulk && have[i].n == got[i].n &&
             memcmp(have[i].p, got[i].p, have[i].n) == 0 && !have[i + 1].bulk && !got[i + 1].bulk;
    }
    if (ok) {
        buf out;
        buf_init(&out);
        buf_append_count(&out, '*', (size_t)nh);
        for (long long i = 0; i < nh; i++) {
            if (i % 2 == 1) {
                have[i].v += got[i].v;
            }
            append_elem(&out, &have[i]);
        }
        buf_free(&b->reply);
        b->reply = out;
    }
    free(have);
    free(got);
    return ok;
}

/* PUBSUB NUMPAT: the sum of every master's integer. */
static int fold_sum(broadcast *b, const char *p, size_t n)
{
    const char *q;
    const char *h = buf_head(&b->reply);
    size_t hn = buf_used(&b->reply);
    if (hn < 1 || h[0] != ':' || n < 1 || p[0] != ':') {
        return 0;
    }
    long long x = read_count(h + 1, h + hn, &q);
    if (x < 0 || q != h + hn) {
        return 0;
    }
    long long y = read_count(p + 1, p + n, &q);
    if (y < 0 || q != p + n) {
        return 0;
    }
    char line[48];
    snprintf(line, sizeof(line), ":%lld\r\n", x + y);
    buf_clear(&b->reply);
    buf_append_str(&b->reply, line);
    return 1;
}

int broadcast_fold(broadcast *b, const char *p, size_t n)
{
    if (b->failed) {
        return 0;
    }
    if (n > 0 && p[0] == '-') {
        buf_clear(&b->reply);
        buf_append(&b->reply, p, n);
        b->failed = 1;
        b->answered++;
        return 0;
    }
    if (b->answered++ == 0) {
        buf_append(&b->reply, p, n);
        return 1;
    }
    if (b->kind == BCAST_AND && !fold_and(b, p, n)) {
        buf_clear(&b->reply);
        buf_append_str(&b->reply, "-ERR ferry: cluster mode: the masters' SCRIPT EXISTS replies "
                                  "differ in shape\r\n");
        b->failed = 1;
        return 0;
    }
    int ok = b->kind == BCAST_UNION       ? fold_union(b, p, n)
             : b->kind == BCAST_SUM_PAIRS ? fold_sum_pairs(b, p, n)
             : b->kind == BCAST_SUM       ? fold_sum(b, p, n)
                                          : 1;
    if (!ok) {
        buf_clear(&b->reply);
        buf_append_str(&b->reply, "-ERR ferry: cluster mode: the masters' PUBSUB replies "
                                  "differ in shape\r\n");
        b->failed = 1;
        return 0;
    }
    return 1;
}
