/* takeover_wire.h - the takeover's frames and the session state they carry
 * (takeover_wire.c), shared by both ends of the conversation (takeover.c,
 * takeover_source.c). */
#ifndef FERRY_TAKEOVER_WIRE_H
#define FERRY_TAKEOVER_WIRE_H

#include <stdint.h>

#include "ferry.h"

struct session;

/* /2: a session frame ends with the Redis user it runs as (client.auth redis). */
#define TAKEOVER_MAGIC "ferry-takeover/2"
#define TAKEOVER_MAX_FDS 64 /* fds in one frame */
#define TAKEOVER_FDQ 256    /* fds received, not yet claimed by a frame */
#define TAKEOVER_HDR 8      /* frame header bytes */

enum { TK_HELLO = 1, TK_LISTENERS, TK_ACCEPTING, TK_SESSION, TK_DONE };

/* A payload being read. */
typedef struct tkw_rd {
    const char *p; /* next byte */
    size_t n;      /* bytes left */
    int bad;       /* read past the end (sticky) */
} tkw_rd;

/* What a control connection received and has not framed yet. */
typedef struct tkw_rx {
    buf rx;                /* bytes (session frames carry passwords: wiped) */
    int fdq[TAKEOVER_FDQ]; /* fds, in arrival order */
    int nfdq;
    int bad; /* the peer broke the protocol (sticky) */
} tkw_rx;

void tkw_put_u32(buf *b, uint32_t v);
void tkw_put_i64(buf *b, int64_t v);
void tkw_put_bytes(buf *b, const void *p, size_t n); /* length, then the bytes */
/* Reads past the end set r->bad and give 0 / "". */
uint32_t tkw_get_u32(tkw_rd *r);
int64_t tkw_get_i64(tkw_rd *r);
const char *tkw_get_bytes(tkw_rd *r, size_t *n); /* borrowed from the payload */
uint64_t tkw_mono_ms(void);

/* Send one frame on fd, its fds attached to its first byte, waiting at most
 * timeout_ms for room. Returns 0 or a negative uv error. */
int tkw_send(int fd, int type, const buf *payload, const int *fds, int nfds, uint64_t timeout_ms);
/* Read what fd has into in. Returns the bytes read (> 0), 0 at EOF,
 * UV_EAGAIN, or a negative uv error. */
int tkw_recv(tkw_rx *in, int fd);
/* The next complete frame: 1 (type, payload and fds filled; consume it with
 * tkw_consume), 0 when incomplete, -1 on a protocol error. */
int tkw_frame(tkw_rx *in, int *type, tkw_rd *payload, int *fds, int *nfds);
void tkw_consume(tkw_rx *in, const tkw_rd *payload);
void tkw_close_fds(const int *fds, int n);

/* Old process: append s's state to b (a TK_SESSION payload): call is the
 * blocked call to re-issue (empty if none), left what is left of its
 * timeout (0: none, -1: no call), or call is the requests the session held
 * unsent (left TKW_LEFT_UNSENT). The password of s's Redis user is last,
 * with room made first (b does not grow once it holds it; free it with
 * buf_free_secret). */
#define TKW_LEFT_UNSENT (-2)
void tkw_session(buf *b, const struct session *s, const buf *call, int64_t left, uint64_t now);

#endif
