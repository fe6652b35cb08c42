'use strict';
// BullMQ's QueueEvents and Queue.getWorkers through ferry (ferry in front of
// a Redis Cluster in test_cluster_bullmq), the queue's keys under a
// {hash-tagged} prefix. A QueueEvents (CLIENT SETNAME, then XREAD BLOCK on
// the events stream) listens for 'completed'; a Worker processes `jobs`
// jobs. Prints one JSON line: jobs added, 'completed' events received
// (distinct job ids), the workers Queue.getWorkers() lists while the worker
// runs, and the errors met. Gives up after 40 s.
//
// usage: node bullmq_events.js PORT JOBS PREFIX

const { Queue, QueueEvents, Worker } = require('bullmq');

const { waitFor } = require('./common');

const GIVE_UP_MS = 40000;

async function main() {
    const port = parseInt(process.argv[2], 10);
    const jobs = parseInt(process.argv[3], 10);
    const prefix = process.argv[4];
    const connection = { host: '127.0.0.1', port, maxRetriesPerRequest: null };
    const errors = [];
    const completed = new Set();

    const events = new QueueEvents('ev', { connection, prefix });
    events.on('error', (e) => errors.push('events: ' + e.message));
    events.on('completed', ({ jobId }) => completed.add(jobId));
    await events.waitUntilReady();
    const queue = new Queue('ev', { connection, prefix });
    queue.on('error', (e) => errors.push('queue: ' + e.message));
    const worker = new Worker('ev', async (job) => job.data.n * 2, {
        connection,
        prefix,
        concurrency: 4,
        name: 'w-ferry',
    });
    worker.on('error', (e) => errors.push('worker: ' + e.message));
    worker.on('failed', (job, e) => errors.push('job ' + (job && job.id) + ': ' + e.message));

    let added = 0;
    let workers = [];
    try {
        await worker.waitUntilReady();
        for (let i = 0; i < jobs; i++) {
            await queue.add('n', { n: i });
            added++;
        }
        await waitFor(async () => completed.size >= jobs || errors.length > 0, GIVE_UP_MS,
            'the completed events');
        workers = (await queue.getWorkers()).map((w) => w.rawname || '');
    } catch (e) {
        errors.push('run: ' + e.message);
    }
    console.log(JSON.stringify({ added, completed: completed.size, workers, errors }));
    await Promise.race([
        Promise.all([worker.close(), queue.close(), events.close()]),
        new Promise((resolve) => setTimeout(resolve, 5000)),
    ]);
    process.exit(0);
}

main().catch((e) => {
    console.log(JSON.stringify({ errors: ['fatal: ' + (e && e.stack ? e.stack : e)] }));
    process.exit(1);
});
