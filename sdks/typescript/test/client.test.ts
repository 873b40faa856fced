// The Client against a scripted in-process server: requests as sent, answers as read, errors as thrown.

import assert from 'node:assert/strict';
import { afterEach, beforeEach, describe, it } from 'node:test';

import * as grpc from '@grpc/grpc-js';

import {
  Client, CycloneClientError, FailedPreconditionError, InvalidArgumentError, NotFoundError, Run, RunCancelled,
  RunFailed, UnavailableError, WaitTimeout, Workflow,
} from '../src/index.js';
import { NodeType, RunState, StepState, type Run as RunMsg } from '../src/gen/cyclone/v1/types.js';
import { FakeServer, plain, status } from './helpers.js';

let server: FakeServer;
let client: Client;

beforeEach(async () => {
  server = await FakeServer.start();
  client = new Client(server.address, { token: 'secret' });
});
afterEach(() => {
  client.close();
  server.stop();
});

function runMsg(fields: Partial<RunMsg> = {}): RunMsg {
  return {
    id: 'run-1', workflow: 'etl', workflowVersion: 1, state: RunState.RUN_STATE_RUNNING, input: { day: 1 },
    result: undefined, priority: 0, idempotencyKey: '', deadline: undefined, parentRunId: '', parentStepId: '',
    createdAt: new Date('2026-12-01T00:00:00Z'), updatedAt: undefined, finishedAt: undefined, steps: [],
    scheduleName: '', scheduleFireAt: undefined, ...fields,
  };
}

function stepMsg(node: string, state: StepState, fields: Record<string, unknown> = {}) {
  return {
    id: `s-${node}`, runId: 'run-1', node, kind: node, type: NodeType.NODE_TYPE_TASK, state, attempt: 1, maxAttempts: 25,
    reclaims: 0, maxReclaims: 5, snoozes: 0, priority: 0, scheduledAt: undefined, leaseOwner: '', leaseExpiry: undefined,
    leaseGeneration: 1, output: undefined, errorKind: '', reason: '', errors: [], deps: [], childRunId: '',
    cancelCause: '', createdAt: undefined, startedAt: undefined, finishedAt: undefined, attemptDeadline: undefined,
    heldBy: '', limits: [],
    ...fields,
  };
}

const lastCall = (method: string) => [...server.calls].reverse().find(([m]) => m === method);

describe('Client', () => {
  it('registers a workflow built with the builder, and reads back its info', async () => {
    server.unary.registerWorkflow = (req) => ({
      created: true,
      workflow: { name: req.name, version: 2, nodes: req.nodes, createdAt: new Date('2026-12-01T00:00:00Z') },
    });
    const wf = new Workflow('etl')
      .task('extract', { maxAttempts: 3, backoffInitialMs: 1500 })
      .task('load', { deps: ['extract'], kind: 'loader', onDepFailure: 'cancel_branch' })
      .sleep('pause', 60_000, { deps: ['load'] })
      .signal('approval', { name: 'approve', maxWaitMs: 5_000 })
      .child('report', 'reports', { deps: ['pause', 'approval'] });
    const info = await client.register(wf);
    assert.deepEqual([info.name, info.version, info.created], ['etl', 2, true]);
    assert.deepEqual(info.nodes.map((n) => [n.id, n.type, n.kind, n.onDepFailure]), [
      ['extract', 'task', '', 'unknown_0'], ['load', 'task', 'loader', 'cancel_branch'], ['pause', 'sleep', '', 'unknown_0'],
      ['approval', 'signal', '', 'unknown_0'], ['report', 'child', '', 'unknown_0'],
    ]);
    assert.equal(info.nodes[0].backoffInitialMs, 1500);
    assert.equal(info.nodes[2].sleepMs, 60_000);
    assert.deepEqual([info.nodes[3].signal, info.nodes[3].maxWaitMs, info.nodes[4].workflow], ['approve', 5000, 'reports']);
    const [, req, md] = lastCall('registerWorkflow')!;
    assert.equal((req as { nodes: unknown[] }).nodes.length, 5);
    assert.deepEqual(md.get('authorization'), ['Bearer secret']);
  });

  it('submits a run with its options, and enqueues jobs one and many', async () => {
    server.unary.submitRun = () => ({ runId: 'run-7', created: true });
    server.unary.enqueue = (req) => ({ runId: `job-${req.kind}`, stepId: 's', created: true });
    server.unary.enqueueMany = (req) => ({ jobs: req.jobs.map((j: { kind: string }, i: number) => ({ runId: `${j.kind}-${i}`, stepId: '', created: true })) });
    const deadline = new Date('2030-01-01T00:00:00Z');
    assert.equal(await client.submit('etl', { day: '2026-12-01' }, { idempotencyKey: 'k', priority: 3, deadline }), 'run-7');
    const [, submit] = lastCall('submitRun')!;
    assert.deepEqual(plain(submit), {
      workflow: 'etl', version: 0, input: { day: '2026-12-01' }, priority: 3, idempotencyKey: 'k', deadline,
    });
    await client.submit(new Workflow('other').task('a'), undefined, { deadline: 90_000 });
    assert.deepEqual(plain(lastCall('submitRun')![1]), {
      workflow: 'other', version: 0, input: null, priority: 0, idempotencyKey: '', deadlineIn: { seconds: 90, nanos: 0 },
    });
    assert.equal(await client.enqueue('resize', { w: 64 }, { maxAttempts: 5, attemptTimeoutMs: 250 }), 'job-resize');
    const enq = plain(lastCall('enqueue')![1]) as Record<string, unknown>;
    assert.deepEqual([enq.kind, enq.input, enq.maxAttempts, enq.attemptTimeout], ['resize', { w: 64 }, 5, { seconds: 0, nanos: 250_000_000 }]);
    assert.deepEqual(await client.enqueueMany([{ kind: 'a' }, { kind: 'b', input: [1], scheduledAt: 5_000 }]), ['a-0', 'b-1']);
    const many = lastCall('enqueueMany')![1] as { jobs: { scheduledAt?: Date }[] };
    assert.ok(many.jobs[1].scheduledAt instanceof Date && many.jobs[1].scheduledAt.getTime() > Date.now());
    // A value that cannot be sent is refused before any call, naming the job and the path.
    await assert.rejects(client.enqueueMany([{ kind: 'a' }, { kind: 'b', input: { x: [Number.NaN] } }]),
      { name: 'TypeError', message: 'jobs[1].input.x[0]: NaN is not a JSON number' });
  });

  it('throws a typed error per status code, with the server\'s message', async () => {
    server.unary.getRun = (req) => { throw status(grpc.status.NOT_FOUND, `run ${req.runId} not found`); };
    server.unary.resumeRun = () => { throw status(grpc.status.FAILED_PRECONDITION, 'run is running'); };
    server.unary.signal = () => { throw status(grpc.status.INVALID_ARGUMENT, 'name: must not be empty'); };
    await assert.rejects(client.get('nope'), (e: unknown) => e instanceof NotFoundError && e instanceof CycloneClientError
      && e.code === grpc.status.NOT_FOUND && e.codeName === 'NOT_FOUND' && e.details === 'run nope not found'
      && e.message === 'NOT_FOUND: run nope not found');
    await assert.rejects(client.resume('r'), FailedPreconditionError);
    await assert.rejects(client.signal('r', ''), InvalidArgumentError);
  });

  it('fails fast, naming the address, when nothing listens there', async () => {
    const closed = await FakeServer.start();
    closed.stop();
    const lonely = new Client(closed.address);
    try {
      await assert.rejects(lonely.get('r'), (e: unknown) => e instanceof UnavailableError
        && e.details === `cannot reach ${closed.address}: connection refused`);
      const patient = new Client(closed.address, { waitForServerMs: 200 });
      await assert.rejects(patient.get('r'), (e: unknown) => e instanceof UnavailableError
        && e.details === `cannot reach ${closed.address}: no server answered within 200 ms`);
      patient.close();
    } finally {
      lonely.close();
    }
    assert.throws(() => new Client('http://127.0.0.1:7233'), TypeError);
  });

  it('reads runs with their steps in the lifecycle\'s words', async () => {
    server.unary.getRun = () => runMsg({
      state: RunState.RUN_STATE_FAILED,
      steps: [stepMsg('a', StepState.STEP_STATE_COMPLETED, { output: { n: 1 } }),
        stepMsg('b', StepState.STEP_STATE_WAITING_SIGNAL), stepMsg('c', 42 as StepState),
        stepMsg('d', StepState.STEP_STATE_AVAILABLE, { heldBy: 'limit tenants key acme: 1/1 running', limits: ['tenants=acme'] })],
    });
    const run = await client.get('run-1');
    assert.ok(run instanceof Run);
    assert.deepEqual([run.state, run.terminal, run.input], ['failed', true, { day: 1 }]);
    assert.deepEqual(run.steps.map((s) => s.state), ['completed', 'waiting_signal', 'unknown_42', 'available']);
    assert.deepEqual([run.step('d').heldBy, run.step('d').limits], ['limit tenants key acme: 1/1 running', ['tenants=acme']]);
    assert.deepEqual([run.step('a').heldBy, run.step('a').limits], ['', []]);
    assert.deepEqual(run.step('a').output, { n: 1 });
    assert.equal(run.step('b').output, null);
    assert.throws(() => run.step('z'), /has no node "z"/);
  });

  it('waits across WaitRun slices, and result() throws for failed, cancelled and unfinished runs', async () => {
    let waits = 0;
    server.unary.waitRun = (req) => {
      waits += 1;
      if (req.runId === 'slow') return { run: runMsg({ id: 'slow' }), timedOut: true };
      if (req.runId === 'ok' && waits < 2) return { run: runMsg({ id: 'ok' }), timedOut: true };
      const state = { ok: RunState.RUN_STATE_COMPLETED, bad: RunState.RUN_STATE_FAILED, gone: RunState.RUN_STATE_CANCELLED }[
        req.runId as 'ok' | 'bad' | 'gone'];
      return {
        run: runMsg({
          id: req.runId, state, result: state === RunState.RUN_STATE_COMPLETED ? { load: 1 } : undefined,
          steps: state === RunState.RUN_STATE_FAILED ? [stepMsg('load', StepState.STEP_STATE_DISCARDED, {
            errorKind: 'max_attempts', errors: [{ attempt: 1, errorKind: 'max_attempts', message: 'boom', at: undefined, reason: '', details: '' }],
          })] : [],
        }),
        timedOut: false,
      };
    };
    assert.deepEqual(await client.result('ok'), { load: 1 });
    assert.equal(waits, 2);
    await assert.rejects(client.result('bad'), (e: unknown) => e instanceof RunFailed
      && e.message === 'run bad failed (load: max_attempts boom)' && e.run.step('load').errors[0].message === 'boom');
    await assert.rejects(client.result('gone'), RunCancelled);
    await assert.rejects(client.result('slow', { timeoutMs: 50 }), (e: unknown) => e instanceof WaitTimeout
      && e.run.state === 'running');
    const [, req] = lastCall('waitRun')!;
    assert.ok(((req as { timeout: { seconds: number } }).timeout.seconds) <= 1);
  });

  it('ends a wait when its AbortSignal aborts, with the signal\'s reason', async () => {
    server.unary.waitRun = () => new Promise(() => undefined); // never answers
    const abort = new AbortController();
    const waiting = client.wait('r', { signal: abort.signal });
    setTimeout(() => abort.abort(new Error('handler stopped')), 50);
    await assert.rejects(waiting, { message: 'handler stopped' });
  });

  it('steers runs: cancel, pause, resume, retry, retryAll, signal, and lists runs page by page', async () => {
    for (const m of ['cancelRun', 'pauseRun', 'resumeRun', 'retryStep', 'retryAll']) {
      server.unary[m] = (req) => ({ run: runMsg({ id: req.runId }), applied: true });
    }
    server.unary.signal = () => ({ signalId: 'sig-1', consumedByStepId: '' });
    let page = 0;
    server.unary.listRuns = (req) => {
      page += 1;
      return page === 1 ? { runs: [runMsg({ id: 'r1' })], nextPageToken: 'p2' } : { runs: [runMsg({ id: 'r2' })], nextPageToken: '' };
    };
    assert.equal((await client.cancel('c')).id, 'c');
    assert.equal((await client.pause('p')).id, 'p');
    assert.equal((await client.resume('p')).id, 'p');
    assert.equal((await client.retry('x', 'load', { deadline: 60_000 })).id, 'x');
    assert.deepEqual(plain(lastCall('retryStep')![1]), { runId: 'x', node: 'load', deadlineIn: { seconds: 60, nanos: 0 } });
    assert.equal((await client.retryAll('y')).id, 'y');
    assert.equal(await client.signal('r', 'approve', { by: 'ada' }), 'sig-1');
    assert.deepEqual(plain(lastCall('signal')![1]), { runId: 'r', name: 'approve', payload: { by: 'ada' } });
    const runs = await client.list({ states: ['failed', 'running'], workflow: 'etl', limit: 5 });
    assert.deepEqual(runs.map((r) => r.id), ['r1', 'r2']);
    const [, second] = lastCall('listRuns')!;
    assert.deepEqual([(second as { pageToken: string }).pageToken, (second as { states: number[] }).states],
      ['p2', [RunState.RUN_STATE_FAILED, RunState.RUN_STATE_RUNNING]]);
    await assert.rejects(client.list({ states: ['nope' as 'failed'] }), TypeError);
  });

  it('makes a read again when the connection broke under it, once the server has answered', async () => {
    server.unary.getRun = () => runMsg();
    await client.get('r'); // the server is reached
    let calls = 0;
    server.unary.getRun = () => {
      calls += 1;
      if (calls === 1) throw status(grpc.status.UNAVAILABLE, 'connection reset');
      return runMsg({ id: 'again' });
    };
    assert.equal((await client.get('r')).id, 'again');
    assert.equal(calls, 2);
    // A write is not repeated: it may have been applied.
    server.unary.cancelRun = () => { throw status(grpc.status.UNAVAILABLE, 'connection reset'); };
    await assert.rejects(client.cancel('r'), UnavailableError);
    assert.equal(server.calls.filter(([m]) => m === 'cancelRun').length, 1);
  });

  it('reads stats and workers', async () => {
    server.unary.getStats = () => ({ kinds: [{ kind: 'a', available: 2, running: 1, oldestAvailableAge: { seconds: 3, nanos: 0 }, scheduled: 4, workers: 1, freeSlots: 7, noWorkers: false }] });
    server.unary.listWorkers = (req) => ({ workers: [{ workerId: 'w', sdk: 'typescript/0.1.0', kinds: [req.kind], slots: 8, leasesHeld: 1, serverId: 's', connectedSince: undefined, lastHeartbeat: undefined }] });
    assert.deepEqual(await client.stats(), [{ kind: 'a', available: 2, running: 1, scheduled: 4, oldestAvailableAgeMs: 3000, workers: 1, freeSlots: 7, noWorkers: false }]);
    assert.deepEqual((await client.workers('a')).map((w) => [w.workerId, w.kinds]), [['w', ['a']]]);
  });

  it('declares limits on task nodes and jobs, names a use it cannot send, and sets and reads limits', async () => {
    server.unary.registerWorkflow = (req) => ({ created: true, workflow: { name: req.name, version: 1, nodes: req.nodes } });
    server.unary.enqueue = (req) => ({ runId: `job-${req.kind}`, stepId: 's', created: true });
    const wf = new Workflow('sync')
      .task('pull', { limits: [{ limit: 'per-tenant', keyPath: 'input.tenant' }, { limit: 'api', key: 'eu' }] })
      .task('push', { deps: ['pull'] });
    const info = await client.register(wf);
    assert.deepEqual(info.nodes.map((n) => n.limits), [[{ limit: 'per-tenant', keyPath: 'input.tenant' }, { limit: 'api', key: 'eu' }], []]);
    await client.enqueue('email', { tenant: 'acme' }, { limits: [{ limit: 'smtp' }] });
    assert.deepEqual((plain(lastCall('enqueue')![1]) as { limits: unknown }).limits, [{ limit: 'smtp', key: '', keyPath: '' }]);
    assert.throws(() => new Workflow('bad').task('a', { limits: [{ limit: 'x', key: 'k', keyPath: 'tenant' }] }),
      { name: 'TypeError', message: 'node "a": limits[0]: key and keyPath both given; at most one' });
    await assert.rejects(client.enqueueMany([{ kind: 'a' }, { kind: 'b', limits: [{ limit: '' }] }]),
      { name: 'TypeError', message: 'jobs[1].limits[0].limit: "" is not a limit\'s name' });
    server.unary.setLimit = (req) => ({ ...req.limit, keys: [{ key: 'acme', running: 2, waiting: 3, oldestWaitingAge: { seconds: 1, nanos: 500_000_000 }, startsInWindow: 0 }] });
    const set = await client.setLimit({ name: 'per-tenant', maxRunning: 5, kinds: ['sync'], keyPath: 'input.tenant', strategy: 'cancel_newest', weights: { acme: 3 } });
    const sent = (plain(lastCall('setLimit')![1]) as { limit: Record<string, unknown> }).limit;
    assert.deepEqual([sent.name, sent.maxRunning, sent.rate, sent.kinds, sent.keyPath, sent.weights], ['per-tenant', 5, 0, ['sync'], 'input.tenant', { acme: 3 }]);
    assert.deepEqual([set.maxRunning, set.rate, set.strategy, set.scope, set.keys], [5, undefined, 'cancel_newest', 'steps',
      [{ key: 'acme', running: 2, waiting: 3, oldestWaitingAgeMs: 1500, startsInWindow: 0 }]]);
    await assert.rejects(client.setLimit({ name: 'x', strategy: 'drop' as 'queue' }),
      { name: 'TypeError', message: 'limit.strategy: "drop" is not one of queue, cancel_newest, cancel_oldest, keep_newest' });
    await assert.rejects(client.setLimit({ name: 'x', maxRunning: 1.5 }), { name: 'TypeError', message: 'limit.maxRunning: 1.5 is not a 32-bit integer' });
    await assert.rejects(client.setLimit({ name: 7 } as unknown as { name: string }), { name: 'TypeError', message: 'limit.name: 7 is not a string' });
    // An empty key is no key: the key path is the one given.
    new Workflow('ok').task('a', { limits: [{ limit: 'x', key: '', keyPath: 'tenant' }] });
    server.unary.listLimits = () => ({ limits: [{ name: 'a', maxRunning: 0, rate: 10, period: { seconds: 60, nanos: 0 }, strategy: 0, scope: 2, kinds: [], workflows: ['w'], key: '', keyPath: '', weights: {}, keys: [] }] });
    const [a] = await client.listLimits();
    assert.deepEqual([a.name, a.maxRunning, a.rate, a.periodMs, a.scope, a.workflows], ['a', undefined, 10, 60_000, 'runs', ['w']]);
    server.unary.deleteLimit = () => { throw status(grpc.status.NOT_FOUND, 'limit "gone" not found'); };
    await assert.rejects(client.deleteLimit('gone'), NotFoundError);
  });
});
