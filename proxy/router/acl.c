/* acl.c - client.auth redis: AUTH checked by Redis' ACL.
 *
 * A client's AUTH user pass (HELLO's AUTH option too) is not answered by
 * ferry: it is sent, as AUTH, on a shared link of that user (opened on
 * demand: authenticated as the user before it carries anything, so a
 * refused AUTH there leaves no command running as anyone else). Redis'
 * answer is the client's: a refusal keeps Redis' words, and since a failed
 * AUTH changes nothing on a connection the link stays the user's. Accepted,
 * the client's commands run on that user's links from then on.
 *
 * With durability.replicas_ack ferry runs WAIT after the user's writes, on
 * the user's link that carried them (WAIT counts what that connection
 * wrote). A user who may not run WAIT would have every write answered
 * -NOREPLICAS, so the check asks WAIT 0 0 on the same link next, and a
 * refusal refuses the AUTH with -NOPERM naming ferry and +wait. */
#include "acl.h"

#include <stdio.h>
#include <string.h>

#include "clustermap.h"
#include "link.h"
#include "log.h"
#include "upstream.h"

/* Bytes of the AUTH command heading r->data. */
static size_t auth_len(const request *r)
{
    return (size_t)(r->arg >> ACL_ARG_LEN_SHIFT);
}

size_t acl_encode(request *r, const resp_arg *user, const resp_arg *pass)
{
    size_t before = buf_used(&r->data);
    buf_append_count(&r->data, '*', 3);
    buf_append_bulk(&r->data, "AUTH", 4);
    if (user != NULL) {
        buf_append_bulk(&r->data, user->ptr, user->len);
    } else {
        buf_append_bulk(&r->data, "default", 7);
    }
    buf_append_bulk(&r->data, pass->ptr, pass->len);
    return buf_used(&r->data) - before;
}

/* User and password of r's AUTH (valid while pp lives). Returns 0 or -1. */
static int auth_args(resp_parser *pp, const request *r, resp_arg *user, resp_arg *pass)
{
    resp_request req;
    if (resp_parse_request(pp, buf_head(&r->data), auth_len(r), &req) != RESP_OK || req.argc != 3) {
        return -1;
    }
    *user = req.argv[1];
    *pass = req.argv[2];
    return 0;
}

/* The password is not kept in the request any longer than needed. */
static void wipe(request *r)
{
    explicit_bzero(buf_head(&r->data), auth_len(r));
}

static void refuse(session *s, request *r, const char *p, size_t n)
{
    s->f->stats.auth_failures++;
    wipe(r);
    s->f->session_ops->answer(s, r, p, n);
}

/* Whether id's links may be opened with pass: not when Redis refused that
 * very password on its last new link. Another password for a refused user
 * is tried: its links are opened with it. */
static int ident_usable(ferry *f, ident *id, const char *pass, size_t plen)
{
    if (!id->rejected) {
        return 1;
    }
    if (strlen(id->pass) == plen && memcmp(id->pass, pass, plen) == 0) {
        return 0;
    }
    upstream_ident_set_pass(id, pass, plen);
    id->rejected = 0;
    id->next_open_ms = 0;
    id->idle_since_ms = uv_now(f->loop);
    return 1;
}

/* The master view that checks a client's AUTH: f->up; in cluster mode the
 * UP shard's master view with the lowest slots (every master knows the
 * users: ACL users are made on every node), else slot 0's, where the check
 * waits (none while no map is known: f->up, without a master). */
static upstream *check_view(ferry *f)
{
    upstream *up = f->cluster != NULL ? clustermap_route(f->cluster, -1) : NULL;
    return up != NULL ? up : f->up;
}

/* s lets go of its user's identities on the other shards' views. */
static void forget_ident_on(session *s)
{
    session_extra *x = s->extra;
    if (x == NULL) {
        return; /* never sent to another shard */
    }
    for (int i = 0; i < x->nident_on; i++) {
        upstream_ident_release(x->ident_on[i]->up, x->ident_on[i]);
    }
    x->nident_on = 0;
}

ident *acl_ident(session *s, upstream *up)
{
    if (s->ident == NULL) {
        return NULL;
    }
    ident *id = upstream_ident_on(up, s->ident);
    if (id == s->ident) {
        return id;
    }
    session_extra *x = session_extra_w(s);
    for (int i = 0; i < x->nident_on; i++) {
        if (x->ident_on[i] == id) {
            return id;
        }
    }
    if (x->nident_on == x->ident_on_cap) {
        x->ident_on_cap = x->ident_on_cap > 0 ? x->ident_on_cap * 2 : 4;
        x->ident_on = xrealloc(x->ident_on, (size_t)x->ident_on_cap * sizeof(*x->ident_on));
    }
    upstream_ident_hold(id);
    x->ident_on[x->nident_on++] = id;
    return id;
}

int acl_dispatch(session *s, request *r)
{
    ferry *f = s->f;
    upstream *up = check_view(f);

    if (s->inflight > 0) {
        return ACL_WAIT; /* as whom the earlier requests run must not change under them */
    }
    if (up->state == UP_DOWN && uv_now(f->loop) - up->down_since_ms >= f->cfg->fallback_after_ms) {
        wipe(r);
        s->f->session_ops->answer_str(
            s, r,
            "-ERR ferry: cannot check the credentials: no Redis master is "
            "reachable (client.auth redis)\r\n");
        return ACL_ANSWERED;
    }
    if (up->state != UP_UP) {
        return ACL_HOLD;
    }
    resp_parser *pp = resp_parser_new(NULL);
    resp_arg user, pass;
    if (auth_args(pp, r, &user, &pass) != 0) {
        resp_parser_free(pp);
        s->f->session_ops->answer_str(s, r, "-ERR syntax error\r\n");
        return ACL_ANSWERED;
    }
    ident *id = upstream_ident(up, user.ptr, user.len, pass.ptr, pass.len);
    if (!ident_usable(f, id, pass.ptr, pass.len)) {
        /* Redis refused these very credentials on the link opened for them. */
        char line[256];
        snprintf(line, sizeof(line), "-%s\r\n", id->error);
        resp_parser_free(pp);
        refuse(s, r, line, strlen(line));
        return ACL_ANSWERED;
    }
    resp_parser_free(pp);
    link *l = upstream_shared(up, id, s->id, 2);
    if (l == NULL) {
        return ACL_HOLD; /* woken when its link is READY or refused */
    }
    r->arg &= ~ACL_ARG_WAIT;
    r->s = s;
    r->sent_ns = uv_hrtime();
    link_send_bytes(l, r, buf_head(&r->data), auth_len(r));
    s->inflight++;
    s->flight_link = l;
    s->checking = 1;
    return ACL_SENT;
}

int acl_on_reply(session *s, request *r, link *l, const char *p, size_t n)
{
    upstream *up = l->up; /* the view that checked it */
    ident *id = l->who;

    if (n == 0 || id->user == NULL) {
        refuse(s, r, "-ERR ferry: the credentials could not be checked\r\n",
               strlen("-ERR ferry: the credentials could not be checked\r\n"));
        return 0;
    }
    if (!(r->arg & ACL_ARG_WAIT)) {
        if (p[0] == '-') {
            refuse(s, r, p, n); /* Redis' own words */
            return 0;
        }
        if (up->replicas_ack > 0) {
            static const char wait0[] = "*3\r\n$4\r\nWAIT\r\n$1\r\n0\r\n$1\r\n0\r\n";
            r->arg |= ACL_ARG_WAIT;
            r->s = s;
            request_set_state(r, REQ_HELD); /* answered by Redis, asked again */
            link_send_bytes(l, r, wait0, sizeof(wait0) - 1);
            s->inflight++;
            s->flight_link = l;
            s->checking = 1;
            return 0;
        }
    } else if (p[0] == '-') {
        char why[200], line[600];
        link_error_text(p, n, why, sizeof(why));
        snprintf(line, sizeof(line),
                 "-NOPERM ferry: user '%s' may not run WAIT, which ferry runs after the user's "
                 "writes to have replicas confirm them (durability.replicas_ack %d); allow it "
                 "with ACL SETUSER %s +wait (Redis: %s)\r\n",
                 id->user, up->replicas_ack, id->user, why);
        log_warn("client %llu: AUTH as user '%s' refused: the user may not run WAIT (%s)",
                 (unsigned long long)s->id, id->user, why);
        refuse(s, r, line, strlen(line));
        return 0;
    }
    /* Accepted: the password Redis just took is the one new links use. */
    resp_parser *pp = resp_parser_new(NULL);
    resp_arg user, pass;
    if (auth_args(pp, r, &user, &pass) == 0) {
        upstream_ident_set_pass(id, pass.ptr, pass.len);
    }
    resp_parser_free(pp);
    wipe(r);
    if (s->ident != id) {
        upstream_ident_hold(id);
        acl_forget(s);
        s->ident = id;
    }
    s->authed = 1;
    log_debug("client %llu: authenticated by Redis as user '%s'", (unsigned long long)s->id,
              id->user);
    return 1;
}

void acl_forget(session *s)
{
    forget_ident_on(s);
    if (s->ident != NULL) {
        upstream_ident_release(s->ident->up, s->ident);
        s->ident = NULL;
    }
}

int acl_adopt(session *s, const session_import *im, char *why, size_t whylen)
{
    ferry *f = s->f;
    int redis = f->cfg->client_auth == CLIENT_AUTH_REDIS;

    if (im->user == NULL) {
        if (redis && s->authed) {
            /* Authenticated by ferry (client.auth was not redis there): it
             * would run as ferry's own user, which client.auth redis never
             * lets a client do. */
            snprintf(why, whylen,
                     "taken over authenticated by ferry, but client.auth is redis here: it "
                     "must authenticate as a Redis user");
            return -1;
        }
        return 0;
    }
    if (!redis) {
        snprintf(why, whylen,
                 "taken over authenticated as Redis user '%.*s', but client.auth is not redis "
                 "here",
                 (int)(im->nuser < 64 ? im->nuser : 64), im->user);
        return -1;
    }
    /* A user this process knows keeps its password (its links may be
     * open, or opening, with it); a new one is created with the password
     * the old process's links were opened with, and its links are opened
     * when the session needs them, as after a failover. */
    ident *id = upstream_ident(check_view(f), im->user, im->nuser, im->pass, im->npass);
    if (!ident_usable(f, id, im->pass, im->npass)) {
        snprintf(why, whylen,
                 "taken over as Redis user '%s', whose credentials Redis refuses on a new link: "
                 "%s",
                 id->user, id->error);
        return -1;
    }
    upstream_ident_hold(id);
    acl_forget(s);
    s->ident = id;
    return 0;
}
