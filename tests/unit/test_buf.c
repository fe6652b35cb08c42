/* test_buf.c - unit tests for proxy/base/buf.c's buffers that may hold a
 * password (the takeover's session frames): a compaction leaves no copy of
 * the bytes it moved, a growth keeps the unconsumed bytes only, and both
 * behave as buf_reserve otherwise. */

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "buf.h"

static int all_zero(const char *p, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (p[i] != 0) {
            return 0;
        }
    }
    return 1;
}

static int contains(const char *p, size_t n, const char *needle)
{
    size_t k = strlen(needle);
    for (size_t i = 0; i + k <= n; i++) {
        if (memcmp(p + i, needle, k) == 0) {
            return 1;
        }
    }
    return 0;
}

/* Consumed bytes in front, a few live ones behind: compacting moves the
 * live ones to the front and wipes where they were. */
static void test_compaction_wipes_moved_bytes(void **state)
{
    (void)state;
    buf b;
    buf_init(&b);
    buf_reserve_secret(&b, 1024);
    size_t cap = b.cap;
    memset(b.data, 'x', cap - 16);
    b.len = cap - 16;
    memcpy(b.data + b.len, "secret-password!", 16);
    b.len += 16;
    b.pos = cap - 16; /* only the password is unconsumed */
    buf_reserve_secret(&b, 64);
    assert_int_equal(b.cap, cap); /* compacted, not grown */
    assert_int_equal(b.pos, 0);
    assert_int_equal(buf_used(&b), 16);
    assert_memory_equal(buf_head(&b), "secret-password!", 16);
    assert_true(all_zero(b.data + cap - 16, 16)); /* where it was */
    assert_false(contains(b.data + 16, cap - 16, "secret"));
    buf_free_secret(&b);
    assert_null(b.data);
    assert_int_equal(b.cap, 0);
}

/* Growing copies the unconsumed bytes only, to the front of a new block. */
static void test_growth_keeps_live_bytes(void **state)
{
    (void)state;
    buf b;
    buf_init(&b);
    buf_append(&b, "consumed|live-part", 18);
    buf_consume(&b, 9);
    buf_reserve_secret(&b, 100000);
    assert_int_equal(b.pos, 0);
    assert_int_equal(buf_used(&b), 9);
    assert_memory_equal(buf_head(&b), "live-part", 9);
    assert_true(b.cap - b.len >= 100000);
    assert_false(contains(b.data, b.len, "consumed")); /* the rest is fresh memory */
    buf_free_secret(&b);
}

/* Room enough already: nothing moves. */
static void test_room_enough_changes_nothing(void **state)
{
    (void)state;
    buf b;
    buf_init(&b);
    buf_append(&b, "abcdef", 6);
    buf_consume(&b, 2);
    char *data = b.data;
    buf_reserve_secret(&b, 10);
    assert_ptr_equal(b.data, data);
    assert_int_equal(b.pos, 2);
    assert_memory_equal(buf_head(&b), "cdef", 4);
    buf_free_secret(&b);
    buf_free_secret(&b); /* an empty buffer too */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_compaction_wipes_moved_bytes),
        cmocka_unit_test(test_growth_keeps_live_bytes),
        cmocka_unit_test(test_room_enough_changes_nothing),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
