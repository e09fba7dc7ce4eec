// Run overview (public): the global learning curve, active peers over time,
// throughput and the ETA to the run's last step, refreshed every few seconds
// without reloading. Data: GET /api/v1/runs/{run}, /curve, /stats
// (docs/accounting.md, "Learning curve and health"). A banner says when
// peers report that their rounds average nothing (stats.averaging). A
// language-model run (ALBERT) also gets its sentence-order loss and its
// masked-token accuracy, each a chart that appears once a step carries it
// (docs/dashboard.md; docs/training.md, "What the dashboard shows").
import { h, fmtNum, fmtDuration, fmtTime, fill } from '../dom.js';
import { api, seg } from '../api.js';
import { lineChart } from '../chart.js';
import { runTabs, runInfo, poll, errorBox } from './common.js';

export const REFRESH_MS = 4000;

function card(id, label) {
  const v = h('div.value', { id }, '—');
  return [h('div.stat', h('div.label', label), v), v];
}

export function render(main, [run]) {
  main.appendChild(runTabs(run, ''));
  const info = h('section.run-info', { id: 'run-info' });
  main.appendChild(info);
  // Peers whose rounds keep averaging nothing say so in their capability
  // reports (stats.averaging): the run is not learning, and this says why.
  const warn = h('section.warning', { id: 'not-averaging', hidden: true });
  main.appendChild(warn);
  const stats = h('section.stats');
  const [cStep, vStep] = card('stat-step', 'step');
  const [cPeers, vPeers] = card('stat-peers', 'active peers');
  const [cSps, vSps] = card('stat-sps', 'samples / s');
  const [cEta, vEta] = card('stat-eta', 'ETA to last step');
  const [cRound, vRound] = card('stat-round', 'avg round');
  const [cFail, vFail] = card('stat-failures', 'failed rounds (window / all)');
  const [cVer, vVer] = card('stat-verified', 'verified samples');
  stats.append(cStep, cPeers, cSps, cEta, cRound, cFail, cVer);
  main.appendChild(stats);
  const charts = h('section.charts');
  main.appendChild(charts);
  const loss = lineChart(charts, 'loss', { title: 'Training loss (samples-weighted, all peers)', x: 'step', xLabel: 'step', yLabel: 'loss', series: [{ label: 'loss' }], empty: 'no reports yet' });
  const peers = lineChart(charts, 'peers', { title: 'Active peers (per minute)', x: 'time', yLabel: 'peers', series: [{ label: 'peers' }], empty: 'no reports in the last hour' });
  const tput = lineChart(charts, 'throughput', { title: 'Throughput (samples / s, per minute)', x: 'time', yLabel: 'samples/s', series: [{ label: 'samples/s' }], empty: 'no reports in the last hour' });
  // ALBERT's heads: made on the first step that carries them, so runs of
  // other models show no empty charts
  const lmCharts = h('section.charts', { id: 'lm-charts', hidden: true });
  main.appendChild(lmCharts);
  let sop = null;
  let acc = null;
  const status = h('p.updated', { id: 'updated' });
  main.appendChild(status);

  runInfo(run).then((r) => {
    fill(info,
      h('p', h(`span.badge.${r.status}`, { id: 'run-status' }, r.status), ' ',
        h('span', { id: 'run-model' }, r.model_summary), ' · target batch ', fmtNum(r.target_batch_size),
        ' · created ', fmtTime(r.created_at)),
      r.description ? h('p.desc', { id: 'run-description' }, r.description) : null);
  }).catch((e) => fill(info, errorBox(e)));

  const stop = poll(async () => {
    const [c, s] = await Promise.all([
      api.get(`/api/v1/runs/${seg(run)}/curve?max_points=2000`),
      api.get(`/api/v1/runs/${seg(run)}/stats?hours=6`),
    ]);
    const pts = c.points || [];
    const steps = pts.map((p) => p.step);
    loss.update([steps, pts.map((p) => (p.loss === null ? null : p.loss))]);
    const has = (k) => pts.some((p) => typeof p[k] === 'number');
    if (!sop && has('sop_loss')) {
      lmCharts.hidden = false;
      loss.setTitle('Masked-LM loss (samples-weighted, all peers)');
      sop = lineChart(lmCharts, 'sop-loss', { title: 'Sentence-order loss (samples-weighted, all peers)', x: 'step', xLabel: 'step', yLabel: 'loss', series: [{ label: 'SOP loss' }] });
    }
    if (!acc && has('mlm_accuracy')) {
      lmCharts.hidden = false;
      loss.setTitle('Masked-LM loss (samples-weighted, all peers)');
      acc = lineChart(lmCharts, 'mlm-accuracy', { title: 'Masked-token accuracy (training batches, % of masked positions)', x: 'step', xLabel: 'step', yLabel: '%', series: [{ label: 'accuracy' }] });
    }
    if (sop) sop.update([steps, pts.map((p) => (typeof p.sop_loss === 'number' ? p.sop_loss : null))]);
    if (acc) acc.update([steps, pts.map((p) => (typeof p.mlm_accuracy === 'number' ? 100 * p.mlm_accuracy : null))]);
    const ap = s.active_peers || [];
    peers.update([ap.map((p) => p.t), ap.map((p) => p.peers)]);
    tput.update([ap.map((p) => p.t), ap.map((p) => p.samples / 60)]);
    vStep.textContent = s.current_step === null ? '—'
      : `${fmtNum(s.current_step)}${s.total_steps ? ` / ${fmtNum(s.total_steps)}` : ''}`;
    const now = Date.now() / 1000;
    const last = ap.length ? ap[ap.length - 1] : null;
    vPeers.textContent = last && now - last.t < 120 ? fmtNum(last.peers) : '0';
    vSps.textContent = fmtNum(s.samples_per_s, 1);
    vEta.textContent = s.eta_s === null ? (s.total_steps ? 'no progress in the window' : 'no last step set') : fmtDuration(s.eta_s);
    vRound.textContent = s.avg_round_ms === null ? '—' : `${fmtNum(s.avg_round_ms, 0)} ms`;
    vFail.textContent = `${fmtNum(s.round_failures.window)} / ${fmtNum(s.round_failures.total)}`;
    vVer.textContent = `${fmtNum(s.totals.verified_samples)} of ${fmtNum(s.totals.claimed_samples)}`;
    const a = s.averaging || {};
    warn.hidden = !a.not_averaging;
    if (a.not_averaging) {
      fill(warn, h('strong', 'The collaboration is not averaging. '),
        `${fmtNum(a.failing_peers)} of ${fmtNum(a.live_peers)} live peers report rounds that averaged nothing `
        + `(up to ${fmtNum(a.failing_rounds)} in a row)`,
        a.reason ? [': ', h('code', { id: 'not-averaging-reason' }, a.reason)] : '', '.');
    }
  }, REFRESH_MS, status);
  return () => {
    stop(); loss.destroy(); peers.destroy(); tput.destroy();
    if (sop) sop.destroy();
    if (acc) acc.destroy();
  };
}
