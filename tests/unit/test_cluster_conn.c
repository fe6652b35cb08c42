/* test_cluster_conn.c - unit tests for proxy/router/cluster_conn.c: the slot of
 * commands whose keys Redis finds by its own rules (XREAD and XREADGROUP
 * after STREAMS, the MPOP family after numkeys), keys of two slots, and
 * arguments Redis refuses (no slot: any master answers) without a crash. */

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "cluster_conn.h"
#include "command.h"
#include "slot.h"

/* cluster_movable_slot of argv (NULL-terminated). */
static int slot_of(const char *const *argv)
{
    resp_arg args[32];
    size_t lens[32];
    size_t n = 0;
    while (argv[n] != NULL) {
        args[n].ptr = argv[n];
        args[n].len = strlen(argv[n]);
        lens[n] = args[n].len;
        n++;
    }
    const command *cmd = command_lookup_argv(n, argv, lens);
    resp_request req = {.len = 0, .is_inline = 0, .argc = n, .argv = args};
    return cluster_movable_slot(cmd, &req);
}

static int key_slot(const char *k)
{
    return slot_of_key(k, strlen(k));
}

static void test_xread(void **state)
{
    (void)state;
    const char *one[] = {"XREAD", "COUNT", "2", "BLOCK", "0", "STREAMS",
                         "s{a}",  "t{a}",  "0", "$",     NULL};
    assert_int_equal(slot_of(one), key_slot("{a}"));
    const char *plain[] = {"xread", "streams", "s", "0", NULL};
    assert_int_equal(slot_of(plain), key_slot("s"));
    const char *group[] = {"XREADGROUP", "GROUP",   "streams", "c", "NOACK", "BLOCK",
                           "10",         "STREAMS", "q{b}",    ">", NULL};
    assert_int_equal(slot_of(group), key_slot("q{b}"));
    const char *cross[] = {"XREAD", "STREAMS", "a", "b", "0", "0", NULL};
    assert_true(key_slot("a") != key_slot("b"));
    assert_int_equal(slot_of(cross), MOVABLE_CROSS);
    /* what Redis refuses: no slot, any master answers its error */
    const char *odd[] = {"XREAD", "STREAMS", "a", "b", "0", NULL};
    assert_int_equal(slot_of(odd), -1);
    const char *none[] = {"XREAD", "BLOCK", "0", "STREAMS", NULL};
    assert_int_equal(slot_of(none), -1);
    const char *nostreams[] = {"XREAD", "COUNT", "1", "a", "0", NULL};
    assert_int_equal(slot_of(nostreams), -1);
    const char *cut[] = {"XREADGROUP", "GROUP", NULL};
    assert_int_equal(slot_of(cut), -1);
}

static void test_mpop(void **state)
{
    (void)state;
    const char *bl[] = {"BLMPOP", "0", "2", "l{x}", "m{x}", "LEFT", NULL};
    assert_int_equal(slot_of(bl), key_slot("{x}"));
    const char *z[] = {"ZMPOP", "1", "z", "MIN", NULL};
    assert_int_equal(slot_of(z), key_slot("z"));
    const char *bz[] = {"BZMPOP", "1", "2", "a", "b", "MAX", NULL};
    assert_int_equal(slot_of(bz), MOVABLE_CROSS);
    const char *l[] = {"LMPOP", "2", "a", "b", "LEFT", NULL};
    assert_int_equal(slot_of(l), MOVABLE_CROSS);
    const char *zero[] = {"LMPOP", "0", "a", "LEFT", NULL};
    assert_int_equal(slot_of(zero), -1);
    const char *big[] = {"LMPOP", "99", "a", "LEFT", NULL};
    assert_int_equal(slot_of(big), -1);
    const char *nan[] = {"BLMPOP", "0", "x", "a", "LEFT", NULL};
    assert_int_equal(slot_of(nan), -1);
    const char *short_[] = {"BLMPOP", "0", NULL};
    assert_int_equal(slot_of(short_), -1);
}

static void test_other_commands(void **state)
{
    (void)state;
    const char *get[] = {"GET", "a", NULL};
    assert_int_equal(slot_of(get), MOVABLE_NONE);
    const char *sort[] = {"SORT", "a", NULL};
    assert_int_equal(slot_of(sort), MOVABLE_NONE);
    resp_request req = {.len = 0, .is_inline = 0, .argc = 0, .argv = NULL};
    assert_int_equal(cluster_movable_slot(NULL, &req), MOVABLE_NONE);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_xread),
        cmocka_unit_test(test_mpop),
        cmocka_unit_test(test_other_commands),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
