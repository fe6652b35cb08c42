'use strict';
// ioredis and node-redis over TLS, driven by test_tls.py.
//
// Usage: node tls.js PORT CA_FILE PREFIX [CERT_FILE KEY_FILE]
// Connects to 127.0.0.1:PORT with each client over TLS (the server's
// certificate checked against CA_FILE, a client certificate if given),
// writes and reads a few keys under PREFIX, and prints one JSON object.
// Exit status 0 when both ran, 1 on an error (the object has "error").

const fs = require('fs');
const Redis = require('ioredis');
const { createClient } = require('redis');

const port = parseInt(process.argv[2], 10);
const ca = fs.readFileSync(process.argv[3]);
const prefix = process.argv[4] || 'node';
const cert = process.argv[5] ? fs.readFileSync(process.argv[5]) : undefined;
const key = process.argv[6] ? fs.readFileSync(process.argv[6]) : undefined;
const out = {};

async function ioredis() {
    const r = new Redis({
        host: '127.0.0.1', port, connectTimeout: 5000, commandTimeout: 5000,
        maxRetriesPerRequest: 0, retryStrategy: () => null,
        tls: { ca, cert, key, servername: 'localhost' },
    });
    try {
        out.ioredis_set = await r.set(prefix + ':io', 'v1');
        out.ioredis_get = await r.get(prefix + ':io');
        const p = r.pipeline();
        for (let i = 0; i < 500; i++) {
            p.rpush(prefix + ':ioq', String(i));
        }
        const res = await p.exec();
        out.ioredis_pipeline_last = res[res.length - 1][1];
        out.ioredis_brpop = await r.brpop(prefix + ':ioq', 1);
    } finally {
        r.disconnect();
    }
}

async function nodeRedis() {
    const c = createClient({
        socket: { host: '127.0.0.1', port, tls: true, ca, cert, key, servername: 'localhost',
                  connectTimeout: 5000, reconnectStrategy: false },
    });
    c.on('error', (e) => { out.node_redis_conn_error = String(e); });
    await c.connect();
    try {
        out.node_redis_set = await c.set(prefix + ':nr', 'v2');
        out.node_redis_get = await c.get(prefix + ':nr');
        const m = c.multi();
        m.incr(prefix + ':nrn');
        m.incr(prefix + ':nrn');
        out.node_redis_exec = await m.exec();
    } finally {
        await c.quit();
    }
}

const deadline = setTimeout(() => {
    out.error = 'deadline';
    console.log(JSON.stringify(out));
    process.exit(2);
}, 40000);

(async () => {
    try {
        await ioredis();
        await nodeRedis();
    } catch (e) {
        out.error = String(e && e.stack || e);
        console.log(JSON.stringify(out));
        process.exit(1);
    }
    clearTimeout(deadline);
    console.log(JSON.stringify(out));
    process.exit(0);
})();
