/* scripts.h - the Lua scripts ferry remembers (scripts.remember_max_bytes),
 * so that an EVALSHA never meets a server that lacks its script: Redis does
 * not copy its script cache to replicas, so a promoted replica, a master
 * that got the slot later, a restarted or flushed server has none.
 *
 * The memory is one per process, shared by every loop (a mutex): the body
 * of each script a client loaded through ferry (SCRIPT LOAD) or ran (EVAL,
 * EVAL_RO), by its SHA1, least recently used dropped past the bound. Each
 * link keeps which of them its server was given (l->script_marks, plain
 * memory freed with the link). For the router: */
#ifndef FERRY_SCRIPTS_H
#define FERRY_SCRIPTS_H

#include <stddef.h>

#include "buf.h"
#include "ferry.h"

struct link;
struct session;
typedef struct scripts scripts;

/* A memory bounded to max_bytes of bodies (0: it remembers nothing). */
scripts *scripts_new(size_t max_bytes);
void scripts_free(scripts *m);

/* The SHA1 of n bytes at p, as Redis names a script: 40 lowercase hex
 * digits and a NUL in out. */
void scripts_sha1_hex(const char *p, size_t n, char out[41]);

/* r (not inside a transaction) is about to be sent on l: an EVALSHA or
 * EVALSHA_RO of a script ferry remembers and l's server was not given yet
 * is preceded on l by SCRIPT LOAD of its body (its reply dropped), so the
 * client's command goes as written and finds the script. */
void scripts_ahead(struct session *s, request *r, struct link *l);
/* Redis answered r on via (p, n): a script loaded, run or flushed is
 * remembered or forgotten. Returns 1 when r is an EVALSHA answered
 * -NOSCRIPT whose script ferry knows and nothing its client sent after it
 * is in flight: it goes back to be sent again (the script loaded ahead of
 * it), once; the client never sees that NOSCRIPT. */
int scripts_on_reply(struct session *s, request *r, struct link *via, const char *p, size_t n);

/* The body of the script ferry remembers as sha (n bytes of hex) appended
 * to out (1); 0 when it remembers none. */
int scripts_body(scripts *m, const char *sha, size_t n, buf *out);
/* A script of ferry's making (body, n bytes; sha its SHA1) about to be
 * called by EVALSHA on l: SCRIPT LOAD of it queued on l first unless l's
 * server was given it (the link's marks, as for a client's script). 0 when
 * there is no memory to mark it in (m NULL): call it by EVAL. */
int scripts_load_on(scripts *m, struct link *l, const char sha[41], const char *body, size_t n);

#endif
