// Converts between plain JSON values and the well-known protobuf types on the wire
// (google.protobuf.Value / Struct / Duration / Timestamp) as @grpc/proto-loader
// represents them with the options this module loads workers.proto with.

import type { Duration } from './gen/google/protobuf/Duration';
import type { Struct__Output } from './gen/google/protobuf/Struct';
import type { Timestamp__Output } from './gen/google/protobuf/Timestamp';
import type { Value, Value__Output } from './gen/google/protobuf/Value';

/** Any value JSON can hold: what handlers receive and return. */
export type Json = null | boolean | number | string | Json[] | { [key: string]: Json };

/** A JSON value as a google.protobuf.Value. Throws on what JSON cannot hold. */
export function toValue(v: unknown): Value {
  if (v === null || v === undefined) return { nullValue: 'NULL_VALUE' };
  switch (typeof v) {
    case 'boolean':
      return { boolValue: v };
    case 'number':
      // The server refuses NaN and infinities (ACK_STATUS_INVALID); fail here, in the
      // handler's own terms, instead of sending a result that cannot be applied.
      if (!Number.isFinite(v)) throw new TypeError(`output holds ${v}, which JSON cannot hold`);
      return { numberValue: v };
    case 'string':
      return { stringValue: v };
    case 'object':
      if (Array.isArray(v)) return { listValue: { values: v.map(toValue) } };
      if (typeof (v as { toJSON?: unknown }).toJSON === 'function') {
        return toValue((v as { toJSON: () => unknown }).toJSON());
      }
      return { structValue: toStruct(v as Record<string, unknown>) };
    default:
      throw new TypeError(`output holds a ${typeof v}, which JSON cannot hold`);
  }
}

function toStruct(obj: Record<string, unknown>): { fields: Record<string, Value> } {
  const fields: Record<string, Value> = {};
  for (const [k, v] of Object.entries(obj)) {
    if (v !== undefined) fields[k] = toValue(v);
  }
  return { fields };
}

/** A google.protobuf.Value as a JSON value; an unset Value is JSON null. */
export function fromValue(v: Value__Output | null | undefined): Json {
  if (!v) return null;
  switch (v.kind) {
    case 'boolValue':
      return Boolean(v.boolValue);
    case 'numberValue':
      return Number(v.numberValue);
    case 'stringValue':
      return v.stringValue ?? '';
    case 'listValue':
      return (v.listValue?.values ?? []).map(fromValue);
    case 'structValue':
      return fromStruct(v.structValue);
    default:
      return null;
  }
}

/** A google.protobuf.Struct as a JSON object; unset is {}. */
export function fromStruct(s: Struct__Output | null | undefined): { [key: string]: Json } {
  const out: { [key: string]: Json } = {};
  for (const [k, v] of Object.entries(s?.fields ?? {})) out[k] = fromValue(v);
  return out;
}

/** Milliseconds as a google.protobuf.Duration (never negative). */
export function toDuration(ms: number): Duration {
  const total = Math.max(0, Math.round(ms * 1e6)); // nanoseconds
  return { seconds: Math.floor(total / 1e9), nanos: total % 1e9 };
}

/** A Duration or Timestamp as milliseconds; unset is 0. */
export function toMillis(d: { seconds: string | number; nanos: number } | null | undefined): number {
  if (!d) return 0;
  return Number(d.seconds) * 1000 + Math.floor(d.nanos / 1e6);
}

/** A google.protobuf.Timestamp as a Date; unset is undefined. */
export function toDate(t: Timestamp__Output | null | undefined): Date | undefined {
  return t ? new Date(toMillis(t)) : undefined;
}
