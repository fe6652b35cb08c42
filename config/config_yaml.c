/* config_yaml.c - reads ferry's YAML configuration with libyaml's document
 * API: walks the mappings building dotted keys, assigns each value through
 * the key table (config.c), records where each key was, and reports errors
 * as "file:line:column: msg". */

#include "config.h"
#include "config_keys.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <yaml.h>

#define CONF_MAX_FILE (4u * 1024 * 1024) /* larger files are refused */
#define CONF_KEY_MAX 128                 /* longest dotted key we build */
#define CONF_QUOTE_MAX 48                /* value text shown in messages */

/* Where a key appeared in the document. */
typedef struct conf_seen {
    int present;       /* 1 once the key was read */
    yaml_mark_t key;   /* position of the key */
    yaml_mark_t value; /* position of its value */
} conf_seen;

/* State of one load. */
struct conf_ctx {
    config *cfg;                   /* being filled */
    const char *name;              /* file name for messages */
    const unsigned char *input;    /* the YAML text (for reader error positions) */
    size_t input_len;              /* its length */
    yaml_document_t *doc;          /* the loaded document */
    char *err;                     /* message buffer, may be NULL */
    size_t errlen;                 /* its size */
    conf_seen seen[CONF_KEYS_MAX]; /* per conf_table entry */
    conf_seen queues;              /* the queues: list (not in conf_table: a list of maps) */
};

/* Writes "name:line:col: message" (line and col 1-based) and returns -1. */
static int conf_error_at(conf_ctx *ctx, unsigned long line, unsigned long col, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static int conf_error_at(conf_ctx *ctx, unsigned long line, unsigned long col, const char *fmt, ...)
{
    va_list ap;
    int n;

    if (ctx->err == NULL || ctx->errlen == 0) {
        return -1;
    }
    n = snprintf(ctx->err, ctx->errlen, "%s:%lu:%lu: ", ctx->name, line, col);
    if (n < 0 || (size_t)n >= ctx->errlen) {
        return -1;
    }
    va_start(ap, fmt);
    vsnprintf(ctx->err + n, ctx->errlen - (size_t)n, fmt, ap);
    va_end(ap);
    return -1;
}

/* Converts a libyaml mark (0-based) into the 1-based line and column. */
static void conf_mark_pos(yaml_mark_t mark, unsigned long *line, unsigned long *col)
{
    *line = (unsigned long)mark.line + 1;
    *col = (unsigned long)mark.column + 1;
}

#define conf_error(ctx, mark, ...)                                                                 \
    conf_error_at((ctx), (unsigned long)(mark).line + 1, (unsigned long)(mark).column + 1,         \
                  __VA_ARGS__)

/* Copies s into buf as printable text, cut to CONF_QUOTE_MAX with "...". */
static const char *conf_quote(const char *s, char *buf, size_t len)
{
    size_t i = 0;
    size_t limit = len - 1;
    int cut = 0;

    if (limit > CONF_QUOTE_MAX) {
        limit = CONF_QUOTE_MAX;
    }
    for (; *s != '\0'; s++) {
        if (i == limit) {
            cut = 1;
            break;
        }
        buf[i++] = (unsigned char)*s < 0x20 || *s == 0x7f ? '?' : *s;
    }
    buf[i] = '\0';
    if (cut && i >= 3) {
        memcpy(buf + i - 3, "...", 3);
    }
    return buf;
}

static void *conf_field(config *cfg, size_t off)
{
    return (char *)cfg + off;
}

/* A plain scalar that YAML reads as null: empty, "~" or "null". */
static int conf_is_null(const yaml_node_t *n)
{
    const char *s;

    if (n->type != YAML_SCALAR_NODE || n->data.scalar.style != YAML_PLAIN_SCALAR_STYLE) {
        return 0;
    }
    s = (const char *)n->data.scalar.value;
    return s[0] == '\0' || strcmp(s, "~") == 0 || strcmp(s, "null") == 0 ||
           strcmp(s, "Null") == 0 || strcmp(s, "NULL") == 0;
}

/* Describes a value for "got ..." messages. */
static const char *conf_describe(const yaml_node_t *n, char *buf, size_t len)
{
    char q[CONF_QUOTE_MAX + 1];

    if (n->type == YAML_MAPPING_NODE) {
        return "a mapping";
    }
    if (n->type == YAML_SEQUENCE_NODE) {
        return "a list";
    }
    if (conf_is_null(n)) {
        return "nothing";
    }
    snprintf(buf, len, "'%s'", conf_quote((const char *)n->data.scalar.value, q, sizeof(q)));
    return buf;
}

/* The text of a scalar node, or NULL if it holds a NUL byte. */
static const char *conf_scalar(const yaml_node_t *n)
{
    const char *s = (const char *)n->data.scalar.value;

    if (strlen(s) != n->data.scalar.length) {
        return NULL;
    }
    return s;
}

/* Error for a value of the wrong shape. */
static int conf_type_error(conf_ctx *ctx, const conf_entry *e, const yaml_node_t *v,
                           const char *expected)
{
    char buf[CONF_QUOTE_MAX + 8];

    return conf_error(ctx, v->start_mark, "%s: expected %s, got %s", e->key, expected,
                      conf_describe(v, buf, sizeof(buf)));
}

static int conf_range_error(conf_ctx *ctx, const conf_entry *e, const yaml_node_t *v,
                            const char *text)
{
    char q[CONF_QUOTE_MAX + 1];

    return conf_error(ctx, v->start_mark, "%s: %s is out of range (%lld..%lld)", e->key,
                      conf_quote(text, q, sizeof(q)), e->min, e->max);
}

static int conf_oom(conf_ctx *ctx, const yaml_node_t *v)
{
    return conf_error(ctx, v->start_mark, "out of memory");
}

/* Copies a string value, runs the entry's check; *out is NULL on error. */
static int conf_string_value(conf_ctx *ctx, const conf_entry *e, const yaml_node_t *v,
                             const char *text, char **out)
{
    char *copy;
    const char *why;

    *out = NULL;
    if (text[0] == '\0' && e->check == NULL) {
        return conf_type_error(ctx, e, v, "a non-empty string");
    }
    copy = strdup(text);
    if (copy == NULL) {
        return conf_oom(ctx, v);
    }
    if (e->check != NULL && (why = e->check(copy)) != NULL) {
        char q[CONF_QUOTE_MAX + 1];
        conf_error(ctx, v->start_mark, "%s: '%s': %s", e->key, conf_quote(text, q, sizeof(q)), why);
        free(copy);
        return -1;
    }
    *out = copy;
    return 0;
}

/* Sets an address list or a string list from a scalar or a sequence. */
static int conf_set_list(conf_ctx *ctx, const conf_entry *e, yaml_node_t *v)
{
    int *count = conf_field(ctx->cfg, e->count_off);
    yaml_node_item_t single = 0;
    yaml_node_item_t *items;
    yaml_node_item_t *end;

    if (v->type == YAML_MAPPING_NODE || conf_is_null(v)) {
        return conf_type_error(ctx, e, v, "a list (use [] for an empty one)");
    }
    if (v->type == YAML_SEQUENCE_NODE) {
        items = v->data.sequence.items.start;
        end = v->data.sequence.items.top;
    } else {
        items = &single;
        end = items + 1;
    }
    if (e->type == CONF_STR_LIST) {
        char **list = conf_field(ctx->cfg, e->off);
        for (int i = 0; i < *count; i++) {
            free(list[i]);
            list[i] = NULL;
        }
    }
    *count = 0;
    for (yaml_node_item_t *it = items; it < end; it++) {
        yaml_node_t *item = it == &single ? v : yaml_document_get_node(ctx->doc, *it);
        const char *text;
        if (item == NULL) {
            continue;
        }
        if (item->type != YAML_SCALAR_NODE) {
            return conf_type_error(ctx, e, item,
                                   e->type == CONF_ADDR_LIST ? "an address" : "a string");
        }
        text = conf_scalar(item);
        if (text == NULL) {
            return conf_error(ctx, item->start_mark, "%s: NUL byte in value", e->key);
        }
        if (*count >= e->max) {
            return conf_error(ctx, item->start_mark, "%s: too many entries (at most %lld)", e->key,
                              e->max);
        }
        if (e->type == CONF_ADDR_LIST) {
            config_addr *list = conf_field(ctx->cfg, e->off);
            char q[CONF_QUOTE_MAX + 1];
            const char *why = conf_addr_parse(text, &list[*count]);
            if (why != NULL) {
                return conf_error(ctx, item->start_mark, "%s: bad address '%s': %s", e->key,
                                  conf_quote(text, q, sizeof(q)), why);
            }
            for (int i = 0; i < *count; i++) {
                if (conf_addr_equal(&list[i], &list[*count])) {
                    return conf_error(ctx, item->start_mark, "%s: duplicate address '%s'", e->key,
                                      conf_quote(text, q, sizeof(q)));
                }
            }
            (*count)++;
        } else {
            char **list = conf_field(ctx->cfg, e->off);
            char *s;
            int dup = 0;
            if (conf_string_value(ctx, e, item, text, &s) < 0) {
                return -1;
            }
            for (int i = 0; i < *count; i++) {
                if (strcmp(list[i], s) == 0) {
                    dup = 1;
                }
            }
            if (dup) {
                free(s);
            } else {
                list[(*count)++] = s;
            }
        }
    }
    return 0;
}

static int conf_walk(conf_ctx *ctx, yaml_node_t *map, const char *prefix);

/* The keys: of one queues entry: a glob or a list of globs. */
static int conf_queue_keys(conf_ctx *ctx, config_queue *q, int idx, yaml_node_t *v)
{
    yaml_node_item_t single = 0;
    yaml_node_item_t *items = &single;
    yaml_node_item_t *end = items + 1;

    if (v->type == YAML_MAPPING_NODE || conf_is_null(v)) {
        return conf_error(ctx, v->start_mark, "queues[%d].keys: expected a glob or a list of globs",
                          idx);
    }
    if (v->type == YAML_SEQUENCE_NODE) {
        items = v->data.sequence.items.start;
        end = v->data.sequence.items.top;
    }
    for (yaml_node_item_t *it = items; it < end; it++) {
        yaml_node_t *item = it == &single ? v : yaml_document_get_node(ctx->doc, *it);
        const char *text;
        if (item == NULL) {
            continue;
        }
        if (item->type != YAML_SCALAR_NODE || conf_is_null(item)) {
            return conf_error(ctx, item->start_mark, "queues[%d].keys: expected a glob", idx);
        }
        text = conf_scalar(item);
        if (text == NULL || text[0] == '\0') {
            return conf_error(ctx, item->start_mark, "queues[%d].keys: %s", idx,
                              text == NULL ? "NUL byte in value" : "an empty glob");
        }
        if (q->nkeys >= CONFIG_MAX_QUEUE_KEYS) {
            return conf_error(ctx, item->start_mark, "queues[%d].keys: too many globs (at most %d)",
                              idx, CONFIG_MAX_QUEUE_KEYS);
        }
        q->keys[q->nkeys] = strdup(text);
        if (q->keys[q->nkeys] == NULL) {
            return conf_oom(ctx, item);
        }
        q->nkeys++;
    }
    if (q->nkeys == 0) {
        return conf_error(ctx, v->start_mark, "queues[%d].keys: expected at least one glob", idx);
    }
    return 0;
}

/* max_length: of one queues entry: a whole number of items, 1 or more. */
static int conf_queue_max_length(conf_ctx *ctx, config_queue *q, int idx, yaml_node_t *v)
{
    char buf[CONF_QUOTE_MAX + 8];
    const char *text = v->type == YAML_SCALAR_NODE && !conf_is_null(v) ? conf_scalar(v) : NULL;
    unsigned long long u;
    int rc = text != NULL ? conf_parse_unsigned(text, 0, &u) : -1;
    if (rc == -2 || (rc == 0 && (u == 0 || u > CONFIG_MAX_QUEUE_LENGTH))) {
        return conf_error(ctx, v->start_mark,
                          "queues[%d].max_length: %s is out of range (1 to %llu items)", idx, text,
                          (unsigned long long)CONFIG_MAX_QUEUE_LENGTH);
    }
    if (rc != 0) {
        return conf_error(ctx, v->start_mark,
                          "queues[%d].max_length: expected a number of items, got %s", idx,
                          conf_describe(v, buf, sizeof(buf)));
    }
    q->max_length = u;
    return 0;
}

/* on_full: of one queues entry: refuse or block. */
static int conf_queue_on_full(conf_ctx *ctx, config_queue *q, int idx, yaml_node_t *v)
{
    char buf[CONF_QUOTE_MAX + 8];
    const char *text = v->type == YAML_SCALAR_NODE && !conf_is_null(v) ? conf_scalar(v) : NULL;
    if (text != NULL && strcmp(text, "refuse") == 0) {
        q->on_full = ON_FULL_REFUSE;
    } else if (text != NULL && strcmp(text, "block") == 0) {
        q->on_full = ON_FULL_BLOCK;
    } else {
        return conf_error(ctx, v->start_mark,
                          "queues[%d].on_full: expected refuse or block, got %s", idx,
                          conf_describe(v, buf, sizeof(buf)));
    }
    return 0;
}

/* processing: or dead_letter: of one queues entry: a key name holding
 * {key} once (the queue key it stands beside). */
static int conf_queue_template(conf_ctx *ctx, char **out, const char *what, int idx, yaml_node_t *v)
{
    char buf[CONF_QUOTE_MAX + 8];
    const char *text = v->type == YAML_SCALAR_NODE && !conf_is_null(v) ? conf_scalar(v) : NULL;
    const char *at = text != NULL ? strstr(text, "{key}") : NULL;
    if (at == NULL || strstr(at + 5, "{key}") != NULL || strlen(text) == 5) {
        return conf_error(ctx, v->start_mark,
                          "queues[%d].%s: expected a key name with {key} once, like "
                          "\"{key}:%s\", got %s",
                          idx, what, strcmp(what, "processing") == 0 ? "processing" : "dead",
                          conf_describe(v, buf, sizeof(buf)));
    }
    *out = strdup(text);
    if (*out == NULL) {
        return conf_oom(ctx, v);
    }
    return 0;
}

/* lease_ms: or max_attempts: of one queues entry: a whole number in range. */
static int conf_queue_number(conf_ctx *ctx, uint64_t *out, const char *what, int idx,
                             yaml_node_t *v, unsigned long long lo, unsigned long long hi)
{
    char buf[CONF_QUOTE_MAX + 8];
    const char *text = v->type == YAML_SCALAR_NODE && !conf_is_null(v) ? conf_scalar(v) : NULL;
    unsigned long long u;
    int rc = text != NULL ? conf_parse_unsigned(text, 0, &u) : -1;
    if (rc == -2 || (rc == 0 && (u < lo || u > hi))) {
        return conf_error(ctx, v->start_mark, "queues[%d].%s: %s is out of range (%llu to %llu)",
                          idx, what, text, lo, hi);
    }
    if (rc != 0) {
        return conf_error(ctx, v->start_mark, "queues[%d].%s: expected a whole number, got %s", idx,
                          what, conf_describe(v, buf, sizeof(buf)));
    }
    *out = u;
    return 0;
}

/* lease_expire_on_disconnect: of one queues entry: true or false. */
static int conf_queue_bool(conf_ctx *ctx, int *out, const char *what, int idx, yaml_node_t *v)
{
    char buf[CONF_QUOTE_MAX + 8];
    const char *text = v->type == YAML_SCALAR_NODE && !conf_is_null(v) ? conf_scalar(v) : NULL;
    if (text != NULL && (strcasecmp(text, "true") == 0 || strcasecmp(text, "yes") == 0)) {
        *out = 1;
        return 0;
    }
    if (text != NULL && (strcasecmp(text, "false") == 0 || strcasecmp(text, "no") == 0)) {
        *out = 0;
        return 0;
    }
    return conf_error(ctx, v->start_mark, "queues[%d].%s: expected true or false, got %s", idx,
                      what, conf_describe(v, buf, sizeof(buf)));
}

/* consumer_backoff: of one queues entry: {after_failures: N, pause_ms: M}. */
static int conf_queue_backoff(conf_ctx *ctx, config_queue *q, int idx, yaml_node_t *v)
{
    char buf[CONF_QUOTE_MAX + 8];
    if (v->type != YAML_MAPPING_NODE) {
        return conf_error(ctx, v->start_mark,
                          "queues[%d].consumer_backoff: expected a mapping like "
                          "{after_failures: 100, pause_ms: 30000}, got %s",
                          idx, conf_describe(v, buf, sizeof(buf)));
    }
    q->backoff_after = 100;
    q->backoff_pause_ms = 30000;
    for (yaml_node_pair_t *p = v->data.mapping.pairs.start; p < v->data.mapping.pairs.top; p++) {
        yaml_node_t *k = yaml_document_get_node(ctx->doc, p->key);
        yaml_node_t *val = yaml_document_get_node(ctx->doc, p->value);
        const char *name = k != NULL && k->type == YAML_SCALAR_NODE ? conf_scalar(k) : NULL;
        int rc;
        if (k == NULL || val == NULL) {
            continue;
        }
        if (name != NULL && strcmp(name, "after_failures") == 0) {
            rc = conf_queue_number(ctx, &q->backoff_after, "consumer_backoff.after_failures", idx,
                                   val, 1, 1000000);
        } else if (name != NULL && strcmp(name, "pause_ms") == 0) {
            rc = conf_queue_number(ctx, &q->backoff_pause_ms, "consumer_backoff.pause_ms", idx, val,
                                   1, 86400000ull);
        } else {
            return conf_error(ctx, k->start_mark, "queues[%d].consumer_backoff: unknown key '%s'",
                              idx, name != NULL ? conf_quote(name, buf, sizeof(buf)) : "?");
        }
        if (rc < 0) {
            return -1;
        }
    }
    return 0;
}

/* queues: a list of maps, each with keys: (required) and the guards that
 * apply to those keys: max_length, on_full; processing, lease_ms,
 * max_attempts, dead_letter (leases). */
static int conf_set_queues(conf_ctx *ctx, yaml_node_t *v)
{
    config *cfg = ctx->cfg;
    char q[CONF_QUOTE_MAX + 1];

    if (conf_is_null(v)) {
        return 0;
    }
    if (v->type != YAML_SEQUENCE_NODE) {
        char buf[CONF_QUOTE_MAX + 8];
        return conf_error(ctx, v->start_mark, "queues: expected a list of entries, got %s",
                          conf_describe(v, buf, sizeof(buf)));
    }
    for (yaml_node_item_t *it = v->data.sequence.items.start; it < v->data.sequence.items.top;
         it++) {
        yaml_node_t *e = yaml_document_get_node(ctx->doc, *it);
        int idx = cfg->nqueues;
        if (e == NULL) {
            continue;
        }
        if (e->type != YAML_MAPPING_NODE) {
            char buf[CONF_QUOTE_MAX + 8];
            return conf_error(ctx, e->start_mark,
                              "queues[%d]: expected a mapping like {keys: \"jobs:*\"}, got %s", idx,
                              conf_describe(e, buf, sizeof(buf)));
        }
        if (idx >= CONFIG_MAX_QUEUES) {
            return conf_error(ctx, e->start_mark, "queues: too many entries (at most %d)",
                              CONFIG_MAX_QUEUES);
        }
        cfg->nqueues++;
        static const char *const known[] = {
            "keys",         "max_length",       "on_full",
            "processing",   "dead_letter",      "lease_ms",
            "max_attempts", "consumer_backoff", "lease_expire_on_disconnect"};
        cfg->queues[idx].lease_ms = 60000;
        cfg->queues[idx].expire_on_disconnect = 1;
        cfg->queues[idx].max_attempts = 5;
        yaml_mark_t lease_at = e->start_mark;
        int seen[sizeof(known) / sizeof(known[0])] = {0};
        yaml_mark_t on_full_at = e->start_mark;
        for (yaml_node_pair_t *p = e->data.mapping.pairs.start; p < e->data.mapping.pairs.top;
             p++) {
            yaml_node_t *k = yaml_document_get_node(ctx->doc, p->key);
            yaml_node_t *val = yaml_document_get_node(ctx->doc, p->value);
            if (k == NULL || val == NULL) {
                continue;
            }
            const char *name = k->type == YAML_SCALAR_NODE ? conf_scalar(k) : NULL;
            size_t which = 0;
            while (name != NULL && which < sizeof(known) / sizeof(known[0]) &&
                   strcmp(name, known[which]) != 0) {
                which++;
            }
            if (name == NULL || which == sizeof(known) / sizeof(known[0])) {
                return conf_error(ctx, k->start_mark, "queues[%d]: unknown key '%s'", idx,
                                  name != NULL ? conf_quote(name, q, sizeof(q)) : "?");
            }
            if (seen[which]) {
                return conf_error(ctx, k->start_mark, "queues[%d]: duplicate key '%s'", idx,
                                  known[which]);
            }
            seen[which] = 1;
            int rc;
            if (which == 0) {
                rc = conf_queue_keys(ctx, &cfg->queues[idx], idx, val);
            } else if (which == 1) {
                rc = conf_queue_max_length(ctx, &cfg->queues[idx], idx, val);
            } else if (which == 2) {
                on_full_at = k->start_mark;
                rc = conf_queue_on_full(ctx, &cfg->queues[idx], idx, val);
            } else if (which == 3) {
                rc = conf_queue_template(ctx, &cfg->queues[idx].processing, "processing", idx, val);
            } else if (which == 4) {
                lease_at = k->start_mark;
                rc = conf_queue_template(ctx, &cfg->queues[idx].dead_letter, "dead_letter", idx,
                                         val);
            } else if (which == 5) {
                lease_at = k->start_mark;
                rc = conf_queue_number(ctx, &cfg->queues[idx].lease_ms, "lease_ms", idx, val, 100,
                                       86400000ull * 7);
            } else if (which == 6) {
                lease_at = k->start_mark;
                rc = conf_queue_number(ctx, &cfg->queues[idx].max_attempts, "max_attempts", idx,
                                       val, 1, 1000000);
            } else if (which == 7) {
                lease_at = k->start_mark;
                rc = conf_queue_backoff(ctx, &cfg->queues[idx], idx, val);
            } else {
                lease_at = k->start_mark;
                rc = conf_queue_bool(ctx, &cfg->queues[idx].expire_on_disconnect,
                                     "lease_expire_on_disconnect", idx, val);
            }
            if (rc < 0) {
                return -1;
            }
        }
        if (!seen[0]) {
            return conf_error(ctx, e->start_mark, "queues[%d]: keys: is required", idx);
        }
        if (seen[2] && !seen[1]) {
            return conf_error(ctx, on_full_at, "queues[%d]: on_full needs max_length", idx);
        }
        if ((seen[4] || seen[5] || seen[6] || seen[7] || seen[8]) && !seen[3]) {
            return conf_error(ctx, lease_at,
                              "queues[%d]: lease_ms, max_attempts, dead_letter, "
                              "consumer_backoff and lease_expire_on_disconnect need processing",
                              idx);
        }
        if (seen[3] && !seen[4]) {
            cfg->queues[idx].dead_letter = strdup("{key}:dead");
            if (cfg->queues[idx].dead_letter == NULL) {
                return conf_oom(ctx, e);
            }
        }
    }
    return 0;
}

/* Parses the value v of entry e into the config. */
static int conf_set(conf_ctx *ctx, const conf_entry *e, yaml_node_t *v)
{
    config *cfg = ctx->cfg;
    const char *text = NULL;
    char q[CONF_QUOTE_MAX + 1];
    unsigned long long u;
    long long ll;
    int rc;

    if (e->has_flag) {
        *(int *)conf_field(cfg, e->flag_off) = 1;
    }
    switch (e->type) {
    case CONF_SECTION:
        if (v->type == YAML_MAPPING_NODE) {
            return conf_walk(ctx, v, e->key);
        }
        if (conf_is_null(v)) {
            return 0;
        }
        return conf_type_error(ctx, e, v, "a mapping");
    case CONF_ADDR_LIST:
    case CONF_STR_LIST:
        return conf_set_list(ctx, e, v);
    default:
        break;
    }

    /* Every other type is a scalar. */
    if (v->type == YAML_SCALAR_NODE) {
        text = conf_scalar(v);
        if (text == NULL) {
            return conf_error(ctx, v->start_mark, "%s: NUL byte in value", e->key);
        }
    }
    switch (e->type) {
    case CONF_STRING: {
        char **field = conf_field(cfg, e->off);
        char *s = NULL;
        if (text == NULL) {
            return conf_type_error(ctx, e, v, "a string");
        }
        if (conf_is_null(v) || text[0] == '\0') {
            if (!(e->flags & CONF_EMPTY_NULL)) {
                return conf_type_error(ctx, e, v, "a non-empty string");
            }
        } else if (conf_string_value(ctx, e, v, text, &s) < 0) {
            return -1;
        }
        free(*field);
        *field = s;
        return 0;
    }
    case CONF_INT:
        if (text == NULL || (rc = conf_parse_ll(text, &ll)) == -1) {
            return conf_type_error(ctx, e, v, "an integer");
        }
        if (rc == -2 || ll < e->min || ll > e->max) {
            return conf_range_error(ctx, e, v, text);
        }
        *(int *)conf_field(cfg, e->off) = (int)ll;
        return 0;
    case CONF_UINT:
    case CONF_SIZE:
    case CONF_DURATION:
        if (text == NULL || (rc = conf_parse_unsigned(text, e->type == CONF_SIZE, &u)) == -1) {
            return conf_type_error(ctx, e, v,
                                   e->type == CONF_SIZE       ? "a size (bytes, or with kb/mb/gb)"
                                   : e->type == CONF_DURATION ? "a duration in milliseconds"
                                                              : "a non-negative integer");
        }
        if (rc == -2 || u < (unsigned long long)e->min || u > (unsigned long long)e->max) {
            return conf_range_error(ctx, e, v, text);
        }
        if (e->type == CONF_DURATION) {
            *(uint64_t *)conf_field(cfg, e->off) = (uint64_t)u;
        } else {
            *(size_t *)conf_field(cfg, e->off) = (size_t)u;
        }
        return 0;
    case CONF_BOOL:
        if (text != NULL && (strcasecmp(text, "true") == 0 || strcasecmp(text, "yes") == 0)) {
            *(int *)conf_field(cfg, e->off) = 1;
            return 0;
        }
        if (text != NULL && (strcasecmp(text, "false") == 0 || strcasecmp(text, "no") == 0)) {
            *(int *)conf_field(cfg, e->off) = 0;
            return 0;
        }
        return conf_type_error(ctx, e, v, "true or false");
    case CONF_ENUM:
        if (text == NULL || (rc = e->parse_enum(text)) < 0) {
            return conf_type_error(ctx, e, v, e->what);
        }
        *(int *)conf_field(cfg, e->off) = rc;
        return 0;
    case CONF_ADDR: {
        const char *why;
        if (text == NULL) {
            return conf_type_error(ctx, e, v, "an address");
        }
        if ((e->flags & CONF_OFF) &&
            (conf_is_null(v) || text[0] == '\0' || strcasecmp(text, "off") == 0)) {
            *(int *)conf_field(cfg, e->flag_off) = 0;
            return 0;
        }
        if (conf_is_null(v)) {
            return conf_type_error(ctx, e, v, "an address");
        }
        why = conf_addr_parse(text, conf_field(cfg, e->off));
        if (why != NULL) {
            return conf_error(ctx, v->start_mark, "%s: bad address '%s': %s", e->key,
                              conf_quote(text, q, sizeof(q)), why);
        }
        return 0;
    }
    default:
        return conf_error(ctx, v->start_mark, "%s: internal error: bad key type", e->key);
    }
}

/* Reads every key of a mapping; prefix is the dotted section name or NULL. */
static int conf_walk(conf_ctx *ctx, yaml_node_t *map, const char *prefix)
{
    for (yaml_node_pair_t *p = map->data.mapping.pairs.start; p < map->data.mapping.pairs.top;
         p++) {
        yaml_node_t *k = yaml_document_get_node(ctx->doc, p->key);
        yaml_node_t *v = yaml_document_get_node(ctx->doc, p->value);
        char full[CONF_KEY_MAX];
        char q[CONF_QUOTE_MAX + 1];
        const char *name;
        int idx = -1;
        int n;

        if (k == NULL || v == NULL) {
            continue;
        }
        if (k->type != YAML_SCALAR_NODE) {
            return conf_error(ctx, k->start_mark, "keys must be names, not %s",
                              k->type == YAML_MAPPING_NODE ? "a mapping" : "a list");
        }
        name = (const char *)k->data.scalar.value;
        if (prefix != NULL) {
            n = snprintf(full, sizeof(full), "%s.%s", prefix, name);
        } else {
            n = snprintf(full, sizeof(full), "%s", name);
        }
        if (prefix == NULL && conf_scalar(k) != NULL && strcmp(name, "queues") == 0) {
            if (ctx->queues.present) {
                return conf_error(ctx, k->start_mark, "duplicate key 'queues' (first at line %lu)",
                                  (unsigned long)ctx->queues.key.line + 1);
            }
            ctx->queues.present = 1;
            ctx->queues.key = k->start_mark;
            ctx->queues.value = v->start_mark;
            if (conf_set_queues(ctx, v) < 0) {
                return -1;
            }
            continue;
        }
        if (n > 0 && (size_t)n < sizeof(full) && strchr(name, '.') == NULL &&
            conf_scalar(k) != NULL) {
            idx = conf_find(full);
        }
        if (idx < 0) {
            return conf_error(ctx, k->start_mark, "unknown key '%s'",
                              conf_quote(full, q, sizeof(q)));
        }
        if (ctx->seen[idx].present) {
            return conf_error(ctx, k->start_mark, "duplicate key '%s' (first at line %lu)", full,
                              (unsigned long)ctx->seen[idx].key.line + 1);
        }
        ctx->seen[idx].present = 1;
        ctx->seen[idx].key = k->start_mark;
        ctx->seen[idx].value = v->start_mark;
        if (conf_set(ctx, &conf_table[idx], v) < 0) {
            return -1;
        }
    }
    return 0;
}

int conf_key_error(conf_ctx *ctx, const char *key, int at_value, const char *fmt, ...)
{
    unsigned long line = 1;
    unsigned long col = 1;
    char msg[256];
    va_list ap;
    int idx = conf_find(key);

    if (idx >= 0 && ctx->seen[idx].present) {
        conf_mark_pos(at_value ? ctx->seen[idx].value : ctx->seen[idx].key, &line, &col);
    }
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    return conf_error_at(ctx, line, col, "%s", msg);
}

int conf_present(const conf_ctx *ctx, const char *key)
{
    int idx = conf_find(key);

    return idx >= 0 && ctx->seen[idx].present;
}

/* Reports a libyaml error with its position. */
static int conf_yaml_error(conf_ctx *ctx, const yaml_parser_t *parser)
{
    const char *problem = parser->problem != NULL ? parser->problem : "unknown error";

    switch (parser->error) {
    case YAML_MEMORY_ERROR:
        return conf_error_at(ctx, 1, 1, "out of memory");
    case YAML_READER_ERROR: {
        /* Reader errors carry a byte offset; turn it into line:column. */
        unsigned long line = 1;
        unsigned long col = 1;
        for (size_t i = 0; i < parser->problem_offset && i < ctx->input_len; i++) {
            if (ctx->input[i] == '\n') {
                line++;
                col = 1;
            } else {
                col++;
            }
        }
        return conf_error_at(ctx, line, col, "invalid input: %s", problem);
    }
    default:
        if (parser->context != NULL) {
            return conf_error(ctx, parser->problem_mark, "YAML syntax error: %s (%s)", problem,
                              parser->context);
        }
        return conf_error(ctx, parser->problem_mark, "YAML syntax error: %s", problem);
    }
}

/* Parses, assigns and validates; cfg already holds the defaults. */
static int conf_load_yaml(conf_ctx *ctx)
{
    yaml_parser_t parser;
    yaml_document_t doc;
    yaml_document_t extra;
    yaml_node_t *root;
    int rc = -1;

    if (!yaml_parser_initialize(&parser)) {
        return conf_error_at(ctx, 1, 1, "out of memory");
    }
    yaml_parser_set_input_string(&parser, ctx->input, ctx->input_len);
    if (!yaml_parser_load(&parser, &doc)) {
        conf_yaml_error(ctx, &parser);
        yaml_parser_delete(&parser);
        return -1;
    }
    ctx->doc = &doc;
    root = yaml_document_get_root_node(&doc);
    if (root == NULL || conf_is_null(root)) {
        conf_error_at(ctx, 1, 1, "empty configuration file");
    } else if (root->type != YAML_MAPPING_NODE) {
        conf_error(ctx, root->start_mark, "the top level must be a mapping (key: value)");
    } else if (conf_walk(ctx, root, NULL) == 0) {
        /* A second document would be silently ignored: refuse it. */
        if (!yaml_parser_load(&parser, &extra)) {
            conf_yaml_error(ctx, &parser);
        } else {
            yaml_node_t *more = yaml_document_get_root_node(&extra);
            if (more != NULL) {
                conf_error(ctx, more->start_mark, "only one YAML document is allowed");
            } else {
                rc = conf_semantic(ctx, ctx->cfg);
            }
            yaml_document_delete(&extra);
        }
    }
    ctx->doc = NULL;
    yaml_document_delete(&doc);
    yaml_parser_delete(&parser);
    return rc;
}

static int conf_load_buffer(config *cfg, const char *name, const unsigned char *buf, size_t len,
                            char *err, size_t errlen)
{
    conf_ctx ctx;

    memset(&ctx, 0, sizeof(ctx));
    ctx.cfg = cfg;
    ctx.name = name;
    ctx.input = buf;
    ctx.input_len = len;
    ctx.err = err;
    ctx.errlen = errlen;
    if (err != NULL && errlen > 0) {
        err[0] = '\0';
    }
    cfg->file = strdup(name);
    if (cfg->file == NULL) {
        conf_error_at(&ctx, 1, 1, "out of memory");
        config_free(cfg);
        return -1;
    }
    if (conf_load_yaml(&ctx) < 0) {
        config_free(cfg);
        return -1;
    }
    return 0;
}

int config_load_string(config *cfg, const char *name, const char *yaml, char *err, size_t errlen)
{
    config_defaults(cfg);
    if (name == NULL) {
        name = "<string>";
    }
    if (yaml == NULL) {
        yaml = "";
    }
    return conf_load_buffer(cfg, name, (const unsigned char *)yaml, strlen(yaml), err, errlen);
}

int config_load(config *cfg, const char *path, char *err, size_t errlen)
{
    conf_ctx ctx;
    unsigned char *buf = NULL;
    size_t len = 0;
    size_t cap = 0;
    FILE *f;
    int rc;

    memset(&ctx, 0, sizeof(ctx));
    ctx.name = path;
    ctx.err = err;
    ctx.errlen = errlen;
    config_defaults(cfg);
    f = fopen(path, "rb");
    if (f == NULL) {
        conf_error_at(&ctx, 1, 1, "cannot open: %s", strerror(errno));
        config_free(cfg);
        return -1;
    }
    for (;;) {
        size_t n;
        if (len == cap) {
            unsigned char *grown;
            cap = cap == 0 ? 4096 : cap * 2;
            if (cap > CONF_MAX_FILE + 1) {
                cap = CONF_MAX_FILE + 1;
            }
            if (len == cap) {
                conf_error_at(&ctx, 1, 1, "file too large (over %u bytes)", CONF_MAX_FILE);
                goto fail;
            }
            grown = realloc(buf, cap);
            if (grown == NULL) {
                conf_error_at(&ctx, 1, 1, "out of memory");
                goto fail;
            }
            buf = grown;
        }
        n = fread(buf + len, 1, cap - len, f);
        len += n;
        if (n == 0) {
            if (ferror(f)) {
                conf_error_at(&ctx, 1, 1, "cannot read: %s", strerror(errno));
                goto fail;
            }
            break;
        }
    }
    fclose(f);
    rc = conf_load_buffer(cfg, path, buf != NULL ? buf : (const unsigned char *)"", len, err,
                          errlen);
    free(buf);
    return rc;

fail:
    fclose(f);
    free(buf);
    config_free(cfg);
    return -1;
}
