/* router_local.h - what ferry answers itself (HELLO, AUTH) and the
 * connection settings a session carries from link to link (CLIENT SETNAME,
 * TRACKING...), for router.c's dispatch. */
#ifndef FERRY_ROUTER_LOCAL_H
#define FERRY_ROUTER_LOCAL_H

#include "link.h"
#include "session.h"
#include "upstream.h"

void router_answer_hello(session *s, request *r);
void router_answer_auth(session *s, request *r);

/* Redis accepted a connection setting (CLIENT SETNAME, TRACKING, ...):
 * kept for the session's next links. */
void router_sticky_accepted(session *s, request *r);

/* Lend s a dedicated link and restore on it the connection settings s made
 * on its earlier ones and an open MULTI being rebuilt. NULL when no master
 * is UP. */
link *router_lend(session *s, upstream *up);

#endif
