// The SDK's errors: what a handler throws to steer its step (HandlerError, Permanent,
// RetryAfter, Snooze), why a handler's signal aborts (Stopped), and what a failed client
// call throws (CycloneClientError and one subclass per gRPC status code).

import { status as grpcStatus } from '@grpc/grpc-js';

import type { Run } from './models.js';

/** Root of every error the SDK throws. */
export class CycloneError extends Error {
  constructor(message: string, options?: ErrorOptions) {
    super(message, options);
    this.name = new.target.name;
  }
}

/** Options of a HandlerError. */
export interface HandlerErrorOptions {
  /** True: do not retry; the step is discarded at once (error_kind "permanent"). */
  permanent?: boolean;
  /** Milliseconds before the next attempt, instead of the node's backoff (ignored when permanent). */
  retryDelayMs?: number;
  /** The error that caused this one: its stack goes to the server with this one's. */
  cause?: unknown;
}

/**
 * Thrown by a handler to fail its step, saying whether and when to retry.
 *
 *   throw new HandlerError('upstream said 503', { retryDelayMs: 2_000 });
 *   throw new HandlerError('bad input', { permanent: true });
 */
export class HandlerError extends CycloneError {
  readonly permanent: boolean;
  readonly retryDelayMs: number | undefined;

  constructor(message: string, options: HandlerErrorOptions = {}) {
    super(message, options.cause === undefined ? undefined : { cause: options.cause });
    this.permanent = options.permanent ?? false;
    this.retryDelayMs = options.retryDelayMs === undefined ? undefined : checkDelay(options.retryDelayMs, 'retryDelayMs');
  }
}

/**
 * A failure that retrying cannot fix: the step is discarded (error_kind "permanent").
 * Takes a message or the error that caused it.
 *
 *   if (!ctx.input.userId) throw new Permanent('no userId in the input');
 */
export class Permanent extends HandlerError {
  constructor(messageOrError: string | Error = '') {
    const isError = messageOrError instanceof Error;
    super(isError ? `${messageOrError.name}: ${messageOrError.message}` : messageOrError,
      { permanent: true, cause: isError ? messageOrError : undefined });
  }
}

/**
 * A retryable failure with its own delay before the next attempt (instead of the backoff).
 *
 *   if (res.status === 429) throw new RetryAfter(Number(res.headers.get('retry-after')) * 1000, 'rate limited');
 */
export class RetryAfter extends HandlerError {
  constructor(delayMs: number, message = '') {
    super(message || `retry after ${delayMs} ms`, { retryDelayMs: delayMs });
  }
}

/**
 * Thrown by a handler to run the step again after `delayMs`: not a failure (the attempt
 * stays the same; the step's snoozes count grows by one).
 *
 *   if (!(await reportReady(ctx.input.id))) throw new Snooze(30_000);
 */
export class Snooze extends CycloneError {
  readonly delayMs: number;

  constructor(delayMs: number) {
    super(`snooze ${delayMs} ms`);
    this.delayMs = checkDelay(delayMs, 'delayMs');
  }
}

/**
 * The reason a handler's `ctx.signal` aborts with: the server's Stop reason ("cancelled",
 * "timeout", "fenced"), "lost" (the lease was lost across a reconnect) or "shutdown" (the
 * worker stopped before the handler finished).
 */
export class Stopped extends CycloneError {
  constructor(readonly reason: string) {
    super(`the step's handler must stop: ${reason}`);
  }
}

/** 100 years: the longest delay the server accepts. */
export const MAX_DELAY_MS = 100 * 365.25 * 24 * 3600 * 1000;

function checkDelay(ms: number, what: string): number {
  if (typeof ms !== 'number' || !Number.isFinite(ms) || ms < 0 || ms > MAX_DELAY_MS) {
    throw new RangeError(`${what}: ${String(ms)} is not a delay from 0 to 100 years in milliseconds`);
  }
  return ms;
}

// -- client errors ---------------------------------------------------------------------

/** The name of a gRPC status code: 5 -> "NOT_FOUND". */
export function statusName(code: number): string {
  return (grpcStatus as unknown as Record<number, string>)[code] ?? `CODE_${code}`;
}

/**
 * A failed call to the Cyclone server: `code` is the gRPC status code (`status.NOT_FOUND`
 * of @grpc/grpc-js), `codeName` its name, `details` the server's message. Each code the
 * server sends has its own subclass (NotFoundError, FailedPreconditionError, ...).
 *
 *   try { await client.resume(runId); }
 *   catch (e) { if (e instanceof FailedPreconditionError) console.log('not paused:', e.details); else throw e; }
 */
export class CycloneClientError extends CycloneError {
  readonly code: number;
  readonly codeName: string;
  readonly details: string;

  constructor(code: number, details: string) {
    super(`${statusName(code)}: ${details}`);
    this.code = code;
    this.codeName = statusName(code);
    this.details = details;
  }
}

/** Bad input: the message names the field and the reason. */
export class InvalidArgumentError extends CycloneClientError {}
/** No such run, workflow, version or schedule. */
export class NotFoundError extends CycloneClientError {}
/** The idempotency key belongs to a different request. */
export class AlreadyExistsError extends CycloneClientError {}
/** The current state forbids the action (resuming a running run, retrying a completed one, ...). */
export class FailedPreconditionError extends CycloneClientError {}
/** The server cannot be reached, or went away during the call. */
export class UnavailableError extends CycloneClientError {}
/** The call's deadline passed. */
export class DeadlineExceededError extends CycloneClientError {}
/** No valid bearer token (servers with auth). */
export class UnauthenticatedError extends CycloneClientError {}
/** The token's role may not make this call (servers with auth). */
export class PermissionDeniedError extends CycloneClientError {}
/** The request is over the server's message limit. */
export class ResourceExhaustedError extends CycloneClientError {}
/** The call was cancelled (for instance by `Client.close()`). */
export class CancelledError extends CycloneClientError {}
/** The server has no such call (an older server). */
export class UnimplementedError extends CycloneClientError {}
/** The server failed in a way it did not foresee. */
export class InternalError extends CycloneClientError {}

const BY_CODE: Record<number, new (code: number, details: string) => CycloneClientError> = {
  [grpcStatus.INVALID_ARGUMENT]: InvalidArgumentError,
  [grpcStatus.NOT_FOUND]: NotFoundError,
  [grpcStatus.ALREADY_EXISTS]: AlreadyExistsError,
  [grpcStatus.FAILED_PRECONDITION]: FailedPreconditionError,
  [grpcStatus.UNAVAILABLE]: UnavailableError,
  [grpcStatus.DEADLINE_EXCEEDED]: DeadlineExceededError,
  [grpcStatus.UNAUTHENTICATED]: UnauthenticatedError,
  [grpcStatus.PERMISSION_DENIED]: PermissionDeniedError,
  [grpcStatus.RESOURCE_EXHAUSTED]: ResourceExhaustedError,
  [grpcStatus.CANCELLED]: CancelledError,
  [grpcStatus.UNIMPLEMENTED]: UnimplementedError,
  [grpcStatus.INTERNAL]: InternalError,
};

/** The typed error for a status code and message. */
export function clientError(code: number, details: string): CycloneClientError {
  const Cls = BY_CODE[code] ?? CycloneClientError;
  return new Cls(code, details);
}

// -- run outcomes ----------------------------------------------------------------------

/**
 * `Client.result` of a run that failed; `run` holds its steps (see the discarded ones).
 *
 *   try { await client.result(runId); }
 *   catch (e) { if (e instanceof RunFailed) console.log(e.run.steps.filter((s) => s.state === 'discarded')); }
 */
export class RunFailed extends CycloneError {
  constructor(readonly run: Run) {
    const detail = run.steps
      .filter((s) => s.state === 'discarded')
      .map((s) => `${s.node}: ${s.errorKind} ${s.errors.at(-1)?.message ?? ''}`.trim())
      .join('; ');
    super(`run ${run.id} failed${detail ? ` (${detail})` : ''}`);
  }
}

/** `Client.result` of a run that was cancelled. */
export class RunCancelled extends CycloneError {
  constructor(readonly run: Run) {
    super(`run ${run.id} was cancelled`);
  }
}

/** `Client.result` of a run still going when its timeout passed; `run` is as it was then. */
export class WaitTimeout extends CycloneError {
  constructor(readonly run: Run, timeoutMs: number) {
    super(`run ${run.id} is still ${run.state} after ${timeoutMs} ms`);
  }
}
