/* resp.c - incremental RESP request parser (Redis 7.0 multibulk and inline
 * rules) and a reply framer that finds where one reply ends without building
 * it. Both keep offsets rather than pointers, so the caller may move its
 * buffer between calls, and neither rescans bytes it has already accepted. */
#include "resp.h"

#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define ARGV_INITIAL_MAX 1024         /* most argv slots reserved from a declared *N */
#define ARGV_KEEP_MAX 4096            /* larger argv arrays shrink when a request starts */
#define SCRATCH_KEEP_MAX (256 * 1024) /* larger scratch buffers are released */

/* What the parser is in the middle of. */
enum parser_state {
    PS_IDLE = 0,  /* between requests */
    PS_MULTIBULK, /* reading a *N request */
    PS_INLINE     /* waiting for the newline of an inline request */
};

struct resp_parser {
    resp_limits limits; /* effective limits (no zero fields) */
    int state;          /* enum parser_state */
    int failed;         /* sticky: nonzero after a protocol error */
    size_t pos;         /* offset of the first byte not yet accepted */
    size_t scan;        /* offset where the search for a line end resumes */
    size_t need;        /* multibulk arguments not yet complete */
    long long bulklen;  /* length of the bulk being read; -1: header unread */
    size_t argc;        /* arguments complete so far */
    size_t argv_cap;    /* slots in argv and offs */
    resp_arg *argv;     /* lengths; pointers are filled in on RESP_OK */
    size_t *offs;       /* argument offsets into buf (multibulk) or scratch */
    char *scratch;      /* unquoted inline arguments */
    size_t scratch_cap; /* bytes allocated for scratch */
    char errbuf[64];    /* text of the sticky error */
};

static void *xrealloc(void *ptr, size_t size)
{
    void *p = realloc(ptr, size == 0 ? 1 : size);
    if (p == NULL) {
        abort();
    }
    return p;
}

/* Parses a decimal the way Redis' string2ll does: an optional '-', no '+',
 * no leading zeros or spaces, at most 20 characters, must fit a long long.
 * Returns 1 and sets *out, or 0 if s[0..n) is not such a number. */
static int parse_ll(const char *s, size_t n, long long *out)
{
    size_t i = 0;
    unsigned long long v = 0;
    int negative = 0;

    if (n == 0 || n > 20) {
        return 0;
    }
    if (n == 1 && s[0] == '0') {
        *out = 0;
        return 1;
    }
    if (s[0] == '-') {
        negative = 1;
        i = 1;
    }
    if (i >= n || s[i] < '1' || s[i] > '9') {
        return 0;
    }
    for (; i < n; i++) {
        unsigned d;
        if (s[i] < '0' || s[i] > '9') {
            return 0;
        }
        d = (unsigned)(s[i] - '0');
        if (v > (ULLONG_MAX - d) / 10) {
            return 0;
        }
        v = v * 10 + d;
    }
    if (negative) {
        if (v > (unsigned long long)LLONG_MAX + 1) {
            return 0;
        }
        *out = v > (unsigned long long)LLONG_MAX ? LLONG_MIN : -(long long)v;
    } else {
        if (v > (unsigned long long)LLONG_MAX) {
            return 0;
        }
        *out = (long long)v;
    }
    return 1;
}

/* ---- request parser ---------------------------------------------------- */

static int fail(resp_parser *p, const char *msg)
{
    snprintf(p->errbuf, sizeof(p->errbuf), "%s", msg);
    p->failed = 1;
    return RESP_ERR;
}

/* Makes room for at least want arguments. */
static void argv_reserve(resp_parser *p, size_t want)
{
    if (want <= p->argv_cap) {
        return;
    }
    p->argv = xrealloc(p->argv, want * sizeof(*p->argv));
    p->offs = xrealloc(p->offs, want * sizeof(*p->offs));
    p->argv_cap = want;
}

static void argv_push(resp_parser *p, size_t off, size_t len)
{
    if (p->argc == p->argv_cap) {
        size_t want = p->argv_cap * 2;
        /* a multibulk request never needs more than it declared */
        if (p->state == PS_MULTIBULK && want > p->argc + p->need) {
            want = p->argc + p->need;
        }
        argv_reserve(p, want > p->argc ? want : p->argc + 1);
    }
    p->offs[p->argc] = off;
    p->argv[p->argc].ptr = NULL;
    p->argv[p->argc].len = len;
    p->argc++;
}

/* Returns to the between-requests state, keeping the allocations. */
static void clear_request(resp_parser *p)
{
    p->state = PS_IDLE;
    p->pos = 0;
    p->scan = 0;
    p->need = 0;
    p->bulklen = -1;
}

resp_parser *resp_parser_new(const resp_limits *limits)
{
    resp_parser *p = xrealloc(NULL, sizeof(*p));
    memset(p, 0, sizeof(*p));
    p->limits.max_bulk_len = RESP_DEFAULT_MAX_BULK_LEN;
    p->limits.max_args = RESP_DEFAULT_MAX_ARGS;
    p->limits.max_inline_len = RESP_DEFAULT_MAX_INLINE_LEN;
    if (limits != NULL) {
        if (limits->max_bulk_len != 0) {
            p->limits.max_bulk_len = limits->max_bulk_len;
        }
        if (limits->max_args != 0) {
            p->limits.max_args = limits->max_args;
        }
        if (limits->max_inline_len != 0) {
            p->limits.max_inline_len = limits->max_inline_len;
        }
    }
    /* bulk lengths are held in a long long */
    if (p->limits.max_bulk_len > (unsigned long long)LLONG_MAX / 2) {
        p->limits.max_bulk_len = (size_t)(LLONG_MAX / 2);
    }
    argv_reserve(p, 8);
    clear_request(p);
    return p;
}

void resp_parser_free(resp_parser *p)
{
    if (p == NULL) {
        return;
    }
    free(p->argv);
    free(p->offs);
    free(p->scratch);
    free(p);
}

void resp_parser_reset(resp_parser *p)
{
    clear_request(p);
    p->argc = 0;
    p->failed = 0;
    p->errbuf[0] = '\0';
}

const char *resp_parser_error(const resp_parser *p)
{
    return p->errbuf; /* "" while there is no error */
}

/* Finds the '\r' that ends the *N or $N line starting at buf[start]. Like
 * Redis, the line may hold at most RESP_MAX_COUNT_LINE bytes before it.
 * Returns 1 with *cr set once the byte after the '\r' is present too, 0 if
 * more bytes are needed, -1 if the line is too long. */
static int find_count_line(resp_parser *p, const char *buf, size_t len, size_t start, size_t *cr)
{
    size_t end = len - start > RESP_MAX_COUNT_LINE ? start + RESP_MAX_COUNT_LINE + 1 : len;
    size_t from = p->scan > start ? p->scan : start;
    const char *r = from < end ? memchr(buf + from, '\r', end - from) : NULL;

    if (r == NULL) {
        p->scan = end;
        return len - start > RESP_MAX_COUNT_LINE ? -1 : 0;
    }
    p->scan = (size_t)(r - buf);
    if (p->scan + 1 >= len) {
        return 0;
    }
    *cr = p->scan;
    return 1;
}

static int parse_multibulk(resp_parser *p, const char *buf, size_t len)
{
    size_t cr;
    long long n;
    int rc;

    if (p->pos == 0) {
        rc = find_count_line(p, buf, len, 0, &cr);
        if (rc < 0) {
            return fail(p, "Protocol error: too big mbulk count string");
        }
        if (rc == 0) {
            return RESP_AGAIN;
        }
        if (buf[cr + 1] != '\n' || !parse_ll(buf + 1, cr - 1, &n) ||
            (n > 0 && (unsigned long long)n > p->limits.max_args)) {
            return fail(p, "Protocol error: invalid multibulk length");
        }
        p->pos = cr + 2;
        if (n <= 0) {
            return RESP_OK;
        }
        p->need = (size_t)n;
        p->bulklen = -1;
        if (p->argv_cap > ARGV_KEEP_MAX) {
            /* give back what an earlier huge request took */
            p->argv_cap = 0;
            argv_reserve(p, ARGV_INITIAL_MAX);
        }
        argv_reserve(p, p->need < ARGV_INITIAL_MAX ? p->need : ARGV_INITIAL_MAX);
    }

    while (p->need > 0) {
        size_t avail;
        if (p->bulklen < 0) {
            rc = find_count_line(p, buf, len, p->pos, &cr);
            if (rc < 0) {
                return fail(p, "Protocol error: too big bulk count string");
            }
            if (rc == 0) {
                return RESP_AGAIN;
            }
            if (buf[p->pos] != '$') {
                char c = buf[p->pos];
                /* Redis formats the byte with %c, then blanks CR and LF */
                if (c == '\r' || c == '\n') {
                    c = ' ';
                }
                snprintf(p->errbuf, sizeof(p->errbuf), "Protocol error: expected '$', got '%c'", c);
                p->failed = 1;
                return RESP_ERR;
            }
            if (buf[cr + 1] != '\n' || !parse_ll(buf + p->pos + 1, cr - p->pos - 1, &n) || n < 0 ||
                (unsigned long long)n > p->limits.max_bulk_len) {
                return fail(p, "Protocol error: invalid bulk length");
            }
            p->pos = cr + 2;
            p->bulklen = n;
        }
        avail = len - p->pos;
        if (avail < 2 || avail - 2 < (size_t)p->bulklen) {
            return RESP_AGAIN;
        }
        cr = p->pos + (size_t)p->bulklen;
        if (buf[cr] != '\r' || buf[cr + 1] != '\n') {
            return fail(p, RESP_ERR_BULK_FORMAT);
        }
        argv_push(p, p->pos, (size_t)p->bulklen);
        p->pos = cr + 2;
        p->bulklen = -1;
        p->need--;
    }
    return RESP_OK;
}

/* isspace() in the C locale, which sdssplitargs uses to skip blanks. */
static int is_blank(int c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r';
}

static int hex_value(int c)
{
    if (c >= '0' && c <= '9') {
        return c - '0';
    }
    if (c >= 'a' && c <= 'f') {
        return c - 'a' + 10;
    }
    if (c >= 'A' && c <= 'F') {
        return c - 'A' + 10;
    }
    return -1;
}

/* The byte at line[i], or 0 past the end (sdssplitargs reads a C string). */
static int byte_at(const char *line, size_t n, size_t i)
{
    return i < n ? (unsigned char)line[i] : 0;
}

/* Splits line[0..n) into arguments in the scratch buffer with the rules of
 * Redis' sdssplitargs. Returns 0, or -1 on unbalanced quotes. */
static int split_inline(resp_parser *p, const char *line, size_t n)
{
    const char *nul = memchr(line, '\0', n);
    size_t i = 0;
    size_t out = 0;

    /* sdssplitargs sees a C string: a NUL byte ends the line */
    if (nul != NULL) {
        n = (size_t)(nul - line);
    }
    if (n > p->scratch_cap) {
        size_t cap = p->scratch_cap * 2 > n ? p->scratch_cap * 2 : n;
        free(p->scratch);
        p->scratch = xrealloc(NULL, cap);
        p->scratch_cap = cap;
    }

    for (;;) {
        size_t start;
        int quote = 0;
        int done = 0;

        while (i < n && is_blank((unsigned char)line[i])) {
            i++;
        }
        if (i >= n) {
            return 0;
        }
        start = out;
        while (!done) {
            int c = byte_at(line, n, i);
            if (quote != 0) {
                /* Escapes first; the rest is the same for both quotes. */
                int escaped = 1;
                if (quote == '"') {
                    int hi = c == '\\' && byte_at(line, n, i + 1) == 'x'
                                 ? hex_value(byte_at(line, n, i + 2))
                                 : -1;
                    int lo = hi >= 0 ? hex_value(byte_at(line, n, i + 3)) : -1;
                    if (lo >= 0) {
                        p->scratch[out++] = (char)(hi * 16 + lo);
                        i += 4;
                    } else if (c == '\\' && byte_at(line, n, i + 1) != 0) {
                        c = byte_at(line, n, i + 1);
                        switch (c) {
                        case 'n':
                            c = '\n';
                            break;
                        case 'r':
                            c = '\r';
                            break;
                        case 't':
                            c = '\t';
                            break;
                        case 'b':
                            c = '\b';
                            break;
                        case 'a':
                            c = '\a';
                            break;
                        default:
                            break;
                        }
                        p->scratch[out++] = (char)c;
                        i += 2;
                    } else {
                        escaped = 0;
                    }
                } else if (c == '\\' && byte_at(line, n, i + 1) == '\'') {
                    p->scratch[out++] = '\'';
                    i += 2;
                } else {
                    escaped = 0;
                }
                if (escaped) {
                    continue;
                }
                if (c == quote) {
                    int next = byte_at(line, n, i + 1);
                    if (next != 0 && !is_blank(next)) {
                        return -1;
                    }
                    done = 1;
                    i++;
                } else if (c == 0) {
                    return -1;
                } else {
                    p->scratch[out++] = (char)c;
                    i++;
                }
            } else {
                switch (c) {
                case ' ':
                case '\n':
                case '\r':
                case '\t':
                case 0:
                    done = 1;
                    break;
                case '"':
                case '\'':
                    quote = c;
                    break;
                default:
                    p->scratch[out++] = (char)c;
                    break;
                }
                if (c != 0) {
                    i++;
                }
            }
        }
        argv_push(p, start, out - start);
    }
}

static int parse_inline(resp_parser *p, const char *buf, size_t len)
{
    size_t max = p->limits.max_inline_len;
    /* a newline within the first max+1 bytes ends a line of at most max */
    size_t end = len > max ? max + 1 : len;
    const char *nl = p->scan < end ? memchr(buf + p->scan, '\n', end - p->scan) : NULL;
    size_t line_len;

    if (nl == NULL) {
        p->scan = end;
        if (len > max) {
            return fail(p, "Protocol error: too big inline request");
        }
        return RESP_AGAIN;
    }
    line_len = (size_t)(nl - buf);
    p->pos = line_len + 1;
    if (line_len > 0 && buf[line_len - 1] == '\r') {
        line_len--;
    }
    if (p->scratch_cap > SCRATCH_KEEP_MAX && line_len <= SCRATCH_KEEP_MAX) {
        free(p->scratch);
        p->scratch = NULL;
        p->scratch_cap = 0;
    }
    if (split_inline(p, buf, line_len) < 0) {
        return fail(p, "Protocol error: unbalanced quotes in request");
    }
    return RESP_OK;
}

int resp_arg_ll(const resp_arg *a, long long *out)
{
    const char *p = a->ptr;
    size_t n = a->len;
    int negative = 0;
    unsigned long long v = 0;
    if (n == 1 && p[0] == '0') {
        *out = 0;
        return 0;
    }
    if (n > 0 && p[0] == '-') {
        negative = 1;
        p++;
        n--;
    }
    /* 19 digits hold any long long; a first digit 1-9 rules out "-0", "00". */
    if (n == 0 || n > 19 || p[0] < '1' || p[0] > '9') {
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        if (p[i] < '0' || p[i] > '9') {
            return -1;
        }
        unsigned d = (unsigned)(p[i] - '0');
        if (v > (ULLONG_MAX - d) / 10) {
            return -1;
        }
        v = v * 10 + d;
    }
    if (negative) {
        if (v > (unsigned long long)LLONG_MAX + 1) {
            return -1;
        }
        *out = v == (unsigned long long)LLONG_MAX + 1 ? LLONG_MIN : -(long long)v;
    } else {
        if (v > (unsigned long long)LLONG_MAX) {
            return -1;
        }
        *out = (long long)v;
    }
    return 0;
}

int resp_parse_request(resp_parser *p, const char *buf, size_t len, resp_request *req)
{
    int rc;
    const char *base;
    size_t i;

    if (p->failed) {
        return RESP_ERR;
    }
    if (p->state == PS_IDLE) {
        if (len == 0) {
            return RESP_AGAIN;
        }
        p->argc = 0;
        p->state = buf[0] == '*' ? PS_MULTIBULK : PS_INLINE;
    }
    if (len < p->pos) {
        /* the caller dropped bytes it had to keep: wait for them */
        return RESP_AGAIN;
    }
    if (p->state == PS_MULTIBULK) {
        rc = parse_multibulk(p, buf, len);
    } else {
        rc = parse_inline(p, buf, len);
    }
    if (rc != RESP_OK) {
        return rc;
    }

    base = p->state == PS_INLINE ? p->scratch : buf;
    for (i = 0; i < p->argc; i++) {
        p->argv[i].ptr = base + p->offs[i];
    }
    req->len = p->pos;
    req->is_inline = p->state == PS_INLINE;
    req->argc = p->argc;
    req->argv = p->argv;
    clear_request(p);
    return RESP_OK;
}

/* ---- reply scanner ----------------------------------------------------- */

static int scan_fail(resp_scanner *s, const char *msg, int byte)
{
    if (byte >= 0) {
        snprintf(s->errstr, sizeof(s->errstr), "%s 0x%02x", msg, (unsigned)byte);
    } else {
        snprintf(s->errstr, sizeof(s->errstr), "%s", msg);
    }
    s->err = 1;
    return RESP_ERR;
}

void resp_scanner_init(resp_scanner *s)
{
    memset(s, 0, sizeof(*s));
}

/* RESP2 types + - : $ * and RESP3 types _ , # ( ! = % ~ > | */
static int is_reply_type(int c)
{
    switch (c) {
    case '+':
    case '-':
    case ':':
    case '$':
    case '*':
    case '_':
    case ',':
    case '#':
    case '(':
    case '!':
    case '=':
    case '%':
    case '~':
    case '>':
    case '|':
        return 1;
    default:
        return 0;
    }
}

/* Finds the CRLF ending the header line that starts at buf[start] (a lone
 * '\r' inside a line is data, as hiredis reads it). Returns 1 with *cr set,
 * 0 if more bytes are needed, -1 if the line exceeds RESP_MAX_REPLY_LINE. */
static int find_reply_line(const char *buf, size_t len, size_t start, size_t *cr)
{
    size_t last = start + RESP_MAX_REPLY_LINE; /* last index a '\r' may have */
    size_t end = len > last + 1 ? last + 1 : len;
    size_t i = start + 1;

    while (i < end) {
        const char *r = memchr(buf + i, '\r', end - i);
        size_t at;
        if (r == NULL) {
            break;
        }
        at = (size_t)(r - buf);
        if (at + 1 >= len) {
            return 0;
        }
        if (buf[at + 1] == '\n') {
            *cr = at;
            return 1;
        }
        i = at + 1;
    }
    return len > last ? -1 : 0;
}

int resp_scan_reply(resp_scanner *s, const char *buf, size_t len, size_t *reply_len)
{
    if (s->err) {
        return RESP_ERR;
    }
    if (s->pos == 0) {
        s->need = 1;
    }
    if (len < s->pos) {
        return RESP_AGAIN;
    }
    while (s->need > 0) {
        size_t start = s->pos;
        size_t cr;
        size_t next;
        long long n = 0;
        long long add = 0;
        int completes = 1;
        int type;
        int rc;

        if (start >= len) {
            return RESP_AGAIN;
        }
        type = (unsigned char)buf[start];
        if (!is_reply_type(type)) {
            return scan_fail(s, "Protocol error: unknown reply type byte", type);
        }
        rc = find_reply_line(buf, len, start, &cr);
        if (rc < 0) {
            return scan_fail(s, "Protocol error: reply line too long", -1);
        }
        if (rc == 0) {
            return RESP_AGAIN;
        }
        next = cr + 2;

        switch (type) {
        case '+': /* simple string */
        case '-': /* error */
        case ',': /* double */
        case '(': /* big number */
            break;
        case ':':
            if (!parse_ll(buf + start + 1, cr - start - 1, &n)) {
                return scan_fail(s, "Protocol error: bad integer", -1);
            }
            break;
        case '_':
            if (cr != start + 1) {
                return scan_fail(s, "Protocol error: bad null", -1);
            }
            break;
        case '#':
            if (cr != start + 2 || (buf[start + 1] != 't' && buf[start + 1] != 'f')) {
                return scan_fail(s, "Protocol error: bad boolean", -1);
            }
            break;
        case '$': /* bulk string */
        case '!': /* blob error */
        case '=': /* verbatim string */
            if (!parse_ll(buf + start + 1, cr - start - 1, &n) || n < -1 ||
                (n == -1 && type != '$') ||
                (n > 0 && (unsigned long long)n > RESP_MAX_REPLY_BULK)) {
                return scan_fail(s, "Protocol error: bad bulk length", -1);
            }
            if (n >= 0) {
                size_t avail = len - next;
                if (avail < 2 || avail - 2 < (size_t)n) {
                    return RESP_AGAIN;
                }
                next += (size_t)n;
                if (buf[next] != '\r' || buf[next + 1] != '\n') {
                    return scan_fail(s, "Protocol error: bulk data not followed by CRLF", -1);
                }
                next += 2;
            }
            break;
        default: /* '*' array, '~' set, '>' push, '%' map, '|' attribute */
            if (!parse_ll(buf + start + 1, cr - start - 1, &n) || n < -1 ||
                (n == -1 && type != '*') || n > RESP_MAX_REPLY_COUNT) {
                return scan_fail(s, "Protocol error: bad aggregate length", -1);
            }
            if (n > 0) {
                add = type == '%' || type == '|' ? 2 * n : n;
            }
            completes = type != '|';
            break;
        }
        if (add > RESP_MAX_REPLY_NEED - s->need) {
            return scan_fail(s, "Protocol error: reply has too many elements", -1);
        }
        s->need += add - completes;
        s->pos = next;
    }
    *reply_len = s->pos;
    s->pos = 0;
    s->need = 0;
    return RESP_OK;
}

long long resp_read_header(const char **pp, const char *end, char c)
{
    const char *p = *pp;
    long long v = 0;
    if (p >= end || *p != c) {
        return -1;
    }
    for (p++; p < end && *p >= '0' && *p <= '9'; p++) {
        v = v * 10 + (*p - '0');
        if (v > (1ll << 40)) {
            return -1;
        }
    }
    if (end - p < 2 || p[0] != '\r' || p[1] != '\n') {
        return -1;
    }
    *pp = p + 2;
    return v;
}

int resp_read_bulk(const char **pp, const char *end, const char **s, size_t *n)
{
    const char *p = *pp;
    long long len = resp_read_header(&p, end, '$');
    if (len < 0 || end - p < len + 2) {
        return -1;
    }
    *s = p;
    *n = (size_t)len;
    *pp = p + len + 2;
    return 0;
}

int resp_arg_is(const resp_arg *a, const char *lit)
{
    size_t n = strlen(lit);
    return a->len == n && strncasecmp(a->ptr, lit, n) == 0;
}
