// Strict JSON parsing and RFC 8785 canonical JSON, exactly as app/receipts/verify.py (_strict_loads) and
// app/receipts/canonical.py (canonical_json) do them.
//
// parseStrict(text, {python: true}) reads JSON the way Python's json module does with the verifier's hooks:
// duplicate member names and NaN/Infinity are errors, and numbers keep the Python type they would have:
//   * an integer literal is a JS number; one outside ±(2^53 - 1) becomes a PyBigInt (canonical JSON refuses
//     it, as canonical.py does, and it stays an "integer" for the type checks);
//   * a literal with a fraction or an exponent is a Python float: a JS number, or, where its value is a whole
//     number (3.0, 1e2), a PyFloat, so that checks which want an integer (leaf_index, tree_size) refuse it.
// Without {python: true} every number is a plain JS number (for display).

export const MAX_SAFE = 9007199254740991;

export class PyFloat {
  constructor(value) { this.value = value; }
}

export class PyBigInt {
  constructor(text) { this.text = text; this.value = Number(text); }
}

export class JSONError extends Error {}

const WS = new Set([' ', '\t', '\n', '\r']);
const ESC = { '"': '"', '\\': '\\', '/': '/', b: '\b', f: '\f', n: '\n', r: '\r', t: '\t' };
const NUM = /-?(?:0|[1-9]\d*)(\.\d+)?([eE][-+]?\d+)?/y;

function pyQuote(s) {
  return pyRepr(s);
}

function position(text, i) {  // as Python's json module counts: in code points
  const before = Array.from(text.slice(0, i));
  const pos = before.length;
  const line = before.filter((c) => c === '\n').length + 1;
  const col = pos - before.lastIndexOf('\n');
  return `line ${line} column ${col} (char ${pos})`;
}

export function parseStrict(text, { python = false } = {}) {
  if (typeof text !== 'string') throw new JSONError('JSON text must be a string');
  let i = 0;
  const fail = (msg, at = i) => { throw new JSONError(`${msg}: ${position(text, at)}`); };
  const ws = () => { while (i < text.length && WS.has(text[i])) i++; };

  function value() {
    ws();
    const c = text[i];
    if (c === '{') return object();
    if (c === '[') return array();
    if (c === '"') return string();
    if (text.startsWith('null', i)) { i += 4; return null; }
    if (text.startsWith('true', i)) { i += 4; return true; }
    if (text.startsWith('false', i)) { i += 5; return false; }
    for (const name of ['NaN', 'Infinity', '-Infinity']) {
      if (text.startsWith(name, i)) throw new JSONError(`${name} is not valid JSON`);
    }
    NUM.lastIndex = i;
    const m = NUM.exec(text);
    if (m) {
      i = NUM.lastIndex;
      return number(m[0], m[1] !== undefined || m[2] !== undefined);
    }
    return fail('Expecting value');
  }

  function number(lit, isFloat) {
    const v = Number(lit);
    if (!python) return v;
    if (isFloat) return Number.isInteger(v) ? new PyFloat(v) : v;  // Infinity (1e400) is a PyFloat too
    if (Math.abs(v) > MAX_SAFE) {
      const big = BigInt(lit);
      if (big > BigInt(MAX_SAFE) || big < -BigInt(MAX_SAFE)) return new PyBigInt(lit);
    }
    return v;
  }

  function string() {
    const start = i++;  // the opening quote
    let out = '';
    for (;;) {
      if (i >= text.length) fail('Unterminated string starting at', start);
      const c = text[i];
      if (c === '"') { i++; return out; }
      if (c === '\\') {
        const e = text[i + 1];
        if (e === 'u') {
          const hex = text.slice(i + 2, i + 6);
          if (!/^[0-9a-fA-F]{4}$/.test(hex)) fail('Invalid \\uXXXX escape');
          out += String.fromCharCode(parseInt(hex, 16));
          i += 6;
        } else if (e !== undefined && Object.prototype.hasOwnProperty.call(ESC, e)) {
          out += ESC[e];
          i += 2;
        } else {
          fail('Invalid \\escape');
        }
      } else if (c < ' ') {
        fail('Invalid control character at');
      } else {
        out += c;
        i++;
      }
    }
  }

  function array() {
    i++;
    const out = [];
    ws();
    if (text[i] === ']') { i++; return out; }
    for (;;) {
      out.push(value());
      ws();
      if (text[i] === ',') { i++; continue; }
      if (text[i] === ']') { i++; return out; }
      fail("Expecting ',' delimiter");
    }
  }

  function object() {
    i++;
    const out = Object.create(null);
    const seen = new Set();
    let duplicate = null;  // reported when the object is complete, as Python's object_pairs_hook does
    ws();
    if (text[i] === '}') { i++; return plain(out); }
    for (;;) {
      ws();
      if (text[i] !== '"') fail('Expecting property name enclosed in double quotes');
      const key = string();
      ws();
      if (text[i] !== ':') fail("Expecting ':' delimiter");
      i++;
      const v = value();
      if (seen.has(key) && duplicate === null) duplicate = key;
      seen.add(key);
      out[key] = v;
      ws();
      if (text[i] === ',') { i++; continue; }
      if (text[i] === '}') {
        i++;
        if (duplicate !== null) throw new JSONError(`duplicate member ${pyQuote(duplicate)}`);
        return plain(out);
      }
      fail("Expecting ',' delimiter");
    }
  }

  const result = value();
  ws();
  if (i !== text.length) fail('Extra data');
  return result;
}

// objects keep their member order (insertion order, as Python dicts do); a plain prototype for ordinary use
function plain(o) {
  const out = {};
  for (const k of Object.keys(o)) {
    Object.defineProperty(out, k, { value: o[k], enumerable: true, writable: true, configurable: true });
  }
  return out;
}

export class CanonicalJSONError extends Error {}

export function isMapping(v) {
  return v !== null && typeof v === 'object' && !Array.isArray(v) && !(v instanceof PyFloat) &&
    !(v instanceof PyBigInt) && !(v instanceof Uint8Array);
}

const LONE_SURROGATE = /[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/;

// RFC 8785 canonical JSON text of a value (canonical.py's canonical_json, as a string; utf8() gives its bytes)
export function canonicalize(v, path = '$') {
  if (v === null) return 'null';
  if (v === true) return 'true';
  if (v === false) return 'false';
  if (typeof v === 'string') {
    if (LONE_SURROGATE.test(v)) throw new CanonicalJSONError('input contains non-UTF-8 codepoints');
    return JSON.stringify(v);  // RFC 8785 §3.2.2.2: exactly ECMAScript's JSON.stringify for well-formed strings
  }
  if (typeof v === 'number' || v instanceof PyFloat) {
    const x = typeof v === 'number' ? v : v.value;
    if (!Number.isFinite(x)) {
      throw new CanonicalJSONError(`${path}: ${pyRepr(v)} is not representable in JSON (NaN/inf are rejected)`);
    }
    return JSON.stringify(x);  // RFC 8785 §3.2.2.3: ECMAScript Number serialisation; -0 is "0"
  }
  if (v instanceof PyBigInt) {
    throw new CanonicalJSONError(`${path}: integer ${v.text} is outside the RFC 8785 safe range ±(2**53-1)`);
  }
  if (Array.isArray(v)) return '[' + v.map((x, i) => canonicalize(x, `${path}[${i}]`)).join(',') + ']';
  if (isMapping(v)) {
    const keys = Object.keys(v);
    const parts = keys.map((k) => [k, canonicalize(k, path) + ':' + canonicalize(v[k], `${path}.${k}`)]);
    parts.sort((a, b) => (a[0] < b[0] ? -1 : a[0] > b[0] ? 1 : 0));  // UTF-16 code units (RFC 8785 §3.2.3)
    return '{' + parts.map((p) => p[1]).join(',') + '}';
  }
  throw new CanonicalJSONError(`${path}: type ${typeof v} is not JSON-serialisable`);
}

const encoder = new TextEncoder();

export function utf8(s) {
  return encoder.encode(s);
}

// ---- Python's repr() and str() of JSON values, for messages identical to the Python verifier's -------------

function pyFloatRepr(x) {
  if (Number.isNaN(x)) return 'nan';
  if (!Number.isFinite(x)) return x > 0 ? 'inf' : '-inf';
  if (x === 0) return Object.is(x, -0) ? '-0.0' : '0.0';
  const [mant, expText] = x.toExponential().split('e');  // shortest round-trip digits
  const exp = Number(expText);
  const neg = mant.startsWith('-');
  const digits = mant.replace('-', '').replace('.', '');
  let out;
  if (exp >= -4 && exp < 16) {  // Python's repr: fixed notation for 1e-4 <= |x| < 1e16
    if (exp < 0) out = '0.' + '0'.repeat(-exp - 1) + digits;
    else if (digits.length > exp + 1) out = digits.slice(0, exp + 1) + '.' + digits.slice(exp + 1);
    else out = digits + '0'.repeat(exp + 1 - digits.length) + '.0';
  } else {
    const m = digits.length > 1 ? digits[0] + '.' + digits.slice(1) : digits;
    out = `${m}e${exp < 0 ? '-' : '+'}${String(Math.abs(exp)).padStart(2, '0')}`;
  }
  return (neg ? '-' : '') + out;
}

const NON_PRINTABLE = /[\p{Cc}\p{Cf}\p{Cs}\p{Co}\p{Cn}\p{Zl}\p{Zp}\p{Zs}]/u;  // not str.isprintable()

function pyStrRepr(s) {
  const quote = s.includes("'") && !s.includes('"') ? '"' : "'";
  let out = quote;
  for (const ch of s) {
    const c = ch.codePointAt(0);
    if (ch === quote || ch === '\\') out += '\\' + ch;
    else if (ch === '\n') out += '\\n';
    else if (ch === '\r') out += '\\r';
    else if (ch === '\t') out += '\\t';
    else if (ch !== ' ' && NON_PRINTABLE.test(ch)) {
      out += c <= 0xff ? '\\x' + c.toString(16).padStart(2, '0')
        : c <= 0xffff ? '\\u' + c.toString(16).padStart(4, '0') : '\\U' + c.toString(16).padStart(8, '0');
    } else out += ch;
  }
  return out + quote;
}

export function pyRepr(v) {
  if (v === null || v === undefined) return 'None';
  if (v === true) return 'True';
  if (v === false) return 'False';
  if (typeof v === 'string') return pyStrRepr(v);
  if (v instanceof PyBigInt) return v.text;
  if (v instanceof PyFloat) return pyFloatRepr(v.value);
  if (typeof v === 'number') return Number.isInteger(v) ? String(v === 0 ? 0 : v) : pyFloatRepr(v);
  if (Array.isArray(v)) return '[' + v.map(pyRepr).join(', ') + ']';
  if (isMapping(v)) return '{' + Object.keys(v).map((k) => `${pyStrRepr(k)}: ${pyRepr(v[k])}`).join(', ') + '}';
  return String(v);
}

export function pyStr(v) {
  return typeof v === 'string' ? v : pyRepr(v);
}

// ---- Python's numeric view of parsed values ---------------------------------------------------------------

// isinstance(v, int) and not isinstance(v, bool)
export function isInt(v) {
  return (typeof v === 'number' && Number.isInteger(v)) || v instanceof PyBigInt;
}

// isinstance(v, (int, float)) and not isinstance(v, bool)
export function isNumber(v) {
  return typeof v === 'number' || v instanceof PyFloat || v instanceof PyBigInt;
}

export function numValue(v) {
  return typeof v === 'number' ? v : v.value;
}

// an integer as a BigInt (for the Merkle arithmetic, exact beyond 2^31)
export function bigOf(v) {
  return v instanceof PyBigInt ? BigInt(v.text) : BigInt(v);
}

// Python's a == b for JSON values (True == 1, 1 == 1.0, dicts and lists compared deeply)
export function pyEq(a, b) {
  const num = (x) => (x === true || x === false || isNumber(x));
  if (num(a) && num(b)) {
    if (a instanceof PyBigInt || b instanceof PyBigInt) {
      return a instanceof PyBigInt && b instanceof PyBigInt && BigInt(a.text) === BigInt(b.text);
    }
    const v = (x) => (x === true ? 1 : x === false ? 0 : numValue(x));
    return v(a) === v(b);
  }
  if (num(a) || num(b)) return false;
  if (a === null || b === null || a === undefined || b === undefined) return a === b;
  if (typeof a === 'string' || typeof b === 'string') return a === b;
  if (Array.isArray(a) || Array.isArray(b)) {
    return Array.isArray(a) && Array.isArray(b) && a.length === b.length && a.every((x, i) => pyEq(x, b[i]));
  }
  if (isMapping(a) && isMapping(b)) {
    const ka = Object.keys(a);
    return ka.length === Object.keys(b).length &&
      ka.every((k) => Object.prototype.hasOwnProperty.call(b, k) && pyEq(a[k], b[k]));
  }
  return false;
}
