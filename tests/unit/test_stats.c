/* test_stats.c - unit tests for proxy/ops/stats.c: histogram bucket edges, the
 * command class counters, JSON escaping and structure, and the Prometheus
 * text (HELP/TYPE per family, cumulative buckets, +Inf equal to _count),
 * rendered from a context without an upstream. */

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "command.h"
#include "ferry.h"
#include "stats.h"

/* A context that can be rendered: a loop, default config, no upstream. */
typedef struct fixture {
    uv_loop_t loop; /* only uv_now() is used */
    config cfg;     /* defaults */
    ferry f;        /* zeroed, then loop and cfg set */
    buf out;        /* rendered text, NUL-terminated by render() */
} fixture;

static int setup(void **state)
{
    fixture *fx = calloc(1, sizeof(*fx));
    assert_non_null(fx);
    assert_int_equal(uv_loop_init(&fx->loop), 0);
    config_defaults(&fx->cfg);
    fx->f.loop = &fx->loop;
    fx->f.cfg = &fx->cfg;
    list_init(&fx->f.sessions);
    fx->f.started_ms = uv_now(&fx->loop);
    buf_init(&fx->out);
    *state = fx;
    return 0;
}

static int teardown(void **state)
{
    fixture *fx = *state;
    buf_free(&fx->out);
    config_free(&fx->cfg);
    assert_int_equal(uv_loop_close(&fx->loop), 0);
    free(fx);
    return 0;
}

/* Render with fn into fx->out and return it as a C string. */
static const char *render(fixture *fx, void (*fn)(ferry *, buf *))
{
    buf_clear(&fx->out);
    fn(&fx->f, &fx->out);
    buf_append(&fx->out, "", 1);
    return buf_head(&fx->out);
}

static void test_bucket_edges(void **state)
{
    (void)state;
    stats_histogram h;
    memset(&h, 0, sizeof(h));
    stats_observe(&h, 0);        /* first bucket */
    stats_observe(&h, 100);      /* le is inclusive: still the first */
    stats_observe(&h, 101);      /* second */
    stats_observe(&h, 10000000); /* the last finite bucket, 10 s */
    stats_observe(&h, 10000001); /* +Inf */
    assert_int_equal(h.bucket[0], 2);
    assert_int_equal(h.bucket[1], 1);
    assert_int_equal(h.bucket[STATS_NBUCKETS - 2], 1);
    assert_int_equal(h.bucket[STATS_NBUCKETS - 1], 1);
    assert_int_equal(h.count, 5);
    assert_int_equal(h.sum_us, 0 + 100 + 101 + 10000000 + 10000001);
    for (int i = 1; i < STATS_NBUCKETS - 1; i++) {
        assert_true(stats_bucket_us[i] > stats_bucket_us[i - 1]);
    }
}

static void test_observe_reply(void **state)
{
    (void)state;
    ferry_stats st;
    memset(&st, 0, sizeof(st));
    stats_observe_reply(&st, 1000000, 1500000, 2000000, 0); /* 1000 us, 500 us */
    stats_observe_reply(&st, 1000000, 0, 2000000, 1);       /* never sent: no upstream sample */
    stats_observe_reply(&st, 3000000, 0, 2000000, 0);       /* clock order broken: ignored */
    assert_int_equal(st.request_duration_seconds.count, 2);
    assert_int_equal(st.request_duration_seconds.sum_us, 2000);
    assert_int_equal(st.upstream_duration_seconds.count, 1);
    assert_int_equal(st.upstream_duration_seconds.sum_us, 500);
    assert_int_equal(st.redis_errors, 1);
}

static void test_count_command(void **state)
{
    (void)state;
    ferry_stats st;
    memset(&st, 0, sizeof(st));
    const char *words[] = {"get", "brpop", "subscribe", "multi", "select", "auth", "shutdown"};
    for (size_t i = 0; i < sizeof(words) / sizeof(words[0]); i++) {
        const command *c = command_lookup(words[i], strlen(words[i]));
        assert_non_null(c);
        stats_count_command(&st, c);
    }
    stats_count_command(&st, NULL);
    assert_int_equal(st.class_stateless, 1);
    assert_int_equal(st.class_blocking, 1);
    assert_int_equal(st.class_pubsub, 1);
    assert_int_equal(st.class_transaction, 1);
    assert_int_equal(st.class_connstate, 1);
    assert_int_equal(st.class_local, 1);
    assert_int_equal(st.class_denied, 1);
    assert_int_equal(st.class_unknown, 1);
}

static void test_held_peak(void **state)
{
    (void)state;
    ferry_stats st;
    memset(&st, 0, sizeof(st));
    stats_held(&st, 10);
    stats_held(&st, 5);
    assert_int_equal(st.held_bytes_peak, 10);
}

static void test_json(void **state)
{
    fixture *fx = *state;
    fx->f.stats.commands_total = 42;
    fx->f.stats.clients_total = 7;
    fx->f.nclients = 3;
    snprintf(fx->f.stats.durability_last_error, STATS_TEXT_MAX, "a\"b\\c\n\x01\xc3\xa9");
    stats_observe(&fx->f.stats.request_duration_seconds, 300);
    const char *j = render(fx, stats_render_json);

    assert_true(strncmp(j, "{\"service\":\"ferry\",\"source\":\"", 29) == 0);
    assert_non_null(strstr(j, "\"total_connections\":7,\"curr_connections\":3,\"clients\":{"));
    assert_non_null(strstr(j, "\"commands\":{\"commands_total\":42,"));
    assert_non_null(
        strstr(j, "\"durability_last_error\":\"a\\\"b\\\\c\\u000a\\u0001\\u00c3\\u00a9\""));
    assert_non_null(strstr(j, "\"upstream_state\":\"DOWN\""));
    /* Memory and the limits, from the context and the configuration. */
    fx->f.clients_mem = 12345;
    j = render(fx, stats_render_json);
    assert_non_null(strstr(j, "\"memory\":{\"memory_clients\":12345,\"memory_rss\":"));
    assert_non_null(strstr(j, "\"max_pipeline\":10000,"));
    assert_non_null(strstr(j, "\"pubsub_output_limit_hard\":33554432,"
                              "\"pubsub_output_limit_soft\":8388608,"
                              "\"pubsub_output_limit_soft_seconds\":60"));
    assert_non_null(strstr(j, "\"upstream_up\":false"));
    /* No sentinel: no replicas, an empty array (JSON only). */
    assert_non_null(strstr(j, "\"replicas_known\":0,\"replicas_enforced\":0,\"replicas\":[]}"));
    assert_non_null(strstr(j, "\"request_duration_seconds\":{\"count\":1,\"sum_seconds\":0.000300,"
                              "\"buckets\":{\"0.0001\":0,\"0.00025\":0,\"0.0005\":1,"));
    assert_non_null(strstr(j, "\"+Inf\":1}}"));
    assert_string_equal(j + strlen(j) - 3, "}}\n");
    /* Balanced braces outside strings, and no raw control bytes. */
    int depth = 0, in_str = 0;
    for (const char *p = j; *p != '\0'; p++) {
        if (in_str) {
            assert_true((unsigned char)*p >= 0x20 && (unsigned char)*p < 0x7f);
            if (*p == '\\') {
                p++;
            } else if (*p == '"') {
                in_str = 0;
            }
        } else if (*p == '"') {
            in_str = 1;
        } else if (*p == '{') {
            depth++;
        } else if (*p == '}') {
            depth--;
            assert_true(depth >= 0);
        }
    }
    assert_int_equal(depth, 0);
}

static void test_prometheus(void **state)
{
    fixture *fx = *state;
    fx->f.stats.commands_total = 5;
    snprintf(fx->f.stats.durability_last_error, STATS_TEXT_MAX, "x\"y\\z\nw");
    stats_observe(&fx->f.stats.request_duration_seconds, 50);
    stats_observe(&fx->f.stats.request_duration_seconds, 2000);
    stats_observe(&fx->f.stats.request_duration_seconds, 99000000);
    const char *t = render(fx, stats_render_prometheus);

    assert_non_null(strstr(t, "# HELP ferry_commands_total requests parsed from clients\n"
                              "# TYPE ferry_commands_total counter\nferry_commands_total 5\n"));
    assert_non_null(strstr(
        t,
        "ferry_durability_info{durability_last_error=\"x\\\"y\\\\z\\nw\",master_replid=\"\"} 1\n"));
    assert_non_null(strstr(t, "# TYPE ferry_request_duration_seconds histogram\n"
                              "ferry_request_duration_seconds_bucket{le=\"0.0001\"} 1\n"));
    assert_non_null(strstr(t, "ferry_request_duration_seconds_bucket{le=\"0.0025\"} 2\n"));
    assert_non_null(strstr(t, "ferry_request_duration_seconds_bucket{le=\"10\"} 2\n"
                              "ferry_request_duration_seconds_bucket{le=\"+Inf\"} 3\n"
                              "ferry_request_duration_seconds_sum 99.002050\n"
                              "ferry_request_duration_seconds_count 3\n"));
    assert_non_null(strstr(t, "ferry_upstream_down_for_seconds 0.000\n"));
    assert_null(strstr(t, "total_connections")); /* JSON-only */
    /* Each TYPE line is preceded by its HELP line. */
    for (const char *p = strstr(t, "# TYPE "); p != NULL; p = strstr(p + 1, "# TYPE ")) {
        const char *name = p + 7;
        size_t n = strcspn(name, " ");
        const char *prev = p - 1;
        while (prev > t && prev[-1] != '\n') {
            prev--;
        }
        assert_true(strncmp(prev, "# HELP ", 7) == 0 && strncmp(prev + 7, name, n) == 0);
    }
}

static void test_describe(void **state)
{
    (void)state;
    char *text = NULL;
    size_t len = 0;
    FILE *mem = open_memstream(&text, &len);
    assert_non_null(mem);
    stats_describe(mem);
    fclose(mem);
    assert_non_null(strstr(text, "commands.commands_total "));
    assert_non_null(strstr(text, " ferry_commands_total "));
    assert_true(strncmp(text, "service ", 8) == 0);
    /* cluster mode's entries follow, per shard under cluster.shards[] */
    assert_non_null(strstr(text, "\ncluster.shards[].routed "));
    assert_non_null(strstr(text, " ferry_cluster_shard_requests_total "));
    assert_non_null(strstr(text, "\ncluster.last_error "));
    int lines = 0;
    for (const char *p = text; *p != '\0'; p++) {
        lines += *p == '\n';
    }
    assert_true(lines > 40);
    free(text);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bucket_edges),
        cmocka_unit_test(test_observe_reply),
        cmocka_unit_test(test_count_command),
        cmocka_unit_test(test_held_peak),
        cmocka_unit_test_setup_teardown(test_json, setup, teardown),
        cmocka_unit_test_setup_teardown(test_prometheus, setup, teardown),
        cmocka_unit_test(test_describe),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
