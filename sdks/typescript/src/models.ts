// Plain objects for what the client reads (runs, steps, workflows, stats), built from the
// wire messages. States are the lifecycle document's words ("running", "waiting_signal", ...).

import type { KindStats as KindStatsMsg, WorkerInfo as WorkerInfoMsg } from './gen/cyclone/v1/admin.js';
import {
  NodeType, OnDepFailure, RunState, type Node as NodeMsg, type Run as RunMsg, type Step as StepMsg,
  StepState, type Workflow as WorkflowMsg,
} from './gen/cyclone/v1/types.js';
import { fromDuration } from './json.js';
import { type LimitUse, limitUse } from './limits.js';

/** A run state: "running", "paused", "completed", "failed" or "cancelled". */
export type RunStateName = 'running' | 'paused' | 'completed' | 'failed' | 'cancelled' | `unknown_${number}`;

/** A step state. */
export type StepStateName = 'pending' | 'available' | 'running' | 'completed' | 'discarded' | 'cancelled'
  | 'waiting_signal' | 'waiting_timer' | 'waiting_child' | 'paused' | `unknown_${number}`;

/** Run states after which WaitRun returns (a failed run may still be reopened by a retry). */
export const TERMINAL_RUN_STATES: ReadonlySet<string> = new Set(['completed', 'failed', 'cancelled']);

/** 'STEP_STATE_WAITING_CHILD' -> 'waiting_child': the document's own words; a newer server's value as 'unknown_N'. */
export function enumWord(enumObj: object, value: number, prefix: string): string {
  const name = (enumObj as Record<number, string>)[value];
  return name && value > 0 ? name.slice(prefix.length).toLowerCase() : `unknown_${value}`;
}

/** One entry of a step's error history (oldest first in `Step.errors`). */
export interface StepError {
  attempt: number;
  /** "error" (retried), "timeout", or the discard's: "permanent", "max_attempts", "reclaim_limit". */
  errorKind: string;
  message: string;
  at: Date | undefined;
  /** For engine discards: "child_failed", "child_cancelled", "max_wait", "deadline", "output_too_large". */
  reason: string;
  /** The worker's Failed.details for this attempt (a stack trace), or "". */
  details: string;
}

/** One node of one run. */
export interface Step {
  id: string;
  runId: string;
  node: string;
  kind: string;
  /** "task", "child", "sleep" or "signal". */
  type: string;
  state: StepStateName;
  attempt: number;
  maxAttempts: number;
  reclaims: number;
  maxReclaims: number;
  snoozes: number;
  priority: number;
  leaseGeneration: number;
  leaseOwner: string;
  /** The output when completed (JSON), else null. */
  // eslint-disable-next-line @typescript-eslint/no-explicit-any
  output: any;
  errorKind: string;
  reason: string;
  cancelCause: string;
  childRunId: string;
  /**
   * An available step a limit holds back: which limit and key, and why, e.g.
   * "limit tenants key acme: 5/5 running"; "" otherwise.
   */
  heldBy: string;
  /** The limits the step consumes, as "<limit>=<key>", in the order they apply. */
  limits: string[];
  deps: string[];
  errors: StepError[];
  scheduledAt: Date | undefined;
  leaseExpiry: Date | undefined;
  createdAt: Date | undefined;
  startedAt: Date | undefined;
  finishedAt: Date | undefined;
  attemptDeadline: Date | undefined;
}

/**
 * A run with its steps. `result` (when completed) holds the outputs of the leaf nodes by
 * node id.
 *
 *   const run = await client.get(runId);
 *   console.log(run.state, run.step('fetch').attempt);
 */
export class Run {
  id!: string;
  /** The workflow name; "" for a standalone job. */
  workflow!: string;
  workflowVersion!: number;
  state!: RunStateName;
  // eslint-disable-next-line @typescript-eslint/no-explicit-any
  input: any;
  // eslint-disable-next-line @typescript-eslint/no-explicit-any
  result: any;
  priority!: number;
  idempotencyKey!: string;
  parentRunId!: string;
  parentStepId!: string;
  deadline: Date | undefined;
  createdAt: Date | undefined;
  updatedAt: Date | undefined;
  finishedAt: Date | undefined;
  steps!: Step[];
  /** The schedule that started the run ("" otherwise), and its fire time. */
  scheduleName!: string;
  scheduleFireAt: Date | undefined;

  /** True when completed, failed or cancelled. */
  get terminal(): boolean {
    return TERMINAL_RUN_STATES.has(this.state);
  }

  /** The step of node `node` (throws when the run has none). */
  step(node: string): Step {
    const step = this.steps.find((s) => s.node === node);
    if (!step) throw new Error(`run ${this.id} has no node ${JSON.stringify(node)} (nodes: ${this.steps.map((s) => s.node).join(', ')})`);
    return step;
  }

  /** @internal */
  static fromProto(r: RunMsg): Run {
    return Object.assign(new Run(), {
      id: r.id, workflow: r.workflow, workflowVersion: r.workflowVersion,
      state: enumWord(RunState, r.state, 'RUN_STATE_') as RunStateName,
      input: r.input ?? null, result: r.result ?? null, priority: r.priority, idempotencyKey: r.idempotencyKey,
      parentRunId: r.parentRunId, parentStepId: r.parentStepId, deadline: r.deadline, createdAt: r.createdAt,
      updatedAt: r.updatedAt, finishedAt: r.finishedAt, steps: r.steps.map(stepFromProto),
      scheduleName: r.scheduleName, scheduleFireAt: r.scheduleFireAt,
    });
  }
}

function stepFromProto(s: StepMsg): Step {
  return {
    id: s.id, runId: s.runId, node: s.node, kind: s.kind, type: enumWord(NodeType, s.type, 'NODE_TYPE_'),
    state: enumWord(StepState, s.state, 'STEP_STATE_') as StepStateName, attempt: s.attempt, maxAttempts: s.maxAttempts,
    reclaims: s.reclaims, maxReclaims: s.maxReclaims, snoozes: s.snoozes, priority: s.priority,
    leaseGeneration: s.leaseGeneration, leaseOwner: s.leaseOwner, output: s.output ?? null, errorKind: s.errorKind,
    reason: s.reason, cancelCause: s.cancelCause, childRunId: s.childRunId, heldBy: s.heldBy, limits: s.limits,
    deps: s.deps,
    errors: s.errors.map((e) => ({
      attempt: e.attempt, errorKind: e.errorKind, message: e.message, at: e.at, reason: e.reason, details: e.details,
    })),
    scheduledAt: s.scheduledAt, leaseExpiry: s.leaseExpiry, createdAt: s.createdAt, startedAt: s.startedAt,
    finishedAt: s.finishedAt, attemptDeadline: s.attemptDeadline,
  };
}

/** A node of a stored workflow, with every default filled in (durations in ms). */
export interface NodeInfo {
  id: string;
  kind: string;
  type: string;
  deps: string[];
  onDepFailure: string;
  maxAttempts: number | undefined;
  priority: number | undefined;
  maxReclaims: number | undefined;
  backoffInitialMs: number | undefined;
  backoffMaxMs: number | undefined;
  attemptTimeoutMs: number | undefined;
  retentionMs: number | undefined;
  maxWaitMs: number | undefined;
  sleepMs: number | undefined;
  signal: string | undefined;
  workflow: string | undefined;
  /** The limits the node's steps consume (its own; those that name its kind are the limits'). */
  limits: LimitUse[];
}

/** A stored workflow version. */
export interface WorkflowInfo {
  name: string;
  version: number;
  nodes: NodeInfo[];
  createdAt: Date | undefined;
  /** Set by Client.register: this call stored a new version. */
  created: boolean;
}

/** @internal */
export function workflowInfo(w: WorkflowMsg | undefined, created = false): WorkflowInfo {
  if (!w) throw new Error('the server sent no workflow');
  return { name: w.name, version: w.version, nodes: w.nodes.map(nodeInfo), createdAt: w.createdAt, created };
}

function nodeInfo(n: NodeMsg): NodeInfo {
  return {
    id: n.id, kind: n.kind, type: enumWord(NodeType, n.type, 'NODE_TYPE_'), deps: n.deps,
    onDepFailure: enumWord(OnDepFailure, n.onDepFailure, 'ON_DEP_FAILURE_'),
    maxAttempts: n.maxAttempts, priority: n.priority, maxReclaims: n.maxReclaims,
    backoffInitialMs: fromDuration(n.backoffInitial), backoffMaxMs: fromDuration(n.backoffMax),
    attemptTimeoutMs: fromDuration(n.attemptTimeout), retentionMs: fromDuration(n.retention),
    maxWaitMs: fromDuration(n.maxWait), sleepMs: fromDuration(n.sleep),
    signal: n.signal || undefined, workflow: n.workflow || undefined, limits: n.limits.map(limitUse),
  };
}

/** Backlog of one step kind (`Client.stats`). */
export interface KindStats {
  kind: string;
  /** Claimable now. */
  available: number;
  running: number;
  /** Waiting for a later scheduled_at (a backoff, a snooze, a scheduled job). */
  scheduled: number;
  oldestAvailableAgeMs: number;
  /** Connected workers that run the kind, and their free slots. */
  workers: number;
  freeSlots: number;
  /** Steps wait to be claimed and no connected worker runs the kind. */
  noWorkers: boolean;
}

/** @internal */
export function kindStats(k: KindStatsMsg): KindStats {
  return {
    kind: k.kind, available: k.available, running: k.running, scheduled: k.scheduled,
    oldestAvailableAgeMs: fromDuration(k.oldestAvailableAge) ?? 0, workers: k.workers, freeSlots: k.freeSlots,
    noWorkers: k.noWorkers,
  };
}

/** A worker connected to any server of the database (`Client.workers`). */
export interface WorkerInfo {
  workerId: string;
  sdk: string;
  kinds: string[];
  slots: number;
  leasesHeld: number;
  serverId: string;
  connectedSince: Date | undefined;
  lastHeartbeat: Date | undefined;
}

/** @internal */
export function workerInfo(w: WorkerInfoMsg): WorkerInfo {
  return {
    workerId: w.workerId, sdk: w.sdk, kinds: w.kinds, slots: w.slots, leasesHeld: w.leasesHeld, serverId: w.serverId,
    connectedSince: w.connectedSince, lastHeartbeat: w.lastHeartbeat,
  };
}
