// The leases a worker holds: runs their handlers, keeps each result until the server acks it.
// The table outlives the streams: after a reconnect its leases go out again in Hello.held,
// and its unacked results are sent again on the new stream.

import { Context } from './context.js';
import { HandlerError, Permanent, Snooze, Stopped } from './errors.js';
import { AckStatus, type Lease, type LeaseRef, type ResultAck, type StepResult } from './gen/cyclone/v1/workers.js';
import { type Json, cutUtf8, jsonSize, toDuration, toJson } from './json.js';
import { type Logger, runInStep } from './logging.js';
import { traced } from './tracing.js';

/** What a server that does not say (Welcome.max_payload_bytes = 0) stores at most. */
export const DEFAULT_MAX_PAYLOAD_BYTES = 1 << 20;
/** The server keeps a failure message up to this many bytes of UTF-8 and cuts the rest: so is it sent. */
export const MAX_ERROR_MESSAGE_BYTES = 64 * 1024;
/** The same for a failure's details (the stack). */
export const MAX_ERROR_DETAILS_BYTES = 16 * 1024;

/**
 * A step handler: takes the step's Context, returns its output (any JSON value, or a
 * promise of one), or throws: `Permanent`, `RetryAfter`, `HandlerError`, `Snooze`, or any
 * error (a retryable failure).
 */
// eslint-disable-next-line @typescript-eslint/no-explicit-any
export type Handler<I = any> = (ctx: Context<I>) => unknown;

/** One of a StepResult's outcomes. */
export type Outcome = Pick<StepResult, 'completed' | 'failed' | 'snoozed'>;

/**
 * The Completed answer for a handler's return value: the output, or only its size when it
 * is over the server's limit (the step is then discarded as output_too_large, and the
 * output never crosses the wire). A value JSON cannot hold fails the step permanently.
 */
export function completedOutcome(out: unknown, maxPayloadBytes: number): Outcome {
  let json: Json;
  try {
    json = toJson(out, 'output');
  } catch (err) {
    return outcomeOf(new Permanent(`output is not JSON: ${(err as Error).message}`));
  }
  const size = jsonSize(json);
  if (size > maxPayloadBytes) return { completed: { output: undefined, oversizedOutputBytes: size } };
  return { completed: { output: json, oversizedOutputBytes: 0 } };
}

/** The stack of `err` and of its causes, for Failed.details ("" for a thrown non-Error). */
export function stackOf(err: unknown): string {
  const parts: string[] = [];
  const seen = new Set<unknown>();
  let e: unknown = err;
  while (e instanceof Error && !seen.has(e) && parts.length < 10) {
    seen.add(e);
    parts.push(e.stack ?? `${e.name}: ${e.message}`);
    e = e.cause;
  }
  return parts.join('\nCaused by: ');
}

/**
 * The outcome for what a handler threw: Snooze -> snoozed; HandlerError -> failed with its
 * permanence and retry delay; anything else -> a retryable failure "{name}: {message}".
 * A failure carries the error's stack (with its causes) as details, both cut as the server
 * would store them.
 */
export function outcomeOf(err: unknown): Outcome {
  if (err instanceof Snooze) return { snoozed: { delay: toDuration(err.delayMs) } };
  let message: string;
  let permanent = false;
  let retryDelay;
  if (err instanceof HandlerError) {
    message = err.message;
    permanent = err.permanent;
    if (err.retryDelayMs !== undefined && !permanent) retryDelay = toDuration(err.retryDelayMs);
  } else if (err instanceof Error) {
    message = `${err.name}: ${err.message}`;
  } else {
    message = String(err);
  }
  return {
    failed: {
      message: cutUtf8(message, MAX_ERROR_MESSAGE_BYTES),
      permanent,
      retryDelay,
      details: cutUtf8(stackOf(err), MAX_ERROR_DETAILS_BYTES),
    },
  };
}

/** (step_id, lease_generation) as one key. */
export const keyOf = (stepId: string, generation: number): string => `${stepId}/${generation}`;

/** One lease: its handler runs, or its result waits for an ack. */
interface Held {
  lease: Lease;
  ctx: Context;
  key: string;
  abort: AbortController;
  started: boolean; // false: arrived while draining, to be handed back unrun
  result: StepResult | undefined; // set once answered; kept until acked
  stopped: boolean; // the server took the lease back (Stop, Welcome.lost) or the worker quit
}

/** What the table reports to its worker. */
export interface LeaseEvents {
  lease(ctx: Context): void;
  ack(ctx: Context, status: string, detail: string): void;
  stop(ctx: Context, reason: string): void;
}

/** The name of an AckStatus: ACK_STATUS_STALE -> "stale" (a newer server's status too). */
export function ackName(status: number): string {
  const name = (AckStatus as unknown as Record<number, string>)[status];
  return name && status >= 0 ? name.replace(/^ACK_STATUS_/, '').toLowerCase() : `unknown_${status}`;
}

/** Held leases by (step_id, generation), and the handlers that run them. */
export class LeaseTable {
  readonly held = new Map<string, Held>();
  /** Sends a result on the stream that is up; null between streams. */
  outlet: ((result: StepResult) => void) | null = null;
  /** New leases are kept unstarted, to be handed back at the end. */
  draining = false;
  /** The server's limit, from its Welcome. */
  maxPayloadBytes = DEFAULT_MAX_PAYLOAD_BYTES;
  private waiters = new Set<() => void>();

  constructor(
    private readonly handlers: ReadonlyMap<string, Handler>,
    private readonly workerId: string,
    private readonly counts: Record<string, number>,
    private readonly logger: Logger,
    private readonly events: LeaseEvents,
  ) {}

  /** What Hello.held lists: every lease the server has not taken back. */
  refs(): LeaseRef[] {
    return [...this.held.values()].filter((h) => !h.stopped)
      .map((h) => ({ stepId: h.lease.stepId, leaseGeneration: h.lease.leaseGeneration }));
  }

  /** A new stream is up: stop the lost leases; returns the results to send on it. */
  welcomed(outlet: (result: StepResult) => void, lost: LeaseRef[], maxPayloadBytes: number): StepResult[] {
    this.maxPayloadBytes = maxPayloadBytes || DEFAULT_MAX_PAYLOAD_BYTES;
    for (const ref of lost) this.stop(ref, 'lost');
    this.outlet = outlet;
    return [...this.held.values()].filter((h) => h.result && !h.stopped).map((h) => h.result as StepResult);
  }

  start(lease: Lease): void {
    const key = keyOf(lease.stepId, lease.leaseGeneration);
    if (this.held.has(key)) return;
    const abort = new AbortController();
    const ctx = new Context(lease, this.workerId, abort.signal, this.logger);
    const h: Held = { lease, ctx, key, abort, started: false, result: undefined, stopped: false };
    this.held.set(key, h);
    this.count('leases');
    this.events.lease(ctx);
    // While draining, the lease waits unanswered: it fills a slot, so nothing more is
    // pushed, whereas handing it back now would bring it straight back.
    if (!this.draining) {
      h.started = true;
      void this.execute(h);
    }
  }

  stop(ref: LeaseRef, reason: string): void {
    const h = this.held.get(keyOf(ref.stepId, ref.leaseGeneration));
    if (!h) return;
    h.stopped = true;
    this.count(`stopped_${reason}`);
    this.drop(h);
    h.abort.abort(new Stopped(reason));
    this.events.stop(h.ctx, reason);
  }

  acked(ack: ResultAck): void {
    const h = this.held.get(keyOf(ack.stepId, ack.leaseGeneration));
    if (!h) return;
    const status = ackName(ack.status);
    this.count(status);
    if (ack.status === AckStatus.ACK_STATUS_INVALID) {
      // The server could not use our answer and failed the attempt in its place: the lease
      // is over (a bug to report, not something to answer again).
      h.ctx.log.error(`result for step ${ack.stepId} refused as invalid: ${ack.detail}`, { ack: status });
    } else if (ack.status !== AckStatus.ACK_STATUS_APPLIED) {
      h.ctx.log.warn(`result for step ${ack.stepId} (generation ${ack.leaseGeneration}) refused: ${status} ${ack.detail}`,
        { ack: status });
    }
    this.drop(h);
    this.events.ack(h.ctx, status, ack.detail);
  }

  /** Started leases not yet answered and acked. */
  running(): number {
    let n = 0;
    for (const h of this.held.values()) if (h.started) n += 1;
    return n;
  }

  /** Answers every lease that never ran with a zero snooze: attempt and reclaims unchanged. */
  giveBackUnstarted(): void {
    for (const h of [...this.held.values()]) {
      if (!h.started && !h.result) this.finish(h, { snoozed: { delay: toDuration(0) } });
    }
  }

  /** Aborts every handler still running and forgets every lease (the worker is gone). */
  abandon(): void {
    for (const h of this.held.values()) {
      h.stopped = true;
      h.abort.abort(new Stopped('shutdown'));
    }
    this.held.clear();
    this.notify();
  }

  /** Resolves at the next change of a lease (one ends, or gets its result), or after `timeoutMs`. */
  changed(timeoutMs: number): Promise<void> {
    return new Promise((resolve) => {
      const done = () => {
        clearTimeout(timer);
        this.waiters.delete(done);
        resolve();
      };
      const timer = setTimeout(done, timeoutMs);
      this.waiters.add(done);
    });
  }

  private async execute(h: Held): Promise<void> {
    let result: Outcome | null = null;
    const run = async (): Promise<void> => {
      try {
        const fn = this.handlers.get(h.lease.kind);
        if (!fn) throw new Error(`worker ${this.workerId} has no handler for kind "${h.lease.kind}"`);
        const out = await fn(h.ctx);
        result = completedOutcome(out, this.maxPayloadBytes);
      } catch (err) {
        if (h.stopped) return;
        result = outcomeOf(err);
      }
      if (result.failed && !h.stopped) {
        // The worker's log keeps the stack too.
        h.ctx.log.warn(`handler ${h.lease.kind} failed: ${result.failed.message}`, {
          permanent: result.failed.permanent, stack: result.failed.details,
        });
      }
    };
    const outcome = () => outcomeName(result, h.stopped);
    try {
      await runInStep(h.ctx.fields, () => traced({ ...h.lease, trace: h.ctx.trace }, run, outcome));
    } catch (err) {
      this.logger.error('cyclone: tracing the handler failed', { error: err });
      if (result === null && !h.stopped) await run();
    }
    if (result === null || h.stopped) {
      this.drop(h);
      return;
    }
    this.finish(h, result);
  }

  private finish(h: Held, outcome: Outcome): void {
    if (this.held.get(h.key) !== h || h.stopped) return;
    const result: StepResult = { stepId: h.lease.stepId, leaseGeneration: h.lease.leaseGeneration, ...outcome };
    h.result = result;
    this.notify();
    this.outlet?.(result);
  }

  private drop(h: Held): void {
    if (this.held.get(h.key) === h) this.held.delete(h.key);
    this.notify();
  }

  private notify(): void {
    for (const w of [...this.waiters]) w();
  }

  private count(name: string): void {
    this.counts[name] = (this.counts[name] ?? 0) + 1;
  }
}

function outcomeName(result: Outcome | null, stopped: boolean): { outcome: string; error: string } {
  if (result === null || stopped) return { outcome: stopped ? 'stopped' : 'abandoned', error: '' };
  if (result.failed) return { outcome: result.failed.permanent ? 'discarded' : 'failed', error: result.failed.message };
  return { outcome: result.snoozed ? 'snoozed' : 'completed', error: '' };
}
