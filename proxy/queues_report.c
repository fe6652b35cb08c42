/* queues_report.c - ferry --queues (see queues_report.h). The master is
 * redis.address, or the one the first answering sentinel names (SENTINEL
 * GET-MASTER-ADDR-BY-NAME). Per entry of queues:, the keys its globs match
 * (SCAN MATCH, at most MAX_KEYS per glob) that are lists, each with its
 * length and, with leases, its processing list's length, its open leases
 * and its dead letter's length; then the consumers paused now. */
#include "queues_report.h"

#include <hiredis/hiredis.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>

#include "buf.h"
#include "lease.h"

#define MAX_KEYS 10000 /* keys listed per glob */
#define TIMEOUT_S 2

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

int queues_report(const config *cfg, FILE *out, char *err, size_t errlen)
{
    redisContext *c = master(cfg, err, errlen);
    if (c == NULL) {
        return -1;
    }
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
            char cursor[32] = "0";
            size_t seen = 0;
            do {
                redisReply *r = redisCommand(c, "SCAN %s MATCH %s COUNT 1000", cursor, q->keys[g]);
                if (r == NULL || r->type != REDIS_REPLY_ARRAY || r->elements != 2) {
                    snprintf(err, errlen, "SCAN failed: %s",
                             r != NULL && r->type == REDIS_REPLY_ERROR ? r->str : c->errstr);
                    if (r != NULL) {
                        freeReplyObject(r);
                    }
                    redisFree(c);
                    return -1;
                }
                snprintf(cursor, sizeof(cursor), "%s", r->element[0]->str);
                for (size_t k = 0; k < r->element[1]->elements && seen < MAX_KEYS; k++, seen++) {
                    const redisReply *key = r->element[1]->element[k];
                    one_key(c, q, key->str, key->len, out);
                }
                freeReplyObject(r);
            } while (strcmp(cursor, "0") != 0 && seen < MAX_KEYS);
        }
    }
    redisReply *p =
        redisCommand(c, "EVAL %s 1 ferry:consumers:paused",
                     "local t = redis.call('TIME') "
                     "local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) "
                     "local r = redis.call('ZRANGEBYSCORE', KEYS[1], now, '+inf', 'WITHSCORES') "
                     "for i = 2, #r, 2 do r[i] = tostring(tonumber(r[i]) - now) end "
                     "return r");
    fprintf(out, "consumers paused:");
    for (size_t i = 0; p != NULL && p->type == REDIS_REPLY_ARRAY && i + 1 < p->elements; i += 2) {
        fprintf(out, " %s (%s ms left)", p->element[i]->str, p->element[i + 1]->str);
    }
    fputc('\n', out);
    if (p != NULL) {
        freeReplyObject(p);
    }
    redisFree(c);
    return 0;
}
