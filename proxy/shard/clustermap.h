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
struct ident;
typedef struct clustermap clustermap;

/* A slot map as the main loop learned it, for the other loops (workers: N):
 * immutable once made, shared by every loop it is sent to (one copy per
 * change of the map, whatever N), freed by the last loop to let go of it.
 * gen numbers the maps the main loop sent, 1, 2, ... */
typedef struct clustermap_snap clustermap_snap;

/* What a clustermap asks of its owner (core fills it): it calls nothing
 * above it by name. */
typedef struct clustermap_ops {
    /* Main loop: a new map for the other loops; snap is borrowed for the
     * call (clustermap_snap_hold for each loop it is sent to). */
    void (*publish)(ferry *f, clustermap_snap *snap);
    /* Another loop: ask the main loop's source for the map now (a MOVED, a
     * CLUSTERDOWN, a shard's master lost); why is borrowed. */
    void (*refresh)(ferry *f, const char *why);
} clustermap_ops;

/* Main loop: start following the cluster of f->cfg (the first round starts
 * at once). */
clustermap *clustermap_new(ferry *f, const clustermap_ops *ops);
/* Another loop (a worker of workers: N): no source of its own; its master
 * views, one per shard with their own links, follow the maps leader (the
 * main loop's clustermap) sends it (clustermap_apply). */
clustermap *clustermap_new_follower(ferry *f, const clustermap_ops *ops, clustermap *leader);
/* Another loop: a map the main loop sent; the loop takes over the
 * reference (an older or equal gen is dropped). */
void clustermap_apply(clustermap *cm, clustermap_snap *snap);
clustermap_snap *clustermap_snap_hold(clustermap_snap *snap);
void clustermap_snap_release(clustermap_snap *snap); /* accepts NULL */
/* The gen of the map cm follows (main loop: of the last map it sent), 0
 * before the first. */
uint64_t clustermap_gen(const clustermap *cm);
/* Another loop: publish its per-shard figures for the main loop's stats
 * port (on its tick, and when the stats port asks). */
void clustermap_publish(clustermap *cm);
/* Periodic: the source's rounds and every shard's master view. */
void clustermap_tick(clustermap *cm, uint64_t now);
/* The master view serving slot (0..16383), or, for -1 (a keyless
 * command), of the shards whose view is UP the one with the lowest slots
 * (else that of the lowest slots); NULL while no shard is known. */
struct upstream *clustermap_route(clustermap *cm, int slot);
/* A ready shared link to the master serving key's slot (cluster mode) or
 * to f's master, as identity id (NULL: ferry's own); NULL while there is
 * none. */
struct link *clustermap_key_link(ferry *f, const char *key, size_t klen, struct ident *id,
                                 uint64_t hint, int proto);
/* A node (of view from, NULL if unknown) answered MOVED slot host:port:
 * the slot is served there from now on (a master view is made for a node
 * not seen yet) and the map is asked again. */
void clustermap_moved(clustermap *cm, struct upstream *from, int slot, const char *host, int port);
/* A node (of view from, NULL if unknown) answered ASK slot host:port: the
 * view of that node (made if it is not known yet; the map is unchanged), or
 * NULL (too many views). */
struct upstream *clustermap_ask(clustermap *cm, struct upstream *from, const char *host, int port);
/* A command every master runs (broadcast.h) keeps which master views
 * replied: one bit per view ever made. */
#define CLUSTERMAP_SEEN_BYTES 64
/* The master view of the map's first shard not set in seen, NULL once
 * every shard's is (or while no map is known). */
struct upstream *clustermap_unseen(const clustermap *cm, const unsigned char *seen);
/* Set up's bit in seen. */
void clustermap_mark_seen(const clustermap *cm, const struct upstream *up, unsigned char *seen);
/* The first slot of the shard of the map serving slot, -1 if none. */
int clustermap_first_slot(const clustermap *cm, int slot);
/* The lowest first slot of a shard of the map above slot (-1: the map's
 * first shard), -1 if none: the shards in the order of their first slots. */
int clustermap_next_first_slot(const clustermap *cm, int slot);
/* Counted for stats: a CROSSSLOT refusal. */
void clustermap_count_crossslot(clustermap *cm);
/* Counted for stats: a request split across slots (split.h). */
void clustermap_count_split(clustermap *cm);
/* Counted for stats: a node's TRYAGAIN (tryagain 1) or CLUSTERDOWN held. */
void clustermap_count_held(clustermap *cm, int tryagain);
/* Ask the cluster for its map now (a master of a shard was lost). */
void clustermap_refresh(clustermap *cm, const char *why);
/* Shards whose master view is not UP; *first gets the first one's master
 * name ("" if none). */
int clustermap_not_up(const clustermap *cm, char *first, size_t len);

/* One shard of the map as the stats port shows it. Its label is its first
 * slot: a failover keeps it (the promoted replica takes every slot of its
 * master), unlike the master's address or node id, and it is the same in
 * every ferry in front of the cluster; only a reshard that moves a shard's
 * lowest slot changes it. */
typedef struct clustermap_shard_view {
    int shard;               /* its first slot (the label) */
    char master[300];        /* "host:port" of the master the map names */
    const char *state;       /* its master view: "UP", "SWITCHING" or "DOWN" */
    int up;                  /* state is UP */
    int nslots;              /* slots it serves in the map */
    int nreplicas;           /* replicas the map lists */
    uint64_t epoch;          /* the master's config epoch */
    uint64_t switches;       /* times its master view lost its master */
    uint64_t routed;         /* client requests sent to its master (a re-send counts) */
    uint64_t held;           /* requests held now for lack of its master */
    uint64_t moved;          /* MOVED answered by its master, followed */
    uint64_t asked;          /* ASK answered by its master, followed */
    uint64_t links;          /* connections open to its master */
    int64_t since_switch_ms; /* since its last switch began; -1: never switched */
    uint64_t not_up_ms;      /* how long it has not been UP, 0 while UP */
    uint64_t up_since_ms;    /* uv_now() it last came UP (while UP) */
    uint64_t view_epoch;     /* masters its view has followed */
    uint64_t last_switch_ms; /* how long its last completed switch took */
    uint64_t longest_ms;     /* its longest completed switch */
    const char *last_reason; /* why its last switch began ("" if never; borrowed) */
    int aof_ok;              /* appendonly/appendfsync asserted on its master */
} clustermap_shard_view;

/* Shards in the map now. */
int clustermap_nshards(const clustermap *cm);
/* The master view of shard i (0 <= i < clustermap_nshards), NULL if none. */
const struct upstream *clustermap_view(const clustermap *cm, int i);
/* Shard i (0 <= i < clustermap_nshards) into *v; now is uv_now(). On the
 * main loop with workers: N, routed, held, moved, asked and links are every
 * loop's summed (each as of its last publish); the state, switches and
 * their times are the main loop's view's (every loop follows the same map). */
void clustermap_shard(const clustermap *cm, int i, uint64_t now, clustermap_shard_view *v);

/* The whole cluster for the stats port: the map source's counts and the
 * redirects followed (every loop's). */
typedef struct clustermap_totals {
    uint64_t shards;         /* shards in the map */
    uint64_t shards_up;      /* of them, with their master UP */
    uint64_t slots_covered;  /* slots with an owner */
    uint64_t rounds;         /* refresh rounds started */
    uint64_t answers;        /* trusted answers merged */
    uint64_t rejected;       /* answers refused */
    uint64_t unreachable;    /* nodes that did not answer in time */
    uint64_t changes;        /* times the map changed */
    uint64_t slots_moved;    /* slots that changed owner */
    uint64_t moved_followed; /* MOVED redirects followed */
    uint64_t ask_followed;   /* ASK redirects followed */
    uint64_t crossslot;      /* CROSSSLOT refusals */
    uint64_t splits;         /* requests split across slots (MGET, MSET, DEL...) */
    uint64_t tryagain;       /* TRYAGAIN answers held */
    uint64_t clusterdown;    /* CLUSTERDOWN answers held */
    /* Refreshes asked for, per reason (cluster.h's cluster_why), and of
     * them those left to a round under way or to the back-off. */
    uint64_t refresh_master_lost, refresh_moved, refresh_clusterdown, refresh_channel;
    uint64_t refresh_replay, refresh_unreachable, refresh_deferred;
    uint64_t meta_changes;  /* map changes that kept every slot's master (not sent to loops) */
    const char *last_error; /* why the last answer was refused, "" if none */
} clustermap_totals;
void clustermap_get_totals(const clustermap *cm, clustermap_totals *t);
/* "mode":"cluster","routing":true,"cluster":{...} for the stats JSON. */
void clustermap_json(const clustermap *cm, buf *b);
/* Close the source and every shard's links; free after a loop turn. */
/* Main loop: the replicas whose durability it enforces (replicas.h), NULL
 * on another loop. */
struct replicas;
const struct replicas *clustermap_replicas(const clustermap *cm);
void clustermap_close(clustermap *cm);
void clustermap_free(clustermap *cm); /* accepts NULL */

#endif
