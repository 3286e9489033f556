// Showing verification results: each check green (passed), red (failed, with the reason) or grey (not checked,
// with why not).
import { h } from './dom.js';

const LABELS = {
  canonical: 'Canonical form (RFC 8785)',
  key: 'Signing key known and valid at issue time',
  signature: 'Ed25519 signature over the canonical form',
  checkpoint: 'Signed checkpoint of the log',
  inclusion: 'Included in the log (Merkle audit path to the checkpoint root)',
  mechanism: 'Noise mechanism terms',
  erasure: 'Exact-erasure terms',
  records: "Erased records' commitments",
  parameters: 'Hash of the published parameters',
  from_checkpoint: 'Older checkpoint signature',
  to_checkpoint: 'Newer checkpoint signature',
  proof: 'Consistency proof (the log only grew)',
  bundle: 'Bundle shape',
  consistency: 'Consistency entry',
};

export function label(check) {
  const last = check.split('.').pop();
  return LABELS[last] || check;
}

// checks: [{check, ok, detail, skipped?}]
export function checkList(checks, { id = null } = {}) {
  return h('ul', { class: 'checks', id },
    checks.map((c) => {
      const state = c.skipped ? 'skip' : c.ok ? 'pass' : 'fail';
      return h('li', { class: ['check', state], dataset: { check: c.check, state } },
        h('span', { class: 'mark', 'aria-hidden': 'true', text: state === 'pass' ? '✓' : state === 'fail' ? '✗' : '–' }),
        h('span', { class: 'what' }, h('strong', { text: label(c.check) }), ' ', h('code', { class: 'name', text: c.check })),
        h('span', { class: 'detail', text: (state === 'fail' ? 'FAILED: ' : state === 'skip' ? 'not checked: ' : '') + (c.detail || '') }));
    }));
}

export function verdict(checks, okText = 'Verified', badText = 'NOT verified') {
  const failed = checks.filter((c) => !c.ok && !c.skipped);
  const ok = checks.length > 0 && failed.length === 0;
  return h('div', { class: ['verdict', ok ? 'pass' : 'fail'], role: 'status', dataset: { state: ok ? 'pass' : 'fail' } },
    h('span', { class: 'mark', 'aria-hidden': 'true', text: ok ? '✓' : '✗' }),
    h('strong', { text: ok ? okText : badText }),
    h('span', { text: ok ? ` — ${checks.filter((c) => !c.skipped).length} checks passed in this browser`
      : ` — ${failed.length} of ${checks.filter((c) => !c.skipped).length} checks failed: ${failed.slice(0, 3).map((c) => `${c.check}: ${c.detail}`).join('; ')}${failed.length > 3 ? '; …' : ''}` }));
}
