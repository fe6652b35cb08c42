/* fallback_group.c - the fallback store's threadpool side: one group of
 * queued operations run in one transaction (BEGIN IMMEDIATE..COMMIT), each
 * operation's statements writing its results into it; on any error the
 * whole group rolls back and nothing took effect. fallback.c, on the loop
 * thread, queues the operations, submits a group and delivers the results
 * (see its threads note); the two share fallback_int.h. */
#include <sqlite3.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fallback.h"
#include "fallback_int.h"
#include "ferry.h"

static int sql_run(fallback *fb, sqlite3_stmt *s);

/* Bind bytes as a BLOB; a zero-length one must not become NULL. */
static int bind_bytes(sqlite3_stmt *s, int idx, const char *p, size_t n)
{
    return sqlite3_bind_blob64(s, idx, n > 0 ? p : "", n, SQLITE_STATIC);
}

static sqlite3_int64 clamp_limit(size_t n)
{
    return n > (size_t)INT64_MAX ? INT64_MAX : (sqlite3_int64)n;
}

/* ---------------------------------------------------------------------------
 * Worker side: one group in one transaction
 * ------------------------------------------------------------------------ */

/* Note the group's first error (the message is read before the reset). */
static int sql_fail(fallback *fb, int rc)
{
    if (fb->werr[0] == '\0') {
        fb_sqlite_errstr(fb->db, rc, fb->werr, sizeof(fb->werr));
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
        size_t klen, mlen, rlen = 0;
        const char *k = fb_column_bytes(s, 2, &klen);
        const char *m = fb_column_bytes(s, 3, &mlen);
        int held = sqlite3_column_type(s, 7) != SQLITE_NULL;
        const char *r = held ? fb_column_bytes(s, 7, &rlen) : NULL;
        char *chunk = xmalloc(klen + mlen + rlen + 1);
        memcpy(chunk, k, klen);
        memcpy(chunk + klen, m, mlen);
        if (rlen > 0) {
            memcpy(chunk + klen + mlen, r, rlen);
        }
        chunk[klen + mlen + rlen] = '\0';
        it->id = sqlite3_column_int64(s, 0);
        it->kind = sqlite3_column_int(s, 1);
        it->key = chunk;
        it->keylen = klen;
        it->member = chunk + klen;
        it->memberlen = mlen;
        it->score = sqlite3_column_double(s, 4);
        it->ts_ms = sqlite3_column_int64(s, 5);
        it->taken = sqlite3_column_int(s, 6) == 1; /* (2: held, rcpt says) */
        it->rcpt = held ? chunk + klen + mlen : NULL;
        it->rcptlen = rlen;
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
    sqlite3_bind_int(s, 7, op->rcpt != NULL ? 2 : 0);
    if (op->rcpt != NULL) {
        bind_bytes(s, 8, op->rcpt, op->rcptlen);
    }
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
            op->dtaken += rc == SQLITE_OK && op->rcpt != NULL; /* held: as taken */
            op->dbytes += rc == SQLITE_OK ? (int64_t)(op->keylen + op->lens[i]) : 0;
        }
        if (rc != SQLITE_OK) {
            return rc;
        }
        m += op->lens[i];
    }
    return SQLITE_OK;
}

/* Up to op->n untaken rows off one end of op->key: taken (a pop: they stay
 * until confirmed or released), or deleted (a move: their element is in its
 * destination in the same transaction). */
static int sql_pop(fallback *fb, fb_op *op, int take)
{
    sqlite3_stmt *s = fb->stmt[ST_POP_HEAD + op->how];
    bind_bytes(s, 1, op->key, op->keylen);
    sqlite3_bind_int64(s, 2, clamp_limit(op->n));
    int rc = sql_collect(fb, s, op);
    for (size_t i = 0; rc == SQLITE_OK && i < op->nitems; i++) {
        if (take) {
            sqlite3_bind_int64(fb->stmt[ST_TAKE], 1, op->items[i].id);
            rc = sql_run(fb, fb->stmt[ST_TAKE]);
            op->items[i].taken = 1;
            op->dtaken++;
        } else {
            sqlite3_bind_int64(fb->stmt[ST_DEL_ID], 1, op->items[i].id);
            rc = sql_run(fb, fb->stmt[ST_DEL_ID]);
            op->drows--;
            op->dbytes -= (int64_t)(op->items[i].keylen + op->items[i].memberlen);
        }
    }
    op->count = (int64_t)op->nitems;
    return rc;
}

/* Confirm (delete) or release (untake) each taken row op->ids names; ids
 * not taken are skipped. A released sorted-set member that has an untaken
 * row again (added meanwhile) is deleted: the set holds it once. */
static int sql_settle(fallback *fb, fb_op *op)
{
    int confirm = op->type == OP_CONFIRM;
    int rc = SQLITE_OK;
    for (size_t i = 0; rc == SQLITE_OK && i < op->n; i++) {
        sqlite3_stmt *s = fb->stmt[ST_TAKEN_ROW];
        sqlite3_bind_int64(s, 1, op->ids[i]);
        rc = sqlite3_step(s);
        if (rc != SQLITE_ROW) {
            if (rc != SQLITE_DONE) {
                sql_fail(fb, rc);
            }
            sqlite3_reset(s);
            sqlite3_clear_bindings(s);
            rc = rc == SQLITE_DONE ? SQLITE_OK : rc;
            continue; /* not taken (any more): nothing to do */
        }
        key_delta d;
        size_t klen, mlen;
        const char *k = fb_column_bytes(s, 0, &klen);
        int kind = sqlite3_column_int(s, 1);
        const char *m = fb_column_bytes(s, 2, &mlen);
        memset(&d, 0, sizeof(d));
        d.key = xmalloc(klen + mlen + 1);
        memcpy(d.key, k, klen);
        memcpy(d.key + klen, m, mlen); /* the member, for a sorted set's check below */
        d.keylen = klen;
        d.taken = 1;
        int64_t bytes = sqlite3_column_int64(s, 3);
        sqlite3_reset(s);
        sqlite3_clear_bindings(s);
        rc = SQLITE_OK;
        int del = confirm;
        if (!confirm && kind == FB_ZADD) {
            int64_t live = 0;
            sqlite3_stmt *z = fb->stmt[ST_ZFIND];
            bind_bytes(z, 1, d.key, klen);
            bind_bytes(z, 2, d.key + klen, mlen);
            rc = sql_int(fb, z, &live);
            del = rc == SQLITE_ROW;
            rc = rc == SQLITE_ROW || rc == SQLITE_DONE ? SQLITE_OK : rc;
        }
        if (rc == SQLITE_OK) {
            sqlite3_stmt *w = fb->stmt[del ? ST_DEL_ID : ST_UNTAKE];
            sqlite3_bind_int64(w, 1, op->ids[i]);
            rc = sql_run(fb, w);
        }
        if (rc != SQLITE_OK) {
            free(d.key);
            break;
        }
        if (del) {
            d.rows = 1;
            d.bytes = bytes;
        }
        op->deltas = xrealloc(op->deltas, (op->ndeltas + 1) * sizeof(*op->deltas));
        op->deltas[op->ndeltas++] = d;
        op->count++;
    }
    return rc;
}

/* LMOVE: one row off src's end, onto dst's end, in the same transaction.
 * op->key holds src then dst (op->n is dst's length). */
static int sql_move(fallback *fb, fb_op *op)
{
    size_t dstlen = op->n;
    op->n = 1;
    int rc = sql_pop(fb, op, 0);
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
        const char *k = fb_column_bytes(s, 0, &d->keylen);
        d->key = xmalloc(d->keylen + 1);
        memcpy(d->key, k, d->keylen);
        d->rows = sqlite3_column_int64(s, 1);
        d->bytes = sqlite3_column_int64(s, 2);
        d->taken = sqlite3_column_int64(s, 3);
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
        return sql_pop(fb, op, 1);
    case OP_CONFIRM:
    case OP_RELEASE:
        return sql_settle(fb, op);
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
int fb_sql_oldest(fallback *fb, int64_t *out)
{
    *out = 0;
    int rc = sql_int(fb, fb->stmt[ST_OLDEST], out);
    return rc == SQLITE_ROW || rc == SQLITE_DONE ? SQLITE_OK : rc;
}

void fb_work_cb(uv_work_t *req)
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
        rc = fb_sql_oldest(fb, &g->oldest_ms);
    }
    if (rc == SQLITE_OK) {
        rc = sql_run(fb, fb->stmt[ST_COMMIT]);
    }
    if (rc != SQLITE_OK) {
        g->status = fb_sqlite_to_uv(rc);
        snprintf(g->errstr, sizeof(g->errstr), "%s", fb->werr[0] ? fb->werr : sqlite3_errstr(rc));
        if (!sqlite3_get_autocommit(fb->db)) {
            sql_run(fb, fb->stmt[ST_ROLLBACK]);
        }
        for (fb_op *op = g->ops; op != NULL; op = op->next) {
            fb_op_drop_results(op);
        }
    }
    g->commit_us = (uv_hrtime() - t0) / 1000;
    uv_mutex_lock(&fb->mu);
    g->done = 1;
    uv_cond_signal(&fb->cond);
    uv_mutex_unlock(&fb->mu);
}
