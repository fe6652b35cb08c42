/* cluster_conn.c - cluster mode: keys found by Redis' own rules, and the
 * client name ferry keeps for each client connection. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include "buf.h"
#include "clients.h"
#include "cluster_conn.h"
#include "router.h"
#include "slot.h"

/* The slot of argv[first .. first+n), MOVABLE_CROSS for two slots. */
static int keys_slot(const resp_request *req, size_t first, size_t n)
{
    int slot = -1;
    for (size_t i = first; i < first + n; i++) {
        int ks = slot_of_key(req->argv[i].ptr, req->argv[i].len);
        if (slot >= 0 && ks != slot) {
            return MOVABLE_CROSS;
        }
        slot = ks;
    }
    return slot;
}

/* XREAD [COUNT n] [BLOCK ms] STREAMS k... id... and XREADGROUP GROUP g c
 * [COUNT n] [BLOCK ms] [NOACK] [CLAIM ms] STREAMS k... id...: the keys are
 * the first half of what follows STREAMS. */
static int streams_slot(const resp_request *req, int group)
{
    xread_args x;
    if (command_xread_args(group, req->argc, req->argv, &x) != 0) {
        return -1; /* Redis answers the error */
    }
    return keys_slot(req, x.keys, x.nkeys);
}

/* numkeys at argv[at], the keys after it (BLMPOP, BZMPOP, LMPOP, ZMPOP). */
static int numkeys_slot(const resp_request *req, size_t at)
{
    long long n;
    if (req->argc <= at || resp_arg_ll(&req->argv[at], &n) != 0 || n <= 0 ||
        n > (long long)(req->argc - at - 1)) {
        return -1;
    }
    return keys_slot(req, at + 1, (size_t)n);
}

int cluster_movable_slot(const command *cmd, const resp_request *req)
{
    if (cmd == NULL) {
        return MOVABLE_NONE;
    }
    if (strcmp(cmd->name, "xread") == 0 || strcmp(cmd->name, "xreadgroup") == 0) {
        return streams_slot(req, strcmp(cmd->name, "xreadgroup") == 0);
    }
    if (strcmp(cmd->name, "blmpop") == 0 || strcmp(cmd->name, "bzmpop") == 0) {
        return numkeys_slot(req, 2);
    }
    if (strcmp(cmd->name, "lmpop") == 0 || strcmp(cmd->name, "zmpop") == 0) {
        return numkeys_slot(req, 1);
    }
    return MOVABLE_NONE;
}

static void reply(request *r, const char *p, size_t n)
{
    buf_clear(&r->reply);
    buf_append(&r->reply, p, n);
    r->route = RT_ERROR;
}

/* Keep CLIENT SETNAME name in its sticky_log, in place of an earlier one. */
static void keep_name(session *s, const resp_request *req)
{
    buf keep;
    resp_parser *p = resp_parser_new(NULL);
    const char *q = buf_head(&session_extra_r(s)->sticky_log);
    size_t left = buf_used(&session_extra_r(s)->sticky_log);
    resp_request o;
    buf_init(&keep);
    while (left > 0 && resp_parse_request(p, q, left, &o) == RESP_OK) {
        if (!(o.argc >= 2 && resp_arg_is(&o.argv[0], "client") &&
              resp_arg_is(&o.argv[1], "setname"))) {
            buf_append(&keep, q, o.len);
        }
        q += o.len;
        left -= o.len;
    }
    resp_parser_free(p);
    buf_append(&keep, "*3\r\n$6\r\nCLIENT\r\n$7\r\nSETNAME\r\n", 29);
    char head[32];
    int hn = snprintf(head, sizeof(head), "$%zu\r\n", req->argv[2].len);
    buf_append(&keep, head, (size_t)hn);
    buf_append(&keep, req->argv[2].ptr, req->argv[2].len);
    buf_append(&keep, "\r\n", 2);
    buf_free(&session_extra_w(s)->sticky_log);
    session_extra_w(s)->sticky_log = keep;
}

int cluster_client_name(session *s, request *r, const resp_request *req)
{
    const command *cmd = r->cmd;
    if (cmd == NULL) {
        return 0;
    }
    if (strcmp(cmd->name, "client|setname") == 0 && req->argc == 3) {
        const resp_arg *a = &req->argv[2];
        for (size_t i = 0; i < a->len; i++) {
            if (a->ptr[i] < '!' || a->ptr[i] > '~') {
                const char *e = "-ERR Client names cannot contain spaces, newlines or special "
                                "characters.\r\n";
                reply(r, e, strlen(e));
                return 1;
            }
        }
        keep_name(s, req);
        reply(r, "+OK\r\n", 5);
        return 1;
    }
    if (strcmp(cmd->name, "client|getname") == 0 && req->argc == 2) {
        char name[512];
        clients_session_name(s, name, sizeof(name));
        if (name[0] == '\0') {
            const char *nil = session_null(s, "$-1\r\n");
            reply(r, nil, strlen(nil));
            return 1;
        }
        char head[32];
        size_t n = strlen(name);
        int hn = snprintf(head, sizeof(head), "$%zu\r\n", n);
        buf_clear(&r->reply);
        buf_append(&r->reply, head, (size_t)hn);
        buf_append(&r->reply, name, n);
        buf_append(&r->reply, "\r\n", 2);
        r->route = RT_ERROR;
        return 1;
    }
    return 0;
}
