/* server.h - the client listeners (TCP and unix sockets). */
#ifndef FERRY_SERVER_H
#define FERRY_SERVER_H

#include "ferry.h"

/* Bind and listen on every configured address. Returns 0, or a negative uv
 * error after logging which address failed (nothing is left open). */
int server_start(ferry *f);
/* Stop accepting (close the listeners). */
void server_stop(ferry *f);
/* Free the listener table (after the loop closed the handles). */
void server_free(ferry *f);

#endif
