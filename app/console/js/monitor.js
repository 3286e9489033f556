// The log monitor, as Certificate Transparency monitors do it: the browser remembers the last signed checkpoint
// it verified for each log (localStorage, per tenant origin) and, at every visit, checks that the current signed
// checkpoint extends it (RFC 9162 consistency proof, verified here). A log that was rewritten (a fork: same
// entries, other root; a truncation: fewer entries) is flagged, and the remembered checkpoint is kept as evidence.
import { getJson, getText } from './api.js';
import { b64decodeStrict } from './crypto.js';
import { isMapping, parseStrict } from './jcs.js';
import { verifyConsistency } from './merkle.js';
import { checkpointProblems } from './verify.js';

const PREFIX = 'olu.console.checkpoint:';
const KEYS = 'olu.console.keys';

export function storedCheckpoint(origin) {
  try {
    const v = JSON.parse(window.localStorage.getItem(PREFIX + origin));
    return isMapping(v) && isMapping(v.checkpoint) ? v : null;
  } catch (e) {
    return null;
  }
}

function remember(cp) {
  window.localStorage.setItem(PREFIX + cp.origin, JSON.stringify({ checkpoint: cp, verified_at: new Date().toISOString() }));
}

export function forget(origin) {
  window.localStorage.removeItem(PREFIX + origin);
}

// the public keys: fetched from the service, remembered for offline use; a key seen before that is no longer
// listed is reported (retired keys stay listed, so one should never vanish)
export async function fetchKeys() {
  const answer = parseStrict(await getText('v1/keys', { auth: false }));
  const keys = isMapping(answer) && Array.isArray(answer.keys) ? answer.keys : [];
  let known = [];
  try { known = JSON.parse(window.localStorage.getItem(KEYS)) || []; } catch (e) { known = []; }
  const ids = new Set(keys.map((k) => k && k.key_id));
  const vanished = known.filter((k) => k && !ids.has(k.key_id)).map((k) => k.key_id);
  const merged = keys.concat(known.filter((k) => k && !ids.has(k.key_id)));
  window.localStorage.setItem(KEYS, JSON.stringify(merged));
  return { keys, vanished };
}

export function rememberedKeys() {
  try {
    const v = JSON.parse(window.localStorage.getItem(KEYS));
    return Array.isArray(v) && v.length ? v : null;
  } catch (e) {
    return null;
  }
}

function same(a, b) {
  return a.tree_size === b.tree_size && a.root_hash === b.root_hash;
}

// {state: first | unchanged | consistent | fork | truncated | invalid, origin, stored, current, detail}
export async function runMonitor(keys) {
  const current = parseStrict(await getText('v1/audit/checkpoint'), { python: true });
  const problems = await checkpointProblems(current, keys);
  if (problems.length) {
    return { state: 'invalid', origin: isMapping(current) ? current.origin : null, current,
      detail: `the current checkpoint does not verify: ${problems.join('; ')}` };
  }
  if (typeof current.tree_size !== 'number') {
    return { state: 'invalid', origin: current.origin, current, detail: 'the current checkpoint has an absurd tree size' };
  }
  const origin = current.origin;
  const saved = storedCheckpoint(origin);
  if (!saved) {
    remember(current);
    return { state: 'first', origin, current, detail: `remembered the checkpoint of size ${current.tree_size}` };
  }
  const stored = saved.checkpoint;
  const m = stored.tree_size;
  const n = current.tree_size;
  const base = { origin, stored, current, since: saved.verified_at };
  if (m > n) {
    return { ...base, state: 'truncated',
      detail: `the log had ${m} entries when this browser verified it; it now claims ${n}: entries were removed` };
  }
  if (m === n) {
    if (same(stored, current)) {
      remember(current);
      return { ...base, state: 'unchanged', detail: `unchanged: ${n} entries, same root` };
    }
    return { ...base, state: 'fork', detail: `same size ${n}, different root hash: the log was rewritten` };
  }
  if (m === 0) {
    remember(current);
    return { ...base, state: 'consistent', detail: `the log grew from 0 to ${n} entries` };
  }
  let proof;
  try {
    proof = await getJson('v1/audit/consistency', { params: { from_size: m, to_size: n } });
  } catch (e) {
    return { ...base, state: 'fork', detail: `the service gave no consistency proof from ${m} to ${n} (${e.message})` };
  }
  let ok = false;
  try {
    const hashes = Array.isArray(proof.hashes) ? proof.hashes.map(b64decodeStrict) : null;
    ok = hashes !== null && await verifyConsistency(BigInt(m), BigInt(n), b64decodeStrict(stored.root_hash),
      b64decodeStrict(current.root_hash), hashes);
  } catch (e) {
    ok = false;
  }
  if (!ok) {
    return { ...base, state: 'fork',
      detail: `no valid consistency proof from the remembered checkpoint (size ${m}) to the current one (size ${n}): the log was rewritten` };
  }
  remember(current);
  return { ...base, state: 'consistent', detail: `the log grew from ${m} to ${n} entries and keeps every earlier entry` };
}
