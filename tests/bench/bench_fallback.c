/* bench_fallback.c - the fallback store's group commit under load: 50
 * simulated clients each push one element, wait for its acknowledgement
 * (the durable commit) and push the next, for N seconds. Prints commits/s,
 * rows/s, the commit latency (worker side, per group) and the ack latency
 * (push to callback) at p50/p99.
 *
 * Usage: bench_fallback [seconds (5)] [dir (TMPDIR or /tmp)] */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fallback.h"

#define CLIENTS 50
#define MAX_SAMPLES (4 * 1024 * 1024) /* ack latencies kept */

typedef struct client {
    struct bench *b;  /* owner */
    int id;           /* 0..CLIENTS-1 */
    uint64_t sent_ns; /* uv_hrtime of the push in flight */
    char key[32];     /* its queue */
    char member[64];  /* the element it pushes */
} client;

typedef struct bench {
    uv_loop_t loop;  /* runs everything */
    uv_timer_t stop; /* ends the run */
    fallback *fb;    /* the store */
    client clients[CLIENTS];
    int stopping;          /* no new pushes */
    uint64_t acked;        /* pushes acknowledged */
    uint64_t errors;       /* pushes failed */
    uint64_t *ack_us;      /* ack latencies */
    size_t nack;           /* entries in ack_us */
    uint64_t *commit_us;   /* per-group commit latencies */
    size_t ncommit;        /* entries in commit_us */
    uint64_t seen_commits; /* stats.commits at the last callback */
    uint64_t seen_sum;     /* stats.commit_us_sum then */
} bench;

static void push_next(client *c);

static void ack_cb(void *arg, int status, const char *errstr, const fallback_result *res)
{
    client *c = arg;
    bench *b = c->b;
    fallback_stats st;
    (void)res;
    if (status != 0) {
        b->errors++;
        fprintf(stderr, "push failed: %s\n", errstr);
    } else {
        b->acked++;
    }
    if (b->nack < MAX_SAMPLES) {
        b->ack_us[b->nack++] = (uv_hrtime() - c->sent_ns) / 1000;
    }
    fallback_get_stats(b->fb, &st);
    if (st.commits + st.commit_errors > b->seen_commits) {
        /* the first callback of a new group: its commit time */
        if (b->ncommit < MAX_SAMPLES) {
            b->commit_us[b->ncommit++] = st.commit_us_sum - b->seen_sum;
        }
        b->seen_commits = st.commits + st.commit_errors;
        b->seen_sum = st.commit_us_sum;
    }
    if (!b->stopping) {
        push_next(c);
    }
}

static void push_next(client *c)
{
    const char *m[1] = {c->member};
    size_t len = strlen(c->member);
    c->sent_ns = uv_hrtime();
    fallback_push(c->b->fb, FB_RPUSH, c->key, strlen(c->key), m, &len, NULL, 1, ack_cb, c);
}

static void stop_cb(uv_timer_t *t)
{
    bench *b = t->data;
    b->stopping = 1;
    uv_close((uv_handle_t *)t, NULL);
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static double pct_ms(uint64_t *v, size_t n, double p)
{
    if (n == 0) {
        return 0;
    }
    size_t i = (size_t)(p * (double)(n - 1));
    return (double)v[i] / 1000.0;
}

static void remove_dir(const char *dir)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    char p[700];
    while (d != NULL && (e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0) {
            snprintf(p, sizeof(p), "%s/%s", dir, e->d_name);
            unlink(p);
        }
    }
    if (d != NULL) {
        closedir(d);
    }
    rmdir(dir);
}

int main(int argc, char **argv)
{
    static bench b;
    double seconds = argc > 1 ? atof(argv[1]) : 5;
    const char *base = argc > 2 ? argv[2] : getenv("TMPDIR");
    char dir[400], path[450], err[256];
    if (seconds <= 0 || seconds > 3600) {
        fprintf(stderr, "usage: bench_fallback [seconds] [dir]\n");
        return 2;
    }
    snprintf(dir, sizeof(dir), "%s/bench-fallback-XXXXXX",
             base != NULL && base[0] != '\0' ? base : "/tmp");
    if (mkdtemp(dir) == NULL) {
        perror("mkdtemp");
        return 1;
    }
    snprintf(path, sizeof(path), "%s/fallback.db", dir);
    b.ack_us = malloc(MAX_SAMPLES * sizeof(*b.ack_us));
    b.commit_us = malloc(MAX_SAMPLES * sizeof(*b.commit_us));
    if (b.ack_us == NULL || b.commit_us == NULL || uv_loop_init(&b.loop) != 0) {
        return 1;
    }
    if (fallback_open(&b.loop, path, 0, &b.fb, err, sizeof(err)) != 0) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    uv_timer_init(&b.loop, &b.stop);
    b.stop.data = &b;
    uv_timer_start(&b.stop, stop_cb, (uint64_t)(seconds * 1000), 0);
    for (int i = 0; i < CLIENTS; i++) {
        client *c = &b.clients[i];
        c->b = &b;
        c->id = i;
        snprintf(c->key, sizeof(c->key), "queue:%d", i % 4);
        snprintf(c->member, sizeof(c->member), "{\"client\":%d,\"job\":\"payload-0123456789\"}", i);
        push_next(c);
    }
    uint64_t t0 = uv_hrtime();
    uv_run(&b.loop, UV_RUN_DEFAULT);
    double elapsed = (double)(uv_hrtime() - t0) / 1e9;
    fallback_stats st;
    fallback_get_stats(b.fb, &st);
    fallback_close(b.fb);
    uv_run(&b.loop, UV_RUN_DEFAULT);
    uv_loop_close(&b.loop);
    remove_dir(dir);

    qsort(b.ack_us, b.nack, sizeof(*b.ack_us), cmp_u64);
    qsort(b.commit_us, b.ncommit, sizeof(*b.commit_us), cmp_u64);
    printf("fallback group commit: %d clients, %.1f s, %llu rows acked, %llu errors\n", CLIENTS,
           elapsed, (unsigned long long)b.acked, (unsigned long long)b.errors);
    printf("  commits/s %.0f   rows/s %.0f   rows/commit %.1f\n", (double)st.commits / elapsed,
           (double)b.acked / elapsed, st.commits ? (double)b.acked / (double)st.commits : 0.0);
    printf("  commit latency ms: p50 %.2f  p99 %.2f  max %.2f\n",
           pct_ms(b.commit_us, b.ncommit, 0.50), pct_ms(b.commit_us, b.ncommit, 0.99),
           (double)st.commit_us_max / 1000.0);
    printf("  ack latency ms:    p50 %.2f  p99 %.2f\n", pct_ms(b.ack_us, b.nack, 0.50),
           pct_ms(b.ack_us, b.nack, 0.99));
    free(b.ack_us);
    free(b.commit_us);
    return b.errors ? 1 : 0;
}
