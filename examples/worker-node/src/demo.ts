// A demo worker whose behaviour per step kind is scripted on the command line, so that
// tests can make it succeed, fail, snooze, wait for a Stop, or hang until killed.
//
//   node dist/demo.js --address 127.0.0.1:7233 --slots 2 --marker-dir /tmp/m \
//     --kind extract=succeed --kind flaky=fail:2 --kind broken=permanent \
//     --kind later=snooze:0.5 --kind slow=block --kind nap=sleep:2 --kind stuck=hang \
//     --kind traced=trace

import * as fs from 'node:fs';
import * as path from 'node:path';
import { Handler, Json, Lease, Permanent, Retry, Snooze, Stopped, Worker } from './worker';

const LANG = 'node';

/** The output of a succeeding step: derived from the run input and the parents' outputs. */
export function derive(lease: Lease, worker: string): Json {
  // value: the run input's "value" for a root node, else the sum of the parents' values; plus one.
  const parents = Object.entries(lease.parents);
  let base = 0;
  const from: { [node: string]: Json } = {};
  if (parents.length === 0) {
    const input = lease.input;
    if (input && typeof input === 'object' && !Array.isArray(input) && typeof input.value === 'number') base = input.value;
  }
  for (const [node, out] of parents) {
    const o = out && typeof out === 'object' && !Array.isArray(out) ? out : {};
    base += typeof o.value === 'number' ? o.value : 0;
    from[node] = typeof o.lang === 'string' ? o.lang : null;
  }
  return { lang: LANG, worker, node: lease.node, attempt: lease.attempt, value: base + 1, from };
}

function explode(node: string): never {
  throw new TypeError(`demo explosion in ${node}`);
}

function behaviour(spec: string, markerDir: string, worker: string): Handler {
  const [name, arg] = spec.split(':', 2);
  switch (name) {
    case 'succeed':
      return (lease) => derive(lease, worker);
    case 'fail': {
      const times = Number(arg ?? '1');
      return (lease) => {
        if (lease.attempt <= times) throw new Retry(`planned failure ${lease.attempt} of ${times}`, 100);
        return derive(lease, worker);
      };
    }
    case 'permanent':
      return (lease) => {
        throw new Permanent(`planned permanent failure of ${lease.node}`);
      };
    case 'panic':
      // A plain Error thrown two calls deep: its stack goes to the server as Failed.details.
      return (lease) => explode(lease.node);
    case 'snooze': {
      // Lease carries no snooze count, so this process remembers which steps it snoozed.
      const snoozed = new Set<string>();
      const delayMs = Number(arg ?? '0.5') * 1000;
      return (lease) => {
        if (!snoozed.has(lease.stepId)) {
          snoozed.add(lease.stepId);
          throw new Snooze(delayMs);
        }
        return derive(lease, worker);
      };
    }
    case 'block':
      return (lease, signal) => {
        fs.writeFileSync(path.join(markerDir, `${lease.stepId}.started`), worker);
        return new Promise((_resolve, reject) => {
          signal.addEventListener('abort', () => {
            const reason = signal.reason instanceof Stopped ? signal.reason.reason : String(signal.reason);
            fs.writeFileSync(path.join(markerDir, `${lease.stepId}.stopped`), reason);
            reject(signal.reason);
          });
        });
      };
    case 'sleep': {
      // Succeeds after a while, even across a lost stream; marks when it is done.
      const ms = Number(arg ?? '1') * 1000;
      return async (lease, signal) => {
        fs.writeFileSync(path.join(markerDir, `${lease.stepId}.started`), worker);
        await new Promise<void>((resolve, reject) => {
          const t = setTimeout(resolve, ms);
          signal.addEventListener('abort', () => { clearTimeout(t); reject(signal.reason); });
        });
        fs.writeFileSync(path.join(markerDir, `${lease.stepId}.done`), worker);
        return derive(lease, worker);
      };
    }
    case 'big': {
      // Returns {"blob": "xxx..."} of BYTES characters: over the server's payload limit,
      // the worker sends only its size and the step is discarded (output_too_large).
      const bytes = Number(arg ?? '2000000');
      return () => ({ blob: 'x'.repeat(bytes) });
    }
    case 'trace':
      // Returns the trace context the handler got, as parsed from the lease.
      return (lease) => {
        const t = lease.trace;
        return t
          ? { lang: LANG, traceparent: t.traceparent, tracestate: t.tracestate, trace_id: t.traceId, span_id: t.spanId, sampled: t.sampled }
          : { lang: LANG, traceparent: '' };
      };
    case 'hang':
      return (lease) => {
        fs.writeFileSync(path.join(markerDir, `${lease.stepId}.started`), worker);
        return new Promise(() => undefined);
      };
    default:
      throw new Error(`unknown behaviour ${JSON.stringify(spec)}: succeed, fail:N, permanent, panic, snooze:SECONDS, block, sleep:SECONDS, big:BYTES, trace or hang`);
  }
}

function parseArgs(argv: string[]): { address: string; workerId?: string; slots: number; markerDir: string; kinds: string[] } {
  const out = {
    address: process.env.CYCLONE_ADDRESS ?? '127.0.0.1:7233',
    workerId: process.env.CYCLONE_WORKER_ID as string | undefined,
    slots: 1,
    markerDir: process.env.CYCLONE_MARKER_DIR ?? '.',
    kinds: (process.env.CYCLONE_KINDS ?? '').split(',').filter(Boolean),
  };
  for (let i = 0; i < argv.length; i += 2) {
    const [flag, value] = [argv[i], argv[i + 1]];
    if (value === undefined) throw new Error(`${flag} needs a value`);
    if (flag === '--address') out.address = value;
    else if (flag === '--worker-id') out.workerId = value;
    else if (flag === '--slots') out.slots = Number(value);
    else if (flag === '--marker-dir') out.markerDir = value;
    else if (flag === '--kind') out.kinds.push(value);
    else throw new Error(`unknown flag ${flag}`);
  }
  if (out.kinds.length === 0) throw new Error('give at least one --kind NAME=BEHAVIOUR');
  return out;
}

async function main(): Promise<void> {
  const args = parseArgs(process.argv.slice(2));
  const handlers: Record<string, Handler> = {};
  const workerId = args.workerId ?? `node-demo-${process.pid}`;
  for (const spec of args.kinds) {
    const eq = spec.indexOf('=');
    if (eq < 1) throw new Error(`--kind wants NAME=BEHAVIOUR, got ${JSON.stringify(spec)}`);
    handlers[spec.slice(0, eq)] = behaviour(spec.slice(eq + 1), args.markerDir, workerId);
  }
  const worker = new Worker({ address: args.address, handlers, slots: args.slots, workerId });
  worker.on('lease', (l: Lease) => process.stderr.write(
    `lease ${l.node} ${l.stepId}/${l.leaseGeneration} attempt ${l.attempt} trace ${l.trace ? `${l.trace.traceId}/${l.trace.spanId}` : '-'}\n`));
  worker.on('ack', (l: Lease, status: string, detail: string) => process.stderr.write(`ack ${l.node} ${l.stepId}/${l.leaseGeneration} ${status} ${detail}\n`));
  for (const sig of ['SIGTERM', 'SIGINT'] as const) {
    process.on(sig, () => {
      process.stderr.write(`${sig}: draining\n`);
      void worker.stop(10_000);
    });
  }
  await worker.run();
}

main().catch((err: unknown) => {
  process.stderr.write(`demo worker: ${err instanceof Error ? err.message : String(err)}\n`);
  process.exit(1);
});
