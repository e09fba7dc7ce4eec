// Browser tests of the dashboard: playwright-core driving Debian's chromium
// against a live coordinator that tests/integ/test_dashboard.c started and
// seeded (real PostgreSQL, signed contribution reports).
//
//   node tests/browser/run.mjs SEED.json
//
// SEED.json (written by the C driver): url, ca, run, empty_run, moe_run, chromium,
// screenshots, steps, total_steps, xss, revoke_reason, users.{organizer,
// auditor, volunteer, volunteer2}.{username,password}, peers[] {username,
// peer_public_key, pass, key_file, sps}, newcomer.
//
// Every test saves a full-page screenshot (printed) and fails on any
// Content-Security-Policy violation or uncaught page error. Exit 0 when all
// pass.
import { createRequire } from 'node:module';
import { readFileSync, mkdirSync, readdirSync, unlinkSync } from 'node:fs';
import { join } from 'node:path';
import https from 'node:https';
import crypto from 'node:crypto';
import assert from 'node:assert/strict';

const require = createRequire(new URL('../../web/package.json', import.meta.url));
const { chromium } = require('playwright-core');

const seed = JSON.parse(readFileSync(process.argv[2], 'utf8'));
const CA = readFileSync(seed.ca);
const RUN = seed.run;
mkdirSync(seed.screenshots, { recursive: true });
// Only this run's screenshots: the directory is the suite's own.
for (const f of readdirSync(seed.screenshots)) if (f.endsWith('.png')) unlinkSync(join(seed.screenshots, f));

// ---- the API from node (verifying the coordinator's certificate) ----
function call(method, path, { token, body, raw } = {}) {
  return new Promise((resolve, reject) => {
    const u = new URL(path, seed.url);
    const data = body === undefined ? null : Buffer.from(typeof body === 'string' ? body : JSON.stringify(body));
    const headers = {};
    if (token) headers.Authorization = `Bearer ${token}`;
    if (data) { headers['Content-Type'] = 'application/json'; headers['Content-Length'] = data.length; }
    const rq = https.request(u, { method, headers, ca: CA, timeout: 20000 }, (res) => {
      const chunks = [];
      res.on('data', (c) => chunks.push(c));
      res.on('end', () => {
        const text = Buffer.concat(chunks).toString('utf8');
        let json = null;
        if (!raw) { try { json = JSON.parse(text); } catch (e) { json = null; } }
        resolve({ status: res.statusCode, headers: res.headers, text, json });
      });
    });
    rq.on('timeout', () => rq.destroy(new Error(`${method} ${path}: timed out`)));
    rq.on('error', reject);
    if (data) rq.write(data);
    rq.end();
  });
}

async function token(who) {
  const u = seed.users[who];
  const r = await call('POST', '/api/v1/session', { body: { username: u.username, password: u.password } });
  assert.equal(r.status, 201, `login ${u.username}: ${r.text}`);
  return r.json.token;
}

// One averaging round of every device at `step`, each report signed with the
// device's peer key over "crowdtrain-report/1\n" + payload (docs/accounting.md).
async function reportStep(step) {
  const keys = seed.peers.map((p) => crypto.createPrivateKey(readFileSync(p.key_file)));
  const truth = seed.peers.map((p) => (p.sps > 0 ? 16 * (p.sps / 5) : 0));
  const round = crypto.createHash('sha256').update(`round-${step}`).digest('hex');
  for (let d = 0; d < seed.peers.length; d++) {
    const p = seed.peers[d];
    const members = {};
    seed.peers.forEach((q, j) => { if (j !== d) members[q.peer_public_key] = truth[j]; });
    const payload = {
      format: 'crowdtrain-report/1', run: RUN, peer: p.peer_public_key, step, group: 'g0', round,
      samples: truth[d], compute_s: p.sps > 0 ? truth[d] / p.sps : 0,
      ...(truth[d] > 0 ? { loss: 0.3 + 0.01 * d } : {}),
      sps: p.sps, round_ms: 150, parts: seed.peers.length, parts_averaged: seed.peers.length,
      members, excluded: [], t: Math.floor(Date.now() / 1000),
    };
    const bytes = Buffer.from(JSON.stringify(payload));
    const sig = crypto.sign(null, Buffer.concat([Buffer.from('crowdtrain-report/1\n'), bytes]), keys[d]);
    const r = await call('POST', `/api/v1/runs/${RUN}/reports`, {
      body: { pass: p.pass, payload: bytes.toString('base64url'), sig: sig.toString('base64url') },
    });
    assert.equal(r.status, 201, `report of ${p.peer_public_key} at step ${step}: ${r.text}`);
  }
}

// ---- the browser ----
// launch() gives chromium a fresh temporary --user-data-dir of its own and
// removes it on close.
const browser = await chromium.launch({
  executablePath: seed.chromium,
  headless: true,
  args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
    '--disable-background-networking', '--disable-component-update', '--disable-sync'],
  timeout: 30000,
});

// A fresh context (own sessionStorage) and page; collects CSP violations and
// page errors, which fail the test.
async function newPage() {
  const context = await browser.newContext({
    ignoreHTTPSErrors: true, viewport: { width: 1280, height: 900 }, acceptDownloads: true,
  });
  const page = await context.newPage();
  page.problems = [];
  page.on('pageerror', (e) => page.problems.push(`page error: ${e.message}`));
  page.on('console', (m) => {
    const t = m.text();
    if (/Content Security Policy|Refused to (execute|load|apply)/i.test(t)) page.problems.push(`CSP: ${t}`);
    else if (m.type() === 'error' && !/Failed to load resource: the server responded with a status of 40[1349]/.test(t)) {
      page.problems.push(`console error: ${t}`);
    }
  });
  page.setDefaultTimeout(15000);
  return page;
}

async function login(page, who) {
  const u = seed.users[who];
  await page.goto(`${seed.url}/#/login`);
  await page.fill('#username', u.username);
  await page.fill('#password', u.password);
  await page.click('#login-form button[type=submit]');
  await page.waitForSelector('#me-username');
  assert.equal(await page.textContent('#me-username'), u.username);
}

const pointsOf = (page, id) => page.evaluate((i) => {
  const u = window.__ctCharts && window.__ctCharts[i];
  if (!u) return -1;
  let n = 0;
  for (let s = 1; s < u.data.length; s++) for (const v of u.data[s]) if (v !== null && v !== undefined) n++;
  return n;
}, id);

async function canvasDrawn(page, id) {
  // uPlot draws into a <canvas>: it must exist, have a size and non-blank pixels.
  return page.evaluate((i) => {
    const c = document.querySelector(`#chart-${i} canvas`);
    if (!c || !c.width || !c.height) return false;
    const px = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
    for (let k = 3; k < px.length; k += 4) if (px[k] !== 0) return true;
    return false;
  }, id);
}

const rowsOf = (page, sel) => page.$$eval(`${sel} tbody tr`, (trs) => trs
  .filter((tr) => !tr.querySelector('td.empty'))
  .map((tr) => [...tr.children].map((td) => td.textContent.trim())));

// An extra screenshot in the middle of a test.
async function shot(page, name) {
  const path = join(seed.screenshots, `${name}.png`);
  await page.screenshot({ path, fullPage: true });
  console.log(`  screenshot ${path}`);
}

const fmt = (x) => Number(x).toLocaleString('en-US', { maximumFractionDigits: 0 });

// The overview's refresh interval (web/src/pages/overview.js, REFRESH_MS).
// The live tests install the page's clock (playwright: time still flows)
// and, once the server holds the change, move it on by one interval, so
// that the refresh due next comes at once instead of up to 4 s later: what
// they check is that one refresh shows the change.
const OVERVIEW_REFRESH_MS = 4000;

// ---- the tests ----
const tests = [];
const test = (name, fn) => tests.push({ name, fn });

test('overview-live', async (page) => {
  await page.clock.install();
  await page.goto(`${seed.url}/#/run/${RUN}`);
  await page.waitForFunction((n) => {
    const u = window.__ctCharts && window.__ctCharts.loss;
    return u && u.data[1].filter((v) => v !== null).length >= n;
  }, seed.steps);
  assert.equal(await pointsOf(page, 'loss'), seed.steps, 'one loss point per seeded step');
  const peers = await pointsOf(page, 'peers');
  const tput = await pointsOf(page, 'throughput');
  assert.ok(peers >= 10, `active-peer points over the aged hour: ${peers}`);
  assert.ok(tput >= 10, `throughput points: ${tput}`);
  for (const id of ['loss', 'peers', 'throughput']) assert.ok(await canvasDrawn(page, id), `${id} canvas drawn`);
  // an MLP run: no language-model charts (overview-albert-heads has them)
  assert.equal(await page.isHidden('#lm-charts'), true);
  assert.equal(await pointsOf(page, 'sop-loss'), -1);
  assert.equal(await pointsOf(page, 'mlm-accuracy'), -1);
  // max peers per minute: the 3 devices whose samples were verified. The
  // public figures count verified claims only (docs/accounting.md), and
  // dave's aggregate-only device claims no samples, so nothing of its
  // reports can be checked against the others'.
  const maxPeers = await page.evaluate(() => Math.max(...window.__ctCharts.peers.data[1]));
  assert.equal(maxPeers, 3);
  assert.equal(await page.textContent('#stat-step'), `${seed.steps - 1} / ${seed.total_steps}`);
  const eta = await page.textContent('#stat-eta');
  assert.match(eta, /^\d+(\.\d)? (s|min|h|days)$/, `ETA: ${eta}`);
  // The description's injected markup is text, not DOM, and never ran.
  const desc = await page.textContent('#run-description');
  assert.ok(desc.includes(seed.xss), `description shown literally: ${desc}`);
  assert.equal(await page.$$eval('#run-description *', (e) => e.length), 0);
  assert.equal(await page.evaluate(() => window.__xss), undefined);
  // Live: two more rounds arrive; the chart grows without a reload.
  await page.evaluate(() => { window.__sameDocument = true; });
  await reportStep(seed.steps);
  await reportStep(seed.steps + 1);
  await page.clock.fastForward(OVERVIEW_REFRESH_MS);
  await page.waitForFunction((n) => window.__ctCharts.loss.data[1].filter((v) => v !== null).length >= n,
    seed.steps + 2, { timeout: 20000 });
  assert.equal(await page.evaluate(() => window.__sameDocument), true, 'updated in place');
  assert.equal(await page.textContent('#stat-step'), `${seed.steps + 1} / ${seed.total_steps}`);
});

// Peers whose rounds average nothing report it with their capabilities
// (stats.averaging): a banner says so within one refresh, their reason shown
// as text, and goes once they average again.
test('overview-not-averaging', async (page) => {
  // the device's own figures, as test_dashboard.c reported them (the
  // schedule, checked later, stays the same)
  const d = seed.peers.findIndex((p) => p.username === seed.users.volunteer.username);
  const dev = seed.peers[d];
  const tok = await token('volunteer');
  const caps = (extra) => call('POST', `/api/v1/runs/${RUN}/capabilities`, {
    token: tok,
    body: { peer_public_key: dev.peer_public_key, samples_per_s: dev.sps, upload_mbps: d === 3 ? 1000 : 50,
      download_mbps: d === 3 ? 1000 : 100, accepts_inbound: d !== 1, ...extra },
  });
  await page.clock.install();
  await page.goto(`${seed.url}/#/run/${RUN}`);
  await page.waitForFunction(() => /^updated /.test(document.querySelector('#updated')?.textContent || ''));
  assert.equal(await page.isVisible('#not-averaging'), false, 'no banner while peers average');
  const reason = `part 0 at 10.77.0.11:4000: connection refused ${seed.xss}`;
  let r = await caps({ failing_rounds: 4, failing_reason: reason });
  assert.equal(r.status, 200, r.text);
  await page.clock.fastForward(OVERVIEW_REFRESH_MS);
  await page.waitForSelector('#not-averaging', { state: 'visible', timeout: 20000 });
  const text = await page.textContent('#not-averaging');
  assert.match(text, /not averaging/, text);
  assert.match(text, /up to 4 in a row/, text);
  assert.equal(await page.textContent('#not-averaging-reason'), reason, 'the reason, as text');
  assert.equal(await page.evaluate(() => window.__xss), undefined);
  await shot(page, 'overview-not-averaging-banner');
  // bad values are refused and change nothing
  for (const bad of [{ failing_rounds: -1 }, { failing_rounds: 'many' }, { failing_reason: 'x'.repeat(400) },
    { reachability: 'punched' }, { reachability: '' }, { address: 'not-an-ip' }, { address: '10.0.0.1:80' },
    { relay: '10.0.0.1:80' }, { reachability: 'relayed', relay: 'relay.example:80' },
    { reachability: 'relayed', relay: '10.0.0.1' }, { reachability: 'relayed', relay: '10.0.0.1:0' },
    { punched: -1 }, { punched: 4097 }, { punched: '2' }, { punched: 1.5 }]) {
    r = await caps(bad);
    assert.equal(r.status, 400, `${JSON.stringify(bad).slice(0, 40)}: ${r.text}`);
  }
  // averaging again: the next report has no failing rounds (and says how
  // peers reach the device: the organizer's live-peers table shows it)
  r = await caps({ reachability: 'direct', address: '10.77.0.11', punched: 2 });
  assert.equal(r.status, 200, r.text);
  await page.clock.fastForward(OVERVIEW_REFRESH_MS);
  await page.waitForSelector('#not-averaging', { state: 'hidden', timeout: 20000 });
});

// A dmoe run gets an Experts tab; its page lists the 16 experts of the 4x4
// grid, none served (no expert server runs here; the page's rows with
// servers are the API's, tested by test_experts_serve). An MLP run has no
// such tab and its experts page says so.
test('experts-page', async (page) => {
  await login(page, 'organizer');
  await page.goto(`${seed.url}/#/run/${seed.moe_run}`);
  await page.waitForSelector('ul.tabs a[href$="/experts"]');
  await page.click('ul.tabs a[href$="/experts"]');
  await page.waitForSelector('#experts-table tbody tr td code');
  const rows = await rowsOf(page, '#experts-table');
  assert.equal(rows.length, 16);
  assert.equal(rows[0][0], 'ffn.0.0');
  assert.equal(rows[15][0], 'ffn.3.3');
  assert.ok(rows.every((r) => r[1] === 'nobody' && r[2] === '—'), `rows: ${JSON.stringify(rows)}`);
  assert.equal(await page.textContent('#experts-served'), '0 of 16');
  assert.equal(await page.textContent('#experts-servers'), '0');
  assert.equal(await page.textContent('#experts-checkpointed'), '0');
  await shot(page, 'experts');
  await page.goto(`${seed.url}/#/run/${RUN}/experts`);
  await page.waitForSelector('#experts .msg');
  assert.equal(await page.textContent('#experts .msg'), 'This run has no mixture-of-experts layer.');
  await page.goto(`${seed.url}/#/run/${RUN}`);
  await page.waitForSelector('#run-status');
  await page.waitForTimeout(300); /* the tab bar's own read of the run */
  const tabs = await page.$$eval('ul.tabs a', (a) => a.map((x) => x.textContent));
  assert.ok(!tabs.includes('Experts'), `tabs: ${tabs}`);
});

// Pipeline runs (tests/integ/test_dashboard.c, test_pipeline_runs, made
// them): pipe-demo (2 stages, dave's two devices, 5 signed steps, stage 0
// at 200 ms a step and stage 1 at 300 ms) gets a Pipeline tab and a grid
// equal to the API's; pipe-wait (2 x 2, no device) shows the waiting state;
// the MLP run has no Pipeline tab.
test('pipeline-page', async (page) => {
  await login(page, 'organizer');
  await page.goto(`${seed.url}/#/run/pipe-demo`);
  await page.waitForSelector('ul.tabs a[href$="/pipeline"]');
  await page.click('ul.tabs a[href$="/pipeline"]');
  await page.waitForSelector('#pipeline-grid tbody .slot');
  const tok = await page.evaluate(() => JSON.parse(sessionStorage.getItem('crowdtrain.session')).token);
  const api = await call('GET', '/api/v1/runs/pipe-demo/pipeline/stages', { token: tok });
  assert.equal(api.status, 200, api.text);
  const rows = await rowsOf(page, '#pipeline-grid');
  assert.equal(rows.length, 1, `rows: ${JSON.stringify(rows)}`);
  assert.equal(rows[0].length, 3);
  api.json.slots.forEach((s, j) => {
    const c = rows[0][1 + j];
    assert.ok(c.startsWith('dave '), c);
    assert.ok(c.includes(`${s.peer_public_key.slice(0, 8)}…`), c);
    assert.ok(c.includes(`${fmt(s.round_ms)} ms/step`), c);
    assert.ok(c.includes(`${s.sps.toLocaleString('en-US', { maximumFractionDigits: 1 })} samples/s`), c);
    assert.ok(c.includes('step 4'), c);
  });
  assert.ok(rows[0][1].includes('200 ms/step') && rows[0][2].includes('300 ms/step'), JSON.stringify(rows));
  const secs = (x) => `${x.toLocaleString('en-US', { maximumFractionDigits: 3 })} s`;
  assert.equal(await page.textContent('#pipeline-predicted'), secs(api.json.predicted.total_s));
  assert.ok((await page.textContent('#pipeline-predicted-split')).startsWith(`dp ${secs(api.json.predicted.dp_s)} + pp `));
  assert.equal(await page.textContent('#pipeline-measured'), '0.3 s');
  assert.equal(await page.textContent('#pipeline-random'), secs(api.json.random_mean_s));
  const tp = await rowsOf(page, '#pipeline-throughput');
  assert.deepEqual(tp.map((r) => r[0]), ['0', '1']);
  assert.equal(tp[1][1], (8000 / 300).toLocaleString('en-US', { maximumFractionDigits: 1 }));
  await shot(page, 'pipeline');
  await page.goto(`${seed.url}/#/run/pipe-wait/pipeline`);
  await page.waitForSelector('#pipeline-waiting');
  assert.equal(await page.textContent('#pipeline-waiting'), 'waiting for volunteers: 0 of 2 x 2');
  await page.goto(`${seed.url}/#/run/${RUN}`);
  await page.waitForSelector('#run-status');
  await page.waitForTimeout(300); /* the tab bar's own read of the run */
  const tabs = await page.$$eval('ul.tabs a', (a) => a.map((x) => x.textContent));
  assert.ok(!tabs.includes('Pipeline'), `tabs: ${tabs}`);
});

test('overview-empty-run', async (page) => {
  await page.goto(`${seed.url}/#/run/${seed.empty_run}`);
  await page.waitForFunction(() => /^updated /.test(document.querySelector('#updated')?.textContent || ''));
  assert.equal(await page.textContent('#stat-step'), '—');
  assert.equal(await page.textContent('#stat-eta'), 'no last step set');
  assert.equal(await pointsOf(page, 'loss'), 0);
  assert.equal(await page.isVisible('#chart-loss + .chart-empty'), true);
  // anonymous: runs list and run pages, no leaderboard names
  await page.goto(`${seed.url}/#/run/${RUN}/leaderboard`);
  await page.waitForSelector('main a[href="#/login"]');
  assert.equal(await page.$('#leaderboard-table'), null);
});

test('leaderboard', async (page) => {
  await login(page, 'volunteer');
  await page.goto(`${seed.url}/#/run/${RUN}/leaderboard`);
  await page.waitForSelector('#leaderboard-table tbody tr td:nth-child(2)');
  const tok = await page.evaluate(() => JSON.parse(sessionStorage.getItem('crowdtrain.session')).token);
  const api = await call('GET', `/api/v1/runs/${RUN}/leaderboard`, { token: tok });
  assert.equal(api.status, 200);
  const rows = await rowsOf(page, '#leaderboard-table');
  assert.equal(rows.length, api.json.users.length);
  api.json.users.forEach((u, i) => {
    assert.equal(rows[i][1], u.username);
    assert.equal(rows[i][3], fmt(u.verified_samples));
    assert.equal(rows[i][5], fmt(u.expert_samples)); // samples their expert servers answered
  });
  assert.equal(rows[0][1], 'bob');
  assert.equal(await page.$$eval('#leaderboard-table .user.me', (e) => e.map((x) => x.textContent).join()), 'bob');
  assert.equal(await pointsOf(page, 'leaderboard'), api.json.users.length, 'one bar per user');
  assert.ok(await canvasDrawn(page, 'leaderboard'));
  // bob's two devices are squares; both reported in the last 10 minutes
  assert.equal(await page.$$eval('#leaderboard-table tbody tr:first-child .devices i.on', (e) => e.length), 2);
});

test('volunteer-page', async (page) => {
  await login(page, 'volunteer');
  await page.waitForSelector('#my-devices-table tbody tr td code');
  const tok = await page.evaluate(() => JSON.parse(sessionStorage.getItem('crowdtrain.session')).token);
  const mine = seed.peers.filter((p) => p.username === seed.users.volunteer.username).map((p) => p.peer_public_key).sort();
  const shown = await page.$$eval('#my-devices-table tbody td code', (e) => e.map((x) => x.getAttribute('title')));
  assert.deepEqual(shown.sort(), mine);
  const sessions = await rowsOf(page, '#my-sessions-table');
  assert.equal(sessions.filter((r) => r[3] === 'this browser').length, 1);
  const c = await call('GET', '/api/v1/me/contributions', { token: tok });
  assert.equal(c.status, 200, c.text);
  const verified = c.json.runs.reduce((a, r) => a + r.verified_samples, 0);
  assert.ok(verified > 0);
  assert.equal(await page.textContent('#my-verified'), fmt(verified));
  const runs = await rowsOf(page, '#my-runs-table');
  assert.equal(runs.length, 1);
  assert.equal(runs[0][0], RUN);
});

test('volunteer-cannot-administer', async (page) => {
  await login(page, 'volunteer');
  const nav = await page.$$eval('nav.top ul a', (a) => a.map((x) => x.textContent));
  assert.ok(!nav.includes('Manage runs') && !nav.includes('Audit log'), `nav: ${nav}`);
  await page.goto(`${seed.url}/#/run/${RUN}`);
  await page.waitForSelector('ul.tabs');
  const tabs = await page.$$eval('ul.tabs a', (a) => a.map((x) => x.textContent));
  assert.deepEqual(tabs, ['Overview', 'Leaderboard']);
  await page.goto(`${seed.url}/#/run/${RUN}/admin`);
  await page.waitForSelector('.msg.error');
  assert.equal(await page.$('#allow-form'), null);
  assert.equal(await page.$('[data-revoke]'), null);
  // The API refuses the organizer's and auditor's endpoints to this session.
  const statuses = await page.evaluate(async (run) => {
    const tok = JSON.parse(sessionStorage.getItem('crowdtrain.session')).token;
    const H = { Authorization: `Bearer ${tok}` };
    const s = async (m, p, b) => (await fetch(p, { method: m, headers: { ...H, 'Content-Type': 'application/json' }, body: b })).status;
    return [
      await s('PUT', `/api/v1/runs/${run}/allowlist/mallory`),
      await s('DELETE', `/api/v1/runs/${run}/allowlist/carol`),
      await s('POST', `/api/v1/runs/${run}/passes/1/revoke`, '{}'),
      await s('GET', `/api/v1/runs/${run}/passes`),
      await s('GET', `/api/v1/runs/${run}/contributions`),
      await s('GET', '/api/v1/audit'),
    ];
  }, RUN);
  assert.deepEqual(statuses, [403, 403, 403, 403, 403, 403]);
  await page.goto(`${seed.url}/#/audit-log`);
  await page.waitForSelector('.msg.error');
  assert.equal(await page.$('#audit-log-table'), null);
  await page.goto(`${seed.url}/#/run/${RUN}/audit`);
  await page.waitForSelector('.msg.error');
  assert.equal(await page.$('#csv-download'), null);
  await page.goto(`${seed.url}/#/run/${RUN}/admin`);
  await page.waitForSelector('.msg.error');
  assert.equal(await page.textContent('.msg.error'), 'Managing a run is for organizers; you are a volunteer.');
});

test('organizer-actions', async (page) => {
  await login(page, 'organizer');
  const nav = await page.$$eval('nav.top ul a', (a) => a.map((x) => x.textContent));
  assert.ok(nav.includes('Manage runs') && nav.includes('Audit log'), `nav: ${nav}`);
  await page.goto(`${seed.url}/#/admin`);
  await page.waitForSelector('#admin-runs-table tbody tr td a');
  const runs = (await rowsOf(page, '#admin-runs-table')).map((r) => r[0]);
  assert.ok(runs.includes(RUN) && runs.includes(seed.empty_run), `runs: ${runs}`);
  // Pause the empty run from its page.
  await page.goto(`${seed.url}/#/run/${seed.empty_run}/admin`);
  await page.waitForSelector('#run-status-select');
  await page.selectOption('#run-status-select', 'paused');
  await page.click('#run-status-save');
  await page.waitForSelector('#admin-result .msg.ok');

  await page.goto(`${seed.url}/#/run/${RUN}/admin`);
  await page.waitForSelector('#allowlist-table tbody tr td button');
  const before = (await rowsOf(page, '#allowlist-table')).map((r) => r[0]);
  assert.deepEqual(before, ['bob', 'carol', 'dave']);
  // add
  await page.fill('#allow-username', seed.newcomer);
  await page.click('#allow-add');
  await page.waitForSelector(`#allowlist-table button[data-user="${seed.newcomer}"]`);
  assert.match(await page.textContent('#admin-result'), /added to the allowlist/);
  // remove
  await page.click(`#allowlist-table button[data-user="${seed.newcomer}"]`);
  await page.waitForSelector(`#allowlist-table button[data-user="${seed.newcomer}"]`, { state: 'detached' });
  assert.match(await page.textContent('#admin-result'), /removed/);
  // revoke carol's pass, with a reason that carries markup
  const carolKey = seed.peers.find((p) => p.username === seed.users.volunteer2.username).peer_public_key;
  const passRow = page.locator('#passes-table tbody tr', { has: page.locator(`code[title="${carolKey}"]`) });
  await passRow.locator('input[data-reason]').fill(seed.revoke_reason);
  await passRow.locator('button[data-revoke]').click();
  await page.waitForFunction((k) => {
    const code = document.querySelector(`#passes-table code[title="${k}"]`);
    return code && code.closest('tr').textContent.includes('revoked');
  }, carolKey);
  const reasonShown = await page.locator('#passes-table tbody tr', { has: page.locator(`code[title="${carolKey}"]`) }).locator('.reason').textContent();
  assert.equal(reasonShown, seed.revoke_reason);
  // peers and their schedule roles
  await page.waitForSelector('#peers-table tbody tr td .role-name');
  const peers = await rowsOf(page, '#peers-table');
  assert.equal(peers.length, seed.peers.length);
  assert.ok(peers.every((r) => r[1] !== '?'), 'every scheduled peer has an owner');
  assert.ok(peers.some((r) => /aggregates/.test(r[2])), `someone aggregates: ${JSON.stringify(peers)}`);
  assert.equal(peers.find((r) => r[1] === 'dave')[2], 'aggregates only', 'the no-compute peer only aggregates');
  // live peers: each device's reachability; bob's report said "direct at
  // 10.77.0.11" with two peers through punched holes, and the page shows
  // where the coordinator saw it come from (this browser test's loopback),
  // not what the report claims
  const live = await rowsOf(page, '#live-peers-table');
  assert.equal(live.length, seed.peers.length, JSON.stringify(live));
  const bobKey = seed.peers.find((p) => p.username === seed.users.volunteer.username).peer_public_key;
  const bobRow = live.find((r) => bobKey.startsWith(r[0].slice(0, 8)) && bobKey.endsWith(r[0].slice(-4)));
  assert.ok(bobRow, `bob's device listed: ${JSON.stringify(live)}`);
  assert.equal(bobRow[2], 'direct; hole-punched with 2 peers');
  assert.equal(bobRow[3], '127.0.0.1');
  assert.ok(live.some((r) => r[2] === 'client mode'), `the device that accepts no connections: ${JSON.stringify(live)}`);
  await shot(page, 'organizer-run-admin-after-actions');
  // The audit log page shows all of it, the reason as text.
  await page.goto(`${seed.url}/#/audit-log`);
  await page.waitForSelector('#audit-log-table tbody tr td code');
  const log = await rowsOf(page, '#audit-log-table');
  const has = (action, target) => log.some((r) => r[2] === seed.users.organizer.username && r[3] === action && (!target || r[4] === target));
  assert.ok(has('allowlist.add', `${RUN}/${seed.newcomer}`), 'allowlist.add logged');
  assert.ok(has('allowlist.remove', `${RUN}/${seed.newcomer}`), 'allowlist.remove logged');
  assert.ok(has('pass.revoke'), 'pass.revoke logged');
  assert.ok(has('run.update', seed.empty_run), 'run.update logged');
  assert.ok(log.some((r) => r[5].includes('<script>window.__xss=1</script>')), 'revoke reason shown as text');
  assert.equal(await page.evaluate(() => window.__xss), undefined);
});

test('revoked-volunteer-sees-it', async (page) => {
  await login(page, 'volunteer2');
  await page.waitForSelector('#my-devices .msg.error');
  const msg = await page.textContent('#my-devices .msg.error');
  assert.ok(msg.includes(seed.revoke_reason), msg);
  assert.equal(await page.$$eval('#my-devices .msg.error *', (e) => e.length), 0);
  assert.equal(await page.evaluate(() => window.__xss), undefined);
  const states = (await rowsOf(page, '#my-devices-table')).map((r) => r[3]);
  assert.deepEqual(states, ['revoked']);
});

test('auditor', async (page) => {
  await login(page, 'auditor');
  const nav = await page.$$eval('nav.top ul a', (a) => a.map((x) => x.textContent));
  assert.ok(!nav.includes('Manage runs') && nav.includes('Audit log'), `nav: ${nav}`);
  const tok = await page.evaluate(() => JSON.parse(sessionStorage.getItem('crowdtrain.session')).token);
  await page.goto(`${seed.url}/#/run/${RUN}/audit`);
  await page.waitForSelector('#audit-users-table tbody tr td .user');
  const tabs = await page.$$eval('ul.tabs a', (a) => a.map((x) => x.textContent));
  assert.deepEqual(tabs, ['Overview', 'Leaderboard', 'Audit']);
  const all = await call('GET', `/api/v1/runs/${RUN}/contributions`, { token: tok });
  assert.equal(all.status, 200, all.text);
  assert.equal(await page.textContent('[data-total="verified samples"]'), fmt(all.json.totals.verified_samples));
  assert.equal(await page.textContent('[data-total="claimed samples"]'), fmt(all.json.totals.claimed_samples));
  assert.ok(all.json.totals.flagged_reports > 0, 'the inflated claims are flagged');
  assert.equal(await page.textContent('[data-total="flagged reports"]'), fmt(all.json.totals.flagged_reports));
  assert.equal((await rowsOf(page, '#audit-users-table')).length, all.json.users.length);
  const flagged = await rowsOf(page, '#audit-flags-table');
  assert.ok(flagged.some((r) => r[1] === seed.users.volunteer2.username), `carol flagged: ${JSON.stringify(flagged)}`);
  // Filter: steps 10-19, user carol.
  await page.fill('#f-step-from', '10');
  await page.fill('#f-step-to', '19');
  await page.fill('#f-user', seed.users.volunteer2.username);
  await page.click('#f-apply');
  await page.waitForFunction(() => {
    const rows = [...document.querySelectorAll('#audit-steps-table tbody tr')];
    return rows.length === 10 && rows.every((r) => r.children[1] && r.children[1].textContent === 'carol');
  });
  const steps = (await rowsOf(page, '#audit-steps-table')).map((r) => Number(r[0].replace(/,/g, '')));
  assert.deepEqual(steps, [10, 11, 12, 13, 14, 15, 16, 17, 18, 19]);
  const users = await rowsOf(page, '#audit-users-table');
  assert.deepEqual(users.map((r) => r[0]), ['carol']);
  assert.equal(await page.textContent('[data-total="users"]'), '1');
  assert.equal(await page.textContent('[data-total="reports"]'), '10');
  const ranged = await call('GET', `/api/v1/runs/${RUN}/contributions?step_from=10&step_to=19`, { token: tok });
  assert.equal(users[0][5], fmt(ranged.json.users.find((u) => u.username === 'carol').verified_samples));
  // CSV download of the filtered range, per user; equal to the API's CSV.
  await page.selectOption('#f-by', 'user');
  const [download] = await Promise.all([page.waitForEvent('download'), page.click('#csv-download')]);
  const csv = readFileSync(await download.path(), 'utf8');
  const apiCsv = await call('GET', `/api/v1/runs/${RUN}/contributions?step_from=10&step_to=19&format=csv&by=user`, { token: tok, raw: true });
  assert.equal(apiCsv.status, 200);
  assert.equal(csv, apiCsv.text);
  const lines = csv.trim().split(/\r?\n/);
  assert.match(lines[0], /^username,peers,reports,steps,claimed_samples,verified_samples/);
  assert.equal(lines.length - 1, ranged.json.users.length);
  assert.match(await page.textContent('#audit-result'), /downloaded .*-contributions-by-user\.csv/);
  await shot(page, 'auditor-filtered');
  // A time window before the run: nothing matches.
  await page.fill('#f-step-from', '');
  await page.fill('#f-step-to', '');
  await page.fill('#f-user', '');
  await page.fill('#f-to', '2001-01-01T00:00');
  await page.click('#f-apply');
  await page.waitForFunction(() => document.querySelector('[data-total="reports"]')?.textContent === '0');
  assert.deepEqual(await rowsOf(page, '#audit-users-table'), []);
  // An auditor reads; writes are refused.
  const w = await call('PUT', `/api/v1/runs/${RUN}/allowlist/mallory`, { token: tok });
  assert.equal(w.status, 403);
  const rv = await call('POST', `/api/v1/runs/${RUN}/passes/1/revoke`, { token: tok, body: {} });
  assert.equal(rv.status, 403);
});

// A language-model run (issue 20): its reports carry ALBERT's sop_loss and
// mlm_accuracy; the overview draws both beside the (masked-LM) loss, one
// point per step, with the curve's samples-weighted means (the accuracy in
// percent). The run, two volunteers and their devices are made here from
// node, so the seeded run's pages stay as the other tests expect them.
test('overview-albert-heads', async (page) => {
  const run = 'albert-demo';
  const org = await token('organizer');
  let r = await call('POST', '/api/v1/runs', { token: org, body: { name: run, target_batch_size: 64, model_summary: 'ALBERT (sentence order)', config: { steps: 100 } } });
  assert.equal(r.status, 201, r.text);
  const devs = [];
  for (const [username, samples] of [['lena', 48], ['marek', 16]]) {
    const password = 'a-long-password';
    r = await call('POST', '/api/v1/users', { token: org, body: { username, role: 'volunteer', password } });
    assert.equal(r.status, 201, r.text);
    r = await call('PUT', `/api/v1/runs/${run}/allowlist/${username}`, { token: org });
    assert.equal(r.status, 201, r.text);
    r = await call('POST', '/api/v1/session', { body: { username, password } });
    const vt = r.json.token;
    const { publicKey, privateKey } = crypto.generateKeyPairSync('ed25519');
    const pk = publicKey.export({ format: 'jwk' }).x;
    const timestamp = Math.floor(Date.now() / 1000);
    const nonce = crypto.randomBytes(16).toString('base64url');
    const msg = `crowdtrain-pass-request/1\n${run}\n${username}\n${pk}\n${timestamp}\n${nonce}`;
    const signature = crypto.sign(null, Buffer.from(msg), privateKey).toString('base64url');
    r = await call('POST', `/api/v1/runs/${run}/passes`, { token: vt, body: { peer_public_key: pk, timestamp, nonce, signature } });
    assert.equal(r.status, 201, r.text);
    devs.push({ pk, key: privateKey, pass: r.json.access_token, samples });
  }
  const STEPS = 6;
  const heads = (step, d) => ({ sop: 0.7 - 0.02 * step - 0.01 * d, acc: 0.02 + 0.03 * step + 0.01 * d });
  for (let step = 0; step < STEPS; step++) {
    const round = crypto.createHash('sha256').update(`albert-round-${step}`).digest('hex');
    for (let d = 0; d < devs.length; d++) {
      const o = devs[1 - d];
      const { sop, acc } = heads(step, d);
      const payload = {
        format: 'crowdtrain-report/1', run, peer: devs[d].pk, step, group: 'all', round,
        samples: devs[d].samples, compute_s: 1, loss: 7 - 0.1 * step, sop_loss: sop, mlm_accuracy: acc,
        sps: 10, round_ms: 150, parts: 2, parts_averaged: 2, members: { [o.pk]: o.samples }, excluded: [],
        t: Math.floor(Date.now() / 1000),
      };
      const bytes = Buffer.from(JSON.stringify(payload));
      const sig = crypto.sign(null, Buffer.concat([Buffer.from('crowdtrain-report/1\n'), bytes]), devs[d].key);
      r = await call('POST', `/api/v1/runs/${run}/reports`, {
        body: { pass: devs[d].pass, payload: bytes.toString('base64url'), sig: sig.toString('base64url') },
      });
      assert.equal(r.status, 201, `report of device ${d} at step ${step}: ${r.text}`);
    }
  }
  await page.goto(`${seed.url}/#/run/${run}`);
  await page.waitForFunction((n) => {
    const a = window.__ctCharts['mlm-accuracy'];
    const s = window.__ctCharts['sop-loss'];
    return a && s && a.data[1].filter((v) => v !== null).length >= n && s.data[1].filter((v) => v !== null).length >= n;
  }, STEPS);
  assert.equal(await pointsOf(page, 'sop-loss'), STEPS);
  assert.equal(await pointsOf(page, 'mlm-accuracy'), STEPS);
  assert.equal(await pointsOf(page, 'loss'), STEPS);
  for (const id of ['loss', 'sop-loss', 'mlm-accuracy']) assert.ok(await canvasDrawn(page, id), `${id} canvas drawn`);
  assert.equal(await page.isVisible('#lm-charts'), true);
  assert.match(await page.textContent('#chart-loss >> xpath=..'), /Masked-LM loss/);
  // what is drawn is the curve's weighted mean: 48 and 16 verified samples
  const want = (step) => {
    const [a, b] = [heads(step, 0), heads(step, 1)];
    return { sop: (48 * a.sop + 16 * b.sop) / 64, acc: 100 * (48 * a.acc + 16 * b.acc) / 64 };
  };
  const drawn = await page.evaluate(() => ({ s: window.__ctCharts['sop-loss'].data, a: window.__ctCharts['mlm-accuracy'].data }));
  for (let step = 0; step < STEPS; step++) {
    assert.equal(drawn.s[0][step], step);
    assert.ok(Math.abs(drawn.s[1][step] - want(step).sop) < 1e-9, `sop loss at step ${step}: ${drawn.s[1][step]}`);
    assert.ok(Math.abs(drawn.a[1][step] - want(step).acc) < 1e-9, `accuracy at step ${step}: ${drawn.a[1][step]}`);
  }
});

// ---- runner ----
let failed = 0;
const t0 = Date.now();
let n = 0;
for (const t of tests) {
  n++;
  const page = await newPage();
  const shot = join(seed.screenshots, `${String(n).padStart(2, '0')}-${t.name}.png`);
  const start = Date.now();
  let err = null;
  try {
    await t.fn(page);
    if (page.problems.length) throw new Error(page.problems.join('\n'));
    // Rendering slips (a missing field printed as-is) fail every page.
    const slip = await page.evaluate(() => (document.body.innerText.match(/\b(null|undefined|NaN)\b|\[object /) || [null])[0]);
    assert.equal(slip, null, `the page shows '${slip}'`);
  } catch (e) {
    err = e;
  }
  try { await page.screenshot({ path: shot, fullPage: true }); } catch (e) { /* reported below */ }
  const secs = ((Date.now() - start) / 1000).toFixed(1);
  if (err) {
    failed++;
    console.log(`FAIL ${t.name} (${secs} s): ${err.stack || err.message}`);
    if (page.problems.length) console.log(`     page problems: ${page.problems.join(' | ')}`);
  } else {
    console.log(`ok   ${t.name} (${secs} s)`);
  }
  console.log(`  screenshot ${shot}`);
  await page.context().close();
}
const version = browser.version();
await browser.close();
console.log(`browser: ${tests.length - failed} passed, ${failed} failed in ${((Date.now() - t0) / 1000).toFixed(1)} s (chromium ${version})`);
process.exit(failed ? 1 : 0);
