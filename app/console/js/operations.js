// The tenant's operations (long retrains, bulk unlearns and large learns answered 202 Accepted): their status and a
// progress bar, refreshed every second while one is queued or running. Read-only, as the whole console: it only
// GETs (a cancel goes through the API: POST /v1/operations/{id}/cancel with a write key).
import { getJson } from './api.js';
import { fill, h, short, when } from './dom.js';

const enc = encodeURIComponent;
const REFRESH_MS = 1000;
let timer = null;

function stop() {
  if (timer) { clearTimeout(timer); timer = null; }
}

function progress(op) {
  const { done, total } = op.progress;
  const max = Math.max(total, 1);
  const value = op.status === 'succeeded' ? max : Math.min(done, max);
  const pct = Math.round((100 * value) / max);
  return h('div', { class: 'op-progress' },
    h('progress', { max, value, 'aria-label': `${op.kind} ${op.id}: ${done} of ${total}` }),
    h('span', { class: 'muted', text: ` ${done} / ${total} (${pct}%)` }));
}

function outcome(op) {
  if (op.error) return h('span', { class: 'error', text: `${op.error.title}${op.error.detail ? `: ${op.error.detail}` : ''}` });
  const r = op.result;
  if (!r) return op.cancel_requested && op.status !== 'cancelled' ? 'cancel asked' : '—';
  if (op.kind === 'retrain') return `version ${r.version}, epoch ${r.epoch}`;
  if (op.kind === 'unlearn') return `${r.forgotten} forgotten, version ${r.version}`;
  return `${r.accepted} learned, version ${r.version}`;
}

export async function renderOperations(main) {
  stop();
  const page = await getJson('v1/operations', { params: { limit: 100 } });
  const active = page.items.some((o) => o.status === 'queued' || o.status === 'running');
  fill(main,
    h('div', { class: 'titlebar' }, h('h1', { text: 'Operations' }),
      h('span', { class: 'muted', id: 'operations-refresh', text: active ? 'refreshing every second while one runs' : '' })),
    page.items.length ? h('div', { class: 'scroll' }, h('table', { class: 'grid', id: 'operations' },
      h('thead', {}, h('tr', {}, ['Operation', 'Kind', 'Model', 'Status', 'Progress', 'Created', 'Finished', 'Result'].map((t) => h('th', { text: t })))),
      h('tbody', {}, page.items.map((o) => h('tr', { dataset: { operation: o.id, status: o.status } },
        h('td', {}, h('code', { text: short(o.id, 18), title: o.id })),
        h('td', { text: o.kind }),
        h('td', {}, h('a', { href: `#/models/${enc(o.model_id)}`, text: short(o.model_id, 18) })),
        h('td', {}, h('span', { class: ['status', `status-${o.status}`], text: o.status })),
        h('td', {}, progress(o)),
        h('td', { text: when(o.created_at) }),
        h('td', { text: when(o.finished_at) }),
        h('td', { class: 'outcome' }, outcome(o))))))) : h('p', { class: 'muted', text: 'No operations: retrains, unlearns and learns too large for one request run as operations.' }),
    page.next_cursor ? h('p', { class: 'muted', text: 'Only the 100 newest operations are listed.' }) : null);
  if (active) {
    timer = setTimeout(() => {
      timer = null;
      if ((window.location.hash || '').startsWith('#/operations')) renderOperations(main).catch(() => {});
    }, REFRESH_MS);
  }
}
