/* config.c - ferry's configuration keys: the table of dotted keys (type,
 * range, field), the parsers of a value's text, the defaults, and the
 * semantic pass that checks the rules spanning keys. Reading the YAML
 * document into the table, and errors as "file:line:column: msg", is
 * config_yaml.c's part. */

#include "config.h"
#include "config_keys.h"
#include "glob.h"
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

static const char *client_auth_name(int v)
{
    return v == CLIENT_AUTH_REDIS ? "redis" : "ferry";
}

static const char *log_level_name(int v)
{
    static const char *const names[] = {"debug", "info", "warn", "error"};
    return v >= 0 && v < (int)(sizeof(names) / sizeof(names[0])) ? names[v] : "?";
}

/* tls.auth_clients: no, optional or yes (Redis' tls-auth-clients). */
static int tls_auth_parse(const char *s)
{
    if (strcmp(s, "no") == 0) {
        return TLS_AUTH_NO;
    }
    if (strcmp(s, "optional") == 0) {
        return TLS_AUTH_OPTIONAL;
    }
    if (strcmp(s, "yes") == 0) {
        return TLS_AUTH_YES;
    }
    return -1;
}

static const char *tls_auth_name(int v)
{
    return v == TLS_AUTH_NO ? "no" : v == TLS_AUTH_OPTIONAL ? "optional" : "yes";
}

/* redis.tls.verify, sentinel.tls.verify: full, ca or none. */
static int tls_verify_parse(const char *s)
{
    if (strcmp(s, "full") == 0) {
        return TLS_VERIFY_FULL;
    }
    if (strcmp(s, "ca") == 0) {
        return TLS_VERIFY_CA;
    }
    if (strcmp(s, "none") == 0) {
        return TLS_VERIFY_NONE;
    }
    return -1;
}

static const char *tls_verify_name(int v)
{
    return v == TLS_VERIFY_CA ? "ca" : v == TLS_VERIFY_NONE ? "none" : "full";
}

/* tls.protocols: TLSv1.2 and/or TLSv1.3, separated by spaces. */
static const char *conf_check_protocols(char *value)
{
    char copy[128];
    int n = 0;
    if (strlen(value) >= sizeof(copy)) {
        return "expected TLSv1.2 and/or TLSv1.3";
    }
    strcpy(copy, value);
    for (char *save = NULL, *w = strtok_r(copy, " \t", &save); w != NULL;
         w = strtok_r(NULL, " \t", &save)) {
        if (strcmp(w, "TLSv1.2") != 0 && strcmp(w, "TLSv1.3") != 0) {
            return "expected TLSv1.2 and/or TLSv1.3 (older protocols are not offered)";
        }
        n++;
    }
    return n == 0 ? "expected TLSv1.2 and/or TLSv1.3" : NULL;
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

static const char *conf_check_instance(char *value);

const conf_entry conf_table[] = {
    {.key = "listen",
     .doc = "where applications connect: one address or a list",
     .type = CONF_ADDR_LIST,
     CONF_FIELD(listen),
     CONF_COUNT(nlisten),
     .max = CONFIG_MAX_LISTEN},
    {.key = "listen_tls",
     .doc =
         "addresses of TLS listeners (host:port), beside the plain ones; they use the tls: block",
     .type = CONF_ADDR_LIST,
     CONF_FIELD(listen_tls),
     CONF_COUNT(nlisten_tls),
     .max = CONFIG_MAX_LISTEN},
    {.key = "tls",
     .doc = "the certificate and rules of the listen_tls listeners (Redis' tls-* directives)",
     .type = CONF_SECTION},
    {.key = "tls.cert_file",
     .doc = "the listeners' certificate (PEM; Redis' tls-cert-file)",
     .type = CONF_STRING,
     CONF_FIELD(tls_cert_file),
     .flags = CONF_EMPTY_NULL},
    {.key = "tls.key_file",
     .doc = "its private key (PEM; tls-key-file)",
     .type = CONF_STRING,
     CONF_FIELD(tls_key_file),
     .flags = CONF_EMPTY_NULL},
    {.key = "tls.ca_cert_file",
     .doc = "CA that client certificates must chain to (tls-ca-cert-file)",
     .type = CONF_STRING,
     CONF_FIELD(tls_ca_cert_file),
     .flags = CONF_EMPTY_NULL},
    {.key = "tls.auth_clients",
     .doc = "client certificates: no, optional or yes (required) (tls-auth-clients)",
     .type = CONF_ENUM,
     CONF_FIELD(tls_auth_clients),
     .parse_enum = tls_auth_parse,
     .enum_name = tls_auth_name,
     .what = "no, optional or yes"},
    {.key = "tls.protocols",
     .doc = "TLS versions offered: TLSv1.2 and/or TLSv1.3 (tls-protocols)",
     .type = CONF_STRING,
     CONF_FIELD(tls_protocols),
     .check = conf_check_protocols},
    {.key = "tls.ciphers",
     .doc = "TLS 1.2 cipher list, OpenSSL syntax (tls-ciphers); empty: OpenSSL's default",
     .type = CONF_STRING,
     CONF_FIELD(tls_ciphers),
     .flags = CONF_EMPTY_NULL},
    {.key = "tls.ciphersuites",
     .doc = "TLS 1.3 cipher suites (tls-ciphersuites); empty: OpenSSL's default",
     .type = CONF_STRING,
     CONF_FIELD(tls_ciphersuites),
     .flags = CONF_EMPTY_NULL},
    {.key = "tls.handshake_timeout_ms",
     .doc = "a client that has not finished its handshake by then is closed",
     .type = CONF_DURATION,
     CONF_FIELD(tls_handshake_timeout_ms),
     .min = 1,
     .max = CONF_DURATION_MAX},

    {.key = "workers",
     .doc = "event loops (threads) serving clients; auto: one per core but one, at most 8",
     .type = CONF_ENUM,
     CONF_FIELD(workers),
     .parse_enum = workers_parse,
     .what = "a number of event loops from 1 to 64, or auto"},

    {.key = "redis",
     .doc = "a fixed master (or, with sentinel, only the credentials)",
     .type = CONF_SECTION},
    {.key = "redis.address",
     .doc = "the fixed master; exactly one of redis.address and sentinel is set",
     .type = CONF_ADDR,
     CONF_FIELD(redis_addr),
     CONF_FLAG(has_redis)},
    {.key = "redis.username",
     .doc = "ACL user ferry authenticates as towards Redis; empty: none",
     .type = CONF_STRING,
     CONF_FIELD(redis_username),
     .flags = CONF_EMPTY_NULL},
    {.key = "redis.password",
     .doc = "password ferry authenticates with towards Redis; empty: none",
     .type = CONF_STRING,
     CONF_FIELD(redis_password),
     .flags = CONF_EMPTY_NULL},
    {.key = "redis.tls",
     .doc = "connect to the Redis nodes over TLS",
     .type = CONF_SECTION,
     CONF_FLAG(redis_tls.enabled)},
    {.key = "redis.tls.ca_cert_file",
     .doc = "CA the nodes' certificates must chain to",
     .type = CONF_STRING,
     CONF_FIELD(redis_tls.ca_cert_file),
     .flags = CONF_EMPTY_NULL},
    {.key = "redis.tls.cert_file",
     .doc = "client certificate ferry presents to the nodes (with key_file)",
     .type = CONF_STRING,
     CONF_FIELD(redis_tls.cert_file),
     .flags = CONF_EMPTY_NULL},
    {.key = "redis.tls.key_file",
     .doc = "its private key",
     .type = CONF_STRING,
     CONF_FIELD(redis_tls.key_file),
     .flags = CONF_EMPTY_NULL},
    {.key = "redis.tls.server_name",
     .doc = "name sent as SNI and checked with verify: full (default: the node's host)",
     .type = CONF_STRING,
     CONF_FIELD(redis_tls.server_name),
     .flags = CONF_EMPTY_NULL,
     .check = conf_check_word},
    {.key = "redis.tls.verify",
     .doc = "full (chain and host name), ca (chain only) or none",
     .type = CONF_ENUM,
     CONF_FIELD(redis_tls.verify),
     .parse_enum = tls_verify_parse,
     .enum_name = tls_verify_name,
     .what = "full, ca or none"},

    {.key = "sentinel",
     .doc = "follow the master Redis Sentinel announces",
     .type = CONF_SECTION,
     CONF_FLAG(has_sentinel)},
    {.key = "sentinel.master",
     .doc = "the master name the sentinels monitor",
     .type = CONF_STRING,
     CONF_FIELD(sentinel_master),
     .check = conf_check_word},
    {.key = "sentinel.addresses",
     .doc = "the sentinels (others are discovered)",
     .type = CONF_ADDR_LIST,
     CONF_FIELD(sentinels),
     CONF_COUNT(nsentinels),
     .max = CONFIG_MAX_SENTINELS},
    {.key = "sentinel.username",
     .doc = "ACL user towards the sentinels; empty: none",
     .type = CONF_STRING,
     CONF_FIELD(sentinel_username),
     .flags = CONF_EMPTY_NULL},
    {.key = "sentinel.password",
     .doc = "password towards the sentinels; empty: none",
     .type = CONF_STRING,
     CONF_FIELD(sentinel_password),
     .flags = CONF_EMPTY_NULL},
    {.key = "sentinel.resolve_interval_ms",
     .doc = "how often the sentinels are asked for the master (and at once on any event)",
     .type = CONF_DURATION,
     CONF_FIELD(sentinel_resolve_interval_ms),
     .min = 1,
     .max = CONF_DURATION_MAX},
    {.key = "sentinel.timeout_ms",
     .doc = "connect and reply timeout towards one sentinel",
     .type = CONF_DURATION,
     CONF_FIELD(sentinel_timeout_ms),
     .min = 1,
     .max = CONF_DURATION_MAX},
    {.key = "sentinel.tls",
     .doc = "connect to the sentinels over TLS",
     .type = CONF_SECTION,
     CONF_FLAG(sentinel_tls.enabled)},
    {.key = "sentinel.tls.ca_cert_file",
     .doc = "CA the sentinels' certificates must chain to",
     .type = CONF_STRING,
     CONF_FIELD(sentinel_tls.ca_cert_file),
     .flags = CONF_EMPTY_NULL},
    {.key = "sentinel.tls.cert_file",
     .doc = "client certificate ferry presents to the sentinels (with key_file)",
     .type = CONF_STRING,
     CONF_FIELD(sentinel_tls.cert_file),
     .flags = CONF_EMPTY_NULL},
    {.key = "sentinel.tls.key_file",
     .doc = "its private key",
     .type = CONF_STRING,
     CONF_FIELD(sentinel_tls.key_file),
     .flags = CONF_EMPTY_NULL},
    {.key = "sentinel.tls.server_name",
     .doc = "name sent as SNI and checked with verify: full (default: the sentinel's host)",
     .type = CONF_STRING,
     CONF_FIELD(sentinel_tls.server_name),
     .flags = CONF_EMPTY_NULL,
     .check = conf_check_word},
    {.key = "sentinel.tls.verify",
     .doc = "full (chain and host name), ca (chain only) or none",
     .type = CONF_ENUM,
     CONF_FIELD(sentinel_tls.verify),
     .parse_enum = tls_verify_parse,
     .enum_name = tls_verify_name,
     .what = "full, ca or none"},

    {.key = "cluster",
     .doc = "Redis Cluster mode: the seed nodes ferry learns the slot map from",
     .type = CONF_SECTION,
     CONF_FLAG(has_cluster)},
    {.key = "cluster.nodes",
     .doc = "seed nodes (host:port), any of the cluster's nodes",
     .type = CONF_ADDR_LIST,
     CONF_FIELD(cluster_nodes),
     CONF_COUNT(ncluster_nodes),
     .max = CONFIG_MAX_CLUSTER_SEEDS},
    {.key = "cluster.refresh_interval_ms",
     .doc = "how often ferry asks the nodes for the slot map (also at once on a failed node)",
     .type = CONF_DURATION,
     CONF_FIELD(cluster_refresh_interval_ms),
     .min = 1,
     .max = CONF_DURATION_MAX},
    {.key = "cluster.timeout_ms",
     .doc = "connect and reply timeout for the map's requests",
     .type = CONF_DURATION,
     CONF_FIELD(cluster_timeout_ms),
     .min = 1,
     .max = CONF_DURATION_MAX},

    {.key = "client", .doc = "what ferry accepts from applications", .type = CONF_SECTION},
    {.key = "client.auth",
     .doc = "who checks a client's AUTH: ferry (client.password) or redis (Redis' ACL users)",
     .type = CONF_ENUM,
     CONF_FIELD(client_auth),
     .parse_enum = client_auth_parse,
     .enum_name = client_auth_name,
     .what = "ferry or redis"},
    {.key = "client.password",
     .doc = "password clients must send with AUTH; empty: no AUTH needed",
     .type = CONF_STRING,
     CONF_FIELD(client_password),
     .flags = CONF_EMPTY_NULL},
    {.key = "client.max_clients",
     .doc = "most client connections at once; more are refused",
     .type = CONF_INT,
     CONF_FIELD(max_clients),
     .min = 1,
     .max = INT_MAX},
    {.key = "client.max_query_bytes",
     .doc = "largest single request (all arguments together)",
     .type = CONF_SIZE,
     CONF_FIELD(max_query_bytes),
     .min = 1,
     .max = CONF_SIZE_MAX},
    {.key = "client.max_pending_bytes",
     .doc = "memory held for one client before ferry stops reading it (resumes at half)",
     .type = CONF_SIZE,
     CONF_FIELD(max_pending_bytes),
     .min = 1,
     .max = CONF_SIZE_MAX},
    {.key = "client.max_bulk_len",
     .doc = "largest single bulk string argument",
     .type = CONF_SIZE,
     CONF_FIELD(max_bulk_len),
     .min = 1,
     .max = CONF_SIZE_MAX},
    {.key = "client.max_args",
     .doc = "most arguments in one request",
     .type = CONF_UINT,
     CONF_FIELD(max_args),
     .min = 1,
     .max = INT_MAX},
    {.key = "client.max_inline_len",
     .doc = "longest inline (non-RESP) request line",
     .type = CONF_SIZE,
     CONF_FIELD(max_inline_len),
     .min = 1,
     .max = CONF_SIZE_MAX},
    {.key = "client.idle_timeout_ms",
     .doc = "close clients idle this long (never blocked or subscribed ones); 0: never",
     .type = CONF_DURATION,
     CONF_FIELD(idle_timeout_ms),
     .min = 0,
     .max = CONF_DURATION_MAX},
    {.key = "client.max_pipeline",
     .doc = "requests in flight per client before ferry stops reading it (resumes at half)",
     .type = CONF_UINT,
     CONF_FIELD(max_pipeline),
     .min = 1,
     .max = INT_MAX},
    {.key = "client.request_timeout_ms",
     .doc = "a request must arrive whole within this long of its first byte; 0: no bound",
     .type = CONF_DURATION,
     CONF_FIELD(request_timeout_ms),
     .min = 0,
     .max = CONF_DURATION_MAX},
    {.key = "client.output_limit",
     .doc = "Redis' client-output-buffer-limit for normal clients",
     .type = CONF_SECTION},
    {.key = "client.output_limit.hard",
     .doc = "queued reply bytes at which a client is closed; 0: none",
     .type = CONF_SIZE,
     CONF_FIELD(output_limit.hard),
     .min = 0,
     .max = CONF_SIZE_MAX},
    {.key = "client.output_limit.soft",
     .doc = "queued reply bytes a client may stay above for soft_seconds; 0: none",
     .type = CONF_SIZE,
     CONF_FIELD(output_limit.soft),
     .min = 0,
     .max = CONF_SIZE_MAX},
    {.key = "client.output_limit.soft_seconds",
     .doc = "how long output may stay above soft",
     .type = CONF_UINT,
     CONF_FIELD(output_limit.soft_seconds),
     .min = 0,
     .max = CONF_DURATION_MAX / 1000},
    {.key = "client.pubsub_output_limit",
     .doc = "the same for subscribed clients",
     .type = CONF_SECTION},
    {.key = "client.pubsub_output_limit.hard",
     .doc = "queued bytes at which a subscriber is closed; 0: none",
     .type = CONF_SIZE,
     CONF_FIELD(pubsub_output_limit.hard),
     .min = 0,
     .max = CONF_SIZE_MAX},
    {.key = "client.pubsub_output_limit.soft",
     .doc = "queued bytes a subscriber may stay above for soft_seconds; 0: none",
     .type = CONF_SIZE,
     CONF_FIELD(pubsub_output_limit.soft),
     .min = 0,
     .max = CONF_SIZE_MAX},
    {.key = "client.pubsub_output_limit.soft_seconds",
     .doc = "how long a subscriber's output may stay above soft",
     .type = CONF_UINT,
     CONF_FIELD(pubsub_output_limit.soft_seconds),
     .min = 0,
     .max = CONF_DURATION_MAX / 1000},

    {.key = "limits", .doc = "ferry as a whole", .type = CONF_SECTION},
    {.key = "limits.max_memory",
     .doc = "bytes held for all clients together before new requests get -OOM; 0: no limit",
     .type = CONF_SIZE,
     CONF_FIELD(max_memory),
     .min = 0,
     .max = CONF_SIZE_MAX},
    {.key = "scripts",
     .doc = "the Lua scripts ferry remembers to load on a server that lacks them",
     .type = CONF_SECTION},
    {.key = "scripts.remember_max_bytes",
     .doc = "bytes of script bodies (SCRIPT LOAD, EVAL) ferry remembers, least recently used "
            "dropped past it, to load them on a new or flushed master ahead of an EVALSHA; "
            "0: none",
     .type = CONF_SIZE,
     CONF_FIELD(scripts_remember_max_bytes),
     .min = 0,
     .max = CONF_SIZE_MAX},

    {.key = "upstream", .doc = "links from ferry to the master", .type = CONF_SECTION},
    {.key = "upstream.shared_links",
     .doc = "pipelined links shared by all clients for ordinary commands",
     .type = CONF_INT,
     CONF_FIELD(shared_links),
     .min = 1,
     .max = 64},
    {.key = "upstream.pool_idle",
     .doc = "idle dedicated links kept open for reuse",
     .type = CONF_INT,
     CONF_FIELD(pool_idle),
     .min = 0,
     .max = 65535},
    {.key = "upstream.connect_timeout_ms",
     .doc = "give up connecting to the master after this long",
     .type = CONF_DURATION,
     CONF_FIELD(connect_timeout_ms),
     .min = 1,
     .max = CONF_DURATION_MAX},
    {.key = "upstream.ping_interval_ms",
     .doc = "PING idle links (and the health probe) this often; 0: off",
     .type = CONF_DURATION,
     CONF_FIELD(ping_interval_ms),
     .min = 0,
     .max = CONF_DURATION_MAX},
    {.key = "upstream.hold_timeout_ms",
     .doc = "how long requests are held without a usable master before -TRYAGAIN",
     .type = CONF_DURATION,
     CONF_FIELD(hold_timeout_ms),
     .min = 1,
     .max = CONF_DURATION_MAX},
    {.key = "upstream.fence_timeout_ms",
     .doc = "how long the WAIT fencing requests in flight on an old master may take",
     .type = CONF_DURATION,
     CONF_FIELD(fence_timeout_ms),
     .min = 1,
     .max = CONF_DURATION_MAX},
    {.key = "upstream.drain_ms",
     .doc = "a blocked pop on the old master stays open this long at a switch",
     .type = CONF_DURATION,
     CONF_FIELD(drain_ms),
     .min = 0,
     .max = CONF_DURATION_MAX},
    {.key = "upstream.health_timeout_ms",
     .doc = "a master whose probe PING goes unanswered this long is given up; 0: no probe",
     .type = CONF_DURATION,
     CONF_FIELD(health_timeout_ms),
     .min = 0,
     .max = CONF_DURATION_MAX},
    {.key = "upstream.hold_max_bytes",
     .doc = "most request bytes held at once without a master",
     .type = CONF_SIZE,
     CONF_FIELD(hold_max_bytes),
     .min = 0,
     .max = CONF_SIZE_MAX},

    {.key = "deny",
     .doc = "commands refused (\"config rewrite\" denies one subcommand); [] denies none",
     .type = CONF_STR_LIST,
     CONF_FIELD(deny),
     CONF_COUNT(ndeny),
     .max = CONFIG_MAX_DENY,
     .check = conf_check_command},

    {.key = "stats", .doc = "the stats port", .type = CONF_SECTION},
    {.key = "stats.listen",
     .doc = "JSON, /metrics, /healthz and the live page; \"\" or off disables it",
     .type = CONF_ADDR,
     CONF_FIELD(stats_listen),
     CONF_FLAG(stats_enabled),
     .flags = CONF_OFF},

    {.key = "log", .doc = "logging", .type = CONF_SECTION},
    {.key = "log.level",
     .doc = "the least severe level written",
     .type = CONF_ENUM,
     CONF_FIELD(log_level),
     .parse_enum = log_level_parse,
     .enum_name = log_level_name,
     .what = "debug, info, warn or error"},
    {.key = "log.file",
     .doc = "log file, reopened on SIGHUP; empty: stderr",
     .type = CONF_STRING,
     CONF_FIELD(log_file),
     .flags = CONF_EMPTY_NULL},

    {.key = "fallback",
     .doc = "the fallback store: queue writes while no Redis master is usable",
     .type = CONF_SECTION},
    {.key = "fallback.path",
     .doc = "the store's SQLite file; empty: no store",
     .type = CONF_STRING,
     CONF_FIELD(fallback_path),
     .flags = CONF_EMPTY_NULL},
    {.key = "fallback.after_ms",
     .doc = "without a usable master this long, the view goes DOWN and the store takes writes",
     .type = CONF_DURATION,
     CONF_FIELD(fallback_after_ms),
     .min = 0,
     .max = CONF_DURATION_MAX},
    {.key = "fallback.keys",
     .doc = "globs of the keys the store takes; empty: every key",
     .type = CONF_STR_LIST,
     CONF_FIELD(fallback_keys),
     CONF_COUNT(nfallback_keys),
     .max = CONFIG_MAX_DENY},
    {.key = "fallback.commands",
     .doc = "commands the store serves; empty: LPUSH, RPUSH, ZADD and the pops",
     .type = CONF_STR_LIST,
     CONF_FIELD(fallback_commands),
     CONF_COUNT(nfallback_commands),
     .max = CONFIG_MAX_DENY},
    {.key = "fallback.serve_pops",
     .doc = "serve pops from the store on keys with rows there",
     .type = CONF_BOOL,
     CONF_FIELD(fallback_serve_pops)},
    {.key = "fallback.max_bytes",
     .doc = "bound on the store's size, past which writes get an error; 0: the disk only",
     .type = CONF_SIZE,
     CONF_FIELD(fallback_max_bytes),
     .min = 0,
     .max = CONF_SIZE_MAX},

    {.key = "queue_depths",
     .doc = "how the lengths of the queues: keys are sampled",
     .type = CONF_SECTION},
    {.key = "queue_depths.interval_ms",
     .doc = "one sampling round this often while a master is UP",
     .type = CONF_DURATION,
     CONF_FIELD(queue_depths_interval_ms),
     .min = 10,
     .max = CONF_DURATION_MAX},
    {.key = "queue_depths.keys_per_round",
     .doc = "keys a round asks SCAN for and measures",
     .type = CONF_UINT,
     CONF_FIELD(queue_depths_keys_per_round),
     .min = 1,
     .max = 100000},
    {.key = "queue_depths.max_keys",
     .doc = "keys whose length ferry keeps and shows",
     .type = CONF_UINT,
     CONF_FIELD(queue_depths_max_keys),
     .min = 1,
     .max = 1000000},

    {.key = "shutdown_timeout_ms",
     .doc = "on SIGTERM, or in a takeover, how long clients may take before they are closed",
     .type = CONF_DURATION,
     CONF_FIELD(shutdown_timeout_ms),
     .min = 1,
     .max = CONF_DURATION_MAX},

    {.key = "instance",
     .doc = "this ferry's identity: its receipts outlive the process under it, and a peer or "
            "the same instance started again puts their items back (docs/failover.md)",
     .type = CONF_SECTION},
    {.key = "instance.name",
     .doc = "the instance's name (letters, digits, '.', '_', '-'), the same across its restarts "
            "and distinct from every other ferry in front of the same Redis; empty: derived from "
            "the host name and the first listen address",
     .type = CONF_STRING,
     CONF_FIELD(instance_name),
     .flags = CONF_EMPTY_NULL,
     .check = conf_check_instance},
    {.key = "instance.heartbeat_ttl_ms",
     .doc = "the TTL of ferry:alive:<name>, refreshed on the master while ferry runs: once it "
            "expired, a live ferry claims the instance's receipts and puts their items back",
     .type = CONF_DURATION,
     CONF_FIELD(instance_heartbeat_ttl_ms),
     .min = 500,
     .max = 600000},

    {.key = "takeover",
     .doc = "restarting ferry without its clients noticing",
     .type = CONF_SECTION},
    {.key = "takeover.socket",
     .doc = "unix socket a new ferry takes this one over through; empty: off",
     .type = CONF_STRING,
     CONF_FIELD(takeover_socket),
     .flags = CONF_EMPTY_NULL,
     .check = conf_check_sockpath},

    {.key = "durability",
     .doc = "checks on the master's persistence and replication",
     .type = CONF_SECTION},
    {.key = "durability.require_aof",
     .doc = "refuse writes unless the master runs with appendonly yes",
     .type = CONF_BOOL,
     CONF_FIELD(require_aof)},
    {.key = "durability.replicas_ack",
     .doc = "replicas that must confirm a write (WAIT) before it is acknowledged; unset: 1 with "
            "Sentinel, 0 with a fixed master",
     .type = CONF_INT,
     CONF_FIELD(replicas_ack),
     .min = 0,
     .max = 16},
    {.key = "durability.replicas_ack_timeout_ms",
     .doc = "how long one WAIT may block",
     .type = CONF_DURATION,
     CONF_FIELD(replicas_ack_timeout_ms),
     .min = 1,
     .max = CONF_DURATION_MAX},
    {.key = "durability.replicas_ack_hold_ms",
     .doc = "how long an acknowledgement waits for the replicas to confirm it (WAIT asked again) "
            "before it is answered -NOREPLICAS, and how long a master back from a switch may "
            "refuse writes with NOREPLICAS (held) before that is its own answer, and how long the "
            "fallback store's replay keeps rows for a replica that confirms none; keep it above "
            "the ~10 s Sentinel takes to make a demoted master a replica",
     .type = CONF_DURATION,
     CONF_FIELD(replicas_ack_hold_ms),
     .min = 1,
     .max = CONF_DURATION_MAX},
    {.key = "durability.replicas_ack_data_hold_ms",
     .doc = "how long a reply that carries data taken out of Redis and has no receipt to undo it "
            "(a pop of several keys, a move, a blocking sorted-set pop, a script's reply) "
            "waits for the replicas to confirm it before it is delivered unconfirmed "
            "(replies_unconfirmed): a client that gives up on a held reply loses its data; keep "
            "it below the clients' read timeouts (Jedis 2 s, Sidekiq 1 s)",
     .type = CONF_DURATION,
     CONF_FIELD(replicas_ack_data_hold_ms),
     .min = 1,
     .max = CONF_DURATION_MAX},
    {.key = "durability.offset_brackets",
     .doc = "with replicas_ack: a ROLE beside each WAIT gives every write the master's replication "
            "offsets around it, so after a failover ferry decides whether the new master has it "
            "(no duplicate) and keeps acknowledged pushes for a promoted replica that lacks them; "
            "no: unknown outcomes are sent again (at-least-once) and nothing is kept",
     .type = CONF_BOOL,
     CONF_FIELD(offset_brackets)},
    {.key = "durability.pop_receipts",
     .doc = "with replicas_ack: a pop (RPOP, LPOP, BRPOP, BLPOP, with a count, ZPOPMIN, ZPOPMAX) "
            "of a key fallback.keys names is sent as a move into a receipt key of its own, deleted "
            "once the reply is written; the pop sent again after a failover that lost its reply is "
            "answered from the receipt if the new master has it: the item is neither lost nor "
            "taken twice. BRPOP, BLPOP of several such keys (a priority pop), BZPOPMIN, BZPOPMAX "
            "are tried that way first, and block as written when every key is empty",
     .type = CONF_BOOL,
     CONF_FIELD(pop_receipts)},
    {.key = "durability.push_receipts",
     .doc = "with replicas_ack: a push (LPUSH, RPUSH, LPUSHX, RPUSHX, XADD) to a key fallback.keys "
            "names is sent as a script that also keeps its reply under a receipt key of its own, "
            "deleted once the reply is in; the push sent again after a failover that lost its "
            "reply is answered from the receipt if the new master has it: never pushed twice. A "
            "transaction with such a push (RQ's enqueue) goes at EXEC as one script the same way "
            "(docs/failover.md)",
     .type = CONF_BOOL,
     CONF_FIELD(push_receipts)},
    {.key = "durability.script_receipts",
     .doc = "with replicas_ack: a script (EVAL, EVALSHA of a body ferry knows) that may write and "
            "names a key fallback.keys names runs inside a wrapper that keeps its reply under a "
            "receipt key of its own in the same step, deleted once the reply is written; sent "
            "again after a failover that lost its reply, it answers the first run's reply if the "
            "new master has it: a script that pops (N4's delayed queue) or pushes runs once",
     .type = CONF_BOOL,
     CONF_FIELD(script_receipts)},
    {.key = "durability.redo_max_bytes",
     .doc = "with replicas_ack: the most bytes of acknowledged queue pushes (LPUSH, RPUSH, ZADD, "
            "XADD, and transactions that go with their receipt) kept until every replica Sentinel "
            "lists is online past them, so they are sent again to a promoted replica that lacks "
            "them; past it the oldest are dropped (counted "
            "redo_dropped_unprotected); 0 keeps none",
     .type = CONF_SIZE,
     CONF_FIELD(redo_max_bytes),
     .min = 0,
     .max = CONF_SIZE_MAX},
    {.key = "durability.enforce_interval_ms",
     .doc = "how often the durability settings are asserted again on every node",
     .type = CONF_DURATION,
     CONF_FIELD(enforce_interval_ms),
     .min = 1,
     .max = CONF_DURATION_MAX},
    {.key = "durability.config_command",
     .doc = "the master's name for CONFIG, if renamed",
     .type = CONF_STRING,
     CONF_FIELD(config_command),
     .check = conf_check_word},
    {.key = "durability.persist_config",
     .doc = "also write the settings to each node's config file (CONFIG REWRITE)",
     .type = CONF_BOOL,
     CONF_FIELD(persist_config)},
};

#define CONF_NKEYS (sizeof(conf_table) / sizeof(conf_table[0]))
const size_t conf_table_len = CONF_NKEYS;
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
const char *conf_check_word(char *value)
{
    for (const char *c = value; *c != '\0'; c++) {
        if ((unsigned char)*c <= 0x20 || *c == 0x7f) {
            return "must be a single word";
        }
    }
    return NULL;
}

/* An instance name: it is part of Redis key names and a SCAN pattern. */
static const char *conf_check_instance(char *value)
{
    for (const char *c = value; *c != '\0'; c++) {
        if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') ||
              *c == '.' || *c == '_' || *c == '-')) {
            return "may hold only letters, digits, '.', '_' and '-'";
        }
    }
    return strlen(value) > 64 ? "must be at most 64 characters" : NULL;
}

/* A unix socket path: "" (off) or one that fits sockaddr_un. */
const char *conf_check_sockpath(char *value)
{
    return strlen(value) >= sizeof(((config_addr *)0)->path) ? "unix socket path too long" : NULL;
}

/* Rules that involve more than one key. */
int conf_semantic(conf_ctx *ctx, config *cfg)
{
    char buf[300];

    int nsources = cfg->has_redis + cfg->has_sentinel + cfg->has_cluster;
    if (nsources > 1) {
        return conf_key_error(ctx, cfg->has_cluster ? "cluster" : "sentinel", 0,
                              "redis.address, sentinel and cluster are mutually exclusive: "
                              "set exactly one");
    }
    if (nsources == 0) {
        return conf_key_error(ctx, "redis", 0,
                              "one of redis.address, sentinel or cluster must be set");
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
    if (cfg->has_cluster) {
        if (cfg->ncluster_nodes == 0) {
            return conf_key_error(ctx,
                                  conf_present(ctx, "cluster.nodes") ? "cluster.nodes" : "cluster",
                                  0, "cluster.nodes must list at least one node of the cluster");
        }
        for (int i = 0; i < cfg->ncluster_nodes; i++) {
            if (cfg->cluster_nodes[i].is_unix) {
                return conf_key_error(ctx, "cluster.nodes", 1,
                                      "cluster.nodes: a cluster node is a host:port, "
                                      "not a unix socket");
            }
        }
        /* Leases: a queue's processing list and dead letter must be in the
         * queue key's slot; with nothing but '}' before {key}, a queue key's
         * hash tag is theirs too (docs/cluster.md "Leases"). */
        for (int i = 0; i < cfg->nqueues; i++) {
            const char *tpl[2] = {cfg->queues[i].processing, cfg->queues[i].dead_letter};
            const char *name[2] = {"processing", "dead_letter"};
            for (int t = 0; t < 2 && cfg->queues[i].processing != NULL; t++) {
                const char *at = tpl[t] != NULL ? strstr(tpl[t], "{key}") : NULL;
                if (at != NULL && memchr(tpl[t], '{', (size_t)(at - tpl[t])) != NULL) {
                    return conf_key_error(ctx, "queues", 1,
                                          "queues[%d].%s: with cluster, no '{' may come before "
                                          "{key} (the list must share the queue key's hash tag, "
                                          "so its slot)",
                                          i, name[t]);
                }
            }
        }
    }
    if (cfg->nlisten == 0 && cfg->nlisten_tls == 0) {
        return conf_key_error(ctx, "listen", 0,
                              "with no listen_tls, listen must have at least one address");
    }
    if (cfg->nlisten_tls > 0 && (cfg->tls_cert_file == NULL || cfg->tls_key_file == NULL)) {
        return conf_key_error(ctx, conf_present(ctx, "tls") ? "tls" : "listen_tls", 0,
                              "listen_tls needs tls.cert_file and tls.key_file");
    }
    if (cfg->nlisten_tls > 0 && cfg->tls_auth_clients != TLS_AUTH_NO &&
        cfg->tls_ca_cert_file == NULL) {
        return conf_key_error(ctx, "tls.auth_clients", 1,
                              "tls.auth_clients %s needs tls.ca_cert_file (the clients' CA); "
                              "set auth_clients: no to accept clients without certificates",
                              cfg->tls_auth_clients == TLS_AUTH_YES ? "yes" : "optional");
    }
    for (int i = 0; i < cfg->nlisten_tls; i++) {
        for (int j = 0; j < cfg->nlisten; j++) {
            if (conf_addr_equal(&cfg->listen_tls[i], &cfg->listen[j])) {
                return conf_key_error(ctx, "listen_tls", 1,
                                      "listen_tls: %s is also a listen address",
                                      config_addr_str(&cfg->listen_tls[i], buf, sizeof(buf)));
            }
        }
    }
    const config_tls_peer *peers[2] = {&cfg->redis_tls, &cfg->sentinel_tls};
    static const char *const pkeys[2] = {"redis.tls", "sentinel.tls"};
    for (int i = 0; i < 2; i++) {
        if ((peers[i]->cert_file == NULL) != (peers[i]->key_file == NULL)) {
            return conf_key_error(ctx, pkeys[i], 0, "%s: cert_file and key_file go together",
                                  pkeys[i]);
        }
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
    cfg->cluster_refresh_interval_ms = 1000;
    cfg->cluster_timeout_ms = 1000;
    cfg->tls_auth_clients = TLS_AUTH_YES;
    cfg->tls_protocols = strdup("TLSv1.2 TLSv1.3");
    cfg->tls_handshake_timeout_ms = 5000;
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
    cfg->scripts_remember_max_bytes = (size_t)8 << 20;
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
    cfg->instance_heartbeat_ttl_ms = 5000;
    cfg->queue_depths_interval_ms = 1000;
    cfg->queue_depths_keys_per_round = 100;
    cfg->queue_depths_max_keys = 1000;
    cfg->require_aof = 0;
    cfg->replicas_ack = -1; /* auto: 1 with Sentinel, 0 with a fixed master */
    cfg->replicas_ack_timeout_ms = 1000;
    cfg->replicas_ack_hold_ms = 30000;
    cfg->replicas_ack_data_hold_ms = 500;
    cfg->offset_brackets = 1;
    cfg->pop_receipts = 1;
    cfg->push_receipts = 1;
    cfg->script_receipts = 1;
    cfg->redo_max_bytes = (size_t)64 << 20;
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
    char **tls_strings[] = {&cfg->tls_cert_file,
                            &cfg->tls_key_file,
                            &cfg->tls_ca_cert_file,
                            &cfg->tls_protocols,
                            &cfg->tls_ciphers,
                            &cfg->tls_ciphersuites,
                            &cfg->redis_tls.ca_cert_file,
                            &cfg->redis_tls.cert_file,
                            &cfg->redis_tls.key_file,
                            &cfg->redis_tls.server_name,
                            &cfg->sentinel_tls.ca_cert_file,
                            &cfg->sentinel_tls.cert_file,
                            &cfg->sentinel_tls.key_file,
                            &cfg->sentinel_tls.server_name};
    for (size_t i = 0; i < sizeof(tls_strings) / sizeof(tls_strings[0]); i++) {
        free(*tls_strings[i]);
        *tls_strings[i] = NULL;
    }
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
    free(cfg->instance_name);
    cfg->instance_name = NULL;
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

int config_fallback_command(const config *cfg, const char *name)
{
    if (cfg->nfallback_commands == 0) {
        return 1;
    }
    for (int i = 0; i < cfg->nfallback_commands; i++) {
        if (strcasecmp(cfg->fallback_commands[i], name) == 0) {
            return 1;
        }
    }
    return 0;
}

int config_fallback_key(const config *cfg, const char *key, size_t len)
{
    if (cfg->nfallback_keys == 0) {
        return 1;
    }
    for (int i = 0; i < cfg->nfallback_keys; i++) {
        if (glob_match(cfg->fallback_keys[i], strlen(cfg->fallback_keys[i]), key, len)) {
            return 1;
        }
    }
    return 0;
}
