/* test_broadcast.c - unit tests for proxy/base/broadcast.c: which commands every
 * master runs in cluster mode, and how the masters' replies fold into the
 * client's: the first master's reply, the first error (the others not
 * asked), SCRIPT EXISTS as the AND of every master's array, PUBSUB's
 * channel lists merged and counts summed, and replies of another shape
 * refused without a crash. */

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "broadcast.h"
#include "command.h"

static const command *lookup(const char *cmd, const char *sub)
{
    const char *argv[2] = {cmd, sub};
    size_t lens[2] = {strlen(cmd), sub != NULL ? strlen(sub) : 0};
    return command_lookup_argv(sub != NULL ? 2 : 1, argv, lens);
}

static void reply_is(const broadcast *b, const char *want)
{
    assert_int_equal(buf_used(&b->reply), strlen(want));
    assert_memory_equal(buf_head(&b->reply), want, strlen(want));
}

static int fold(broadcast *b, const char *reply)
{
    return broadcast_fold(b, reply, strlen(reply));
}

static void test_kinds(void **state)
{
    (void)state;
    assert_int_equal(broadcast_kind_of(lookup("SCRIPT", "LOAD")), BCAST_FIRST);
    assert_int_equal(broadcast_kind_of(lookup("script", "flush")), BCAST_FIRST);
    assert_int_equal(broadcast_kind_of(lookup("SCRIPT", "EXISTS")), BCAST_AND);
    assert_int_equal(broadcast_kind_of(lookup("FUNCTION", "LOAD")), BCAST_FIRST);
    assert_int_equal(broadcast_kind_of(lookup("FUNCTION", "DELETE")), BCAST_FIRST);
    assert_int_equal(broadcast_kind_of(lookup("FUNCTION", "FLUSH")), BCAST_FIRST);
    assert_int_equal(broadcast_kind_of(lookup("FUNCTION", "RESTORE")), BCAST_FIRST);
    assert_int_equal(broadcast_kind_of(lookup("CONFIG", "SET")), BCAST_FIRST);
    assert_int_equal(broadcast_kind_of(lookup("CONFIG", "GET")), BCAST_NONE);
    /* read on one master, or about the script running on one node */
    assert_int_equal(broadcast_kind_of(lookup("FUNCTION", "LIST")), BCAST_NONE);
    assert_int_equal(broadcast_kind_of(lookup("FUNCTION", "DUMP")), BCAST_NONE);
    assert_int_equal(broadcast_kind_of(lookup("SCRIPT", "KILL")), BCAST_NONE);
    /* the whole keyspace */
    assert_int_equal(broadcast_kind_of(lookup("FLUSHALL", NULL)), BCAST_FIRST);
    assert_int_equal(broadcast_kind_of(lookup("flushdb", NULL)), BCAST_FIRST);
    assert_int_equal(broadcast_kind_of(lookup("KEYS", NULL)), BCAST_CONCAT);
    assert_int_equal(broadcast_kind_of(lookup("DBSIZE", NULL)), BCAST_SUM);
    assert_int_equal(broadcast_kind_of(lookup("RANDOMKEY", NULL)), BCAST_ANY);
    assert_int_equal(broadcast_kind_of(lookup("INFO", NULL)), BCAST_INFO);
    assert_int_equal(broadcast_kind_of(lookup("SCAN", NULL)), BCAST_NONE); /* keyspace.c */
    assert_int_equal(broadcast_kind_of(lookup("EVAL", NULL)), BCAST_NONE);
    assert_int_equal(broadcast_kind_of(lookup("GET", NULL)), BCAST_NONE);
    assert_int_equal(broadcast_kind_of(NULL), BCAST_NONE);
}

static void test_first_reply_kept(void **state)
{
    (void)state;
    broadcast *b = broadcast_new(BCAST_FIRST);
    const char *sha = "$40\r\ne0e1f9fabfc9d4800c877a703b823ac0578ff8db\r\n";
    assert_int_equal(fold(b, sha), 1);
    assert_int_equal(fold(b, sha), 1);
    assert_int_equal(fold(b, "$3\r\nodd\r\n"), 1); /* the first master's is the reply */
    reply_is(b, sha);
    assert_int_equal(b->answered, 3);
    assert_int_equal(b->failed, 0);
    broadcast_free(b);
}

static void test_error_stops(void **state)
{
    (void)state;
    broadcast *b = broadcast_new(BCAST_FIRST);
    assert_int_equal(fold(b, "+OK\r\n"), 1);
    assert_int_equal(fold(b, "-ERR Library 'x' already exists\r\n"), 0);
    reply_is(b, "-ERR Library 'x' already exists\r\n");
    /* nothing after the error changes it */
    assert_int_equal(fold(b, "+OK\r\n"), 0);
    reply_is(b, "-ERR Library 'x' already exists\r\n");
    broadcast_free(b);

    b = broadcast_new(BCAST_AND);
    assert_int_equal(fold(b, "-NOPERM no\r\n"), 0);
    reply_is(b, "-NOPERM no\r\n");
    broadcast_free(b);
}

static void test_exists_and(void **state)
{
    (void)state;
    broadcast *b = broadcast_new(BCAST_AND);
    assert_int_equal(fold(b, "*3\r\n:1\r\n:1\r\n:0\r\n"), 1);
    assert_int_equal(fold(b, "*3\r\n:1\r\n:0\r\n:1\r\n"), 1);
    reply_is(b, "*3\r\n:1\r\n:0\r\n:0\r\n");
    assert_int_equal(fold(b, "*3\r\n:1\r\n:1\r\n:1\r\n"), 1);
    reply_is(b, "*3\r\n:1\r\n:0\r\n:0\r\n");
    broadcast_free(b);

    b = broadcast_new(BCAST_AND);
    assert_int_equal(fold(b, "*0\r\n"), 1);
    assert_int_equal(fold(b, "*0\r\n"), 1);
    reply_is(b, "*0\r\n");
    broadcast_free(b);
}

static void test_exists_nonsense(void **state)
{
    (void)state;
    static const char *const bad[] = {
        "*2\r\n:1\r\n",        /* short */
        "*1\r\n:1\r\n:1\r\n",  /* long */
        "*1\r\n:2\r\n",        /* not 0/1 */
        "*1\r\n$1\r\n1\r\n",   /* not an integer */
        "+OK\r\n",             /* not an array */
        "*x\r\n",              /* no count */
        "*99999999999999\r\n", /* a count past the bytes */
        "*1\r\n:1",            /* cut */
        "",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        broadcast *b = broadcast_new(BCAST_AND);
        assert_int_equal(fold(b, "*1\r\n:1\r\n"), 1);
        assert_int_equal(broadcast_fold(b, bad[i], strlen(bad[i])), 0);
        assert_int_equal(b->failed, 1);
        assert_true(buf_used(&b->reply) > 5 && memcmp(buf_head(&b->reply), "-ERR ferry", 10) == 0);
        broadcast_free(b);
    }
    broadcast_free(NULL);
}

static int info_has_keyspace(const char *a, const char *b)
{
    const char *argv[3] = {"INFO", a, b};
    size_t lens[3] = {4, a != NULL ? strlen(a) : 0, b != NULL ? strlen(b) : 0};
    return broadcast_info_has_keyspace(a == NULL ? 1 : b == NULL ? 2 : 3, argv, lens);
}

static void test_info_sections(void **state)
{
    (void)state;
    assert_true(info_has_keyspace(NULL, NULL));
    assert_true(info_has_keyspace("KEYSPACE", NULL));
    assert_true(info_has_keyspace("server", "keyspace"));
    assert_true(info_has_keyspace("all", NULL));
    assert_true(info_has_keyspace("everything", NULL));
    assert_true(info_has_keyspace("default", NULL));
    assert_false(info_has_keyspace("server", NULL));
    assert_false(info_has_keyspace("replication", "clients"));
    assert_false(info_has_keyspace("keyspac", NULL));
}

static void test_keys_joined(void **state)
{
    (void)state;
    broadcast *b = broadcast_new(BCAST_CONCAT);
    assert_int_equal(fold(b, "*2\r\n$1\r\na\r\n$1\r\nb\r\n"), 1);
    assert_int_equal(fold(b, "*0\r\n"), 1);
    assert_int_equal(fold(b, "*1\r\n$2\r\ncc\r\n"), 1);
    reply_is(b, "*3\r\n$1\r\na\r\n$1\r\nb\r\n$2\r\ncc\r\n");
    assert_int_equal(fold(b, "+OK\r\n"), 0); /* not an array: ferry's error */
    assert_int_equal(memcmp(buf_head(&b->reply), "-ERR ferry", 10), 0);
    broadcast_free(b);
}

static void test_dbsize_summed(void **state)
{
    (void)state;
    broadcast *b = broadcast_new(BCAST_SUM);
    assert_int_equal(fold(b, ":100\r\n"), 1);
    assert_int_equal(fold(b, ":0\r\n"), 1);
    assert_int_equal(fold(b, ":240\r\n"), 1);
    reply_is(b, ":340\r\n");
    broadcast_free(b);
    static const char *const bad[] = {":\r\n", ":12", "$2\r\n12\r\n", ":1x\r\n", ""};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        b = broadcast_new(BCAST_SUM);
        assert_int_equal(fold(b, ":1\r\n"), 1);
        assert_int_equal(broadcast_fold(b, bad[i], strlen(bad[i])), 0);
        assert_int_equal(memcmp(buf_head(&b->reply), "-ERR ferry", 10), 0);
        broadcast_free(b);
    }
}

static void test_pubsub_kinds(void **state)
{
    (void)state;
    assert_int_equal(broadcast_kind_of(lookup("PUBSUB", "CHANNELS")), BCAST_UNION);
    assert_int_equal(broadcast_kind_of(lookup("PUBSUB", "SHARDCHANNELS")), BCAST_UNION);
    assert_int_equal(broadcast_kind_of(lookup("PUBSUB", "NUMSUB")), BCAST_SUM_PAIRS);
    assert_int_equal(broadcast_kind_of(lookup("PUBSUB", "SHARDNUMSUB")), BCAST_SUM_PAIRS);
    assert_int_equal(broadcast_kind_of(lookup("PUBSUB", "NUMPAT")), BCAST_SUM);
    assert_int_equal(broadcast_kind_of(lookup("PUBSUB", "HELP")), BCAST_NONE);
    assert_int_equal(broadcast_kind_of(lookup("PUBLISH", NULL)), BCAST_NONE);
}

static void test_pubsub_union(void **state)
{
    (void)state;
    broadcast *b = broadcast_new(BCAST_UNION);
    assert_int_equal(fold(b, "*2\r\n$1\r\na\r\n$2\r\nbb\r\n"), 1);
    assert_int_equal(fold(b, "*0\r\n"), 1);
    assert_int_equal(fold(b, "*2\r\n$2\r\nbb\r\n$3\r\nc\r\n\r\n"), 1); /* a name with CRLF */
    reply_is(b, "*3\r\n$1\r\na\r\n$2\r\nbb\r\n$3\r\nc\r\n\r\n");
    broadcast_free(b);

    b = broadcast_new(BCAST_UNION);
    assert_int_equal(fold(b, "*0\r\n"), 1);
    assert_int_equal(fold(b, "*1\r\n$0\r\n\r\n"), 1);
    reply_is(b, "*1\r\n$0\r\n\r\n");
    broadcast_free(b);
}

static void test_pubsub_sums(void **state)
{
    (void)state;
    broadcast *b = broadcast_new(BCAST_SUM_PAIRS);
    assert_int_equal(fold(b, "*4\r\n$1\r\na\r\n:1\r\n$1\r\nb\r\n:0\r\n"), 1);
    assert_int_equal(fold(b, "*4\r\n$1\r\na\r\n:2\r\n$1\r\nb\r\n:0\r\n"), 1);
    assert_int_equal(fold(b, "*4\r\n$1\r\na\r\n:0\r\n$1\r\nb\r\n:7\r\n"), 1);
    reply_is(b, "*4\r\n$1\r\na\r\n:3\r\n$1\r\nb\r\n:7\r\n");
    broadcast_free(b);

    b = broadcast_new(BCAST_SUM);
    assert_int_equal(fold(b, ":2\r\n"), 1);
    assert_int_equal(fold(b, ":0\r\n"), 1);
    assert_int_equal(fold(b, ":40\r\n"), 1);
    reply_is(b, ":42\r\n");
    broadcast_free(b);
}

static void test_pubsub_nonsense(void **state)
{
    (void)state;
    static const struct {
        broadcast_kind kind;
        const char *first, *bad;
    } cases[] = {
        {BCAST_UNION, "*1\r\n$1\r\na\r\n", "*1\r\n:1\r\n"},       /* not a name */
        {BCAST_UNION, "*1\r\n$1\r\na\r\n", "*1\r\n$5\r\nab\r\n"}, /* bulk past the end */
        {BCAST_UNION, "*1\r\n$1\r\na\r\n", "*1\r\n$1\r\nab\r\n"}, /* bulk longer */
        {BCAST_UNION, "*1\r\n$1\r\na\r\n", "*2\r\n$1\r\na\r\n"},  /* short */
        {BCAST_UNION, "*1\r\n$1\r\na\r\n", "+OK\r\n"},            /* not an array */
        {BCAST_SUM_PAIRS, "*2\r\n$1\r\na\r\n:1\r\n", "*2\r\n$1\r\nb\r\n:1\r\n"}, /* other name */
        {BCAST_SUM_PAIRS, "*2\r\n$1\r\na\r\n:1\r\n", "*2\r\n$1\r\na\r\n$1\r\n1\r\n"},
        {BCAST_SUM_PAIRS, "*2\r\n$1\r\na\r\n:1\r\n", "*0\r\n"},      /* other length */
        {BCAST_SUM_PAIRS, "*1\r\n$1\r\na\r\n", "*1\r\n$1\r\na\r\n"}, /* odd */
        {BCAST_SUM, ":1\r\n", "$1\r\n1\r\n"},                        /* not an integer */
        {BCAST_SUM, ":1\r\n", ":1"},                                 /* cut */
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        broadcast *b = broadcast_new(cases[i].kind);
        assert_int_equal(fold(b, cases[i].first), 1);
        assert_int_equal(fold(b, cases[i].bad), 0);
        assert_int_equal(b->failed, 1);
        assert_true(buf_used(&b->reply) > 5 && memcmp(buf_head(&b->reply), "-ERR ferry", 10) == 0);
        broadcast_free(b);
    }
}

static void test_randomkey_first_key(void **state)
{
    (void)state;
    broadcast *b = broadcast_new(BCAST_ANY);
    assert_int_equal(fold(b, "$-1\r\n"), 1); /* an empty master: ask the next */
    assert_int_equal(fold(b, "_\r\n"), 1);
    assert_int_equal(fold(b, "$3\r\nk:1\r\n"), 0);
    reply_is(b, "$3\r\nk:1\r\n");
    broadcast_free(b);
    b = broadcast_new(BCAST_ANY);
    assert_int_equal(fold(b, "$-1\r\n"), 1);
    assert_int_equal(fold(b, "$-1\r\n"), 1);
    reply_is(b, "$-1\r\n"); /* every master empty: nil */
    broadcast_free(b);
}

static void test_info_keyspace_summed(void **state)
{
    (void)state;
    const char *a = "# Server\r\nredis_version:7.0.15\r\n\r\n# Keyspace\r\n"
                    "db0:keys=100,expires=10,avg_ttl=1000\r\n";
    const char *b2 = "# Server\r\nredis_version:7.0.15\r\n\r\n# Keyspace\r\n"
                     "db0:keys=50,expires=30,avg_ttl=3000\r\n";
    const char *c = "# Server\r\nredis_version:7.0.15\r\n\r\n# Keyspace\r\n";
    char r1[256], r2[256], r3[256];
    snprintf(r1, sizeof(r1), "$%zu\r\n%s\r\n", strlen(a), a);
    snprintf(r2, sizeof(r2), "$%zu\r\n%s\r\n", strlen(b2), b2);
    snprintf(r3, sizeof(r3), "$%zu\r\n%s\r\n", strlen(c), c);
    broadcast *b = broadcast_new(BCAST_INFO);
    assert_int_equal(fold(b, r1), 1);
    assert_int_equal(fold(b, r2), 1);
    assert_int_equal(fold(b, r3), 1);
    const char *want = "# Server\r\nredis_version:7.0.15\r\n\r\n# Keyspace\r\n"
                       "db0:keys=150,expires=40,avg_ttl=2500\r\n";
    char w[256];
    snprintf(w, sizeof(w), "$%zu\r\n%s\r\n", strlen(want), want);
    reply_is(b, w);
    broadcast_free(b);

    /* RESP3's verbatim string; the first master has no keys; a section after */
    const char *d = "# Keyspace\r\n\r\n# Other\r\nx:1\r\n";
    const char *e = "# Keyspace\r\ndb0:keys=7,expires=0,avg_ttl=0\r\n\r\n# Other\r\nx:2\r\n";
    snprintf(r1, sizeof(r1), "=%zu\r\ntxt:%s\r\n", strlen(d) + 4, d);
    snprintf(r2, sizeof(r2), "=%zu\r\ntxt:%s\r\n", strlen(e) + 4, e);
    b = broadcast_new(BCAST_INFO);
    assert_int_equal(fold(b, r1), 1);
    assert_int_equal(fold(b, r2), 1);
    want = "# Keyspace\r\ndb0:keys=7,expires=0,avg_ttl=0\r\n\r\n# Other\r\nx:1\r\n";
    snprintf(w, sizeof(w), "=%zu\r\ntxt:%s\r\n", strlen(want) + 4, want);
    reply_is(b, w);
    broadcast_free(b);

    /* not INFO's shape: ferry's error, no crash */
    static const char *const bad[] = {"+OK\r\n", "$5\r\nab\r\n", "$-1\r\n", "=3\r\nabc\r\n", ""};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        b = broadcast_new(BCAST_INFO);
        assert_int_equal(broadcast_fold(b, bad[i], strlen(bad[i])), 0);
        assert_int_equal(memcmp(buf_head(&b->reply), "-ERR ferry", 10), 0);
        broadcast_free(b);
    }
    /* odd keyspace lines are skipped, not a crash */
    const char *odd = "# Keyspace\r\ndb:keys=1\r\ndb99:keys=1\r\ndb1:keys=x,=3,expires=2\r\n"
                      "db2\r\n";
    snprintf(r1, sizeof(r1), "$%zu\r\n%s\r\n", strlen(odd), odd);
    b = broadcast_new(BCAST_INFO);
    assert_int_equal(fold(b, r1), 1);
    want = "# Keyspace\r\ndb1:expires=2\r\n";
    snprintf(w, sizeof(w), "$%zu\r\n%s\r\n", strlen(want), want);
    reply_is(b, w);
    broadcast_free(b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kinds),
        cmocka_unit_test(test_first_reply_kept),
        cmocka_unit_test(test_error_stops),
        cmocka_unit_test(test_exists_and),
        cmocka_unit_test(test_exists_nonsense),
        cmocka_unit_test(test_info_sections),
        cmocka_unit_test(test_keys_joined),
        cmocka_unit_test(test_dbsize_summed),
        cmocka_unit_test(test_randomkey_first_key),
        cmocka_unit_test(test_info_keyspace_summed),
        cmocka_unit_test(test_pubsub_kinds),
        cmocka_unit_test(test_pubsub_union),
        cmocka_unit_test(test_pubsub_sums),
        cmocka_unit_test(test_pubsub_nonsense),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
