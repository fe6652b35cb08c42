/* fallback.h - the fallback store (N14): queue elements written while no
 * Redis master is usable, kept on ferry's disk in SQLite (WAL mode,
 * synchronous=FULL), committed off the event loop in group commits, served
 * to pops while Redis is away, and read back in write order for the replay.
 *
 * A pop does not delete: it takes rows (marks them; no other pop gets
 * them) and they stay in the store until the caller says what became of
 * the reply that carries them: fallback_confirm once it was written to the
 * client's socket (the rows are deleted), fallback_release if it never will
 * be (they are back in the queue where they were). Rows still taken when
 * the store is opened again (ferry was killed, or stopped before it knew)
 * are back in the queue, in place: never lost, rarely delivered twice.
 *
 * Every operation is queued on the loop thread and runs, in submission
 * order, in a worker thread (uv_queue_work); everything queued while one
 * group is being committed goes into the next group, one SQLite
 * transaction per group. Callbacks run on the loop thread once the group
 * is durably committed (or failed: then no operation of that group took
 * effect). No fsync ever runs on the loop thread. */
#ifndef FERRY_FALLBACK_H
#define FERRY_FALLBACK_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <uv.h>

/* What a row holds: one list element or one sorted-set member. */
enum fallback_kind {
    FB_LPUSH = 1, /* pushed at the head of a list */
    FB_RPUSH = 2, /* pushed at the tail of a list */
    FB_ZADD = 3   /* a sorted-set member with its score */
};

/* Where a pop takes from. */
enum fallback_end {
    FB_HEAD = 0, /* LPOP / BLPOP */
    FB_TAIL = 1, /* RPOP / BRPOP */
    FB_MIN = 2,  /* ZPOPMIN / BZPOPMIN */
    FB_MAX = 3   /* ZPOPMAX / BZPOPMAX */
};

typedef struct fallback_item {
    int64_t id;      /* row id: write order across all keys, never reused */
    int kind;        /* enum fallback_kind */
    const char *key; /* key bytes (binary safe) */
    size_t keylen;
    const char *member; /* element / member bytes (binary safe) */
    size_t memberlen;
    double score;     /* FB_ZADD */
    int64_t ts_ms;    /* wall-clock ms when it was written */
    int taken;        /* 1: a pop took it and its reply is not confirmed yet */
    const char *rcpt; /* a held row (fallback_push_held): its push's receipt key; else NULL */
    size_t rcptlen;
} fallback_item;

typedef struct fallback_result {
    int64_t count;        /* push: the key's length in the store after it (list:
                             elements; zset: members); zadd: members added (not
                             updated); delete, confirm: rows deleted; release:
                             rows put back */
    fallback_item *items; /* pop / read: the rows, valid until the callback returns */
    size_t nitems;
} fallback_result;

/* status: 0, or a negative error (FERRY_E* or UV_E*) with errstr saying what
 * happened in words ("disk full (SQLITE_FULL)", "database is locked", ...).
 * errstr is NULL on success; res is never NULL (count 0, no items on error). */
typedef void (*fallback_cb)(void *arg, int status, const char *errstr, const fallback_result *res);

typedef struct fallback_stats {
    uint64_t rows;          /* rows pending (not yet replayed, nor popped and confirmed);
                               taken rows included */
    uint64_t taken;         /* rows taken by pops whose replies are not confirmed */
    uint64_t bytes;         /* bytes of keys + members pending */
    int64_t oldest_ms;      /* wall-clock ms of the oldest pending row, 0 if none */
    uint64_t written;       /* rows written since start */
    uint64_t popped;        /* rows taken by pops since start */
    uint64_t confirmed;     /* taken rows deleted by fallback_confirm since start */
    uint64_t released;      /* taken rows put back since start: fallback_release, and
                               the rows found taken when the store was opened */
    uint64_t deleted;       /* rows deleted after replay since start */
    uint64_t commits;       /* groups committed */
    uint64_t commit_errors; /* groups that failed */
    uint64_t commit_us_sum; /* total commit time (worker side), microseconds */
    uint64_t commit_us_max; /* longest commit */
    char last_error[160];   /* "" if the last group committed */
} fallback_stats;

typedef struct fallback fallback;

/* Open (or create) the store at path on loop: WAL, synchronous=FULL, the
 * schema, and an exclusive lock held for the process's life (a second ferry
 * on the same path fails here with an error that says so). Rows a pop had
 * taken are put back (counted in stats.released). max_bytes > 0
 * bounds the file (SQLite max_page_count): past it writes fail as a full
 * disk would (fallback.max_bytes; tests use it to fill the store). Returns 0 and
 * *out, or a negative error with err filled. Existing rows are kept (they
 * are replayed once a master is up). */
int fallback_open(uv_loop_t *loop, const char *path, uint64_t max_bytes, fallback **out, char *err,
                  size_t errlen);
/* Finish the group in flight (waits for it), close SQLite, release the lock,
 * free. Queued confirms and releases run in one last transaction (on the
 * calling thread); other queued operations fail with UV_ECANCELED. NULL ok.
 * Blocks the loop thread until the group in flight is done; every callback
 * has run when it returns (an operation queued from one fails at once with
 * UV_ECANCELED). The memory goes once the loop runs again (handle close). */
void fallback_close(fallback *fb);

/* Append n elements (one client write: LPUSH key m1 .. mn, or ZADD key s1 m1
 * ...) in order. Copies what it needs. cb may be NULL. A NaN score or n == 0
 * fails this operation alone with UV_EINVAL. */
void fallback_push(fallback *fb, int kind, const char *key, size_t keylen,
                   const char *const *members, const size_t *lens, const double *scores, size_t n,
                   fallback_cb cb, void *arg);
/* A list push (FB_LPUSH, FB_RPUSH) Redis may have applied already: sent
 * with its receipt rcpt to a master that did not answer. Its rows are held:
 * no pop takes them (they count as taken in fallback_key_ready and the
 * stats), and the replay pushes them only where Redis lacks the receipt. A
 * reopened store keeps them held. The count answered includes them. */
void fallback_push_held(fallback *fb, int kind, const char *key, size_t keylen,
                        const char *const *members, const size_t *lens, size_t n, const char *rcpt,
                        size_t rcptlen, fallback_cb cb, void *arg);
/* Take up to count rows of key from one end (rows other pops took are
 * skipped): they stay in the store, taken, until fallback_confirm or
 * fallback_release names their ids. 0 rows is a success (count 0). */
void fallback_pop(fallback *fb, int end, const char *key, size_t keylen, size_t count,
                  fallback_cb cb, void *arg);
/* The replies carrying these taken rows were written to their client:
 * delete them. An id that is not taken (any more) is skipped. Copies ids. */
void fallback_confirm(fallback *fb, const int64_t *ids, size_t n, fallback_cb cb, void *arg);
/* The replies carrying these taken rows will never be written (the client
 * left first): put them back in the queue where they were (a sorted-set
 * member added again meanwhile keeps its new row and score). An id that is
 * not taken (any more) is skipped. Copies ids. */
void fallback_release(fallback *fb, const int64_t *ids, size_t n, fallback_cb cb, void *arg);
/* LMOVE/BLMOVE: take one row off src's end (FB_HEAD or FB_TAIL) and put
 * it at dst's end (FB_LPUSH: head, FB_RPUSH: tail) in one transaction; the
 * result has the moved row (0 rows: src had none). */
void fallback_move(fallback *fb, int end, const char *src, size_t srclen, int to, const char *dst,
                   size_t dstlen, fallback_cb cb, void *arg);
/* Read (without deleting) up to n rows with id > after_id, in id order,
 * taken rows included (item.taken says which). */
void fallback_read(fallback *fb, int64_t after_id, size_t n, fallback_cb cb, void *arg);
/* Delete every row with id <= upto (replayed and acknowledged by Redis),
 * taken ones included (a later confirm or release of them does nothing). */
void fallback_delete_upto(fallback *fb, int64_t upto, fallback_cb cb, void *arg);
/* The same for one key's rows only (the replay goes key by key). */
void fallback_delete_key_upto(fallback *fb, const char *key, size_t keylen, int64_t upto,
                              fallback_cb cb, void *arg);

/* Rows pending for key, taken ones included, from an in-memory index kept
 * by the loop thread (exact once every queued operation has completed).
 * This, fallback_key_ready and fallback_rows may be called from any thread
 * while the store is open. */
uint64_t fallback_key_rows(const fallback *fb, const char *key, size_t keylen);
/* Rows of key a pop may take (pending and not taken). */
uint64_t fallback_key_ready(const fallback *fb, const char *key, size_t keylen);
/* Rows pending in all, taken ones included. */
uint64_t fallback_rows(const fallback *fb);
/* Wall-clock ms of the oldest pending row as of the last commit, 0 if none
 * (any thread, as fallback_rows). */
int64_t fallback_oldest(const fallback *fb);
void fallback_get_stats(const fallback *fb, fallback_stats *st);

/* Print every pending row of the store at path to out, one per line
 * (id, time, command, key, member/score; binary bytes escaped), without
 * taking the lock (read-only). Returns 0 or a negative error. For
 * `ferry --fallback-dump`. */
int fallback_dump(const char *path, FILE *out, char *err, size_t errlen);

#endif
