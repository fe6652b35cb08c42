/* router_pubsub.c - pub/sub in cluster mode. A cluster carries PUBLISH to
 * every node over its bus, so a client's SUBSCRIBE and PSUBSCRIBE may live
 * on any master: ferry puts them on the first shard's master that is UP
 * (another one after a failover). A shard channel (SSUBSCRIBE) lives on the
 * master serving its slot, and SPUBLISH reaches only that shard: the
 * session's subscription link goes to the master of the slot of its first
 * SSUBSCRIBE, and is rebuilt there after a failover of that shard. One
 * client connection is one link to one node: a connection's shard channels
 * live on one shard (a cluster client opens one connection per node). */
#include "router_pubsub.h"

#include <stdio.h>
#include <string.h>

#include "clustermap.h"
#include "router.h"
#include "slot.h"
#include "upstream.h"

/* r is answered line (composed here, as router_classify.c does). */
static void refuse(request *r, const char *line)
{
    buf_clear(&r->reply);
    buf_append(&r->reply, line, strlen(line));
    r->route = RT_ERROR;
}

static int same_shard(clustermap *cm, int a, int b)
{
    if (a == b) {
        return 1;
    }
    if (a < 0 || b < 0) {
        return 0;
    }
    upstream *ua = clustermap_route(cm, a);
    return ua != NULL && ua == clustermap_route(cm, b);
}

int router_pubsub_classify(session *s, request *r, const resp_request *req)
{
    ferry *f = s->f;
    const command *cmd = r->cmd;
    int slot = -1;
    if (cmd->first_key > 0) {
        /* SSUBSCRIBE, SUNSUBSCRIBE: their channels are keys. */
        for (size_t i = 1; i < req->argc; i++) {
            int ks = slot_of_key(req->argv[i].ptr, req->argv[i].len);
            if (slot >= 0 && ks != slot) {
                refuse(r, "-CROSSSLOT Keys in request don't hash to the same slot\r\n");
                clustermap_count_crossslot(f->cluster);
                return 1;
            }
            slot = ks;
        }
    }
    int ssub = strcmp(cmd->name, "ssubscribe") == 0;
    if (ssub && req->argc < 2) {
        /* Redis' own answer, from here: it must not choose the master. */
        refuse(r, "-ERR wrong number of arguments for 'ssubscribe' command\r\n");
        return 1;
    }
    if (!session_extra_r(s)->ps_homed) {
        session_extra_w(s)->ps_homed = 1;
        session_extra_w(s)->ps_slot = ssub ? slot : -1;
    } else if (ssub && !same_shard(f->cluster, slot, session_extra_r(s)->ps_slot)) {
        char line[400];
        if (session_extra_r(s)->ps_slot < 0) {
            snprintf(line, sizeof(line),
                     "-ERR ferry: cluster mode: this connection's SUBSCRIBE/PSUBSCRIBE "
                     "subscriptions live on one master; SSUBSCRIBE (slot %d) on a connection "
                     "of its own\r\n",
                     slot);
        } else {
            snprintf(line, sizeof(line),
                     "-ERR ferry: cluster mode: this connection's shard channels live on the "
                     "shard of slot %d; SSUBSCRIBE channels of slot %d (another shard) on a "
                     "connection of their own\r\n",
                     session_extra_r(s)->ps_slot, slot);
        }
        refuse(r, line);
        f->stats.commands_denied++;
        return 1;
    }
    r->slot = session_extra_r(s)->ps_slot;
    if (s->subs == NULL) {
        s->subs = sub_sets_new();
    }
    if (strcmp(cmd->name, "sunsubscribe") == 0) {
        /* Redis answers one sunsubscribe per channel named, or per shard
         * channel the client has (one with no channel if none). */
        size_t all = s->subs->shards.n > 0 ? s->subs->shards.n : 1;
        session_extra_w(s)->ps_sunsub_owed += req->argc > 1 ? req->argc - 1 : all;
    }
    subs_track(&s->subs->channels, &s->subs->patterns, &s->subs->shards, cmd->name, req);
    return 0;
}

upstream *router_pubsub_view(session *s)
{
    ferry *f = s->f;
    if (f->cluster == NULL) {
        return f->up;
    }
    const session_extra *x = session_extra_r(s);
    upstream *up = clustermap_route(f->cluster, x->ps_homed ? x->ps_slot : -1);
    if (up != NULL && up == x->ps_left) {
        return NULL; /* it dropped the slot: wait for the map to name the new owner */
    }
    return up != NULL ? up : f->up;
}

/* "$<len>\r\n<name>\r\n" at p (n bytes): the name in *name, *len. */
static int read_bulk(const char *p, size_t n, const char **name, size_t *len)
{
    size_t v = 0, i = 1;
    if (n < 4 || p[0] != '$') {
        return 0;
    }
    while (i < n && p[i] >= '0' && p[i] <= '9' && v < ((size_t)1 << 32)) {
        v = v * 10 + (size_t)(p[i] - '0');
        i++;
    }
    if (i == 1 || n - i < 2 || p[i] != '\r' || p[i + 1] != '\n' || n - i - 2 < v + 2) {
        return 0;
    }
    *name = p + i + 2;
    *len = v;
    return 1;
}

int router_pubsub_dropped(session *s, const char *p, size_t n)
{
    static const char head2[] = "*3\r\n$12\r\nsunsubscribe\r\n";
    static const char head3[] = ">3\r\n$12\r\nsunsubscribe\r\n";
    size_t h = sizeof(head2) - 1;
    const char *name;
    size_t len;
    if (s->f->cluster == NULL || n <= h || (memcmp(p, head2, h) != 0 && memcmp(p, head3, h) != 0)) {
        return 0;
    }
    if (session_extra_r(s)->ps_sunsub_owed > 0) {
        session_extra_w(s)->ps_sunsub_owed--; /* the reply to the client's own SUNSUBSCRIBE */
        return 0;
    }
    if (s->subs == NULL || !read_bulk(p + h, n - h, &name, &len) ||
        !subs_has(&s->subs->shards, name, len)) {
        return 0; /* not a shard channel it is still subscribed to */
    }
    int slot = slot_of_key(name, len);
    const sub_set *set = &s->subs->shards;
    for (size_t i = 0; i < set->n; i++) {
        if (slot_of_key(set->v[i], set->l[i]) != slot) {
            /* Its other channels stay where they are: this one ends, as
             * the node says. */
            subs_del(&s->subs->shards, name, len);
            return 0;
        }
    }
    session_extra_w(s)->ps_slot = slot;
    return 1;
}

int router_pubsub_elsewhere(session *s, const request *r)
{
    if (s->f->cluster == NULL || s->dlink == NULL || r->slot < 0) {
        return 0;
    }
    return clustermap_route(s->f->cluster, r->slot) != s->dlink->up;
}
