/* split.h - cluster mode: a multi-key command whose keys span slots (MGET,
 * MSET, DEL, UNLINK, EXISTS, TOUCH) cut into one part per slot, each part
 * the same command with that slot's keys in the client's order. The router
 * sends the parts one after the other, each to its slot's master with that
 * master's hold and retry policy, and folds their replies here into the one
 * reply a single server gives: MGET an array in the client's key order,
 * MSET +OK once every part is OK, the others the sum of the integers. A
 * part's error is the reply, and the parts after it are not sent. No I/O:
 * replies are pushed in. */
#ifndef FERRY_SPLIT_H
#define FERRY_SPLIT_H

#include <stddef.h>

#include "buf.h"
#include "command.h"
#include "resp.h"

/* How the parts' replies make the client's. */
typedef enum split_kind {
    SPLIT_NONE = 0, /* not split: a node refuses it across slots (CROSSSLOT) */
    SPLIT_ARRAY,    /* MGET: the parts' elements, in the client's key order */
    SPLIT_OK,       /* MSET: +OK once every part is OK */
    SPLIT_SUM       /* DEL, UNLINK, EXISTS, TOUCH: the sum of the integers */
} split_kind;

typedef struct split_part {
    int slot;     /* the slot of its keys */
    size_t first; /* its keys: order[first .. first + n) */
    size_t n;
} split_part;

typedef struct split {
    split_kind kind;
    int step;          /* keys' stride in the arguments: 1, 2 for MSET */
    size_t nkeys;      /* keys as the client named them (repeats count) */
    size_t *order;     /* key indexes (0..nkeys-1), grouped by part */
    split_part *parts; /* by slot, ascending */
    size_t nparts;
    size_t next;   /* the part whose reply comes next */
    int built;     /* the part whose bytes were last encoded, -1 none */
    int failed;    /* a part's error is the reply: stop */
    buf args;      /* the command name and the key (and value) bytes */
    size_t *aoff;  /* argument i (0: the name, then key-major) in args */
    size_t *alen;  /* its length */
    long long sum; /* SPLIT_SUM so far */
    buf vals;      /* SPLIT_ARRAY: the elements received, as sent */
    size_t *voff;  /* key i's element in vals ((size_t)-1: not yet) */
    size_t *vlen;  /* its length */
    buf reply;     /* the client's reply once done */
} split;

/* Whether cmd is split across slots in cluster mode, and how. */
split_kind split_kind_of(const command *cmd);
/* A split of req (cmd's arguments; its keys span slots). NULL when it
 * cannot be split as a node would run it (MSET with a key lacking its
 * value: any node answers the arity error). */
split *split_new(split_kind kind, const resp_request *req);
void split_free(split *sp); /* accepts NULL */
/* The slot of the part to send now. */
int split_slot(const split *sp);
/* The part to send now, encoded as a request (RESP multibulk) into out
 * (cleared first). */
void split_encode(split *sp, buf *out);
/* The reply (p, n: one complete RESP reply) to the part sent now, folded.
 * Returns 1 while parts are left to send (the next one is now current), 0
 * once sp->reply is the client's reply (every part replied, or a part's
 * error, or a reply that cannot be folded: a ferry error says so). */
int split_fold(split *sp, const char *p, size_t n);

#endif
