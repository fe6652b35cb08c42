/* scripts.c - the scripts ferry remembers, and what it does with them.
 *
 * Redis keeps a script cache per server and copies none of it to its
 * replicas (checked on 7.0.15: neither SCRIPT LOAD nor EVAL reaches a
 * replica; FUNCTION LOAD does, functions are in the data set). A client
 * that loaded its scripts once and calls them by EVALSHA would get
 * NOSCRIPT from a promoted replica, from a master that gets a slot later,
 * from a restarted server. ferry remembers each body it saw succeed (the
 * reply to SCRIPT LOAD, or to EVAL / EVAL_RO: Redis caches those too) and
 * each link remembers which scripts its server was given. Before an
 * EVALSHA goes out on a link that was not given its script, ferry queues
 * SCRIPT LOAD of the body on that link, right ahead of it: on one
 * connection Redis runs commands in order, so the EVALSHA finds the
 * script, and nothing the client sent after it can overtake it. The
 * client's command itself goes as written (its reply, its ACL check, its
 * command statistics are those of an EVALSHA).
 *
 * A NOSCRIPT all the same (a SCRIPT FLUSH sent to the server behind
 * ferry's back) forgets the link's marks; when nothing the client sent
 * after the EVALSHA is in flight, the EVALSHA is sent once more, the
 * script loaded ahead of it, and the client gets the script's reply.
 * When the client pipelined more behind it, that has already run on
 * Redis: re-running the EVALSHA after it would reorder the client's
 * commands, so the NOSCRIPT is the reply, as Redis gave it.
 *
 * Inside MULTI nothing is added (a SCRIPT LOAD would be queued in the
 * transaction and show in EXEC's reply): a script missing there is the
 * NOSCRIPT inside EXEC's array, as on Redis.
 *
 * SCRIPT FLUSH through ferry forgets every script: a generation number
 * that every link's marks are checked against. */
#include "scripts.h"

#include <openssl/evp.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

#include "link.h"
#include "log.h"
#include "resp.h"
#include "session.h"
#include "tx.h"

/* One remembered script. */
typedef struct script_entry {
    struct script_entry *hnext; /* in its hash bucket */
    struct script_entry *prev;  /* LRU: more recently used */
    struct script_entry *next;  /* LRU: less recently used */
    char sha[41];               /* lowercase hex */
    char *body;
    size_t len;
} script_entry;

struct scripts {
    uv_mutex_t lock;
    script_entry **buckets;
    size_t nbuckets; /* a power of two */
    size_t count;
    size_t bytes;         /* of bodies */
    size_t max_bytes;     /* scripts.remember_max_bytes */
    script_entry *head;   /* most recently used */
    script_entry *tail;   /* least recently used: dropped first */
    _Atomic uint64_t gen; /* bumped by SCRIPT FLUSH: every link's marks go */
};

/* What a link's server was given: the first 64 bits of each SHA1, in an
 * open-addressed table (0: empty), valid for one generation. */
typedef struct script_marks {
    uint64_t gen;
    size_t n, cap;
    uint64_t keys[];
} script_marks;

#define MARKS_FIRST 16
#define MARKS_MAX 8192 /* past it the table starts again (scripts loaded again) */

scripts *scripts_new(size_t max_bytes)
{
    scripts *m = xcalloc(1, sizeof(*m));
    uv_mutex_init(&m->lock);
    m->nbuckets = 64;
    m->buckets = xcalloc(m->nbuckets, sizeof(*m->buckets));
    m->max_bytes = max_bytes;
    atomic_init(&m->gen, 1);
    return m;
}

static void drop_all(scripts *m)
{
    script_entry *e = m->head;
    while (e != NULL) {
        script_entry *next = e->next;
        free(e->body);
        free(e);
        e = next;
    }
    memset(m->buckets, 0, m->nbuckets * sizeof(*m->buckets));
    m->head = m->tail = NULL;
    m->count = 0;
    m->bytes = 0;
}

void scripts_free(scripts *m)
{
    if (m == NULL) {
        return;
    }
    drop_all(m);
    free(m->buckets);
    uv_mutex_destroy(&m->lock);
    free(m);
}

void scripts_sha1_hex(const char *p, size_t n, char out[41])
{
    static const char hex[] = "0123456789abcdef";
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int mdlen = 0;
    if (EVP_Digest(p, n, md, &mdlen, EVP_sha1(), NULL) != 1 || mdlen != 20) {
        ferry_assert(!"SHA1 failed");
    }
    for (unsigned i = 0; i < 20; i++) {
        out[2 * i] = hex[md[i] >> 4];
        out[2 * i + 1] = hex[md[i] & 15];
    }
    out[40] = '\0';
}

/* The SHA1 at p (40 hex digits, either case) in lowercase in out; -1 if
 * it is not one (Redis answers NOSCRIPT to such a name: nothing to do). */
static int normal_sha(const char *p, size_t n, char out[41])
{
    if (n != 40) {
        return -1;
    }
    for (size_t i = 0; i < 40; i++) {
        char c = p[i];
        if (c >= 'A' && c <= 'F') {
            c = (char)(c - 'A' + 'a');
        }
        if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) {
            return -1;
        }
        out[i] = c;
    }
    out[40] = '\0';
    return 0;
}

static uint64_t sha_key(const char sha[41])
{
    uint64_t k = 0;
    for (int i = 0; i < 16; i++) {
        char c = sha[i];
        k = (k << 4) | (uint64_t)(c <= '9' ? c - '0' : c - 'a' + 10);
    }
    return k != 0 ? k : 1;
}

static size_t bucket_of(const scripts *m, const char sha[41])
{
    return (size_t)sha_key(sha) & (m->nbuckets - 1);
}

static script_entry *find(scripts *m, const char sha[41])
{
    for (script_entry *e = m->buckets[bucket_of(m, sha)]; e != NULL; e = e->hnext) {
        if (memcmp(e->sha, sha, 40) == 0) {
            return e;
        }
    }
    return NULL;
}

static void lru_unlink(scripts *m, script_entry *e)
{
    if (e->prev != NULL) {
        e->prev->next = e->next;
    } else {
        m->head = e->next;
    }
    if (e->next != NULL) {
        e->next->prev = e->prev;
    } else {
        m->tail = e->prev;
    }
    e->prev = e->next = NULL;
}

static void lru_push(scripts *m, script_entry *e)
{
    e->prev = NULL;
    e->next = m->head;
    if (m->head != NULL) {
        m->head->prev = e;
    }
    m->head = e;
    if (m->tail == NULL) {
        m->tail = e;
    }
}

static void drop(scripts *m, script_entry *e)
{
    script_entry **pp = &m->buckets[bucket_of(m, e->sha)];
    while (*pp != e) {
        pp = &(*pp)->hnext;
    }
    *pp = e->hnext;
    lru_unlink(m, e);
    m->count--;
    m->bytes -= e->len;
    free(e->body);
    free(e);
}

static void grow(scripts *m)
{
    size_t n = m->nbuckets * 2;
    script_entry **b = xcalloc(n, sizeof(*b));
    for (size_t i = 0; i < m->nbuckets; i++) {
        script_entry *e = m->buckets[i];
        while (e != NULL) {
            script_entry *next = e->hnext;
            size_t j = (size_t)sha_key(e->sha) & (n - 1);
            e->hnext = b[j];
            b[j] = e;
            e = next;
        }
    }
    free(m->buckets);
    m->buckets = b;
    m->nbuckets = n;
}

/* Remember body (n bytes) as sha; the least recently used go past the
 * bound. Returns 1 when it is remembered. */
static int remember(scripts *m, const char sha[41], const char *body, size_t n)
{
    if (m == NULL || m->max_bytes == 0 || n > m->max_bytes) {
        return 0;
    }
    uv_mutex_lock(&m->lock);
    script_entry *e = find(m, sha);
    if (e != NULL) {
        lru_unlink(m, e);
        lru_push(m, e);
        uv_mutex_unlock(&m->lock);
        return 1;
    }
    while (m->tail != NULL && m->bytes + n > m->max_bytes) {
        drop(m, m->tail);
    }
    e = xcalloc(1, sizeof(*e));
    memcpy(e->sha, sha, 41);
    e->body = xmalloc(n > 0 ? n : 1);
    memcpy(e->body, body, n);
    e->len = n;
    if (m->count + 1 > m->nbuckets) {
        grow(m);
    }
    size_t b = bucket_of(m, sha);
    e->hnext = m->buckets[b];
    m->buckets[b] = e;
    lru_push(m, e);
    m->count++;
    m->bytes += n;
    uv_mutex_unlock(&m->lock);
    return 1;
}

/* SCRIPT LOAD <body of sha> appended to out; 0 when sha is not known. */
static int load_command(scripts *m, const char sha[41], buf *out)
{
    uv_mutex_lock(&m->lock);
    script_entry *e = find(m, sha);
    if (e != NULL) {
        lru_unlink(m, e);
        lru_push(m, e);
        buf_append_count(out, '*', 3);
        buf_append_bulk(out, "SCRIPT", 6);
        buf_append_bulk(out, "LOAD", 4);
        buf_append_bulk(out, e->body, e->len);
    }
    uv_mutex_unlock(&m->lock);
    return e != NULL;
}

static int known(scripts *m, const char sha[41])
{
    uv_mutex_lock(&m->lock);
    int k = find(m, sha) != NULL;
    uv_mutex_unlock(&m->lock);
    return k;
}

static void forget_all(scripts *m)
{
    uv_mutex_lock(&m->lock);
    drop_all(m);
    atomic_fetch_add(&m->gen, 1);
    uv_mutex_unlock(&m->lock);
}

/* ------------------------------------------------------------ link marks */

/* l's marks, valid for the memory's generation now (emptied if not). */
static script_marks *marks_of(link *l, uint64_t gen, int create)
{
    script_marks *k = l->script_marks;
    if (k != NULL && k->gen != gen) {
        memset(k->keys, 0, k->cap * sizeof(uint64_t));
        k->n = 0;
        k->gen = gen;
    }
    if (k == NULL && create) {
        k = xcalloc(1, sizeof(*k) + MARKS_FIRST * sizeof(uint64_t));
        k->cap = MARKS_FIRST;
        k->gen = gen;
        l->script_marks = k;
    }
    return k;
}

static int marks_has(const script_marks *k, uint64_t key)
{
    if (k == NULL) {
        return 0;
    }
    for (size_t i = (size_t)key & (k->cap - 1);; i = (i + 1) & (k->cap - 1)) {
        if (k->keys[i] == key) {
            return 1;
        }
        if (k->keys[i] == 0) {
            return 0;
        }
    }
}

static void marks_put(script_marks *k, uint64_t key)
{
    for (size_t i = (size_t)key & (k->cap - 1);; i = (i + 1) & (k->cap - 1)) {
        if (k->keys[i] == key) {
            return;
        }
        if (k->keys[i] == 0) {
            k->keys[i] = key;
            k->n++;
            return;
        }
    }
}

static void mark(link *l, uint64_t gen, uint64_t key)
{
    script_marks *k = marks_of(l, gen, 1);
    if ((k->n + 1) * 2 > k->cap) {
        if (k->cap >= MARKS_MAX) {
            memset(k->keys, 0, k->cap * sizeof(uint64_t));
            k->n = 0;
        } else {
            script_marks *g = xcalloc(1, sizeof(*g) + 2 * k->cap * sizeof(uint64_t));
            g->cap = 2 * k->cap;
            g->gen = gen;
            for (size_t i = 0; i < k->cap; i++) {
                if (k->keys[i] != 0) {
                    marks_put(g, k->keys[i]);
                }
            }
            free(k);
            l->script_marks = k = g;
        }
    }
    marks_put(k, key);
}

/* ------------------------------------------------------------ requests */

/* The argument at index i (0: the command's name) of r's multibulk. */
static int arg_at(const request *r, int i, const char **s, size_t *n)
{
    const char *p = buf_head(&r->data), *end = p + buf_used(&r->data);
    long long argc = resp_read_header(&p, end, '*');
    if (argc <= i) {
        return -1;
    }
    for (int j = 0; j <= i; j++) {
        long long len = resp_read_header(&p, end, '$');
        if (len < 0 || end - p < len + 2) {
            return -1;
        }
        *s = p;
        *n = (size_t)len;
        p += len + 2;
    }
    return 0;
}

typedef enum script_kind {
    SK_NONE = 0,
    SK_EVALSHA, /* EVALSHA, EVALSHA_RO */
    SK_EVAL,    /* EVAL, EVAL_RO */
    SK_LOAD,    /* SCRIPT LOAD */
    SK_FLUSH    /* SCRIPT FLUSH */
} script_kind;

static script_kind kind_of(const request *r)
{
    const char *name = r->cmd != NULL ? r->cmd->name : NULL;
    if (name == NULL || (name[0] != 'e' && name[0] != 's') || (r->flags & REQ_F_INTERNAL)) {
        return SK_NONE; /* the common case, at the cost of one comparison */
    }
    if (strcmp(name, "evalsha") == 0 || strcmp(name, "evalsha_ro") == 0) {
        return SK_EVALSHA;
    }
    if (strcmp(name, "eval") == 0 || strcmp(name, "eval_ro") == 0) {
        return SK_EVAL;
    }
    if (strcmp(name, "script|load") == 0) {
        return SK_LOAD;
    }
    if (strcmp(name, "script|flush") == 0) {
        return SK_FLUSH;
    }
    return SK_NONE;
}

void scripts_ahead(session *s, request *r, link *l)
{
    scripts *m = s->f->scripts;
    const char *p;
    size_t n;
    char sha[41];
    if (m == NULL || kind_of(r) != SK_EVALSHA || tx_in_multi(s) || arg_at(r, 1, &p, &n) != 0 ||
        normal_sha(p, n, sha) != 0) {
        return;
    }
    uint64_t gen = atomic_load(&m->gen);
    uint64_t key = sha_key(sha);
    if (marks_has(marks_of(l, gen, 0), key)) {
        return;
    }
    buf b;
    buf_init(&b);
    if (load_command(m, sha, &b)) {
        link_internal_raw(l, buf_head(&b), buf_used(&b), NULL);
        mark(l, gen, key);
        s->f->stats.scripts_reloaded++;
        log_debug("scripts: %s loaded on link %llu ahead of client %llu's EVALSHA", sha,
                  (unsigned long long)l->id, (unsigned long long)s->id);
    }
    buf_free(&b);
}

int scripts_body(scripts *m, const char *sha, size_t n, buf *out)
{
    char norm[41];
    if (m == NULL || normal_sha(sha, n, norm) != 0) {
        return 0;
    }
    uv_mutex_lock(&m->lock);
    script_entry *e = find(m, norm);
    if (e != NULL) {
        buf_append(out, e->body, e->len);
    }
    uv_mutex_unlock(&m->lock);
    return e != NULL;
}

int scripts_load_on(scripts *m, link *l, const char sha[41], const char *body, size_t n)
{
    if (m == NULL) {
        return 0;
    }
    uint64_t gen = atomic_load(&m->gen);
    uint64_t key = sha_key(sha);
    if (!marks_has(marks_of(l, gen, 0), key)) {
        buf b;
        buf_init(&b);
        buf_append_count(&b, '*', 3);
        buf_append_bulk(&b, "SCRIPT", 6);
        buf_append_bulk(&b, "LOAD", 4);
        buf_append_bulk(&b, body, n);
        link_internal_raw(l, buf_head(&b), buf_used(&b), NULL);
        buf_free(&b);
        mark(l, gen, key);
    }
    return 1;
}

static int starts(const char *p, size_t n, const char *lit)
{
    size_t m = strlen(lit);
    return n >= m && memcmp(p, lit, m) == 0;
}

int scripts_on_reply(session *s, request *r, link *via, const char *p, size_t n)
{
    scripts *m = s->f->scripts;
    const char *a;
    size_t alen;
    char sha[41];
    script_kind k = m != NULL ? kind_of(r) : SK_NONE;
    if (k == SK_NONE || n == 0 || tx_in_multi(s)) {
        return 0; /* inside MULTI the reply is +QUEUED: EXEC's reply is the outcome */
    }
    uint64_t gen = atomic_load(&m->gen);
    switch (k) {
    case SK_FLUSH:
        if (starts(p, n, "+OK")) {
            forget_all(m);
        }
        return 0;
    case SK_LOAD:
    case SK_EVAL:
        if (arg_at(r, k == SK_LOAD ? 2 : 1, &a, &alen) != 0) {
            return 0;
        }
        if (p[0] == '-' &&
            (k == SK_LOAD || starts(p, n, "-ERR Error compiling script") ||
             starts(p, n, "-NOPERM") || starts(p, n, "-NOAUTH") ||
             starts(p, n, "-ERR wrong number") || starts(p, n, "-ERR Number of keys"))) {
            return 0; /* not compiled, not run: not cached on Redis either */
        }
        scripts_sha1_hex(a, alen, sha);
        if (remember(m, sha, a, alen) && via != NULL) {
            mark(via, gen, sha_key(sha));
        }
        return 0;
    case SK_EVALSHA:
        if (!starts(p, n, "-NOSCRIPT") || arg_at(r, 1, &a, &alen) != 0 ||
            normal_sha(a, alen, sha) != 0) {
            return 0;
        }
        if (via != NULL && via->script_marks != NULL) {
            /* Its server lost its scripts (flushed): load them again. */
            script_marks *mk = via->script_marks;
            memset(mk->keys, 0, mk->cap * sizeof(uint64_t));
            mk->n = 0;
        }
        if ((r->flags & REQ_F_SCRIPT_AGAIN) || s->inflight != 1 || !known(m, sha)) {
            return 0; /* unknown to ferry, sent again already, or more behind it ran */
        }
        r->flags |= REQ_F_SCRIPT_AGAIN;
        s->f->stats.noscript_resent++;
        log_info("scripts: Redis lacked script %s; client %llu's EVALSHA sent again after it", sha,
                 (unsigned long long)s->id);
        return 1;
    default:
        return 0;
    }
}
