/* backlog.c - holding requests while there is no usable master.
 *
 * A session whose next request has no link joins f->waiting; its held
 * bytes count against upstream.hold_max_bytes (the newest are refused past
 * it) and each held request against upstream.hold_timeout_ms (-TRYAGAIN).
 * A held blocking call also keeps its own timeout: when it runs out the
 * client gets what Redis answers on timeout, held or not. When a master is
 * UP again, every waiting session is dispatched, in order. */
#include "backlog.h"

#include <stdio.h>
#include <string.h>

#include "log.h"
#include "outage.h"
#include "router.h"
#include "upstream.h"

/* What s holds for lack of a master; f->held_bytes is the sum over sessions. */
static void backlog_set_held(session *s, size_t held)
{
    s->f->held_bytes = s->f->held_bytes - s->held_bytes + held;
    s->held_bytes = held;
}

void backlog_wait(session *s)
{
    if (!list_linked(&s->wait_node)) {
        list_add_tail(&s->f->waiting, &s->wait_node);
    }
}

void backlog_release(session *s)
{
    if (list_linked(&s->wait_node)) {
        list_del(&s->wait_node);
    }
    backlog_set_held(s, 0);
}

void backlog_hold(session *s)
{
    ferry *f = s->f;
    size_t held = 0;

    backlog_wait(s);
    for (list_node *m = s->cursor; m != &s->requests; m = m->next) {
        request *r = list_entry(m, request, sq);
        if (r->state == REQ_HELD) {
            held += buf_used(&r->data);
            if (r->flags & REQ_F_BLOCKING) {
                r->flags |= REQ_F_REARM; /* time held counts against its timeout */
            }
        }
    }
    backlog_set_held(s, held);
    stats_held(&f->stats, f->held_bytes);
    if (f->held_bytes <= f->cfg->hold_max_bytes) {
        return;
    }
    if (f->outage != NULL && f->up->state == UP_SWITCHING) {
        /* Full before fallback.after_ms: the fallback store takes over now;
         * what it does not take is refused at the next pass. */
        upstream_give_up(f->up, "the hold buffer is full (upstream.hold_max_bytes)");
        return;
    }
    /* Past the bound, the newest held requests are refused at once. */
    list_node *prev;
    for (list_node *m = s->requests.prev;
         m != &s->requests && f->held_bytes > f->cfg->hold_max_bytes; m = prev) {
        request *r = list_entry(m, request, sq);
        prev = m->prev; /* r may be written out and recycled below */
        if (r->state == REQ_HELD) {
            backlog_set_held(s, s->held_bytes - buf_used(&r->data));
            f->stats.requests_tryagain++;
            session_answer_str(s, r,
                               "-TRYAGAIN ferry: no master and the hold buffer is "
                               "full (upstream.hold_max_bytes)\r\n");
        }
    }
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
        session *s = list_entry(n, session, wait_node);
        list_del(n);
        router_dispatch(s);
    }
}

void backlog_tick(ferry *f, uint64_t now)
{
    const config *cfg = f->cfg;
    list_node *n, *t;

    list_foreach_safe(n, t, &f->waiting)
    {
        session *s = list_entry(n, session, wait_node);
        int answered = 0;
        list_node *next;
        for (list_node *m = s->cursor; m != &s->requests; m = next) {
            request *r = list_entry(m, request, sq);
            next = m->next; /* r may be written out and recycled below */
            if (r->state != REQ_HELD) {
                continue;
            }
            if (r->deadline != 0 && now >= r->deadline) {
                /* A blocked call's own timeout ran out while it was held. */
                const char *expired = r->cmd != NULL && (strcmp(r->cmd->name, "blmove") == 0 ||
                                                         strcmp(r->cmd->name, "brpoplpush") == 0)
                                          ? "$-1\r\n"
                                          : "*-1\r\n";
                f->stats.requests_timed_out_held++;
                session_answer_str(s, r, session_null(s, expired));
                answered = 1;
                continue;
            }
            if (now - r->held_since < cfg->hold_timeout_ms || outage_waits(f, r)) {
                continue; /* a blocked pop waiting on the fallback store keeps its own timeout */
            }
            char line[128];
            snprintf(line, sizeof(line), "-TRYAGAIN ferry: no master for %llu ms\r\n",
                     (unsigned long long)(now - f->up->down_since_ms));
            f->stats.requests_tryagain++;
            session_answer_str(s, r, line);
            answered = 1;
        }
        if (answered || f->up->state == UP_UP || (f->outage != NULL && f->up->state == UP_DOWN)) {
            /* A master is UP: retry what Redis refused; or the fallback
             * store may take what waits (at start-up, once after_ms ran out). */
            router_dispatch(s);
        }
    }
}
