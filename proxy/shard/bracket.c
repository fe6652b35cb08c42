/* bracket.c - the decision of bracket.h.
 *
 * The facts (Redis 7.0, replication.c):
 * - A master numbers the bytes of its replication stream from 1;
 *   master_repl_offset (ROLE's second element) is the number of the last
 *   byte written, so the next write's first byte is master_repl_offset + 1.
 *   A command's propagation is fed into the stream before the next command
 *   of the same connection runs, so a ROLE answered after a request returns
 *   an offset at or past the request's last byte (hi), and a ROLE answered
 *   before it returns an offset below its first byte (its first byte is at
 *   least lo + 1). Other connections' writes only widen the bracket.
 * - A replica promoted to master shifts its replication id:
 *   replid2 = the old master's replid, second_replid_offset =
 *   master_repl_offset + 1, where master_repl_offset is the last byte of the
 *   old stream it applied. So the new master holds bytes 1 .. S - 1 of the
 *   old stream (S = second_repl_offset) and none from S on.
 *
 * Hence, with S - 1 = the last byte shared:
 *   hi <= S - 1      : the request's last byte is shared: APPLIED.
 *   lo + 1 >= S,
 *   i.e. lo >= S - 1 : its first byte is past what is shared: NOT_APPLIED.
 *   otherwise        : the boundary may fall inside it: AMBIGUOUS.
 * On the boundary: hi == S - 1 is APPLIED (the last byte shared is the
 * request's last or later); lo == S - 1 is NOT_APPLIED (the first byte not
 * shared, S, is at or before the request's first, lo + 1). Both hold only
 * when lo == hi == S - 1, a request that propagated nothing (a pop that
 * found nothing): it is on the new master as much as it is anywhere, and
 * APPLIED (checked first) delivers its reply without re-sending it.
 *
 * What makes it AMBIGUOUS besides: offsets of different replication ids
 * are not comparable (the new master's replid2 is not the id the offsets
 * were read under: a different history, or a backlog freed and created
 * again, which changes the id); a master without a backlog does not move
 * its offset (every bracket would look empty); an offset not learned. */
#include "bracket.h"

#include <string.h>

static int replid_equal(const char *a, const char *b)
{
    return a != NULL && b != NULL && strlen(a) == BRACKET_REPLID_LEN &&
           strlen(b) == BRACKET_REPLID_LEN && memcmp(a, b, BRACKET_REPLID_LEN) == 0;
}

bracket_verdict bracket_decide(const bracket *b, const bracket_heir *h)
{
    if (b == NULL || h == NULL || !b->backlog || h->second < 1 ||
        !replid_equal(b->replid, h->replid2)) {
        return BRACKET_AMBIGUOUS;
    }
    long long shared = h->second - 1; /* the last byte of the old stream it holds */
    if (b->hi == 0 || (b->lo >= 0 && b->hi >= 0 && b->hi < b->lo)) {
        /* An offset still 0 after a write: nothing was ever fed to a
         * backlog (a master with replicas has at least their PINGs). A hi
         * below lo: not one history. */
        return BRACKET_AMBIGUOUS;
    }
    if (b->hi >= 0 && b->hi <= shared) {
        return BRACKET_APPLIED;
    }
    if (b->lo >= 0 && b->lo >= shared) {
        return BRACKET_NOT_APPLIED;
    }
    return BRACKET_AMBIGUOUS;
}

/* Applied: it is there, never again. Not applied: again (a pop's item is
 * still there). Ambiguous: a pop's item is delivered (sent again, the pop
 * could take a second item and the first would be lost); anything else is
 * sent again (at least once: a duplicate rather than a loss), a write's
 * data reply too: delivered, an add's id (XADD, a queue library's add
 * script) that the next master lacks would be an acknowledged job lost;
 * sent again, it is at worst there twice, and a script that moves an item
 * (a reliable-queue pop, BullMQ's moveToActive) leaves it where the
 * queue's own recovery finds it. */
int bracket_delivers(bracket_verdict v, int taken)
{
    return v == BRACKET_APPLIED || (v == BRACKET_AMBIGUOUS && taken);
}

const char *bracket_verdict_name(bracket_verdict v)
{
    switch (v) {
    case BRACKET_APPLIED:
        return "applied";
    case BRACKET_NOT_APPLIED:
        return "not applied";
    default:
        return "ambiguous";
    }
}
