// What a handler sees and returns: the lease, the outcomes it can throw, and how each
// outcome becomes a StepResult on the wire.

import type { StepResult } from './gen/cyclone/v1/StepResult';
import type { TraceContext__Output } from './gen/cyclone/v1/TraceContext';
import { type Json, toDuration } from './wire';

/** Everything a handler learns about the step it runs (Lease in workers.proto). */
export interface Lease {
  runId: string;
  stepId: string;
  node: string;
  kind: string;
  attempt: number;
  maxAttempts: number;
  reclaims: number;
  leaseGeneration: string; // an int64, kept as the decimal string the wire gives
  input: Json;
  parents: { [node: string]: Json };
  attemptDeadline?: Date;
  /** The W3C trace context to run the handler under (Lease.trace_context); absent when the run has none. */
  trace?: TraceContext;
}

/**
 * A lease's W3C trace context (https://www.w3.org/TR/trace-context/). Start the handler's
 * span as a child of `spanId`; with @opentelemetry/api,
 * `propagation.extract(ROOT_CONTEXT, { traceparent, tracestate })` gives the parent context.
 * Send `traceparent` / `tracestate` as call metadata when the handler submits runs, so they
 * join the same trace.
 */
export interface TraceContext {
  traceparent: string; // "00-<trace id>-<parent span id>-<flags>"
  tracestate: string; // vendor entries, passed on as is; may be empty
  traceId: string; // 32 hex digits
  spanId: string; // 16 hex digits: the parent of the handler's span
  sampled: boolean; // flag 01: the trace is recorded upstream
}

const TRACEPARENT = /^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?$/;

/** Lease.trace_context, parsed; undefined when absent or malformed. */
export function parseTraceContext(tc: TraceContext__Output | null | undefined): TraceContext | undefined {
  const m = tc?.traceparent ? TRACEPARENT.exec(tc.traceparent) : null;
  if (!tc || !m || m[1] === 'ff' || (m[1] === '00' && m[5]) || /^0+$/.test(m[2]) || /^0+$/.test(m[3])) return undefined;
  return { traceparent: tc.traceparent, tracestate: tc.tracestate, traceId: m[2], spanId: m[3], sampled: (parseInt(m[4], 16) & 1) === 1 };
}

/**
 * A step handler. `signal` aborts when the server says Stop (its reason is a `Stopped`),
 * when the lease is lost on reconnect, or when the worker shuts down.
 * Return the output (any JSON value); throw `Permanent`, `Retry`, `Snooze` or any error.
 *
 *   const handlers = { resize: async (lease, signal) => ({ width: lease.input.width }) };
 */
export type Handler = (lease: Lease, signal: AbortSignal) => unknown | Promise<unknown>;

/** Fail the step for good: no retry (Failed.permanent). */
export class Permanent extends Error {}

/** Fail this attempt and retry after `delayMs` instead of the node's backoff. */
export class Retry extends Error {
  constructor(message: string, readonly delayMs: number) {
    super(message);
  }
}

/** Run the step again after `delayMs`; not a failure (Snoozed). */
export class Snooze extends Error {
  constructor(readonly delayMs: number) {
    super(`snooze ${delayMs} ms`);
  }
}

/** The abort reason a handler's signal carries: Stop.reason, "lost" or "shutdown". */
export class Stopped extends Error {
  constructor(readonly reason: string) {
    super(`stopped: ${reason}`);
  }
}

/** The StepResult outcome for what a handler threw. A failure carries the error's stack in
 * Failed.details (the server keeps it in the step's error history, cut at 16 KiB). */
export function outcomeOf(err: unknown): Pick<StepResult, 'failed' | 'snoozed'> {
  if (err instanceof Snooze) return { snoozed: { delay: toDuration(err.delayMs) } };
  const details = err instanceof Error ? err.stack ?? '' : '';
  if (err instanceof Permanent) return { failed: { message: err.message, permanent: true, details } };
  if (err instanceof Retry) {
    return { failed: { message: err.message, retry_delay: toDuration(err.delayMs), details } };
  }
  return { failed: { message: err instanceof Error ? err.message : String(err), details } };
}
