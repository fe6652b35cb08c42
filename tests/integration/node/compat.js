'use strict';
// The compatibility matrix's queue checks with the Node.js clients, driven by
// test_compat.py.
//
// Usage: node compat.js PORT CLIENT PREFIX [CHECK...]
//   CLIENT  node-redis        node-redis 6 with its default options (RESP3)
//           node-redis-resp2  node-redis 6 with RESP: 2
//           ioredis           ioredis 6 (RESP2)
// Runs each check (all of them when none is named) against 127.0.0.1:PORT,
// every key and channel of a check under PREFIX:CHECK, each check on
// connections of its own that it closes when it ends. Prints one JSON object
// on stdout: {"client": ..., "results": {CHECK: {...what it saw...} or
// {"error": "..."}}}. The Python side judges the values and reads Redis
// directly. Exit status 0 when the object was printed (whatever the checks
// found), 2 when the whole run overran its deadline. Every check has a
// deadline, so an unanswered command fails that check instead of hanging.

const crypto = require('crypto');

const net = require('net');
const { waitFor, blockedClients, nodeRedisOptions, ioredisOptions } = require('./common');

const CHECK_TIMEOUT_MS = 10000; // one check; through a healthy ferry it takes ms
const RUN_TIMEOUT_MS = 50000;   // the whole run
const CONNECT_TIMEOUT_MS = 5000;
const BINARY_SIZE = 1 << 20;

const port = parseInt(process.argv[2], 10);
const clientName = process.argv[3];
const prefix = process.argv[4] || 'compat';
const only = process.argv.slice(5);
// COMPAT_HASH_TAG=1 (a cluster): each check's keys in one slot, `{prefix:check}`
const hashTag = process.env.COMPAT_HASH_TAG === '1';

// The 1 MiB value of the binary check: every byte value, CR LF and NUL
// included, in an order with no short period. test_compat.py builds the same.
function binaryValue() {
    const b = Buffer.alloc(BINARY_SIZE);
    for (let i = 0; i < BINARY_SIZE; i++) {
        b[i] = (i * 167 + (i >>> 11)) & 0xff;
    }
    return b;
}

// The delayed-queue script: moves the members of KEYS[1] (a sorted set
// scored by due time) whose score is <= ARGV[1] onto the list KEYS[2], in
// due order, and returns them. test_compat.py holds the same text.
const DELAYED_SCRIPT = [
    "local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1])",
    "for _, job in ipairs(due) do redis.call('LPUSH', KEYS[2], job) end",
    "if #due > 0 then redis.call('ZREM', KEYS[1], unpack(due)) end",
    'return due',
].join('\n');

const sha256 = (buf) => crypto.createHash('sha256').update(buf).digest('hex');
// Starts the blocking call block() (a promise), waits until Redis counts one
// more blocked client (INFO through `other`), then runs push(). Returns
// [what push answered, what the blocking call answered].
// COMPAT_NODE_PORTS=p1,p2... (a cluster): blocked clients are counted on
// these nodes directly and summed (ferry's INFO clients is one master's).
const nodePorts = (process.env.COMPAT_NODE_PORTS || '').split(',').filter((p) => p).map(Number);

function nodeBlocked(port) {
    return new Promise((resolve, reject) => {
        const s = net.connect(port, '127.0.0.1');
        let buf = '';
        s.setTimeout(5000, () => { s.destroy(); reject(new Error('INFO clients on ' + port)); });
        s.on('error', reject);
        s.on('connect', () => s.write('*2\r\n$4\r\nINFO\r\n$7\r\nclients\r\n'));
        s.on('data', (d) => {
            buf += d;
            const m = /blocked_clients:(\d+)\r\n/.exec(buf);
            if (m) {
                s.destroy();
                resolve(parseInt(m[1], 10));
            }
        });
    });
}

async function countBlocked(other) {
    if (!nodePorts.length) {
        return blockedClients(other);
    }
    let n = 0;
    for (const p of nodePorts) {
        n += await nodeBlocked(p);
    }
    return n;
}

async function blockThenPush(other, block, push) {
    const base = await countBlocked(other);
    const pending = block();
    pending.catch(() => {}); // judged below
    await waitFor(async () => (await countBlocked(other)) > base,
        CHECK_TIMEOUT_MS / 2, 'the blocking call to block in Redis');
    const pushed = await push();
    return [pushed, await pending];
}

// --- node-redis 6 ----------------------------------------------------------

function nodeRedis(resp) {
    const { createClient, RESP_TYPES, WatchError } = require('redis');
    return (conns) => {
        async function connect(extra = {}) {
            const c = createClient(nodeRedisOptions(port, CONNECT_TIMEOUT_MS, resp, extra));
            c.on('error', () => {}); // connect() and each command report their own
            conns.push(() => c.destroy());
            await c.connect();
            return c;
        }
        const nil = (v) => (v === null || v === undefined ? null : v);

        return {
            async fifo(P) {
                const c = await connect();
                const pushes = [];
                for (const v of ['a1', 'a2', 'a3', 'a4', 'a5']) {
                    pushes.push(await c.lPush(P + ':q', v));
                }
                const pops = [];
                for (let i = 0; i < 3; i++) {
                    pops.push(await c.rPop(P + ':q'));
                }
                return { pushes, pops };
            },

            async priority_brpop(P) {
                const c = await connect();
                const other = await connect();
                const hi = P + ':high';
                const lo = P + ':low';
                const setup = [await c.lPush(lo, ['l1', 'l2']), await c.lPush(hi, 'h1')];
                const pops = [];
                for (let i = 0; i < 3; i++) {
                    const r = await c.brPop([hi, lo], 1);
                    pops.push(r && [r.key, r.element]);
                }
                const timeout = nil(await c.brPop([hi, lo], 0.1));
                const [pushed, r] = await blockThenPush(other, () => c.brPop([hi, lo], 5),
                    () => other.lPush(lo, 'l3'));
                return { setup, pops, timeout, pushed_while_blocked: pushed,
                    woken: r && [r.key, r.element] };
            },

            async bzpopmin(P) {
                const c = await connect();
                const z = P + ':z';
                const added = await c.zAdd(z, [{ score: 30, value: 'c' }, { score: 10, value: 'a' },
                    { score: 20, value: 'b' }]);
                const pops = [];
                for (let i = 0; i < 2; i++) {
                    const r = await c.bzPopMin(z, 1);
                    pops.push(r && [r.key, r.value, r.score]);
                }
                const timeout = nil(await c.bzPopMin(P + ':none', 0.1));
                return { added, pops, timeout };
            },

            async lua_delayed(P) {
                const c = await connect();
                const keys = [P + ':delayed', P + ':ready'];
                const added = await c.zAdd(keys[0], [{ score: 100, value: 'j1' },
                    { score: 200, value: 'j2' }, { score: 300, value: 'j3' }]);
                const due_eval = await c.eval(DELAYED_SCRIPT, { keys, arguments: ['250'] });
                const sha = await c.scriptLoad(DELAYED_SCRIPT);
                const due_evalsha = await c.evalSha(sha, { keys, arguments: ['350'] });
                const due_none = await c.evalSha(sha, { keys, arguments: ['400'] });
                return { added, due_eval, sha, due_evalsha, due_none };
            },

            async lpop_count(P) {
                const c = await connect();
                const q = P + ':q';
                return {
                    pushed: await c.rPush(q, ['a', 'b', 'c', 'd', 'e']),
                    first: await c.lPopCount(q, 2),
                    rest: await c.lPopCount(q, 10),
                    missing: nil(await c.lPopCount(q, 2)),
                    pushed_again: await c.rPush(q, ['f', 'g']),
                    one: await c.lPopCount(q, 1),
                };
            },

            async pipeline(P) {
                const c = await connect();
                const k = P + ':p';
                const m = c.multi();
                for (let i = 0; i < 100; i++) {
                    m.rPush(k, String(i));
                    m.lIndex(k, -1);
                }
                return { replies: await m.execAsPipeline() };
            },

            async multi(P) {
                const c = await connect();
                const exec = await c.multi().lPush(P + ':q', 'a').lPush(P + ':q', 'b')
                    .incr(P + ':n').exec();
                return { exec };
            },

            async watch(P) {
                const a = await connect();
                const b = await connect();
                const k = P + ':w';
                const side = P + ':side';
                await a.set(k, 'v0');
                await a.watch(k);
                const read = await a.get(k);
                await b.set(k, 'theirs');
                let aborted;
                try {
                    aborted = await a.multi().set(k, 'mine').incr(side).exec();
                } catch (e) {
                    if (!(e instanceof WatchError)) {
                        throw e;
                    }
                    aborted = null; // node-redis reports a watch conflict this way
                }
                await a.watch(k);
                const committed = await a.multi().set(k, 'mine').incr(side).exec();
                return { read, aborted, committed };
            },

            async pubsub(P) {
                const sub = await connect();
                const pub = await connect();
                const ch = P + ':ch';
                const pat = P + ':news.*';
                const messages = [];
                await sub.subscribe(ch, (msg, channel) => {
                    messages.push(['message', channel, msg]);
                });
                await sub.pSubscribe(pat, (msg, channel) => {
                    messages.push(['pmessage', pat, channel, msg]);
                });
                const published = [await pub.publish(ch, 'one'), await pub.publish(P + ':news.x', 'two')];
                await waitFor(() => messages.length >= 2, CHECK_TIMEOUT_MS / 2, '2 messages');
                await sub.unsubscribe(ch);
                await sub.pUnsubscribe(pat);
                const published_after = [await pub.publish(ch, 'lost'),
                    await pub.publish(P + ':news.y', 'lost')];
                return { published, messages, published_after };
            },

            async select(P) {
                const c = await connect({ database: 3 });
                return { pushed: await c.rPush(P + ':q', ['a', 'b']), popped: await c.lPop(P + ':q') };
            },

            async blmove(P) {
                const c = await connect();
                const other = await connect();
                const q = P + ':q';
                const work = P + ':work';
                const pushed = await c.lPush(q, ['j1', 'j2']);
                const moved = await c.blMove(q, work, 'RIGHT', 'LEFT', 1);
                const timeout = nil(await c.blMove(P + ':empty', work, 'RIGHT', 'LEFT', 0.1));
                const [pushedWhile, woken] = await blockThenPush(other,
                    () => c.blMove(P + ':q2', work, 'RIGHT', 'LEFT', 5),
                    () => other.lPush(P + ':q2', 'j3'));
                const acked = await c.lRem(work, 1, moved);
                return { pushed, moved, timeout, pushed_while_blocked: pushedWhile, woken, acked };
            },

            async binary_1mb(P) {
                const c = (await connect()).withTypeMapping({ [RESP_TYPES.BLOB_STRING]: Buffer });
                const v = binaryValue();
                const set = await c.set(P + ':bin', v);
                const got = await c.get(P + ':bin');
                const pushed = await c.rPush(P + ':bq', v);
                const popped = await c.rPop(P + ':bq');
                return {
                    set,
                    get_len: got.length, get_sha256: sha256(got),
                    pushed,
                    pop_len: popped.length, pop_sha256: sha256(popped),
                };
            },
        };
    };
}

// --- ioredis 6 ---------------------------------------------------------------

function ioredis() {
    const Redis = require('ioredis');
    return (conns) => {
        async function connect(extra = {}) {
            const c = new Redis(ioredisOptions(port, CONNECT_TIMEOUT_MS,
                { lazyConnect: true, ...extra }));
            c.on('error', () => {}); // connect() and each command report their own
            conns.push(() => c.disconnect());
            await c.connect();
            return c;
        }
        // ioredis' [[err, value], ...] of exec(): the values, or the first error
        function values(res) {
            if (res === null) {
                return null;
            }
            const err = res.find(([e]) => e);
            if (err) {
                throw err[0];
            }
            return res.map(([, v]) => v);
        }

        return {
            async fifo(P) {
                const c = await connect();
                const pushes = [];
                for (const v of ['a1', 'a2', 'a3', 'a4', 'a5']) {
                    pushes.push(await c.lpush(P + ':q', v));
                }
                const pops = [];
                for (let i = 0; i < 3; i++) {
                    pops.push(await c.rpop(P + ':q'));
                }
                return { pushes, pops };
            },

            async priority_brpop(P) {
                const c = await connect();
                const other = await connect();
                const hi = P + ':high';
                const lo = P + ':low';
                const setup = [await c.lpush(lo, 'l1', 'l2'), await c.lpush(hi, 'h1')];
                const pops = [];
                for (let i = 0; i < 3; i++) {
                    pops.push(await c.brpop(hi, lo, 1));
                }
                const timeout = await c.brpop(hi, lo, 0.1);
                const [pushed, woken] = await blockThenPush(other, () => c.brpop(hi, lo, 5),
                    () => other.lpush(lo, 'l3'));
                return { setup, pops, timeout, pushed_while_blocked: pushed, woken };
            },

            async bzpopmin(P) {
                const c = await connect();
                const z = P + ':z';
                const added = await c.zadd(z, 30, 'c', 10, 'a', 20, 'b');
                const pops = [];
                for (let i = 0; i < 2; i++) {
                    const r = await c.bzpopmin(z, 1);
                    pops.push(r && [r[0], r[1], Number(r[2])]);
                }
                const timeout = await c.bzpopmin(P + ':none', 0.1);
                return { added, pops, timeout };
            },

            async lua_delayed(P) {
                const c = await connect();
                const d = P + ':delayed';
                const ready = P + ':ready';
                const added = await c.zadd(d, 100, 'j1', 200, 'j2', 300, 'j3');
                const due_eval = await c.eval(DELAYED_SCRIPT, 2, d, ready, '250');
                const sha = await c.script('LOAD', DELAYED_SCRIPT);
                const due_evalsha = await c.evalsha(sha, 2, d, ready, '350');
                const due_none = await c.evalsha(sha, 2, d, ready, '400');
                return { added, due_eval, sha, due_evalsha, due_none };
            },

            async lpop_count(P) {
                const c = await connect();
                const q = P + ':q';
                return {
                    pushed: await c.rpush(q, 'a', 'b', 'c', 'd', 'e'),
                    first: await c.lpop(q, 2),
                    rest: await c.lpop(q, 10),
                    missing: await c.lpop(q, 2),
                    pushed_again: await c.rpush(q, 'f', 'g'),
                    one: await c.lpop(q, 1),
                };
            },

            async pipeline(P) {
                const c = await connect();
                const k = P + ':p';
                const p = c.pipeline();
                for (let i = 0; i < 100; i++) {
                    p.rpush(k, String(i));
                    p.lindex(k, -1);
                }
                return { replies: values(await p.exec()) };
            },

            async multi(P) {
                const c = await connect();
                const exec = values(await c.multi().lpush(P + ':q', 'a').lpush(P + ':q', 'b')
                    .incr(P + ':n').exec());
                return { exec };
            },

            async watch(P) {
                const a = await connect();
                const b = await connect();
                const k = P + ':w';
                const side = P + ':side';
                await a.set(k, 'v0');
                await a.watch(k);
                const read = await a.get(k);
                await b.set(k, 'theirs');
                const aborted = values(await a.multi().set(k, 'mine').incr(side).exec());
                await a.watch(k);
                const committed = values(await a.multi().set(k, 'mine').incr(side).exec());
                return { read, aborted, committed };
            },

            async pubsub(P) {
                const sub = await connect();
                const pub = await connect();
                const ch = P + ':ch';
                const pat = P + ':news.*';
                const messages = [];
                sub.on('message', (channel, msg) => messages.push(['message', channel, msg]));
                sub.on('pmessage', (p, channel, msg) => {
                    messages.push(['pmessage', p, channel, msg]);
                });
                await sub.subscribe(ch);
                await sub.psubscribe(pat);
                const published = [await pub.publish(ch, 'one'), await pub.publish(P + ':news.x', 'two')];
                await waitFor(() => messages.length >= 2, CHECK_TIMEOUT_MS / 2, '2 messages');
                await sub.unsubscribe(ch);
                await sub.punsubscribe(pat);
                const published_after = [await pub.publish(ch, 'lost'),
                    await pub.publish(P + ':news.y', 'lost')];
                return { published, messages, published_after };
            },

            async select(P) {
                const c = await connect({ db: 3 });
                return { pushed: await c.rpush(P + ':q', 'a', 'b'), popped: await c.lpop(P + ':q') };
            },

            async blmove(P) {
                const c = await connect();
                const other = await connect();
                const q = P + ':q';
                const work = P + ':work';
                const pushed = await c.lpush(q, 'j1', 'j2');
                const moved = await c.blmove(q, work, 'RIGHT', 'LEFT', 1);
                const timeout = await c.blmove(P + ':empty', work, 'RIGHT', 'LEFT', 0.1);
                const [pushedWhile, woken] = await blockThenPush(other,
                    () => c.blmove(P + ':q2', work, 'RIGHT', 'LEFT', 5),
                    () => other.lpush(P + ':q2', 'j3'));
                const acked = await c.lrem(work, 1, moved);
                return { pushed, moved, timeout, pushed_while_blocked: pushedWhile, woken, acked };
            },

            async binary_1mb(P) {
                const c = await connect();
                const v = binaryValue();
                const set = await c.set(P + ':bin', v);
                const got = await c.getBuffer(P + ':bin');
                const pushed = await c.rpush(P + ':bq', v);
                const popped = await c.rpopBuffer(P + ':bq');
                return {
                    set,
                    get_len: got.length, get_sha256: sha256(got),
                    pushed,
                    pop_len: popped.length, pop_sha256: sha256(popped),
                };
            },
        };
    };
}

const CLIENTS = {
    'node-redis': () => nodeRedis(undefined),
    'node-redis-resp2': () => nodeRedis(2),
    ioredis,
};

function withDeadline(promise, ms, what) {
    let timer;
    const deadline = new Promise((resolve, reject) => {
        timer = setTimeout(() => reject(new Error(what + ' overran ' + ms + ' ms')), ms);
    });
    return Promise.race([promise, deadline]).finally(() => clearTimeout(timer));
}

async function main() {
    const make = CLIENTS[clientName];
    if (!make) {
        throw new Error('unknown client ' + clientName + '; known: '
            + Object.keys(CLIENTS).join(' '));
    }
    const checksOf = make();
    const names = only.length ? only : Object.keys(checksOf([]));
    const results = {};
    for (const name of names) {
        const conns = [];
        const checks = checksOf(conns);
        if (!checks[name]) {
            results[name] = { error: 'unknown check ' + name };
            continue;
        }
        try {
            results[name] = await withDeadline(checks[name](hashTag ? '{' + prefix + ':' + name + '}' : prefix + ':' + name), CHECK_TIMEOUT_MS,
                'check ' + name);
        } catch (e) {
            results[name] = { error: String(e && e.message ? e.message : e) };
        }
        for (const close of conns) {
            try {
                close();
            } catch (e) {
                // already closed
            }
        }
    }
    return results;
}

const say = (obj) => process.stdout.write(JSON.stringify({ client: clientName, ...obj }) + '\n');

const watchdog = setTimeout(() => {
    say({ error: 'run overran ' + RUN_TIMEOUT_MS + ' ms' });
    process.exit(2);
}, RUN_TIMEOUT_MS);

main().then((results) => {
    clearTimeout(watchdog);
    say({ results });
    process.exitCode = 0;
}, (e) => {
    clearTimeout(watchdog);
    say({ error: String(e && e.message ? e.message : e) });
    process.exitCode = 1;
});
