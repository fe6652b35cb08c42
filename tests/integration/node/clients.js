'use strict';
// Client-level checks with ioredis, driven by test_node_clients.py.
//
// Usage: node clients.js PORT SCENARIO PREFIX
// Runs one scenario against 127.0.0.1:PORT, with every key and channel name
// under PREFIX, and prints one JSON object on stdout. Exit status 0 when the
// scenario ran to its end (the Python side judges the values), 1 when a
// command failed (the object then has "error" and what was gathered before),
// 2 when the whole run overran its deadline. Every command has a timeout, so
// an unanswered command fails instead of hanging.

const Redis = require('ioredis');

const { waitFor, blockedClients, ioredisOptions } = require('./common');

const COMMAND_TIMEOUT_MS = 5000; // one command; a healthy ferry answers in ms
const RUN_TIMEOUT_MS = 40000;    // the whole scenario

const port = parseInt(process.argv[2], 10);
const scenario = process.argv[3];
const prefix = process.argv[4] || 'node';
const out = { scenario };
const conns = [];

function connect() {
    const c = new Redis(ioredisOptions(port, COMMAND_TIMEOUT_MS, {
        commandTimeout: COMMAND_TIMEOUT_MS,
        enableOfflineQueue: true,
        lazyConnect: false,
    }));
    c.on('error', (e) => { (out.conn_errors = out.conn_errors || []).push(String(e)); });
    conns.push(c);
    return c;
}

// [[error message or null, value], ...] from an ioredis exec()/pipeline
// result; null stays null (an aborted EXEC).
function plain(results) {
    if (results === null) {
        return null;
    }
    return results.map(([err, val]) => [err ? err.message : null, val]);
}

const scenarios = {
    // MULTI/EXEC with writes (queued by ioredis as one pipeline), a MULTI
    // sent on its own then DISCARD, and one transaction of 1000 writes.
    async multi() {
        const r = connect();
        const k = prefix + ':list';
        const c = prefix + ':counter';
        out.exec = plain(await r.multi().del(k).lpush(k, 'a').lpush(k, 'b').incr(c)
            .lrange(k, 0, -1).exec());
        out.after = await r.lrange(k, 0, -1);

        const d = prefix + ':discarded';
        out.multi_reply = await r.multi({ pipeline: false });
        out.queued = await r.set(d, 'x');
        out.discard = await r.discard();
        out.discarded_exists = await r.exists(d);

        const big = prefix + ':big';
        const m = r.multi();
        for (let i = 0; i < 1000; i++) {
            m.rpush(big, String(i));
        }
        const res = await m.exec();
        out.big_n = res.length;
        out.big_errors = res.filter(([e]) => e).length;
        out.big_last = res[res.length - 1][1];
        out.big_len = await r.llen(big);
    },

    // WATCH abort: another connection changes the watched key between WATCH
    // and EXEC, so EXEC answers null and nothing is applied. Then the same
    // with no interference commits.
    async watch() {
        const a = connect();
        const b = connect();
        const k = prefix + ':watched';
        const side = prefix + ':side';
        await a.set(k, 'v0');
        out.watch = await a.watch(k);
        out.read = await a.get(k);
        out.other_set = await b.set(k, 'theirs');
        out.aborted = plain(await a.multi().set(k, 'mine').incr(side).exec());
        out.value_after_abort = await b.get(k);
        out.side_after_abort = await b.get(side);

        await a.watch(k);
        out.committed = plain(await a.multi().set(k, 'mine').incr(side).exec());
        out.value_after_commit = await b.get(k);
        out.side_after_commit = await b.get(side);

        // UNWATCH, then a change by another client does not abort
        await a.watch(k);
        out.unwatch = await a.unwatch();
        await b.set(k, 'theirs2');
        out.after_unwatch = plain(await a.multi().set(k, 'mine2').exec());
        out.value_final = await b.get(k);
    },

    // A pipeline of 1000 commands, writes and reads interleaved, answered in
    // order.
    async pipeline() {
        const r = connect();
        const k = prefix + ':plist';
        await r.del(k);
        const p = r.pipeline();
        for (let i = 0; i < 1000; i++) {
            if (i % 2 === 0) {
                p.rpush(k, String(i));
            } else {
                p.lindex(k, -1);
            }
        }
        const res = await p.exec();
        out.n = res.length;
        out.errors = res.filter(([e]) => e).map(([e]) => e.message).slice(0, 5);
        const bad = [];
        res.forEach(([, v], i) => {
            const want = i % 2 === 0 ? i / 2 + 1 : String(i - 1);
            if (v !== want && bad.length < 5) {
                bad.push({ i, got: v, want });
            }
        });
        out.mismatches = bad;
        out.len = await r.llen(k);
    },

    // SUBSCRIBE / PSUBSCRIBE, messages in publish order, UNSUBSCRIBE of one
    // channel, PUNSUBSCRIBE, then UNSUBSCRIBE of the rest, after which the
    // connection runs commands again.
    async pubsub() {
        const sub = connect();
        const pub = connect();
        const ch1 = prefix + ':ch1';
        const ch2 = prefix + ':ch2';
        const pat = prefix + ':news.*';
        const got = [];
        sub.on('message', (ch, msg) => got.push(['message', ch, msg]));
        sub.on('pmessage', (p, ch, msg) => got.push(['pmessage', p, ch, msg]));
        out.subscribe = await sub.subscribe(ch1, ch2);
        out.psubscribe = await sub.psubscribe(pat);
        out.published = [
            await pub.publish(ch1, 'one'),
            await pub.publish(prefix + ':news.x', 'two'),
            await pub.publish(ch2, 'three'),
        ];
        await waitFor(() => got.length >= 3, COMMAND_TIMEOUT_MS, '3 messages');
        out.unsubscribe_one = await sub.unsubscribe(ch1);
        out.published_after_unsubscribe = [
            await pub.publish(ch1, 'lost'),
            await pub.publish(ch2, 'four'),
        ];
        await waitFor(() => got.length >= 4, COMMAND_TIMEOUT_MS, '4 messages');
        // ioredis resolves an UNSUBSCRIBE without arguments only once the
        // count reaches 0, so the pattern goes first.
        out.punsubscribe = await sub.punsubscribe(pat);
        out.unsubscribe_all = await sub.unsubscribe();
        out.published_after_all = [
            await pub.publish(ch2, 'lost'),
            await pub.publish(prefix + ':news.y', 'lost'),
        ];
        out.ping_after = await sub.ping();
        out.messages = got;
    },

    // BRPOP that times out (nil after about its timeout), one that gets an
    // item pushed while it waits, and key order as priority.
    async brpop() {
        const a = connect();
        const b = connect();
        const k = prefix + ':bq';
        const hi = prefix + ':high';
        const lo = prefix + ':low';
        await a.del(k, hi, lo);

        let t0 = Date.now();
        out.timeout_result = await a.brpop(k, 1);
        out.timeout_ms = Date.now() - t0;

        const blocked0 = await blockedClients(b);
        t0 = Date.now();
        const pending = a.brpop(k, 4);
        // push only once the pop is blocked in Redis
        await waitFor(async () => await blockedClients(b) > blocked0, 3000, 'the pop to block');
        out.pushed = await b.lpush(k, 'x');
        out.pop_result = await pending;
        out.pop_ms = Date.now() - t0;

        await b.rpush(lo, 'l1');
        await b.rpush(hi, 'h1');
        out.priority = [await a.brpop(hi, lo, 1), await a.brpop(hi, lo, 1),
            await a.brpop(hi, lo, 1)];
    },

    // The reliable-queue pattern through ferry's queue guards (the Python
    // side configures PREFIX:* with max_length 5 and a processing list):
    // pushes past the bound, three items taken with BRPOPLPUSH, two acked
    // with LREM, the third left unacked when the client leaves.
    async reliable() {
        const r = connect();
        const q = prefix + ':q';
        const proc = q + ':processing';
        out.pushed = await r.lpush(q, 'a', 'b', 'c', 'd', 'e');
        try {
            await r.lpush(q, 'f');
            out.full = null;
        } catch (e) {
            out.full = e.message;
        }
        out.taken = [await r.brpoplpush(q, proc, 1), await r.brpoplpush(q, proc, 1),
            await r.brpoplpush(q, proc, 1)];
        out.acked = [await r.lrem(proc, 1, out.taken[0]), await r.lrem(proc, 1, out.taken[1])];
    },
};

async function main() {
    const fn = scenarios[scenario];
    if (!fn) {
        throw new Error('unknown scenario ' + scenario + '; known: ' + Object.keys(scenarios).join(' '));
    }
    await fn();
}

const watchdog = setTimeout(() => {
    out.error = 'scenario overran ' + RUN_TIMEOUT_MS + ' ms';
    process.stdout.write(JSON.stringify(out) + '\n');
    process.exit(2);
}, RUN_TIMEOUT_MS);

main().then(() => 0, (e) => {
    out.error = String(e && e.message ? e.message : e);
    return 1;
}).then((rc) => {
    clearTimeout(watchdog);
    for (const c of conns) {
        c.disconnect();
    }
    process.stdout.write(JSON.stringify(out) + '\n');
    process.exitCode = rc;
});
