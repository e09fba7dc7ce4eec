// The list of runs (public).
import { h, table, fmtNum, fmtTime, fill } from '../dom.js';
import { api, role } from '../api.js';
import { errorBox } from './common.js';

export function render(main) {
  main.appendChild(h('h1', 'Training runs'));
  const box = h('div', { id: 'runs' }, 'loading…');
  main.appendChild(box);
  api.get('/api/v1/runs').then((r) => {
    const org = role() === 'organizer';
    fill(box, table(['run', 'status', 'model', 'target batch', 'created', ''],
      r.runs.map((run) => [
        h('a', { href: `#/run/${encodeURIComponent(run.name)}` }, run.name),
        h(`span.badge.${run.status}`, run.status),
        h('span', run.model_summary, run.description ? h('small.desc', run.description) : null),
        fmtNum(run.target_batch_size), fmtTime(run.created_at),
        h('span.links', h('a', { href: `#/run/${encodeURIComponent(run.name)}/leaderboard` }, 'leaderboard'),
          org ? [' · ', h('a', { href: `#/run/${encodeURIComponent(run.name)}/admin` }, 'manage')] : null),
      ]), 'no runs yet', { id: 'runs-table' }));
  }).catch((e) => fill(box, errorBox(e)));
}
