/* fallback_int.h - internal to the fallback store: the types and helpers
 * that fallback.c (the loop thread's side) and fallback_group.c (a group's
 * transaction on the threadpool) share. Nothing else includes it; the
 * contract is fallback.h. */
#ifndef FERRY_FALLBACK_INT_H
#define FERRY_FALLBACK_INT_H

#include <sqlite3.h>
#include <stdint.h>

#include "fallback.h"
#include "ferry.h"

#define FB_ERRLEN 160 /* error strings (fits fallback_stats.last_error) */

/* One key's pending rows in the loop-side index. */
typedef struct key_entry {
    struct key_entry *next; /* next in the same slot */
    uint64_t hash;          /* key_hash() of the key */
    uint64_t rows;          /* rows in the store, taken ones included (> 0; entries at 0
                               are removed) */
    uint64_t taken;         /* of those, taken by pops whose replies are not confirmed */
    size_t keylen;          /* bytes in key */
    char key[];             /* the key bytes */
} key_entry;

/* A chained hash table of key_entry. */
typedef struct key_index {
    key_entry **slots; /* nslots chain heads */
    size_t nslots;     /* a power of two */
    size_t n;          /* entries */
} key_index;

typedef enum op_type {
    OP_PUSH = 0, /* fallback_push */
    OP_POP,      /* fallback_pop */
    OP_READ,     /* fallback_read */
    OP_DELETE,   /* fallback_delete_upto */
    OP_MOVE,     /* fallback_move */
    OP_CONFIRM,  /* fallback_confirm */
    OP_RELEASE   /* fallback_release */
} op_type;

/* The effect of a delete (or a confirm, a release) on one key. */
typedef struct key_delta {
    char *key;     /* key bytes (owned) */
    size_t keylen; /* bytes */
    int64_t rows;  /* rows deleted */
    int64_t taken; /* of those, or of the rows put back, rows that were taken */
    int64_t bytes; /* key + member bytes deleted */
} key_delta;

/* One queued operation; the worker writes its results. */
typedef struct fb_op {
    struct fb_op *next; /* next in the queue / the group, in submission order */
    op_type type;       /* what it does */
    int how;            /* push: enum fallback_kind; pop: enum fallback_end */
    char *key;          /* push/pop: key bytes, then (push) the members back to back */
    size_t keylen;      /* bytes of key */
    size_t n;           /* push: members; pop/read: most rows to return; confirm,
                           release: ids */
    size_t *lens;       /* push: member lengths */
    double *scores;     /* push FB_ZADD: scores */
    int64_t id;         /* read: rows after this id; delete: rows up to it */
    int64_t *ids;       /* confirm, release: the rows */
    int64_t ts_ms;      /* push: wall-clock ms when queued */
    char *rcpt;         /* push: a held push's receipt key (fallback_push_held), or NULL */
    size_t rcptlen;
    fallback_cb cb;       /* may be NULL */
    void *arg;            /* for cb */
    int err;              /* refused before it ran (UV_EINVAL), else 0 */
    const char *errstr;   /* why, when err != 0 */
    int64_t count;        /* result count (see fallback_result) */
    fallback_item *items; /* pop/read: rows returned; item.key owns key+member */
    size_t nitems;        /* rows in items */
    size_t itemcap;       /* allocated in items */
    int64_t drows;        /* push/pop: rows added (negative: removed) for key */
    int64_t dbytes;       /* push/pop: bytes added (negative: removed) */
    int64_t dtaken;       /* pop: rows of key taken */
    key_delta *deltas;    /* delete: per key; move: the destination's row */
    int to;               /* move: FB_LPUSH or FB_RPUSH into dst */
    size_t ndeltas;       /* entries in deltas */
} fb_op;

/* One transaction's worth of operations. */
typedef struct fb_group {
    uv_work_t req;          /* threadpool request; req.data unused */
    fallback *fb;           /* owner */
    fb_op *ops;             /* in order; popped as their callbacks run */
    int done;               /* worker finished (under fb->mu) */
    int finished;           /* stats applied on the loop thread */
    int status;             /* 0 committed, or negative: nothing took effect */
    char errstr[FB_ERRLEN]; /* why it failed */
    uint64_t commit_us;     /* BEGIN..COMMIT in the worker */
    int64_t oldest_ms;      /* ts of the lowest id after commit, 0 if none */
} fb_group;

enum fb_stmt {
    ST_BEGIN = 0,
    ST_COMMIT,
    ST_ROLLBACK,
    ST_INSERT,
    ST_HEADPOS,
    ST_TAILPOS,
    ST_ZFIND,
    ST_ZUPDATE,
    ST_POP_HEAD, /* ST_POP_HEAD + enum fallback_end */
    ST_POP_TAIL,
    ST_POP_MIN,
    ST_POP_MAX,
    ST_DEL_ID,
    ST_TAKE,
    ST_UNTAKE,
    ST_TAKEN_ROW,
    ST_READ,
    ST_DEL_COUNT,
    ST_DEL_UPTO,
    ST_DEL_KEY_COUNT,
    ST_DEL_KEY_UPTO,
    ST_OLDEST,
    ST_COUNT
};

struct fallback {
    uv_loop_t *loop;              /* the loop callbacks run on */
    uv_check_t check;             /* submits the queued group at the end of a loop turn */
    uv_idle_t idle;               /* keeps the poll from blocking while operations wait */
    char *path;                   /* database file */
    int lockfd;                   /* "<path>.lock", flock'ed; -1 once released */
    sqlite3 *db;                  /* the connection (see the threads note on top) */
    sqlite3_stmt *stmt[ST_COUNT]; /* prepared statements */
    char werr[FB_ERRLEN];         /* worker: the first error of the group in flight */
    uv_mutex_t mu;                /* guards fb_group.done */
    uv_mutex_t ixlock;            /* guards keys, stats.rows and .oldest_ms */
    uv_cond_t cond;               /* signalled when a group is done */
    fb_op *qhead;                 /* queued, not submitted yet */
    fb_op *qtail;                 /* last queued */
    fb_group *inflight;           /* the group in the worker or being delivered */
    int scheduled;                /* check and idle started */
    int closing;                  /* fallback_close called */
    int refs;                     /* pending close callbacks and work completions */
    key_index keys;               /* pending rows per key */
    fallback_stats stats;         /* rows, bytes, oldest_ms kept current on the loop */
};

/* fallback.c: a SQLite result code as a libuv error. */
int fb_sqlite_to_uv(int rc);
/* fallback.c: "<sqlite3_errmsg> (SQLITE_X)" into out. */
void fb_sqlite_errstr(sqlite3 *db, int rc, char *out, size_t len);
/* fallback.c: a BLOB column's bytes (a zero-length one comes back as ""). */
const char *fb_column_bytes(sqlite3_stmt *s, int col, size_t *n);
/* fallback.c: free op's results (after a rollback: none took effect). */
void fb_op_drop_results(fb_op *op);

/* fallback_group.c: ts of the lowest id, 0 if the store is empty. */
int fb_sql_oldest(fallback *fb, int64_t *out);
/* fallback_group.c, threadpool: run the group req belongs to. */
void fb_work_cb(uv_work_t *req);

#endif
