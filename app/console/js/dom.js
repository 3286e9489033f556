// DOM helpers: elements are built with createElement and textContent only (no HTML strings anywhere, which the
// Content-Security-Policy's Trusted Types rule would refuse anyway), so nothing the server sends can inject markup.

export function h(tag, props = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(props || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === 'class') el.className = Array.isArray(v) ? v.filter(Boolean).join(' ') : v;
    else if (k === 'text') el.textContent = String(v);
    else if (k === 'on') for (const [ev, fn] of Object.entries(v)) el.addEventListener(ev, fn);
    else if (k === 'dataset') Object.assign(el.dataset, v);
    else if (k === 'style') throw new Error('no inline styles (CSP): use a class');
    else if (k.startsWith('on')) throw new Error('no inline handlers (CSP): use on: {...}');
    else if (v === true) el.setAttribute(k, '');
    else el.setAttribute(k, String(v));
  }
  append(el, children);
  return el;
}

export function append(el, children) {
  for (const c of children.flat(Infinity)) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

export function clear(el) {
  while (el.firstChild) el.removeChild(el.firstChild);
  return el;
}

// replace an element's children (null, false and undefined children are skipped, unlike Element.append)
export function fill(el, ...children) {
  return append(clear(el), children);
}

export function $(sel) {
  return document.querySelector(sel);
}

// numbers for people: up to 4 significant digits, exponent for the very small or large
export function num(x, digits = 4) {
  if (x === null || x === undefined) return '—';
  if (typeof x !== 'number') return String(x);
  if (x === 0) return '0';
  const a = Math.abs(x);
  if (a < 1e-3 || a >= 1e6) return x.toExponential(2).replace('e+', 'e');
  return String(Number(x.toPrecision(digits)));
}

export function short(id, n = 12) {
  return typeof id === 'string' && id.length > n + 1 ? id.slice(0, n) + '…' : String(id);
}

export function when(iso) {
  if (typeof iso !== 'string') return '—';
  const d = new Date(iso);
  return Number.isNaN(d.getTime()) ? iso : d.toISOString().replace('T', ' ').replace(/\.\d+Z$/, ' UTC').replace(/Z$/, ' UTC');
}

// a download of text the page already holds (no request)
export function download(filename, text, type = 'application/json') {
  const url = URL.createObjectURL(new Blob([text], { type }));
  const a = h('a', { href: url, download: filename, class: 'hidden' });
  document.body.append(a);
  a.click();
  setTimeout(() => { URL.revokeObjectURL(url); a.remove(); }, 1000);
}
