// One model: its terms, the privacy ledger plotted over deletions, the deletion log (paged), the export bundle.
import { ApiError, getAll, getJson } from './api.js';
import { capacityChart, privacyChart } from './charts.js';
import { fill, h, num, short, when } from './dom.js';
import { exportBundle } from './receipt.js';
import { evaluationCard, lastEvaluation } from './evaluation.js';

const enc = encodeURIComponent;
const PAGE = 20;

function field(name, value) {
  return [h('dt', { text: name }), h('dd', {}, value)];
}

export async function renderModel(main, id) {
  let model = null;
  try {
    model = await getJson(`v1/models/${enc(id)}`);
  } catch (e) {
    if (!(e instanceof ApiError) || e.status !== 404) throw e;  // a deleted model: its audit trail stays readable
  }
  const ledger = await getJson(`v1/models/${enc(id)}/ledger`);
  const all = await getAll(`v1/models/${enc(id)}/deletions`, { cap: 5000 });
  const points = all.items.map((r) => ({ rho: r.ledger_after.rho_spent, epsilon: r.ledger_after.epsilon, capacity: r.ledger_after.capacity_left }));
  const deleted = ledger.model_status === 'deleted';
  const evaluation = model ? await lastEvaluation(id) : null;

  const chartBox = h('div', { class: 'chart', id: 'privacy-chart' });
  const capBox = h('div', { class: 'chart', id: 'capacity-chart' });
  const log = h('div', { id: 'deletion-log' });
  fill(main, 
    h('nav', { class: 'crumbs' }, h('a', { href: '#/', text: 'Models' }), ' › ', short(id, 24)),
    h('h1', {}, model ? model.name : 'Deleted model', ' ', h('code', { class: 'muted', text: id })),
    deleted ? h('div', { class: 'notice' }, `This model was deleted on ${when(ledger.deleted_at)}: its secret state, records and data are erased. `,
      ledger.erasure_receipt_id ? h('a', { href: `#/receipts/${enc(ledger.erasure_receipt_id)}`, text: 'Open its erasure receipt' }) : null) : null,
    h('div', { class: 'cols' },
      model ? h('section', { class: 'card' }, h('h2', { text: 'Model' }), h('dl', { class: 'facts' },
        field('Family', model.algorithm), field('Loss', model.loss + (model.n_classes ? ` (${model.n_classes} classes)` : '')),
        field('Guarantee', model.guarantee.definition), field('In words', model.guarantee.statement),
        field('Target', `ε = ${num(model.privacy.epsilon)}, δ = ${num(model.privacy.delta)}`),
        field('Version / epoch / step', `${model.version} / ${model.epoch} / ${model.step ?? 'withheld'}`),
        field('Records learned / forgotten', model.n_records === null ? 'withheld (private publication: no exact count leaves the model)' : `${model.n_records} / ${model.n_forgotten}`),
        field('Created', when(model.created_at)), field('Status', model.status))) : null,
      h('section', { class: 'card' }, h('h2', { text: 'Privacy ledger' }), h('dl', { class: 'facts' },
        field('Accounting', `${ledger.accounting} (conversion ${ledger.conversion})`),
        field('ρ spent', ledger.rho_budget === null ? num(ledger.rho_spent) : `${num(ledger.rho_spent)} of ${num(ledger.rho_budget)} (${Math.round(100 * ledger.rho_spent / ledger.rho_budget)}%)`),
        field('ε spent', `${num(ledger.epsilon)} at δ = ${num(ledger.delta)}`),
        ledger.capacity_total === null ? null : field('Deletion capacity', `${ledger.capacity_left} of ${ledger.capacity_total} left`),
        field('Epoch', String(ledger.epoch)), field('Ledger entries', String(ledger.entries.length))))),
    evaluation ? evaluationCard(evaluation) : null,
    h('section', { class: 'card', id: 'ledger-plot' }, h('h2', { text: 'Privacy spent over deletions' }),
      h('p', { class: 'muted', text: points.length ? `From the ${points.length} signed receipts (each receipt's ledger_after).`
        + (all.truncated ? ' Only the first 5000 deletions are plotted.' : '') : 'No deletions yet.' }),
      points.length ? chartBox : null, points.length && ledger.capacity_total !== null ? capBox : null),
    h('section', { class: 'card' }, h('h2', { text: 'Deletion log' }), log,
      h('div', { class: 'actions' }, h('button', { type: 'button', id: 'export-model',
        on: { click: () => exportBundle({ model_id: id }, `olu-bundle-${id}.json`) }, text: 'Download export bundle for this model' }),
      h('span', { class: 'muted', text: ' every receipt with its proof, the checkpoint and the public keys; drop it on “Verify a file”, or run olu verify' }))));
  if (points.length) {
    privacyChart(chartBox, points, { rhoBudget: ledger.rho_budget, epsilonTarget: model ? model.privacy.epsilon : null });
    if (ledger.capacity_total !== null) capacityChart(capBox, points, ledger.capacity_total);
  }
  await renderLogPage(log, id, []);
}

// one page of the deletion log; `stack` holds the cursors of the pages before it
async function renderLogPage(box, id, stack) {
  const cursor = stack.length ? stack[stack.length - 1] : null;
  const page = await getJson(`v1/models/${enc(id)}/deletions`, { params: { limit: PAGE, cursor } });
  const first = stack.length * PAGE;
  fill(box, 
    page.items.length ? h('div', { class: 'scroll' }, h('table', { class: 'grid' },
      h('thead', {}, h('tr', {}, ['#', 'Receipt', 'Record commitment', 'Forgotten at step', 'Mechanism', 'ρ', 'ε after', 'Issued'].map((t) => h('th', { text: t })))),
      h('tbody', {}, page.items.map((r, i) => h('tr', {},
        h('td', { class: 'num', text: first + i + 1 }),
        h('td', {}, h('a', { href: `#/receipts/${enc(r.id)}`, class: 'receipt-link', text: short(r.id, 18) })),
        h('td', {}, h('code', { text: short(r.record_commitment, 16) })),
        h('td', { class: 'num', text: r.forgotten_step }),
        h('td', { text: r.mechanism.type }),
        h('td', { class: 'num', text: num(r.mechanism.rho) }),
        h('td', { class: 'num', text: num(r.ledger_after.epsilon) }),
        h('td', { text: when(r.issued_at) })))))) : h('p', { class: 'muted', text: 'No receipts: nothing was forgotten.' }),
    h('div', { class: 'pager' },
      h('button', { type: 'button', disabled: stack.length === 0, text: '‹ Previous',
        on: { click: () => renderLogPage(box, id, stack.slice(0, -1)) } }),
      h('span', { class: 'muted', text: page.items.length ? ` receipts ${first + 1}–${first + page.items.length} ` : ' ' }),
      h('button', { type: 'button', disabled: !page.next_cursor, text: 'Next ›', id: 'log-next',
        on: { click: () => renderLogPage(box, id, stack.concat([page.next_cursor])) } })));
}
