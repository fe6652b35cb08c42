/* broadcast.c - the replies of every master to one command, folded into
 * the client's (broadcast.h). */
#include "broadcast.h"

#include <stdlib.h>
#include <string.h>

#include "ferry.h"

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
    return 1;
}
