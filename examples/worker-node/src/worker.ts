// The worker side of Cyclone's Workers.Connect stream, written from proto/ alone:
// hello with kinds and slots, leases, results matched to acks by (step_id,
// lease_generation), Stop -> abort the handler, Ping -> Pong, reconnect with backoff.

import { EventEmitter } from 'node:events';
import * as os from 'node:os';
import * as path from 'node:path';
import { randomUUID } from 'node:crypto';
import * as grpc from '@grpc/grpc-js';
import * as protoLoader from '@grpc/proto-loader';

import type { ProtoGrpcType } from './gen/workers';
import type { Lease__Output } from './gen/cyclone/v1/Lease';
import type { LeaseRef } from './gen/cyclone/v1/LeaseRef';
import type { ResultAck__Output } from './gen/cyclone/v1/ResultAck';
import type { ServerMessage__Output } from './gen/cyclone/v1/ServerMessage';
import type { StepResult } from './gen/cyclone/v1/StepResult';
import type { WorkerMessage } from './gen/cyclone/v1/WorkerMessage';
import type { WorkersClient } from './gen/cyclone/v1/Workers';
import { type Handler, type Lease, Stopped, outcomeOf, parseTraceContext } from './lease';
import { fromStruct, fromValue, toDate, toDuration, toMillis, toValue } from './wire';

export { type Handler, type Lease, type TraceContext, Permanent, Retry, Snooze, Stopped } from './lease';
export type { Json } from './wire';

export interface WorkerOptions {
  /** The server, HOST:PORT. */
  address: string;
  /** Handlers by step kind; the kinds listed in Hello. */
  handlers: Record<string, Handler>;
  /** Leases held at once (Hello.slots). Default 1. */
  slots?: number;
  /** Stable across reconnects (Hello.worker_id). Default host:pid:uuid. */
  workerId?: string;
  /** Folder holding cyclone/v1/workers.proto. Default: the repository's proto/. */
  protoDir?: string;
  /** Reconnect backoff: first delay and cap, in ms (doubled per failed attempt, with jitter). */
  backoffInitialMs?: number;
  backoffMaxMs?: number;
  log?: (line: string) => void;
}

// A stream ending with one of these is not retried: the worker is misconfigured.
const FATAL = new Set([grpc.status.INVALID_ARGUMENT, grpc.status.UNAUTHENTICATED, grpc.status.PERMISSION_DENIED]);
// Before Welcome we know no heartbeat interval; a server that says nothing this long is dead.
const WELCOME_TIMEOUT_MS = 15_000;

interface Held {
  lease: Lease;
  abort: AbortController;
  started: boolean; // false for a lease that arrived while draining: it is handed back
  result: StepResult | null; // set once the handler returned; kept until acked
  sentIn: number; // the session the result was last sent on (resent after a reconnect)
}

const keyOf = (stepId: string, generation: string | number) => `${stepId}/${generation}`;

export function loadWorkersClient(address: string, protoDir: string): WorkersClient {
  const def = protoLoader.loadSync(path.join(protoDir, 'cyclone/v1/workers.proto'), {
    keepCase: true, longs: String, enums: String, defaults: true, oneofs: true, includeDirs: [protoDir],
  });
  const pkg = grpc.loadPackageDefinition(def) as unknown as ProtoGrpcType;
  return new pkg.cyclone.v1.Workers(address, grpc.credentials.createInsecure(), {
    // The channel's own reconnect backoff; our stream backoff sits on top of it.
    'grpc.initial_reconnect_backoff_ms': 200,
    'grpc.max_reconnect_backoff_ms': 5_000,
    // A lease carries its input and parents' outputs as protobuf Values, up to 5 or 6 times
    // their JSON size: more than gRPC's default 4 MiB for payloads near the 1 MiB limit.
    'grpc.max_receive_message_length': 64 * 1024 * 1024,
  });
}

/**
 * One worker process's stream to Cyclone. Events: 'welcome' (serverId), 'lease' (Lease),
 * 'stop' (Lease, reason), 'ack' (Lease, status, detail), 'disconnect' (code, details).
 *
 *   const w = new Worker({ address: '127.0.0.1:7233', handlers, slots: 4 });
 *   process.on('SIGTERM', () => w.stop());
 *   await w.run();
 */
export class Worker extends EventEmitter {
  readonly workerId: string;
  private readonly handlers: Record<string, Handler>;
  private readonly slots: number;
  private readonly client: WorkersClient;
  private readonly log: (line: string) => void;
  private readonly backoffInitialMs: number;
  private readonly backoffMaxMs: number;
  private readonly held = new Map<string, Held>();
  private call: grpc.ClientDuplexStream<WorkerMessage, ServerMessage__Output> | null = null;
  private session = 0;
  private welcomed = false;
  // The largest output the server stores (Welcome.max_payload_bytes; 1 MiB from a server that does not say).
  private maxPayloadBytes = 1 << 20;
  private draining = false;
  private stopping = false;
  private wake: (() => void) | null = null;
  private changed: (() => void) | null = null; // wakes stop() when a lease or the stream changes

  constructor(opts: WorkerOptions) {
    super();
    this.handlers = opts.handlers;
    this.slots = opts.slots ?? 1;
    this.workerId = opts.workerId ?? `${os.hostname()}:${process.pid}:${randomUUID()}`;
    this.log = opts.log ?? ((line) => process.stderr.write(`[cyclone-worker ${this.workerId}] ${line}\n`));
    this.backoffInitialMs = opts.backoffInitialMs ?? 100;
    this.backoffMaxMs = opts.backoffMaxMs ?? 10_000;
    const protoDir = opts.protoDir ?? path.resolve(__dirname, '../../../proto');
    this.client = loadWorkersClient(opts.address, protoDir);
  }

  /** Connects and serves until stop(); rejects when the server refuses the worker for good. */
  async run(): Promise<void> {
    let backoff = this.backoffInitialMs;
    try {
      while (!this.stopping) {
        const end = await this.connectOnce();
        if (this.stopping) break;
        if (FATAL.has(end.code)) {
          throw new Error(`stream ended with ${grpc.status[end.code]}: ${end.details}; not reconnecting`);
        }
        if (end.welcomed) backoff = this.backoffInitialMs;
        const delay = Math.round(backoff * (0.5 + Math.random() / 2));
        this.log(`stream ended (${grpc.status[end.code]}: ${end.details}); reconnecting in ${delay} ms`);
        await new Promise<void>((resolve) => {
          const t = setTimeout(resolve, delay);
          this.wake = () => { clearTimeout(t); resolve(); };
        });
        this.wake = null;
        backoff = Math.min(this.backoffMaxMs, backoff * 2);
      }
    } finally {
      for (const key of [...this.held.keys()]) this.stopLease(key, 'shutdown');
      this.client.close();
    }
  }

  /**
   * Graceful stop: no new handler starts; running handlers get up to `graceMs` to finish
   * and have their results acked. Then leases that arrived meanwhile are handed back
   * (Snoozed, delay 0: same attempt), handlers still running are aborted without an
   * answer (their leases expire and are reclaimed, as after a crash), and the worker
   * half-closes the stream, after which the server pushes nothing more and ends it.
   */
  async stop(graceMs = 10_000): Promise<void> {
    if (this.draining) return;
    this.draining = true;
    const running = () => [...this.held.values()].some((h) => h.started);
    await this.until(() => !running(), graceMs);
    this.stopping = true;
    for (const [key, h] of [...this.held]) {
      if (!h.started) this.finish(key, h, { snoozed: { delay: toDuration(0) } });
      else if (!h.result) this.stopLease(key, 'shutdown');
    }
    const call = this.call;
    if (call) {
      call.end();
      await this.until(() => this.call !== call, 3_000); // the server acks, then ends the stream
    }
    this.call?.cancel();
    this.wake?.();
  }

  private async until(done: () => boolean, timeoutMs: number): Promise<void> {
    const end = Date.now() + timeoutMs;
    while (!done() && Date.now() < end) {
      await new Promise<void>((resolve) => {
        const t = setTimeout(resolve, Math.min(100, end - Date.now()));
        this.changed = () => { clearTimeout(t); resolve(); };
      });
      this.changed = null;
    }
  }

  private connectOnce(): Promise<{ code: grpc.status; details: string; welcomed: boolean }> {
    return new Promise((resolve) => {
      const call = this.client.Connect();
      this.call = call;
      this.session += 1;
      this.welcomed = false;
      let welcomed = false;
      let lastHeard = Date.now();
      let silenceMs = WELCOME_TIMEOUT_MS;
      const watchdog = setInterval(() => {
        if (Date.now() - lastHeard > silenceMs) {
          this.log(`no message from the server for ${silenceMs} ms; dropping the stream`);
          call.cancel();
        }
      }, 100);
      call.on('data', (msg: ServerMessage__Output) => {
        lastHeard = Date.now();
        if (msg.msg === 'welcome' && msg.welcome) {
          welcomed = true;
          // workers.proto: a worker that hears nothing for 3 heartbeat intervals reconnects.
          silenceMs = 3 * toMillis(msg.welcome.heartbeat_interval) || WELCOME_TIMEOUT_MS;
        }
        this.onMessage(call, msg);
      });
      call.on('error', () => undefined); // the 'status' event carries the same status
      call.on('status', (st: grpc.StatusObject) => {
        clearInterval(watchdog);
        if (this.call === call) {
          this.call = null;
          this.welcomed = false;
        }
        this.emit('disconnect', st.code, st.details);
        this.changed?.();
        resolve({ code: st.code, details: st.details, welcomed });
      });
      const held: LeaseRef[] = [...this.held.values()].map((h) => ({
        step_id: h.lease.stepId, lease_generation: h.lease.leaseGeneration,
      }));
      call.write({
        hello: { worker_id: this.workerId, kinds: Object.keys(this.handlers), slots: this.slots, held, sdk: 'node-example/0.1.0' },
      });
    });
  }

  private onMessage(call: grpc.ClientDuplexStream<WorkerMessage, ServerMessage__Output>, msg: ServerMessage__Output): void {
    if (call !== this.call) return;
    switch (msg.msg) {
      case 'welcome': {
        const w = msg.welcome!;
        this.welcomed = true;
        this.maxPayloadBytes = Number(w.max_payload_bytes) || 1 << 20;
        this.log(`welcome from ${w.server_id}; ${w.lost.length} held lease(s) lost`);
        for (const ref of w.lost) this.stopLease(keyOf(ref.step_id, ref.lease_generation), 'lost');
        this.emit('welcome', w.server_id);
        this.flush();
        break;
      }
      case 'leases':
        for (const l of msg.leases!.leases) this.startLease(l);
        break;
      case 'acks':
        for (const a of msg.acks!.acks) this.onAck(a);
        break;
      case 'stop':
        for (const ref of msg.stop!.leases) this.stopLease(keyOf(ref.step_id, ref.lease_generation), msg.stop!.reason);
        break;
      case 'ping':
        call.write({ pong: { nonce: msg.ping!.nonce } });
        break;
      default:
        break; // a message type added after this worker was written: ignore it
    }
  }

  private startLease(l: Lease__Output): void {
    const key = keyOf(l.step_id, l.lease_generation);
    if (this.held.has(key)) return;
    const lease: Lease = {
      runId: l.run_id, stepId: l.step_id, node: l.node, kind: l.kind, attempt: l.attempt,
      maxAttempts: l.max_attempts, reclaims: l.reclaims, leaseGeneration: l.lease_generation,
      input: fromValue(l.input), parents: fromStruct(l.parents), attemptDeadline: toDate(l.attempt_deadline),
      trace: parseTraceContext(l.trace_context),
    };
    const h: Held = { lease, abort: new AbortController(), started: !this.draining, result: null, sentIn: 0 };
    this.held.set(key, h);
    // While draining, the lease waits unanswered: it fills a slot, so nothing more is
    // pushed, whereas handing it back now would free the slot and bring it straight back.
    if (!h.started) return;
    this.emit('lease', lease);
    void this.runHandler(key, h);
  }

  private async runHandler(key: string, h: Held): Promise<void> {
    let outcome: Pick<StepResult, 'completed' | 'failed' | 'snoozed'>;
    try {
      const handler = this.handlers[h.lease.kind];
      if (!handler) throw new Error(`no handler for kind ${h.lease.kind}`);
      const out = await handler(h.lease, h.abort.signal);
      // Measured as the server measures (compact JSON): an output over its limit is answered
      // with its size only, and the server discards the step (output_too_large).
      const size = Buffer.byteLength(JSON.stringify(out ?? null) ?? 'null');
      outcome = size > this.maxPayloadBytes
        ? { completed: { oversized_output_bytes: String(size) } }
        : { completed: { output: toValue(out) } };
    } catch (err) {
      outcome = outcomeOf(err);
    }
    this.finish(key, h, outcome);
  }

  private finish(key: string, h: Held, outcome: Pick<StepResult, 'completed' | 'failed' | 'snoozed'>): void {
    // A stopped or lost lease's result would only be refused: drop it.
    if (h.abort.signal.aborted || this.held.get(key) !== h) return;
    h.result = { step_id: h.lease.stepId, lease_generation: h.lease.leaseGeneration, ...outcome };
    this.flush();
  }

  /** Sends every result not yet sent on this stream; results wait here while it is down. */
  private flush(): void {
    if (!this.call || !this.welcomed) return;
    const batch: StepResult[] = [];
    for (const h of this.held.values()) {
      if (h.result && h.sentIn !== this.session) {
        h.sentIn = this.session;
        batch.push(h.result);
      }
    }
    if (batch.length > 0) this.call.write({ results: { results: batch } });
  }

  private onAck(a: ResultAck__Output): void {
    const key = keyOf(a.step_id, a.lease_generation);
    const h = this.held.get(key);
    if (!h) return;
    // Every ack ends the lease. INVALID means our answer was malformed and the server failed
    // the attempt in its place: a bug in this worker, so it is logged as an error.
    if (a.status === 'ACK_STATUS_INVALID') console.error(`cyclone: result for ${key} refused as invalid: ${a.detail}`);
    this.held.delete(key);
    if (a.status !== 'ACK_STATUS_APPLIED') this.log(`result for ${key} refused: ${a.status} ${a.detail}`);
    this.emit('ack', h.lease, a.status, a.detail);
    this.changed?.();
  }

  private stopLease(key: string, reason: string): void {
    const h = this.held.get(key);
    if (!h) return;
    this.held.delete(key);
    this.log(`stop ${key}: ${reason}`);
    h.abort.abort(new Stopped(reason));
    this.emit('stop', h.lease, reason);
    this.changed?.();
  }
}
