/* router_int.h - internal to the router: what router_classify.c stores
 * in r->arg for router.c's dispatch to read. Nothing else includes it; the
 * contract is router.h. */
#ifndef FERRY_ROUTER_INT_H
#define FERRY_ROUTER_INT_H

/* r->arg of AUTH and HELLO: the result (bits 0-3), HELLO's protocol asked
 * (bits 4-7, 0: none) and, for a check Redis makes (client.auth redis),
 * acl.c's bits (ACL_ARG_*). */
enum { AUTH_FAIL = 0, AUTH_OK = 1, AUTH_NOPASS = 2, AUTH_REDIS = 3 };
enum {
    HELLO_OK = 0,
    HELLO_AUTH_OK = 1,
    HELLO_AUTH_FAIL = 2,
    HELLO_NOPROTO = 3,
    HELLO_BADPROTO = 4,
    HELLO_SYNTAX = 5,
    HELLO_AUTH_REDIS = 6
};

#define AUTH_RESULT(r) ((int)((r)->arg & 0xf))
/* r->arg of SELECT: the db asked (bits 0-31), the one before (bits 32-62). */
#define SELECT_DB(r) ((int)((r)->arg & 0x7fffffff))
#define HELLO_PROTO_SHIFT 4 /* r->arg of HELLO: result | protocol asked (0: none) << 4 */
#define HELLO_PROTO(r) ((int)(((r)->arg >> HELLO_PROTO_SHIFT) & 0xf))

/* r->arg of CLIENT TRACKING (RT_STICKY). */
enum { TRACK_NONE = 0, TRACK_ON, TRACK_OFF };

#endif
