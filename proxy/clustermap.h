/* clustermap.h - ferry with a cluster: configuration, until requests are
 * routed by slot: it learns the slot map (cluster/) and shows it on the
 * stats port; clients are not served yet. */
#ifndef FERRY_CLUSTERMAP_H
#define FERRY_CLUSTERMAP_H

#include <uv.h>

#include "config.h"

/* Run on loop until SIGTERM / SIGINT. Returns the process exit code: 0
 * after a signal, 3 when the stats port cannot listen. redis_tls: redis.tls
 * (the cluster nodes are Redis nodes), NULL for plain TCP. */
struct tls_conf;
int clustermap_run(uv_loop_t *loop, const config *cfg, struct tls_conf *redis_tls);

#endif
