/* instance.h - a ferry's stable identity, its heartbeat in Redis, and the
 * receipts of dead processes claimed and settled (instance.c). */
#ifndef FERRY_INSTANCE_H
#define FERRY_INSTANCE_H

#include "config.h"
#include "ferry.h"

/* The exit status of a ferry that found its instance name held by another
 * live process. */
#define INSTANCE_EXIT_TAKEN 4

struct instance;

/* Once per process, before its loops start (the main loop's context keeps
 * it, each worker's points at it): the instance's name (instance.name, or
 * derived from the host name and the first listen address) and this
 * process's token. adopted: the process takes over from one of the same
 * instance (--takeover): it shares the heartbeat and puts nothing of its
 * predecessor's back. */
struct instance *instance_new(const config *cfg, int adopted);
void instance_free(struct instance *in);

/* "<name>:<process token>": the part of receipt names that says whose they
 * are (receipts.c adds the loop and the receipt's number). */
const char *instance_receipt_owner(const ferry *f);

/* The instance's name (instance.name as resolved; "" before setup). */
const char *instance_own_name(const ferry *f);

/* Periodic (the main loop's tick; nothing on a worker's): the heartbeat,
 * the own instance's receipts of an earlier process settled once, and
 * dead peers' claimed. */
void instance_tick(ferry *f, uint64_t now);

#endif
