/* clustermap.c - the cluster mode as far as it goes today (clustermap.h):
 * the cluster topology source on ferry's loop, a tick, the signals, and a
 * stats port that answers with the learned map in JSON: a plain connection
 * gets the document, an HTTP GET gets it as the body (503 on /healthz while
 * no slot is known, 200 once all 16384 are). No client listener. */
#include "clustermap.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "buf.h"
#include "cluster.h"
#include "log.h"

#define CLUSTERMAP_TICK_MS 50        /* the source's tick */
#define CLUSTERMAP_PLAIN_WAIT_MS 200 /* silence after which a stats connection is plain */
#define CLUSTERMAP_MAX_REQUEST 4096  /* bytes of an HTTP request read */

typedef struct cmap {
    uv_loop_t *loop;      /* ferry's loop */
    const config *cfg;    /* borrowed */
    cluster_source *cs;   /* the topology source */
    uv_timer_t tick;      /* drives cluster_tick */
    uv_signal_t sig_term; /* stop */
    uv_signal_t sig_int;  /* stop */
    uv_tcp_t stats;       /* the stats listener */
    int stats_on;         /* stats is listening */
    int stopping;         /* a signal came */
} cmap;

typedef struct scli {
    uv_tcp_t tcp;                     /* the stats connection */
    uv_timer_t timer;                 /* plain-wait */
    uv_write_t wr;                    /* the answer */
    cmap *cm;                         /* owner */
    char req[CLUSTERMAP_MAX_REQUEST]; /* what the peer sent */
    size_t nreq;
    buf out;      /* the answer's bytes */
    int answered; /* the answer is written or being written */
    int closing;  /* handles are closing */
    int nclosed;  /* handles closed of 2 */
} scli;

/* ==== the JSON document ==== */

static void json_str(buf *b, const char *s)
{
    buf_append_str(b, "\"");
    for (; *s != '\0'; s++) {
        unsigned char ch = (unsigned char)*s;
        char esc[8];
        if (ch == '"' || ch == '\\') {
            snprintf(esc, sizeof(esc), "\\%c", ch);
            buf_append_str(b, esc);
        } else if (ch < 0x20 || ch >= 0x7f) {
            snprintf(esc, sizeof(esc), "\\u%04x", ch);
            buf_append_str(b, esc);
        } else {
            buf_append(b, s, 1);
        }
    }
    buf_append_str(b, "\"");
}

static const char *health_name(int h)
{
    return h == SLOTMAP_FAILED ? "failed" : h == SLOTMAP_LOADING ? "loading" : "online";
}

static void json_node(buf *b, const slotmap_node *n)
{
    char tmp[64];
    buf_append_str(b, "{\"id\":");
    json_str(b, n->id);
    buf_append_str(b, ",\"host\":");
    json_str(b, n->host);
    snprintf(tmp, sizeof(tmp), ",\"port\":%d,\"health\":", n->port);
    buf_append_str(b, tmp);
    json_str(b, health_name(n->health));
    buf_append_str(b, "}");
}

static void json_map(cmap *cm, buf *b)
{
    const slotmap *m = cluster_map(cm->cs);
    const cluster_counts *k = cluster_get_counts(cm->cs);
    char tmp[256];

    buf_append_str(b, "{\"mode\":\"cluster\",\"routing\":false,\"cluster\":{\"shards\":[");
    for (int i = 0; i < m->nshards; i++) {
        const slotmap_shard *s = &m->shards[i];
        buf_append_str(b, i > 0 ? ",{\"master\":" : "{\"master\":");
        json_node(b, &s->master);
        snprintf(tmp, sizeof(tmp), ",\"epoch\":%llu,\"nslots\":%d,\"slots\":[",
                 (unsigned long long)s->epoch, s->nslots);
        buf_append_str(b, tmp);
        int first = 1;
        for (int lo = 0; lo < CLUSTER_SLOTS; lo++) {
            if (m->owner[lo] != i) {
                continue;
            }
            int hi = lo;
            while (hi + 1 < CLUSTER_SLOTS && m->owner[hi + 1] == i) {
                hi++;
            }
            snprintf(tmp, sizeof(tmp), "%s[%d,%d]", first ? "" : ",", lo, hi);
            buf_append_str(b, tmp);
            first = 0;
            lo = hi;
        }
        buf_append_str(b, "],\"replicas\":[");
        for (int r = 0; r < s->nreplicas; r++) {
            if (r > 0) {
                buf_append_str(b, ",");
            }
            json_node(b, &s->replicas[r]);
        }
        buf_append_str(b, "]}");
    }
    snprintf(tmp, sizeof(tmp),
             "],\"slots_covered\":%d,\"rounds\":%llu,\"answers\":%llu,\"rejected\":%llu,"
             "\"unreachable\":%llu,\"changes\":%llu,\"slots_moved\":%llu,\"last_error\":",
             slotmap_covered(m), (unsigned long long)k->rounds, (unsigned long long)k->answers,
             (unsigned long long)k->rejected, (unsigned long long)k->unreachable,
             (unsigned long long)k->changes, (unsigned long long)k->slots_moved);
    buf_append_str(b, tmp);
    json_str(b, k->last_error);
    buf_append_str(b, "}}\n");
}

/* ==== stats connections ==== */

static void scli_closed_cb(uv_handle_t *h)
{
    scli *c = h->data;
    if (++c->nclosed == 2) {
        buf_free(&c->out);
        free(c);
    }
}

static void scli_close(scli *c)
{
    if (c->closing) {
        return;
    }
    c->closing = 1;
    uv_close((uv_handle_t *)&c->timer, scli_closed_cb);
    uv_close((uv_handle_t *)&c->tcp, scli_closed_cb);
}

static void scli_written_cb(uv_write_t *w, int status)
{
    scli_close(w->data);
}

static void scli_answer(scli *c, int http)
{
    buf body = {0};
    if (c->answered || c->closing) {
        return;
    }
    c->answered = 1;
    uv_timer_stop(&c->timer);
    uv_read_stop((uv_stream_t *)&c->tcp);
    json_map(c->cm, &body);
    if (http) {
        char head[256];
        int healthz = strncmp(c->req, "GET /healthz", 12) == 0;
        int ok = !healthz || slotmap_covered(cluster_map(c->cm->cs)) == CLUSTER_SLOTS;
        snprintf(head, sizeof(head),
                 "HTTP/1.0 %s\r\nContent-Type: application/json\r\nContent-Length: %zu\r\n"
                 "Connection: close\r\n\r\n",
                 ok ? "200 OK" : "503 Service Unavailable", buf_used(&body));
        buf_append_str(&c->out, head);
    }
    buf_append(&c->out, buf_head(&body), buf_used(&body));
    buf_free(&body);
    uv_buf_t ub = uv_buf_init(c->out.data + c->out.pos, (unsigned)buf_used(&c->out));
    c->wr.data = c;
    if (uv_write(&c->wr, (uv_stream_t *)&c->tcp, &ub, 1, scli_written_cb) != 0) {
        scli_close(c);
    }
}

static void scli_plain_cb(uv_timer_t *t)
{
    scli_answer(t->data, 0);
}

static void scli_alloc_cb(uv_handle_t *h, size_t hint, uv_buf_t *b)
{
    scli *c = h->data;
    b->base = c->req + c->nreq;
    b->len = sizeof(c->req) - 1 - c->nreq;
}

static void scli_read_cb(uv_stream_t *st, ssize_t n, const uv_buf_t *b)
{
    scli *c = st->data;
    if (n < 0) {
        scli_close(c);
        return;
    }
    c->nreq += (size_t)n;
    c->req[c->nreq] = '\0';
    if (strstr(c->req, "\r\n\r\n") != NULL || strstr(c->req, "\n\n") != NULL ||
        c->nreq >= sizeof(c->req) - 1) {
        scli_answer(c, 1);
    }
}

static void stats_conn_cb(uv_stream_t *server, int status)
{
    cmap *cm = server->data;
    if (status < 0) {
        return;
    }
    scli *c = calloc(1, sizeof(*c));
    if (c == NULL) {
        return;
    }
    c->cm = cm;
    uv_tcp_init(cm->loop, &c->tcp);
    uv_timer_init(cm->loop, &c->timer);
    c->tcp.data = c;
    c->timer.data = c;
    if (uv_accept(server, (uv_stream_t *)&c->tcp) != 0) {
        scli_close(c);
        return;
    }
    uv_read_start((uv_stream_t *)&c->tcp, scli_alloc_cb, scli_read_cb);
    uv_timer_start(&c->timer, scli_plain_cb, CLUSTERMAP_PLAIN_WAIT_MS, 0);
}

static int stats_listen(cmap *cm)
{
    const config_addr *a = &cm->cfg->stats_listen;
    struct sockaddr_storage ss;
    int rc;
    if (a->is_unix) {
        return UV_EINVAL;
    }
    if (uv_ip4_addr(a->host, a->port, (struct sockaddr_in *)&ss) != 0 &&
        uv_ip6_addr(a->host, a->port, (struct sockaddr_in6 *)&ss) != 0) {
        return UV_EINVAL;
    }
    uv_tcp_init(cm->loop, &cm->stats);
    cm->stats.data = cm;
    cm->stats_on = 1;
    rc = uv_tcp_bind(&cm->stats, (const struct sockaddr *)&ss, 0);
    if (rc == 0) {
        rc = uv_listen((uv_stream_t *)&cm->stats, 64, stats_conn_cb);
    }
    return rc;
}

/* ==== run ==== */

static void on_map(void *data, const slotmap *m, int moved)
{
    (void)data;
    for (int i = 0; i < m->nshards; i++) {
        log_debug("cluster: shard %d: master %s:%d epoch %llu, %d slot(s), %d replica(s)", i,
                  m->shards[i].master.host, m->shards[i].master.port,
                  (unsigned long long)m->shards[i].epoch, m->shards[i].nslots,
                  m->shards[i].nreplicas);
    }
    (void)moved;
}

static void tick_cb(uv_timer_t *t)
{
    cmap *cm = t->data;
    cluster_tick(cm->cs, uv_now(cm->loop));
}

static void stop(cmap *cm, const char *why)
{
    if (cm->stopping) {
        return;
    }
    cm->stopping = 1;
    log_info("stopping: %s", why);
    cluster_close(cm->cs);
    uv_close((uv_handle_t *)&cm->tick, NULL);
    uv_close((uv_handle_t *)&cm->sig_term, NULL);
    uv_close((uv_handle_t *)&cm->sig_int, NULL);
    if (cm->stats_on) {
        uv_close((uv_handle_t *)&cm->stats, NULL);
    }
    /* open stats connections end with their write or their timer */
}

static void signal_cb(uv_signal_t *h, int signum)
{
    stop(h->data, signum == SIGINT ? "SIGINT" : "SIGTERM");
}

int clustermap_run(uv_loop_t *loop, const config *cfg, struct tls_conf *redis_tls)
{
    static const cluster_ops ops = {.on_map = on_map};
    cmap cm;
    memset(&cm, 0, sizeof(cm));
    cm.loop = loop;
    cm.cfg = cfg;
    log_warn("cluster mode: not yet routed: ferry learns the slot map and shows it on the "
             "stats port; clients are not served");
    if (cfg->stats_enabled) {
        int rc = stats_listen(&cm);
        if (rc != 0) {
            char a[300];
            log_error("stats: cannot listen on %s: %s",
                      config_addr_str(&cfg->stats_listen, a, sizeof(a)), uv_strerror(rc));
            if (cm.stats_on) {
                uv_close((uv_handle_t *)&cm.stats, NULL);
                uv_run(loop, UV_RUN_DEFAULT);
            }
            return 3;
        }
    }
    cm.cs = cluster_new(loop, cfg, redis_tls, &ops, &cm);
    uv_timer_init(loop, &cm.tick);
    cm.tick.data = &cm;
    uv_timer_start(&cm.tick, tick_cb, CLUSTERMAP_TICK_MS, CLUSTERMAP_TICK_MS);
    uv_signal_init(loop, &cm.sig_term);
    uv_signal_init(loop, &cm.sig_int);
    cm.sig_term.data = &cm;
    cm.sig_int.data = &cm;
    uv_signal_start(&cm.sig_term, signal_cb, SIGTERM);
    uv_signal_start(&cm.sig_int, signal_cb, SIGINT);
    uv_run(loop, UV_RUN_DEFAULT);
    cluster_free(cm.cs);
    return 0;
}
