/* test_config.c - unit tests for config/config.c: loading every key, defaults,
 * size and address parsing, the deny list, and each kind of error with its
 * exact "file:line:column:" position. */

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <uv.h>

#include "config.h"
#include "log.h"

#define MB ((size_t)1 << 20)

/* One error case: input, expected "name:line:col: " prefix, and a part of the
 * message that must follow. */
typedef struct error_case {
    const char *yaml;     /* the document */
    const char *prefix;   /* exact start of the message */
    const char *contains; /* substring of the message */
} error_case;

/* Loads yaml (named "t.yml") and asserts success, printing the error if not. */
static void load_ok(config *cfg, const char *yaml)
{
    char err[512] = "";
    int rc = config_load_string(cfg, "t.yml", yaml, err, sizeof(err));

    if (rc != 0) {
        print_error("unexpected error: %s\n--- input ---\n%s\n", err, yaml);
    }
    assert_int_equal(rc, 0);
}

/* Loads yaml and asserts it fails with the given prefix and substring. */
static void load_fails(const error_case *c)
{
    config cfg;
    char err[512] = "";
    int rc = config_load_string(&cfg, "t.yml", c->yaml, err, sizeof(err));

    if (rc == 0) {
        print_error("expected an error for:\n%s\n", c->yaml);
        config_free(&cfg);
        fail();
    }
    if (strncmp(err, c->prefix, strlen(c->prefix)) != 0 || strstr(err, c->contains) == NULL) {
        print_error("input:\n%s\nexpected: %s...%s\ngot:      %s\n", c->yaml, c->prefix,
                    c->contains, err);
        fail();
    }
    /* On error cfg is left freed. */
    assert_null(cfg.file);
    assert_null(cfg.config_command);
    assert_int_equal(cfg.ndeny, 0);
    config_free(&cfg);
}

static void run_error_cases(const error_case *cases, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        load_fails(&cases[i]);
    }
}

static void assert_addr(const config_addr *a, const char *text)
{
    char buf[300];

    assert_string_equal(config_addr_str(a, buf, sizeof(buf)), text);
}

static void test_defaults(void **state)
{
    config cfg;

    (void)state;
    config_defaults(&cfg);
    assert_null(cfg.file);
    assert_int_equal(cfg.nlisten, 1);
    assert_addr(&cfg.listen[0], "127.0.0.1:6380");
    assert_int_equal(cfg.has_redis, 0);
    assert_int_equal(cfg.has_sentinel, 0);
    assert_null(cfg.redis_username);
    assert_null(cfg.redis_password);
    assert_null(cfg.sentinel_master);
    assert_int_equal(cfg.nsentinels, 0);
    assert_int_equal(cfg.sentinel_resolve_interval_ms, 1000);
    assert_int_equal(cfg.sentinel_timeout_ms, 1000);
    assert_null(cfg.client_password);
    assert_int_equal(cfg.max_clients, 10000);
    assert_int_equal(cfg.max_query_bytes, 1024 * MB);
    assert_int_equal(cfg.max_pending_bytes, 64 * MB);
    assert_int_equal(cfg.max_bulk_len, 512 * MB);
    assert_int_equal(cfg.max_args, 1048576);
    assert_int_equal(cfg.max_inline_len, 64 * 1024);
    assert_int_equal(cfg.idle_timeout_ms, 0);
    assert_int_equal(cfg.max_pipeline, 10000);
    assert_int_equal(cfg.request_timeout_ms, 0);
    /* Redis' client-output-buffer-limit defaults: normal 0 0 0, pubsub 32mb 8mb 60 */
    assert_int_equal(cfg.output_limit.hard, 0);
    assert_int_equal(cfg.output_limit.soft, 0);
    assert_int_equal(cfg.output_limit.soft_seconds, 0);
    assert_int_equal(cfg.pubsub_output_limit.hard, 32 * MB);
    assert_int_equal(cfg.pubsub_output_limit.soft, 8 * MB);
    assert_int_equal(cfg.pubsub_output_limit.soft_seconds, 60);
    assert_int_equal(cfg.max_memory, 0);
    assert_int_equal(cfg.shared_links, 1);
    assert_int_equal(cfg.pool_idle, 16);
    assert_int_equal(cfg.connect_timeout_ms, 2000);
    assert_int_equal(cfg.ping_interval_ms, 1000);
    assert_int_equal(cfg.hold_timeout_ms, 10000);
    assert_int_equal(cfg.hold_max_bytes, 64 * MB);
    assert_int_equal(cfg.ndeny, 6);
    assert_string_equal(cfg.deny[0], "shutdown");
    assert_string_equal(cfg.deny[1], "replicaof");
    assert_string_equal(cfg.deny[2], "slaveof");
    assert_string_equal(cfg.deny[3], "failover");
    assert_string_equal(cfg.deny[4], "debug");
    assert_string_equal(cfg.deny[5], "config rewrite");
    assert_int_equal(cfg.stats_enabled, 1);
    assert_addr(&cfg.stats_listen, "127.0.0.1:22222");
    assert_int_equal(cfg.log_level, LOG_INFO);
    assert_null(cfg.log_file);
    assert_null(cfg.fallback_path);
    assert_int_equal(cfg.shutdown_timeout_ms, 5000);
    assert_int_equal(cfg.require_aof, 0);
    assert_int_equal(cfg.replicas_ack, -1); /* auto */
    assert_int_equal(cfg.replicas_ack_timeout_ms, 1000);
    assert_int_equal(cfg.replicas_ack_hold_ms, 30000);
    assert_int_equal(cfg.enforce_interval_ms, 5000);
    assert_string_equal(cfg.config_command, "CONFIG");
    assert_int_equal(cfg.persist_config, 0);
    config_free(&cfg);
}

/* Only redis.address given: everything else keeps its default. */
static void test_minimal(void **state)
{
    config cfg;

    (void)state;
    load_ok(&cfg, "redis:\n  address: localhost:6379\n");
    assert_string_equal(cfg.file, "t.yml");
    assert_int_equal(cfg.has_redis, 1);
    assert_int_equal(cfg.has_sentinel, 0);
    assert_addr(&cfg.redis_addr, "localhost:6379");
    assert_int_equal(cfg.nlisten, 1);
    assert_addr(&cfg.listen[0], "127.0.0.1:6380");
    assert_int_equal(cfg.max_clients, 10000);
    assert_int_equal(cfg.ndeny, 6);
    assert_int_equal(cfg.stats_enabled, 1);
    assert_string_equal(cfg.config_command, "CONFIG");
    config_free(&cfg);
}

static void test_full_round_trip(void **state)
{
    config cfg;

    (void)state;
    load_ok(&cfg, "listen:\n"
                  "  - 0.0.0.0:7000\n"
                  "  - \"[::1]:7001\"\n"
                  "  - unix:/run/ferry/ferry.sock\n"
                  "redis:\n"
                  "  address: \"[2001:db8::5]:6390\"\n"
                  "  username: app\n"
                  "  password: s3cret\n"
                  "client:\n"
                  "  password: letmein\n"
                  "  max_clients: 123\n"
                  "  max_query_bytes: 2mb\n"
                  "  max_pending_bytes: 3KB\n"
                  "  max_bulk_len: 1gb\n"
                  "  max_args: 77\n"
                  "  max_inline_len: 4096\n"
                  "  idle_timeout_ms: 30000\n"
                  "  max_pipeline: 500\n"
                  "  request_timeout_ms: 2500\n"
                  "  output_limit: {hard: 256mb, soft: 64mb, soft_seconds: 30}\n"
                  "  pubsub_output_limit:\n"
                  "    hard: 0\n"
                  "    soft: 1mb\n"
                  "    soft_seconds: 5\n"
                  "limits:\n"
                  "  max_memory: 2gb\n"
                  "upstream:\n"
                  "  shared_links: 4\n"
                  "  pool_idle: 0\n"
                  "  connect_timeout_ms: 250\n"
                  "  ping_interval_ms: 0\n"
                  "  hold_timeout_ms: 1500\n"
                  "  hold_max_bytes: 10 mb\n"
                  "deny: [FlushAll, \"client  KILL\"]\n"
                  "stats:\n"
                  "  listen: 10.1.2.3:9999\n"
                  "log:\n"
                  "  level: debug\n"
                  "  file: /var/log/ferry.log\n"
                  "fallback:\n"
                  "  path: /var/lib/ferry/fallback\n"
                  "durability:\n"
                  "  require_aof: yes\n"
                  "  replicas_ack: 2\n"
                  "  replicas_ack_timeout_ms: 300\n"
                  "  enforce_interval_ms: 60000\n"
                  "  config_command: MYCONFIG\n"
                  "  persist_config: true\n"
                  "shutdown_timeout_ms: 42\n");
    assert_int_equal(cfg.nlisten, 3);
    assert_addr(&cfg.listen[0], "0.0.0.0:7000");
    assert_addr(&cfg.listen[1], "[::1]:7001");
    assert_int_equal(cfg.listen[2].is_unix, 1);
    assert_string_equal(cfg.listen[2].path, "/run/ferry/ferry.sock");
    assert_int_equal(cfg.has_redis, 1);
    assert_string_equal(cfg.redis_addr.host, "2001:db8::5");
    assert_int_equal(cfg.redis_addr.port, 6390);
    assert_string_equal(cfg.redis_username, "app");
    assert_string_equal(cfg.redis_password, "s3cret");
    assert_int_equal(cfg.has_sentinel, 0);
    assert_string_equal(cfg.client_password, "letmein");
    assert_int_equal(cfg.max_clients, 123);
    assert_int_equal(cfg.max_query_bytes, 2 * MB);
    assert_int_equal(cfg.max_pending_bytes, 3 * 1024);
    assert_int_equal(cfg.max_bulk_len, 1024 * MB);
    assert_int_equal(cfg.max_args, 77);
    assert_int_equal(cfg.max_inline_len, 4096);
    assert_int_equal(cfg.idle_timeout_ms, 30000);
    assert_int_equal(cfg.max_pipeline, 500);
    assert_int_equal(cfg.request_timeout_ms, 2500);
    assert_int_equal(cfg.output_limit.hard, 256 * MB);
    assert_int_equal(cfg.output_limit.soft, 64 * MB);
    assert_int_equal(cfg.output_limit.soft_seconds, 30);
    assert_int_equal(cfg.pubsub_output_limit.hard, 0);
    assert_int_equal(cfg.pubsub_output_limit.soft, 1 * MB);
    assert_int_equal(cfg.pubsub_output_limit.soft_seconds, 5);
    assert_int_equal(cfg.max_memory, (size_t)2048 * MB);
    assert_int_equal(cfg.shared_links, 4);
    assert_int_equal(cfg.pool_idle, 0);
    assert_int_equal(cfg.connect_timeout_ms, 250);
    assert_int_equal(cfg.ping_interval_ms, 0);
    assert_int_equal(cfg.hold_timeout_ms, 1500);
    assert_int_equal(cfg.hold_max_bytes, 10 * MB);
    assert_int_equal(cfg.ndeny, 2);
    assert_string_equal(cfg.deny[0], "flushall");
    assert_string_equal(cfg.deny[1], "client kill");
    assert_int_equal(cfg.stats_enabled, 1);
    assert_addr(&cfg.stats_listen, "10.1.2.3:9999");
    assert_int_equal(cfg.log_level, LOG_DEBUG);
    assert_string_equal(cfg.log_file, "/var/log/ferry.log");
    assert_string_equal(cfg.fallback_path, "/var/lib/ferry/fallback");
    assert_int_equal(cfg.require_aof, 1);
    assert_int_equal(cfg.replicas_ack, 2);
    assert_int_equal(cfg.replicas_ack_timeout_ms, 300);
    assert_int_equal(cfg.enforce_interval_ms, 60000);
    assert_string_equal(cfg.config_command, "MYCONFIG");
    assert_int_equal(cfg.persist_config, 1);
    assert_int_equal(cfg.shutdown_timeout_ms, 42);
    config_free(&cfg);
    config_free(&cfg);
}

static void test_sentinel_mode(void **state)
{
    config cfg;

    (void)state;
    load_ok(&cfg, "listen: 127.0.0.1:6380\n"
                  "redis: {username: app, password: pw}\n"
                  "sentinel:\n"
                  "  master: mymaster\n"
                  "  addresses: [10.0.0.1:26379, \"sentinel-b.example:26380\"]\n"
                  "  username: sent\n"
                  "  password: sentpw\n"
                  "  resolve_interval_ms: 500\n"
                  "  timeout_ms: 250\n");
    assert_int_equal(cfg.has_redis, 0);
    assert_int_equal(cfg.has_sentinel, 1);
    assert_string_equal(cfg.sentinel_master, "mymaster");
    assert_int_equal(cfg.nsentinels, 2);
    assert_addr(&cfg.sentinels[0], "10.0.0.1:26379");
    assert_addr(&cfg.sentinels[1], "sentinel-b.example:26380");
    assert_string_equal(cfg.sentinel_username, "sent");
    assert_string_equal(cfg.sentinel_password, "sentpw");
    assert_string_equal(cfg.redis_username, "app");
    assert_string_equal(cfg.redis_password, "pw");
    assert_int_equal(cfg.sentinel_resolve_interval_ms, 500);
    assert_int_equal(cfg.sentinel_timeout_ms, 250);
    config_free(&cfg);

    /* A single sentinel may be given as a scalar. */
    load_ok(&cfg, "sentinel: {master: m, addresses: 10.0.0.9:26379}\n");
    assert_int_equal(cfg.nsentinels, 1);
    assert_addr(&cfg.sentinels[0], "10.0.0.9:26379");
    config_free(&cfg);
}

/* cluster: seed nodes, a refresh interval, a timeout; credentials from
 * redis.username / redis.password. */
static void test_cluster_mode(void **state)
{
    config cfg;

    (void)state;
    load_ok(&cfg, "redis: {username: app, password: pw}\n"
                  "cluster:\n"
                  "  nodes: [10.0.0.1:7000, \"node-b.example:7001\"]\n"
                  "  refresh_interval_ms: 250\n"
                  "  timeout_ms: 300\n");
    assert_int_equal(cfg.has_redis, 0);
    assert_int_equal(cfg.has_sentinel, 0);
    assert_int_equal(cfg.has_cluster, 1);
    assert_int_equal(cfg.ncluster_nodes, 2);
    assert_addr(&cfg.cluster_nodes[0], "10.0.0.1:7000");
    assert_addr(&cfg.cluster_nodes[1], "node-b.example:7001");
    assert_int_equal(cfg.cluster_refresh_interval_ms, 250);
    assert_int_equal(cfg.cluster_timeout_ms, 300);
    assert_string_equal(cfg.redis_password, "pw");
    config_free(&cfg);

    /* one seed as a scalar; the defaults */
    load_ok(&cfg, "cluster: {nodes: 10.0.0.9:7000}\n");
    assert_int_equal(cfg.ncluster_nodes, 1);
    assert_int_equal(cfg.cluster_refresh_interval_ms, 1000);
    assert_int_equal(cfg.cluster_timeout_ms, 1000);
    config_free(&cfg);
}

/* client.auth: ferry by default, redis when asked (then with no client.password). */
static void test_client_auth(void **state)
{
    config cfg;

    (void)state;
    load_ok(&cfg, "redis: {address: 127.0.0.1:6379}\n");
    assert_int_equal(cfg.client_auth, CLIENT_AUTH_FERRY);
    config_free(&cfg);
    load_ok(&cfg, "redis: {address: 127.0.0.1:6379}\nclient: {auth: redis, password: ''}\n");
    assert_int_equal(cfg.client_auth, CLIENT_AUTH_REDIS);
    assert_null(cfg.client_password);
    config_free(&cfg);
    load_ok(&cfg, "redis: {address: 127.0.0.1:6379}\nclient: {auth: ferry, password: pw}\n");
    assert_int_equal(cfg.client_auth, CLIENT_AUTH_FERRY);
    assert_string_equal(cfg.client_password, "pw");
    config_free(&cfg);
}

/* Empty strings and YAML nulls for optional strings mean "none". */
static void test_empty_strings_are_null(void **state)
{
    config cfg;

    (void)state;
    load_ok(&cfg, "redis: {address: 127.0.0.1:6379, username: '', password: \"\"}\n"
                  "client:\n"
                  "  password:\n"
                  "log: {file: ~}\n"
                  "fallback: {path: \"\"}\n"
                  "takeover: {socket: \"\"}\n");
    assert_null(cfg.takeover_socket);
    assert_null(cfg.redis_username);
    assert_null(cfg.redis_password);
    assert_null(cfg.client_password);
    assert_null(cfg.log_file);
    assert_null(cfg.fallback_path);
    config_free(&cfg);

    /* A quoted "null" is a real password. */
    load_ok(&cfg, "redis: {address: 127.0.0.1:6379, password: \"null\"}\n");
    assert_string_equal(cfg.redis_password, "null");
    config_free(&cfg);
}

static void test_takeover_socket(void **state)
{
    config cfg;
    char yaml[400];
    char path[200];
    error_case c = {yaml, "t.yml:2:20: takeover.socket: ", "unix socket path too long"};

    (void)state;
    load_ok(&cfg, "redis: {address: 127.0.0.1:6379}\n");
    assert_null(cfg.takeover_socket); /* off by default */
    config_free(&cfg);
    load_ok(&cfg, "redis: {address: 127.0.0.1:6379}\ntakeover: {socket: /run/ferry/t.sock}\n");
    assert_string_equal(cfg.takeover_socket, "/run/ferry/t.sock");
    config_free(&cfg);
    /* sockaddr_un holds 107 bytes and the NUL. */
    memset(path, 'a', 108);
    path[0] = '/';
    path[108] = '\0';
    snprintf(yaml, sizeof(yaml), "redis: {address: 127.0.0.1:6379}\ntakeover: {socket: %s}\n",
             path);
    load_fails(&c);
    path[107] = '\0';
    snprintf(yaml, sizeof(yaml), "redis: {address: 127.0.0.1:6379}\ntakeover: {socket: %s}\n",
             path);
    load_ok(&cfg, yaml);
    assert_string_equal(cfg.takeover_socket, path);
    config_free(&cfg);
}

static void test_workers(void **state)
{
    static const error_case cases[] = {
        {"redis: {address: 127.0.0.1:6379}\nworkers: 0\n", "t.yml:2:10: ",
         "workers: expected a number of event loops from 1 to 64, or auto, got '0'"},
        {"redis: {address: 127.0.0.1:6379}\nworkers: 65\n", "t.yml:2:10: ", "got '65'"},
        {"redis: {address: 127.0.0.1:6379}\nworkers: -2\n", "t.yml:2:10: ", "got '-2'"},
        {"redis: {address: 127.0.0.1:6379}\nworkers: many\n", "t.yml:2:10: ", "got 'many'"},
        {"redis: {address: 127.0.0.1:6379}\nworkers: 2x\n", "t.yml:2:10: ", "got '2x'"},
    };
    config cfg;
    unsigned cores = uv_available_parallelism();
    int want = cores > 1 ? (int)cores - 1 : 1;

    (void)state;
    load_ok(&cfg, "redis: {address: 127.0.0.1:6379}\n");
    assert_int_equal(cfg.workers, 1); /* one event loop by default */
    config_free(&cfg);
    load_ok(&cfg, "redis: {address: 127.0.0.1:6379}\nworkers: 4\n");
    assert_int_equal(cfg.workers, 4);
    config_free(&cfg);
    load_ok(&cfg, "redis: {address: 127.0.0.1:6379}\nworkers: 64\n");
    assert_int_equal(cfg.workers, 64);
    config_free(&cfg);
    load_ok(&cfg, "redis: {address: 127.0.0.1:6379}\nworkers: auto\n");
    assert_int_equal(cfg.workers, want > 8 ? 8 : want);
    config_free(&cfg);
    /* the fallback store runs with any number of loops */
    load_ok(&cfg, "redis: {address: 127.0.0.1:6379}\nworkers: auto\nfallback: {path: /tmp/f.db}\n");
    assert_int_equal(cfg.workers, want > 8 ? 8 : want);
    config_free(&cfg);
    load_ok(&cfg, "redis: {address: 127.0.0.1:6379}\nworkers: 4\nfallback: {path: /tmp/f.db}\n");
    assert_int_equal(cfg.workers, 4);
    config_free(&cfg);
    /* a takeover socket does not need one loop: auto stays auto, N stays N */
    load_ok(&cfg,
            "redis: {address: 127.0.0.1:6379}\nworkers: auto\ntakeover: {socket: /tmp/t.sock}\n");
    assert_int_equal(cfg.workers, want > 8 ? 8 : want);
    config_free(&cfg);
    load_ok(&cfg,
            "redis: {address: 127.0.0.1:6379}\nworkers: 3\ntakeover: {socket: /tmp/t.sock}\n");
    assert_int_equal(cfg.workers, 3);
    config_free(&cfg);
    load_ok(&cfg, "redis: {address: 127.0.0.1:6379}\nworkers: 1\nfallback: {path: /tmp/f.db}\n");
    assert_int_equal(cfg.workers, 1);
    config_free(&cfg);
    run_error_cases(cases, sizeof(cases) / sizeof(cases[0]));
}

static void test_queues(void **state)
{
    config cfg;
    (void)state;

    load_ok(&cfg, "redis: {address: 127.0.0.1:6379}\n");
    assert_int_equal(cfg.nqueues, 0);
    assert_int_equal(cfg.queue_depths_interval_ms, 1000);
    assert_int_equal(cfg.queue_depths_keys_per_round, 100);
    assert_int_equal(cfg.queue_depths_max_keys, 1000);
    config_free(&cfg);

    load_ok(&cfg, "redis: {address: 127.0.0.1:6379}\nqueues:\n  - keys: \"jobs:*\"\n"
                  "  - {keys: [\"a:*\", \"b:[0-9]\"]}\n"
                  "queue_depths: {interval_ms: 250, keys_per_round: 7, max_keys: 20}\n");
    assert_int_equal(cfg.nqueues, 2);
    assert_int_equal(cfg.queues[0].nkeys, 1);
    assert_string_equal(cfg.queues[0].keys[0], "jobs:*");
    assert_int_equal(cfg.queues[1].nkeys, 2);
    assert_string_equal(cfg.queues[1].keys[1], "b:[0-9]");
    assert_int_equal(cfg.queue_depths_interval_ms, 250);
    assert_int_equal(cfg.queue_depths_keys_per_round, 7);
    assert_int_equal(cfg.queue_depths_max_keys, 20);
    assert_int_equal(cfg.queues[0].max_length, 0);
    assert_int_equal(cfg.queues[0].on_full, ON_FULL_REFUSE);
    config_free(&cfg);

    load_ok(&cfg, "redis: {address: 127.0.0.1:6379}\nqueues:\n"
                  "  - {keys: \"jobs:*\", max_length: 10000}\n"
                  "  - {keys: \"b:*\", max_length: 4294967295, on_full: block}\n"
                  "  - {keys: \"c:*\", on_full: refuse, max_length: 1}\n");
    assert_int_equal(cfg.nqueues, 3);
    assert_int_equal(cfg.queues[0].max_length, 10000);
    assert_int_equal(cfg.queues[0].on_full, ON_FULL_REFUSE);
    assert_int_equal(cfg.queues[1].max_length, 4294967295ull);
    assert_int_equal(cfg.queues[1].on_full, ON_FULL_BLOCK);
    assert_int_equal(cfg.queues[2].max_length, 1);
    assert_int_equal(cfg.queues[2].on_full, ON_FULL_REFUSE);
    config_free(&cfg);

    load_ok(&cfg, "redis: {address: 127.0.0.1:6379}\nqueues:\n"
                  "  - {keys: \"jobs:*\", processing: \"{key}:processing\"}\n"
                  "  - {keys: \"b:*\", processing: \"p:{key}\", lease_ms: 250, max_attempts: 2,"
                  " dead_letter: \"{key}:dlq\"}\n");
    assert_string_equal(cfg.queues[0].processing, "{key}:processing");
    assert_string_equal(cfg.queues[0].dead_letter, "{key}:dead");
    assert_int_equal(cfg.queues[0].lease_ms, 60000);
    assert_int_equal(cfg.queues[0].max_attempts, 5);
    assert_string_equal(cfg.queues[1].processing, "p:{key}");
    assert_string_equal(cfg.queues[1].dead_letter, "{key}:dlq");
    assert_int_equal(cfg.queues[1].lease_ms, 250);
    assert_int_equal(cfg.queues[1].max_attempts, 2);
    assert_int_equal(cfg.queues[1].backoff_after, 0);
    config_free(&cfg);

    load_ok(&cfg, "redis: {address: 127.0.0.1:6379}\nqueues:\n"
                  "  - {keys: a, processing: \"{key}:p\", consumer_backoff: {pause_ms: 500}}\n"
                  "  - {keys: b, processing: \"{key}:p\","
                  " consumer_backoff: {after_failures: 3, pause_ms: 1500}}\n");
    assert_int_equal(cfg.queues[0].backoff_after, 100);
    assert_int_equal(cfg.queues[0].backoff_pause_ms, 500);
    assert_int_equal(cfg.queues[1].backoff_after, 3);
    assert_int_equal(cfg.queues[1].backoff_pause_ms, 1500);
    config_free(&cfg);

    static const error_case cases[] = {
        {"redis: {address: 127.0.0.1:6379}\nqueues:\n  - keys: \"j:*\"\n    leases: 5\n",
         "t.yml:4:5: ", "queues[0]: unknown key 'leases'"},
        {"redis: {address: 127.0.0.1:6379}\nqueues:\n  - keys: a\n  - {keys: b, x: 1}\n",
         "t.yml:4:15: ", "queues[1]: unknown key 'x'"},
        {"redis: {address: 127.0.0.1:6379}\nqueues: {keys: a}\n",
         "t.yml:2:9: ", "queues: expected a list of entries, got a mapping"},
        {"redis: {address: 127.0.0.1:6379}\nqueues: [a]\n",
         "t.yml:2:10: ", "queues[0]: expected a mapping"},
        {"redis: {address: 127.0.0.1:6379}\nqueues: [{}]\n",
         "t.yml:2:10: ", "queues[0]: keys: is required"},
        {"redis: {address: 127.0.0.1:6379}\nqueues: [{keys: []}]\n",
         "t.yml:2:17: ", "queues[0].keys: expected at least one glob"},
        {"redis: {address: 127.0.0.1:6379}\nqueues: [{keys: \"\"}]\n",
         "t.yml:2:17: ", "queues[0].keys: an empty glob"},
        {"redis: {address: 127.0.0.1:6379}\nqueues: [{keys: a, keys: b}]\n",
         "t.yml:2:20: ", "queues[0]: duplicate key 'keys'"},
        {"redis: {address: 127.0.0.1:6379}\nqueues: []\nqueues: []\n",
         "t.yml:3:1: ", "duplicate key 'queues'"},
        {"redis: {address: 127.0.0.1:6379}\nqueues: [{keys: a, max_length: 0}]\n",
         "t.yml:2:32: ", "queues[0].max_length: 0 is out of range (1 to 4294967295 items)"},
        {"redis: {address: 127.0.0.1:6379}\nqueues: [{keys: a, max_length: 4294967296}]\n",
         "t.yml:2:32: ", "queues[0].max_length: 4294967296 is out of range"},
        {"redis: {address: 127.0.0.1:6379}\nqueues: [{keys: a, max_length: -3}]\n",
         "t.yml:2:32: ", "queues[0].max_length: expected a number of items, got '-3'"},
        {"redis: {address: 127.0.0.1:6379}\nqueues: [{keys: a, max_length: 10k}]\n",
         "t.yml:2:32: ", "queues[0].max_length: expected a number of items, got '10k'"},
        {"redis: {address: 127.0.0.1:6379}\nqueues: [{keys: a, max_length: [1]}]\n",
         "t.yml:2:32: ", "queues[0].max_length: expected a number of items, got a list"},
        {"redis: {address: 127.0.0.1:6379}\nqueues: [{keys: a, max_length: 5, on_full: wait}]\n",
         "t.yml:2:44: ", "queues[0].on_full: expected refuse or block, got 'wait'"},
        {"redis: {address: 127.0.0.1:6379}\nqueues: [{keys: a, on_full: block}]\n",
         "t.yml:2:20: ", "queues[0]: on_full needs max_length"},
        {"redis: {address: 127.0.0.1:6379}\nqueues: [{keys: a, max_length: 1, max_length: 2}]\n",
         "t.yml:2:35: ", "queues[0]: duplicate key 'max_length'"},
        {"redis: {address: 127.0.0.1:6379}\nqueues: [{keys: a, processing: proc}]\n",
         "t.yml:2:32: ", "queues[0].processing: expected a key name with {key} once"},
        {"redis: {address: 127.0.0.1:6379}\nqueues: [{keys: a, processing: \"{key}{key}\"}]\n",
         "t.yml:2:32: ", "queues[0].processing: expected a key name with {key} once"},
        {"redis: {address: 127.0.0.1:6379}\nqueues: [{keys: a, processing: \"{key}\"}]\n",
         "t.yml:2:32: ", "queues[0].processing: expected a key name with {key} once"},
        {"redis: {address: 127.0.0.1:6379}\nqueues: [{keys: a, lease_ms: 1000}]\n", "t.yml:2:20: ",
         "queues[0]: lease_ms, max_attempts, dead_letter, consumer_backoff and "
         "lease_expire_on_disconnect need processing"},
        {"redis: {address: 127.0.0.1:6379}\nqueues: [{keys: a, processing: \"{key}:p\", "
         "lease_ms: 5}]\n",
         "t.yml:2:53: ", "queues[0].lease_ms: 5 is out of range (100 to 604800000)"},
        {"redis: {address: 127.0.0.1:6379}\nqueues: [{keys: a, processing: \"{key}:p\", "
         "max_attempts: 0}]\n",
         "t.yml:2:57: ", "queues[0].max_attempts: 0 is out of range (1 to 1000000)"},
        {"redis: {address: 127.0.0.1:6379}\nqueues: [{keys: a, processing: \"{key}:p\", "
         "consumer_backoff: 5}]\n",
         "t.yml:2:61: ", "queues[0].consumer_backoff: expected a mapping like"},
        {"redis: {address: 127.0.0.1:6379}\nqueues: [{keys: a, processing: \"{key}:p\", "
         "consumer_backoff: {after: 5}}]\n",
         "t.yml:2:62: ", "queues[0].consumer_backoff: unknown key 'after'"},
        {"redis: {address: 127.0.0.1:6379}\nqueues: [{keys: a, processing: \"{key}:p\", "
         "consumer_backoff: {after_failures: 0}}]\n",
         "t.yml:2:78: ", "queues[0].consumer_backoff.after_failures: 0 is out of range"},
        {"redis: {address: 127.0.0.1:6379}\nqueue_depths: {interval_ms: 1}\n",
         "t.yml:2:29: ", "queue_depths.interval_ms: 1 is out of range"},
        {"redis: {address: 127.0.0.1:6379}\nqueue_depths: {rounds: 1}\n",
         "t.yml:2:16: ", "unknown key 'queue_depths.rounds'"},
    };
    run_error_cases(cases, sizeof(cases) / sizeof(cases[0]));
}

static void test_stats_off(void **state)
{
    config cfg;
    const char *inputs[] = {
        "redis: {address: 127.0.0.1:6379}\nstats: {listen: off}\n",
        "redis: {address: 127.0.0.1:6379}\nstats: {listen: \"\"}\n",
        "redis: {address: 127.0.0.1:6379}\nstats: {listen: \"OFF\"}\n",
        "redis: {address: 127.0.0.1:6379}\nstats:\n  listen:\n",
    };

    (void)state;
    for (size_t i = 0; i < sizeof(inputs) / sizeof(inputs[0]); i++) {
        load_ok(&cfg, inputs[i]);
        assert_int_equal(cfg.stats_enabled, 0);
        config_free(&cfg);
    }
    load_ok(&cfg, "redis: {address: 127.0.0.1:6379}\nstats: {listen: \"unix:/tmp/st\"}\n");
    assert_int_equal(cfg.stats_enabled, 1);
    assert_addr(&cfg.stats_listen, "unix:/tmp/st");
    config_free(&cfg);
}

static void test_sizes(void **state)
{
    static const struct {
        const char *text; /* value of client.max_query_bytes */
        size_t bytes;     /* expected result */
    } good[] = {
        {"1", 1},
        {"1024", 1024},
        {"7b", 7},
        {"7B", 7},
        {"1kb", 1024},
        {"1KB", 1024},
        {"1Kb", 1024},
        {"3mb", 3 * MB},
        {"2 MB", 2 * MB},
        {"1gb", 1024 * MB},
        {"16GB", (size_t)16 << 30},
    };
    static const char *const bad[] = {"1k", "1.5mb", "-1", "mb", "1 tb", "0x10", "12 34"};
    config cfg;
    char yaml[256];
    char want[128];

    (void)state;
    for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
        snprintf(yaml, sizeof(yaml),
                 "redis: {address: 127.0.0.1:6379}\nclient: {max_query_bytes: %s}\n", good[i].text);
        load_ok(&cfg, yaml);
        assert_int_equal(cfg.max_query_bytes, good[i].bytes);
        config_free(&cfg);
    }
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        error_case c;
        snprintf(yaml, sizeof(yaml),
                 "redis: {address: 127.0.0.1:6379}\nclient:\n"
                 "  max_query_bytes: %s\n",
                 bad[i]);
        snprintf(want, sizeof(want), "client.max_query_bytes: expected a size");
        c.yaml = yaml;
        c.prefix = "t.yml:3:20: ";
        c.contains = want;
        load_fails(&c);
    }
    {
        /* Zero and overflow are range errors. */
        static const error_case cases[] = {
            {"redis: {address: 127.0.0.1:6379}\nclient:\n  max_query_bytes: 0\n",
             "t.yml:3:20: ", "client.max_query_bytes: 0 is out of range"},
            {"redis: {address: 127.0.0.1:6379}\nclient:\n"
             "  max_bulk_len: 99999999999999999999999\n",
             "t.yml:3:17: ", "out of range"},
            {"redis: {address: 127.0.0.1:6379}\nclient:\n  max_bulk_len: 17179869184gb\n",
             "t.yml:3:17: ", "out of range"},
        };
        run_error_cases(cases, sizeof(cases) / sizeof(cases[0]));
    }
}

static void test_parse_addr(void **state)
{
    static const struct {
        const char *in;  /* text given */
        const char *out; /* config_addr_str of the result */
    } good[] = {
        {"127.0.0.1:6380", "127.0.0.1:6380"},
        {"localhost:1", "localhost:1"},
        {"redis-1.example.com:65535", "redis-1.example.com:65535"},
        {"[::1]:6380", "[::1]:6380"},
        {"[2001:db8::1]:80", "[2001:db8::1]:80"},
        {"unix:/x", "unix:/x"},
        {"unix:/run/ferry/ferry.sock", "unix:/run/ferry/ferry.sock"},
    };
    static const char *const bad[] = {
        "",        "127.0.0.1",  "127.0.0.1:", ":6379", "host:0",    "host:65536", "host:99999999",
        "host:-1", "host:12a",   "::1:6379",   "[::1]", "[::1]6379", "[zz]:1",     "[]:1",
        "unix:",   "bad host:1", "a/b:1",
    };
    config_addr a;
    char longpath[200];

    (void)state;
    for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
        memset(&a, 0x55, sizeof(a));
        assert_int_equal(config_parse_addr(good[i].in, &a), 0);
        assert_addr(&a, good[i].out);
    }
    assert_int_equal(config_parse_addr("[::1]:6380", &a), 0);
    assert_int_equal(a.is_unix, 0);
    assert_string_equal(a.host, "::1");
    assert_int_equal(a.port, 6380);
    assert_int_equal(config_parse_addr("unix:/tmp/s", &a), 0);
    assert_int_equal(a.is_unix, 1);
    assert_string_equal(a.path, "/tmp/s");
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        if (config_parse_addr(bad[i], &a) == 0) {
            print_error("accepted bad address '%s'\n", bad[i]);
            fail();
        }
    }

    /* unix paths: 107 bytes fit (sun_path holds 108 with the NUL), 108 do not. */
    memcpy(longpath, "unix:/", 6);
    memset(longpath + 6, 'p', 106);
    longpath[6 + 106] = '\0';
    assert_int_equal(config_parse_addr(longpath, &a), 0);
    assert_int_equal(strlen(a.path), 107);
    longpath[6 + 106] = 'p';
    longpath[6 + 107] = '\0';
    assert_int_equal(config_parse_addr(longpath, &a), -1);

    /* A tiny buffer truncates safely. */
    {
        char small[6];
        config_parse_addr("127.0.0.1:6380", &a);
        assert_string_equal(config_addr_str(&a, small, sizeof(small)), "127.0");
    }
}

static void test_listen_forms(void **state)
{
    config cfg;

    (void)state;
    load_ok(&cfg, "listen: \"unix:/run/ferry/ferry.sock\"\nredis: {address: 127.0.0.1:6379}\n");
    assert_int_equal(cfg.nlisten, 1);
    assert_addr(&cfg.listen[0], "unix:/run/ferry/ferry.sock");
    config_free(&cfg);

    load_ok(&cfg, "listen: [127.0.0.1:6380, \"unix:/run/ferry/ferry.sock\"]\n"
                  "redis: {address: 127.0.0.1:6379}\n");
    assert_int_equal(cfg.nlisten, 2);
    assert_addr(&cfg.listen[0], "127.0.0.1:6380");
    assert_addr(&cfg.listen[1], "unix:/run/ferry/ferry.sock");
    config_free(&cfg);
}

static void test_deny_list(void **state)
{
    config cfg;

    (void)state;
    load_ok(&cfg, "redis: {address: 127.0.0.1:6379}\n"
                  "deny:\n"
                  "  - \"  Config   REWRITE  \"\n"
                  "  - \"acl\tsetuser\"\n"
                  "  - FLUSHALL\n"
                  "  - flushall\n"
                  "  - KEYS\n");
    assert_int_equal(cfg.ndeny, 4);
    assert_string_equal(cfg.deny[0], "config rewrite");
    assert_string_equal(cfg.deny[1], "acl setuser");
    assert_string_equal(cfg.deny[2], "flushall");
    assert_string_equal(cfg.deny[3], "keys");
    config_free(&cfg);

    /* An explicit empty list denies nothing extra. */
    load_ok(&cfg, "redis: {address: 127.0.0.1:6379}\ndeny: []\n");
    assert_int_equal(cfg.ndeny, 0);
    config_free(&cfg);

    /* A scalar is a one-entry list. */
    load_ok(&cfg, "redis: {address: 127.0.0.1:6379}\ndeny: Monitor\n");
    assert_int_equal(cfg.ndeny, 1);
    assert_string_equal(cfg.deny[0], "monitor");
    config_free(&cfg);

    /* Absent: the default list. */
    load_ok(&cfg, "redis: {address: 127.0.0.1:6379}\n");
    assert_int_equal(cfg.ndeny, 6);
    assert_string_equal(cfg.deny[5], "config rewrite");
    config_free(&cfg);

    {
        static const error_case cases[] = {
            {"redis: {address: 127.0.0.1:6379}\ndeny: [debug, \"  \"]\n",
             "t.yml:2:15: ", "deny: '  ': empty command name"},
            {"redis: {address: 127.0.0.1:6379}\ndeny: [\"a b c\"]\n",
             "t.yml:2:8: ", "expected a command or 'command subcommand'"},
            {"redis: {address: 127.0.0.1:6379}\ndeny:\n",
             "t.yml:2:6: ", "deny: expected a list (use [] for an empty one), got nothing"},
            {"redis: {address: 127.0.0.1:6379}\ndeny: {a: b}\n",
             "t.yml:2:7: ", "deny: expected a list"},
            {"redis: {address: 127.0.0.1:6379}\ndeny: [[x]]\n",
             "t.yml:2:8: ", "deny: expected a string, got a list"},
        };
        run_error_cases(cases, sizeof(cases) / sizeof(cases[0]));
    }
}

/* Too many deny entries: the 65th is reported. */
static void test_deny_too_many(void **state)
{
    char yaml[2048];
    size_t n;
    error_case c;

    (void)state;
    n = (size_t)snprintf(yaml, sizeof(yaml), "redis: {address: 127.0.0.1:6379}\ndeny:\n");
    for (int i = 0; i <= CONFIG_MAX_DENY; i++) {
        n += (size_t)snprintf(yaml + n, sizeof(yaml) - n, "  - cmd%d\n", i);
    }
    c.yaml = yaml;
    c.prefix = "t.yml:67:5: ";
    c.contains = "deny: too many entries (at most 64)";
    load_fails(&c);
}

static void test_errors_keys(void **state)
{
    static const error_case cases[] = {
        /* unknown keys, at the top and in a section */
        {"redis: {address: 127.0.0.1:6379}\nfoo: 1\n", "t.yml:2:1: ", "unknown key 'foo'"},
        {"redis: {address: 127.0.0.1:6379}\nclient:\n  max_clients: 5\n  bar: 1\n",
         "t.yml:4:3: ", "unknown key 'client.bar'"},
        {"foo:\n  bar: 1\n", "t.yml:1:1: ", "unknown key 'foo'"},
        {"redis: {address: 127.0.0.1:6379}\nclient.max_clients: 5\n",
         "t.yml:2:1: ", "unknown key 'client.max_clients'"},
        {"redis: {address: 127.0.0.1:6379, sentinel: x}\n",
         "t.yml:1:34: ", "unknown key 'redis.sentinel'"},
        {"redis: {address: 127.0.0.1:6379}\n[a]: 1\n", "t.yml:2:1: ", "keys must be names"},
        /* duplicates, at the top and in a section */
        {"redis: {address: 127.0.0.1:6379}\nlisten: 1.2.3.4:5\nlisten: 1.2.3.4:6\n",
         "t.yml:3:1: ", "duplicate key 'listen' (first at line 2)"},
        {"redis:\n  address: 127.0.0.1:6379\n  address: 127.0.0.1:6379\n",
         "t.yml:3:3: ", "duplicate key 'redis.address'"},
        {"redis: {address: 127.0.0.1:6379}\nclient: {}\nclient: {}\n",
         "t.yml:3:1: ", "duplicate key 'client'"},
        /* sections of the wrong shape */
        {"redis: 127.0.0.1:6379\n",
         "t.yml:1:8: ", "redis: expected a mapping, got '127.0.0.1:6379'"},
        {"redis: {address: 127.0.0.1:6379}\nclient: [1]\n",
         "t.yml:2:9: ", "client: expected a mapping, got a list"},
    };

    (void)state;
    run_error_cases(cases, sizeof(cases) / sizeof(cases[0]));
}

static void test_errors_values(void **state)
{
    static const error_case cases[] = {
        {"redis: {address: 127.0.0.1:6379}\nclient:\n  max_clients: abc\n",
         "t.yml:3:16: ", "client.max_clients: expected an integer, got 'abc'"},
        {"redis: {address: 127.0.0.1:6379}\nclient:\n  max_clients: 1.5\n",
         "t.yml:3:16: ", "expected an integer, got '1.5'"},
        {"redis: {address: 127.0.0.1:6379}\nclient:\n  max_clients:\n",
         "t.yml:3:15: ", "client.max_clients: expected an integer, got nothing"},
        {"redis: {address: 127.0.0.1:6379}\nclient:\n  max_clients: [1]\n",
         "t.yml:3:16: ", "expected an integer, got a list"},
        {"redis: {address: 127.0.0.1:6379}\nclient:\n  max_clients: 0\n",
         "t.yml:3:16: ", "client.max_clients: 0 is out of range (1..2147483647)"},
        {"redis: {address: 127.0.0.1:6379}\nclient:\n  max_clients: 99999999999\n",
         "t.yml:3:16: ", "out of range"},
        {"redis: {address: 127.0.0.1:6379}\nupstream: {shared_links: 65}\n",
         "t.yml:2:26: ", "upstream.shared_links: 65 is out of range (1..64)"},
        {"redis: {address: 127.0.0.1:6379}\nupstream: {shared_links: 0}\n",
         "t.yml:2:26: ", "out of range (1..64)"},
        {"redis: {address: 127.0.0.1:6379}\nupstream: {pool_idle: -1}\n",
         "t.yml:2:23: ", "upstream.pool_idle: -1 is out of range"},
        {"redis: {address: 127.0.0.1:6379}\nclient: {max_args: 0}\n",
         "t.yml:2:20: ", "client.max_args: 0 is out of range"},
        {"redis: {address: 127.0.0.1:6379}\nclient: {max_args: 1kb}\n",
         "t.yml:2:20: ", "client.max_args: expected a non-negative integer"},
        {"redis: {address: 127.0.0.1:6379}\nclient: {max_pipeline: 0}\n",
         "t.yml:2:24: ", "client.max_pipeline: 0 is out of range"},
        {"redis: {address: 127.0.0.1:6379}\nclient: {output_limit: {hard: lots}}\n",
         "t.yml:2:31: ", "client.output_limit.hard: expected a size"},
        {"redis: {address: 127.0.0.1:6379}\nclient: {pubsub_output_limit: {soft_seconds: 1m}}\n",
         "t.yml:2:46: ",
         "client.pubsub_output_limit.soft_seconds: expected a non-negative integer"},
        {"redis: {address: 127.0.0.1:6379}\nclient: {output_limit: {seconds: 5}}\n",
         "t.yml:2:25: ", "unknown key 'client.output_limit.seconds'"},
        {"redis: {address: 127.0.0.1:6379}\nlimits: {max_memory: -1}\n",
         "t.yml:2:22: ", "limits.max_memory: "},
        /* durations: zero where it makes no sense */
        {"redis: {address: 127.0.0.1:6379}\nupstream: {connect_timeout_ms: 0}\n",
         "t.yml:2:32: ", "upstream.connect_timeout_ms: 0 is out of range"},
        {"redis: {address: 127.0.0.1:6379}\nupstream: {hold_timeout_ms: 0}\n",
         "t.yml:2:29: ", "upstream.hold_timeout_ms: 0 is out of range"},
        {"redis: {address: 127.0.0.1:6379}\nshutdown_timeout_ms: 0\n",
         "t.yml:2:22: ", "shutdown_timeout_ms: 0 is out of range"},
        {"redis: {address: 127.0.0.1:6379}\nshutdown_timeout_ms: 5s\n",
         "t.yml:2:22: ", "shutdown_timeout_ms: expected a duration in milliseconds, got '5s'"},
        {"redis: {address: 127.0.0.1:6379}\nsentinel_x: 1\n",
         "t.yml:2:1: ", "unknown key 'sentinel_x'"},
        /* bools and enums */
        {"redis: {address: 127.0.0.1:6379}\ndurability: {require_aof: maybe}\n",
         "t.yml:2:27: ", "durability.require_aof: expected true or false, got 'maybe'"},
        {"redis: {address: 127.0.0.1:6379}\ndurability: {replicas_ack: 17}\n",
         "t.yml:2:28: ", "durability.replicas_ack: 17 is out of range (0..16)"},
        {"redis: {address: 127.0.0.1:6379}\ndurability: {config_command: \"a b\"}\n",
         "t.yml:2:30: ", "durability.config_command: 'a b': must be a single word"},
        {"redis: {address: 127.0.0.1:6379}\ndurability: {config_command: \"\"}\n",
         "t.yml:2:30: ", "durability.config_command: expected a non-empty string"},
        {"redis: {address: 127.0.0.1:6379}\ndurability: {persist_config: 1}\n",
         "t.yml:2:30: ", "durability.persist_config: expected true or false, got '1'"},
        {"redis: {address: 127.0.0.1:6379}\nclient: {auth: acl}\n",
         "t.yml:2:16: ", "client.auth: expected ferry or redis, got 'acl'"},
        {"redis: {address: 127.0.0.1:6379}\nlog: {level: loud}\n",
         "t.yml:2:14: ", "log.level: expected debug, info, warn or error, got 'loud'"},
        {"redis: {address: 127.0.0.1:6379}\nlog: {file: [a]}\n",
         "t.yml:2:13: ", "log.file: expected a string, got a list"},
        /* addresses */
        {"redis:\n  address: 127.0.0.1\n",
         "t.yml:2:12: ", "redis.address: bad address '127.0.0.1': missing port"},
        {"redis:\n  address: 127.0.0.1:0\n", "t.yml:2:12: ", "port must be 1..65535"},
        {"redis:\n  address:\n", "t.yml:2:11: ", "redis.address: expected an address, got nothing"},
        {"redis: {address: 127.0.0.1:6379}\nlisten: [1.2.3.4:5, 1.2.3.4:99999]\n",
         "t.yml:2:21: ", "listen: bad address '1.2.3.4:99999': port must be 1..65535"},
        {"redis: {address: 127.0.0.1:6379}\nlisten: [1.2.3.4:5, 1.2.3.4:5]\n",
         "t.yml:2:21: ", "listen: duplicate address '1.2.3.4:5'"},
        {"redis: {address: 127.0.0.1:6379}\nlisten: \"unix:/"
         "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
         "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
         "\"\n",
         "t.yml:2:9: ", "unix socket path too long"},
        {"redis: {address: 127.0.0.1:6379}\nlisten: [1.1.1.1:1, 1.1.1.1:2, 1.1.1.1:3, "
         "1.1.1.1:4, 1.1.1.1:5, 1.1.1.1:6, 1.1.1.1:7, 1.1.1.1:8, 1.1.1.1:9]\n",
         "t.yml:2:98: ", "listen: too many entries (at most 8)"},
        {"redis: {address: 127.0.0.1:6379}\nstats: {listen: 127.0.0.1}\n",
         "t.yml:2:17: ", "stats.listen: bad address"},
        {"redis: {address: 127.0.0.1:6379}\nsentinel:\n  master: \"my master\"\n",
         "t.yml:3:11: ", "sentinel.master: 'my master': must be a single word"},
    };

    (void)state;
    run_error_cases(cases, sizeof(cases) / sizeof(cases[0]));
}

static void test_errors_semantic(void **state)
{
    static const error_case cases[] = {
        {"listen: 127.0.0.1:6380\n",
         "t.yml:1:1: ", "one of redis.address, sentinel or cluster must be set"},
        {"listen: 127.0.0.1:6380\nredis:\n  password: x\n",
         "t.yml:2:1: ", "one of redis.address, sentinel or cluster must be set"},
        {"redis: {address: 127.0.0.1:6379}\n"
         "sentinel: {master: m, addresses: [1.2.3.4:26379]}\n",
         "t.yml:2:1: ", "redis.address, sentinel and cluster are mutually exclusive"},
        {"redis: {address: 127.0.0.1:6379}\n"
         "cluster: {nodes: [1.2.3.4:7000]}\n",
         "t.yml:2:1: ", "redis.address, sentinel and cluster are mutually exclusive"},
        {"sentinel: {master: m, addresses: [1.2.3.4:26379]}\n"
         "cluster: {nodes: [1.2.3.4:7000]}\n",
         "t.yml:2:1: ", "set exactly one"},
        {"cluster:\n", "t.yml:1:1: ", "cluster.nodes must list at least one node"},
        {"cluster:\n  refresh_interval_ms: 100\n",
         "t.yml:1:1: ", "cluster.nodes must list at least one node"},
        {"cluster:\n  nodes: []\n", "t.yml:2:3: ", "cluster.nodes must list at least one node"},
        {"cluster:\n  nodes: [unix:/tmp/r.sock]\n",
         "t.yml:2:10: ", "a cluster node is a host:port"},
        {"cluster:\n  nodes: [1.2.3.4:7000]\n  refresh_interval_ms: 0\n",
         "t.yml:3:", "refresh_interval_ms"},
        /* Leases with cluster: no '{' before {key} (docs/cluster.md "Leases"). */
        {"cluster: {nodes: [1.2.3.4:7000]}\nqueues: [{keys: a, processing: \"{p}{key}\"}]\n",
         "t.yml:1:1: ", "queues[0].processing: with cluster, no '{' may come before {key}"},
        {"cluster: {nodes: [1.2.3.4:7000]}\n"
         "queues: [{keys: a, processing: \"{key}:p\", dead_letter: \"d{x}:{key}\"}]\n",
         "t.yml:1:1: ", "queues[0].dead_letter: with cluster, no '{' may come before {key}"},

        {"listen: 127.0.0.1:6380\nsentinel:\n  addresses: [1.2.3.4:26379]\n",
         "t.yml:2:1: ", "sentinel.master must be set"},
        {"listen: 127.0.0.1:6380\nsentinel:\n  master: m\n",
         "t.yml:2:1: ", "sentinel.addresses must list at least one sentinel"},
        {"sentinel:\n  master: m\n  addresses: []\n",
         "t.yml:3:3: ", "sentinel.addresses must list at least one sentinel"},
        {"sentinel:\n", "t.yml:1:1: ", "sentinel.master must be set"},
        {"redis: {address: 127.0.0.1:6379}\nlisten: []\n",
         "t.yml:2:1: ", "listen must have at least one address"},
        {"redis: {address: 127.0.0.1:6379}\nlisten_tls: 127.0.0.1:7001\n",
         "t.yml:2:1: ", "listen_tls needs tls.cert_file and tls.key_file"},
        {"redis: {address: 127.0.0.1:6379}\nlisten_tls: 127.0.0.1:7001\n"
         "tls: {cert_file: c, key_file: k}\n",
         "t.yml:1:1: ", "tls.auth_clients yes needs tls.ca_cert_file"},
        {"redis: {address: 127.0.0.1:6379}\nlisten: 127.0.0.1:7001\nlisten_tls: 127.0.0.1:7001\n"
         "tls: {cert_file: c, key_file: k, auth_clients: no}\n",
         "t.yml:3:13: ", "listen_tls: 127.0.0.1:7001 is also a listen address"},
        {"redis: {address: 127.0.0.1:6379, tls: {cert_file: c}}\n",
         "t.yml:1:34: ", "redis.tls: cert_file and key_file go together"},
        {"redis: {address: 127.0.0.1:6379}\nlisten: [127.0.0.1:7000]\n"
         "stats:\n  listen: 127.0.0.1:7000\n",
         "t.yml:4:11: ", "stats.listen: 127.0.0.1:7000 is also a listen address"},
        {"redis: {address: 127.0.0.1:6379}\nclient: {auth: redis, password: x}\n",
         "t.yml:2:33: ", "client.password cannot be set with client.auth redis"},
    };

    (void)state;
    run_error_cases(cases, sizeof(cases) / sizeof(cases[0]));
}

static void test_errors_document(void **state)
{
    static const error_case cases[] = {
        {"", "t.yml:1:1: ", "empty configuration file"},
        {"# only a comment\n\n", "t.yml:1:1: ", "empty configuration file"},
        {"---\n", "t.yml:1:1: ", "empty configuration file"},
        {"- a\n- b\n", "t.yml:1:1: ", "the top level must be a mapping"},
        {"\n\njust text\n", "t.yml:3:1: ", "the top level must be a mapping"},
        /* a tab used for indentation */
        {"redis:\n\taddress: 127.0.0.1:6379\n",
         "t.yml:2:1: ", "YAML syntax error: found character that cannot start any token"},
        {"redis: {address: 127.0.0.1:6379\n", "t.yml:2:1: ", "YAML syntax error"},
        {"redis:\n  address: \"127.0.0.1:6379\n",
         "t.yml:3:1: ", "YAML syntax error: found unexpected end of stream"},
        {"redis: {address: *nope}\n", "t.yml:1:18: ", "YAML syntax error: found undefined alias"},
        {"redis: {address: 127.0.0.1:6379}\n---\nlisten: 1.2.3.4:5\n",
         "t.yml:3:1: ", "only one YAML document is allowed"},
        {"redis: {address: 127.0.0.1:6379}\n---\n[\n", "t.yml:4:1: ", "YAML syntax error"},
        {"redis: {address: 127.0.0.1:6379}\nlog: {file: \"a\x01\"}\n",
         "t.yml:2:15: ", "invalid input: control characters are not allowed"},
    };

    (void)state;
    run_error_cases(cases, sizeof(cases) / sizeof(cases[0]));
}

/* Long or binary values are cut and made printable in messages. */
static void test_error_value_quoting(void **state)
{
    config cfg;
    char yaml[512];
    char err[512];
    char *quote;

    (void)state;
    snprintf(yaml, sizeof(yaml),
             "redis: {address: 127.0.0.1:6379}\nclient: {max_clients: \"%0200d\\t\"}\n", 7);
    assert_int_equal(config_load_string(&cfg, "t.yml", yaml, err, sizeof(err)), -1);
    quote = strchr(err, '\'');
    assert_non_null(quote);
    assert_true(strlen(quote) < 60);
    assert_non_null(strstr(err, "...'"));

    snprintf(yaml, sizeof(yaml),
             "redis: {address: 127.0.0.1:6379}\nclient: {max_clients: \"1\\t2\"}\n");
    assert_int_equal(config_load_string(&cfg, "t.yml", yaml, err, sizeof(err)), -1);
    assert_non_null(strstr(err, "got '1?2'"));

    /* A NUL inside a value is refused. */
    snprintf(yaml, sizeof(yaml),
             "redis: {address: 127.0.0.1:6379}\nclient: {password: \"a\\0b\"}\n");
    assert_int_equal(config_load_string(&cfg, "t.yml", yaml, err, sizeof(err)), -1);
    assert_non_null(strstr(err, "NUL byte"));

    /* A short or missing error buffer is fine. */
    assert_int_equal(config_load_string(&cfg, "t.yml", "foo: 1\n", err, 4), -1);
    assert_string_equal(err, "t.y");
    assert_int_equal(config_load_string(&cfg, "t.yml", "foo: 1\n", NULL, 0), -1);
}

/* Finds config/ferry.yml: FERRY_SOURCE_DIR (set by ctest), or relative paths. */
static int example_path(char *buf, size_t len)
{
    const char *dir = getenv("FERRY_SOURCE_DIR");
    static const char *const rel[] = {"config/ferry.yml", "../config/ferry.yml",
                                      "../../config/ferry.yml"};

    if (dir != NULL && dir[0] != '\0') {
        snprintf(buf, len, "%s/config/ferry.yml", dir);
        return 0;
    }
    const char *slash;

    for (size_t i = 0; i < sizeof(rel) / sizeof(rel[0]); i++) {
        if (access(rel[i], R_OK) == 0) {
            snprintf(buf, len, "%s", rel[i]);
            return 0;
        }
    }
    /* Last resort: this source file's directory is tests/unit. */
    slash = strrchr(__FILE__, '/');
    if (slash != NULL) {
        snprintf(buf, len, "%.*s/../../config/ferry.yml", (int)(slash - __FILE__), __FILE__);
        if (access(buf, R_OK) == 0) {
            return 0;
        }
    }
    return -1;
}

/* The shipped example loads and spells out the defaults. */
static void test_example_file(void **state)
{
    config cfg;
    config def;
    char path[4096];
    char err[512] = "";
    int rc;

    (void)state;
    if (example_path(path, sizeof(path)) < 0) {
        print_error("config/ferry.yml not found: set FERRY_SOURCE_DIR\n");
        fail();
    }
    rc = config_load(&cfg, path, err, sizeof(err));
    if (rc != 0) {
        print_error("%s\n", err);
    }
    assert_int_equal(rc, 0);
    assert_string_equal(cfg.file, path);
    assert_int_equal(cfg.has_redis, 1);
    assert_int_equal(cfg.has_sentinel, 0);
    assert_addr(&cfg.redis_addr, "127.0.0.1:6379");

    config_defaults(&def);
    assert_int_equal(cfg.nlisten, def.nlisten);
    assert_addr(&cfg.listen[0], "127.0.0.1:6380");
    assert_null(cfg.redis_username);
    assert_null(cfg.redis_password);
    assert_null(cfg.client_password);
    assert_int_equal(cfg.max_clients, def.max_clients);
    assert_int_equal(cfg.max_query_bytes, def.max_query_bytes);
    assert_int_equal(cfg.max_pending_bytes, def.max_pending_bytes);
    assert_int_equal(cfg.max_bulk_len, def.max_bulk_len);
    assert_int_equal(cfg.max_args, def.max_args);
    assert_int_equal(cfg.max_inline_len, def.max_inline_len);
    assert_int_equal(cfg.idle_timeout_ms, def.idle_timeout_ms);
    assert_int_equal(cfg.max_pipeline, def.max_pipeline);
    assert_int_equal(cfg.request_timeout_ms, def.request_timeout_ms);
    assert_memory_equal(&cfg.output_limit, &def.output_limit, sizeof(def.output_limit));
    assert_memory_equal(&cfg.pubsub_output_limit, &def.pubsub_output_limit,
                        sizeof(def.pubsub_output_limit));
    assert_int_equal(cfg.max_memory, def.max_memory);
    assert_int_equal(cfg.shared_links, def.shared_links);
    assert_int_equal(cfg.pool_idle, def.pool_idle);
    assert_int_equal(cfg.connect_timeout_ms, def.connect_timeout_ms);
    assert_int_equal(cfg.ping_interval_ms, def.ping_interval_ms);
    assert_int_equal(cfg.hold_timeout_ms, def.hold_timeout_ms);
    assert_int_equal(cfg.hold_max_bytes, def.hold_max_bytes);
    assert_int_equal(cfg.ndeny, def.ndeny);
    for (int i = 0; i < def.ndeny; i++) {
        assert_string_equal(cfg.deny[i], def.deny[i]);
    }
    assert_int_equal(cfg.stats_enabled, 1);
    assert_addr(&cfg.stats_listen, "127.0.0.1:22222");
    assert_int_equal(cfg.log_level, def.log_level);
    assert_null(cfg.log_file);
    assert_null(cfg.fallback_path);
    assert_int_equal(cfg.shutdown_timeout_ms, def.shutdown_timeout_ms);
    assert_int_equal(cfg.require_aof, def.require_aof);
    assert_int_equal(cfg.replicas_ack, def.replicas_ack);
    assert_int_equal(cfg.replicas_ack_timeout_ms, def.replicas_ack_timeout_ms);
    assert_int_equal(cfg.replicas_ack_hold_ms, def.replicas_ack_hold_ms);
    assert_int_equal(cfg.enforce_interval_ms, def.enforce_interval_ms);
    assert_string_equal(cfg.config_command, def.config_command);
    assert_int_equal(cfg.persist_config, def.persist_config);
    config_free(&def);
    config_free(&cfg);
}

/* config_load: a real file's name in messages, and a missing file. */
static void test_load_file(void **state)
{
    char path[] = "/tmp/ferry-test-config-XXXXXX";
    char want[128];
    char err[512];
    config cfg;
    FILE *f;
    int fd;

    (void)state;
    fd = mkstemp(path);
    assert_true(fd >= 0);
    f = fdopen(fd, "w");
    assert_non_null(f);
    fputs("redis:\n  address: 127.0.0.1:6379\nclient:\n  max_clients: lots\n", f);
    fclose(f);
    assert_int_equal(config_load(&cfg, path, err, sizeof(err)), -1);
    snprintf(want, sizeof(want), "%s:4:16: client.max_clients: expected an integer", path);
    assert_memory_equal(err, want, strlen(want));
    config_free(&cfg);

    f = fopen(path, "w");
    assert_non_null(f);
    fputs("redis:\n  address: 127.0.0.1:6379\n", f);
    fclose(f);
    assert_int_equal(config_load(&cfg, path, err, sizeof(err)), 0);
    assert_string_equal(cfg.file, path);
    config_free(&cfg);

    f = fopen(path, "w");
    assert_non_null(f);
    fclose(f);
    assert_int_equal(config_load(&cfg, path, err, sizeof(err)), -1);
    snprintf(want, sizeof(want), "%s:1:1: empty configuration file", path);
    assert_string_equal(err, want);
    unlink(path);

    assert_int_equal(config_load(&cfg, "/nonexistent/ferry.yml", err, sizeof(err)), -1);
    assert_string_equal(err, "/nonexistent/ferry.yml:1:1: cannot open: No such file or directory");
    assert_null(cfg.file);
    config_free(&cfg);
}

static void test_free_idempotent(void **state)
{
    config cfg;

    (void)state;
    config_defaults(&cfg);
    config_free(&cfg);
    config_free(&cfg);
    assert_null(cfg.config_command);
    assert_int_equal(cfg.ndeny, 0);

    load_ok(&cfg, "redis: {address: 127.0.0.1:6379, password: pw}\nlog: {file: /tmp/x}\n");
    config_free(&cfg);
    assert_null(cfg.file);
    assert_null(cfg.redis_password);
    assert_null(cfg.log_file);
    config_free(&cfg);

    memset(&cfg, 0, sizeof(cfg));
    config_free(&cfg);
    config_free(NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_minimal),
        cmocka_unit_test(test_full_round_trip),
        cmocka_unit_test(test_sentinel_mode),
        cmocka_unit_test(test_cluster_mode),
        cmocka_unit_test(test_empty_strings_are_null),
        cmocka_unit_test(test_takeover_socket),
        cmocka_unit_test(test_workers),
        cmocka_unit_test(test_queues),
        cmocka_unit_test(test_stats_off),
        cmocka_unit_test(test_sizes),
        cmocka_unit_test(test_parse_addr),
        cmocka_unit_test(test_listen_forms),
        cmocka_unit_test(test_deny_list),
        cmocka_unit_test(test_deny_too_many),
        cmocka_unit_test(test_errors_keys),
        cmocka_unit_test(test_errors_values),
        cmocka_unit_test(test_errors_semantic),
        cmocka_unit_test(test_client_auth),
        cmocka_unit_test(test_errors_document),
        cmocka_unit_test(test_error_value_quoting),
        cmocka_unit_test(test_example_file),
        cmocka_unit_test(test_load_file),
        cmocka_unit_test(test_free_idempotent),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
