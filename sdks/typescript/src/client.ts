// The client: register workflows, start runs and jobs, read, wait for and steer them.

import * as grpc from '@grpc/grpc-js';

import { type ConnectionOptions, openChannel } from './channel.js';
import { RunCancelled, RunFailed, WaitTimeout, clientError } from './errors.js';
import { AdminClient, type GetStatsResponse, type ListWorkersResponse } from './gen/cyclone/v1/admin.js';
import {
  type EnqueueRequest, type ListRunsResponse, type RunActionResponse, RunsClient, type WaitRunResponse,
} from './gen/cyclone/v1/runs.js';
import { type Run as RunMsg, RunState, type Workflow as WorkflowMsg } from './gen/cyclone/v1/types.js';
import { type ListWorkflowsResponse, type RegisterWorkflowResponse, WorkflowsClient } from './gen/cyclone/v1/workflows.js';
import { toDuration, toJson } from './json.js';
import { type LimitInfo, type LimitSpec, type LimitUse, limitInfo, limitMessage, limitUses } from './limits.js';
import { type Limit as LimitMsg, LimitsClient, type ListLimitsResponse } from './gen/cyclone/v1/limits.js';
import {
  type KindStats, Run, type RunStateName, type WorkerInfo, type WorkflowInfo, kindStats, workerInfo, workflowInfo,
} from './models.js';
import { loadOtel, traceMetadata } from './tracing.js';
import { Workflow } from './workflow.js';

/** One WaitRun call waits at most this long; `wait` loops, so that a long wait survives proxies that cut idle calls. */
const WAIT_SLICE_MS = 30_000;

/** A deadline: a Date, or milliseconds from now. */
export type Deadline = Date | number;

export interface ClientOptions extends ConnectionOptions {
  /** Each call's deadline, in ms (WaitRun: its wait plus this). Default 30 000. */
  rpcTimeoutMs?: number;
  /**
   * Until the server has answered once, a call fails at once when nothing listens at the
   * address (UNAVAILABLE, "cannot reach HOST:PORT: connection refused"). Give this to wait
   * up to that many ms for a server that is still starting. Default 0.
   */
  waitForServerMs?: number;
}

/** Options of `Client.submit`. */
export interface SubmitOptions {
  /** The workflow version; 0 (default) runs the latest. */
  version?: number;
  /** Default claim priority of the run's steps; lower first. */
  priority?: number;
  /** The same request with the same key returns the same run. */
  idempotencyKey?: string;
  /** When the run fails if it has not ended: a Date, or ms from now. */
  deadline?: Deadline;
}

/** Options of a standalone job (`Client.enqueue`); durations in ms. */
export interface JobOptions {
  priority?: number;
  idempotencyKey?: string;
  /** A Date, or ms from now. */
  deadline?: Deadline;
  /** Not claimable before then: a Date, or ms from now. */
  scheduledAt?: Deadline;
  maxAttempts?: number;
  backoffInitialMs?: number;
  backoffMaxMs?: number;
  maxReclaims?: number;
  attemptTimeoutMs?: number;
  retentionMs?: number;
  /** Limits the job consumes, besides those that name its kind (docs/flow-control.md). */
  limits?: LimitUse[];
}

/** One job of `Client.enqueueMany`. */
export interface Job extends JobOptions {
  kind: string;
  input?: unknown;
}

/** Options of `Client.wait` and `Client.result`. */
export interface WaitOptions {
  /** Give up after this many ms (`wait` returns the run as it is; `result` throws WaitTimeout). Default: never. */
  timeoutMs?: number;
  /** Ends the wait when aborted, throwing its reason. */
  signal?: AbortSignal;
}

/** Filters of `Client.list`. */
export interface ListOptions {
  states?: RunStateName[];
  workflow?: string;
  createdAfter?: Date;
  createdBefore?: Date;
  /** At most this many runs (default 100), newest first. */
  limit?: number;
  includeSteps?: boolean;
  /** Only runs this schedule started. */
  schedule?: string;
}

// The calls that change nothing, or nothing more when made twice: made again when the
// connection they were sent on broke (see Client.call).
const REPEATABLE = new Set(['getRun', 'listRuns', 'waitRun', 'getWorkflow', 'listWorkflows', 'registerWorkflow',
  'getStats', 'listWorkers', 'getLimit', 'listLimits', 'setLimit']);
// Statuses a call can end with that the server did not send: it may not have been reached.
const NOT_AN_ANSWER = new Set([grpc.status.UNAVAILABLE, grpc.status.DEADLINE_EXCEEDED, grpc.status.CANCELLED,
  grpc.status.UNKNOWN]);

type Callback<Res> = (error: grpc.ServiceError | null, response: Res) => void;
type Invoke<Res> = (metadata: grpc.Metadata, options: Partial<grpc.CallOptions>, callback: Callback<Res>) => unknown;

/** gRPC's connect failure in a few words: "connection refused", "unknown host", or as it came. */
function unreachable(details: string): string {
  const lowered = details.toLowerCase();
  for (const [needle, words] of [['econnrefused', 'connection refused'], ['connection refused', 'connection refused'],
    ['enotfound', 'unknown host'], ['name resolution', 'unknown host'], ['eai_again', 'unknown host'],
    ['timed out', 'connection timed out'], ['etimedout', 'connection timed out'], ['ehostunreach', 'no route to host']]) {
    if (lowered.includes(needle)) return words;
  }
  return details;
}

function deadlineFields(deadline: Deadline | undefined, what = 'deadline') {
  if (deadline === undefined) return { deadline: undefined, deadlineIn: undefined };
  if (deadline instanceof Date) return { deadline, deadlineIn: undefined };
  return { deadline: undefined, deadlineIn: toDuration(deadline, what) };
}

function ms(value: number | undefined, what: string) {
  return value === undefined ? undefined : toDuration(value, what);
}

/** The EnqueueRequest of a job; a value that cannot be sent throws, naming the field after `where`. */
function jobRequest(job: Job, where = ''): EnqueueRequest {
  const at = (field: string) => (where ? `${where}.${field}` : field);
  if (typeof job.kind !== 'string') throw new TypeError(`${at('kind')}: ${JSON.stringify(job.kind)} is not a string`);
  let scheduledAt: Date | undefined;
  if (job.scheduledAt instanceof Date) scheduledAt = job.scheduledAt;
  else if (job.scheduledAt !== undefined) {
    toDuration(job.scheduledAt, at('scheduledAt')); // checks it
    scheduledAt = new Date(Date.now() + job.scheduledAt);
  }
  return {
    kind: job.kind, input: toJson(job.input, at('input')), priority: job.priority ?? 0,
    idempotencyKey: job.idempotencyKey ?? '', ...deadlineFields(job.deadline, at('deadline')),
    maxAttempts: job.maxAttempts, maxReclaims: job.maxReclaims,
    backoffInitial: ms(job.backoffInitialMs, at('backoffInitialMs')), backoffMax: ms(job.backoffMaxMs, at('backoffMaxMs')),
    attemptTimeout: ms(job.attemptTimeoutMs, at('attemptTimeoutMs')), retention: ms(job.retentionMs, at('retentionMs')),
    scheduledAt, limits: limitUses(job.limits, at('limits')),
  };
}

/**
 * A client of a Cyclone server.
 *
 * Every failed call throws a CycloneClientError (one subclass per status code:
 * NotFoundError, FailedPreconditionError, ...). Until the server has answered once, a call
 * fails at once when nothing listens at `address` (UnavailableError, "cannot reach
 * HOST:PORT: connection refused"); `waitForServerMs` waits that long instead. Once it has
 * answered, a call made while the server is unreachable waits for it, up to `rpcTimeoutMs`
 * (then DEADLINE_EXCEEDED), so that a server restart does not break a client. A call that
 * was on its way when the server went away is made again if that is harmless (reads,
 * registering a workflow, setting a limit whole); any other fails with UNAVAILABLE, since it may have been applied
 * (give `enqueue` and `submit` an idempotency key to make them safe to repeat).
 *
 *   const client = new Client('127.0.0.1:7233');
 *   await client.register(new Workflow('etl').task('extract').task('load', { deps: ['extract'] }));
 *   const runId = await client.submit('etl', { day: '2026-12-01' });
 *   console.log(await client.result(runId, { timeoutMs: 60_000 }));
 *   client.close();
 */
export class Client {
  readonly address: string;
  private readonly options: ClientOptions;
  private readonly rpcTimeoutMs: number;
  private reached = false; // has the server answered once? Then calls wait across restarts.
  private closed = false;
  private stubs: {
    channel: grpc.Channel; runs: RunsClient; workflows: WorkflowsClient; admin: AdminClient; limits: LimitsClient;
  } | null = null;

  constructor(address: string, options: ClientOptions = {}) {
    this.address = address;
    this.options = options;
    this.rpcTimeoutMs = options.rpcTimeoutMs ?? 30_000;
    const wait = options.waitForServerMs ?? 0;
    if (!(wait >= 0 && Number.isFinite(wait))) throw new RangeError(`waitForServerMs: ${wait} is not a number of ms >= 0`);
    openChannel(address, options).close(); // refuses a malformed address now, not at the first call
  }

  /** Closes the channel; calls in progress end with CANCELLED. A later call opens a new one. */
  close(): void {
    const stubs = this.stubs;
    this.stubs = null;
    if (stubs) {
      this.closed = true;
      stubs.runs.close();
      stubs.workflows.close();
      stubs.admin.close();
      stubs.channel.close();
    }
  }

  private open() {
    if (!this.stubs) {
      this.closed = false;
      const channel = openChannel(this.address, this.options);
      const creds = this.options.credentials ?? grpc.credentials.createInsecure();
      const opts = { channelOverride: channel };
      this.stubs = {
        channel,
        runs: new RunsClient(this.address, creds, opts),
        workflows: new WorkflowsClient(this.address, creds, opts),
        admin: new AdminClient(this.address, creds, opts),
        limits: new LimitsClient(this.address, creds, opts),
      };
    }
    return this.stubs;
  }

  private async call<Res>(method: string, invoke: Invoke<Res>, timeoutMs?: number, signal?: AbortSignal): Promise<Res> {
    signal?.throwIfAborted();
    await loadOtel();
    const trace = traceMetadata(); // the caller's trace context: a run it starts joins its trace
    const stubs = this.open();
    const waitForServer = this.options.waitForServerMs ?? 0;
    if (!this.reached && waitForServer > 0) {
      const ready = await new Promise<boolean>((resolve) => {
        stubs.runs.waitForReady(Date.now() + waitForServer, (err) => resolve(!err));
      });
      if (!ready) {
        throw clientError(grpc.status.UNAVAILABLE, `cannot reach ${this.address}: no server answered within ${waitForServer} ms`);
      }
    }
    const deadline = Date.now() + (timeoutMs ?? this.rpcTimeoutMs);
    for (;;) {
      // wait_for_ready once the server has answered: a call made while it restarts waits
      // for it (up to the deadline) instead of failing with UNAVAILABLE. Before that, a
      // wrong address fails at once.
      const metadata = new grpc.Metadata({ waitForReady: this.reached });
      if (this.options.token) metadata.set('authorization', `Bearer ${this.options.token}`);
      for (const [k, v] of trace) metadata.set(k, v);
      try {
        const response = await new Promise<Res>((resolve, reject) => {
          let onAbort: (() => void) | undefined;
          const call = invoke(metadata, { deadline }, (err, res) => {
            if (onAbort) signal?.removeEventListener('abort', onAbort);
            if (signal?.aborted) reject(signal.reason);
            else if (err) reject(err);
            else resolve(res);
          }) as grpc.ClientUnaryCall;
          if (signal) {
            onAbort = () => call.cancel();
            signal.addEventListener('abort', onAbort, { once: true });
          }
        });
        this.reached = true;
        return response;
      } catch (e) {
        if (signal?.aborted) throw e; // the caller's abort reason
        const err = e as grpc.ServiceError;
        if (this.closed || this.stubs !== stubs) throw clientError(grpc.status.CANCELLED, 'the Client was closed');
        if (typeof err.code !== 'number') throw err;
        if (!NOT_AN_ANSWER.has(err.code)) this.reached = true; // refused, but by the server: it is there
        if (!this.reached && err.code === grpc.status.UNAVAILABLE) {
          throw clientError(grpc.status.UNAVAILABLE, `cannot reach ${this.address}: ${unreachable(err.details ?? '')}`);
        }
        // A call sent on a connection that broke under it is made again when repeating it
        // is harmless, once the server is back; a write may have been applied, so its
        // caller decides.
        if (err.code === grpc.status.UNAVAILABLE && REPEATABLE.has(method) && Date.now() < deadline) {
          await new Promise((r) => setTimeout(r, 50));
          continue;
        }
        throw clientError(err.code, err.details ?? err.message);
      }
    }
  }

  private runs<Req, Res>(method: keyof RunsClient & string, request: Req, timeoutMs?: number,
    signal?: AbortSignal): Promise<Res> {
    return this.call<Res>(method, (md, opts, cb) => {
      const stub = this.open().runs as unknown as Record<string, (...args: unknown[]) => unknown>;
      return stub[method](request, md, opts, cb);
    }, timeoutMs, signal);
  }

  private workflows<Req, Res>(method: keyof WorkflowsClient & string, request: Req): Promise<Res> {
    return this.call<Res>(method, (md, opts, cb) => {
      const stub = this.open().workflows as unknown as Record<string, (...args: unknown[]) => unknown>;
      return stub[method](request, md, opts, cb);
    });
  }

  private admin<Req, Res>(method: keyof AdminClient & string, request: Req): Promise<Res> {
    return this.call<Res>(method, (md, opts, cb) => {
      const stub = this.open().admin as unknown as Record<string, (...args: unknown[]) => unknown>;
      return stub[method](request, md, opts, cb);
    });
  }

  private limitsCall<Req, Res>(method: keyof LimitsClient & string, request: Req): Promise<Res> {
    return this.call<Res>(method, (md, opts, cb) => {
      const stub = this.open().limits as unknown as Record<string, (...args: unknown[]) => unknown>;
      return stub[method](request, md, opts, cb);
    });
  }

  // -- workflows ------------------------------------------------------------------------

  /**
   * Stores a workflow definition; the same definition again is a no-op (`created` false).
   *
   *   const info = await client.register(new Workflow('etl').task('extract'));
   */
  async register(workflow: Workflow): Promise<WorkflowInfo> {
    const resp = await this.workflows<unknown, RegisterWorkflowResponse>(
      'registerWorkflow', workflow.toRequest());
    return workflowInfo(resp.workflow, resp.created);
  }

  /** One version of a workflow (the latest when `version` is 0). */
  async getWorkflow(name: string, version = 0): Promise<WorkflowInfo> {
    return workflowInfo(await this.workflows<unknown, WorkflowMsg>('getWorkflow', { name, version }));
  }

  /** Workflows by name then version (only the latest version of each unless `allVersions`). */
  async listWorkflows(namePrefix = '', { allVersions = false } = {}): Promise<WorkflowInfo[]> {
    const resp = await this.workflows<unknown, ListWorkflowsResponse>(
      'listWorkflows', { namePrefix, allVersions });
    return resp.workflows.map((w) => workflowInfo(w));
  }

  // -- starting runs --------------------------------------------------------------------

  /**
   * Starts a run of a registered workflow; returns its run id.
   *
   *   const runId = await client.submit('etl', { day: '2026-12-01' }, { idempotencyKey: 'etl-2026-12-01' });
   */
  async submit(workflow: string | Workflow, input: unknown = null, options: SubmitOptions = {}): Promise<string> {
    const request = {
      workflow: workflow instanceof Workflow ? workflow.name : workflow, version: options.version ?? 0,
      input: toJson(input, 'input'), priority: options.priority ?? 0, idempotencyKey: options.idempotencyKey ?? '',
      ...deadlineFields(options.deadline),
    };
    return (await this.runs<unknown, { runId: string }>('submitRun', request)).runId;
  }

  /**
   * Starts a standalone job (a one-node run of step kind `kind`); returns its run id.
   *
   *   const runId = await client.enqueue('send_email', { to: 'ada@example.com' }, { maxAttempts: 5 });
   */
  async enqueue(kind: string, input: unknown = null, options: JobOptions = {}): Promise<string> {
    return (await this.runs<EnqueueRequest, { runId: string }>('enqueue', jobRequest({ ...options, kind, input }))).runId;
  }

  /**
   * Starts up to 1000 standalone jobs in one call and one transaction (all or none);
   * returns their run ids in order. A bad job fails the call, named by its index (`jobs[3].kind: ...`).
   *
   *   const runIds = await client.enqueueMany(addresses.map((to) => ({ kind: 'send_email', input: { to } })));
   */
  async enqueueMany(jobs: Iterable<Job>): Promise<string[]> {
    const requests = [...jobs].map((job, i) => jobRequest(job, `jobs[${i}]`));
    const resp = await this.runs<unknown, { jobs: { runId: string }[] }>('enqueueMany', { jobs: requests });
    return resp.jobs.map((j) => j.runId);
  }

  // -- reading --------------------------------------------------------------------------

  /** A run with all its steps. */
  async get(runId: string): Promise<Run> {
    return Run.fromProto(await this.runs<unknown, RunMsg>('getRun', { runId }));
  }

  /**
   * Up to `limit` runs matching every filter, newest first.
   *
   *   const failed = await client.list({ states: ['failed'], workflow: 'etl', limit: 20 });
   */
  async list(options: ListOptions = {}): Promise<Run[]> {
    const limit = options.limit ?? 100;
    const states = (options.states ?? []).map((s) => {
      const value = (RunState as unknown as Record<string, number>)[`RUN_STATE_${String(s).toUpperCase()}`];
      if (value === undefined || value <= 0) {
        throw new TypeError(`states: ${JSON.stringify(s)} is not a run state (running, paused, completed, failed, cancelled)`);
      }
      return value;
    });
    const runs: Run[] = [];
    let pageToken = '';
    while (runs.length < limit) {
      const resp = await this.runs<unknown, ListRunsResponse>('listRuns', {
        states, workflow: options.workflow ?? '', createdAfter: options.createdAfter, createdBefore: options.createdBefore,
        limit: Math.min(limit - runs.length, 1000), pageToken, includeSteps: options.includeSteps ?? false,
        schedule: options.schedule ?? '', scheduleFireAt: undefined,
      });
      runs.push(...resp.runs.map((r) => Run.fromProto(r)));
      if (!resp.nextPageToken) break;
      pageToken = resp.nextPageToken;
    }
    return runs;
  }

  /**
   * Waits until the run is terminal (completed, failed, cancelled) or `timeoutMs` passes
   * (default: forever); returns the run either way (check `run.terminal`). An aborted
   * `signal` ends the wait, throwing its reason (pass a handler's `ctx.signal`).
   */
  async wait(runId: string, { timeoutMs, signal }: WaitOptions = {}): Promise<Run> {
    const end = timeoutMs === undefined ? undefined : Date.now() + timeoutMs;
    for (;;) {
      const left = end === undefined ? WAIT_SLICE_MS : Math.max(0, Math.min(WAIT_SLICE_MS, end - Date.now()));
      const resp = await this.runs<unknown, WaitRunResponse>('waitRun',
        { runId, timeout: toDuration(left) }, left + this.rpcTimeoutMs, signal);
      if (!resp.run) throw clientError(grpc.status.INTERNAL, 'WaitRun answered without a run');
      const run = Run.fromProto(resp.run);
      if (run.terminal || (end !== undefined && Date.now() >= end)) return run;
    }
  }

  /**
   * The result of a completed run: the outputs of its leaf nodes by node id. Throws
   * RunFailed, RunCancelled, or WaitTimeout when the run is still going after `timeoutMs`.
   */
  // eslint-disable-next-line @typescript-eslint/no-explicit-any
  async result(runId: string, options: WaitOptions = {}): Promise<Record<string, any>> {
    const run = await this.wait(runId, options);
    if (run.state === 'completed') return run.result && typeof run.result === 'object' ? run.result : {};
    if (run.state === 'failed') throw new RunFailed(run);
    if (run.state === 'cancelled') throw new RunCancelled(run);
    throw new WaitTimeout(run, options.timeoutMs ?? 0);
  }

  // -- actions --------------------------------------------------------------------------

  private async action(method: keyof RunsClient & string, request: unknown): Promise<Run> {
    const resp = await this.runs<unknown, RunActionResponse>(method, request);
    if (!resp.run) throw clientError(grpc.status.INTERNAL, `${method} answered without a run`);
    return Run.fromProto(resp.run);
  }

  /** Cancels a running or paused run (a no-op on a cancelled one); returns the run as the action left it. */
  cancel(runId: string): Promise<Run> {
    return this.action('cancelRun', { runId });
  }

  /** Pauses a running run: nothing new starts; running steps finish. */
  pause(runId: string): Promise<Run> {
    return this.action('pauseRun', { runId });
  }

  /** Resumes a paused run. */
  resume(runId: string): Promise<Run> {
    return this.action('resumeRun', { runId });
  }

  /** Reopens the discarded node `node` with a fresh attempt budget (a `deadline` replaces the run's). */
  retry(runId: string, node: string, { deadline }: { deadline?: Deadline } = {}): Promise<Run> {
    return this.action('retryStep', { runId, node, ...deadlineFields(deadline) });
  }

  /** Reopens every discarded node of the run. */
  retryAll(runId: string, { deadline }: { deadline?: Deadline } = {}): Promise<Run> {
    return this.action('retryAll', { runId, ...deadlineFields(deadline) });
  }

  /**
   * Sends signal `name` to a run's mailbox; returns the signal id.
   *
   *   await client.signal(runId, 'approval', { approvedBy: 'ada' });
   */
  async signal(runId: string, name: string, payload: unknown = null): Promise<string> {
    const request = { runId, name, payload: toJson(payload, 'payload') };
    return (await this.runs<unknown, { signalId: string }>('signal', request)).signalId;
  }

  /** Deletes up to `limit` terminal runs finished more than `olderThanMs` ago; returns how many. */
  async purge(olderThanMs: number, limit = 1000): Promise<number> {
    const request = { olderThan: toDuration(olderThanMs, 'olderThanMs'), limit, dryRun: false };
    return (await this.runs<unknown, { deleted: number }>('purgeTerminalRuns', request)).deleted;
  }

  /** The backlog per step kind: available, scheduled, running, the oldest available step's age, workers. */
  async stats(): Promise<KindStats[]> {
    const resp = await this.admin<unknown, GetStatsResponse>('getStats', {});
    return resp.kinds.map(kindStats);
  }

  // -- limits (docs/flow-control.md) ----------------------------------------------------------

  /**
   * Creates or replaces a limit, whole (admin role); it applies on every server within a second.
   *
   *   await client.setLimit({ name: 'per-tenant', maxRunning: 5, kinds: ['sync'], keyPath: 'input.tenant' });
   */
  async setLimit(limit: LimitSpec): Promise<LimitInfo> {
    return limitInfo(await this.limitsCall<unknown, LimitMsg>('setLimit', { limit: limitMessage(limit) }));
  }

  /** A limit with its busiest keys; NotFoundError when there is none of that name. */
  async getLimit(name: string): Promise<LimitInfo> {
    return limitInfo(await this.limitsCall<unknown, LimitMsg>('getLimit', { name }));
  }

  /** Every limit, by name, each with its busiest keys. */
  async listLimits(): Promise<LimitInfo[]> {
    return (await this.limitsCall<unknown, ListLimitsResponse>('listLimits', {})).limits.map(limitInfo);
  }

  /** Deletes a limit (admin role): its waiting steps are claimable at once. NotFoundError when there is none. */
  async deleteLimit(name: string): Promise<void> {
    await this.limitsCall<unknown, unknown>('deleteLimit', { name });
  }

  /** The workers connected to any server of the database; with `kind`, those that run it. */
  async workers(kind = ''): Promise<WorkerInfo[]> {
    const resp = await this.admin<unknown, ListWorkersResponse>('listWorkers', { kind });
    return resp.workers.map(workerInfo);
  }
}

