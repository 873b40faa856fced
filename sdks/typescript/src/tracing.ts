// OpenTelemetry, when the application has @opentelemetry/api (an optional peer dependency):
// every handler runs in a "handle {kind}" span, a child of the lease's W3C trace context,
// current while it runs; and the client sends the current span's context with every call,
// so that the runs it starts join the caller's trace. Without it, nothing here imports
// OpenTelemetry; the lease's trace context still reaches handlers (ctx.trace) and logs,
// and runs submitted from inside a handler still join its trace.
//
// The wire format is W3C Trace Context whatever propagator the application configured,
// since that is what the server stores: the SDK reads and writes traceparent itself.

import { AsyncLocalStorage } from 'node:async_hooks';

import { VERSION } from './version.js';

/** A lease's W3C trace context (https://www.w3.org/TR/trace-context/), parsed. */
export interface TraceContext {
  /** "00-<trace id>-<parent span id>-<flags>", as received. */
  traceparent: string;
  /** Vendor entries, passed on as received; may be empty. */
  tracestate: string;
  /** 32 lowercase hex digits. */
  traceId: string;
  /** 16 lowercase hex digits: the parent of the handler's span. */
  spanId: string;
  /** Flag 01: the trace is recorded upstream. */
  sampled: boolean;
}

const TRACEPARENT = /^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?$/;

/** A traceparent and tracestate, parsed; undefined when absent or malformed (treated as absent). */
export function parseTraceparent(traceparent: string | undefined, tracestate = ''): TraceContext | undefined {
  const m = traceparent ? TRACEPARENT.exec(traceparent) : null;
  if (!traceparent || !m) return undefined;
  const [, version, traceId, spanId, flags, rest] = m;
  if (version === 'ff' || (version === '00' && rest) || /^0+$/.test(traceId) || /^0+$/.test(spanId)) return undefined;
  return { traceparent, tracestate, traceId, spanId, sampled: (parseInt(flags, 16) & 1) === 1 };
}

// The few parts of @opentelemetry/api the SDK uses, typed here so that the SDK's
// declarations never name the optional package.
/* eslint-disable @typescript-eslint/no-explicit-any */
interface SpanContextLike {
  traceId: string;
  spanId: string;
  traceFlags: number;
  isRemote?: boolean;
  traceState?: { serialize(): string };
}
interface SpanLike {
  setAttribute(key: string, value: string | number | boolean): unknown;
  setStatus(status: { code: number; message?: string }): unknown;
  end(): void;
}
interface OtelApi {
  ROOT_CONTEXT: unknown;
  SpanKind: { CONSUMER: number };
  SpanStatusCode: { ERROR: number };
  createTraceState?: (raw?: string) => unknown;
  context: { active(): unknown; with<T>(ctx: unknown, fn: () => T): T };
  trace: {
    getTracer(name: string, version?: string): {
      startSpan(name: string, options: { kind: number; attributes: Record<string, string | number> }, ctx: unknown): SpanLike;
    };
    setSpanContext(ctx: unknown, sc: SpanContextLike): unknown;
    getSpanContext(ctx: unknown): SpanContextLike | undefined;
    setSpan(ctx: unknown, span: SpanLike): unknown;
  };
}

let loading: Promise<OtelApi | null> | undefined;
let loaded: OtelApi | null | undefined;
const PACKAGE = '@opentelemetry/api';

/** @opentelemetry/api, imported on first use; null when it is not installed. */
export function loadOtel(): Promise<OtelApi | null> {
  loading ??= import(PACKAGE).then(
    (m: any) => (loaded = (m.default?.trace ? m.default : m) as OtelApi),
    () => (loaded = null),
  );
  return loading;
}

/** The trace context of the handler running in this async context (the lease's), if any. */
const handlerTrace = new AsyncLocalStorage<TraceContext | undefined>();

/** What a handler's span records about its lease. */
export interface SpanLease {
  runId: string;
  stepId: string;
  node: string;
  kind: string;
  attempt: number;
  leaseGeneration: number;
  trace: TraceContext | undefined;
}

/**
 * Runs `execute` (a lease's handler) in a span "handle {kind}", a child of the lease's
 * trace context, current while it runs; then records `outcome()` on it (completed, failed,
 * discarded, snoozed, stopped) and, for a failure, its message as an error status.
 */
export async function traced(lease: SpanLease, execute: () => Promise<void>,
  outcome: () => { outcome: string; error: string }): Promise<void> {
  await loadOtel();
  const api = loaded;
  const inTrace = () => handlerTrace.run(lease.trace, execute);
  if (!api) {
    await inTrace();
    return;
  }
  let parent = api.ROOT_CONTEXT;
  if (lease.trace) {
    parent = api.trace.setSpanContext(api.ROOT_CONTEXT, {
      traceId: lease.trace.traceId,
      spanId: lease.trace.spanId,
      traceFlags: lease.trace.sampled ? 1 : 0,
      isRemote: true,
      ...(lease.trace.tracestate && api.createTraceState
        ? { traceState: api.createTraceState(lease.trace.tracestate) as SpanContextLike['traceState'] } : {}),
    });
  }
  const span = api.trace.getTracer('cyclone-workflows', VERSION).startSpan(`handle ${lease.kind}`, {
    kind: api.SpanKind.CONSUMER,
    attributes: {
      'cyclone.run_id': lease.runId, 'cyclone.step_id': lease.stepId, 'cyclone.node': lease.node,
      'cyclone.kind': lease.kind, 'cyclone.attempt': lease.attempt, 'cyclone.lease_generation': lease.leaseGeneration,
    },
  }, parent);
  try {
    await api.context.with(api.trace.setSpan(parent, span), inTrace);
  } finally {
    const { outcome: name, error } = outcome();
    span.setAttribute('cyclone.outcome', name);
    if (error) span.setStatus({ code: api.SpanStatusCode.ERROR, message: error });
    span.end();
  }
}

const VALID_TRACE_ID = /^(?!0{32})[0-9a-f]{32}$/;
const VALID_SPAN_ID = /^(?!0{16})[0-9a-f]{16}$/;

/**
 * gRPC metadata entries carrying the caller's trace context, so that a run it starts joins
 * its trace: the current OpenTelemetry span's when there is one, else (inside a handler)
 * the lease's. Empty outside any trace. Call after `loadOtel()` has settled.
 */
export function traceMetadata(): [string, string][] {
  const api = loaded;
  if (api) {
    const sc = api.trace.getSpanContext(api.context.active());
    if (sc && VALID_TRACE_ID.test(sc.traceId) && VALID_SPAN_ID.test(sc.spanId)) {
      const flags = (sc.traceFlags & 0xff).toString(16).padStart(2, '0');
      const out: [string, string][] = [['traceparent', `00-${sc.traceId}-${sc.spanId}-${flags}`]];
      const state = sc.traceState?.serialize();
      if (state) out.push(['tracestate', state]);
      return out;
    }
  }
  const lease = handlerTrace.getStore();
  if (!lease) return [];
  return lease.tracestate ? [['traceparent', lease.traceparent], ['tracestate', lease.tracestate]]
    : [['traceparent', lease.traceparent]];
}
