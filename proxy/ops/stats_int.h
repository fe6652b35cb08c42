/* stats_int.h - shared inside the stats module (stats.c, stats_port.c,
 * stats_cluster.c, stats_out.c): output helpers, the snapshot, and what
 * cluster mode adds to the stats port. */
#ifndef FERRY_STATS_INT_H
#define FERRY_STATS_INT_H

#include <stdint.h>
#include <stdio.h>

#include "buf.h"
#include "stats.h"

/* stats.c: every figure of f now (what /stats, /metrics and the page show). */
void stats_take(struct ferry *f, ferry_stats *st);

/* stats_out.c: printf onto b (grows it). */
void stats_printf(buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* s escaped for Prometheus: a HELP text, or (label) a label value. */
void stats_prom_escape(buf *b, const char *s, int label);
/* The # HELP and # TYPE lines of a family. */
void stats_prom_header(buf *b, const char *family, const char *help, const char *type);

/* stats_out.c: a stat type as --describe-stats names it. */
const char *stats_type_name(stat_type t);

/* stats_cluster.c: FERRY_CLUSTER_STATS as --describe-stats lines. */
void stats_cluster_describe(FILE *out);
/* The cluster families of /metrics; nothing unless f is in cluster mode. */
void stats_cluster_prometheus(struct ferry *f, buf *out);
/* Cluster mode: the master-view figures of st (upstream_*, failovers,
 * AOF) for the cluster as a whole, once a map is known: UP while every
 * shard's master is UP. now: uv_now(); unix_now: seconds. */
void stats_cluster_summary(struct ferry *f, ferry_stats *st, uint64_t now, int64_t unix_now);
/* Cluster mode: the /healthz body; returns the HTTP status. */
int stats_cluster_healthz(struct ferry *f, buf *body);
/* Cluster mode: one line per shard for the page's text summary. */
void stats_cluster_text(struct ferry *f, buf *text);

#endif
