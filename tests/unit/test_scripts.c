/* test_scripts.c - unit tests for proxy/router/scripts.c: the SHA1 is Redis'
 * name of a script; what a reply makes ferry remember, drop (least
 * recently used past scripts.remember_max_bytes) and forget (SCRIPT
 * FLUSH), seen through the one verdict the router acts on: an EVALSHA
 * answered -NOSCRIPT is sent again only for a script ferry knows, once,
 * and only when nothing its client sent after it is in flight. */

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "link.h"
#include "scripts.h"
#include "session.h"

static const char noscript[] = "-NOSCRIPT No matching script. Please use EVAL.\r\n";

typedef struct fixture {
    ferry f;
    session s;
    link l;
} fixture;

static fixture *fx_new(size_t max_bytes)
{
    fixture *x = calloc(1, sizeof(*x));
    x->f.scripts = scripts_new(max_bytes);
    x->s.f = &x->f;
    x->s.inflight = 1;
    x->l.f = &x->f;
    return x;
}

static void fx_free(fixture *x)
{
    scripts_free(x->f.scripts);
    free(x->l.script_marks);
    free(x);
}

/* A request of these words, as a client's multibulk. */
static void req_of(request *r, int argc, const char *const *argv)
{
    memset(r, 0, sizeof(*r));
    buf_init(&r->data);
    buf_append_count(&r->data, '*', (size_t)argc);
    for (int i = 0; i < argc; i++) {
        buf_append_bulk(&r->data, argv[i], strlen(argv[i]));
    }
    if (argc >= 2 && strcmp(argv[0], "SCRIPT") == 0) {
        const char *w[2] = {argv[0], argv[1]};
        size_t l[2] = {strlen(argv[0]), strlen(argv[1])};
        r->cmd = command_lookup_argv(2, w, l);
    } else {
        r->cmd = command_lookup(argv[0], strlen(argv[0]));
    }
    assert_non_null(r->cmd);
}

/* Redis answered `reply` to argv on x's link: the verdict. */
static int answer(fixture *x, const char *reply, int argc, const char *const *argv)
{
    request r;
    req_of(&r, argc, argv);
    int v = scripts_on_reply(&x->s, &r, &x->l, reply, strlen(reply));
    buf_free(&r.data);
    return v;
}

static int evalsha_noscript(fixture *x, const char *sha)
{
    const char *argv[] = {"EVALSHA", sha, "0"};
    return answer(x, noscript, 3, argv);
}

static void test_sha1_is_redis_name(void **state)
{
    char out[41];
    scripts_sha1_hex("return 42", 9, out);
    assert_string_equal(out, "1fa00e76656cc152ad327c13fe365858fd7be306");
    scripts_sha1_hex("", 0, out);
    assert_string_equal(out, "da39a3ee5e6b4b0d3255bfef95601890afd80709");
}

static void test_remembered_lru_and_flush(void **state)
{
    fixture *x = fx_new(100);
    char body_a[61], body_b[61], sha_a[41], sha_b[41];
    memset(body_a, 'a', 60);
    body_a[60] = '\0';
    memcpy(body_a, "return 1 --", 11);
    memset(body_b, 'b', 60);
    body_b[60] = '\0';
    memcpy(body_b, "return 2 --", 11);
    scripts_sha1_hex(body_a, 60, sha_a);
    scripts_sha1_hex(body_b, 60, sha_b);

    /* Unknown: NOSCRIPT is Redis' answer. */
    assert_int_equal(evalsha_noscript(x, sha_a), 0);
    /* A SCRIPT LOAD that did not compile is not remembered. */
    const char *load_a[] = {"SCRIPT", "LOAD", body_a};
    assert_int_equal(answer(x, "-ERR Error compiling script\r\n", 3, load_a), 0);
    assert_int_equal(evalsha_noscript(x, sha_a), 0);
    /* Loaded: known, in either case of its name. */
    char reply[64];
    snprintf(reply, sizeof(reply), "$40\r\n%s\r\n", sha_a);
    assert_int_equal(answer(x, reply, 3, load_a), 0);
    assert_int_equal(evalsha_noscript(x, sha_a), 1);
    char upper[41];
    for (int i = 0; i < 41; i++) {
        upper[i] = (char)(sha_a[i] >= 'a' && sha_a[i] <= 'f' ? sha_a[i] - 32 : sha_a[i]);
    }
    assert_int_equal(evalsha_noscript(x, upper), 1);
    /* Something else of the client in flight behind it: not sent again. */
    x->s.inflight = 2;
    assert_int_equal(evalsha_noscript(x, sha_a), 0);
    x->s.inflight = 1;
    /* An EVAL'd body is remembered too; past 100 bytes A (the least
     * recently used) goes. */
    const char *eval_b[] = {"EVAL", body_b, "0"};
    assert_int_equal(answer(x, ":2\r\n", 3, eval_b), 0);
    assert_int_equal(evalsha_noscript(x, sha_b), 1);
    assert_int_equal(evalsha_noscript(x, sha_a), 0);
    /* SCRIPT FLUSH through ferry forgets them all. */
    const char *flush[] = {"SCRIPT", "FLUSH"};
    assert_int_equal(answer(x, "+OK\r\n", 2, flush), 0);
    assert_int_equal(evalsha_noscript(x, sha_b), 0);
    fx_free(x);
}

static void test_nothing_remembered_at_zero(void **state)
{
    fixture *x = fx_new(0);
    const char *eval[] = {"EVAL", "return 42", "0"};
    assert_int_equal(answer(x, ":42\r\n", 3, eval), 0);
    assert_int_equal(evalsha_noscript(x, "1fa00e76656cc152ad327c13fe365858fd7be306"), 0);
    fx_free(x);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sha1_is_redis_name),
        cmocka_unit_test(test_remembered_lru_and_flush),
        cmocka_unit_test(test_nothing_remembered_at_zero),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
