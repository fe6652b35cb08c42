/* standin.h - ferry's own answers while no master is usable (the master
 * view DOWN: upstream_down): PING and ECHO as Redis answers them, and INFO
 * with ferry's own sections (server, clients, stats, replication, cluster,
 * and "ferry": the master view and the fallback store). Health checks then
 * see a ferry that serves, not a request held until -TRYAGAIN. */
#ifndef FERRY_STANDIN_H
#define FERRY_STANDIN_H

#include "session.h"

/* Answer r if it is PING, ECHO or INFO (INFO not for a client running as a
 * Redis ACL user: only Redis can say what that user may see). subscribed:
 * s is a RESP2 client in pub/sub, where Redis answers PING as [pong, msg]
 * and refuses ECHO and INFO. Returns 1 when r was answered, else 0 (r left
 * as it was). The caller checks that the view is DOWN and that the client
 * is authenticated. */
int standin_answer(session *s, request *r, int subscribed);

#endif
