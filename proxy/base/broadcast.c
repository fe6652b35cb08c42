/* broadcast.c - the replies of every master to one command, folded into
 * the client's (broadcast.h). */
#include "broadcast.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "ferry.h"
#include "subs.h"

broadcast_kind broadcast_kind_of(const command *cmd)
{
    static const char *const first[] = {"script|load",     "script|flush",   "function|load",
                                        "function|delete", "function|flush", "function|restore",
                                        "flushall",        "flushdb",        "config|set"};
    static const struct {
        const char *name;
        broadcast_kind kind;
    } whole[] = {{"script|exists", BCAST_AND},
                 {"keys", BCAST_CONCAT},
                 {"dbsize", BCAST_SUM},
                 {"randomkey", BCAST_ANY},
                 {"info", BCAST_INFO}};
    if (cmd == NULL) {
        return BCAST_NONE;
    }
    for (size_t i = 0; i < sizeof(whole) / sizeof(whole[0]); i++) {
        if (strcmp(cmd->name, whole[i].name) == 0) {
            return whole[i].kind;
        }
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

int broadcast_info_has_keyspace(size_t argc, const char *const *argv, const size_t *lens)
{
    static const char *const with[] = {"keyspace", "default", "all", "everything"};
    if (argc <= 1) {
        return 1;
    }
    for (size_t i = 1; i < argc; i++) {
        for (size_t k = 0; k < sizeof(with) / sizeof(with[0]); k++) {
            if (lens[i] == strlen(with[k]) && strncasecmp(argv[i], with[k], lens[i]) == 0) {
                return 1;
            }
        }
    }
    return 0;
}

broadcast *broadcast_new(broadcast_kind kind)
{
    broadcast *b = xcalloc(1, sizeof(*b));
    b->kind = kind;
    buf_init(&b->reply);
    buf_init(&b->body);
    return b;
}

void broadcast_free(broadcast *b)
{
    if (b == NULL) {
        return;
    }
    buf_free(&b->reply);
    buf_free(&b->body);
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

/* A signed decimal up to "\r\n" at p (at most end), as read_count. */
static int read_signed(const char *p, const char *end, long long *v, const char **next)
{
    int neg = p < end && *p == '-';
    long long x = read_count(p + neg, end, next);
    if (x < 0) {
        return -1;
    }
    *v = neg ? -x : x;
    return 0;
}

/* KEYS: the array p, n joined to the ones before. */
static int fold_concat(broadcast *b, const char *p, size_t n)
{
    const char *end = p + n, *q;
    if (n < 1 || p[0] != '*') {
        return 0;
    }
    long long count = read_count(p + 1, end, &q);
    if (count < 0) {
        return 0;
    }
    b->count += count;
    buf_append(&b->body, q, (size_t)(end - q));
    buf_clear(&b->reply);
    buf_append_count(&b->reply, '*', (size_t)b->count);
    buf_append(&b->reply, buf_head(&b->body), buf_used(&b->body));
    return 1;
}

/* DBSIZE: the integer p, n added to the ones before. */
static int fold_sum(broadcast *b, const char *p, size_t n)
{
    const char *q;
    long long v;
    if (n < 1 || p[0] != ':' || read_signed(p + 1, p + n, &v, &q) != 0 || q != p + n) {
        return 0;
    }
    b->count += v;
    char line[40];
    snprintf(line, sizeof(line), ":%lld\r\n", b->count);
    buf_clear(&b->reply);
    buf_append_str(&b->reply, line);
    return 1;
}

/* INFO's reply p, n: its text (*text, *len: a bulk string, or RESP3's
 * verbatim string without its "txt:"). 0 if it is not one. */
static int info_text(const char *p, size_t n, const char **text, size_t *len)
{
    const char *end = p + n, *q;
    if (n < 1 || (p[0] != '$' && p[0] != '=')) {
        return 0;
    }
    long long l = read_count(p + 1, end, &q);
    if (l < 0 || l > end - q || end - q - l != 2 || q[l] != '\r' || q[l + 1] != '\n') {
        return 0;
    }
    if (p[0] == '=') {
        if (l < 4 || q[3] != ':') {
            return 0;
        }
        q += 4;
        l -= 4;
    }
    *text = q;
    *len = (size_t)l;
    return 1;
}

/* The Keyspace section of INFO's text: [*from, *to) its lines after the
 * "# Keyspace" title. 0 if there is none. */
static int keyspace_lines(const char *text, size_t len, size_t *from, size_t *to)
{
    static const char title[] = "# Keyspace\r\n";
    size_t tl = sizeof(title) - 1;
    for (size_t at = 0; at + tl <= len; at++) {
        if ((at == 0 || text[at - 1] == '\n') && memcmp(text + at, title, tl) == 0) {
            size_t e = at + tl;
            while (e < len && text[e] != '#' && text[e] != '\r') {
                const char *nl = memchr(text + e, '\n', len - e);
                e = nl != NULL ? (size_t)(nl - text) + 1 : len;
            }
            *from = at + tl;
            *to = e;
            return 1;
        }
    }
    return 0;
}

/* One "dbN:keys=..,expires=..,avg_ttl=.." line (p, n without its end)
 * added to b->db. Lines that are not that are ignored. */
static void keyspace_add(broadcast *b, const char *p, size_t n)
{
    char line[256], *save = NULL;
    long long db = 0;
    size_t i = 2;
    if (n < 4 || n >= sizeof(line) || memcmp(p, "db", 2) != 0) {
        return;
    }
    for (; i < n && p[i] >= '0' && p[i] <= '9' && db < BCAST_DBS; i++) {
        db = db * 10 + (p[i] - '0');
    }
    if (i == 2 || i >= n || p[i] != ':' || db >= BCAST_DBS) {
        return;
    }
    memcpy(line, p + i + 1, n - i - 1);
    line[n - i - 1] = '\0';
    char names[BCAST_FIELDS][16];
    unsigned long long vals[BCAST_FIELDS], expires = 0;
    int nf = 0;
    for (char *tok = strtok_r(line, ",", &save); tok != NULL && nf < BCAST_FIELDS;
         tok = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(tok, '='), *stop;
        if (eq == NULL || eq == tok || (size_t)(eq - tok) >= sizeof(names[0])) {
            continue;
        }
        *eq = '\0';
        unsigned long long v = strtoull(eq + 1, &stop, 10);
        if (*stop != '\0' || stop == eq + 1) {
            continue;
        }
        snprintf(names[nf], sizeof(names[nf]), "%s", tok);
        vals[nf++] = v;
        if (strcmp(tok, "expires") == 0) {
            expires = v;
        }
    }
    broadcast_db *d = &b->db[db];
    d->present = 1;
    for (int f = 0; f < nf; f++) {
        int k = 0;
        while (k < d->nfields && strcmp(d->name[k], names[f]) != 0) {
            k++;
        }
        if (k == d->nfields) {
            if (k == BCAST_FIELDS) {
                continue;
            }
            memcpy(d->name[k], names[f], sizeof(d->name[k]));
            d->sum[k] = 0;
            d->nfields++;
        }
        d->sum[k] += strcmp(names[f], "avg_ttl") == 0 ? vals[f] * expires : vals[f];
    }
}

/* b->db as INFO's lines. */
static void keyspace_write(const broadcast *b, buf *out)
{
    for (int db = 0; db < BCAST_DBS; db++) {
        const broadcast_db *d = &b->db[db];
        unsigned long long expires = 0;
        char item[64];
        if (!d->present) {
            continue;
        }
        for (int k = 0; k < d->nfields; k++) {
            if (strcmp(d->name[k], "expires") == 0) {
                expires = d->sum[k];
            }
        }
        snprintf(item, sizeof(item), "db%d:", db);
        buf_append_str(out, item);
        for (int k = 0; k < d->nfields; k++) {
            unsigned long long v = d->sum[k];
            if (strcmp(d->name[k], "avg_ttl") == 0) {
                v = expires > 0 ? v / expires : 0;
            }
            snprintf(item, sizeof(item), "%s%s=%llu", k > 0 ? "," : "", d->name[k], v);
            buf_append_str(out, item);
        }
        buf_append_str(out, "\r\n");
    }
}

/* INFO: the keyspace of p, n added; the reply is the first master's with
 * the summed Keyspace section. */
static int fold_info(broadcast *b, const char *p, size_t n, int first)
{
    const char *text;
    size_t len, from, to;
    if (!info_text(p, n, &text, &len)) {
        return 0;
    }
    if (keyspace_lines(text, len, &from, &to)) {
        for (size_t at = from; at < to;) {
            const char *nl = memchr(text + at, '\n', to - at);
            size_t e = nl != NULL ? (size_t)(nl - text) : to;
            size_t l = e - at;
            keyspace_add(b, text + at, l > 0 && text[at + l - 1] == '\r' ? l - 1 : l);
            at = e + 1;
        }
    }
    if (first) {
        buf_append(&b->body, p, n);
    }
    if (!info_text(buf_head(&b->body), buf_used(&b->body), &text, &len) ||
        !keyspace_lines(text, len, &from, &to)) {
        buf_clear(&b->reply); /* no section to sum: the first master's as it is */
        buf_append(&b->reply, buf_head(&b->body), buf_used(&b->body));
        return 1;
    }
    buf t;
    buf_init(&t);
    buf_append(&t, text, from);
    keyspace_write(b, &t);
    buf_append(&t, text + to, len - to);
    int verbatim = buf_head(&b->body)[0] == '=';
    buf_clear(&b->reply);
    buf_append_count(&b->reply, verbatim ? '=' : '$', buf_used(&t) + (verbatim ? 4 : 0));
    if (verbatim) {
        buf_append_str(&b->reply, "txt:");
    }
    buf_append(&b->reply, buf_head(&t), buf_used(&t));
    buf_append_str(&b->reply, "\r\n");
    buf_free(&t);
    return 1;
}

static int is_nil(const char *p, size_t n)
{
    return (n == 5 && memcmp(p, "$-1\r\n", 5) == 0) || (n == 3 && memcmp(p, "_\r\n", 3) == 0) ||
           (n == 5 && memcmp(p, "*-1\r\n", 5) == 0);
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
    int first = b->answered++ == 0;
    int ok = 1;
    switch (b->kind) {
    case BCAST_CONCAT:
        ok = fold_concat(b, p, n);
        break;
    case BCAST_SUM:
        ok = fold_sum(b, p, n);
        break;
    case BCAST_UNION:
        ok = first ? (buf_append(&b->reply, p, n), 1) : fold_union(b, p, n);
        break;
    case BCAST_SUM_PAIRS:
        ok = first ? (buf_append(&b->reply, p, n), 1) : fold_sum_pairs(b, p, n);
        break;
    case BCAST_INFO:
        ok = fold_info(b, p, n, first);
        break;
    case BCAST_ANY:
        buf_clear(&b->reply);
        buf_append(&b->reply, p, n);
        if (!is_nil(p, n)) {
            b->failed = 1; /* a key: the reply is final */
            return 0;
        }
        return 1;
    case BCAST_AND:
        if (first) {
            buf_append(&b->reply, p, n);
        } else if (!fold_and(b, p, n)) {
            buf_clear(&b->reply);
            buf_append_str(&b->reply, "-ERR ferry: cluster mode: the masters' SCRIPT EXISTS "
                                      "replies differ in shape\r\n");
            b->failed = 1;
            return 0;
        }
        return 1;
    default:
        if (first) {
            buf_append(&b->reply, p, n);
        }
        return 1;
    }
    if (!ok) {
        buf_clear(&b->reply);
        buf_append_str(&b->reply, "-ERR ferry: cluster mode: a master's reply could not be "
                                  "merged with the others'\r\n");
        b->failed = 1;
        return 0;
    }
    return 1;
}
