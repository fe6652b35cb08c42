/* test_cluster.c - unit tests for cluster/: the key slot (CRC16 with hash
 * tags, against values a Redis 7.0 node gave for CLUSTER KEYSLOT), parsing
 * CLUSTER SHARDS / SLOTS / NODES replies (nonsense gives an error, never a
 * crash or a half map) and the epoch rule of slotmap_merge. */

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <uv.h>

#include "cluster.h"
#include "config.h"
#include "slot.h"
#include "slotmap.h"

/* ==== building replies ==== */

typedef struct rb {
    char s[65536];
    size_t n;
} rb;

static void rb_put(rb *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void rb_put(rb *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(b->s + b->n, sizeof(b->s) - b->n, fmt, ap);
    va_end(ap);
    assert_true(k >= 0 && (size_t)k < sizeof(b->s) - b->n);
    b->n += (size_t)k;
}

static void rb_bulk(rb *b, const char *v)
{
    rb_put(b, "$%zu\r\n%s\r\n", strlen(v), v);
}

/* RESP text -> a reply (freeReplyObject it). */
static redisReply *parse(const char *p, size_t n)
{
    redisReader *rd = redisReaderCreate();
    void *reply = NULL;
    assert_non_null(rd);
    assert_int_equal(redisReaderFeed(rd, p, n), REDIS_OK);
    assert_int_equal(redisReaderGetReply(rd, &reply), REDIS_OK);
    assert_non_null(reply);
    redisReaderFree(rd);
    return reply;
}

static redisReply *parse_str(const char *p)
{
    return parse(p, strlen(p));
}

#define ID(c) (c c c c c c c c c c c c c c c c c c c c c c c c c c c c c c c c c c c c c c c c)
static const char *ids[] = {ID("a"), ID("b"), ID("c"), ID("d"), ID("e"), ID("f"), ID("1")};

/* A SHARDS node: [id, port, ip, endpoint, role, replication-offset, health]. */
static void shards_node(rb *b, int id, int port, const char *role, const char *health)
{
    rb_put(b, "*14\r\n");
    rb_bulk(b, "id");
    rb_bulk(b, ids[id]);
    rb_bulk(b, "port");
    rb_put(b, ":%d\r\n", port);
    rb_bulk(b, "ip");
    rb_bulk(b, "127.0.0.1");
    rb_bulk(b, "endpoint");
    rb_bulk(b, "127.0.0.1");
    rb_bulk(b, "role");
    rb_bulk(b, role);
    rb_bulk(b, "replication-offset");
    rb_put(b, ":%d\r\n", 42);
    rb_bulk(b, "health");
    rb_bulk(b, health);
}

/* The reply of a 3 + 3 cluster as redis-cli makes it: 0-5460 on node 0
 * (replica 3), 5461-10922 on node 1 (replica 4), 10923-16383 on node 2
 * (replica 5); ports 7000 + id. */
static void three_shards_bytes(rb *b)
{
    static const int lo[] = {0, 5461, 10923}, hi[] = {5460, 10922, 16383};
    rb_put(b, "*3\r\n");
    for (int i = 0; i < 3; i++) {
        rb_put(b, "*4\r\n");
        rb_bulk(b, "slots");
        rb_put(b, "*2\r\n:%d\r\n:%d\r\n", lo[i], hi[i]);
        rb_bulk(b, "nodes");
        rb_put(b, "*2\r\n");
        shards_node(b, i, 7000 + i, "master", "online");
        shards_node(b, i + 3, 7003 + i, "replica", "online");
    }
}

static redisReply *three_shards(void)
{
    rb b = {.n = 0};
    three_shards_bytes(&b);
    return parse(b.s, b.n);
}

/* CLUSTER NODES text for the same cluster, masters at epochs e0, e1, e2,
 * seen by node `me`; `fail` flags one node failed (-1: none). */
static void nodes_text(char *out, size_t cap, int me, uint64_t e0, uint64_t e1, uint64_t e2,
                       int failed)
{
    static const char *slots[] = {"0-5460", "5461-10922", "10923-16383"};
    uint64_t ep[3] = {e0, e1, e2};
    size_t n = 0;
    for (int i = 0; i < 6; i++) {
        char flags[64];
        snprintf(flags, sizeof(flags), "%s%s%s", i == me ? "myself," : "",
                 i < 3 ? "master" : "slave", i == failed ? ",fail" : "");
        n += (size_t)snprintf(out + n, cap - n, "%s 127.0.0.1:%d@%d %s %s 0 0 %llu connected%s%s\n",
                              ids[i], 7000 + i, 17000 + i, flags, i < 3 ? "-" : ids[i - 3],
                              (unsigned long long)ep[i % 3], i < 3 ? " " : "",
                              i < 3 ? slots[i] : "");
    }
}

/* ==== slot ==== */

static void test_crc16_and_keyslot_vectors(void **state)
{
    (void)state;
    /* The check value of CRC16-XMODEM (the cluster specification's too). */
    assert_int_equal(slot_crc16("123456789", 9), 0x31C3);
    /* What `CLUSTER KEYSLOT` answered on a Redis 7.0.15 cluster node. */
    static const struct {
        const char *key;
        int slot;
    } v[] = {{"foo", 12182},
             {"bar", 5061},
             {"hello", 866},
             {"123456789", 12739},
             {"{user1000}.following", 3443},
             {"user1000", 3443},
             {"foo{}{bar}", 8363},    /* empty first tag: the whole key */
             {"foo{{bar}}zap", 4015}, /* tag "{bar" */
             {"{bar", 4015},
             {"foo{bar}{zap}", 5061}, /* the first tag only */
             {"", 0},
             {"{}", 15257},
             {"a{b", 13340}, /* no closing brace */
             {"a}b{c}", 7365},
             {"{a}", 15495},
             {"ab{", 3823}};
    for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++) {
        int got = slot_of_key(v[i].key, strlen(v[i].key));
        if (got != v[i].slot) {
            fail_msg("slot of '%s': %d, Redis says %d", v[i].key, got, v[i].slot);
        }
    }
    /* binary safe: a NUL inside the key counts */
    assert_int_equal(slot_of_key("\x00\xff\x80", 3), 4727);
    assert_int_not_equal(slot_of_key("a\0b", 3), slot_of_key("a", 1));
}

/* A key of each slot ("{N}", N the smallest number hashing there: a
 * cluster transaction's receipt lies in its slot): every slot has one,
 * and it is that slot's; out of range or no room: -1. */
static void test_slot_tag_key(void **state)
{
    (void)state;
    char k[16];
    for (int slot = 0; slot < CLUSTER_SLOTS; slot++) {
        int n = slot_tag_key(slot, k, sizeof(k));
        if (n <= 2 || k[0] != '{' || k[n - 1] != '}' || slot_of_key(k, (size_t)n) != slot) {
            fail_msg("slot %d: '%s' (%d)", slot, k, n);
        }
    }
    assert_int_equal(slot_tag_key(0, k, sizeof(k)), 6);
    assert_string_equal(k, "{3560}"); /* CLUSTER KEYSLOT 3560 = 0 */
    assert_int_equal(slot_tag_key(-1, k, sizeof(k)), -1);
    assert_int_equal(slot_tag_key(CLUSTER_SLOTS, k, sizeof(k)), -1);
    assert_int_equal(slot_tag_key(0, k, 4), -1);
}

/* ==== CLUSTER SHARDS ==== */

static void test_shards_parse(void **state)
{
    (void)state;
    slotmap *m = malloc(sizeof(*m));
    char err[200] = "";
    redisReply *r = three_shards();
    assert_int_equal(slotmap_from_shards(m, r, 0, err, sizeof(err)), 0);
    assert_int_equal(m->nshards, 3);
    assert_int_equal(slotmap_covered(m), CLUSTER_SLOTS);
    const slotmap_shard *s = slotmap_shard_of(m, 5461);
    assert_non_null(s);
    assert_string_equal(s->master.id, ids[1]);
    assert_string_equal(s->master.host, "127.0.0.1");
    assert_int_equal(s->master.port, 7001);
    assert_int_equal(s->nreplicas, 1);
    assert_int_equal(s->replicas[0].port, 7004);
    assert_int_equal(s->nslots, 10922 - 5461 + 1);
    assert_int_equal(slotmap_shard_of(m, 16383)->master.port, 7002);
    assert_int_equal(slotmap_shard_of(m, 0)->master.port, 7000);
    assert_null(slotmap_shard_of(m, 16384));
    assert_null(slotmap_shard_of(m, -1));
    freeReplyObject(r);
    free(m);
}

/* One shard of slots 0-16383 whose master (ids[0]) lists port (if > 0)
 * and tls-port (if > 0), as Redis does with tls-cluster yes. */
static redisReply *tls_shard(int port, int tls_port)
{
    rb b = {.n = 0};
    rb_put(&b, "*1\r\n*4\r\n");
    rb_bulk(&b, "slots");
    rb_put(&b, "*2\r\n:0\r\n:16383\r\n");
    rb_bulk(&b, "nodes");
    rb_put(&b, "*1\r\n*%d\r\n", 8 + (port > 0 ? 2 : 0) + (tls_port > 0 ? 2 : 0));
    rb_bulk(&b, "id");
    rb_bulk(&b, ids[0]);
    if (port > 0) {
        rb_bulk(&b, "port");
        rb_put(&b, ":%d\r\n", port);
    }
    if (tls_port > 0) {
        rb_bulk(&b, "tls-port");
        rb_put(&b, ":%d\r\n", tls_port);
    }
    rb_bulk(&b, "ip");
    rb_bulk(&b, "127.0.0.1");
    rb_bulk(&b, "endpoint");
    rb_bulk(&b, "127.0.0.1");
    rb_bulk(&b, "role");
    rb_bulk(&b, "master");
    return parse(b.s, b.n);
}

/* Over TLS a node's tls-port is the one to reach it on; a TLS-only node
 * (port 0) lists no "port"; plain TCP takes "port", and a node with a TLS
 * port only is refused with a word on redis.tls. */
static void test_shards_tls_ports(void **state)
{
    (void)state;
    slotmap *m = malloc(sizeof(*m));
    char err[200] = "";
    redisReply *both = tls_shard(7000, 8000), *tls_only = tls_shard(0, 8000);
    redisReply *plain = tls_shard(7000, 0);
    assert_int_equal(slotmap_from_shards(m, both, 1, err, sizeof(err)), 0);
    assert_int_equal(slotmap_shard_of(m, 0)->master.port, 8000);
    assert_int_equal(slotmap_from_shards(m, both, 0, err, sizeof(err)), 0);
    assert_int_equal(slotmap_shard_of(m, 0)->master.port, 7000);
    assert_int_equal(slotmap_from_shards(m, tls_only, 1, err, sizeof(err)), 0);
    assert_int_equal(slotmap_shard_of(m, 16383)->master.port, 8000);
    assert_int_equal(slotmap_from_shards(m, plain, 1, err, sizeof(err)), 0);
    assert_int_equal(slotmap_shard_of(m, 0)->master.port, 7000);
    assert_int_equal(slotmap_from_shards(m, tls_only, 0, err, sizeof(err)), -1);
    assert_non_null(strstr(err, "redis.tls"));
    assert_int_equal(m->nshards, 0);
    freeReplyObject(both);
    freeReplyObject(tls_only);
    freeReplyObject(plain);
    free(m);
}

/* A shard whose master is failed (a replica not promoted yet) says nothing
 * about its slots; "?" as endpoint falls back to the ip. */
static void test_shards_failed_master_and_unknown_endpoint(void **state)
{
    (void)state;
    slotmap *m = malloc(sizeof(*m));
    char err[200] = "";
    rb b = {.n = 0};
    rb_put(&b, "*2\r\n");
    rb_put(&b, "*4\r\n");
    rb_bulk(&b, "slots");
    rb_put(&b, "*2\r\n:0\r\n:99\r\n");
    rb_bulk(&b, "nodes");
    rb_put(&b, "*2\r\n");
    shards_node(&b, 0, 7000, "master", "failed");
    shards_node(&b, 3, 7003, "replica", "online");
    rb_put(&b, "*4\r\n");
    rb_bulk(&b, "slots");
    rb_put(&b, "*4\r\n:100\r\n:199\r\n:300\r\n:300\r\n");
    rb_bulk(&b, "nodes");
    rb_put(&b, "*1\r\n*10\r\n");
    rb_bulk(&b, "id");
    rb_bulk(&b, ids[1]);
    rb_bulk(&b, "port");
    rb_put(&b, ":7001\r\n");
    rb_bulk(&b, "ip");
    rb_bulk(&b, "10.0.0.1");
    rb_bulk(&b, "endpoint");
    rb_bulk(&b, "?");
    rb_bulk(&b, "role");
    rb_bulk(&b, "master");
    redisReply *r = parse(b.s, b.n);
    assert_int_equal(slotmap_from_shards(m, r, 0, err, sizeof(err)), 0);
    assert_int_equal(m->nshards, 1);
    assert_null(slotmap_shard_of(m, 0));
    assert_string_equal(slotmap_shard_of(m, 150)->master.host, "10.0.0.1");
    assert_int_equal(slotmap_shard_of(m, 300)->master.port, 7001);
    assert_null(slotmap_shard_of(m, 250));
    assert_int_equal(slotmap_covered(m), 101);
    freeReplyObject(r);
    free(m);
}

/* A master whose health is "fail" (what Redis 7.0.15 sends), "failed" (what
 * its documentation says) or an unknown word is not used. */
static void test_shards_health_words(void **state)
{
    (void)state;
    static const char *words[] = {"fail", "failed", "meh"};
    slotmap *m = malloc(sizeof(*m));
    for (size_t i = 0; i < 3; i++) {
        rb b = {.n = 0};
        char err[200] = "";
        rb_put(&b, "*1\r\n*4\r\n");
        rb_bulk(&b, "slots");
        rb_put(&b, "*2\r\n:0\r\n:10\r\n");
        rb_bulk(&b, "nodes");
        rb_put(&b, "*2\r\n");
        shards_node(&b, 0, 7000, "master", words[i]);
        shards_node(&b, 3, 7003, "replica", "online");
        redisReply *r = parse(b.s, b.n);
        assert_int_equal(slotmap_from_shards(m, r, 0, err, sizeof(err)), 0);
        assert_int_equal(m->nshards, 0);
        assert_int_equal(slotmap_covered(m), 0);
        freeReplyObject(r);
    }
    free(m);
}

/* Nonsense: each gives -1, a message and an empty map, never a crash. */
static void test_shards_nonsense(void **state)
{
    (void)state;
    static const char *cases[] = {
        ":1\r\n",                                           /* not a list */
        "-ERR unknown subcommand 'shards'\r\n",             /* an error */
        "$5\r\nhello\r\n",                                  /* a string */
        "*1\r\n:7\r\n",                                     /* a shard that is a number */
        "*1\r\n*3\r\n$5\r\nslots\r\n*0\r\n$5\r\nnodes\r\n", /* odd fields */
        "*1\r\n*2\r\n$5\r\nnodes\r\n*0\r\n",                /* no slots */
        "*1\r\n*2\r\n$5\r\nslots\r\n*0\r\n",                /* no nodes */
        "*1\r\n*4\r\n$5\r\nslots\r\n*1\r\n:0\r\n$5\r\nnodes\r\n*0\r\n", /* odd range */
        "*1\r\n*4\r\n$5\r\nslots\r\n*2\r\n:0\r\n:16384\r\n$5\r\nnodes\r\n*0\r\n",
        "*1\r\n*4\r\n$5\r\nslots\r\n*2\r\n:-1\r\n:5\r\n$5\r\nnodes\r\n*0\r\n",
        "*1\r\n*4\r\n$5\r\nslots\r\n*2\r\n:9\r\n:5\r\n$5\r\nnodes\r\n*0\r\n",
        "*1\r\n*4\r\n$5\r\nslots\r\n*2\r\n$1\r\nx\r\n:5\r\n$5\r\nnodes\r\n*0\r\n",
        "*1\r\n*4\r\n$5\r\nslots\r\n:3\r\n$5\r\nnodes\r\n*0\r\n",        /* slots a number */
        "*1\r\n*4\r\n$5\r\nslots\r\n*0\r\n$5\r\nnodes\r\n$1\r\nx\r\n",   /* nodes a string */
        "*1\r\n*4\r\n$5\r\nslots\r\n*0\r\n$5\r\nnodes\r\n*1\r\n*-1\r\n", /* a nil node */
        "*1\r\n*4\r\n$5\r\nslots\r\n*0\r\n$5\r\nnodes\r\n*1\r\n*2\r\n$2\r\nid\r\n$3\r\nabc\r\n",
        "*2\r\n*-1\r\n*-1\r\n", /* nil shards */
    };
    slotmap *m = malloc(sizeof(*m));
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char err[200] = "";
        redisReply *r = parse_str(cases[i]);
        if (slotmap_from_shards(m, r, 0, err, sizeof(err)) != -1) {
            fail_msg("case %zu accepted", i);
        }
        if (err[0] == '\0') {
            fail_msg("case %zu: no message", i);
        }
        assert_int_equal(m->nshards, 0);
        assert_int_equal(slotmap_covered(m), 0);
        freeReplyObject(r);
    }
    /* NULL reply */
    char err[200] = "";
    assert_int_equal(slotmap_from_shards(m, NULL, 0, err, sizeof(err)), -1);
    free(m);
}

/* Node-level nonsense inside an otherwise good reply. */
static void test_shards_bad_nodes(void **state)
{
    (void)state;
    static const char *const variants[][2] = {
        {"port", ":70000\r\n"},  {"port", "$2\r\nxx\r\n"}, {"role", "$4\r\nboss\r\n"},
        {"id", "$3\r\nabc\r\n"}, {"ip", ":1\r\n"},
    };
    slotmap *m = malloc(sizeof(*m));
    for (size_t v = 0; v < sizeof(variants) / sizeof(variants[0]); v++) {
        rb b = {.n = 0};
        char err[200] = "";
        int nf = 0;
        const char *keys[] = {"id", "port", "ip", "role", "health"};
        const char *vals[] = {NULL, ":7000\r\n", "$9\r\n127.0.0.1\r\n", "$6\r\nmaster\r\n",
                              "$6\r\nonline\r\n"};
        char idval[64];
        snprintf(idval, sizeof(idval), "$40\r\n%s\r\n", ids[0]);
        vals[0] = idval;
        rb_put(&b, "*1\r\n*4\r\n$5\r\nslots\r\n*2\r\n:0\r\n:10\r\n$5\r\nnodes\r\n*1\r\n*10\r\n");
        for (int k = 0; k < 5; k++) {
            rb_bulk(&b, keys[k]);
            rb_put(&b, "%s", strcmp(keys[k], variants[v][0]) == 0 ? variants[v][1] : vals[k]);
            nf++;
        }
        redisReply *r = parse(b.s, b.n);
        if (slotmap_from_shards(m, r, 0, err, sizeof(err)) != -1 || err[0] == '\0') {
            fail_msg("variant %zu (%s) accepted", v, variants[v][0]);
        }
        assert_int_equal(slotmap_covered(m), 0);
        freeReplyObject(r);
    }
    free(m);
}

/* One master heading two shards (with different replicas): nonsense, or
 * merging the same answer twice would flip its replicas each time. */
static void test_shards_master_twice(void **state)
{
    (void)state;
    slotmap *m = malloc(sizeof(*m));
    rb b = {.n = 0};
    char err[200] = "";
    rb_put(&b, "*2\r\n");
    for (int i = 0; i < 2; i++) {
        rb_put(&b, "*4\r\n");
        rb_bulk(&b, "slots");
        rb_put(&b, "*2\r\n:%d\r\n:%d\r\n", i * 100, i * 100 + 9);
        rb_bulk(&b, "nodes");
        rb_put(&b, "*2\r\n");
        shards_node(&b, 0, 7000, "master", "online");
        shards_node(&b, 3 + i, 7003 + i, "replica", "online");
    }
    redisReply *r = parse(b.s, b.n);
    assert_int_equal(slotmap_from_shards(m, r, 0, err, sizeof(err)), -1);
    assert_non_null(strstr(err, "heads two shards"));
    assert_int_equal(slotmap_covered(m), 0);
    freeReplyObject(r);
    free(m);
}

/* Two shards claiming one slot, two live masters in one shard. */
static void test_shards_conflicts(void **state)
{
    (void)state;
    slotmap *m = malloc(sizeof(*m));
    for (int variant = 0; variant < 2; variant++) {
        rb b = {.n = 0};
        char err[200] = "";
        if (variant == 0) {
            rb_put(&b, "*2\r\n");
            for (int i = 0; i < 2; i++) {
                rb_put(&b, "*4\r\n");
                rb_bulk(&b, "slots");
                rb_put(&b, "*2\r\n:%d\r\n:%d\r\n", i * 10, 10 + i * 10);
                rb_bulk(&b, "nodes");
                rb_put(&b, "*1\r\n");
                shards_node(&b, i, 7000 + i, "master", "online");
            }
        } else {
            rb_put(&b, "*1\r\n*4\r\n");
            rb_bulk(&b, "slots");
            rb_put(&b, "*2\r\n:0\r\n:10\r\n");
            rb_bulk(&b, "nodes");
            rb_put(&b, "*2\r\n");
            shards_node(&b, 0, 7000, "master", "online");
            shards_node(&b, 1, 7001, "master", "online");
        }
        redisReply *r = parse(b.s, b.n);
        assert_int_equal(slotmap_from_shards(m, r, 0, err, sizeof(err)), -1);
        assert_true(strstr(err, variant == 0 ? "two masters" : "two live masters") != NULL);
        assert_int_equal(slotmap_covered(m), 0);
        freeReplyObject(r);
    }
    free(m);
}

/* ==== CLUSTER SLOTS ==== */

static void test_slots_parse_and_nonsense(void **state)
{
    (void)state;
    slotmap *m = malloc(sizeof(*m));
    char err[200] = "";
    rb b = {.n = 0};
    /* two ranges of one master, one range of another (with a replica) */
    rb_put(&b, "*3\r\n");
    rb_put(&b, "*3\r\n:0\r\n:99\r\n*3\r\n");
    rb_bulk(&b, "127.0.0.1");
    rb_put(&b, ":7000\r\n");
    rb_bulk(&b, ids[0]);
    rb_put(&b, "*4\r\n:100\r\n:16383\r\n*3\r\n");
    rb_bulk(&b, "127.0.0.1");
    rb_put(&b, ":7001\r\n");
    rb_bulk(&b, ids[1]);
    rb_put(&b, "*4\r\n");
    rb_bulk(&b, "127.0.0.1");
    rb_put(&b, ":7004\r\n");
    rb_bulk(&b, ids[4]);
    rb_put(&b, "*0\r\n");
    rb_put(&b, "*3\r\n:200\r\n:300\r\n*3\r\n");
    rb_bulk(&b, "127.0.0.1");
    rb_put(&b, ":7000\r\n");
    rb_bulk(&b, ids[0]);
    redisReply *r = parse(b.s, b.n);
    /* 200-300 is claimed by 7001 (100-16383) and 7000: an error */
    assert_int_equal(slotmap_from_slots(m, r, err, sizeof(err)), -1);
    assert_true(strstr(err, "two masters") != NULL);
    freeReplyObject(r);

    b.n = 0;
    rb_put(&b, "*2\r\n");
    rb_put(&b, "*3\r\n:0\r\n:99\r\n*3\r\n");
    rb_bulk(&b, "127.0.0.1");
    rb_put(&b, ":7000\r\n");
    rb_bulk(&b, ids[0]);
    rb_put(&b, "*4\r\n:100\r\n:16383\r\n*3\r\n");
    rb_bulk(&b, "127.0.0.1");
    rb_put(&b, ":7001\r\n");
    rb_bulk(&b, ids[1]);
    rb_put(&b, "*3\r\n");
    rb_bulk(&b, "127.0.0.1");
    rb_put(&b, ":7004\r\n");
    rb_bulk(&b, ids[4]);
    r = parse(b.s, b.n);
    assert_int_equal(slotmap_from_slots(m, r, err, sizeof(err)), 0);
    assert_int_equal(m->nshards, 2);
    assert_int_equal(slotmap_covered(m), CLUSTER_SLOTS);
    assert_int_equal(slotmap_shard_of(m, 99)->master.port, 7000);
    assert_int_equal(slotmap_shard_of(m, 100)->nreplicas, 1);
    assert_int_equal(slotmap_shard_of(m, 100)->replicas[0].port, 7004);
    freeReplyObject(r);

    static const char *cases[] = {
        ":1\r\n",
        "*1\r\n:1\r\n",
        "*1\r\n*2\r\n:0\r\n:1\r\n",
        "*1\r\n*3\r\n:0\r\n:16384\r\n*3\r\n$1\r\nx\r\n:1\r\n$1\r\ny\r\n",
        "*1\r\n*3\r\n:5\r\n:1\r\n*3\r\n$1\r\nx\r\n:1\r\n$1\r\ny\r\n",
        "*1\r\n*3\r\n:0\r\n:1\r\n*3\r\n$1\r\nx\r\n:1\r\n$1\r\ny\r\n", /* bad id */
        "*1\r\n*3\r\n:0\r\n:1\r\n*1\r\n$1\r\nx\r\n",                  /* short node */
        "*1\r\n*3\r\n:0\r\n:1\r\n:9\r\n",                             /* node a number */
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        err[0] = '\0';
        r = parse_str(cases[i]);
        if (slotmap_from_slots(m, r, err, sizeof(err)) != -1 || err[0] == '\0') {
            fail_msg("SLOTS case %zu accepted", i);
        }
        assert_int_equal(slotmap_covered(m), 0);
        freeReplyObject(r);
    }
    free(m);
}

/* ==== CLUSTER NODES ==== */

static void test_nodes_parse(void **state)
{
    (void)state;
    char text[4096];
    slotmap_nodeinfo ni[16];
    int n = 0;
    char err[200] = "";
    nodes_text(text, sizeof(text), 1, 1, 2, 3, 3);
    assert_int_equal(slotmap_nodes_parse(text, strlen(text), ni, 16, &n, err, sizeof(err)), 0);
    assert_int_equal(n, 6);
    assert_int_equal(ni[1].flags, SLOTMAP_F_MYSELF | SLOTMAP_F_MASTER);
    assert_int_equal(ni[2].epoch, 3);
    assert_int_equal(ni[3].flags, SLOTMAP_F_REPLICA | SLOTMAP_F_FAIL);
    assert_string_equal(ni[3].master_id, ids[0]);
    assert_int_equal(slotmap_nodes_parse(text, strlen(text), ni, 5, &n, err, sizeof(err)), -1);

    static const char *bad[] = {
        "",                                                    /* nobody is myself */
        "garbage\n",                                           /* too few fields */
        "xyz 127.0.0.1:1@2 myself,master - 0 0 1 connected\n", /* bad id */
        "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa 127.0.0.1:1@2 myself,master - 0 0 x connected\n",
        "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa 127.0.0.1:1@2 myself,master - 0 0 "
        "99999999999999999999999 connected\n",
        "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa 127.0.0.1:1@2 myself,master zz 0 0 1 connected\n",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        err[0] = '\0';
        if (slotmap_nodes_parse(bad[i], strlen(bad[i]), ni, 16, &n, err, sizeof(err)) != -1 ||
            err[0] == '\0') {
            fail_msg("NODES case %zu accepted", i);
        }
    }
    /* two myself lines */
    char two[4096];
    nodes_text(two, sizeof(two), 1, 1, 2, 3, -1);
    char *p = strstr(two, " master ");
    assert_non_null(p);
    memcpy(p, " myself", 7); /* line 0 now says "myself" as its flags */
    assert_int_equal(slotmap_nodes_parse(two, strlen(two), ni, 16, &n, err, sizeof(err)), -1);
}

/* ==== epochs and the merge ==== */

/* three_shards() with the epochs of nodes_text(). */
static slotmap *learned(uint64_t e0, uint64_t e1, uint64_t e2, int failed)
{
    slotmap *m = malloc(sizeof(*m));
    char text[4096], err[200] = "";
    slotmap_nodeinfo ni[16];
    int n = 0;
    redisReply *r = three_shards();
    assert_int_equal(slotmap_from_shards(m, r, 0, err, sizeof(err)), 0);
    freeReplyObject(r);
    nodes_text(text, sizeof(text), 0, e0, e1, e2, failed);
    assert_int_equal(slotmap_nodes_parse(text, strlen(text), ni, 16, &n, err, sizeof(err)), 0);
    assert_int_equal(slotmap_set_epochs(m, ni, n, err, sizeof(err)), 0);
    return m;
}

static void test_set_epochs(void **state)
{
    (void)state;
    slotmap *m = learned(4, 5, 6, 0);
    assert_int_equal(slotmap_shard_of(m, 0)->epoch, 4);
    assert_int_equal(slotmap_shard_of(m, 16383)->epoch, 6);
    assert_int_equal(slotmap_shard_of(m, 0)->master.health, SLOTMAP_FAILED);
    assert_int_equal(slotmap_shard_of(m, 6000)->master.health, SLOTMAP_ONLINE);
    /* a master NODES does not name: no epoch to weigh it by */
    slotmap_nodeinfo ni[1];
    memset(ni, 0, sizeof(ni));
    memcpy(ni[0].id, ids[6], SLOTMAP_ID_LEN);
    ni[0].flags = SLOTMAP_F_MYSELF | SLOTMAP_F_MASTER;
    char err[200] = "";
    assert_int_equal(slotmap_set_epochs(m, ni, 1, err, sizeof(err)), -1);
    assert_true(strstr(err, "does not name master") != NULL);
    free(m);
}

/* Move slots lo..hi of cand to shard `to` (an existing one). */
static void give(slotmap *m, int lo, int hi, int to)
{
    for (int s = lo; s <= hi; s++) {
        m->shards[m->owner[s]].nslots--;
        m->owner[s] = (int16_t)to;
        m->shards[to].nslots++;
    }
}

static void test_merge_epoch_rule(void **state)
{
    (void)state;
    slotmap *cur = malloc(sizeof(*cur));
    int changed = -1;
    slotmap_init(cur);

    /* into an empty map: everything is taken */
    slotmap *first = learned(1, 2, 3, -1);
    assert_int_equal(slotmap_merge(cur, first, &changed), CLUSTER_SLOTS);
    assert_int_equal(changed, 1);
    assert_int_equal(cur->nshards, 3);
    /* the same again: nothing changes */
    assert_int_equal(slotmap_merge(cur, first, &changed), 0);
    assert_int_equal(changed, 0);

    /* master 0 announced at a higher epoch (as after a failover or a
     * bump): the shard's epoch is refreshed, no slot moves */
    slotmap *newer = learned(7, 2, 3, -1);
    assert_int_equal(slotmap_merge(cur, newer, &changed), 0);
    assert_int_equal(changed, 1); /* the epoch changed */
    assert_int_equal(slotmap_shard_of(cur, 0)->epoch, 7);

    /* a minority node's old view (master 0 at epoch 1) claiming 0..99 for
     * master 1 (epoch 2 < 7): ignored */
    slotmap *stale = learned(1, 2, 3, -1);
    give(stale, 0, 99, 1);
    assert_int_equal(slotmap_merge(cur, stale, &changed), 0);
    assert_int_equal(changed, 0);
    assert_int_equal(slotmap_shard_of(cur, 0)->master.port, 7000);
    assert_int_equal(slotmap_shard_of(cur, 0)->epoch, 7);

    /* a reshard: 0..99 to master 1, which now has epoch 8 > 7: they move */
    slotmap *moved = learned(7, 8, 3, -1);
    give(moved, 0, 99, 1);
    assert_int_equal(slotmap_merge(cur, moved, &changed), 100);
    assert_int_equal(changed, 1);
    assert_int_equal(slotmap_shard_of(cur, 0)->master.port, 7001);
    assert_int_equal(slotmap_shard_of(cur, 100)->master.port, 7000);
    assert_int_equal(slotmap_shard_of(cur, 0)->nslots, 10922 - 5461 + 1 + 100);

    /* an equal epoch for another master does not move a slot */
    slotmap *tie = learned(7, 8, 8, -1);
    give(tie, 0, 9, 2);
    assert_int_equal(slotmap_merge(cur, tie, &changed), 0);
    assert_int_equal(slotmap_shard_of(cur, 5)->master.port, 7001);

    /* slots a view does not assign stay where they are */
    slotmap *partial = learned(7, 8, 3, -1);
    for (int s = 0; s < 1000; s++) {
        partial->owner[s] = -1;
    }
    assert_int_equal(slotmap_merge(cur, partial, &changed), 0);
    assert_int_equal(slotmap_covered(cur), CLUSTER_SLOTS);

    /* a failover of shard 2: its replica (node 5) is master at epoch 9 */
    slotmap *fo = learned(7, 8, 3, -1);
    give(fo, 0, 99, 1);
    slotmap_shard *s2 = &fo->shards[fo->owner[16383]];
    slotmap_node old = s2->master;
    s2->master = s2->replicas[0];
    s2->replicas[0] = old;
    s2->replicas[0].health = SLOTMAP_FAILED;
    s2->epoch = 9;
    assert_int_equal(slotmap_merge(cur, fo, &changed), 16383 - 10923 + 1);
    assert_int_equal(slotmap_shard_of(cur, 16383)->master.port, 7005);
    assert_int_equal(slotmap_shard_of(cur, 16383)->epoch, 9);
    assert_int_equal(cur->nshards, 3); /* the old master's shard is gone */
    for (int k = 0; k < cur->nshards; k++) {
        assert_int_not_equal(cur->shards[k].master.port, 7002);
    }
    /* and the old master, back, claiming its slots at its old epoch: no */
    slotmap *back = learned(7, 8, 3, -1);
    give(back, 0, 99, 1);
    assert_int_equal(slotmap_merge(cur, back, &changed), 0);
    assert_int_equal(slotmap_shard_of(cur, 16383)->master.port, 7005);

    /* a master the view flags failed does not take slots even at a high
     * epoch */
    slotmap *failed = learned(7, 8, 30, 2);
    give(failed, 0, 99, 1);
    assert_int_equal(failed->shards[failed->owner[16383]].master.health, SLOTMAP_FAILED);
    assert_int_equal(slotmap_merge(cur, failed, &changed), 0);
    assert_int_equal(slotmap_shard_of(cur, 16383)->master.port, 7005);

    free(first);
    free(newer);
    free(stale);
    free(moved);
    free(tie);
    free(partial);
    free(fo);
    free(back);
    free(failed);
    free(cur);
}

/* Random replies built from the shapes above with random damage: the
 * parsers answer 0 or -1 and never read out of bounds (ASan, valgrind). */
/* One shard (all slots on node 0) with replicas 3 and 4 listed in the
 * order given. */
static slotmap *two_replicas(int first, int second)
{
    rb b = {.n = 0};
    char err[200] = "";
    slotmap *m = malloc(sizeof(*m));
    rb_put(&b, "*1\r\n*4\r\n");
    rb_bulk(&b, "slots");
    rb_put(&b, "*2\r\n:0\r\n:16383\r\n");
    rb_bulk(&b, "nodes");
    rb_put(&b, "*3\r\n");
    shards_node(&b, 0, 7000, "master", "online");
    shards_node(&b, first, 7000 + first, "replica", "online");
    shards_node(&b, second, 7000 + second, "replica", "online");
    redisReply *r = parse(b.s, b.n);
    assert_int_equal(slotmap_from_shards(m, r, 0, err, sizeof(err)), 0);
    freeReplyObject(r);
    return m;
}

/* Nodes list a master's replicas in the order each learned them: the same
 * replicas in another order are the same map, not a change (each change
 * goes to every loop of ferry). */
static void test_replica_order_is_no_change(void **state)
{
    (void)state;
    slotmap *cur = malloc(sizeof(*cur));
    slotmap *a = two_replicas(3, 4), *b = two_replicas(4, 3);
    int changed = -1;
    slotmap_init(cur);
    assert_int_equal(slotmap_merge(cur, a, &changed), CLUSTER_SLOTS);
    assert_int_equal(changed, 1);
    assert_int_equal(slotmap_merge(cur, b, &changed), 0);
    assert_int_equal(changed, 0);
    assert_int_equal(cur->shards[0].nreplicas, 2);
    assert_int_equal(cur->shards[0].replicas[0].port, 7003);
    assert_int_equal(cur->shards[0].replicas[1].port, 7004);
    /* a replica's health is news */
    b->shards[0].replicas[1].health = SLOTMAP_FAILED;
    assert_int_equal(slotmap_merge(cur, b, &changed), 0);
    assert_int_equal(changed, 1);
    free(a);
    free(b);
    free(cur);
}

static void test_random_replies(void **state)
{
    (void)state;
    slotmap *m = malloc(sizeof(*m));
    unsigned seed = 12345;
    for (int iter = 0; iter < 2000; iter++) {
        rb b = {.n = 0};
        char err[200];
        /* a random tree of arrays, ints, strings and nils, depth <= 4 */
        int depth = 0, open[8] = {0};
        rb_put(&b, "*3\r\n");
        open[0] = 3;
        while (depth >= 0 && b.n < sizeof(b.s) - 200) {
            seed = seed * 1103515245u + 12345u;
            int pick = (int)((seed >> 16) % 9);
            if (open[depth] == 0) {
                depth--;
                continue;
            }
            open[depth]--;
            static const char *words[] = {"slots",  "nodes",  "id",      "port",
                                          "ip",     "role",   "master",  "replica",
                                          "health", "online", "endpoint"};
            if (pick < 2 && depth < 6) {
                int k = (int)((seed >> 8) % 5);
                rb_put(&b, "*%d\r\n", k);
                open[++depth] = k;
            } else if (pick < 4) {
                rb_put(&b, ":%d\r\n", (int)((seed >> 4) % 20000) - 100);
            } else if (pick < 7) {
                rb_bulk(&b, words[(seed >> 5) % 11]);
            } else if (pick < 8) {
                rb_bulk(&b, ids[(seed >> 7) % 7]);
            } else {
                rb_put(&b, "$-1\r\n");
            }
        }
        while (depth >= 0) {
            while (open[depth] > 0) {
                rb_put(&b, ":0\r\n");
                open[depth]--;
            }
            depth--;
        }
        redisReply *r = parse(b.s, b.n);
        int rc1 = slotmap_from_shards(m, r, 0, err, sizeof(err));
        assert_true(rc1 == 0 || rc1 == -1);
        int rc2 = slotmap_from_slots(m, r, err, sizeof(err));
        assert_true(rc2 == 0 || rc2 == -1);
        freeReplyObject(r);
    }
    free(m);
}

/* ==== real replies ==== */

/* tests/fuzz/corpus/cluster/<name> (a selector byte, then the reply) into
 * buf; returns its length without the selector, or -1. */
static long corpus_file(const char *name, char *buf, size_t cap)
{
    char path[4096];
    const char *dir = getenv("FERRY_SOURCE_DIR");
    const char *slash = strrchr(__FILE__, '/');
    if (dir != NULL && dir[0] != '\0') {
        snprintf(path, sizeof(path), "%s/tests/fuzz/corpus/cluster/%s", dir, name);
    } else if (slash != NULL) {
        snprintf(path, sizeof(path), "%.*s/../fuzz/corpus/cluster/%s", (int)(slash - __FILE__),
                 __FILE__, name);
    } else {
        return -1;
    }
    FILE *fp = fopen(path, "rb");
    if (fp == NULL) {
        return -1;
    }
    size_t n = fread(buf, 1, cap, fp);
    fclose(fp);
    if (n < 1 || n >= cap) {
        return -1;
    }
    memmove(buf, buf + 1, n - 1);
    return (long)n - 1;
}

/* CLUSTER SHARDS, CLUSTER SLOTS and CLUSTER NODES of one Redis 7.0.15 node
 * of a 3 + 3 cluster, taken at the same moment (the fuzz seeds): SHARDS and
 * SLOTS give the same map, and NODES gives every master an epoch. */
static void test_real_replies_agree(void **state)
{
    (void)state;
    static char shards[65536], slots[65536], nodes[65536];
    long ns = corpus_file("shards", shards, sizeof(shards));
    long nl = corpus_file("slots", slots, sizeof(slots));
    long nn = corpus_file("nodes", nodes, sizeof(nodes));
    if (ns < 0 || nl < 0 || nn < 0) {
        fail_msg("tests/fuzz/corpus/cluster/{shards,slots,nodes} not found: set FERRY_SOURCE_DIR");
    }
    slotmap *a = malloc(sizeof(*a)), *b = malloc(sizeof(*b));
    slotmap_nodeinfo ni[16];
    int n = 0;
    char err[200] = "";
    redisReply *r = parse(shards, (size_t)ns);
    assert_int_equal(slotmap_from_shards(a, r, 0, err, sizeof(err)), 0);
    freeReplyObject(r);
    r = parse(slots, (size_t)nl);
    assert_int_equal(slotmap_from_slots(b, r, err, sizeof(err)), 0);
    freeReplyObject(r);
    assert_int_equal(a->nshards, 3);
    assert_int_equal(b->nshards, 3);
    assert_int_equal(slotmap_covered(a), CLUSTER_SLOTS);
    for (int s = 0; s < CLUSTER_SLOTS; s++) {
        const slotmap_shard *x = slotmap_shard_of(a, s), *y = slotmap_shard_of(b, s);
        assert_string_equal(x->master.id, y->master.id);
        assert_string_equal(x->master.host, y->master.host);
        assert_int_equal(x->master.port, y->master.port);
        /* SLOTS leaves out a replica still loading its first sync; SHARDS
         * lists it with health "loading" (as in these replies) */
        assert_true(y->nreplicas <= x->nreplicas);
    }
    assert_int_equal(slotmap_nodes_parse(nodes, (size_t)nn, ni, 16, &n, err, sizeof(err)), 0);
    assert_int_equal(n, 6);
    assert_int_equal(slotmap_set_epochs(a, ni, n, err, sizeof(err)), 0);
    for (int k = 0; k < a->nshards; k++) {
        assert_true(a->shards[k].epoch > 0);
    }
    free(a);
    free(b);
}

/* ==== the source on a loop ==== */

/* Fake nodes in the test's loop: whatever a connection sends, a node
 * answers with its fixed bytes (a CLUSTER NODES reply, then a CLUSTER SHARDS
 * one) and keeps the connection until the peer closes it; with mute_first it
 * closes its first connection unanswered. */
#define FAKE_CONNS 32

typedef struct fnode {
    uv_tcp_t srv;
    uv_tcp_t conn[FAKE_CONNS];
    uv_write_t wr[FAKE_CONNS];
    int answered[FAKE_CONNS];
    int nconn;
    int mute_first;
    int port;
    rb answer;
} fnode;

typedef struct fake {
    fnode node[2];
    int nnodes;
    int maps;         /* on_map calls */
    int covered;      /* slots covered at the last one */
    int first_port;   /* the master of slot 0 at the last one */
    uv_timer_t timer; /* the test's poll */
    cluster_source *cs;
    uint64_t want_answers;
    uint64_t want_rejected;
    int want_port; /* and the master of slot 0 on this port (0: any) */
    int done;
    int asks; /* cluster_refresh calls of ask_poll */
} fake;

static void fake_alloc(uv_handle_t *h, size_t hint, uv_buf_t *b)
{
    static char scratch[4096];
    (void)h;
    (void)hint;
    b->base = scratch;
    b->len = sizeof(scratch);
}

static void fake_read(uv_stream_t *st, ssize_t n, const uv_buf_t *b)
{
    fnode *fn = st->data;
    int i = (int)((uv_tcp_t *)st - fn->conn);
    (void)b;
    if (n < 0) {
        uv_read_stop(st);
        return;
    }
    if (n > 0 && !fn->answered[i]) {
        fn->answered[i] = 1;
        if (i == 0 && fn->mute_first) {
            uv_read_stop(st);
            uv_tcp_close_reset((uv_tcp_t *)st, NULL);
            return;
        }
        uv_buf_t ub = uv_buf_init(fn->answer.s, (unsigned)fn->answer.n);
        uv_write(&fn->wr[i], st, &ub, 1, NULL);
    }
}

static void fake_accept(uv_stream_t *srv, int status)
{
    fnode *fn = srv->data;
    if (status < 0 || fn->nconn >= FAKE_CONNS) {
        return;
    }
    uv_tcp_t *c = &fn->conn[fn->nconn];
    uv_tcp_init(srv->loop, c);
    c->data = fn;
    if (uv_accept(srv, (uv_stream_t *)c) == 0) {
        fn->nconn++;
        uv_read_start((uv_stream_t *)c, fake_alloc, fake_read);
    } else {
        uv_close((uv_handle_t *)c, NULL);
    }
}

static void fake_listen(uv_loop_t *loop, fnode *fn)
{
    struct sockaddr_in sa;
    int namelen = sizeof(sa);
    uv_tcp_init(loop, &fn->srv);
    fn->srv.data = fn;
    uv_ip4_addr("127.0.0.1", 0, &sa);
    assert_int_equal(uv_tcp_bind(&fn->srv, (const struct sockaddr *)&sa, 0), 0);
    assert_int_equal(uv_listen((uv_stream_t *)&fn->srv, 8, fake_accept), 0);
    uv_tcp_getsockname(&fn->srv, (struct sockaddr *)&sa, &namelen);
    fn->port = ntohs(sa.sin_port);
}

static void fake_on_map(void *data, const slotmap *m, int moved)
{
    fake *fk = data;
    fk->maps++;
    fk->covered = slotmap_covered(m);
    fk->first_port = slotmap_shard_of(m, 0) != NULL ? slotmap_shard_of(m, 0)->master.port : 0;
    (void)moved;
}

static void fake_poll(uv_timer_t *t)
{
    fake *fk = t->data;
    const cluster_counts *k = cluster_get_counts(fk->cs);
    cluster_tick(fk->cs, uv_now(t->loop));
    if (fk->maps > 0 && k->answers >= fk->want_answers && k->rejected >= fk->want_rejected &&
        (fk->want_port == 0 || fk->first_port == fk->want_port)) {
        fk->done = 1;
        uv_timer_stop(t);
    }
}

/* Run the source on loop over cfg until fk->done or 5 s. */
static void fake_run(uv_loop_t *loop, fake *fk, config *cfg)
{
    static const cluster_ops ops = {.on_map = fake_on_map};
    fk->cs = cluster_new(loop, cfg, NULL, &ops, fk);
    uv_timer_init(loop, &fk->timer);
    fk->timer.data = fk;
    uv_timer_start(&fk->timer, fake_poll, 5, 5);
    uint64_t t0 = uv_now(loop);
    while (!fk->done && uv_now(loop) - t0 < 5000) {
        uv_run(loop, UV_RUN_ONCE);
    }
}

/* Close everything; the loop must end with no handle left. */
static void fake_close(uv_loop_t *loop, fake *fk)
{
    cluster_close(fk->cs);
    uv_close((uv_handle_t *)&fk->timer, NULL);
    for (int j = 0; j < fk->nnodes; j++) {
        fnode *fn = &fk->node[j];
        uv_close((uv_handle_t *)&fn->srv, NULL);
        for (int i = 0; i < fn->nconn; i++) {
            if (!uv_is_closing((uv_handle_t *)&fn->conn[i])) {
                uv_close((uv_handle_t *)&fn->conn[i], NULL);
            }
        }
    }
    uv_run(loop, UV_RUN_DEFAULT);
    assert_int_equal(uv_loop_close(loop), 0);
    cluster_free(fk->cs);
}

static void seed(config *cfg, int port)
{
    config_parse_addr("127.0.0.1:1", &cfg->cluster_nodes[cfg->ncluster_nodes]);
    cfg->cluster_nodes[cfg->ncluster_nodes++].port = port;
}

static config *fake_config(void)
{
    config *cfg = calloc(1, sizeof(*cfg));
    config_defaults(cfg);
    cfg->has_cluster = 1;
    cfg->cluster_refresh_interval_ms = 20;
    cfg->cluster_timeout_ms = 500;
    return cfg;
}

/* cluster_new learns the map from a seed (a fake node in the loop), reports
 * it once through on_map, goes on with rounds (the map's masters do not
 * exist: refused connections, counted; a seed that is a host name is
 * resolved), and closes without a leaked handle. */
static void test_source_learns_and_closes_clean(void **state)
{
    (void)state;
    uv_loop_t loop;
    fake *fk = calloc(1, sizeof(*fk));
    config *cfg = fake_config();
    char text[4096];

    assert_int_equal(uv_loop_init(&loop), 0);
    nodes_text(text, sizeof(text), 0, 1, 2, 3, -1);
    rb_put(&fk->node[0].answer, "$%zu\r\n%s\r\n", strlen(text), text);
    three_shards_bytes(&fk->node[0].answer);
    fake_listen(&loop, &fk->node[0]);
    fk->nnodes = 1;
    seed(cfg, 1);
    seed(cfg, fk->node[0].port);
    config_parse_addr("localhost:1", &cfg->cluster_nodes[cfg->ncluster_nodes++]);
    fk->want_answers = 3;

    fake_run(&loop, fk, cfg);
    assert_true(fk->done);
    assert_int_equal(fk->maps, 1); /* the same answer again changes nothing */
    assert_int_equal(fk->covered, CLUSTER_SLOTS);
    const cluster_counts *k = cluster_get_counts(fk->cs);
    assert_true(k->answers >= 3);
    assert_true(k->unreachable > 0); /* 127.0.0.1:1 and the map's masters */
    assert_int_equal(k->rejected, 0);
    assert_int_equal(cluster_map(fk->cs)->nshards, 3);
    fake_close(&loop, fk);
    config_free(cfg);
    free(cfg);
    free(fk);
}

/* Node B claims every slot at config epoch 50 (far above the others'). A,
 * heard first (B closes its first connection unanswered), flags B fail or
 * not: flagged, B is never heard and the map stays A's; not flagged, B's
 * claim wins by its epoch (which shows it is the flag that stops it). */
static void test_source_ignores_a_node_flagged_failed(void **state)
{
    (void)state;
    for (int flagged = 1; flagged >= 0; flagged--) {
        uv_loop_t loop;
        fake *fk = calloc(1, sizeof(*fk));
        config *cfg = fake_config();
        char text[4096], line[256];

        assert_int_equal(uv_loop_init(&loop), 0);
        fake_listen(&loop, &fk->node[0]);
        fake_listen(&loop, &fk->node[1]);
        fk->nnodes = 2;
        int bport = fk->node[1].port;
        /* A: the 3 + 3 cluster, and B as a master with no slot */
        nodes_text(text, sizeof(text), 0, 1, 2, 3, -1);
        snprintf(line, sizeof(line), "%s 127.0.0.1:%d@%d master%s - 0 0 50 connected\n", ids[6],
                 bport, bport + 10000, flagged ? ",fail" : "");
        strcat(text, line);
        rb_put(&fk->node[0].answer, "$%zu\r\n%s\r\n", strlen(text), text);
        three_shards_bytes(&fk->node[0].answer);
        /* B: itself master of every slot at epoch 50 */
        snprintf(line, sizeof(line),
                 "%s 127.0.0.1:%d@%d myself,master - 0 0 50 connected 0-16383\n", ids[6], bport,
                 bport + 10000);
        rb_put(&fk->node[1].answer, "$%zu\r\n%s\r\n", strlen(line), line);
        rb_put(&fk->node[1].answer, "*1\r\n*4\r\n");
        rb_bulk(&fk->node[1].answer, "slots");
        rb_put(&fk->node[1].answer, "*2\r\n:0\r\n:16383\r\n");
        rb_bulk(&fk->node[1].answer, "nodes");
        rb_put(&fk->node[1].answer, "*1\r\n");
        shards_node(&fk->node[1].answer, 6, bport, "master", "online");
        fk->node[1].mute_first = 1;
        seed(cfg, fk->node[0].port);
        seed(cfg, bport);
        fk->want_answers = flagged ? 3 : 1;
        fk->want_rejected = flagged ? 2 : 0;
        fk->want_port = flagged ? 0 : bport; /* unflagged: until B's map is taken */
        fake_run(&loop, fk, cfg);
        const cluster_counts *k = cluster_get_counts(fk->cs);
        if (flagged) {
            assert_true(fk->done);
            assert_int_equal(fk->maps, 1);
            assert_int_equal(fk->first_port, 7000);
            assert_true(k->rejected >= 2);
            assert_non_null(strstr(k->last_error, "flags this node failed"));
            assert_int_equal(slotmap_shard_of(cluster_map(fk->cs), 0)->master.port, 7000);
        } else {
            assert_true(fk->done);
            assert_int_equal(fk->first_port, bport);
            assert_int_equal(cluster_map(fk->cs)->nshards, 1);
            assert_int_equal(k->rejected, 0);
        }
        fake_close(&loop, fk);
        config_free(cfg);
        free(cfg);
        free(fk);
    }
}

/* test_cluster --keyslot: for each line of stdin, a key in hex, print
 * slot_of_key of it (the integration test compares with CLUSTER KEYSLOT). */
static int keyslot_tool(void)
{
    char line[8192];
    while (fgets(line, sizeof(line), stdin) != NULL) {
        char key[4096];
        size_t n = 0;
        for (size_t i = 0; line[i] != '\0' && line[i] != '\n' && n < sizeof(key); i += 2) {
            unsigned v;
            if (sscanf(line + i, "%2x", &v) != 1) {
                return 2;
            }
            key[n++] = (char)v;
        }
        printf("%d\n", slot_of_key(key, n));
    }
    return 0;
}

/* A request refused MOVED every 5 ms: ask for the map, then the owner's
 * tick. */
static void ask_poll(uv_timer_t *t)
{
    fake *fk = t->data;
    cluster_refresh(fk->cs, CLUSTER_WHY_MOVED, "MOVED 0 127.0.0.1:7000");
    fk->asks++;
    cluster_tick(fk->cs, uv_now(t->loop));
}

/* Rounds asked for are spaced by the back-off: asked every 5 ms for 2 s
 * while they move no slot (the map's masters refuse the connection, which
 * asks as well), the source starts one every CLUSTER_ASK_MAX_MS or so once
 * the gap has grown, not one right after the other (~400, or as many as
 * the fake node accepts); every ask is counted for its reason. */
static void test_source_backs_off_rounds_asked_for(void **state)
{
    (void)state;
    uv_loop_t loop;
    fake *fk = calloc(1, sizeof(*fk));
    config *cfg = fake_config();
    char text[4096];

    assert_int_equal(uv_loop_init(&loop), 0);
    cfg->cluster_refresh_interval_ms = 1000;
    nodes_text(text, sizeof(text), 0, 1, 2, 3, -1);
    rb_put(&fk->node[0].answer, "$%zu\r\n%s\r\n", strlen(text), text);
    three_shards_bytes(&fk->node[0].answer);
    fake_listen(&loop, &fk->node[0]);
    fk->nnodes = 1;
    seed(cfg, fk->node[0].port);
    fk->want_answers = 1;
    fake_run(&loop, fk, cfg);
    assert_true(fk->done);

    const cluster_counts *k = cluster_get_counts(fk->cs);
    uint64_t rounds0 = k->rounds, t0 = uv_now(&loop);
    uv_timer_start(&fk->timer, ask_poll, 5, 5);
    while (uv_now(&loop) - t0 < 2000) {
        uv_run(&loop, UV_RUN_ONCE);
    }
    uv_timer_stop(&fk->timer);
    uint64_t rounds = k->rounds - rounds0;
    print_message("rounds in 2 s of asks every 5 ms: %llu (%d asks)\n", (unsigned long long)rounds,
                  fk->asks);
    /* 2 s: the interval's 2 rounds and the asks' (gaps 100, 200, then 250
     * ms): about 10; never more than one per CLUSTER_ASK_MIN_MS. */
    assert_true(rounds >= 3);
    assert_true(rounds <= 2000 / CLUSTER_ASK_MIN_MS);
    assert_true(rounds <= 14);
    assert_int_equal(k->asked[CLUSTER_WHY_MOVED], (uint64_t)fk->asks);
    assert_true(fk->asks > 100);
    assert_true(k->deferred + rounds >= (uint64_t)fk->asks);
    assert_true(k->asked[CLUSTER_WHY_UNREACHABLE] > 0);
    assert_int_equal(fk->maps, 1);
    fake_close(&loop, fk);
    config_free(cfg);
    free(cfg);
    free(fk);
}

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "--keyslot") == 0) {
        return keyslot_tool();
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_crc16_and_keyslot_vectors),
        cmocka_unit_test(test_slot_tag_key),
        cmocka_unit_test(test_shards_parse),
        cmocka_unit_test(test_shards_tls_ports),
        cmocka_unit_test(test_shards_failed_master_and_unknown_endpoint),
        cmocka_unit_test(test_shards_health_words),
        cmocka_unit_test(test_shards_nonsense),
        cmocka_unit_test(test_shards_bad_nodes),
        cmocka_unit_test(test_shards_conflicts),
        cmocka_unit_test(test_shards_master_twice),
        cmocka_unit_test(test_slots_parse_and_nonsense),
        cmocka_unit_test(test_nodes_parse),
        cmocka_unit_test(test_set_epochs),
        cmocka_unit_test(test_merge_epoch_rule),
        cmocka_unit_test(test_replica_order_is_no_change),
        cmocka_unit_test(test_random_replies),
        cmocka_unit_test(test_real_replies_agree),
        cmocka_unit_test(test_source_learns_and_closes_clean),
        cmocka_unit_test(test_source_ignores_a_node_flagged_failed),
        cmocka_unit_test(test_source_backs_off_rounds_asked_for),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
