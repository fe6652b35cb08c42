/* core.h - the context's life: start-up, the per-turn flush, the periodic
 * tick, signals, graceful shutdown. */
#ifndef FERRY_CORE_H
#define FERRY_CORE_H

#include "ferry.h"

struct takeover;

/* Set up f on loop with cfg (borrowed for f's life), listen and start
 * connecting. tk (owned by f from now on, even on error) is the takeover of
 * a running ferry that takeover_connect began, or NULL. Returns 0 or a
 * negative error (logged). */
int core_init(ferry *f, uv_loop_t *loop, config *cfg, struct takeover *tk);
/* Run until shutdown. Returns the exit code. */
int core_run(ferry *f);
/* Begin a graceful stop (what SIGTERM does). */
void core_stop(ferry *f, const char *why);

#endif
