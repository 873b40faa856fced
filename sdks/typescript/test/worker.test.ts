// The Worker against a scripted in-process server: the protocol of docs/protocol.md, one
// behaviour per test.

import assert from 'node:assert/strict';
import { afterEach, beforeEach, describe, it } from 'node:test';

import * as grpc from '@grpc/grpc-js';

import {
  type Context, HandlerError, InvalidArgumentError, Permanent, RetryAfter, Snooze, Stopped, UnavailableError, Worker,
  type WorkerOptions,
} from '../src/index.js';
import { currentStep } from '../src/logging.js';
import { SDK_NAME } from '../src/version.js';
import { FakeServer, type FakeStream, deferred, memoryLogger, plain, until } from './helpers.js';

// A server of its own per test, and every worker a test made stopped after it, so that a
// failing test leaves nothing behind for the next.
let server: FakeServer;
let workers: Worker[] = [];

beforeEach(async () => {
  server = await FakeServer.start();
});
afterEach(async () => {
  await Promise.all(workers.map((w) => w.stop()));
  workers = [];
  server.stop();
});

const T = { timeout: 30_000 };

function worker(options: WorkerOptions = {}): Worker & { log: ReturnType<typeof memoryLogger> } {
  const log = memoryLogger();
  const w = new Worker(server.address, {
    signals: [], logger: log, reconnect: { initialMs: 20, maxMs: 200 }, connectTimeoutMs: 5_000, ...options,
  });
  workers.push(w);
  return Object.assign(w, { log });
}

/** Starts `w`, returns its run() promise and its first stream, welcomed. */
async function connect(w: Worker, welcome: Parameters<FakeStream['welcome']>[0] = {}) {
  const running = w.run();
  const stream = await server.nextStream();
  stream.welcome(welcome);
  await w.waitConnected(5_000);
  return { running, stream };
}

describe('Worker', () => {
  it('says Hello with its id, kinds, slots and SDK, and runs a lease to a completed result', T, async () => {
    const w = worker({ slots: 3, workerId: 'w-hello' });
    let seen: Context | undefined;
    w.handle('resize', (ctx) => {
      seen = ctx;
      return { width: ctx.input.width * 2, parent: ctx.parents.fetch };
    });
    w.handle('other', () => null);
    const { running, stream } = await connect(w);
    assert.deepEqual(plain(stream.hello), { workerId: 'w-hello', kinds: ['resize', 'other'], slots: 3, held: [], sdk: SDK_NAME });
    const [lease] = stream.lease({
      kind: 'resize', node: 'thumb', runId: 'r-1', attempt: 2, maxAttempts: 2, reclaims: 1, snoozes: 3,
      leaseGeneration: 7, input: { width: 21 }, parents: { fetch: { url: 'u' } },
      attemptDeadline: new Date('2030-01-01T00:00:00Z'),
      traceContext: { traceparent: '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01', tracestate: 'k=v' },
    });
    const [result] = await stream.results();
    assert.deepEqual(plain(result), {
      stepId: lease.stepId, leaseGeneration: 7, completed: { output: { width: 42, parent: { url: 'u' } }, oversizedOutputBytes: 0 },
    });
    assert.ok(seen);
    assert.deepEqual([seen.runId, seen.node, seen.kind, seen.attempt, seen.maxAttempts, seen.lastAttempt, seen.reclaims,
      seen.snoozes, seen.leaseGeneration, seen.workerId], ['r-1', 'thumb', 'resize', 2, 2, true, 1, 3, 7, 'w-hello']);
    assert.deepEqual(seen.attemptDeadline, new Date('2030-01-01T00:00:00Z'));
    assert.deepEqual(seen.trace, {
      traceparent: '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01', tracestate: 'k=v',
      traceId: '0af7651916cd43dd8448eb211c80319c', spanId: 'b7ad6b7169203331', sampled: true,
    });
    assert.equal(seen.signal.aborted, false);
    await until(() => w.counts.applied === 1, 'the ack to be counted');
    await w.stop();
    await running;
    assert.deepEqual(w.counts, { welcomes: 1, leases: 1, applied: 1 });
  });

  it('answers every Ping with a Pong carrying its nonce', T, async () => {
    const w = worker().handle('a', () => 1);
    const { running, stream } = await connect(w);
    stream.send({ ping: { nonce: 41, at: new Date() } });
    stream.send({ ping: { nonce: 42, at: new Date() } });
    assert.deepEqual(plain(await stream.messages.next()), { pong: { nonce: 41 } });
    assert.deepEqual(plain(await stream.messages.next()), { pong: { nonce: 42 } });
    await w.stop();
    await running;
  });

  it('sends results that are ready together in one Results message', T, async () => {
    const gate = deferred();
    const w = worker({ slots: 2 }).handle('a', async (ctx) => {
      await gate.promise;
      return ctx.stepId;
    });
    const { running, stream } = await connect(w);
    const [l1, l2] = stream.lease({}, {});
    await until(() => w.counts.leases === 2, 'both leases to arrive');
    gate.resolve();
    const results = await stream.results();
    assert.deepEqual(results.map((r) => r.completed?.output).sort(), [l1.stepId, l2.stepId].sort());
    await w.stop();
    await running;
  });

  it('maps what a handler throws to failed and snoozed results', T, async () => {
    const w = worker({ slots: 5 })
      .handle('retry', () => { throw new RetryAfter(1500, 'rate limited'); })
      .handle('permanent', () => { throw new Permanent('bad input'); })
      .handle('crash', () => { (null as unknown as { x: () => void }).x(); })
      .handle('general', () => { throw new HandlerError('custom', { retryDelayMs: 20 }); })
      .handle('snooze', () => { throw new Snooze(250); });
    const { running, stream } = await connect(w);
    const kinds = ['retry', 'permanent', 'crash', 'general', 'snooze'];
    const leases = stream.lease(...kinds.map((kind) => ({ kind })));
    const byStep = new Map<string, Awaited<ReturnType<FakeStream['results']>>[number]>();
    while (byStep.size < kinds.length) for (const r of await stream.results()) byStep.set(r.stepId, r);
    const [retry, permanent, crash, general, snooze] = leases.map((l) => byStep.get(l.stepId)!);
    assert.equal(retry.failed?.message, 'rate limited');
    assert.deepEqual(retry.failed?.retryDelay, { seconds: 1, nanos: 500_000_000 });
    assert.equal(retry.failed?.permanent, false);
    assert.match(retry.failed!.details, /^RetryAfter: rate limited\n {4}at /);
    assert.deepEqual([permanent.failed?.message, permanent.failed?.permanent, permanent.failed?.retryDelay],
      ['bad input', true, undefined]);
    assert.match(crash.failed!.message, /^TypeError: Cannot read properties of null/);
    assert.equal(crash.failed?.permanent, false);
    assert.match(crash.failed!.details, /^TypeError: .*\n {4}at .*worker\.test\.js/);
    assert.deepEqual(general.failed?.retryDelay, { seconds: 0, nanos: 20_000_000 });
    assert.deepEqual(plain(snooze), { stepId: leases[4].stepId, leaseGeneration: 1, snoozed: { delay: { seconds: 0, nanos: 250_000_000 } } });
    // The worker's own log has each failure, with the stack and the step's ids.
    const failures = w.log.records.filter((r) => r.level === 'warn' && r.msg.startsWith('handler '));
    assert.equal(failures.length, 4);
    assert.ok(failures.every((r) => typeof r.stack === 'string' && r.run_id === 'run-1' && r.attempt === 1));
    await w.stop();
    await running;
  });

  it('sends an output over Welcome.max_payload_bytes as its size, measured as the server measures it', T, async () => {
    const w = worker({ slots: 2 })
      .handle('big', () => ({ blob: 'x'.repeat(5000) }))
      .handle('fits', () => ({ blob: 'é'.repeat(494) })); // 988 + 11 bytes of JSON: 999, not over 1000
    const { running, stream } = await connect(w, { maxPayloadBytes: 1000 });
    const [big, fits] = stream.lease({ kind: 'big' }, { kind: 'fits' });
    const byStep = new Map<string, Awaited<ReturnType<FakeStream['results']>>[number]>();
    while (byStep.size < 2) for (const r of await stream.results()) byStep.set(r.stepId, r);
    assert.deepEqual(plain(byStep.get(big.stepId)?.completed), { oversizedOutputBytes: 5011 });
    assert.deepEqual(byStep.get(fits.stepId)?.completed, { output: { blob: 'é'.repeat(494) }, oversizedOutputBytes: 0 });
    await w.stop();
    await running;
  });

  it('fails the step permanently when the output is not JSON, naming where', T, async () => {
    const w = worker().handle('a', () => ({ items: [1, Number.NaN] }));
    const { running, stream } = await connect(w);
    stream.lease();
    const [result] = await stream.results();
    assert.equal(result.failed?.message, 'output is not JSON: output.items[1]: NaN is not a JSON number');
    assert.equal(result.failed?.permanent, true);
    await w.stop();
    await running;
  });

  it('aborts the handler\'s signal on Stop, with the reason, and sends no result for it', T, async () => {
    const aborted = deferred<unknown>();
    let reason = '';
    const w = worker({ slots: 2 }).handle('block', (ctx) => new Promise((_resolve, reject) => {
      ctx.signal.addEventListener('abort', () => {
        reason = ctx.cancelReason;
        aborted.resolve(ctx.signal.reason);
        reject(ctx.signal.reason);
      });
    })).handle('ok', () => 'ok');
    const { running, stream } = await connect(w);
    const [lease] = stream.lease({ kind: 'block', leaseGeneration: 3 });
    await until(() => w.counts.leases === 1, 'the lease to start');
    stream.send({ stop: { leases: [{ stepId: lease.stepId, leaseGeneration: 3 }], reason: 'cancelled' } });
    const why = await aborted.promise;
    assert.ok(why instanceof Stopped);
    assert.equal((why as Stopped).reason, 'cancelled');
    assert.equal(reason, 'cancelled');
    // The next message is the next lease's result: none for the stopped one.
    const [ok] = stream.lease({ kind: 'ok' });
    const results = await stream.results();
    assert.deepEqual(results.map((r) => r.stepId), [ok.stepId]);
    assert.equal(w.counts.stopped_cancelled, 1);
    await w.stop();
    await running;
  });

  it('reconnects after a lost stream, lists its held leases in Hello, and delivers the result on the new stream', T, async () => {
    const gate = deferred();
    const w = worker({ workerId: 'w-re' }).handle('a', async () => {
      await gate.promise;
      return 'done';
    });
    const { running, stream } = await connect(w);
    const [lease] = stream.lease({ leaseGeneration: 4 });
    await until(() => w.counts.leases === 1, 'the lease to start');
    stream.end(grpc.status.UNAVAILABLE, 'server shutting down');
    const second = await server.nextStream();
    assert.equal(second.hello.workerId, 'w-re');
    assert.deepEqual(plain(second.hello.held), [{ stepId: lease.stepId, leaseGeneration: 4 }]);
    second.welcome();
    gate.resolve();
    const [result] = await second.results();
    assert.deepEqual([result.stepId, result.leaseGeneration, result.completed?.output], [lease.stepId, 4, 'done']);
    assert.equal(w.counts.disconnects, 1);
    await until(() => w.counts.applied === 1, 'the ack');
    await w.stop();
    await running;
  });

  it('sends an unacked result again after a reconnect, until it is acked', T, async () => {
    const w = worker().handle('a', () => 'out');
    const { running, stream } = await connect(w);
    stream.autoAck = false;
    const [lease] = stream.lease();
    const [first] = await stream.results();
    assert.equal(first.stepId, lease.stepId);
    stream.end(grpc.status.UNAVAILABLE, 'gone before the ack');
    const second = await server.nextStream();
    second.autoAck = false;
    assert.deepEqual(plain(second.hello.held), [{ stepId: lease.stepId, leaseGeneration: 1 }]);
    second.welcome();
    const [again] = await second.results();
    assert.deepEqual(plain(again), plain(first));
    second.ack(again, 3, 'the step already left running under this lease generation'); // ENDED
    await until(() => w.counts.ended === 1, 'the ENDED ack to be counted');
    assert.ok(w.log.records.some((r) => r.level === 'warn' && r.msg.includes('refused: ended')));
    // Acked: a third stream lists nothing held.
    second.end(grpc.status.UNAVAILABLE, 'again');
    const third = await server.nextStream();
    assert.deepEqual(third.hello.held, []);
    third.welcome();
    await w.stop();
    await running;
  });

  it('stops the handlers of leases the Welcome reports lost, and drops their results', T, async () => {
    const gate = deferred();
    let reason = '';
    const w = worker().handle('a', async (ctx) => {
      await gate.promise;
      reason = ctx.cancelReason;
      return 'late';
    });
    const { running, stream } = await connect(w);
    const [lease] = stream.lease();
    await until(() => w.counts.leases === 1, 'the lease to start');
    stream.end(grpc.status.UNAVAILABLE, 'cut');
    const second = await server.nextStream();
    second.welcome({ lost: [{ stepId: lease.stepId, leaseGeneration: 1 }] });
    await until(() => w.counts.stopped_lost === 1, 'the lost lease to be stopped');
    gate.resolve();
    await until(() => reason !== '', 'the handler to end');
    assert.equal(reason, 'lost');
    second.send({ ping: { nonce: 1, at: new Date() } });
    const next = await second.messages.next();
    assert.deepEqual(plain(next), { pong: { nonce: 1 } }); // no result came before the pong
    await w.stop();
    await running;
  });

  it('does not reconnect after INVALID_ARGUMENT: run() rejects with it', T, async () => {
    const w = worker().handle('a', () => 1);
    const running = w.run();
    const stream = await server.nextStream();
    stream.end(grpc.status.INVALID_ARGUMENT, 'hello.slots: must be between 1 and 10000');
    await assert.rejects(running, (err: unknown) => err instanceof InvalidArgumentError
      && err.details === 'hello.slots: must be between 1 and 10000');
  });

  it('gives up after `reconnect.attempts` failed connections', T, async () => {
    const closed = await FakeServer.start();
    const address = closed.address;
    closed.stop();
    const w = new Worker(address, { signals: [], logger: memoryLogger(), reconnect: { initialMs: 10, maxMs: 20, attempts: 3 } })
      .handle('a', () => 1);
    await assert.rejects(w.run(), (err: unknown) => err instanceof UnavailableError);
  });

  it('drops a stream the server leaves silent for 3 heartbeats, and reconnects', T, async () => {
    const w = worker().handle('a', () => 1);
    const running = w.run();
    const stream = await server.nextStream();
    stream.welcome({ heartbeatMs: 100 });
    const second = await server.nextStream();
    assert.equal(second.hello.workerId, w.workerId);
    assert.match(String(w.log.records.find((r) => r.msg.startsWith('stream lost'))?.msg), /sent nothing for 0\.3 s/);
    second.welcome();
    await w.stop();
    await running;
  });

  it('stops gracefully: lets a running handler finish, hands back a lease that arrived meanwhile, half-closes', T, async () => {
    const gate = deferred();
    const started: string[] = [];
    const w = worker({ slots: 2 }).handle('a', async (ctx) => {
      started.push(ctx.stepId);
      await gate.promise;
      return 'finished';
    });
    const { running, stream } = await connect(w);
    stream.autoAck = false;
    stream.autoEnd = false;
    const [first] = stream.lease();
    await until(() => started.length === 1, 'the first handler to start');
    const stopped = w.stop();
    const [second] = stream.lease({ leaseGeneration: 2 });
    await until(() => w.counts.leases === 2, 'the second lease to arrive');
    assert.deepEqual(started, [first.stepId]); // not started while draining
    gate.resolve();
    const [done] = await stream.results();
    assert.deepEqual([done.stepId, done.completed?.output], [first.stepId, 'finished']);
    stream.send({ ping: { nonce: 9, at: new Date() } });
    await new Promise((r) => setTimeout(r, 50));
    assert.deepEqual(plain(await stream.messages.next()), { pong: { nonce: 9 } });
    assert.equal(stream.messages.size, 0); // the drain waits for the ack before it hands back
    stream.ack(done);
    const [handBack] = await stream.results();
    assert.deepEqual(plain(handBack), { stepId: second.stepId, leaseGeneration: 2, snoozed: { delay: { seconds: 0, nanos: 0 } } });
    await stream.halfClosed;
    stream.end();
    await stopped;
    await running;
    assert.deepEqual(started, [first.stepId]);
    // Nothing after the hand-back but the half-close: no pong, no result.
    assert.deepEqual(stream.skipped, []);
    assert.equal(stream.messages.size, 0);
  });

  it('cuts off a handler still running after the grace period, without an answer', T, async () => {
    let reason = '';
    const w = worker({ graceMs: 200 }).handle('a', (ctx) => new Promise(() => {
      ctx.signal.addEventListener('abort', () => { reason = ctx.cancelReason; });
    }));
    const { running, stream } = await connect(w);
    stream.lease();
    await until(() => w.counts.leases === 1, 'the lease');
    await w.stop();
    await running;
    assert.equal(reason, 'shutdown');
    await stream.halfClosed;
    assert.equal(stream.messages.size, 0); // no result
  });

  it('stops on the signals it was given', T, async () => {
    const w = worker({ signals: ['SIGUSR2'] }).handle('a', () => 1);
    const { running, stream } = await connect(w);
    process.kill(process.pid, 'SIGUSR2');
    await stream.halfClosed;
    stream.end();
    await running;
    assert.equal(process.listenerCount('SIGUSR2'), 0);
    assert.ok(w.log.records.some((r) => r.msg.startsWith('SIGUSR2: stopping')));
  });

  it('receives a lease bigger than gRPC\'s default 4 MiB', T, async () => {
    let size = 0;
    const w = worker().handle('a', (ctx) => {
      size = ctx.input.pad.length;
      return size;
    });
    const { running, stream } = await connect(w);
    stream.lease({ input: { pad: 'x'.repeat(6 * 1024 * 1024) } });
    const [result] = await stream.results();
    assert.equal(result.completed?.output, 6 * 1024 * 1024);
    assert.equal(size, 6 * 1024 * 1024);
    await w.stop();
    await running;
  });

  it('logs through ctx.log and any logger inside the handler with the step\'s run, step and attempt', T, async () => {
    let inside: ReturnType<typeof currentStep>;
    const w = worker().handle('a', (ctx) => {
      ctx.log.info('working', { items: 3 });
      inside = currentStep();
      return null;
    });
    const { running, stream } = await connect(w);
    const [lease] = stream.lease({ runId: 'r-9', attempt: 4, node: 'n' });
    await stream.results();
    const record = w.log.records.find((r) => r.msg === 'working');
    assert.deepEqual(record, {
      level: 'info', msg: 'working', run_id: 'r-9', step_id: lease.stepId, node: 'n', kind: 'a', attempt: 4, items: 3,
    });
    assert.deepEqual(inside, { run_id: 'r-9', step_id: lease.stepId, node: 'n', kind: 'a', attempt: 4 });
    assert.equal(currentStep(), undefined);
    await w.stop();
    await running;
  });

  it('refuses bad registrations and runs once', () => {
    const w = worker();
    assert.throws(() => w.handle('bad kind!', () => 1), TypeError);
    w.handle('a', () => 1);
    assert.throws(() => w.handle('a', () => 2), /already has a handler/);
    assert.throws(() => new Worker(server.address, { slots: 0 }), RangeError);
    assert.deepEqual(w.kinds, ['a']);
  });
});
