/* clustermap.h - ferry in cluster mode: the slot map's source (cluster/)
 * and one master view (upstream.c: UP / SWITCHING / DOWN, its links, hold,
 * fence and WAIT) per shard, created and re-pointed from the map; the
 * router asks it which shard serves a slot. It calls nothing above it. */
#ifndef FERRY_CLUSTERMAP_H
#define FERRY_CLUSTERMAP_H

#include <stdint.h>

#include "buf.h"
#include "ferry.h"

struct upstream;
typedef struct clustermap clustermap;

/* Start following the cluster of f->cfg (the first round starts at once). */
clustermap *clustermap_new(ferry *f);
/* Periodic: the source's rounds and every shard's master view. */
void clustermap_tick(clustermap *cm, uint64_t now);
/* The master view serving slot (0..16383), or, for -1 (a keyless
 * command), one that is UP (else any); NULL while no shard is known. */
struct upstream *clustermap_route(clustermap *cm, int slot);
/* A node answered MOVED slot host:port: the slot is served there from now
 * on (a master view is made for a node not seen yet) and the map is asked
 * again. */
void clustermap_moved(clustermap *cm, int slot, const char *host, int port);
/* A node answered ASK slot host:port: the view of that node (made if it is
 * not known yet; the map is unchanged), or NULL (too many views). */
struct upstream *clustermap_ask(clustermap *cm, const char *host, int port);
/* A command every master runs (broadcast.h) keeps which master views
 * replied: one bit per view ever made. */
#define CLUSTERMAP_SEEN_BYTES 64
/* The master view of the map's first shard not set in seen, NULL once
 * every shard's is (or while no map is known). */
struct upstream *clustermap_unseen(const clustermap *cm, const unsigned char *seen);
/* Set up's bit in seen. */
void clustermap_mark_seen(const clustermap *cm, const struct upstream *up, unsigned char *seen);
/* Counted for stats: a CROSSSLOT refusal. */
void clustermap_count_crossslot(clustermap *cm);
/* Ask the cluster for its map now (a master of a shard was lost). */
void clustermap_refresh(clustermap *cm, const char *why);
/* Shards whose master view is not UP; *first gets the first one's master
 * name ("" if none). */
int clustermap_not_up(const clustermap *cm, char *first, size_t len);
/* "mode":"cluster","routing":true,"cluster":{...} for the stats JSON. */
void clustermap_json(const clustermap *cm, buf *b);
/* Close the source and every shard's links; free after a loop turn. */
void clustermap_close(clustermap *cm);
void clustermap_free(clustermap *cm); /* accepts NULL */

#endif
