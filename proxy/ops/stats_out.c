/* stats_out.c - text output helpers of the stats module (stats_int.h):
 * printf onto a buffer, Prometheus escaping and family headers. */
#include <stdarg.h>
#include <stdio.h>

#include "stats_int.h"

void stats_printf(buf *b, const char *fmt, ...)
{
    va_list ap;
    buf_reserve(b, 256);
    va_start(ap, fmt);
    int n = vsnprintf(b->data + b->len, b->cap - b->len, fmt, ap);
    va_end(ap);
    if (n < 0) {
        return;
    }
    if ((size_t)n >= b->cap - b->len) {
        buf_reserve(b, (size_t)n + 1);
        va_start(ap, fmt);
        vsnprintf(b->data + b->len, b->cap - b->len, fmt, ap);
        va_end(ap);
    }
    b->len += (size_t)n;
}

/* Prometheus escaping: HELP text escapes \ and newline; label values also ". */
void stats_prom_escape(buf *b, const char *s, int label)
{
    for (const char *p = s; *p != '\0'; p++) {
        if (*p == '\\') {
            buf_append(b, "\\\\", 2);
        } else if (*p == '\n') {
            buf_append(b, "\\n", 2);
        } else if (*p == '"' && label) {
            buf_append(b, "\\\"", 2);
        } else {
            buf_append(b, p, 1);
        }
    }
}

void stats_prom_header(buf *b, const char *family, const char *help, const char *type)
{
    stats_printf(b, "# HELP %s ", family);
    stats_prom_escape(b, help, 0);
    stats_printf(b, "\n# TYPE %s %s\n", family, type);
}

const char *stats_type_name(stat_type t)
{
    switch (t) {
    case STAT_COUNTER:
        return "counter";
    case STAT_GAUGE:
        return "gauge";
    case STAT_MSEC:
        return "gauge_ms";
    case STAT_BOOL:
        return "bool";
    case STAT_TEXT:
        return "text";
    case STAT_HISTOGRAM:
        return "histogram";
    case STAT_NODES:
        return "nodes";
    }
    return "?";
}
