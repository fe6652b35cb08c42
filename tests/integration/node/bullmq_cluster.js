'use strict';
// BullMQ through ferry: a Queue and a Worker on one ferry port (ferry in
// front of a Redis Cluster in test_cluster_route), the queue's keys under a
// {hash-tagged} prefix so that every script BullMQ runs names keys of one
// slot. Adds `jobs` jobs, processes them with 4 at once, and prints one JSON
// line: jobs added, jobs processed, distinct jobs processed, the errors the
// queue, the worker or a job met. Gives up after 40 s.
//
// usage: node bullmq_cluster.js PORT JOBS PREFIX

const { Queue, Worker } = require('bullmq');

const { waitFor } = require('./common');

const GIVE_UP_MS = 40000;

async function main() {
    const port = parseInt(process.argv[2], 10);
    const jobs = parseInt(process.argv[3], 10);
    const prefix = process.argv[4];
    const connection = { host: '127.0.0.1', port, maxRetriesPerRequest: null };
    const errors = [];
    const seen = new Map();
    let processed = 0;

    const queue = new Queue('jobs', { connection, prefix });
    queue.on('error', (e) => errors.push('queue: ' + e.message));
    const worker = new Worker(
        'jobs',
        async (job) => {
            processed++;
            seen.set(job.data.n, (seen.get(job.data.n) || 0) + 1);
            return job.data.n * 2;
        },
        { connection, prefix, concurrency: 4 },
    );
    worker.on('error', (e) => errors.push('worker: ' + e.message));
    worker.on('failed', (job, e) => errors.push('job ' + (job && job.id) + ': ' + e.message));

    let added = 0;
    let counts = {};
    try {
        for (let i = 0; i < jobs; i++) {
            await queue.add('n', { n: i });
            added++;
        }
        await waitFor(async () => seen.size >= jobs || errors.length > 0, GIVE_UP_MS, 'the jobs');
        await waitFor(
            async () => (await queue.getJobCounts('completed')).completed >= jobs,
            GIVE_UP_MS,
            'the jobs completed',
        );
        counts = await queue.getJobCounts('completed', 'failed', 'waiting', 'active');
    } catch (e) {
        errors.push('run: ' + e.message);
    }
    const twice = [...seen.values()].filter((v) => v > 1).length;
    console.log(JSON.stringify({ added, processed, distinct: seen.size, twice, counts, errors }));
    await Promise.race([
        Promise.all([worker.close(), queue.close()]),
        new Promise((resolve) => setTimeout(resolve, 5000)),
    ]);
    process.exit(0);
}

main().catch((e) => {
    console.log(JSON.stringify({ errors: ['fatal: ' + (e && e.stack ? e.stack : e)] }));
    process.exit(1);
});
