// The workflow builder: a named DAG of task, child, sleep and signal nodes, as the wire's Node messages.

import { type Node, NodeType, OnDepFailure } from './gen/cyclone/v1/types.js';
import type { RegisterWorkflowRequest } from './gen/cyclone/v1/workflows.js';
import { toDuration } from './json.js';
import { type LimitUse, limitUses } from './limits.js';

/** What a node does when one of its dependencies is discarded: fail the run (the default), or cancel only this branch. */
export type OnDepFailureName = 'fail_run' | 'cancel_branch';

/** Options every node type takes. Durations are in milliseconds. */
export interface NodeOptions {
  /** Ids of the nodes that must complete first. */
  deps?: string[];
  /** Default "fail_run"; "cancel_branch" contains a discard upstream when every node downstream of it says so. */
  onDepFailure?: OnDepFailureName;
  /** The run becomes eligible for purge this long after it finishes. */
  retentionMs?: number;
}

/** Options of a task node (unset ones take the server's defaults). */
export interface TaskOptions extends NodeOptions {
  /** The handler name; default the node id. */
  kind?: string;
  /** Executions allowed before the step is discarded; default 25. */
  maxAttempts?: number;
  /** Backoff after the first failed attempt, doubling to backoffMaxMs (default 1 s and 10 min). */
  backoffInitialMs?: number;
  backoffMaxMs?: number;
  /** Claim priority; lower first. Default: the run's. */
  priority?: number;
  /** Lease expiries reclaimed before the step is discarded; default 5. */
  maxReclaims?: number;
  /** How long one execution may run; default 10 min. */
  attemptTimeoutMs?: number;
  /** Limits the node's steps consume, besides those that name its kind (docs/flow-control.md). */
  limits?: LimitUse[];
}

/** Options of a wait node (child, sleep, signal). */
export interface WaitNodeOptions extends NodeOptions {
  /** The longest the step may wait; then it is discarded (reason "max_wait"). */
  maxWaitMs?: number;
}

/** Options of a signal node. */
export interface SignalOptions extends WaitNodeOptions {
  /** The signal name it waits for; default the node id. */
  name?: string;
}

const ON_DEP_FAILURE: Record<OnDepFailureName, OnDepFailure> = {
  fail_run: OnDepFailure.ON_DEP_FAILURE_FAIL_RUN,
  cancel_branch: OnDepFailure.ON_DEP_FAILURE_CANCEL_BRANCH,
};

/**
 * A workflow definition: a named DAG of nodes, built with chained calls. Register it with
 * `client.register(workflow)`, then start runs with `client.submit(name, input)`.
 *
 *   const etl = new Workflow('etl')
 *     .task('extract')
 *     .task('transform', { deps: ['extract'], maxAttempts: 5, backoffInitialMs: 2_000 })
 *     .sleep('cool-down', 60_000, { deps: ['transform'] })
 *     .signal('approval', { deps: ['transform'], maxWaitMs: 3_600_000 })
 *     .child('publish', 'publish-report', { deps: ['cool-down', 'approval'] });
 */
export class Workflow {
  private readonly byId = new Map<string, Node>();

  constructor(readonly name: string) {
    if (typeof name !== 'string' || name === '') throw new TypeError('a workflow needs a name');
  }

  /** The node ids, in the order they were added. */
  get nodes(): string[] {
    return [...this.byId.keys()];
  }

  /** The step kinds of the task nodes (what a worker for this workflow must handle). */
  get kinds(): string[] {
    return [...new Set([...this.byId.values()].filter((n) => n.type === NodeType.NODE_TYPE_TASK).map((n) => n.kind || n.id))];
  }

  /** Adds a task node, run by a worker that handles `options.kind` (default: the node id). */
  task(id: string, options: TaskOptions = {}): this {
    const where = `node "${id}"`;
    return this.add(id, NodeType.NODE_TYPE_TASK, options, {
      kind: options.kind ?? '',
      maxAttempts: options.maxAttempts,
      priority: options.priority,
      maxReclaims: options.maxReclaims,
      backoffInitial: duration(options.backoffInitialMs, `${where}: backoffInitialMs`),
      backoffMax: duration(options.backoffMaxMs, `${where}: backoffMaxMs`),
      attemptTimeout: duration(options.attemptTimeoutMs, `${where}: attemptTimeoutMs`),
      limits: limitUses(options.limits, `${where}: limits`),
    });
  }

  /**
   * Adds a child node: starts the registered workflow `workflow` as a child run and completes
   * with its result. The child run's input is `{"input": <this run's input>, "parents": {<dep>: <output>}}`.
   */
  child(id: string, workflow: string | Workflow, options: WaitNodeOptions = {}): this {
    const name = workflow instanceof Workflow ? workflow.name : workflow;
    return this.add(id, NodeType.NODE_TYPE_CHILD, options, {
      workflow: name, maxWait: duration(options.maxWaitMs, `node "${id}": maxWaitMs`),
    });
  }

  /** Adds a durable timer: completes `ms` after its deps complete, with output `{"fired_at": ...}`. */
  sleep(id: string, ms: number, options: WaitNodeOptions = {}): this {
    return this.add(id, NodeType.NODE_TYPE_SLEEP, options, {
      sleep: toDuration(ms, `node "${id}": sleep`), maxWait: duration(options.maxWaitMs, `node "${id}": maxWaitMs`),
    });
  }

  /** Adds a signal node: waits for `client.signal(runId, name, payload)` and completes with the payload. */
  signal(id: string, options: SignalOptions = {}): this {
    return this.add(id, NodeType.NODE_TYPE_SIGNAL, options, {
      signal: options.name ?? '', maxWait: duration(options.maxWaitMs, `node "${id}": maxWaitMs`),
    });
  }

  /** The RegisterWorkflow request for this definition (the server validates the DAG). */
  toRequest(): RegisterWorkflowRequest {
    return { name: this.name, nodes: [...this.byId.values()] };
  }

  private add(id: string, type: NodeType, options: NodeOptions, fields: Partial<Node>): this {
    if (typeof id !== 'string' || id === '') throw new TypeError(`node id: ${JSON.stringify(id)} must be a non-empty string`);
    if (this.byId.has(id)) throw new Error(`node "${id}": duplicate node id in workflow "${this.name}"`);
    const deps = typeof options.deps === 'string' ? [options.deps] : [...(options.deps ?? [])];
    let onDepFailure = OnDepFailure.ON_DEP_FAILURE_UNSPECIFIED;
    if (options.onDepFailure !== undefined) {
      if (!(options.onDepFailure in ON_DEP_FAILURE)) {
        throw new TypeError(`node "${id}": onDepFailure ${JSON.stringify(options.onDepFailure)} is not "fail_run" or "cancel_branch"`);
      }
      onDepFailure = ON_DEP_FAILURE[options.onDepFailure];
    }
    this.byId.set(id, {
      id, kind: '', deps, type, maxAttempts: undefined, backoffInitial: undefined, backoffMax: undefined,
      priority: undefined, maxReclaims: undefined, attemptTimeout: undefined, onDepFailure,
      retention: duration(options.retentionMs, `node "${id}": retentionMs`), maxWait: undefined, sleep: undefined,
      signal: '', workflow: '', limits: [], ...fields,
    });
    return this;
  }
}

function duration(ms: number | undefined, what: string) {
  return ms === undefined ? undefined : toDuration(ms, what);
}
