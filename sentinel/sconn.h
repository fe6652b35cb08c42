/* sconn.h - a small RESP client connection on libuv for ferry's own talks
 * with sentinels: connect, send commands, receive each reply parsed (by
 * hiredis' reader, which reports bad input instead of asserting) in order.
 * Whatever a peer sends, the worst outcome is that the connection closes. */
#ifndef FERRY_SCONN_H
#define FERRY_SCONN_H

#include <hiredis/hiredis.h>
#include <sys/socket.h>
#include <uv.h>

typedef struct sconn sconn;

/* A reply to the command sent with `kind` (or, on a push connection, any
 * message with kind -1). The reply is freed after the call. */
typedef void (*sconn_reply_cb)(sconn *c, void *data, int kind, redisReply *r);
/* The connection is up (up = 1), or gone for good (up = 0, why says why);
 * it is freed by the loop after the 'gone' call. */
typedef void (*sconn_state_cb)(sconn *c, void *data, int up, const char *why);

struct tls_conf;

/* Start connecting to addr, over TLS with tc's settings if tc is not
 * NULL. push = 1: replies are not matched to commands (pub/sub). Returns a
 * new connection or NULL (no callback is made then). */
sconn *sconn_open(uv_loop_t *loop, const struct sockaddr *addr, struct tls_conf *tc, int push,
                  sconn_reply_cb rcb, sconn_state_cb scb, void *data);
/* Queue a command; kind comes back with its reply. Returns 0, or -1 when
 * too many replies are already due (the caller should drop the link). */
int sconn_send(sconn *c, int kind, int argc, const char *const *argv);
/* Queue a command Redis answers nothing to (CLIENT REPLY OFF, ...): no
 * reply is expected for it. Returns 0, or -1 when closing. */
int sconn_send_noreply(sconn *c, int argc, const char *const *argv);
/* Close; the state callback reports it once. Safe inside a callback. */
void sconn_close(sconn *c, const char *why);
int sconn_up(const sconn *c);
/* A string reply used as text: its bytes, or NULL when r is no string, is
 * longer than 255 bytes or holds a NUL. */
const char *sconn_reply_text(const redisReply *r);
/* In a flat field list (name, value, name, value ...: SENTINEL REPLICAS and
 * SENTINEL SENTINELS entries), the text of name's value, or NULL. */
const char *sconn_reply_field(const redisReply *fields, const char *name);

/* A TCP port written as plain digits, 1..65535, else -1 (what the
 * replies of sentinels and replicas carry). */
int sconn_parse_port(const char *s);

#endif
