// Test helpers: an in-process gRPC server speaking Cyclone's services, scripted by the test.
// The worker side of Workers.Connect is driven message by message (FakeStream); Runs,
// Workflows and Admin answer from per-method functions.

import * as grpc from '@grpc/grpc-js';

import { AdminService } from '../src/gen/cyclone/v1/admin.js';
import { LimitsService } from '../src/gen/cyclone/v1/limits.js';
import { RunsService } from '../src/gen/cyclone/v1/runs.js';
import {
  type Hello, type Lease, type ServerMessage, type StepResult, type WorkerMessage, WorkersService,
} from '../src/gen/cyclone/v1/workers.js';
import { WorkflowsService } from '../src/gen/cyclone/v1/workflows.js';
import { type LogFields, type Logger } from '../src/logging.js';

/** A FIFO whose `next()` waits, failing the test after a timeout. */
export class Queue<T> {
  private items: T[] = [];
  private waiters: ((item: T) => void)[] = [];

  push(item: T): void {
    const waiter = this.waiters.shift();
    if (waiter) waiter(item);
    else this.items.push(item);
  }

  get size(): number {
    return this.items.length;
  }

  next(timeoutMs = 10_000, what = 'an item'): Promise<T> {
    const item = this.items.shift();
    if (item !== undefined) return Promise.resolve(item);
    return new Promise((resolve, reject) => {
      const waiter = (x: T) => {
        clearTimeout(timer);
        resolve(x);
      };
      const timer = setTimeout(() => {
        this.waiters = this.waiters.filter((w) => w !== waiter);
        reject(new Error(`no ${what} within ${timeoutMs} ms`));
      }, timeoutMs);
      this.waiters.push(waiter);
    });
  }
}

let leases = 0;

/** A Lease with defaults for every field. */
export function makeLease(fields: Partial<Lease> = {}): Lease {
  leases += 1;
  return {
    runId: 'run-1', stepId: `step-${leases}`, node: 'a', kind: 'a', attempt: 1, maxAttempts: 25, reclaims: 0,
    leaseGeneration: 1, input: null, parents: {}, attemptDeadline: undefined, leaseExpiry: undefined, snoozes: 0,
    traceContext: undefined, ...fields,
  };
}

/** The server's side of one Workers.Connect stream. */
export class FakeStream {
  readonly messages = new Queue<WorkerMessage>();
  /** Resolves when the worker half-closes its side. */
  readonly halfClosed: Promise<void>;
  /** Resolves when the call is over (ended by either side, or cancelled). */
  readonly done: Promise<void>;
  metadata: grpc.Metadata;
  /** Ack every result APPLIED as it arrives, as the server does (false: the test acks). */
  autoAck = true;
  /** End the stream OK when the worker half-closes, as the server does. */
  autoEnd = true;
  /** The messages `results()` passed over (pongs), in order. */
  readonly skipped: WorkerMessage[] = [];
  private ended = false;

  constructor(readonly call: grpc.ServerDuplexStream<WorkerMessage, ServerMessage>, readonly hello: Hello) {
    this.metadata = call.metadata;
    this.halfClosed = new Promise((resolve) => call.on('end', () => {
      resolve();
      if (this.autoEnd) setTimeout(() => this.end(), 10);
    }));
    this.done = new Promise((resolve) => {
      call.on('cancelled', () => resolve());
      call.on('finish', () => resolve());
      call.on('close', () => resolve());
    });
  }

  send(msg: Partial<ServerMessage>): void {
    if (!this.ended) this.call.write(msg as ServerMessage);
  }

  welcome(fields: { heartbeatMs?: number; lost?: { stepId: string; leaseGeneration: number }[]; maxPayloadBytes?: number } = {}): void {
    const hb = fields.heartbeatMs ?? 10_000;
    this.send({
      welcome: {
        serverId: 'fake-server', leaseTtl: { seconds: Math.floor((3 * hb) / 1000), nanos: ((3 * hb) % 1000) * 1e6 },
        heartbeatInterval: { seconds: Math.floor(hb / 1000), nanos: (hb % 1000) * 1e6 },
        lost: fields.lost ?? [], maxPayloadBytes: fields.maxPayloadBytes ?? 0,
      },
    });
  }

  /** Pushes leases (defaults filled in); returns them. */
  lease(...fields: Partial<Lease>[]): Lease[] {
    const out = (fields.length ? fields : [{}]).map(makeLease);
    this.send({ leases: { leases: out } });
    return out;
  }

  ack(result: StepResult, status = 1, detail = ''): void {
    this.send({ acks: { acks: [{ stepId: result.stepId, leaseGeneration: result.leaseGeneration, status, detail }] } });
  }

  /** The next Results message's results (other messages in between are returned in `skipped`). */
  async results(timeoutMs = 10_000): Promise<StepResult[]> {
    for (;;) {
      const msg = await this.messages.next(timeoutMs, 'Results message');
      if (msg.results) return msg.results.results;
      this.skipped.push(msg);
    }
  }

  /** Ends the stream: OK, or with a status code. */
  end(code: grpc.status = grpc.status.OK, details = ''): void {
    if (this.ended) return;
    this.ended = true;
    if (code === grpc.status.OK) this.call.end();
    else this.call.emit('error', { code, details });
  }
}

type UnaryFn = (request: any, metadata: grpc.Metadata) => unknown; // eslint-disable-line @typescript-eslint/no-explicit-any

/** An error a fake unary method throws to answer with that status. */
export function status(code: grpc.status, details: string): Error & { code: number; details: string } {
  return Object.assign(new Error(details), { code, details });
}

/** An in-process server on a free loopback port. */
export class FakeServer {
  readonly streams = new Queue<FakeStream>();
  /** Every unary call: [method, request, metadata]. */
  readonly calls: [string, unknown, grpc.Metadata][] = [];
  readonly unary: Record<string, UnaryFn> = {};
  address = '';
  private readonly server = new grpc.Server({ 'grpc.max_receive_message_length': 64 << 20 });

  static async start(): Promise<FakeServer> {
    const fake = new FakeServer();
    fake.server.addService(WorkersService, {
      connect: (call: grpc.ServerDuplexStream<WorkerMessage, ServerMessage>) => {
        let stream: FakeStream | undefined;
        call.on('data', (msg: WorkerMessage) => {
          if (!stream) {
            if (!msg.hello) {
              call.emit('error', { code: grpc.status.INVALID_ARGUMENT, details: 'the first message must be hello' });
              return;
            }
            stream = new FakeStream(call, msg.hello);
            fake.streams.push(stream);
          } else {
            stream.messages.push(msg);
            if (msg.results && stream.autoAck) for (const r of msg.results.results) stream.ack(r);
          }
        });
        call.on('error', () => undefined);
      },
    });
    for (const [service, name] of [[RunsService, 'runs'], [WorkflowsService, 'workflows'], [AdminService, 'admin'],
      [LimitsService, 'limits']] as const) {
      const impl: grpc.UntypedServiceImplementation = {};
      for (const method of Object.keys(service)) {
        impl[method] = (call: grpc.ServerUnaryCall<unknown, unknown>, callback: grpc.sendUnaryData<unknown>) => {
          fake.calls.push([method, call.request, call.metadata]);
          const fn = fake.unary[method];
          if (!fn) {
            callback({ code: grpc.status.UNIMPLEMENTED, details: `${name}.${method} is not scripted` });
            return;
          }
          Promise.resolve().then(() => fn(call.request, call.metadata)).then(
            (res) => callback(null, res),
            (err: { code?: number; details?: string; message?: string }) =>
              callback({ code: err.code ?? grpc.status.INTERNAL, details: err.details ?? err.message }),
          );
        };
      }
      fake.server.addService(service, impl);
    }
    const port = await new Promise<number>((resolve, reject) => {
      fake.server.bindAsync('127.0.0.1:0', grpc.ServerCredentials.createInsecure(), (err, p) => (err ? reject(err) : resolve(p)));
    });
    fake.address = `127.0.0.1:${port}`;
    return fake;
  }

  /** The next Workers.Connect stream a worker opened (after its Hello). */
  nextStream(timeoutMs = 10_000): Promise<FakeStream> {
    return this.streams.next(timeoutMs, 'worker stream');
  }

  stop(): void {
    this.server.forceShutdown();
  }
}

/** A Logger keeping its records, for assertions. */
export function memoryLogger(): Logger & { records: ({ level: string; msg: string } & LogFields)[] } {
  const records: ({ level: string; msg: string } & LogFields)[] = [];
  const at = (level: string) => (msg: string, fields?: LogFields) => { records.push({ level, msg, ...fields }); };
  return { records, debug: at('debug'), info: at('info'), warn: at('warn'), error: at('error') };
}

/** Polls `cond` until it is truthy (returns it), failing after `timeoutMs`. */
export async function until<T>(cond: () => T | Promise<T>, what: string, timeoutMs = 10_000): Promise<NonNullable<T>> {
  const end = Date.now() + timeoutMs;
  for (;;) {
    const value = await cond();
    if (value) return value as NonNullable<T>;
    if (Date.now() > end) throw new Error(`not within ${timeoutMs} ms: ${what}`);
    await new Promise((r) => setTimeout(r, 10));
  }
}

/** A promise and its resolve function. */
export function deferred<T = void>(): { promise: Promise<T>; resolve: (value: T) => void } {
  let resolve!: (value: T) => void;
  const promise = new Promise<T>((r) => { resolve = r; });
  return { promise, resolve };
}

/** `value` without its undefined object members, recursively (decoded messages carry every oneof member). */
export function plain<T>(value: T): T {
  if (Array.isArray(value)) return value.map(plain) as T;
  if (value && typeof value === 'object' && !(value instanceof Date)) {
    return Object.fromEntries(Object.entries(value).filter(([, v]) => v !== undefined).map(([k, v]) => [k, plain(v)])) as T;
  }
  return value;
}
