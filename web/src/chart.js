// Charts through uPlot (a small canvas charting library from npm). Each
// chart registers itself in window.__ctCharts under its id so the browser
// tests can count the points it is really drawing, and keeps
// data-points / data-series on its container for the same reason.
import uPlot from 'uplot';
import 'uplot/dist/uPlot.min.css';
import { h, clear } from './dom.js';

const COLORS = ['#2563eb', '#dc2626', '#16a34a', '#9333ea', '#ea580c', '#0891b2'];
window.__ctCharts = window.__ctCharts || {};

function countPoints(data) {
  let n = 0;
  for (let s = 1; s < data.length; s++) for (const v of data[s]) if (v !== null && v !== undefined) n++;
  return n;
}

function widthOf(el) {
  return Math.max(240, Math.floor(el.getBoundingClientRect().width || el.clientWidth || 600) - 4);
}

// A line chart. opts: {title, x: 'time'|'step', xLabel, yLabel, series: [{label}], height}
export function lineChart(parent, id, opts) {
  const box = h('div.chart', { id: `chart-${id}`, dataset: { points: '0', series: String(opts.series.length) } });
  const empty = h('p.chart-empty', opts.empty || 'no data yet');
  const caption = h('figcaption', opts.title);
  parent.appendChild(h('figure.chart-fig', caption, box, empty));
  let plot = null;
  const spec = () => ({
    width: widthOf(box),
    height: opts.height || 220,
    scales: { x: { time: opts.x === 'time' } },
    axes: [
      { label: opts.xLabel, stroke: '#475569', grid: { stroke: '#e2e8f0' } },
      { label: opts.yLabel, stroke: '#475569', grid: { stroke: '#e2e8f0' }, size: 60 },
    ],
    series: [
      { label: opts.xLabel || 'x' },
      ...opts.series.map((s, i) => ({
        label: s.label, stroke: COLORS[i % COLORS.length], width: 2,
        points: { show: true, size: 4 }, spanGaps: true,
      })),
    ],
    legend: { show: opts.series.length > 1 },
  });
  const ro = new ResizeObserver(() => { if (plot) plot.setSize({ width: widthOf(box), height: opts.height || 220 }); });
  ro.observe(box);
  return {
    // the caption, when what the chart shows turns out to be more precise
    setTitle(text) { caption.textContent = text; },
    // data: [xs, ys1, ys2, ...] (uPlot's column layout)
    update(data) {
      const n = countPoints(data);
      box.dataset.points = String(n);
      empty.hidden = n > 0;
      if (!plot) {
        plot = new uPlot(spec(), data, box);
        window.__ctCharts[id] = plot;
      } else {
        plot.setData(data);
      }
    },
    destroy() {
      ro.disconnect();
      if (plot) plot.destroy();
      if (window.__ctCharts[id] === plot) delete window.__ctCharts[id];
      plot = null;
    },
  };
}

// A bar chart over categories (usernames): labels[i] under bar i.
export function barChart(parent, id, opts) {
  const box = h('div.chart', { id: `chart-${id}`, dataset: { points: '0', series: '1' } });
  const empty = h('p.chart-empty', opts.empty || 'no data yet');
  parent.appendChild(h('figure.chart-fig', h('figcaption', opts.title), box, empty));
  let plot = null;
  let labels = [];
  const bars = uPlot.paths.bars({ size: [0.6, 64], align: 0 });
  const spec = () => ({
    width: widthOf(box),
    height: opts.height || 240,
    scales: { x: { time: false, range: (u, lo, hi) => [lo - 0.6, hi + 0.6] } },
    axes: [
      { stroke: '#475569', grid: { show: false }, splits: () => labels.map((_, i) => i),
        values: (u, splits) => splits.map((i) => labels[i] || '') },
      { label: opts.yLabel, stroke: '#475569', grid: { stroke: '#e2e8f0' }, size: 70 },
    ],
    series: [{ label: 'user' }, { label: opts.yLabel, fill: '#93c5fd', stroke: '#2563eb', paths: bars, points: { show: false } }],
    legend: { show: false },
  });
  return {
    update(names, values) {
      labels = names;
      const data = [names.map((_, i) => i), values];
      box.dataset.points = String(countPoints(data));
      empty.hidden = names.length > 0;
      if (plot) plot.destroy();
      clear(box);
      plot = new uPlot(spec(), data, box);
      window.__ctCharts[id] = plot;
    },
    destroy() {
      if (plot) plot.destroy();
      if (window.__ctCharts[id] === plot) delete window.__ctCharts[id];
      plot = null;
    },
  };
}
