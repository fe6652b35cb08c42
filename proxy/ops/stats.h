/* stats.h - every statistic ferry keeps, declared once in FERRY_STATS: the
 * context's counters struct, the stats port's JSON and Prometheus output and
 * `ferry --describe-stats` are all generated from that one list. Stats are
 * updated on the loop only; the stats port is a listener on the same loop. */
#ifndef FERRY_STATS_H
#define FERRY_STATS_H

#include <stdint.h>
#include <stdio.h>

#include "config.h"

struct buf;
struct command;
struct ferry;

/* What a stat is, which decides its field type and how it is printed. */
typedef enum stat_type {
    STAT_COUNTER = 0, /* only grows; Prometheus counter */
    STAT_GAUGE,       /* a number that goes up and down */
    STAT_MSEC,        /* a gauge kept in milliseconds; Prometheus gets seconds */
    STAT_BOOL,        /* 0 or 1; JSON true/false, Prometheus gauge */
    STAT_TEXT,        /* a string; JSON string, Prometheus label of an info gauge */
    STAT_HISTOGRAM,   /* a latency distribution (buckets in microseconds) */
    STAT_NODES        /* JSON only: an array with one object per node, built
                         from the context when printed; the field holds the count */
} stat_type;

/* The stat list: X(section, name, type, prometheus name, help).
 *  - section groups stats in the JSON document ("top" is its top level,
 *    nutcracker's keys); entries of one section stay together;
 *  - name is the field in ferry_stats and the JSON key;
 *  - the Prometheus name is "" for JSON-only entries; TEXT entries with the
 *    same Prometheus name become the labels of one info gauge (value 1);
 *  - gauges marked (live) are computed from the context when printed. */
#define FERRY_STATS(X)                                                                             \
    X(top, service, TEXT, "ferry_info", "always \"ferry\" (live)")                                 \
    X(top, source, TEXT, "ferry_info", "host name (live)")                                         \
    X(top, version, TEXT, "ferry_info", "ferry version (live)")                                    \
    X(top, instance, TEXT, "ferry_info",                                                           \
      "instance.name as resolved: the name its receipts and heartbeat go by (live)")               \
    X(top, uptime, GAUGE, "ferry_uptime_seconds", "seconds since ferry started (live)")            \
    X(top, timestamp, GAUGE, "", "unix time of this report, seconds (live)")                       \
    X(top, workers, GAUGE, "ferry_workers",                                                        \
      "event loops serving clients (workers); counters and gauges are their sum, the master "      \
      "view, failover and durability figures the main loop's (live)")                              \
    X(top, worker_loops, NODES, "",                                                                \
      "per event loop, the main one first: clients, commands_total, held_bytes, links_open, "      \
      "upstream_up, epoch, master (published by each loop when the stats are read) (live)")        \
    X(top, total_connections, COUNTER, "",                                                         \
      "client connections accepted; same as clients.clients_total (live)")                         \
    X(top, curr_connections, GAUGE, "ferry_client_connections", "client connections open (live)")  \
                                                                                                   \
    X(clients, clients_total, COUNTER, "ferry_clients_total", "client connections accepted")       \
    X(clients, clients_rejected, COUNTER, "ferry_clients_rejected_total",                          \
      "client connections refused at client.max_clients")                                          \
    X(clients, clients_tls_on_plain_port, COUNTER, "ferry_clients_tls_on_plain_port_total",        \
      "clients closed for starting a TLS handshake on a plain port (listen, not listen_tls)")      \
    X(clients, clients_output_limit_closed, COUNTER, "ferry_clients_output_limit_closed_total",    \
      "clients closed at client.output_limit or client.pubsub_output_limit")                       \
    X(clients, clients_request_timeout, COUNTER, "ferry_clients_request_timeout_total",            \
      "clients closed because a request did not arrive whole within client.request_timeout_ms")    \
    X(clients, clients_paused, GAUGE, "ferry_clients_paused",                                      \
      "clients ferry is not reading from for backpressure: client.max_pending_bytes, "             \
      "client.max_pipeline (live)")                                                                \
                                                                                                   \
    X(memory, memory_clients, GAUGE, "ferry_memory_clients_bytes",                                 \
      "bytes held for clients as allocated: sessions, requests, replies, buffers (live)")          \
    X(memory, memory_rss, GAUGE, "ferry_memory_rss_bytes",                                         \
      "resident set size of the ferry process (live)")                                             \
                                                                                                   \
    X(limits, max_memory, GAUGE, "ferry_limit_max_memory_bytes",                                   \
      "limits.max_memory: bytes held for all clients before new requests get -OOM, 0 = none "      \
      "(live)")                                                                                    \
    X(limits, max_clients, GAUGE, "ferry_limit_max_clients",                                       \
      "client.max_clients: client connections ferry accepts at once (live)")                       \
    X(limits, max_pending_bytes, GAUGE, "ferry_limit_max_pending_bytes",                           \
      "client.max_pending_bytes: memory per client before ferry stops reading it (live)")          \
    X(limits, max_pipeline, GAUGE, "ferry_limit_max_pipeline",                                     \
      "client.max_pipeline: requests in flight per client before ferry stops reading it (live)")   \
    X(limits, request_timeout_ms, MSEC, "ferry_limit_request_timeout_seconds",                     \
      "client.request_timeout_ms: time a request may take to arrive whole, 0 = none (live)")       \
    X(limits, output_limit_hard, GAUGE, "ferry_limit_output_hard_bytes",                           \
      "client.output_limit.hard, 0 = none (live)")                                                 \
    X(limits, output_limit_soft, GAUGE, "ferry_limit_output_soft_bytes",                           \
      "client.output_limit.soft, 0 = none (live)")                                                 \
    X(limits, output_limit_soft_seconds, GAUGE, "ferry_limit_output_soft_seconds",                 \
      "client.output_limit.soft_seconds (live)")                                                   \
    X(limits, pubsub_output_limit_hard, GAUGE, "ferry_limit_pubsub_output_hard_bytes",             \
      "client.pubsub_output_limit.hard, 0 = none (live)")                                          \
    X(limits, pubsub_output_limit_soft, GAUGE, "ferry_limit_pubsub_output_soft_bytes",             \
      "client.pubsub_output_limit.soft, 0 = none (live)")                                          \
    X(limits, pubsub_output_limit_soft_seconds, GAUGE, "ferry_limit_pubsub_output_soft_seconds",   \
      "client.pubsub_output_limit.soft_seconds (live)")                                            \
                                                                                                   \
    X(commands, commands_total, COUNTER, "ferry_commands_total", "requests parsed from clients")   \
    X(commands, class_stateless, COUNTER, "ferry_commands_class_stateless_total",                  \
      "requests of the stateless class (the shared link)")                                         \
    X(commands, class_blocking, COUNTER, "ferry_commands_class_blocking_total",                    \
      "requests of the blocking class (BLPOP, BRPOP, XREAD...)")                                   \
    X(commands, class_pubsub, COUNTER, "ferry_commands_class_pubsub_total",                        \
      "requests of the pub/sub class (SUBSCRIBE, PUBLISH...)")                                     \
    X(commands, class_transaction, COUNTER, "ferry_commands_class_transaction_total",              \
      "requests of the transaction class (MULTI, EXEC, WATCH...)")                                 \
    X(commands, class_connstate, COUNTER, "ferry_commands_class_connstate_total",                  \
      "requests of the connection-state class (SELECT, CLIENT SETNAME, MONITOR...)")               \
    X(commands, class_local, COUNTER, "ferry_commands_class_local_total",                          \
      "requests of the local class (AUTH, HELLO, QUIT, RESET)")                                    \
    X(commands, class_denied, COUNTER, "ferry_commands_class_denied_total",                        \
      "requests of the denied class (SHUTDOWN, REPLICAOF...)")                                     \
    X(commands, class_unknown, COUNTER, "ferry_commands_class_unknown_total",                      \
      "requests naming a command Redis 7.0 does not have")                                         \
    X(commands, commands_local, COUNTER, "ferry_commands_local_total",                             \
      "requests answered by ferry itself")                                                         \
    X(commands, commands_denied, COUNTER, "ferry_commands_denied_total",                           \
      "requests refused (deny list, CONFIG SET of enforced settings)")                             \
    X(commands, multipop_calls, COUNTER, "ferry_multipop_calls_total",                             \
      "blocking pops (BLPOP, BRPOP, BZPOPMIN, BZPOPMAX) over keys of several slots served as "     \
      "one call: the priority pop across slots (0 outside cluster mode)")                          \
    X(commands, multipop_put_back, COUNTER, "ferry_multipop_put_back_total",                       \
      "items a cancelled pop of such a call took anyway, pushed back to the end they came from "   \
      "(0 outside cluster mode)")                                                                  \
    X(commands, multipop_unconfirmed, COUNTER, "ferry_multipop_unconfirmed_total",                 \
      "of such calls, items delivered and put-backs left although fewer than "                     \
      "durability.replicas_ack replicas confirmed them (0 outside cluster mode)")                  \
                                                                                                   \
    X(errors, protocol_errors, COUNTER, "ferry_protocol_errors_total",                             \
      "clients closed for malformed input or an oversized query")                                  \
    X(errors, upstream_errors, COUNTER, "ferry_upstream_errors_total",                             \
      "links to Redis that failed (connect, timeout, authentication, I/O)")                        \
    X(errors, requests_retried, COUNTER, "ferry_requests_retried_total",                           \
      "requests re-sent after a lost link")                                                        \
    X(errors, requests_retried_unknown, COUNTER, "ferry_requests_retried_unknown_total",           \
      "writes re-sent whose outcome on the lost master was unknown (at-least-once)")               \
    X(errors, requests_refused, COUNTER, "ferry_requests_refused_total",                           \
      "refusals by Redis without effect (READONLY, LOADING, ...) held to be sent again")           \
    X(errors, requests_timed_out_held, COUNTER, "ferry_requests_timed_out_held_total",             \
      "blocking calls whose own timeout ran out while held for a master (answered nil)")           \
    X(errors, replies_unconfirmed, COUNTER, "ferry_replies_unconfirmed_total",                     \
      "replies carrying data released although replicas_ack was not confirmed")                    \
    X(errors, transactions_rebuilt, COUNTER, "ferry_transactions_rebuilt_total",                   \
      "open MULTI transactions rebuilt on a new link after a lost one")                            \
    X(errors, transactions_watch_lost, COUNTER, "ferry_transactions_watch_lost_total",             \
      "EXEC answered with the null reply because the WATCH was lost with its link")                \
    X(errors, scripts_reloaded, COUNTER, "ferry_scripts_reloaded_total",                           \
      "SCRIPT LOADs of a remembered script ferry sent ahead of an EVALSHA on a link that "         \
      "had not carried it (once per link and script; a promoted master's links, a flushed "        \
      "server's)")                                                                                 \
    X(errors, noscript_resent, COUNTER, "ferry_noscript_resent_total",                             \
      "EVALSHAs answered NOSCRIPT that ferry sent again with their script loaded ahead "           \
      "(the client never saw that NOSCRIPT)")                                                      \
    X(errors, requests_tryagain, COUNTER, "ferry_requests_tryagain_total",                         \
      "requests answered -TRYAGAIN (no master, or Redis refusing, for hold_timeout_ms; hold "      \
      "buffer full)")                                                                              \
    X(errors, requests_failed, COUNTER, "ferry_requests_failed_total",                             \
      "requests answered with an error after their link was lost (retries used up, transaction)")  \
    X(errors, requests_oom, COUNTER, "ferry_requests_oom_total",                                   \
      "requests answered -OOM because ferry was over limits.max_memory")                           \
    X(errors, auth_failures, COUNTER, "ferry_auth_failures_total",                                 \
      "client AUTH or HELLO AUTH with a wrong password")                                           \
    X(errors, redis_errors, COUNTER, "ferry_redis_errors_total",                                   \
      "error replies from Redis passed on to clients")                                             \
                                                                                                   \
    X(tls, tls_handshakes, COUNTER, "ferry_tls_handshakes_total",                                  \
      "TLS handshakes finished on the listen_tls listeners (live)")                                \
    X(tls, tls_sessions_resumed, COUNTER, "ferry_tls_sessions_resumed_total",                      \
      "of those, TLS sessions resumed (a ticket or session id) (live)")                            \
    X(tls, tls_failed_timeout, COUNTER, "ferry_tls_handshake_timeouts_total",                      \
      "TLS clients closed: handshake not done within tls.handshake_timeout_ms (live)")             \
    X(tls, tls_failed_not_tls, COUNTER, "ferry_tls_failed_not_tls_total",                          \
      "TLS handshakes failed: the client did not speak TLS (plain RESP, HTTP) (live)")             \
    X(tls, tls_failed_certificate, COUNTER, "ferry_tls_failed_certificate_total",                  \
      "TLS handshakes failed: a client certificate missing or refused (live)")                     \
    X(tls, tls_failed_protocol, COUNTER, "ferry_tls_failed_protocol_total",                        \
      "TLS handshakes failed: protocol version, cipher or another TLS error (live)")               \
    X(tls, tls_failed_closed, COUNTER, "ferry_tls_failed_closed_total",                            \
      "TLS handshakes failed: the client closed the connection mid-handshake (live)")              \
    X(tls, tls_listeners, NODES, "",                                                               \
      "per listen_tls address: address, handshakes, sessions_resumed and failed (by reason)")      \
    X(tls, tls_reloads, COUNTER, "ferry_tls_reloads_total",                                        \
      "certificate reloads (SIGHUP) that took, every TLS role (live)")                             \
    X(tls, tls_reload_failures, COUNTER, "ferry_tls_reload_failures_total",                        \
      "certificate reloads refused: the old files stay (live)")                                    \
    X(tls, tls_upstream_handshakes, COUNTER, "ferry_tls_upstream_handshakes_total",                \
      "TLS handshakes finished with Redis nodes and sentinels (live)")                             \
    X(tls, tls_upstream_failures, COUNTER, "ferry_tls_upstream_failures_total",                    \
      "TLS handshakes failed with Redis nodes and sentinels (live)")                               \
                                                                                                   \
    X(latency, request_duration_seconds, HISTOGRAM, "ferry_request_duration_seconds",              \
      "client-seen latency of requests Redis answered, parse to reply (blocking calls included)")  \
    X(latency, upstream_duration_seconds, HISTOGRAM, "ferry_upstream_duration_seconds",            \
      "Redis round trip of those requests, send to reply")                                         \
                                                                                                   \
    X(upstream, upstream_up, BOOL, "ferry_upstream_up",                                            \
      "1 while a verified master answers (live)")                                                  \
    X(upstream, upstream_state, TEXT, "ferry_upstream_info", "UP, SWITCHING or DOWN (live)")       \
    X(upstream, master_addr, TEXT, "ferry_upstream_info",                                          \
      "address of the master, empty if none is known (live)")                                      \
    X(upstream, epoch, GAUGE, "ferry_upstream_epoch",                                              \
      "bumped each time ferry follows a new master (live)")                                        \
    X(upstream, connected_since, GAUGE, "ferry_upstream_connected_since_timestamp_seconds",        \
      "unix time the master last came UP, 0 while DOWN (live)")                                    \
    X(upstream, down_for_ms, MSEC, "ferry_upstream_down_for_seconds",                              \
      "how long there has been no UP master, 0 while UP (live)")                                   \
    X(upstream, links_open, GAUGE, "ferry_links_open",                                             \
      "connections to Redis open: shared, lent and pooled (live)")                                 \
    X(upstream, links_opened, COUNTER, "ferry_links_opened_total", "connections to Redis opened")  \
    X(upstream, links_opened_dedicated, COUNTER, "ferry_links_opened_dedicated_total",             \
      "of those, dedicated links (lent to one client, or to ferry's own calls), opened when the "  \
      "pool had no idle one")                                                                      \
    X(upstream, links_opened_for_blocking, COUNTER, "ferry_links_opened_for_blocking_total",       \
      "of the dedicated, for a client's blocking call (BLPOP, BLMOVE, BZPOPMIN, XREAD BLOCK...)")  \
    X(upstream, links_opened_for_script, COUNTER, "ferry_links_opened_for_script_total",           \
      "of the dedicated, for a client's script or function call (EVAL, EVALSHA, FCALL...)")        \
    X(upstream, links_opened_for_transaction, COUNTER, "ferry_links_opened_for_transaction_total", \
      "of the dedicated, for a client's transaction (MULTI, WATCH)")                               \
    X(upstream, links_opened_for_state, COUNTER, "ferry_links_opened_for_state_total",             \
      "of the dedicated, for a client's connection state (SELECT, CLIENT SETNAME, SUBSCRIBE, "     \
      "MONITOR...)")                                                                               \
    X(upstream, pool_idle, GAUGE, "ferry_links_pool_idle", "idle dedicated links pooled (live)")   \
    X(upstream, held_bytes, GAUGE, "ferry_held_bytes",                                             \
      "request bytes held for lack of a master (live)")                                            \
                                                                                                   \
    X(failover, failovers, COUNTER, "ferry_failovers_total",                                       \
      "times the master was lost or switched: UP to DOWN or SWITCHING (live)")                     \
    X(failover, failover_last_ms, MSEC, "ferry_failover_last_duration_seconds",                    \
      "how long the last failover or outage lasted, until a master was UP again (live)")           \
    X(failover, failover_longest_ms, MSEC, "ferry_failover_longest_duration_seconds",              \
      "the longest failover or outage (live)")                                                     \
    X(failover, failover_last_reason, TEXT, "ferry_failover_info",                                 \
      "why the master was last lost or switched (live)")                                           \
    X(failover, decided_applied, COUNTER, "ferry_failover_decided_applied_total",                  \
      "writes and pops a failover left with an unknown outcome that their offset brackets place "  \
      "on the next master (a write answered but unconfirmed: its reply delivered, not sent "       \
      "again)")                                                                                    \
    X(failover, decided_not_applied, COUNTER, "ferry_failover_decided_not_applied_total",          \
      "... that their offset brackets place not on the next master (a write: sent again once)")    \
    X(failover, requests_ambiguous, COUNTER, "ferry_failover_requests_ambiguous_total",            \
      "... that their offset brackets cannot place (the boundary inside the bracket, no reply, "   \
      "replication ids that differ, no backlog): at-least-once, as in the retry policy")           \
    X(failover, duplicates_known, COUNTER, "ferry_failover_duplicates_known_total",                \
      "of the decided ones, duplicates the retry policy still made: a pop's data delivered "       \
      "although the pop was not applied (its item pops again), a write re-sent although applied")  \
    X(failover, held_bytes_peak, GAUGE, "ferry_held_bytes_peak",                                   \
      "most request bytes held at once for lack of a master")                                      \
    X(failover, recent, NODES, "",                                                                 \
      "the last 16 switches of the master view (cluster mode: of every shard's), oldest first: "   \
      "start and end (unix time in ms; "                                                           \
      "end 0 while in progress), duration_ms, went_down (it reached DOWN), reason, from (the "     \
      "master lost), to (the master UP after it) (live)")                                          \
                                                                                                   \
    X(durability, aof_enforced, BOOL, "ferry_durability_aof_enforced",                             \
      "appendonly/appendfsync asserted on the current master (live)")                              \
    X(durability, aof_enforced_since, GAUGE,                                                       \
      "ferry_durability_aof_enforced_since_timestamp_seconds",                                     \
      "unix time they were last asserted, 0 if never (live)")                                      \
    X(durability, durability_last_error, TEXT, "ferry_durability_info",                            \
      "last durability enforcement error, empty if none (live)")                                   \
    X(durability, master_replid, TEXT, "ferry_durability_info",                                    \
      "the master's replication id (INFO replication, once per master with replicas_ack), "        \
      "empty while unknown or while it has no replication backlog (live)")                         \
    X(durability, wait_nudges, COUNTER, "ferry_durability_wait_nudges_total",                      \
      "replicas_ack WAITs late past 2 ms that had the master send its replicas a few bytes")       \
    X(durability, bracket_roles, COUNTER, "ferry_durability_bracket_roles_total",                  \
      "ROLEs pipelined beside a replicas_ack WAIT or behind writes sent while one is in flight, "  \
      "reading the master's replication offset after a batch of writes")                           \
    X(durability, brackets, COUNTER, "ferry_durability_brackets_total",                            \
      "held write replies given an offset bracket: the master's offset before and after them")     \
    X(durability, bracket_bytes, COUNTER, "ferry_durability_bracket_bytes_total",                  \
      "the widths of those brackets summed, in bytes of the replication stream (over brackets: "   \
      "the mean width)")                                                                           \
    X(durability, brackets_open, COUNTER, "ferry_durability_brackets_open_total",                  \
      "held write replies given only the offset after them (none read before them on their link)") \
    X(durability, redo_kept, GAUGE, "ferry_durability_redo_kept",                                  \
      "acknowledged queue pushes kept until every online replica has them, to be sent again to a " \
      "promoted replica that lacks them (durability.redo_max_bytes)")                              \
    X(durability, redo_kept_bytes, GAUGE, "ferry_durability_redo_kept_bytes", "their bytes")       \
    X(durability, redo_replayed, COUNTER, "ferry_durability_redo_replayed_total",                  \
      "kept pushes sent again to a new master that lacked them (or may have: redo_ambiguous)")     \
    X(durability, redo_ambiguous, COUNTER, "ferry_durability_redo_ambiguous_total",                \
      "of those, pushes the new master's history could not place (sent again: at worst twice)")    \
    X(durability, redo_no_history, COUNTER, "ferry_durability_redo_no_history_total",              \
      "kept pushes a new master sharing no replication history with the one that acknowledged "    \
      "them (a node restarted from its AOF) made undecidable: not sent again")                     \
    X(durability, redo_errors, COUNTER, "ferry_durability_redo_errors_total",                      \
      "kept pushes the new master answered with an error when sent again (logged)")                \
    X(durability, redo_dropped_unprotected, COUNTER,                                               \
      "ferry_durability_redo_dropped_unprotected_total",                                           \
      "acknowledged queue pushes not kept (past durability.redo_max_bytes, or no offset after "    \
      "them): lost if a replica that lacks them is promoted")                                      \
    X(durability, acked_writes_missing, COUNTER, "ferry_durability_acked_writes_missing_total",    \
      "acknowledged writes a new master lacked (or may have lacked) that ferry cannot send again " \
      "(transactions, scripts, writes other than queue pushes): lost (logged)")                    \
    X(durability, pop_receipts, COUNTER, "ferry_durability_pop_receipts_total",                    \
      "pops sent as a move into a receipt key of their own (durability.pop_receipts)")             \
    X(durability, pop_receipts_resent, COUNTER, "ferry_durability_pop_receipts_resent_total",      \
      "of those, pops sent again after their link was lost: answered from the receipt when the "   \
      "new master has it")                                                                         \
    X(durability, pop_receipts_found, COUNTER, "ferry_durability_pop_receipts_found_total",        \
      "pops sent again whose receipt held the item the first one took: answered with it, not "     \
      "popped again (the reply the failover lost)")                                                \
    X(durability, pop_receipts_put_back, COUNTER, "ferry_durability_pop_receipts_put_back_total",  \
      "pops with a receipt answered by ferry itself (their timeout while held, -TRYAGAIN) whose "  \
      "receipt is moved back to its queue: the item is there again if the first move applied")     \
    X(durability, pops_undone, COUNTER, "ferry_durability_pops_undone_total",                      \
      "pops with a receipt whose client left before their reply was written (a reply held for "    \
      "its WAIT, a pop in flight): the receipt moved back to its queue, the item there again")     \
    X(durability, push_receipts, COUNTER, "ferry_durability_push_receipts_total",                  \
      "pushes sent as a script that keeps their reply under a receipt key "                        \
      "(durability.push_receipts)")                                                                \
    X(durability, push_receipts_resent, COUNTER, "ferry_durability_push_receipts_resent_total",    \
      "of those, pushes sent again after their link was lost: answered from the receipt when the " \
      "new master has it")                                                                         \
    X(durability, push_receipts_found, COUNTER, "ferry_durability_push_receipts_found_total",      \
      "pushes sent again whose receipt held the first one's reply: answered with it, not pushed "  \
      "again (the reply the failover lost)")                                                       \
    X(durability, script_receipts, COUNTER, "ferry_durability_script_receipts_total",              \
      "scripts that may write, of a queue key, run inside the wrapper that keeps their reply "     \
      "under "                                                                                     \
      "a receipt key (durability.script_receipts)")                                                \
    X(durability, script_receipts_resent, COUNTER,                                                 \
      "ferry_durability_script_receipts_resent_total",                                             \
      "scripts sent again with their receipt after their link was lost: the new master answers "   \
      "the first run's reply if it has it, else runs them")                                        \
    X(durability, transaction_receipts, COUNTER, "ferry_durability_transaction_receipts_total",    \
      "transactions with a push of a queue sent at EXEC as a script that keeps EXEC's reply "      \
      "under a receipt key (durability.push_receipts)")                                            \
    X(durability, transaction_receipts_resent, COUNTER,                                            \
      "ferry_durability_transaction_receipts_resent_total",                                        \
      "of those, transactions sent again after their link was lost: answered from the receipt "    \
      "when the new master has it")                                                                \
    X(durability, transaction_receipts_found, COUNTER,                                             \
      "ferry_durability_transaction_receipts_found_total",                                         \
      "transactions sent again whose receipt held the first one's reply: answered with it, not "   \
      "run again")                                                                                 \
    X(durability, receipts_deleted_again, COUNTER,                                                 \
      "ferry_durability_receipts_deleted_again_total",                                             \
      "receipts deleted on a master in its last seconds, deleted again on the next one (their "    \
      "DEL may have died with the first)")                                                         \
    X(durability, receipts_held, GAUGE, "ferry_durability_receipts_held",                          \
      "receipts this process is answerable for now: requests sent with one and not answered, and " \
      "served ones whose DEL (or put-back) is not sent yet; a dead process's are settled by its "  \
      "instance started again or a peer")                                                          \
    X(durability, instances_claimed, COUNTER, "ferry_durability_instances_claimed_total",          \
      "ferry instances whose heartbeat (ferry:alive:<name>) expired that this one claimed: their " \
      "receipts settled (instance.name)")                                                          \
    X(durability, receipts_put_back, COUNTER, "ferry_durability_receipts_put_back_total",          \
      "items of a dead ferry process's pop receipts moved back to the end of their queue, by a "   \
      "peer or the same instance started again (at least once: each logged with its key)")         \
    X(durability, receipts_settled_deleted, COUNTER,                                               \
      "ferry_durability_receipts_settled_deleted_total",                                           \
      "a dead ferry process's push and transaction receipts settled (the write stands: a "         \
      "transaction's deleted, a push's left to expire in 24 h)")                                   \
    X(durability, stream_reads_looked, COUNTER, "ferry_durability_stream_reads_looked_total",      \
      "XREADGROUP '>' reads sent again (their reply lost with a link, or refused) that first "     \
      "read the consumer's pending entries after the ones it was handed")                          \
    X(durability, stream_reads_found, COUNTER, "ferry_durability_stream_reads_found_total",        \
      "of those, reads answered with the entries found there: the first read's, whose reply "      \
      "the failover lost (not read again past them)")                                              \
    X(durability, replicas_ack, GAUGE, "ferry_durability_replicas_ack",                            \
      "replicas that must confirm a write (WAIT) before its reply is released: "                   \
      "durability.replicas_ack as resolved (live)")                                                \
    X(durability, replicas_known, GAUGE, "ferry_durability_replicas_known",                        \
      "replicas Sentinel (or the cluster map) lists, whose durability ferry enforces too "         \
      "(live)")                                                                                    \
    X(durability, replicas_enforced, GAUGE, "ferry_durability_replicas_enforced",                  \
      "of those, replicas with the settings asserted and INFO persistence trusted (live)")         \
    X(durability, replicas, NODES, "",                                                             \
      "per replica: addr, enforced, enforced_since (unix time, 0 if not), last_error (live)")      \
                                                                                                   \
    X(sentinels, sentinels_configured, GAUGE, "ferry_sentinels_configured",                        \
      "entries in sentinel.addresses (live)")                                                      \
    X(sentinels, sentinels_known, GAUGE, "ferry_sentinels_known",                                  \
      "sentinels known, configured and discovered, each counted once by MYID (live)")              \
    X(sentinels, sentinels_reachable, GAUGE, "ferry_sentinels_reachable",                          \
      "sentinels that answered in the last poll round (live)")                                     \
    X(sentinels, sentinel_quorum_ok, BOOL, "ferry_sentinel_quorum_ok",                             \
      "1 while a majority of the known sentinels answered the last poll round; 0: ferry keeps "    \
      "its master while ROLE says master and follows no failover but one announced at a higher "   \
      "config epoch and backed by a second sentinel (live)")                                       \
                                                                                                   \
    X(fallback, fallback_pending, GAUGE, "ferry_fallback_pending",                                 \
      "rows in the fallback store awaiting replay")                                                \
    X(fallback, fallback_bytes, GAUGE, "ferry_fallback_bytes",                                     \
      "bytes of keys and members in the fallback store")                                           \
    X(fallback, fallback_oldest_ms, MSEC, "ferry_fallback_oldest_age_seconds",                     \
      "age of the oldest row in the fallback store")                                               \
    X(fallback, fallback_written, COUNTER, "ferry_fallback_written_total",                         \
      "client writes committed to the fallback store")                                             \
    X(fallback, fallback_popped, COUNTER, "ferry_fallback_popped_total",                           \
      "rows served to pops from the fallback store")                                               \
    X(fallback, fallback_taken, GAUGE, "ferry_fallback_taken",                                     \
      "rows popped from the fallback store whose replies are not written to their clients yet "    \
      "(deleted once written, back in the queue if never), and held rows (a push Redis may "       \
      "have applied: the replay asks Redis for its receipt)")                                      \
    X(fallback, fallback_returned, COUNTER, "ferry_fallback_returned_total",                       \
      "popped rows back in the fallback store because their replies were never written (the "      \
      "client left first, or ferry was killed or stopped first)")                                  \
    X(fallback, fallback_replayed_taken, COUNTER, "ferry_fallback_replayed_taken_total",           \
      "rows replayed while a reply carrying them was still unwritten after 1 s: their consumer "   \
      "may get them twice")                                                                        \
    X(fallback, fallback_replayed, COUNTER, "ferry_fallback_replayed_total",                       \
      "rows replayed into Redis and deleted from the store")                                       \
    X(fallback, fallback_replay_errors, COUNTER, "ferry_fallback_replay_errors_total",             \
      "replay rounds or keys Redis refused (retried with back-off)")                               \
    X(fallback, fallback_commits, COUNTER, "ferry_fallback_commits_total",                         \
      "group commits of the fallback store")                                                       \
    X(fallback, fallback_commit_seconds, HISTOGRAM, "ferry_fallback_commit_seconds",               \
      "client writes to the fallback store: submit to durable commit (group commits)")             \
    X(fallback, fallback_commit_errors, COUNTER, "ferry_fallback_commit_errors_total",             \
      "group commits that failed (disk full, I/O error): nothing of them acknowledged")            \
                                                                                                   \
    X(queues, queues, NODES, "",                                                                   \
      "per entry of queues: (in order): keys (its globs), pushes and pops (push and pop "          \
      "commands on its keys through ferry, every loop; Prometheus ferry_queue_pushes_total and "   \
      "ferry_queue_pops_total by keys), length (sum of its keys' sampled lengths), max_length "    \
      "(its bound, 0: none), refused_full (pushes answered -QFULL) and held_full (times a push "   \
      "found it full and was held, on_full: block), lease_expired, dead_lettered and "             \
      "lease_orphans (leases this ferry expired, of them dead-lettered, items found without a "    \
      "lease); Prometheus ferry_queue_refused_full_total, ferry_queue_held_full_total, "           \
      "ferry_queue_lease_expired_total and ferry_queue_dead_lettered_total by keys (live)")        \
    X(queues, queue_keys, NODES, "",                                                               \
      "per key sampled: key, queue (index in queues:), type, length, age_ms (since it was "        \
      "sampled), store_rows (its rows in the fallback store); Prometheus ferry_queue_length by "   \
      "queue (the key) (live)")                                                                    \
    X(queues, consumers_paused, GAUGE, "ferry_consumers_paused",                                   \
      "consumers whose pops ferry holds now (consumer_backoff), as the main loop last polled "     \
      "them from Redis (live)")                                                                    \
    X(queues, queue_keys_tracked, GAUGE, "ferry_queue_keys_tracked",                               \
      "keys whose length ferry keeps, at most queue_depths.max_keys (live)")                       \
    X(queues, queue_sampling, BOOL, "ferry_queue_sampling",                                        \
      "1 while lengths are sampled on an UP master; 0: paused (live)")                             \
    X(queues, queue_sample_rounds, COUNTER, "ferry_queue_sample_rounds_total",                     \
      "sampling rounds sent to the master: one SCAN and up to keys_per_round TYPE and length "     \
      "calls (live)")                                                                              \
    X(queues, queue_keys_probed, COUNTER, "ferry_queue_keys_probed_total",                         \
      "keys whose length was asked of the master (live)")

/* Cluster mode only (cluster: in the configuration; none of it is printed
 * otherwise): X(JSON path, type, Prometheus name, help). "cluster.shards[]."
 * entries are per shard: in Prometheus one series per shard, labelled
 * shard="<its first slot>" (a failover keeps it; the master's address and
 * node id change); TEXT entries sharing a Prometheus name are the labels of
 * one info gauge. clustermap.c writes the JSON, stats.c the Prometheus
 * text from this list, --describe-stats lists it after FERRY_STATS. */
#define FERRY_CLUSTER_STATS(X)                                                                     \
    X("mode", TEXT, "", "\"cluster\" (cluster mode)")                                              \
    X("routing", BOOL, "", "true: ferry routes by slot (cluster mode)")                            \
    X("cluster.shards", NODES, "ferry_cluster_shards",                                             \
      "per shard of the slot map, the fields below; Prometheus: the number of shards "             \
      "(cluster mode)")                                                                            \
    X("cluster.shards[].shard", GAUGE, "",                                                         \
      "its first slot: the shard label of the per-shard Prometheus series (cluster mode)")         \
    X("cluster.shards[].master", TEXT, "ferry_cluster_shard_info",                                 \
      "the master the map names: {id, host, port, health} in JSON, host:port as a label "          \
      "(cluster mode)")                                                                            \
    X("cluster.shards[].state", TEXT, "ferry_cluster_shard_info",                                  \
      "ferry's master view of the shard: UP, SWITCHING or DOWN (cluster mode)")                    \
    X("cluster.shards[].up", BOOL, "ferry_cluster_shard_up",                                       \
      "1 while the shard's master is verified and answers (cluster mode)")                         \
    X("cluster.shards[].epoch", GAUGE, "ferry_cluster_shard_config_epoch",                         \
      "the config epoch of the shard's master (cluster mode)")                                     \
    X("cluster.shards[].nslots", GAUGE, "ferry_cluster_shard_slots",                               \
      "slots the shard serves (cluster mode)")                                                     \
    X("cluster.shards[].slots", NODES, "", "its slot ranges, [first, last] each (cluster mode)")   \
    X("cluster.shards[].switches", COUNTER, "ferry_cluster_shard_switches_total",                  \
      "times ferry lost the shard's master: a failover, a lost link (cluster mode)")               \
    X("cluster.shards[].routed", COUNTER, "ferry_cluster_shard_requests_total",                    \
      "client requests sent to the shard's master (a request sent again counts again) "            \
      "(cluster mode)")                                                                            \
    X("cluster.shards[].held", GAUGE, "ferry_cluster_shard_held_requests",                         \
      "requests held now for lack of the shard's master (cluster mode)")                           \
    X("cluster.shards[].moved", COUNTER, "ferry_cluster_shard_moved_total",                        \
      "MOVED redirects the shard's master answered, followed by ferry (cluster mode)")             \
    X("cluster.shards[].asked", COUNTER, "ferry_cluster_shard_ask_total",                          \
      "ASK redirects the shard's master answered, followed by ferry (cluster mode)")               \
    X("cluster.shards[].links", GAUGE, "ferry_cluster_shard_links",                                \
      "connections open to the shard's master (cluster mode)")                                     \
    X("cluster.shards[].not_up_ms", MSEC, "ferry_cluster_shard_not_up_seconds",                    \
      "how long the shard has been without an UP master, 0 while UP (cluster mode)")               \
    X("cluster.shards[].since_switch_ms", MSEC, "ferry_cluster_shard_since_switch_seconds",        \
      "time since the shard's last switch began; null (no series) if it never switched "           \
      "(cluster mode)")                                                                            \
    X("cluster.shards[].replicas", NODES, "",                                                      \
      "its replicas as the map lists them: {id, host, port, health} (cluster mode)")               \
    X("cluster.shards_up", GAUGE, "ferry_cluster_shards_up",                                       \
      "shards whose master is UP (cluster mode)")                                                  \
    X("cluster.slots_covered", GAUGE, "ferry_cluster_slots_covered",                               \
      "slots of the map with a master, of 16384 (cluster mode)")                                   \
    X("cluster.rounds", COUNTER, "ferry_cluster_map_rounds_total",                                 \
      "slot map refresh rounds started (cluster mode)")                                            \
    X("cluster.answers", COUNTER, "ferry_cluster_map_answers_total",                               \
      "node answers merged into the map (cluster mode)")                                           \
    X("cluster.rejected", COUNTER, "ferry_cluster_map_rejected_total",                             \
      "node answers refused: nonsense, or from a node flagged failed (cluster mode)")              \
    X("cluster.unreachable", COUNTER, "ferry_cluster_map_unreachable_total",                       \
      "nodes that did not answer a refresh in time or refused the connection (cluster mode)")      \
    X("cluster.changes", COUNTER, "ferry_cluster_map_changes_total",                               \
      "times the slot map changed (cluster mode)")                                                 \
    X("cluster.slots_moved", COUNTER, "ferry_cluster_slots_moved_total",                           \
      "slots that changed master in the map, in total (cluster mode)")                             \
    X("cluster.moved_followed", COUNTER, "ferry_cluster_moved_followed_total",                     \
      "MOVED redirects followed, every shard (cluster mode)")                                      \
    X("cluster.ask_followed", COUNTER, "ferry_cluster_ask_followed_total",                         \
      "ASK redirects followed, every shard (cluster mode)")                                        \
    X("cluster.crossslot_refused", COUNTER, "ferry_cluster_crossslot_refused_total",               \
      "requests refused with -CROSSSLOT (cluster mode)")                                           \
    X("cluster.splits", COUNTER, "ferry_cluster_splits_total",                                     \
      "requests split across slots, one part per slot: MGET, MSET, DEL... (cluster mode)")         \
    X("cluster.tryagain_held", COUNTER, "ferry_cluster_tryagain_held_total",                       \
      "TRYAGAIN answers (a slot in migration) held and sent again (cluster mode)")                 \
    X("cluster.clusterdown_held", COUNTER, "ferry_cluster_clusterdown_held_total",                 \
      "CLUSTERDOWN answers held and sent again (cluster mode)")                                    \
    X("cluster.last_error", TEXT, "ferry_cluster_info",                                            \
      "why the last node answer was refused, empty if none (cluster mode)")                        \
    X("cluster.refresh_master_lost", COUNTER, "ferry_cluster_refresh_master_lost_total",           \
      "map refreshes asked because a shard's master was lost (cluster mode)")                      \
    X("cluster.refresh_moved", COUNTER, "ferry_cluster_refresh_moved_total",                       \
      "map refreshes asked by a MOVED answer, every loop (cluster mode)")                          \
    X("cluster.refresh_clusterdown", COUNTER, "ferry_cluster_refresh_clusterdown_total",           \
      "map refreshes asked by a CLUSTERDOWN answer, every loop (cluster mode)")                    \
    X("cluster.refresh_channel", COUNTER, "ferry_cluster_refresh_channel_total",                   \
      "map refreshes asked because a node dropped a shard channel (cluster mode)")                 \
    X("cluster.refresh_replay", COUNTER, "ferry_cluster_refresh_replay_total",                     \
      "map refreshes asked by a redirected fallback replay (cluster mode)")                        \
    X("cluster.refresh_unreachable", COUNTER, "ferry_cluster_refresh_unreachable_total",           \
      "map refreshes asked because a master of the map did not answer (cluster mode)")             \
    X("cluster.refresh_deferred", COUNTER, "ferry_cluster_refresh_deferred_total",                 \
      "of the refreshes asked, those left to a round under way or to the back-off (cluster mode)") \
    X("cluster.meta_changes", COUNTER, "ferry_cluster_map_changes_meta_total",                     \
      "map changes that kept every slot's master (replicas, health, epochs): not sent to the "     \
      "loops (cluster mode)")

#define STATS_TEXT_MAX 320 /* bytes kept of a TEXT stat, NUL included */
#define STATS_NBUCKETS 17  /* histogram buckets, the last one +Inf */

/* Upper bounds of the histogram buckets in microseconds (the +Inf bucket has
 * none): 100us 250us 500us 1ms ... 5s 10s. */
extern const uint64_t stats_bucket_us[STATS_NBUCKETS - 1];

typedef struct stats_histogram {
    uint64_t bucket[STATS_NBUCKETS]; /* observations per bucket, not cumulative */
    uint64_t count;                  /* observations */
    uint64_t sum_us;                 /* their sum in microseconds */
} stats_histogram;

#define STATS_FIELD_COUNTER(name) uint64_t name;
#define STATS_FIELD_GAUGE(name) uint64_t name;
#define STATS_FIELD_MSEC(name) uint64_t name;
#define STATS_FIELD_BOOL(name) uint64_t name;
#define STATS_FIELD_TEXT(name) char name[STATS_TEXT_MAX];
#define STATS_FIELD_HISTOGRAM(name) stats_histogram name;
#define STATS_FIELD_NODES(name) uint64_t name;
#define STATS_FIELD(section, name, type, prom, help) STATS_FIELD_##type(name)

typedef struct ferry_stats {
    FERRY_STATS(STATS_FIELD)                  /* one field per stat, commented in FERRY_STATS */
    uint64_t queue_pushes[CONFIG_MAX_QUEUES]; /* per entry of queues: (queues.c) */
    uint64_t queue_pops[CONFIG_MAX_QUEUES];
    uint64_t queue_refused_full[CONFIG_MAX_QUEUES];  /* -QFULL answered (guards.c) */
    uint64_t queue_held_full[CONFIG_MAX_QUEUES];     /* a push found it full and was held */
    uint64_t queue_lease_expired[CONFIG_MAX_QUEUES]; /* leases expired (lease.c) */
    uint64_t queue_dead_lettered[CONFIG_MAX_QUEUES]; /* of them, items dead-lettered */
    uint64_t queue_lease_orphans[CONFIG_MAX_QUEUES]; /* items found without a lease */
} ferry_stats;

/* The counting functions below live in counters.c (no upward calls: any
 * layer may count); the rest in stats.c. */
/* Count a parsed request by its command's class (cmd NULL: unknown). */
void stats_count_command(ferry_stats *st, const struct command *cmd);
/* Record a reply from Redis to a client request: born_ns and sent_ns are the
 * uv_hrtime() of parsing and sending, now_ns of the reply (0 = unknown);
 * is_error if the reply is an error. */
void stats_observe_reply(ferry_stats *st, uint64_t born_ns, uint64_t sent_ns, uint64_t now_ns,
                         int is_error);
/* Add one observation of us microseconds to h. */
void stats_observe(stats_histogram *h, uint64_t us);
/* Add src's counters and histograms to dst (another event loop's; the
 * peak of held bytes is the larger one). */
void stats_add(ferry_stats *dst, const ferry_stats *src);
/* Note how many request bytes are held now (keeps the peak). */
void stats_held(ferry_stats *st, uint64_t held_bytes);

/* Append the JSON document / the Prometheus text exposition (format 0.0.4)
 * for f to out. */
void stats_render_json(struct ferry *f, struct buf *out);
void stats_render_prometheus(struct ferry *f, struct buf *out);
/* Print every stat: JSON path, type, Prometheus name ("-" if none), help;
 * one per line (ferry --describe-stats). */
void stats_describe(FILE *out);

/* Listen on cfg->stats_listen if cfg->stats_enabled. Returns 0, or a
 * negative uv error after logging (nothing left open). */
int stats_start(struct ferry *f);
/* Close the listener and every stats connection. */
void stats_stop(struct ferry *f);
/* Free the stats port's memory once the loop has closed its handles. */
void stats_free(struct ferry *f);
/* The stats port's listening socket (for a takeover; it stays ferry's), or -1. */
int stats_socket(struct ferry *f);

#endif
