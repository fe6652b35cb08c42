/* fallback.c - the fallback store (N14): queue rows in a SQLite file on
 * ferry's disk, written in group commits by a worker thread, served to pops
 * with Redis' semantics and read back in id order for the replay.
 *
 * Schema (`sqlite3 FILE .schema`; application_id 0x46525259 "FRRY",
 * user_version 1):
 *
 *   CREATE TABLE rows (
 *       id     INTEGER PRIMARY KEY AUTOINCREMENT, -- write order; never reused
 *       key    BLOB NOT NULL,                     -- Redis key bytes
 *       kind   INTEGER NOT NULL,                  -- 1 LPUSH, 2 RPUSH, 3 ZADD
 *       member BLOB NOT NULL,                     -- list element / zset member
 *       score  REAL,                              -- ZADD rows; NULL otherwise
 *       pos    INTEGER,                           -- list rows; NULL otherwise
 *       ts     INTEGER NOT NULL                   -- unix ms when written
 *   );
 *   CREATE INDEX rows_list ON rows(key, pos) WHERE pos IS NOT NULL;
 *   CREATE INDEX rows_zset ON rows(key, score, member) WHERE kind = 3;
 *   CREATE UNIQUE INDEX rows_zmember ON rows(key, member) WHERE kind = 3;
 *   CREATE INDEX rows_key ON rows(key, id);   -- the replay deletes key by key
 *
 *   sqlite3 -readonly FILE "SELECT id, kind, CAST(key AS TEXT),
 *       CAST(member AS TEXT), score, pos, ts FROM rows ORDER BY id"
 *
 * A list's head is its lowest pos: LPUSH puts an element at min(pos) - 1,
 * RPUSH at max(pos) + 1 (0 for an empty list), so replaying the rows in id
 * order with their own command rebuilds the same list. A ZADD of a member
 * the key already holds updates that row's score (the row keeps its id).
 * ZPOPMIN/ZPOPMAX order by score, then by member bytes, as Redis does.
 *
 * Threads: the loop thread queues operations; a uv_check at the end of the
 * loop turn hands everything queued to the threadpool as one group (one
 * BEGIN IMMEDIATE..COMMIT), at most one group at a time; operations queued
 * meanwhile form the next group. Callbacks, the per-key row index and the
 * stats live on the loop thread. The SQLite connection is used by the
 * worker while a group is in flight and by the loop thread only at open
 * (which may sync: schema, WAL recovery) and close. The per-key row index
 * and the row count are also read from other threads (workers: N, every
 * event loop decides what the store serves): they change and are read under
 * ixlock; everything else is the loop thread's. fallback_close blocks the
 * loop thread: it waits (mutex/cond) for the group in flight, delivers its
 * callbacks, and closes SQLite (whose last checkpoint syncs the file) -
 * start-up and shutdown only. Its memory is freed once the loop has run the
 * handles' close callbacks and the work request's completion.
 *
 * Lock: flock(LOCK_EX|LOCK_NB) on "<path>.lock", held while open; the file
 * is left in place (removing lock files races). */
#include "fallback.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <sqlite3.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <time.h>
#include <unistd.h>

#include "ferry.h"

#define FB_APP_ID 0x46525259    /* "FRRY" */
#define FB_SCHEMA_VERSION 1     /* user_version */
#define FB_BUSY_TIMEOUT_MS 100  /* only a foreign writer (sqlite3 CLI) can hold it */
#define FB_WAL_LIMIT (16 << 20) /* WAL file truncated to this after checkpoints */
#define FB_KEYS_MIN_SLOTS 64    /* key index: initial slots (power of two) */
#define FB_ERRLEN 160           /* error strings (fits fallback_stats.last_error) */

/* ---------------------------------------------------------------------------
 * Types
 * ------------------------------------------------------------------------ */

/* One key's pending rows in the loop-side index. */
typedef struct key_entry {
    struct key_entry *next; /* next in the same slot */
    uint64_t hash;          /* key_hash() of the key */
    uint64_t rows;          /* rows pending (> 0; entries at 0 are removed) */
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
    OP_MOVE      /* fallback_move */
} op_type;

/* The effect of a delete on one key. */
typedef struct key_delta {
    char *key;     /* key bytes (owned) */
    size_t keylen; /* bytes */
    int64_t rows;  /* rows deleted */
    int64_t bytes; /* key + member bytes deleted */
} key_delta;

/* One queued operation; the worker writes its results. */
typedef struct fb_op {
    struct fb_op *next;   /* next in the queue / the group, in submission order */
    op_type type;         /* what it does */
    int how;              /* push: enum fallback_kind; pop: enum fallback_end */
    char *key;            /* push/pop: key bytes, then (push) the members back to back */
    size_t keylen;        /* bytes of key */
    size_t n;             /* push: members; pop/read: most rows to return */
    size_t *lens;         /* push: member lengths */
    double *scores;       /* push FB_ZADD: scores */
    int64_t id;           /* read: rows after this id; delete: rows up to it */
    int64_t ts_ms;        /* push: wall-clock ms when queued */
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
    ST_READ,
    ST_DEL_COUNT,
    ST_DEL_UPTO,
    ST_DEL_KEY_COUNT,
    ST_DEL_KEY_UPTO,
    ST_OLDEST,
    ST_COUNT
};

#define ROW_COLS "id, kind, key, member, score, ts"

static const char *const stmt_sql[ST_COUNT] = {
    [ST_BEGIN] = "BEGIN IMMEDIATE",
    [ST_COMMIT] = "COMMIT",
    [ST_ROLLBACK] = "ROLLBACK",
    [ST_INSERT] = "INSERT INTO rows(key, kind, member, score, pos, ts) VALUES(?1,?2,?3,?4,?5,?6)",
    [ST_HEADPOS] = "SELECT pos FROM rows WHERE key = ?1 AND pos IS NOT NULL ORDER BY pos LIMIT 1",
    [ST_TAILPOS] = "SELECT pos FROM rows WHERE key = ?1 AND pos IS NOT NULL "
                   "ORDER BY pos DESC LIMIT 1",
    [ST_ZFIND] = "SELECT id FROM rows WHERE key = ?1 AND kind = 3 AND member = ?2",
    [ST_ZUPDATE] = "UPDATE rows SET score = ?2 WHERE id = ?1",
    [ST_POP_HEAD] = "SELECT " ROW_COLS " FROM rows WHERE key = ?1 AND pos IS NOT NULL "
                    "ORDER BY pos LIMIT ?2",
    [ST_POP_TAIL] = "SELECT " ROW_COLS " FROM rows WHERE key = ?1 AND pos IS NOT NULL "
                    "ORDER BY pos DESC LIMIT ?2",
    [ST_POP_MIN] = "SELECT " ROW_COLS " FROM rows WHERE key = ?1 AND kind = 3 "
                   "ORDER BY score, member LIMIT ?2",
    [ST_POP_MAX] = "SELECT " ROW_COLS " FROM rows WHERE key = ?1 AND kind = 3 "
                   "ORDER BY score DESC, member DESC LIMIT ?2",
    [ST_DEL_ID] = "DELETE FROM rows WHERE id = ?1",
    [ST_READ] = "SELECT " ROW_COLS " FROM rows WHERE id > ?1 ORDER BY id LIMIT ?2",
    [ST_DEL_COUNT] = "SELECT key, count(*), sum(length(key) + length(member)) FROM rows "
                     "WHERE id <= ?1 GROUP BY key",
    [ST_DEL_UPTO] = "DELETE FROM rows WHERE id <= ?1",
    [ST_DEL_KEY_COUNT] = "SELECT key, count(*), sum(length(key) + length(member)) FROM rows "
                         "WHERE id <= ?1 AND key = ?2 GROUP BY key",
    [ST_DEL_KEY_UPTO] = "DELETE FROM rows WHERE id <= ?1 AND key = ?2",
    [ST_OLDEST] = "SELECT ts FROM rows ORDER BY id LIMIT 1",
};

static const char schema_sql[] =
    "CREATE TABLE rows (id INTEGER PRIMARY KEY AUTOINCREMENT, key BLOB NOT NULL,"
    " kind INTEGER NOT NULL, member BLOB NOT NULL, score REAL, pos INTEGER,"
    " ts INTEGER NOT NULL);"
    "CREATE INDEX rows_list ON rows(key, pos) WHERE pos IS NOT NULL;"
    "CREATE INDEX rows_zset ON rows(key, score, member) WHERE kind = 3;"
    "CREATE UNIQUE INDEX rows_zmember ON rows(key, member) WHERE kind = 3;"
    "CREATE INDEX rows_key ON rows(key, id);";

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
    uv_mutex_t ixlock;            /* guards keys and stats.rows (read by other loops) */
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

static void key_index_init(key_index *ix);
static void key_index_free(key_index *ix);
static uint64_t key_index_get(const key_index *ix, const char *key, size_t keylen);
static void key_index_add(key_index *ix, const char *key, size_t keylen, int64_t delta);
static int sql_run(fallback *fb, sqlite3_stmt *s);
static void work_cb(uv_work_t *req);
static void after_work_cb(uv_work_t *req, int status);
static void fb_unref(fallback *fb);

/* ---------------------------------------------------------------------------
 * Small helpers
 * ------------------------------------------------------------------------ */

static int64_t wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* "FULL" for SQLITE_FULL (extended codes by their primary code). */
static const char *sqlite_code_name(int rc)
{
    static const char *const names[] = {
        "OK",       "ERROR",    "INTERNAL",  "PERM",   "ABORT",   "BUSY",       "LOCKED",
        "NOMEM",    "READONLY", "INTERRUPT", "IOERR",  "CORRUPT", "NOTFOUND",   "FULL",
        "CANTOPEN", "PROTOCOL", "EMPTY",     "SCHEMA", "TOOBIG",  "CONSTRAINT", "MISMATCH",
        "MISUSE",   "NOLFS",    "AUTH",      "FORMAT", "RANGE",   "NOTADB"};
    size_t primary = (size_t)(rc & 0xff);
    return primary < sizeof(names) / sizeof(names[0]) ? names[primary] : "?";
}

/* A SQLite result code as a libuv error. */
static int sqlite_to_uv(int rc)
{
    switch (rc & 0xff) {
    case SQLITE_FULL:
        return UV_ENOSPC;
    case SQLITE_BUSY:
    case SQLITE_LOCKED:
        return UV_EBUSY;
    case SQLITE_NOMEM:
        return UV_ENOMEM;
    case SQLITE_READONLY:
        return UV_EROFS;
    case SQLITE_PERM:
    case SQLITE_AUTH:
        return UV_EACCES;
    case SQLITE_TOOBIG:
        return UV_E2BIG;
    default:
        return UV_EIO; /* IOERR, CORRUPT, NOTADB, CANTOPEN and the rest */
    }
}

/* "<sqlite3_errmsg> (SQLITE_X)" into buf. */
static void sqlite_errstr(sqlite3 *db, int rc, char *out, size_t len)
{
    const char *msg = db != NULL ? sqlite3_errmsg(db) : sqlite3_errstr(rc);
    snprintf(out, len, "%s (SQLITE_%s)", msg, sqlite_code_name(rc));
}

/* Bind bytes as a BLOB; a zero-length one must not become NULL. */
static int bind_bytes(sqlite3_stmt *s, int idx, const char *p, size_t n)
{
    return sqlite3_bind_blob64(s, idx, n > 0 ? p : "", n, SQLITE_STATIC);
}

/* A BLOB column's bytes (a zero-length one comes back as NULL). */
static const char *column_bytes(sqlite3_stmt *s, int col, size_t *n)
{
    const char *p = sqlite3_column_blob(s, col);
    *n = (size_t)sqlite3_column_bytes(s, col);
    return p != NULL ? p : "";
}

static sqlite3_int64 clamp_limit(size_t n)
{
    return n > (size_t)INT64_MAX ? INT64_MAX : (sqlite3_int64)n;
}

/* ---------------------------------------------------------------------------
 * Key index (loop thread): rows pending per key
 * ------------------------------------------------------------------------ */

static uint64_t key_hash(const char *key, size_t keylen)
{
    uint64_t h = 0xcbf29ce484222325ULL; /* FNV-1a */
    for (size_t i = 0; i < keylen; i++) {
        h ^= (unsigned char)key[i];
        h *= 0x100000001b3ULL;
    }
    return h;
}

static void key_index_init(key_index *ix)
{
    ix->nslots = FB_KEYS_MIN_SLOTS;
    ix->slots = xcalloc(ix->nslots, sizeof(*ix->slots));
    ix->n = 0;
}

static void key_index_free(key_index *ix)
{
    for (size_t i = 0; i < ix->nslots; i++) {
        key_entry *e = ix->slots[i];
        while (e != NULL) {
            key_entry *next = e->next;
            free(e);
            e = next;
        }
    }
    free(ix->slots);
    ix->slots = NULL;
    ix->nslots = 0;
    ix->n = 0;
}

/* The link that points at key's entry, or at the NULL ending its chain. */
static key_entry **key_index_link(const key_index *ix, const char *key, size_t keylen, uint64_t h)
{
    key_entry **link = &ix->slots[h & (ix->nslots - 1)];
    while (*link != NULL) {
        key_entry *e = *link;
        if (e->hash == h && e->keylen == keylen && memcmp(e->key, key, keylen) == 0) {
            break;
        }
        link = &e->next;
    }
    return link;
}

static void key_index_grow(key_index *ix)
{
    size_t nslots = ix->nslots * 2;
    key_entry **slots = xcalloc(nslots, sizeof(*slots));
    for (size_t i = 0; i < ix->nslots; i++) {
        key_entry *e = ix->slots[i];
        while (e != NULL) {
            key_entry *next = e->next;
            e->next = slots[e->hash & (nslots - 1)];
            slots[e->hash & (nslots - 1)] = e;
            e = next;
        }
    }
    free(ix->slots);
    ix->slots = slots;
    ix->nslots = nslots;
}

static uint64_t key_index_get(const key_index *ix, const char *key, size_t keylen)
{
    key_entry *e = *key_index_link(ix, key, keylen, key_hash(key, keylen));
    return e != NULL ? e->rows : 0;
}

/* Add delta rows to key; an entry that reaches 0 is removed. */
static void key_index_add(key_index *ix, const char *key, size_t keylen, int64_t delta)
{
    if (delta == 0) {
        return;
    }
    uint64_t h = key_hash(key, keylen);
    key_entry **link = key_index_link(ix, key, keylen, h);
    key_entry *e = *link;
    if (e == NULL) {
        if (delta < 0) {
            return; /* only a foreign writer could cause this: nothing to track */
        }
        e = xmalloc(sizeof(*e) + keylen);
        e->next = NULL;
        e->hash = h;
        e->rows = (uint64_t)delta;
        e->keylen = keylen;
        memcpy(e->key, key, keylen);
        *link = e;
        if (++ix->n > ix->nslots) {
            key_index_grow(ix);
        }
        return;
    }
    if (delta < 0 && (uint64_t)-delta >= e->rows) {
        *link = e->next;
        free(e);
        ix->n--;
        return;
    }
    e->rows += (uint64_t)delta;
}

/* ---------------------------------------------------------------------------
 * Operations: allocation and results
 * ------------------------------------------------------------------------ */

static fb_op *op_new(op_type type, fallback_cb cb, void *arg)
{
    fb_op *op = xcalloc(1, sizeof(*op));
    op->type = type;
    op->cb = cb;
    op->arg = arg;
    return op;
}

static void op_drop_results(fb_op *op)
{
    for (size_t i = 0; i < op->nitems; i++) {
        free((void *)op->items[i].key);
    }
    free(op->items);
    op->items = NULL;
    op->nitems = op->itemcap = 0;
    for (size_t i = 0; i < op->ndeltas; i++) {
        free(op->deltas[i].key);
    }
    free(op->deltas);
    op->deltas = NULL;
    op->ndeltas = 0;
    op->count = op->drows = op->dbytes = 0;
}

static void op_free(fb_op *op)
{
    op_drop_results(op);
    free(op->key);
    free(op->lens);
    free(op->scores);
    free(op);
}

/* Run op's callback with status (no effect when < 0) and free it. */
static void op_complete(fallback *fb, fb_op *op, int status, const char *errstr)
{
    fallback_result res = {0, NULL, 0};
    if (op->err != 0) {
        status = op->err;
        errstr = op->errstr;
    }
    if (status == 0) {
        fallback_stats *st = &fb->stats;
        uv_mutex_lock(&fb->ixlock);
        key_index_add(&fb->keys, op->key, op->keylen, op->drows);
        st->rows += (uint64_t)op->drows; /* drows < 0 wraps to a subtraction */
        st->bytes += (uint64_t)op->dbytes;
        for (size_t i = 0; i < op->ndeltas; i++) {
            const key_delta *d = &op->deltas[i];
            key_index_add(&fb->keys, d->key, d->keylen, -d->rows);
            st->rows -= (uint64_t)d->rows;
            st->bytes -= (uint64_t)d->bytes;
        }
        res.count = op->count;
        res.items = op->items;
        res.nitems = op->nitems;
        if (op->type == OP_PUSH && op->how != FB_ZADD) {
            res.count = (int64_t)key_index_get(&fb->keys, op->key, op->keylen);
        }
        uv_mutex_unlock(&fb->ixlock);
        if (op->type == OP_PUSH) {
            st->written += (uint64_t)op->drows;
        } else if (op->type == OP_POP) {
            st->popped += op->nitems;
        } else if (op->type == OP_DELETE) {
            st->deleted += (uint64_t)op->count;
        }
    }
    if (op->cb != NULL) {
        op->cb(op->arg, status, status != 0 ? errstr : NULL, &res);
    }
    op_free(op);
}

/* ---------------------------------------------------------------------------
 * Worker side: one group in one transaction
 * ------------------------------------------------------------------------ */

/* Note the group's first error (the message is read before the reset). */
static int sql_fail(fallback *fb, int rc)
{
    if (fb->werr[0] == '\0') {
        sqlite_errstr(fb->db, rc, fb->werr, sizeof(fb->werr));
    }
    return rc;
}

/* Step a statement that returns no rows; SQLITE_OK or the error. */
static int sql_run(fallback *fb, sqlite3_stmt *s)
{
    int rc = sqlite3_step(s);
    if (rc != SQLITE_DONE && rc != SQLITE_ROW) {
        sql_fail(fb, rc);
    }
    sqlite3_reset(s);
    sqlite3_clear_bindings(s);
    return rc == SQLITE_DONE || rc == SQLITE_ROW ? SQLITE_OK : rc;
}

/* Step once: SQLITE_ROW with column 0 in *out, SQLITE_DONE, or the error. */
static int sql_int(fallback *fb, sqlite3_stmt *s, int64_t *out)
{
    int rc = sqlite3_step(s);
    if (rc == SQLITE_ROW) {
        *out = sqlite3_column_int64(s, 0);
    } else if (rc != SQLITE_DONE) {
        sql_fail(fb, rc);
    }
    sqlite3_reset(s);
    sqlite3_clear_bindings(s);
    return rc;
}

/* The rows a SELECT of ROW_COLS yields, appended to op->items. */
static int sql_collect(fallback *fb, sqlite3_stmt *s, fb_op *op)
{
    int rc;
    while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
        if (op->nitems == op->itemcap) {
            op->itemcap = op->itemcap ? op->itemcap * 2 : 8;
            op->items = xrealloc(op->items, op->itemcap * sizeof(*op->items));
        }
        fallback_item *it = &op->items[op->nitems++];
        size_t klen, mlen;
        const char *k = column_bytes(s, 2, &klen);
        const char *m = column_bytes(s, 3, &mlen);
        char *chunk = xmalloc(klen + mlen + 1);
        memcpy(chunk, k, klen);
        memcpy(chunk + klen, m, mlen);
        chunk[klen + mlen] = '\0';
        it->id = sqlite3_column_int64(s, 0);
        it->kind = sqlite3_column_int(s, 1);
        it->key = chunk;
        it->keylen = klen;
        it->member = chunk + klen;
        it->memberlen = mlen;
        it->score = sqlite3_column_double(s, 4);
        it->ts_ms = sqlite3_column_int64(s, 5);
    }
    if (rc != SQLITE_DONE) {
        sql_fail(fb, rc);
    }
    sqlite3_reset(s);
    sqlite3_clear_bindings(s);
    return rc == SQLITE_DONE ? SQLITE_OK : rc;
}

static int sql_insert(fallback *fb, const fb_op *op, const char *m, size_t mlen, double score,
                      int64_t pos, int has_pos)
{
    sqlite3_stmt *s = fb->stmt[ST_INSERT];
    bind_bytes(s, 1, op->key, op->keylen);
    sqlite3_bind_int(s, 2, op->how);
    bind_bytes(s, 3, m, mlen);
    if (op->how == FB_ZADD) {
        sqlite3_bind_double(s, 4, score);
    }
    if (has_pos) {
        sqlite3_bind_int64(s, 5, pos);
    }
    sqlite3_bind_int64(s, 6, op->ts_ms);
    return sql_run(fb, s);
}

/* ZADD: update the member's row if the key has it, else insert one. */
static int sql_zadd(fallback *fb, fb_op *op, const char *m, size_t mlen, double score)
{
    sqlite3_stmt *s = fb->stmt[ST_ZFIND];
    int64_t id = 0;
    bind_bytes(s, 1, op->key, op->keylen);
    bind_bytes(s, 2, m, mlen);
    int rc = sql_int(fb, s, &id);
    if (rc == SQLITE_ROW) {
        s = fb->stmt[ST_ZUPDATE];
        sqlite3_bind_int64(s, 1, id);
        sqlite3_bind_double(s, 2, score);
        return sql_run(fb, s);
    }
    if (rc != SQLITE_DONE) {
        return rc;
    }
    rc = sql_insert(fb, op, m, mlen, score, 0, 0);
    if (rc == SQLITE_OK) {
        op->count++;
        op->drows++;
        op->dbytes += (int64_t)(op->keylen + mlen);
    }
    return rc;
}

static int sql_push(fallback *fb, fb_op *op)
{
    const char *m = op->key + op->keylen;
    int64_t pos = 0;
    int rc = SQLITE_DONE;
    if (op->how != FB_ZADD) {
        sqlite3_stmt *s = fb->stmt[op->how == FB_LPUSH ? ST_HEADPOS : ST_TAILPOS];
        bind_bytes(s, 1, op->key, op->keylen);
        if ((rc = sql_int(fb, s, &pos)) != SQLITE_ROW && rc != SQLITE_DONE) {
            return rc;
        }
    }
    int has_end = rc == SQLITE_ROW; /* pos is the end the pushes go past */
    for (size_t i = 0; i < op->n; i++) {
        if (op->how == FB_ZADD) {
            rc = sql_zadd(fb, op, m, op->lens[i], op->scores[i]);
        } else {
            pos = !has_end ? 0 : op->how == FB_LPUSH ? pos - 1 : pos + 1;
            has_end = 1;
            rc = sql_insert(fb, op, m, op->lens[i], 0, pos, 1);
            op->drows += rc == SQLITE_OK;
            op->dbytes += rc == SQLITE_OK ? (int64_t)(op->keylen + op->lens[i]) : 0;
        }
        if (rc != SQLITE_OK) {
            return rc;
        }
        m += op->lens[i];
    }
    return SQLITE_OK;
}

static int sql_pop(fallback *fb, fb_op *op)
{
    sqlite3_stmt *s = fb->stmt[ST_POP_HEAD + op->how];
    bind_bytes(s, 1, op->key, op->keylen);
    sqlite3_bind_int64(s, 2, clamp_limit(op->n));
    int rc = sql_collect(fb, s, op);
    for (size_t i = 0; rc == SQLITE_OK && i < op->nitems; i++) {
        sqlite3_bind_int64(fb->stmt[ST_DEL_ID], 1, op->items[i].id);
        rc = sql_run(fb, fb->stmt[ST_DEL_ID]);
        op->drows--;
        op->dbytes -= (int64_t)(op->items[i].keylen + op->items[i].memberlen);
    }
    op->count = (int64_t)op->nitems;
    return rc;
}

/* LMOVE: one row off src's end, onto dst's end, in the same transaction.
 * op->key holds src then dst (op->n is dst's length). */
static int sql_move(fallback *fb, fb_op *op)
{
    size_t dstlen = op->n;
    op->n = 1;
    int rc = sql_pop(fb, op);
    op->n = dstlen;
    if (rc != SQLITE_OK || op->nitems == 0) {
        return rc;
    }
    const fallback_item *it = &op->items[0];
    fb_op dst;
    memset(&dst, 0, sizeof(dst));
    dst.key = op->key + op->keylen;
    dst.keylen = dstlen;
    dst.how = op->to;
    dst.ts_ms = op->ts_ms;
    int64_t pos = 0;
    sqlite3_stmt *s = fb->stmt[op->to == FB_LPUSH ? ST_HEADPOS : ST_TAILPOS];
    bind_bytes(s, 1, dst.key, dst.keylen);
    rc = sql_int(fb, s, &pos);
    if (rc != SQLITE_ROW && rc != SQLITE_DONE) {
        return rc;
    }
    pos = rc == SQLITE_DONE ? 0 : op->to == FB_LPUSH ? pos - 1 : pos + 1;
    rc = sql_insert(fb, &dst, it->member, it->memberlen, 0, pos, 1);
    if (rc == SQLITE_OK) {
        /* Deltas are subtracted when the group completes: -1 row = one more. */
        op->deltas = xcalloc(1, sizeof(*op->deltas));
        op->ndeltas = 1;
        op->deltas[0].key = xmalloc(dstlen + 1);
        memcpy(op->deltas[0].key, dst.key, dstlen);
        op->deltas[0].keylen = dstlen;
        op->deltas[0].rows = -1;
        op->deltas[0].bytes = -(int64_t)(dstlen + it->memberlen);
    }
    return rc;
}

static int sql_delete(fallback *fb, fb_op *op)
{
    int by_key = op->key != NULL; /* fallback_delete_key_upto */
    sqlite3_stmt *s = fb->stmt[by_key ? ST_DEL_KEY_COUNT : ST_DEL_COUNT];
    sqlite3_stmt *del = fb->stmt[by_key ? ST_DEL_KEY_UPTO : ST_DEL_UPTO];
    size_t cap = 0;
    int rc;
    sqlite3_bind_int64(s, 1, op->id);
    if (by_key) {
        bind_bytes(s, 2, op->key, op->keylen);
    }
    while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
        if (op->ndeltas == cap) {
            cap = cap ? cap * 2 : 8;
            op->deltas = xrealloc(op->deltas, cap * sizeof(*op->deltas));
        }
        key_delta *d = &op->deltas[op->ndeltas++];
        const char *k = column_bytes(s, 0, &d->keylen);
        d->key = xmalloc(d->keylen + 1);
        memcpy(d->key, k, d->keylen);
        d->rows = sqlite3_column_int64(s, 1);
        d->bytes = sqlite3_column_int64(s, 2);
    }
    if (rc != SQLITE_DONE) {
        sql_fail(fb, rc);
    }
    sqlite3_reset(s);
    sqlite3_clear_bindings(s);
    if (rc != SQLITE_DONE) {
        return rc;
    }
    sqlite3_bind_int64(del, 1, op->id);
    if (by_key) {
        bind_bytes(del, 2, op->key, op->keylen);
    }
    rc = sql_run(fb, del);
    op->count = rc == SQLITE_OK ? sqlite3_changes64(fb->db) : 0;
    return rc;
}

static int sql_op(fallback *fb, fb_op *op)
{
    switch (op->type) {
    case OP_PUSH:
        return sql_push(fb, op);
    case OP_POP:
        return sql_pop(fb, op);
    case OP_READ:
        sqlite3_bind_int64(fb->stmt[ST_READ], 1, op->id);
        sqlite3_bind_int64(fb->stmt[ST_READ], 2, clamp_limit(op->n));
        return sql_collect(fb, fb->stmt[ST_READ], op);
    case OP_DELETE:
        return sql_delete(fb, op);
    case OP_MOVE:
        return sql_move(fb, op);
    }
    return SQLITE_MISUSE;
}

/* ts of the lowest id, 0 if the store is empty. */
static int sql_oldest(fallback *fb, int64_t *out)
{
    *out = 0;
    int rc = sql_int(fb, fb->stmt[ST_OLDEST], out);
    return rc == SQLITE_ROW || rc == SQLITE_DONE ? SQLITE_OK : rc;
}

static void work_cb(uv_work_t *req)
{
    fb_group *g = (fb_group *)(void *)((char *)req - offsetof(fb_group, req));
    fallback *fb = g->fb;
    uint64_t t0 = uv_hrtime();
    fb->werr[0] = '\0';
    int rc = sql_run(fb, fb->stmt[ST_BEGIN]);
    for (fb_op *op = g->ops; rc == SQLITE_OK && op != NULL; op = op->next) {
        if (op->err == 0) {
            rc = sql_op(fb, op);
        }
    }
    if (rc == SQLITE_OK) {
        rc = sql_oldest(fb, &g->oldest_ms);
    }
    if (rc == SQLITE_OK) {
        rc = sql_run(fb, fb->stmt[ST_COMMIT]);
    }
    if (rc != SQLITE_OK) {
        g->status = sqlite_to_uv(rc);
        snprintf(g->errstr, sizeof(g->errstr), "%s", fb->werr[0] ? fb->werr : sqlite3_errstr(rc));
        if (!sqlite3_get_autocommit(fb->db)) {
            sql_run(fb, fb->stmt[ST_ROLLBACK]);
        }
        for (fb_op *op = g->ops; op != NULL; op = op->next) {
            op_drop_results(op);
        }
    }
    g->commit_us = (uv_hrtime() - t0) / 1000;
    uv_mutex_lock(&fb->mu);
    g->done = 1;
    uv_cond_signal(&fb->cond);
    uv_mutex_unlock(&fb->mu);
}

/* ---------------------------------------------------------------------------
 * Loop side: queue, submit, deliver
 * ------------------------------------------------------------------------ */

static void idle_cb(uv_idle_t *h)
{
    (void)h; /* only there so the poll does not block while a group waits */
}

static void submit(fallback *fb)
{
    if (fb->inflight != NULL || fb->qhead == NULL || fb->closing) {
        return;
    }
    fb_group *g = xcalloc(1, sizeof(*g));
    g->fb = fb;
    g->ops = fb->qhead;
    fb->qhead = fb->qtail = NULL;
    fb->inflight = g;
    fb->refs++;
    int rc = uv_queue_work(fb->loop, &g->req, work_cb, after_work_cb);
    ferry_assert(rc == 0);
}

static void check_cb(uv_check_t *h)
{
    fallback *fb = h->data;
    fb->scheduled = 0;
    uv_check_stop(&fb->check);
    uv_idle_stop(&fb->idle);
    submit(fb);
}

/* Submit what is queued at the end of this loop turn, unless a group is in
 * flight (its completion schedules the next one). */
static void schedule(fallback *fb)
{
    if (fb->scheduled || fb->inflight != NULL || fb->qhead == NULL || fb->closing) {
        return;
    }
    fb->scheduled = 1;
    uv_check_start(&fb->check, check_cb);
    uv_idle_start(&fb->idle, idle_cb);
}

static void enqueue(fallback *fb, fb_op *op)
{
    if (fb->closing) {
        op_complete(fb, op, UV_ECANCELED, "fallback store closing");
        return;
    }
    if (fb->qtail != NULL) {
        fb->qtail->next = op;
    } else {
        fb->qhead = op;
    }
    fb->qtail = op;
    schedule(fb);
}

/* Apply a finished group's stats, then run its callbacks in order. Safe to
 * re-enter (a callback that closes the store finishes the rest). */
static void group_finish(fallback *fb, fb_group *g)
{
    if (!g->finished) {
        fallback_stats *st = &fb->stats;
        g->finished = 1;
        st->commit_us_sum += g->commit_us;
        if (g->commit_us > st->commit_us_max) {
            st->commit_us_max = g->commit_us;
        }
        if (g->status == 0) {
            st->commits++;
            st->oldest_ms = g->oldest_ms;
            st->last_error[0] = '\0';
        } else {
            st->commit_errors++;
            snprintf(st->last_error, sizeof(st->last_error), "%s", g->errstr);
        }
    }
    fb_op *op;
    while ((op = g->ops) != NULL) {
        g->ops = op->next;
        op_complete(fb, op, g->status, g->errstr);
    }
}

static void after_work_cb(uv_work_t *req, int status)
{
    fb_group *g = (fb_group *)(void *)((char *)req - offsetof(fb_group, req));
    fallback *fb = g->fb;
    ferry_assert(status == 0);
    group_finish(fb, g);
    fb->inflight = NULL;
    free(g);
    schedule(fb);
    fb_unref(fb);
}

/* ---------------------------------------------------------------------------
 * Open and close
 * ------------------------------------------------------------------------ */

/* The first column of a query's first row as text into out ("" if none). */
static int query_text(sqlite3 *db, const char *sql, char *out, size_t len)
{
    sqlite3_stmt *s;
    int rc = sqlite3_prepare_v2(db, sql, -1, &s, NULL);
    out[0] = '\0';
    if (rc == SQLITE_OK && (rc = sqlite3_step(s)) == SQLITE_ROW) {
        const unsigned char *t = sqlite3_column_text(s, 0);
        snprintf(out, len, "%s", t != NULL ? (const char *)t : "");
    }
    sqlite3_finalize(s);
    return rc == SQLITE_ROW || rc == SQLITE_DONE ? SQLITE_OK : rc;
}

static int query_int(sqlite3 *db, const char *sql, int64_t *out)
{
    char text[32];
    int rc = query_text(db, sql, text, sizeof(text));
    *out = strtoll(text, NULL, 10);
    return rc;
}

static int open_fail(sqlite3 *db, int rc, const char *path, char *err, size_t errlen)
{
    char why[FB_ERRLEN];
    sqlite_errstr(db, rc, why, sizeof(why));
    snprintf(err, errlen, "fallback store %s: %s", path, why);
    return sqlite_to_uv(rc);
}

/* Is this ferry's store? Creates the schema in an empty file when create. */
static int check_store(sqlite3 *db, const char *path, int create, char *err, size_t errlen)
{
    int64_t tables, app, version;
    int rc = query_int(db, "SELECT count(*) FROM sqlite_schema", &tables);
    if (rc == SQLITE_OK) {
        rc = query_int(db, "PRAGMA application_id", &app);
    }
    if (rc == SQLITE_OK) {
        rc = query_int(db, "PRAGMA user_version", &version);
    }
    if (rc != SQLITE_OK) {
        return open_fail(db, rc, path, err, errlen);
    }
    if (tables == 0 && app == 0 && create) {
        char sql[sizeof(schema_sql) + 128];
        snprintf(sql, sizeof(sql),
                 "BEGIN IMMEDIATE; %s PRAGMA application_id = %d;"
                 " PRAGMA user_version = %d; COMMIT;",
                 schema_sql, FB_APP_ID, FB_SCHEMA_VERSION);
        rc = sqlite3_exec(db, sql, NULL, NULL, NULL);
        return rc == SQLITE_OK ? 0 : open_fail(db, rc, path, err, errlen);
    }
    if (app != FB_APP_ID) {
        snprintf(err, errlen, "fallback store %s: not a ferry fallback store", path);
        return UV_EINVAL;
    }
    if (version != FB_SCHEMA_VERSION) {
        snprintf(err, errlen, "fallback store %s: unknown schema version %lld", path,
                 (long long)version);
        return UV_EINVAL;
    }
    return 0;
}

/* The key index, rows, bytes and oldest row from the file. */
static int load_index(fallback *fb, char *err, size_t errlen)
{
    sqlite3_stmt *s;
    int rc = sqlite3_prepare_v2(fb->db,
                                "SELECT key, count(*), sum(length(key) + length(member))"
                                " FROM rows GROUP BY key",
                                -1, &s, NULL);
    while ((rc == SQLITE_OK || rc == SQLITE_ROW) && (rc = sqlite3_step(s)) == SQLITE_ROW) {
        size_t klen;
        const char *k = column_bytes(s, 0, &klen);
        int64_t rows = sqlite3_column_int64(s, 1);
        key_index_add(&fb->keys, k, klen, rows);
        fb->stats.rows += (uint64_t)rows;
        fb->stats.bytes += (uint64_t)sqlite3_column_int64(s, 2);
    }
    if (rc == SQLITE_DONE) {
        rc = sql_oldest(fb, &fb->stats.oldest_ms);
    }
    sqlite3_finalize(s);
    if (rc != SQLITE_OK && rc != SQLITE_DONE) {
        return open_fail(fb->db, rc, fb->path, err, errlen);
    }
    return 0;
}

/* Everything but the lock and the handles; 0 or a negative error. */
static int open_db(fallback *fb, uint64_t max_bytes, char *err, size_t errlen)
{
    char text[FB_ERRLEN], sql[160];
    int64_t page = 0;
    int rc = sqlite3_open_v2(fb->path, &fb->db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, NULL);
    if (rc == SQLITE_OK) {
        sqlite3_extended_result_codes(fb->db, 1);
        sqlite3_busy_timeout(fb->db, FB_BUSY_TIMEOUT_MS);
        rc = query_text(fb->db, "PRAGMA journal_mode = WAL", text, sizeof(text));
    }
    if (rc != SQLITE_OK) {
        return open_fail(fb->db, rc, fb->path, err, errlen);
    }
    if (strcmp(text, "wal") != 0) {
        snprintf(err, errlen, "fallback store %s: WAL mode refused (journal_mode %s)", fb->path,
                 text);
        return UV_EINVAL;
    }
    snprintf(sql, sizeof(sql), "PRAGMA synchronous = FULL; PRAGMA journal_size_limit = %d;",
             FB_WAL_LIMIT);
    if ((rc = sqlite3_exec(fb->db, sql, NULL, NULL, NULL)) != SQLITE_OK) {
        return open_fail(fb->db, rc, fb->path, err, errlen);
    }
    int r = check_store(fb->db, fb->path, 1, err, errlen);
    if (r != 0) {
        return r;
    }
    if ((rc = query_text(fb->db, "PRAGMA quick_check(1)", text, sizeof(text))) != SQLITE_OK) {
        return open_fail(fb->db, rc, fb->path, err, errlen);
    }
    if (strcmp(text, "ok") != 0) {
        for (char *nl = strchr(text, '\n'); nl != NULL; nl = strchr(nl, '\n')) {
            *nl = ' ';
        }
        snprintf(err, errlen, "fallback store %s: corrupt file (quick_check: %s)", fb->path, text);
        return UV_EIO;
    }
    if (max_bytes > 0 && (rc = query_int(fb->db, "PRAGMA page_size", &page)) == SQLITE_OK) {
        uint64_t pages = max_bytes / (uint64_t)page;
        snprintf(sql, sizeof(sql), "PRAGMA max_page_count = %llu",
                 (unsigned long long)(pages > 0 ? pages : 1));
        rc = query_text(fb->db, sql, text, sizeof(text));
    }
    for (int i = 0; rc == SQLITE_OK && i < ST_COUNT; i++) {
        rc = sqlite3_prepare_v3(fb->db, stmt_sql[i], -1, SQLITE_PREPARE_PERSISTENT, &fb->stmt[i],
                                NULL);
    }
    if (rc != SQLITE_OK) {
        return open_fail(fb->db, rc, fb->path, err, errlen);
    }
    return load_index(fb, err, errlen);
}

static void close_db(fallback *fb)
{
    for (int i = 0; i < ST_COUNT; i++) {
        sqlite3_finalize(fb->stmt[i]);
        fb->stmt[i] = NULL;
    }
    sqlite3_close_v2(fb->db); /* NULL ok */
    fb->db = NULL;
    if (fb->lockfd >= 0) {
        close(fb->lockfd); /* releases the flock */
        fb->lockfd = -1;
    }
}

/* Take "<path>.lock"; 0, or a negative error with err filled. */
static int take_lock(fallback *fb, char *err, size_t errlen)
{
    size_t n = strlen(fb->path);
    char *lockpath = xmalloc(n + sizeof(".lock"));
    memcpy(lockpath, fb->path, n);
    memcpy(lockpath + n, ".lock", sizeof(".lock"));
    int r = 0;
    fb->lockfd = open(lockpath, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fb->lockfd < 0) {
        r = -errno;
        snprintf(err, errlen, "fallback store %s: cannot open lock file %s: %s", fb->path, lockpath,
                 strerror(errno));
    } else if (flock(fb->lockfd, LOCK_EX | LOCK_NB) != 0) {
        r = -errno;
        if (errno == EWOULDBLOCK) {
            r = UV_EBUSY;
            snprintf(err, errlen, "fallback store %s is locked: another ferry holds it (%s)",
                     fb->path, lockpath);
        } else {
            snprintf(err, errlen, "fallback store %s: cannot lock %s: %s", fb->path, lockpath,
                     strerror(errno));
        }
        close(fb->lockfd);
        fb->lockfd = -1;
    }
    free(lockpath);
    return r;
}

static void fb_free(fallback *fb)
{
    key_index_free(&fb->keys);
    uv_mutex_destroy(&fb->ixlock);
    uv_mutex_destroy(&fb->mu);
    uv_cond_destroy(&fb->cond);
    free(fb->path);
    free(fb);
}

static void fb_unref(fallback *fb)
{
    ferry_assert(fb->refs > 0);
    if (--fb->refs == 0 && fb->closing) {
        fb_free(fb);
    }
}

static void handle_close_cb(uv_handle_t *h)
{
    fb_unref(h->data);
}

int fallback_open(uv_loop_t *loop, const char *path, uint64_t max_bytes, fallback **out, char *err,
                  size_t errlen)
{
    fallback *fb = xcalloc(1, sizeof(*fb));
    fb->loop = loop;
    fb->path = xstrdup(path);
    fb->lockfd = -1;
    key_index_init(&fb->keys);
    *out = NULL;
    int r = take_lock(fb, err, errlen);
    if (r == 0) {
        r = open_db(fb, max_bytes, err, errlen);
    }
    if (r == 0 && (r = uv_mutex_init(&fb->mu)) == 0 && (r = uv_cond_init(&fb->cond)) != 0) {
        uv_mutex_destroy(&fb->mu);
    }
    if (r == 0 && (r = uv_mutex_init(&fb->ixlock)) != 0) {
        uv_cond_destroy(&fb->cond);
        uv_mutex_destroy(&fb->mu);
    }
    if (r != 0) {
        close_db(fb);
        key_index_free(&fb->keys);
        free(fb->path);
        free(fb);
        return r;
    }
    uv_check_init(loop, &fb->check);
    uv_idle_init(loop, &fb->idle);
    fb->check.data = fb;
    fb->idle.data = fb;
    *out = fb;
    return 0;
}

void fallback_close(fallback *fb)
{
    if (fb == NULL || fb->closing) {
        return;
    }
    fb->closing = 1;
    fb_group *g = fb->inflight;
    if (g != NULL) {
        uv_mutex_lock(&fb->mu);
        while (!g->done) {
            uv_cond_wait(&fb->cond, &fb->mu);
        }
        uv_mutex_unlock(&fb->mu);
        group_finish(fb, g); /* after_work_cb then only frees it */
    }
    fb_op *op;
    while ((op = fb->qhead) != NULL) {
        fb->qhead = op->next;
        op_complete(fb, op, UV_ECANCELED, "fallback store closed");
    }
    fb->qtail = NULL;
    close_db(fb);
    fb->refs += 2;
    uv_close((uv_handle_t *)&fb->check, handle_close_cb);
    uv_close((uv_handle_t *)&fb->idle, handle_close_cb);
}

/* ---------------------------------------------------------------------------
 * Operations
 * ------------------------------------------------------------------------ */

void fallback_push(fallback *fb, int kind, const char *key, size_t keylen,
                   const char *const *members, const size_t *lens, const double *scores, size_t n,
                   fallback_cb cb, void *arg)
{
    fb_op *op = op_new(OP_PUSH, cb, arg);
    size_t total = keylen;
    for (size_t i = 0; i < n; i++) {
        total += lens[i];
    }
    op->how = kind;
    op->keylen = keylen;
    op->n = n;
    op->key = xmalloc(total + 1);
    memcpy(op->key, key, keylen);
    char *p = op->key + keylen;
    for (size_t i = 0; i < n; i++) {
        memcpy(p, members[i], lens[i]);
        p += lens[i];
    }
    op->lens = xcalloc(n ? n : 1, sizeof(*op->lens));
    if (n > 0) {
        memcpy(op->lens, lens, n * sizeof(*op->lens));
    }
    op->ts_ms = wall_ms();
    if (kind != FB_LPUSH && kind != FB_RPUSH && kind != FB_ZADD) {
        op->err = UV_EINVAL;
        op->errstr = "unknown push kind";
    } else if (n == 0) {
        op->err = UV_EINVAL;
        op->errstr = "nothing to push";
    } else if (kind == FB_ZADD) {
        op->scores = xmalloc(n * sizeof(*op->scores));
        memcpy(op->scores, scores, n * sizeof(*op->scores));
        for (size_t i = 0; i < n; i++) {
            if (isnan(scores[i])) {
                op->err = UV_EINVAL;
                op->errstr = "score is not a number";
            }
        }
    }
    enqueue(fb, op);
}

void fallback_pop(fallback *fb, int end, const char *key, size_t keylen, size_t count,
                  fallback_cb cb, void *arg)
{
    fb_op *op = op_new(OP_POP, cb, arg);
    op->how = end;
    op->key = xmalloc(keylen + 1);
    memcpy(op->key, key, keylen);
    op->keylen = keylen;
    op->n = count;
    if (end < FB_HEAD || end > FB_MAX) {
        op->err = UV_EINVAL;
        op->errstr = "unknown pop end";
    }
    enqueue(fb, op);
}

void fallback_read(fallback *fb, int64_t after_id, size_t n, fallback_cb cb, void *arg)
{
    fb_op *op = op_new(OP_READ, cb, arg);
    op->id = after_id;
    op->n = n;
    enqueue(fb, op);
}

void fallback_delete_upto(fallback *fb, int64_t upto, fallback_cb cb, void *arg)
{
    fb_op *op = op_new(OP_DELETE, cb, arg);
    op->id = upto;
    enqueue(fb, op);
}

void fallback_move(fallback *fb, int end, const char *src, size_t srclen, int to, const char *dst,
                   size_t dstlen, fallback_cb cb, void *arg)
{
    fb_op *op = op_new(OP_MOVE, cb, arg);
    op->how = end;
    op->to = to;
    op->key = xmalloc(srclen + dstlen + 1);
    memcpy(op->key, src, srclen);
    memcpy(op->key + srclen, dst, dstlen);
    op->keylen = srclen;
    op->n = dstlen;
    op->ts_ms = wall_ms();
    if ((end != FB_HEAD && end != FB_TAIL) || (to != FB_LPUSH && to != FB_RPUSH)) {
        op->err = UV_EINVAL;
        op->errstr = "a move goes between list ends";
    }
    enqueue(fb, op);
}

void fallback_delete_key_upto(fallback *fb, const char *key, size_t keylen, int64_t upto,
                              fallback_cb cb, void *arg)
{
    fb_op *op = op_new(OP_DELETE, cb, arg);
    op->id = upto;
    op->key = xmalloc(keylen + 1);
    memcpy(op->key, key, keylen);
    op->keylen = keylen;
    enqueue(fb, op);
}

uint64_t fallback_key_rows(const fallback *fb, const char *key, size_t keylen)
{
    uv_mutex_t *lock = (uv_mutex_t *)&fb->ixlock; /* the index itself is not changed */
    uv_mutex_lock(lock);
    uint64_t n = key_index_get(&fb->keys, key, keylen);
    uv_mutex_unlock(lock);
    return n;
}

uint64_t fallback_rows(const fallback *fb)
{
    uv_mutex_t *lock = (uv_mutex_t *)&fb->ixlock;
    uv_mutex_lock(lock);
    uint64_t n = fb->stats.rows;
    uv_mutex_unlock(lock);
    return n;
}

void fallback_get_stats(const fallback *fb, fallback_stats *st)
{
    *st = fb->stats;
}

/* ---------------------------------------------------------------------------
 * Dump
 * ------------------------------------------------------------------------ */

/* Bytes as a double-quoted string: printable ASCII as is, the rest escaped. */
static void dump_bytes(FILE *out, const char *p, size_t n)
{
    static const char special[] = "\\\"\n\r\t", escaped[] = "\\\"nrt";
    fputc('"', out);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)p[i];
        const char *sp = c != 0 ? strchr(special, c) : NULL;
        if (sp != NULL) {
            fputc('\\', out);
            fputc(escaped[sp - special], out);
        } else if (c >= 0x20 && c < 0x7f) {
            fputc(c, out);
        } else {
            fprintf(out, "\\x%02x", c);
        }
    }
    fputc('"', out);
}

int fallback_dump(const char *path, FILE *out, char *err, size_t errlen)
{
    static const char *const cmd[] = {"?", "LPUSH", "RPUSH", "ZADD"};
    sqlite3 *db = NULL;
    sqlite3_stmt *s = NULL;
    int rc = sqlite3_open_v2(path, &db, SQLITE_OPEN_READONLY, NULL);
    int r = 0;
    if (rc == SQLITE_OK) {
        sqlite3_busy_timeout(db, FB_BUSY_TIMEOUT_MS);
        r = check_store(db, path, 0, err, errlen);
        if (r == 0) {
            rc = sqlite3_prepare_v2(db, "SELECT " ROW_COLS " FROM rows ORDER BY id", -1, &s, NULL);
        }
    }
    while (r == 0 && (rc == SQLITE_OK || rc == SQLITE_ROW) &&
           (rc = sqlite3_step(s)) == SQLITE_ROW) {
        int64_t ts = sqlite3_column_int64(s, 5);
        time_t sec = (time_t)(ts / 1000);
        struct tm tm;
        char when[32] = "?";
        if (gmtime_r(&sec, &tm) != NULL) {
            strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%S", &tm);
        }
        int kind = sqlite3_column_int(s, 1);
        size_t klen, mlen;
        const char *k = column_bytes(s, 2, &klen);
        const char *m = column_bytes(s, 3, &mlen);
        fprintf(out, "%lld %s.%03dZ %s ", (long long)sqlite3_column_int64(s, 0), when,
                (int)(ts % 1000), cmd[kind >= 1 && kind <= 3 ? kind : 0]);
        dump_bytes(out, k, klen);
        if (kind == FB_ZADD) {
            fprintf(out, " %.17g", sqlite3_column_double(s, 4));
        }
        fputc(' ', out);
        dump_bytes(out, m, mlen);
        fputc('\n', out);
    }
    if (r == 0 && rc != SQLITE_DONE) {
        r = open_fail(db, rc, path, err, errlen);
    }
    sqlite3_finalize(s);
    sqlite3_close_v2(db);
    if (r == 0 && fflush(out) != 0) {
        r = -errno;
        snprintf(err, errlen, "fallback dump: write failed: %s", strerror(errno));
    }
    return r;
}
