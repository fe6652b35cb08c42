/* router_classify.c - a request's classification, once, when it is parsed
 * (router_classify): its command, whether it may write (scripts and
 * functions count as writes unless read-only), its route, the refusals
 * ferry answers itself (denied commands, CONFIG SET of a setting ferry
 * enforces, a bad SELECT...) and, for AUTH and HELLO, the checked result in
 * r->arg (router_int.h). router.c dispatches the request in order later. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "acl.h"
#include "broadcast.h"
#include "clients.h"
#include "cluster_conn.h"
#include "clustermap.h"
#include "keyspace.h"
#include "log.h"
#include "multipop.h"
#include "queues.h"
#include "router.h"
#include "router_int.h"
#include "router_pubsub.h"
#include "slot.h"
#include "split.h"

static int arg_eq(const resp_arg *a, const char *lit)
{
    size_t n = strlen(lit);
    return a->len == n && strncasecmp(a->ptr, lit, n) == 0;
}

static void set_error(request *r, const char *fmt, const char *what)
{
    char line[512];
    int n = snprintf(line, sizeof(line), fmt, what);
    if (n < 0) {
        n = 0;
    }
    if ((size_t)n >= sizeof(line)) {
        n = sizeof(line) - 1;
    }
    buf_clear(&r->reply);
    buf_append(&r->reply, line, (size_t)n);
    r->route = RT_ERROR;
}

void router_refuse(request *r, const char *line)
{
    set_error(r, "%s", line);
}

static int password_ok(ferry *f, const resp_arg *user, const resp_arg *pass)
{
    const char *pw = f->cfg->client_password;
    if (pw == NULL) {
        /* As Redis' default user without a password (nopass): any password
         * of it passes. AUTH <password> alone is Redis' error; so is, as
         * ferry's own answer, another user's AUTH (docs/commands.md). */
        return user != NULL && arg_eq(user, "default") ? AUTH_OK : AUTH_NOPASS;
    }
    if (user != NULL && !arg_eq(user, "default")) {
        return AUTH_FAIL;
    }
    size_t n = strlen(pw);
    /* Compare without an early exit, so timing does not leak the prefix. */
    unsigned diff = (unsigned)(pass->len != n);
    for (size_t i = 0; i < pass->len; i++) {
        diff |= (unsigned)(unsigned char)(pass->ptr[i] ^ pw[i % (n ? n : 1)]);
    }
    return diff == 0 ? AUTH_OK : AUTH_FAIL;
}

static int is_enforced_param(const resp_arg *a)
{
    return arg_eq(a, "appendonly") || arg_eq(a, "appendfsync") ||
           arg_eq(a, "no-appendfsync-on-rewrite");
}

static int is_denied(ferry *f, const command *cmd)
{
    for (int i = 0; i < f->ndeny; i++) {
        if (f->deny[i] == cmd) {
            return 1;
        }
    }
    return 0;
}

/* Upper-case display name of a command: "CONFIG REWRITE". */
static void display_name(const command *cmd, char *out, size_t len)
{
    size_t i = 0;
    for (const char *p = cmd->name; *p != '\0' && i + 1 < len; p++) {
        out[i++] = *p == '|' ? ' ' : (char)(*p >= 'a' && *p <= 'z' ? *p - 32 : *p);
    }
    out[i] = '\0';
}

/* CONFIG SET (under any name ferry's config_command gives CONFIG) of a
 * setting ferry enforces is refused. Returns 1 if r was refused. */
static int refuse_config_set(ferry *f, request *r, const resp_request *req, const char *shown)
{
    const resp_arg *argv = req->argv;
    for (size_t i = 2; i < req->argc; i += 2) {
        if (is_enforced_param(&argv[i])) {
            char what[128];
            snprintf(what, sizeof(what), "%s SET %.*s", shown,
                     (int)(argv[i].len < 40 ? argv[i].len : 40), argv[i].ptr);
            set_error(r,
                      "-ERR ferry: %s is not allowed through the proxy (ferry enforces "
                      "durability)\r\n",
                      what);
            f->stats.commands_denied++;
            return 1;
        }
    }
    return 0;
}

/* Scripts and functions may write unless they are the _RO variants or an
 * EVAL whose script declares no-writes in its shebang line. */
static int script_may_write(const command *cmd, const resp_request *req)
{
    if (strcmp(cmd->name, "eval") == 0) {
        const resp_arg *body = &req->argv[1];
        if (req->argc >= 2 && body->len > 2 && memcmp(body->ptr, "#!", 2) == 0) {
            const char *nl = memchr(body->ptr, '\n', body->len);
            size_t n = nl != NULL ? (size_t)(nl - body->ptr) : body->len;
            for (size_t i = 0; i + 9 <= n; i++) {
                if (memcmp(body->ptr + i, "no-writes", 9) == 0) {
                    return 0;
                }
            }
        }
        return 1;
    }
    return strcmp(cmd->name, "evalsha") == 0 || strcmp(cmd->name, "fcall") == 0;
}

/* EVAL, EVALSHA, FCALL and their _RO variants: a call that may run past
 * lua-time-limit, while Redis answers -BUSY to every other connection. On
 * a link of its own it holds no other client behind it. */
static int is_script_call(const command *cmd)
{
    static const char *const names[] = {"eval",       "evalsha", "eval_ro",
                                        "evalsha_ro", "fcall",   "fcall_ro"};
    if (cmd->name[0] != 'e' && cmd->name[0] != 'f') {
        return 0;
    }
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        if (strcmp(cmd->name, names[i]) == 0) {
            return 1;
        }
    }
    return 0;
}

static void classify_hello(ferry *f, request *r, const resp_request *req)
{
    const resp_arg *argv = req->argv;
    r->route = RT_HELLO;
    r->arg = HELLO_OK;
    if (req->argc < 2) {
        return;
    }
    long long ver;
    if (resp_arg_ll(&argv[1], &ver) != 0) {
        r->arg = HELLO_BADPROTO;
        return;
    }
    if (ver != 2 && ver != 3) {
        r->arg = HELLO_NOPROTO;
        return;
    }
    r->arg = HELLO_OK | (ver << HELLO_PROTO_SHIFT);
    const resp_arg *user = NULL, *pass = NULL, *name = NULL;
    for (size_t i = 2; i < req->argc; i++) {
        if (arg_eq(&argv[i], "auth") && i + 2 < req->argc) {
            user = &argv[i + 1];
            pass = &argv[i + 2];
            i += 2;
        } else if (arg_eq(&argv[i], "setname") && i + 1 < req->argc) {
            name = &argv[i + 1];
            i += 1;
        } else {
            r->arg = HELLO_SYNTAX;
            buf_clear(&r->data); /* the option, for Redis' words (router_local.c) */
            buf_append(&r->data, argv[i].ptr, argv[i].len);
            return;
        }
    }
    buf_clear(&r->data);
    if (user != NULL && f->cfg->client_auth == CLIENT_AUTH_REDIS) {
        /* Redis checks it: the AUTH heads r->data (acl.c). */
        size_t n = acl_encode(r, user, pass);
        r->arg =
            HELLO_AUTH_REDIS | (ver << HELLO_PROTO_SHIFT) | ((long long)n << ACL_ARG_LEN_SHIFT);
    } else if (user != NULL) {
        int ok = password_ok(f, user, pass);
        r->arg = (ok == AUTH_OK ? HELLO_AUTH_OK : HELLO_AUTH_FAIL) | (ver << HELLO_PROTO_SHIFT);
    }
    if (name != NULL) {
        /* Kept as the CLIENT SETNAME it stands for (applied on success). */
        buf_append_count(&r->data, '*', 3);
        buf_append_bulk(&r->data, "CLIENT", 6);
        buf_append_bulk(&r->data, "SETNAME", 7);
        buf_append_bulk(&r->data, name->ptr, name->len);
    }
}

static int classify_route(session *s, request *r, const resp_request *req)
{
    ferry *f = s->f;
    const resp_arg *argv = req->argv;
    size_t argc = req->argc;

    if (f->acap < argc) {
        f->acap = argc < 16 ? 16 : argc;
        f->av = xrealloc(f->av, f->acap * sizeof(*f->av));
        f->al = xrealloc(f->al, f->acap * sizeof(*f->al));
    }
    size_t nlook = argc < 2 ? argc : 2;
    for (size_t i = 0; i < nlook; i++) {
        f->av[i] = argv[i].ptr;
        f->al[i] = argv[i].len;
    }
    const command *cmd = command_lookup_argv(nlook, f->av, f->al);
    r->cmd = cmd;
    if (cmd != NULL) {
        s->last_cmd = cmd;
    }
    r->route = RT_SHARED;
    stats_count_command(&f->stats, cmd);
    const char *cc = f->cfg->config_command;
    if (cc != NULL && argc >= 2 && arg_eq(&argv[0], cc) && arg_eq(&argv[1], "set") &&
        refuse_config_set(f, r, req, cc)) {
        return 1; /* the renamed CONFIG is guarded as CONFIG is */
    }
    if (cmd == NULL) {
        return 0; /* Redis answers unknown commands itself */
    }
    queues_count(f, cmd, argv, argc);
    if ((cmd->flags & CMD_F_WRITE) || script_may_write(cmd, req)) {
        r->flags |= REQ_F_WRITE;
    }
    if (f->ndeny > 0 && is_denied(f, cmd)) {
        char name[64];
        display_name(cmd, name, sizeof(name));
        set_error(r, "-ERR ferry: %s is not allowed through the proxy\r\n", name);
        f->stats.commands_denied++;
        return 1;
    }
    if (is_script_call(cmd)) {
        r->route = RT_SCRIPT;
        return 0;
    }
    switch (cmd->cls) {
    case CMD_BLOCKING:
        if (command_is_blocking(cmd, argc, argv)) {
            r->route = RT_BLOCKING;
            r->flags |= REQ_F_BLOCKING;
        }
        return 0;
    case CMD_PUBSUB:
        r->route = RT_TUNNEL;
        if (f->cluster != NULL) {
            return 0; /* tracked once its slot is known (router_pubsub.c) */
        }
        if (s->subs == NULL) {
            s->subs = sub_sets_new();
        }
        subs_track(&s->subs->channels, &s->subs->patterns, &s->subs->shards, cmd->name, req);
        return 0;
    case CMD_TRANSACTION:
        if (strcmp(cmd->name, "multi") == 0) {
            r->route = RT_MULTI;
        } else if (strcmp(cmd->name, "exec") == 0) {
            r->route = RT_EXEC;
        } else if (strcmp(cmd->name, "discard") == 0) {
            r->route = RT_DISCARD;
        } else if (strcmp(cmd->name, "watch") == 0) {
            r->route = RT_WATCH;
        } else {
            r->route = RT_UNWATCH;
        }
        return 0;
    case CMD_CONNSTATE:
        if (strcmp(cmd->name, "select") == 0) {
            long long db;
            if (argc != 2) {
                return 0; /* Redis answers the arity error */
            }
            if (resp_arg_ll(&argv[1], &db) != 0) {
                set_error(r, "-ERR value is not an integer or out of range\r\n%s", "");
            } else if (db < 0 || db > 0x7fffffff) {
                set_error(r, "-ERR DB index is out of range\r\n%s", "");
            } else {
                r->route = RT_SELECT;
                r->arg = db;
                return 0;
            }
            return 1;
        }
        if (strcmp(cmd->name, "monitor") == 0 || strcmp(cmd->name, "client|reply") == 0) {
            r->route = RT_TUNNEL;
            return 0;
        }
        r->route = RT_STICKY;
        if (strcmp(cmd->name, "client|tracking") == 0 && argc >= 3) {
            for (size_t i = 3; i < argc; i++) {
                if (arg_eq(&argv[i], "redirect")) {
                    /* The id a client learns from CLIENT ID is ferry's; the
                     * Redis connection invalidations would go to changes
                     * at every failover. */
                    set_error(r,
                              "-ERR ferry: CLIENT TRACKING REDIRECT is not supported through "
                              "the proxy (client ids are ferry's); use RESP3 (HELLO 3), "
                              "whose invalidations come on the same connection\r\n%s",
                              "");
                    f->stats.commands_denied++;
                    return 1;
                }
            }
            r->arg = arg_eq(&argv[2], "on") ? TRACK_ON : TRACK_OFF;
        }
        return 0;
    case CMD_LOCAL:
        if (strcmp(cmd->name, "auth") == 0) {
            r->route = RT_AUTH;
            if (f->cfg->client_auth == CLIENT_AUTH_REDIS && (argc == 2 || argc == 3)) {
                size_t n = acl_encode(r, argc == 3 ? &argv[1] : NULL, &argv[argc - 1]);
                r->arg = AUTH_REDIS | ((long long)n << ACL_ARG_LEN_SHIFT);
            } else if (argc == 2) {
                r->arg = password_ok(f, NULL, &argv[1]);
            } else if (argc == 3) {
                r->arg = password_ok(f, &argv[1], &argv[2]);
            } else {
                set_error(r, "-ERR syntax error\r\n%s", "");
            }
        } else if (strcmp(cmd->name, "hello") == 0) {
            classify_hello(f, r, req);
        } else if (strcmp(cmd->name, "quit") == 0) {
            r->route = RT_QUIT;
        } else {
            r->route = RT_RESET;
        }
        return 1;
    case CMD_DENIED:
    case CMD_STATELESS:
    default:
        break;
    }
    if (strcmp(cmd->name, "config|set") == 0 && refuse_config_set(f, r, req, "CONFIG")) {
        return 1;
    }
    int cl = clients_classify(cmd, argc);
    if (cl != CL_NONE && cl != CL_ID && cl != CL_INFO && f->cfg->client_auth == CLIENT_AUTH_REDIS) {
        /* A Redis ACL user: Redis says whether it may list, kill or
         * unblock clients (about ferry's links, as before). */
        cl = CL_NONE;
    }
    if (cl != CL_NONE) {
        /* Ferry's clients, not Redis' links (its arguments are read from
         * r->data when dispatched). */
        r->route = RT_CLIENT;
        r->arg = cl;
    }
    return 0;
}

/* EVAL, EVALSHA, FCALL and their _RO variants: the slot of the keys they
 * declare (numkeys at argv[2], the keys after it), -1 for none (numkeys 0,
 * or a numkeys Redis refuses itself: any master answers that error as a
 * node would), -2 for keys in two slots. */
static int script_slot(const resp_request *req)
{
    long long numkeys;
    if (req->argc < 3 || resp_arg_ll(&req->argv[2], &numkeys) != 0 || numkeys <= 0 ||
        numkeys > (long long)req->argc - 3) {
        return -1;
    }
    int slot = -1;
    for (size_t i = 3; i < 3 + (size_t)numkeys; i++) {
        int ks = slot_of_key(req->argv[i].ptr, req->argv[i].len);
        if (slot >= 0 && ks != slot) {
            return -2;
        }
        slot = ks;
    }
    return slot;
}

/* Keys in two slots: MGET, MSET, DEL, UNLINK, EXISTS and TOUCH are split,
 * one part per slot (router.c sends them in turn, split.c merges their
 * replies); an MSET a node refuses for its arity goes to its first key's
 * slot, whose node answers that error. 1 when r is routed so. */
static int classify_split(ferry *f, request *r, const resp_request *req)
{
    split_kind kind = split_kind_of(r->cmd);
    if (kind == SPLIT_NONE) {
        return 0;
    }
    r->sp = split_new(kind, req);
    if (r->sp == NULL) {
        r->slot = slot_of_key(req->argv[1].ptr, req->argv[1].len);
        return 1;
    }
    r->slot = split_slot(r->sp);
    clustermap_count_split(f->cluster);
    return 1;
}

/* Cluster mode: the slot of r's keys (r->slot), or its refusal. Commands
 * whose keys share a slot go to that slot's master; keyless ones to any
 * master. What this step cannot route yet is refused with ferry's words;
 * keys in two slots get a node's own CROSSSLOT. Returns 1 when refused. */
static int classify_slot(session *s, request *r, const resp_request *req)
{
    ferry *f = s->f;
    const command *cmd = r->cmd;
    char name[64];
    if (cmd == NULL) {
        return 0; /* any master answers it as unknown */
    }
    if (r->route == RT_TUNNEL && cmd->cls == CMD_PUBSUB) {
        return router_pubsub_classify(s, r, req);
    }
    display_name(cmd, name, sizeof(name));
    if (r->route == RT_SCRIPT) {
        /* By the keys it declares, on a link lent by that slot's master
         * view, as in Sentinel mode; numkeys 0: any master that is UP (a
         * script may touch no undeclared key of another node's slots). */
        r->slot = script_slot(req);
        if (r->slot == -2) {
            r->slot = -1;
            set_error(r, "-CROSSSLOT Keys in request don't hash to the same slot\r\n%s", "");
            clustermap_count_crossslot(f->cluster);
            return 1;
        }
        return 0;
    }
    if (cluster_client_name(s, r, req)) {
        return 1; /* CLIENT SETNAME/GETNAME: ferry keeps the name (cluster_conn.c) */
    }
    int ms = cluster_movable_slot(cmd, req);
    if (ms == MOVABLE_CROSS) {
        set_error(r, "-CROSSSLOT Keys in request don't hash to the same slot\r\n%s", "");
        clustermap_count_crossslot(f->cluster);
        return 1;
    }
    if (ms != MOVABLE_NONE) {
        r->slot = ms; /* XREAD, XREADGROUP, BLMPOP...: by slot, blocking or not */
        return 0;
    }
    int bk = r->route == RT_SHARED ? broadcast_kind_of(cmd) : BCAST_NONE;
    if (bk == BCAST_INFO) {
        /* INFO with its keyspace section: summed over every master; other
         * sections: one master's (any UP one), as before. */
        size_t argc = req->argc < f->acap ? req->argc : f->acap;
        for (size_t i = 0; i < argc; i++) {
            f->av[i] = req->argv[i].ptr;
            f->al[i] = req->argv[i].len;
        }
        if (!broadcast_info_has_keyspace(argc, f->av, f->al)) {
            bk = BCAST_NONE;
        }
    }
    if (r->route == RT_SHARED && strcmp(cmd->name, "scan") == 0) {
        /* Every master in turn, ferry's cursor naming the shard (keyspace.c). */
        keyspace_scan_parsed(f->cluster, r, req);
        return 0;
    }
    if (strcmp(cmd->name, "readonly") == 0 || strcmp(cmd->name, "readwrite") == 0 ||
        strcmp(cmd->name, "asking") == 0) {
        /* ferry reads from masters and follows ASK itself: nothing to do. */
        set_error(r, "+OK\r\n%s", "");
        return 1;
    }
    if (strncmp(cmd->name, "cluster", 7) == 0 && (cmd->name[7] == '\0' || cmd->name[7] == '|')) {
        set_error(r,
                  "-ERR ferry: cluster mode: %s is not served: ferry presents the cluster as one "
                  "server and follows its slot map itself (connect as to one Redis, without "
                  "cluster support)\r\n",
                  name);
        f->stats.commands_denied++;
        return 1;
    }
    if (bk != BCAST_NONE) {
        /* SCRIPT LOAD/FLUSH/EXISTS, FUNCTION LOAD/DELETE/FLUSH/RESTORE,
         * FLUSHALL, FLUSHDB, KEYS, DBSIZE, RANDOMKEY, INFO (keyspace): to
         * every master of the map in turn (router.c), one reply. */
        r->bc = broadcast_new(bk);
        return 0;
    }
    int later = 0;
    switch (r->route) {
    case RT_SHARED:
        break;
    case RT_BLOCKING:
        /* single-slot pops (BLPOP, BRPOP, BLMOVE, BZPOPMIN...) on a link the
         * slot's master view lends; keyless ones (WAIT) are not routed yet */
        later = cmd->first_key <= 0;
        break;
    case RT_SELECT:
        if (r->arg != 0) {
            /* a cluster has database 0 only (a node answers SELECT is not allowed) */
            set_error(r,
                      "-ERR ferry: cluster mode: SELECT of a database other than 0 is not served: "
                      "ferry presents the cluster as one server, and a cluster has database 0 "
                      "only\r\n%s",
                      "");
            f->stats.commands_denied++;
            return 1;
        }
        break;
    case RT_MULTI:
    case RT_EXEC:
    case RT_DISCARD:
    case RT_WATCH:
    case RT_UNWATCH:
        break; /* pinned to the slot of WATCH's keys or the first keys inside (tx.c) */
    case RT_CLIENT:
        later = r->arg != CL_ID && r->arg != CL_INFO && r->arg != CL_LIST;
        break;
    default:
        later = 1; /* MONITOR, connection state */
        break;
    }
    if (!later && cmd->first_key == 0 && (cmd->flags & CMD_F_WRITE)) {
        later = 1; /* a keyless write: one node's effect would mislead */
    }
    if (!later && (cmd->flags & CMD_F_MOVABLEKEYS)) {
        later = 1; /* its keys are found by Redis' own rules */
    }
    if (later) {
        set_error(r,
                  "-ERR ferry: cluster mode: %s is not routed yet (ferry routes commands whose "
                  "keys share one slot)\r\n",
                  name);
        f->stats.commands_denied++;
        return 1;
    }
    if (cmd->first_key <= 0 || (size_t)cmd->first_key >= req->argc) {
        return 0; /* keyless (or an arity error any master answers) */
    }
    long last = cmd->last_key < 0 ? (long)req->argc + cmd->last_key : cmd->last_key;
    long step = cmd->key_step > 0 ? cmd->key_step : 1;
    if (last >= (long)req->argc) {
        last = (long)req->argc - 1;
    }
    int slot = -1;
    for (long i = cmd->first_key; i <= last; i += step) {
        int ks = slot_of_key(req->argv[i].ptr, req->argv[i].len);
        if (slot >= 0 && ks != slot && r->route == RT_SHARED && classify_split(f, r, req)) {
            return 0; /* MGET, MSET, DEL... one part per slot (split.c) */
        }
        if (slot >= 0 && ks != slot && r->route == RT_BLOCKING && multipop_handles(cmd)) {
            r->slot = MULTIPOP_SLOT; /* the priority pop across slots (multipop.c) */
            return 0;
        }
        if (slot >= 0 && ks != slot) {
            set_error(r, "-CROSSSLOT Keys in request don't hash to the same slot\r\n%s", "");
            clustermap_count_crossslot(f->cluster);
            return 1;
        }
        slot = ks;
    }
    r->slot = slot;
    return 0;
}

int router_classify(session *s, request *r, const resp_request *req)
{
    int rc = classify_route(s, r, req);
    if (rc != 0 || s->f->cluster == NULL) {
        return rc;
    }
    return classify_slot(s, r, req);
}
