// The audit console: sign-in, tenant overview, the monitor banner and the router. Read-only: it only GETs.
import { ApiError, getAll, getJson, getText, session, whenAuthLost } from './api.js';
import { ed25519Supported } from './crypto.js';
import { $, append, clear, download, fill, h, num, when } from './dom.js';
import { renderVerifyFile } from './files.js';
import { renderModel } from './model.js';
import { renderOperations } from './operations.js';
import { fetchKeys, forget, runMonitor } from './monitor.js';
import { renderReceipt, renderRecordLookup } from './receipt.js';

const enc = encodeURIComponent;
const ctx = { keys: null, monitor: null, vanished: [] };
let signInMessage = null;

whenAuthLost((err) => {
  session.clear();
  ctx.monitor = null;
  signInMessage = err.status === 401 ? 'The key was refused (unknown or revoked): sign in again.' : err.message;
  route();
});

function header() {
  const signedIn = Boolean(session.key);
  $('#nav').hidden = !signedIn;
  $('#signout').hidden = !signedIn;
  $('#tenant').textContent = signedIn && ctx.monitor && ctx.monitor.origin ? ctx.monitor.origin : '';
  for (const a of document.querySelectorAll('#nav a')) {
    a.classList.toggle('active', (window.location.hash || '#/').startsWith(a.getAttribute('href')) &&
      (a.getAttribute('href') !== '#/' || ['', '#/', '#'].includes(window.location.hash) || window.location.hash.startsWith('#/models')));
  }
}

// ---- the monitor banner ----------------------------------------------------------------------------------------

function monitorBanner() {
  const box = $('#monitor');
  const m = ctx.monitor;
  if (!session.key || !m) { box.hidden = true; return; }
  box.hidden = false;
  const bad = ['fork', 'truncated', 'invalid'].includes(m.state);
  box.className = `monitor ${bad ? 'alarm' : m.state === 'first' ? 'info' : 'ok'}`;
  box.dataset.state = m.state;
  const size = (cp) => (cp ? `size ${cp.tree_size}, root ${String(cp.root_hash).slice(0, 12)}…, signed ${when(cp.timestamp)}` : '');
  clear(box);
  if (bad) {
    box.setAttribute('role', 'alert');
    append(box, [
      h('strong', { class: 'headline', text: m.state === 'invalid' ? '⚠ The log\'s checkpoint does not verify' : '⚠ This log was rewritten' }),
      h('p', { text: m.detail }),
      m.stored ? h('p', { text: `Remembered (verified by this browser on ${when(m.since)}): ${size(m.stored)}. Current: ${size(m.current)}.` }) : null,
      h('p', { text: 'Receipts from this log can no longer be taken as permanent: a receipt that was once included may have been removed or changed. '
        + 'Keep the remembered checkpoint as evidence; it is signed by the service.' }),
      h('div', { class: 'actions' },
        h('button', { type: 'button', on: { click: () => {
          const blob = JSON.stringify({ remembered: m.stored, current: m.current, detail: m.detail }, null, 2);
          download('olu-log-evidence.json', blob);
        } }, text: 'Download the evidence' }),
        h('button', { type: 'button', class: 'subtle', on: { click: () => {
          if (window.confirm('Forget the remembered checkpoint and trust the current log from now on?')) {
            forget(m.origin);
            startMonitor().then(route);
          }
        } }, text: 'Forget the remembered checkpoint…' }))]);
  } else {
    box.removeAttribute('role');
    const text = m.state === 'first'
      ? `Log monitor: first visit for ${m.origin}. This browser now remembers the signed checkpoint (${size(m.current)}) and will check at every visit that the log only grows from it.`
      : `Log monitor ✓ ${m.detail} (remembered since ${when(m.since)}; now ${size(m.current)}).`;
    box.append(h('span', { text }));
  }
  if (ctx.vanished.length) {
    box.append(h('p', { class: 'warn', text: `Signing keys seen before are no longer listed by /v1/keys: ${ctx.vanished.join(', ')}.` }));
  }
}

async function startMonitor() {
  const { keys, vanished } = await fetchKeys();
  ctx.keys = keys;
  ctx.vanished = vanished;
  try {
    ctx.monitor = await runMonitor(keys);
  } catch (e) {
    if (e instanceof ApiError && (e.status === 401 || e.status === 403)) throw e;
    ctx.monitor = { state: 'invalid', detail: `the monitor could not run: ${e.message}` };
  }
}

// ---- sign-in ---------------------------------------------------------------------------------------------------

function renderSignIn(main) {
  const input = h('input', { type: 'password', id: 'api-key', autocomplete: 'off', spellcheck: 'false',
    placeholder: 'olu_…', 'aria-describedby': 'key-help' });
  const error = h('p', { class: 'error', id: 'signin-error', role: 'alert', text: signInMessage || '' });
  signInMessage = null;
  const button = h('button', { type: 'submit', text: 'Sign in' });
  const form = h('form', { class: 'signin card', on: { submit: async (e) => {
    e.preventDefault();
    const key = input.value.trim();
    if (!key) return;
    button.disabled = true;
    error.textContent = '';
    try {
      await getText('v1/audit/checkpoint', { key });  // the audit scope is what the console needs
      session.set(key);
      input.value = '';
      await startMonitor();
      // a changed hash routes through its hashchange event; routing here as well would render the page twice,
      // the second render replacing the first while it is read
      if (!window.location.hash || window.location.hash === '#/signin') window.location.hash = '#/';
      else route();
    } catch (err) {
      session.clear();
      error.textContent = !(err instanceof ApiError) ? `The service could not be reached: ${err.message}`
        : err.status === 401 ? 'This key is unknown or revoked.'
        : err.status === 403 ? 'This key does not have the audit scope, which the console needs. Ask your tenant administrator for a key with the audit scope.'
        : err.status === 429 ? 'Too many attempts: wait a moment and try again.' : err.message;
    } finally {
      button.disabled = false;
    }
  } } },
  h('h1', { text: 'Sign in' }),
  h('label', { for: 'api-key', text: 'API key with the audit scope' }),
  h('div', { class: 'row' }, input, button),
  error,
  h('p', { class: 'muted', id: 'key-help', text: 'The key stays in this browser tab only (sessionStorage: gone when the tab closes). '
    + 'It is sent to this service in the Authorization header of each request, and never put in a URL or a cookie.' }),
  h('p', {}, 'No key at hand? ', h('a', { href: '#/verify', text: 'Verify a bundle file offline' }), ' — no key needed, nothing is sent.'));
  fill(main, form);
  input.focus();
}

// ---- overview --------------------------------------------------------------------------------------------------

function spent(m) {
  const s = m.ledger_summary;
  const parts = [];
  if (s.rho_budget) {
    const frac = Math.min(1, s.rho_spent / s.rho_budget);
    const bar = h('span', { class: ['bar', frac > 0.9 ? 'high' : null] }, h('span', { class: 'fill' }));
    bar.firstChild.style.width = `${(100 * frac).toFixed(1)}%`;  // CSSOM, allowed by the style-src policy
    parts.push(h('div', { class: 'spent' }, bar, ` ρ ${num(s.rho_spent)} of ${num(s.rho_budget)}`));
  } else if (!s.rho_spent) {
    parts.push(h('div', { class: 'spent', text: 'exact: no privacy spent' }));
  } else {
    parts.push(h('div', { class: 'spent', text: `ρ ${num(s.rho_spent)}` }));
  }
  parts.push(h('div', { class: 'muted', text: `ε ${num(s.epsilon)} of ${num(m.privacy.epsilon)}` + (s.capacity_left === null || s.capacity_left === undefined ? '' : ` · ${s.capacity_left} deletions left`) }));
  return parts;
}

// the tenant's quotas and what it uses of them (GET /v1/tenant): live models, records held, bytes stored, audit trail;
// a quota of 0 is "no limit"
function bytes(n) {
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let k = 0;
  let v = n;
  while (v >= 1024 && k < units.length - 1) { v /= 1024; k += 1; }
  return k === 0 ? `${n} B` : `${num(v, 3)} ${units[k]}`;
}

function usageCard(t) {
  // audit_bytes: what forgets, deletions and checkpoints left for audit; it never shrinks, and once it reaches its
  // quota learns and model creations are refused (never forgets)
  const rows = [['models', 'Models', String], ['records', 'Records held', String], ['bytes', 'Bytes stored', bytes],
    ['audit_bytes', 'Audit trail', bytes]];
  return h('div', { class: 'usage card', id: 'usage' }, h('h2', { text: 'Usage and quotas' }),
    h('div', { class: 'usage-rows' }, rows.map(([k, label, show]) => {
      const used = t.usage[k] ?? 0;
      const limit = t.quotas[k];  // 0: no limit
      const frac = limit ? Math.min(1, used / limit) : 0;
      const bar = h('span', { class: ['bar', frac > 0.9 ? 'high' : null] }, h('span', { class: 'fill' }));
      bar.firstChild.style.width = `${(100 * frac).toFixed(1)}%`;  // CSSOM, allowed by the style-src policy
      return h('div', { class: 'spent', dataset: { quota: k } }, h('span', { class: 'label', text: label }), bar,
        ` ${show(used)} of ${limit ? show(limit) : 'no limit'}`);
    })));
}

async function renderOverview(main) {
  const [{ items, truncated }, tenant] = await Promise.all([getAll('v1/models', { cap: 1000 }),
    getJson('v1/tenant').catch(() => null)]);
  const lookup = h('form', { class: 'lookup', on: { submit: (e) => {
    e.preventDefault();
    const v = e.target.querySelector('input').value.trim();
    if (v) { ctx.pendingRecord = v; window.location.hash = '#/records'; }
  } } }, h('input', { type: 'search', placeholder: 'look up a record id', 'aria-label': 'record id', autocomplete: 'off' }),
  h('button', { type: 'submit', text: 'Look up' }));
  fill(main,
    tenant ? usageCard(tenant) : null,
    h('div', { class: 'titlebar' }, h('h1', { text: 'Models' }), lookup),
    items.length ? h('div', { class: 'scroll' }, h('table', { class: 'grid', id: 'models' },
      h('thead', {}, h('tr', {}, ['Model', 'Family', 'Loss', 'Guarantee', 'Version', 'Learned', 'Forgotten', 'Privacy spent'].map((t) => h('th', { text: t })))),
      h('tbody', {}, items.map((m) => h('tr', { dataset: { model: m.id } },
        h('td', {}, h('a', { href: `#/models/${enc(m.id)}`, class: 'model-link', text: m.name }), h('div', {}, h('code', { class: 'muted', text: m.id }))),
        h('td', { text: m.algorithm }),
        h('td', { text: m.loss }),
        h('td', { class: 'guarantee', text: m.guarantee.definition, title: m.guarantee.statement }),
        h('td', { class: 'num', text: m.version }),
        h('td', { class: 'num', text: m.n_records ?? 'withheld' }),
        h('td', { class: 'num', text: m.n_forgotten ?? 'withheld' }),
        h('td', {}, spent(m))))))) : h('p', { class: 'muted', text: 'This tenant has no models (deleted models stay auditable: look up a record, or open a receipt).' }),
    truncated ? h('p', { class: 'muted', text: 'Only the first 1000 models are listed.' }) : null);
}

// ---- router ----------------------------------------------------------------------------------------------------

async function route() {
  const main = $('#main');
  const hash = window.location.hash || '#/';
  header();
  const [, view, arg] = hash.match(/^#\/([a-z]*)\/?(.*)$/) || [];
  try {
    if (view === 'verify') { renderVerifyFile(main); return; }
    if (!session.key) { monitorBanner(); renderSignIn(main); return; }
    if (!ctx.monitor) await startMonitor();
    header();
    monitorBanner();
    fill(main, h('p', { class: 'muted loading', text: 'Loading…' }));
    if (view === 'models' && arg) await renderModel(main, decodeURIComponent(arg));
    else if (view === 'receipts' && arg) await renderReceipt(main, decodeURIComponent(arg), ctx);
    else if (view === 'operations') await renderOperations(main);
    else if (view === 'records') { const r = ctx.pendingRecord || ''; ctx.pendingRecord = null; renderRecordLookup(main, ctx, r); }
    else await renderOverview(main);
  } catch (e) {
    if (e instanceof ApiError && (e.status === 401 || e.status === 403) && !session.key) return;  // shown at sign-in
    fill(main, h('div', { class: 'error card' }, h('strong', { text: 'Could not load this page. ' }),
      e instanceof ApiError && e.status === 404 ? 'Not found (or not this tenant\'s).' : e.message));
  }
}

async function boot() {
  $('#signout').addEventListener('click', () => {
    session.clear();
    ctx.monitor = null;
    window.location.hash = '#/';
    route();
  });
  if (!await ed25519Supported()) {
    document.body.insertBefore(h('div', { class: 'error card', role: 'alert', text: 'This browser cannot verify Ed25519 signatures with WebCrypto (or the page is not in a secure context): '
      + 'the console\'s checks would fail. Use a current Chromium, Firefox or Safari over https (or localhost).' }), $('#main'));
  }
  window.addEventListener('hashchange', route);
  route();
}

boot();
