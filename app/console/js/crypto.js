// Encodings, hashes, Ed25519 and timestamps, as app/receipts/keys.py defines them. Hashing and signatures use
// the browser's WebCrypto (crypto.subtle): SHA-256 and Ed25519.

export class ValueError extends Error {}

// ---- base64 (keys.py b64encode / b64decode_strict) --------------------------------------------------------

export function b64encode(bytes) {
  let bin = '';
  for (let i = 0; i < bytes.length; i++) bin += String.fromCharCode(bytes[i]);
  return btoa(bin);
}

// standard padded base64, only the canonical encoding of the bytes; ValueError otherwise (messages as keys.py)
export function b64decodeStrict(text) {
  if (typeof text !== 'string') throw new ValueError('base64 value must be a string');
  // base64.b64decode(validate=True): only the alphabet, then at most two '='
  if (!/^[A-Za-z0-9+/]*={0,2}$/.test(text)) throw new ValueError('invalid base64');
  const data = text.replace(/=+$/, '');
  const pads = text.length - data.length;
  const r = data.length % 4;
  if (r === 1 || (r === 2 && pads < 2) || (r === 3 && pads < 1)) throw new ValueError('invalid base64');
  const bin = atob(data + '='.repeat((4 - r) % 4));
  const raw = new Uint8Array(bin.length);
  for (let i = 0; i < bin.length; i++) raw[i] = bin.charCodeAt(i);
  if (b64encode(raw) !== text) throw new ValueError('non-canonical base64');
  return raw;
}

export function hex(bytes) {
  return Array.from(bytes, (b) => b.toString(16).padStart(2, '0')).join('');
}

export function fromHex(text) {
  const out = new Uint8Array(text.length / 2);
  for (let i = 0; i < out.length; i++) out[i] = parseInt(text.slice(2 * i, 2 * i + 2), 16);
  return out;
}

export function concat(...parts) {
  const out = new Uint8Array(parts.reduce((n, p) => n + p.length, 0));
  let at = 0;
  for (const p of parts) { out.set(p, at); at += p.length; }
  return out;
}

export function bytesEqual(a, b) {
  if (!a || !b || a.length !== b.length) return false;
  for (let i = 0; i < a.length; i++) if (a[i] !== b[i]) return false;
  return true;
}

function subtle() {
  if (!globalThis.crypto || !globalThis.crypto.subtle) {
    throw new Error('this browser offers no WebCrypto here (it needs a secure context: https, or localhost)');
  }
  return globalThis.crypto.subtle;
}

export async function sha256(bytes) {
  return new Uint8Array(await subtle().digest('SHA-256', bytes));
}

// ---- Ed25519 (keys.py _verify_raw) --------------------------------------------------------------------------

const keyCache = new Map();

// true iff signatureB64 is the canonical base64 of a 64-byte Ed25519 signature of message by publicKeyRaw
export async function ed25519Verify(publicKeyRaw, message, signatureB64) {
  let sig;
  try {
    sig = b64decodeStrict(signatureB64);
  } catch (e) {
    return false;
  }
  if (sig.length !== 64 || publicKeyRaw.length !== 32) return false;
  const id = b64encode(publicKeyRaw);
  try {
    let key = keyCache.get(id);
    if (!key) {
      key = await subtle().importKey('raw', publicKeyRaw, { name: 'Ed25519' }, false, ['verify']);
      keyCache.set(id, key);
    }
    return await subtle().verify({ name: 'Ed25519' }, key, sig, message);
  } catch (e) {
    if (e instanceof Error && /WebCrypto/.test(e.message)) throw e;
    if (e && e.name === 'NotSupportedError') {
      throw new Error('this browser cannot verify Ed25519 signatures (WebCrypto Ed25519 is missing)');
    }
    return false;  // a malformed public key
  }
}

export async function ed25519Supported() {
  try {
    await subtle().importKey('raw', new Uint8Array(32).fill(1), { name: 'Ed25519' }, false, ['verify']);
    return true;
  } catch (e) {
    return e && e.name !== 'NotSupportedError' && !/WebCrypto/.test(String(e.message));
  }
}

// ---- times (keys.py parse_utc: datetime.fromisoformat, naive = UTC) -----------------------------------------

const DAYS = [31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31];
const ISO = new RegExp(
  '^(?:(\\d{4})-(\\d{2})-(\\d{2})|(\\d{4})(\\d{2})(\\d{2}))' +                // YYYY-MM-DD or YYYYMMDD
  '(?:.(\\d{2})(?::?(\\d{2})(?::?(\\d{2})(?:[.,](\\d+))?)?)?' +             // any one separator, then time
  '(Z|[+-]\\d{2}(?::?\\d{2}(?::?\\d{2}(?:[.,]\\d{1,6})?)?)?)?)?$', 'u');

function daysFromCivil(y, m, d) {  // days since 1970-01-01 in the proleptic Gregorian calendar
  y -= m <= 2 ? 1 : 0;
  const era = Math.floor(y / 400);
  const yoe = y - era * 400;
  const doy = Math.floor((153 * (m + (m > 2 ? -3 : 9)) + 2) / 5) + d - 1;
  return era * 146097 + yoe * 365 + Math.floor(yoe / 4) - Math.floor(yoe / 100) + doy - 719468;
}

// microseconds since 1970-01-01T00:00:00Z as a BigInt; ValueError for what fromisoformat refuses (the ISO 8601
// forms the service and Python 3.11 write: dates, times to the microsecond, Z or a numeric offset)
export function parseUtc(text) {
  if (typeof text !== 'string') throw new ValueError('timestamp must be an ISO-8601 string');
  const m = ISO.exec(text);
  if (!m) throw new ValueError(`Invalid isoformat string: ${JSON.stringify(text)}`);
  const [y, mo, d] = (m[1] ? [m[1], m[2], m[3]] : [m[4], m[5], m[6]]).map(Number);
  const leap = (y % 4 === 0 && y % 100 !== 0) || y % 400 === 0;
  if (y < 1 || mo < 1 || mo > 12 || d < 1 || d > (mo === 2 && leap ? 29 : DAYS[mo - 1])) {
    throw new ValueError('day is out of range for month');
  }
  const hh = Number(m[7] || 0);
  const mi = Number(m[8] || 0);
  const ss = Number(m[9] || 0);
  if (hh > 23 || mi > 59 || ss > 59) throw new ValueError('hour, minute or second out of range');
  const micro = BigInt((m[10] || '').slice(0, 6).padEnd(6, '0'));
  let offset = 0n;
  const tz = m[11];
  if (tz && tz !== 'Z') {
    const sign = tz[0] === '-' ? -1n : 1n;
    const [hms, frac = ''] = tz.slice(1).replace(/:/g, '').split(/[.,]/);
    const oh = BigInt(hms.slice(0, 2));
    const om = BigInt(hms.slice(2, 4) || '0');
    const os = BigInt(hms.slice(4, 6) || '0');
    if (oh > 23n || om > 59n || os > 59n) throw new ValueError('offset out of range');
    offset = sign * (((oh * 60n + om) * 60n + os) * 1000000n + BigInt(frac.padEnd(6, '0')));
  }
  const days = BigInt(daysFromCivil(y, mo, d));
  return (days * 86400n + BigInt(hh * 3600 + mi * 60 + ss)) * 1000000n + micro - offset;
}
