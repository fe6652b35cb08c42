/* cluster_conn.h - cluster mode: the slot of commands whose keys Redis
 * finds by its own rules (XREAD, XREADGROUP, BLMPOP, BZMPOP, LMPOP,
 * ZMPOP), and the client name ferry keeps itself (CLIENT SETNAME,
 * CLIENT GETNAME). */
#ifndef FERRY_CLUSTER_CONN_H
#define FERRY_CLUSTER_CONN_H

#include "command.h"
#include "resp.h"
#include "session.h"

#define MOVABLE_NONE (-3)  /* not a command this file finds keys of */
#define MOVABLE_CROSS (-2) /* keys in two slots */

/* The slot of cmd's keys in req; -1 when none can be found (an argument
 * error any master answers as a node would), MOVABLE_CROSS, MOVABLE_NONE. */
int cluster_movable_slot(const command *cmd, const resp_request *req);

/* CLIENT SETNAME and CLIENT GETNAME answered by ferry: the name is kept
 * with the client's connection settings (replayed on a link lent to it).
 * Returns 1 with the reply in r->reply (route RT_ERROR), 0 for any other
 * command. */
int cluster_client_name(session *s, request *r, const resp_request *req);

#endif
