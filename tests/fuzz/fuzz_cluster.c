/* fuzz_cluster.c - libFuzzer target for cluster/slotmap.c: the input's first
 * byte picks a parser (CLUSTER SHARDS, CLUSTER SLOTS, CLUSTER NODES), the
 * rest is the reply (RESP, framed by ferry's scanner then read by hiredis'
 * reader, as sconn.c does: hiredis alone would allocate whatever array
 * length a header claims) or the NODES text. Whatever it is: no crash, an error or a map whose
 * owners are valid shard indexes with slot counts that add up, and merging a map twice changes
 * nothing the second time. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "resp.h"
#include "slotmap.h"

static void check(int ok)
{
    if (!ok) {
        abort();
    }
}

static void check_map(const slotmap *m)
{
    int count[SLOTMAP_MAX_SHARDS] = {0};
    check(m->nshards >= 0 && m->nshards <= SLOTMAP_MAX_SHARDS);
    for (int s = 0; s < CLUSTER_SLOTS; s++) {
        check(m->owner[s] >= -1 && m->owner[s] < m->nshards);
        if (m->owner[s] >= 0) {
            count[m->owner[s]]++;
        }
    }
    for (int k = 0; k < m->nshards; k++) {
        check(m->shards[k].nslots == count[k]);
        check(m->shards[k].nreplicas >= 0 && m->shards[k].nreplicas <= SLOTMAP_MAX_REPLICAS);
        check(memchr(m->shards[k].master.host, '\0', sizeof(m->shards[k].master.host)) != NULL);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static slotmap m, cur;
    static slotmap_nodeinfo nodes[SLOTMAP_MAX_NODES];
    char err[200];
    int n = 0, changed = 0;

    if (size < 1) {
        return 0;
    }
    int sel = data[0] % 3, tls = data[0] & 8; /* tls: the SHARDS reply came over TLS */
    data++;
    size--;
    if (sel == 2) {
        if (slotmap_nodes_parse((const char *)data, size, nodes, SLOTMAP_MAX_NODES, &n, err,
                                sizeof(err)) == 0) {
            check(n > 0 && n <= SLOTMAP_MAX_NODES);
        }
        return 0;
    }
    resp_scanner sc;
    size_t framed = 0;
    resp_scanner_init(&sc);
    if (resp_scan_reply(&sc, (const char *)data, size, &framed) != RESP_OK) {
        return 0;
    }
    redisReader *rd = redisReaderCreate();
    void *reply = NULL;
    check(rd != NULL);
    if (redisReaderFeed(rd, (const char *)data, framed) == REDIS_OK &&
        redisReaderGetReply(rd, &reply) == REDIS_OK && reply != NULL) {
        int rc = sel == 0 ? slotmap_from_shards(&m, reply, tls, err, sizeof(err))
                          : slotmap_from_slots(&m, reply, err, sizeof(err));
        check(rc == 0 || rc == -1);
        check_map(&m);
        if (rc == 0) {
            slotmap_init(&cur);
            slotmap_merge(&cur, &m, &changed);
            check_map(&cur);
            check(slotmap_merge(&cur, &m, &changed) == 0);
            check(changed == 0);
        } else {
            check(m.nshards == 0);
        }
        freeReplyObject(reply);
    }
    redisReaderFree(rd);
    return 0;
}
