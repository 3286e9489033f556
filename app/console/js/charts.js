// Privacy-ledger plots, drawn by the vendored uPlot (app/console/vendor/, loaded as a classic script before
// the modules). Colours come from the stylesheet's custom properties.
import { h } from './dom.js';

function css(name, fallback) {
  const v = getComputedStyle(document.documentElement).getPropertyValue(name).trim();
  return v || fallback;
}

const charts = new Set();
let resizing = false;
window.addEventListener('resize', () => {
  if (resizing) return;
  resizing = true;
  window.requestAnimationFrame(() => {
    resizing = false;
    for (const c of charts) {
      if (!document.body.contains(c.root)) { charts.delete(c); continue; }
      c.setSize({ width: c.root.parentElement.clientWidth, height: c.height });
    }
  });
});

function fmtAxis(_u, values) {
  return values.map((v) => (v === null ? '' : Math.abs(v) > 0 && Math.abs(v) < 1e-3 ? v.toExponential(0) : String(Number(v.toPrecision(3)))));
}

// deletions are counted: ticks at whole numbers only (uPlot's default steps put one at 1.5 deletions)
const WHOLE = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000];
function whole(_u, values) {
  return values.map((v) => (v === null || !Number.isInteger(v) ? '' : String(v)));
}
const xAxis = { label: 'deletion (in log order)', incrs: WHOLE, values: whole };

// the legend shows the last deletion's values until the pointer is over the plot, and again when it leaves
// (uPlot's legend shows "--" without a cursor)
function latestInLegend(u) {
  if (u.cursor.idx === null || u.cursor.idx === undefined) u.setLegend({ idx: u.data[0].length - 1 });
}

function plot(container, opts, data) {
  if (!window.uPlot) {
    container.append(h('p', { class: 'muted', text: 'The charting library did not load; the numbers are in the table below.' }));
    return null;
  }
  const width = Math.max(320, container.clientWidth || 720);
  const hooks = { ready: [latestInLegend], setCursor: [latestInLegend] };
  const chart = new window.uPlot({ width, height: 280, hooks, ...opts }, data, container);
  chart.root.setAttribute('role', 'img');
  container.chart = chart;  // the tests read its axes and legend
  charts.add(chart);
  return chart;
}

// rho and epsilon spent after each deletion (the receipts' ledger_after), with the rho budget and the target
// epsilon as dashed lines
export function privacyChart(container, points, { rhoBudget = null, epsilonTarget = null } = {}) {
  const x = points.map((_, i) => i + 1);
  const rho = points.map((p) => p.rho);
  const eps = points.map((p) => p.epsilon);
  const rhoColor = css('--rho', '#2563eb');
  const epsColor = css('--eps', '#d97706');
  const series = [
    { label: 'deletion' },
    { label: 'ρ spent', stroke: rhoColor, width: 2, scale: 'rho', points: { show: points.length <= 40 } },
    { label: 'ε spent', stroke: epsColor, width: 2, scale: 'eps', points: { show: points.length <= 40 } },
  ];
  const data = [x, rho, eps];
  if (rhoBudget !== null && epsilonTarget !== null) {
    // the rho budget is the target epsilon's conversion (at the model's delta): on their two scales the two dashed
    // lines were drawn on top of each other, so they are one line, both values in its legend
    series.push({ label: 'ρ budget = ε target', stroke: rhoColor, width: 1.5, dash: [6, 4], scale: 'rho',
      points: { show: false }, value: (_u, v) => (v === null ? '' : `ρ ${fmtAxis(null, [v])[0]} ↔ ε ${fmtAxis(null, [epsilonTarget])[0]}`) });
    data.push(x.map(() => rhoBudget));
  } else if (rhoBudget !== null) {
    series.push({ label: 'ρ budget', stroke: rhoColor, width: 1.5, dash: [6, 4], scale: 'rho', points: { show: false } });
    data.push(x.map(() => rhoBudget));
  } else if (epsilonTarget !== null) {
    series.push({ label: 'ε target', stroke: epsColor, width: 1.5, dash: [2, 4], scale: 'eps', points: { show: false } });
    data.push(x.map(() => epsilonTarget));
  }
  const top = (vals) => Math.max(1e-12, ...vals.filter((v) => typeof v === 'number')) * 1.08;
  return plot(container, {
    scales: {
      x: { time: false, range: (_u, lo, hi) => [Math.min(lo, 1), Math.max(hi, lo + 1)] },
      rho: { range: () => [0, top(rho.concat(rhoBudget === null ? [] : [rhoBudget]))] },
      eps: { range: () => [0, top(eps.concat(epsilonTarget === null ? [] : [epsilonTarget]))] },
    },
    axes: [
      { ...xAxis, stroke: css('--fg', '#111') },
      { scale: 'rho', label: 'ρ (zCDP)', stroke: rhoColor, values: fmtAxis, size: 60 },
      { scale: 'eps', label: 'ε', side: 1, stroke: epsColor, values: fmtAxis, size: 60, grid: { show: false } },
    ],
    series,
  }, data);
}

// deletions left of the model's capacity after each deletion
export function capacityChart(container, points, capacityTotal) {
  const x = points.map((_, i) => i + 1);
  const color = css('--cap', '#7c3aed');
  return plot(container, {
    title: `Deletion capacity (${capacityTotal} in total)`,
    scales: { x: { time: false, range: (_u, lo, hi) => [Math.min(lo, 1), Math.max(hi, lo + 1)] },
      y: { range: () => [0, capacityTotal * 1.05 || 1] } },
    axes: [xAxis, { label: 'deletions left', size: 60, incrs: WHOLE, values: whole }],
    series: [
      { label: 'deletion' },
      { label: 'capacity left', stroke: color, width: 2, paths: window.uPlot.paths.stepped({ align: 1 }), points: { show: points.length <= 40 } },
      { label: 'capacity', stroke: color, width: 1.5, dash: [6, 4], points: { show: false } },
    ],
  }, [x, points.map((p) => p.capacity), x.map(() => capacityTotal)]);
}
