/* request.c - request objects: recycled through a free list in the context
 * so the hot path does not allocate, and re-armed when a blocking call has
 * to be sent again to a new master. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "broadcast.h"
#include "split.h"
#include "ferry.h"
#include "session.h"

#define REQ_FREE_MAX 1024   /* recycled request objects kept */
#define REQ_KEEP_BYTES 1024 /* a recycled request keeps buffers up to this size */

request *request_new(ferry *f)
{
    request *r;
    list_node *n = list_first(&f->free_reqs);
    if (n != NULL) {
        list_del(n);
        f->nfree_reqs--;
        r = list_entry(n, request, sq);
    } else {
        r = xcalloc(1, sizeof(*r));
        buf_init(&r->data);
        buf_init(&r->reply);
    }
    list_init(&r->sq);
    list_init(&r->lq);
    list_init(&r->hq);
    r->hpos = 0;
    r->due = 0;
    r->held_charge = 0;
    r->s = NULL;
    r->link = NULL;
    r->state = REQ_HELD;
    r->flags = 0;
    r->cmd = NULL;
    r->slot = -1;
    r->ask = NULL;
    r->bc = NULL;
    r->sp = NULL;
    r->born = uv_now(f->loop);
    r->born_ns = uv_hrtime();
    r->sent_ns = 0;
    r->held_since = r->born;
    r->deadline = 0;
    r->retries = 0;
    r->br_lo = -1;
    r->br_hi = -1;
    r->rcpt = 0;
    r->rcpt_slot1 = 0;
    r->db1 = 0;
    r->refusals = 0;
    r->retry_at = 0;
    r->refusal = NULL;
    r->done = NULL;
    r->written = NULL;
    r->written_arg = NULL;
    r->seq = 0;
    r->route = 0; /* the session decides */
    r->arg = 0;
    r->charge = 0;
    return r;
}

void request_free(ferry *f, request *r)
{
    if (r == NULL) {
        return;
    }
    ferry_assert(!list_linked(&r->hq) && r->hpos == 0); /* never freed while held */
    if (r->flags & REQ_F_RCPT) {
        f->stats.receipts_held--; /* its receipt is left to settle (instance.c) */
    }
    if (r->written != NULL) {
        /* Its reply was never handed to the session's output: it will not
         * be written. (The session takes the callback when it is.) */
        req_sent_cb cb = r->written;
        r->written = NULL;
        cb(r->written_arg, 0);
    }
    broadcast_free(r->bc);
    r->bc = NULL;
    split_free(r->sp);
    r->sp = NULL;
    buf_clear(&r->data);
    buf_clear(&r->reply);
    buf_shrink(&r->data, REQ_KEEP_BYTES);
    buf_shrink(&r->reply, REQ_KEEP_BYTES);
    if (f->nfree_reqs < REQ_FREE_MAX) {
        list_add_head(&f->free_reqs, &r->sq);
        f->nfree_reqs++;
        return;
    }
    buf_free(&r->data);
    buf_free(&r->reply);
    free(r);
}

void request_set_state(request *r, req_state st)
{
    static const unsigned legal[] = {
        [REQ_HELD] = 1u << REQ_SENT | 1u << REQ_ANSWERED,
        [REQ_SENT] = 1u << REQ_WAITING | 1u << REQ_ANSWERED | 1u << REQ_HELD,
        [REQ_WAITING] = 1u << REQ_ANSWERED | 1u << REQ_HELD,
        [REQ_ANSWERED] = 0,
    };
    ferry_assert(legal[r->state] & (1u << st));
    if (list_linked(&r->hq)) {
        r->s->f->unhold(r); /* sent or answered: no longer held for a master */
    }
    r->state = st;
}

/* Where the timeout of a blocking call sits in its arguments. Returns 0
 * with *ti (argument index), *millis (XREAD BLOCK counts milliseconds),
 * *expired (the reply its expiry produces) and *t (the timeout, > 0), or -1
 * when it blocks forever or is something ferry leaves for Redis to judge. */
static int block_timeout(const request *r, const resp_request *req, size_t *ti, int *millis,
                         const char **expired, double *t)
{
    const char *name = r->cmd->name;
    *ti = req->argc - 1; /* BLPOP, BRPOP, BZPOPMIN/MAX, BLMOVE, BRPOPLPUSH: last */
    *millis = 0;
    *expired = "*-1\r\n";
    if (strcmp(name, "blmpop") == 0 || strcmp(name, "bzmpop") == 0) {
        *ti = 1;
    } else if (strcmp(name, "blmove") == 0 || strcmp(name, "brpoplpush") == 0) {
        *expired = "$-1\r\n";
    } else if (strcmp(name, "xread") == 0 || strcmp(name, "xreadgroup") == 0) {
        *millis = 1;
        *ti = 0;
        for (size_t i = 1; i + 1 < req->argc; i++) {
            if (req->argv[i].len == 5 && strncasecmp(req->argv[i].ptr, "block", 5) == 0) {
                *ti = i + 1;
                break;
            }
        }
        if (*ti == 0) {
            return -1;
        }
    }
    char tmp[64];
    size_t tl = req->argv[*ti].len < sizeof(tmp) - 1 ? req->argv[*ti].len : sizeof(tmp) - 1;
    memcpy(tmp, req->argv[*ti].ptr, tl);
    tmp[tl] = '\0';
    char *end;
    *t = strtod(tmp, &end);
    if (*end != '\0' || !(*t > 0) || *t > 1e12) {
        return -1; /* 0 = forever; anything odd is left for Redis to judge */
    }
    return 0;
}

const char *request_expired_reply(const request *r)
{
    const char *name = r->cmd != NULL ? r->cmd->name : "";
    return strcmp(name, "blmove") == 0 || strcmp(name, "brpoplpush") == 0 ? "$-1\r\n" : "*-1\r\n";
}

uint64_t request_block_deadline(const request *r, uint64_t now)
{
    resp_parser *p;
    resp_request req;
    size_t ti;
    int millis;
    const char *expired;
    double t;
    uint64_t deadline = 0;

    if (!(r->flags & REQ_F_BLOCKING) || r->cmd == NULL) {
        return 0;
    }
    p = resp_parser_new(NULL);
    if (resp_parse_request(p, buf_head(&r->data), buf_used(&r->data), &req) == RESP_OK &&
        req.argc >= 2 && block_timeout(r, &req, &ti, &millis, &expired, &t) == 0) {
        deadline = now + (uint64_t)(millis ? t : t * 1000.0);
    }
    resp_parser_free(p);
    return deadline;
}

/* Rewrite the timeout of a blocking request that is re-issued: it gets
 * what is left of its own timeout, measured from when it was first sent.
 * Returns 0, or 1 with *expired set to the reply its timeout produces. */
int request_rearm_blocking(request *r, uint64_t now, const char **expired)
{
    resp_parser *p = resp_parser_new(NULL);
    resp_request req;
    size_t ti;
    int millis;
    double t;
    if (resp_parse_request(p, buf_head(&r->data), buf_used(&r->data), &req) != RESP_OK ||
        req.argc < 2 || r->cmd == NULL || block_timeout(r, &req, &ti, &millis, expired, &t) != 0) {
        resp_parser_free(p);
        return 0;
    }
    double elapsed = (double)(now - r->born) / (millis ? 1.0 : 1000.0);
    double left = t - elapsed;
    if (left <= (millis ? 1.0 : 0.001)) {
        resp_parser_free(p);
        return 1;
    }
    char nt[64];
    if (millis) {
        snprintf(nt, sizeof(nt), "%lld", (long long)left);
    } else {
        snprintf(nt, sizeof(nt), "%.3f", left);
    }
    buf out;
    buf_init(&out);
    buf_append_count(&out, '*', req.argc);
    for (size_t i = 0; i < req.argc; i++) {
        if (i == ti) {
            buf_append_bulk(&out, nt, strlen(nt));
        } else {
            buf_append_bulk(&out, req.argv[i].ptr, req.argv[i].len);
        }
    }
    resp_parser_free(p);
    buf_free(&r->data);
    r->data = out;
    r->born = now;
    return 0;
}

int request_reply_is_data(const request *r, const char *p, size_t n)
{
    if (n == 0 || (r->cmd != NULL && strcmp(r->cmd->name, "exec") == 0)) {
        return 0;
    }
    return p[0] == '$' || p[0] == '*' || p[0] == '%' || p[0] == '~' || p[0] == '=';
}

int request_reply_taken(const request *r)
{
    return command_takes_out(r->cmd) &&
           request_reply_is_data(r, buf_head(&r->reply), buf_used(&r->reply));
}

int request_verdict_data(const request *r)
{
    return (r->flags & REQ_F_VERDICT) && request_reply_taken(r);
}

int request_push_view(const request *r, push_view *v)
{
    const command *cmd = r->cmd;
    if (cmd == NULL || (strcmp(cmd->name, "lpush") != 0 && strcmp(cmd->name, "rpush") != 0 &&
                        strcmp(cmd->name, "lpushx") != 0 && strcmp(cmd->name, "rpushx") != 0)) {
        return -1;
    }
    const char *p = buf_head(&r->data), *end = p + buf_used(&r->data);
    const char *name;
    size_t nlen;
    long long argc = resp_read_header(&p, end, '*');
    if (argc < 3 || resp_read_bulk(&p, end, &name, &nlen) != 0 ||
        resp_read_bulk(&p, end, &v->key, &v->klen) != 0) {
        return -1;
    }
    v->tail = p;
    v->tlen = (size_t)(end - p);
    v->nvalues = (size_t)argc - 2;
    return 0;
}
