// A demo worker on the TypeScript SDK (cyclone-workflows) whose behaviour per step kind is
// scripted on the command line, so that tests can make it succeed, fail, snooze, wait for a
// Stop, hang until killed, or start runs and send signals from a handler.
//
//   node dist/demo.js --address 127.0.0.1:7233 --slots 2 --marker-dir /tmp/m \
//     --kind extract=succeed --kind flaky=fail:2 --kind polite=faildelay:2:1500 \
//     --kind broken=permanent --kind later=snooze:0.5 --kind slow=block --kind nap=sleep:2 \
//     --kind stuck=hang --kind traced=trace --kind spawn=submit:child-wf --kind ping=signal:go

import * as fs from 'node:fs';
import * as path from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';

import {
  Client, type Context, type Handler, type Json, Permanent, RetryAfter, Snooze, Worker,
} from 'cyclone-workflows';

const LANG = 'node';

interface Args {
  address: string;
  workerId: string;
  slots: number;
  markerDir: string;
  token: string | undefined;
  kinds: string[];
}

/** The output of a succeeding step: derived from the run input and the parents' outputs. */
export function derive(ctx: Context, worker: string): Json {
  // value: the run input's "value" for a root node, else the sum of the parents' values; plus one.
  const parents = Object.entries(ctx.parents);
  let base = 0;
  const from: { [node: string]: Json } = {};
  if (parents.length === 0) {
    const input = ctx.input;
    if (input && typeof input === 'object' && !Array.isArray(input) && typeof input.value === 'number') base = input.value;
  }
  for (const [node, out] of parents) {
    const o = out && typeof out === 'object' && !Array.isArray(out) ? out : {};
    base += typeof o.value === 'number' ? o.value : 0;
    from[node] = typeof o.lang === 'string' ? o.lang : null;
  }
  return { lang: LANG, worker, node: ctx.node, attempt: ctx.attempt, value: base + 1, from };
}

function explode(node: string): never {
  throw new TypeError(`demo explosion in ${node}`);
}

function behaviour(spec: string, args: Args, client: () => Client): Handler {
  const [name, ...params] = spec.split(':');
  const worker = args.workerId;
  const marker = (ctx: Context, suffix: string, text: string) =>
    fs.writeFileSync(path.join(args.markerDir, `${ctx.stepId}.${suffix}`), text);
  switch (name) {
    case 'succeed':
      return (ctx) => derive(ctx, worker);
    case 'fail': {
      // Fails attempts 1..N with a retry delay of 100 ms, then succeeds.
      const times = Number(params[0] ?? '1');
      return (ctx) => {
        if (ctx.attempt <= times) throw new RetryAfter(100, `planned failure ${ctx.attempt} of ${times}`);
        return derive(ctx, worker);
      };
    }
    case 'faildelay': {
      // Fails attempts 1..N asking for a retry delay of MS milliseconds, then succeeds.
      const times = Number(params[0] ?? '1');
      const delayMs = Number(params[1] ?? '1000');
      return (ctx) => {
        if (ctx.attempt <= times) {
          throw new RetryAfter(delayMs, `planned failure ${ctx.attempt} of ${times}, retry in ${delayMs} ms`);
        }
        return derive(ctx, worker);
      };
    }
    case 'permanent':
      return (ctx) => {
        throw new Permanent(`planned permanent failure of ${ctx.node}`);
      };
    case 'panic':
      // A TypeError thrown two calls deep: its stack goes to the server as Failed.details.
      return (ctx) => explode(ctx.node);
    case 'snooze': {
      // Snoozes S seconds the first time it sees the step (the lease counts its snoozes).
      const delayMs = Number(params[0] ?? '0.5') * 1000;
      return (ctx) => {
        if (ctx.snoozes === 0) throw new Snooze(delayMs);
        return derive(ctx, worker);
      };
    }
    case 'block':
      // Waits for its abort signal, then writes the Stop reason.
      return (ctx) => {
        marker(ctx, 'started', worker);
        return new Promise((_resolve, reject) => {
          ctx.signal.addEventListener('abort', () => {
            marker(ctx, 'stopped', ctx.cancelReason);
            reject(ctx.signal.reason);
          }, { once: true });
        });
      };
    case 'sleep': {
      // Succeeds after S seconds, even across a lost stream; marks when it is done.
      const ms = Number(params[0] ?? '1') * 1000;
      return async (ctx) => {
        marker(ctx, 'started', worker);
        await sleep(ms, undefined, { signal: ctx.signal });
        marker(ctx, 'done', worker);
        return derive(ctx, worker);
      };
    }
    case 'big': {
      // {"blob": "xxx..."} of BYTES characters: over the server's limit, only its size is sent.
      const bytes = Number(params[0] ?? '2000000');
      return () => ({ blob: 'x'.repeat(bytes) });
    }
    case 'trace':
      // The trace context the handler got, as the SDK parsed it from the lease.
      return (ctx) => {
        const t = ctx.trace;
        return t
          ? { lang: LANG, traceparent: t.traceparent, tracestate: t.tracestate, trace_id: t.traceId, span_id: t.spanId, sampled: t.sampled }
          : { lang: LANG, traceparent: '' };
      };
    case 'hang':
      // Never returns, ignoring Stop (to be killed).
      return (ctx) => {
        marker(ctx, 'started', worker);
        return new Promise(() => undefined);
      };
    case 'submit': {
      // Starts a run of the registered workflow WORKFLOW, waits for it, returns its result.
      const workflow = params.join(':');
      if (!workflow) throw new Error('submit wants submit:WORKFLOW');
      return async (ctx) => {
        const runId = await client().submit(workflow, { parent_step: ctx.stepId });
        const result = await client().result(runId, { signal: ctx.signal });
        return { lang: LANG, child_run: runId, child_result: result };
      };
    }
    case 'signal': {
      // Sends the signal NAME to the handler's own run, then succeeds.
      const signal = params.join(':');
      if (!signal) throw new Error('signal wants signal:NAME');
      return async (ctx) => {
        await client().signal(ctx.runId, signal, { from: LANG, step: ctx.stepId });
        return derive(ctx, worker);
      };
    }
    default:
      throw new Error(`unknown behaviour ${JSON.stringify(spec)}: succeed, fail:N, faildelay:N:MS, permanent, panic, `
        + 'snooze:SECONDS, block, sleep:SECONDS, big:BYTES, trace, hang, submit:WORKFLOW or signal:NAME');
  }
}

function parseArgs(argv: string[]): Args {
  const out: Args = {
    address: process.env.CYCLONE_ADDRESS ?? '127.0.0.1:7233',
    workerId: process.env.CYCLONE_WORKER_ID ?? `node-demo-${process.pid}`,
    slots: 1,
    markerDir: process.env.CYCLONE_MARKER_DIR ?? '.',
    token: process.env.CYCLONE_TOKEN || undefined,
    kinds: (process.env.CYCLONE_KINDS ?? '').split(',').filter(Boolean),
  };
  for (let i = 0; i < argv.length; i += 2) {
    const [flag, value] = [argv[i], argv[i + 1]];
    if (value === undefined) throw new Error(`${flag} needs a value`);
    if (flag === '--address') out.address = value;
    else if (flag === '--worker-id') out.workerId = value;
    else if (flag === '--slots') out.slots = Number(value);
    else if (flag === '--marker-dir') out.markerDir = value;
    else if (flag === '--token') out.token = value;
    else if (flag === '--kind') out.kinds.push(value);
    else throw new Error(`unknown flag ${flag}`);
  }
  if (out.kinds.length === 0) throw new Error('give at least one --kind NAME=BEHAVIOUR');
  return out;
}

async function main(): Promise<void> {
  const args = parseArgs(process.argv.slice(2));
  let client: Client | undefined;
  const getClient = () => (client ??= new Client(args.address, { token: args.token }));
  const worker = new Worker(args.address, {
    slots: args.slots, workerId: args.workerId, token: args.token, graceMs: 10_000, signals: [],
  });
  for (const spec of args.kinds) {
    const eq = spec.indexOf('=');
    if (eq < 1) throw new Error(`--kind wants NAME=BEHAVIOUR, got ${JSON.stringify(spec)}`);
    worker.handle(spec.slice(0, eq), behaviour(spec.slice(eq + 1), args, getClient));
  }
  const say = (line: string) => process.stderr.write(`${line}\n`);
  worker.on('welcome', ({ serverId, lost }) => say(`welcome from ${serverId}; ${lost} held lease(s) lost`));
  worker.on('lease', (ctx) => say(`lease ${ctx.node} ${ctx.stepId}/${ctx.leaseGeneration} attempt ${ctx.attempt} `
    + `trace ${ctx.trace ? `${ctx.trace.traceId}/${ctx.trace.spanId}` : '-'}`));
  worker.on('ack', (ctx, status, detail) => say(`ack ${ctx.node} ${ctx.stepId}/${ctx.leaseGeneration} ${status} ${detail}`));
  worker.on('stop', (ctx, reason) => say(`stop ${ctx.node} ${ctx.stepId}/${ctx.leaseGeneration} ${reason}`));
  for (const sig of ['SIGTERM', 'SIGINT'] as const) {
    process.on(sig, () => {
      say(`${sig}: draining`);
      void worker.stop();
    });
  }
  await worker.run();
  client?.close();
}

main().then(() => process.exit(0), (err: unknown) => {
  process.stderr.write(`demo worker: ${err instanceof Error ? err.message : String(err)}\n`);
  process.exit(1);
});
