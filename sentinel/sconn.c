/* sconn.c - RESP client connections for the Sentinel client: raw libuv TCP,
 * replies framed by ferry's scanner and parsed by hiredis' reader. Unlike
 * hiredis' async layer it has no assertion a peer can trip: an unexpected
 * or malformed reply closes the connection with a reason. */
#include "sconn.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "buf.h"
#include "ferry.h"
#include "resp.h"
#include "tls.h"

#define SCONN_MAX_DUE 16              /* replies awaited at once */
#define SCONN_MAX_REPLY (1024 * 1024) /* a sentinel's reply is small */

enum { SC_CONNECTING = 0, SC_UP, SC_CLOSING };

struct sconn {
    uv_tcp_t tcp;           /* the connection */
    uv_connect_t creq;      /* connect request */
    int state;              /* SC_* */
    int push;               /* replies are not matched to commands */
    buf in;                 /* bytes read, not yet framed */
    resp_scanner sc;        /* frames replies */
    outq out;               /* bytes to send */
    int due[SCONN_MAX_DUE]; /* kinds of the replies awaited, oldest first */
    int ndue, head;         /* ring of due */
    sconn_reply_cb rcb;     /* reply callback */
    sconn_state_cb scb;     /* state callback */
    void *data;             /* caller's */
};

static void sconn_flush(sconn *c);

static void close_cb(uv_handle_t *h)
{
    sconn *c = h->data;
    buf_free(&c->in);
    outq_free(&c->out);
    free(c);
}

void sconn_close(sconn *c, const char *why)
{
    if (c->state == SC_CLOSING) {
        return;
    }
    int was_up = c->state == SC_UP;
    c->state = SC_CLOSING;
    if (was_up) {
        outq_tls_bye(&c->out, (uv_stream_t *)&c->tcp); /* TLS: close_notify */
    }
    uv_close((uv_handle_t *)&c->tcp, close_cb);
    c->scb(c, c->data, 0, why);
}

int sconn_up(const sconn *c)
{
    return c->state == SC_UP;
}

static void write_cb(uv_write_t *w, int status)
{
    sconn *c = w->handle->data;
    outq_done(&c->out, status);
    if (c->state == SC_CLOSING) {
        return;
    }
    if (status < 0) {
        sconn_close(c, uv_strerror(status));
        return;
    }
    sconn_flush(c);
}

static void sconn_flush(sconn *c)
{
    if (c->state != SC_UP) {
        return;
    }
    int rc = outq_flush(&c->out, (uv_stream_t *)&c->tcp, write_cb);
    if (rc < 0) {
        sconn_close(c, uv_strerror(rc));
    }
}

int sconn_send(sconn *c, int kind, int argc, const char *const *argv)
{
    if (c->state == SC_CLOSING || (!c->push && c->ndue >= SCONN_MAX_DUE)) {
        return -1;
    }
    buf_append_argv(&c->out.fill, argc, argv);
    if (!c->push) {
        c->due[(c->head + c->ndue) % SCONN_MAX_DUE] = kind;
        c->ndue++;
    }
    sconn_flush(c);
    return 0;
}

int sconn_send_noreply(sconn *c, int argc, const char *const *argv)
{
    if (c->state == SC_CLOSING) {
        return -1;
    }
    buf_append_argv(&c->out.fill, argc, argv);
    sconn_flush(c);
    return 0;
}

static void alloc_cb(uv_handle_t *h, size_t hint, uv_buf_t *b)
{
    sconn *c = h->data;
    buf_reserve(&c->in, 16 * 1024);
    b->base = c->in.data + c->in.len;
    b->len = c->in.cap - c->in.len;
}

static void read_cb(uv_stream_t *st, ssize_t nread, const uv_buf_t *b)
{
    sconn *c = st->data;
    if (c->state == SC_CLOSING) {
        return;
    }
    if (nread < 0) {
        sconn_close(c, nread == UV_EOF ? "closed by the peer" : uv_strerror((int)nread));
        return;
    }
    if (c->out.tls != NULL) {
        if (outq_tls_input(&c->out, b->base, (size_t)nread, &c->in) < 0) {
            char why[300];
            snprintf(why, sizeof(why), "TLS: %s", tls_error(c->out.tls));
            sconn_close(c, why);
            return;
        }
        if (outq_tls_wants_flush(&c->out)) {
            sconn_flush(c);
        }
    } else {
        c->in.len += (size_t)nread;
    }
    while (c->state == SC_UP && buf_used(&c->in) > 0) {
        size_t n = 0;
        int rc = resp_scan_reply(&c->sc, buf_head(&c->in), buf_used(&c->in), &n);
        if (rc == RESP_AGAIN) {
            if (buf_used(&c->in) > SCONN_MAX_REPLY) {
                sconn_close(c, "reply too large");
            }
            return;
        }
        if (rc == RESP_ERR) {
            char why[200];
            snprintf(why, sizeof(why), "protocol error: %s", c->sc.errstr);
            sconn_close(c, why);
            return;
        }
        void *reply = NULL;
        redisReader *rd = redisReaderCreate();
        if (rd == NULL || redisReaderFeed(rd, buf_head(&c->in), n) != REDIS_OK ||
            redisReaderGetReply(rd, &reply) != REDIS_OK || reply == NULL) {
            redisReaderFree(rd);
            sconn_close(c, "unparsable reply");
            return;
        }
        redisReaderFree(rd);
        buf_consume(&c->in, n);
        int kind = -1;
        if (!c->push) {
            if (c->ndue == 0) {
                freeReplyObject(reply);
                sconn_close(c, "a reply nobody asked for");
                return;
            }
            kind = c->due[c->head];
            c->head = (c->head + 1) % SCONN_MAX_DUE;
            c->ndue--;
        }
        c->rcb(c, c->data, kind, reply);
        freeReplyObject(reply);
    }
}

static void connect_cb(uv_connect_t *req, int status)
{
    sconn *c = req->data;
    if (c->state == SC_CLOSING) {
        return;
    }
    if (status < 0) {
        sconn_close(c, uv_strerror(status));
        return;
    }
    int rc = uv_read_start((uv_stream_t *)&c->tcp, alloc_cb, read_cb);
    if (rc < 0) {
        sconn_close(c, uv_strerror(rc));
        return;
    }
    c->state = SC_UP;
    c->scb(c, c->data, 1, "connected");
    sconn_flush(c);
}

sconn *sconn_open(uv_loop_t *loop, const struct sockaddr *addr, struct tls_conf *tc, int push,
                  sconn_reply_cb rcb, sconn_state_cb scb, void *data)
{
    sconn *c = xcalloc(1, sizeof(*c));
    c->push = push;
    c->rcb = rcb;
    c->scb = scb;
    c->data = data;
    buf_init(&c->in);
    outq_init(&c->out);
    resp_scanner_init(&c->sc);
    uv_tcp_init(loop, &c->tcp);
    c->tcp.data = c;
    uv_tcp_nodelay(&c->tcp, 1);
    c->creq.data = c;
    if (tc != NULL) {
        char host[64] = "";
        if (addr->sa_family == AF_INET6) {
            uv_ip6_name((const struct sockaddr_in6 *)addr, host, sizeof(host));
        } else {
            uv_ip4_name((const struct sockaddr_in *)addr, host, sizeof(host));
        }
        c->out.tls = tls_new_client(tc, host);
    }
    if ((tc != NULL && c->out.tls == NULL) ||
        uv_tcp_connect(&c->creq, &c->tcp, addr, connect_cb) < 0) {
        c->state = SC_CLOSING;
        uv_close((uv_handle_t *)&c->tcp, close_cb);
        return NULL;
    }
    return c;
}

const char *sconn_reply_text(const redisReply *r)
{
    if (r == NULL || r->type != REDIS_REPLY_STRING || r->str == NULL || r->len > 255 ||
        strlen(r->str) != r->len) {
        return NULL;
    }
    return r->str;
}

const char *sconn_reply_field(const redisReply *fields, const char *name)
{
    if (fields == NULL || fields->type != REDIS_REPLY_ARRAY) {
        return NULL;
    }
    for (size_t j = 0; j + 1 < fields->elements; j += 2) {
        const char *k = sconn_reply_text(fields->element[j]);
        if (k != NULL && strcmp(k, name) == 0) {
            return sconn_reply_text(fields->element[j + 1]);
        }
    }
    return NULL;
}

int sconn_parse_port(const char *s)
{
    long v = 0;
    if (s == NULL || *s == '\0' || strlen(s) > 5) {
        return -1;
    }
    for (const char *p = s; *p != '\0'; p++) {
        if (*p < '0' || *p > '9') {
            return -1;
        }
        v = v * 10 + (*p - '0');
    }
    return v >= 1 && v <= 65535 ? (int)v : -1;
}
