/* resp.h - I/O-free, incremental RESP request parser and reply scanner.
 *
 * Both work on a caller-owned byte buffer whose first byte is the first
 * unconsumed byte of the stream. A call either completes one message (and
 * says how many bytes it spans) or asks for more bytes; in that case the
 * caller keeps those bytes, appends new ones, and calls again with the same
 * prefix: the parser resumes where it stopped instead of rescanning. */
#ifndef FERRY_RESP_H
#define FERRY_RESP_H

#include <stddef.h>
#include <stdint.h>

#define RESP_OK 0     /* one message complete */
#define RESP_AGAIN 1  /* incomplete: call again with more bytes */
#define RESP_ERR (-1) /* protocol error: errstr says which; sticky */

#define RESP_DEFAULT_MAX_BULK_LEN (512UL * 1024 * 1024) /* proto-max-bulk-len */
#define RESP_DEFAULT_MAX_ARGS (1024UL * 1024)           /* multibulk length cap */
#define RESP_DEFAULT_MAX_INLINE_LEN (64UL * 1024)       /* PROTO_INLINE_MAX_SIZE */
#define RESP_MAX_COUNT_LINE (64UL * 1024)               /* longest *N or $N line of a request */

/* Reply scanner bounds: longest header line (type byte included, CRLF not),
 * largest aggregate count, largest bulk, most pending elements. */
#define RESP_MAX_REPLY_LINE (64UL * 1024)
#define RESP_MAX_REPLY_COUNT 2147483647LL
#define RESP_MAX_REPLY_BULK ((unsigned long long)(SIZE_MAX >> 1))
#define RESP_MAX_REPLY_NEED (1LL << 62)

/* The one request error Redis has no text for: it silently skips the two
 * bytes after bulk data; ferry insists they are CRLF. */
#define RESP_ERR_BULK_FORMAT "Protocol error: invalid bulk format"

/* A zero field means its default. */
typedef struct resp_limits {
    size_t max_bulk_len;   /* longest bulk string argument */
    size_t max_args;       /* most arguments in one request */
    size_t max_inline_len; /* longest inline command line */
} resp_limits;

typedef struct resp_arg {
    const char *ptr; /* into the caller's buffer, or the parser's scratch (inline) */
    size_t len;
} resp_arg;

typedef struct resp_request {
    size_t len;           /* bytes of input this request spans (consume them) */
    int is_inline;        /* 1 if sent as an inline command */
    size_t argc;          /* 0 for an empty line / empty multibulk: ignore it */
    const resp_arg *argv; /* argc entries; valid until the next call or free */
} resp_request;

typedef struct resp_parser resp_parser;

/* Returns a new parser with the given limits (NULL: the defaults); aborts on OOM. */
resp_parser *resp_parser_new(const resp_limits *limits);
void resp_parser_free(resp_parser *p); /* accepts NULL */
/* Forget any partial request (the caller dropped its buffer). Clears errors. */
void resp_parser_reset(resp_parser *p);

/* Parse the next request from buf[0..len). On RESP_OK fills *req (pointers
 * valid until the next call on this parser and while buf is unchanged). On
 * RESP_ERR the error is sticky and resp_parser_error() returns the text Redis
 * would send after "-ERR ", e.g. "Protocol error: invalid bulk length". */
int resp_parse_request(resp_parser *p, const char *buf, size_t len, resp_request *req);
const char *resp_parser_error(const resp_parser *p); /* "" when none */

/* A whole argument as a long long, read as Redis reads integers (its
 * string2ll): an optional '-', then digits with no leading zero ("0" alone
 * is zero), nothing else, within 64 bits; so "+1", " 1", "01", "-0" and
 * 20 nines are refused. Returns 0 (*out set) or -1. */
int resp_arg_ll(const resp_arg *a, long long *out);

/* A multibulk or bulk header "<c><digits>\r\n" at *pp (before end): the
 * number, *pp moved past it; -1 (*pp kept) if it is not one or is over
 * 2^40. For ferry's own reading of requests it already parsed. */
long long resp_read_header(const char **pp, const char *end, char c);

/* A bulk "$<n>\r\n<bytes>\r\n" at *pp (before end): its bytes in *s, *n,
 * *pp moved past it; -1 (*pp kept) if it is not one. */
int resp_read_bulk(const char **pp, const char *end, const char **s, size_t *n);

/* The argument is lit, in any case. */
int resp_arg_is(const resp_arg *a, const char *lit);

/* Reply scanner: frames one complete reply (RESP2, and RESP3 types for later)
 * without building objects; the bytes are forwarded as Redis sent them.
 * State is a position and a count of pending elements: no allocation. */
typedef struct resp_scanner {
    size_t pos;     /* bytes of the current reply already scanned */
    long long need; /* elements still missing to complete the reply */
    int err;        /* sticky: nonzero after a protocol error */
    char errstr[128];
} resp_scanner;

void resp_scanner_init(resp_scanner *s);
/* Frame the next reply in buf[0..len). RESP_OK: *reply_len is its length and
 * the scanner is ready for the next one. RESP_AGAIN: keep the bytes. */
int resp_scan_reply(resp_scanner *s, const char *buf, size_t len, size_t *reply_len);

#endif
