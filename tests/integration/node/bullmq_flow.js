'use strict';
// BullMQ's FlowProducer through ferry (in front of a Redis Cluster in
// test_cluster_multi): `flows` flows, each a parent job with `children`
// children, added with FlowProducer.add (one MULTI/EXEC per flow), every
// key under a {hash-tagged} prefix. A worker on the children's queue and
// one on the parents' process them; a parent runs once all its children
// are done and reads their results. Prints one JSON line: flows added, the
// children and parents processed (distinct, twice), the sums the parents
// read, the errors met. Gives up after 40 s.
//
// usage: node bullmq_flow.js PORT FLOWS CHILDREN PREFIX

const { FlowProducer, Worker, Queue } = require('bullmq');

const { waitFor } = require('./common');

const GIVE_UP_MS = 40000;

async function main() {
    const port = parseInt(process.argv[2], 10);
    const flows = parseInt(process.argv[3], 10);
    const children = parseInt(process.argv[4], 10);
    const prefix = process.argv[5];
    const connection = { host: '127.0.0.1', port, maxRetriesPerRequest: null };
    const errors = [];
    const kids = new Map();
    const parents = new Map();
    const sums = [];

    const producer = new FlowProducer({ connection, prefix });
    producer.on('error', (e) => errors.push('producer: ' + e.message));
    const kidWorker = new Worker(
        'steps',
        async (job) => {
            const k = job.data.flow + ':' + job.data.n;
            kids.set(k, (kids.get(k) || 0) + 1);
            return job.data.n;
        },
        { connection, prefix, concurrency: 4 },
    );
    const parentWorker = new Worker(
        'flows',
        async (job) => {
            parents.set(job.data.flow, (parents.get(job.data.flow) || 0) + 1);
            const values = await job.getChildrenValues();
            sums.push(Object.values(values).reduce((a, b) => a + b, 0));
            return 'done';
        },
        { connection, prefix, concurrency: 2 },
    );
    for (const [name, w] of [['steps', kidWorker], ['flows', parentWorker]]) {
        w.on('error', (e) => errors.push(name + ' worker: ' + e.message));
        w.on('failed', (job, e) => errors.push(name + ' job ' + (job && job.id) + ': ' + e.message));
    }
    const parentsQueue = new Queue('flows', { connection, prefix });

    let added = 0;
    let counts = {};
    try {
        for (let f = 0; f < flows; f++) {
            const kidsOf = [];
            for (let n = 0; n < children; n++) {
                kidsOf.push({ name: 'step', queueName: 'steps', data: { flow: f, n } });
            }
            await producer.add({ name: 'flow', queueName: 'flows', data: { flow: f }, children: kidsOf });
            added++;
        }
        await waitFor(async () => sums.length >= flows || errors.length > 0, GIVE_UP_MS, 'the flows');
        await waitFor(
            async () => (await parentsQueue.getJobCounts('completed')).completed >= flows,
            GIVE_UP_MS,
            'the flows completed',
        );
        counts = await parentsQueue.getJobCounts('completed', 'failed', 'waiting', 'active', 'waiting-children');
    } catch (e) {
        errors.push('run: ' + e.message);
    }
    const twice = [...kids.values(), ...parents.values()].filter((v) => v > 1).length;
    console.log(
        JSON.stringify({
            added,
            children: kids.size,
            parents: parents.size,
            twice,
            sums,
            counts,
            errors,
        }),
    );
    await Promise.race([
        Promise.all([kidWorker.close(), parentWorker.close(), producer.close(), parentsQueue.close()]),
        new Promise((resolve) => setTimeout(resolve, 5000)),
    ]);
    process.exit(0);
}

main().catch((e) => {
    console.log(JSON.stringify({ errors: ['fatal: ' + (e && e.stack ? e.stack : e)] }));
    process.exit(1);
});
