/* backlog.c - holding requests while there is no usable master.
 *
 * A session whose next request has no link joins f->waiting; its requests
 * held for lack of a master are on its held list (held, oldest first, in
 * the session's extra state: a session that never held has none)
 * and in one deadline heap for all sessions (f->held_heap, by r->due), so
 * each step costs O(1), or O(log n) in the heap, per request, however
 * many are held:
 *   hold     a request joins once, when a dispatch first finds no master
 *            for it; each hold looks only at requests newer than those
 *            the last one looked at (held_upto);
 *   bound    held bytes count against upstream.hold_max_bytes: past it the
 *            session's newest held requests are refused (-TRYAGAIN), taken
 *            from the tail of its held list;
 *   timeout  each held request against upstream.hold_timeout_ms (-TRYAGAIN)
 *            and a held blocking call against its own timeout too (answered
 *            as Redis answers a timeout): the tick pops only what is due;
 *   release  a request that is sent or answered leaves both (its one state
 *            setter, request_set_state, calls backlog_forget).
 * When a master is UP again, every waiting session is dispatched, in order. */
#include "backlog.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "receipts.h"
#include "outage.h"
#include "tx.h"
#include "upstream.h"
#include "workers.h"

#define HEAP_MIN 64 /* entries the heap keeps allocated once it has grown */

/* ------------------------------------------------------------- the heap */

/* r is due before q (ties: the earlier request of its session first, so a
 * session's timeouts are answered in order and flushed at once). */
static int heap_before(const request *r, const request *q)
{
    return r->due < q->due || (r->due == q->due && r->seq < q->seq);
}

static void heap_put(ferry *f, size_t i, request *r)
{
    f->held_heap[i] = r;
    r->hpos = i + 1;
}

static void heap_up(ferry *f, size_t i)
{
    request *r = f->held_heap[i];
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (!heap_before(r, f->held_heap[parent])) {
            break;
        }
        heap_put(f, i, f->held_heap[parent]);
        i = parent;
    }
    heap_put(f, i, r);
}

static void heap_down(ferry *f, size_t i)
{
    request *r = f->held_heap[i];
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= f->nheld) {
            break;
        }
        if (c + 1 < f->nheld && heap_before(f->held_heap[c + 1], f->held_heap[c])) {
            c++;
        }
        if (!heap_before(f->held_heap[c], r)) {
            break;
        }
        heap_put(f, i, f->held_heap[c]);
        i = c;
    }
    heap_put(f, i, r);
}

static void heap_push(ferry *f, request *r)
{
    if (f->nheld == f->held_cap) {
        f->held_cap = f->held_cap == 0 ? HEAP_MIN : f->held_cap * 2;
        f->held_heap = xrealloc(f->held_heap, f->held_cap * sizeof(*f->held_heap));
    }
    f->held_heap[f->nheld++] = r;
    heap_up(f, f->nheld - 1);
}

static void heap_remove(ferry *f, request *r)
{
    size_t i = r->hpos - 1;
    request *last = f->held_heap[--f->nheld];
    r->hpos = 0;
    if (last != r) {
        heap_put(f, i, last);
        heap_up(f, i);
        heap_down(f, last->hpos - 1);
    }
    if (f->held_cap > HEAP_MIN && f->nheld < f->held_cap / 4) {
        f->held_cap /= 2;
        f->held_heap = xrealloc(f->held_heap, f->held_cap * sizeof(*f->held_heap));
    }
}

/* r's due time changed: move it to its place. */
static void heap_fix(ferry *f, request *r)
{
    heap_up(f, r->hpos - 1);
    heap_down(f, r->hpos - 1);
}

void backlog_free(ferry *f)
{
    ferry_assert(f->nheld == 0);
    free(f->held_heap);
    f->held_heap = NULL;
    f->held_cap = 0;
}

/* ---------------------------------------------------------- held requests */

/* What s holds for lack of a master; f->held_bytes is the sum over sessions. */
static void backlog_set_held(session *s, size_t held)
{
    session_extra *x = session_extra_w(s);
    s->f->held_bytes = s->f->held_bytes - x->held_bytes + held;
    workers_held_changed(s->f, (int64_t)held - (int64_t)x->held_bytes);
    x->held_bytes = held;
}

/* How long r may be held: upstream.hold_timeout_ms, or, refused with
 * NOREPLICAS by a master just back from a switch, as long as a write waits
 * for its replicas (durability.replicas_ack_hold_ms): Sentinel attaches a
 * demoted master as the new one's replica only ~10 s after the switch. */
static uint64_t hold_bound(const ferry *f, const request *r)
{
    if ((r->flags & REQ_F_REFUSED) && r->refusal != NULL && strcmp(r->refusal, "NOREPLICAS") == 0) {
        return f->cfg->replicas_ack_hold_ms;
    }
    return f->cfg->hold_timeout_ms;
}

/* When r is next looked at: its hold timeout, or its own timeout (a
 * blocking call) if that comes first. */
static uint64_t held_due(const ferry *f, const request *r)
{
    uint64_t due = r->held_since + hold_bound(f, r);
    if (request_verdict_data(r) || (r->flags & REQ_F_XSENT)) {
        /* Its data is delivered at the latest then, not a timeout's null
         * (an XREADGROUP sent before: the next master's pending list says
         * what it took, xreads.c). */
        return due;
    }
    return r->deadline != 0 && r->deadline < due ? r->deadline : due;
}

static int is_held(const request *r)
{
    return list_linked(&r->hq);
}

/* r joins s's held requests: at the tail (newest) or, when it is held again
 * after being sent, at the head. */
static void held_add(session *s, request *r, int newest)
{
    session_extra *x = session_extra_w(s);
    if (newest) {
        list_add_tail(&x->held, &r->hq);
    } else {
        list_add_head(&x->held, &r->hq);
    }
    r->held_charge = buf_used(&r->data);
    backlog_set_held(s, x->held_bytes + r->held_charge);
    if (r->flags & REQ_F_BLOCKING) {
        r->flags |= REQ_F_REARM; /* time held counts against its timeout */
    }
    r->due = held_due(s->f, r);
    heap_push(s->f, r);
}

void backlog_forget(request *r)
{
    session *s = r->s;
    list_del(&r->hq);
    if (r->hpos != 0) {
        heap_remove(s->f, r);
    }
    backlog_set_held(s, s->extra->held_bytes - r->held_charge); /* it held r */
    r->held_charge = 0;
}

void backlog_wait(session *s)
{
    session_extra *x = session_extra_w(s);
    if (!list_linked(&x->wait_node)) {
        list_add_tail(&s->f->waiting, &x->wait_node);
    }
}

void backlog_release(session *s)
{
    session_extra *x = s->extra;
    if (x == NULL) {
        return; /* it never waited nor held */
    }
    if (list_linked(&x->wait_node)) {
        list_del(&x->wait_node);
    }
    while (!list_empty(&x->held)) {
        backlog_forget(list_entry(list_first(&x->held), request, hq));
    }
    x->held_upto = 0;
    ferry_assert(x->held_bytes == 0);
}

void backlog_requeue(session *s, request *r)
{
    backlog_wait(s);
    if (s->extra->held_upto != 0 && !is_held(r)) { /* backlog_wait made it */
        /* s is holding already: the next hold looks only at newer
         * requests, so r joins now (it is older than every held one). */
        held_add(s, r, 0);
        stats_held(&s->f->stats, workers_held(s->f));
    }
}

void backlog_hold(session *s)
{
    ferry *f = s->f;

    backlog_wait(s);
    session_extra *x = s->extra; /* backlog_wait made it */
    if (s->cursor != &s->requests) {
        /* Held requests from the cursor up to the newest one looked at
         * before have joined (those held again joined at requeue): only
         * newer ones are looked at, walking back from the tail. */
        request *c = list_entry(s->cursor, request, sq);
        if (c->state == REQ_HELD && !is_held(c)) {
            held_add(s, c, list_empty(&x->held)); /* older than any held */
        }
        list_node *m = s->requests.prev;
        while (m != s->cursor && list_entry(m, request, sq)->seq >= x->held_upto) {
            m = m->prev;
        }
        for (m = m->next; m != &s->requests; m = m->next) {
            request *r = list_entry(m, request, sq);
            if (r->state == REQ_HELD && !is_held(r)) {
                held_add(s, r, 1);
            }
        }
        x->held_upto = list_entry(s->requests.prev, request, sq)->seq + 1;
    }
    /* The bound and the peak are for ferry as a whole (every loop's). */
    stats_held(&f->stats, workers_held(f));
    if (workers_held(f) <= f->cfg->hold_max_bytes) {
        return;
    }
    if (f->outage != NULL && f->up->state == UP_SWITCHING) {
        /* Full before fallback.after_ms: the fallback store takes over now;
         * what it does not take is refused at the next pass. */
        upstream_give_up(f->up, "the hold buffer is full (upstream.hold_max_bytes)");
        return;
    }
    /* Past the bound, the newest held requests are refused at once. */
    while (workers_held(f) > f->cfg->hold_max_bytes && !list_empty(&x->held)) {
        request *r = list_entry(x->held.prev, request, hq);
        f->stats.requests_tryagain++;
        s->f->session_ops->answer_str(s, r,
                                      "-TRYAGAIN ferry: no master and the hold buffer is "
                                      "full (upstream.hold_max_bytes)\r\n");
    }
}

/* r reached the hold bound: -TRYAGAIN, naming Redis' refusal when a master
 * is UP and refused it, the missing master otherwise. */
static void answer_tryagain(session *s, request *r, uint64_t now)
{
    ferry *f = s->f;
    char line[160];
    if ((r->flags & REQ_F_REFUSED) && (f->up->state == UP_UP || f->cluster != NULL)) {
        snprintf(line, sizeof(line), "-TRYAGAIN ferry: refused by Redis (%s) for %llu ms\r\n",
                 r->refusal != NULL ? r->refusal : "refused",
                 (unsigned long long)(now - r->held_since));
    } else {
        /* (Cluster mode: f->up is the view without a master; the shard's
         * own view may have lost it later: count from the hold.) */
        uint64_t since = f->cluster != NULL ? r->held_since : f->up->down_since_ms;
        snprintf(line, sizeof(line), "-TRYAGAIN ferry: no master for %llu ms\r\n",
                 (unsigned long long)(now - since));
    }
    f->stats.requests_tryagain++;
    receipts_undo(f, r); /* nothing applied, as -TRYAGAIN says */
    if (r->route == RT_MULTI) {
        tx_on_multi_refused(s, r);
    } else if (tx_in_multi(s)) {
        /* Not queued: EXEC must not run the transaction without it (it
         * aborts, as Redis' EXEC after a refused command). */
        session_extra_w(s)->tx_dirty = TX_DIRTY_FERRY;
    }
    s->f->session_ops->answer_str(s, r, line);
}

int backlog_refused(session *s, request *r, uint64_t now)
{
    if (!(r->flags & REQ_F_REFUSED)) {
        return 0;
    }
    if (now - r->held_since >= hold_bound(s->f, r)) {
        answer_tryagain(s, r, now);
        return 2;
    }
    return now < r->retry_at;
}

void backlog_wake_all(ferry *f)
{
    list_node batch;
    if (list_empty(&f->waiting)) {
        return;
    }
    /* Move the waiting list aside: dispatch may put sessions back on it. */
    batch.next = f->waiting.next;
    batch.prev = f->waiting.prev;
    batch.next->prev = &batch;
    batch.prev->next = &batch;
    list_init(&f->waiting);
    while (!list_empty(&batch)) {
        list_node *n = list_first(&batch);
        session *s = list_entry(n, session_extra, wait_node)->s;
        list_del(n);
        f->redispatch(s);
    }
}

void backlog_tick(ferry *f, uint64_t now)
{
    const config *cfg = f->cfg;
    list_node *n, *t;

    /* Only what is due: the heap's head, until it is in the future. */
    while (f->nheld > 0 && f->held_heap[0]->due <= now) {
        request *r = f->held_heap[0];
        session *s = r->s;
        if (request_verdict_data(r) && now - r->held_since >= cfg->hold_timeout_ms) {
            /* A pop's data whose verdict never came: delivered undecided
             * (at-least-once), never replaced by -TRYAGAIN. */
            r->flags &= ~REQ_F_VERDICT;
            f->stats.requests_ambiguous++;
            buf tmp = r->reply;
            buf_init(&r->reply);
            s->f->session_ops->answer(s, r, buf_head(&tmp), buf_used(&tmp));
            buf_free(&tmp);
        } else if (request_verdict_data(r)) {
            r->due = held_due(f, r); /* held again since it joined */
            heap_fix(f, r);
            continue;
        } else if (r->deadline != 0 && now >= r->deadline && !(r->flags & REQ_F_XSENT)) {
            /* A blocked call's own timeout ran out while it was held. Had
             * its receipt move applied (the reply lost with its link), the
             * item goes back to its queue on the next master (receipts.c). */
            receipts_undo(f, r);
            const char *expired = r->cmd != NULL && (strcmp(r->cmd->name, "blmove") == 0 ||
                                                     strcmp(r->cmd->name, "brpoplpush") == 0)
                                      ? "$-1\r\n"
                                      : "*-1\r\n";
            f->stats.requests_timed_out_held++;
            s->f->session_ops->answer_str(s, r, session_null(s, expired));
        } else if (now - r->held_since < hold_bound(f, r)) {
            r->due = held_due(f, r); /* held again since it joined */
            heap_fix(f, r);
            continue;
        } else if (outage_waits(f, r)) {
            /* A blocked pop waiting on the fallback store keeps its own
             * timeout; looked at again after another hold timeout. */
            r->due = now + cfg->hold_timeout_ms;
            if (r->deadline != 0 && r->deadline < r->due) {
                r->due = r->deadline;
            }
            heap_fix(f, r);
            continue;
        } else {
            answer_tryagain(s, r, now);
        }
        /* Written out in order; the fallback store may take what follows. */
        f->redispatch(s);
    }
    if (f->up->state == UP_UP || f->up->state == UP_DOWN) {
        /* A master is UP: retry what Redis refused, once its back-off ran
         * (backlog_refused); or, DOWN, the fallback store may take what waits
         * and ferry answers PING, ECHO and INFO (at start-up, once after_ms
         * ran out). */
        list_foreach_safe(n, t, &f->waiting)
        {
            f->redispatch(list_entry(n, session_extra, wait_node)->s);
        }
    }
}
