// The JSON API, same origin. The key lives in sessionStorage only (this tab, until it closes): never in a URL,
// never in a cookie, never in localStorage; requests carry it in the Authorization header and send no cookies.

const KEY = 'olu.console.apiKey';
const BASE = new URL('../', window.location.href.split('#')[0]);

export const session = {
  get key() { return window.sessionStorage.getItem(KEY); },
  set(key) { window.sessionStorage.setItem(KEY, key); },
  clear() { window.sessionStorage.removeItem(KEY); },
};

export class ApiError extends Error {
  constructor(status, problem, text) {
    const detail = problem && (problem.detail || problem.title);
    super(detail ? `${status}: ${detail}` : `HTTP ${status}`);
    this.status = status;
    this.problem = problem;
    this.text = text;
  }
}

export function apiUrl(path, params = {}) {
  const url = new URL(path.replace(/^\//, ''), BASE);
  for (const [k, v] of Object.entries(params)) if (v !== null && v !== undefined) url.searchParams.set(k, v);
  return url;
}

let onAuthLost = null;
export function whenAuthLost(fn) { onAuthLost = fn; }

// the answer's text (kept verbatim: the verifier parses it strictly itself); ApiError for a non-2xx answer
export async function getText(path, { params = {}, auth = true, key = null } = {}) {
  const headers = { Accept: 'application/json' };
  const token = key || (auth ? session.key : null);
  if (token) headers.Authorization = `Bearer ${token}`;
  const res = await fetch(apiUrl(path, params), {
    headers, credentials: 'omit', cache: 'no-store', referrerPolicy: 'no-referrer', redirect: 'error',
  });
  const text = await res.text();
  if (!res.ok) {
    let problem = null;
    try { problem = JSON.parse(text); } catch (e) { /* not JSON */ }
    const err = new ApiError(res.status, problem, text);
    if ((res.status === 401 || res.status === 403) && auth && !key && onAuthLost && path !== 'v1/keys' &&
        !/\/parameters$/.test(path)) onAuthLost(err);
    throw err;
  }
  return text;
}

export async function getJson(path, opts) {
  return JSON.parse(await getText(path, opts));
}

// every page of a cursor-paged list, up to `cap` items
export async function getAll(path, { cap = 2000, limit = 200, params = {} } = {}) {
  const items = [];
  let cursor = null;
  let first = null;
  do {
    const page = await getJson(path, { params: { ...params, limit, cursor } });
    if (!first) first = page;
    items.push(...page.items);
    cursor = page.next_cursor;
  } while (cursor && items.length < cap);
  return { items, truncated: Boolean(cursor), first };
}
