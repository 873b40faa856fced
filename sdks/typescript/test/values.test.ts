// JSON checks and measures, outcomes of what handlers throw, errors, the workflow builder, the package.

import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { describe, it } from 'node:test';

import * as grpc from '@grpc/grpc-js';

import * as sdk from '../src/index.js';
import {
  AlreadyExistsError, CycloneClientError, HandlerError, NotFoundError, Permanent, RetryAfter, Snooze, Workflow,
  jsonSize, toJson,
} from '../src/index.js';
import { clientError } from '../src/errors.js';
import { NodeType, OnDepFailure } from '../src/gen/cyclone/v1/types.js';
import { cutUtf8, pythonNumber, toDuration } from '../src/json.js';
import { completedOutcome, outcomeOf } from '../src/leases.js';
import { parseTraceparent } from '../src/tracing.js';
import { plain } from './helpers.js';

describe('toJson', () => {
  it('keeps JSON data, applies toJSON, and drops undefined members as JSON.stringify does', () => {
    const at = new Date('2026-12-01T10:00:00Z');
    assert.deepEqual(toJson({ a: [1, 'x', true, null, undefined], b: undefined, at, nested: { z: -0.5 } }),
      { a: [1, 'x', true, null, null], at: '2026-12-01T10:00:00.000Z', nested: { z: -0.5 } });
    assert.equal(toJson(undefined), null);
  });

  it('refuses what JSON cannot hold, naming the path', () => {
    const cyclic: Record<string, unknown> = { a: 1 };
    cyclic.self = cyclic;
    for (const [value, message] of [
      [{ items: [1, Number.NaN] }, 'output.items[1]: NaN is not a JSON number'],
      [{ big: 10n }, 'output.big: a bigint is not JSON (use objects, arrays, strings, numbers, booleans or null)'],
      [{ f: () => 1 }, 'output.f: a function is not JSON'],
      [{ inf: -Infinity }, 'output.inf: -Infinity is not a JSON number'],
      [cyclic, 'output.self: a circular reference is not JSON'],
      [{ m: new Map() }, 'output.m: a Map is not JSON (convert it to an array or object)'],
    ] as const) {
      assert.throws(() => toJson(value, 'output'), { name: 'TypeError', message });
    }
    // The same object twice, side by side, is no cycle.
    const shared = { n: 1 };
    assert.deepEqual(toJson([shared, shared]), [{ n: 1 }, { n: 1 }]);
  });
});

describe('jsonSize', () => {
  it('is the UTF-8 size of compact JSON for strings, objects and arrays', () => {
    for (const value of [
      {}, [], '', 'é', '日本', '😀', 'a"b\\c', 'line\nbreak\ttab\u0001\u001f\u007f', '<>&\u2028',
      { key: ['v', 1, true, null, { deep: [[], {}] }] }, [1, 2, 3], { 'ké': 'vé' },
    ]) {
      assert.equal(jsonSize(value as sdk.Json), Buffer.byteLength(JSON.stringify(value)), JSON.stringify(value));
    }
  });

  it('counts a lone surrogate as the U+FFFD it crosses the wire as', () => {
    assert.equal(jsonSize('\ud800'), 2 + 3);
    assert.equal(jsonSize({ ['\udc00']: 'x' }), 2 + 5 + 1 + 3);
  });

  it('writes numbers as the server\'s Python json module does', () => {
    // From Python: json.dumps(int(x) if x.is_integer() and abs(x) <= 2**53 else x)
    const table: [number, string][] = [
      [1e-7, '1e-07'], [0.0001, '0.0001'], [0.00001, '1e-05'], [1e16, '1e+16'], [1.5e16, '1.5e+16'],
      [9007199254740994, '9007199254740994.0'], [2 ** 53, '9007199254740992'], [0.1, '0.1'],
      [1 / 3, '0.3333333333333333'], [-2.5e-300, '-2.5e-300'], [1e21, '1e+21'], [123456789012345.67, '123456789012345.67'],
      [1.7976931348623157e308, '1.7976931348623157e+308'], [5e-324, '5e-324'], [-0, '0'], [12345.678, '12345.678'],
      [1e15 + 0.5, '1000000000000000.5'], [41, '41'], [-7, '-7'],
    ];
    for (const [n, text] of table) {
      assert.equal(pythonNumber(n), text, String(n));
      assert.equal(jsonSize(n), text.length);
    }
  });
});

describe('cutUtf8', () => {
  it('keeps text within the limit, and cuts longer text at a character boundary with a marker', () => {
    assert.equal(cutUtf8('short', 100), 'short');
    const long = 'é'.repeat(100); // 200 bytes
    const cut = cutUtf8(long, 64);
    assert.ok(Buffer.byteLength(cut) <= 64, cut);
    assert.match(cut, /^é+\.\.\. \[cut at \d+ of 200 bytes\]$/);
    assert.ok(!cut.includes('\ufffd'));
  });
});

describe('outcomes', () => {
  it('completes with the output, or only its size when it is over the limit', () => {
    assert.deepEqual(plain(completedOutcome({ a: 1 }, 100)), { completed: { output: { a: 1 }, oversizedOutputBytes: 0 } });
    assert.deepEqual(plain(completedOutcome('x'.repeat(100), 100)), { completed: { oversizedOutputBytes: 102 } });
    assert.deepEqual(plain(completedOutcome(undefined, 100)), { completed: { output: null, oversizedOutputBytes: 0 } });
  });

  it('maps what a handler throws', () => {
    assert.deepEqual(plain(outcomeOf(new Snooze(1500))), { snoozed: { delay: { seconds: 1, nanos: 500_000_000 } } });
    const retry = outcomeOf(new RetryAfter(250, 'later')).failed!;
    assert.deepEqual([retry.message, retry.permanent, retry.retryDelay], ['later', false, { seconds: 0, nanos: 250_000_000 }]);
    const perm = outcomeOf(new HandlerError('no', { permanent: true, retryDelayMs: 5 })).failed!;
    assert.deepEqual([perm.permanent, perm.retryDelay], [true, undefined]);
    assert.equal(outcomeOf(new Permanent(new RangeError('bad'))).failed!.message, 'RangeError: bad');
    assert.equal(outcomeOf('a string').failed!.message, 'a string');
    assert.equal(outcomeOf('a string').failed!.details, '');
    const chained = outcomeOf(new Error('outer', { cause: new TypeError('inner') })).failed!;
    assert.equal(chained.message, 'Error: outer');
    assert.match(chained.details, /^Error: outer\n {4}at [\s\S]*\nCaused by: TypeError: inner\n {4}at /);
  });

  it('cuts a failure\'s message at 64 KiB and its details at 16 KiB, as the server stores them', () => {
    const err = new Error('m'.repeat(100_000));
    err.stack = 's'.repeat(50_000);
    const failed = outcomeOf(err).failed!;
    assert.ok(Buffer.byteLength(failed.message) <= 64 * 1024);
    assert.match(failed.message, /\.\.\. \[cut at \d+ of 100007 bytes\]$/);
    assert.ok(Buffer.byteLength(failed.details) <= 16 * 1024);
    assert.match(failed.details, /\.\.\. \[cut at \d+ of 50000 bytes\]$/);
  });

  it('refuses delays out of range', () => {
    assert.throws(() => new Snooze(-1), RangeError);
    assert.throws(() => new RetryAfter(Number.NaN), RangeError);
    assert.throws(() => new Snooze(101 * 365 * 24 * 3600 * 1000), RangeError);
    assert.throws(() => toDuration(-5, 'sleep'), { message: 'sleep: -5 is not a duration in milliseconds >= 0' });
  });
});

describe('errors', () => {
  it('has one class per status code, all CycloneClientErrors', () => {
    const e = clientError(grpc.status.NOT_FOUND, 'no run');
    assert.ok(e instanceof NotFoundError && e instanceof CycloneClientError && e instanceof sdk.CycloneError);
    assert.deepEqual([e.name, e.code, e.codeName, e.details], ['NotFoundError', 5, 'NOT_FOUND', 'no run']);
    assert.ok(clientError(grpc.status.ALREADY_EXISTS, '') instanceof AlreadyExistsError);
    const other = clientError(grpc.status.DATA_LOSS, 'x');
    assert.equal(other.constructor, CycloneClientError);
  });
});

describe('parseTraceparent', () => {
  it('parses a W3C traceparent and treats a malformed one as absent', () => {
    assert.deepEqual(parseTraceparent('00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00', 'a=b'), {
      traceparent: '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00', tracestate: 'a=b',
      traceId: '0af7651916cd43dd8448eb211c80319c', spanId: 'b7ad6b7169203331', sampled: false,
    });
    for (const bad of ['', 'nope', '00-00000000000000000000000000000000-b7ad6b7169203331-01',
      '00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01', 'ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01',
      '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-extra', '00-0AF7651916CD43DD8448EB211C80319C-b7ad6b7169203331-01']) {
      assert.equal(parseTraceparent(bad), undefined, bad);
    }
  });
});

describe('Workflow', () => {
  it('builds the RegisterWorkflow request', () => {
    const wf = new Workflow('w')
      .task('a', { maxAttempts: 3, attemptTimeoutMs: 1_500, retentionMs: 86_400_000 })
      .task('b', { deps: ['a'], kind: 'shared', onDepFailure: 'cancel_branch', priority: -1, maxReclaims: 0 })
      .child('c', new Workflow('sub'), { deps: ['b'], maxWaitMs: 10 })
      .sleep('d', 250, { deps: ['c'] })
      .signal('e', { name: 'go', deps: ['d'] })
      .task('f', { kind: 'shared' });
    assert.deepEqual(wf.nodes, ['a', 'b', 'c', 'd', 'e', 'f']);
    assert.deepEqual(wf.kinds, ['a', 'shared']);
    const req = wf.toRequest();
    const [a, b, c, d, e] = req.nodes.map(plain);
    assert.deepEqual(a, { id: 'a', kind: '', deps: [], type: NodeType.NODE_TYPE_TASK, maxAttempts: 3,
      attemptTimeout: { seconds: 1, nanos: 500_000_000 }, onDepFailure: OnDepFailure.ON_DEP_FAILURE_UNSPECIFIED,
      retention: { seconds: 86400, nanos: 0 }, signal: '', workflow: '', limits: [] });
    assert.deepEqual([b.kind, b.deps, b.onDepFailure, b.priority, b.maxReclaims],
      ['shared', ['a'], OnDepFailure.ON_DEP_FAILURE_CANCEL_BRANCH, -1, 0]);
    assert.deepEqual([c.type, c.workflow, c.maxWait], [NodeType.NODE_TYPE_CHILD, 'sub', { seconds: 0, nanos: 10_000_000 }]);
    assert.deepEqual([d.type, d.sleep], [NodeType.NODE_TYPE_SLEEP, { seconds: 0, nanos: 250_000_000 }]);
    assert.deepEqual([e.type, e.signal], [NodeType.NODE_TYPE_SIGNAL, 'go']);
  });

  it('refuses duplicate ids, bad options and negative durations', () => {
    assert.throws(() => new Workflow('w').task('a').task('a'), /duplicate node id/);
    assert.throws(() => new Workflow('w').task(''), TypeError);
    assert.throws(() => new Workflow('w').task('a', { onDepFailure: 'nope' as 'fail_run' }), /is not "fail_run" or "cancel_branch"/);
    assert.throws(() => new Workflow('w').sleep('s', -1), { message: 'node "s": sleep: -1 is not a duration in milliseconds >= 0' });
    assert.throws(() => new Workflow(''), TypeError);
  });
});

describe('the package', () => {
  it('has the version of package.json, and exports what the docs use', () => {
    const pkg = JSON.parse(readFileSync(new URL('../../package.json', import.meta.url), 'utf8'));
    assert.equal(sdk.VERSION, pkg.version);
    for (const name of ['Worker', 'Client', 'Workflow', 'Context', 'HandlerError', 'Permanent', 'RetryAfter', 'Snooze',
      'Stopped', 'CycloneClientError', 'NotFoundError', 'FailedPreconditionError', 'UnavailableError', 'RunFailed',
      'RunCancelled', 'WaitTimeout', 'jsonLogger', 'currentStep', 'parseTraceparent', 'Run']) {
      assert.ok(name in sdk, name);
    }
  });
});
