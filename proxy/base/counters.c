/* counters.c - the counting half of stats: what the stack calls to count a
 * command, a reply's latency, the held bytes' peak, and the sum of every
 * loop's figures. stats.c reads and serves them; this file calls nothing
 * but the command table's classes, so any layer may count. */
#include <stdint.h>

#include "command.h"
#include "stats.h"

const uint64_t stats_bucket_us[STATS_NBUCKETS - 1] = {
    100,   250,    500,    1000,   2500,    5000,    10000,   25000,
    50000, 100000, 250000, 500000, 1000000, 2500000, 5000000, 10000000};

void stats_count_command(ferry_stats *st, const struct command *cmd)
{
    if (cmd == NULL) {
        st->class_unknown++;
        return;
    }
    switch (cmd->cls) {
    case CMD_STATELESS:
        st->class_stateless++;
        break;
    case CMD_BLOCKING:
        st->class_blocking++;
        break;
    case CMD_PUBSUB:
        st->class_pubsub++;
        break;
    case CMD_TRANSACTION:
        st->class_transaction++;
        break;
    case CMD_CONNSTATE:
        st->class_connstate++;
        break;
    case CMD_DENIED:
        st->class_denied++;
        break;
    case CMD_LOCAL:
        st->class_local++;
        break;
    }
}

void stats_observe(stats_histogram *h, uint64_t us)
{
    int i = 0;
    while (i < STATS_NBUCKETS - 1 && us > stats_bucket_us[i]) {
        i++;
    }
    h->bucket[i]++;
    h->count++;
    h->sum_us += us;
}

void stats_observe_reply(ferry_stats *st, uint64_t born_ns, uint64_t sent_ns, uint64_t now_ns,
                         int is_error)
{
    if (is_error) {
        st->redis_errors++;
    }
    if (now_ns == 0) {
        return;
    }
    if (born_ns != 0 && now_ns >= born_ns) {
        stats_observe(&st->request_duration_seconds, (now_ns - born_ns) / 1000);
    }
    if (sent_ns != 0 && now_ns >= sent_ns) {
        stats_observe(&st->upstream_duration_seconds, (now_ns - sent_ns) / 1000);
    }
}

#define STATS_ADD_COUNTER(name) dst->name += src->name;
#define STATS_ADD_GAUGE(name)
#define STATS_ADD_MSEC(name)
#define STATS_ADD_BOOL(name)
#define STATS_ADD_TEXT(name)
#define STATS_ADD_NODES(name)
#define STATS_ADD_HISTOGRAM(name)                                                                  \
    for (int i = 0; i < STATS_NBUCKETS; i++) {                                                     \
        dst->name.bucket[i] += src->name.bucket[i];                                                \
    }                                                                                              \
    dst->name.count += src->name.count;                                                            \
    dst->name.sum_us += src->name.sum_us;
#define STATS_ADD(section, name, type, prom, help) STATS_ADD_##type(name)

void stats_add(ferry_stats *dst, const ferry_stats *src)
{
    FERRY_STATS(STATS_ADD)
    for (int i = 0; i < CONFIG_MAX_QUEUES; i++) {
        dst->queue_pushes[i] += src->queue_pushes[i];
        dst->queue_pops[i] += src->queue_pops[i];
        dst->queue_refused_full[i] += src->queue_refused_full[i];
        dst->queue_held_full[i] += src->queue_held_full[i];
        dst->queue_lease_expired[i] += src->queue_lease_expired[i];
        dst->queue_dead_lettered[i] += src->queue_dead_lettered[i];
        dst->queue_lease_orphans[i] += src->queue_lease_orphans[i];
    }
    dst->redo_kept += src->redo_kept; /* gauges of each loop's own redo (redo.c) */
    dst->redo_kept_bytes += src->redo_kept_bytes;
    dst->receipts_held += src->receipts_held; /* each loop's own receipts (receipts.c) */
    if (src->held_bytes_peak > dst->held_bytes_peak) {
        dst->held_bytes_peak = src->held_bytes_peak;
    }
}

void stats_held(ferry_stats *st, uint64_t held_bytes)
{
    if (held_bytes > st->held_bytes_peak) {
        st->held_bytes_peak = held_bytes;
    }
}
