/* receipts_int.h - internal to the receipts: a request's parts as its
 * receipt script reads them, the receipts' names and the scripts' heads
 * (receipts_view.c), used by receipts.c and receipts_tx.c, and the
 * transactions' hooks receipts.c calls (receipts_tx.c). */
#ifndef FERRY_RECEIPTS_INT_H
#define FERRY_RECEIPTS_INT_H

#include <stddef.h>
#include <stdint.h>

#include "buf.h"
#include "ferry.h"

struct link;
struct session;

extern const char ferry_receipt_pop_lua[];
extern const size_t ferry_receipt_pop_lua_len;
extern const char ferry_receipt_pop_lua_sha1[];
extern const char ferry_receipt_mpop_lua[];
extern const size_t ferry_receipt_mpop_lua_len;
extern const char ferry_receipt_mpop_lua_sha1[];
extern const char ferry_receipt_push_lua[];
extern const size_t ferry_receipt_push_lua_len;
extern const char ferry_receipt_push_lua_sha1[];
extern const char ferry_receipt_tx_lua[];
extern const size_t ferry_receipt_tx_lua_len;

/* A pop's or a push's parts, read from its multibulk bytes. */
typedef struct rcpt_view {
    const char *key, *timeout;
    size_t klen, tlen;
    const char *side;  /* a pop: "LEFT" or "RIGHT" */
    const char *count; /* a batch pop (RPOP k n, LPOP k n): its count; NULL one item */
    size_t clen;
    int zset; /* ZPOPMIN, ZPOPMAX (side "MIN" or "MAX") */
    int blocking;
    const char *push;     /* a push: its command (lpush, rpush, lpushx, rpushx, xadd); NULL a pop */
    const char *values;   /* a push: its values (XADD: all after the key), as bulk strings */
    size_t vlen, nvalues; /* their bytes and how many */
    /* A script (push "script"): EVAL's body or EVALSHA's SHA1, its keys and
     * its arguments as bulk strings, as the client sent them. */
    int script, sha;
    int multi;  /* a blocking pop of several keys (N2): keys and nkeys below */
    int shaped; /* LMPOP, BLMPOP, ZMPOP, BZMPOP: {key, {items}} (count: v->count) */
    const char *src, *keys, *args;
    size_t srclen, keyslen, argslen;
    long long nkeys, nargs;
    char tag[16]; /* cluster mode: a transaction's key, "{N}" of its slot (slot_tag_key) */
} rcpt_view;

/* BRPOP or BLPOP (of r's pops, the blocking ones start with b). */
int blocking_pop(const request *r);
/* r's parts as its receipt script reads them (0), or -1: no receipt's. */
int rcpt_of(const ferry *f, const request *r, rcpt_view *v);
/* The receipt key of r (number n) into out. */
void receipt_key(ferry *f, const rcpt_view *v, uint64_t n, buf *out);
/* The receipt of key i of a priority pop's view (each key its own). */
void multi_receipt_key(ferry *f, const rcpt_view *v, uint64_t n, long long i, buf *out);
/* A script on l: its SCRIPT LOAD queued once per link (bit: which one),
 * then EVALSHA; EVAL once Redis said it lacked it. Its head, in b. */
void rcpt_script_head(struct link *l, request *r, int bit, const char *lua, size_t lua_len,
                      const char *sha1, size_t argc, buf *b);
/* r carries a receipt now (REQ_F_RCPT, probe: REQ_F_RCPT_PROBE or 0),
 * counted in durability.receipts_held. */
void rcpt_hold(ferry *f, request *r, unsigned probe);

/* receipts_tx.c: EXEC sent as the transaction's receipt script (1), or as
 * written (0); a reply of that script as EXEC's, into out (1), else 0. */
int receipts_tx_send(struct session *s, request *r, struct link *l);
int tx_reshape(ferry *f, const char *p, size_t n, buf *out);

#endif
