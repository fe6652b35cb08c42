/* test_fallback.c - unit tests for proxy/store/fallback.c on a real loop and a
 * real SQLite file in a temp dir per test: list and sorted-set semantics
 * against what Redis answers for the same commands, group commit and
 * ordering, replay bookkeeping (read / delete_upto), persistence and ids
 * across reopen, the per-key index, the file lock, a full store and its
 * recovery, a failed write, corrupt files, binary bytes, close with work in
 * flight, and the dump; rows a pop took stay until confirmed, go back in
 * place when released or when the store is opened again (a kill), also in
 * a full store; a version 1 file is brought up to date. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fallback.h"

#define MAX_ITEMS 64                /* rows a recorded callback keeps */
#define MAX_BYTES 64                /* bytes of a recorded key or member */
#define RUN_LIMIT_NS 20000000000ULL /* run_until gives up after 20 s */
#define RUN_MAX_TURNS 1000000       /* ... or this many loop turns */

typedef struct fixture fixture;

/* A row as a callback saw it. */
typedef struct got_item {
    int64_t id;             /* row id */
    int kind;               /* enum fallback_kind */
    char key[MAX_BYTES];    /* key bytes */
    size_t keylen;          /* bytes */
    char member[MAX_BYTES]; /* member bytes */
    size_t memberlen;       /* bytes */
    double score;           /* ZADD rows */
    int taken;              /* read: taken by a pop */
    char rcpt[MAX_BYTES];   /* read: a held row's receipt key, "" none */
    int held;               /* read: rcpt set */
} got_item;

/* What one operation's callback reported. */
typedef struct rec {
    fixture *fx;                /* for the callback order and the stats */
    int calls;                  /* times called (must end at 1) */
    int seq;                    /* position among all callbacks of the test */
    int status;                 /* status argument */
    char errstr[200];           /* errstr argument, "" if NULL */
    int64_t count;              /* res->count */
    size_t nitems;              /* res->nitems */
    got_item items[MAX_ITEMS];  /* the first MAX_ITEMS rows */
    uint64_t commits;           /* stats.commits when the callback ran */
    void (*then)(struct rec *); /* run after recording, if set */
} rec;

static const char *self_path; /* argv[0]: test_lock_conflict runs it again */

struct fixture {
    char dir[256];  /* temp dir of this test */
    char path[300]; /* dir/fallback.db */
    uv_loop_t loop; /* the loop the store runs on */
    fallback *fb;   /* the open store, or NULL */
    int done;       /* callbacks so far */
};

/* ---------------------------------------------------------------------------
 * Helpers
 * ------------------------------------------------------------------------ */

static void record_cb(void *arg, int status, const char *errstr, const fallback_result *res)
{
    rec *r = arg;
    fallback_stats st;
    assert_non_null(res);
    r->calls++;
    r->seq = r->fx->done++;
    r->status = status;
    snprintf(r->errstr, sizeof(r->errstr), "%s", errstr != NULL ? errstr : "");
    r->count = res->count;
    r->nitems = res->nitems;
    for (size_t i = 0; i < res->nitems && i < MAX_ITEMS; i++) {
        const fallback_item *it = &res->items[i];
        got_item *g = &r->items[i];
        g->id = it->id;
        g->kind = it->kind;
        memcpy(g->key, it->key, it->keylen < MAX_BYTES ? it->keylen : MAX_BYTES);
        g->keylen = it->keylen;
        memcpy(g->member, it->member, it->memberlen < MAX_BYTES ? it->memberlen : MAX_BYTES);
        g->memberlen = it->memberlen; /* the bytes kept are at most MAX_BYTES */
        g->score = it->score;
        g->taken = it->taken;
        g->held = it->rcpt != NULL;
        snprintf(g->rcpt, sizeof(g->rcpt), "%.*s", (int)it->rcptlen, it->rcpt ? it->rcpt : "");
        assert_true(it->ts_ms > 1600000000000LL);
    }
    if (r->fx->fb != NULL) {
        fallback_get_stats(r->fx->fb, &st);
        r->commits = st.commits;
    }
    if (r->then != NULL) {
        r->then(r);
    }
}

static void rec_init(fixture *fx, rec *r, size_t n)
{
    memset(r, 0, n * sizeof(*r));
    for (size_t i = 0; i < n; i++) {
        r[i].fx = fx;
    }
}

/* Run the loop until *counter reaches want (bounded in turns and time). */
static void run_until(fixture *fx, const int *counter, int want)
{
    uint64_t t0 = uv_hrtime();
    for (int turns = 0; *counter < want && turns < RUN_MAX_TURNS; turns++) {
        uv_run(&fx->loop, UV_RUN_ONCE);
        if (uv_hrtime() - t0 > RUN_LIMIT_NS) {
            break;
        }
    }
    assert_int_equal(*counter, want);
}

/* Queue a push of NUL-terminated strings (scores for FB_ZADD). */
static void push(fixture *fx, int kind, const char *key, const char *const *m, const double *s,
                 size_t n, rec *r)
{
    size_t lens[16];
    assert_true(n <= 16);
    for (size_t i = 0; i < n; i++) {
        lens[i] = strlen(m[i]);
    }
    fallback_push(fx->fb, kind, key, strlen(key), m, lens, s, n, record_cb, r);
}

static void pop(fixture *fx, int end, const char *key, size_t count, rec *r)
{
    fallback_pop(fx->fb, end, key, strlen(key), count, record_cb, r);
}

/* Confirm (or release) every row the n recorded operations from r on took
 * (pushes took none), and run until it is done; out gets the result. */
static void settle(fixture *fx, const rec *r, size_t n, int confirm, rec *out)
{
    int64_t ids[8 * MAX_ITEMS];
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        for (size_t j = 0; j < r[i].nitems && j < MAX_ITEMS; j++) {
            assert_true(k < sizeof(ids) / sizeof(ids[0]));
            ids[k++] = r[i].items[j].id;
        }
    }
    rec_init(fx, out, 1);
    if (confirm) {
        fallback_confirm(fx->fb, ids, k, record_cb, out);
    } else {
        fallback_release(fx->fb, ids, k, record_cb, out);
    }
    run_until(fx, &out->calls, 1);
    assert_int_equal(out->status, 0);
}

/* The recorded items' members joined with spaces. */
static const char *members(const rec *r)
{
    static char out[1024];
    size_t n = 0;
    out[0] = '\0';
    for (size_t i = 0; i < r->nitems && i < MAX_ITEMS; i++) {
        n += (size_t)snprintf(
            out + n, sizeof(out) - n, "%s%.*s", i ? " " : "",
            (int)(r->items[i].memberlen < MAX_BYTES ? r->items[i].memberlen : MAX_BYTES),
            r->items[i].member);
    }
    return out;
}

static void assert_ok(const rec *r, int64_t count)
{
    assert_int_equal(r->calls, 1);
    assert_int_equal(r->status, 0);
    assert_string_equal(r->errstr, "");
    assert_int_equal(r->count, count);
}

static int store_open(fixture *fx, uint64_t max_bytes)
{
    char err[256];
    int rc = fallback_open(&fx->loop, fx->path, max_bytes, &fx->fb, err, sizeof(err));
    if (rc != 0) {
        print_error("fallback_open: %s\n", err);
    }
    return rc;
}

/* Close the store and run the loop until its handles and work are gone. */
static void store_close(fixture *fx)
{
    fallback_close(fx->fb);
    fx->fb = NULL;
    assert_int_equal(uv_run(&fx->loop, UV_RUN_DEFAULT), 0);
}

static void store_reopen(fixture *fx)
{
    store_close(fx);
    assert_int_equal(store_open(fx, 0), 0);
}

/* Write failures injected through SQLite's system-call table. */
typedef ssize_t (*pwrite_fn)(int, const void *, size_t, off_t);
static sqlite3_syscall_ptr real_pwrite;
static int fail_writes;   /* fail every write while set */
static int failed_writes; /* writes failed so far */

static ssize_t faulty_pwrite(int fd, const void *buf, size_t n, off_t off)
{
    if (fail_writes) {
        failed_writes++;
        errno = EIO;
        return -1;
    }
    return ((pwrite_fn)real_pwrite)(fd, buf, n, off);
}

static int setup(void **state)
{
    fixture *fx = calloc(1, sizeof(*fx));
    const char *tmp = getenv("TMPDIR");
    snprintf(fx->dir, sizeof(fx->dir), "%s/ferry-fallback-XXXXXX",
             tmp != NULL && tmp[0] != '\0' ? tmp : "/tmp");
    if (mkdtemp(fx->dir) == NULL) {
        free(fx);
        return -1;
    }
    snprintf(fx->path, sizeof(fx->path), "%s/fallback.db", fx->dir);
    if (uv_loop_init(&fx->loop) != 0 || store_open(fx, 0) != 0) {
        return -1;
    }
    *state = fx;
    return 0;
}

static int teardown(void **state)
{
    fixture *fx = *state;
    sqlite3_vfs *vfs = sqlite3_vfs_find(NULL);
    vfs->xSetSystemCall(vfs, "pwrite64", NULL); /* undo test_io_error's fault */
    fail_writes = 0;
    fallback_close(fx->fb);
    uv_run(&fx->loop, UV_RUN_DEFAULT);
    assert_int_equal(uv_loop_close(&fx->loop), 0);
    DIR *d = opendir(fx->dir);
    struct dirent *e;
    char p[600];
    while (d != NULL && (e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0) {
            snprintf(p, sizeof(p), "%s/%s", fx->dir, e->d_name);
            unlink(p);
        }
    }
    if (d != NULL) {
        closedir(d);
    }
    rmdir(fx->dir);
    free(fx);
    return 0;
}

/* ---------------------------------------------------------------------------
 * Semantics
 * ------------------------------------------------------------------------ */

/* The same sequence on Redis: LPUSH k a b c -> 3; LPOP k -> c; RPUSH k d ->
 * 3 (b a d); RPOP k 2 -> d a; LPUSH k e -> 2 (e b); RPUSH k f g -> 4;
 * LPOP k 10 -> e b f g; LPOP k -> nil; RPOP missing -> nil. Queued in one
 * turn, so order inside a group matters too. */
static void test_list_semantics(void **state)
{
    fixture *fx = *state;
    rec r[9];
    rec_init(fx, r, 9);
    push(fx, FB_LPUSH, "k", (const char *[]){"a", "b", "c"}, NULL, 3, &r[0]);
    pop(fx, FB_HEAD, "k", 1, &r[1]);
    push(fx, FB_RPUSH, "k", (const char *[]){"d"}, NULL, 1, &r[2]);
    pop(fx, FB_TAIL, "k", 2, &r[3]);
    push(fx, FB_LPUSH, "k", (const char *[]){"e"}, NULL, 1, &r[4]);
    push(fx, FB_RPUSH, "k", (const char *[]){"f", "g"}, NULL, 2, &r[5]);
    pop(fx, FB_HEAD, "k", 10, &r[6]);
    pop(fx, FB_HEAD, "k", 1, &r[7]);
    pop(fx, FB_TAIL, "missing", 1, &r[8]);
    run_until(fx, &fx->done, 9);
    for (int i = 0; i < 9; i++) {
        assert_int_equal(r[i].seq, i);
    }
    assert_ok(&r[0], 3);
    assert_ok(&r[1], 1);
    assert_string_equal(members(&r[1]), "c");
    assert_int_equal(r[1].items[0].kind, FB_LPUSH);
    assert_ok(&r[2], 3);
    assert_ok(&r[3], 2);
    assert_string_equal(members(&r[3]), "d a");
    assert_int_equal(r[3].items[0].kind, FB_RPUSH);
    assert_ok(&r[4], 2);
    assert_ok(&r[5], 4);
    assert_ok(&r[6], 4);
    assert_string_equal(members(&r[6]), "e b f g");
    assert_ok(&r[7], 0);
    assert_int_equal(r[7].nitems, 0);
    assert_ok(&r[8], 0);
    /* Popped rows are taken, not gone, until their replies are confirmed. */
    assert_int_equal(fallback_key_ready(fx->fb, "k", 1), 0);
    assert_int_equal(fallback_key_rows(fx->fb, "k", 1), 7);
    rec done;
    settle(fx, r, 9, 1, &done);
    assert_ok(&done, 7);
    assert_int_equal(fallback_key_rows(fx->fb, "k", 1), 0);
    assert_int_equal(fallback_rows(fx->fb), 0);
    fallback_stats st;
    fallback_get_stats(fx->fb, &st);
    assert_int_equal(st.popped, 7);
    assert_int_equal(st.confirmed, 7);
    assert_int_equal(st.taken, 0);
    assert_int_equal(st.bytes, 0);
}

/* Redis: RPUSH src a b c; LMOVE src dst RIGHT LEFT -> c; LMOVE src dst
 * LEFT RIGHT -> a; LMOVE src src RIGHT LEFT -> b (a rotation); LMOVE nothing
 * dst LEFT LEFT -> nil. Then src = [b], dst = [c a]. */
static void test_move(void **state)
{
    fixture *fx = *state;
    rec r[8];
    rec_init(fx, r, 8);
    push(fx, FB_RPUSH, "src", (const char *[]){"a", "b", "c"}, NULL, 3, &r[0]);
    fallback_move(fx->fb, FB_TAIL, "src", 3, FB_LPUSH, "dst", 3, record_cb, &r[1]);
    fallback_move(fx->fb, FB_HEAD, "src", 3, FB_RPUSH, "dst", 3, record_cb, &r[2]);
    fallback_move(fx->fb, FB_TAIL, "src", 3, FB_LPUSH, "src", 3, record_cb, &r[3]);
    fallback_move(fx->fb, FB_HEAD, "nothing", 7, FB_LPUSH, "dst", 3, record_cb, &r[4]);
    pop(fx, FB_HEAD, "src", 10, &r[5]);
    pop(fx, FB_HEAD, "dst", 10, &r[6]);
    fallback_move(fx->fb, FB_MIN, "src", 3, FB_LPUSH, "dst", 3, record_cb, &r[7]);
    run_until(fx, &fx->done, 8);
    assert_ok(&r[1], 1);
    assert_string_equal(members(&r[1]), "c");
    assert_ok(&r[2], 1);
    assert_string_equal(members(&r[2]), "a");
    assert_ok(&r[3], 1);
    assert_string_equal(members(&r[3]), "b");
    assert_ok(&r[4], 0);
    assert_int_equal(r[4].nitems, 0);
    assert_ok(&r[5], 1);
    assert_string_equal(members(&r[5]), "b");
    assert_ok(&r[6], 2);
    assert_string_equal(members(&r[6]), "c a");
    assert_int_equal(r[7].status, UV_EINVAL);
    /* A move deletes its source row at once (its element is in the
     * destination): only the pops' rows are taken. */
    assert_int_equal(fallback_key_ready(fx->fb, "src", 3), 0);
    assert_int_equal(fallback_key_ready(fx->fb, "dst", 3), 0);
    assert_int_equal(fallback_rows(fx->fb), 3);
    rec done;
    settle(fx, &r[5], 2, 1, &done);
    assert_ok(&done, 3);
    assert_int_equal(fallback_key_rows(fx->fb, "src", 3), 0);
    assert_int_equal(fallback_key_rows(fx->fb, "dst", 3), 0);
    assert_int_equal(fallback_rows(fx->fb), 0);
}

/* Redis: ZADD z 1 a 2 b 3 c -> 3; ZADD z 5 a 0 d -> 1 (a updated);
 * ZPOPMIN z 2 -> d 0, b 2; ZPOPMAX z -> a 5; ZADD t 1 b 1 a 1 c 1 a -> 3;
 * ZPOPMIN t 2 -> a b (equal scores: by member); ZADD t 1 a -> 1;
 * ZPOPMAX t 5 -> c a; ZADD s -inf x +inf y -1.5 w -> 3; ZPOPMIN s 3 ->
 * x w y. A NaN score is refused alone; the rest of its group commits. */
static void test_zset_semantics(void **state)
{
    fixture *fx = *state;
    rec r[12];
    rec_init(fx, r, 12);
    push(fx, FB_ZADD, "z", (const char *[]){"a", "b", "c"}, (double[]){1, 2, 3}, 3, &r[0]);
    push(fx, FB_ZADD, "z", (const char *[]){"a", "d"}, (double[]){5, 0}, 2, &r[1]);
    run_until(fx, &fx->done, 2);
    assert_ok(&r[0], 3);
    assert_ok(&r[1], 1);
    assert_int_equal(fallback_key_rows(fx->fb, "z", 1), 4);
    pop(fx, FB_MIN, "z", 2, &r[2]);
    pop(fx, FB_MAX, "z", 1, &r[3]);
    push(fx, FB_ZADD, "t", (const char *[]){"b", "a", "c", "a"}, (double[]){1, 1, 1, 1}, 4, &r[4]);
    pop(fx, FB_MIN, "t", 2, &r[5]);
    push(fx, FB_ZADD, "t", (const char *[]){"a"}, (double[]){1}, 1, &r[6]);
    pop(fx, FB_MAX, "t", 5, &r[7]);
    push(fx, FB_ZADD, "s", (const char *[]){"x", "y", "w"}, (double[]){-INFINITY, INFINITY, -1.5},
         3, &r[8]);
    push(fx, FB_ZADD, "s", (const char *[]){"n"}, (double[]){NAN}, 1, &r[9]);
    pop(fx, FB_MIN, "s", 3, &r[10]);
    pop(fx, FB_HEAD, "z", 5, &r[11]); /* a list pop finds no list rows in a zset */
    run_until(fx, &fx->done, 12);
    assert_ok(&r[2], 2);
    assert_string_equal(members(&r[2]), "d b");
    assert_true(r[2].items[0].score == 0 && r[2].items[1].score == 2);
    assert_int_equal(r[2].items[0].kind, FB_ZADD);
    assert_ok(&r[3], 1);
    assert_string_equal(members(&r[3]), "a");
    assert_true(r[3].items[0].score == 5);
    assert_ok(&r[4], 3);
    assert_string_equal(members(&r[5]), "a b");
    assert_ok(&r[6], 1);
    assert_string_equal(members(&r[7]), "c a");
    assert_ok(&r[8], 3);
    assert_int_equal(r[9].status, UV_EINVAL);
    assert_string_equal(r[9].errstr, "score is not a number");
    assert_string_equal(members(&r[10]), "x w y");
    assert_true(isinf(r[10].items[0].score) && r[10].items[0].score < 0);
    assert_ok(&r[11], 0);
    assert_int_equal(fallback_key_ready(fx->fb, "z", 1), 1); /* c */
    assert_int_equal(fallback_key_ready(fx->fb, "t", 1), 0);
    assert_int_equal(fallback_key_ready(fx->fb, "s", 1), 0);
    rec done;
    settle(fx, r, 12, 1, &done);
    assert_ok(&done, 3 + 4 + 3);
    assert_int_equal(fallback_key_rows(fx->fb, "z", 1), 1); /* c */
    assert_int_equal(fallback_key_rows(fx->fb, "t", 1), 0);
    assert_int_equal(fallback_key_rows(fx->fb, "s", 1), 0);
    assert_int_equal(fallback_rows(fx->fb), 1);
}

/* ---------------------------------------------------------------------------
 * Taken rows: confirmed, released, back after a restart
 * ------------------------------------------------------------------------ */

/* Redis: RPUSH q a b c d; LPOP q 2 -> a b; RPOP q -> d; LPUSH q x -> 2
 * (x c). The pops' replies: a b never written (released), d written
 * (confirmed). a and b are back where they were, behind x that was pushed
 * past them: LPOP q 10 -> x a b c. A confirm or release of a row that is
 * not taken does nothing. A sorted-set member added again while taken keeps
 * its new score when the old row is released. */
static void test_confirm_release(void **state)
{
    fixture *fx = *state;
    rec r[12], c[4];
    fallback_stats st;
    rec_init(fx, r, 12);
    push(fx, FB_RPUSH, "q", (const char *[]){"a", "b", "c", "d"}, NULL, 4, &r[0]);
    pop(fx, FB_HEAD, "q", 2, &r[1]);
    pop(fx, FB_TAIL, "q", 1, &r[2]);
    push(fx, FB_LPUSH, "q", (const char *[]){"x"}, NULL, 1, &r[3]);
    push(fx, FB_ZADD, "z", (const char *[]){"m", "n"}, (double[]){1, 2}, 2, &r[4]);
    pop(fx, FB_MIN, "z", 1, &r[5]);
    push(fx, FB_ZADD, "z", (const char *[]){"m"}, (double[]){7}, 1, &r[6]);
    run_until(fx, &fx->done, 7);
    assert_string_equal(members(&r[1]), "a b");
    assert_string_equal(members(&r[2]), "d");
    assert_ok(&r[3], 2);
    assert_string_equal(members(&r[5]), "m");
    assert_ok(&r[6], 1); /* m was popped: added, not updated */
    assert_int_equal(fallback_key_rows(fx->fb, "q", 1), 5);
    assert_int_equal(fallback_key_ready(fx->fb, "q", 1), 2);
    assert_int_equal(fallback_key_rows(fx->fb, "z", 1), 3);
    assert_int_equal(fallback_key_ready(fx->fb, "z", 1), 2);
    fallback_get_stats(fx->fb, &st);
    assert_int_equal(st.taken, 4);

    settle(fx, &r[1], 1, 0, &c[0]);
    assert_ok(&c[0], 2);
    settle(fx, &r[2], 1, 1, &c[1]);
    assert_ok(&c[1], 1);
    settle(fx, &r[1], 2, 1, &c[2]); /* none of them is taken any more */
    assert_ok(&c[2], 0);
    settle(fx, &r[5], 1, 0, &c[3]); /* m has a row again: the old one goes */
    assert_ok(&c[3], 1);
    fallback_get_stats(fx->fb, &st);
    assert_int_equal(st.taken, 0);
    assert_int_equal(st.confirmed, 1);
    assert_int_equal(st.released, 3);
    assert_int_equal(st.rows, 4 + 2);
    assert_int_equal(fallback_key_ready(fx->fb, "q", 1), 4);
    assert_int_equal(fallback_key_ready(fx->fb, "z", 1), 2);

    fx->done = 7;
    pop(fx, FB_HEAD, "q", 10, &r[7]);
    pop(fx, FB_MIN, "z", 10, &r[8]);
    push(fx, FB_RPUSH, "q", (const char *[]){"e"}, NULL, 1, &r[9]);
    run_until(fx, &fx->done, 10);
    assert_string_equal(members(&r[7]), "x a b c");
    assert_string_equal(members(&r[8]), "n m");
    assert_true(r[8].items[1].score == 7);
    assert_ok(&r[9], 1);
}

/* ferry killed with rows taken (their replies never known written): the
 * next open puts them back in place, counted in stats.released; a
 * sorted-set member added again meanwhile is there once, with its new
 * score. The store closes without confirming here, as a kill would leave
 * it (only a confirm or release already queued runs at close). */
static void test_taken_back_on_reopen(void **state)
{
    fixture *fx = *state;
    rec r[8];
    fallback_stats st;
    rec_init(fx, r, 8);
    push(fx, FB_RPUSH, "l", (const char *[]){"1", "2", "3", "4"}, NULL, 4, &r[0]);
    pop(fx, FB_HEAD, "l", 2, &r[1]);
    push(fx, FB_ZADD, "z", (const char *[]){"m"}, (double[]){1}, 1, &r[2]);
    pop(fx, FB_MIN, "z", 1, &r[3]);
    push(fx, FB_ZADD, "z", (const char *[]){"m"}, (double[]){5}, 1, &r[4]);
    run_until(fx, &fx->done, 5);
    assert_string_equal(members(&r[1]), "1 2");
    store_reopen(fx);
    fallback_get_stats(fx->fb, &st);
    assert_int_equal(st.released, 3);
    assert_int_equal(st.taken, 0);
    assert_int_equal(st.rows, 4 + 1);
    assert_int_equal(fallback_key_ready(fx->fb, "l", 1), 4);
    assert_int_equal(fallback_key_ready(fx->fb, "z", 1), 1);
    pop(fx, FB_HEAD, "l", 10, &r[5]);
    pop(fx, FB_MIN, "z", 10, &r[6]);
    fallback_read(fx->fb, 0, 10, record_cb, &r[7]);
    run_until(fx, &fx->done, 8);
    assert_string_equal(members(&r[5]), "1 2 3 4");
    assert_int_equal(r[5].items[0].id, r[1].items[0].id); /* the same rows */
    assert_string_equal(members(&r[6]), "m");
    assert_true(r[6].items[0].score == 5);
    assert_int_equal(r[7].nitems, 5); /* read shows taken rows, marked */
    for (size_t i = 0; i < r[7].nitems; i++) {
        assert_int_equal(r[7].items[i].taken, 1);
    }
}

/* A push Redis may have applied (sent with its receipt, unanswered) is
 * held: counted in its reply, never taken by a pop, kept held across a
 * reopen, read back with its receipt key for the replay to ask Redis. */
static void test_held_push(void **state)
{
    fixture *fx = *state;
    rec r[8];
    fallback_stats st;
    size_t lens[2] = {1, 1};
    rec_init(fx, r, 8);
    push(fx, FB_RPUSH, "l", (const char *[]){"a"}, NULL, 1, &r[0]);
    fallback_push_held(fx->fb, FB_RPUSH, "l", 1, (const char *[]){"b", "c"}, lens, 2, "rc:1", 4,
                       record_cb, &r[1]);
    push(fx, FB_RPUSH, "l", (const char *[]){"d"}, NULL, 1, &r[2]);
    fallback_push_held(fx->fb, FB_ZADD, "z", 1, (const char *[]){"m"}, lens, 1, "rc:2", 4,
                       record_cb, &r[3]);
    run_until(fx, &fx->done, 4);
    assert_ok(&r[0], 1);
    assert_ok(&r[1], 3); /* its own rows counted */
    assert_ok(&r[2], 2); /* held rows are not the store's to serve */
    assert_int_equal(r[3].status, UV_EINVAL);
    assert_int_equal(fallback_key_rows(fx->fb, "l", 1), 4);
    assert_int_equal(fallback_key_ready(fx->fb, "l", 1), 2);
    store_reopen(fx);
    fallback_get_stats(fx->fb, &st);
    assert_int_equal(st.released, 0);
    assert_int_equal(st.taken, 2);
    assert_int_equal(fallback_key_ready(fx->fb, "l", 1), 2);
    pop(fx, FB_HEAD, "l", 10, &r[4]);
    fallback_read(fx->fb, 0, 10, record_cb, &r[5]);
    run_until(fx, &fx->done, 6);
    assert_string_equal(members(&r[4]), "a d");
    assert_int_equal(r[5].nitems, 4);
    assert_false(r[5].items[0].held);
    assert_true(r[5].items[1].held && r[5].items[2].held);
    assert_string_equal(r[5].items[1].rcpt, "rc:1");
    assert_int_equal(r[5].items[1].taken, 0); /* held, not taken by a pop */
    assert_int_equal(r[5].items[0].taken, 1);
    fallback_delete_upto(fx->fb, r[5].items[3].id, record_cb, &r[6]);
    run_until(fx, &fx->done, 7);
    fallback_get_stats(fx->fb, &st);
    assert_int_equal(st.rows, 0);
    assert_int_equal(st.taken, 0);
}

/* Confirms and releases still queued when the store closes run in one last
 * transaction: the confirmed row is gone, the released one back. */
static void test_close_settles_queued(void **state)
{
    fixture *fx = *state;
    rec r[4];
    rec_init(fx, r, 4);
    push(fx, FB_RPUSH, "l", (const char *[]){"1", "2"}, NULL, 2, &r[0]);
    pop(fx, FB_HEAD, "l", 1, &r[1]);
    pop(fx, FB_HEAD, "l", 1, &r[2]);
    run_until(fx, &fx->done, 3);
    fallback_confirm(fx->fb, &r[1].items[0].id, 1, NULL, NULL);
    fallback_release(fx->fb, &r[2].items[0].id, 1, NULL, NULL);
    store_reopen(fx);
    fallback_stats st;
    fallback_get_stats(fx->fb, &st);
    assert_int_equal(st.released, 0); /* nothing was left taken */
    assert_int_equal(fallback_rows(fx->fb), 1);
    pop(fx, FB_HEAD, "l", 10, &r[3]);
    run_until(fx, &fx->done, 4);
    assert_string_equal(members(&r[3]), "2");
}

/* A store written by a ferry of schema version 1 (no taken column) is
 * brought up to date when opened: rows, ids and order kept; the dump reads
 * either version. */
static void test_upgrade_v1(void **state)
{
    fixture *fx = *state;
    sqlite3 *db;
    rec r[3];
    char *text = NULL, err[256];
    size_t textlen = 0;
    store_close(fx);
    unlink(fx->path);
    assert_int_equal(sqlite3_open(fx->path, &db), SQLITE_OK);
    assert_int_equal(
        sqlite3_exec(db,
                     "PRAGMA journal_mode = WAL;"
                     "CREATE TABLE rows (id INTEGER PRIMARY KEY AUTOINCREMENT, key BLOB NOT NULL,"
                     " kind INTEGER NOT NULL, member BLOB NOT NULL, score REAL, pos INTEGER,"
                     " ts INTEGER NOT NULL);"
                     "CREATE INDEX rows_list ON rows(key, pos) WHERE pos IS NOT NULL;"
                     "CREATE INDEX rows_zset ON rows(key, score, member) WHERE kind = 3;"
                     "CREATE UNIQUE INDEX rows_zmember ON rows(key, member) WHERE kind = 3;"
                     "CREATE INDEX rows_key ON rows(key, id);"
                     "PRAGMA application_id = 1179800153; PRAGMA user_version = 1;"
                     "INSERT INTO rows(key, kind, member, score, pos, ts) VALUES"
                     " (CAST('l' AS BLOB), 2, CAST('a' AS BLOB), NULL, 0, 1700000000000),"
                     " (CAST('z' AS BLOB), 3, CAST('m' AS BLOB), 2.5, NULL, 1700000000000),"
                     " (CAST('l' AS BLOB), 2, CAST('b' AS BLOB), NULL, 1, 1700000000000);",
                     NULL, NULL, NULL),
        SQLITE_OK);
    sqlite3_close(db);
    FILE *out = open_memstream(&text, &textlen);
    assert_int_equal(fallback_dump(fx->path, out, err, sizeof(err)), 0);
    fclose(out);
    assert_non_null(strstr(text, "RPUSH \"l\" \"b\""));
    free(text);
    assert_int_equal(store_open(fx, 0), 0);
    assert_int_equal(fallback_rows(fx->fb), 3);
    rec_init(fx, r, 3);
    pop(fx, FB_HEAD, "l", 10, &r[0]);
    pop(fx, FB_MIN, "z", 10, &r[1]);
    push(fx, FB_ZADD, "z", (const char *[]){"m"}, (double[]){9}, 1, &r[2]);
    run_until(fx, &fx->done, 3);
    assert_string_equal(members(&r[0]), "a b");
    assert_int_equal(r[0].items[1].id, 3);
    assert_string_equal(members(&r[1]), "m");
    assert_ok(&r[2], 1);
    store_reopen(fx); /* taken rows back; the zset member once, with score 9 */
    assert_int_equal(fallback_rows(fx->fb), 3);
    assert_int_equal(sqlite3_open(fx->path, &db), SQLITE_OK);
    sqlite3_stmt *s;
    assert_int_equal(sqlite3_prepare_v2(db, "PRAGMA user_version", -1, &s, NULL), SQLITE_OK);
    assert_int_equal(sqlite3_step(s), SQLITE_ROW);
    assert_int_equal(sqlite3_column_int(s, 0), 3);
    sqlite3_finalize(s);
    sqlite3_close(db);
}

/* ---------------------------------------------------------------------------
 * Group commit
 * ------------------------------------------------------------------------ */

#define GC_OPS 300
#define GC_CHAINED 10

static rec gc_chained[GC_CHAINED];

/* Run from a callback of the first group: these form the second group. */
static void queue_chained(rec *r)
{
    for (int i = 0; i < GC_CHAINED; i++) {
        push(r->fx, FB_RPUSH, "chained", (const char *[]){"x"}, NULL, 1, &gc_chained[i]);
    }
}

/* GC_OPS operations queued in one turn: one commit, callbacks in queue
 * order, each push's length and each pop's element exactly what a FIFO
 * (RPUSH + LPOP, as Redis would run them) gives. */
static void test_group_commit(void **state)
{
    fixture *fx = *state;
    static rec r[GC_OPS];
    static char vals[GC_OPS][16];
    int model[GC_OPS], head = 0, tail = 0; /* the FIFO: values queued */
    int64_t want_count[GC_OPS];
    int want_pop[GC_OPS]; /* value popped, -1 none */
    fallback_stats st;
    rec_init(fx, r, GC_OPS);
    rec_init(fx, gc_chained, GC_CHAINED);
    for (int i = 0; i < GC_OPS; i++) {
        want_pop[i] = -1;
        if (i % 3 == 2) {
            pop(fx, FB_HEAD, "q", 1, &r[i]);
            want_count[i] = head < tail ? 1 : 0;
            if (head < tail) {
                want_pop[i] = model[head++];
            }
        } else {
            snprintf(vals[i], sizeof(vals[i]), "v%d", i);
            push(fx, FB_RPUSH, "q", (const char *[]){vals[i]}, NULL, 1, &r[i]);
            model[tail++] = i;
            want_count[i] = tail - head;
        }
    }
    r[0].then = queue_chained;
    run_until(fx, &fx->done, GC_OPS + GC_CHAINED);
    for (int i = 0; i < GC_OPS; i++) {
        assert_int_equal(r[i].seq, i);
        assert_ok(&r[i], want_count[i]);
        assert_int_equal(r[i].commits, 1);
        if (want_pop[i] >= 0) {
            char want[16];
            snprintf(want, sizeof(want), "v%d", want_pop[i]);
            assert_string_equal(members(&r[i]), want);
        }
    }
    for (int i = 0; i < GC_CHAINED; i++) {
        assert_ok(&gc_chained[i], i + 1);
        assert_int_equal(gc_chained[i].commits, 2);
    }
    fallback_get_stats(fx->fb, &st);
    assert_int_equal(st.commits, 2);
    assert_int_equal(st.commit_errors, 0);
    assert_int_equal(st.written, GC_OPS / 3 * 2 + GC_CHAINED);
    assert_int_equal(st.popped, GC_OPS / 3);
    assert_int_equal(st.taken, GC_OPS / 3);
    assert_int_equal(st.rows, GC_OPS / 3 * 2 + GC_CHAINED); /* the taken ones included */
    assert_int_equal(fallback_key_rows(fx->fb, "q", 1), GC_OPS / 3 * 2);
    assert_int_equal(fallback_key_ready(fx->fb, "q", 1), GC_OPS / 3);
    assert_true(st.commit_us_sum > 0 && st.commit_us_max > 0);
    assert_true(st.commit_us_max <= st.commit_us_sum);
}

/* ---------------------------------------------------------------------------
 * Replay bookkeeping, persistence, key index
 * ------------------------------------------------------------------------ */

static void test_read_delete(void **state)
{
    fixture *fx = *state;
    rec r[12];
    fallback_stats st;
    int64_t before = 0;
    rec_init(fx, r, 12);
    push(fx, FB_RPUSH, "a", (const char *[]){"x1"}, NULL, 1, &r[0]);
    push(fx, FB_RPUSH, "b", (const char *[]){"y1"}, NULL, 1, &r[1]);
    push(fx, FB_ZADD, "c", (const char *[]){"m"}, (double[]){2.5}, 1, &r[2]);
    push(fx, FB_RPUSH, "a", (const char *[]){"x2"}, NULL, 1, &r[3]);
    push(fx, FB_LPUSH, "b", (const char *[]){"y0"}, NULL, 1, &r[4]);
    fallback_read(fx->fb, 0, 3, record_cb, &r[5]);
    fallback_read(fx->fb, 3, 10, record_cb, &r[6]);
    fallback_read(fx->fb, 5, 10, record_cb, &r[7]);
    run_until(fx, &fx->done, 8);
    fallback_get_stats(fx->fb, &st);
    assert_int_equal(st.rows, 5);
    assert_int_equal(st.bytes, 5 * 1 + 2 + 2 + 1 + 2 + 2);
    assert_true(st.oldest_ms > 1600000000000LL);
    assert_int_equal(r[5].nitems, 3);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(r[5].items[i].id, i + 1);
    }
    assert_memory_equal(r[5].items[1].key, "b", 1);
    assert_int_equal(r[5].items[2].kind, FB_ZADD);
    assert_true(r[5].items[2].score == 2.5);
    assert_string_equal(members(&r[6]), "x2 y0");
    assert_int_equal(r[6].items[0].id, 4);
    assert_int_equal(r[6].items[1].kind, FB_LPUSH);
    assert_int_equal(r[7].nitems, 0);

    fallback_delete_upto(fx->fb, 3, record_cb, &r[8]);
    fallback_read(fx->fb, 0, 10, record_cb, &r[9]);
    fallback_delete_upto(fx->fb, 3, record_cb, &r[10]);
    run_until(fx, &fx->done, 11);
    assert_ok(&r[8], 3);
    assert_string_equal(members(&r[9]), "x2 y0");
    assert_ok(&r[10], 0);
    assert_int_equal(fallback_key_rows(fx->fb, "a", 1), 1);
    assert_int_equal(fallback_key_rows(fx->fb, "b", 1), 1);
    assert_int_equal(fallback_key_rows(fx->fb, "c", 1), 0);
    fallback_get_stats(fx->fb, &st);
    assert_int_equal(st.rows, 2);
    assert_int_equal(st.bytes, 1 + 2 + 1 + 2);
    assert_int_equal(st.deleted, 3);
    assert_int_equal(st.written, 5);
    /* the list order survives the delete: b is y0 y1 minus y1 */
    pop(fx, FB_TAIL, "b", 5, &r[11]);
    run_until(fx, &fx->done, 12);
    assert_string_equal(members(&r[11]), "y0");
    before = r[11].items[0].id;
    assert_int_equal(before, 5);
}

/* The replay deletes key by key: only that key's rows up to the id go;
 * a push without a callback is stored all the same. */
static void test_delete_key_upto(void **state)
{
    fixture *fx = *state;
    rec r[5];
    fallback_stats st;
    rec_init(fx, r, 5);
    for (int i = 0; i < 3; i++) {
        push(fx, FB_RPUSH, "a", (const char *[]){"a"}, NULL, 1, &r[0]); /* ids 1, 3, 5 */
        fallback_push(fx->fb, FB_RPUSH, "b", 1, (const char *[]){"bb"}, (size_t[]){2}, NULL, 1,
                      NULL, NULL); /* ids 2, 4, 6 */
    }
    fallback_delete_key_upto(fx->fb, "a", 1, 4, record_cb, &r[1]);
    fallback_delete_key_upto(fx->fb, "zzz", 3, 6, record_cb, &r[2]);
    fallback_read(fx->fb, 0, 10, record_cb, &r[3]);
    run_until(fx, &fx->done, 6);
    assert_ok(&r[1], 2);
    assert_ok(&r[2], 0);
    assert_string_equal(members(&r[3]), "bb bb a bb");
    assert_int_equal(r[3].items[2].id, 5);
    assert_int_equal(fallback_key_rows(fx->fb, "a", 1), 1);
    assert_int_equal(fallback_key_rows(fx->fb, "b", 1), 3);
    fallback_get_stats(fx->fb, &st);
    assert_int_equal(st.rows, 4);
    assert_int_equal(st.bytes, 2 + 3 * 3);
    assert_int_equal(st.deleted, 2);
    assert_int_equal(st.written, 6);
    fallback_delete_key_upto(fx->fb, "b", 1, 100, record_cb, &r[4]);
    run_until(fx, &fx->done, 7);
    assert_ok(&r[4], 3);
    assert_int_equal(fallback_key_rows(fx->fb, "b", 1), 0);
    assert_int_equal(fallback_rows(fx->fb), 1);
}

/* Rows, ids, list ends and the key index survive close and reopen; an id
 * is never handed out twice, even after every row was deleted. */
static void test_persistence(void **state)
{
    fixture *fx = *state;
    rec r[10];
    fallback_stats st;
    rec_init(fx, r, 10);
    push(fx, FB_RPUSH, "l", (const char *[]){"1", "2", "3"}, NULL, 3, &r[0]);
    push(fx, FB_ZADD, "z", (const char *[]){"m", "n"}, (double[]){7, 3}, 2, &r[1]);
    pop(fx, FB_HEAD, "l", 1, &r[2]);
    run_until(fx, &fx->done, 3);
    rec done;
    settle(fx, &r[2], 1, 1, &done);
    fx->done = 3;
    store_reopen(fx);
    assert_int_equal(fallback_rows(fx->fb), 4);
    assert_int_equal(fallback_key_rows(fx->fb, "l", 1), 2);
    assert_int_equal(fallback_key_rows(fx->fb, "z", 1), 2);
    fallback_get_stats(fx->fb, &st);
    assert_int_equal(st.bytes, 2 * 2 + 2 * 2);
    assert_true(st.oldest_ms > 0);
    assert_int_equal(st.written, 0); /* counters are per run */
    fallback_read(fx->fb, 0, 10, record_cb, &r[3]);
    push(fx, FB_LPUSH, "l", (const char *[]){"0"}, NULL, 1, &r[4]);
    pop(fx, FB_HEAD, "l", 10, &r[5]);
    pop(fx, FB_MIN, "z", 1, &r[6]);
    run_until(fx, &fx->done, 7);
    assert_string_equal(members(&r[3]), "2 3 m n");
    assert_int_equal(r[3].items[0].id, 2);
    assert_int_equal(r[3].items[3].id, 5);
    assert_ok(&r[4], 3);
    assert_string_equal(members(&r[5]), "0 2 3");
    assert_int_equal(r[5].items[0].id, 6);
    assert_string_equal(members(&r[6]), "n");
    fallback_delete_upto(fx->fb, 100, record_cb, &r[7]);
    run_until(fx, &fx->done, 8);
    assert_ok(&r[7], 5); /* taken rows too: the replay has them */
    assert_int_equal(fallback_rows(fx->fb), 0);
    store_reopen(fx);
    fallback_get_stats(fx->fb, &st);
    assert_int_equal(st.rows, 0);
    assert_int_equal(st.oldest_ms, 0);
    push(fx, FB_RPUSH, "l", (const char *[]){"new"}, NULL, 1, &r[8]);
    fallback_read(fx->fb, 0, 10, record_cb, &r[9]);
    run_until(fx, &fx->done, 10);
    assert_int_equal(r[9].nitems, 1);
    assert_int_equal(r[9].items[0].id, 7);
}

#define KI_KEYS 300

/* Enough keys to grow the index several times; after reopen every key's
 * count is what the writes and pops left. */
static void test_key_index_reopen(void **state)
{
    fixture *fx = *state;
    static rec r[2 * KI_KEYS];
    uint64_t want[KI_KEYS], total = 0;
    char key[32];
    rec_init(fx, r, 2 * KI_KEYS);
    for (int i = 0; i < KI_KEYS; i++) {
        snprintf(key, sizeof(key), "key:%d", i);
        size_t n = 1 + (size_t)(i % 5);
        push(fx, FB_RPUSH, key, (const char *[]){"a", "b", "c", "d", "e"}, NULL, n, &r[i]);
        want[i] = n;
        if (i % 4 == 0) {
            pop(fx, FB_TAIL, key, 2, &r[KI_KEYS + i]);
            want[i] -= n < 2 ? n : 2;
        } else {
            fallback_read(fx->fb, 0, 0, record_cb, &r[KI_KEYS + i]);
        }
        total += want[i];
    }
    run_until(fx, &fx->done, 2 * KI_KEYS);
    for (int i = 0; i < KI_KEYS; i += 4) {
        rec done;
        settle(fx, &r[KI_KEYS + i], 1, 1, &done);
    }
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 0; i < KI_KEYS; i++) {
            snprintf(key, sizeof(key), "key:%d", i);
            assert_int_equal(fallback_key_rows(fx->fb, key, strlen(key)), want[i]);
        }
        assert_int_equal(fallback_rows(fx->fb), total);
        assert_int_equal(fallback_key_rows(fx->fb, "key:", 4), 0);
        store_reopen(fx);
    }
}

/* ---------------------------------------------------------------------------
 * Lock, full store, failed writes, corrupt files
 * ------------------------------------------------------------------------ */

/* A second open on the same path fails, in this process (flock is per open
 * file description) and in another; closing releases the lock. */
static void test_lock_conflict(void **state)
{
    fixture *fx = *state;
    fallback *second = (fallback *)1;
    char err[256];
    int rc = fallback_open(&fx->loop, fx->path, 0, &second, err, sizeof(err));
    assert_int_equal(rc, UV_EBUSY);
    assert_null(second);
    assert_non_null(strstr(err, fx->path));
    assert_non_null(strstr(err, "another ferry holds it"));

    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) { /* a fresh process: this binary again, in try_open mode */
        execl(self_path, self_path, "--try-open", fx->path, (char *)NULL);
        _exit(127);
    }
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);

    store_close(fx);
    assert_int_equal(store_open(fx, 0), 0);
}

#define FULL_BATCH 8 /* pushes per turn */
#define FULL_MAX_ROUNDS 200
#define FULL_POPPED 24

/* A store bounded to 96 KiB: pushes of 1 KiB fill it, the failing group's
 * writes all get ENOSPC and none of them is stored; pops still work (taking
 * a row needs no space), and once their replies are confirmed (the rows
 * deleted) pushes are accepted again. */
static void test_max_bytes(void **state)
{
    fixture *fx = *state;
    static rec r[FULL_BATCH];
    rec one[4];
    char big[1024];
    const char *m[1] = {big};
    size_t len = sizeof(big);
    uint64_t acked = 0;
    fallback_stats st;
    int failed = 0;
    store_close(fx);
    assert_int_equal(store_open(fx, 96 * 1024), 0);
    memset(big, 'x', sizeof(big));
    for (int round = 0; round < FULL_MAX_ROUNDS && !failed; round++) {
        rec_init(fx, r, FULL_BATCH);
        fx->done = 0;
        for (int i = 0; i < FULL_BATCH; i++) {
            fallback_push(fx->fb, FB_RPUSH, "big", 3, m, &len, NULL, 1, record_cb, &r[i]);
        }
        run_until(fx, &fx->done, FULL_BATCH);
        failed = r[0].status != 0;
        for (int i = 0; i < FULL_BATCH; i++) {
            assert_int_equal(r[i].status, r[0].status); /* all or nothing */
            acked += r[i].status == 0;
        }
    }
    assert_true(failed);
    assert_true(acked >= FULL_POPPED && acked < 96);
    assert_int_equal(r[0].status, UV_ENOSPC);
    assert_string_equal(r[0].errstr, "database or disk is full (SQLITE_FULL)");
    fallback_get_stats(fx->fb, &st);
    assert_int_equal(st.commit_errors, 1);
    assert_string_equal(st.last_error, r[0].errstr);
    assert_int_equal(st.rows, acked);
    assert_int_equal(fallback_key_rows(fx->fb, "big", 3), acked);

    rec_init(fx, one, 4);
    fx->done = 0;
    pop(fx, FB_HEAD, "big", FULL_POPPED, &one[0]);
    run_until(fx, &fx->done, 1);
    assert_ok(&one[0], FULL_POPPED);
    rec done;
    settle(fx, &one[0], 1, 1, &done);
    assert_ok(&done, FULL_POPPED);
    fx->done = 1;
    fallback_push(fx->fb, FB_RPUSH, "big", 3, m, &len, NULL, 1, record_cb, &one[1]);
    fallback_push(fx->fb, FB_RPUSH, "big", 3, m, &len, NULL, 1, record_cb, &one[2]);
    fallback_read(fx->fb, 0, 1000, record_cb, &one[3]);
    run_until(fx, &fx->done, 4);
    assert_ok(&one[1], (int64_t)acked - FULL_POPPED + 1);
    assert_ok(&one[2], (int64_t)acked - FULL_POPPED + 2);
    assert_int_equal(one[3].nitems, acked - FULL_POPPED + 2);
    fallback_get_stats(fx->fb, &st);
    assert_string_equal(st.last_error, "");
}

/* An I/O error fails the group it hits (nothing of it stored), and the
 * next group commits normally. */
static void test_io_error(void **state)
{
    fixture *fx = *state;
    sqlite3_vfs *vfs = sqlite3_vfs_find(NULL);
    rec r[5];
    rec_init(fx, r, 5);
    real_pwrite = vfs->xGetSystemCall(vfs, "pwrite64");
    assert_non_null(real_pwrite);
    assert_int_equal(vfs->xSetSystemCall(vfs, "pwrite64", (sqlite3_syscall_ptr)faulty_pwrite),
                     SQLITE_OK);
    push(fx, FB_RPUSH, "k", (const char *[]){"before"}, NULL, 1, &r[0]);
    run_until(fx, &fx->done, 1);
    assert_ok(&r[0], 1);
    fail_writes = 1;
    failed_writes = 0;
    push(fx, FB_RPUSH, "k", (const char *[]){"lost1"}, NULL, 1, &r[1]);
    push(fx, FB_RPUSH, "k", (const char *[]){"lost2"}, NULL, 1, &r[2]);
    run_until(fx, &fx->done, 3);
    fail_writes = 0;
    assert_true(failed_writes > 0);
    assert_int_equal(r[1].status, UV_EIO);
    assert_int_equal(r[2].status, UV_EIO);
    assert_non_null(strstr(r[1].errstr, "disk I/O error (SQLITE_IOERR)"));
    push(fx, FB_RPUSH, "k", (const char *[]){"after"}, NULL, 1, &r[3]);
    run_until(fx, &fx->done, 4);
    assert_ok(&r[3], 2);
    vfs->xSetSystemCall(vfs, "pwrite64", NULL);
    store_reopen(fx);
    fallback_read(fx->fb, 0, 10, record_cb, &r[4]);
    run_until(fx, &fx->done, 5);
    assert_string_equal(members(&r[4]), "before after");
}

/* A statement that fails inside a group (a trigger another connection put
 * on the table raises on "boom"): every operation of the group fails with
 * the error, including a push before it that had already run, and the
 * next group commits. */
static void test_group_rollback(void **state)
{
    fixture *fx = *state;
    sqlite3 *db;
    rec r[6];
    rec_init(fx, r, 6);
    assert_int_equal(sqlite3_open(fx->path, &db), SQLITE_OK);
    assert_int_equal(sqlite3_exec(db,
                                  "CREATE TRIGGER boom BEFORE INSERT ON rows WHEN NEW.member ="
                                  " CAST('boom' AS BLOB) BEGIN SELECT RAISE(ABORT, 'boom'); END",
                                  NULL, NULL, NULL),
                     SQLITE_OK);
    sqlite3_close(db);
    push(fx, FB_RPUSH, "k", (const char *[]){"kept"}, NULL, 1, &r[0]);
    run_until(fx, &fx->done, 1);
    push(fx, FB_RPUSH, "k", (const char *[]){"undone"}, NULL, 1, &r[1]);
    pop(fx, FB_HEAD, "k", 1, &r[2]);
    push(fx, FB_RPUSH, "k", (const char *[]){"boom"}, NULL, 1, &r[3]);
    run_until(fx, &fx->done, 4);
    for (int i = 1; i < 4; i++) {
        assert_int_equal(r[i].status, UV_EIO);
        assert_string_equal(r[i].errstr, "boom (SQLITE_CONSTRAINT)");
        assert_int_equal(r[i].nitems, 0);
    }
    push(fx, FB_RPUSH, "k", (const char *[]){"next"}, NULL, 1, &r[4]);
    fallback_read(fx->fb, 0, 10, record_cb, &r[5]);
    run_until(fx, &fx->done, 6);
    assert_ok(&r[4], 2);
    assert_string_equal(members(&r[5]), "kept next");
    assert_int_equal(fallback_key_rows(fx->fb, "k", 1), 2);
}

static void write_file(const char *path, const char *data, size_t len, off_t at)
{
    int fd = open(path, O_WRONLY | O_CREAT, 0600);
    assert_true(fd >= 0);
    assert_int_equal(pwrite(fd, data, len, at), (ssize_t)len);
    close(fd);
}

static void assert_open_fails(fixture *fx, const char *path, const char *why)
{
    fallback *fb = (fallback *)1;
    char err[256];
    int rc = fallback_open(&fx->loop, path, 0, &fb, err, sizeof(err));
    if (rc == 0 || strstr(err, why) == NULL) {
        print_error("open %s: %d %s\n", path, rc, rc ? err : "");
    }
    assert_true(rc < 0);
    assert_null(fb);
    assert_non_null(strstr(err, path));
    assert_non_null(strstr(err, why));
}

/* Not a database, someone else's database, a store whose pages were
 * overwritten: each open fails and says why, and releases the lock (a
 * second try gives the same answer, not "locked"). */
static void test_corrupt_file(void **state)
{
    fixture *fx = *state;
    char path[400], junk[8192];
    sqlite3 *db;
    rec r[1];
    rec_init(fx, r, 1);
    memset(junk, '?', sizeof(junk));
    snprintf(path, sizeof(path), "%s/junk.db", fx->dir);
    write_file(path, junk, sizeof(junk), 0);
    assert_open_fails(fx, path, "file is not a database (SQLITE_NOTADB)");
    assert_open_fails(fx, path, "file is not a database (SQLITE_NOTADB)");

    snprintf(path, sizeof(path), "%s/other.db", fx->dir);
    assert_int_equal(sqlite3_open(path, &db), SQLITE_OK);
    assert_int_equal(sqlite3_exec(db, "CREATE TABLE t(x)", NULL, NULL, NULL), SQLITE_OK);
    sqlite3_close(db);
    assert_open_fails(fx, path, "not a ferry fallback store");

    for (int i = 0; i < 20; i++) {
        push(fx, FB_RPUSH, "k", (const char *[]){"some element"}, NULL, 1, r);
    }
    run_until(fx, &fx->done, 20);
    store_close(fx);
    write_file(fx->path, junk, sizeof(junk), 4096); /* pages 2 and 3 */
    assert_open_fails(fx, fx->path, fx->path);
    assert_open_fails(fx, fx->path, "corrupt file");
}

/* ---------------------------------------------------------------------------
 * Binary bytes, close, dump
 * ------------------------------------------------------------------------ */

/* Keys and members with NUL bytes, an empty member, bytes that need
 * escaping; members that differ only by a trailing NUL sort shorter
 * first, as Redis compares them. */
static void test_binary(void **state)
{
    fixture *fx = *state;
    const char *m[3] = {"x\0y", "", "\xff\n\"\\"};
    size_t lens[3] = {3, 0, 4};
    const char *zm[2] = {"a\0", "a"};
    size_t zlens[2] = {2, 1};
    double zs[2] = {1, 1};
    rec r[5];
    rec_init(fx, r, 5);
    fallback_push(fx->fb, FB_LPUSH, "q\0a", 3, m, lens, NULL, 3, record_cb, &r[0]);
    fallback_push(fx->fb, FB_RPUSH, "q\0b", 3, m, lens, NULL, 1, record_cb, &r[1]);
    fallback_push(fx->fb, FB_ZADD, "z\0", 2, zm, zlens, zs, 2, record_cb, &r[2]);
    run_until(fx, &fx->done, 3);
    assert_ok(&r[0], 3);
    assert_ok(&r[1], 1);
    assert_ok(&r[2], 2);
    assert_int_equal(fallback_key_rows(fx->fb, "q\0a", 3), 3);
    assert_int_equal(fallback_key_rows(fx->fb, "q\0b", 3), 1);
    assert_int_equal(fallback_key_rows(fx->fb, "q", 1), 0);
    assert_int_equal(fallback_key_rows(fx->fb, "z\0", 2), 2);

    char *text = NULL;
    size_t textlen = 0;
    char err[256];
    FILE *out = open_memstream(&text, &textlen);
    assert_int_equal(fallback_dump(fx->path, out, err, sizeof(err)), 0);
    fclose(out);
    assert_non_null(strstr(text, " LPUSH \"q\\x00a\" \"x\\x00y\"\n"));
    assert_non_null(strstr(text, " LPUSH \"q\\x00a\" \"\"\n"));
    assert_non_null(strstr(text, " LPUSH \"q\\x00a\" \"\\xff\\n\\\"\\\\\"\n"));
    assert_non_null(strstr(text, " ZADD \"z\\x00\" 1 \"a\\x00\"\n"));
    free(text);

    fallback_pop(fx->fb, FB_TAIL, "q\0a", 3, 3, record_cb, &r[3]);
    fallback_pop(fx->fb, FB_MIN, "z\0", 2, 2, record_cb, &r[4]);
    run_until(fx, &fx->done, 5);
    assert_int_equal(r[3].nitems, 3);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(r[3].items[i].keylen, 3);
        assert_memory_equal(r[3].items[i].key, "q\0a", 3);
        assert_int_equal(r[3].items[i].memberlen, lens[i]);
        assert_memory_equal(r[3].items[i].member, m[i], lens[i]);
    }
    assert_int_equal(r[4].items[0].memberlen, 1);
    assert_int_equal(r[4].items[1].memberlen, 2);
    assert_memory_equal(r[4].items[1].member, "a\0", 2);
}

/* Closing with one group in the worker and one operation queued: close
 * waits, the committed group's callback runs (status 0) before close
 * returns, the queued one is cancelled and not stored. */
static void test_close_inflight(void **state)
{
    fixture *fx = *state;
    rec r[3];
    rec_init(fx, r, 3);
    push(fx, FB_RPUSH, "k", (const char *[]){"committed"}, NULL, 1, &r[0]);
    uv_run(&fx->loop, UV_RUN_NOWAIT); /* the check hands the group to the worker */
    push(fx, FB_RPUSH, "k", (const char *[]){"cancelled"}, NULL, 1, &r[1]);
    assert_int_equal(r[0].calls, 0);
    fallback_close(fx->fb);
    assert_ok(&r[0], 1);
    assert_int_equal(r[1].calls, 1);
    assert_int_equal(r[1].status, UV_ECANCELED);
    fx->fb = NULL;
    assert_int_equal(uv_run(&fx->loop, UV_RUN_DEFAULT), 0);
    assert_int_equal(store_open(fx, 0), 0);
    fallback_read(fx->fb, 0, 10, record_cb, &r[2]);
    run_until(fx, &fx->done, 3);
    assert_string_equal(members(&r[2]), "committed");
}

static rec cb_close_late;

/* Closes the store from inside its own callback, then pushes. */
static void close_from_cb(rec *r)
{
    fallback *fb = r->fx->fb;
    r->fx->fb = NULL;
    fallback_close(fb);
    fallback_push(fb, FB_RPUSH, "k", 1, (const char *[]){"late"}, (size_t[]){4}, NULL, 1, record_cb,
                  &cb_close_late);
}

/* A callback that closes the store: the rest of its committed group still
 * gets status 0, a push after close is cancelled at once, nothing leaks. */
static void test_close_in_callback(void **state)
{
    fixture *fx = *state;
    rec r[2];
    rec_init(fx, r, 2);
    rec_init(fx, &cb_close_late, 1);
    r[0].then = close_from_cb;
    push(fx, FB_RPUSH, "k", (const char *[]){"a"}, NULL, 1, &r[0]);
    push(fx, FB_RPUSH, "k", (const char *[]){"b"}, NULL, 1, &r[1]);
    run_until(fx, &fx->done, 3);
    assert_ok(&r[0], 1);
    assert_ok(&r[1], 2);
    assert_int_equal(r[1].seq, 1); /* delivered by the close inside a's callback */
    assert_int_equal(cb_close_late.status, UV_ECANCELED);
    assert_int_equal(cb_close_late.seq, 2);
    assert_null(fx->fb);
}

/* The dump reads a store another ferry holds, in id order, one line per
 * row; a missing or foreign file is an error. */
static void test_dump(void **state)
{
    fixture *fx = *state;
    rec r[2];
    char *text = NULL, err[256], path[400];
    size_t textlen = 0;
    rec_init(fx, r, 2);
    push(fx, FB_RPUSH, "jobs", (const char *[]){"j1", "j2"}, NULL, 2, &r[0]);
    push(fx, FB_ZADD, "delayed", (const char *[]){"d1"}, (double[]){1700000000000.5}, 1, &r[1]);
    run_until(fx, &fx->done, 2);
    FILE *out = open_memstream(&text, &textlen);
    assert_int_equal(fallback_dump(fx->path, out, err, sizeof(err)), 0);
    fclose(out);
    char *second = strchr(text, '\n') + 1;
    char *third = strchr(second, '\n') + 1;
    assert_non_null(strstr(text, "1 2"));
    assert_memory_equal(strstr(text, "Z RPUSH"), "Z RPUSH \"jobs\" \"j1\"\n", 20);
    assert_memory_equal(second, "2 ", 2);
    assert_non_null(strstr(second, "Z RPUSH \"jobs\" \"j2\"\n"));
    assert_memory_equal(third, "3 ", 2);
    assert_non_null(strstr(third, "Z ZADD \"delayed\" 1700000000000.5 \"d1\"\n"));
    assert_string_equal(strchr(third, '\n'), "\n");
    store_close(fx); /* and once nobody holds it: the same rows */
    char *again = NULL;
    out = open_memstream(&again, &textlen);
    assert_int_equal(fallback_dump(fx->path, out, err, sizeof(err)), 0);
    fclose(out);
    assert_string_equal(again, text);
    free(again);
    free(text);

    snprintf(path, sizeof(path), "%s/none.db", fx->dir);
    out = open_memstream(&text, &textlen);
    assert_true(fallback_dump(path, out, err, sizeof(err)) < 0);
    fclose(out);
    free(text);
    assert_non_null(strstr(err, path));
}

/* The other process of test_lock_conflict: exit 0 if opening path fails
 * because another ferry holds it. */
static int try_open(const char *path)
{
    uv_loop_t loop;
    fallback *fb = NULL;
    char err[256];
    int rc = uv_loop_init(&loop);
    if (rc == 0) {
        rc = fallback_open(&loop, path, 0, &fb, err, sizeof(err));
        fprintf(stderr, "try_open: %d %s\n", rc, rc != 0 ? err : "opened");
        fallback_close(fb);
        uv_run(&loop, UV_RUN_DEFAULT);
        uv_loop_close(&loop);
    }
    return rc == UV_EBUSY && strstr(err, "another ferry holds it") != NULL ? 0 : 1;
}

int main(int argc, char **argv)
{
    if (argc == 3 && strcmp(argv[1], "--try-open") == 0) {
        return try_open(argv[2]);
    }
    self_path = argv[0];
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_list_semantics, setup, teardown),
        cmocka_unit_test_setup_teardown(test_zset_semantics, setup, teardown),
        cmocka_unit_test_setup_teardown(test_move, setup, teardown),
        cmocka_unit_test_setup_teardown(test_confirm_release, setup, teardown),
        cmocka_unit_test_setup_teardown(test_taken_back_on_reopen, setup, teardown),
        cmocka_unit_test_setup_teardown(test_close_settles_queued, setup, teardown),
        cmocka_unit_test_setup_teardown(test_held_push, setup, teardown),
        cmocka_unit_test_setup_teardown(test_upgrade_v1, setup, teardown),
        cmocka_unit_test_setup_teardown(test_group_commit, setup, teardown),
        cmocka_unit_test_setup_teardown(test_read_delete, setup, teardown),
        cmocka_unit_test_setup_teardown(test_delete_key_upto, setup, teardown),
        cmocka_unit_test_setup_teardown(test_persistence, setup, teardown),
        cmocka_unit_test_setup_teardown(test_key_index_reopen, setup, teardown),
        cmocka_unit_test_setup_teardown(test_lock_conflict, setup, teardown),
        cmocka_unit_test_setup_teardown(test_max_bytes, setup, teardown),
        cmocka_unit_test_setup_teardown(test_io_error, setup, teardown),
        cmocka_unit_test_setup_teardown(test_group_rollback, setup, teardown),
        cmocka_unit_test_setup_teardown(test_corrupt_file, setup, teardown),
        cmocka_unit_test_setup_teardown(test_binary, setup, teardown),
        cmocka_unit_test_setup_teardown(test_close_inflight, setup, teardown),
        cmocka_unit_test_setup_teardown(test_close_in_callback, setup, teardown),
        cmocka_unit_test_setup_teardown(test_dump, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
