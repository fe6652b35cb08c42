/* durable.c - the durability verdict on a Redis node from its INFO
 * persistence: AOF on, no initial AOF rewrite still to finish, the last AOF
 * write ok, not loading. `CONFIG SET appendonly yes` answers OK at once, but
 * until the initial rewrite has written the data set to the AOF, a restart
 * loses what was acknowledged meanwhile (the AOF does not hold it yet). */
#include "durable.h"

#include <stdio.h>
#include <string.h>

typedef enum field_kind {
    FIELD_FLAG = 0, /* "0" or "1" */
    FIELD_STATUS    /* "ok" (1) or "err" (0) */
} field_kind;

typedef struct field {
    const char *name; /* INFO field name */
    field_kind kind;  /* how its value is read */
    size_t offset;    /* of the int in durable_info */
} field;

static const field fields[] = {
    {"loading", FIELD_FLAG, offsetof(durable_info, loading)},
    {"aof_enabled", FIELD_FLAG, offsetof(durable_info, aof_enabled)},
    {"aof_rewrite_in_progress", FIELD_FLAG, offsetof(durable_info, aof_rewrite_in_progress)},
    {"aof_rewrite_scheduled", FIELD_FLAG, offsetof(durable_info, aof_rewrite_scheduled)},
    {"aof_last_write_status", FIELD_STATUS, offsetof(durable_info, aof_last_write_ok)},
    {"aof_last_bgrewrite_status", FIELD_STATUS, offsetof(durable_info, aof_last_bgrewrite_ok)},
};
#define NFIELDS (sizeof(fields) / sizeof(fields[0]))

static int *field_ptr(durable_info *in, const field *fd)
{
    return (int *)(void *)((char *)in + fd->offset);
}

static int field_get(const durable_info *in, const field *fd)
{
    return *(const int *)(const void *)((const char *)in + fd->offset);
}

/* The value of one field: 0 or 1, or -1 when it is neither. */
static int field_value(field_kind kind, const char *v, size_t n)
{
    if (kind == FIELD_FLAG) {
        if (n == 1 && (v[0] == '0' || v[0] == '1')) {
            return v[0] - '0';
        }
        return -1;
    }
    if (n == 2 && memcmp(v, "ok", 2) == 0) {
        return 1;
    }
    if (n == 3 && memcmp(v, "err", 3) == 0) {
        return 0;
    }
    return -1;
}

/* One "name:value" line (no line end). */
static void parse_line(const char *p, size_t n, durable_info *out)
{
    const char *colon = memchr(p, ':', n);
    if (n == 0 || p[0] == '#' || colon == NULL) {
        return;
    }
    size_t klen = (size_t)(colon - p);
    for (size_t i = 0; i < NFIELDS; i++) {
        if (strlen(fields[i].name) == klen && memcmp(p, fields[i].name, klen) == 0) {
            *field_ptr(out, &fields[i]) = field_value(fields[i].kind, colon + 1, n - klen - 1);
            return;
        }
    }
}

void durable_parse(const char *body, size_t len, durable_info *out)
{
    for (size_t i = 0; i < NFIELDS; i++) {
        *field_ptr(out, &fields[i]) = -1;
    }
    size_t pos = 0;
    while (body != NULL && pos < len) {
        const char *line = body + pos;
        const char *nl = memchr(line, '\n', len - pos);
        size_t n = nl != NULL ? (size_t)(nl - line) : len - pos;
        pos += n + (nl != NULL);
        if (n > 0 && line[n - 1] == '\r') {
            n--;
        }
        parse_line(line, n, out);
    }
}

int durable_judge(const durable_info *in, durable_history hist, char *why, size_t len)
{
    const char *reason = NULL;
    char missing[DURABLE_WHY_MAX];

    for (size_t i = 0; i < NFIELDS && reason == NULL; i++) {
        if (field_get(in, &fields[i]) < 0) {
            snprintf(missing, sizeof(missing), "INFO persistence has no usable %s field",
                     fields[i].name);
            reason = missing;
        }
    }
    int fresh = hist != DURABLE_SETTLED;
    int was_off = hist == DURABLE_WAS_OFF;
    if (reason != NULL) {
        /* already set */
    } else if (in->loading == 1) {
        reason = "loading its data set (loading:1)";
    } else if (in->aof_enabled != 1) {
        reason = "appendonly is off (aof_enabled:0)";
    } else if (in->aof_last_write_ok != 1) {
        reason = "the last AOF write failed (aof_last_write_status:err)";
    } else if (fresh && in->aof_rewrite_in_progress == 1) {
        reason = was_off ? "initial AOF rewrite in progress"
                         : "AOF rewrite in progress (it may be the initial one)";
    } else if (fresh && in->aof_rewrite_scheduled == 1) {
        reason = was_off ? "initial AOF rewrite scheduled"
                         : "AOF rewrite scheduled (it may be the initial one)";
    } else if (was_off && in->aof_last_bgrewrite_ok != 1) {
        reason = "the initial AOF rewrite failed (aof_last_bgrewrite_status:err)";
    }
    if (len > 0) {
        snprintf(why, len, "%s", reason != NULL ? reason : "");
    }
    return reason == NULL;
}

int durable_check(const char *body, size_t len, durable_history hist, char *why, size_t whylen)
{
    durable_info in;
    durable_parse(body, len, &in);
    return durable_judge(&in, hist, why, whylen);
}
