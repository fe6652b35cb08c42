/* lease.h - leases and dead letters for the reliable-queue pattern
 * (queues: processing, lease_ms, max_attempts, dead_letter), kept in Redis:
 *
 *   ferry:leases:{T}:<processing>    zset: item -> deadline (ms, Redis' TIME)
 *   ferry:attempts:{T}:<processing>  hash: item -> "<attempts>:<R|L>" (the end
 *                                    of the queue it was taken from)
 *   ferry:consumer:{T}:<processing>  hash: item -> the consumer holding it
 *   ferry:consumers:{T}:failures     hash: consumer -> expired leases in a row
 *   ferry:leases:{T}:lock            the one ferry expiring T's leases (PX)
 *   ferry:leases:registry            set: the processing lists with leases
 *   ferry:consumers:paused           zset: consumer -> end of its pause
 *
 * T is the queue key's hash tag (what is between its first '{' and the next
 * '}', if not empty), else the whole queue key: every key a script touches
 * is in the queue's slot (cluster mode). The last two are written by plain
 * commands outside the scripts.
 *
 * A move (RPOPLPUSH, LMOVE, BRPOPLPUSH, BLMOVE) from a queue key into its
 * processing list that hands out an item is followed, before the client
 * gets the item, by one script that leases it if it is still in the
 * processing list. LREM on a processing list (the ack) is sent as one
 * script that removes the item and, with its last copy, its lease. The
 * main loop expires leases past their deadline, and leases items it finds in
 * a processing list without one (a ferry killed between move and lease). */
#ifndef FERRY_LEASE_H
#define FERRY_LEASE_H

#include <stddef.h>

#include "buf.h"
#include "router.h"

struct link;

/* The hash tag the companions of queue q[0..qlen) carry: *tag, its length. */
size_t lease_tag(const char *q, size_t qlen, const char **tag);
/* Append "ferry:<kind>:{T}" (T: lease_tag of q), then ":<p>" if p is not
 * NULL, to out. */
void lease_key(buf *out, const char *kind, const char *q, size_t qlen, const char *p, size_t plen);

/* Redis answered r (any client request) on link l with p[0..n): a move
 * that handed out an item from a leased queue records the lease, on l if
 * it is a shared link, else on a shared link. */
void lease_on_reply(session *s, request *r, struct link *l, const char *p, size_t n);
/* r is about to be sent on l: an LREM on a processing list is queued as
 * the ack script. Returns 1 when it was (link_send must not be called). */
int lease_send(session *s, request *r, struct link *l);

/* s's client hung up (or ferry closed it, not stopping): the leases it
 * took and did not ack (queues entries with lease_expire_on_disconnect)
 * are expired now, those still its own. Called once, as s closes. */
void lease_client_gone(session *s);
/* s goes to another ferry process (takeover): its client has not left;
 * what s took is forgotten here (the deadline still applies). */
void lease_client_handed(session *s);

/* Redis answered r (any client request) p[0..n): 1 when r is an ack sent
 * as EVALSHA that found no script (SCRIPT FLUSH): REQ_F_LEASE_EVAL is set
 * and the router sends it again (as EVAL). */
int lease_noscript(request *r, const char *p, size_t n);

/* A pop of s (a move, LPOP, RPOP, BLPOP, BRPOP) from a queue with
 * consumer_backoff while s's consumer is paused: 1 and *until (uv_now()
 * when the pause ends). */
int lease_paused(session *s, const request *r, uint64_t now, uint64_t *until);

/* Consumers this loop holds the pops of now. */
size_t lease_npaused(const ferry *f, uint64_t now);
/* Every loop: keep the paused consumers if an entry has consumer_backoff;
 * the main loop: run the expiry if an entry has processing. */
void lease_open(ferry *f);
/* Every tick: poll the paused consumers, and (main loop) an expiry round
 * when due. */
void lease_tick(ferry *f, uint64_t now);
void lease_free(ferry *f);

#endif
