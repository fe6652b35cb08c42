/* receipts.h - pops and pushes that survive the loss of their reply (durability.*_receipts). */
#ifndef FERRY_RECEIPTS_H
#define FERRY_RECEIPTS_H

#include "buf.h"
#include "link.h"
#include "session.h"

/* Sends r on l as its receipt move or script if it is a pop or push that gets one (1);
 * otherwise nothing is sent (0). */
int receipts_send(session *s, request *r, link *l);

/* r, a push to a bounded queue about to go as the guard script
 * (guards.c): 1 if it carries a receipt (its key appended to key; *before:
 * it went with it before, so the script looks first), else 0. */
int receipts_guarded_push(session *s, request *r, link *l, buf *key, int *before);

/* r, a command queued in its session's MULTI: noted for whether the
 * transaction can go as the receipt script at EXEC (receipts.c). */
void receipts_tx_note(session *s, const request *r);

/* r, s's EXEC sent as the receipt script, is answered and acknowledged:
 * the same transaction as it can be sent again to a promoted replica that
 * lacks it (redo.c, through shard_ops): the receipt script flagged sent
 * before, in cmd, and the DEL of the receipt it leaves, in after; 0 when
 * r did not go with its receipt. */
int receipts_tx_redo(const session *s, const request *r, buf *cmd, buf *after);

/* A reply to r that means r must go again (1): Redis lacked the script
 * (now sent as EVAL), or a blocking pop sent again found no receipt and no
 * item (now the blocking move, with the time it has left). */
int receipts_again(session *s, request *r, const char *p, size_t n);

/* A reply to r as it arrives from Redis, put as the client's command
 * answers it (1, in out): {item} from a receipt unwrapped, a blocking
 * move's item as BRPOP's [key, item]; 0: p as it is. */
int receipts_reshape(link *l, request *r, const char *p, size_t n, buf *out);

/* r's reply is final and goes to its client's output: the receipt it
 * left is deleted, on its key's master, at the flush after the reply is
 * handed to the client's socket (r's written watch); a reply never
 * written undoes the pop instead (its item back in its queue). */
void receipts_reply(ferry *f, request *r, const char *p, size_t n);
/* The same for a reply already written to its client (takeover.c): the
 * DEL at the next flush. */
void receipts_reply_sent(ferry *f, request *r, const char *p, size_t n);

/* r, a list or stream push sent with its receipt (its outcome unknown
 * while it is not answered): its receipt key appended to out (0), else -1.
 * The fallback store keeps it with the push it takes over (outage.c). */
int receipts_push_key(ferry *f, const request *r, buf *out);

/* r, a pop with its receipt, is answered by ferry itself (its timeout ran
 * out while held, -TRYAGAIN): had its move applied, the item goes back to
 * the end of its queue it came from (LMOVE from the receipt), now or, with
 * no master, at a tick once there is one. */
void receipts_undo(ferry *f, request *r);
/* s's client is gone, its requests not let go yet: each pop with its
 * receipt whose move may have applied is undone the same way (counted
 * pops_undone): its reply will never be written. A push's or a
 * transaction's receipt is deleted (the write stands). */
void receipts_client_gone(session *s);
void receipts_tick(ferry *f);
/* The receipts served before this turn deleted, in one DEL (before the links
 * flush); this turn's wait for the next, their replies written first. */
void receipts_flush(ferry *f);
void receipts_free(ferry *f);

#endif
