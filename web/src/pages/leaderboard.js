// Contribution leaderboard (any logged-in user): verified samples per
// volunteer, their devices (a filled square per device active in the last
// 10 minutes), greyed when inactive, like the sahajBERT participants chart
// (seed 001). Data: GET /api/v1/runs/{run}/leaderboard.
import { h, table, fmtNum, fmtDuration, fmtTime, fill } from '../dom.js';
import { api, seg, session } from '../api.js';
import { barChart } from '../chart.js';
import { runTabs, poll, errorBox } from './common.js';

const TOP = 30;

export function render(main, [run]) {
  main.appendChild(runTabs(run, '/leaderboard'));
  if (!session()) {
    main.appendChild(h('p', 'The leaderboard names volunteers, so it is shown to logged-in participants. ',
      h('a', { href: '#/login' }, 'Log in')));
    return null;
  }
  const charts = h('section.charts');
  main.appendChild(charts);
  const chart = barChart(charts, 'leaderboard', { title: `Verified samples (top ${TOP})`, yLabel: 'verified samples', empty: 'no verified contributions yet' });
  const box = h('div', { id: 'leaderboard' });
  main.appendChild(box);
  const status = h('p.updated', { id: 'updated' });
  main.appendChild(status);
  const me = session().username;
  const stop = poll(async () => {
    let r;
    try {
      r = await api.get(`/api/v1/runs/${seg(run)}/leaderboard`);
    } catch (e) {
      fill(box, errorBox(e));
      throw e;
    }
    const top = r.users.slice(0, TOP);
    chart.update(top.map((u) => u.username), top.map((u) => u.verified_samples));
    const total = r.users.reduce((a, u) => a + u.verified_samples, 0);
    fill(box, table(['#', 'volunteer', 'devices', 'verified samples', 'share', 'expert samples', 'compute', 'steps', 'last report'],
      r.users.map((u, i) => [
        String(i + 1),
        h(`span.user${u.active ? '' : '.inactive'}${u.username === me ? '.me' : ''}`, u.username),
        h('span.devices', { title: `${u.active_devices} of ${u.devices} active` },
          Array.from({ length: Math.min(u.devices, 12) }, (_, k) => h(`i.dev${k < u.active_devices ? '.on' : ''}`)),
          u.devices > 12 ? ` +${u.devices - 12}` : null),
        fmtNum(u.verified_samples),
        total > 0 ? `${(100 * u.verified_samples / total).toFixed(1)} %` : '—',
        // samples this volunteer's expert servers answered for trainers (verified)
        fmtNum(u.expert_samples || 0),
        fmtDuration(u.compute_s), fmtNum(u.steps), fmtTime(u.last_at),
      ]), 'no contributions yet', { id: 'leaderboard-table' }));
  }, 10000, status);
  return () => { stop(); chart.destroy(); };
}
