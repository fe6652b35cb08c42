'use strict';
// The stats port's page in a real browser (Debian's chromium, driven by
// puppeteer-core), for test_page.py.
//
//   node page.js <stats port> <output folder>
//
// Opens http://127.0.0.1:<port>/ and prints one JSON object a line on
// stdout: {"ev":"view", "t": unix ms, "state", "master", "epoch", "pending",
// "latency" (p50 / p99 ms)}
// whenever what the page shows changes (looked at every 25 ms), {"ev":
// "console"|"pageerror"|"requestfailed", "text"} for each error the page
// meets, {"ev":"shot","file"} once a screenshot is written, {"ev":"widths",
// "page": [scroll width, viewport width], "cards": [{"card": its heading,
// "scroll", "client"}, ...], "loops": the Loops table's rows, "loops_titles": its
// master cells' titles} when asked.
// Lines read on stdin: "shot <name>" (a screenshot <name>.png in the output
// folder), "widths", "quit". Exits by itself after 120 s.

const path = require('path');
const readline = require('readline');
const puppeteer = require('puppeteer-core');

const CHROMIUM = process.env.CHROMIUM || '/usr/bin/chromium';
const LOOK_MS = 25;
const MAX_RUN_MS = 120000;

const [port, outDir] = process.argv.slice(2);
const say = (o) => process.stdout.write(JSON.stringify(o) + '\n');

async function main() {
    const browser = await puppeteer.launch({
        executablePath: CHROMIUM,
        headless: true,
        args: ['--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage', '--no-first-run'],
    });
    const done = setTimeout(() => { say({ev: 'timeout'}); browser.close().then(() => process.exit(2)); }, MAX_RUN_MS);
    const page = await browser.newPage();
    await page.setViewport({width: 1280, height: 1000});
    page.on('console', (m) => {
        if (m.type() === 'error') say({ev: 'console', text: m.text()});
    });
    page.on('pageerror', (e) => say({ev: 'pageerror', text: String(e)}));
    page.on('requestfailed', (r) => say({ev: 'requestfailed', text: r.url() + ' ' + (r.failure() || {}).errorText}));
    await page.goto('http://127.0.0.1:' + port + '/', {waitUntil: 'load'});
    say({ev: 'loaded', t: Date.now()});

    let last = '';
    let quit = false;
    const rl = readline.createInterface({input: process.stdin});
    const jobs = [];
    rl.on('line', (line) => jobs.push(line.trim()));
    rl.on('close', () => { quit = true; });
    while (!quit) {
        const v = await page.evaluate(() => {
            const cell = document.querySelector('#fallback tr:nth-child(2) td');
            return {
                state: document.getElementById('state').textContent,
                master: document.getElementById('master').textContent,
                epoch: document.getElementById('epoch').textContent,
                pending: cell ? cell.textContent : '',
                error: document.getElementById('err').textContent,
                latency: document.getElementById('v_lat').textContent,
            };
        });
        const key = JSON.stringify(v);
        if (key !== last) {
            last = key;
            say(Object.assign({ev: 'view', t: Date.now()}, v));
        }
        while (jobs.length > 0) {
            const job = jobs.shift();
            if (job === 'quit') {
                quit = true;
            } else if (job.startsWith('shot ')) {
                const file = path.join(outDir, job.slice(5) + '.png');
                await page.screenshot({path: file, fullPage: true});
                say({ev: 'shot', file: file});
            } else if (job === 'widths') {
                // A card wider inside than its box shows a horizontal scroll
                // bar (or spills over its neighbour).
                say(Object.assign({ev: 'widths'}, await page.evaluate(() => ({
                    page: [document.documentElement.scrollWidth, window.innerWidth],
                    cards: Array.from(document.querySelectorAll('main > section'))
                        .filter((s) => !s.hidden)
                        .map((s) => ({card: s.querySelector('h2').textContent,
                                      scroll: s.scrollWidth, client: s.clientWidth})),
                    loops: Array.from(document.querySelectorAll('#loops tr'))
                        .map((tr) => Array.from(tr.cells).map((c) => c.textContent)),
                    loops_titles: Array.from(document.querySelectorAll('#loops td:last-child'))
                        .map((c) => c.title),
                }))));
            }
        }
        await new Promise((r) => setTimeout(r, LOOK_MS));
    }
    clearTimeout(done);
    await browser.close();
    say({ev: 'bye'});
}

main().catch((e) => { say({ev: 'fatal', text: String(e && e.stack || e)}); process.exit(1); });
