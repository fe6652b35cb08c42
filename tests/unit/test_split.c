/* test_split.c - unit tests for proxy/base/split.c: which commands are split
 * across slots, how their keys are grouped one part per slot (client order
 * kept inside a part, MSET's values with their keys), and how the parts'
 * replies fold into one: MGET's elements in the client's key order (RESP3
 * nulls too), MSET's +OK, the sums, a part's error as the reply (the rest
 * not sent), and replies of the wrong shape refused without a crash. */

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "command.h"
#include "slot.h"
#include "split.h"

static const command *lookup(const char *name)
{
    const char *argv[1] = {name};
    size_t lens[1] = {strlen(name)};
    return command_lookup_argv(1, argv, lens);
}

/* A split of argv (NULL-terminated). */
static split *make(split_kind kind, const char *const *argv)
{
    resp_arg args[32];
    size_t n = 0;
    while (argv[n] != NULL) {
        args[n].ptr = argv[n];
        args[n].len = strlen(argv[n]);
        n++;
    }
    resp_request req = {.len = 0, .is_inline = 0, .argc = n, .argv = args};
    return split_new(kind, &req);
}

static void part_is(split *sp, const char *want)
{
    buf b;
    buf_init(&b);
    split_encode(sp, &b);
    assert_int_equal(buf_used(&b), strlen(want));
    assert_memory_equal(buf_head(&b), want, strlen(want));
    buf_free(&b);
}

static void reply_is(const split *sp, const char *want)
{
    assert_int_equal(buf_used(&sp->reply), strlen(want));
    assert_memory_equal(buf_head(&sp->reply), want, strlen(want));
}

static int fold(split *sp, const char *reply)
{
    return split_fold(sp, reply, strlen(reply));
}

static void test_kinds(void **state)
{
    (void)state;
    assert_int_equal(split_kind_of(lookup("MGET")), SPLIT_ARRAY);
    assert_int_equal(split_kind_of(lookup("mset")), SPLIT_OK);
    assert_int_equal(split_kind_of(lookup("DEL")), SPLIT_SUM);
    assert_int_equal(split_kind_of(lookup("UNLINK")), SPLIT_SUM);
    assert_int_equal(split_kind_of(lookup("EXISTS")), SPLIT_SUM);
    assert_int_equal(split_kind_of(lookup("TOUCH")), SPLIT_SUM);
    /* all or nothing on one node: refused across slots, as a node does */
    assert_int_equal(split_kind_of(lookup("MSETNX")), SPLIT_NONE);
    assert_int_equal(split_kind_of(lookup("RPOPLPUSH")), SPLIT_NONE);
    assert_int_equal(split_kind_of(lookup("SUNIONSTORE")), SPLIT_NONE);
    assert_int_equal(split_kind_of(NULL), SPLIT_NONE);
}

static void test_mget_order(void **state)
{
    (void)state;
    /* {b} hashes below {a}: its part goes first */
    assert_true(slot_of_key("{b}", 3) < slot_of_key("{a}", 3));
    static const char *const argv[] = {"MGET", "{a}1", "{b}1", "{a}2", "{b}1", "{a}1", NULL};
    split *sp = make(SPLIT_ARRAY, argv);
    assert_non_null(sp);
    assert_int_equal(sp->nparts, 2);
    assert_int_equal(split_slot(sp), slot_of_key("{b}", 3));
    part_is(sp, "*3\r\n$4\r\nMGET\r\n$4\r\n{b}1\r\n$4\r\n{b}1\r\n");
    assert_int_equal(fold(sp, "*2\r\n$2\r\nB1\r\n$2\r\nB1\r\n"), 1);
    assert_int_equal(split_slot(sp), slot_of_key("{a}", 3));
    part_is(sp, "*4\r\n$4\r\nMGET\r\n$4\r\n{a}1\r\n$4\r\n{a}2\r\n$4\r\n{a}1\r\n");
    /* RESP3 null for {a}2, a value with CRLF inside for {a}1 */
    assert_int_equal(fold(sp, "*3\r\n$4\r\nA\r\n1\r\n_\r\n$4\r\nA\r\n1\r\n"), 0);
    reply_is(sp, "*5\r\n$4\r\nA\r\n1\r\n$2\r\nB1\r\n_\r\n$2\r\nB1\r\n$4\r\nA\r\n1\r\n");
    assert_int_equal(fold(sp, "*0\r\n"), 0); /* nothing left: no change */
    reply_is(sp, "*5\r\n$4\r\nA\r\n1\r\n$2\r\nB1\r\n_\r\n$2\r\nB1\r\n$4\r\nA\r\n1\r\n");
    split_free(sp);
}

static void test_mset_pairs(void **state)
{
    (void)state;
    static const char *const argv[] = {"mset", "{a}k", "1", "{b}k", "2", "{a}k", "3", NULL};
    split *sp = make(SPLIT_OK, argv);
    assert_non_null(sp);
    part_is(sp, "*3\r\n$4\r\nmset\r\n$4\r\n{b}k\r\n$1\r\n2\r\n");
    assert_int_equal(fold(sp, "+OK\r\n"), 1);
    part_is(sp, "*5\r\n$4\r\nmset\r\n$4\r\n{a}k\r\n$1\r\n1\r\n$4\r\n{a}k\r\n$1\r\n3\r\n");
    assert_int_equal(fold(sp, "+OK\r\n"), 0);
    reply_is(sp, "+OK\r\n");
    split_free(sp);
    /* a key without its value: not split (a node answers the arity error) */
    static const char *const odd[] = {"MSET", "{a}k", "1", "{b}k", NULL};
    assert_null(make(SPLIT_OK, odd));
    static const char *const none[] = {"MGET", NULL};
    assert_null(make(SPLIT_ARRAY, none));
}

static void test_sums_and_errors(void **state)
{
    (void)state;
    static const char *const argv[] = {"EXISTS", "{a}", "{b}", "{c}", "{a}", NULL};
    split *sp = make(SPLIT_SUM, argv);
    assert_int_equal(sp->nparts, 3);
    assert_int_equal(fold(sp, ":1\r\n"), 1);
    assert_int_equal(fold(sp, ":2\r\n"), 1);
    assert_int_equal(fold(sp, ":0\r\n"), 0);
    reply_is(sp, ":3\r\n");
    split_free(sp);

    /* a part's error is the reply, as the node gave it; nothing after */
    sp = make(SPLIT_SUM, argv);
    assert_int_equal(fold(sp, ":1\r\n"), 1);
    assert_int_equal(fold(sp, "-NOPERM no permissions\r\n"), 0);
    reply_is(sp, "-NOPERM no permissions\r\n");
    assert_int_equal(fold(sp, ":5\r\n"), 0);
    reply_is(sp, "-NOPERM no permissions\r\n");
    split_free(sp);
    split_free(NULL);
}

static void test_nonsense(void **state)
{
    (void)state;
    static const char *const mget[] = {"MGET", "{a}", "{b}", NULL};
    static const char *const del[] = {"DEL", "{a}", "{b}", NULL};
    static const char *const mset[] = {"MSET", "{a}", "1", "{b}", "2", NULL};
    static const struct {
        split_kind kind;
        const char *const *argv;
        const char *reply;
    } bad[] = {
        {SPLIT_ARRAY, mget, "*2\r\n$1\r\nx\r\n$1\r\ny\r\n"}, /* two elements for one key */
        {SPLIT_ARRAY, mget, "*1\r\n$5\r\nx\r\n"},            /* cut */
        {SPLIT_ARRAY, mget, "*1\r\n$1\r\nx\r\nextra"},       /* trailing bytes */
        {SPLIT_ARRAY, mget, ":1\r\n"},                       /* not an array */
        {SPLIT_ARRAY, mget, "*-1\r\n"},                      /* null array */
        {SPLIT_ARRAY, mget, ""},
        {SPLIT_SUM, del, "+OK\r\n"},
        {SPLIT_SUM, del, ":x\r\n"},
        {SPLIT_SUM, del, ":1"},
        {SPLIT_SUM, del, ":99999999999999999999999\r\n"},
        {SPLIT_OK, mset, ":1\r\n"},
        {SPLIT_OK, mset, "+QUEUED\r\n"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        split *sp = make(bad[i].kind, bad[i].argv);
        assert_non_null(sp);
        assert_int_equal(split_fold(sp, bad[i].reply, strlen(bad[i].reply)), 0);
        assert_int_equal(sp->failed, 1);
        assert_true(buf_used(&sp->reply) > 10 &&
                    memcmp(buf_head(&sp->reply), "-ERR ferry", 10) == 0);
        split_free(sp);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kinds),      cmocka_unit_test(test_mget_order),
        cmocka_unit_test(test_mset_pairs), cmocka_unit_test(test_sums_and_errors),
        cmocka_unit_test(test_nonsense),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
