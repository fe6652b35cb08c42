/* clients.h - the CLIENT subcommands that name clients, answered by ferry
 * for its own clients: CLIENT ID and INFO (the client's own id and line),
 * CLIENT LIST (every client of every loop, in Redis' line format), CLIENT
 * KILL (closes ferry's clients) and CLIENT UNBLOCK (a blocked call pending
 * on Redis is unblocked there, on its dedicated link; one ferry holds is
 * answered by ferry). Other forms go to Redis as before. */
#ifndef FERRY_CLIENTS_H
#define FERRY_CLIENTS_H

#include "session.h"

/* r->arg of a request routed RT_CLIENT. */
enum { CL_NONE = 0, CL_ID, CL_INFO, CL_LIST, CL_KILL, CL_UNBLOCK };

/* Which of these ferry answers for cmd (a "client|..." entry) called with
 * argc arguments: a CL_* value, or CL_NONE (Redis answers, as before). */
int clients_classify(const command *cmd, size_t argc);
/* The name CLIENT SETNAME (or HELLO ... SETNAME) gave c, "" if none. */
void clients_session_name(const session *c, char *out, size_t len);
/* Answer r (route RT_CLIENT) now, or start asking the other loops / Redis
 * (r is then in flight, off any link, until the answer is in; resume(s) is
 * called once it is, so what s sent after it goes on). */
void clients_dispatch(session *s, request *r, void (*resume)(session *s));

/* CLIENT UNBLOCKs put off until their link's Redis id is known: asked
 * again (each tick), or answered 0 when the loop stops. */
void clients_tick(ferry *f);
void clients_free(ferry *f);

#endif
