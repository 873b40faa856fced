// The worker: registers handlers by step kind, runs the leases the server pushes on its one
// stream, answers each with the handler's result, reconnects on its own, and stops
// gracefully.

import { randomUUID } from 'node:crypto';
import { EventEmitter } from 'node:events';
import * as os from 'node:os';

import * as grpc from '@grpc/grpc-js';

import { type ConnectionOptions, authMetadata, openChannel } from './channel.js';
import type { Context } from './context.js';
import type { CycloneClientError } from './errors.js';
import { type Hello, type StepResult, type Welcome, WorkersClient } from './gen/cyclone/v1/workers.js';
import { type Handler, LeaseTable } from './leases.js';
import { type Logger, jsonLogger } from './logging.js';
import { FATAL_CODES, Session } from './session.js';
import { loadOtel } from './tracing.js';
import { SDK_NAME } from './version.js';

/**
 * Backoff between reconnect attempts: exponential with jitter from `initialMs` to `maxMs`;
 * `attempts` consecutive failures end `run()` with the last error (undefined: never).
 */
export interface ReconnectPolicy {
  initialMs?: number;
  maxMs?: number;
  attempts?: number;
}

export interface WorkerOptions extends ConnectionOptions {
  /** Leases run at once (Hello.slots), 1 to 10000. Default 8. */
  slots?: number;
  /** Stable across reconnects, unique among workers. Default `host:pid:random`. */
  workerId?: string;
  /** Default `{ initialMs: 100, maxMs: 5000 }`, retrying forever; null: no reconnect (the first failure ends run()). */
  reconnect?: ReconnectPolicy | null;
  /** How long a graceful stop lets running handlers finish, in ms. Default 30 000. */
  graceMs?: number;
  /** How long to wait for the server's Welcome on each connection, in ms. Default 10 000. */
  connectTimeoutMs?: number;
  /** Where the worker and `ctx.log` log. Default: JSON lines on stderr (jsonLogger()). */
  logger?: Logger;
  /**
   * Signals that stop the worker gracefully while `run()` runs (a second one ends the
   * process at once). Default ["SIGTERM", "SIGINT"]; [] to handle signals yourself.
   */
  signals?: NodeJS.Signals[];
}

/** What a worker reports, for `worker.on(event, listener)`. */
export interface WorkerEvents {
  /** A stream is up: the server's id, and how many held leases it reported lost. */
  welcome: [info: { serverId: string; lost: number }];
  /** A welcomed stream ended; the worker reconnects. */
  disconnect: [error: CycloneClientError];
  /** A lease arrived (its handler starts unless the worker is stopping). */
  lease: [ctx: Context];
  /** The server acknowledged a result: "applied", "stale", "ended", "unknown" or "invalid". */
  ack: [ctx: Context, status: string, detail: string];
  /** The server took a lease back ("cancelled", "timeout", "fenced", "lost"). */
  stop: [ctx: Context, reason: string];
}

/**
 * Runs handlers for step kinds: connects to a Cyclone server, receives leases up to
 * `slots` at a time, answers each with its handler's result, and reconnects on its own.
 *
 *   const worker = new Worker('127.0.0.1:7233', { slots: 4 });
 *   worker.handle('resize', async (ctx) => ({ url: await thumbnail(ctx.input.url, ctx.signal) }));
 *   await worker.run(); // until SIGTERM or SIGINT, then a graceful stop
 */
export class Worker extends EventEmitter<WorkerEvents> {
  readonly address: string;
  readonly slots: number;
  readonly workerId: string;
  readonly graceMs: number;
  readonly connectTimeoutMs: number;
  readonly logger: Logger;
  /** What happened to this worker's leases, results and streams, by name (leases, applied, stale, welcomes, ...). */
  readonly counts: Record<string, number> = {};
  private readonly options: WorkerOptions;
  private readonly reconnect: Required<Pick<ReconnectPolicy, 'initialMs' | 'maxMs'>> & ReconnectPolicy | null;
  private readonly handlers = new Map<string, Handler>();
  private readonly table: LeaseTable;
  private session: Session | null = null;
  private isConnected = false;
  private connectedWaiters: (() => void)[] = [];
  private running: Promise<void> | null = null;
  private stopRequested = false;
  private requestStop: () => void = () => undefined;
  private closing = false;
  private connectionDone = false;
  private wake: (() => void) | null = null;

  constructor(address: string, options: WorkerOptions = {}) {
    super();
    const slots = options.slots ?? 8;
    if (!Number.isInteger(slots) || slots < 1 || slots > 10000) {
      throw new RangeError(`slots: ${slots} must be a whole number from 1 to 10000`);
    }
    this.address = address;
    this.slots = slots;
    this.workerId = options.workerId ?? `${os.hostname()}:${process.pid}:${randomUUID().slice(0, 8)}`;
    this.graceMs = options.graceMs ?? 30_000;
    this.connectTimeoutMs = options.connectTimeoutMs ?? 10_000;
    this.logger = options.logger ?? jsonLogger();
    this.reconnect = options.reconnect === null ? null
      : { initialMs: 100, maxMs: 5000, ...options.reconnect };
    this.options = options;
    this.table = new LeaseTable(this.handlers, this.workerId, this.counts, this.logger, {
      lease: (ctx) => this.emit('lease', ctx),
      ack: (ctx, status, detail) => this.emit('ack', ctx, status, detail),
      stop: (ctx, reason) => this.emit('stop', ctx, reason),
    });
  }

  // -- handlers -------------------------------------------------------------------------

  /**
   * Registers `fn` as the handler of step kind `kind` (1 to 200 characters of
   * [A-Za-z0-9_.:/-]); returns the worker, so that calls chain.
   *
   *   worker.handle('send_email', async (ctx) => { await smtp.send(ctx.input.to, ctx.input.body); });
   */
  // eslint-disable-next-line @typescript-eslint/no-explicit-any
  handle<I = any>(kind: string, fn: Handler<I>): this {
    if (typeof kind !== 'string' || !/^[A-Za-z0-9_.:/-]{1,200}$/.test(kind)) {
      throw new TypeError(`kind: ${JSON.stringify(kind)} is not 1 to 200 characters of [A-Za-z0-9_.:/-]`);
    }
    if (typeof fn !== 'function') throw new TypeError(`the handler of ${kind} is not a function`);
    if (this.handlers.has(kind)) throw new Error(`kind ${JSON.stringify(kind)} already has a handler`);
    this.handlers.set(kind, fn as Handler);
    return this;
  }

  /** The step kinds this worker handles. */
  get kinds(): string[] {
    return [...this.handlers.keys()];
  }

  /** True while the stream is up (after the server's Welcome). */
  get connected(): boolean {
    return this.isConnected;
  }

  /** Resolves once the stream is up; rejects after `timeoutMs`. */
  waitConnected(timeoutMs = 30_000): Promise<void> {
    if (this.isConnected) return Promise.resolve();
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => {
        this.connectedWaiters = this.connectedWaiters.filter((w) => w !== done);
        reject(new Error(`worker ${this.workerId} not connected to ${this.address} within ${timeoutMs} ms`));
      }, timeoutMs);
      const done = () => {
        clearTimeout(timer);
        resolve();
      };
      this.connectedWaiters.push(done);
    });
  }

  // -- running --------------------------------------------------------------------------

  /**
   * Connects and runs leases until `stop()` (or a signal of `options.signals`), then
   * drains gracefully. Rejects on a fatal stream error (INVALID_ARGUMENT, UNAUTHENTICATED,
   * PERMISSION_DENIED) or when reconnect attempts run out. A worker runs once.
   *
   * Handlers that ignore their signal may still run after it resolves: their results are
   * dropped, so exit the process (or let them end).
   */
  run(): Promise<void> {
    if (this.running) throw new Error('this worker already ran: make a new Worker');
    if (this.handlers.size === 0) {
      return Promise.reject(new Error('a worker needs at least one handler (worker.handle(kind, fn))'));
    }
    this.running = this.serve();
    return this.running;
  }

  /**
   * Stops gracefully: no new handler starts; running handlers get `graceMs` to finish and
   * have their results delivered; leases that never started are handed back (zero-delay
   * snoozes); then the stream closes. Resolves when `run()` has ended.
   */
  stop(): Promise<void> {
    this.stopRequested = true;
    this.requestStop();
    return (this.running ?? Promise.resolve()).catch(() => undefined);
  }

  private async serve(): Promise<void> {
    await loadOtel();
    const channel = openChannel(this.address, this.options);
    const client = new WorkersClient(this.address, this.options.credentials ?? grpc.credentials.createInsecure(),
      { channelOverride: channel });
    const stopping = new Promise<'stop'>((resolve) => {
      this.requestStop = () => resolve('stop');
      if (this.stopRequested) resolve('stop');
    });
    const removeSignals = this.installSignals();
    const connection = this.connectLoop(client).finally(() => {
      this.connectionDone = true; // ends a drain that waits: nothing more can be delivered
    });
    try {
      const first = await Promise.race([connection.then(() => 'connection' as const), stopping]);
      if (first === 'connection' && !this.stopRequested) return;
      await this.drain();
    } finally {
      this.closing = true;
      this.session?.cancel();
      this.wake?.();
      await connection.catch(() => undefined);
      this.table.abandon();
      client.close();
      channel.close();
      removeSignals();
      this.isConnected = false;
    }
  }

  private installSignals(): () => void {
    const signals = this.options.signals ?? ['SIGTERM', 'SIGINT'];
    const listeners = new Map<NodeJS.Signals, () => void>();
    for (const sig of signals) {
      const listener = () => {
        if (this.stopRequested) {
          // A second signal: the default action (ends the process).
          for (const [s, l] of listeners) process.removeListener(s, l);
          process.kill(process.pid, sig);
          return;
        }
        this.logger.info(`${sig}: stopping (up to ${this.graceMs / 1000} s for running handlers)`,
          { worker_id: this.workerId });
        void this.stop();
      };
      listeners.set(sig, listener);
      process.on(sig, listener);
    }
    return () => {
      for (const [s, l] of listeners) process.removeListener(s, l);
    };
  }

  private async connectLoop(client: WorkersClient): Promise<void> {
    const policy = this.reconnect;
    const metadata = authMetadata(this.options.token);
    let failures = 0;
    while (!this.closing) {
      const session = new Session(this, this.table, client.connect(metadata));
      this.session = session;
      try {
        await session.run();
        return; // closed: the worker is stopping
      } catch (err) {
        if (this.closing) return;
        const e = err as CycloneClientError;
        if (FATAL_CODES.has(e.code)) throw e;
        if (policy === null) throw e;
        let delay: number;
        if (session.welcomed) {
          // A welcomed stream died: reconnect at once with a fresh backoff budget, after a
          // short pause so that a server that drops every stream is not hammered.
          this.count('disconnects');
          this.logger.warn(`stream lost (${e.message}); reconnecting`, { worker_id: this.workerId });
          this.emit('disconnect', e);
          failures = 0;
          delay = policy.initialMs;
        } else {
          failures += 1;
          if (policy.attempts !== undefined && failures >= policy.attempts) throw e;
          delay = Math.min(policy.maxMs, policy.initialMs * 2 ** (failures - 1)) + Math.random() * policy.initialMs;
          this.logger.warn(`cannot connect to ${this.address} (${e.message}); retrying in ${Math.round(delay)} ms`,
            { worker_id: this.workerId });
        }
        await this.sleep(delay);
      } finally {
        if (this.session === session) {
          this.session = null;
          this.table.outlet = null;
        }
        this.isConnected = false;
      }
    }
  }

  private sleep(ms: number): Promise<void> {
    return new Promise<void>((resolve) => {
      const timer = setTimeout(done, ms);
      function done() {
        clearTimeout(timer);
        resolve();
      }
      this.wake = done;
    }).finally(() => {
      this.wake = null;
    });
  }

  // -- called by the session ------------------------------------------------------------

  /** @internal */
  hello(): Hello {
    return { workerId: this.workerId, kinds: this.kinds, slots: this.slots, held: this.table.refs(), sdk: SDK_NAME };
  }

  /** @internal */
  welcomed(session: Session, welcome: Welcome): StepResult[] {
    this.session = session;
    const results = this.table.welcomed((r) => session.sendResult(r), welcome.lost, welcome.maxPayloadBytes);
    this.isConnected = true;
    this.count('welcomes');
    for (const w of this.connectedWaiters.splice(0)) w();
    this.emit('welcome', { serverId: welcome.serverId, lost: welcome.lost.length });
    return results;
  }

  // -- stopping -------------------------------------------------------------------------

  private async drain(): Promise<void> {
    const table = this.table;
    table.draining = true;
    this.logger.info(`stopping; waiting for ${table.running()} running handlers`, { worker_id: this.workerId });
    const end = Date.now() + this.graceMs;
    while (table.running() > 0 && Date.now() < end && !this.connectionDone) {
      await table.changed(Math.min(500, end - Date.now()));
    }
    // Handlers still running after the grace are cut off without an answer: their leases
    // expire and are reclaimed, as after a crash, since their side effects may be partial.
    // The zero snoozes of unstarted leases go out just before the half-close, without
    // waiting for their acks: the server pushes nothing to a worker while one of its
    // snoozes waits for its ack, and reads the half-close before that ack.
    table.giveBackUnstarted();
    if (this.session) await this.session.close();
  }

  private count(name: string): void {
    this.counts[name] = (this.counts[name] ?? 0) + 1;
  }
}
