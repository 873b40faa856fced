// JSON payloads as the server sees them: checking a handler's value (what JSON cannot hold
// is refused, naming its path), measuring it as the server measures it (compact JSON in
// UTF-8 bytes, numbers as Python's json module writes them), and cutting text to a byte
// limit. Durations and times for the wire.

import type { Duration } from './gen/google/protobuf/duration.js';

/** Any value JSON can hold. */
export type Json = null | boolean | number | string | Json[] | { [key: string]: Json };

/** The largest integer a JSON number (a double) holds exactly. */
const MAX_SAFE = 2 ** 53;

/**
 * `value` as plain JSON data: objects' `toJSON` applied (a Date becomes its ISO string, as
 * JSON.stringify does), `undefined` object members left out and `undefined` array items or
 * a top-level `undefined` made null. Throws a TypeError naming the path (`output.items[2]`)
 * for what JSON cannot hold: NaN, Infinity, a bigint, a function, a symbol, a cycle.
 */
export function toJson(value: unknown, path = 'value'): Json {
  return walk(value, path, new Set(), '');
}

function walk(value: unknown, path: string, ancestors: Set<object>, key: string): Json {
  if (value !== null && typeof value === 'object' && typeof (value as { toJSON?: unknown }).toJSON === 'function') {
    value = (value as { toJSON: (k: string) => unknown }).toJSON(key);
  }
  switch (typeof value) {
    case 'undefined':
      return null;
    case 'boolean':
    case 'string':
      return value;
    case 'number':
      if (!Number.isFinite(value)) throw new TypeError(`${path}: ${value} is not a JSON number`);
      return value;
    case 'object': {
      if (value === null) return null;
      if (ancestors.has(value)) throw new TypeError(`${path}: a circular reference is not JSON`);
      ancestors.add(value);
      try {
        if (Array.isArray(value)) return value.map((item, i) => walk(item, `${path}[${i}]`, ancestors, String(i)));
        if (ArrayBuffer.isView(value) || value instanceof Map || value instanceof Set) {
          throw new TypeError(`${path}: a ${value.constructor.name} is not JSON (convert it to an array or object)`);
        }
        const out: { [key: string]: Json } = {};
        for (const [k, v] of Object.entries(value)) {
          if (v === undefined || typeof v === 'function' || typeof v === 'symbol') {
            if (v === undefined) continue;
            throw new TypeError(`${path}.${k}: a ${typeof v} is not JSON`);
          }
          out[k] = walk(v, `${path}.${k}`, ancestors, k);
        }
        return out;
      } finally {
        ancestors.delete(value);
      }
    }
    default:
      throw new TypeError(`${path}: a ${typeof value} is not JSON (use objects, arrays, strings, numbers, booleans or null)`);
  }
}

/**
 * The size of `value` (plain JSON data, see toJson) in bytes of compact JSON, as the server
 * measures an output (docs/protocol.md, section 5): no spaces, strings escaped only where
 * JSON requires and written as UTF-8 (a lone surrogate crosses the wire as U+FFFD), an
 * integral number within 2^53 without a fraction, any other number as Python writes it
 * (`1e-05`, `1e+16`, `9007199254740994.0`).
 */
export function jsonSize(value: Json): number {
  if (value === null) return 4;
  switch (typeof value) {
    case 'boolean':
      return value ? 4 : 5;
    case 'number':
      return pythonNumber(value).length;
    case 'string':
      return stringSize(value);
    default:
      break;
  }
  if (Array.isArray(value)) {
    let size = 2 + Math.max(0, value.length - 1);
    for (const item of value) size += jsonSize(item);
    return size;
  }
  const entries = Object.entries(value);
  let size = 2 + Math.max(0, entries.length - 1);
  for (const [k, v] of entries) size += stringSize(k) + 1 + jsonSize(v);
  return size;
}

function stringSize(s: string): number {
  // JSON.stringify escapes exactly what Python's json.dumps(ensure_ascii=False) escapes
  // (", \ and the control characters, with the same short forms), except lone surrogates,
  // which the protobuf encoder sends as U+FFFD: make the string well formed first.
  return Buffer.byteLength(JSON.stringify(s.isWellFormed() ? s : s.toWellFormed()), 'utf8');
}

/** A number as the server's json.dumps writes it (after reading integral doubles within 2^53 as integers). */
export function pythonNumber(n: number): string {
  if (Number.isInteger(n) && Math.abs(n) <= MAX_SAFE) return String(n === 0 ? 0 : n);
  // Python's repr: the shortest digits that read back the same (what toExponential() gives),
  // in fixed notation when the decimal exponent is from -4 to 15, else d.ddde+XX.
  const [mantissa, exp] = n.toExponential().split('e');
  const negative = mantissa.startsWith('-');
  const digits = mantissa.replace('-', '').replace('.', '');
  const e = Number(exp);
  let text: string;
  if (e < -4 || e >= 16) {
    text = sci(digits, e);
  } else if (e < 0) {
    text = `0.${'0'.repeat(-e - 1)}${digits}`;
  } else if (digits.length <= e + 1) {
    text = `${digits}${'0'.repeat(e + 1 - digits.length)}.0`;
  } else {
    text = `${digits.slice(0, e + 1)}.${digits.slice(e + 1)}`;
  }
  return negative ? `-${text}` : text;
}

function sci(digits: string, e: number): string {
  const m = digits.length > 1 ? `${digits[0]}.${digits.slice(1)}` : digits;
  const sign = e < 0 ? '-' : '+';
  return `${m}e${sign}${String(Math.abs(e)).padStart(2, '0')}`;
}

/**
 * `text` within `limit` bytes of UTF-8, its marker included, as the server would keep it:
 * past the limit it is cut and ends with `... [cut at K of N bytes]`.
 */
export function cutUtf8(text: string, limit: number): string {
  const raw = Buffer.from(text.isWellFormed() ? text : text.toWellFormed(), 'utf8');
  if (raw.length <= limit) return text;
  const keep = limit - `... [cut at ${limit} of ${raw.length} bytes]`.length;
  let end = keep;
  // Back off to a character boundary (a UTF-8 continuation byte is 0b10xxxxxx).
  while (end > 0 && (raw[end] & 0xc0) === 0x80) end -= 1;
  return `${raw.subarray(0, end).toString('utf8')}... [cut at ${keep} of ${raw.length} bytes]`;
}

// -- durations and times ---------------------------------------------------------------

/** Milliseconds as a google.protobuf.Duration; negative or non-finite is a RangeError naming `what`. */
export function toDuration(ms: number, what = 'duration'): Duration {
  if (typeof ms !== 'number' || !Number.isFinite(ms) || ms < 0) {
    throw new RangeError(`${what}: ${String(ms)} is not a duration in milliseconds >= 0`);
  }
  const nanos = Math.round(ms * 1e6);
  const seconds = Math.floor(nanos / 1e9);
  return { seconds, nanos: nanos - seconds * 1e9 };
}

/** A google.protobuf.Duration as milliseconds; unset is undefined. */
export function fromDuration(d: Duration | undefined | null): number | undefined {
  return d ? d.seconds * 1000 + d.nanos / 1e6 : undefined;
}
