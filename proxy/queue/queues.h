/* queues.h - the queues: entries of the configuration (globs of keys):
 * push and pop commands through ferry counted per entry on every loop, and
 * the lengths of the matching keys sampled on the current master by the
 * main loop (SCAN MATCH/COUNT, TYPE, then LLEN, ZCARD or XLEN), a bounded
 * number of keys per round, paused while no master is UP. */
#ifndef FERRY_QUEUES_H
#define FERRY_QUEUES_H

#include <stddef.h>
#include <stdint.h>

#include "ferry.h"

/* One sampled key, as the stats port shows it. */
typedef struct queue_key_view {
    const char *key;     /* the key (NUL-terminated) */
    int queue;           /* its entry in cfg->queues */
    const char *type;    /* "list", "zset" or "stream" */
    uint64_t length;     /* its length when last sampled */
    uint64_t sampled_ms; /* uv_now() of that sample */
} queue_key_view;

/* Where the sampler is, for the stats port. */
typedef struct queue_sampler_view {
    int active;           /* a master is UP and sampling runs */
    uint64_t rounds;      /* sampling rounds run */
    uint64_t passes;      /* full SCAN passes completed over every glob */
    uint64_t keys_probed; /* keys whose TYPE and length were asked */
    uint64_t epoch;       /* the master epoch sampled last */
} queue_sampler_view;

/* The entry of cfg->queues whose globs match key[0..len), or -1. */
int queues_match(const config *cfg, const char *key, size_t len);
/* A request was classified (any loop): count it as a push or a pop of the
 * entries its keys belong to, in f->stats. */
void queues_count(ferry *f, const command *cmd, const resp_arg *argv, size_t argc);

/* Main loop: start the sampler if cfg->queues has entries. */
void queues_open(ferry *f);
/* Main loop, on every tick: start the next round when it is due. */
void queues_tick(ferry *f, uint64_t now);
/* Free the sampler (after the loop closed its links). */
void queues_free(ferry *f);

/* Keys whose length is kept, and the i-th of them (0 if i is out of range). */
size_t queues_nkeys(const ferry *f);
int queues_key(const ferry *f, size_t i, queue_key_view *v);
void queues_sampler(const ferry *f, queue_sampler_view *v);

#endif
