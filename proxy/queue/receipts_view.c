/* receipts_view.c - a request as its receipt sees it: which pop, push or
 * script it is (rcpt_of: its keys, side, count, timeout), the names of its
 * receipt keys, and the head of a receipt script's call. Shared by the
 * pops', pushes' and scripts' receipts (receipts.c) and the transactions'
 * (receipts_tx.c); it calls neither. */
#include "receipts_int.h"

#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "config.h"
#include "instance.h"
#include "lease.h"
#include "link.h"
#include "resp.h"
#include "router.h"
#include "slot.h"
#include "stats.h"

/* BRPOP or BLPOP (of r's pops, the blocking ones start with b). */
int blocking_pop(const request *r)
{
    return r->cmd != NULL && r->cmd->name[0] == 'b';
}

#define XADD_ARGS_MAX 7000 /* inside the script: Lua's unpack takes about 8 000 */

/* An XADD's key and the arguments after it (*v; 0), unless it has
 * NOMKSTREAM (its null reply has no receipt to keep) or too many (-1). */
static int xadd_of(const request *r, push_view *v)
{
    const char *p = buf_head(&r->data), *end = p + buf_used(&r->data), *a;
    size_t alen;
    long long argc = resp_read_header(&p, end, '*');
    if (argc < 5 || argc - 2 > XADD_ARGS_MAX || resp_read_bulk(&p, end, &a, &alen) != 0 ||
        resp_read_bulk(&p, end, &v->key, &v->klen) != 0) {
        return -1;
    }
    v->tail = p;
    v->tlen = (size_t)(end - p);
    v->nvalues = (size_t)argc - 2;
    for (long long i = 2; i < argc; i++) {
        if (resp_read_bulk(&p, end, &a, &alen) != 0 ||
            (alen == 10 && strncasecmp(a, "nomkstream", 10) == 0)) {
            return -1;
        }
    }
    return 0;
}

#define BATCH_MAX 7000 /* a batch pop's count the script takes (Lua's unpack) */

/* p's n bytes as a number in *out: 1 to maxlen decimal digits (leading
 * zeros too), else -1. */
static int digits_of(const char *p, size_t n, size_t maxlen, long long *out)
{
    long long c = 0;
    if (n == 0 || n > maxlen) {
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        if (p[i] < '0' || p[i] > '9') {
            return -1;
        }
        c = c * 10 + (p[i] - '0');
    }
    *out = c;
    return 0;
}

/* A batch pop's count: digits, 1 to max (else it goes as written). */
static int batch_count_ok(const char *p, size_t n, long long max)
{
    long long c;
    return digits_of(p, n, 4, &c) == 0 && c >= 1 && c <= max;
}

/* A sure tag for a receipt in key's slot (cluster mode): not a key whose
 * braces say nothing sure. */
static int tag_sure(const ferry *f, const char *key, size_t klen)
{
    const char *tag;
    if (f->cluster == NULL) {
        return 1;
    }
    size_t tlen = lease_tag(key, klen, &tag);
    return !(tlen == klen && (memchr(key, '{', klen) || memchr(key, '}', klen)));
}

/* EVAL or EVALSHA (not the _RO ones: they cannot write) with at least one
 * key that fallback.keys names (the first such is v->key). */
static int script_of(const ferry *f, const request *r, rcpt_view *v)
{
    const char *p = buf_head(&r->data), *end = p + buf_used(&r->data), *a, *k;
    size_t alen, klen;
    long long argc = resp_read_header(&p, end, '*'), nkeys;
    memset(v, 0, sizeof(*v));
    if (argc < 4 || resp_read_bulk(&p, end, &a, &alen) != 0 ||
        resp_read_bulk(&p, end, &v->src, &v->srclen) != 0 ||
        resp_read_bulk(&p, end, &a, &alen) != 0 || digits_of(a, alen, 6, &nkeys) != 0) {
        return -1;
    }
    if (nkeys < 1 || nkeys > argc - 3) {
        return -1;
    }
    v->sha = (r->cmd->name[4] == 's');
    v->keys = p;
    for (long long i = 0; i < nkeys; i++) {
        if (resp_read_bulk(&p, end, &k, &klen) != 0) {
            return -1;
        }
        if (v->key == NULL && config_fallback_key(f->cfg, k, klen)) {
            v->key = k;
            v->klen = klen;
        }
    }
    v->keyslen = (size_t)(p - v->keys);
    v->args = p;
    v->argslen = (size_t)(end - p);
    v->nkeys = nkeys;
    v->nargs = argc - 3 - nkeys;
    v->push = "script";
    v->script = 1;
    return v->key != NULL && tag_sure(f, v->key, v->klen) ? 0 : -1;
}

#define MULTI_KEYS_MAX 64 /* keys of a priority pop the try script takes */

/* A timeout Redis takes: digits, and a fraction after one dot. */
static int timeout_ok(const char *p, size_t n)
{
    int dot = 0, digits = 0;
    for (size_t i = 0; i < n; i++) {
        if (p[i] == '.' && !dot) {
            dot = 1;
        } else if (p[i] >= '0' && p[i] <= '9') {
            digits++;
        } else {
            return 0;
        }
    }
    return digits > 0 && n <= 20;
}

/* n keys at *p, each one fallback.keys names with a sure tag, into v
 * (keys, the first as v->key, nkeys); 0, or -1 when one is not. */
static int view_keys(const ferry *f, const char **p, const char *end, long long n, rcpt_view *v)
{
    const char *k;
    size_t klen;
    v->keys = *p;
    for (long long i = 0; i < n; i++) {
        if (resp_read_bulk(p, end, &k, &klen) != 0 || !tag_sure(f, k, klen) ||
            !config_fallback_key(f->cfg, k, klen)) {
            return -1;
        }
        if (i == 0) {
            v->key = k;
            v->klen = klen;
        }
    }
    v->keyslen = (size_t)(*p - v->keys);
    v->nkeys = n;
    return 0;
}

/* BRPOP or BLPOP of several keys (N2's priority pop), BZPOPMIN or
 * BZPOPMAX of one key or more (N3's), every one a key fallback.keys names
 * (v->key the first): side the end it takes from (LEFT, RIGHT; MIN, MAX). */
static int multi_of(const ferry *f, const request *r, rcpt_view *v, const char *side)
{
    const char *p = buf_head(&r->data), *end = p + buf_used(&r->data), *a;
    size_t alen;
    long long argc = resp_read_header(&p, end, '*');
    int zset = side[0] == 'M';
    memset(v, 0, sizeof(*v));
    if (argc < (zset ? 3 : 4) || argc - 2 > MULTI_KEYS_MAX ||
        resp_read_bulk(&p, end, &a, &alen) != 0) {
        return -1;
    }
    if (view_keys(f, &p, end, argc - 2, v) != 0 ||
        resp_read_bulk(&p, end, &v->timeout, &v->tlen) != 0 || !timeout_ok(v->timeout, v->tlen)) {
        return -1;
    }
    v->multi = 1;
    v->blocking = 1;
    v->zset = zset;
    v->side = side;
    return 0;
}

/* LMPOP, BLMPOP (side LEFT or RIGHT), ZMPOP, BZMPOP (MIN or MAX):
 * [timeout] numkeys key... side [COUNT n], every key one fallback.keys
 * names, taken like a priority pop (one receipt per key) and answered in
 * their shape. Anything Redis would refuse goes as written (its error). */
static int mpop_of(const ferry *f, const request *r, rcpt_view *v, int zset, int blocking)
{
    const char *p = buf_head(&r->data), *end = p + buf_used(&r->data), *a;
    size_t alen;
    long long argc = resp_read_header(&p, end, '*'), nkeys;
    memset(v, 0, sizeof(*v));
    if (argc < 4 + blocking || resp_read_bulk(&p, end, &a, &alen) != 0 ||
        (blocking && (resp_read_bulk(&p, end, &v->timeout, &v->tlen) != 0 ||
                      !timeout_ok(v->timeout, v->tlen))) ||
        resp_read_bulk(&p, end, &a, &alen) != 0 || digits_of(a, alen, 2, &nkeys) != 0) {
        return -1;
    }
    long long rest = argc - 2 - blocking - nkeys; /* side [COUNT n] */
    if (nkeys < 1 || nkeys > MULTI_KEYS_MAX || (rest != 1 && rest != 3)) {
        return -1;
    }
    if (view_keys(f, &p, end, nkeys, v) != 0 || resp_read_bulk(&p, end, &a, &alen) != 0 ||
        alen != (zset ? 3 : (size_t)4 + (alen == 5))) {
        return -1;
    }
    v->side = zset ? (strncasecmp(a, "min", 3) == 0   ? "MIN"
                      : strncasecmp(a, "max", 3) == 0 ? "MAX"
                                                      : NULL)
                   : (alen == 4 && strncasecmp(a, "left", 4) == 0    ? "LEFT"
                      : alen == 5 && strncasecmp(a, "right", 5) == 0 ? "RIGHT"
                                                                     : NULL);
    if (v->side == NULL) {
        return -1;
    }
    if (rest == 3 &&
        (resp_read_bulk(&p, end, &a, &alen) != 0 || alen != 5 || strncasecmp(a, "count", 5) != 0 ||
         resp_read_bulk(&p, end, &v->count, &v->clen) != 0 ||
         !batch_count_ok(v->count, v->clen, zset ? BATCH_MAX / 2 : BATCH_MAX))) {
        return -1;
    }
    v->multi = 1;
    v->shaped = 1;
    v->blocking = blocking;
    v->zset = zset;
    return 0;
}

/* The i-th key of a priority pop's view (v->keys), in *k. */
static void multi_key(const rcpt_view *v, long long i, const char **k, size_t *klen)
{
    const char *p = v->keys, *end = v->keys + v->keyslen;
    for (long long j = 0; j <= i; j++) {
        if (resp_read_bulk(&p, end, k, klen) != 0) {
            *k = "";
            *klen = 0;
            return; /* (never: read by multi_of) */
        }
    }
}

int rcpt_of(const ferry *f, const request *r, rcpt_view *v)
{
    const char *name = r->cmd != NULL ? r->cmd->name : "";
    const char *p = buf_head(&r->data), *end = p + buf_used(&r->data), *cmd;
    size_t clen;
    long long want;
    push_view pv;
    v->push = NULL;
    v->count = NULL;
    v->clen = 0;
    v->zset = 0;
    v->script = 0;
    v->multi = 0;
    v->shaped = 0;
    if (strcmp(name, "eval") == 0 || strcmp(name, "evalsha") == 0) {
        return script_of(f, r, v);
    }
    if (r->route == RT_EXEC) {
        /* A transaction sent as the receipt script (receipts_tx_send);
         * cluster mode: its receipt in the transaction's slot, named by a
         * key of that slot (its DEL goes to the slot's master). */
        memset(v, 0, sizeof(*v));
        v->push = "exec";
        v->key = "";
        if (f->cluster == NULL) {
            return 0;
        }
        int n = slot_tag_key(r->rcpt_slot1 - 1, v->tag, sizeof(v->tag));
        v->key = v->tag;
        v->klen = n > 0 ? (size_t)n : 0;
        return n > 0 ? 0 : -1;
    }
    if (strcmp(name, "xadd") == 0 ? xadd_of(r, &pv) == 0 : request_push_view(r, &pv) == 0) {
        v->push = name; /* as the script calls it */
        v->key = pv.key;
        v->klen = pv.klen;
        v->values = pv.tail;
        v->vlen = pv.tlen;
        v->nvalues = pv.nvalues;
        v->blocking = 0;
        v->side = NULL;
    } else {
        if (strcmp(name, "rpop") == 0 || strcmp(name, "lpop") == 0) {
            want = 2;
            v->blocking = 0;
        } else if (strcmp(name, "zpopmin") == 0 || strcmp(name, "zpopmax") == 0) {
            want = 2;
            v->blocking = 0;
            v->zset = 1;
        } else if (strcmp(name, "brpop") == 0 || strcmp(name, "blpop") == 0) {
            want = 3;
            v->blocking = 1;
        } else if (strcmp(name, "bzpopmin") == 0 || strcmp(name, "bzpopmax") == 0) {
            return multi_of(f, r, v, name[6] == 'i' ? "MIN" : "MAX");
        } else if (strcmp(name, "lmpop") == 0 || strcmp(name, "blmpop") == 0 ||
                   strcmp(name, "zmpop") == 0 || strcmp(name, "bzmpop") == 0) {
            return mpop_of(f, r, v, name[name[0] == 'b'] == 'z', name[0] == 'b');
        } else {
            return -1;
        }
        long long argc = resp_read_header(&p, end, '*');
        int batch = !v->blocking && argc == 3; /* RPOP k n, LPOP k n */
        if (v->blocking && argc > 3) {
            return multi_of(f, r, v, name[1] == 'r' ? "RIGHT" : "LEFT");
        }
        if ((argc != want && !batch) || resp_read_bulk(&p, end, &cmd, &clen) != 0 ||
            resp_read_bulk(&p, end, &v->key, &v->klen) != 0) {
            return -1; /* more keys: sent as written */
        }
        if (v->blocking && resp_read_bulk(&p, end, &v->timeout, &v->tlen) != 0) {
            return -1;
        }
        /* (ZPOPMIN's pairs: twice as many values for the script's unpack) */
        if (batch && (resp_read_bulk(&p, end, &v->count, &v->clen) != 0 ||
                      !batch_count_ok(v->count, v->clen, v->zset ? BATCH_MAX / 2 : BATCH_MAX))) {
            return -1;
        }
        if (v->zset) {
            v->side = name[5] == 'i' ? "MIN" : "MAX";
        } else {
            v->side = name[v->blocking] == 'r' ? "RIGHT" : "LEFT";
        }
    }
    /* The receipt goes in the key's slot: only where its tag is sure. */
    return tag_sure(f, v->key, v->klen) && config_fallback_key(f->cfg, v->key, v->klen) ? 0 : -1;
}

/* ferry:rcpt:[{tag}:]<instance>:<process>.<loop>:<n>:<what>:<key>: whose
 * it is (a process that dies leaves it to a peer or its instance started
 * again, instance.c) and what settling it needs: <what> L or R, a pop's
 * end of <key> its item came from; Z a sorted set's pop (ZPOPMIN, ZPOPMAX:
 * members and scores); P a push, T a transaction. */
void receipt_key(ferry *f, const rcpt_view *v, uint64_t n, buf *out)
{
    char tail[24];
    if (f->rcpt_token[0] == '\0') {
        /* Unique across restarts and loops: the instance, its process, the loop. */
        snprintf(f->rcpt_token, sizeof(f->rcpt_token), "%.*s.%d", (int)sizeof(f->rcpt_token) - 8,
                 instance_receipt_owner(f), f->worker_index);
    }
    buf_append(out, "ferry:rcpt:", 11);
    if (f->cluster != NULL) {
        const char *tag;
        size_t tlen = lease_tag(v->key, v->klen, &tag);
        buf_append(out, "{", 1);
        buf_append(out, tag, tlen);
        buf_append(out, "}:", 2);
    }
    buf_append_str(out, f->rcpt_token);
    char *p = buf_digits(tail + sizeof(tail), n);
    *--p = ':';
    buf_append(out, p, (size_t)(tail + sizeof(tail) - p));
    const char *what = v->script           ? ":S:"
                       : v->push != NULL   ? (strcmp(v->push, "exec") == 0 ? ":T:" : ":P:")
                       : v->zset           ? ":Z:"
                       : v->side[0] == 'L' ? ":L:"
                                           : ":R:";
    buf_append(out, what, 3);
    buf_append(out, v->key, v->klen);
}

/* A priority pop's receipt of its i-th key (each key its own, in its slot,
 * named as a one-key pop's: a dead process's are settled the same way). */
void multi_receipt_key(ferry *f, const rcpt_view *v, uint64_t n, long long i, buf *out)
{
    rcpt_view one = *v;
    one.multi = 0;
    multi_key(v, i, &one.key, &one.klen);
    receipt_key(f, &one, n, out);
}

/* A script on l: its SCRIPT LOAD queued once per link (bit: which one),
 * then EVALSHA; EVAL once Redis said it lacked it. Its head, in b. */
void rcpt_script_head(link *l, request *r, int bit, const char *lua, size_t lua_len,
                      const char *sha1, size_t argc, buf *b)
{
    int eval = (r->flags & REQ_F_RCPT_EVAL) != 0;
    if (!eval && !(l->receipt_script & bit)) {
        const char *argv[3] = {"SCRIPT", "LOAD", lua};
        link_internal(l, argv, 3, NULL, 0);
        l->receipt_script |= bit;
    }
    buf_append_count(b, '*', argc);
    if (eval) {
        buf_append_bulk(b, "EVAL", 4);
        buf_append_bulk(b, lua, lua_len);
    } else {
        buf_append_bulk(b, "EVALSHA", 7);
        buf_append_bulk(b, sha1, strlen(sha1));
    }
}

/* r carries a receipt now (REQ_F_RCPT): this process answers for it until
 * it is served, put back or r is freed (request_free lets go of it then):
 * durability.receipts_held. */
void rcpt_hold(ferry *f, request *r, unsigned probe)
{
    if (!(r->flags & REQ_F_RCPT)) {
        f->stats.receipts_held++;
    }
    r->flags = (r->flags & ~REQ_F_RCPT_PROBE) | REQ_F_RCPT | probe;
}
