// The offline verifier of app/receipts/verify.py, in the browser: the same checks, with the same names, outcomes
// and (where no Python exception text is quoted) the same details. Keys: keys.py verify_with_public_keys and
// PublicKeyEntry; checkpoints: checkpoint.py checkpoint_problems. The Python file is the reference: a change
// there must be made here too (tests/test_console_browser.py compares both on shared vectors).
import {
  CanonicalJSONError, JSONError, canonicalize, isInt, isMapping, isNumber, numValue, bigOf, parseStrict, pyEq,
  pyRepr, pyStr, utf8, PyBigInt,
} from './jcs.js';
import { ValueError, b64decodeStrict, ed25519Verify, fromHex, hex, parseUtc, sha256 } from './crypto.js';
import { HASH_SIZE, leafHash, verifyConsistency, verifyInclusion } from './merkle.js';

export const ERASURE = 'model_erasure';
const ALG = 'Ed25519';

export class Report {
  constructor() { this.checks = []; }

  get ok() { return this.checks.length > 0 && this.checks.every((c) => c.ok); }

  add(check, ok, detail = '') {
    this.checks.push({ check, ok: Boolean(ok), detail });
    return Boolean(ok);
  }

  failures() { return this.checks.filter((c) => !c.ok); }
}

const has = (o, k) => Object.prototype.hasOwnProperty.call(o, k);
const get = (o, k) => (isMapping(o) && has(o, k) ? o[k] : null);

function isValueError(e) {
  return e instanceof ValueError || e instanceof JSONError || e instanceof CanonicalJSONError;
}

function strictLoads(text) {
  return parseStrict(text, { python: true });
}

// ---- keys (keys.py) -----------------------------------------------------------------------------------------

// PublicKeyEntry.from_dict, or null where Python raises (KeyLoadError, AttributeError, TypeError)
function keyEntry(d) {
  if (!isMapping(d)) return null;
  if (!pyEq(has(d, 'alg') ? d.alg : ALG, ALG)) return null;
  if (!has(d, 'public_key')) return null;
  let raw;
  try {
    raw = b64decodeStrict(d.public_key);
  } catch (e) {
    return null;
  }
  if (raw.length !== 32) return null;
  return { raw, keyId: null, given: has(d, 'key_id') ? d.key_id : undefined,
    notBefore: get(d, 'not_before'), notAfter: get(d, 'not_after') };
}

async function keyIdFor(raw) {
  return hex(await sha256(raw)).slice(0, 16);
}

function validAt(entry, at) {
  if (at === null) return true;
  const t = parseUtc(at);
  if (entry.notBefore !== null && t < parseUtc(entry.notBefore)) return false;
  if (entry.notAfter !== null && t > parseUtc(entry.notAfter)) return false;
  return true;
}

// keys.py verify_with_public_keys: the first well-formed entry with this key id decides
export async function verifyWithPublicKeys(publicKeys, keyId, message, signatureB64, at = null) {
  for (const k of publicKeys) {
    const entry = keyEntry(k);
    if (entry === null) continue;
    const kid = await keyIdFor(entry.raw);
    if (entry.given !== undefined && !pyEq(entry.given, kid)) continue;
    if (kid === keyId) {
      try {
        if (!validAt(entry, at)) return false;
      } catch (e) {
        if (e instanceof ValueError) return false;
        throw e;
      }
      if (typeof signatureB64 !== 'string') return false;
      return ed25519Verify(entry.raw, message, signatureB64);
    }
  }
  return false;
}

function keyIdOf(entry) {
  return isMapping(entry) && has(entry, 'key_id') ? entry.key_id : null;
}

// ---- checkpoints (checkpoint.py) ----------------------------------------------------------------------------

export function tenantOrigin(tenantId) {
  return `olu/${tenantId}`;
}

export function checkpointBody(origin, treeSize, rootHashB64, timestamp) {
  for (const [name, v] of [['origin', origin], ['timestamp', timestamp], ['root_hash', rootHashB64]]) {
    if (typeof v !== 'string' || !v || v.includes('\n') || v.includes('\r')) {
      throw new ValueError(`checkpoint ${name} must be a non-empty single-line string`);
    }
  }
  if (!isInt(treeSize) || (treeSize instanceof PyBigInt ? treeSize.text.startsWith('-') : treeSize < 0)) {
    throw new ValueError('checkpoint tree_size must be a non-negative integer');
  }
  const text = `${origin}\n${pyStr(treeSize)}\n${rootHashB64}\n${timestamp}\n`;
  try {
    canonicalize(text);  // lone surrogates cannot be UTF-8 encoded (Python: UnicodeEncodeError)
  } catch (e) {
    throw new ValueError("'utf-8' codec can't encode characters: surrogates not allowed");
  }
  return utf8(text);
}

// why cp does not verify (empty list = valid)
export async function checkpointProblems(cp, publicKeys) {
  if (!isMapping(cp)) return ['checkpoint is not an object'];
  const missing = ['origin', 'tree_size', 'root_hash', 'timestamp', 'key_id', 'signature'].filter((k) => !has(cp, k));
  if (missing.length) return [`checkpoint lacks ${missing.join(', ')}`];
  let body;
  try {
    body = checkpointBody(cp.origin, cp.tree_size, cp.root_hash, cp.timestamp);
    if (b64decodeStrict(cp.root_hash).length !== HASH_SIZE) return ['root_hash is not 32 bytes'];
  } catch (e) {
    if (e instanceof ValueError) return [e.message];
    throw e;
  }
  try {
    parseUtc(cp.timestamp);
  } catch (e) {
    return ['timestamp is not ISO-8601'];
  }
  const at = cp.timestamp;
  if (typeof cp.key_id !== 'string' || typeof cp.signature !== 'string') return ['key_id and signature must be strings'];
  if (!await verifyWithPublicKeys(Array.from(publicKeys), cp.key_id, body, cp.signature, at)) {
    return [`signature does not verify under trusted key ${pyRepr(cp.key_id)} at ${at}`];
  }
  return [];
}

// ---- receipts (verify.py) -----------------------------------------------------------------------------------

function decodeHashes(hashes) {
  if (!Array.isArray(hashes)) throw new ValueError('hashes must be a list');
  const out = hashes.map((h) => b64decodeStrict(h));
  if (out.some((h) => h.length !== HASH_SIZE)) throw new ValueError('every hash must be 32 bytes');
  return out;
}

function without(receipt, members) {
  const out = {};
  for (const k of Object.keys(receipt)) if (!members.includes(k)) out[k] = receipt[k];
  return out;
}

// canonical.py receipt_signing_bytes / receipt_leaf_bytes
export function receiptSigningBytes(receipt) {
  return utf8(canonicalize(without(receipt, ['signature', 'proof'])));
}

export function receiptLeafBytes(receipt) {
  if (!has(receipt, 'signature')) {
    throw new CanonicalJSONError("a receipt must be signed before it is logged (no 'signature' member)");
  }
  return utf8(canonicalize(without(receipt, ['proof'])));
}

function frexpMantissaIsHalf(x) {  // math.frexp(x)[0] == 0.5 for x > 0: x is a power of two
  if (!(x > 0) || !Number.isFinite(x)) return false;
  const view = new DataView(new ArrayBuffer(8));
  view.setFloat64(0, x);
  const hi = view.getUint32(0);
  const lo = view.getUint32(4);
  const exp = (hi >>> 20) & 0x7ff;
  const mantHi = hi & 0xfffff;
  if (exp !== 0) return mantHi === 0 && lo === 0;
  const bits = (n) => { let c = 0; while (n) { c += n & 1; n >>>= 1; } return c; };
  return bits(mantHi) + bits(lo) === 1;  // a subnormal power of two
}

function discreteMechanismProblem(mech) {
  const [grid, sigma, sens, rho] = ['grid', 'sigma', 'sensitivity', 'rho'].map((k) => get(mech, k));
  if (![grid, sigma, sens, rho].every((v) => isNumber(v) && Number.isFinite(numValue(v)))) {
    return 'grid, sigma, sensitivity and rho must be finite numbers';
  }
  const [g, s, d, r] = [grid, sigma, sens, rho].map(numValue);
  if (!(g > 0 && frexpMantissaIsHalf(g))) return `grid ${pyRepr(grid)} is not a positive power of two`;
  if (!pyEq(get(mech, 'rounding'), 'nearest_even')) return `unknown rounding ${pyRepr(get(mech, 'rounding'))}`;
  if (!(s > 0 && d >= 0 && r >= d * d / (2.0 * s * s) * (1.0 - 1e-12))) return 'rho is below sensitivity^2 / (2 sigma^2)';
  return null;
}

// append the checks of one receipt (with its proof) to report
export async function verifyReceipt(receipt, trustedPublicKeys, report, name = 'receipt', expectedOrigin = null) {
  let signed;
  let leaf;
  try {
    if (typeof receipt === 'string') receipt = strictLoads(receipt);
    if (!isMapping(receipt)) throw new ValueError('receipt is not a JSON object');
    const canon = canonicalize(without(receipt, ['proof']));
    if (canonicalize(strictLoads(canon)) !== canon) throw new ValueError('canonical form is not stable under re-serialisation');
    signed = receiptSigningBytes(receipt);
    leaf = receiptLeafBytes(receipt);
  } catch (e) {
    if (!isValueError(e)) throw e;
    report.add(`${name}.canonical`, false, e.message);
    return;
  }
  report.add(`${name}.canonical`, true, `${signed.length} signed bytes`);
  if (pyEq(get(receipt, 'kind'), ERASURE)) {
    const problems = erasureProblems(receipt);
    report.add(`${name}.erasure`, problems.length === 0, problems.join('; ') ||
      `exact erasure of ${pyStr(receipt.records.erased)} records of model ${pyStr(get(receipt, 'model_id'))}`);
  }
  const mech = get(receipt, 'mechanism');
  if (isMapping(mech) && pyEq(get(mech, 'type'), 'discrete_gaussian')) {
    const problem = discreteMechanismProblem(mech);
    report.add(`${name}.mechanism`, problem === null, problem || `discrete_gaussian on grid ${pyRepr(mech.grid)}`);
  }

  // key and signature
  const keyId = get(receipt, 'key_id');
  const sig = get(receipt, 'signature');
  const issued = get(receipt, 'issued_at');
  const known = trustedPublicKeys.filter((e) => pyEq(keyIdOf(e), keyId) && keyIdOf(e) !== null);
  if (typeof keyId !== 'string' || known.length === 0) {
    report.add(`${name}.key`, false, `key_id ${pyRepr(keyId)} is not a trusted key`);
    report.add(`${name}.signature`, false, 'no trusted key to verify with');
  } else {
    let at = null;
    if (typeof issued === 'string') {
      try {
        parseUtc(issued);
        at = issued;
      } catch (e) { /* not a time: the window is not checked */ }
    }
    const inWindow = typeof sig === 'string' ? await verifyWithPublicKeys(known, keyId, signed, sig, at) : false;
    const sigOk = typeof sig === 'string' ? await verifyWithPublicKeys(known, keyId, signed, sig) : false;
    report.add(`${name}.key`, inWindow || !sigOk,
      `trusted key ${keyId}` + (inWindow || !sigOk ? '' : ` not valid at ${pyStr(issued)}`));
    report.add(`${name}.signature`, sigOk, sigOk ? 'Ed25519 signature valid' : 'bad signature');
  }

  // checkpoint
  const proof = get(receipt, 'proof');
  if (!isMapping(proof)) {
    report.add(`${name}.checkpoint`, false, 'receipt has no proof');
    report.add(`${name}.inclusion`, false, 'receipt has no proof');
    return;
  }
  const cp = get(proof, 'checkpoint');
  let problems = await checkpointProblems(cp, trustedPublicKeys);
  let origin = expectedOrigin;
  if (origin === null && typeof get(receipt, 'tenant_id') === 'string') origin = tenantOrigin(receipt.tenant_id);
  if (problems.length === 0 && origin !== null && !pyEq(cp.origin, origin)) {
    problems = [`origin ${pyRepr(cp.origin)} is not the expected ${pyRepr(origin)}`];
  }
  report.add(`${name}.checkpoint`, problems.length === 0, problems.join('; ') || `signed by ${pyStr(cp.key_id)}`);

  // inclusion
  try {
    const idx = get(proof, 'leaf_index');
    const size = get(proof, 'tree_size');
    if (!(isInt(idx) && isInt(size))) throw new ValueError('leaf_index and tree_size must be integers');
    if (has(receipt, 'log_index') && !pyEq(receipt.log_index, idx)) {
      throw new ValueError(`proof.leaf_index ${pyStr(idx)} != receipt log_index ${pyRepr(receipt.log_index)}`);
    }
    if (!isMapping(cp) || !pyEq(get(cp, 'tree_size'), size)) {
      throw new ValueError("proof.tree_size differs from the checkpoint's tree_size");
    }
    const root = b64decodeStrict(get(cp, 'root_hash'));
    const hashes = decodeHashes(get(proof, 'hashes'));
    const ok = await verifyInclusion(await leafHash(leaf), bigOf(idx), bigOf(size), hashes, root);
    report.add(`${name}.inclusion`, ok,
      ok ? `leaf ${pyStr(idx)} in tree of size ${pyStr(size)}` : 'audit path does not lead to the root');
  } catch (e) {
    if (!(e instanceof ValueError)) throw e;
    report.add(`${name}.inclusion`, false, e.message);
  }
}

const HEX64 = /^[0-9a-f]{64}$/;
const hex64 = (v) => typeof v === 'string' && HEX64.test(v);
const zero = (v) => isNumber(v) && !(v instanceof PyBigInt) && numValue(v) === 0;

// why an erasure receipt's terms are not those of an exact erasure (empty = they are)
export function erasureProblems(receipt) {
  const out = [];
  const mech = get(receipt, 'mechanism');
  const guarantee = get(receipt, 'guarantee');
  const records = get(receipt, 'records');
  if (!(isMapping(mech) && pyEq(get(mech, 'type'), 'exact') && ['sigma', 'sensitivity', 'rho'].every((k) => zero(get(mech, k))))) {
    out.push('mechanism is not exact with sigma = sensitivity = rho = 0');
  }
  if (!(isMapping(guarantee) && pyEq(get(guarantee, 'definition'), 'exact') && zero(get(guarantee, 'epsilon')) &&
        zero(get(guarantee, 'delta')))) {
    out.push('guarantee is not exact with epsilon = delta = 0');
  }
  const erased = get(records, 'erased');
  if (!(isMapping(records) && isInt(erased) && numValue(erased) >= 0 && hex64(get(records, 'commitments_sha256')))) {
    out.push('records must give erased (an integer >= 0) and commitments_sha256 (64 hex digits)');
  } else {
    const learned = get(receipt, 'records_learned');
    const before = get(receipt, 'records_forgotten_before');
    if (!(isInt(learned) && isInt(before) && numValue(before) >= 0 && numValue(before) <= numValue(learned))) {
      out.push('records_learned and records_forgotten_before must be integers, 0 <= forgotten <= learned');
    } else if (numValue(erased) > numValue(learned) - numValue(before)) {
      out.push(`${pyStr(erased)} records erased but only ${numValue(learned) - numValue(before)} were held`);
    }
  }
  if (typeof get(receipt, 'model_id') !== 'string') out.push('the receipt names no model');
  return out;
}

async function erasedRecordsSha256(commits) {
  const sorted = commits.slice().sort();  // lowercase hex of equal length: the byte order
  return hex(await sha256(fromHex(sorted.join(''))));
}

async function verifyErasure(entry, keys, report, name, expectedOrigin) {
  if (!isMapping(entry) || !has(entry, 'receipt')) {
    report.add(name, false, 'an erasure entry is {receipt, commitments}');
    return;
  }
  let receipt = entry.receipt;
  if (typeof receipt === 'string') {
    try {
      receipt = strictLoads(receipt);
    } catch (e) { /* verifyReceipt reports it */ }
  }
  if (!(isMapping(receipt) && pyEq(get(receipt, 'kind'), ERASURE))) {
    report.add(`${name}.erasure`, false, `the receipt's kind is not ${pyRepr(ERASURE)}`);
  }
  await verifyReceipt(receipt, keys, report, name, expectedOrigin);
  const commits = get(entry, 'commitments');
  if (commits === null || !isMapping(receipt)) return;
  const records = isMapping(get(receipt, 'records')) ? receipt.records : {};
  if (!(Array.isArray(commits) && commits.every(hex64))) {
    report.add(`${name}.records`, false, 'commitments must be a list of 64-hex strings');
  } else if (new Set(commits).size !== commits.length) {
    report.add(`${name}.records`, false, 'commitments repeat');
  } else if (!pyEq(get(records, 'erased'), commits.length)) {
    report.add(`${name}.records`, false, `${commits.length} commitments, receipt says ${pyRepr(get(records, 'erased'))}`);
  } else {
    const ok = pyEq(await erasedRecordsSha256(commits), get(records, 'commitments_sha256'));
    report.add(`${name}.records`, ok, ok ? `${commits.length} commitments hash to commitments_sha256`
      : "SHA-256 of the sorted commitments differs from the receipt's commitments_sha256");
  }
}

async function verifyConsistencyEntry(c, keys, report, expectedOrigin) {
  if (!isMapping(c)) {
    report.add('consistency', false, 'consistency is not an object');
    return;
  }
  const a = get(c, 'from');
  const b = get(c, 'to');
  for (const [label, cp] of [['from', a], ['to', b]]) {
    let probs = await checkpointProblems(cp, keys);
    if (probs.length === 0 && expectedOrigin !== null && !pyEq(cp.origin, expectedOrigin)) {
      probs = [`origin ${pyRepr(cp.origin)} is not the expected ${pyRepr(expectedOrigin)}`];
    }
    report.add(`consistency.${label}_checkpoint`, probs.length === 0, probs.join('; ') || 'signature valid');
  }
  try {
    if (!(isMapping(a) && isMapping(b))) throw new ValueError('missing checkpoints');
    if (!pyEq(get(a, 'origin'), get(b, 'origin'))) throw new ValueError('checkpoints are from different logs (origins differ)');
    const m = get(a, 'tree_size');
    const n = get(b, 'tree_size');
    if (!(isInt(m) && isInt(n))) throw new ValueError('tree sizes must be integers');
    const ok = await verifyConsistency(bigOf(m), bigOf(n), b64decodeStrict(get(a, 'root_hash')),
      b64decodeStrict(get(b, 'root_hash')), decodeHashes(get(c, 'hashes')));
    report.add('consistency.proof', ok, ok ? `tree ${pyStr(n)} extends tree ${pyStr(m)}` : 'consistency proof invalid');
  } catch (e) {
    if (!(e instanceof ValueError)) throw e;
    report.add('consistency.proof', false, e.message);
  }
}

// verify every receipt, erasure and the optional consistency proof of a bundle; never throws on bad input
export async function verifyBundle(bundle, trustedPublicKeys, { expectedOrigin = null } = {}) {
  const report = new Report();
  if (isMapping(trustedPublicKeys)) trustedPublicKeys = has(trustedPublicKeys, 'keys') ? trustedPublicKeys.keys : [];
  const keys = Array.isArray(trustedPublicKeys) ? trustedPublicKeys : [];
  if (!isMapping(bundle)) {
    report.add('bundle', false, 'bundle is not an object');
    return report;
  }
  const receipts = has(bundle, 'receipts') ? bundle.receipts : [];
  const erasures = has(bundle, 'erasures') ? bundle.erasures : [];
  if (!Array.isArray(erasures)) {
    report.add('bundle', false, 'erasures is not a list');
    return report;
  }
  if (!Array.isArray(receipts) || (!receipts.length && !erasures.length && !has(bundle, 'consistency'))) {
    report.add('bundle', false, 'bundle has no receipts and no consistency proof');
    return report;
  }
  for (let i = 0; i < receipts.length; i++) await verifyReceipt(receipts[i], keys, report, `receipt[${i}]`, expectedOrigin);
  for (let i = 0; i < erasures.length; i++) await verifyErasure(erasures[i], keys, report, `erasure[${i}]`, expectedOrigin);
  if (has(bundle, 'consistency')) await verifyConsistencyEntry(bundle.consistency, keys, report, expectedOrigin);
  return report;
}

// `olu verify FILE`: a bundle, or a single receipt as served by GET /v1/receipts/{id}; the text is parsed
// strictly (duplicate members, NaN: refused). Returns {report, data, keysFromBundle} or throws JSONError.
export async function verifyFileText(text, trustedKeys) {
  let data = strictLoads(text);
  if (isMapping(data) && !['receipts', 'erasures', 'consistency'].some((k) => has(data, k))) data = { receipts: [data] };
  const keys = trustedKeys !== null ? trustedKeys : (isMapping(data) && has(data, 'public_keys') ? data.public_keys : []);
  return { report: await verifyBundle(data, keys), data };
}

export { strictLoads };
