'use strict';
// What the Node.js drivers (compat.js, resp3.js, clients.js) share: the
// options of a node-redis or ioredis client of ferry on 127.0.0.1, and the
// polling helpers (a condition waited for with a deadline, Redis' count of
// blocked clients).

const WAIT_STEP_MS = 10;

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

// Resolves once await pred() is true; rejects after ms.
async function waitFor(pred, ms, what) {
    const t0 = Date.now();
    while (!(await pred())) {
        if (Date.now() - t0 > ms) {
            throw new Error('timed out waiting for ' + what);
        }
        await sleep(WAIT_STEP_MS);
    }
}

// Redis' blocked_clients count, from INFO clients through the proxy (c is
// a node-redis or an ioredis client); -1 when INFO does not say.
async function blockedClients(c) {
    const m = /blocked_clients:(\d+)/.exec(await c.info('clients'));
    return m ? parseInt(m[1], 10) : -1;
}

// node-redis createClient options: never reconnects (a dropped connection
// fails the run); resp is the protocol (undefined: the library's default).
function nodeRedisOptions(port, connectTimeout, resp, extra = {}) {
    const opts = {
        socket: { host: '127.0.0.1', port, connectTimeout, reconnectStrategy: false },
        ...extra,
    };
    if (resp !== undefined) {
        opts.RESP = resp;
    }
    return opts;
}

// ioredis options: never retries or reconnects (a dropped connection fails
// the run).
function ioredisOptions(port, connectTimeout, extra = {}) {
    return {
        host: '127.0.0.1',
        port,
        connectTimeout,
        maxRetriesPerRequest: 0,
        retryStrategy: () => null,
        ...extra,
    };
}

module.exports = { sleep, waitFor, blockedClients, nodeRedisOptions, ioredisOptions };
