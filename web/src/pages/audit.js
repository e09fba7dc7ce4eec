// Auditors and organizers: who contributed what to a run, verified against
// claimed, with filters (report time, step range, user), the per-step
// evidence, flagged peers, and CSV downloads of the same numbers. Read-only.
// Data: GET /api/v1/runs/{run}/contributions[?format=csv], /contributions/steps,
// /flags (docs/accounting.md, "Auditor API").
import { h, table, fmtNum, fmtDuration, fmtTime, shortKey, message, fill } from '../dom.js';
import { api, seg, role } from '../api.js';
import { runTabs, forbidden, errorBox } from './common.js';

const STEP_ROWS = 500;

// <input type=datetime-local> (UTC) -> Unix seconds, or null
function unixOf(v) {
  if (!v) return null;
  const t = Date.parse(`${v}Z`);
  return Number.isFinite(t) ? Math.floor(t / 1000) : null;
}

export function render(main, [run]) {
  main.appendChild(runTabs(run, '/audit'));
  const r = role();
  if (r !== 'auditor' && r !== 'organizer') { forbidden(main, 'The audit page', 'auditors and organizers'); return null; }
  const R = `/api/v1/runs/${seg(run)}`;
  const f = {
    from: h('input', { id: 'f-from', type: 'datetime-local' }),
    to: h('input', { id: 'f-to', type: 'datetime-local' }),
    stepFrom: h('input', { id: 'f-step-from', type: 'number', min: 0, placeholder: 'first' }),
    stepTo: h('input', { id: 'f-step-to', type: 'number', min: 0, placeholder: 'last' }),
    user: h('input', { id: 'f-user', placeholder: 'any', maxlength: 64 }),
    by: h('select', { id: 'f-by' }, h('option', { value: 'peer' }, 'per device'), h('option', { value: 'user' }, 'per user')),
  };
  const form = h('form.filters.card', { id: 'audit-filters' },
    h('label', 'received from (UTC) ', f.from), h('label', 'to ', f.to),
    h('label', 'steps ', f.stepFrom, ' – ', f.stepTo), h('label', 'user ', f.user),
    h('button', { type: 'submit', id: 'f-apply' }, 'Apply'),
    h('span.sep'),
    h('label', 'CSV ', f.by), h('button', { type: 'button', id: 'csv-download' }, 'Download CSV'),
    h('button', { type: 'button', id: 'csv-steps' }, 'Step detail CSV'));
  const out = h('div', { id: 'audit-result' });
  const totals = h('section', { id: 'audit-totals' });
  const users = h('section', { id: 'audit-users' });
  const peers = h('section', { id: 'audit-peers' });
  const steps = h('section', { id: 'audit-steps' });
  const flags = h('section', { id: 'audit-flags' });
  main.append(form, out, totals, users, peers, flags, steps);

  function query(extra = {}) {
    const q = new URLSearchParams();
    const from = unixOf(f.from.value), to = unixOf(f.to.value);
    if (from !== null) q.set('from', from);
    if (to !== null) q.set('to', to);
    if (f.stepFrom.value !== '') q.set('step_from', f.stepFrom.value);
    if (f.stepTo.value !== '') q.set('step_to', f.stepTo.value);
    for (const [k, v] of Object.entries(extra)) q.set(k, v);
    return q;
  }
  function stepQuery(extra = {}) {
    const q = new URLSearchParams();
    if (f.stepFrom.value !== '') q.set('from', f.stepFrom.value);
    if (f.stepTo.value !== '') q.set('to', f.stepTo.value);
    if (f.user.value.trim()) q.set('user', f.user.value.trim());
    for (const [k, v] of Object.entries(extra)) q.set(k, v);
    return q;
  }

  async function download(path, name) {
    try {
      const resp = await api.get(path, { raw: true });
      const blob = await resp.blob();
      const url = URL.createObjectURL(blob);
      const a = h('a', { href: url, download: name });
      document.body.appendChild(a);
      a.click();
      a.remove();
      setTimeout(() => URL.revokeObjectURL(url), 10000);
      fill(out, message('ok', `downloaded ${name} (${fmtNum(blob.size)} bytes)`));
    } catch (e) { fill(out, errorBox(e)); }
  }
  form.querySelector('#csv-download').addEventListener('click', () =>
    download(`${R}/contributions?${query({ format: 'csv', by: f.by.value })}`, `${run}-contributions-by-${f.by.value}.csv`));
  form.querySelector('#csv-steps').addEventListener('click', () =>
    download(`${R}/contributions/steps?${stepQuery({ format: 'csv' })}`, `${run}-steps.csv`));

  async function load() {
    fill(out, message('info', 'loading…'));
    const user = f.user.value.trim();
    const [c, s, fl] = await Promise.all([
      api.get(`${R}/contributions?${query()}`),
      api.get(`${R}/contributions/steps?${stepQuery({ limit: STEP_ROWS })}`),
      api.get(`${R}/flags`),
    ]);
    const us = user ? c.users.filter((u) => u.username === user) : c.users;
    const ps = user ? c.peers.filter((p) => p.username === user) : c.peers;
    // The API totals cover every user; with a user filter, that user's row is the total.
    const t = user ? (us[0] ? { ...us[0], users: 1 } : {
      reports: 0, users: 0, peers: 0, steps: 0, claimed_samples: 0, verified_samples: 0, flagged_reports: 0, compute_s: 0,
    }) : c.totals;
    fill(totals, h('h2', user ? `Totals for ${user}` : 'Totals'), h('div.stats',
      [['reports', t.reports], ['users', t.users], ['devices', t.peers], ['steps', t.steps],
        ['claimed samples', t.claimed_samples], ['verified samples', t.verified_samples],
        ['flagged reports', t.flagged_reports]].map(([k, v]) => h('div.stat', h('div.label', k), h('div.value', { 'data-total': k }, fmtNum(v)))),
      h('div.stat', h('div.label', 'compute'), h('div.value', fmtDuration(t.compute_s)))));
    fill(users, h('h2', 'Per user'), table(
      ['username', 'devices', 'reports', 'steps', 'claimed', 'verified', 'flagged', 'compute', 'first', 'last'],
      us.map((u) => [h('span.user', u.username), fmtNum(u.peers), fmtNum(u.reports), fmtNum(u.steps),
        fmtNum(u.claimed_samples), fmtNum(u.verified_samples),
        u.flagged_reports ? h('span.flag', fmtNum(u.flagged_reports)) : '0',
        fmtDuration(u.compute_s), fmtTime(u.first_at), fmtTime(u.last_at)]), 'no reports match', { id: 'audit-users-table' }));
    fill(peers, h('h2', 'Per device'), table(
      ['peer key', 'username', 'reports', 'claimed', 'verified', 'flagged', 'compute', 'last'],
      ps.map((p) => [h('code', { title: p.peer_public_key }, shortKey(p.peer_public_key)), p.username, fmtNum(p.reports),
        fmtNum(p.claimed_samples), fmtNum(p.verified_samples),
        p.flagged_reports ? h('span.flag', fmtNum(p.flagged_reports)) : '0', fmtDuration(p.compute_s), fmtTime(p.last_at)]),
      'no reports match', { id: 'audit-peers-table' }));
    fill(flags, h('h2', 'Flagged devices'), table(
      ['peer key', 'username', 'inflated claims', 'excluded (reports / by)', 'conflicting duplicates', 'last'],
      fl.peers.map((p) => [h('code', { title: p.peer_public_key }, shortKey(p.peer_public_key)), p.username ?? '(never reported)',
        fmtNum(p.inflated_claims), `${fmtNum(p.excluded_reports)} / ${fmtNum(p.excluded_by)}`,
        fmtNum(p.conflicting_duplicates), fmtTime(p.last_at)]), 'no flags', { id: 'audit-flags-table' }));
    fill(steps, h('h2', `Step detail${s.truncated ? ` (first ${STEP_ROWS} rows; narrow the steps or download the CSV)` : ''}`), table(
      ['step', 'username', 'peer key', 'group', 'claimed', 'seen (min–max)', 'observers', 'verified', 'loss', 'received'],
      s.rows.map((x) => [fmtNum(x.step), x.username, h('code', { title: x.peer_public_key }, shortKey(x.peer_public_key)), x.group,
        fmtNum(x.claimed_samples), x.seen_min === null ? '—' : `${fmtNum(x.seen_min)}–${fmtNum(x.seen_max)}`,
        fmtNum(x.observers), h(x.inflated || x.excluded ? 'span.flag' : 'span', fmtNum(x.verified_samples)),
        x.loss === null || x.loss === undefined ? '—' : fmtNum(x.loss, 4), fmtTime(x.received_at)]),
      'no reports match', { id: 'audit-steps-table' }));
    fill(out);
  }
  form.addEventListener('submit', (ev) => { ev.preventDefault(); load().catch((e) => fill(out, errorBox(e))); });
  load().catch((e) => fill(out, errorBox(e)));
  return null;
}
