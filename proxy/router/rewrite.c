/* rewrite.c - the rewriters' table (rewrite.h). The order is the one the
 * request path had: a push to a bounded queue carries its receipt inside
 * the guard's script (receipts_guarded_push), so guards come before
 * receipts; the others never claim the same request. */
#include "rewrite.h"

#include "guards.h"
#include "lease.h"
#include "receipts.h"
#include "xreads.h"

static rewrite_verdict guards_again(session *s, request *r, const char *p, size_t n)
{
    switch (guards_on_reply(s, r, p, n)) {
    case GUARD_RESEND:
        return REWRITE_RESEND;
    case GUARD_HOLD:
        return REWRITE_HOLD;
    default:
        return REWRITE_PASS;
    }
}

static rewrite_verdict lease_again(session *s, request *r, const char *p, size_t n)
{
    (void)s;
    return lease_noscript(r, p, n) ? REWRITE_RESEND : REWRITE_PASS;
}

static int lease_reply(session *s, request *r, struct link *via, const char *p, size_t n, buf *out)
{
    (void)out;
    lease_on_reply(s, r, via, p, n);
    return 0;
}

static rewrite_verdict receipts_verdict(session *s, request *r, const char *p, size_t n)
{
    return receipts_again(s, r, p, n) ? REWRITE_RESEND : REWRITE_PASS;
}

static int receipts_final(session *s, request *r, struct link *via, const char *p, size_t n,
                          buf *out)
{
    (void)via;
    (void)out;
    receipts_reply(s->f, r, p, n);
    return 0;
}

static rewrite_verdict xreads_verdict(session *s, request *r, const char *p, size_t n)
{
    return xreads_again(s, r, p, n) ? REWRITE_RESEND : REWRITE_PASS;
}

static int xreads_final(session *s, request *r, struct link *via, const char *p, size_t n, buf *out)
{
    (void)via;
    return xreads_reply(s, r, p, n, out);
}

static const rewriter table[] = {
    {"guards", guards_send, guards_again, NULL, NULL},
    {"lease", lease_send, lease_again, lease_reply, lease_client_gone},
    {"receipts", receipts_send, receipts_verdict, receipts_final, receipts_client_gone},
    {"xreads", xreads_send, xreads_verdict, xreads_final, NULL},
};

#define NREWRITERS (sizeof(table) / sizeof(table[0]))

int rewrite_send(session *s, request *r, struct link *l)
{
    for (size_t i = 0; i < NREWRITERS; i++) {
        if (table[i].send(s, r, l)) {
            return 1;
        }
    }
    return 0;
}

rewrite_verdict rewrite_again(session *s, request *r, const char *p, size_t n)
{
    for (size_t i = 0; i < NREWRITERS; i++) {
        rewrite_verdict v = table[i].again != NULL ? table[i].again(s, r, p, n) : REWRITE_PASS;
        if (v != REWRITE_PASS) {
            return v;
        }
    }
    return REWRITE_PASS;
}

int rewrite_reply(session *s, request *r, struct link *via, const char *p, size_t n, buf *out)
{
    int shaped = 0;
    for (size_t i = 0; i < NREWRITERS; i++) {
        if (table[i].reply != NULL && table[i].reply(s, r, via, p, n, out)) {
            shaped = 1;
        }
    }
    return shaped;
}

void rewrite_client_gone(session *s)
{
    for (size_t i = 0; i < NREWRITERS; i++) {
        if (table[i].client_gone != NULL) {
            table[i].client_gone(s);
        }
    }
}
