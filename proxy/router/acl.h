/* acl.h - client.auth redis: a client's AUTH (or HELLO ... AUTH) is checked
 * by Redis' ACL on a link of the user it names, and its commands then run
 * on that user's links (upstream.c keeps shared links and a pool per user).
 * With durability.replicas_ack the user must also be allowed WAIT, which
 * ferry runs after the user's writes: checked with WAIT 0 0 on the same link. */
#ifndef FERRY_ACL_H
#define FERRY_ACL_H

#include "session.h"

struct link;

#define ACL_ARG_WAIT (1LL << 8) /* r->arg: the check's WAIT 0 0 is in flight */
#define ACL_ARG_LEN_SHIFT 16    /* r->arg: bytes of the AUTH command heading r->data */

/* What acl_dispatch did with r. */
enum { ACL_SENT = 0, ACL_ANSWERED, ACL_WAIT, ACL_HOLD };

/* Append "AUTH user pass" to r->data (user "default" when NULL). Returns
 * the bytes appended. */
size_t acl_encode(request *r, const resp_arg *user, const resp_arg *pass);
/* Send r's check (the AUTH heading r->data) to a link of its user.
 * ACL_WAIT: s has requests in flight; ACL_HOLD: no master, or the user's
 * links are opening (s is woken); ACL_ANSWERED: refused at once (no master
 * for fallback.after_ms, or Redis just refused the same credentials). */
int acl_dispatch(session *s, request *r);
/* Redis answered r's check on link l. Returns 1 when the user is accepted
 * (s->ident is set; the caller answers as the command does), 0 when r was
 * answered with Redis' refusal or ferry's, or its next step was sent. */
int acl_on_reply(session *s, request *r, struct link *l, const char *p, size_t n);
/* A session taken over from another ferry process (takeover.c) goes on as
 * the Redis user it ran as there: im->user, whose links are opened with
 * im->pass when this process has none (as after a failover). Returns 0, or
 * -1 with why filled when it cannot be carried (the caller closes it): the
 * user is refused by Redis, or this configuration's client.auth differs. */
int acl_adopt(session *s, const session_import *im, char *why, size_t whylen);
/* The identity s runs as on master view up: NULL (ferry's own) when s is
 * no Redis user's; in cluster mode its user's identity on that shard's view
 * (made with the password Redis accepted, held until acl_forget). */
struct ident *acl_ident(session *s, struct upstream *up);
/* The session leaves its user (RESET, close). */
void acl_forget(session *s);

#endif
