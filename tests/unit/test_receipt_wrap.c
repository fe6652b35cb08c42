/* test_receipt_wrap.c - unit tests for proxy/queue/receipt_wrap.c: a
 * client's script wrapped so that its reply is kept under a receipt (the
 * body on the wrapper's first line, a '#!lua' line kept first, read-only
 * and unknown shebangs left alone), and Redis' errors of the wrapped script
 * given back the client's script's SHA1. */

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "receipt_wrap.h"

static char *wrapped(const char *body)
{
    static char out[4096];
    buf b;
    buf_init(&b);
    if (receipt_wrap(body, strlen(body), &b) != 0) {
        assert_int_equal(buf_used(&b), 0);
        buf_free(&b);
        return NULL;
    }
    assert_true(buf_used(&b) < sizeof(out));
    memcpy(out, buf_head(&b), buf_used(&b));
    out[buf_used(&b)] = '\0';
    buf_free(&b);
    return out;
}

static size_t lines(const char *s)
{
    size_t n = 1;
    for (; *s != '\0'; s++) {
        n += *s == '\n';
    }
    return n;
}

static void test_plain_body_on_the_first_line(void **state)
{
    (void)state;
    const char *body = "local v = redis.call('ZRANGE', KEYS[1], 0, 0)\nreturn v[1]";
    char *w = wrapped(body);
    assert_non_null(w);
    assert_non_null(strstr(w, body));
    /* The body's lines are the wrapped script's: its first is the first. */
    assert_true(strstr(w, body) - w < (long)strcspn(w, "\n"));
    assert_int_equal(lines(w), lines(body) + 1); /* the wrapper's end on a line of its own */
    assert_non_null(strstr(w, "table.remove(KEYS)"));
    assert_non_null(strstr(w, "table.remove(ARGV)"));
    assert_non_null(strstr(w, "cmsgpack.pack"));
    assert_non_null(strstr(w, "redis.set_repl(redis.REPL_ALL)"));
    assert_non_null(strstr(w, "redis.pcall('SELECT', 0)")); /* the receipt in database 0 */
    /* A body ending in a comment is closed on the next line. */
    assert_non_null(strstr(wrapped("return 1 -- done"), "-- done\nend)()"));
}

static void test_shebang_kept_first(void **state)
{
    (void)state;
    const char *body = "#!lua flags=allow-oom\nreturn redis.call('LPOP', KEYS[1])";
    char *w = wrapped(body);
    assert_non_null(w);
    assert_memory_equal(w, "#!lua flags=allow-oom\nlocal ferry_rk", 36);
    assert_non_null(strstr(w, "return redis.call('LPOP', KEYS[1])\nend)()"));
    assert_int_equal(lines(w), lines(body) + 1);
    assert_non_null(wrapped("#!lua\nreturn 1"));
    assert_non_null(wrapped("#!lua\r\nreturn 1"));
    assert_non_null(wrapped("#!lua flags=no-cluster,allow-stale\nreturn 1"));
}

static void test_read_only_and_unknown_shebangs_not_wrapped(void **state)
{
    (void)state;
    assert_null(wrapped("#!lua flags=no-writes\nreturn redis.call('GET', KEYS[1])"));
    assert_null(wrapped("#!lua flags=allow-oom,no-writes\nreturn 1"));
    assert_null(wrapped("#!lua flags=no-writes,allow-stale\nreturn 1"));
    assert_null(wrapped("#!lua name=x flags=no-writes\nreturn 1"));
    assert_null(wrapped("#!python\nreturn 1"));
    assert_null(wrapped("#!luajit\nreturn 1"));
    assert_non_null(wrapped("#!lua flags=no-writesx\nreturn 1")); /* not that flag */
}

static void error_is(const char *reply, const char *want)
{
    char sha[41];
    memset(sha, 'a', 40);
    sha[40] = '\0';
    buf b;
    buf_init(&b);
    int fixed = receipt_wrap_error(reply, strlen(reply), sha, &b);
    if (want == NULL) {
        assert_int_equal(fixed, 0);
        assert_int_equal(buf_used(&b), 0);
    } else {
        assert_int_equal(fixed, 1);
        assert_int_equal(buf_used(&b), strlen(want));
        assert_memory_equal(buf_head(&b), want, strlen(want));
    }
    buf_free(&b);
}

static void test_errors_name_the_clients_script(void **state)
{
    (void)state;
    error_is("-ERR Unknown Redis command called from script script: "
             "2e62bd290e1c67129a92c7fb276cb127c2216bcc, on @user_script:1.\r\n",
             "-ERR Unknown Redis command called from script script: "
             "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa, on @user_script:1.\r\n");
    error_is("-ERR user_script:2: Script attempted to access nonexistent global variable 'x' "
             "script: 1032408B3A84E6D707827CB41AE326B250ED5318, on @user_script:2.\r\n",
             "-ERR user_script:2: Script attempted to access nonexistent global variable 'x' "
             "script: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa, on @user_script:2.\r\n");
    error_is("-MYERR something\r\n", NULL);
    error_is("-ERR script: abc\r\n", NULL);
    error_is("+OK\r\n", NULL);
    error_is("$-1\r\n", NULL);
    error_is("", NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_plain_body_on_the_first_line),
        cmocka_unit_test(test_shebang_kept_first),
        cmocka_unit_test(test_read_only_and_unknown_shebangs_not_wrapped),
        cmocka_unit_test(test_errors_name_the_clients_script),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
