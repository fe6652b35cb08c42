/* test_resp.c - unit tests of the RESP request parser and reply scanner.
 * Every case is fed whole, byte by byte and in seeded random splits through a
 * helper that behaves like ferry's read path (keep the unconsumed prefix,
 * append, buffer moves), and must give the same transcript each way. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "resp.h"

#define NUM_SEEDS 8 /* random split schedules per case */

/* How a stream is cut into reads. */
enum feed_mode {
    FEED_WHOLE = 0, /* one read */
    FEED_BYTES,     /* one byte per read */
    FEED_RANDOM     /* random read sizes from a seed */
};

/* A growable string holding a transcript. */
typedef struct strbuf {
    char *s;    /* NUL-terminated text */
    size_t len; /* bytes before the NUL */
    size_t cap; /* bytes allocated */
} strbuf;

static void sb_putn(strbuf *sb, const char *s, size_t n)
{
    if (sb->len + n + 1 > sb->cap) {
        sb->cap = (sb->len + n + 1) * 2;
        sb->s = realloc(sb->s, sb->cap);
        assert_non_null(sb->s);
    }
    memcpy(sb->s + sb->len, s, n);
    sb->len += n;
    sb->s[sb->len] = '\0';
}

/* Appends a copy of the buffer's own contents. */
static void sb_double(strbuf *sb)
{
    char *copy = malloc(sb->len + 1);
    size_t n = sb->len;
    assert_non_null(copy);
    memcpy(copy, sb->s, n);
    sb_putn(sb, copy, n);
    free(copy);
}

static void sb_printf(strbuf *sb, const char *fmt, ...)
{
    char tmp[512];
    va_list ap;
    int n;

    va_start(ap, fmt);
    n = vsnprintf(tmp, sizeof(tmp), fmt, ap);
    va_end(ap);
    assert_true(n >= 0 && (size_t)n < sizeof(tmp));
    sb_putn(sb, tmp, (size_t)n);
}

/* Appends an argument with bytes outside printable ASCII, and the
 * transcript's separators, as \xHH. */
static void sb_arg(strbuf *sb, const char *s, size_t n)
{
    size_t i;
    for (i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c < 0x20 || c > 0x7e || c == ',' || c == ';' || c == '\\') {
            sb_printf(sb, "\\x%02x", c);
        } else {
            sb_putn(sb, (const char *)&c, 1);
        }
    }
}

/* xorshift32: a small deterministic generator independent of rand(). */
static uint32_t rng_next(uint32_t *state)
{
    uint32_t x = *state;
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    *state = x;
    return x;
}

static size_t next_chunk(int mode, uint32_t *rng, size_t left)
{
    size_t n;
    if (mode == FEED_WHOLE) {
        return left;
    }
    if (mode == FEED_BYTES) {
        return left < 1 ? left : 1;
    }
    /* mostly small reads, sometimes large ones */
    n = rng_next(rng) % 4 == 0 ? 1 + rng_next(rng) % 4096 : 1 + rng_next(rng) % 24;
    return n < left ? n : left;
}

/* The caller's unconsumed bytes: every append moves them to a new block so
 * that a parser holding stale pointers trips ASan. */
typedef struct feed_buf {
    char *data; /* unconsumed bytes */
    size_t len; /* how many */
} feed_buf;

static void feed_append(feed_buf *fb, const char *src, size_t n)
{
    char *moved = malloc(fb->len + n + 1);
    assert_non_null(moved);
    if (fb->len > 0) {
        memcpy(moved, fb->data, fb->len);
    }
    if (n > 0) {
        memcpy(moved + fb->len, src, n);
    }
    free(fb->data);
    fb->data = moved;
    fb->len += n;
}

static void feed_consume(feed_buf *fb, size_t n)
{
    memmove(fb->data, fb->data + n, fb->len - n);
    fb->len -= n;
}

/* Parses data cut into reads per mode/seed and returns the transcript:
 * "M:" or "I:" then the arguments joined by ',' and ';' per request,
 * "E:text;" for an error, "+N" for N bytes left incomplete at the end. */
static char *parse_stream(const resp_limits *lim, const char *data, size_t n, int mode,
                          uint32_t seed)
{
    resp_parser *p = resp_parser_new(lim);
    strbuf out = {NULL, 0, 0};
    feed_buf fb = {NULL, 0};
    uint32_t rng = seed * 2654435761u + 1;
    size_t fed = 0;
    int failed = 0;

    sb_putn(&out, "", 0);
    while (!failed) {
        size_t chunk = next_chunk(mode, &rng, n - fed);
        feed_append(&fb, data + fed, chunk);
        fed += chunk;
        for (;;) {
            resp_request req;
            size_t i;
            int rc = resp_parse_request(p, fb.data, fb.len, &req);
            if (rc == RESP_AGAIN) {
                break;
            }
            if (rc == RESP_ERR) {
                sb_printf(&out, "E:%s;", resp_parser_error(p));
                /* sticky */
                assert_int_equal(resp_parse_request(p, "PING\r\n", 6, &req), RESP_ERR);
                failed = 1;
                break;
            }
            assert_int_equal(rc, RESP_OK);
            assert_true(req.len > 0 && req.len <= fb.len);
            sb_putn(&out, req.is_inline ? "I:" : "M:", 2);
            for (i = 0; i < req.argc; i++) {
                if (!req.is_inline) {
                    assert_true(req.argv[i].ptr >= fb.data);
                    assert_true(req.argv[i].ptr + req.argv[i].len <= fb.data + req.len);
                }
                if (i > 0) {
                    sb_putn(&out, ",", 1);
                }
                sb_arg(&out, req.argv[i].ptr, req.argv[i].len);
            }
            sb_putn(&out, ";", 1);
            feed_consume(&fb, req.len);
        }
        if (fed == n) {
            break;
        }
    }
    if (!failed && fb.len > 0) {
        sb_printf(&out, "+%zu", fb.len);
    }
    free(fb.data);
    resp_parser_free(p);
    return out.s;
}

/* Checks that data gives want whichever way it is cut into reads. */
static void check_parse(const resp_limits *lim, const char *data, size_t n, const char *want)
{
    uint32_t seed;
    char *got = parse_stream(lim, data, n, FEED_WHOLE, 0);
    assert_string_equal(got, want);
    free(got);
    if (n <= 4096) {
        got = parse_stream(lim, data, n, FEED_BYTES, 0);
        assert_string_equal(got, want);
        free(got);
    }
    for (seed = 1; seed <= NUM_SEEDS; seed++) {
        got = parse_stream(lim, data, n, FEED_RANDOM, seed);
        assert_string_equal(got, want);
        free(got);
    }
}

/* A test input with its expected transcript; len allows NUL bytes. */
typedef struct stream_case {
    const char *in;   /* bytes fed */
    size_t len;       /* how many */
    const char *want; /* transcript */
} stream_case;

#define CASE(s, w)                                                                                 \
    {                                                                                              \
        (s), sizeof(s) - 1, (w)                                                                    \
    }

static const stream_case request_cases[] = {
    /* multibulk */
    CASE("*1\r\n$4\r\nPING\r\n", "M:PING;"),
    CASE("*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$5\r\nhello\r\n", "M:SET,k,hello;"),
    CASE("*2\r\n$0\r\n\r\n$5\r\na\0b\r\n\r\n", "M:,a\\x00b\\x0d\\x0a;"),
    CASE("*1\r\n$9\r\n$3\r\nfoo\r\n\r\n", "M:$3\\x0d\\x0afoo\\x0d\\x0a;"),
    CASE("*0\r\n", "M:;"),
    CASE("*-1\r\n", "M:;"),
    CASE("*-5\r\n", "M:;"),
    CASE("*1\r\n$4\r\nPING\r\nPING\r\n*2\r\n$3\r\nGET\r\n$1\r\nx\r\n*0\r\n",
         "M:PING;I:PING;M:GET,x;M:;"),
    CASE("*2\r\n$3\r\nGET\r\n$1\r\n", "+17"),
    CASE("*2\r\n$3\r\nGET\r\n$1\r\nx", "+18"),
    CASE("*2\r\n$3\r\nGET\r\n$1\r\nx\r", "+19"),
    CASE("*", "+1"),
    CASE("*12", "+3"),
    CASE("*1\r", "+3"),
    /* inline */
    CASE("PING\r\n", "I:PING;"),
    CASE("PING\n", "I:PING;"),
    CASE("  set  a\tb \r\n", "I:set,a,b;"),
    CASE("\r\n", "I:;"),
    CASE("\n", "I:;"),
    CASE("\r\r\n", "I:;"),
    CASE(" \t\v\f \n", "I:;"),
    CASE("a\vb\n", "I:a\\x0bb;"),
    CASE("\va\n", "I:a;"),
    CASE("a\rb\n", "I:a,b;"),
    CASE("get a\0b c\n", "I:get,a;"),
    CASE("\0PING\n", "I:;"),
    CASE("set \"a b\" 'c d'\n", "I:set,a b,c d;"),
    CASE("\"\\x41\\x4a\\x4A\" \"\\n\\r\\t\\b\\a\\\\\\\"\" \"\\q\"\n",
         "I:AJJ,\\x0a\\x0d\\x09\\x08\\x07\\x5c\",q;"),
    CASE("\"\\x4\" \"\\x4g\" \"\\xzz\"\n", "I:x4,x4g,xzz;"),
    CASE("'it\\'s' 'a\\nb' '\"'\n", "I:it's,a\\x5cnb,\";"),
    CASE("foo\"bar\" x\n", "I:foobar,x;"),
    CASE("foo'b c'\n", "I:foob c;"),
    CASE("\"\" ''\n", "I:,;"),
    CASE("\"a\"\r\n", "I:a;"),
    CASE("\"a\"\t'b'\vc\n", "I:a,b,c;"),
    CASE("\"\\x00\"\n", "I:\\x00;"),
    CASE("PING", "+4"),
    CASE("PING\r", "+5"),
    CASE("PING\nPING\r\n\nGET k\n", "I:PING;I:PING;I:;I:GET,k;"),
    /* inline errors */
    CASE("\"foo\n", "E:Protocol error: unbalanced quotes in request;"),
    CASE("'foo\n", "E:Protocol error: unbalanced quotes in request;"),
    CASE("\"foo\"bar\n", "E:Protocol error: unbalanced quotes in request;"),
    CASE("'foo'bar\n", "E:Protocol error: unbalanced quotes in request;"),
    CASE("\"a\\\"\n", "E:Protocol error: unbalanced quotes in request;"),
    CASE("\"a\\\n", "E:Protocol error: unbalanced quotes in request;"),
    CASE("'a\\'\n", "E:Protocol error: unbalanced quotes in request;"),
    CASE("\"a\0\"\n", "E:Protocol error: unbalanced quotes in request;"),
    CASE("PING\n\"x\nPING\n", "I:PING;E:Protocol error: unbalanced quotes in request;"),
    /* multibulk errors */
    CASE("*x\r\n", "E:Protocol error: invalid multibulk length;"),
    CASE("*\r\n", "E:Protocol error: invalid multibulk length;"),
    CASE("*01\r\n", "E:Protocol error: invalid multibulk length;"),
    CASE("*+1\r\n", "E:Protocol error: invalid multibulk length;"),
    CASE("*-0\r\n", "E:Protocol error: invalid multibulk length;"),
    CASE("*-\r\n", "E:Protocol error: invalid multibulk length;"),
    CASE("* 1\r\n", "E:Protocol error: invalid multibulk length;"),
    CASE("*1 \r\n", "E:Protocol error: invalid multibulk length;"),
    CASE("*1\n", "+3"),
    CASE("*1\rX", "E:Protocol error: invalid multibulk length;"),
    CASE("*99999999999999999999\r\n", "E:Protocol error: invalid multibulk length;"),
    CASE("*-9223372036854775808\r\n", "M:;"),
    CASE("*-9223372036854775809\r\n", "E:Protocol error: invalid multibulk length;"),
    CASE("*1\r\n+foo\r\n", "E:Protocol error: expected '$', got '+';"),
    CASE("*1\r\nfoo\r\n", "E:Protocol error: expected '$', got 'f';"),
    CASE("*1\r\n\r\n", "E:Protocol error: expected '$', got ' ';"),
    CASE("*1\r\n\nx\r\n", "E:Protocol error: expected '$', got ' ';"),
    CASE("*1\r\n\0\r\n", "E:Protocol error: expected '$', got ';"),
    CASE("*2\r\n$1\r\na\r\n*1\r\n", "E:Protocol error: expected '$', got '*';"),
    CASE("*1\r\n$-1\r\n", "E:Protocol error: invalid bulk length;"),
    CASE("*1\r\n$x\r\n", "E:Protocol error: invalid bulk length;"),
    CASE("*1\r\n$\r\n", "E:Protocol error: invalid bulk length;"),
    CASE("*1\r\n$01\r\n", "E:Protocol error: invalid bulk length;"),
    CASE("*1\r\n$3\rX", "E:Protocol error: invalid bulk length;"),
    CASE("*1\r\n$3\r\nfooXY", "E:" RESP_ERR_BULK_FORMAT ";"),
    CASE("*1\r\n$3\r\nfoo\rX", "E:" RESP_ERR_BULK_FORMAT ";"),
    CASE("*1\r\n$3\r\nfoo\n\r", "E:" RESP_ERR_BULK_FORMAT ";"),
    CASE("*1\r\n$3\r\nfoobar\r\n", "E:" RESP_ERR_BULK_FORMAT ";"),
    CASE("*1\r\n$4\r\nPING\r\n*1\r\n$-1\r\n*1\r\n$4\r\nPING\r\n",
         "M:PING;E:Protocol error: invalid bulk length;"),
    /* limits at their defaults: at the boundary and one past */
    CASE("*1048576\r\n", "+10"),
    CASE("*1048577\r\n", "E:Protocol error: invalid multibulk length;"),
    CASE("*1\r\n$536870912\r\n", "+16"),
    CASE("*1\r\n$536870913\r\n", "E:Protocol error: invalid bulk length;"),
};

static void test_request_cases(void **state)
{
    size_t i;
    (void)state;
    for (i = 0; i < sizeof(request_cases) / sizeof(request_cases[0]); i++) {
        const stream_case *c = &request_cases[i];
        check_parse(NULL, c->in, c->len, c->want);
    }
}

#define CHECK_PARSE(lim, lit, want) check_parse((lim), (lit), sizeof(lit) - 1, (want))

static void test_request_limits(void **state)
{
    resp_limits lim = {5, 3, 8};
    (void)state;

    CHECK_PARSE(&lim, "*3\r\n$1\r\na\r\n$1\r\nb\r\n$5\r\nhello\r\n", "M:a,b,hello;");
    CHECK_PARSE(&lim, "*4\r\n", "E:Protocol error: invalid multibulk length;");
    CHECK_PARSE(&lim, "*1\r\n$6\r\n", "E:Protocol error: invalid bulk length;");
    /* inline: at most max_inline_len bytes before the '\n', '\r' included */
    CHECK_PARSE(&lim, "12345678\n", "I:12345678;");
    CHECK_PARSE(&lim, "1234567\r\n", "I:1234567;");
    CHECK_PARSE(&lim, "12345678", "+8");
    CHECK_PARSE(&lim, "123456789\n", "E:Protocol error: too big inline request;");
    CHECK_PARSE(&lim, "12345678\r\n", "E:Protocol error: too big inline request;");
    CHECK_PARSE(&lim, "123456789", "E:Protocol error: too big inline request;");
    CHECK_PARSE(&lim, "a\n123456789", "I:a;E:Protocol error: too big inline request;");
    /* limits of zero are the defaults */
    lim.max_bulk_len = 0;
    lim.max_args = 0;
    lim.max_inline_len = 0;
    CHECK_PARSE(&lim, "*1048576\r\n", "+10");
    CHECK_PARSE(&lim, "*1048577\r\n", "E:Protocol error: invalid multibulk length;");
}

/* A stream of n copies of c. */
static char *repeat(char c, size_t n, size_t extra)
{
    char *s = malloc(n + extra + 1);
    assert_non_null(s);
    memset(s, c, n);
    s[n] = '\0';
    return s;
}

static void test_request_count_line_limits(void **state)
{
    const size_t max = RESP_MAX_COUNT_LINE;
    char *s = repeat('1', max + 1, 8);
    char want[64];
    (void)state;

    /* "*" then max-1 digits: the '\r' is at the last allowed index */
    s[0] = '*';
    memcpy(s + max, "\r\n", 2);
    check_parse(NULL, s, max + 2, "E:Protocol error: invalid multibulk length;");
    /* no '\r' within max + 1 bytes */
    check_parse(NULL, s, max, "+65536");
    memset(s + max, '1', 2);
    check_parse(NULL, s, max + 1, "E:Protocol error: too big mbulk count string;");
    /* a '\r' just past the allowed window */
    memcpy(s + max + 1, "\r\n", 2);
    check_parse(NULL, s, max + 3, "E:Protocol error: too big mbulk count string;");
    free(s);

    s = repeat('x', max + 5, 8);
    memcpy(s, "*1\r\n", 4);
    snprintf(want, sizeof(want), "+%zu", 4 + max);
    check_parse(NULL, s, 4 + max, want);
    check_parse(NULL, s, 4 + max + 1, "E:Protocol error: too big bulk count string;");
    s[4] = '$';
    check_parse(NULL, s, 4 + max + 1, "E:Protocol error: too big bulk count string;");
    memcpy(s + 4 + max, "\r\n", 2);
    check_parse(NULL, s, 4 + max + 2, "E:Protocol error: invalid bulk length;");
    free(s);
}

static void test_request_inline_limit_default(void **state)
{
    const size_t max = RESP_DEFAULT_MAX_INLINE_LEN;
    char *s = repeat('a', max + 1, 8);
    resp_parser *p = resp_parser_new(NULL);
    resp_request req;
    size_t i;
    (void)state;

    /* byte by byte in a stable buffer: resumes the newline search */
    s[max] = '\n';
    for (i = 1; i <= max; i++) {
        assert_int_equal(resp_parse_request(p, s, i, &req), RESP_AGAIN);
    }
    assert_int_equal(resp_parse_request(p, s, max + 1, &req), RESP_OK);
    assert_int_equal(req.argc, 1);
    assert_int_equal(req.argv[0].len, max);
    assert_int_equal(req.len, max + 1);
    assert_int_equal(req.is_inline, 1);
    free(s);

    s = repeat('a', max + 2, 8);
    s[max + 1] = '\n';
    check_parse(NULL, s, max + 2, "E:Protocol error: too big inline request;");
    free(s);
    resp_parser_free(p);
}

static void test_request_pointers(void **state)
{
    static const char in[] = "*2\r\n$3\r\nGET\r\n$3\r\nkey\r\nrest";
    resp_parser *p = resp_parser_new(NULL);
    resp_request req;
    (void)state;

    assert_int_equal(resp_parse_request(p, in, sizeof(in) - 1, &req), RESP_OK);
    assert_int_equal(req.len, 22);
    assert_int_equal(req.is_inline, 0);
    assert_int_equal(req.argc, 2);
    assert_ptr_equal(req.argv[0].ptr, in + 8);
    assert_ptr_equal(req.argv[1].ptr, in + 17);
    assert_int_equal(req.argv[1].len, 3);
    assert_string_equal(resp_parser_error(p), "");
    resp_parser_free(p);
    resp_parser_free(NULL);
}

static void test_request_scratch_reuse(void **state)
{
    resp_parser *p = resp_parser_new(NULL);
    resp_request req;
    const char *first;
    (void)state;

    assert_int_equal(resp_parse_request(p, "set a bbbbbbbbbbbbbbbb\n", 23, &req), RESP_OK);
    first = req.argv[0].ptr;
    assert_int_equal(resp_parse_request(p, "get c\n", 6, &req), RESP_OK);
    assert_ptr_equal(req.argv[0].ptr, first);
    assert_ptr_equal(req.argv[1].ptr, first + 3);
    assert_int_equal(resp_parse_request(p, "\"x y\" 'z' w\r\n", 13, &req), RESP_OK);
    assert_ptr_equal(req.argv[0].ptr, first);
    assert_int_equal(req.argc, 3);
    resp_parser_free(p);
}

static void test_request_reset(void **state)
{
    resp_parser *p = resp_parser_new(NULL);
    resp_request req;
    (void)state;

    /* a partial request is forgotten */
    assert_int_equal(resp_parse_request(p, "*2\r\n$3\r\nfoo", 11, &req), RESP_AGAIN);
    resp_parser_reset(p);
    assert_int_equal(resp_parse_request(p, "PING\r\n", 6, &req), RESP_OK);
    assert_int_equal(req.is_inline, 1);

    /* a sticky error is cleared */
    assert_int_equal(resp_parse_request(p, "*x\r\n", 4, &req), RESP_ERR);
    assert_string_equal(resp_parser_error(p), "Protocol error: invalid multibulk length");
    assert_int_equal(resp_parse_request(p, "PING\r\n", 6, &req), RESP_ERR);
    assert_int_equal(resp_parse_request(p, "", 0, &req), RESP_ERR);
    resp_parser_reset(p);
    assert_string_equal(resp_parser_error(p), "");
    assert_int_equal(resp_parse_request(p, "*1\r\n$4\r\nPING\r\n", 14, &req), RESP_OK);
    assert_int_equal(req.argc, 1);
    assert_int_equal(resp_parse_request(p, "", 0, &req), RESP_AGAIN);
    resp_parser_free(p);
}

/* Odd limits and a caller that hands back fewer bytes than it must. */
static void test_request_edge_limits(void **state)
{
    resp_limits lim = {SIZE_MAX, 2, 512 * 1024};
    resp_parser *p = resp_parser_new(&lim);
    resp_request req;
    char *line = repeat('a', 300 * 1024, 2);
    const char *first;
    (void)state;

    /* a bulk limit past what a long long holds is clamped, not wrapped */
    CHECK_PARSE(&lim, "*1\r\n$9223372036854775807\r\n", "E:Protocol error: invalid bulk length;");
    CHECK_PARSE(&lim, "*1\r\n$4611686018427387903\r\n", "+26");

    /* a scratch buffer grown past 256 KiB is released afterwards */
    line[300 * 1024] = '\n';
    assert_int_equal(resp_parse_request(p, line, 300 * 1024 + 1, &req), RESP_OK);
    assert_int_equal(req.argv[0].len, 300 * 1024);
    assert_int_equal(resp_parse_request(p, "a b\n", 4, &req), RESP_OK);
    first = req.argv[0].ptr;
    assert_int_equal(resp_parse_request(p, "c d\n", 4, &req), RESP_OK);
    assert_ptr_equal(req.argv[0].ptr, first);
    free(line);

    /* fewer bytes than last time: still incomplete, then resumes */
    assert_int_equal(resp_parse_request(p, "*1\r\n$3\r\nfo", 10, &req), RESP_AGAIN);
    assert_int_equal(resp_parse_request(p, "*1\r\n", 4, &req), RESP_AGAIN);
    assert_int_equal(resp_parse_request(p, "*1\r\n$3\r\nfoo\r\n", 13, &req), RESP_OK);
    assert_int_equal(req.argc, 1);
    resp_parser_free(p);
}

/* Builds a random pipeline of multibulk and inline requests and checks it
 * against the transcript it should give. */
static void test_request_pipeline(void **state)
{
    uint32_t seed;
    (void)state;

    for (seed = 1; seed <= 4; seed++) {
        strbuf in = {NULL, 0, 0};
        strbuf want = {NULL, 0, 0};
        uint32_t rng = seed;
        int r;

        for (r = 0; r < 500; r++) {
            size_t argc = 1 + rng_next(&rng) % 6;
            size_t a;
            if (rng_next(&rng) % 3 == 0) {
                sb_putn(&want, "I:", 2);
                for (a = 0; a < argc; a++) {
                    char tok[16];
                    size_t k, tl = 1 + rng_next(&rng) % 10;
                    for (k = 0; k < tl; k++) {
                        tok[k] = (char)('a' + rng_next(&rng) % 26);
                    }
                    sb_putn(&in, a > 0 ? "  " : "", a > 0 ? 2 : 0);
                    sb_putn(&in, tok, tl);
                    sb_putn(&want, a > 0 ? "," : "", a > 0 ? 1 : 0);
                    sb_putn(&want, tok, tl);
                }
                if (rng_next(&rng) % 2) {
                    sb_putn(&in, "\r\n", 2);
                } else {
                    sb_putn(&in, "\n", 1);
                }
            } else {
                sb_printf(&in, "*%zu\r\n", argc);
                sb_putn(&want, "M:", 2);
                for (a = 0; a < argc; a++) {
                    char arg[300];
                    size_t k, al = rng_next(&rng) % 300;
                    for (k = 0; k < al; k++) {
                        arg[k] = (char)(rng_next(&rng) & 0xff);
                    }
                    sb_printf(&in, "$%zu\r\n", al);
                    sb_putn(&in, arg, al);
                    sb_putn(&in, "\r\n", 2);
                    sb_putn(&want, a > 0 ? "," : "", a > 0 ? 1 : 0);
                    sb_arg(&want, arg, al);
                }
            }
            sb_putn(&want, ";", 1);
        }
        check_parse(NULL, in.s, in.len, want.s);
        free(in.s);
        free(want.s);
    }
}

static double now_sec(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* A 100 MB bulk fed in 4 KiB reads: linear, so well under a second
 * (a rescanning parser would read ~1.2 TB). */
static void test_request_big_bulk(void **state)
{
    const size_t blen = 100UL * 1024 * 1024;
    const char *head = "*2\r\n$3\r\nSET\r\n$104857600\r\n";
    size_t hl = strlen(head);
    size_t total = hl + blen + 2;
    char *s = malloc(total);
    resp_parser *p = resp_parser_new(NULL);
    resp_request req;
    size_t len = 0;
    int rc = RESP_AGAIN;
    double t0;
    (void)state;

    assert_non_null(s);
    memcpy(s, head, hl);
    memset(s + hl, 'v', blen);
    memcpy(s + hl + blen, "\r\n", 2);
    t0 = now_sec();
    while (rc == RESP_AGAIN) {
        len = len + 4096 < total ? len + 4096 : total;
        rc = resp_parse_request(p, s, len, &req);
        if (len < total) {
            assert_int_equal(rc, RESP_AGAIN);
        }
    }
    assert_int_equal(rc, RESP_OK);
    assert_true(now_sec() - t0 < 5.0);
    assert_int_equal(req.len, total);
    assert_int_equal(req.argc, 2);
    assert_ptr_equal(req.argv[1].ptr, s + hl);
    assert_int_equal(req.argv[1].len, blen);
    free(s);
    resp_parser_free(p);
}

/* A huge declared count with few arguments present must work (and not
 * reserve a million slots); arguments keep arriving past the first 1024. */
static void test_request_many_args(void **state)
{
    strbuf in = {NULL, 0, 0};
    strbuf want = {NULL, 0, 0};
    size_t i;
    (void)state;

    sb_printf(&in, "*%d\r\n", 5000);
    sb_putn(&want, "M:", 2);
    for (i = 0; i < 5000; i++) {
        sb_printf(&in, "$%d\r\n%04zu\r\n", 4, i);
        sb_printf(&want, i > 0 ? ",%04zu" : "%04zu", i);
    }
    sb_putn(&want, ";", 1);
    /* twice: the second time the argv array is warm */
    sb_double(&in);
    sb_double(&want);
    check_parse(NULL, in.s, in.len, want.s);
    free(in.s);
    free(want.s);
}

/* ---- reply scanner ----------------------------------------------------- */

/* Scans data cut into reads and returns the transcript: "L<len>;" per reply,
 * "E:text;" for an error, "+N" for N bytes left incomplete. */
static char *scan_stream(const char *data, size_t n, int mode, uint32_t seed)
{
    resp_scanner s;
    strbuf out = {NULL, 0, 0};
    feed_buf fb = {NULL, 0};
    uint32_t rng = seed * 2654435761u + 7;
    size_t fed = 0;
    int failed = 0;

    resp_scanner_init(&s);
    sb_putn(&out, "", 0);
    while (!failed) {
        size_t chunk = next_chunk(mode, &rng, n - fed);
        feed_append(&fb, data + fed, chunk);
        fed += chunk;
        for (;;) {
            size_t rl = 0;
            int rc = resp_scan_reply(&s, fb.data, fb.len, &rl);
            if (rc == RESP_AGAIN) {
                assert_true(s.pos <= fb.len);
                break;
            }
            if (rc == RESP_ERR) {
                sb_printf(&out, "E:%s;", s.errstr);
                assert_int_equal(resp_scan_reply(&s, "+OK\r\n", 5, &rl), RESP_ERR);
                failed = 1;
                break;
            }
            assert_int_equal(rc, RESP_OK);
            assert_true(rl > 0 && rl <= fb.len);
            sb_printf(&out, "L%zu;", rl);
            feed_consume(&fb, rl);
        }
        if (fed == n) {
            break;
        }
    }
    if (!failed && fb.len > 0) {
        sb_printf(&out, "+%zu", fb.len);
    }
    free(fb.data);
    return out.s;
}

static void check_scan(const char *data, size_t n, const char *want)
{
    uint32_t seed;
    char *got = scan_stream(data, n, FEED_WHOLE, 0);
    assert_string_equal(got, want);
    free(got);
    if (n <= 4096) {
        got = scan_stream(data, n, FEED_BYTES, 0);
        assert_string_equal(got, want);
        free(got);
    }
    for (seed = 1; seed <= NUM_SEEDS; seed++) {
        got = scan_stream(data, n, FEED_RANDOM, seed);
        assert_string_equal(got, want);
        free(got);
    }
}

/* Each is exactly one complete reply. */
#define R(s)                                                                                       \
    {                                                                                              \
        (s), sizeof(s) - 1                                                                         \
    }
static const struct {
    const char *in; /* the reply */
    size_t len;     /* its length */
} replies[] = {
    R("+OK\r\n"),
    R("+\r\n"),
    R("+with\rcr\r\n"),
    R("-ERR unknown command 'FOO'\r\n"),
    R(":0\r\n"),
    R(":-123\r\n"),
    R(":9223372036854775807\r\n"),
    R(":-9223372036854775808\r\n"),
    R("$-1\r\n"),
    R("*-1\r\n"),
    R("$0\r\n\r\n"),
    R("$5\r\nhello\r\n"),
    R("$6\r\na\r\nb\0c\r\n"),
    R("*0\r\n"),
    R("*2\r\n$1\r\na\r\n:1\r\n"),
    R("*2\r\n*1\r\n+a\r\n*0\r\n"),
    R("*3\r\n$-1\r\n*-1\r\n_\r\n"),
    R("*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n:1\r\n"),
    R("_\r\n"),
    R(",3.14\r\n"),
    R(",-inf\r\n"),
    R("#t\r\n"),
    R("#f\r\n"),
    R("(3492890328409238509324850943850943825024385\r\n"),
    R("!21\r\nSYNTAX invalid syntax\r\n"),
    R("=15\r\ntxt:Some string\r\n"),
    R("%2\r\n+a\r\n:1\r\n+b\r\n*2\r\n:2\r\n:3\r\n"),
    R("%0\r\n"),
    R("~2\r\n+a\r\n+b\r\n"),
    R(">3\r\n$7\r\nmessage\r\n$2\r\nch\r\n$2\r\nhi\r\n"),
    R("|1\r\n+ttl\r\n:3600\r\n$3\r\nbar\r\n"),
    R("|0\r\n+OK\r\n"),
    R("*2\r\n|1\r\n+a\r\n+b\r\n:1\r\n:2\r\n"),
    /* attributes stack up before the reply they decorate */
    R("|1\r\n+a\r\n+x\r\n|1\r\n+b\r\n+c\r\n%1\r\n+k\r\n+v\r\n"),
};

static void test_scan_replies(void **state)
{
    size_t i;
    strbuf all = {NULL, 0, 0};
    strbuf want = {NULL, 0, 0};
    (void)state;

    for (i = 0; i < sizeof(replies) / sizeof(replies[0]); i++) {
        char w[32];
        snprintf(w, sizeof(w), "L%zu;", replies[i].len);
        check_scan(replies[i].in, replies[i].len, w);
        /* every proper prefix is incomplete, never an error */
        snprintf(w, sizeof(w), "+%zu", replies[i].len - 1);
        check_scan(replies[i].in, replies[i].len - 1, w);
        sb_putn(&all, replies[i].in, replies[i].len);
        sb_printf(&want, "L%zu;", replies[i].len);
    }
    /* the whole table as one pipeline, several times over */
    for (i = 0; i < 3; i++) {
        sb_double(&all);
        sb_double(&want);
    }
    check_scan(all.s, all.len, want.s);
    free(all.s);
    free(want.s);
}

static const stream_case reply_errors[] = {
    CASE("?x\r\n", "E:Protocol error: unknown reply type byte 0x3f;"),
    CASE("\r\n", "E:Protocol error: unknown reply type byte 0x0d;"),
    CASE("\0", "E:Protocol error: unknown reply type byte 0x00;"),
    CASE("+OK\r\n+OK\r\nx", "L5;L5;E:Protocol error: unknown reply type byte 0x78;"),
    CASE("*2\r\n:1\r\nOK\r\n", "E:Protocol error: unknown reply type byte 0x4f;"),
    CASE(":abc\r\n", "E:Protocol error: bad integer;"),
    CASE(":\r\n", "E:Protocol error: bad integer;"),
    CASE(":01\r\n", "E:Protocol error: bad integer;"),
    CASE(":9223372036854775808\r\n", "E:Protocol error: bad integer;"),
    CASE("_x\r\n", "E:Protocol error: bad null;"),
    CASE("#x\r\n", "E:Protocol error: bad boolean;"),
    CASE("#\r\n", "E:Protocol error: bad boolean;"),
    CASE("#tt\r\n", "E:Protocol error: bad boolean;"),
    CASE("$-2\r\n", "E:Protocol error: bad bulk length;"),
    CASE("$abc\r\n", "E:Protocol error: bad bulk length;"),
    CASE("$\r\n", "E:Protocol error: bad bulk length;"),
    CASE("$1\rx\r\n", "E:Protocol error: bad bulk length;"),
    CASE("!-1\r\n", "E:Protocol error: bad bulk length;"),
    CASE("=-1\r\n", "E:Protocol error: bad bulk length;"),
    CASE("$3\r\nabcd\r\n", "E:Protocol error: bulk data not followed by CRLF;"),
    CASE("$3\r\nabc\n\r", "E:Protocol error: bulk data not followed by CRLF;"),
    CASE("*-2\r\n", "E:Protocol error: bad aggregate length;"),
    CASE("*x\r\n", "E:Protocol error: bad aggregate length;"),
    CASE("%-1\r\n", "E:Protocol error: bad aggregate length;"),
    CASE("~-1\r\n", "E:Protocol error: bad aggregate length;"),
    CASE(">-1\r\n", "E:Protocol error: bad aggregate length;"),
    CASE("|-1\r\n", "E:Protocol error: bad aggregate length;"),
    CASE("*2147483648\r\n", "E:Protocol error: bad aggregate length;"),
    CASE("%2147483648\r\n", "E:Protocol error: bad aggregate length;"),
    CASE("|1\r\n+a\r\n+b\r\n", "+12"), /* an attribute alone is no reply */
    CASE("*2147483647\r\n", "+13"),
    CASE("%2147483647\r\n", "+13"),
    CASE("*1\r\n$-1\r\n+OK\r\n*1\r\n$x\r\n", "L9;L5;E:Protocol error: bad bulk length;"),
};

static void test_scan_errors(void **state)
{
    size_t i;
    (void)state;
    for (i = 0; i < sizeof(reply_errors) / sizeof(reply_errors[0]); i++) {
        check_scan(reply_errors[i].in, reply_errors[i].len, reply_errors[i].want);
    }
}

static void test_scan_line_limit(void **state)
{
    const size_t max = RESP_MAX_REPLY_LINE;
    char *s = repeat('a', max + 4, 8);
    char want[32];
    (void)state;

    /* "+" and max-1 bytes: the CRLF follows the longest allowed line */
    s[0] = '+';
    memcpy(s + max, "\r\n", 2);
    snprintf(want, sizeof(want), "L%zu;", max + 2);
    check_scan(s, max + 2, want);
    /* no CRLF yet, but one could still end the line */
    snprintf(want, sizeof(want), "+%zu", max);
    check_scan(s, max, want);
    snprintf(want, sizeof(want), "+%zu", max + 1);
    check_scan(s, max + 1, want);
    /* one byte longer */
    memset(s + max, 'a', 2);
    memcpy(s + max + 1, "\r\n", 2);
    check_scan(s, max + 3, "E:Protocol error: reply line too long;");
    check_scan(s, max + 1, "E:Protocol error: reply line too long;");
    /* lone '\r' bytes do not end a line */
    memset(s + 1, '\r', max + 3);
    check_scan(s, max + 3, "E:Protocol error: reply line too long;");
    free(s);
}

static void test_scan_state(void **state)
{
    resp_scanner s;
    size_t rl = 0;
    (void)state;

    resp_scanner_init(&s);
    /* completed elements are not scanned again */
    assert_int_equal(resp_scan_reply(&s, "*3\r\n+a\r\n+b", 10, &rl), RESP_AGAIN);
    assert_int_equal(s.pos, 8);
    assert_int_equal(s.need, 2);
    assert_int_equal(resp_scan_reply(&s, "*3\r\n+a\r\n+b\r\n$3\r\nab", 18, &rl), RESP_AGAIN);
    assert_int_equal(s.pos, 12);
    assert_int_equal(s.need, 1);
    assert_int_equal(resp_scan_reply(&s, "*3\r\n+a\r\n+b\r\n$3\r\nabc\r\n+x", 23, &rl), RESP_OK);
    assert_int_equal(rl, 21);
    assert_int_equal(s.pos, 0);
    assert_int_equal(s.need, 0);
    assert_int_equal(resp_scan_reply(&s, "", 0, &rl), RESP_AGAIN);

    /* fewer bytes than last time: still incomplete */
    assert_int_equal(resp_scan_reply(&s, "*2\r\n+a\r\n+", 9, &rl), RESP_AGAIN);
    assert_int_equal(s.pos, 8);
    assert_int_equal(resp_scan_reply(&s, "*2\r\n", 4, &rl), RESP_AGAIN);
    assert_int_equal(resp_scan_reply(&s, "*2\r\n+a\r\n+b\r\n", 12, &rl), RESP_OK);
    assert_int_equal(rl, 12);

    /* sticky errors, cleared by init */
    assert_int_equal(resp_scan_reply(&s, "x", 1, &rl), RESP_ERR);
    assert_int_equal(s.err, 1);
    assert_int_equal(resp_scan_reply(&s, "+OK\r\n", 5, &rl), RESP_ERR);
    resp_scanner_init(&s);
    assert_int_equal(resp_scan_reply(&s, "+OK\r\n", 5, &rl), RESP_OK);
    assert_int_equal(rl, 5);
}

/* A 100 MB bulk reply and a 200k-element array fed in 16 KiB reads. */
static void test_scan_big(void **state)
{
    const size_t blen = 100UL * 1024 * 1024;
    const char *head = "$104857600\r\n";
    size_t hl = strlen(head);
    size_t total = hl + blen + 2;
    char *s = malloc(total);
    resp_scanner sc;
    size_t len = 0, rl = 0, n, i;
    int rc = RESP_AGAIN;
    double t0 = now_sec();
    strbuf arr = {NULL, 0, 0};
    (void)state;

    assert_non_null(s);
    memcpy(s, head, hl);
    memset(s + hl, 'v', blen);
    memcpy(s + hl + blen, "\r\n", 2);
    resp_scanner_init(&sc);
    while (rc == RESP_AGAIN) {
        len = len + 16384 < total ? len + 16384 : total;
        rc = resp_scan_reply(&sc, s, len, &rl);
    }
    assert_int_equal(rc, RESP_OK);
    assert_int_equal(rl, total);
    free(s);

    n = 200000;
    sb_printf(&arr, "*%zu\r\n", n);
    for (i = 0; i < n; i++) {
        sb_putn(&arr, "$3\r\nabc\r\n", 9);
    }
    len = 0;
    rc = RESP_AGAIN;
    while (rc == RESP_AGAIN) {
        len = len + 16384 < arr.len ? len + 16384 : arr.len;
        rc = resp_scan_reply(&sc, arr.s, len, &rl);
    }
    assert_int_equal(rc, RESP_OK);
    assert_int_equal(rl, arr.len);
    assert_true(now_sec() - t0 < 5.0);
    free(arr.s);
}

/* resp_arg_ll reads integers as Redis' string2ll does. */
static void test_arg_ll(void **state)
{
    (void)state;
    static const struct {
        const char *text;
        size_t len;
        int ok;
        long long v;
    } cases[] = {
        {"0", 1, 1, 0},
        {"7", 1, 1, 7},
        {"-7", 2, 1, -7},
        {"1234567890", 10, 1, 1234567890LL},
        {"9223372036854775807", 19, 1, 9223372036854775807LL},
        {"-9223372036854775808", 20, 1, -9223372036854775807LL - 1},
        {"", 0, 0, 0},
        {"-", 1, 0, 0},
        {"-0", 2, 0, 0},
        {"00", 2, 0, 0},
        {"01", 2, 0, 0},
        {"+1", 2, 0, 0},
        {" 1", 2, 0, 0},
        {"1 ", 2, 0, 0},
        {"1\0"
         "0",
         3, 0, 0},
        {"1x", 2, 0, 0},
        {"--1", 3, 0, 0},
        {"9223372036854775808", 19, 0, 0},
        {"-9223372036854775809", 20, 0, 0},
        {"18446744073709551616", 20, 0, 0},
        {"99999999999999999999", 20, 0, 0},
        {"100000000000000000000", 21, 0, 0},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        resp_arg a = {cases[i].text, cases[i].len};
        long long v = 12345;
        int rc = resp_arg_ll(&a, &v);
        if (cases[i].ok) {
            assert_int_equal(rc, 0);
            assert_true(v == cases[i].v);
        } else {
            assert_int_equal(rc, -1);
            assert_true(v == 12345);
        }
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_request_cases),
        cmocka_unit_test(test_request_limits),
        cmocka_unit_test(test_request_count_line_limits),
        cmocka_unit_test(test_request_inline_limit_default),
        cmocka_unit_test(test_request_pointers),
        cmocka_unit_test(test_request_scratch_reuse),
        cmocka_unit_test(test_request_reset),
        cmocka_unit_test(test_request_edge_limits),
        cmocka_unit_test(test_request_pipeline),
        cmocka_unit_test(test_request_big_bulk),
        cmocka_unit_test(test_request_many_args),
        cmocka_unit_test(test_scan_replies),
        cmocka_unit_test(test_scan_errors),
        cmocka_unit_test(test_scan_line_limit),
        cmocka_unit_test(test_scan_state),
        cmocka_unit_test(test_scan_big),
        cmocka_unit_test(test_arg_ll),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
