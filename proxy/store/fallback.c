/* fallback.c - the fallback store (N14): queue rows in a SQLite file on
 * ferry's disk, written in group commits by a worker thread, served to pops
 * with Redis' semantics and read back in id order for the replay.
 *
 * Schema (`sqlite3 FILE .schema`; application_id 0x46525259 "FRRY",
 * user_version 3; an older file gains the columns it lacks when opened):
 *
 *   CREATE TABLE rows (
 *       id     INTEGER PRIMARY KEY AUTOINCREMENT, -- write order; never reused
 *       key    BLOB NOT NULL,                     -- Redis key bytes
 *       kind   INTEGER NOT NULL,                  -- 1 LPUSH, 2 RPUSH, 3 ZADD
 *       member BLOB NOT NULL,                     -- list element / zset member
 *       score  REAL,                              -- ZADD rows; NULL otherwise
 *       pos    INTEGER,                           -- list rows; NULL otherwise
 *       ts     INTEGER NOT NULL,                  -- unix ms when written
 *       taken  INTEGER NOT NULL DEFAULT 0,        -- 1: a pop took it, its reply is
 *                                                 -- not confirmed yet; 2: held (rcpt)
 *       rcpt   BLOB                               -- held rows: the receipt key of a
 *   );                                            -- push Redis may have applied
 *   CREATE INDEX rows_list ON rows(key, pos) WHERE pos IS NOT NULL;
 *   CREATE INDEX rows_zset ON rows(key, score, member) WHERE kind = 3;
 *   CREATE UNIQUE INDEX rows_zmember ON rows(key, member) WHERE kind = 3 AND taken = 0;
 *   CREATE INDEX rows_key ON rows(key, id);   -- the replay deletes key by key
 *
 *   sqlite3 -readonly FILE "SELECT id, kind, CAST(key AS TEXT),
 *       CAST(member AS TEXT), score, pos, ts, taken FROM rows ORDER BY id"
 *
 * A pop takes rows (taken = 1) rather than deleting them; the row is
 * deleted once the reply carrying it was written to the client
 * (fallback_confirm), or untaken if it never will be (fallback_release),
 * and every row still taken is untaken when the store is opened: a row
 * keeps its id and its place while taken, so putting it back needs no
 * write anywhere else. A taken row keeps its list position (pushes go past
 * it); a sorted-set member added again while its row is taken gets a new
 * row (the unique index is over untaken rows), and putting the old one
 * back then just deletes it. Taking changes no row's size (SQLite stores 0
 * and 1 in no bytes), so a pop needs no new page: it works in a full store.
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
 * and the row count (and the oldest row's time) are also read from other
 * threads (workers: N, every event loop decides what the store serves): they
 * change and are read under ixlock; everything else is the loop thread's. fallback_close blocks the
 * loop thread: it waits (mutex/cond) for the group in flight, delivers its
 * callbacks, and closes SQLite (whose last checkpoint syncs the file) -
 * start-up and shutdown only. Its memory is freed once the loop has run the
 * handles' close callbacks and the work request's completion.
 *
 * Lock: flock(LOCK_EX|LOCK_NB) on "<path>.lock", held while open; the file
 * is left in place (removing lock files races).
 *
 * This file is the loop thread's side (the queue, the key index, open and
 * close, the dump); fallback_group.c runs a group's statements on the
 * threadpool. Their shared types: fallback_int.h. */
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

#include "fallback_int.h"
#include "ferry.h"

#define FB_APP_ID 0x46525259    /* "FRRY" */
#define FB_SCHEMA_VERSION 3     /* user_version (1: no taken column, 2: no rcpt) */
#define FB_BUSY_TIMEOUT_MS 100  /* only a foreign writer (sqlite3 CLI) can hold it */
#define FB_WAL_LIMIT (16 << 20) /* WAL file truncated to this after checkpoints */
#define FB_KEYS_MIN_SLOTS 64    /* key index: initial slots (power of two) */

/* ---------------------------------------------------------------------------
 * Types
 * ------------------------------------------------------------------------ */

#define ROW_COLS "id, kind, key, member, score, ts, taken, rcpt"

static const char *const stmt_sql[ST_COUNT] = {
    [ST_BEGIN] = "BEGIN IMMEDIATE",
    [ST_COMMIT] = "COMMIT",
    [ST_ROLLBACK] = "ROLLBACK",
    [ST_INSERT] = "INSERT INTO rows(key, kind, member, score, pos, ts, taken, rcpt) "
                  "VALUES(?1,?2,?3,?4,?5,?6,?7,?8)",
    [ST_HEADPOS] = "SELECT pos FROM rows WHERE key = ?1 AND pos IS NOT NULL ORDER BY pos LIMIT 1",
    [ST_TAILPOS] = "SELECT pos FROM rows WHERE key = ?1 AND pos IS NOT NULL "
                   "ORDER BY pos DESC LIMIT 1",
    [ST_ZFIND] = "SELECT id FROM rows WHERE key = ?1 AND kind = 3 AND member = ?2 AND taken = 0",
    [ST_ZUPDATE] = "UPDATE rows SET score = ?2 WHERE id = ?1",
    [ST_POP_HEAD] = "SELECT " ROW_COLS " FROM rows WHERE key = ?1 AND pos IS NOT NULL "
                    "AND taken = 0 ORDER BY pos LIMIT ?2",
    [ST_POP_TAIL] = "SELECT " ROW_COLS " FROM rows WHERE key = ?1 AND pos IS NOT NULL "
                    "AND taken = 0 ORDER BY pos DESC LIMIT ?2",
    [ST_POP_MIN] = "SELECT " ROW_COLS " FROM rows WHERE key = ?1 AND kind = 3 AND taken = 0 "
                   "ORDER BY score, member LIMIT ?2",
    [ST_POP_MAX] = "SELECT " ROW_COLS " FROM rows WHERE key = ?1 AND kind = 3 AND taken = 0 "
                   "ORDER BY score DESC, member DESC LIMIT ?2",
    [ST_DEL_ID] = "DELETE FROM rows WHERE id = ?1",
    [ST_TAKE] = "UPDATE rows SET taken = 1 WHERE id = ?1",
    [ST_UNTAKE] = "UPDATE rows SET taken = 0 WHERE id = ?1",
    [ST_TAKEN_ROW] = "SELECT key, kind, member, length(key) + length(member) FROM rows "
                     "WHERE id = ?1 AND taken = 1",
    [ST_READ] = "SELECT " ROW_COLS " FROM rows WHERE id > ?1 ORDER BY id LIMIT ?2",
    [ST_DEL_COUNT] = "SELECT key, count(*), sum(length(key) + length(member)), "
                     "sum(taken != 0) FROM rows WHERE id <= ?1 GROUP BY key",
    [ST_DEL_UPTO] = "DELETE FROM rows WHERE id <= ?1",
    [ST_DEL_KEY_COUNT] = "SELECT key, count(*), sum(length(key) + length(member)), "
                         "sum(taken != 0) FROM rows WHERE id <= ?1 AND key = ?2 GROUP BY key",
    [ST_DEL_KEY_UPTO] = "DELETE FROM rows WHERE id <= ?1 AND key = ?2",
    [ST_OLDEST] = "SELECT ts FROM rows ORDER BY id LIMIT 1",
};

static const char schema_sql[] =
    "CREATE TABLE rows (id INTEGER PRIMARY KEY AUTOINCREMENT, key BLOB NOT NULL,"
    " kind INTEGER NOT NULL, member BLOB NOT NULL, score REAL, pos INTEGER,"
    " ts INTEGER NOT NULL, taken INTEGER NOT NULL DEFAULT 0, rcpt BLOB);"
    "CREATE INDEX rows_list ON rows(key, pos) WHERE pos IS NOT NULL;"
    "CREATE INDEX rows_zset ON rows(key, score, member) WHERE kind = 3;"
    "CREATE UNIQUE INDEX rows_zmember ON rows(key, member) WHERE kind = 3 AND taken = 0;"
    "CREATE INDEX rows_key ON rows(key, id);";

/* Version 1 to 2: the taken column; a member's uniqueness is over untaken rows. */
static const char upgrade_v1_sql[] =
    "ALTER TABLE rows ADD COLUMN taken INTEGER NOT NULL DEFAULT 0;"
    "DROP INDEX rows_zmember;"
    "CREATE UNIQUE INDEX rows_zmember ON rows(key, member) WHERE kind = 3 AND taken = 0;";

/* Version 2 to 3: held rows' receipt keys. */
static const char upgrade_v2_sql[] = "ALTER TABLE rows ADD COLUMN rcpt BLOB;";

/* At open: every row still taken goes back (a sorted-set member that is
 * there untaken, or taken again later, keeps only that newer row); held
 * rows stay held (only the replay can tell whether Redis has them). */
static const char untake_sql[] =
    "DELETE FROM rows WHERE kind = 3 AND taken = 1 AND EXISTS (SELECT 1 FROM rows t"
    " WHERE t.key = rows.key AND t.kind = 3 AND t.member = rows.member"
    " AND (t.taken = 0 OR t.id > rows.id));"
    "UPDATE rows SET taken = 0 WHERE taken = 1;";

static void key_index_init(key_index *ix);
static void key_index_free(key_index *ix);
static const key_entry *key_index_get(const key_index *ix, const char *key, size_t keylen);
static void key_index_add(key_index *ix, const char *key, size_t keylen, int64_t drows,
                          int64_t dtaken);
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
int fb_sqlite_to_uv(int rc)
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
void fb_sqlite_errstr(sqlite3 *db, int rc, char *out, size_t len)
{
    const char *msg = db != NULL ? sqlite3_errmsg(db) : sqlite3_errstr(rc);
    snprintf(out, len, "%s (SQLITE_%s)", msg, sqlite_code_name(rc));
}

/* A BLOB column's bytes (a zero-length one comes back as NULL). */
const char *fb_column_bytes(sqlite3_stmt *s, int col, size_t *n)
{
    const char *p = sqlite3_column_blob(s, col);
    *n = (size_t)sqlite3_column_bytes(s, col);
    return p != NULL ? p : "";
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

/* key's entry, NULL if it has no rows. */
static const key_entry *key_index_get(const key_index *ix, const char *key, size_t keylen)
{
    return *key_index_link(ix, key, keylen, key_hash(key, keylen));
}

/* drows rows (taken or not) and dtaken taken ones more for key; an entry
 * whose rows reach 0 is removed. */
static void key_index_add(key_index *ix, const char *key, size_t keylen, int64_t drows,
                          int64_t dtaken)
{
    if (drows == 0 && dtaken == 0) {
        return;
    }
    uint64_t h = key_hash(key, keylen);
    key_entry **link = key_index_link(ix, key, keylen, h);
    key_entry *e = *link;
    if (e == NULL) {
        if (drows <= 0) {
            return; /* only a foreign writer could cause this: nothing to track */
        }
        e = xmalloc(sizeof(*e) + keylen);
        e->next = NULL;
        e->hash = h;
        e->rows = 0;
        e->taken = 0;
        e->keylen = keylen;
        memcpy(e->key, key, keylen);
        *link = e;
        if (++ix->n > ix->nslots) {
            key_index_grow(ix);
        }
    }
    if (drows < 0 && (uint64_t)-drows >= e->rows) {
        *link = e->next;
        free(e);
        ix->n--;
        return;
    }
    e->rows += (uint64_t)drows; /* a negative delta wraps to a subtraction */
    e->taken = dtaken < 0 && (uint64_t)-dtaken >= e->taken ? 0 : e->taken + (uint64_t)dtaken;
    if (e->taken > e->rows) {
        e->taken = e->rows;
    }
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

void fb_op_drop_results(fb_op *op)
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
    op->count = op->drows = op->dbytes = op->dtaken = 0;
}

static void op_free(fb_op *op)
{
    fb_op_drop_results(op);
    free(op->ids);
    free(op->key);
    free(op->lens);
    free(op->scores);
    free(op->rcpt);
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
        if (op->key != NULL) {
            key_index_add(&fb->keys, op->key, op->keylen, op->drows, op->dtaken);
        }
        st->rows += (uint64_t)op->drows; /* drows < 0 wraps to a subtraction */
        st->taken += (uint64_t)op->dtaken;
        st->bytes += (uint64_t)op->dbytes;
        for (size_t i = 0; i < op->ndeltas; i++) {
            const key_delta *d = &op->deltas[i];
            key_index_add(&fb->keys, d->key, d->keylen, -d->rows, -d->taken);
            st->rows -= (uint64_t)d->rows;
            st->taken -= (uint64_t)d->taken;
            st->bytes -= (uint64_t)d->bytes;
        }
        res.count = op->count;
        res.items = op->items;
        res.nitems = op->nitems;
        if (op->type == OP_PUSH && op->how != FB_ZADD) {
            const key_entry *e = key_index_get(&fb->keys, op->key, op->keylen);
            res.count = e != NULL ? (int64_t)(e->rows - e->taken) : 0;
            res.count += op->rcpt != NULL ? op->drows : 0; /* its own, held */
        }
        uv_mutex_unlock(&fb->ixlock);
        if (op->type == OP_PUSH) {
            st->written += (uint64_t)op->drows;
        } else if (op->type == OP_POP) {
            st->popped += op->nitems;
        } else if (op->type == OP_DELETE) {
            st->deleted += (uint64_t)op->count;
        } else if (op->type == OP_CONFIRM) {
            st->confirmed += (uint64_t)op->count;
        } else if (op->type == OP_RELEASE) {
            st->released += (uint64_t)op->count;
        }
    }
    if (op->cb != NULL) {
        op->cb(op->arg, status, status != 0 ? errstr : NULL, &res);
    }
    op_free(op);
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
    int rc = uv_queue_work(fb->loop, &g->req, fb_work_cb, after_work_cb);
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
            uv_mutex_lock(&fb->ixlock);
            st->oldest_ms = g->oldest_ms;
            uv_mutex_unlock(&fb->ixlock);
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
    fb_sqlite_errstr(db, rc, why, sizeof(why));
    snprintf(err, errlen, "fallback store %s: %s", path, why);
    return fb_sqlite_to_uv(rc);
}

/* Is this ferry's store? Creates the schema in an empty file, and brings an
 * older version up to date, when create (a writable open). */
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
    if ((version == 1 || version == 2) && create) {
        char sql[sizeof(upgrade_v1_sql) + sizeof(upgrade_v2_sql) + 128];
        snprintf(sql, sizeof(sql), "BEGIN IMMEDIATE; %s%s PRAGMA user_version = %d; COMMIT;",
                 version == 1 ? upgrade_v1_sql : "", upgrade_v2_sql, FB_SCHEMA_VERSION);
        rc = sqlite3_exec(db, sql, NULL, NULL, NULL);
        if (rc != SQLITE_OK) {
            int r = open_fail(db, rc, path, err, errlen);
            if (!sqlite3_get_autocommit(db)) {
                sqlite3_exec(db, "ROLLBACK", NULL, NULL, NULL);
            }
            return r;
        }
        version = FB_SCHEMA_VERSION;
    }
    if (version != FB_SCHEMA_VERSION && (create || (version != 1 && version != 2))) {
        snprintf(err, errlen, "fallback store %s: unknown schema version %lld", path,
                 (long long)version);
        return UV_EINVAL;
    }
    return 0;
}

/* Rows a pop took before the store was last closed (ferry killed, or
 * stopped before it knew whether their replies went out) back in the queue,
 * in place; counted in stats.released. */
static int untake_all(fallback *fb, char *err, size_t errlen)
{
    char sql[sizeof(untake_sql) + 64];
    snprintf(sql, sizeof(sql), "BEGIN IMMEDIATE; %s COMMIT;", untake_sql);
    int64_t before = 0, after = 0;
    int rc = query_int(fb->db, "SELECT count(*) FROM rows WHERE taken = 1", &before);
    if (rc == SQLITE_OK && before > 0) {
        rc = sqlite3_exec(fb->db, sql, NULL, NULL, NULL);
        if (rc == SQLITE_OK) {
            rc = query_int(fb->db, "SELECT count(*) FROM rows WHERE taken = 1", &after);
        }
    }
    if (rc != SQLITE_OK) {
        int r = open_fail(fb->db, rc, fb->path, err, errlen);
        if (!sqlite3_get_autocommit(fb->db)) {
            sqlite3_exec(fb->db, "ROLLBACK", NULL, NULL, NULL);
        }
        return r;
    }
    fb->stats.released = (uint64_t)(before - after);
    return 0;
}

/* The key index, rows, bytes and oldest row from the file. */
static int load_index(fallback *fb, char *err, size_t errlen)
{
    sqlite3_stmt *s;
    int rc = sqlite3_prepare_v2(fb->db,
                                "SELECT key, count(*), sum(length(key) + length(member)),"
                                " sum(taken != 0) FROM rows GROUP BY key",
                                -1, &s, NULL);
    while ((rc == SQLITE_OK || rc == SQLITE_ROW) && (rc = sqlite3_step(s)) == SQLITE_ROW) {
        size_t klen;
        const char *k = fb_column_bytes(s, 0, &klen);
        int64_t rows = sqlite3_column_int64(s, 1);
        int64_t held = sqlite3_column_int64(s, 3); /* none is taken after untake_all: held */
        key_index_add(&fb->keys, k, klen, rows, held);
        fb->stats.rows += (uint64_t)rows;
        fb->stats.taken += (uint64_t)held;
        fb->stats.bytes += (uint64_t)sqlite3_column_int64(s, 2);
    }
    if (rc == SQLITE_DONE) {
        rc = fb_sql_oldest(fb, &fb->stats.oldest_ms);
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
    if ((r = untake_all(fb, err, errlen)) != 0) {
        return r;
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
    /* What became of replies already known (confirms, releases) is
     * recorded in one last transaction, here; anything else is cancelled. */
    fb_group last;
    memset(&last, 0, sizeof(last));
    last.fb = fb;
    fb_op **tail = &last.ops, *op;
    while ((op = fb->qhead) != NULL) {
        fb->qhead = op->next;
        op->next = NULL;
        if ((op->type == OP_CONFIRM || op->type == OP_RELEASE) && fb->db != NULL) {
            *tail = op;
            tail = &op->next;
        } else {
            op_complete(fb, op, UV_ECANCELED, "fallback store closed");
        }
    }
    fb->qtail = NULL;
    if (last.ops != NULL) {
        fb_work_cb(&last.req); /* no group is in flight: the connection is this thread's */
        group_finish(fb, &last);
    }
    close_db(fb);
    fb->refs += 2;
    uv_close((uv_handle_t *)&fb->check, handle_close_cb);
    uv_close((uv_handle_t *)&fb->idle, handle_close_cb);
}

/* ---------------------------------------------------------------------------
 * Operations
 * ------------------------------------------------------------------------ */

static fb_op *push_op(int kind, const char *key, size_t keylen, const char *const *members,
                      const size_t *lens, const double *scores, size_t n, fallback_cb cb, void *arg)
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
    return op;
}

void fallback_push(fallback *fb, int kind, const char *key, size_t keylen,
                   const char *const *members, const size_t *lens, const double *scores, size_t n,
                   fallback_cb cb, void *arg)
{
    enqueue(fb, push_op(kind, key, keylen, members, lens, scores, n, cb, arg));
}

void fallback_push_held(fallback *fb, int kind, const char *key, size_t keylen,
                        const char *const *members, const size_t *lens, size_t n, const char *rcpt,
                        size_t rcptlen, fallback_cb cb, void *arg)
{
    /* (a sorted set's push has no receipt: refused as an unknown kind) */
    fb_op *op = push_op(kind == FB_ZADD ? 0 : kind, key, keylen, members, lens, NULL, n, cb, arg);
    if (rcpt != NULL) {
        op->rcpt = xmalloc(rcptlen + 1);
        memcpy(op->rcpt, rcpt, rcptlen);
        op->rcpt[rcptlen] = '\0';
        op->rcptlen = rcptlen;
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

/* A confirm or a release of n taken rows. */
static void enqueue_ids(fallback *fb, op_type type, const int64_t *ids, size_t n, fallback_cb cb,
                        void *arg)
{
    fb_op *op = op_new(type, cb, arg);
    op->ids = xcalloc(n ? n : 1, sizeof(*op->ids));
    if (n > 0) {
        memcpy(op->ids, ids, n * sizeof(*ids));
    }
    op->n = n;
    enqueue(fb, op);
}

void fallback_confirm(fallback *fb, const int64_t *ids, size_t n, fallback_cb cb, void *arg)
{
    enqueue_ids(fb, OP_CONFIRM, ids, n, cb, arg);
}

void fallback_release(fallback *fb, const int64_t *ids, size_t n, fallback_cb cb, void *arg)
{
    enqueue_ids(fb, OP_RELEASE, ids, n, cb, arg);
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

/* Taken and untaken rows of key. */
static void key_counts(const fallback *fb, const char *key, size_t keylen, uint64_t *rows,
                       uint64_t *taken)
{
    uv_mutex_t *lock = (uv_mutex_t *)&fb->ixlock; /* the index itself is not changed */
    uv_mutex_lock(lock);
    const key_entry *e = key_index_get(&fb->keys, key, keylen);
    *rows = e != NULL ? e->rows : 0;
    *taken = e != NULL ? e->taken : 0;
    uv_mutex_unlock(lock);
}

uint64_t fallback_key_rows(const fallback *fb, const char *key, size_t keylen)
{
    uint64_t rows, taken;
    key_counts(fb, key, keylen, &rows, &taken);
    return rows;
}

uint64_t fallback_key_ready(const fallback *fb, const char *key, size_t keylen)
{
    uint64_t rows, taken;
    key_counts(fb, key, keylen, &rows, &taken);
    return rows - taken;
}

uint64_t fallback_rows(const fallback *fb)
{
    uv_mutex_t *lock = (uv_mutex_t *)&fb->ixlock;
    uv_mutex_lock(lock);
    uint64_t n = fb->stats.rows;
    uv_mutex_unlock(lock);
    return n;
}

int64_t fallback_oldest(const fallback *fb)
{
    uv_mutex_t *lock = (uv_mutex_t *)&fb->ixlock;
    uv_mutex_lock(lock);
    int64_t t = fb->stats.oldest_ms;
    uv_mutex_unlock(lock);
    return t;
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
            /* Both schema versions: no taken column named (a taken row is
             * pending: it is back in the queue once the store is opened). */
            rc = sqlite3_prepare_v2(
                db, "SELECT id, kind, key, member, score, ts FROM rows ORDER BY id", -1, &s, NULL);
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
        const char *k = fb_column_bytes(s, 2, &klen);
        const char *m = fb_column_bytes(s, 3, &mlen);
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
