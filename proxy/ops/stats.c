/* stats.c - the statistics generated from FERRY_STATS (stats.h): updates,
 * the snapshot of every figure, the JSON document, the Prometheus text
 * exposition and --describe-stats. The stats port that serves them is
 * stats_port.c. */
#include "stats.h"
#include "stats_int.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clustermap.h"
#include "ferry.h"
#include "instance.h"
#include "lease.h"
#include "outage.h"
#include "queues.h"
#include "replicas.h"
#include "sentinel.h"
#include "tls.h"
#include "upstream.h"
#include "workers.h"

typedef struct stat_desc {
    const char *section; /* JSON object it belongs to ("top": the document) */
    const char *name;    /* field and JSON key */
    stat_type type;      /* see stat_type */
    const char *prom;    /* Prometheus name, "" = JSON only */
    const char *help;    /* one line */
    size_t offset;       /* of the field in ferry_stats */
} stat_desc;

#define STATS_DESC(section, name, type, prom, help)                                                \
    {#section, #name, STAT_##type, prom, help, offsetof(ferry_stats, name)},

static const stat_desc stat_descs[] = {FERRY_STATS(STATS_DESC)};
#define STATS_NDESC (sizeof(stat_descs) / sizeof(stat_descs[0]))

/* ----------------------------------------------------------------- output */

/* A JSON string: quotes, backslashes, control and non-ASCII bytes escaped
 * (so the document is valid whatever bytes a reason or name holds). */
static void json_string(buf *b, const char *s)
{
    buf_append(b, "\"", 1);
    for (const unsigned char *p = (const unsigned char *)s; *p != '\0'; p++) {
        if (*p == '"' || *p == '\\') {
            char e[2] = {'\\', (char)*p};
            buf_append(b, e, 2);
        } else if (*p < 0x20 || *p >= 0x7f) {
            stats_printf(b, "\\u%04x", *p);
        } else {
            buf_append(b, p, 1);
        }
    }
    buf_append(b, "\"", 1);
}

static uint64_t stat_num(const ferry_stats *st, const stat_desc *d)
{
    uint64_t v;
    memcpy(&v, (const char *)st + d->offset, sizeof(v));
    return v;
}

static const char *stat_text(const ferry_stats *st, const stat_desc *d)
{
    return (const char *)st + d->offset;
}

static const stats_histogram *stat_hist(const ferry_stats *st, const stat_desc *d)
{
    return (const stats_histogram *)(const void *)((const char *)st + d->offset);
}

/* A bucket bound as Prometheus writes it: seconds, shortest form ("0.0025"). */
static void bucket_label(char *out, size_t len, int i)
{
    if (i >= STATS_NBUCKETS - 1) {
        snprintf(out, len, "+Inf");
    } else {
        snprintf(out, len, "%g", (double)stats_bucket_us[i] / 1e6);
    }
}

/* Copy a TEXT stat, truncated to STATS_TEXT_MAX - 1 bytes. */
static void text_set(char *dst, const char *src)
{
    size_t n = strlen(src);
    if (n >= STATS_TEXT_MAX) {
        n = STATS_TEXT_MAX - 1;
    }
    memcpy(dst, src, n);
    dst[n] = '\0';
}

/* Unix seconds of a uv_now() instant 'then', given both clocks now. */
static uint64_t unix_of(uint64_t now_ms, uint64_t then_ms, int64_t unix_now)
{
    uint64_t ago = now_ms >= then_ms ? (now_ms - then_ms) / 1000 : 0;
    return unix_now > 0 && (uint64_t)unix_now > ago ? (uint64_t)unix_now - ago : 0;
}

/* Resident set size of this process in bytes (0 if unknown). */
static uint64_t stats_rss(void)
{
    size_t rss = 0;
    return uv_resident_set_memory(&rss) == 0 ? (uint64_t)rss : 0;
}

/* Memory, backpressure and the configured limits. */
static void stats_limits(ferry *f, ferry_stats *st)
{
    const config *cfg = f->cfg;
    st->memory_rss = stats_rss();
    st->max_memory = cfg->max_memory;
    st->max_clients = (uint64_t)cfg->max_clients;
    st->max_pending_bytes = cfg->max_pending_bytes;
    st->max_pipeline = cfg->max_pipeline;
    st->request_timeout_ms = cfg->request_timeout_ms;
    st->output_limit_hard = cfg->output_limit.hard;
    st->output_limit_soft = cfg->output_limit.soft;
    st->output_limit_soft_seconds = cfg->output_limit.soft_seconds;
    st->pubsub_output_limit_hard = cfg->pubsub_output_limit.hard;
    st->pubsub_output_limit_soft = cfg->pubsub_output_limit.soft;
    st->pubsub_output_limit_soft_seconds = cfg->pubsub_output_limit.soft_seconds;
}

/* TLS figures: each role's counts are the process' (every loop counts in
 * its shared context). */
static void stats_tls(ferry *f, ferry_stats *st)
{
    tls_figures fig;
    if (f->tls == NULL) {
        return;
    }
    if (f->tls->clients != NULL) {
        st->tls_listeners = (uint64_t)f->cfg->nlisten_tls;
        tls_conf_figures(f->tls->clients, &fig);
        st->tls_handshakes = fig.handshakes;
        st->tls_sessions_resumed = fig.resumed;
        st->tls_failed_timeout = fig.failures[TLS_FAIL_TIMEOUT];
        st->tls_failed_not_tls = fig.failures[TLS_FAIL_NOT_TLS];
        st->tls_failed_certificate = fig.failures[TLS_FAIL_CERT];
        st->tls_failed_protocol = fig.failures[TLS_FAIL_PROTOCOL];
        st->tls_failed_closed = fig.failures[TLS_FAIL_CLOSED];
        st->tls_reloads += fig.reloads;
        st->tls_reload_failures += fig.reload_failures;
    }
    tls_conf *peers[2] = {f->tls->redis, f->tls->sentinel};
    for (int i = 0; i < 2; i++) {
        if (peers[i] != NULL) {
            tls_conf_figures(peers[i], &fig);
            st->tls_upstream_handshakes += fig.handshakes;
            for (int k = 0; k < TLS_NFAIL; k++) {
                st->tls_upstream_failures += fig.failures[k];
            }
            st->tls_reloads += fig.reloads;
            st->tls_reload_failures += fig.reload_failures;
        }
    }
}

/* The replicas whose durability ferry enforces: the ones Sentinel lists, or
 * the cluster map's; NULL in fixed mode. */
static const replicas *enforced_replicas(ferry *f)
{
    return f->sentinel != NULL  ? sentinel_replicas(f->sentinel)
           : f->cluster != NULL ? clustermap_replicas(f->cluster)
                                : NULL;
}

/* f->stats plus the live values, computed now from the context. */
void stats_take(ferry *f, ferry_stats *st)
{
    const upstream *up = f->up;
    uint64_t now = uv_now(f->loop);
    uv_timeval64_t tv;
    char host[256];
    size_t hlen = sizeof(host);

    worker_view views[CONFIG_MAX_WORKERS];

    *st = f->stats;
    int nloops = workers_stats(f, st, views, CONFIG_MAX_WORKERS); /* the main loop first */
    st->workers = (uint64_t)nloops;
    st->worker_loops = (uint64_t)nloops;
    for (int i = 0; i < nloops; i++) {
        st->curr_connections += views[i].clients;
        st->clients_paused += views[i].clients_paused;
        st->held_bytes += views[i].held_bytes;
        st->memory_clients += views[i].memory;
        st->links_open += views[i].links;
        st->pool_idle += views[i].pool;
    }
    if (uv_gettimeofday(&tv) != 0) {
        tv.tv_sec = 0;
    }
    if (uv_os_gethostname(host, &hlen) != 0) {
        snprintf(host, sizeof(host), "unknown");
    }
    snprintf(st->service, sizeof(st->service), "ferry");
    text_set(st->source, host);
    text_set(st->version, FERRY_VERSION);
    text_set(st->instance, instance_own_name(f));
    st->uptime = (now - f->started_ms) / 1000;
    st->timestamp = (uint64_t)tv.tv_sec;
    st->total_connections = st->clients_total;
    stats_limits(f, st);
    stats_tls(f, st);
    st->sentinels_configured = (uint64_t)f->cfg->nsentinels;
    outage_stats(f, st);
    const replicas *rs = enforced_replicas(f);
    if (rs != NULL) {
        st->replicas_known = (uint64_t)replicas_count(rs);
        st->replicas = st->replicas_known;
        for (int i = 0; i < replicas_count(rs); i++) {
            replica_view v;
            replicas_get(rs, i, &v);
            st->replicas_enforced += (uint64_t)(v.enforced != 0);
        }
    }
    if (f->sentinel != NULL) {
        st->sentinels_known = (uint64_t)sentinel_known(f->sentinel);
        st->sentinels_reachable = (uint64_t)sentinel_reachable(f->sentinel);
        st->sentinel_quorum_ok = (uint64_t)sentinel_quorum_ok(f->sentinel);
    }
    queue_sampler_view qv;
    queues_sampler(f, &qv);
    st->consumers_paused = (uint64_t)lease_npaused(f, uv_now(f->loop));
    st->queue_keys_tracked = (uint64_t)queues_nkeys(f);
    st->queue_keys = st->queue_keys_tracked;
    st->queues = (uint64_t)f->cfg->nqueues;
    st->queue_sampling = (uint64_t)qv.active;
    st->queue_sample_rounds = qv.rounds;
    st->queue_keys_probed = qv.keys_probed;
    snprintf(st->upstream_state, sizeof(st->upstream_state), "DOWN");
    if (up == NULL) {
        return;
    }
    int is_up = up->state == UP_UP;
    st->upstream_up = (uint64_t)is_up;
    text_set(st->upstream_state, upstream_state_name(up->state));
    text_set(st->master_addr, upstream_name(up));
    st->epoch = up->epoch;
    st->connected_since = is_up ? unix_of(now, up->up_since_ms, tv.tv_sec) : 0;
    st->down_for_ms = is_up ? 0 : now - up->down_since_ms;
    st->failovers = up->switches;
    st->failover_last_ms = up->last_switch_ms;
    st->failover_longest_ms = up->longest_switch_ms;
    text_set(st->failover_last_reason, up->last_reason);
    st->replicas_ack = up->replicas_ack > 0 ? (uint64_t)up->replicas_ack : 0;
    st->aof_enforced = (uint64_t)(up->aof_ok != 0);
    st->aof_enforced_since = up->aof_ok ? unix_of(now, up->aof_since_ms, tv.tv_sec) : 0;
    text_set(st->durability_last_error, up->aof_error);
    text_set(st->master_replid, up->replid_epoch == up->epoch ? up->replid : "");
    stats_cluster_summary(f, st, now, tv.tv_sec);
}

static void json_histogram(buf *b, const stats_histogram *h)
{
    char le[32];
    uint64_t cum = 0;
    stats_printf(b, "{\"count\":%llu,\"sum_seconds\":%.6f,\"buckets\":{",
                 (unsigned long long)h->count, (double)h->sum_us / 1e6);
    for (int i = 0; i < STATS_NBUCKETS; i++) {
        cum += h->bucket[i];
        bucket_label(le, sizeof(le), i);
        stats_printf(b, "%s\"%s\":%llu", i > 0 ? "," : "", le, (unsigned long long)cum);
    }
    buf_append_str(b, "}}");
}

/* The replicas whose durability ferry enforces, one object each. */
static void json_replicas(ferry *f, buf *b)
{
    const replicas *rs = enforced_replicas(f);
    uint64_t now = uv_now(f->loop);
    uv_timeval64_t tv;
    if (uv_gettimeofday(&tv) != 0) {
        tv.tv_sec = 0;
    }
    buf_append_str(b, "[");
    for (int i = 0; i < replicas_count(rs); i++) {
        replica_view v;
        replicas_get(rs, i, &v);
        uint64_t since = v.enforced ? unix_of(now, v.enforced_since_ms, tv.tv_sec) : 0;
        buf_append_str(b, i > 0 ? ",{\"addr\":" : "{\"addr\":");
        json_string(b, v.addr);
        stats_printf(b, ",\"enforced\":%s,\"enforced_since\":%llu,\"last_error\":",
                     v.enforced ? "true" : "false", (unsigned long long)since);
        json_string(b, v.last_error);
        buf_append_str(b, "}");
    }
    buf_append_str(b, "]");
}

/* Unix time in ms of the uv_now() instant then_ms. */
static uint64_t unix_ms_of(const ferry *f, uint64_t then_ms)
{
    uv_timeval64_t tv;
    if (uv_gettimeofday(&tv) != 0) {
        return 0;
    }
    uint64_t unix_now = (uint64_t)tv.tv_sec * 1000 + (uint64_t)tv.tv_usec / 1000;
    uint64_t ago = uv_now(f->loop) - then_ms;
    return unix_now > ago ? unix_now - ago : 0;
}

/* The ring of recent switches of the master view, oldest first. */
/* Switch records, for sorting by start. */
static int recent_cmp(const void *a, const void *b)
{
    const switch_record *x = *(const switch_record *const *)a;
    const switch_record *y = *(const switch_record *const *)b;
    return x->start_ms < y->start_ms ? -1 : x->start_ms > y->start_ms;
}

/* Adds the switches recorded by up (oldest first) to out[*n...]. */
static void recent_of(const upstream *up, const switch_record **out, size_t *n)
{
    uint64_t nr = up != NULL ? up->nrecent : 0;
    uint64_t first = nr > UPSTREAM_RECENT_SWITCHES ? nr - UPSTREAM_RECENT_SWITCHES : 0;
    for (uint64_t i = first; i < nr; i++) {
        out[(*n)++] = &up->recent[i % UPSTREAM_RECENT_SWITCHES];
    }
}

/* The last switches of the master view (cluster mode: of every shard's,
 * by start), oldest first. */
static void json_recent(ferry *f, buf *b)
{
    int nviews = f->cluster != NULL ? clustermap_nshards(f->cluster) : 0;
    const switch_record **rec =
        xmalloc(((size_t)nviews + 1) * UPSTREAM_RECENT_SWITCHES * sizeof(*rec));
    size_t n = 0;
    if (f->cluster == NULL) {
        recent_of(f->up, rec, &n);
    }
    for (int i = 0; i < nviews; i++) {
        recent_of(clustermap_view(f->cluster, i), rec, &n);
    }
    if (f->cluster != NULL) {
        qsort(rec, n, sizeof(*rec), recent_cmp);
    }
    size_t first = n > UPSTREAM_RECENT_SWITCHES ? n - UPSTREAM_RECENT_SWITCHES : 0;
    uint64_t now = uv_now(f->loop);
    buf_append_str(b, "[");
    for (size_t i = first; i < n; i++) {
        const switch_record *sw = rec[i];
        uint64_t end = sw->end_ms != 0 ? sw->end_ms : now;
        stats_printf(b,
                     "%s{\"start\":%llu,\"end\":%llu,\"duration_ms\":%llu,\"went_down\":%s,"
                     "\"reason\":",
                     i > first ? "," : "", (unsigned long long)unix_ms_of(f, sw->start_ms),
                     (unsigned long long)(sw->end_ms != 0 ? unix_ms_of(f, sw->end_ms) : 0),
                     (unsigned long long)(end - sw->start_ms), sw->went_down ? "true" : "false");
        json_string(b, sw->reason);
        buf_append_str(b, ",\"from\":");
        json_string(b, sw->from);
        buf_append_str(b, ",\"to\":");
        json_string(b, sw->to);
        buf_append_str(b, "}");
    }
    buf_append_str(b, "]");
    free(rec);
}

/* Sum of the sampled lengths of entry q's keys. */
static uint64_t queue_length(const ferry *f, int q)
{
    uint64_t sum = 0;
    queue_key_view v;
    for (size_t i = 0; queues_key(f, i, &v); i++) {
        sum += v.queue == q ? v.length : 0;
    }
    return sum;
}

/* The entries of queues: with their counters and summed lengths. */
static void json_queues(ferry *f, const ferry_stats *st, buf *b)
{
    const config *cfg = f->cfg;
    buf_append_str(b, "[");
    for (int q = 0; q < cfg->nqueues; q++) {
        buf_append_str(b, q > 0 ? ",{\"keys\":[" : "{\"keys\":[");
        for (int g = 0; g < cfg->queues[q].nkeys; g++) {
            if (g > 0) {
                buf_append_str(b, ",");
            }
            json_string(b, cfg->queues[q].keys[g]);
        }
        stats_printf(b,
                     "],\"pushes\":%llu,\"pops\":%llu,\"length\":%llu,\"max_length\":%llu,"
                     "\"refused_full\":%llu,\"held_full\":%llu,\"lease_expired\":%llu,"
                     "\"dead_lettered\":%llu,\"lease_orphans\":%llu}",
                     (unsigned long long)st->queue_pushes[q], (unsigned long long)st->queue_pops[q],
                     (unsigned long long)queue_length(f, q),
                     (unsigned long long)cfg->queues[q].max_length,
                     (unsigned long long)st->queue_refused_full[q],
                     (unsigned long long)st->queue_held_full[q],
                     (unsigned long long)st->queue_lease_expired[q],
                     (unsigned long long)st->queue_dead_lettered[q],
                     (unsigned long long)st->queue_lease_orphans[q]);
    }
    buf_append_str(b, "]");
}

/* Every key sampled, with its length. */
static void json_queue_keys(ferry *f, buf *b)
{
    uint64_t now = uv_now(f->loop);
    queue_key_view v;
    buf_append_str(b, "[");
    for (size_t i = 0; queues_key(f, i, &v); i++) {
        buf_append_str(b, i > 0 ? ",{\"key\":" : "{\"key\":");
        json_string(b, v.key);
        stats_printf(b,
                     ",\"queue\":%d,\"type\":\"%s\",\"length\":%llu,\"age_ms\":%llu,"
                     "\"store_rows\":%llu}",
                     v.queue, v.type, (unsigned long long)v.length,
                     (unsigned long long)(v.sampled_ms != 0 ? now - v.sampled_ms : 0),
                     (unsigned long long)outage_key_rows(f, v.key, strlen(v.key)));
    }
    buf_append_str(b, "]");
}

/* Every event loop, the main one first, as of its last tick. */
/* Each listen_tls address' own TLS figures. */
static void json_tls_listeners(ferry *f, buf *b)
{
    buf_append_str(b, "[");
    for (int i = 0; f->tls != NULL && f->tls->clients != NULL && i < f->cfg->nlisten_tls; i++) {
        tls_figures fig;
        char addr[320];
        tls_conf_listener_figures(f->tls->clients, i, &fig);
        buf_append_str(b, i > 0 ? ",{\"address\":" : "{\"address\":");
        json_string(b, config_addr_str(&f->cfg->listen_tls[i], addr, sizeof(addr)));
        stats_printf(b, ",\"handshakes\":%llu,\"sessions_resumed\":%llu,\"failed\":{",
                     (unsigned long long)fig.handshakes, (unsigned long long)fig.resumed);
        for (int k = 0; k < TLS_NFAIL; k++) {
            stats_printf(b, "%s\"%s\":%llu", k > 0 ? "," : "", tls_fail_name((tls_fail)k),
                         (unsigned long long)fig.failures[k]);
        }
        buf_append_str(b, "}}");
    }
    buf_append_str(b, "]");
}

static void json_loops(ferry *f, buf *b)
{
    worker_view views[CONFIG_MAX_WORKERS];
    int n = workers_stats(f, NULL, views, CONFIG_MAX_WORKERS);
    buf_append_str(b, "[");
    for (int i = 0; i < n; i++) {
        const worker_view *v = &views[i];
        stats_printf(b,
                     "%s{\"clients\":%llu,\"commands_total\":%llu,\"held_bytes\":%llu,"
                     "\"links_open\":%llu,\"upstream_up\":%s,\"epoch\":%llu,\"master\":",
                     i > 0 ? "," : "", (unsigned long long)v->clients,
                     (unsigned long long)v->commands, (unsigned long long)v->held_bytes,
                     (unsigned long long)v->links, v->up ? "true" : "false",
                     (unsigned long long)v->epoch);
        json_string(b, v->master);
        buf_append_str(b, "}");
    }
    buf_append_str(b, "]");
}

void stats_render_json(ferry *f, buf *out)
{
    ferry_stats *st = xmalloc(sizeof(*st));
    const char *section = "top";
    int first = 1;

    stats_take(f, st);
    buf_append_str(out, "{");
    for (size_t i = 0; i < STATS_NDESC; i++) {
        const stat_desc *d = &stat_descs[i];
        if (strcmp(d->section, section) != 0) {
            if (strcmp(section, "top") != 0) {
                buf_append_str(out, "}");
            }
            section = d->section;
            buf_append_str(out, ",");
            json_string(out, section);
            buf_append_str(out, ":{");
            first = 1;
        }
        if (!first) {
            buf_append_str(out, ",");
        }
        first = 0;
        json_string(out, d->name);
        buf_append_str(out, ":");
        switch (d->type) {
        case STAT_COUNTER:
        case STAT_GAUGE:
        case STAT_MSEC:
            stats_printf(out, "%llu", (unsigned long long)stat_num(st, d));
            break;
        case STAT_BOOL:
            buf_append_str(out, stat_num(st, d) ? "true" : "false");
            break;
        case STAT_TEXT:
            json_string(out, stat_text(st, d));
            break;
        case STAT_HISTOGRAM:
            json_histogram(out, stat_hist(st, d));
            break;
        case STAT_NODES: /* durability.replicas, worker_loops, failover.recent, queues */
            if (strcmp(d->name, "worker_loops") == 0) {
                json_loops(f, out);
            } else if (strcmp(d->name, "recent") == 0) {
                json_recent(f, out);
            } else if (strcmp(d->name, "queues") == 0) {
                json_queues(f, st, out);
            } else if (strcmp(d->name, "queue_keys") == 0) {
                json_queue_keys(f, out);
            } else if (strcmp(d->name, "tls_listeners") == 0) {
                json_tls_listeners(f, out);
            } else {
                json_replicas(f, out);
            }
            break;
        }
    }
    if (strcmp(section, "top") != 0) {
        buf_append_str(out, "}");
    }
    if (f->cluster != NULL) {
        buf_append_str(out, ",");
        clustermap_json(f->cluster, out);
    }
    buf_append_str(out, "}\n");
    free(st);
}

/* TEXT entries descs[i..] sharing a Prometheus name: one info gauge whose
 * labels are their values. Returns the index after the run. */
static size_t prom_info(buf *b, const ferry_stats *st, size_t i)
{
    const stat_desc *d0 = &stat_descs[i];
    size_t j = i;
    buf help;

    buf_init(&help);
    buf_append_str(&help, "Always 1; text stats as labels:");
    while (j < STATS_NDESC && stat_descs[j].type == STAT_TEXT &&
           strcmp(stat_descs[j].prom, d0->prom) == 0) {
        stats_printf(&help, "%s %s: %s", j > i ? ";" : "", stat_descs[j].name, stat_descs[j].help);
        j++;
    }
    buf_append(&help, "", 1);
    stats_prom_header(b, d0->prom, help.data, "gauge");
    buf_free(&help);
    stats_printf(b, "%s{", d0->prom);
    for (size_t k = i; k < j; k++) {
        stats_printf(b, "%s%s=\"", k > i ? "," : "", stat_descs[k].name);
        stats_prom_escape(b, stat_text(st, &stat_descs[k]), 1);
        buf_append_str(b, "\"");
    }
    buf_append_str(b, "} 1\n");
    return j;
}

static void prom_histogram(buf *b, const stat_desc *d, const stats_histogram *h)
{
    char le[32];
    uint64_t cum = 0;
    stats_prom_header(b, d->prom, d->help, "histogram");
    for (int i = 0; i < STATS_NBUCKETS; i++) {
        cum += h->bucket[i];
        bucket_label(le, sizeof(le), i);
        stats_printf(b, "%s_bucket{le=\"%s\"} %llu\n", d->prom, le, (unsigned long long)cum);
    }
    stats_printf(b, "%s_sum %.6f\n", d->prom, (double)h->sum_us / 1e6);
    stats_printf(b, "%s_count %llu\n", d->prom, (unsigned long long)h->count);
}

/* A label value list "keys" of entry q: its globs joined by commas. */
static void prom_queue_label(buf *b, const config *cfg, int q)
{
    for (int g = 0; g < cfg->queues[q].nkeys; g++) {
        if (g > 0) {
            buf_append_str(b, ",");
        }
        stats_prom_escape(b, cfg->queues[q].keys[g], 1);
    }
}

/* A counter family with one series per entry of queues:, labelled by its keys. */
static void prom_queue_counter(buf *out, const config *cfg, const char *family, const char *help,
                               const uint64_t *counts)
{
    stats_prom_header(out, family, help, "counter");
    for (int q = 0; q < cfg->nqueues; q++) {
        stats_printf(out, "%s{keys=\"", family);
        prom_queue_label(out, cfg, q);
        stats_printf(out, "\"} %llu\n", (unsigned long long)counts[q]);
    }
}

/* The queues' families: labelled, so outside the FERRY_STATS list. */
static void prom_queues(ferry *f, const ferry_stats *st, buf *out)
{
    const config *cfg = f->cfg;
    queue_key_view v;
    if (cfg->nqueues == 0) {
        return;
    }
    prom_queue_counter(out, cfg, "ferry_queue_pushes_total",
                       "push commands (LPUSH, RPUSH, ZADD, XADD, the push side of LMOVE...) on the "
                       "keys of a queues: entry through ferry",
                       st->queue_pushes);
    prom_queue_counter(
        out, cfg, "ferry_queue_pops_total",
        "pop commands (LPOP, BLPOP, ZPOPMIN, LMPOP, the pop side of LMOVE...) on the "
        "keys of a queues: entry through ferry",
        st->queue_pops);
    prom_queue_counter(out, cfg, "ferry_queue_refused_full_total",
                       "pushes answered -QFULL: they would have taken a list of a queues: entry "
                       "past its max_length (on_full: refuse); nothing was applied",
                       st->queue_refused_full);
    prom_queue_counter(out, cfg, "ferry_queue_held_full_total",
                       "times a push found a list of a queues: entry with on_full: block at its "
                       "max_length and was held to be tried again",
                       st->queue_held_full);
    prom_queue_counter(out, cfg, "ferry_queue_lease_expired_total",
                       "leases of a queues: entry expired by this ferry (the item back in its "
                       "queue, or dead-lettered past max_attempts)",
                       st->queue_lease_expired);
    prom_queue_counter(out, cfg, "ferry_queue_dead_lettered_total",
                       "items of a queues: entry moved to its dead_letter by this ferry",
                       st->queue_dead_lettered);
    stats_prom_header(
        out, "ferry_queue_length",
        "length of a queue key (LLEN, ZCARD or XLEN) when ferry last sampled it on the master",
        "gauge");
    for (size_t i = 0; queues_key(f, i, &v); i++) {
        buf_append_str(out, "ferry_queue_length{queue=\"");
        stats_prom_escape(out, v.key, 1);
        buf_append_str(out, "\",keys=\"");
        prom_queue_label(out, cfg, v.queue);
        stats_printf(out, "\"} %llu\n", (unsigned long long)v.length);
    }
}

void stats_render_prometheus(ferry *f, buf *out)
{
    ferry_stats *st = xmalloc(sizeof(*st));
    size_t i = 0;

    stats_take(f, st);
    while (i < STATS_NDESC) {
        const stat_desc *d = &stat_descs[i];
        if (d->prom[0] == '\0') {
            i++;
            continue;
        }
        switch (d->type) {
        case STAT_TEXT:
            i = prom_info(out, st, i);
            continue;
        case STAT_COUNTER:
            stats_prom_header(out, d->prom, d->help, "counter");
            stats_printf(out, "%s %llu\n", d->prom, (unsigned long long)stat_num(st, d));
            break;
        case STAT_GAUGE:
        case STAT_BOOL:
            stats_prom_header(out, d->prom, d->help, "gauge");
            stats_printf(out, "%s %llu\n", d->prom, (unsigned long long)stat_num(st, d));
            break;
        case STAT_MSEC:
            stats_prom_header(out, d->prom, d->help, "gauge");
            stats_printf(out, "%s %.3f\n", d->prom, (double)stat_num(st, d) / 1000.0);
            break;
        case STAT_HISTOGRAM:
            prom_histogram(out, d, stat_hist(st, d));
            break;
        case STAT_NODES:
            break; /* JSON only */
        }
        i++;
    }
    prom_queues(f, st, out);
    stats_cluster_prometheus(f, out);
    free(st);
}

void stats_describe(FILE *out)
{
    for (size_t i = 0; i < STATS_NDESC; i++) {
        const stat_desc *d = &stat_descs[i];
        char path[96];
        if (strcmp(d->section, "top") == 0) {
            snprintf(path, sizeof(path), "%s", d->name);
        } else {
            snprintf(path, sizeof(path), "%s.%s", d->section, d->name);
        }
        fprintf(out, "%-36s %-9s %-54s %s\n", path, stats_type_name(d->type),
                d->prom[0] != '\0' ? d->prom : "-", d->help);
    }
    stats_cluster_describe(out);
}
