// What a handler sees and returns: the lease, the outcomes it can throw, and how each
// outcome becomes a StepResult on the wire.

import type { StepResult } from './gen/cyclone/v1/StepResult';
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
