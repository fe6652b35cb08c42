/* xreads.h - consumer-group reads that survive the loss of their reply. */
#ifndef FERRY_XREADS_H
#define FERRY_XREADS_H

#include "buf.h"
#include "link.h"
#include "session.h"

/* r goes to l. An XREADGROUP with a '>' id sent before (its outcome lost
 * with its link, its held reply dropped, a refusal) goes as its look: sent
 * here (1). Otherwise nothing is sent (0); a first '>' read is marked. */
int xreads_send(session *s, request *r, link *l);

/* A reply to r that means r must go again (1): its look found none of the
 * consumer's entries after the ones it was handed, so the '>' read goes
 * now, as written (a blocking one with the time it has left). */
int xreads_again(session *s, request *r, const char *p, size_t n);

/* r's final reply, about to be answered: the entry ids it hands out are
 * kept (what a later look starts after). A look's reply is put as the '>'
 * read would answer it (1, in out: streams with no entry left out);
 * 0: p as it is. */
int xreads_reply(session *s, request *r, const char *p, size_t n, buf *out);

/* s closes or is handed over: its marks go. */
void xreads_forget(session *s);

#endif
