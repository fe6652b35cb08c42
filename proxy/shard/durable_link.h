/* durable_link.h - durability verified on a master link (N13): CONFIG SET
 * answering OK is not proof, so INFO persistence is read around it and the
 * link carries client requests only once durable.c trusts the node. While
 * the initial AOF rewrite runs, the check is repeated every 100 ms. */
#ifndef FERRY_DURABLE_LINK_H
#define FERRY_DURABLE_LINK_H

#include "ferry.h"
#include "link.h"
#include "upstream.h"

#define DURABLE_RECHECK_FIRST_MS 10 /* first re-check (a small data set's rewrite) */
#define DURABLE_RECHECK_MS 100      /* then this period while a new link waits */
#define DURABLE_RECHECK_MAX 300     /* then the link is closed and opened again */

/* Queue INFO persistence on l just before its CONFIG SET of the durability
 * settings (queued next by the caller): it notes whether AOF was off, so
 * the rewrite that follows is known to be the initial one. */
void durable_link_before_set(link *l);

/* CONFIG SET (request set) answered OK on l: queue CONFIG REWRITE when
 * durability.persist_config asks for it, then INFO persistence, whose
 * verdict sets up->aof_ok / aof_since_ms / aof_error and, when trusted,
 * calls fence_link_verified(l). */
void durable_link_after_set(link *l, const request *set);

#endif
