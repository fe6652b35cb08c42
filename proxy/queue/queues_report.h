/* queues_report.h - ferry --queues: what Redis holds for the queues:
 * entries of a configuration (lengths, processing lists, open leases, dead
 * letters, paused consumers), read from the master it names, for an
 * operator. A command-line tool: blocking calls, no event loop. */
#ifndef FERRY_QUEUES_REPORT_H
#define FERRY_QUEUES_REPORT_H

#include <stdio.h>

#include "config.h"

/* Print the report to out. Returns 0, or -1 with err set. */
int queues_report(const config *cfg, FILE *out, char *err, size_t errlen);

#endif
