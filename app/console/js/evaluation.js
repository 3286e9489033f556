// A model's last evaluation (POST /v1/models/{id}/evaluate, issue 39): only its aggregate figures are stored, and
// GET /v1/models/{id}/evaluation gives them. Shown as a card on the model page.
import { getJson } from './api.js';
import { h, num, when } from './dom.js';

const enc = encodeURIComponent;

function field(name, value) {
  return [h('dt', { text: name }), h('dd', {}, value)];
}

// the last evaluation of model `id`, or null when it has none (or it cannot be read)
export async function lastEvaluation(id) {
  try {
    return (await getJson(`v1/models/${enc(id)}/evaluation`)).evaluation;
  } catch (e) {
    return null;
  }
}

export function evaluationCard(ev) {
  const names = ev.classes || null;
  const label = (k) => (names ? names[k] : String(k));
  const cm = ev.confusion_matrix;
  return h('section', { class: 'card', id: 'evaluation' }, h('h2', { text: 'Last evaluation' }),
    h('dl', { class: 'facts' },
      field('Examples', String(ev.n)),
      ev.accuracy === undefined ? null : field('Accuracy', `${num(ev.accuracy)} (${ev.correct} of ${ev.n} correct)`),
      ev.log_loss === undefined ? null : field('Log-loss', num(ev.log_loss)),
      ev.mean_squared_error === undefined ? null : field('Mean squared error', num(ev.mean_squared_error)),
      field('Model version', String(ev.version)), field('Evaluated', when(ev.evaluated_at))),
    cm ? h('div', { class: 'scroll' }, h('table', { class: 'grid', id: 'confusion' },
      h('thead', {}, h('tr', {}, h('th', { text: 'true \\ predicted' }), cm.map((_, k) => h('th', { text: label(k) })))),
      h('tbody', {}, cm.map((row, i) => h('tr', {}, h('th', { text: label(i) }),
        row.map((v) => h('td', { class: 'num', text: v }))))))) : null,
    h('p', { class: 'muted', text: 'Aggregate figures only: the examples evaluated are not kept.' }));
}
