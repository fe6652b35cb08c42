/* test_durable.c - unit tests for proxy/base/durable.c: the durability verdict on
 * INFO persistence bodies as Redis 7.0 writes them (a case table over every
 * field and each history), plus malformed, truncated and odd input, and the
 * reason buffer's bounds. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "durable.h"

/* An INFO persistence body shaped like Redis 7.0's, with the six fields the
 * verdict reads set from the arguments (strings, so odd values fit). */
static void body7(char *out, size_t len, const char *loading, const char *enabled,
                  const char *inprog, const char *sched, const char *bgrw, const char *write)
{
    snprintf(out, len,
             "# Persistence\r\n"
             "loading:%s\r\n"
             "async_loading:0\r\n"
             "current_cow_peak:0\r\n"
             "current_save_keys_processed:0\r\n"
             "rdb_changes_since_last_save:0\r\n"
             "rdb_bgsave_in_progress:0\r\n"
             "rdb_last_bgsave_status:ok\r\n"
             "aof_enabled:%s\r\n"
             "aof_rewrite_in_progress:%s\r\n"
             "aof_rewrite_scheduled:%s\r\n"
             "aof_last_rewrite_time_sec:-1\r\n"
             "aof_current_rewrite_time_sec:0\r\n"
             "aof_last_bgrewrite_status:%s\r\n"
             "aof_rewrites:1\r\n"
             "aof_rewrites_consecutive_failures:0\r\n"
             "aof_last_write_status:%s\r\n"
             "aof_last_cow_size:0\r\n"
             "module_fork_in_progress:0\r\n"
             "aof_current_size:0\r\n"
             "aof_base_size:0\r\n",
             loading, enabled, inprog, sched, bgrw, write);
}

typedef struct verdict_case {
    const char *loading, *enabled, *inprog, *sched, *bgrw, *write; /* field values */
    durable_history hist;                                          /* what ferry knew */
    int trusted;                                                   /* expected verdict */
    const char *why;                                               /* expected reason */
} verdict_case;

#define OK_FIELDS "0", "1", "0", "0", "ok", "ok"

static const verdict_case cases[] = {
    /* the durable steady state, whatever ferry knew */
    {OK_FIELDS, DURABLE_UNKNOWN, 1, ""},
    {OK_FIELDS, DURABLE_WAS_OFF, 1, ""},
    {OK_FIELDS, DURABLE_SETTLED, 1, ""},
    /* AOF off */
    {"0", "0", "0", "0", "ok", "ok", DURABLE_UNKNOWN, 0, "appendonly is off (aof_enabled:0)"},
    {"0", "0", "0", "0", "ok", "ok", DURABLE_SETTLED, 0, "appendonly is off (aof_enabled:0)"},
    /* the initial rewrite right after CONFIG SET appendonly yes */
    {"0", "1", "1", "0", "ok", "ok", DURABLE_WAS_OFF, 0, "initial AOF rewrite in progress"},
    {"0", "1", "1", "0", "ok", "ok", DURABLE_UNKNOWN, 0,
     "AOF rewrite in progress (it may be the initial one)"},
    /* ... a routine rewrite on a node already seen durable is fine */
    {"0", "1", "1", "0", "ok", "ok", DURABLE_SETTLED, 1, ""},
    /* scheduled: waits for a running child (a BGSAVE) to end */
    {"0", "1", "0", "1", "ok", "ok", DURABLE_WAS_OFF, 0, "initial AOF rewrite scheduled"},
    {"0", "1", "0", "1", "ok", "ok", DURABLE_UNKNOWN, 0,
     "AOF rewrite scheduled (it may be the initial one)"},
    {"0", "1", "0", "1", "ok", "ok", DURABLE_SETTLED, 1, ""},
    /* in progress wins over scheduled in the reason */
    {"0", "1", "1", "1", "ok", "ok", DURABLE_WAS_OFF, 0, "initial AOF rewrite in progress"},
    /* the initial rewrite failed; a failed routine one leaves the AOF in use */
    {"0", "1", "0", "0", "err", "ok", DURABLE_WAS_OFF, 0,
     "the initial AOF rewrite failed (aof_last_bgrewrite_status:err)"},
    {"0", "1", "0", "0", "err", "ok", DURABLE_UNKNOWN, 1, ""},
    {"0", "1", "0", "0", "err", "ok", DURABLE_SETTLED, 1, ""},
    /* the last write to the AOF failed (disk full): never trusted */
    {"0", "1", "0", "0", "ok", "err", DURABLE_SETTLED, 0,
     "the last AOF write failed (aof_last_write_status:err)"},
    {"0", "1", "0", "0", "ok", "err", DURABLE_UNKNOWN, 0,
     "the last AOF write failed (aof_last_write_status:err)"},
    /* loading comes first */
    {"1", "1", "1", "0", "ok", "err", DURABLE_SETTLED, 0, "loading its data set (loading:1)"},
    {"1", "0", "0", "0", "ok", "ok", DURABLE_UNKNOWN, 0, "loading its data set (loading:1)"},
    /* values that are neither 0/1 nor ok/err count as missing */
    {"0", "2", "0", "0", "ok", "ok", DURABLE_SETTLED, 0,
     "INFO persistence has no usable aof_enabled field"},
    {"0", "1", "", "0", "ok", "ok", DURABLE_SETTLED, 0,
     "INFO persistence has no usable aof_rewrite_in_progress field"},
    {"0", "1", "0", "yes", "ok", "ok", DURABLE_SETTLED, 0,
     "INFO persistence has no usable aof_rewrite_scheduled field"},
    {"0", "1", "0", "0", "OK", "ok", DURABLE_SETTLED, 0,
     "INFO persistence has no usable aof_last_bgrewrite_status field"},
    {"0", "1", "0", "0", "ok", "okay", DURABLE_SETTLED, 0,
     "INFO persistence has no usable aof_last_write_status field"},
    {"-1", "1", "0", "0", "ok", "ok", DURABLE_SETTLED, 0,
     "INFO persistence has no usable loading field"},
    {"0", "1 ", "0", "0", "ok", "ok", DURABLE_SETTLED, 0,
     "INFO persistence has no usable aof_enabled field"},
};

static void test_case_table(void **state)
{
    (void)state;
    char body[2048], why[DURABLE_WHY_MAX];
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        const verdict_case *c = &cases[i];
        body7(body, sizeof(body), c->loading, c->enabled, c->inprog, c->sched, c->bgrw, c->write);
        memset(why, 'x', sizeof(why));
        int got = durable_check(body, strlen(body), c->hist, why, sizeof(why));
        if (got != c->trusted || strcmp(why, c->why) != 0) {
            print_error("case %zu: got %d '%s', want %d '%s'\n", i, got, why, c->trusted, c->why);
        }
        assert_int_equal(got, c->trusted);
        assert_string_equal(why, c->why);
        /* The same body with bare LF line ends. */
        char lf[2048];
        size_t n = 0;
        for (const char *p = body; *p != '\0'; p++) {
            if (*p != '\r') {
                lf[n++] = *p;
            }
        }
        assert_int_equal(durable_check(lf, n, c->hist, why, sizeof(why)), c->trusted);
        assert_string_equal(why, c->why);
    }
}

/* Every field parsed, and -1 for those missing. */
static void test_parse_fields(void **state)
{
    (void)state;
    char body[2048];
    durable_info in;
    body7(body, sizeof(body), "1", "0", "1", "0", "err", "ok");
    durable_parse(body, strlen(body), &in);
    assert_int_equal(in.loading, 1);
    assert_int_equal(in.aof_enabled, 0);
    assert_int_equal(in.aof_rewrite_in_progress, 1);
    assert_int_equal(in.aof_rewrite_scheduled, 0);
    assert_int_equal(in.aof_last_bgrewrite_ok, 0);
    assert_int_equal(in.aof_last_write_ok, 1);

    durable_parse("", 0, &in);
    assert_int_equal(in.loading, -1);
    assert_int_equal(in.aof_enabled, -1);
    assert_int_equal(in.aof_rewrite_in_progress, -1);
    assert_int_equal(in.aof_rewrite_scheduled, -1);
    assert_int_equal(in.aof_last_bgrewrite_ok, -1);
    assert_int_equal(in.aof_last_write_ok, -1);
    durable_parse(NULL, 10, &in);
    assert_int_equal(in.aof_enabled, -1);
}

/* Every proper prefix of a trusted body is cut inside or before some field
 * the verdict needs (the last one sits before three trailing lines, so those
 * prefixes pass) and must never be trusted by mistake: only prefixes holding
 * all six complete lines may be. */
static void test_truncated(void **state)
{
    (void)state;
    char body[2048], why[DURABLE_WHY_MAX];
    body7(body, sizeof(body), OK_FIELDS);
    size_t len = strlen(body);
    const char *last = strstr(body, "aof_last_write_status:ok\r\n");
    assert_non_null(last);
    size_t complete = (size_t)(last - body) + strlen("aof_last_write_status:ok");
    for (size_t n = 0; n < len; n++) {
        int got = durable_check(body, n, DURABLE_SETTLED, why, sizeof(why));
        assert_int_equal(got, n >= complete);
        if (!got) {
            assert_non_null(strstr(why, "INFO persistence has no usable"));
        }
    }
}

/* Names must match whole; the last occurrence wins; other sections and
 * blank lines are skipped; a missing line end on the last line is fine. */
static void test_odd_input(void **state)
{
    (void)state;
    char why[DURABLE_WHY_MAX];
    const char *prefixes = "loading:0\naof_enabled_x:1\nx_aof_enabled:1\naof_enabled:0\n"
                           "aof_rewrite_in_progress:0\naof_rewrite_scheduled:0\n"
                           "aof_last_bgrewrite_status:ok\naof_last_write_status:ok";
    assert_int_equal(durable_check(prefixes, strlen(prefixes), DURABLE_SETTLED, why, sizeof(why)),
                     0);
    assert_string_equal(why, "appendonly is off (aof_enabled:0)");

    const char *dup = "loading:0\naof_enabled:0\naof_rewrite_in_progress:0\n\n\n"
                      "# Stats\naof_rewrite_scheduled:0\naof_last_bgrewrite_status:ok\n"
                      "garbage without colon\n:\naof_last_write_status:ok\naof_enabled:1";
    assert_int_equal(durable_check(dup, strlen(dup), DURABLE_UNKNOWN, why, sizeof(why)), 1);
    assert_string_equal(why, "");

    /* A NUL inside a value does not end the body early or match. */
    const char nul[] = "loading:0\naof_enabled:1\0\naof_rewrite_in_progress:0\n"
                       "aof_rewrite_scheduled:0\naof_last_bgrewrite_status:ok\n"
                       "aof_last_write_status:ok\n";
    assert_int_equal(durable_check(nul, sizeof(nul) - 1, DURABLE_SETTLED, why, sizeof(why)), 0);
    assert_string_equal(why, "INFO persistence has no usable aof_enabled field");

    /* A header line that happens to contain a colon is a comment. */
    const char *hdr = "#aof_enabled:1\nloading:0\naof_rewrite_in_progress:0\n"
                      "aof_rewrite_scheduled:0\naof_last_bgrewrite_status:ok\n"
                      "aof_last_write_status:ok\n";
    assert_int_equal(durable_check(hdr, strlen(hdr), DURABLE_SETTLED, why, sizeof(why)), 0);
    assert_string_equal(why, "INFO persistence has no usable aof_enabled field");
}

/* The reason is cut to the buffer and always terminated; len 0 writes
 * nothing. */
static void test_reason_buffer(void **state)
{
    (void)state;
    char body[2048], small[8];
    body7(body, sizeof(body), "0", "1", "1", "0", "ok", "ok");
    memset(small, 'x', sizeof(small));
    assert_int_equal(durable_check(body, strlen(body), DURABLE_WAS_OFF, small, sizeof(small)), 0);
    assert_string_equal(small, "initial");

    char none[1] = {'z'};
    assert_int_equal(durable_check(body, strlen(body), DURABLE_WAS_OFF, none, 0), 0);
    assert_int_equal(none[0], 'z');

    /* The longest reason fits DURABLE_WHY_MAX. */
    char why[DURABLE_WHY_MAX];
    durable_info in = {-1, -1, -1, -1, -1, -1};
    in.loading = 0;
    in.aof_enabled = 1;
    in.aof_rewrite_in_progress = 0;
    in.aof_rewrite_scheduled = 0;
    in.aof_last_write_ok = 1;
    assert_int_equal(durable_judge(&in, DURABLE_SETTLED, why, sizeof(why)), 0);
    assert_string_equal(why, "INFO persistence has no usable aof_last_bgrewrite_status field");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_case_table),    cmocka_unit_test(test_parse_fields),
        cmocka_unit_test(test_truncated),     cmocka_unit_test(test_odd_input),
        cmocka_unit_test(test_reason_buffer),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
