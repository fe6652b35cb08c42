/* core.h - the context's life: start-up, the per-turn flush, the periodic
 * tick, signals, graceful shutdown. */
#ifndef FERRY_CORE_H
#define FERRY_CORE_H

#include "ferry.h"

/* Set up f on loop with cfg (borrowed for f's life), listen and start
 * connecting. Returns 0 or a negative error (logged). */
int core_init(ferry *f, uv_loop_t *loop, config *cfg);
/* Run until shutdown. Returns the exit code. */
int core_run(ferry *f);
/* Begin a graceful stop (what SIGTERM does). */
void core_stop(ferry *f, const char *why);

#endif
