/* core.h - the context's life: start-up, the per-turn flush, the periodic
 * tick, signals, graceful shutdown. */
#ifndef FERRY_CORE_H
#define FERRY_CORE_H

#include <signal.h>

#include "ferry.h"

struct takeover;
struct tls_roles;
struct workers;

/* Set up f on loop with cfg and roles (TLS contexts; both borrowed for
 * f's life and shared with its worker loops), listen and start
 * connecting. tk (owned by f from now on, even on error) is the takeover of
 * a running ferry that takeover_connect began, or NULL. Returns 0 or a
 * negative error (logged). */
int core_init(ferry *f, uv_loop_t *loop, config *cfg, struct tls_roles *roles, struct takeover *tk);
/* Set up f as worker index (1..) of wk on its own loop: no listener,
 * stats port, signals, Sentinel client or fallback store; its own upstream
 * (with Sentinel, it connects once the main loop names a master). Its ids
 * are base_id + index + k * cfg->workers (k >= 1). Returns 0 or a negative
 * error. */
int core_init_worker(ferry *f, uv_loop_t *loop, config *cfg, struct workers *wk, int index,
                     uint64_t base_id);
/* Run until shutdown. Returns the exit code. */
int core_run(ferry *f);
/* Begin a graceful stop (what SIGTERM does). */
void core_stop(ferry *f, const char *why);
/* Close every handle of f now (the loop then ends). */
void core_close(ferry *f);
/* The signals the main loop handles (SIGTERM, SIGINT, SIGHUP) in *set. */
void core_stop_signals(sigset_t *set);
/* Main thread, before core_init: block those signals and start libuv's
 * threadpool, so that every thread started from now on (the pool, the
 * worker loops core_init starts) blocks them for its life; then
 * core_signals_here() once core_init returned: the main thread alone takes
 * them (see close_everything). */
void core_threads_without_signals(void);
void core_signals_here(void);
/* Free what outlives f's handles, once its loop has ended. */
void core_release(ferry *f);

#endif
