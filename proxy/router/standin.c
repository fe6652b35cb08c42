/* standin.c - PING, ECHO and INFO answered by ferry while no master is
 * usable (standin.h). The replies are Redis 7.0's: PING's and ECHO's forms
 * and arity errors, INFO as a bulk string (RESP3: a verbatim "txt" string)
 * made of "# Section" blocks of "field:value" lines, one empty line between
 * blocks. ferry has only the sections it can answer truthfully: its own
 * server, clients and stats, the role it presents (a master: it takes the
 * queue writes the fallback store serves), and a "ferry" section with the
 * master view and the store. It has no Keyspace, Memory or Persistence:
 * those are facts of a Redis it cannot reach, and an empty Keyspace would
 * say the data set is empty. An unknown section gives "", as on Redis. */
#include "standin.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <sys/utsname.h>

#include "outage.h"
#include "stats.h"
#include "upstream.h"
#include "workers.h"

#define STANDIN_LINE_MAX 512 /* bytes of one "field:value" line */

typedef void (*section_fn)(session *s, buf *b);

static void info_server(session *s, buf *b);
static void info_clients(session *s, buf *b);
static void info_stats(session *s, buf *b);
static void info_replication(session *s, buf *b);
static void info_cluster(session *s, buf *b);
static void info_ferry(session *s, buf *b);

/* In the order INFO prints them; all of them are the default set. */
static const struct {
    const char *name;  /* as INFO's argument, lowercase */
    const char *title; /* its "# Title" line */
    section_fn fn;     /* appends its lines */
} sections[] = {
    {"server", "Server", info_server},    {"clients", "Clients", info_clients},
    {"stats", "Stats", info_stats},       {"replication", "Replication", info_replication},
    {"cluster", "Cluster", info_cluster}, {"ferry", "Ferry", info_ferry},
};
#define NSECTIONS (sizeof(sections) / sizeof(sections[0]))

/* One "field:value" line; CR and LF in the value become spaces. */
static void field(buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void field(buf *b, const char *fmt, ...)
{
    char line[STANDIN_LINE_MAX];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof(line), fmt, ap);
    va_end(ap);
    if (n < 0) {
        return;
    }
    if ((size_t)n >= sizeof(line)) {
        n = (int)sizeof(line) - 1;
    }
    for (int i = 0; i < n; i++) {
        if (line[i] == '\r' || line[i] == '\n') {
            line[i] = ' ';
        }
    }
    buf_append(b, line, (size_t)n);
    buf_append_str(b, "\r\n");
}

static unsigned long long ull(uint64_t v)
{
    return (unsigned long long)v;
}

/* ------------------------------------------------------------- sections */

static void info_server(session *s, buf *b)
{
    ferry *f = s->f;
    const config *cfg = f->cfg;
    struct utsname un;
    uv_timeval64_t tv;
    int port = 0;
    uint64_t up_s = (uv_now(f->loop) - f->started_ms) / 1000;

    for (int i = 0; i < cfg->nlisten; i++) {
        if (!cfg->listen[i].is_unix) {
            port = cfg->listen[i].port; /* Redis' tcp_port: 0 when unix only */
            break;
        }
    }
    if (uv_gettimeofday(&tv) != 0) {
        tv.tv_sec = 0;
        tv.tv_usec = 0;
    }
    field(b, "redis_version:%s", command_redis_version());
    field(b, "redis_mode:standalone");
    field(b, "ferry_version:%s", FERRY_VERSION);
    if (uname(&un) == 0) {
        field(b, "os:%s %s %s", un.sysname, un.release, un.machine);
    }
    field(b, "arch_bits:%d", (int)(sizeof(void *) * 8));
    field(b, "process_id:%ld", (long)uv_os_getpid());
    field(b, "tcp_port:%d", port);
    field(b, "server_time_usec:%lld", (long long)tv.tv_sec * 1000000 + (long long)tv.tv_usec);
    field(b, "uptime_in_seconds:%llu", ull(up_s));
    field(b, "uptime_in_days:%llu", ull(up_s / 86400));
    field(b, "config_file:%s", cfg->file != NULL ? cfg->file : "");
}

static void info_clients(session *s, buf *b)
{
    field(b, "connected_clients:%llu", ull(workers_clients(s->f)));
    field(b, "maxclients:%d", s->f->cfg->max_clients);
}

static void info_stats(session *s, buf *b)
{
    ferry_stats st;
    workers_totals(s->f, &st);
    field(b, "total_connections_received:%llu", ull(st.clients_total));
    field(b, "total_commands_processed:%llu", ull(st.commands_total));
    field(b, "rejected_connections:%llu", ull(st.clients_rejected));
    field(b, "ferry_requests_tryagain:%llu", ull(st.requests_tryagain));
    field(b, "ferry_fallback_written:%llu", ull(st.fallback_written));
}

/* ferry presents itself as a master (HELLO says so too): while DOWN it
 * still takes the queue writes the fallback store serves, and a client
 * that checks the role before writing must not stop writing to it. The
 * line after says no master stands behind it now. */
static void info_replication(session *s, buf *b)
{
    (void)s;
    field(b, "role:master");
    field(b, "connected_slaves:0");
    field(b, "ferry_master_view:down");
}

static void info_cluster(session *s, buf *b)
{
    (void)s;
    field(b, "cluster_enabled:0");
}

static void info_ferry(session *s, buf *b)
{
    ferry *f = s->f;
    const upstream *up = f->up;
    uint64_t rows, age;

    field(b, "ferry_master_view:down");
    field(b, "ferry_master_mode:%s", f->cfg->has_sentinel ? "sentinel" : "fixed");
    field(b, "ferry_master:%s", upstream_name(up));
    field(b, "ferry_down_for_ms:%llu", ull(uv_now(f->loop) - up->down_since_ms));
    field(b, "ferry_down_reason:%s", up->last_reason);
    field(b, "ferry_workers:%d", f->cfg->workers > 1 ? f->cfg->workers : 1);
    field(b, "ferry_held_bytes:%llu", ull(workers_held(f)));
    if (outage_backlog(f, &rows, &age) != 0) {
        field(b, "ferry_fallback_store:off");
        return;
    }
    field(b, "ferry_fallback_store:on");
    field(b, "ferry_fallback_rows_pending:%llu", ull(rows));
    field(b, "ferry_fallback_oldest_age_ms:%llu", ull(age));
}

/* ---------------------------------------------------------------- replies */

static void answer_ping(session *s, request *r, const resp_request *req, int subscribed)
{
    buf b;
    if (req->argc > 2) {
        s->f->session_ops->answer_str(s, r,
                                      "-ERR wrong number of arguments for 'ping' command\r\n");
        return;
    }
    buf_init(&b);
    if (subscribed) {
        buf_append_count(&b, '*', 2);
        buf_append_bulk(&b, "pong", 4);
        if (req->argc == 2) {
            buf_append_bulk(&b, req->argv[1].ptr, req->argv[1].len);
        } else {
            buf_append_bulk(&b, "", 0);
        }
    } else if (req->argc == 2) {
        buf_append_bulk(&b, req->argv[1].ptr, req->argv[1].len);
    } else {
        buf_append_str(&b, "+PONG\r\n");
    }
    s->f->session_ops->answer(s, r, buf_head(&b), buf_used(&b));
    buf_free(&b);
}

static void answer_echo(session *s, request *r, const resp_request *req)
{
    buf b;
    if (req->argc != 2) {
        s->f->session_ops->answer_str(s, r,
                                      "-ERR wrong number of arguments for 'echo' command\r\n");
        return;
    }
    buf_init(&b);
    buf_append_bulk(&b, req->argv[1].ptr, req->argv[1].len);
    s->f->session_ops->answer(s, r, buf_head(&b), buf_used(&b));
    buf_free(&b);
}

/* The sections INFO's arguments name (none, "default", "all",
 * "everything": every one), in ferry's order. */
static void answer_info(session *s, request *r, const resp_request *req)
{
    int want[NSECTIONS] = {0};
    int any = req->argc < 2;
    buf text, out;
    char head[32];

    for (size_t i = 1; i < req->argc; i++) {
        const resp_arg *a = &req->argv[i];
        if (resp_arg_is(a, "default") || resp_arg_is(a, "all") || resp_arg_is(a, "everything")) {
            any = 1;
        }
        for (size_t k = 0; k < NSECTIONS; k++) {
            if (resp_arg_is(a, sections[k].name)) {
                want[k] = 1;
            }
        }
    }
    buf_init(&text);
    for (size_t k = 0; k < NSECTIONS; k++) {
        if (!any && !want[k]) {
            continue;
        }
        if (buf_used(&text) > 0) {
            buf_append_str(&text, "\r\n");
        }
        buf_append_str(&text, "# ");
        buf_append_str(&text, sections[k].title);
        buf_append_str(&text, "\r\n");
        sections[k].fn(s, &text);
    }
    buf_init(&out);
    if (s->proto == 3) {
        /* Redis 7.0 sends INFO as a verbatim string of format "txt". */
        snprintf(head, sizeof(head), "=%zu\r\ntxt:", buf_used(&text) + 4);
        buf_append_str(&out, head);
        buf_append(&out, buf_head(&text), buf_used(&text));
        buf_append_str(&out, "\r\n");
    } else {
        buf_append_bulk(&out, buf_head(&text), buf_used(&text));
    }
    s->f->session_ops->answer(s, r, buf_head(&out), buf_used(&out));
    buf_free(&out);
    buf_free(&text);
}

int standin_answer(session *s, request *r, int subscribed)
{
    resp_request req;
    if (r->cmd == NULL) {
        return 0;
    }
    const char *name = r->cmd->name;
    int ping = strcmp(name, "ping") == 0;
    int echo = strcmp(name, "echo") == 0;
    int info = strcmp(name, "info") == 0;
    if (!ping && !echo && !info) {
        return 0;
    }
    if (info && s->ident != NULL && !subscribed) {
        return 0; /* a Redis ACL user's: Redis decides what it may see */
    }
    resp_parser *p = resp_parser_new(NULL);
    if (resp_parse_request(p, buf_head(&r->data), buf_used(&r->data), &req) != RESP_OK) {
        resp_parser_free(p);
        return 0;
    }
    if (ping) {
        answer_ping(s, r, &req, subscribed);
    } else if (subscribed) {
        char line[200];
        snprintf(line, sizeof(line),
                 "-ERR Can't execute '%s': only (P|S)SUBSCRIBE / (P|S)UNSUBSCRIBE / PING / "
                 "QUIT / RESET are allowed in this context\r\n",
                 name);
        s->f->session_ops->answer_str(s, r, line);
    } else if (echo) {
        answer_echo(s, r, &req);
    } else {
        answer_info(s, r, &req);
    }
    resp_parser_free(p);
    return 1;
}
