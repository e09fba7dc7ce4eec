// The stages of a pipeline run (logged-in participants of a run whose
// config has a "pipeline" object; docs/dashboard.md, "Pipeline"): which
// device runs which stage of which replica (DT-FM's assignment, seed 003
// §3), what each stage measures (its step time and samples/s, medians of
// its last 20 reports), the predicted seconds per step with its split
// against the measured ones and the random assignments' mean, and each
// stage's throughput. Before the first assignment it says how many of the
// S x D devices are there. Data: GET /api/v1/runs/{run}/pipeline/stages
// (docs/pipelines.md, "Watching the stages").
import { h, table, fmtNum, fmtTime, shortKey, fill, message } from '../dom.js';
import { api, seg, session } from '../api.js';
import { runTabs, runInfo, poll, errorBox } from './common.js';

export const REFRESH_MS = 5000;

const secs = (x) => (x === null || x === undefined ? '—' : `${fmtNum(x, 3)} s`);

// One cell of the grid: who runs the slot and what it measured.
function cell(s) {
  return h('div.slot', { dataset: { replica: s.replica, stage: s.stage } },
    h('div.who', h('span.user', s.username || 'unknown'), ' ',
      h('code', { title: s.peer_public_key }, shortKey(s.peer_public_key))),
    h('div.figs',
      h('span.ms', s.round_ms === null ? '— ms/step' : `${fmtNum(s.round_ms)} ms/step`), ' · ',
      h('span.sps', s.sps === null ? '— samples/s' : `${fmtNum(s.sps, 1)} samples/s`)),
    h('div.reason', s.step === null ? 'no report yet' : `step ${fmtNum(s.step)}, ${fmtNum(s.verified_samples)} verified samples`));
}

export function render(main, [run]) {
  main.appendChild(runTabs(run, '/pipeline'));
  if (!session()) {
    main.appendChild(h('p', 'The pipeline page is for logged-in participants of the run. ',
      h('a', { href: '#/login' }, 'Log in')));
    return null;
  }
  const summary = h('section.stats', { id: 'pipeline-summary' });
  const note = h('div', { id: 'pipeline-note' });
  const box = h('div', { id: 'pipeline' });
  const stages = h('div', { id: 'pipeline-stages' });
  const status = h('p.updated', { id: 'updated' });
  main.append(summary, note, box, stages, status);
  let stop = null;
  let gone = false;
  // the run's config says whether it is a pipeline run (no request the API would refuse)
  runInfo(run).then((x) => {
    const p = x && x.config && x.config.pipeline;
    if (gone) return;
    if (!p || typeof p !== 'object') fill(box, message('info', 'This run is not a pipeline run.'));
    else stop = poll(refresh, REFRESH_MS, status);
  }).catch((e) => fill(box, errorBox(e)));

  async function refresh() {
    let r;
    try {
      r = await api.get(`/api/v1/runs/${seg(run)}/pipeline/stages`);
    } catch (e) {
      fill(summary);
      fill(box, errorBox(e));
      throw e;
    }
    const stat = (id, label, value, sub) => h('div.stat', h('div.label', label), h('div.value', { id }, value),
      sub ? h('div.reason', { id: `${id}-split` }, sub) : null);
    if (r.version === null) {
      fill(summary);
      fill(note);
      fill(box, h('p.msg.info', { id: 'pipeline-waiting', role: 'status' },
        `waiting for volunteers: ${fmtNum(r.live_devices)} of ${fmtNum(r.stages)} x ${fmtNum(r.replicas)}`));
      fill(stages);
      return;
    }
    const pr = r.predicted;
    fill(summary,
      stat('pipeline-predicted', 'predicted s/step', secs(pr.total_s),
        `dp ${secs(pr.dp_s)} + pp ${secs(pr.pp_s)} + compute ${secs(pr.compute_s)}`),
      stat('pipeline-measured', 'measured s/step', secs(r.measured.step_s),
        r.measured.steps ? `median of ${fmtNum(r.measured.steps)} steps` : 'no complete step yet'),
      stat('pipeline-random', 'random assignment', secs(r.random_mean_s), 'mean of 20'),
      stat('pipeline-shape', 'stages x replicas', `${fmtNum(r.stages)} x ${fmtNum(r.replicas)}`,
        `${fmtNum(r.live_devices)} devices live, ${fmtNum(r.spares)} spare${r.spares === 1 ? '' : 's'}`));
    fill(note, r.newest_version > r.version
      ? message('info', `Assignment ${r.version} is running; the coordinator has solved version ${r.newest_version} since (the agents take it when they re-schedule).`)
      : h('p.reason', `Assignment version ${r.version}, solved ${fmtTime(r.created_at)}, valid until ${fmtTime(r.valid_until)}.`));
    const headers = ['replica'];
    for (let j = 0; j < r.stages; j++) headers.push(`stage ${j}`);
    const rows = [];
    for (let i = 0; i < r.replicas; i++) {
      rows.push([`${i}`, ...r.slots.filter((s) => s.replica === i).sort((a, b) => a.stage - b.stage).map(cell)]);
    }
    fill(box, table(headers, rows, 'no slots', { id: 'pipeline-grid' }));
    fill(stages, h('h2', 'Throughput per stage'),
      table(['stage', 'samples/s', 'replicas reporting'],
        r.throughput.map((t) => [`${t.stage}`, t.sps === null ? '—' : fmtNum(t.sps, 1), fmtNum(t.replicas)]),
        'no stages', { id: 'pipeline-throughput' }));
  }
  return () => { gone = true; if (stop) stop(); };
}
