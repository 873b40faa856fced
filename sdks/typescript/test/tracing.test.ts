// OpenTelemetry with a tracer provider and a context manager, as an application sets them up:
// the handler's span is a child of the lease's trace context, and runs it submits join it.
// (A file of its own: node --test runs each file in its own process, and these are global.)

import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';

import { ROOT_CONTEXT, SpanKind, SpanStatusCode, context, trace } from '@opentelemetry/api';
import { AsyncLocalStorageContextManager } from '@opentelemetry/context-async-hooks';
import { BasicTracerProvider, InMemorySpanExporter, SimpleSpanProcessor } from '@opentelemetry/sdk-trace-base';

import { Client, Worker } from '../src/index.js';
import { type Run as RunMsg, RunState } from '../src/gen/cyclone/v1/types.js';
import { FakeServer, memoryLogger, until } from './helpers.js';

const exporter = new InMemorySpanExporter();
let server: FakeServer;

before(async () => {
  context.setGlobalContextManager(new AsyncLocalStorageContextManager().enable());
  trace.setGlobalTracerProvider(new BasicTracerProvider({ spanProcessors: [new SimpleSpanProcessor(exporter)] }));
  server = await FakeServer.start();
  server.unary.getRun = () => ({
    id: 'child', workflow: '', workflowVersion: 0, state: RunState.RUN_STATE_RUNNING, input: null, result: undefined,
    priority: 0, idempotencyKey: '', deadline: undefined, parentRunId: '', parentStepId: '', createdAt: undefined,
    updatedAt: undefined, finishedAt: undefined, steps: [], scheduleName: '', scheduleFireAt: undefined,
  } satisfies RunMsg);
});
after(() => server.stop());

const TRACE_ID = '0af7651916cd43dd8448eb211c80319c';
const PARENT = 'b7ad6b7169203331';

describe('tracing with OpenTelemetry', () => {
  it('runs each handler in a "handle {kind}" span, a child of the lease\'s context; its client calls carry that span', async () => {
    const client = new Client(server.address);
    let inHandler = '';
    const worker = new Worker(server.address, { signals: [], logger: memoryLogger() })
      .handle('traced', async (ctx) => {
        inHandler = trace.getSpanContext(context.active())?.spanId ?? '';
        await client.get('child'); // as a handler that reads or starts runs does
        return ctx.trace?.traceId;
      })
      .handle('broken', () => { throw new Error('no luck'); });
    const running = worker.run();
    const stream = await server.nextStream();
    stream.welcome();
    const traceContext = { traceparent: `00-${TRACE_ID}-${PARENT}-01`, tracestate: 'congo=t61rcWkgMzE' };
    const [lease] = stream.lease({ kind: 'traced', node: 'n', attempt: 2, leaseGeneration: 5, traceContext });
    const [result] = await stream.results();
    assert.equal(result.completed?.output, TRACE_ID);
    stream.lease({ kind: 'broken', traceContext });
    await stream.results();
    await worker.stop();
    await running;
    client.close();

    const [handled, failed] = await until(() => {
      const spans = exporter.getFinishedSpans();
      return spans.length >= 2 ? spans : null;
    }, 'two spans');
    assert.equal(handled.name, 'handle traced');
    assert.equal(handled.kind, SpanKind.CONSUMER);
    assert.equal(handled.spanContext().traceId, TRACE_ID);
    assert.equal(handled.parentSpanContext?.spanId, PARENT);
    assert.equal(handled.spanContext().spanId, inHandler); // current while the handler ran
    assert.deepEqual(handled.attributes, {
      'cyclone.run_id': 'run-1', 'cyclone.step_id': lease.stepId, 'cyclone.node': 'n', 'cyclone.kind': 'traced',
      'cyclone.attempt': 2, 'cyclone.lease_generation': 5, 'cyclone.outcome': 'completed',
    });
    assert.equal(failed.name, 'handle broken');
    assert.equal(failed.attributes['cyclone.outcome'], 'failed');
    assert.deepEqual(failed.status, { code: SpanStatusCode.ERROR, message: 'Error: no luck' });
    // The handler's GetRun carried the handler span's context, and the lease's trace state.
    const [, , metadata] = server.calls.find(([m]) => m === 'getRun')!;
    assert.deepEqual(metadata.get('traceparent'), [`00-${TRACE_ID}-${inHandler}-01`]);
    assert.deepEqual(metadata.get('tracestate'), ['congo=t61rcWkgMzE']);
  });

  it('sends the current span\'s context with client calls made outside handlers', async () => {
    const client = new Client(server.address);
    const span = trace.getTracer('test').startSpan('request', {}, ROOT_CONTEXT);
    await context.with(trace.setSpan(ROOT_CONTEXT, span), () => client.get('child'));
    span.end();
    await client.get('child'); // no span: no traceparent
    client.close();
    const calls = server.calls.filter(([m]) => m === 'getRun').slice(-2);
    assert.deepEqual(calls[0][2].get('traceparent'), [`00-${span.spanContext().traceId}-${span.spanContext().spanId}-01`]);
    assert.deepEqual(calls[1][2].get('traceparent'), []);
  });
});
