// One worker stream (Workers/Connect): Hello, Welcome, then leases, acks, stops and pings
// until it ends. The worker keeps what must survive a reconnect (the lease table); a
// Session only speaks the protocol of workers.proto on one stream.

import * as grpc from '@grpc/grpc-js';

import { type CycloneClientError, clientError } from './errors.js';
import type { Hello, ServerMessage, StepResult, Welcome, WorkerMessage } from './gen/cyclone/v1/workers.js';
import { fromDuration } from './json.js';
import type { LeaseTable } from './leases.js';
import type { Logger } from './logging.js';

/** The server ends a stream with these when reconnecting cannot help. */
export const FATAL_CODES: ReadonlySet<number> = new Set([
  grpc.status.INVALID_ARGUMENT, grpc.status.UNAUTHENTICATED, grpc.status.PERMISSION_DENIED,
]);
/** When the server's Welcome leaves it out: a safe guess well inside the default lease TTL. */
const DEFAULT_HEARTBEAT_MS = 10_000;

/** What a Session needs of its worker. */
export interface SessionOwner {
  readonly workerId: string;
  readonly address: string;
  readonly connectTimeoutMs: number;
  readonly logger: Logger;
  hello(): Hello;
  /** Stops the lost leases; returns the results still to deliver on this new stream. */
  welcomed(session: Session, welcome: Welcome): StepResult[];
}

export type Call = grpc.ClientDuplexStream<WorkerMessage, ServerMessage>;

/** Speaks the worker protocol on one stream on behalf of a Worker. */
export class Session {
  /** True once the server's Welcome arrived. */
  welcomed = false;
  private closing = false;
  private ended = false;
  private pending: StepResult[] = [];
  private flushing = false;
  private readonly endedWaiters: (() => void)[] = [];

  constructor(private readonly owner: SessionOwner, private readonly table: LeaseTable, private readonly call: Call) {}

  /**
   * Resolves only after `close()` or `cancel()`; otherwise rejects with the
   * CycloneClientError that ended the stream (check `welcomed` to tell a lost stream from
   * a failed connection attempt).
   */
  run(): Promise<void> {
    const { owner, call } = this;
    return new Promise<void>((resolve, reject) => {
      let silenceMs = owner.connectTimeoutMs;
      const finish = (err?: CycloneClientError): void => {
        if (this.ended) return;
        this.ended = true;
        clearTimeout(timer);
        for (const w of this.endedWaiters.splice(0)) w();
        call.cancel(); // a no-op once the call has its status
        if (err && !this.closing) reject(err);
        else resolve();
      };
      const silent = (): void => {
        const what = this.welcomed ? `the server sent nothing for ${silenceMs / 1000} s` : `no Welcome within ${silenceMs / 1000} s`;
        finish(clientError(grpc.status.UNAVAILABLE, what));
      };
      let timer = setTimeout(silent, silenceMs);
      call.on('data', (msg: ServerMessage) => {
        if (this.ended) return;
        timer.refresh();
        if (this.welcomed) {
          this.dispatch(msg);
          return;
        }
        if (!msg.welcome) {
          const kind = Object.keys(msg).find((k) => (msg as Record<string, unknown>)[k] !== undefined) ?? 'nothing';
          finish(clientError(grpc.status.UNAVAILABLE, `expected Welcome, got ${kind}`));
          return;
        }
        const welcome = msg.welcome;
        this.welcomed = true;
        const heartbeatMs = fromDuration(welcome.heartbeatInterval) || DEFAULT_HEARTBEAT_MS;
        // workers.proto: a worker that hears nothing for 3 heartbeat intervals reconnects.
        silenceMs = 3 * heartbeatMs;
        clearTimeout(timer);
        timer = setTimeout(silent, silenceMs);
        owner.logger.info(`connected to ${owner.address} (server ${welcome.serverId}, heartbeat ${heartbeatMs / 1000} s, `
          + `${welcome.lost.length} lost)`, { worker_id: owner.workerId, server_id: welcome.serverId });
        for (const result of owner.welcomed(this, welcome)) this.sendResult(result);
      });
      // The 'status' event carries the same status as an 'error'; without a listener an
      // 'error' would be thrown.
      call.on('error', () => undefined);
      call.on('status', (st: grpc.StatusObject) => {
        if (st.code === grpc.status.OK) finish(clientError(grpc.status.UNAVAILABLE, 'the server ended the stream'));
        else finish(clientError(st.code, st.details || grpc.status[st.code]));
      });
      this.write({ hello: owner.hello() });
    });
  }

  private dispatch(msg: ServerMessage): void {
    const table = this.table;
    if (msg.leases) {
      for (const lease of msg.leases.leases) table.start(lease);
    } else if (msg.acks) {
      for (const ack of msg.acks.acks) table.acked(ack);
    } else if (msg.stop) {
      for (const ref of msg.stop.leases) table.stop(ref, msg.stop.reason || 'stop');
    } else if (msg.ping && !this.closing) {
      // Once closing, no pong: the half-close follows the hand-backs (zero-delay
      // snoozes), and a message in between would tell the server we are not stopping.
      this.write({ pong: { nonce: msg.ping.nonce } });
    }
    // A message kind added by a newer server is ignored, as the protocol asks.
  }

  /** Queues a result; results queued in the same turn of the event loop go out in one Results message. */
  sendResult(result: StepResult): void {
    if (this.ended) return; // kept by the lease table, sent again after the next Welcome
    this.pending.push(result);
    if (!this.flushing) {
      this.flushing = true;
      setImmediate(() => this.flush());
    }
  }

  private flush(): void {
    this.flushing = false;
    if (this.pending.length === 0) return;
    const results = this.pending;
    this.pending = [];
    this.write({ results: { results } });
  }

  private write(msg: WorkerMessage): void {
    if (this.ended) return;
    try {
      // @grpc/grpc-js queues writes: one writer per stream, as the protocol asks.
      this.call.write(msg);
    } catch (err) {
      // The stream is breaking; its status ends the session, and unacked results go out
      // again after the next Welcome.
      this.owner.logger.debug('cyclone worker: write failed', { error: err });
    }
  }

  /** Graceful end: flush queued results, half-close, give the server `timeoutMs` to end the stream. */
  async close(timeoutMs = 2000): Promise<void> {
    if (this.ended) return;
    this.closing = true;
    this.flush();
    try {
      this.call.end();
    } catch {
      // already ending
    }
    await new Promise<void>((resolve) => {
      const timer = setTimeout(resolve, timeoutMs);
      this.endedWaiters.push(() => {
        clearTimeout(timer);
        resolve();
      });
    });
    this.cancel();
  }

  /** Ends the stream at once (the worker is going away). */
  cancel(): void {
    this.closing = true;
    if (!this.ended) this.call.cancel();
  }
}
