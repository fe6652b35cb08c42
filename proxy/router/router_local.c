/* router_local.c - what ferry answers itself (HELLO, AUTH) and the
 * connection settings a session carries from link to link.
 *
 * A setting Redis accepted (CLIENT SETNAME, CLIENT TRACKING, HELLO's
 * SETNAME...) is kept in the session's sticky log, one entry per command,
 * and replayed on each new dedicated link before the client's own
 * commands; a refusal there is logged, not answered (the client was
 * answered when it set it). */
#include "router_local.h"

#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "acl.h"
#include "command.h"
#include "log.h"
#include "resp.h"
#include "router_int.h"
#include "tx.h"

/* ----------------------------------------------------- connection settings */

/* Reply to a replayed CLIENT SETNAME/TRACKING... on a new link. */
static void sticky_done(link *l, request *r, const char *reply, size_t len)
{
    if (len > 0 && reply[0] == '-') {
        char why[200];
        link_error_text(reply, len, why, sizeof(why));
        log_warn("link %llu: Redis refused a connection setting ferry restored: %s",
                 (unsigned long long)l->id, why);
    }
}

/* Same command (first two words, any case)? */
static int same_command(const resp_request *a, const resp_request *b)
{
    size_t n = a->argc < 2 ? a->argc : 2;
    if (a->argc < n || b->argc < n) {
        return 0;
    }
    for (size_t i = 0; i < n; i++) {
        if (a->argv[i].len != b->argv[i].len ||
            strncasecmp(a->argv[i].ptr, b->argv[i].ptr, a->argv[i].len) != 0) {
            return 0;
        }
    }
    return 1;
}

/* Keep the setting encoded in p[0..n) in its sticky_log, in place of an
 * earlier one of the same command: the log is what a new link replays. */
static void sticky_add(session *s, const char *p, size_t n)
{
    buf keep;
    resp_parser *np = resp_parser_new(NULL);
    resp_parser *op = resp_parser_new(NULL);
    resp_request nr;
    buf_init(&keep);
    if (resp_parse_request(np, p, n, &nr) == RESP_OK) {
        const char *q = buf_head(&session_extra_r(s)->sticky_log);
        size_t left = buf_used(&session_extra_r(s)->sticky_log);
        resp_request orq;
        while (left > 0 && resp_parse_request(op, q, left, &orq) == RESP_OK) {
            if (!same_command(&orq, &nr)) {
                buf_append(&keep, q, orq.len);
            }
            q += orq.len;
            left -= orq.len;
        }
    }
    buf_append(&keep, p, n);
    resp_parser_free(np);
    resp_parser_free(op);
    buf_free(&session_extra_w(s)->sticky_log);
    session_extra_w(s)->sticky_log = keep;
}

void router_sticky_accepted(session *s, request *r)
{
    if (r->cmd != NULL && strcmp(r->cmd->name, "client|caching") == 0) {
        return; /* it applies to the next command only */
    }
    if (r->arg == TRACK_ON || r->arg == TRACK_OFF) {
        s->tracking = r->arg == TRACK_ON;
    }
    sticky_add(s, buf_head(&r->data), buf_used(&r->data));
}

/* router_lend: see router_local.h. */
link *router_lend(session *s, upstream *up)
{
    acl_ident(s, up); /* s holds its user's identity on up (cluster mode) */
    link *l = upstream_lend(up, s);
    if (l == NULL) {
        return NULL;
    }
    if (buf_used(&session_extra_r(s)->sticky_log) > 0) {
        size_t n = link_internal_each(l, &session_extra_r(s)->sticky_log, sticky_done);
        l->client_set = 1;
        log_debug("client %llu: %zu connection setting(s) restored on link %llu",
                  (unsigned long long)s->id, n, (unsigned long long)l->id);
    }
    tx_on_lend(s, l);
    return l;
}

/* ---------------------------------------------------------- local answers */

/* HELLO's map: Redis' fields, with the values a client needs (the protocol
 * it now speaks, its id in ferry), plus "proxy" naming ferry. "version" is
 * the Redis version whose commands ferry follows, "mode" and "role" what
 * ferry presents (one master, standalone). */
static void hello_reply(session *s, request *r)
{
    buf b;
    char id[32];
    buf_init(&b);
    snprintf(id, sizeof(id), "%llu", (unsigned long long)s->id);
    if (s->proto == 3) {
        buf_append_count(&b, '%', 8);
    } else {
        buf_append_count(&b, '*', 16);
    }
    buf_append_bulk(&b, "server", 6);
    buf_append_bulk(&b, "redis", 5);
    buf_append_bulk(&b, "version", 7);
    buf_append_bulk(&b, command_redis_version(), strlen(command_redis_version()));
    buf_append_bulk(&b, "proto", 5);
    buf_append_str(&b, s->proto == 3 ? ":3\r\n" : ":2\r\n");
    buf_append_bulk(&b, "id", 2);
    buf_append_str(&b, ":");
    buf_append_str(&b, id);
    buf_append_str(&b, "\r\n");
    buf_append_bulk(&b, "mode", 4);
    buf_append_bulk(&b, "standalone", 10);
    buf_append_bulk(&b, "role", 4);
    buf_append_bulk(&b, "master", 6);
    buf_append_bulk(&b, "modules", 7);
    buf_append_str(&b, "*0\r\n");
    buf_append_bulk(&b, "proxy", 5);
    buf_append_bulk(&b, "ferry " FERRY_VERSION, strlen("ferry " FERRY_VERSION));
    s->f->session_ops->answer(s, r, buf_head(&b), buf_used(&b));
    buf_free(&b);
}

/* The client switches protocol: so does its dedicated link, behind what it
 * already carries (their replies come in the protocol they were sent in). */
static void switch_proto(session *s, int proto)
{
    static const char *const hello2[] = {"HELLO", "2"};
    static const char *const hello3[] = {"HELLO", "3"};
    if (s->proto == proto) {
        return;
    }
    log_debug("client %llu: RESP%d -> RESP%d", (unsigned long long)s->id, s->proto, proto);
    s->proto = proto;
    if (s->dlink != NULL && s->dlink->state != LINK_CLOSING) {
        link_internal(s->dlink, proto == 3 ? hello3 : hello2, 2, NULL, 0);
        s->dlink->proto = proto;
    }
}

void router_answer_hello(session *s, request *r)
{
    int proto = HELLO_PROTO(r);
    size_t skip = 0; /* the AUTH Redis checked heads r->data (acl.c) */
    switch (AUTH_RESULT(r)) {
    case HELLO_NOPROTO:
        s->f->session_ops->answer_str(s, r, "-NOPROTO unsupported protocol version\r\n");
        return;
    case HELLO_BADPROTO:
        s->f->session_ops->answer_str(
            s, r, "-ERR Protocol version is not an integer or out of range\r\n");
        return;
    case HELLO_SYNTAX: {
        /* Redis names the option (up to a NUL, as its %s does). */
        char line[300];
        const char *opt = buf_head(&r->data);
        size_t n = strnlen(opt, buf_used(&r->data));
        snprintf(line, sizeof(line), "-ERR Syntax error in HELLO option '%.*s'\r\n",
                 (int)(n < 200 ? n : 200), opt);
        s->f->session_ops->answer_str(s, r, line);
        return;
    }
    case HELLO_AUTH_FAIL:
        s->f->stats.auth_failures++;
        s->f->session_ops->answer_str(s, r,
                                      "-WRONGPASS invalid username-password pair or user is "
                                      "disabled.\r\n");
        return;
    case HELLO_AUTH_OK:
        s->authed = 1;
        break;
    case HELLO_AUTH_REDIS:
        skip = (size_t)(r->arg >> ACL_ARG_LEN_SHIFT); /* Redis accepted it (acl.c) */
        break;
    default:
        if (!s->authed) {
            s->f->session_ops->answer_str(s, r,
                                          "-NOAUTH HELLO must be called with the client already "
                                          "authenticated, otherwise the HELLO AUTH <user> <pass> "
                                          "option can be used to authenticate the client and "
                                          "select the RESP protocol version at the same time\r\n");
            return;
        }
        break;
    }
    if (proto != 0 && proto != s->proto && s->tunnel != TUN_NONE) {
        /* A tunnel's bytes pass as Redis sends them: they cannot change
         * protocol half way. */
        s->f->session_ops->answer_str(
            s, r,
            "-ERR ferry: HELLO cannot change the protocol of a connection in "
            "pub/sub, MONITOR or CLIENT REPLY mode\r\n");
        return;
    }
    if (proto != 0) {
        switch_proto(s, proto);
    }
    if (buf_used(&r->data) > skip) {
        /* HELLO ... SETNAME: the name lives on the client's own link, as
         * CLIENT SETNAME's does. */
        const char *p = buf_head(&r->data) + skip;
        size_t n = buf_used(&r->data) - skip;
        sticky_add(s, p, n);
        if (s->dlink != NULL && s->dlink->state != LINK_CLOSING) {
            link_internal_raw(s->dlink, p, n, sticky_done);
        }
        s->sticky = 1;
    }
    hello_reply(s, r);
}

void router_answer_auth(session *s, request *r)
{
    if (r->arg == AUTH_OK || AUTH_RESULT(r) == AUTH_REDIS) {
        s->authed = 1;
        s->f->session_ops->answer_str(s, r, "+OK\r\n");
    } else if (r->arg == AUTH_NOPASS) {
        s->f->session_ops->answer_str(s, r,
                                      "-ERR AUTH <password> called without any password "
                                      "configured for the default user. Are you sure your "
                                      "configuration is correct?\r\n");
    } else {
        s->f->stats.auth_failures++;
        s->f->session_ops->answer_str(s, r,
                                      "-WRONGPASS invalid username-password pair or user is "
                                      "disabled.\r\n");
    }
}
