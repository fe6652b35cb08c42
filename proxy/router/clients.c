/* clients.c - CLIENT ID, INFO, LIST, KILL and UNBLOCK for ferry's own
 * clients.
 *
 * Through ferry a client's connection to Redis is a shared link, or a
 * dedicated one lent for a while: Redis' own ids name links, not clients.
 * Each session has an id of its own (ferry_next_id: unique across loops,
 * loop i gives i + k * loops), which HELLO and CLIENT ID report, and the
 * commands that name clients act on sessions:
 *
 *   CLIENT ID / INFO      answered at once from the session
 *   CLIENT LIST / KILL    a job: one part per loop (workers_call), each
 *                         lists or closes the matching sessions of its loop;
 *                         the parts come back to the asking loop, which
 *                         answers once every loop did
 *   CLIENT UNBLOCK <id>   one part, on the loop that gave id: the client's
 *                         blocked call is either held by ferry (no master,
 *                         or a pop waiting on the fallback store: answered
 *                         here, null or -UNBLOCKED) or pending on Redis on
 *                         its dedicated link: CLIENT UNBLOCK <that link's
 *                         Redis id> goes to Redis on a shared link, so
 *                         Redis ends the call (nothing popped for nobody)
 *                         and the client gets Redis' reply; ERROR marks
 *                         the call (REQ_F_UNBLOCK) so its -UNBLOCKED is
 *                         its reply, not a failover's refusal (link.c)
 *
 * The asking request is in flight off any link meanwhile (as on the
 * fallback store): requests behind it wait, and if its client leaves, the
 * job frees it when the answer comes. */
#include "clients.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "link.h"
#include "log.h"
#include "tx.h"
#include "upstream.h"
#include "workers.h"

/* Client types of CLIENT LIST TYPE / CLIENT KILL TYPE. */
enum { CT_ANY = -1, CT_NORMAL = 0, CT_PUBSUB, CT_NOTHING /* master, replica: none is ferry's */ };

/* What a CLIENT LIST / KILL matches (every field set is required). */
typedef struct cl_filter {
    int type;      /* CT_* */
    uint64_t id;   /* 0: any */
    uint64_t *ids; /* LIST ID ...: any of these (nids > 0) */
    size_t nids;   /* entries in ids */
    char *addr;    /* client's address "ip:port"; NULL: any */
    char *laddr;   /* ferry's address it connected to; NULL: any */
    char *user;    /* user it runs as; NULL: any */
    int skipme;    /* KILL: not the asking client */
    int old_form;  /* KILL ip:port: +OK / -ERR No such client */
} cl_filter;

/* One CLIENT LIST / KILL / UNBLOCK in progress. Read-only while its parts
 * run (on any loop); changed on the asking loop only. */
typedef struct cl_job {
    ferry *origin;              /* the asking loop (other loops read its workers only) */
    int origin_index;           /* its worker_index */
    request *r;                 /* the asking request (origin only) */
    uint64_t sid;               /* the asking session's id */
    int kind;                   /* CL_LIST, CL_KILL, CL_UNBLOCK */
    cl_filter flt;              /* LIST, KILL */
    uint64_t target;            /* UNBLOCK: the client named */
    int unblock_error;          /* UNBLOCK ... ERROR */
    int pending;                /* parts not back yet */
    int dispatching;            /* the asking dispatch is still sending parts */
    buf out;                    /* LIST: the lines gathered */
    long long count;            /* KILL, UNBLOCK: clients killed / unblocked */
    int kill_self;              /* KILL: the asking client matched (SKIPME no) */
    void (*resume)(session *s); /* the router's: dispatch what s sent after r */
} cl_job;

/* A job's work on one loop. */
typedef struct cl_part {
    cl_job *job;
    buf out;              /* LIST: lines of this loop's clients */
    long long count;      /* KILL, UNBLOCK */
    int kill_self;        /* KILL */
    uint64_t seq;         /* UNBLOCK: the blocked call asked about (its seq) */
    uint64_t since;       /* UNBLOCK: uv_now() when first put off (0: never) */
    struct cl_part *next; /* UNBLOCK: in f->unblock_later while put off */
} cl_part;

#define UNBLOCK_LATER_MS 1000 /* how long an UNBLOCK waits for its link's id */

static void part_back(ferry *f, cl_part *p);

/* ---------------------------------------------------------------- helpers */

static char *arg_dup(const resp_arg *a)
{
    return xstrndup(a->ptr, a->len);
}

static int type_by_name(const resp_arg *a)
{
    if (resp_arg_is(a, "normal")) {
        return CT_NORMAL;
    }
    if (resp_arg_is(a, "pubsub")) {
        return CT_PUBSUB;
    }
    if (resp_arg_is(a, "master") || resp_arg_is(a, "slave") || resp_arg_is(a, "replica")) {
        return CT_NOTHING;
    }
    return CT_ANY;
}

static void error_unknown_type(session *s, request *r, const resp_arg *a)
{
    char line[200];
    snprintf(line, sizeof(line), "-ERR Unknown client type '%.*s'\r\n",
             (int)(a->len < 100 ? a->len : 100), a->ptr);
    s->f->session_ops->answer_str(s, r, line);
}

/* "ip:port" of a socket address, Redis' way ("[ip6]:port"). */
static void format_addr(const struct sockaddr_storage *ss, char *out, size_t len)
{
    char host[64] = "?";
    int port = 0;
    if (ss->ss_family == AF_INET) {
        const struct sockaddr_in *in = (const struct sockaddr_in *)ss;
        uv_ip4_name(in, host, sizeof(host));
        port = ntohs(in->sin_port);
        snprintf(out, len, "%s:%d", host, port);
    } else if (ss->ss_family == AF_INET6) {
        const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)ss;
        uv_ip6_name(in6, host, sizeof(host));
        port = ntohs(in6->sin6_port);
        snprintf(out, len, "[%s]:%d", host, port);
    } else {
        snprintf(out, len, "?:0");
    }
}

/* The client's address (addr=) and ferry's end of it (laddr=); a unix
 * socket is "<path>:0" for both, as in Redis. */
static void session_addrs(session *c, char *addr, char *laddr, size_t len)
{
    struct sockaddr_storage ss;
    int n = sizeof(ss);
    if (c->io.h.type == UV_NAMED_PIPE) {
        char path[256];
        size_t pl = sizeof(path);
        if (uv_pipe_getsockname(&c->io.pipe, path, &pl) != 0) {
            pl = 0;
        }
        snprintf(addr, len, "%.*s:0", (int)pl, path);
        snprintf(laddr, len, "%.*s:0", (int)pl, path);
        return;
    }
    snprintf(addr, len, "%s", session_peer(c));
    if (uv_tcp_getsockname(&c->io.tcp, (struct sockaddr *)&ss, &n) == 0) {
        format_addr(&ss, laddr, len);
    } else {
        snprintf(laddr, len, "?:0");
    }
}

/* The name CLIENT SETNAME (or HELLO ... SETNAME) gave c: the last one in
 * the settings it keeps. Empty when none. */
static void session_name(const session *c, char *out, size_t len)
{
    resp_parser *p = resp_parser_new(NULL);
    const char *q = buf_head(&session_extra_r(c)->sticky_log);
    size_t left = buf_used(&session_extra_r(c)->sticky_log);
    resp_request req;
    out[0] = '\0';
    while (left > 0 && resp_parse_request(p, q, left, &req) == RESP_OK) {
        if (req.argc == 3 && resp_arg_is(&req.argv[0], "client") &&
            resp_arg_is(&req.argv[1], "setname")) {
            size_t n = req.argv[2].len < len - 1 ? req.argv[2].len : len - 1;
            memcpy(out, req.argv[2].ptr, n);
            out[n] = '\0';
        }
        q += req.len;
        left -= req.len;
    }
    resp_parser_free(p);
}

void clients_session_name(const session *c, char *out, size_t len)
{
    session_name(c, out, len);
}

static const char *session_user(const session *c)
{
    return c->ident != NULL && c->ident->user != NULL ? c->ident->user : "default";
}

static int session_type(const session *c)
{
    return c->tunnel == TUN_PUBSUB || c->tunnel == TUN_PUBSUB_LOST ? CT_PUBSUB : CT_NORMAL;
}

/* c's blocking call, if the first request it waits for is one. */
static request *blocked_call(session *c)
{
    list_node *n;
    list_foreach(n, &c->requests)
    {
        request *r = list_entry(n, request, sq);
        if (r->state == REQ_ANSWERED) {
            continue;
        }
        return (r->flags & REQ_F_BLOCKING) ? r : NULL;
    }
    return NULL;
}

/* Commands c's open MULTI has queued (multi=). */
static int queued(const session *c)
{
    resp_parser *p = resp_parser_new(NULL);
    const char *q = buf_head(&session_extra_r(c)->tx_log);
    size_t left = buf_used(&session_extra_r(c)->tx_log);
    resp_request req;
    int n = 0;
    while (left > 0 && resp_parse_request(p, q, left, &req) == RESP_OK) {
        n++;
        q += req.len;
        left -= req.len;
    }
    resp_parser_free(p);
    return n;
}

/* One line of CLIENT LIST / INFO for c, in Redis' format. Fields ferry
 * has no value for are 0 (buffers Redis counts and ferry does not). */
static void client_line(buf *b, session *c)
{
    char addr[300], laddr[300], name[256], flags[8], line[1400];
    uint64_t now = uv_now(c->f->loop);
    char *fp = flags;
    request *bc = blocked_call(c);
    session_addrs(c, addr, laddr, sizeof(addr));
    session_name(c, name, sizeof(name));
    if (session_type(c) == CT_PUBSUB) {
        *fp++ = 'P';
    }
    if (tx_in_multi(c)) {
        *fp++ = 'x';
    }
    if (bc != NULL && bc->state != REQ_WAITING) {
        *fp++ = 'b';
    }
    if (c->tracking) {
        *fp++ = 't';
    }
    if (c->io.h.type == UV_NAMED_PIPE) {
        *fp++ = 'U';
    }
    if (fp == flags) {
        *fp++ = 'N';
    }
    *fp = '\0';
    uv_os_fd_t fd = -1;
    if (uv_fileno(&c->io.h, &fd) != 0) {
        fd = -1;
    }
    const sub_sets *ss = c->subs;
    int n = snprintf(
        line, sizeof(line),
        "id=%llu addr=%s laddr=%s fd=%d name=%s age=%llu idle=%llu flags=%s db=%d sub=%zu "
        "psub=%zu ssub=%zu multi=%d qbuf=%zu qbuf-free=0 argv-mem=0 multi-mem=0 rbs=0 rbp=0 "
        "obl=0 oll=0 omem=%zu tot-mem=%zu events=r cmd=%s user=%s redir=-1 resp=%d\n",
        (unsigned long long)c->id, addr, laddr, (int)fd, name,
        (unsigned long long)((now - c->opened_ms) / 1000),
        (unsigned long long)((now - c->last_active_ms) / 1000), flags, c->db,
        ss != NULL ? ss->channels.n : 0, ss != NULL ? ss->patterns.n : 0,
        ss != NULL ? ss->shards.n : 0, tx_in_multi(c) ? queued(c) : -1,
        buf_used(&session_extra_r(c)->in), outq_len(&c->out), session_mem(c),
        c->last_cmd != NULL ? c->last_cmd->name : "NULL", session_user(c), c->proto);
    if (n > 0) {
        buf_append(b, line, (size_t)n < sizeof(line) ? (size_t)n : sizeof(line) - 1);
    }
}

/* CLIENT INFO / LIST's text: a verbatim string in RESP3, a bulk in RESP2. */
static void answer_text(session *s, request *r, const char *p, size_t n)
{
    buf b;
    buf_init(&b);
    if (s->proto == 3) {
        char head[32];
        snprintf(head, sizeof(head), "=%zu\r\ntxt:", n + 4);
        buf_append_str(&b, head);
        buf_append(&b, p, n);
        buf_append_str(&b, "\r\n");
    } else {
        buf_append_bulk(&b, p, n);
    }
    s->f->session_ops->answer(s, r, buf_head(&b), buf_used(&b));
    buf_free(&b);
}

/* ------------------------------------------------------------ each loop */

static int matches(const cl_job *job, ferry *f, session *c)
{
    const cl_filter *fl = &job->flt;
    if (c->state == SESSION_CLOSING) {
        return 0;
    }
    if (fl->type != CT_ANY && session_type(c) != fl->type) {
        return 0;
    }
    if (fl->id != 0 && c->id != fl->id) {
        return 0;
    }
    if (fl->nids > 0) {
        size_t i;
        for (i = 0; i < fl->nids && fl->ids[i] != c->id; i++) {
        }
        if (i == fl->nids) {
            return 0;
        }
    }
    if (fl->addr != NULL || fl->laddr != NULL) {
        char addr[300], laddr[300];
        session_addrs(c, addr, laddr, sizeof(addr));
        if ((fl->addr != NULL && strcmp(fl->addr, addr) != 0) ||
            (fl->laddr != NULL && strcmp(fl->laddr, laddr) != 0)) {
            return 0;
        }
    }
    if (fl->user != NULL && strcmp(fl->user, session_user(c)) != 0) {
        return 0;
    }
    (void)f;
    return 1;
}

static int is_asker(const cl_job *job, ferry *f, const session *c)
{
    return f == job->origin && c->id == job->sid;
}

static void run_list(ferry *f, cl_part *p)
{
    list_node *n;
    list_foreach(n, &f->sessions)
    {
        session *c = list_entry(n, session, node);
        if (matches(p->job, f, c)) {
            client_line(&p->out, c);
        }
    }
}

static void run_kill(ferry *f, cl_part *p)
{
    list_node *n = f->sessions.next;
    while (n != &f->sessions) {
        session *c = list_entry(n, session, node);
        n = n->next; /* c may leave the list */
        if (!matches(p->job, f, c)) {
            continue;
        }
        if (is_asker(p->job, f, c)) {
            if (p->job->flt.skipme) {
                continue;
            }
            p->kill_self = 1; /* closed after its reply */
        } else {
            c->f->session_ops->close(c, "killed by CLIENT KILL");
        }
        p->count++;
    }
}

static session *find_session(ferry *f, uint64_t id)
{
    list_node *n;
    list_foreach(n, &f->sessions)
    {
        session *c = list_entry(n, session, node);
        if (c->id == id && c->state != SESSION_CLOSING) {
            return c;
        }
    }
    return NULL;
}

static request *find_request(session *c, uint64_t seq)
{
    list_node *n;
    list_foreach(n, &c->requests)
    {
        request *r = list_entry(n, request, sq);
        if (r->seq == seq) {
            return r;
        }
    }
    return NULL;
}

/* Redis answered the CLIENT UNBLOCK ferry sent for part p (reply NULL: its
 * link was lost first). */
static void unblock_done(link *l, request *ir, const char *reply, size_t len)
{
    cl_part *p = (cl_part *)(intptr_t)ir->arg;
    ferry *f = l->f;
    int one = reply != NULL && len >= 2 && memcmp(reply, ":1", 2) == 0;
    if (reply != NULL && len > 0 && reply[0] == '-') {
        char why[200];
        link_error_text(reply, len, why, sizeof(why));
        log_warn("client %llu: CLIENT UNBLOCK refused by Redis: %s",
                 (unsigned long long)p->job->target, why);
    }
    if (!one) {
        /* Nothing was unblocked: a later -UNBLOCKED is a failover's again. */
        session *c = find_session(f, p->job->target);
        request *br = c != NULL ? find_request(c, p->seq) : NULL;
        if (br != NULL) {
            br->flags &= ~REQ_F_UNBLOCK;
        }
    }
    p->count = one;
    part_back(f, p);
}

static void run_unblock(ferry *f, cl_part *p)
{
    const cl_job *job = p->job;
    session *c = find_session(f, job->target);
    request *br = c != NULL ? blocked_call(c) : NULL;
    if (br == NULL || is_asker(job, f, c)) {
        part_back(f, p);
        return;
    }
    if (br->state == REQ_HELD) {
        /* Held by ferry (no master, or waiting for the fallback store):
         * ended here, as Redis would end it. */
        if (job->unblock_error) {
            c->f->session_ops->answer_str(c, br,
                                          "-UNBLOCKED client unblocked via CLIENT UNBLOCK\r\n");
        } else {
            c->f->session_ops->answer_str(c, br, session_null(c, request_expired_reply(br)));
        }
        log_debug("client %llu: held blocking call unblocked (CLIENT UNBLOCK)",
                  (unsigned long long)c->id);
        p->count = 1;
        c->f->session_ops->flush_answered(c);
        f->wake_pending = 1; /* what it sent after the call goes on */
        part_back(f, p);
        return;
    }
    link *l = br->link;
    link *sh = upstream_shared(f->up, &f->up->self, c->id, 2);
    uint64_t now = uv_now(f->loop);
    if (br->state == REQ_SENT && l != NULL && l == c->dlink && l->redis_id <= 0 &&
        l->state == LINK_READY && (p->since == 0 || now - p->since < UNBLOCK_LATER_MS)) {
        /* Blocked on a link whose HELLO reply (its Redis id) this loop has
         * not read yet (both were ready in one turn, the asker's first):
         * asked again at the next tick (clients_tick). */
        if (p->since == 0) {
            p->since = now;
        }
        p->next = f->unblock_later;
        f->unblock_later = p;
        return;
    }
    if (br->state != REQ_SENT || l == NULL || l != c->dlink || l->redis_id <= 0 ||
        l->state != LINK_READY || sh == NULL) {
        part_back(f, p); /* served already, or nowhere Redis could unblock it */
        return;
    }
    char id[32];
    snprintf(id, sizeof(id), "%lld", l->redis_id);
    const char *argv[] = {"CLIENT", "UNBLOCK", id, job->unblock_error ? "ERROR" : "TIMEOUT"};
    if (job->unblock_error) {
        br->flags |= REQ_F_UNBLOCK;
    }
    p->seq = br->seq;
    link_internal_sure(sh, argv, 4, unblock_done, (long long)(intptr_t)p);
}

/* On the loop the part is for (f NULL: that loop has stopped). */
static void part_run(ferry *f, void *arg)
{
    cl_part *p = arg;
    if (f == NULL) {
        part_back(NULL, p);
        return;
    }
    switch (p->job->kind) {
    case CL_LIST:
        run_list(f, p);
        break;
    case CL_KILL:
        run_kill(f, p);
        break;
    case CL_UNBLOCK:
        run_unblock(f, p);
        return; /* it calls part_back, maybe later */
    default:
        break;
    }
    part_back(f, p);
}

/* ------------------------------------------------------------ the asker */

static void job_free(cl_job *job)
{
    free(job->flt.ids);
    free(job->flt.addr);
    free(job->flt.laddr);
    free(job->flt.user);
    buf_free(&job->out);
    free(job);
}

/* Every part is back: answer the asking request. */
static void job_answer(ferry *f, cl_job *job)
{
    request *r = job->r;
    session *s = r->s;
    if (s == NULL) {
        request_free(f, r); /* its client left meanwhile */
        job_free(job);
        return;
    }
    s->inflight--;
    if (s->inflight == 0) {
        s->flight_link = NULL;
    }
    char line[64];
    if (job->kill_self) {
        /* Answered first, then closed (Redis' CLOSE_AFTER_REPLY). */
        r->flags |= REQ_F_QUIT;
    }
    switch (job->kind) {
    case CL_LIST:
        answer_text(s, r, buf_head(&job->out), buf_used(&job->out));
        break;
    case CL_KILL:
        if (job->flt.old_form) {
            s->f->session_ops->answer_str(s, r,
                                          job->count > 0 ? "+OK\r\n" : "-ERR No such client\r\n");
        } else {
            snprintf(line, sizeof(line), ":%lld\r\n", job->count);
            s->f->session_ops->answer_str(s, r, line);
        }
        break;
    default:
        s->f->session_ops->answer_str(s, r, job->count > 0 ? ":1\r\n" : ":0\r\n");
        break;
    }
    int later = !job->dispatching;
    void (*resume)(session *) = job->resume;
    job_free(job);
    s->f->session_ops->flush_answered(s);
    if (later && s->inflight == 0) {
        resume(s);
    }
    s->f->session_ops->check_reading(s);
}

/* On the asking loop: part p is back (f NULL: the asking loop stopped). */
static void part_merge(ferry *f, void *arg)
{
    cl_part *p = arg;
    cl_job *job = p->job;
    if (f != NULL) {
        buf_append(&job->out, buf_head(&p->out), buf_used(&p->out));
        job->count += p->count;
        job->kill_self |= p->kill_self;
    }
    buf_free(&p->out);
    free(p);
    if (--job->pending == 0) {
        if (f == NULL) {
            return; /* the asking loop is gone: so is the request */
        }
        job_answer(f, job);
    }
}

/* On the part's loop f: send p back to the asking loop (merged there,
 * never on this thread). f NULL: that loop stopped before p ran. */
static void part_back(ferry *f, cl_part *p)
{
    cl_job *job = p->job;
    int rc = f != NULL ? workers_call(f, job->origin_index, part_merge, p)
                       : workers_post(job->origin, job->origin_index, part_merge, p);
    if (rc != 0) {
        buf_free(&p->out);
        free(p); /* the asking loop stopped: nothing to answer */
    }
}

/* Send job's parts: to every loop, or to the loop that gave target. */
static void job_start(session *s, request *r, cl_job *job)
{
    ferry *f = s->f;
    int n = workers_loops(f);
    int first = 0, last = n - 1;
    job->origin = f;
    job->origin_index = f->worker_index;
    job->r = r;
    job->sid = s->id;
    if (job->kind == CL_UNBLOCK) {
        first = last = workers_loop_of(f, job->target);
    }
    r->s = s;
    r->sent_ns = uv_hrtime();
    request_set_state(r, REQ_SENT);
    s->inflight++;
    s->flight_link = NULL; /* in flight off any link */
    /* One count per part and one for this call, so no part can end the
     * job (and free it) before every part is sent. */
    job->pending = last - first + 2;
    job->dispatching = 1;
    for (int i = first; i <= last; i++) {
        cl_part *p = xcalloc(1, sizeof(*p));
        p->job = job;
        buf_init(&p->out);
        if (workers_call(f, i, part_run, p) != 0) {
            part_merge(f, p); /* that loop stopped: it has no clients */
        }
    }
    if (--job->pending == 0) {
        job_answer(f, job); /* every part ran on this loop: answered in this dispatch */
    } else {
        job->dispatching = 0;
    }
}

/* ------------------------------------------------------------- commands */

/* CLIENT KILL's filters, as Redis 7.0 parses them. Returns 0, or answers
 * r with Redis' error and returns -1. */
static int parse_kill(session *s, request *r, const resp_request *req, cl_filter *fl)
{
    fl->type = CT_ANY;
    fl->skipme = 1;
    if (req->argc == 3) {
        fl->addr = arg_dup(&req->argv[2]);
        fl->skipme = 0; /* the old form may kill the asking client */
        fl->old_form = 1;
        return 0;
    }
    for (size_t i = 2; i < req->argc; i += 2) {
        const resp_arg *opt = &req->argv[i];
        const resp_arg *val = &req->argv[i + 1];
        if (i + 1 >= req->argc) {
            s->f->session_ops->answer_str(s, r, "-ERR syntax error\r\n");
            return -1;
        }
        if (resp_arg_is(opt, "id")) {
            long long v;
            if (resp_arg_ll(val, &v) != 0 || v < 1) {
                s->f->session_ops->answer_str(s, r, "-ERR client-id should be greater than 0\r\n");
                return -1;
            }
            fl->id = (uint64_t)v;
        } else if (resp_arg_is(opt, "type")) {
            fl->type = type_by_name(val);
            if (fl->type == CT_ANY) {
                error_unknown_type(s, r, val);
                return -1;
            }
        } else if (resp_arg_is(opt, "addr")) {
            free(fl->addr);
            fl->addr = arg_dup(val);
        } else if (resp_arg_is(opt, "laddr")) {
            free(fl->laddr);
            fl->laddr = arg_dup(val);
        } else if (resp_arg_is(opt, "user")) {
            free(fl->user);
            fl->user = arg_dup(val);
        } else if (resp_arg_is(opt, "skipme")) {
            if (resp_arg_is(val, "yes")) {
                fl->skipme = 1;
            } else if (resp_arg_is(val, "no")) {
                fl->skipme = 0;
            } else {
                s->f->session_ops->answer_str(s, r, "-ERR syntax error\r\n");
                return -1;
            }
        } else {
            s->f->session_ops->answer_str(s, r, "-ERR syntax error\r\n");
            return -1;
        }
    }
    return 0;
}

/* CLIENT LIST [TYPE t] [ID id ...]. Returns 0, or answers r and returns -1. */
static int parse_list(session *s, request *r, const resp_request *req, cl_filter *fl)
{
    fl->type = CT_ANY;
    if (req->argc == 4 && resp_arg_is(&req->argv[2], "type")) {
        fl->type = type_by_name(&req->argv[3]);
        if (fl->type == CT_ANY) {
            error_unknown_type(s, r, &req->argv[3]);
            return -1;
        }
        return 0;
    }
    if (req->argc > 3 && resp_arg_is(&req->argv[2], "id")) {
        fl->ids = xcalloc(req->argc - 3, sizeof(*fl->ids));
        for (size_t i = 3; i < req->argc; i++) {
            long long v;
            if (resp_arg_ll(&req->argv[i], &v) != 0) {
                s->f->session_ops->answer_str(s, r, "-ERR Invalid client ID\r\n");
                return -1;
            }
            fl->ids[fl->nids++] = (uint64_t)v;
        }
        if (fl->nids > 0) {
            return 0;
        }
    }
    if (req->argc != 2) {
        s->f->session_ops->answer_str(s, r, "-ERR syntax error\r\n");
        return -1;
    }
    return 0;
}

int clients_classify(const command *cmd, size_t argc)
{
    const char *sub;
    if (cmd == NULL || strncmp(cmd->name, "client|", 7) != 0) {
        return CL_NONE;
    }
    sub = cmd->name + 7;
    if (strcmp(sub, "id") == 0 && argc == 2) {
        return CL_ID;
    }
    if (strcmp(sub, "info") == 0 && argc == 2) {
        return CL_INFO;
    }
    if (strcmp(sub, "list") == 0 && argc >= 2) {
        return CL_LIST;
    }
    if (strcmp(sub, "kill") == 0 && argc >= 3) {
        return CL_KILL;
    }
    if (strcmp(sub, "unblock") == 0 && (argc == 3 || argc == 4)) {
        return CL_UNBLOCK;
    }
    return CL_NONE;
}

void clients_dispatch(session *s, request *r, void (*resume)(session *s))
{
    ferry *f = s->f;
    resp_parser *pp = resp_parser_new(NULL);
    resp_request req;
    cl_job *job = NULL;
    char line[64];

    f->stats.commands_local++;
    if (resp_parse_request(pp, buf_head(&r->data), buf_used(&r->data), &req) != RESP_OK ||
        req.argc < 2) {
        s->f->session_ops->answer_str(s, r,
                                      "-ERR syntax error\r\n"); /* cannot happen: it was parsed */
        resp_parser_free(pp);
        return;
    }
    switch ((int)r->arg) {
    case CL_ID:
        snprintf(line, sizeof(line), ":%llu\r\n", (unsigned long long)s->id);
        s->f->session_ops->answer_str(s, r, line);
        break;
    case CL_INFO: {
        buf b;
        buf_init(&b);
        client_line(&b, s);
        answer_text(s, r, buf_head(&b), buf_used(&b));
        buf_free(&b);
        break;
    }
    case CL_LIST:
    case CL_KILL:
        job = xcalloc(1, sizeof(*job));
        job->kind = (int)r->arg;
        buf_init(&job->out);
        if ((job->kind == CL_LIST ? parse_list : parse_kill)(s, r, &req, &job->flt) != 0) {
            job_free(job);
            job = NULL;
        }
        break;
    case CL_UNBLOCK: {
        long long id;
        int error = 0;
        if (req.argc == 4 && resp_arg_is(&req.argv[3], "error")) {
            error = 1;
        } else if (req.argc == 4 && !resp_arg_is(&req.argv[3], "timeout")) {
            s->f->session_ops->answer_str(
                s, r, "-ERR CLIENT UNBLOCK reason should be TIMEOUT or ERROR\r\n");
            break;
        }
        if (resp_arg_ll(&req.argv[2], &id) != 0) {
            s->f->session_ops->answer_str(s, r, "-ERR value is not an integer or out of range\r\n");
            break;
        }
        if (id <= 0) {
            s->f->session_ops->answer_str(s, r, ":0\r\n");
            break;
        }
        job = xcalloc(1, sizeof(*job));
        job->kind = CL_UNBLOCK;
        job->target = (uint64_t)id;
        job->unblock_error = error;
        buf_init(&job->out);
        break;
    }
    default:
        s->f->session_ops->answer_str(s, r, "-ERR syntax error\r\n");
        break;
    }
    resp_parser_free(pp);
    if (job != NULL) {
        job->resume = resume;
        job_start(s, r, job);
    }
}

void clients_tick(ferry *f)
{
    cl_part *p = f->unblock_later;
    f->unblock_later = NULL;
    while (p != NULL) {
        cl_part *next = p->next;
        p->next = NULL;
        run_unblock(f, p);
        p = next;
    }
}

void clients_free(ferry *f)
{
    cl_part *p = f->unblock_later;
    f->unblock_later = NULL;
    while (p != NULL) {
        cl_part *next = p->next;
        part_back(f, p); /* answered with what it has: 0 */
        p = next;
    }
}
