// Without a tracer provider or context manager (OpenTelemetry's API alone, or nothing): the
// handler still sees the lease's trace context, and the runs it submits still join that trace.

import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';

import { Client, Worker } from '../src/index.js';
import { FakeServer, memoryLogger } from './helpers.js';

let server: FakeServer;

before(async () => {
  server = await FakeServer.start();
  server.unary.submitRun = () => ({ runId: 'child-run', created: true });
});
after(() => server.stop());

describe('tracing without an OpenTelemetry setup', () => {
  it('passes the lease\'s traceparent on with the calls a handler makes', async () => {
    const client = new Client(server.address);
    const worker = new Worker(server.address, { signals: [], logger: memoryLogger() })
      .handle('spawn', (ctx) => client.submit('child', { parent_step: ctx.stepId }));
    const running = worker.run();
    const stream = await server.nextStream();
    stream.welcome();
    const traceparent = '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01';
    stream.lease({ kind: 'spawn', traceContext: { traceparent, tracestate: '' } });
    const [result] = await stream.results();
    assert.equal(result.completed?.output, 'child-run');
    await client.submit('outside'); // not in a handler: no trace context
    await worker.stop();
    await running;
    client.close();
    const [inside, outside] = server.calls.filter(([m]) => m === 'submitRun');
    assert.deepEqual(inside[2].get('traceparent'), [traceparent]);
    assert.deepEqual(inside[2].get('tracestate'), []);
    assert.deepEqual(outside[2].get('traceparent'), []);
  });
});

describe('without @opentelemetry/api', () => {
  it('runs handlers untraced, and still passes the lease\'s context on', async () => {
    const { execFileSync } = await import('node:child_process');
    const { fileURLToPath } = await import('node:url');
    // A resolve hook that hides the package, as in an application that does not install it.
    const hook = `data:text/javascript,${encodeURIComponent(`
      export async function resolve(specifier, context, next) {
        if (specifier === '@opentelemetry/api') throw Object.assign(new Error('not installed'), { code: 'ERR_MODULE_NOT_FOUND' });
        return next(specifier, context);
      }`)}`;
    const tracing = new URL('../src/tracing.js', import.meta.url).href;
    const script = `
      import { register } from 'node:module';
      register(${JSON.stringify(hook)});
      const t = await import(${JSON.stringify(tracing)});
      const api = await t.loadOtel();
      const trace = t.parseTraceparent('00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01');
      let inside;
      await t.traced({ runId: 'r', stepId: 's', node: 'n', kind: 'k', attempt: 1, leaseGeneration: 1, trace },
        async () => { inside = t.traceMetadata(); }, () => ({ outcome: 'completed', error: '' }));
      console.log(JSON.stringify({ api, inside, outside: t.traceMetadata() }));`;
    const out = execFileSync(process.execPath, ['--input-type=module', '-e', script], {
      cwd: fileURLToPath(new URL('.', import.meta.url)), encoding: 'utf8',
    });
    assert.deepEqual(JSON.parse(out), {
      api: null, inside: [['traceparent', '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01']], outside: [],
    });
  });
});
