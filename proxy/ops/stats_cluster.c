/* stats_cluster.c - what the stats port adds in cluster mode, from
 * FERRY_CLUSTER_STATS (stats.h) and the shards' views (clustermap.h): the
 * Prometheus families, one series per shard labelled by its first slot;
 * the master-view figures of the whole cluster; /healthz naming the shards
 * that are not UP; the page's text lines. The JSON is clustermap_json's. */
#include <stdlib.h>
#include <string.h>

#include "clustermap.h"
#include "ferry.h"
#include "outage.h"
#include "stats_int.h"

typedef struct cstat_desc {
    const char *path; /* JSON path; "cluster.shards[]." ones are per shard */
    stat_type type;   /* see stat_type */
    const char *prom; /* Prometheus name, "" = JSON only */
    const char *help; /* one line */
} cstat_desc;

#define CSTAT_DESC(path, type, prom, help) {path, STAT_##type, prom, help},

static const cstat_desc cstat_descs[] = {FERRY_CLUSTER_STATS(CSTAT_DESC)};
#define CSTAT_NDESC (sizeof(cstat_descs) / sizeof(cstat_descs[0]))
#define SHARD_PREFIX "cluster.shards[]."

void stats_cluster_describe(FILE *out)
{
    for (size_t i = 0; i < CSTAT_NDESC; i++) {
        const cstat_desc *d = &cstat_descs[i];
        fprintf(out, "%-36s %-9s %-54s %s\n", d->path, stats_type_name(d->type),
                d->prom[0] != '\0' ? d->prom : "-", d->help);
    }
}

/* ------------------------------------------------------------ Prometheus */

static const char *leaf(const cstat_desc *d)
{
    const char *dot = strrchr(d->path, '.');
    return dot != NULL ? dot + 1 : d->path;
}

static int per_shard(const cstat_desc *d)
{
    return strncmp(d->path, SHARD_PREFIX, strlen(SHARD_PREFIX)) == 0;
}

/* A shard's number named by the JSON key; -1: no value (no series). */
static int64_t shard_num(const clustermap_shard_view *v, const char *key)
{
    static const struct {
        const char *key;
        size_t off;
    } nums[] = {
        {"epoch", offsetof(clustermap_shard_view, epoch)},
        {"switches", offsetof(clustermap_shard_view, switches)},
        {"routed", offsetof(clustermap_shard_view, routed)},
        {"held", offsetof(clustermap_shard_view, held)},
        {"moved", offsetof(clustermap_shard_view, moved)},
        {"asked", offsetof(clustermap_shard_view, asked)},
        {"links", offsetof(clustermap_shard_view, links)},
        {"not_up_ms", offsetof(clustermap_shard_view, not_up_ms)},
    };
    if (strcmp(key, "up") == 0) {
        return v->up;
    }
    if (strcmp(key, "nslots") == 0) {
        return v->nslots;
    }
    if (strcmp(key, "since_switch_ms") == 0) {
        return v->since_switch_ms;
    }
    for (size_t i = 0; i < sizeof(nums) / sizeof(nums[0]); i++) {
        if (strcmp(key, nums[i].key) == 0) {
            uint64_t x;
            memcpy(&x, (const char *)v + nums[i].off, sizeof(x));
            return (int64_t)x;
        }
    }
    return -1;
}

/* The cluster's number named by the JSON key (cluster.<key>). */
static uint64_t total_num(const clustermap_totals *t, const char *key)
{
    static const struct {
        const char *key;
        size_t off;
    } nums[] = {
        {"shards", offsetof(clustermap_totals, shards)},
        {"shards_up", offsetof(clustermap_totals, shards_up)},
        {"slots_covered", offsetof(clustermap_totals, slots_covered)},
        {"rounds", offsetof(clustermap_totals, rounds)},
        {"answers", offsetof(clustermap_totals, answers)},
        {"rejected", offsetof(clustermap_totals, rejected)},
        {"unreachable", offsetof(clustermap_totals, unreachable)},
        {"changes", offsetof(clustermap_totals, changes)},
        {"slots_moved", offsetof(clustermap_totals, slots_moved)},
        {"moved_followed", offsetof(clustermap_totals, moved_followed)},
        {"ask_followed", offsetof(clustermap_totals, ask_followed)},
        {"crossslot_refused", offsetof(clustermap_totals, crossslot)},
        {"splits", offsetof(clustermap_totals, splits)},
        {"tryagain_held", offsetof(clustermap_totals, tryagain)},
        {"clusterdown_held", offsetof(clustermap_totals, clusterdown)},
        {"refresh_master_lost", offsetof(clustermap_totals, refresh_master_lost)},
        {"refresh_moved", offsetof(clustermap_totals, refresh_moved)},
        {"refresh_clusterdown", offsetof(clustermap_totals, refresh_clusterdown)},
        {"refresh_channel", offsetof(clustermap_totals, refresh_channel)},
        {"refresh_replay", offsetof(clustermap_totals, refresh_replay)},
        {"refresh_unreachable", offsetof(clustermap_totals, refresh_unreachable)},
        {"refresh_deferred", offsetof(clustermap_totals, refresh_deferred)},
        {"meta_changes", offsetof(clustermap_totals, meta_changes)},
    };
    for (size_t i = 0; i < sizeof(nums) / sizeof(nums[0]); i++) {
        if (strcmp(key, nums[i].key) == 0) {
            uint64_t x;
            memcpy(&x, (const char *)t + nums[i].off, sizeof(x));
            return x;
        }
    }
    return 0;
}

static void prom_value(buf *out, stat_type type, int64_t x)
{
    if (type == STAT_MSEC) {
        stats_printf(out, " %.3f\n", (double)x / 1000.0);
    } else {
        stats_printf(out, " %lld\n", (long long)x);
    }
}

/* TEXT entries descs[i..] sharing a Prometheus name: one info gauge, per
 * shard or for the cluster. Returns the index after the run. */
static size_t prom_info(buf *out, size_t i, const clustermap_shard_view *views, int n,
                        const clustermap_totals *t)
{
    const cstat_desc *d0 = &cstat_descs[i];
    size_t j = i;
    buf help;
    buf_init(&help);
    buf_append_str(&help, "Always 1; text stats as labels:");
    while (j < CSTAT_NDESC && cstat_descs[j].type == STAT_TEXT &&
           strcmp(cstat_descs[j].prom, d0->prom) == 0) {
        stats_printf(&help, "%s %s: %s", j > i ? ";" : "", leaf(&cstat_descs[j]),
                     cstat_descs[j].help);
        j++;
    }
    buf_append(&help, "", 1);
    stats_prom_header(out, d0->prom, help.data, "gauge");
    buf_free(&help);
    if (!per_shard(d0)) {
        stats_printf(out, "%s{", d0->prom);
        for (size_t k = i; k < j; k++) {
            stats_printf(out, "%s%s=\"", k > i ? "," : "", leaf(&cstat_descs[k]));
            stats_prom_escape(
                out, strcmp(leaf(&cstat_descs[k]), "last_error") == 0 ? t->last_error : "", 1);
            buf_append_str(out, "\"");
        }
        buf_append_str(out, "} 1\n");
        return j;
    }
    for (int s = 0; s < n; s++) {
        stats_printf(out, "%s{shard=\"%d\"", d0->prom, views[s].shard);
        for (size_t k = i; k < j; k++) {
            const char *key = leaf(&cstat_descs[k]);
            stats_printf(out, ",%s=\"", key);
            stats_prom_escape(out, strcmp(key, "master") == 0 ? views[s].master : views[s].state,
                              1);
            buf_append_str(out, "\"");
        }
        buf_append_str(out, "} 1\n");
    }
    return j;
}

void stats_cluster_prometheus(ferry *f, buf *out)
{
    if (f->cluster == NULL) {
        return;
    }
    uint64_t now = uv_now(f->loop);
    int n = clustermap_nshards(f->cluster);
    clustermap_shard_view *views = xcalloc(n > 0 ? (size_t)n : 1, sizeof(*views));
    clustermap_totals t;
    for (int s = 0; s < n; s++) {
        clustermap_shard(f->cluster, s, now, &views[s]);
    }
    clustermap_get_totals(f->cluster, &t);
    size_t i = 0;
    while (i < CSTAT_NDESC) {
        const cstat_desc *d = &cstat_descs[i];
        if (d->prom[0] == '\0') {
            i++;
            continue;
        }
        if (d->type == STAT_TEXT) {
            i = prom_info(out, i, views, n, &t);
            continue;
        }
        stats_prom_header(out, d->prom, d->help, d->type == STAT_COUNTER ? "counter" : "gauge");
        if (!per_shard(d)) {
            stats_printf(out, "%s", d->prom);
            prom_value(out, d->type, (int64_t)total_num(&t, leaf(d)));
            i++;
            continue;
        }
        for (int s = 0; s < n; s++) {
            int64_t x = shard_num(&views[s], leaf(d));
            if (x >= 0) {
                stats_printf(out, "%s{shard=\"%d\"}", d->prom, views[s].shard);
                prom_value(out, d->type, x);
            }
        }
        i++;
    }
    free(views);
}

/* ------------------------------------------------ the cluster as a whole */

/* Unix seconds of the uv_now() instant then_ms. */
static uint64_t unix_of(uint64_t now_ms, uint64_t then_ms, int64_t unix_now)
{
    uint64_t ago = now_ms >= then_ms ? (now_ms - then_ms) / 1000 : 0;
    return unix_now > 0 && (uint64_t)unix_now > ago ? (uint64_t)unix_now - ago : 0;
}

static void text_copy(char *dst, const char *src)
{
    snprintf(dst, STATS_TEXT_MAX, "%s", src);
}

void stats_cluster_summary(ferry *f, ferry_stats *st, uint64_t now, int64_t unix_now)
{
    int n = f->cluster != NULL ? clustermap_nshards(f->cluster) : 0;
    if (n == 0) {
        return; /* no map yet: the view without a master, DOWN since the start */
    }
    int all_up = 1, all_aof = 1;
    int64_t latest = -1;          /* the most recent switch: its since_switch_ms */
    uint64_t latest_up_since = 0; /* the last shard to come UP */
    const char *first_state = NULL;
    st->epoch = st->failovers = st->failover_longest_ms = st->down_for_ms = 0;
    st->failover_last_ms = 0;
    st->failover_last_reason[0] = '\0';
    for (int s = 0; s < n; s++) {
        clustermap_shard_view v;
        clustermap_shard(f->cluster, s, now, &v);
        all_up &= v.up;
        all_aof &= v.up && v.aof_ok;
        if (!v.up && first_state == NULL) {
            first_state = v.state;
        }
        if (v.up && v.up_since_ms > latest_up_since) {
            latest_up_since = v.up_since_ms;
        }
        if (v.not_up_ms > st->down_for_ms) {
            st->down_for_ms = v.not_up_ms;
        }
        st->epoch += v.view_epoch;
        st->failovers += v.switches;
        if (v.longest_ms > st->failover_longest_ms) {
            st->failover_longest_ms = v.longest_ms;
        }
        if (v.since_switch_ms >= 0 && (latest < 0 || v.since_switch_ms < latest)) {
            latest = v.since_switch_ms;
            st->failover_last_ms = v.last_switch_ms;
            text_copy(st->failover_last_reason, v.last_reason);
        }
    }
    st->upstream_up = (uint64_t)all_up;
    text_copy(st->upstream_state, all_up ? "UP" : first_state);
    st->master_addr[0] = '\0'; /* no one master: cluster.shards names each */
    st->connected_since = all_up ? unix_of(now, latest_up_since, unix_now) : 0;
    st->aof_enforced = (uint64_t)all_aof;
    if (!all_aof) {
        st->aof_enforced_since = 0;
    }
}

/* ---------------------------------------------------- /healthz, the page */

/* One line for shard v: "shard 5461 (master ...): SWITCHING for 812 ms". */
static void shard_line(buf *b, const clustermap_shard_view *v)
{
    stats_printf(b, "shard %d (master %s, %d slot(s)): %s", v->shard, v->master, v->nslots,
                 v->state);
    if (!v->up) {
        stats_printf(b, " for %llu ms", (unsigned long long)v->not_up_ms);
        if (v->last_reason[0] != '\0') {
            stats_printf(b, ": %s", v->last_reason);
        }
        if (v->held > 0) {
            stats_printf(b, "; %llu request(s) held", (unsigned long long)v->held);
        }
    }
    buf_append_str(b, "\n");
}

int stats_cluster_healthz(ferry *f, buf *body)
{
    uint64_t now = uv_now(f->loop);
    int n = clustermap_nshards(f->cluster);
    int up = 0;
    if (n == 0) {
        buf_append_str(body, "DOWN: no cluster map yet\n");
        return 503;
    }
    clustermap_shard_view *views = xcalloc((size_t)n, sizeof(*views));
    for (int s = 0; s < n; s++) {
        clustermap_shard(f->cluster, s, now, &views[s]);
        up += views[s].up;
    }
    int code = 200;
    if (up == n) {
        stats_printf(body, "OK: every shard's master is UP (%d shard(s))\n", n);
    } else if (up > 0) {
        /* Still serving the other shards: every ferry in front of the
         * cluster sees the same, so taking this one out helps nobody. */
        stats_printf(body,
                     "OK: %d of %d shard(s) UP; DEGRADED: %d shard(s) without a master, their "
                     "requests held\n",
                     up, n, n - up);
    } else {
        stats_printf(body, "DOWN: no shard's master is UP (%d shard(s))\n", n);
        code = 503;
    }
    int down = 0;
    for (int s = 0; s < n; s++) {
        if (!views[s].up) {
            shard_line(body, &views[s]);
        }
        down += strcmp(views[s].state, "DOWN") == 0;
    }
    if (f->outage != NULL && up < n) {
        /* The store takes the queue writes of the shards DOWN (cluster.md). */
        ferry_stats st;
        memset(&st, 0, sizeof(st));
        outage_stats(f, &st);
        stats_printf(body, "fallback store: %s, %llu row(s) pending%s\n",
                     down > 0 ? "taking the queue writes of the shard(s) DOWN" : "standing by",
                     (unsigned long long)st.fallback_pending,
                     st.fallback_commit_errors > 0 ? ", commit errors seen (see log)" : "");
    }
    free(views);
    return code;
}

void stats_cluster_text(ferry *f, buf *text)
{
    uint64_t now = uv_now(f->loop);
    int n = clustermap_nshards(f->cluster);
    for (int s = 0; s < n; s++) {
        clustermap_shard_view v;
        clustermap_shard(f->cluster, s, now, &v);
        stats_printf(text,
                     "shard %d: %s, master %s, %d slot(s), %llu request(s) routed, %llu held, "
                     "%llu MOVED / %llu ASK followed, %llu switch(es)\n",
                     v.shard, v.state, v.master, v.nslots, (unsigned long long)v.routed,
                     (unsigned long long)v.held, (unsigned long long)v.moved,
                     (unsigned long long)v.asked, (unsigned long long)v.switches);
    }
}
