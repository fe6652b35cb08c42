/* config.h - ferry's configuration: one struct, loaded from YAML (libyaml),
 * validated, with errors reported as "file:line:column: message". */
#ifndef FERRY_CONFIG_H
#define FERRY_CONFIG_H

#include <stddef.h>
#include <stdio.h>
#include <stdint.h>

#define CONFIG_MAX_LISTEN 8
#define CONFIG_MAX_SENTINELS 16
#define CONFIG_MAX_CLUSTER_SEEDS 64 /* cluster.nodes */
#define CONFIG_MAX_DENY 64
#define CONFIG_MAX_WORKERS 64                 /* workers: most event loops */
#define CONFIG_AUTO_WORKERS 8                 /* workers: auto picks at most this many */
#define CONFIG_MAX_QUEUES 16                  /* queues: most entries */
#define CONFIG_MAX_QUEUE_KEYS 8               /* queues[].keys: most globs per entry */
#define CONFIG_MAX_QUEUE_LENGTH 4294967295ull /* queues[].max_length: Redis' list bound */

/* client.auth: who checks a client's AUTH, and as whom its commands run. */
enum {
    CLIENT_AUTH_FERRY = 0, /* ferry's client.password; commands run as ferry's Redis user */
    CLIENT_AUTH_REDIS = 1  /* Redis' ACL; commands run as the user the client named */
};

/* A network endpoint: "host:port", "[v6]:port" or "unix:/path". */
typedef struct config_addr {
    int is_unix;    /* 1: path is set; 0: host and port are set */
    char host[256]; /* IPv4/IPv6 literal or name */
    int port;       /* 1..65535 */
    char path[108]; /* unix socket path */
} config_addr;

/* Redis' client-output-buffer-limit: a client whose queued output reaches
 * hard, or stays above soft for soft_seconds, is closed (0 = no limit). */
typedef struct config_output_limit {
    size_t hard;         /* bytes */
    size_t soft;         /* bytes */
    size_t soft_seconds; /* how long output may stay above soft */
} config_output_limit;

/* queues[].on_full: what a push that would pass max_length gets. */
typedef enum config_on_full {
    ON_FULL_REFUSE = 0, /* -QFULL at once, nothing applied */
    ON_FULL_BLOCK       /* held and tried again until there is room (hold_timeout_ms) */
} config_on_full;

/* One entry of queues: the keys it names (Redis glob patterns) and the
 * guards that apply to them. */
typedef struct config_queue {
    char *keys[CONFIG_MAX_QUEUE_KEYS]; /* keys: one glob or a list */
    int nkeys;
    uint64_t max_length;       /* max_length: most items a list may hold (0: no bound) */
    config_on_full on_full;    /* on_full: refuse (default) or block */
    char *processing;          /* processing: "{key}:processing": the list a move from a queue
                                  key into it leases (NULL: no leases) */
    char *dead_letter;         /* dead_letter: where an item goes past max_attempts
                                  ("{key}:dead") */
    uint64_t lease_ms;         /* lease_ms (60000): how long a leased item may stay unacked */
    uint64_t max_attempts;     /* max_attempts (5): deliveries before the dead letter */
    int expire_on_disconnect;  /* lease_expire_on_disconnect (true): a client that hangs up
                                  with items unacked has their leases expired at once */
    uint64_t backoff_after;    /* consumer_backoff.after_failures: expired leases in a row
                                  that pause a consumer (0: no back-off) */
    uint64_t backoff_pause_ms; /* consumer_backoff.pause_ms: how long its pops are held */
} config_queue;

/* TLS toward Redis nodes or sentinels (redis.tls, sentinel.tls). */
enum { TLS_VERIFY_FULL = 0, TLS_VERIFY_CA = 1, TLS_VERIFY_NONE = 2 };
typedef struct config_tls_peer {
    int enabled;        /* the section is given */
    char *ca_cert_file; /* CA bundle the peer's certificate must chain to (NULL: system's) */
    char *cert_file;    /* ferry's client certificate, NULL = none */
    char *key_file;     /* its key */
    char *server_name;  /* SNI and the name verified (NULL: the address' host) */
    int verify;         /* TLS_VERIFY_*: full (chain and name), ca (chain), none */
} config_tls_peer;

/* tls.auth_clients, as Redis' tls-auth-clients. */
enum { TLS_AUTH_NO = 0, TLS_AUTH_OPTIONAL = 1, TLS_AUTH_YES = 2 };

typedef struct config {
    char *file; /* path it was loaded from */

    config_addr listen[CONFIG_MAX_LISTEN]; /* listen: one address or a list */
    int nlisten;

    /* TLS listeners beside the plain ones (Redis' tls-port and tls-* names) */
    config_addr listen_tls[CONFIG_MAX_LISTEN]; /* listen_tls: one address or a list */
    int nlisten_tls;
    char *tls_cert_file;               /* tls.cert_file (tls-cert-file) */
    char *tls_key_file;                /* tls.key_file (tls-key-file) */
    char *tls_ca_cert_file;            /* tls.ca_cert_file (tls-ca-cert-file): client certs' CA */
    int tls_auth_clients;              /* tls.auth_clients: TLS_AUTH_* (yes, as Redis) */
    char *tls_protocols;               /* tls.protocols ("TLSv1.2 TLSv1.3") */
    char *tls_ciphers;                 /* tls.ciphers (TLS 1.2), NULL = OpenSSL's */
    char *tls_ciphersuites;            /* tls.ciphersuites (TLS 1.3), NULL = OpenSSL's */
    uint64_t tls_handshake_timeout_ms; /* tls.handshake_timeout_ms (5000) */

    /* redis: a fixed master (exactly one of redis / sentinel is set) */
    int has_redis;
    config_addr redis_addr;    /* redis.address */
    char *redis_username;      /* redis.username, NULL = none */
    char *redis_password;      /* redis.password, NULL = none */
    config_tls_peer redis_tls; /* redis.tls: TLS to the Redis nodes */

    /* sentinel: follow a Sentinel-managed master */
    int has_sentinel;
    char *sentinel_master;                       /* sentinel.master */
    config_addr sentinels[CONFIG_MAX_SENTINELS]; /* sentinel.addresses */
    int nsentinels;
    char *sentinel_username;               /* sentinel.username (to sentinels) */
    char *sentinel_password;               /* sentinel.password (to sentinels) */
    config_tls_peer sentinel_tls;          /* sentinel.tls: TLS to the sentinels */
    uint64_t sentinel_resolve_interval_ms; /* sentinel.resolve_interval_ms (1000):
                                              how often the master is re-asked */
    uint64_t sentinel_timeout_ms;          /* sentinel.timeout_ms (1000): connect and
                                              reply timeout towards one sentinel */
    /* Redis credentials in sentinel mode also come from redis.username/password
     * given without redis.address. */

    /* cluster: a Redis Cluster, its slot map learned from the seed nodes
     * (exactly one of redis / sentinel / cluster is set) */
    int has_cluster;
    config_addr cluster_nodes[CONFIG_MAX_CLUSTER_SEEDS]; /* cluster.nodes: seed addresses */
    int ncluster_nodes;
    uint64_t cluster_refresh_interval_ms; /* cluster.refresh_interval_ms (1000): how often
                                             the slot map is asked again */
    uint64_t cluster_timeout_ms;          /* cluster.timeout_ms (1000): connect and reply
                                             timeout towards one node */

    /* client: what ferry accepts from applications */
    int client_auth;                         /* client.auth: CLIENT_AUTH_FERRY (default) or
                                                CLIENT_AUTH_REDIS (Redis' ACL users) */
    char *client_password;                   /* client.password, NULL = no AUTH */
    int max_clients;                         /* client.max_clients (10000) */
    size_t max_query_bytes;                  /* client.max_query_bytes (1gb) */
    size_t max_pending_bytes;                /* client.max_pending_bytes (64mb): unanswered
                                                request bytes before ferry stops reading */
    size_t max_bulk_len;                     /* client.max_bulk_len (512mb) */
    size_t max_args;                         /* client.max_args (1048576) */
    size_t max_inline_len;                   /* client.max_inline_len (64kb) */
    uint64_t idle_timeout_ms;                /* client.idle_timeout_ms (0 = never);
                                                never applied to blocked/subscribed */
    size_t max_pipeline;                     /* client.max_pipeline (10000): requests in flight
                                                per client before ferry stops reading it */
    uint64_t request_timeout_ms;             /* client.request_timeout_ms (0 = none): a
                                                request must arrive whole within this */
    config_output_limit output_limit;        /* client.output_limit (0 0 0) */
    config_output_limit pubsub_output_limit; /* client.pubsub_output_limit (32mb 8mb 60) */

    /* limits: ferry as a whole */
    size_t max_memory; /* limits.max_memory (0 = none): bytes held for clients */

    /* scripts: what ferry remembers of the clients' Lua scripts (scripts.c) */
    size_t scripts_remember_max_bytes; /* scripts.remember_max_bytes (8mb; 0 = none) */

    /* workers: event loops, each with its own clients and links to the master */
    int workers; /* workers (1; "auto" = cores - 1, at most CONFIG_AUTO_WORKERS) */

    /* upstream: links to the master */
    int shared_links;            /* upstream.shared_links (1) */
    int pool_idle;               /* upstream.pool_idle (16) */
    uint64_t connect_timeout_ms; /* upstream.connect_timeout_ms (2000) */
    uint64_t ping_interval_ms;   /* upstream.ping_interval_ms (1000) */
    uint64_t hold_timeout_ms;    /* upstream.hold_timeout_ms (10000) */
    uint64_t fence_timeout_ms;   /* upstream.fence_timeout_ms (1000): how long
                                    a WAIT on an old master may take */
    uint64_t drain_ms;           /* upstream.drain_ms (300): a blocked call on
                                    an old master may still be served */
    size_t hold_max_bytes;       /* upstream.hold_max_bytes (64mb) */
    uint64_t health_timeout_ms;  /* upstream.health_timeout_ms (5000): a master whose
                                    probe PING goes unanswered this long is frozen;
                                    0 = no probe */

    /* deny: commands refused, lowercase, "config rewrite" style for subcommands */
    char *deny[CONFIG_MAX_DENY];
    int ndeny;

    config_addr stats_listen; /* stats.listen (127.0.0.1:22222) */
    int stats_enabled;        /* 0 if stats.listen is "" or "off" */

    int log_level;  /* log.level: LOG_* (info) */
    char *log_file; /* log.file, NULL = stderr */

    char *fallback_path;                  /* fallback.path, NULL = none */
    uint64_t fallback_after_ms;           /* fallback.after_ms (5000): SWITCHING this long
                                             without a usable master is DOWN */
    char *fallback_keys[CONFIG_MAX_DENY]; /* fallback.keys: globs of the queue keys
                                             the store takes (none = every key) */
    int nfallback_keys;
    char *fallback_commands[CONFIG_MAX_DENY]; /* fallback.commands: those the store serves
                                                 (none = lpush rpush zadd and the pops) */
    int nfallback_commands;
    int fallback_serve_pops;   /* fallback.serve_pops (true) */
    size_t fallback_max_bytes; /* fallback.max_bytes (0 = no bound but the disk) */

    config_queue queues[CONFIG_MAX_QUEUES]; /* queues: a list of entries with keys: globs */
    int nqueues;
    uint64_t queue_depths_interval_ms;  /* queue_depths.interval_ms (1000): how often the
                                           queues' lengths are sampled on the master */
    size_t queue_depths_keys_per_round; /* queue_depths.keys_per_round (100): keys a
                                           sampling round asks SCAN for and measures */
    size_t queue_depths_max_keys;       /* queue_depths.max_keys (1000): keys whose
                                           length ferry keeps and shows */

    uint64_t shutdown_timeout_ms;       /* shutdown_timeout_ms (5000) */
    char *instance_name;                /* instance.name, NULL = derived (instance.c) */
    uint64_t instance_heartbeat_ttl_ms; /* instance.heartbeat_ttl_ms (5000) */
    char *takeover_socket;              /* takeover.socket: unix socket a new ferry
                                           takes this one over through, NULL = off */

    /* durability: checks on the master's persistence and replication */
    int require_aof;                    /* durability.require_aof (0): refuse
                                           writes unless appendonly is yes */
    int replicas_ack;                   /* durability.replicas_ack (-1 = auto, 0 = off, 0..16):
                                           replicas that must ack writes (WAIT) */
    uint64_t replicas_ack_timeout_ms;   /* durability.replicas_ack_timeout_ms (1000) */
    uint64_t replicas_ack_hold_ms;      /* durability.replicas_ack_hold_ms (30000) */
    uint64_t replicas_ack_data_hold_ms; /* durability.replicas_ack_data_hold_ms (500) */
    int offset_brackets;                /* durability.offset_brackets (1): ROLE beside WAIT */
    int pop_receipts;                   /* durability.pop_receipts (1): pops leave a receipt */
    int script_receipts; /* durability.script_receipts (1): writing scripts of queue keys keep their
                            reply */
    int push_receipts;   /* durability.push_receipts (1): pushes leave a receipt */
    size_t redo_max_bytes;        /* durability.redo_max_bytes (64mb) */
    uint64_t enforce_interval_ms; /* durability.enforce_interval_ms (5000):
                                     how often the checks are re-run */
    char *config_command;         /* durability.config_command ("CONFIG"):
                                     the master's name for CONFIG, if renamed */
    int persist_config;           /* durability.persist_config (0): also run
                                     CONFIG REWRITE so a restarted node
                                     comes back durable */
} config;

/* Fill cfg with the defaults (no redis/sentinel, listen 127.0.0.1:6380, the
 * default deny list). */
void config_defaults(config *cfg);
/* Every key, one line each: key, type, default, what it accepts, meaning,
 * separated by tabs (ferry --describe-config). */
void config_describe(FILE *out);
/* Load and validate path into cfg (defaults first). Returns 0, or -1 with
 * err holding "file:line:column: message" (errlen bytes at most). On error
 * cfg is left freed. */
int config_load(config *cfg, const char *path, char *err, size_t errlen);
/* Same from a string, name used in messages (for tests). */
int config_load_string(config *cfg, const char *name, const char *yaml, char *err, size_t errlen);
/* Parse "host:port" / "[v6]:port" / "unix:/path". Returns 0 or -1. */
int config_parse_addr(const char *s, config_addr *out);
/* Format an address as text into buf. Returns buf. */
char *config_addr_str(const config_addr *a, char *buf, size_t len);
void config_free(config *cfg);

/* fallback.commands and fallback.keys: whether the command (name, any
 * case) and the key are among those the fallback store serves and the redo
 * keeps (none listed: all). */
int config_fallback_command(const config *cfg, const char *name);
int config_fallback_key(const config *cfg, const char *key, size_t len);

#endif
