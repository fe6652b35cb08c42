/* config_describe.c - `ferry --describe-config`: every key of the table
 * with its type, default, accepted values and one line of doc, as
 * scripts/gen-config-doc turns into docs/configuration.md. */
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "config.h"
#include "config_keys.h"

/* --describe-config: a size as written in ferry.yml (64mb, 1gb, 0). */
static void conf_fmt_size(char *buf, size_t len, unsigned long long v)
{
    static const struct {
        unsigned long long unit;
        const char *suffix;
    } units[] = {{1ULL << 30, "gb"}, {1ULL << 20, "mb"}, {1ULL << 10, "kb"}};
    for (size_t i = 0; i < sizeof(units) / sizeof(units[0]); i++) {
        if (v != 0 && v % units[i].unit == 0) {
            snprintf(buf, len, "%llu%s", v / units[i].unit, units[i].suffix);
            return;
        }
    }
    snprintf(buf, len, "%llu", v);
}

static void conf_fmt_addr(char *buf, size_t len, const config_addr *a)
{
    if (a->is_unix) {
        snprintf(buf, len, "unix:%s", a->path);
    } else if (a->host[0] == '\0') {
        snprintf(buf, len, "(none)");
    } else if (strchr(a->host, ':') != NULL) {
        snprintf(buf, len, "[%s]:%d", a->host, a->port);
    } else {
        snprintf(buf, len, "%s:%d", a->host, a->port);
    }
}

/* The default value of e, as ferry.yml would write it. */
static void conf_fmt_default(char *buf, size_t len, const conf_entry *e, const config *cfg)
{
    const char *field = (const char *)cfg + e->off;
    size_t used = 0;
    buf[0] = '\0';
    switch (e->type) {
    case CONF_SECTION:
        break;
    case CONF_STRING: {
        const char *s = *(char *const *)(const void *)field;
        snprintf(buf, len, "%s", s != NULL && s[0] != '\0' ? s : "\"\"");
        break;
    }
    case CONF_INT: {
        int v = *(const int *)(const void *)field;
        if (v < e->min) {
            snprintf(buf, len, "(unset)");
        } else {
            snprintf(buf, len, "%d", v);
        }
        break;
    }
    case CONF_UINT:
        snprintf(buf, len, "%zu", *(const size_t *)(const void *)field);
        break;
    case CONF_SIZE:
        conf_fmt_size(buf, len, *(const size_t *)(const void *)field);
        break;
    case CONF_DURATION:
        snprintf(buf, len, "%llu", (unsigned long long)*(const uint64_t *)(const void *)field);
        break;
    case CONF_BOOL:
        snprintf(buf, len, "%s", *(const int *)(const void *)field ? "true" : "false");
        break;
    case CONF_ENUM: {
        int v = *(const int *)(const void *)field;
        if (e->enum_name != NULL) {
            snprintf(buf, len, "%s", e->enum_name(v));
        } else {
            snprintf(buf, len, "%d", v);
        }
        break;
    }
    case CONF_ADDR:
        if ((e->flags & CONF_OFF) && e->has_flag &&
            *(const int *)(const void *)((const char *)cfg + e->flag_off) == 0) {
            snprintf(buf, len, "off");
        } else {
            conf_fmt_addr(buf, len, (const config_addr *)(const void *)field);
        }
        break;
    case CONF_ADDR_LIST:
    case CONF_STR_LIST: {
        int n = *(const int *)(const void *)((const char *)cfg + e->count_off);
        used += (size_t)snprintf(buf, len, n == 1 && e->type == CONF_ADDR_LIST ? "" : "[");
        for (int i = 0; i < n && used < len; i++) {
            char one[300];
            if (e->type == CONF_ADDR_LIST) {
                conf_fmt_addr(one, sizeof(one), (const config_addr *)(const void *)field + i);
            } else {
                snprintf(one, sizeof(one), "%s", ((char *const *)(const void *)field)[i]);
            }
            used += (size_t)snprintf(buf + used, len - used, "%s%s", i ? ", " : "", one);
        }
        if (used < len && !(n == 1 && e->type == CONF_ADDR_LIST)) {
            snprintf(buf + used, len - used, "]");
        }
        break;
    }
    }
}

/* What e accepts. */
static void conf_fmt_accepted(char *buf, size_t len, const conf_entry *e)
{
    char lo[32], hi[32];
    switch (e->type) {
    case CONF_SECTION:
        buf[0] = '\0';
        break;
    case CONF_STRING:
        snprintf(buf, len, "%s",
                 e->check == conf_check_word       ? "a word"
                 : e->check == conf_check_sockpath ? "a unix socket path"
                                                   : "text");
        break;
    case CONF_INT:
    case CONF_UINT:
    case CONF_DURATION:
        snprintf(buf, len, "%lld to %lld", e->min, e->max);
        break;
    case CONF_SIZE:
        conf_fmt_size(lo, sizeof(lo), (unsigned long long)e->min);
        conf_fmt_size(hi, sizeof(hi), (unsigned long long)e->max);
        snprintf(buf, len, "%s to %s", lo, hi);
        break;
    case CONF_BOOL:
        snprintf(buf, len, "true, false, yes, no");
        break;
    case CONF_ENUM:
        snprintf(buf, len, "%s", e->what != NULL ? e->what : "");
        break;
    case CONF_ADDR:
        snprintf(buf, len, "host:port, [ipv6]:port or unix:/path%s",
                 (e->flags & CONF_OFF) ? "; \"\" or off" : "");
        break;
    case CONF_ADDR_LIST:
        snprintf(buf, len, "an address or a list of up to %lld", e->max);
        break;
    case CONF_STR_LIST:
        snprintf(buf, len, "a list of up to %lld", e->max);
        break;
    }
}

static const char *conf_type_name(conf_type t)
{
    switch (t) {
    case CONF_SECTION:
        return "section";
    case CONF_STRING:
        return "string";
    case CONF_INT:
    case CONF_UINT:
        return "integer";
    case CONF_SIZE:
        return "size";
    case CONF_DURATION:
        return "duration";
    case CONF_BOOL:
        return "bool";
    case CONF_ENUM:
        return "enum";
    case CONF_ADDR:
        return "address";
    case CONF_ADDR_LIST:
        return "addresses";
    case CONF_STR_LIST:
        return "list";
    }
    return "?";
}

void config_describe(FILE *out)
{
    config cfg;
    config_defaults(&cfg);
    for (size_t i = 0; i < conf_table_len; i++) {
        const conf_entry *e = &conf_table[i];
        char def[1024], acc[256];
        conf_fmt_default(def, sizeof(def), e, &cfg);
        conf_fmt_accepted(acc, sizeof(acc), e);
        fprintf(out, "%s\t%s\t%s\t%s\t%s\n", e->key, conf_type_name(e->type), def, acc,
                e->doc != NULL ? e->doc : "");
    }
    /* queues: a list of mappings, read by config_yaml.c outside the table. */
    fprintf(out,
            "queues\tlist\t[]\ta list of up to %d entries {keys: a glob or a list of up to %d}\t"
            "queues whose pushes, pops and lengths the stats port shows, and their guards\n",
            CONFIG_MAX_QUEUES, CONFIG_MAX_QUEUE_KEYS);
    static const char *const guard_keys[][5] = {
        {"queues[].max_length", "integer", "none", "1 to 4294967295",
         "most items a covered list may hold; a push past it is refused or held"},
        {"queues[].on_full", "enum", "refuse", "refuse or block",
         "refuse: -QFULL; block: the push is held until there is room (hold_timeout_ms)"},
        {"queues[].processing", "string", "none", "a key template with {key}",
         "the processing list moves into are leased in (RPOPLPUSH, LMOVE and blocking forms)"},
        {"queues[].lease_ms", "integer", "60000", "100 to 604800000",
         "how long a leased item may stay unacked before it goes back to its queue"},
        {"queues[].max_attempts", "integer", "5", "1 to 1000000",
         "deliveries of an item before it goes to dead_letter"},
        {"queues[].dead_letter", "string", "{key}:dead", "a key template with {key}",
         "where an item goes after max_attempts"},
        {"queues[].consumer_backoff.after_failures", "integer", "100", "1 to 1000000",
         "expired leases in a row after which a consumer's pops are held"},
        {"queues[].consumer_backoff.pause_ms", "integer", "30000", "1 to 86400000",
         "how long a failing consumer's pops are held"},
        {"queues[].lease_expire_on_disconnect", "bool", "true", "true or false",
         "a client that hangs up has its unacked leases expired at once (false: the deadline "
         "only)"},
    };
    for (size_t i = 0; i < sizeof(guard_keys) / sizeof(guard_keys[0]); i++) {
        fprintf(out, "%s\t%s\t%s\t%s\t%s\n", guard_keys[i][0], guard_keys[i][1], guard_keys[i][2],
                guard_keys[i][3], guard_keys[i][4]);
    }
    config_free(&cfg);
}
