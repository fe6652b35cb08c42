/* bracket.h - was a request applied on the master promoted after a
 * failover? A pure decision from the old master's replication offsets
 * around the request (its bracket) and what the new master says of the
 * history it shares with the old one. No I/O, no context. */
#ifndef FERRY_BRACKET_H
#define FERRY_BRACKET_H

#define BRACKET_REPLID_LEN 40  /* a Redis replication id: 40 hex characters */
#define BRACKET_UNKNOWN (-1LL) /* an offset not learned */

typedef enum bracket_verdict {
    BRACKET_AMBIGUOUS = 0, /* cannot tell: today's at-least-once policy applies */
    BRACKET_APPLIED,       /* every byte the request propagated is on the new master */
    BRACKET_NOT_APPLIED    /* no byte of it is on the new master */
} bracket_verdict;

/* One request as the old master saw it. */
typedef struct bracket {
    const char *replid; /* the old master's replid when the offsets were read; NULL unknown */
    int backlog;        /* that master had a replication backlog (its offset moves) */
    long long lo;       /* its offset before the request (a ROLE answered before it); -1 unknown */
    long long hi;       /* its offset after the request (a ROLE answered after it); -1 unknown */
} bracket;

/* What the new master says (INFO replication): master_replid2 and
 * second_repl_offset; replid2 NULL or second < 1 when it has no second id. */
typedef struct bracket_heir {
    const char *replid2;
    long long second;
} bracket_heir;

bracket_verdict bracket_decide(const bracket *b, const bracket_heir *h);
const char *bracket_verdict_name(bracket_verdict v);

/* What becomes of a request's held reply on verdict v: delivered (1) or
 * dropped and the request sent again (0). taken: the reply carries data the
 * request took out of Redis (a pop's item), not data a write made (XADD's
 * id) nor a script's return value (either: ferry cannot tell). */
int bracket_delivers(bracket_verdict v, int taken);

#endif
