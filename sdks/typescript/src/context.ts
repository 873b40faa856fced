// What a handler sees of its step: the lease's fields, its AbortSignal, its logger.

import type { Lease } from './gen/cyclone/v1/workers.js';
import { Stopped } from './errors.js';
import { type Logger, type StepFields, withFields } from './logging.js';
import { type TraceContext, parseTraceparent } from './tracing.js';

/**
 * Everything a handler gets: its lease (`runId`, `stepId`, `node`, `kind`, `attempt`,
 * `leaseGeneration`, `attemptDeadline`, ...), the run `input`, the `parents`' outputs by
 * node id, `signal` (aborted when the handler must stop), and `log`.
 *
 *   worker.handle('total', async (ctx) => {
 *     const items = ctx.parents.fetch.items as { price: number }[];
 *     return { run: ctx.runId, total: items.reduce((sum, i) => sum + i.price, 0) };
 *   });
 */
// eslint-disable-next-line @typescript-eslint/no-explicit-any
export class Context<I = any> {
  /** The step's run. */
  readonly runId: string;
  /** The step (opaque id). */
  readonly stepId: string;
  /** The node id within the run's workflow (for a standalone job: its kind). */
  readonly node: string;
  /** The handler name. */
  readonly kind: string;
  /** 1-based; only a failed execution that is retried increments it. */
  readonly attempt: number;
  /** The node's max_attempts. */
  readonly maxAttempts: number;
  /** How often this step's lease expired and was reclaimed (same attempt). */
  readonly reclaims: number;
  /** How often the step was snoozed before this lease. */
  readonly snoozes: number;
  /** Fences this execution's result. */
  readonly leaseGeneration: number;
  /** The run input (null when none was given). */
  readonly input: I;
  /** The outputs of the node's dependencies, by node id ({} for none). */
  // eslint-disable-next-line @typescript-eslint/no-explicit-any
  readonly parents: Record<string, any>;
  /** When this attempt times out (the server then stops it with reason "timeout"). */
  readonly attemptDeadline: Date | undefined;
  /** When the lease expires unless renewed (the worker's stream renews it). */
  readonly leaseExpiry: Date | undefined;
  /** The W3C trace context the step runs under ("" when none); see `trace`. */
  readonly traceparent: string;
  readonly tracestate: string;
  /** The trace context, parsed (undefined when none or malformed). */
  readonly trace: TraceContext | undefined;
  /** The worker running the step (its Hello.worker_id, the step's lease_owner). */
  readonly workerId: string;
  /**
   * Aborted when the handler must stop: its reason is a `Stopped` whose `reason` is
   * "cancelled", "timeout", "fenced", "lost" or "shutdown". Pass it to whatever takes an
   * AbortSignal (fetch, timers/promises, child_process, ...). A stopped handler's result
   * is dropped: the server would refuse it anyway.
   */
  readonly signal: AbortSignal;
  /** A logger whose records carry this step's run_id, step_id, node, kind and attempt. */
  readonly log: Logger;
  /** The step's ids as log fields. */
  readonly fields: StepFields;

  /** @internal */
  constructor(lease: Lease, workerId: string, signal: AbortSignal, logger: Logger) {
    this.runId = lease.runId;
    this.stepId = lease.stepId;
    this.node = lease.node;
    this.kind = lease.kind;
    this.attempt = lease.attempt;
    this.maxAttempts = lease.maxAttempts;
    this.reclaims = lease.reclaims;
    this.snoozes = lease.snoozes;
    this.leaseGeneration = lease.leaseGeneration;
    this.input = (lease.input === undefined ? null : lease.input) as I;
    this.parents = lease.parents ?? {};
    this.attemptDeadline = lease.attemptDeadline;
    this.leaseExpiry = lease.leaseExpiry;
    this.traceparent = lease.traceContext?.traceparent ?? '';
    this.tracestate = lease.traceContext?.tracestate ?? '';
    this.trace = parseTraceparent(this.traceparent, this.tracestate);
    this.workerId = workerId;
    this.signal = signal;
    this.fields = {
      run_id: this.runId, step_id: this.stepId, node: this.node, kind: this.kind, attempt: this.attempt,
      ...(this.trace ? { trace_id: this.trace.traceId } : {}),
    };
    this.log = withFields(logger, { ...this.fields });
  }

  /** True when a failure of this attempt discards the step (attempt == maxAttempts). */
  get lastAttempt(): boolean {
    return this.attempt >= this.maxAttempts;
  }

  /** True once the handler was told to stop. */
  isCancelled(): boolean {
    return this.signal.aborted;
  }

  /** Why the handler must stop ("" until it must). */
  get cancelReason(): string {
    if (!this.signal.aborted) return '';
    const reason: unknown = this.signal.reason;
    return reason instanceof Stopped ? reason.reason : String(reason);
  }
}
