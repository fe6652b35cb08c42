/* slotmap.c - parsing CLUSTER SHARDS / SLOTS / NODES into a slot map, and
 * the epoch rule by which a newer view replaces slots (slotmap.h).
 *
 * Why CLUSTER NODES: neither SHARDS nor SLOTS says at which config epoch a
 * master owns its slots, and without it a stale view (a node cut off in a
 * minority, a restarted old master) cannot be told from a newer one. NODES
 * carries each master's configEpoch, the number Redis itself compares when
 * two nodes claim a slot (the higher wins); a failover and the last step of
 * a slot migration both give the new owner an epoch above every other. So
 * ferry asks one node for both replies back to back and weighs the pair. */
#include "slotmap.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int fail(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int fail(char *err, size_t errlen, const char *fmt, ...)
{
    if (err != NULL && errlen > 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return -1;
}

void slotmap_init(slotmap *m)
{
    for (int i = 0; i < CLUSTER_SLOTS; i++) {
        m->owner[i] = -1;
    }
    m->nshards = 0;
}

const slotmap_shard *slotmap_shard_of(const slotmap *m, int slot)
{
    if (slot < 0 || slot >= CLUSTER_SLOTS || m->owner[slot] < 0) {
        return NULL;
    }
    return &m->shards[m->owner[slot]];
}

int slotmap_covered(const slotmap *m)
{
    int n = 0;
    for (int i = 0; i < CLUSTER_SLOTS; i++) {
        n += m->owner[i] >= 0;
    }
    return n;
}

/* ==== reply helpers ==== */

static int is_str(const redisReply *r)
{
    return r != NULL && (r->type == REDIS_REPLY_STRING || r->type == REDIS_REPLY_STATUS);
}

static int str_is(const redisReply *r, const char *s)
{
    return is_str(r) && r->len == strlen(s) && memcmp(r->str, s, r->len) == 0;
}

/* A text field into dst (cap bytes with the NUL): 0, or -1 when it is no
 * string, is empty, too long or holds a NUL. */
static int copy_text(char *dst, size_t cap, const redisReply *r)
{
    if (!is_str(r) || r->len == 0 || r->len >= cap || memchr(r->str, '\0', r->len) != NULL) {
        return -1;
    }
    memcpy(dst, r->str, r->len);
    dst[r->len] = '\0';
    return 0;
}

/* A node id: 40 characters of [0-9a-f]. */
static int valid_id(const char *s, size_t n)
{
    if (n != SLOTMAP_ID_LEN) {
        return 0;
    }
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) {
            return 0;
        }
    }
    return 1;
}

/* An integer reply, or a string of digits (RESP3 answers and proxies vary),
 * within [lo, hi]: 0, else -1. */
static int get_int(const redisReply *r, long long lo, long long hi, long long *out)
{
    long long v;
    if (r == NULL) {
        return -1;
    }
    if (r->type == REDIS_REPLY_INTEGER) {
        v = r->integer;
    } else if (is_str(r) && r->len > 0 && r->len < 20) {
        char tmp[24];
        char *end = NULL;
        memcpy(tmp, r->str, r->len);
        tmp[r->len] = '\0';
        v = strtoll(tmp, &end, 10);
        if (end == tmp || *end != '\0' || tmp[0] == '+' || tmp[0] == ' ') {
            return -1;
        }
    } else {
        return -1;
    }
    if (v < lo || v > hi) {
        return -1;
    }
    *out = v;
    return 0;
}

/* The value after key in a flat [k1, v1, k2, v2, ...] array, or NULL. */
static const redisReply *kv_get(const redisReply *r, const char *key)
{
    for (size_t i = 0; i + 1 < r->elements; i += 2) {
        if (str_is(r->element[i], key)) {
            return r->element[i + 1];
        }
    }
    return NULL;
}

static int same_node(const slotmap_node *a, const slotmap_node *b)
{
    if (a->id[0] != '\0' || b->id[0] != '\0') {
        return strcmp(a->id, b->id) == 0;
    }
    return a->port == b->port && strcmp(a->host, b->host) == 0;
}

/* Nodes list a shard's replicas in the order each learned them, which
 * differs between nodes: kept in one order (id, else address) so that two
 * nodes' same view is the same map. */
static int node_cmp(const slotmap_node *a, const slotmap_node *b)
{
    int c = strcmp(a->id, b->id);
    if (c == 0) {
        c = strcmp(a->host, b->host);
    }
    return c != 0 ? c : (a->port > b->port) - (a->port < b->port);
}

static void sort_replicas(slotmap *m)
{
    for (int k = 0; k < m->nshards; k++) {
        slotmap_shard *s = &m->shards[k];
        for (int i = 1; i < s->nreplicas; i++) {
            slotmap_node x = s->replicas[i];
            int j = i;
            for (; j > 0 && node_cmp(&s->replicas[j - 1], &x) > 0; j--) {
                s->replicas[j] = s->replicas[j - 1];
            }
            s->replicas[j] = x;
        }
    }
}

/* Assign slots [lo, hi] to shard k; -1 (err) when one has an owner. */
static int assign(slotmap *m, int k, long long lo, long long hi, char *err, size_t errlen)
{
    for (long long s = lo; s <= hi; s++) {
        if (m->owner[s] >= 0 && m->owner[s] != k) {
            return fail(err, errlen, "slot %lld is served by two masters", s);
        }
        if (m->owner[s] < 0) {
            m->owner[s] = (int16_t)k;
            m->shards[k].nslots++;
        }
    }
    return 0;
}

/* ==== CLUSTER SHARDS ==== */

/* One node of a SHARDS reply: its fields into *nd, *is_master. */
static int shards_node(const redisReply *r, int tls, slotmap_node *nd, int *is_master, char *err,
                       size_t errlen)
{
    const redisReply *v;
    long long port;

    memset(nd, 0, sizeof(*nd));
    if (r == NULL || r->type != REDIS_REPLY_ARRAY || r->elements % 2 != 0) {
        return fail(err, errlen, "CLUSTER SHARDS: a node is not a list of fields");
    }
    v = kv_get(r, "id");
    if (v == NULL || !is_str(v) || !valid_id(v->str, v->len)) {
        return fail(err, errlen, "CLUSTER SHARDS: a node has no valid id");
    }
    memcpy(nd->id, v->str, SLOTMAP_ID_LEN);
    nd->id[SLOTMAP_ID_LEN] = '\0';
    v = tls && kv_get(r, "tls-port") != NULL ? kv_get(r, "tls-port") : kv_get(r, "port");
    if (get_int(v, 0, 65535, &port) != 0) {
        if (!tls && kv_get(r, "tls-port") != NULL) {
            return fail(err, errlen,
                        "CLUSTER SHARDS: node %.12s has a TLS port only (a TLS cluster: "
                        "give redis.tls)",
                        nd->id);
        }
        return fail(err, errlen, "CLUSTER SHARDS: node %.12s has no valid port", nd->id);
    }
    nd->port = (int)port;
    /* endpoint is where the cluster wants clients to connect; "?" or ""
     * means unknown, then the ip. */
    v = kv_get(r, "endpoint");
    if (v == NULL || str_is(v, "?") || copy_text(nd->host, sizeof(nd->host), v) != 0) {
        if (copy_text(nd->host, sizeof(nd->host), kv_get(r, "ip")) != 0) {
            return fail(err, errlen, "CLUSTER SHARDS: node %.12s has no valid ip or endpoint",
                        nd->id);
        }
    }
    v = kv_get(r, "role");
    if (str_is(v, "master")) {
        *is_master = 1;
    } else if (str_is(v, "replica") || str_is(v, "slave")) {
        *is_master = 0;
    } else {
        return fail(err, errlen, "CLUSTER SHARDS: node %.12s has no valid role", nd->id);
    }
    v = kv_get(r, "health");
    if (v == NULL || str_is(v, "online")) {
        nd->health = SLOTMAP_ONLINE;
    } else if (str_is(v, "loading")) {
        nd->health = SLOTMAP_LOADING;
    } else {
        /* "failed" in the documentation, "fail" from Redis 7.0.15; any
         * other word is no promise the node serves: not used either. */
        nd->health = SLOTMAP_FAILED;
    }
    return 0;
}

int slotmap_from_shards(slotmap *m, const redisReply *r, int tls, char *err, size_t errlen)
{
    slotmap_init(m);
    if (r == NULL || r->type != REDIS_REPLY_ARRAY) {
        return fail(err, errlen, "CLUSTER SHARDS: the reply is not a list");
    }
    for (size_t i = 0; i < r->elements; i++) {
        const redisReply *sh = r->element[i];
        const redisReply *slots, *nodes;
        slotmap_node master, replicas[SLOTMAP_MAX_REPLICAS];
        int nreplicas = 0, nmasters = 0;

        if (sh == NULL || sh->type != REDIS_REPLY_ARRAY || sh->elements % 2 != 0) {
            goto bad_shape;
        }
        slots = kv_get(sh, "slots");
        nodes = kv_get(sh, "nodes");
        if (slots == NULL || slots->type != REDIS_REPLY_ARRAY || slots->elements % 2 != 0) {
            slotmap_init(m);
            return fail(err, errlen, "CLUSTER SHARDS: shard %zu has no valid slots list", i);
        }
        if (nodes == NULL || nodes->type != REDIS_REPLY_ARRAY) {
            slotmap_init(m);
            return fail(err, errlen, "CLUSTER SHARDS: shard %zu has no nodes list", i);
        }
        memset(&master, 0, sizeof(master));
        for (size_t j = 0; j < nodes->elements; j++) {
            slotmap_node nd;
            int is_master = 0;
            if (shards_node(nodes->element[j], tls, &nd, &is_master, err, errlen) != 0) {
                slotmap_init(m);
                return -1;
            }
            if (is_master && nd.health != SLOTMAP_FAILED) {
                if (nmasters++ > 0) {
                    slotmap_init(m);
                    return fail(err, errlen, "CLUSTER SHARDS: shard %zu has two live masters", i);
                }
                master = nd;
            } else if (!is_master && nreplicas < SLOTMAP_MAX_REPLICAS) {
                replicas[nreplicas++] = nd;
            }
        }
        /* Check every range first: a bad one voids the reply. */
        for (size_t j = 0; j < slots->elements; j += 2) {
            long long lo, hi;
            if (get_int(slots->element[j], 0, CLUSTER_SLOTS - 1, &lo) != 0 ||
                get_int(slots->element[j + 1], 0, CLUSTER_SLOTS - 1, &hi) != 0 || lo > hi) {
                slotmap_init(m);
                return fail(err, errlen,
                            "CLUSTER SHARDS: shard %zu has a slot range out of "
                            "0..16383",
                            i);
            }
        }
        if (nmasters == 0 || master.port == 0 || slots->elements == 0) {
            continue; /* no live master, or nothing served: says nothing */
        }
        for (int k = 0; k < m->nshards; k++) {
            if (same_node(&m->shards[k].master, &master)) {
                slotmap_init(m);
                return fail(err, errlen, "CLUSTER SHARDS: master %.12s heads two shards",
                            master.id);
            }
        }
        if (m->nshards >= SLOTMAP_MAX_SHARDS) {
            slotmap_init(m);
            return fail(err, errlen, "CLUSTER SHARDS: more than %d shards", SLOTMAP_MAX_SHARDS);
        }
        int k = m->nshards++;
        slotmap_shard *s = &m->shards[k];
        memset(s, 0, sizeof(*s));
        s->master = master;
        memcpy(s->replicas, replicas, sizeof(replicas[0]) * (size_t)nreplicas);
        s->nreplicas = nreplicas;
        for (size_t j = 0; j < slots->elements; j += 2) {
            long long lo, hi;
            get_int(slots->element[j], 0, CLUSTER_SLOTS - 1, &lo);
            get_int(slots->element[j + 1], 0, CLUSTER_SLOTS - 1, &hi);
            if (assign(m, k, lo, hi, err, errlen) != 0) {
                slotmap_init(m);
                return -1;
            }
        }
    }
    sort_replicas(m);
    return 0;

bad_shape:
    slotmap_init(m);
    return fail(err, errlen, "CLUSTER SHARDS: a shard is not a list of fields");
}

/* ==== CLUSTER SLOTS ==== */

/* [ip, port, id, ...] of a SLOTS entry. */
static int slots_node(const redisReply *r, slotmap_node *nd, char *err, size_t errlen)
{
    long long port;
    memset(nd, 0, sizeof(*nd));
    if (r == NULL || r->type != REDIS_REPLY_ARRAY || r->elements < 3) {
        return fail(err, errlen, "CLUSTER SLOTS: a node is not [ip, port, id, ...]");
    }
    if (get_int(r->element[1], 0, 65535, &port) != 0) {
        return fail(err, errlen, "CLUSTER SLOTS: a node has no valid port");
    }
    nd->port = (int)port;
    if (!is_str(r->element[2]) || !valid_id(r->element[2]->str, r->element[2]->len)) {
        return fail(err, errlen, "CLUSTER SLOTS: a node has no valid id");
    }
    memcpy(nd->id, r->element[2]->str, SLOTMAP_ID_LEN);
    /* "?" or empty: the endpoint is unknown; NIL: the same as the node asked
     * (cluster-preferred-endpoint-type unknown-endpoint). */
    if (r->element[0] == NULL || r->element[0]->type == REDIS_REPLY_NIL ||
        str_is(r->element[0], "?") || str_is(r->element[0], "")) {
        nd->host[0] = '\0';
        return 0;
    }
    if (copy_text(nd->host, sizeof(nd->host), r->element[0]) != 0) {
        return fail(err, errlen, "CLUSTER SLOTS: node %.12s has no valid ip", nd->id);
    }
    return 0;
}

int slotmap_from_slots(slotmap *m, const redisReply *r, char *err, size_t errlen)
{
    slotmap_init(m);
    if (r == NULL || r->type != REDIS_REPLY_ARRAY) {
        return fail(err, errlen, "CLUSTER SLOTS: the reply is not a list");
    }
    for (size_t i = 0; i < r->elements; i++) {
        const redisReply *e = r->element[i];
        long long lo, hi;
        slotmap_node master;
        int k;

        if (e == NULL || e->type != REDIS_REPLY_ARRAY || e->elements < 3) {
            slotmap_init(m);
            return fail(err, errlen, "CLUSTER SLOTS: entry %zu is not [start, end, master, ...]",
                        i);
        }
        if (get_int(e->element[0], 0, CLUSTER_SLOTS - 1, &lo) != 0 ||
            get_int(e->element[1], 0, CLUSTER_SLOTS - 1, &hi) != 0 || lo > hi) {
            slotmap_init(m);
            return fail(err, errlen, "CLUSTER SLOTS: entry %zu has a slot range out of 0..16383",
                        i);
        }
        if (slots_node(e->element[2], &master, err, errlen) != 0) {
            slotmap_init(m);
            return -1;
        }
        if (master.host[0] == '\0' || master.port == 0) {
            continue; /* the master's address is unknown: nothing to route to */
        }
        for (k = 0; k < m->nshards && !same_node(&m->shards[k].master, &master); k++) {
        }
        if (k == m->nshards) {
            if (m->nshards >= SLOTMAP_MAX_SHARDS) {
                slotmap_init(m);
                return fail(err, errlen, "CLUSTER SLOTS: more than %d masters", SLOTMAP_MAX_SHARDS);
            }
            memset(&m->shards[k], 0, sizeof(m->shards[k]));
            m->shards[k].master = master;
            m->nshards++;
            for (size_t j = 3; j < e->elements; j++) {
                slotmap_node rep;
                if (slots_node(e->element[j], &rep, err, errlen) != 0) {
                    slotmap_init(m);
                    return -1;
                }
                if (rep.host[0] != '\0' && rep.port != 0 &&
                    m->shards[k].nreplicas < SLOTMAP_MAX_REPLICAS) {
                    m->shards[k].replicas[m->shards[k].nreplicas++] = rep;
                }
            }
        }
        if (assign(m, k, lo, hi, err, errlen) != 0) {
            slotmap_init(m);
            return -1;
        }
    }
    sort_replicas(m);
    return 0;
}

/* ==== CLUSTER NODES ==== */

/* Split the next space-separated field of [*p, end) into (f, fn). */
static int next_field(const char **p, const char *end, const char **f, size_t *fn)
{
    while (*p < end && **p == ' ') {
        (*p)++;
    }
    if (*p >= end) {
        return 0;
    }
    *f = *p;
    while (*p < end && **p != ' ') {
        (*p)++;
    }
    *fn = (size_t)(*p - *f);
    return 1;
}

static unsigned parse_flags(const char *f, size_t n)
{
    static const struct {
        const char *name;
        unsigned bit;
    } names[] = {{"myself", SLOTMAP_F_MYSELF},       {"master", SLOTMAP_F_MASTER},
                 {"slave", SLOTMAP_F_REPLICA},       {"replica", SLOTMAP_F_REPLICA},
                 {"fail?", SLOTMAP_F_PFAIL},         {"fail", SLOTMAP_F_FAIL},
                 {"handshake", SLOTMAP_F_HANDSHAKE}, {"noaddr", SLOTMAP_F_NOADDR}};
    unsigned flags = 0;
    const char *p = f, *end = f + n;
    while (p < end) {
        const char *q = memchr(p, ',', (size_t)(end - p));
        size_t len = q != NULL ? (size_t)(q - p) : (size_t)(end - p);
        for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
            if (strlen(names[i].name) == len && memcmp(names[i].name, p, len) == 0) {
                flags |= names[i].bit;
            }
        }
        p += len + 1;
    }
    return flags;
}

int slotmap_nodes_parse(const char *text, size_t len, slotmap_nodeinfo *out, int max, int *n,
                        char *err, size_t errlen)
{
    const char *p = text, *end = text + len;
    int count = 0, myself = 0, lineno = 0;

    *n = 0;
    if (text == NULL) {
        return fail(err, errlen, "CLUSTER NODES: no text");
    }
    while (p < end) {
        const char *eol = memchr(p, '\n', (size_t)(end - p));
        const char *le = eol != NULL ? eol : end;
        const char *f[8];
        size_t fn[8];
        const char *q = p;
        int nf = 0;

        lineno++;
        if (le > p && le[-1] == '\r') {
            le--;
        }
        while (nf < 8 && next_field(&q, le, &f[nf], &fn[nf])) {
            nf++;
        }
        if (nf == 0) {
            p = eol != NULL ? eol + 1 : end;
            continue;
        }
        if (nf < 8) {
            return fail(err, errlen, "CLUSTER NODES: line %d has %d fields, not 8 or more", lineno,
                        nf);
        }
        if (count >= max) {
            return fail(err, errlen, "CLUSTER NODES: more than %d nodes", max);
        }
        slotmap_nodeinfo *ni = &out[count];
        memset(ni, 0, sizeof(*ni));
        if (!valid_id(f[0], fn[0])) {
            return fail(err, errlen, "CLUSTER NODES: line %d has no valid node id", lineno);
        }
        memcpy(ni->id, f[0], SLOTMAP_ID_LEN);
        ni->flags = parse_flags(f[2], fn[2]);
        if (fn[3] == 1 && f[3][0] == '-') {
            ni->master_id[0] = '\0';
        } else if (valid_id(f[3], fn[3])) {
            memcpy(ni->master_id, f[3], SLOTMAP_ID_LEN);
        } else {
            return fail(err, errlen, "CLUSTER NODES: line %d has no valid master id", lineno);
        }
        /* configEpoch: plain digits */
        uint64_t ep = 0;
        if (fn[6] == 0 || fn[6] > 19) {
            return fail(err, errlen, "CLUSTER NODES: line %d has no valid config epoch", lineno);
        }
        for (size_t i = 0; i < fn[6]; i++) {
            if (f[6][i] < '0' || f[6][i] > '9') {
                return fail(err, errlen, "CLUSTER NODES: line %d has no valid config epoch",
                            lineno);
            }
            ep = ep * 10 + (uint64_t)(f[6][i] - '0');
        }
        ni->epoch = ep;
        if (ni->flags & SLOTMAP_F_MYSELF) {
            myself++;
        }
        count++;
        p = eol != NULL ? eol + 1 : end;
    }
    if (myself != 1) {
        return fail(err, errlen, "CLUSTER NODES: %d lines flagged myself, not 1", myself);
    }
    *n = count;
    return 0;
}

static const slotmap_nodeinfo *find_info(const slotmap_nodeinfo *nodes, int n, const char *id)
{
    for (int i = 0; i < n; i++) {
        if (strcmp(nodes[i].id, id) == 0) {
            return &nodes[i];
        }
    }
    return NULL;
}

int slotmap_set_epochs(slotmap *m, const slotmap_nodeinfo *nodes, int n, char *err, size_t errlen)
{
    for (int k = 0; k < m->nshards; k++) {
        slotmap_shard *s = &m->shards[k];
        const slotmap_nodeinfo *ni = find_info(nodes, n, s->master.id);
        if (ni == NULL) {
            return fail(err, errlen, "CLUSTER NODES does not name master %.12s (%s:%d)",
                        s->master.id, s->master.host, s->master.port);
        }
        s->epoch = ni->epoch;
        if (ni->flags & SLOTMAP_F_FAIL) {
            s->master.health = SLOTMAP_FAILED;
        }
        for (int i = 0; i < s->nreplicas; i++) {
            const slotmap_nodeinfo *ri = find_info(nodes, n, s->replicas[i].id);
            if (ri != NULL && (ri->flags & SLOTMAP_F_FAIL)) {
                s->replicas[i].health = SLOTMAP_FAILED;
            }
        }
    }
    return 0;
}

/* ==== the merge ==== */

static int find_shard(const slotmap *m, const slotmap_node *master)
{
    for (int k = 0; k < m->nshards; k++) {
        if (same_node(&m->shards[k].master, master)) {
            return k;
        }
    }
    return -1;
}

int slotmap_merge(slotmap *cur, const slotmap *cand, int *changed)
{
    int map[SLOTMAP_MAX_SHARDS];
    int moved = 0, meta = 0;

    /* 1. Each candidate shard to a shard of cur (refreshed when the
     *    candidate is at least as new), or a new one. */
    for (int c = 0; c < cand->nshards; c++) {
        const slotmap_shard *cs = &cand->shards[c];
        int k = find_shard(cur, &cs->master);
        map[c] = -1;
        if (k >= 0) {
            slotmap_shard *s = &cur->shards[k];
            if (cs->epoch >= s->epoch) {
                if (cs->epoch != s->epoch || cs->nreplicas != s->nreplicas ||
                    memcmp(&cs->master, &s->master, sizeof(cs->master)) != 0 ||
                    memcmp(cs->replicas, s->replicas,
                           sizeof(cs->replicas[0]) * (size_t)cs->nreplicas) != 0) {
                    int nslots = s->nslots;
                    *s = *cs;
                    s->nslots = nslots;
                    meta = 1;
                }
            }
            map[c] = k;
        } else if (cs->master.health != SLOTMAP_FAILED && cur->nshards < SLOTMAP_MAX_SHARDS) {
            k = cur->nshards++;
            cur->shards[k] = *cs;
            cur->shards[k].nslots = 0;
            map[c] = k;
        }
    }
    /* 2. Slots: to the candidate's owner when none is known or its epoch is
     *    higher than the current owner's. */
    for (int slot = 0; slot < CLUSTER_SLOTS; slot++) {
        int c = cand->owner[slot];
        if (c < 0 || map[c] < 0) {
            continue;
        }
        int k = map[c], o = cur->owner[slot];
        if (o == k || cand->shards[c].master.health == SLOTMAP_FAILED) {
            continue;
        }
        if (o < 0 || cand->shards[c].epoch > cur->shards[o].epoch) {
            cur->owner[slot] = (int16_t)k;
            moved++;
        }
    }
    /* 3. Count, and drop the shards left without slots. */
    int remap[SLOTMAP_MAX_SHARDS];
    for (int k = 0; k < cur->nshards; k++) {
        cur->shards[k].nslots = 0;
    }
    for (int slot = 0; slot < CLUSTER_SLOTS; slot++) {
        if (cur->owner[slot] >= 0) {
            cur->shards[cur->owner[slot]].nslots++;
        }
    }
    int kept = 0;
    for (int k = 0; k < cur->nshards; k++) {
        if (cur->shards[k].nslots == 0) {
            remap[k] = -1;
            continue;
        }
        remap[k] = kept;
        if (kept != k) {
            cur->shards[kept] = cur->shards[k];
        }
        kept++;
    }
    cur->nshards = kept;
    for (int slot = 0; slot < CLUSTER_SLOTS; slot++) {
        if (cur->owner[slot] >= 0) {
            cur->owner[slot] = (int16_t)remap[cur->owner[slot]];
        }
    }
    /* A shard that lost its last slot lost it to a move; one appended
     * without winning a slot was never there. */
    if (changed != NULL) {
        *changed = moved > 0 || meta;
    }
    return moved;
}
