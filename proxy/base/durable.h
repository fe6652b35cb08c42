/* durable.h - may a Redis node be trusted with acknowledged writes? Parses
 * the body of an `INFO persistence` reply and decides, with a reason when
 * not. Pure: no I/O, no allocation. */
#ifndef FERRY_DURABLE_H
#define FERRY_DURABLE_H

#include <stddef.h>

#define DURABLE_WHY_MAX 160 /* bytes of a reason, NUL included */

/* What ferry knows of the node's AOF before this reply. Redis 7.0's INFO
 * does not tell the initial AOF rewrite (after `appendonly yes`, when the
 * AOF does not hold the data yet) from a routine one, so the caller says. */
typedef enum durable_history {
    DURABLE_UNKNOWN = 0, /* first look: any rewrite may be the initial one */
    DURABLE_WAS_OFF,     /* AOF was seen off just before ferry turned it on */
    DURABLE_SETTLED      /* trusted at the last check, AOF not seen off since:
                            a rewrite now is a routine one */
} durable_history;

/* The fields of INFO persistence the verdict reads (-1 = absent). */
typedef struct durable_info {
    int loading;                 /* loading:1 while the data set loads */
    int aof_enabled;             /* aof_enabled:1 */
    int aof_rewrite_in_progress; /* aof_rewrite_in_progress:1 */
    int aof_rewrite_scheduled;   /* aof_rewrite_scheduled:1 (waits for a child) */
    int aof_last_write_ok;       /* aof_last_write_status:ok = 1, err = 0 */
    int aof_last_bgrewrite_ok;   /* aof_last_bgrewrite_status:ok = 1, err = 0 */
} durable_info;

/* Parse an INFO body ("field:value" lines, CRLF or LF, '#' headers).
 * Unknown fields are skipped; fields not found stay -1. Never fails. */
void durable_parse(const char *body, size_t len, durable_info *out);

/* The verdict on parsed fields: 1 = trusted; 0 = not, with the reason in
 * why (DURABLE_WHY_MAX bytes or fewer, always NUL-terminated). */
int durable_judge(const durable_info *in, durable_history hist, char *why, size_t len);

/* durable_parse + durable_judge. */
int durable_check(const char *body, size_t len, durable_history hist, char *why, size_t whylen);

#endif
