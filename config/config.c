/* config.c - ferry's configuration keys: the table of dotted keys (type,
 * range, field), the parsers of a value's text, the defaults, and the
 * semantic pass that checks the rules spanning keys. Reading the YAML
 * document into the table, and errors as "file:line:column: msg", is
 * config_yaml.c's part. */

#include "config.h"
#include "config_keys.h"
#include "log.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <uv.h>

#define CONF_DURATION_MAX 31536000000LL    /* one year, in milliseconds */
#define CONF_SIZE_MAX ((long long)1 << 50) /* 1 PiB: sane upper bound for sizes */

static const char *conf_check_command(char *value);
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

const conf_entry conf_table[] = {
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

    {.key = "queue_depths", .type = CONF_SECTION},
    {.key = "queue_depths.interval_ms",
     .type = CONF_DURATION,
     CONF_FIELD(queue_depths_interval_ms),
     .min = 10,
     .max = CONF_DURATION_MAX},
    {.key = "queue_depths.keys_per_round",
     .type = CONF_UINT,
     CONF_FIELD(queue_depths_keys_per_round),
     .min = 1,
     .max = 100000},
    {.key = "queue_depths.max_keys",
     .type = CONF_UINT,
     CONF_FIELD(queue_depths_max_keys),
     .min = 1,
     .max = 1000000},

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
_Static_assert(CONF_NKEYS <= CONF_KEYS_MAX, "CONF_KEYS_MAX is too small for conf_table");

/* The default deny list (already normalised). */
static const char *const conf_default_deny[] = {
    "shutdown", "replicaof", "slaveof", "failover", "debug", "config rewrite",
};

int conf_find(const char *key)
{
    for (size_t i = 0; i < CONF_NKEYS; i++) {
        if (strcmp(conf_table[i].key, key) == 0) {
            return (int)i;
        }
    }
    return -1;
}

/* Parses an optionally signed decimal integer. 0, -1 if malformed, -2 on overflow. */
int conf_parse_ll(const char *s, long long *out)
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
int conf_parse_unsigned(const char *s, int allow_suffix, unsigned long long *out)
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
const char *conf_addr_parse(const char *s, config_addr *out)
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

int conf_addr_equal(const config_addr *a, const config_addr *b)
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

/* Rules that involve more than one key. */
int conf_semantic(conf_ctx *ctx, config *cfg)
{
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
        /* auto: one loop per core but one, at most CONFIG_AUTO_WORKERS. */
        unsigned cores = uv_available_parallelism();
        cfg->workers = cores > 1 ? (int)cores - 1 : 1;
        if (cfg->workers > CONFIG_AUTO_WORKERS) {
            cfg->workers = CONFIG_AUTO_WORKERS;
        }
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
    cfg->queue_depths_interval_ms = 1000;
    cfg->queue_depths_keys_per_round = 100;
    cfg->queue_depths_max_keys = 1000;
    cfg->require_aof = 0;
    cfg->replicas_ack = -1; /* auto: 1 with Sentinel, 0 with a fixed master */
    cfg->replicas_ack_timeout_ms = 1000;
    cfg->enforce_interval_ms = 5000;
    cfg->config_command = strdup("CONFIG");
    cfg->persist_config = 0;
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
    for (int q = 0; q < cfg->nqueues && q < CONFIG_MAX_QUEUES; q++) {
        for (int i = 0; i < cfg->queues[q].nkeys && i < CONFIG_MAX_QUEUE_KEYS; i++) {
            free(cfg->queues[q].keys[i]);
            cfg->queues[q].keys[i] = NULL;
        }
        cfg->queues[q].nkeys = 0;
        free(cfg->queues[q].processing);
        cfg->queues[q].processing = NULL;
        free(cfg->queues[q].dead_letter);
        cfg->queues[q].dead_letter = NULL;
    }
    cfg->nqueues = 0;
}
