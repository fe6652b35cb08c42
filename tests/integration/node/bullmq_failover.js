'use strict';
// BullMQ through ferry across a failover (test_cluster_bullmq_failover): the
// queue's keys under a {hash-tagged} prefix, so they all live on one master
// of the cluster ferry fronts, which the test kills (kill -9) mid-run.
//
// Two producers (one Queue.add after the other, one Queue.addBulk of 5 after
// the other) and two Workers (concurrency 4 each), a QueueEvents listening
// for 'completed'. Every job carries a number of its own (data.n): a job is
// acknowledged once its add resolved.
//
// While running it prints a progress line every 100 ms:
//   {"progress": {"added": A, "processed": P}}
// On a line "stop" on stdin the producers stop; it then waits (up to 100 s)
// until every acknowledged job was processed and nothing is left waiting or
// active, and prints one JSON line with the accounting: jobs added, their
// completions counted by number (processed, distinct, duplicates, missing),
// the completed set read back from Redis, the job counts, the 'error',
// 'failed' and 'stalled' events and rejected adds, and the longest gap
// between two acknowledged adds and between two completions.
//
// usage: node bullmq_failover.js PORT PREFIX

const readline = require('readline');

const { Queue, QueueEvents, Worker } = require('bullmq');

const { sleep, waitFor } = require('./common');

// A moveToActive sent again after the kill (its reply lost, the first one on
// the promoted replica) leaves a job active with nobody's lock: BullMQ's
// stalled check moves it back after lockDuration + stalledInterval (30 s +
// 30 s by default), so the drain waits longer than that.
const DRAIN_MS = 100000;
const BULK = 5;
const PROGRESS_MS = 100;

async function main() {
    const port = parseInt(process.argv[2], 10);
    const prefix = process.argv[3];
    const connection = { host: '127.0.0.1', port, maxRetriesPerRequest: null };
    const name = 'fo';
    const errors = [];
    const stalled = [];
    const acked = new Map(); // n -> job id
    const done = new Map(); // n -> completions
    const doneIds = new Map(); // job id -> completions
    const gaps = { add: 0, done: 0 };
    let lastAdd = 0;
    let lastDone = 0;
    let processed = 0;
    let next = 0;
    let stopping = false;

    const note = (what) => {
        const now = Date.now();
        if (what === 'add') {
            if (lastAdd) gaps.add = Math.max(gaps.add, now - lastAdd);
            lastAdd = now;
        } else {
            if (lastDone) gaps.done = Math.max(gaps.done, now - lastDone);
            lastDone = now;
        }
    };

    const events = new QueueEvents(name, { connection, prefix });
    const eventIds = new Set();
    events.on('error', (e) => errors.push('events: ' + e.message));
    events.on('completed', ({ jobId }) => eventIds.add(jobId));
    await events.waitUntilReady();

    const queue = new Queue(name, { connection, prefix });
    queue.on('error', (e) => errors.push('queue: ' + e.message));
    const workers = [];
    for (let w = 0; w < 2; w++) {
        const worker = new Worker(
            name,
            async (job) => {
                processed++;
                done.set(job.data.n, (done.get(job.data.n) || 0) + 1);
                doneIds.set(job.id, (doneIds.get(job.id) || 0) + 1);
                note('done');
                return job.data.n;
            },
            { connection, prefix, concurrency: 4, name: 'w' + w },
        );
        worker.on('error', (e) => errors.push('worker ' + w + ': ' + e.message));
        worker.on('failed', (job, e) =>
            errors.push('failed ' + (job && job.id) + ' (n ' + (job && job.data.n) + '): ' + e.message));
        worker.on('stalled', (id) => stalled.push(id));
        workers.push(worker);
    }
    await Promise.all(workers.map((w) => w.waitUntilReady()));

    async function addOne() {
        while (!stopping) {
            const n = next++;
            try {
                const job = await queue.add('n', { n });
                acked.set(n, job.id);
                note('add');
            } catch (e) {
                errors.push('add n ' + n + ': ' + e.message);
            }
        }
    }
    async function addBulk() {
        while (!stopping) {
            const ns = [];
            for (let i = 0; i < BULK; i++) ns.push(next++);
            try {
                const jobs = await queue.addBulk(ns.map((n) => ({ name: 'n', data: { n } })));
                jobs.forEach((job, i) => acked.set(ns[i], job.id));
                note('add');
            } catch (e) {
                errors.push('addBulk n ' + ns[0] + '..: ' + e.message);
            }
        }
    }

    const progress = setInterval(() => {
        console.log(JSON.stringify({ progress: { added: acked.size, processed } }));
    }, PROGRESS_MS);
    const stopped = new Promise((resolve) => {
        const rl = readline.createInterface({ input: process.stdin });
        rl.on('line', (line) => {
            if (line.trim() === 'stop') resolve();
        });
        rl.on('close', resolve);
    });
    const producers = [addOne(), addBulk()];
    await stopped;
    stopping = true;
    await Promise.all(producers);

    let counts = {};
    let completedInRedis = [];
    const t0 = Date.now();
    try {
        await waitFor(
            async () => [...acked.keys()].every((n) => done.has(n)),
            DRAIN_MS,
            'every acknowledged job processed',
        );
        await waitFor(
            async () => {
                counts = await queue.getJobCounts('completed', 'failed', 'waiting', 'active',
                    'delayed', 'prioritized', 'waiting-children');
                return counts.completed >= acked.size && counts.active === 0 && counts.waiting === 0;
            },
            DRAIN_MS,
            'the queue drained',
        );
        // the completions counted in Redis: every completed job's number
        const jobs = await queue.getJobs(['completed'], 0, -1);
        completedInRedis = jobs.map((j) => j.data.n);
        await sleep(200); // the last QueueEvents
    } catch (e) {
        errors.push('drain: ' + e.message);
    }
    clearInterval(progress);
    const missing = [...acked.keys()].filter((n) => !done.has(n));
    const redisSet = new Map();
    for (const n of completedInRedis) redisSet.set(n, (redisSet.get(n) || 0) + 1);
    console.log(JSON.stringify({
        added: acked.size,
        processed,
        distinct: done.size,
        duplicates: [...done.entries()].filter(([, c]) => c > 1).map(([n]) => n),
        duplicate_ids: [...doneIds.entries()].filter(([, c]) => c > 1).map(([id]) => id),
        missing: missing.slice(0, 20),
        missing_count: missing.length,
        unacked_processed: [...done.keys()].filter((n) => !acked.has(n)).length,
        redis_completed: completedInRedis.length,
        redis_completed_twice: [...redisSet.values()].filter((c) => c > 1).length,
        redis_missing: [...acked.keys()].filter((n) => !redisSet.has(n)).length,
        distinct_ids: new Set(acked.values()).size,
        acked_ids: [...acked.values()],
        counts,
        events_completed: eventIds.size,
        stalled,
        gap_add_ms: gaps.add,
        gap_done_ms: gaps.done,
        drain_ms: Date.now() - t0,
        errors,
    }));
    await Promise.race([
        Promise.all([...workers.map((w) => w.close()), queue.close(), events.close()]),
        sleep(5000),
    ]);
    process.exit(0);
}

main().catch((e) => {
    console.log(JSON.stringify({ errors: ['fatal: ' + (e && e.stack ? e.stack : e)] }));
    process.exit(1);
});
