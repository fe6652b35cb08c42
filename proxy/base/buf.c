/* buf.c - growable byte buffers and double-buffered socket output. */
#include "buf.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ferry.h"
#include "tls.h"

#define BUF_MIN 512
#define OUTQ_PIECE ((size_t)1 << 30) /* most bytes in one uv_buf_t */
#define OUTQ_MAX_PIECES 16
#define OUTQ_TLS_STEP ((size_t)64 << 10) /* plaintext encrypted or decrypted per call */

void buf_init(buf *b)
{
    b->data = NULL;
    b->pos = b->len = b->cap = 0;
}

void buf_free(buf *b)
{
    free(b->data);
    buf_init(b);
}

void buf_reserve(buf *b, size_t n)
{
    if (b->cap - b->len >= n) {
        return;
    }
    if (b->pos > 0 && b->cap - (b->len - b->pos) >= n && b->pos >= (b->len - b->pos)) {
        /* Compact instead of growing when the live part is small. */
        memmove(b->data, b->data + b->pos, b->len - b->pos);
        b->len -= b->pos;
        b->pos = 0;
        return;
    }
    size_t need = b->len + n;
    size_t cap = b->cap ? b->cap : BUF_MIN;
    while (cap < need) {
        cap = cap < (64u << 20) ? cap * 2 : cap + (64u << 20);
    }
    b->data = xrealloc(b->data, cap);
    b->cap = cap;
}

void buf_reserve_secret(buf *b, size_t n)
{
    size_t live = b->len - b->pos;
    if (b->cap - b->len >= n) {
        return;
    }
    if (b->pos > 0 && b->cap - live >= n && b->pos >= live) {
        memmove(b->data, b->data + b->pos, live);
        explicit_bzero(b->data + live, b->len - live); /* the copy moved from */
        b->len = live;
        b->pos = 0;
        return;
    }
    size_t cap = b->cap ? b->cap : BUF_MIN;
    while (cap < live + n) {
        cap = cap < (64u << 20) ? cap * 2 : cap + (64u << 20);
    }
    char *data = xmalloc(cap);
    if (live > 0) {
        memcpy(data, b->data + b->pos, live);
    }
    buf_free_secret(b);
    b->data = data;
    b->len = live;
    b->cap = cap;
}

void buf_free_secret(buf *b)
{
    if (b->data != NULL) {
        explicit_bzero(b->data, b->cap);
    }
    buf_free(b);
}

void buf_append(buf *b, const void *p, size_t n)
{
    if (n == 0) {
        return;
    }
    buf_reserve(b, n);
    memcpy(b->data + b->len, p, n);
    b->len += n;
}

void buf_append_str(buf *b, const char *s)
{
    buf_append(b, s, strlen(s));
}

char *buf_digits(char *end, unsigned long long n)
{
    do {
        *--end = (char)('0' + n % 10);
        n /= 10;
    } while (n != 0);
    return end;
}

void buf_append_count(buf *b, char type, size_t n)
{
    /* Not snprintf: this header goes before every argument ferry builds (a
     * receipt's move has six), where snprintf showed up in profiles. */
    char hdr[32];
    char *end = hdr + sizeof(hdr) - 2;
    end[0] = '\r';
    end[1] = '\n';
    char *p = buf_digits(end, n);
    *--p = type;
    buf_append(b, p, (size_t)(hdr + sizeof(hdr) - p));
}

void buf_append_bulk(buf *b, const void *p, size_t n)
{
    buf_append_count(b, '$', n);
    buf_append(b, p, n);
    buf_append(b, "\r\n", 2);
}

void buf_append_argv(buf *b, int argc, const char *const *argv)
{
    buf_append_count(b, '*', (size_t)argc);
    for (int i = 0; i < argc; i++) {
        buf_append_bulk(b, argv[i], strlen(argv[i]));
    }
}

void buf_consume(buf *b, size_t n)
{
    b->pos += n;
    if (b->pos >= b->len) {
        b->pos = b->len = 0;
    }
}

void buf_clear(buf *b)
{
    b->pos = b->len = 0;
}

void buf_shrink(buf *b, size_t keep)
{
    if (b->cap > keep && buf_used(b) == 0) {
        buf_free(b);
    }
}

void outq_init(outq *q)
{
    buf_init(&q->fill);
    q->tls = NULL;
    q->w = NULL;
    q->written = 0;
}

/* The write and its storage are no longer needed. */
static void outq_drop_write(outq *q)
{
    if (q->w != NULL) {
        buf_free(&q->w->busy);
        free(q->w);
        q->w = NULL;
    }
}

void outq_free(outq *q)
{
    buf_free(&q->fill);
    outq_drop_write(q); /* libuv has called the write callback before any close callback */
    tls_free(q->tls);
    q->tls = NULL;
}

/* The write request and its buffer, allocated when a write first needs them. */
static outq_write *outq_get_write(outq *q)
{
    if (q->w == NULL) {
        q->w = xmalloc(sizeof(*q->w));
        buf_init(&q->w->busy);
        q->w->busy_plain = 0;
        q->w->active = 0;
    }
    return q->w;
}

/* Hand q->w->busy to libuv, in pieces (uv_buf_t lengths are unsigned int). */
static int outq_start(outq *q, uv_stream_t *stream, uv_write_cb cb)
{
    uv_buf_t ub[OUTQ_MAX_PIECES];
    unsigned int nb = 0;
    outq_write *w = q->w;
    size_t left = buf_used(&w->busy);
    char *p = buf_head(&w->busy);
    ferry_assert(left <= (size_t)OUTQ_MAX_PIECES * OUTQ_PIECE);
    while (left > 0) {
        size_t n = left < OUTQ_PIECE ? left : OUTQ_PIECE;
        ub[nb++] = uv_buf_init(p, (unsigned int)n);
        p += n;
        left -= n;
    }
    int rc = uv_write(&w->req, stream, ub, nb, cb);
    if (rc < 0) {
        return rc;
    }
    w->active = 1;
    return OUTQ_STARTED;
}

/* outq_flush with TLS: queued plaintext is encrypted (none while the
 * handshake waits for the peer), and the ciphertext, with whatever the
 * session wants to send of its own, is written as plain bytes are. */
static int outq_flush_tls(outq *q, uv_stream_t *stream, uv_write_cb cb)
{
    /* Encrypted in steps, each a few records; the ciphertext of one flush
     * stays well within what one uv_write takes. */
    size_t budget = (size_t)OUTQ_MAX_PIECES * OUTQ_PIECE / 2;
    size_t plain = q->w != NULL ? q->w->busy_plain : 0;
    while (buf_used(&q->fill) > 0 && plain < budget) {
        size_t n = buf_used(&q->fill) < OUTQ_TLS_STEP ? buf_used(&q->fill) : OUTQ_TLS_STEP;
        ssize_t got = tls_write(q->tls, buf_head(&q->fill), n);
        if (got < 0) {
            return UV_EPROTO;
        }
        if (got == 0) {
            break; /* the handshake needs the peer first */
        }
        buf_consume(&q->fill, (size_t)got);
        outq_get_write(q)->busy_plain += (size_t)got;
        plain += (size_t)got;
    }
    size_t pend = tls_pending(q->tls);
    if (pend > 0) {
        buf *busy = &outq_get_write(q)->busy;
        buf_reserve(busy, pend);
        busy->len += tls_take(q->tls, busy->data + busy->len, pend);
    }
    outq_write *w = q->w;
    if (w == NULL || buf_used(&w->busy) == 0) {
        return OUTQ_IDLE;
    }
    if (buf_used(&w->busy) <= OUTQ_PIECE) {
        uv_buf_t one = uv_buf_init(buf_head(&w->busy), (unsigned int)buf_used(&w->busy));
        int n = uv_try_write(stream, &one, 1);
        if (n < 0 && n != UV_EAGAIN) {
            return n;
        }
        if (n > 0) {
            buf_consume(&w->busy, (size_t)n);
        }
        if (buf_used(&w->busy) == 0) {
            q->written += w->busy_plain;
            outq_drop_write(q);
            if (buf_used(&q->fill) == 0) {
                buf_free(&q->fill);
            }
            return OUTQ_WRITTEN;
        }
    }
    return outq_start(q, stream, cb);
}

int outq_tls_input(outq *q, const char *p, size_t n, buf *in)
{
    tls_put(q->tls, p, n);
    for (;;) {
        buf_reserve(in, 16 * 1024); /* a TLS record at most */
        ssize_t got = tls_read(q->tls, in->data + in->len, in->cap - in->len);
        if (got <= 0) {
            return (int)got;
        }
        in->len += (size_t)got;
    }
}

int outq_tls_wants_flush(const outq *q)
{
    return q->tls != NULL && !outq_writing(q) &&
           (tls_pending(q->tls) > 0 || (buf_used(&q->fill) > 0 && tls_ready(q->tls)));
}

void outq_tls_bye(outq *q, uv_stream_t *stream)
{
    if (q->tls == NULL || outq_writing(q)) {
        return; /* bytes still in flight would come after it */
    }
    tls_bye(q->tls);
    char b[256];
    size_t n = tls_take(q->tls, b, sizeof(b));
    if (n > 0) {
        uv_buf_t one = uv_buf_init(b, (unsigned int)n);
        (void)uv_try_write(stream, &one, 1); /* best effort: the socket closes next */
    }
}

int outq_flush(outq *q, uv_stream_t *stream, uv_write_cb cb)
{
    if (outq_writing(q)) {
        return OUTQ_IDLE;
    }
    if (q->tls != NULL) {
        return outq_flush_tls(q, stream, cb);
    }
    if (buf_used(&q->fill) == 0) {
        return OUTQ_IDLE;
    }
    /* Most writes fit in the socket buffer: written now, they need no write
     * request, no callback on a later loop turn, and no change of the
     * socket's epoll interest. */
    if (buf_used(&q->fill) <= OUTQ_PIECE) {
        uv_buf_t one = uv_buf_init(buf_head(&q->fill), (unsigned int)buf_used(&q->fill));
        int n = uv_try_write(stream, &one, 1);
        if (n < 0 && n != UV_EAGAIN) {
            return n;
        }
        if (n > 0) {
            buf_consume(&q->fill, (size_t)n);
            q->written += (uint64_t)n;
        }
        if (buf_used(&q->fill) == 0) {
            /* As outq_done: an idle connection keeps no storage. */
            outq_drop_write(q);
            buf_free(&q->fill);
            return OUTQ_WRITTEN;
        }
    }
    /* Swap: the filled buffer goes to libuv, the drained one takes new bytes. */
    outq_write *w = outq_get_write(q);
    buf tmp = w->busy;
    w->busy = q->fill;
    q->fill = tmp;
    buf_clear(&q->fill);
    return outq_start(q, stream, cb);
}

uint64_t outq_sent(const outq *q, const uv_stream_t *stream)
{
    if (!outq_writing(q) || q->tls != NULL) {
        return q->written; /* TLS: plaintext counts once its ciphertext is written */
    }
    size_t busy = buf_used(&q->w->busy), left = uv_stream_get_write_queue_size(stream);
    return q->written + (left < busy ? busy - left : 0);
}

void outq_done(outq *q, int status)
{
    outq_write *w = q->w;
    w->active = 0;
    if (status == 0) {
        q->written += q->tls != NULL ? w->busy_plain : buf_used(&w->busy);
    }
    w->busy_plain = 0;
    buf_clear(&w->busy);
    if (buf_used(&q->fill) == 0) {
        /* Nothing more to write: an idle connection keeps no storage. */
        outq_drop_write(q);
        buf_free(&q->fill);
    } else {
        buf_shrink(&w->busy, 1u << 20);
    }
}
