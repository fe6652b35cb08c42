/* buf.h - growable byte buffers with a read cursor, and the double-buffered
 * output queue every socket uses (one buffer filling while the other is
 * being written by libuv, which needs it intact until the write callback;
 * the second lives with the write request, so an idle socket has neither). */
#ifndef FERRY_BUF_H
#define FERRY_BUF_H

#include <stddef.h>
#include <uv.h>

typedef struct buf {
    char *data; /* heap storage, NULL when empty and never used */
    size_t pos; /* first unconsumed byte */
    size_t len; /* end of valid bytes */
    size_t cap; /* bytes allocated */
} buf;

/* Unconsumed bytes. */
static inline size_t buf_used(const buf *b)
{
    return b->len - b->pos;
}

static inline char *buf_head(const buf *b)
{
    return b->data + b->pos;
}

void buf_init(buf *b);
void buf_free(buf *b);
/* Make room for n more bytes after len (compacting consumed bytes first). */
void buf_reserve(buf *b, size_t n);
/* As buf_reserve, for bytes that may hold a password: no copy of them is
 * left behind (a compaction wipes what it moved from, a growth wipes the
 * block it leaves). */
void buf_reserve_secret(buf *b, size_t n);
/* As buf_free, wiping every byte of the storage first. */
void buf_free_secret(buf *b);
void buf_append(buf *b, const void *p, size_t n);
void buf_append_str(buf *b, const char *s);
/* RESP encoding: "<type><n>\r\n" (type '*' or '$'), one bulk string, and a
 * whole command from NUL-terminated arguments. */
void buf_append_count(buf *b, char type, size_t n);
/* n's decimal digits written backwards, ending just before end; returns
 * where they start (room: 20 bytes). */
char *buf_digits(char *end, unsigned long long n);
void buf_append_bulk(buf *b, const void *p, size_t n);
void buf_append_argv(buf *b, int argc, const char *const *argv);
/* Consume n bytes from the front; resets to empty when all are consumed. */
void buf_consume(buf *b, size_t n);
void buf_clear(buf *b);
/* Drop the storage if it grew past keep bytes (so idle objects stay small). */
void buf_shrink(buf *b, size_t keep);

struct tls;

/* A write handed to libuv and the bytes it writes. Allocated by the first
 * write that does not complete at once; kept while more is queued (its
 * storage serves the next write), freed when the queue drains. */
typedef struct outq_write {
    uv_write_t req;    /* libuv's request (req.data: the stream's own) */
    buf busy;          /* bytes being written (with TLS: their ciphertext) */
    size_t busy_plain; /* TLS: plaintext bytes whose ciphertext is in busy */
    int active;        /* req is in flight */
} outq_write;

typedef struct outq {
    buf fill;         /* bytes queued, not yet handed to libuv */
    struct tls *tls;  /* the connection's TLS session (owned: freed with the queue), or NULL */
    outq_write *w;    /* the write in progress, or storage kept for the next; NULL: none */
    uint64_t written; /* bytes written to the socket so far (writes that ended) */
} outq;

void outq_init(outq *q);
void outq_free(outq *q);
static inline size_t outq_len(const outq *q)
{
    const outq_write *w = q->w;
    if (w == NULL) {
        return buf_used(&q->fill);
    }
    return buf_used(&q->fill) + (q->tls != NULL ? w->busy_plain : buf_used(&w->busy));
}
/* A write is in flight (libuv will call its callback). */
static inline int outq_writing(const outq *q)
{
    return q->w != NULL && q->w->active;
}
/* Bytes of storage the queue holds, as allocated. */
static inline size_t outq_mem(const outq *q)
{
    return q->fill.cap + (q->w != NULL ? sizeof(*q->w) + q->w->busy.cap : 0);
}
/* The stream's byte count once everything queued is written: a byte queued
 * now is written when outq_sent reaches this. */
static inline uint64_t outq_end(const outq *q)
{
    return q->written + outq_len(q);
}
/* Bytes of the stream handed to the kernel so far, the part of the write in
 * flight libuv has written included. */
uint64_t outq_sent(const outq *q, const uv_stream_t *stream);
/* What outq_flush did (or a negative uv error, with cb not called). */
enum {
    OUTQ_STARTED = 0, /* a write is in flight: cb will be called */
    OUTQ_IDLE = 1,    /* nothing started: nothing queued, or a write already in flight */
    OUTQ_WRITTEN = 2, /* everything queued was written at once: no cb; storage freed */
};
/* Write what is queued if no write is in flight: first directly
 * (uv_try_write), what the socket did not take with uv_write. */
int outq_flush(outq *q, uv_stream_t *stream, uv_write_cb cb);
/* Call from the write callback with its status (once it no longer needs
 * its uv_write_t, which this frees): marks the write done, counts its bytes
 * written if status is 0, drops them, and frees both buffers' storage when
 * nothing more is queued. */
void outq_done(outq *q, int status);

/* TLS on a stream whose output is q (q->tls set). The read callback got
 * n ciphertext bytes at p (they may lie at in's end, where its alloc
 * callback pointed: they are taken before in grows): the plaintext they
 * complete is appended to in. Returns 0, or TLS_ERR / TLS_EOF (tls_error
 * says why). Afterwards the session may have output of
 * its own (handshake, tickets) or may now take queued plaintext:
 * outq_tls_wants_flush says so. */
int outq_tls_input(outq *q, const char *p, size_t n, buf *in);
int outq_tls_wants_flush(const outq *q);
/* Before closing the stream: a close_notify, written if the socket takes it now. */
void outq_tls_bye(outq *q, uv_stream_t *stream);

#endif
