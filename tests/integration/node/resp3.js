'use strict';
// node-redis speaking RESP3 through ferry, driven by test_resp3.py.
//
// Usage: node resp3.js PORT PREFIX
// Prints one JSON object on stdout: what each command answered. Exit status
// 0 when the run reached its end, 1 when a command failed ("error" is then
// set), 2 when the whole run overran its deadline.

const { createClient } = require('redis');

const { waitFor, nodeRedisOptions } = require('./common');

const RUN_TIMEOUT_MS = 40000;

const port = parseInt(process.argv[2], 10);
const prefix = process.argv[3] || 'node3';
const out = {};
const clients = [];

async function connect(extra) {
    const c = createClient(nodeRedisOptions(port, 5000, 3, extra || {}));
    c.on('error', (e) => { (out.conn_errors = out.conn_errors || []).push(String(e)); });
    clients.push(c);
    await c.connect();
    return c;
}

async function main() {
    const c = await connect();
    const hello = await c.sendCommand(['HELLO', '3']);
    out.hello_proto = hello.proto !== undefined ? hello.proto : hello.get && hello.get('proto');
    await c.set(prefix, 'v');
    out.get = await c.get(prefix);
    await c.hSet(prefix + ':h', 'f', 'v');
    out.hgetall = await c.hGetAll(prefix + ':h');
    await c.zAdd(prefix + ':z', { score: 1.5, value: 'a' });
    out.zscore = await c.zScore(prefix + ':z', 'a');
    await c.lPush(prefix + ':q', 'job');
    out.brpop = await c.brPop(prefix + ':q', 1);
    out.exec = await c.multi().set(prefix + ':m', 'x').incr(prefix + ':n').exec();
    for (const v of ['1', '2', '3']) {
        await c.lPush(prefix + ':fifo', v);
    }
    out.fifo = [];
    for (let i = 0; i < 3; i++) {
        out.fifo.push(await c.rPop(prefix + ':fifo'));
    }

    // pub/sub: RESP3 pushes on the subscriber's connection
    const sub = await connect();
    const messages = [];
    await sub.subscribe(prefix + ':ch', (m) => messages.push(m));
    await c.publish(prefix + ':ch', 'm1');
    await c.publish(prefix + ':ch', 'm2');
    await waitFor(() => messages.length >= 2, 10000, 'two messages');
    out.messages = messages;
    try {
        out.get_while_subscribed = await sub.get(prefix);
    } catch (e) {
        out.get_while_subscribed_error = String(e);
    }

    // client-side caching (CLIENT TRACKING in RESP3, invalidations pushed)
    const cached = await connect({ clientSideCache: { ttl: 0, maxEntries: 0 } });
    out.cache_first = await cached.get(prefix);
    out.cache_second = await cached.get(prefix);
    await c.set(prefix, 'v2');
    await waitFor(async () => (await cached.get(prefix)) === 'v2', 10000,
        'the cached value to be invalidated');
    out.cache_after = await cached.get(prefix);
    await c.set(prefix, 'v');
    await waitFor(async () => (await cached.get(prefix)) === 'v', 10000, 'the value back');
}

const timer = setTimeout(() => {
    out.error = 'run timeout';
    console.log(JSON.stringify(out));
    process.exit(2);
}, RUN_TIMEOUT_MS);

main().then(() => 0, (e) => {
    out.error = String(e && e.stack ? e.stack : e);
    return 1;
}).then(async (code) => {
    clearTimeout(timer);
    for (const c of clients) {
        try {
            await c.quit();
        } catch (e) {
            // already closed
        }
    }
    console.log(JSON.stringify(out));
    process.exit(code);
});
