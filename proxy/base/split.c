/* split.c - a multi-key command cut into one part per slot, and its parts'
 * replies folded into the client's (split.h). */
#include "split.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ferry.h"
#include "slot.h"

split_kind split_kind_of(const command *cmd)
{
    if (cmd == NULL) {
        return SPLIT_NONE;
    }
    if (strcmp(cmd->name, "mget") == 0) {
        return SPLIT_ARRAY;
    }
    if (strcmp(cmd->name, "mset") == 0) {
        return SPLIT_OK;
    }
    if (strcmp(cmd->name, "del") == 0 || strcmp(cmd->name, "unlink") == 0 ||
        strcmp(cmd->name, "exists") == 0 || strcmp(cmd->name, "touch") == 0) {
        return SPLIT_SUM;
    }
    return SPLIT_NONE; /* MSETNX and the rest: all or nothing on one node */
}

/* A key's slot with its index, sorted by slot then index (stable). */
typedef struct keyslot {
    int slot;
    size_t i;
} keyslot;

static int keyslot_cmp(const void *a, const void *b)
{
    const keyslot *x = a, *y = b;
    if (x->slot != y->slot) {
        return x->slot < y->slot ? -1 : 1;
    }
    return x->i < y->i ? -1 : x->i > y->i;
}

split *split_new(split_kind kind, const resp_request *req)
{
    int step = kind == SPLIT_OK ? 2 : 1;
    if (kind == SPLIT_NONE || req->argc < 2 || (req->argc - 1) % (size_t)step != 0) {
        return NULL;
    }
    size_t nkeys = (req->argc - 1) / (size_t)step;
    split *sp = xcalloc(1, sizeof(*sp));
    sp->kind = kind;
    sp->step = step;
    sp->nkeys = nkeys;
    sp->built = -1;
    buf_init(&sp->args);
    buf_init(&sp->vals);
    buf_init(&sp->reply);
    sp->aoff = xmalloc(req->argc * sizeof(*sp->aoff));
    sp->alen = xmalloc(req->argc * sizeof(*sp->alen));
    for (size_t a = 0; a < req->argc; a++) {
        sp->aoff[a] = buf_used(&sp->args);
        sp->alen[a] = req->argv[a].len;
        buf_append(&sp->args, req->argv[a].ptr, req->argv[a].len);
    }
    keyslot *ks = xmalloc(nkeys * sizeof(*ks));
    for (size_t i = 0; i < nkeys; i++) {
        const resp_arg *k = &req->argv[1 + i * (size_t)step];
        ks[i].slot = slot_of_key(k->ptr, k->len);
        ks[i].i = i;
    }
    qsort(ks, nkeys, sizeof(*ks), keyslot_cmp);
    sp->order = xmalloc(nkeys * sizeof(*sp->order));
    sp->parts = xmalloc(nkeys * sizeof(*sp->parts));
    for (size_t i = 0; i < nkeys; i++) {
        sp->order[i] = ks[i].i;
        if (i == 0 || ks[i].slot != ks[i - 1].slot) {
            split_part *p = &sp->parts[sp->nparts++];
            p->slot = ks[i].slot;
            p->first = i;
            p->n = 0;
        }
        sp->parts[sp->nparts - 1].n++;
    }
    free(ks);
    if (kind == SPLIT_ARRAY) {
        sp->voff = xmalloc(nkeys * sizeof(*sp->voff));
        sp->vlen = xcalloc(nkeys, sizeof(*sp->vlen));
        for (size_t i = 0; i < nkeys; i++) {
            sp->voff[i] = (size_t)-1;
        }
    }
    return sp;
}

void split_free(split *sp)
{
    if (sp == NULL) {
        return;
    }
    buf_free(&sp->args);
    buf_free(&sp->vals);
    buf_free(&sp->reply);
    free(sp->aoff);
    free(sp->alen);
    free(sp->order);
    free(sp->parts);
    free(sp->voff);
    free(sp->vlen);
    free(sp);
}

int split_slot(const split *sp)
{
    return sp->next < sp->nparts ? sp->parts[sp->next].slot : -1;
}

static void append_arg(const split *sp, buf *out, size_t a)
{
    buf_append_bulk(out, buf_head(&sp->args) + sp->aoff[a], sp->alen[a]);
}

void split_encode(split *sp, buf *out)
{
    buf_clear(out);
    if (sp->next >= sp->nparts) {
        return;
    }
    const split_part *p = &sp->parts[sp->next];
    buf_append_count(out, '*', 1 + p->n * (size_t)sp->step);
    append_arg(sp, out, 0);
    for (size_t j = p->first; j < p->first + p->n; j++) {
        size_t a = 1 + sp->order[j] * (size_t)sp->step;
        for (int k = 0; k < sp->step; k++) {
            append_arg(sp, out, a + (size_t)k);
        }
    }
    sp->built = (int)sp->next;
}

/* The client's reply is final: this line (a ferry error, or a node's). */
static int fail(split *sp, const char *p, size_t n)
{
    buf_clear(&sp->reply);
    buf_append(&sp->reply, p, n);
    sp->failed = 1;
    return 0;
}

static int fail_shape(split *sp)
{
    char line[200];
    int len = sp->alen[0] < 20 ? (int)sp->alen[0] : 20;
    int n = snprintf(line, sizeof(line),
                     "-ERR ferry: cluster mode: a node's reply to a part of a split %.*s is not "
                     "what it answers\r\n",
                     len, buf_head(&sp->args) + sp->aoff[0]);
    return fail(sp, line, (size_t)n);
}

/* A number up to "\r\n" at p (before end), signed if sign: its value and
 * *next past the "\r\n"; 0 on success, -1 if it is not one. */
static int read_num(const char *p, const char *end, int sign, long long *out, const char **next)
{
    int neg = 0;
    long long v = 0;
    const char *q = p;
    if (sign && q < end && *q == '-') {
        neg = 1;
        q++;
    }
    const char *digits = q;
    while (q < end && *q >= '0' && *q <= '9' && v < (1LL << 50)) {
        v = v * 10 + (*q - '0');
        q++;
    }
    if (q == digits || end - q < 2 || q[0] != '\r' || q[1] != '\n') {
        return -1;
    }
    *out = neg ? -v : v;
    *next = q + 2;
    return 0;
}

/* MGET's part: an array of one element per key of the part. */
static int fold_array(split *sp, const split_part *part, const char *p, size_t n)
{
    const char *end = p + n, *q;
    long long count;
    if (n < 1 || p[0] != '*' || read_num(p + 1, end, 0, &count, &q) != 0 ||
        count != (long long)part->n) {
        return -1;
    }
    for (size_t j = 0; j < part->n; j++) {
        resp_scanner sc;
        size_t len;
        resp_scanner_init(&sc);
        if (q >= end || resp_scan_reply(&sc, q, (size_t)(end - q), &len) != RESP_OK) {
            return -1;
        }
        size_t k = sp->order[part->first + j];
        sp->voff[k] = buf_used(&sp->vals);
        sp->vlen[k] = len;
        buf_append(&sp->vals, q, len);
        q += len;
    }
    return q == end ? 0 : -1;
}

/* Every part replied: the client's reply. */
static void finish(split *sp)
{
    buf_clear(&sp->reply);
    switch (sp->kind) {
    case SPLIT_ARRAY:
        buf_append_count(&sp->reply, '*', sp->nkeys);
        for (size_t i = 0; i < sp->nkeys; i++) {
            buf_append(&sp->reply, buf_head(&sp->vals) + sp->voff[i], sp->vlen[i]);
        }
        break;
    case SPLIT_OK:
        buf_append_str(&sp->reply, "+OK\r\n");
        break;
    default: {
        char line[32];
        int m = snprintf(line, sizeof(line), ":%lld\r\n", sp->sum);
        buf_append(&sp->reply, line, (size_t)m);
        break;
    }
    }
}

int split_fold(split *sp, const char *p, size_t n)
{
    if (sp->failed || sp->next >= sp->nparts) {
        return 0;
    }
    if (n > 0 && (p[0] == '-' || p[0] == '!')) {
        return fail(sp, p, n); /* a node's error is the reply, as it gave it */
    }
    const split_part *part = &sp->parts[sp->next];
    const char *q;
    long long v;
    switch (sp->kind) {
    case SPLIT_ARRAY:
        if (fold_array(sp, part, p, n) != 0) {
            return fail_shape(sp);
        }
        break;
    case SPLIT_OK:
        if (n != 5 || memcmp(p, "+OK\r\n", 5) != 0) {
            return fail_shape(sp);
        }
        break;
    default:
        if (n < 1 || p[0] != ':' || read_num(p + 1, p + n, 1, &v, &q) != 0 || q != p + n) {
            return fail_shape(sp);
        }
        sp->sum += v;
        break;
    }
    sp->next++;
    if (sp->next < sp->nparts) {
        return 1;
    }
    finish(sp);
    return 0;
}
