// A volunteer's own page (any logged-in user, their own records only): the
// devices they joined with (one Ed25519 peer key per device, each with its
// access passes), their open sessions, and their contribution per run and
// device. Data: GET /api/v1/me, /me/passes, /me/sessions, /me/contributions.
import { h, table, fmtNum, fmtDuration, fmtTime, shortKey, message, fill } from '../dom.js';
import { api, session } from '../api.js';
import { forbidden, errorBox, poll } from './common.js';

function devicesFrom(passes, contrib) {
  // peer key -> {key, runs:Set, passes:[], verified}
  const m = new Map();
  for (const p of passes) {
    const d = m.get(p.peer_public_key) || { key: p.peer_public_key, runs: new Set(), passes: [], verified: 0, claimed: 0 };
    d.runs.add(p.run);
    d.passes.push(p);
    m.set(p.peer_public_key, d);
  }
  for (const r of contrib.runs || []) {
    for (const p of r.peers || []) {
      const d = m.get(p.peer_public_key) || { key: p.peer_public_key, runs: new Set(), passes: [], verified: 0, claimed: 0 };
      d.runs.add(r.run);
      d.verified += p.verified_samples;
      d.claimed += p.claimed_samples;
      m.set(p.peer_public_key, d);
    }
  }
  return [...m.values()];
}

function stateOf(d) {
  if (d.passes.some((p) => p.state === 'active')) return 'active';
  if (d.passes.some((p) => p.state === 'revoked')) return 'revoked';
  return d.passes.length ? 'expired' : 'no pass';
}

export function render(main) {
  const s = session();
  if (!s) { forbidden(main, 'This page', 'logged-in users'); return null; }
  main.appendChild(h('h1', 'My contribution'));
  const who = h('p', { id: 'me' }, 'loading…');
  const contribBox = h('section', { id: 'my-contributions' });
  const devBox = h('section', { id: 'my-devices' });
  const sessBox = h('section', { id: 'my-sessions' });
  main.append(who, contribBox, devBox, sessBox);
  const status = h('p.updated', { id: 'updated' });
  main.appendChild(status);

  api.get('/api/v1/me').then((m) => {
    fill(who, 'Logged in as ', h('strong', { id: 'me-username' }, m.username), ' · role ',
      h('span', { id: 'me-role' }, m.role));
  }).catch((e) => fill(who, errorBox(e)));

  const stop = poll(async () => {
    const [passes, contrib, sessions] = await Promise.all([
      api.get('/api/v1/me/passes'),
      api.get('/api/v1/me/contributions').catch((e) => ({ runs: [], error: e })),
      api.get('/api/v1/me/sessions'),
    ]);
    const runs = contrib.runs || [];
    const totV = runs.reduce((a, r) => a + r.verified_samples, 0);
    const totC = runs.reduce((a, r) => a + r.compute_s, 0);
    fill(contribBox, h('h2', 'Contribution'),
      contrib.error ? errorBox(contrib.error) : null,
      h('p.summary', h('strong', { id: 'my-verified' }, fmtNum(totV)), ' verified samples · ',
        fmtDuration(totC), ' of compute across ', String(runs.length), runs.length === 1 ? ' run' : ' runs'),
      table(['run', 'verified samples', 'claimed', 'flagged reports', 'steps', 'compute', 'first', 'last'],
        runs.map((r) => [h('a', { href: `#/run/${encodeURIComponent(r.run)}` }, r.run), fmtNum(r.verified_samples),
          fmtNum(r.claimed_samples), r.flagged_reports ? h('span.flag', fmtNum(r.flagged_reports)) : '0',
          fmtNum(r.steps), fmtDuration(r.compute_s), fmtTime(r.first_at), fmtTime(r.last_at)]),
        'no contribution reports yet: join a run with crowdtrain-agent join', { id: 'my-runs-table' }));
    const devices = devicesFrom(passes.passes, contrib);
    fill(devBox, h('h2', 'Devices'),
      h('p.hint', 'Each device is the peer key its agent created at login; passes are renewed automatically.'),
      table(['peer key', 'runs', 'passes', 'state', 'latest expiry', 'verified samples'],
        devices.map((d) => [h('code', { title: d.key }, shortKey(d.key)), [...d.runs].join(', '),
          String(d.passes.length), h(`span.badge.${stateOf(d).replace(' ', '-')}`, stateOf(d)),
          fmtTime(Math.max(0, ...d.passes.map((p) => p.expires_at))), fmtNum(d.verified)]),
        'no devices yet', { id: 'my-devices-table' }),
      passes.passes.some((p) => p.state === 'revoked')
        ? message('error', 'An organizer revoked a pass of yours: ' +
          passes.passes.filter((p) => p.state === 'revoked').map((p) => `${p.run} #${p.pass_id}: ${p.revoke_reason}`).join('; '))
        : null);
    fill(sessBox, h('h2', 'Sessions'),
      table(['session', 'started', 'expires', ''],
        sessions.sessions.map((x) => [h('code', x.id), fmtTime(x.created_at), fmtTime(x.expires_at), x.current ? 'this browser' : '']),
        'none', { id: 'my-sessions-table' }));
  }, 10000, status);
  return stop;
}
