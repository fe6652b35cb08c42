/* takeover.h - restarting ferry without its clients noticing. A new process
 * (`ferry --takeover PATH`) connects to the running one's takeover socket
 * (takeover.socket), receives its listening sockets and then each client
 * connection with the session state it needs, over SCM_RIGHTS; the old
 * process exits 0 once every session is handed over (or, after
 * shutdown_timeout_ms, closed after its replies as SIGTERM does). The new
 * process's side is takeover.c, the old one's takeover_source.c. */
#ifndef FERRY_TAKEOVER_H
#define FERRY_TAKEOVER_H

#include "ferry.h"

struct takeover;

/* How long the new process waits for the old one's listening sockets. */
#define TAKEOVER_HANDSHAKE_MS 10000

/* New process, before core_init: connect to the running ferry at path and
 * receive its listening sockets (blocking, at most timeout_ms). Returns a
 * new takeover for core_init, or NULL with err filled (nothing is left
 * open; the running ferry is unaffected). */
struct takeover *takeover_connect(const char *path, uint64_t timeout_ms, char *err, size_t errlen);

/* A listening socket received for the address a (ownership passes to the
 * caller), or -1 when none was received for it (bind it instead). */
int takeover_claim_listener(ferry *f, const config_addr *a);

/* After the listeners are open (core_init): the new process starts
 * receiving client connections; every process listens on takeover.socket
 * when it is configured (the new one once the handover is done). Returns 0
 * or a negative error (logged). */
int takeover_start(ferry *f);
/* The fallback store may be opened now: always, except in a new process
 * whose predecessor has not released it yet. */
int takeover_store_free(const ferry *f);
/* Periodic (core tick): the old process hands sessions over. */
void takeover_tick(ferry *f, uint64_t now);
/* The process is closing (after the fallback store was closed): the old
 * process tells the new one it is done; every handle is closed. */
void takeover_close(ferry *f);
/* Free what outlives the handles (after the loop ran them closed). */
void takeover_free(ferry *f);

/* With workers (takeover.c's header comment; takeover_source.c). A
 * worker, told by the main loop of an old process: hand this loop's
 * sessions over through relay / stop handing them over (the takeover was
 * aborted: they stay). */
struct tk_relay;
void takeover_worker_hand(ferry *f, struct tk_relay *relay);
void takeover_worker_abort(ferry *f);
/* New process, any loop: serve fd, a client received with its state frame
 * (frame[0..len), a TK_SESSION payload; its password bytes are wiped).
 * Returns 0, or -1 with fd closed. */
int takeover_adopt(ferry *f, int fd, char *frame, size_t len);

/* Tell systemd (NOTIFY_SOCKET, Type=notify) msg, e.g. "READY=1". Does
 * nothing without NOTIFY_SOCKET. */
void takeover_sd_notify(const char *msg);

#endif
