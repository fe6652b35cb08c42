/* queues_report.c - ferry --queues (see queues_report.h). The master is
 * redis.address, or the one the first answering sentinel names (SENTINEL
 * GET-MASTER-ADDR-BY-NAME). Per entry of queues:, the keys its globs match
 * (SCAN MATCH, at most MAX_KEYS per glob) that are lists, each with its
 * length and, with leases, its processing list's length, its open leases
 * and its dead letter's length; then the consumers paused now.
 *
 * Cluster mode: the masters CLUSTER SLOTS names on the first seed node that
 * answers; each glob is scanned on every master, and each key's figures are
 * read where SCAN found it (a lease's keys are in its queue's slot); the
 * paused consumers from the master serving their key. */
#include "queues_report.h"

#include <hiredis/hiredis.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>

#include "buf.h"
#include "lease.h"

#define MAX_KEYS 10000 /* keys listed per glob */
#define TIMEOUT_S 2
#define MAX_MASTERS 64

static redisContext *connect_to(const config_addr *a)
{
    struct timeval tv = {TIMEOUT_S, 0};
    redisContext *c = a->is_unix ? redisConnectUnixWithTimeout(a->path, tv)
                                 : redisConnectWithTimeout(a->host, a->port, tv);
    if (c != NULL && c->err == 0) {
        redisSetTimeout(c, tv);
    }
    return c;
}

static int auth(redisContext *c, const char *user, const char *pass)
{
    if (pass == NULL) {
        return 0;
    }
    redisReply *r =
        user != NULL ? redisCommand(c, "AUTH %s %s", user, pass) : redisCommand(c, "AUTH %s", pass);
    int ok = r != NULL && r->type == REDIS_REPLY_STATUS;
    if (r != NULL) {
        freeReplyObject(r);
    }
    return ok ? 0 : -1;
}

/* The master: connected and authenticated, or NULL with err set. */
static redisContext *master(const config *cfg, char *err, size_t errlen)
{
    config_addr a;
    if (!cfg->has_sentinel) {
        a = cfg->redis_addr;
    } else {
        int found = 0;
        for (int i = 0; i < cfg->nsentinels && !found; i++) {
            redisContext *s = connect_to(&cfg->sentinels[i]);
            if (s == NULL || s->err != 0 ||
                auth(s, cfg->sentinel_username, cfg->sentinel_password) != 0) {
                if (s != NULL) {
                    redisFree(s);
                }
                continue;
            }
            redisReply *r =
                redisCommand(s, "SENTINEL GET-MASTER-ADDR-BY-NAME %s", cfg->sentinel_master);
            if (r != NULL && r->type == REDIS_REPLY_ARRAY && r->elements == 2 &&
                r->element[0]->type == REDIS_REPLY_STRING) {
                memset(&a, 0, sizeof(a));
                snprintf(a.host, sizeof(a.host), "%s", r->element[0]->str);
                a.port = atoi(r->element[1]->str);
                found = 1;
            }
            if (r != NULL) {
                freeReplyObject(r);
            }
            redisFree(s);
        }
        if (!found) {
            snprintf(err, errlen, "no sentinel named a master '%s'", cfg->sentinel_master);
            return NULL;
        }
    }
    redisContext *c = connect_to(&a);
    if (c == NULL || c->err != 0) {
        char where[300];
        snprintf(err, errlen, "cannot connect to the master %s: %s",
                 config_addr_str(&a, where, sizeof(where)), c != NULL ? c->errstr : "no memory");
        if (c != NULL) {
            redisFree(c);
        }
        return NULL;
    }
    if (auth(c, cfg->redis_username, cfg->redis_password) != 0) {
        snprintf(err, errlen, "the master refused redis.username/redis.password");
        redisFree(c);
        return NULL;
    }
    return c;
}

static long long integer(redisContext *c, const char *fmt, const char *key, size_t klen)
{
    redisReply *r = redisCommand(c, fmt, key, klen);
    long long v = r != NULL && r->type == REDIS_REPLY_INTEGER ? r->integer : -1;
    if (r != NULL) {
        freeReplyObject(r);
    }
    return v;
}

/* template with {key} replaced by key. */
static void apply(const char *tpl, const char *key, size_t klen, char *out, size_t cap)
{
    const char *at = strstr(tpl, "{key}");
    snprintf(out, cap, "%.*s%.*s%s", (int)(at - tpl), tpl, (int)klen, key, at + 5);
}

static void one_key(redisContext *c, const config_queue *q, const char *key, size_t klen, FILE *out)
{
    redisReply *t = redisCommand(c, "TYPE %b", key, klen);
    int is_list = t != NULL && t->type == REDIS_REPLY_STATUS && strcmp(t->str, "list") == 0;
    if (t != NULL) {
        freeReplyObject(t);
    }
    if (!is_list) {
        return;
    }
    fprintf(out, "  %.*s length=%lld", (int)klen, key, integer(c, "LLEN %b", key, klen));
    if (q->processing != NULL) {
        char proc[1024], dead[1024];
        buf leases;
        buf_init(&leases);
        apply(q->processing, key, klen, proc, sizeof(proc));
        apply(q->dead_letter, key, klen, dead, sizeof(dead));
        lease_key(&leases, "leases", key, klen, proc, strlen(proc));
        fprintf(out, " processing=%lld leases_open=%lld dead=%lld",
                integer(c, "LLEN %b", proc, strlen(proc)),
                integer(c, "ZCARD %b", buf_head(&leases), buf_used(&leases)),
                integer(c, "LLEN %b", dead, strlen(dead)));
        buf_free(&leases);
    }
    fputc('\n', out);
}

/* The report of every queues entry, with the keys found on the n masters cs. */
static int report(redisContext **cs, int n, const config *cfg, FILE *out, char *err, size_t errlen)
{
    for (int i = 0; i < cfg->nqueues; i++) {
        const config_queue *q = &cfg->queues[i];
        fprintf(out, "queues[%d] keys=", i);
        for (int g = 0; g < q->nkeys; g++) {
            fprintf(out, "%s%s", g > 0 ? "," : "", q->keys[g]);
        }
        fprintf(out, " max_length=%llu on_full=%s", (unsigned long long)q->max_length,
                q->on_full == ON_FULL_BLOCK ? "block" : "refuse");
        if (q->processing != NULL) {
            fprintf(out, " processing=%s lease_ms=%llu max_attempts=%llu dead_letter=%s",
                    q->processing, (unsigned long long)q->lease_ms,
                    (unsigned long long)q->max_attempts, q->dead_letter);
        }
        fputc('\n', out);
        for (int g = 0; g < q->nkeys; g++) {
            size_t seen = 0;
            for (int m = 0; m < n && seen < MAX_KEYS; m++) {
                redisContext *c = cs[m];
                char cursor[32] = "0";
                do {
                    redisReply *r =
                        redisCommand(c, "SCAN %s MATCH %s COUNT 1000", cursor, q->keys[g]);
                    if (r == NULL || r->type != REDIS_REPLY_ARRAY || r->elements != 2) {
                        snprintf(err, errlen, "SCAN failed: %s",
                                 r != NULL && r->type == REDIS_REPLY_ERROR ? r->str : c->errstr);
                        if (r != NULL) {
                            freeReplyObject(r);
                        }
                        return -1;
                    }
                    snprintf(cursor, sizeof(cursor), "%s", r->element[0]->str);
                    for (size_t k = 0; k < r->element[1]->elements && seen < MAX_KEYS;
                         k++, seen++) {
                        const redisReply *key = r->element[1]->element[k];
                        one_key(c, q, key->str, key->len, out);
                    }
                    freeReplyObject(r);
                } while (strcmp(cursor, "0") != 0 && seen < MAX_KEYS);
            }
        }
    }
    /* The paused set: from the master serving its key (others answer MOVED). */
    redisReply *p = NULL;
    for (int m = 0; m < n && (p == NULL || p->type != REDIS_REPLY_ARRAY); m++) {
        if (p != NULL) {
            freeReplyObject(p);
        }
        p = redisCommand(cs[m], "EVAL %s 1 ferry:consumers:paused",
                         "local t = redis.call('TIME') "
                         "local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) "
                         "local r = redis.call('ZRANGEBYSCORE', KEYS[1], now, '+inf', "
                         "'WITHSCORES') "
                         "for i = 2, #r, 2 do r[i] = tostring(tonumber(r[i]) - now) end "
                         "return r");
    }
    fprintf(out, "consumers paused:");
    for (size_t i = 0; p != NULL && p->type == REDIS_REPLY_ARRAY && i + 1 < p->elements; i += 2) {
        fprintf(out, " %s (%s ms left)", p->element[i]->str, p->element[i + 1]->str);
    }
    fputc('\n', out);
    if (p != NULL) {
        freeReplyObject(p);
    }
    return 0;
}

/* Cluster mode: a connection to each master CLUSTER SLOTS names on the
 * first seed node that answers; returns how many (0: err is set). */
static int cluster_masters(const config *cfg, redisContext **cs, char *err, size_t errlen)
{
    int n = 0;
    snprintf(err, errlen, "no node of cluster.nodes answered CLUSTER SLOTS");
    for (int i = 0; i < cfg->ncluster_nodes && n == 0; i++) {
        redisContext *seed = connect_to(&cfg->cluster_nodes[i]);
        redisReply *r = NULL;
        if (seed != NULL && seed->err == 0 &&
            auth(seed, cfg->redis_username, cfg->redis_password) == 0) {
            r = redisCommand(seed, "CLUSTER SLOTS");
        }
        for (size_t j = 0; r != NULL && r->type == REDIS_REPLY_ARRAY && j < r->elements; j++) {
            const redisReply *range = r->element[j];
            if (range->type != REDIS_REPLY_ARRAY || range->elements < 3 ||
                range->element[2]->type != REDIS_REPLY_ARRAY || range->element[2]->elements < 2 ||
                range->element[2]->element[0]->type != REDIS_REPLY_STRING ||
                range->element[2]->element[1]->type != REDIS_REPLY_INTEGER) {
                continue;
            }
            config_addr a;
            memset(&a, 0, sizeof(a));
            snprintf(a.host, sizeof(a.host), "%s", range->element[2]->element[0]->str);
            if (a.host[0] == '\0') {
                snprintf(a.host, sizeof(a.host), "%s", cfg->cluster_nodes[i].host);
            }
            a.port = (int)range->element[2]->element[1]->integer;
            int dup = 0;
            for (int k = 0; k < n; k++) {
                dup |= strcmp(cs[k]->tcp.host, a.host) == 0 && cs[k]->tcp.port == a.port;
            }
            if (dup || n == MAX_MASTERS) {
                continue;
            }
            redisContext *c = connect_to(&a);
            if (c == NULL || c->err != 0 ||
                auth(c, cfg->redis_username, cfg->redis_password) != 0) {
                snprintf(err, errlen, "cannot use the master %s:%d: %s", a.host, a.port,
                         c != NULL && c->err != 0 ? c->errstr : "refused redis.password");
                if (c != NULL) {
                    redisFree(c);
                }
                for (int k = 0; k < n; k++) {
                    redisFree(cs[k]);
                }
                n = 0;
                break;
            }
            cs[n++] = c;
        }
        if (r != NULL) {
            freeReplyObject(r);
        }
        if (seed != NULL) {
            redisFree(seed);
        }
    }
    return n;
}

int queues_report(const config *cfg, FILE *out, char *err, size_t errlen)
{
    redisContext *cs[MAX_MASTERS];
    int n = 0;
    if (cfg->has_cluster) {
        n = cluster_masters(cfg, cs, err, errlen);
    } else if ((cs[0] = master(cfg, err, errlen)) != NULL) {
        n = 1;
    }
    if (n == 0) {
        return -1;
    }
    int rc = report(cs, n, cfg, out, err, errlen);
    for (int i = 0; i < n; i++) {
        redisFree(cs[i]);
    }
    return rc;
}
