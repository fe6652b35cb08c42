/* keyspace.h - cluster mode: SCAN over every master, one shard after the
 * other in the order of their first slots. ferry's cursor says where the
 * scan is: bits 0-13 the first slot of the shard being read, bits 14-23 a
 * tag of the master that gave the node's cursor (its port plus a hash of
 * its host), bits 24-63 that node's cursor. A shard's first cursor is its
 * first slot alone; 0 starts the scan and ends it, as on one server.
 *
 * A failover of the shard being read gives it another master, whose
 * cursors mean nothing of the old one's: the tag no longer matches, so that
 * shard is read again from its start (its keys may come twice, none is
 * missed). A reshard during a scan may miss or repeat the keys it moves.
 * No I/O: the router calls these when a SCAN is parsed, sent and answered. */
#ifndef FERRY_KEYSPACE_H
#define FERRY_KEYSPACE_H

#include <stddef.h>

#include "buf.h"
#include "clustermap.h"
#include "ferry.h"
#include "resp.h"

struct upstream;

/* Whether r is a SCAN whose cursor ferry reads (keyspace_scan_parsed). */
int keyspace_is_scan(const request *r);
/* A SCAN parsed: r->slot the first slot of the shard its cursor names (the
 * map's first shard for 0), r->arg the cursor. A cursor that is not one
 * (not a number) leaves r->slot -1: any master answers its error. */
void keyspace_scan_parsed(const clustermap *cm, request *r, const resp_request *req);
/* r is sent to a master of view up: its cursor in r->data becomes that
 * node's (0 where the cursor was another master's). */
void keyspace_scan_sending(request *r, const struct upstream *up);
/* A node's SCAN reply (p, n) to r, from the master of view up: into *out
 * with ferry's cursor (the next shard's start once the node's cursor is 0;
 * 0 after the last shard). Returns 0 (out untouched) for a reply that is
 * not SCAN's (an error: the client gets it as it is). */
int keyspace_scan_reply(const clustermap *cm, const request *r, const struct upstream *up,
                        const char *p, size_t n, buf *out);

#endif
