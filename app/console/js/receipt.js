// A receipt, opened and verified in the browser; and the record lookup, which verifies every receipt it finds.
import { ApiError, getAll, getJson, getText } from './api.js';
import { checkList, verdict } from './checks.js';
import { hex, sha256 } from './crypto.js';
import { download, fill, h, num, short, when } from './dom.js';
import { parseStrict } from './jcs.js';
import { Report, verifyReceipt } from './verify.js';

const enc = encodeURIComponent;

// SHA-256 of the little-endian float64 weights followed by the bias (canonical.py parameters_sha256)
export async function parametersSha256(weights, bias) {
  const vals = weights.concat(bias === null || bias === undefined ? [] : [bias]);
  const buf = new DataView(new ArrayBuffer(8 * vals.length));
  vals.forEach((v, i) => buf.setFloat64(8 * i, v, true));
  return hex(await sha256(new Uint8Array(buf.buffer)));
}

async function parametersCheck(receipt) {
  if (typeof receipt.published_parameters_sha256 !== 'string') return null;  // erasure receipts name none
  const check = 'receipt.parameters';
  let p;
  try {
    p = JSON.parse(await getText(`v1/models/${enc(receipt.model_id)}/parameters`));
  } catch (e) {
    if (!(e instanceof ApiError)) throw e;
    const why = e.status === 403 ? 'reading the published parameters needs a key with the predict scope as well'
      : e.status === 404 ? 'the model was deleted, and its parameters with it' : e.message;
    return { check, ok: true, skipped: true, detail: why };
  }
  if (p.version !== receipt.model_version) {
    return { check, ok: true, skipped: true,
      detail: `the model is now at version ${p.version}; this receipt hashed version ${receipt.model_version} (later learning or forgetting changed them)` };
  }
  const got = await parametersSha256(p.weights, p.bias);
  const ok = got === receipt.published_parameters_sha256;
  return { check, ok, detail: ok ? `SHA-256 of the ${p.weights.length + (p.bias === null ? 0 : 1)} published float64 values (version ${p.version}) matches`
    : `the published parameters of version ${p.version} hash to ${short(got, 16)}, the receipt says ${short(receipt.published_parameters_sha256, 16)}` };
}

// verify a receipt as served (its text), with the trusted keys; the server's answer is parsed strictly here
export async function verifyServed(text, keys, { parameters = true } = {}) {
  const report = new Report();
  await verifyReceipt(text, keys, report, 'receipt');
  const checks = report.checks.slice();
  if (parameters) {
    let receipt = null;
    try { receipt = parseStrict(text); } catch (e) { /* reported as receipt.canonical */ }
    if (receipt) {
      const p = await parametersCheck(receipt);
      if (p) checks.push(p);
    }
  }
  return checks;
}

function field(name, value) {
  return [h('dt', { text: name }), h('dd', {}, value)];
}

export async function renderReceipt(main, id, ctx) {
  const text = await getText(`v1/receipts/${enc(id)}`);
  const r = JSON.parse(text);
  const erasure = r.kind === 'model_erasure';
  const checks = await verifyServed(text, ctx.keys);
  fill(main, 
    h('nav', { class: 'crumbs' }, h('a', { href: '#/', text: 'Models' }), ' › ',
      h('a', { href: `#/models/${enc(r.model_id)}`, text: short(r.model_id, 20) }), ' › ', 'receipt'),
    h('h1', {}, erasure ? 'Erasure receipt ' : 'Certificate receipt ', h('code', { text: r.id })),
    h('section', { class: 'card' },
      h('h2', { text: 'Verification in this browser' }),
      h('p', { class: 'muted', text: 'Every check below runs here, with WebCrypto and the public keys of /v1/keys: '
        + 'the service\'s own word is not taken for any of them.' }),
      verdict(checks),
      checkList(checks, { id: 'receipt-checks' })),
    h('section', { class: 'card' },
      h('h2', { text: 'What the receipt says' }),
      h('dl', { class: 'facts' },
        field('Model', h('a', { href: `#/models/${enc(r.model_id)}`, text: r.model_id })),
        field('Family', r.algorithm),
        erasure ? field('Records erased', `${r.records.erased} (of ${r.records_learned} learned; ${r.records_forgotten_before} forgotten before, each with its own receipt)`)
          : field('Record commitment', h('code', { text: r.record_commitment })),
        erasure ? null : field('Learned at step / forgotten at step', r.learned_step === null ? `withheld (private publication; epoch ${r.epoch})` : `${r.learned_step} / ${r.forgotten_step} (deletion ${r.deletion_index}, epoch ${r.epoch})`),
        field('Mechanism', `${r.mechanism.type}: σ = ${num(r.mechanism.sigma)}, sensitivity = ${num(r.mechanism.sensitivity)}, ρ = ${num(r.mechanism.rho)}`
          + (r.mechanism.grid ? `, grid ${r.mechanism.grid}` : '')),
        field('Guarantee', `${r.guarantee.definition} — ε = ${num(r.guarantee.epsilon)}, δ = ${num(r.guarantee.delta)}`),
        r.guarantee.statement ? field('In words', r.guarantee.statement) : null,
        r.ledger_after ? field('Ledger after', `ρ spent ${num(r.ledger_after.rho_spent)}, ε ${num(r.ledger_after.epsilon)}`
          + (r.ledger_after.capacity_left === null ? '' : `, ${r.ledger_after.capacity_left} deletions left`)) : null,
        r.published_parameters_sha256 ? field('Published parameters SHA-256', h('code', { text: r.published_parameters_sha256 })) : null,
        field('Model version', String(r.model_version)),
        field('Issued', when(r.issued_at)),
        field('Log index / key', `${r.log_index} / ${r.key_id}`),
        r.proof ? field('Proven against', `checkpoint of size ${r.proof.tree_size}, signed ${when(r.proof.checkpoint.timestamp)}`) : null),
      h('div', { class: 'actions' },
        h('button', { type: 'button', on: { click: () => download(`${r.id}.json`, text) }, text: 'Download receipt (JSON)' }),
        h('span', { class: 'muted', text: ' verify it offline too: olu verify FILE --keys keys.json' }))),
    h('details', { class: 'card' }, h('summary', { text: 'Raw receipt as served' }),
      h('pre', { class: 'raw', text: JSON.stringify(r, null, 2) })));
}

const STATUS = { learned: 'learned', forgotten: 'forgotten', erased_with_model: 'erased with its model' };

export function renderRecordLookup(main, ctx, initial = '') {
  const input = h('input', { type: 'search', id: 'record-id', placeholder: 'a record id, as your application sent it',
    autocomplete: 'off', spellcheck: 'false', value: initial });
  const out = h('div', { id: 'record-result' });
  const form = h('form', { class: 'lookup', on: { submit: (e) => { e.preventDefault(); lookup(input.value.trim(), out, ctx); } } },
    input, h('button', { type: 'submit', text: 'Look up' }));
  fill(main, 
    h('h1', { text: 'Record lookup' }),
    h('p', { class: 'muted', text: 'Where a record was learned, and whether it was forgotten (with its certificate receipt) or erased with its model. '
      + 'Every receipt found is verified here. The record id is sent to the service in the request path and stored nowhere else.' }),
    form, out);
  input.focus();
  if (initial) lookup(initial, out, ctx);
}

async function lookup(recordId, out, ctx) {
  if (!recordId) return;
  fill(out, h('p', { class: 'muted', text: 'Looking up…' }));
  let status;
  try {
    status = await getJson(`v1/audit/records/${enc(recordId)}`);
  } catch (e) {
    fill(out, h('p', { class: 'error', text: e.status === 404 ? 'No model of this tenant ever learned this record id.' : e.message }));
    return;
  }
  if (!ctx.modelNames) {
    const { items } = await getAll('v1/models', { cap: 1000 });
    ctx.modelNames = new Map(items.map((m) => [m.id, m.name]));
  }
  const rows = await Promise.all(status.models.map(async (m) => {
    let cell = h('span', { class: 'muted', text: '—' });
    if (m.receipt_id) {
      const text = await getText(`v1/receipts/${enc(m.receipt_id)}`);
      const checks = await verifyServed(text, ctx.keys, { parameters: false });
      const failed = checks.filter((c) => !c.ok);
      cell = h('span', { class: ['badge', failed.length ? 'fail' : 'pass'] },
        failed.length ? `✗ ${failed.map((c) => `${c.check}: ${c.detail}`).join('; ')}` : `✓ ${checks.length} checks passed`);
    }
    return h('tr', { dataset: { status: m.status } },
      h('td', {}, h('a', { href: `#/models/${enc(m.model_id)}`, text: ctx.modelNames.get(m.model_id) || 'a deleted model' }),
        h('div', {}, h('code', { class: 'muted', text: m.model_id }))),
      h('td', {}, h('span', { class: ['status', m.status], text: STATUS[m.status] || m.status })),
      h('td', { class: 'num', text: m.step }),
      h('td', {}, m.receipt_id ? h('a', { href: `#/receipts/${enc(m.receipt_id)}`, text: short(m.receipt_id, 16) }) : '—',
        m.erased_at ? h('div', { class: 'muted', text: `erased ${when(m.erased_at)}` }) : null),
      h('td', {}, cell));
  }));
  fill(out, 
    h('table', { class: 'grid' },
      h('thead', {}, h('tr', {}, ['Model', 'Status', 'Step', 'Receipt', 'Verified here'].map((t) => h('th', { text: t })))),
      h('tbody', {}, rows)),
    h('div', { class: 'actions' },
      h('button', { type: 'button', on: { click: () => exportBundle({ record_id: recordId }, `olu-bundle-record.json`) },
        text: 'Download export bundle for this record' })));
}

export async function exportBundle(params, filename) {
  const text = await getText('v1/audit/export', { params });
  download(filename, text);
}
