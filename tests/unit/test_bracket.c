/* test_bracket.c - unit tests for proxy/shard/bracket.c: the verdict on each side
 * of the new master's boundary (second_repl_offset - 1, the last byte of the
 * old stream it holds) and on it, a replication id that does not match, a
 * master without a backlog, and a bracket whose end is not known; which
 * commands take data out, and a push's parts (a push's receipt, receipts.c). */

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "bracket.h"
#include "command.h"
#include "ferry.h"

#include <string.h>

#define OLD "3f1c9b7de0a24c6f8b5e1d2a9c0f7e6b5a4d3c2b"
#define OTHER "9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c4d3e2f1a0b"

static bracket_verdict decide(long long lo, long long hi, long long second)
{
    bracket b = {OLD, 1, lo, hi};
    bracket_heir h = {OLD, second};
    return bracket_decide(&b, &h);
}

/* The new master holds bytes 1..999 (second_repl_offset 1000). */
static void test_bracket_below_boundary_applied(void **state)
{
    (void)state;
    assert_int_equal(decide(900, 950, 1000), BRACKET_APPLIED);
    assert_int_equal(decide(900, 998, 1000), BRACKET_APPLIED);
}

static void test_bracket_ends_on_boundary_applied(void **state)
{
    (void)state;
    /* Its last byte is 999 at the latest: the last byte shared. */
    assert_int_equal(decide(900, 999, 1000), BRACKET_APPLIED);
}

static void test_bracket_ends_one_past_boundary_ambiguous(void **state)
{
    (void)state;
    /* Byte 1000 may be its own and is not on the new master. */
    assert_int_equal(decide(900, 1000, 1000), BRACKET_AMBIGUOUS);
    assert_int_equal(decide(998, 1000, 1000), BRACKET_AMBIGUOUS);
}

static void test_bracket_starts_on_boundary_not_applied(void **state)
{
    (void)state;
    /* Offset 999 before it: its first byte is 1000 or later, not shared. */
    assert_int_equal(decide(999, 1040, 1000), BRACKET_NOT_APPLIED);
}

static void test_bracket_starts_one_before_boundary_ambiguous(void **state)
{
    (void)state;
    /* Its first byte may be 999, which the new master holds. */
    assert_int_equal(decide(998, 1040, 1000), BRACKET_AMBIGUOUS);
}

static void test_bracket_above_boundary_not_applied(void **state)
{
    (void)state;
    assert_int_equal(decide(1000, 1040, 1000), BRACKET_NOT_APPLIED);
    assert_int_equal(decide(5000, 6000, 1000), BRACKET_NOT_APPLIED);
}

static void test_bracket_straddles_boundary_ambiguous(void **state)
{
    (void)state;
    assert_int_equal(decide(900, 1100, 1000), BRACKET_AMBIGUOUS);
}

static void test_bracket_empty_on_boundary_applied(void **state)
{
    (void)state;
    /* Propagated nothing (lo == hi == 999): APPLIED is checked first. */
    assert_int_equal(decide(999, 999, 1000), BRACKET_APPLIED);
}

static void test_bracket_replid_mismatch_ambiguous(void **state)
{
    (void)state;
    bracket b = {OLD, 1, 900, 950};
    bracket_heir other = {OTHER, 1000};
    assert_int_equal(bracket_decide(&b, &other), BRACKET_AMBIGUOUS);
    b.lo = 2000;
    b.hi = 2100;
    assert_int_equal(bracket_decide(&b, &other), BRACKET_AMBIGUOUS);
    /* No second id on the new master (Redis writes 40 zeros and -1). */
    bracket_heir none = {"0000000000000000000000000000000000000000", -1};
    assert_int_equal(bracket_decide(&b, &none), BRACKET_AMBIGUOUS);
    bracket_heir null_id = {NULL, 1000};
    assert_int_equal(bracket_decide(&b, &null_id), BRACKET_AMBIGUOUS);
    /* The old master's id was never learned. */
    bracket unknown = {NULL, 1, 900, 950};
    bracket_heir h = {OLD, 1000};
    assert_int_equal(bracket_decide(&unknown, &h), BRACKET_AMBIGUOUS);
    /* A truncated id is no match either. */
    bracket_heir shortid = {"3f1c9b7d", 1000};
    bracket b2 = {"3f1c9b7d", 1, 900, 950};
    assert_int_equal(bracket_decide(&b2, &shortid), BRACKET_AMBIGUOUS);
}

static void test_bracket_no_backlog_ambiguous(void **state)
{
    (void)state;
    /* The master said it has no backlog: its offset does not move. */
    bracket b = {OLD, 0, 500, 500};
    bracket_heir h = {OLD, 1000};
    assert_int_equal(bracket_decide(&b, &h), BRACKET_AMBIGUOUS);
    b.lo = 2000;
    b.hi = 2000;
    assert_int_equal(bracket_decide(&b, &h), BRACKET_AMBIGUOUS);
    /* Offset still 0 after the request: nothing was ever propagated. */
    bracket zero = {OLD, 1, 0, 0};
    bracket_heir first = {OLD, 1};
    assert_int_equal(bracket_decide(&zero, &first), BRACKET_AMBIGUOUS);
    /* second_repl_offset 0: not a valid boundary. */
    bracket ok = {OLD, 1, 10, 20};
    bracket_heir bad = {OLD, 0};
    assert_int_equal(bracket_decide(&ok, &bad), BRACKET_AMBIGUOUS);
}

static void test_bracket_hi_unknown(void **state)
{
    (void)state;
    /* A request sent with no reply yet: only lo is known. */
    assert_int_equal(decide(999, BRACKET_UNKNOWN, 1000), BRACKET_NOT_APPLIED);
    assert_int_equal(decide(1500, BRACKET_UNKNOWN, 1000), BRACKET_NOT_APPLIED);
    assert_int_equal(decide(998, BRACKET_UNKNOWN, 1000), BRACKET_AMBIGUOUS);
    assert_int_equal(decide(100, BRACKET_UNKNOWN, 1000), BRACKET_AMBIGUOUS);
    /* Nothing known at all. */
    assert_int_equal(decide(BRACKET_UNKNOWN, BRACKET_UNKNOWN, 1000), BRACKET_AMBIGUOUS);
    /* lo unknown, hi known. */
    assert_int_equal(decide(BRACKET_UNKNOWN, 950, 1000), BRACKET_APPLIED);
    assert_int_equal(decide(BRACKET_UNKNOWN, 1001, 1000), BRACKET_AMBIGUOUS);
}

static void test_bracket_inverted_ambiguous(void **state)
{
    (void)state;
    assert_int_equal(decide(1500, 900, 1000), BRACKET_AMBIGUOUS);
}

static void test_bracket_null_inputs(void **state)
{
    (void)state;
    bracket b = {OLD, 1, 900, 950};
    bracket_heir h = {OLD, 1000};
    assert_int_equal(bracket_decide(NULL, &h), BRACKET_AMBIGUOUS);
    assert_int_equal(bracket_decide(&b, NULL), BRACKET_AMBIGUOUS);
    assert_string_equal(bracket_verdict_name(BRACKET_APPLIED), "applied");
    assert_string_equal(bracket_verdict_name(BRACKET_NOT_APPLIED), "not applied");
    assert_string_equal(bracket_verdict_name(BRACKET_AMBIGUOUS), "ambiguous");
}

static void test_delivers_by_verdict_and_kind(void **state)
{
    (void)state;
    /* Applied: the reply, never sent again, whatever it carries. */
    assert_int_equal(bracket_delivers(BRACKET_APPLIED, 0), 1);
    assert_int_equal(bracket_delivers(BRACKET_APPLIED, 1), 1);
    /* Not applied: sent again (a pop's item is still there). */
    assert_int_equal(bracket_delivers(BRACKET_NOT_APPLIED, 0), 0);
    assert_int_equal(bracket_delivers(BRACKET_NOT_APPLIED, 1), 0);
    /* Ambiguous: a pop's item delivered; any other reply (an ack, XADD's
     * id, a script's value: data a write made) sent again. */
    assert_int_equal(bracket_delivers(BRACKET_AMBIGUOUS, 1), 1);
    assert_int_equal(bracket_delivers(BRACKET_AMBIGUOUS, 0), 0);
}

static void test_takes_out_by_command(void **state)
{
    (void)state;
    static const char *const out[] = {"rpop",      "lpop",       "brpop",     "blmove",
                                      "rpoplpush", "zpopmin",    "lmpop",     "spop",
                                      "getdel",    "xreadgroup", "xautoclaim"};
    static const char *const made[] = {"xadd",    "set",   "getset", "incrbyfloat", "eval",
                                       "evalsha", "fcall", "lpush",  "exec",        "lrange"};
    for (size_t i = 0; i < sizeof(out) / sizeof(out[0]); i++) {
        const command *c = command_lookup(out[i], strlen(out[i]));
        assert_non_null(c);
        assert_true(command_takes_out(c));
    }
    for (size_t i = 0; i < sizeof(made) / sizeof(made[0]); i++) {
        const command *c = command_lookup(made[i], strlen(made[i]));
        assert_non_null(c);
        assert_false(command_takes_out(c));
    }
    assert_false(command_takes_out(NULL));
}

/* r as a client's command: its bytes and its table entry. */
static void as_command(request *r, const char *name, const char *bytes)
{
    memset(r, 0, sizeof(*r));
    buf_init(&r->data);
    buf_append(&r->data, bytes, strlen(bytes));
    r->cmd = command_lookup(name, strlen(name));
    assert_non_null(r->cmd);
}

static void test_push_view(void **state)
{
    (void)state;
    request r;
    push_view v;
    as_command(&r, "rpush", "*4\r\n$5\r\nRPUSH\r\n$1\r\nq\r\n$2\r\nv1\r\n$3\r\nv22\r\n");
    assert_int_equal(request_push_view(&r, &v), 0);
    assert_int_equal(v.klen, 1);
    assert_memory_equal(v.key, "q", 1);
    assert_int_equal(v.nvalues, 2);
    assert_int_equal(v.tlen, strlen("$2\r\nv1\r\n$3\r\nv22\r\n"));
    assert_memory_equal(v.tail, "$2\r\nv1\r\n", 8);
    buf_free(&r.data);
    /* No value: Redis answers its arity error, nothing to view. */
    as_command(&r, "lpushx", "*2\r\n$6\r\nLPUSHX\r\n$1\r\nq\r\n");
    assert_int_equal(request_push_view(&r, &v), -1);
    buf_free(&r.data);
    /* Not a push. */
    as_command(&r, "lpos", "*3\r\n$4\r\nLPOS\r\n$1\r\nq\r\n$1\r\nv\r\n");
    assert_int_equal(request_push_view(&r, &v), -1);
    buf_free(&r.data);
    r.cmd = NULL;
    assert_int_equal(request_push_view(&r, &v), -1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_delivers_by_verdict_and_kind),
        cmocka_unit_test(test_takes_out_by_command),
        cmocka_unit_test(test_push_view),
        cmocka_unit_test(test_bracket_below_boundary_applied),
        cmocka_unit_test(test_bracket_ends_on_boundary_applied),
        cmocka_unit_test(test_bracket_ends_one_past_boundary_ambiguous),
        cmocka_unit_test(test_bracket_starts_on_boundary_not_applied),
        cmocka_unit_test(test_bracket_starts_one_before_boundary_ambiguous),
        cmocka_unit_test(test_bracket_above_boundary_not_applied),
        cmocka_unit_test(test_bracket_straddles_boundary_ambiguous),
        cmocka_unit_test(test_bracket_empty_on_boundary_applied),
        cmocka_unit_test(test_bracket_replid_mismatch_ambiguous),
        cmocka_unit_test(test_bracket_no_backlog_ambiguous),
        cmocka_unit_test(test_bracket_hi_unknown),
        cmocka_unit_test(test_bracket_inverted_ambiguous),
        cmocka_unit_test(test_bracket_null_inputs),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
