/* keyspace.c - cluster mode: SCAN over every master (keyspace.h). */
#include "keyspace.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "log.h"
#include "upstream.h"

#define SLOT_BITS 14
#define TAG_BITS 10
#define NODE_SHIFT (SLOT_BITS + TAG_BITS)
#define NODE_MAX ((1ULL << (64 - NODE_SHIFT)) - 1) /* the largest node cursor carried */

int keyspace_is_scan(const request *r)
{
    return r->cmd != NULL && r->slot >= 0 && strcmp(r->cmd->name, "scan") == 0;
}

/* An unsigned decimal of at most 20 digits that fits 64 bits, as Redis
 * reads a cursor. */
static int read_u64(const char *p, size_t n, uint64_t *out)
{
    uint64_t v = 0;
    if (n == 0 || n > 20) {
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        if (p[i] < '0' || p[i] > '9') {
            return -1;
        }
        uint64_t d = (uint64_t)(p[i] - '0');
        if (v > (UINT64_MAX - d) / 10) {
            return -1;
        }
        v = v * 10 + d;
    }
    *out = v;
    return 0;
}

/* The master of view up, as a cursor's tag: its port plus a hash of its
 * host (nodes on one host never share a tag; others by a 1 in 1024 chance). */
static uint64_t master_tag(const struct upstream *up)
{
    const char *name = upstream_name(up);
    const char *colon = strrchr(name, ':');
    uint32_t h = 2166136261u;
    if (colon == NULL) {
        return 0;
    }
    for (const char *p = name; p < colon; p++) {
        h = (h ^ (unsigned char)*p) * 16777619u;
    }
    unsigned port = 0;
    for (const char *p = colon + 1; *p >= '0' && *p <= '9'; p++) {
        port = port * 10 + (unsigned)(*p - '0');
    }
    return (uint64_t)((h + port) & ((1u << TAG_BITS) - 1));
}

void keyspace_scan_parsed(const clustermap *cm, request *r, const resp_request *req)
{
    uint64_t c;
    r->slot = -1;
    if (req->argc < 2 || read_u64(req->argv[1].ptr, req->argv[1].len, &c) != 0) {
        return;
    }
    r->arg = (long long)c;
    if (c == 0) {
        int first = clustermap_next_first_slot(cm, -1);
        r->slot = first >= 0 ? first : 0; /* no map yet: held until one names slot 0 */
    } else {
        r->slot = (int)(c & ((1u << SLOT_BITS) - 1));
    }
}

/* The multibulk data's second argument replaced by the decimal v. */
static void set_second_arg(buf *data, uint64_t v)
{
    const char *p = buf_head(data), *end = p + buf_used(data);
    const char *q = memchr(p, '\n', (size_t)(end - p)); /* "*N\r\n" */
    uint64_t l;
    if (q == NULL || ++q >= end || *q != '$') {
        return;
    }
    const char *nl = memchr(q, '\n', (size_t)(end - q));
    if (nl == NULL || read_u64(q + 1, (size_t)(nl - q - 2), &l) != 0 ||
        (uint64_t)(end - nl - 1) < l + 2) {
        return;
    }
    const char *arg = nl + 1 + l + 2; /* the cursor's "$len\r\n" */
    nl = arg < end ? memchr(arg, '\n', (size_t)(end - arg)) : NULL;
    if (nl == NULL || *arg != '$' || read_u64(arg + 1, (size_t)(nl - arg - 2), &l) != 0 ||
        (uint64_t)(end - nl - 1) < l + 2) {
        return;
    }
    const char *after = nl + 1 + l + 2;
    char num[24];
    int nn = snprintf(num, sizeof(num), "%llu", (unsigned long long)v);
    buf out;
    buf_init(&out);
    buf_append(&out, p, (size_t)(arg - p));
    buf_append_bulk(&out, num, (size_t)nn);
    buf_append(&out, after, (size_t)(end - after));
    buf_clear(data);
    buf_append(data, buf_head(&out), buf_used(&out));
    buf_free(&out);
}

void keyspace_scan_sending(request *r, const struct upstream *up)
{
    uint64_t c = (uint64_t)r->arg;
    uint64_t node = c >> NODE_SHIFT;
    uint64_t tag = (c >> SLOT_BITS) & ((1u << TAG_BITS) - 1);
    if (node != 0 && tag != master_tag(up)) {
        log_info("SCAN: the cursor was of another master than %s (a failover of its shard): "
                 "that shard is read again from its start",
                 upstream_name(up));
        node = 0;
    }
    set_second_arg(&r->data, node);
}

int keyspace_scan_reply(const clustermap *cm, const request *r, const struct upstream *up,
                        const char *p, size_t n, buf *out)
{
    const char *end = p + n, *q;
    uint64_t l, node;
    if (n < 6 || memcmp(p, "*2\r\n$", 5) != 0) {
        return 0;
    }
    q = memchr(p + 5, '\n', n - 5);
    if (q == NULL || read_u64(p + 5, (size_t)(q - p - 6), &l) != 0 ||
        (uint64_t)(end - q - 1) < l + 2 || read_u64(q + 1, (size_t)l, &node) != 0) {
        return 0;
    }
    const char *rest = q + 1 + l + 2;
    uint64_t c;
    int first = clustermap_first_slot(cm, r->slot);
    if (first < 0) {
        first = r->slot;
    }
    if (node == 0) {
        int next = clustermap_next_first_slot(cm, first);
        c = next > 0 ? (uint64_t)next : 0;
    } else if (node > NODE_MAX) {
        buf_append_str(out, "-ERR ferry: cluster mode: a node's SCAN cursor is too large for "
                            "ferry's cursor\r\n");
        return 1;
    } else {
        c = node << NODE_SHIFT | master_tag(up) << SLOT_BITS | (uint64_t)first;
    }
    char num[24];
    int nn = snprintf(num, sizeof(num), "%llu", (unsigned long long)c);
    buf_append_str(out, "*2\r\n");
    buf_append_bulk(out, num, (size_t)nn);
    buf_append(out, rest, (size_t)(end - rest));
    return 1;
}
