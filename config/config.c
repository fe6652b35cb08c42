/* config.c - loads ferry's YAML configuration with libyaml's document API.
 * A table of dotted keys drives type checking and assignment, then a semantic
 * pass checks the rules that span keys. Errors read "file:line:column: msg". */

#include "config.h"
#include "log.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <uv.h>
#include <yaml.h>

#define CONF_MAX_FILE (4u * 1024 * 1024)   /* larger files are refused */
#define CONF_DURATION_MAX 31536000000LL    /* one year, in milliseconds */
#define CONF_SIZE_MAX ((long long)1 << 50) /* 1 PiB: sane upper bound for sizes */
#define CONF_KEY_MAX 128                   /* longest dotted key we build */
#define CONF_QUOTE_MAX 48                  /* value text shown in messages */

/* How a key's value is parsed. */
typedef enum conf_type {
    CONF_SECTION,   /* a mapping of sub-keys (null = empty) */
    CONF_STRING,    /* char *, heap-allocated */
    CONF_INT,       /* int within [min, max] */
    CONF_UINT,      /* size_t, plain non-negative integer */
    CONF_SIZE,      /* size_t, integer with optional b/kb/mb/gb suffix */
    CONF_DURATION,  /* uint64_t milliseconds */
    CONF_BOOL,      /* int 0/1 from true/false/yes/no */
    CONF_ENUM,      /* int from a parse function */
    CONF_ADDR,      /* config_addr */
    CONF_ADDR_LIST, /* config_addr[], a scalar or a sequence */
    CONF_STR_LIST   /* char *[], a scalar or a sequence */
} conf_type;

#define CONF_EMPTY_NULL 0x1u /* strings: "" or null stores NULL ("none") */
#define CONF_OFF 0x2u        /* addresses: "" or "off" clears the flag field */

/* Normalises a string value in place; returns NULL or an error description. */
typedef const char *(*conf_check_fn)(char *value);

/* One configuration key. */
typedef struct conf_entry {
    const char *key;                  /* dotted key, e.g. "client.max_clients" */
    conf_type type;                   /* how the value is parsed */
    size_t off;                       /* offsetof the field in config */
    size_t count_off;                 /* lists: offsetof the int entry count */
    size_t flag_off;                  /* int set to 1 when the key is given */
    int has_flag;                     /* 1 if flag_off is meaningful */
    long long min;                    /* numbers: smallest accepted value */
    long long max;                    /* numbers: largest value; lists: most entries */
    unsigned flags;                   /* CONF_EMPTY_NULL, CONF_OFF */
    conf_check_fn check;              /* strings and string lists, or NULL */
    int (*parse_enum)(const char *s); /* CONF_ENUM: value or -1 */
    const char *what;                 /* CONF_ENUM: the accepted values, for errors */
} conf_entry;

static const char *conf_check_command(char *value);
static int conf_parse_ll(const char *s, long long *out);
static const char *conf_check_word(char *value);
static const char *conf_check_sockpath(char *value);

/* client.auth: "ferry" or "redis". */
static int client_auth_parse(const char *s)
{
    if (strcmp(s, "ferry") == 0) {
        return CLIENT_AUTH_FERRY;
    }
    if (strcmp(s, "redis") == 0) {
        return CLIENT_AUTH_REDIS;
    }
    return -1;
}

/* workers: 1 to CONFIG_MAX_WORKERS, or "auto" (0: resolved by
 * conf_semantic). */
static int workers_parse(const char *s)
{
    if (strcmp(s, "auto") == 0) {
        return 0;
    }
    long long n = 0;
    if (conf_parse_ll(s, &n) != 0 || n < 1 || n > CONFIG_MAX_WORKERS) {
        return -1;
    }
    return (int)n;
}

#define CONF_FIELD(f) .off = offsetof(config, f)
#define CONF_COUNT(f) .count_off = offsetof(config, f)
#define CONF_FLAG(f) .flag_off = offsetof(config, f), .has_flag = 1

static const conf_entry conf_table[] = {
    {.key = "listen",
     .type = CONF_ADDR_LIST,
     CONF_FIELD(listen),
     CONF_COUNT(nlisten),
     .max = CONFIG_MAX_LISTEN},

    {.key = "workers",
     .type = CONF_ENUM,
     CONF_FIELD(workers),
     .parse_enum = workers_parse,
     .what = "a number of event loops from 1 to 64, or auto"},

    {.key = "redis", .type = CONF_SECTION},
    {.key = "redis.address", .type = CONF_ADDR, CONF_FIELD(redis_addr), CONF_FLAG(has_redis)},
    {.key = "redis.username",
     .type = CONF_STRING,
     CONF_FIELD(redis_username),
     .flags = CONF_EMPTY_NULL},
    {.key = "redis.password",
     .type = CONF_STRING,
     CONF_FIELD(redis_password),
     .flags = CONF_EMPTY_NULL},

    {.key = "sentinel", .type = CONF_SECTION, CONF_FLAG(has_sentinel)},
    {.key = "sentinel.master",
     .type = CONF_STRING,
     CONF_FIELD(sentinel_master),
     .check = conf_check_word},
    {.key = "sentinel.addresses",
     .type = CONF_ADDR_LIST,
     CONF_FIELD(sentinels),
     CONF_COUNT(nsentinels),
     .max = CONFIG_MAX_SENTINELS},
    {.key = "sentinel.username",
     .type = CONF_STRING,
     CONF_FIELD(sentinel_username),
     .flags = CONF_EMPTY_NULL},
    {.key = "sentinel.password",
     .type = CONF_STRING,
     CONF_FIELD(sentinel_password),
     .flags = CONF_EMPTY_NULL},
    {.key = "sentinel.resolve_interval_ms",
     .type = CONF_DURATION,
     CONF_FIELD(sentinel_resolve_interval_ms),
     .min = 1,
     .max = CONF_DURATION_MAX},
    {.key = "sentinel.timeout_ms",
     .type = CONF_DURATION,
     CONF_FIELD(sentinel_timeout_ms),
     .min = 1,
     .max = CONF_DURATION_MAX},

    {.key = "client", .type = CONF_SECTION},
    {.key = "client.auth",
     .type = CONF_ENUM,
     CONF_FIELD(client_auth),
     .parse_enum = client_auth_parse,
     .what = "ferry or redis"},
    {.key = "client.password",
     .type = CONF_STRING,
     CONF_FIELD(client_password),
     .flags = CONF_EMPTY_NULL},
    {.key = "client.max_clients",
     .type = CONF_INT,
     CONF_FIELD(max_clients),
     .min = 1,
     .max = INT_MAX},
    {.key = "client.max_query_bytes",
     .type = CONF_SIZE,
     CONF_FIELD(max_query_bytes),
     .min = 1,
     .max = CONF_SIZE_MAX},
    {.key = "client.max_pending_bytes",
     .type = CONF_SIZE,
     CONF_FIELD(max_pending_bytes),
     .min = 1,
     .max = CONF_SIZE_MAX},
    {.key = "client.max_bulk_len",
     .type = CONF_SIZE,
     CONF_FIELD(max_bulk_len),
     .min = 1,
     .max = CONF_SIZE_MAX},
    {.key = "client.max_args", .type = CONF_UINT, CONF_FIELD(max_args), .min = 1, .max = INT_MAX},
    {.key = "client.max_inline_len",
     .type = CONF_SIZE,
     CONF_FIELD(max_inline_len),
     .min = 1,
     .max = CONF_SIZE_MAX},
    {.key = "client.idle_timeout_ms",
     .type = CONF_DURATION,
     CONF_FIELD(idle_timeout_ms),
     .min = 0,
     .max = CONF_DURATION_MAX},
    {.key = "client.max_pipeline",
     .type = CONF_UINT,
     CONF_FIELD(max_pipeline),
     .min = 1,
     .max = INT_MAX},
    {.key = "client.request_timeout_ms",
     .type = CONF_DURATION,
     CONF_FIELD(request_timeout_ms),
     .min = 0,
     .max = CONF_DURATION_MAX},
    {.key = "client.output_limit", .type = CONF_SECTION},
    {.key = "client.output_limit.hard",
     .type = CONF_SIZE,
     CONF_FIELD(output_limit.hard),
     .min = 0,
     .max = CONF_SIZE_MAX},
    {.key = "client.output_limit.soft",
     .type = CONF_SIZE,
     CONF_FIELD(output_limit.soft),
     .min = 0,
     .max = CONF_SIZE_MAX},
    {.key = "client.output_limit.soft_seconds",
     .type = CONF_UINT,
     CONF_FIELD(output_limit.soft_seconds),
     .min = 0,
     .max = CONF_DURATION_MAX / 1000},
    {.key = "client.pubsub_output_limit", .type = CONF_SECTION},
    {.key = "client.pubsub_output_limit.hard",
     .type = CONF_SIZE,
     CONF_FIELD(pubsub_output_limit.hard),
     .min = 0,
     .max = CONF_SIZE_MAX},
    {.key = "client.pubsub_output_limit.soft",
     .type = CONF_SIZE,
     CONF_FIELD(pubsub_output_limit.soft),
     .min = 0,
     .max = CONF_SIZE_MAX},
    {.key = "client.pubsub_output_limit.soft_seconds",
     .type = CONF_UINT,
     CONF_FIELD(pubsub_output_limit.soft_seconds),
     .min = 0,
     .max = CONF_DURATION_MAX / 1000},

    {.key = "limits", .type = CONF_SECTION},
    {.key = "limits.max_memory",
     .type = CONF_SIZE,
     CONF_FIELD(max_memory),
     .min = 0,
     .max = CONF_SIZE_MAX},

    {.key = "upstream", .type = CONF_SECTION},
    {.key = "upstream.shared_links",
     .type = CONF_INT,
     CONF_FIELD(shared_links),
     .min = 1,
     .max = 64},
    {.key = "upstream.pool_idle", .type = CONF_INT, CONF_FIELD(pool_idle), .min = 0, .max = 65535},
    {.key = "upstream.connect_timeout_ms",
     .type = CONF_DURATION,
     CONF_FIELD(connect_timeout_ms),
     .min = 1,
     .max = CONF_DURATION_MAX},
    {.key = "upstream.ping_interval_ms",
     .type = CONF_DURATION,
     CONF_FIELD(ping_interval_ms),
     .min = 0,
     .max = CONF_DURATION_MAX},
    {.key = "upstream.hold_timeout_ms",
     .type = CONF_DURATION,
     CONF_FIELD(hold_timeout_ms),
     .min = 1,
     .max = CONF_DURATION_MAX},
    {.key = "upstream.fence_timeout_ms",
     .type = CONF_DURATION,
     CONF_FIELD(fence_timeout_ms),
     .min = 1,
     .max = CONF_DURATION_MAX},
    {.key = "upstream.drain_ms",
     .type = CONF_DURATION,
     CONF_FIELD(drain_ms),
     .min = 0,
     .max = CONF_DURATION_MAX},
    {.key = "upstream.health_timeout_ms",
     .type = CONF_DURATION,
     CONF_FIELD(health_timeout_ms),
     .min = 0,
     .max = CONF_DURATION_MAX},
    {.key = "upstream.hold_max_bytes",
     .type = CONF_SIZE,
     CONF_FIELD(hold_max_bytes),
     .min = 0,
     .max = CONF_SIZE_MAX},

    {.key = "deny",
     .type = CONF_STR_LIST,
     CONF_FIELD(deny),
     CONF_COUNT(ndeny),
     .max = CONFIG_MAX_DENY,
     .check = conf_check_command},

    {.key = "stats", .type = CONF_SECTION},
    {.key = "stats.listen",
     .type = CONF_ADDR,
     CONF_FIELD(stats_listen),
     CONF_FLAG(stats_enabled),
     .flags = CONF_OFF},

    {.key = "log", .type = CONF_SECTION},
    {.key = "log.level",
     .type = CONF_ENUM,
     CONF_FIELD(log_level),
     .parse_enum = log_level_parse,
     .what = "debug, info, warn or error"},
    {.key = "log.file", .type = CONF_STRING, CONF_FIELD(log_file), .flags = CONF_EMPTY_NULL},

    {.key = "fallback", .type = CONF_SECTION},
    {.key = "fallback.path",
     .type = CONF_STRING,
     CONF_FIELD(fallback_path),
     .flags = CONF_EMPTY_NULL},
    {.key = "fallback.after_ms",
     .type = CONF_DURATION,
     CONF_FIELD(fallback_after_ms),
     .min = 0,
     .max = CONF_DURATION_MAX},
    {.key = "fallback.keys",
     .type = CONF_STR_LIST,
     CONF_FIELD(fallback_keys),
     CONF_COUNT(nfallback_keys),
     .max = CONFIG_MAX_DENY},
    {.key = "fallback.commands",
     .type = CONF_STR_LIST,
     CONF_FIELD(fallback_commands),
     CONF_COUNT(nfallback_commands),
     .max = CONFIG_MAX_DENY},
    {.key = "fallback.serve_pops", .type = CONF_BOOL, CONF_FIELD(fallback_serve_pops)},
    {.key = "fallback.max_bytes",
     .type = CONF_SIZE,
     CONF_FIELD(fallback_max_bytes),
     .min = 0,
     .max = CONF_SIZE_MAX},

    {.key = "shutdown_timeout_ms",
     .type = CONF_DURATION,
     CONF_FIELD(shutdown_timeout_ms),
     .min = 1,
     .max = CONF_DURATION_MAX},

    {.key = "takeover", .type = CONF_SECTION},
    {.key = "takeover.socket",
     .type = CONF_STRING,
     CONF_FIELD(takeover_socket),
     .flags = CONF_EMPTY_NULL,
     .check = conf_check_sockpath},

    {.key = "durability", .type = CONF_SECTION},
    {.key = "durability.require_aof", .type = CONF_BOOL, CONF_FIELD(require_aof)},
    {.key = "durability.replicas_ack",
     .type = CONF_INT,
     CONF_FIELD(replicas_ack),
     .min = 0,
     .max = 16},
    {.key = "durability.replicas_ack_timeout_ms",
     .type = CONF_DURATION,
     CONF_FIELD(replicas_ack_timeout_ms),
     .min = 1,
     .max = CONF_DURATION_MAX},
    {.key = "durability.enforce_interval_ms",
     .type = CONF_DURATION,
     CONF_FIELD(enforce_interval_ms),
     .min = 1,
     .max = CONF_DURATION_MAX},
    {.key = "durability.config_command",
     .type = CONF_STRING,
     CONF_FIELD(config_command),
     .check = conf_check_word},
    {.key = "durability.persist_config", .type = CONF_BOOL, CONF_FIELD(persist_config)},
};

#define CONF_NKEYS (sizeof(conf_table) / sizeof(conf_table[0]))

/* The default deny list (already normalised). */
static const char *const conf_default_deny[] = {
    "shutdown", "replicaof", "slaveof", "failover", "debug", "config rewrite",
};

/* Where a key appeared in the document. */
typedef struct conf_seen {
    int present;       /* 1 once the key was read */
    yaml_mark_t key;   /* position of the key */
    yaml_mark_t value; /* position of its value */
} conf_seen;

/* State of one load. */
typedef struct conf_ctx {
    config *cfg;                /* being filled */
    const char *name;           /* file name for messages */
    const unsigned char *input; /* the YAML text (for reader error positions) */
    size_t input_len;           /* its length */
    yaml_document_t *doc;       /* the loaded document */
    char *err;                  /* message buffer, may be NULL */
    size_t errlen;              /* its size */
    conf_seen seen[CONF_NKEYS]; /* per conf_table entry */
} conf_ctx;

/* Writes "name:line:col: message" (line and col 1-based) and returns -1. */
static int conf_error_at(conf_ctx *ctx, unsigned long line, unsigned long col, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static int conf_error_at(conf_ctx *ctx, unsigned long line, unsigned long col, const char *fmt, ...)
{
    va_list ap;
    int n;

    if (ctx->err == NULL || ctx->errlen == 0) {
        return -1;
    }
    n = snprintf(ctx->err, ctx->errlen, "%s:%lu:%lu: ", ctx->name, line, col);
    if (n < 0 || (size_t)n >= ctx->errlen) {
        return -1;
    }
    va_start(ap, fmt);
    vsnprintf(ctx->err + n, ctx->errlen - (size_t)n, fmt, ap);
    va_end(ap);
    return -1;
}

/* Converts a libyaml mark (0-based) into the 1-based line and column. */
static void conf_mark_pos(yaml_mark_t mark, unsigned long *line, unsigned long *col)
{
    *line = (unsigned long)mark.line + 1;
    *col = (unsigned long)mark.column + 1;
}

#define conf_error(ctx, mark, ...)                                                                 \
    conf_error_at((ctx), (unsigned long)(mark).line + 1, (unsigned long)(mark).column + 1,         \
                  __VA_ARGS__)

/* Copies s into buf as printable text, cut to CONF_QUOTE_MAX with "...". */
static const char *conf_quote(const char *s, char *buf, size_t len)
{
    size_t i = 0;
    size_t limit = len - 1;
    int cut = 0;

    if (limit > CONF_QUOTE_MAX) {
        limit = CONF_QUOTE_MAX;
    }
    for (; *s != '\0'; s++) {
        if (i == limit) {
            cut = 1;
            break;
        }
        buf[i++] = (unsigned char)*s < 0x20 || *s == 0x7f ? '?' : *s;
    }
    buf[i] = '\0';
    if (cut && i >= 3) {
        memcpy(buf + i - 3, "...", 3);
    }
    return buf;
}

static void *conf_field(config *cfg, size_t off)
{
    return (char *)cfg + off;
}

static int conf_find(const char *key)
{
    for (size_t i = 0; i < CONF_NKEYS; i++) {
        if (strcmp(conf_table[i].key, key) == 0) {
            return (int)i;
        }
    }
    return -1;
}

/* A plain scalar that YAML reads as null: empty, "~" or "null". */
static int conf_is_null(const yaml_node_t *n)
{
    const char *s;

    if (n->type != YAML_SCALAR_NODE || n->data.scalar.style != YAML_PLAIN_SCALAR_STYLE) {
        return 0;
    }
    s = (const char *)n->data.scalar.value;
    return s[0] == '\0' || strcmp(s, "~") == 0 || strcmp(s, "null") == 0 ||
           strcmp(s, "Null") == 0 || strcmp(s, "NULL") == 0;
}

/* Describes a value for "got ..." messages. */
static const char *conf_describe(const yaml_node_t *n, char *buf, size_t len)
{
    char q[CONF_QUOTE_MAX + 1];

    if (n->type == YAML_MAPPING_NODE) {
        return "a mapping";
    }
    if (n->type == YAML_SEQUENCE_NODE) {
        return "a list";
    }
    if (conf_is_null(n)) {
        return "nothing";
    }
    snprintf(buf, len, "'%s'", conf_quote((const char *)n->data.scalar.value, q, sizeof(q)));
    return buf;
}

/* The text of a scalar node, or NULL if it holds a NUL byte. */
static const char *conf_scalar(const yaml_node_t *n)
{
    const char *s = (const char *)n->data.scalar.value;

    if (strlen(s) != n->data.scalar.length) {
        return NULL;
    }
    return s;
}

/* Parses an optionally signed decimal integer. 0, -1 if malformed, -2 on overflow. */
static int conf_parse_ll(const char *s, long long *out)
{
    int neg = 0;
    unsigned long long v = 0;
    unsigned long long limit;

    if (*s == '-' || *s == '+') {
        neg = *s == '-';
        s++;
    }
    if (!isdigit((unsigned char)*s)) {
        return -1;
    }
    limit = neg ? (unsigned long long)LLONG_MAX + 1 : (unsigned long long)LLONG_MAX;
    for (; isdigit((unsigned char)*s); s++) {
        unsigned d = (unsigned)(*s - '0');
        if (v > (limit - d) / 10) {
            while (isdigit((unsigned char)*s)) {
                s++;
            }
            return *s == '\0' ? -2 : -1;
        }
        v = v * 10 + d;
    }
    if (*s != '\0') {
        return -1;
    }
    if (neg) {
        *out = v == (unsigned long long)LLONG_MAX + 1 ? LLONG_MIN : -(long long)v;
    } else {
        *out = (long long)v;
    }
    return 0;
}

/* Parses digits and an optional b/kb/mb/gb suffix (when allow_suffix is set).
 * 0, -1 if malformed, -2 on overflow. */
static int conf_parse_unsigned(const char *s, int allow_suffix, unsigned long long *out)
{
    static const struct {
        const char *name;        /* suffix text */
        unsigned long long mult; /* bytes per unit */
    } units[] = {
        {"b", 1ull},
        {"kb", 1ull << 10},
        {"mb", 1ull << 20},
        {"gb", 1ull << 30},
    };
    unsigned long long v = 0;
    int overflow = 0;

    if (!isdigit((unsigned char)*s)) {
        return -1;
    }
    for (; isdigit((unsigned char)*s); s++) {
        unsigned d = (unsigned)(*s - '0');
        if (v > (ULLONG_MAX - d) / 10) {
            overflow = 1;
        } else {
            v = v * 10 + d;
        }
    }
    if (*s != '\0') {
        size_t i;
        if (!allow_suffix) {
            return -1;
        }
        while (*s == ' ') {
            s++;
        }
        for (i = 0; i < sizeof(units) / sizeof(units[0]); i++) {
            if (strcasecmp(s, units[i].name) == 0) {
                break;
            }
        }
        if (i == sizeof(units) / sizeof(units[0])) {
            return -1;
        }
        if (v > ULLONG_MAX / units[i].mult) {
            overflow = 1;
        } else {
            v *= units[i].mult;
        }
    }
    if (overflow) {
        return -2;
    }
    *out = v;
    return 0;
}

/* Parses an address; returns NULL or why it is not one. */
static const char *conf_addr_parse(const char *s, config_addr *out)
{
    config_addr a;
    const char *port;
    size_t n;
    long p = 0;

    memset(&a, 0, sizeof(a));
    if (s == NULL || *s == '\0') {
        return "empty address";
    }
    if (strncmp(s, "unix:", 5) == 0) {
        s += 5;
        n = strlen(s);
        if (n == 0) {
            return "empty unix socket path";
        }
        if (n >= sizeof(a.path)) {
            return "unix socket path too long (at most 107 bytes)";
        }
        for (size_t i = 0; i < n; i++) {
            if ((unsigned char)s[i] < 0x20) {
                return "control character in unix socket path";
            }
        }
        a.is_unix = 1;
        memcpy(a.path, s, n + 1);
        *out = a;
        return NULL;
    }
    if (s[0] == '[') {
        const char *close = strchr(s, ']');
        struct in6_addr in6;
        if (close == NULL) {
            return "missing ']' after IPv6 address";
        }
        n = (size_t)(close - (s + 1));
        if (n == 0 || n >= sizeof(a.host)) {
            return "bad IPv6 address";
        }
        memcpy(a.host, s + 1, n);
        a.host[n] = '\0';
        if (inet_pton(AF_INET6, a.host, &in6) != 1) {
            return "bad IPv6 address";
        }
        if (close[1] != ':') {
            return "missing port (expected [ipv6]:port)";
        }
        port = close + 2;
    } else {
        const char *colon = strrchr(s, ':');
        if (colon == NULL) {
            return "missing port (expected host:port)";
        }
        n = (size_t)(colon - s);
        if (n == 0) {
            return "missing host";
        }
        if (memchr(s, ':', n) != NULL) {
            return "IPv6 addresses must be written [address]:port";
        }
        if (n >= sizeof(a.host)) {
            return "host name too long";
        }
        for (size_t i = 0; i < n; i++) {
            unsigned char c = (unsigned char)s[i];
            if (!isalnum(c) && c != '-' && c != '.' && c != '_') {
                return "bad character in host name";
            }
        }
        memcpy(a.host, s, n);
        a.host[n] = '\0';
        port = colon + 1;
    }
    if (*port == '\0') {
        return "missing port";
    }
    for (const char *c = port; *c != '\0'; c++) {
        if (!isdigit((unsigned char)*c) || c - port >= 5) {
            return "port must be 1..65535";
        }
        p = p * 10 + (*c - '0');
    }
    if (p < 1 || p > 65535) {
        return "port must be 1..65535";
    }
    a.port = (int)p;
    *out = a;
    return NULL;
}

int config_parse_addr(const char *s, config_addr *out)
{
    return conf_addr_parse(s, out) == NULL ? 0 : -1;
}

char *config_addr_str(const config_addr *a, char *buf, size_t len)
{
    if (buf == NULL || len == 0) {
        return buf;
    }
    if (a->is_unix) {
        snprintf(buf, len, "unix:%s", a->path);
    } else if (strchr(a->host, ':') != NULL) {
        snprintf(buf, len, "[%s]:%d", a->host, a->port);
    } else {
        snprintf(buf, len, "%s:%d", a->host, a->port);
    }
    return buf;
}

static int conf_addr_equal(const config_addr *a, const config_addr *b)
{
    if (a->is_unix != b->is_unix) {
        return 0;
    }
    if (a->is_unix) {
        return strcmp(a->path, b->path) == 0;
    }
    return a->port == b->port && strcasecmp(a->host, b->host) == 0;
}

/* deny entries: lowercase, words separated by one space, at most two words. */
static const char *conf_check_command(char *value)
{
    char *w = value;
    int words = 0;
    int in_word = 0;

    for (char *r = value; *r != '\0'; r++) {
        unsigned char c = (unsigned char)*r;
        if (c == ' ' || c == '\t') {
            in_word = 0;
            continue;
        }
        if (c < 0x20 || c == 0x7f) {
            return "control character in command name";
        }
        if (!in_word) {
            if (words > 0) {
                *w++ = ' ';
            }
            words++;
            in_word = 1;
        }
        *w++ = (char)tolower(c);
    }
    *w = '\0';
    if (words == 0) {
        return "empty command name";
    }
    if (words > 2) {
        return "expected a command or 'command subcommand'";
    }
    return NULL;
}

/* A single word: no spaces or control characters. */
static const char *conf_check_word(char *value)
{
    for (const char *c = value; *c != '\0'; c++) {
        if ((unsigned char)*c <= 0x20 || *c == 0x7f) {
            return "must be a single word";
        }
    }
    return NULL;
}

/* A unix socket path: "" (off) or one that fits sockaddr_un. */
static const char *conf_check_sockpath(char *value)
{
    return strlen(value) >= sizeof(((config_addr *)0)->path) ? "unix socket path too long" : NULL;
}

/* Error for a value of the wrong shape. */
static int conf_type_error(conf_ctx *ctx, const conf_entry *e, const yaml_node_t *v,
                           const char *expected)
{
    char buf[CONF_QUOTE_MAX + 8];

    return conf_error(ctx, v->start_mark, "%s: expected %s, got %s", e->key, expected,
                      conf_describe(v, buf, sizeof(buf)));
}

static int conf_range_error(conf_ctx *ctx, const conf_entry *e, const yaml_node_t *v,
                            const char *text)
{
    char q[CONF_QUOTE_MAX + 1];

    return conf_error(ctx, v->start_mark, "%s: %s is out of range (%lld..%lld)", e->key,
                      conf_quote(text, q, sizeof(q)), e->min, e->max);
}

static int conf_oom(conf_ctx *ctx, const yaml_node_t *v)
{
    return conf_error(ctx, v->start_mark, "out of memory");
}

/* Copies a string value, runs the entry's check; *out is NULL on error. */
static int conf_string_value(conf_ctx *ctx, const conf_entry *e, const yaml_node_t *v,
                             const char *text, char **out)
{
    char *copy;
    const char *why;

    *out = NULL;
    if (text[0] == '\0' && e->check == NULL) {
        return conf_type_error(ctx, e, v, "a non-empty string");
    }
    copy = strdup(text);
    if (copy == NULL) {
        return conf_oom(ctx, v);
    }
    if (e->check != NULL && (why = e->check(copy)) != NULL) {
        char q[CONF_QUOTE_MAX + 1];
        conf_error(ctx, v->start_mark, "%s: '%s': %s", e->key, conf_quote(text, q, sizeof(q)), why);
        free(copy);
        return -1;
    }
    *out = copy;
    return 0;
}

/* Sets an address list or a string list from a scalar or a sequence. */
static int conf_set_list(conf_ctx *ctx, const conf_entry *e, yaml_node_t *v)
{
    int *count = conf_field(ctx->cfg, e->count_off);
    yaml_node_item_t single = 0;
    yaml_node_item_t *items;
    yaml_node_item_t *end;

    if (v->type == YAML_MAPPING_NODE || conf_is_null(v)) {
        return conf_type_error(ctx, e, v, "a list (use [] for an empty one)");
    }
    if (v->type == YAML_SEQUENCE_NODE) {
        items = v->data.sequence.items.start;
        end = v->data.sequence.items.top;
    } else {
        items = &single;
        end = items + 1;
    }
    if (e->type == CONF_STR_LIST) {
        char **list = conf_field(ctx->cfg, e->off);
        for (int i = 0; i < *count; i++) {
            free(list[i]);
            list[i] = NULL;
        }
    }
    *count = 0;
    for (yaml_node_item_t *it = items; it < end; it++) {
        yaml_node_t *item = it == &single ? v : yaml_document_get_node(ctx->doc, *it);
        const char *text;
        if (item == NULL) {
            continue;
        }
        if (item->type != YAML_SCALAR_NODE) {
            return conf_type_error(ctx, e, item,
                                   e->type == CONF_ADDR_LIST ? "an address" : "a string");
        }
        text = conf_scalar(item);
        if (text == NULL) {
            return conf_error(ctx, item->start_mark, "%s: NUL byte in value", e->key);
        }
        if (*count >= e->max) {
            return conf_error(ctx, item->start_mark, "%s: too many entries (at most %lld)", e->key,
                              e->max);
        }
        if (e->type == CONF_ADDR_LIST) {
            config_addr *list = conf_field(ctx->cfg, e->off);
            char q[CONF_QUOTE_MAX + 1];
            const char *why = conf_addr_parse(text, &list[*count]);
            if (why != NULL) {
                return conf_error(ctx, item->start_mark, "%s: bad address '%s': %s", e->key,
                                  conf_quote(text, q, sizeof(q)), why);
            }
            for (int i = 0; i < *count; i++) {
                if (conf_addr_equal(&list[i], &list[*count])) {
                    return conf_error(ctx, item->start_mark, "%s: duplicate address '%s'", e->key,
                                      conf_quote(text, q, sizeof(q)));
                }
            }
            (*count)++;
        } else {
            char **list = conf_field(ctx->cfg, e->off);
            char *s;
            int dup = 0;
            if (conf_string_value(ctx, e, item, text, &s) < 0) {
                return -1;
            }
            for (int i = 0; i < *count; i++) {
                if (strcmp(list[i], s) == 0) {
                    dup = 1;
                }
            }
            if (dup) {
                free(s);
            } else {
                list[(*count)++] = s;
            }
        }
    }
    return 0;
}

static int conf_walk(conf_ctx *ctx, yaml_node_t *map, const char *prefix);

/* Parses the value v of entry e into the config. */
static int conf_set(conf_ctx *ctx, const conf_entry *e, yaml_node_t *v)
{
    config *cfg = ctx->cfg;
    const char *text = NULL;
    char q[CONF_QUOTE_MAX + 1];
    unsigned long long u;
    long long ll;
    int rc;

    if (e->has_flag) {
        *(int *)conf_field(cfg, e->flag_off) = 1;
    }
    switch (e->type) {
    case CONF_SECTION:
        if (v->type == YAML_MAPPING_NODE) {
            return conf_walk(ctx, v, e->key);
        }
        if (conf_is_null(v)) {
            return 0;
        }
        return conf_type_error(ctx, e, v, "a mapping");
    case CONF_ADDR_LIST:
    case CONF_STR_LIST:
        return conf_set_list(ctx, e, v);
    default:
        break;
    }

    /* Every other type is a scalar. */
    if (v->type == YAML_SCALAR_NODE) {
        text = conf_scalar(v);
        if (text == NULL) {
            return conf_error(ctx, v->start_mark, "%s: NUL byte in value", e->key);
        }
    }
    switch (e->type) {
    case CONF_STRING: {
        char **field = conf_field(cfg, e->off);
        char *s = NULL;
        if (text == NULL) {
            return conf_type_error(ctx, e, v, "a string");
        }
        if (conf_is_null(v) || text[0] == '\0') {
            if (!(e->flags & CONF_EMPTY_NULL)) {
                return conf_type_error(ctx, e, v, "a non-empty string");
            }
        } else if (conf_string_value(ctx, e, v, text, &s) < 0) {
            return -1;
        }
        free(*field);
        *field = s;
        return 0;
    }
    case CONF_INT:
        if (text == NULL || (rc = conf_parse_ll(text, &ll)) == -1) {
            return conf_type_error(ctx, e, v, "an integer");
        }
        if (rc == -2 || ll < e->min || ll > e->max) {
            return conf_range_error(ctx, e, v, text);
        }
        *(int *)conf_field(cfg, e->off) = (int)ll;
        return 0;
    case CONF_UINT:
    case CONF_SIZE:
    case CONF_DURATION:
        if (text == NULL || (rc = conf_parse_unsigned(text, e->type == CONF_SIZE, &u)) == -1) {
            return conf_type_error(ctx, e, v,
                                   e->type == CONF_SIZE       ? "a size (bytes, or with kb/mb/gb)"
                                   : e->type == CONF_DURATION ? "a duration in milliseconds"
                                                              : "a non-negative integer");
        }
        if (rc == -2 || u < (unsigned long long)e->min || u > (unsigned long long)e->max) {
            return conf_range_error(ctx, e, v, text);
        }
        if (e->type == CONF_DURATION) {
            *(uint64_t *)conf_field(cfg, e->off) = (uint64_t)u;
        } else {
            *(size_t *)conf_field(cfg, e->off) = (size_t)u;
        }
        return 0;
    case CONF_BOOL:
        if (text != NULL && (strcasecmp(text, "true") == 0 || strcasecmp(text, "yes") == 0)) {
            *(int *)conf_field(cfg, e->off) = 1;
            return 0;
        }
        if (text != NULL && (strcasecmp(text, "false") == 0 || strcasecmp(text, "no") == 0)) {
            *(int *)conf_field(cfg, e->off) = 0;
            return 0;
        }
        return conf_type_error(ctx, e, v, "true or false");
    case CONF_ENUM:
        if (text == NULL || (rc = e->parse_enum(text)) < 0) {
            return conf_type_error(ctx, e, v, e->what);
        }
        *(int *)conf_field(cfg, e->off) = rc;
        return 0;
    case CONF_ADDR: {
        const char *why;
        if (text == NULL) {
            return conf_type_error(ctx, e, v, "an address");
        }
        if ((e->flags & CONF_OFF) &&
            (conf_is_null(v) || text[0] == '\0' || strcasecmp(text, "off") == 0)) {
            *(int *)conf_field(cfg, e->flag_off) = 0;
            return 0;
        }
        if (conf_is_null(v)) {
            return conf_type_error(ctx, e, v, "an address");
        }
        why = conf_addr_parse(text, conf_field(cfg, e->off));
        if (why != NULL) {
            return conf_error(ctx, v->start_mark, "%s: bad address '%s': %s", e->key,
                              conf_quote(text, q, sizeof(q)), why);
        }
        return 0;
    }
    default:
        return conf_error(ctx, v->start_mark, "%s: internal error: bad key type", e->key);
    }
}

/* Reads every key of a mapping; prefix is the dotted section name or NULL. */
static int conf_walk(conf_ctx *ctx, yaml_node_t *map, const char *prefix)
{
    for (yaml_node_pair_t *p = map->data.mapping.pairs.start; p < map->data.mapping.pairs.top;
         p++) {
        yaml_node_t *k = yaml_document_get_node(ctx->doc, p->key);
        yaml_node_t *v = yaml_document_get_node(ctx->doc, p->value);
        char full[CONF_KEY_MAX];
        char q[CONF_QUOTE_MAX + 1];
        const char *name;
        int idx = -1;
        int n;

        if (k == NULL || v == NULL) {
            continue;
        }
        if (k->type != YAML_SCALAR_NODE) {
            return conf_error(ctx, k->start_mark, "keys must be names, not %s",
                              k->type == YAML_MAPPING_NODE ? "a mapping" : "a list");
        }
        name = (const char *)k->data.scalar.value;
        if (prefix != NULL) {
            n = snprintf(full, sizeof(full), "%s.%s", prefix, name);
        } else {
            n = snprintf(full, sizeof(full), "%s", name);
        }
        if (n > 0 && (size_t)n < sizeof(full) && strchr(name, '.') == NULL &&
            conf_scalar(k) != NULL) {
            idx = conf_find(full);
        }
        if (idx < 0) {
            return conf_error(ctx, k->start_mark, "unknown key '%s'",
                              conf_quote(full, q, sizeof(q)));
        }
        if (ctx->seen[idx].present) {
            return conf_error(ctx, k->start_mark, "duplicate key '%s' (first at line %lu)", full,
                              (unsigned long)ctx->seen[idx].key.line + 1);
        }
        ctx->seen[idx].present = 1;
        ctx->seen[idx].key = k->start_mark;
        ctx->seen[idx].value = v->start_mark;
        if (conf_set(ctx, &conf_table[idx], v) < 0) {
            return -1;
        }
    }
    return 0;
}

/* Error at a key's position, or 1:1 if the key was not given. */
static int conf_key_error(conf_ctx *ctx, const char *key, int at_value, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static int conf_key_error(conf_ctx *ctx, const char *key, int at_value, const char *fmt, ...)
{
    unsigned long line = 1;
    unsigned long col = 1;
    char msg[256];
    va_list ap;
    int idx = conf_find(key);

    if (idx >= 0 && ctx->seen[idx].present) {
        conf_mark_pos(at_value ? ctx->seen[idx].value : ctx->seen[idx].key, &line, &col);
    }
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    return conf_error_at(ctx, line, col, "%s", msg);
}

static int conf_present(const conf_ctx *ctx, const char *key)
{
    int idx = conf_find(key);

    return idx >= 0 && ctx->seen[idx].present;
}

/* Rules that involve more than one key. */
static int conf_semantic(conf_ctx *ctx)
{
    config *cfg = ctx->cfg;
    char buf[300];

    if (cfg->has_redis && cfg->has_sentinel) {
        return conf_key_error(ctx, "sentinel", 0,
                              "redis.address and sentinel are mutually exclusive");
    }
    if (!cfg->has_redis && !cfg->has_sentinel) {
        return conf_key_error(ctx, "redis", 0, "either redis.address or sentinel must be set");
    }
    if (cfg->has_sentinel) {
        if (cfg->sentinel_master == NULL) {
            return conf_key_error(ctx, "sentinel", 0, "sentinel.master must be set");
        }
        if (cfg->nsentinels == 0) {
            return conf_key_error(
                ctx, conf_present(ctx, "sentinel.addresses") ? "sentinel.addresses" : "sentinel", 0,
                "sentinel.addresses must list at least one sentinel");
        }
    }
    if (cfg->nlisten == 0) {
        return conf_key_error(ctx, "listen", 0, "listen must have at least one address");
    }
    if (cfg->workers == 0) {
        /* auto: one loop per core but one, at most CONFIG_AUTO_WORKERS; one
         * where a feature needs a single loop (below). */
        unsigned cores = uv_available_parallelism();
        cfg->workers = cores > 1 ? (int)cores - 1 : 1;
        if (cfg->workers > CONFIG_AUTO_WORKERS) {
            cfg->workers = CONFIG_AUTO_WORKERS;
        }
        if (cfg->fallback_path != NULL) {
            cfg->workers = 1;
        }
    }
    if (cfg->workers > 1 && cfg->fallback_path != NULL) {
        return conf_key_error(ctx, "workers", 1,
                              "workers: %d with fallback.path: the fallback store needs "
                              "workers: 1 (or auto) for now",
                              cfg->workers);
    }
    if (cfg->client_auth == CLIENT_AUTH_REDIS && cfg->client_password != NULL) {
        return conf_key_error(ctx, "client.password", 1,
                              "client.password cannot be set with client.auth redis "
                              "(Redis checks the clients' passwords)");
    }
    if (cfg->stats_enabled) {
        for (int i = 0; i < cfg->nlisten; i++) {
            if (conf_addr_equal(&cfg->stats_listen, &cfg->listen[i])) {
                return conf_key_error(ctx, "stats.listen", 1,
                                      "stats.listen: %s is also a listen address",
                                      config_addr_str(&cfg->stats_listen, buf, sizeof(buf)));
            }
        }
    }
    return 0;
}

/* Reports a libyaml error with its position. */
static int conf_yaml_error(conf_ctx *ctx, const yaml_parser_t *parser)
{
    const char *problem = parser->problem != NULL ? parser->problem : "unknown error";

    switch (parser->error) {
    case YAML_MEMORY_ERROR:
        return conf_error_at(ctx, 1, 1, "out of memory");
    case YAML_READER_ERROR: {
        /* Reader errors carry a byte offset; turn it into line:column. */
        unsigned long line = 1;
        unsigned long col = 1;
        for (size_t i = 0; i < parser->problem_offset && i < ctx->input_len; i++) {
            if (ctx->input[i] == '\n') {
                line++;
                col = 1;
            } else {
                col++;
            }
        }
        return conf_error_at(ctx, line, col, "invalid input: %s", problem);
    }
    default:
        if (parser->context != NULL) {
            return conf_error(ctx, parser->problem_mark, "YAML syntax error: %s (%s)", problem,
                              parser->context);
        }
        return conf_error(ctx, parser->problem_mark, "YAML syntax error: %s", problem);
    }
}

/* Parses, assigns and validates; cfg already holds the defaults. */
static int conf_load_yaml(conf_ctx *ctx)
{
    yaml_parser_t parser;
    yaml_document_t doc;
    yaml_document_t extra;
    yaml_node_t *root;
    int rc = -1;

    if (!yaml_parser_initialize(&parser)) {
        return conf_error_at(ctx, 1, 1, "out of memory");
    }
    yaml_parser_set_input_string(&parser, ctx->input, ctx->input_len);
    if (!yaml_parser_load(&parser, &doc)) {
        conf_yaml_error(ctx, &parser);
        yaml_parser_delete(&parser);
        return -1;
    }
    ctx->doc = &doc;
    root = yaml_document_get_root_node(&doc);
    if (root == NULL || conf_is_null(root)) {
        conf_error_at(ctx, 1, 1, "empty configuration file");
    } else if (root->type != YAML_MAPPING_NODE) {
        conf_error(ctx, root->start_mark, "the top level must be a mapping (key: value)");
    } else if (conf_walk(ctx, root, NULL) == 0) {
        /* A second document would be silently ignored: refuse it. */
        if (!yaml_parser_load(&parser, &extra)) {
            conf_yaml_error(ctx, &parser);
        } else {
            yaml_node_t *more = yaml_document_get_root_node(&extra);
            if (more != NULL) {
                conf_error(ctx, more->start_mark, "only one YAML document is allowed");
            } else {
                rc = conf_semantic(ctx);
            }
            yaml_document_delete(&extra);
        }
    }
    ctx->doc = NULL;
    yaml_document_delete(&doc);
    yaml_parser_delete(&parser);
    return rc;
}

static int conf_load_buffer(config *cfg, const char *name, const unsigned char *buf, size_t len,
                            char *err, size_t errlen)
{
    conf_ctx ctx;

    memset(&ctx, 0, sizeof(ctx));
    ctx.cfg = cfg;
    ctx.name = name;
    ctx.input = buf;
    ctx.input_len = len;
    ctx.err = err;
    ctx.errlen = errlen;
    if (err != NULL && errlen > 0) {
        err[0] = '\0';
    }
    cfg->file = strdup(name);
    if (cfg->file == NULL) {
        conf_error_at(&ctx, 1, 1, "out of memory");
        config_free(cfg);
        return -1;
    }
    if (conf_load_yaml(&ctx) < 0) {
        config_free(cfg);
        return -1;
    }
    return 0;
}

void config_defaults(config *cfg)
{
    memset(cfg, 0, sizeof(*cfg));
    config_parse_addr("127.0.0.1:6380", &cfg->listen[0]);
    cfg->nlisten = 1;
    cfg->sentinel_resolve_interval_ms = 1000;
    cfg->sentinel_timeout_ms = 1000;
    cfg->max_clients = 10000;
    cfg->max_query_bytes = (size_t)1 << 30;
    cfg->max_pending_bytes = (size_t)64 << 20;
    cfg->max_bulk_len = (size_t)512 << 20;
    cfg->max_args = 1048576;
    cfg->max_inline_len = (size_t)64 << 10;
    cfg->idle_timeout_ms = 0;
    cfg->max_pipeline = 10000;
    cfg->request_timeout_ms = 0;
    cfg->pubsub_output_limit.hard = (size_t)32 << 20;
    cfg->pubsub_output_limit.soft = (size_t)8 << 20;
    cfg->pubsub_output_limit.soft_seconds = 60;
    cfg->max_memory = 0;
    cfg->shared_links = 1;
    cfg->workers = 1;
    cfg->pool_idle = 16;
    cfg->connect_timeout_ms = 2000;
    cfg->ping_interval_ms = 1000;
    cfg->hold_timeout_ms = 10000;
    cfg->fence_timeout_ms = 1000;
    cfg->drain_ms = 300;
    cfg->health_timeout_ms = 5000;
    cfg->fallback_after_ms = 5000;
    cfg->fallback_serve_pops = 1;
    cfg->hold_max_bytes = (size_t)64 << 20;
    for (size_t i = 0; i < sizeof(conf_default_deny) / sizeof(conf_default_deny[0]); i++) {
        char *s = strdup(conf_default_deny[i]);
        if (s != NULL) {
            cfg->deny[cfg->ndeny++] = s;
        }
    }
    config_parse_addr("127.0.0.1:22222", &cfg->stats_listen);
    cfg->stats_enabled = 1;
    cfg->log_level = LOG_INFO;
    cfg->shutdown_timeout_ms = 5000;
    cfg->require_aof = 0;
    cfg->replicas_ack = -1; /* auto: 1 with Sentinel, 0 with a fixed master */
    cfg->replicas_ack_timeout_ms = 1000;
    cfg->enforce_interval_ms = 5000;
    cfg->config_command = strdup("CONFIG");
    cfg->persist_config = 0;
}

int config_load_string(config *cfg, const char *name, const char *yaml, char *err, size_t errlen)
{
    config_defaults(cfg);
    if (name == NULL) {
        name = "<string>";
    }
    if (yaml == NULL) {
        yaml = "";
    }
    return conf_load_buffer(cfg, name, (const unsigned char *)yaml, strlen(yaml), err, errlen);
}

int config_load(config *cfg, const char *path, char *err, size_t errlen)
{
    conf_ctx ctx;
    unsigned char *buf = NULL;
    size_t len = 0;
    size_t cap = 0;
    FILE *f;
    int rc;

    memset(&ctx, 0, sizeof(ctx));
    ctx.name = path;
    ctx.err = err;
    ctx.errlen = errlen;
    config_defaults(cfg);
    f = fopen(path, "rb");
    if (f == NULL) {
        conf_error_at(&ctx, 1, 1, "cannot open: %s", strerror(errno));
        config_free(cfg);
        return -1;
    }
    for (;;) {
        size_t n;
        if (len == cap) {
            unsigned char *grown;
            cap = cap == 0 ? 4096 : cap * 2;
            if (cap > CONF_MAX_FILE + 1) {
                cap = CONF_MAX_FILE + 1;
            }
            if (len == cap) {
                conf_error_at(&ctx, 1, 1, "file too large (over %u bytes)", CONF_MAX_FILE);
                goto fail;
            }
            grown = realloc(buf, cap);
            if (grown == NULL) {
                conf_error_at(&ctx, 1, 1, "out of memory");
                goto fail;
            }
            buf = grown;
        }
        n = fread(buf + len, 1, cap - len, f);
        len += n;
        if (n == 0) {
            if (ferror(f)) {
                conf_error_at(&ctx, 1, 1, "cannot read: %s", strerror(errno));
                goto fail;
            }
            break;
        }
    }
    fclose(f);
    rc = conf_load_buffer(cfg, path, buf != NULL ? buf : (const unsigned char *)"", len, err,
                          errlen);
    free(buf);
    return rc;

fail:
    fclose(f);
    free(buf);
    config_free(cfg);
    return -1;
}

void config_free(config *cfg)
{
    if (cfg == NULL) {
        return;
    }
    free(cfg->file);
    cfg->file = NULL;
    free(cfg->redis_username);
    cfg->redis_username = NULL;
    free(cfg->redis_password);
    cfg->redis_password = NULL;
    free(cfg->sentinel_master);
    cfg->sentinel_master = NULL;
    free(cfg->sentinel_username);
    cfg->sentinel_username = NULL;
    free(cfg->sentinel_password);
    cfg->sentinel_password = NULL;
    free(cfg->client_password);
    cfg->client_password = NULL;
    for (int i = 0; i < cfg->ndeny && i < CONFIG_MAX_DENY; i++) {
        free(cfg->deny[i]);
        cfg->deny[i] = NULL;
    }
    cfg->ndeny = 0;
    free(cfg->log_file);
    cfg->log_file = NULL;
    free(cfg->fallback_path);
    cfg->fallback_path = NULL;
    free(cfg->takeover_socket);
    cfg->takeover_socket = NULL;
    for (int i = 0; i < cfg->nfallback_keys && i < CONFIG_MAX_DENY; i++) {
        free(cfg->fallback_keys[i]);
        cfg->fallback_keys[i] = NULL;
    }
    cfg->nfallback_keys = 0;
    for (int i = 0; i < cfg->nfallback_commands && i < CONFIG_MAX_DENY; i++) {
        free(cfg->fallback_commands[i]);
        cfg->fallback_commands[i] = NULL;
    }
    cfg->nfallback_commands = 0;
    free(cfg->config_command);
    cfg->config_command = NULL;
}
