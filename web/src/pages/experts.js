// Experts of a run's mixture-of-experts layer (logged-in users of a dmoe
// run; docs/dashboard.md, "Experts"): which expert servers serve each
// expert of the grid now (the run's DHT, read by the coordinator) and each
// expert's newest checkpoint. A grid cell nobody serves shows as such:
// trainers then route around it (their gate renormalises over the experts
// that answer) until a server takes it over. Data: GET
// /api/v1/runs/{run}/experts/servers and /experts (docs/experts.md).
import { h, table, fmtNum, fmtTime, shortKey, fill, message } from '../dom.js';
import { api, seg, session } from '../api.js';
import { runTabs, runInfo, poll, errorBox } from './common.js';

export const REFRESH_MS = 5000;

// Every uid of a grid, in grid order: prefix.0.0, prefix.0.1, ...
function allUids(prefix, dims, size) {
  const out = [];
  const idx = new Array(dims).fill(0);
  for (;;) {
    out.push(`${prefix}.${idx.join('.')}`);
    let d = dims - 1;
    while (d >= 0 && ++idx[d] === size) idx[d--] = 0;
    if (d < 0) return out;
  }
}

export function render(main, [run]) {
  main.appendChild(runTabs(run, '/experts'));
  if (!session()) {
    main.appendChild(h('p', 'The experts page is for logged-in participants of the run. ',
      h('a', { href: '#/login' }, 'Log in')));
    return null;
  }
  const summary = h('section.stats', { id: 'experts-summary' });
  const note = h('div', { id: 'experts-note' });
  const box = h('div', { id: 'experts' });
  const status = h('p.updated', { id: 'updated' });
  main.append(summary, note, box, status);
  let stop = null;
  let gone = false;
  // the run's config says whether it has experts (no request the API would refuse)
  runInfo(run).then((x) => {
    const m = x && x.config && x.config.model;
    if (gone) return;
    if (!m || m.type !== 'dmoe') fill(box, message('info', 'This run has no mixture-of-experts layer.'));
    else stop = poll(refresh, REFRESH_MS, status);
  }).catch((e) => fill(box, errorBox(e)));

  async function refresh() {
    let ck;
    try {
      ck = await api.get(`/api/v1/runs/${seg(run)}/experts`);
    } catch (e) {
      fill(summary);
      fill(box, errorBox(e));
      throw e;
    }
    // The live view may be missing (no DHT node here for the run): the
    // checkpoints still show.
    let live = null;
    let liveErr = null;
    try {
      live = await api.get(`/api/v1/runs/${seg(run)}/experts/servers`);
    } catch (e) {
      liveErr = e;
    }
    const byUid = new Map((ck.experts || []).map((x) => [x.uid, x]));
    const served = new Map(((live && live.experts) || []).map((x) => [x.uid, x.servers]));
    const uids = live ? allUids(live.prefix, live.grid_dims, live.grid_size) : [...byUid.keys()];
    const nServed = uids.filter((u) => served.has(u)).length;
    const stat = (id, label, value) => h('div.stat', h('div.label', label), h('div.value', { id }, value));
    fill(summary,
      stat('experts-served', 'experts served now', live ? `${fmtNum(nServed)} of ${fmtNum(uids.length)}` : '—'),
      stat('experts-servers', 'expert servers', live ? fmtNum(live.servers) : '—'),
      stat('experts-checkpointed', 'experts with a checkpoint', fmtNum(byUid.size)));
    fill(note,
      liveErr ? message('error', `Who serves what is unknown: ${liveErr.message}`) : null,
      live && !live.complete ? message('info', 'Part of the grid could not be read from the DHT in time; those experts may show as not served.') : null);
    fill(box, table(['expert', 'servers now', 'newest checkpoint', 'uploaded by', 'uploaded at'],
      uids.map((u) => {
        const s = served.get(u) || [];
        const c = byUid.get(u);
        return [
          h('code', u),
          s.length
            ? h('span.servers', s.map((x, i) => [i ? ', ' : '',
              h('span', { title: `key ${x.peer}, declaration expires in ${x.expires_in_s} s` }, x.addr),
              ` (${shortKey(x.peer)})`]))
            : h('span.inactive', live ? 'nobody' : '—'),
          c ? `step ${fmtNum(c.step)}` : '—',
          c ? c.uploaded_by : '—',
          c ? fmtTime(c.uploaded_at) : '—',
        ];
      }), 'no experts yet', { id: 'experts-table' }));
  }
  return () => { gone = true; if (stop) stop(); };
}
