// Flow control in the SDK (docs/flow-control.md): the limits a task node or a job consumes,
// and the limits themselves as the Limits service sets and reads them.

import {
  type Limit as LimitMsg, LimitScope, LimitStrategy, type LimitUse as LimitUseMsg,
} from './gen/cyclone/v1/limits.js';
import { fromDuration, toDuration } from './json.js';

/**
 * The use of a named limit by a task node or a job, under a key: a constant `key` (a global
 * cap when left out), or `keyPath`, a field path into the run input ("input.tenant" or
 * "tenant"). At most one of the two.
 *
 *   new Workflow('sync').task('pull', { limits: [{ limit: 'per-tenant', keyPath: 'input.tenant' }] });
 *   await client.enqueue('email', { tenant: 'acme' }, { limits: [{ limit: 'smtp' }] });
 */
export interface LimitUse {
  limit: string;
  key?: string;
  keyPath?: string;
}

/** @internal `uses` as LimitUse messages; a TypeError names the entry (`limits[1]`) that cannot be one. */
export function limitUses(uses: readonly LimitUse[] | undefined, where: string): LimitUseMsg[] {
  if (uses === undefined) return [];
  if (!Array.isArray(uses)) throw new TypeError(`${where}: ${JSON.stringify(uses)} is not an array of { limit, key | keyPath }`);
  return uses.map((u, i) => {
    const at = `${where}[${i}]`;
    if (typeof u !== 'object' || u === null) throw new TypeError(`${at}: ${JSON.stringify(u)} is not { limit, key | keyPath }`);
    for (const field of Object.keys(u)) {
      if (!['limit', 'key', 'keyPath'].includes(field)) throw new TypeError(`${at}: unknown field ${JSON.stringify(field)}`);
    }
    if (typeof u.limit !== 'string' || u.limit === '') throw new TypeError(`${at}.limit: ${JSON.stringify(u.limit)} is not a limit's name`);
    keyFields(u, at);
    if (u.key && u.keyPath) throw new TypeError(`${at}: key and keyPath both given; at most one`);
    return { limit: u.limit, key: u.key ?? '', keyPath: u.keyPath ?? '' };
  });
}

/** A use's or a limit's `key` and `keyPath`: strings when given, else a TypeError naming the field after `at`. */
function keyFields(x: { key?: unknown; keyPath?: unknown }, at: string): void {
  for (const field of ['key', 'keyPath'] as const) {
    if (x[field] !== undefined && typeof x[field] !== 'string') {
      throw new TypeError(`${at}.${field}: ${JSON.stringify(x[field])} is not a string`);
    }
  }
}

/** @internal A LimitUse message as the SDK's LimitUse (its empty fields left out). */
export function limitUse(m: LimitUseMsg): LimitUse {
  return { limit: m.limit, ...(m.key ? { key: m.key } : {}), ...(m.keyPath ? { keyPath: m.keyPath } : {}) };
}

/** What a limit does when a key is at its cap (docs/flow-control.md, "Strategies"). */
export type LimitStrategyName = 'queue' | 'cancel_newest' | 'cancel_oldest' | 'keep_newest';
/** What a limit counts: running steps, or active runs of its workflows. */
export type LimitScopeName = 'steps' | 'runs';

/**
 * A limit, as `Client.setLimit` sets it, whole (durations in ms). `maxRunning` caps running
 * steps (or active runs, scope "runs") per key; `rate` starts per `periodMs` per key; the key
 * is a constant `key` or a field path `keyPath` into the run input; `kinds` (scope steps) or
 * `workflows` (scope runs) attach it; `weights` share a kind's slots between keys.
 */
export interface LimitSpec {
  name: string;
  maxRunning?: number;
  rate?: number;
  periodMs?: number;
  strategy?: LimitStrategyName;
  scope?: LimitScopeName;
  kinds?: string[];
  workflows?: string[];
  key?: string;
  keyPath?: string;
  weights?: Record<string, number>;
}

/** How one key of a limit stands: running (or admitted) and waiting, the oldest wait, the starts in the rate's window. */
export interface LimitKeyInfo {
  key: string;
  running: number;
  waiting: number;
  oldestWaitingAgeMs: number;
  startsInWindow: number;
}

/** A limit as stored, with its busiest keys (at most 20, busiest first). */
export interface LimitInfo {
  name: string;
  maxRunning: number | undefined;
  rate: number | undefined;
  periodMs: number | undefined;
  strategy: LimitStrategyName;
  scope: LimitScopeName;
  kinds: string[];
  workflows: string[];
  key: string;
  keyPath: string;
  weights: Record<string, number>;
  keys: LimitKeyInfo[];
  createdAt: Date | undefined;
  updatedAt: Date | undefined;
}

const STRATEGIES: Record<LimitStrategyName, LimitStrategy> = {
  queue: LimitStrategy.LIMIT_STRATEGY_QUEUE,
  cancel_newest: LimitStrategy.LIMIT_STRATEGY_CANCEL_NEWEST,
  cancel_oldest: LimitStrategy.LIMIT_STRATEGY_CANCEL_OLDEST,
  keep_newest: LimitStrategy.LIMIT_STRATEGY_KEEP_NEWEST,
};
const SCOPES: Record<LimitScopeName, LimitScope> = { steps: LimitScope.LIMIT_SCOPE_STEPS, runs: LimitScope.LIMIT_SCOPE_RUNS };

function int32(value: number | undefined, what: string): number {
  if (value === undefined) return 0;
  if (!Number.isInteger(value) || value < -(2 ** 31) || value >= 2 ** 31) {
    throw new TypeError(`${what}: ${JSON.stringify(value)} is not a 32-bit integer`);
  }
  return value;
}

function word<T>(value: string | undefined, words: Record<string, T>, what: string): T | undefined {
  if (value === undefined) return undefined;
  if (!Object.prototype.hasOwnProperty.call(words, value)) {
    throw new TypeError(`${what}: ${JSON.stringify(value)} is not one of ${Object.keys(words).join(', ')}`);
  }
  return words[value];
}

/** @internal The Limit message of a LimitSpec; a TypeError names the field the SDK cannot send. The server checks the rest. */
export function limitMessage(spec: LimitSpec): LimitMsg {
  if (typeof spec !== 'object' || spec === null) throw new TypeError(`limit: ${JSON.stringify(spec)} is not a LimitSpec`);
  if (typeof spec.name !== 'string') throw new TypeError(`limit.name: ${JSON.stringify(spec.name)} is not a string`);
  keyFields(spec, 'limit');
  for (const field of ['kinds', 'workflows'] as const) {
    const names = spec[field];
    if (names !== undefined && (!Array.isArray(names) || names.some((n) => typeof n !== 'string'))) {
      throw new TypeError(`limit.${field}: ${JSON.stringify(names)} is not a list of names`);
    }
  }
  const weights: Record<string, number> = {};
  for (const [k, w] of Object.entries(spec.weights ?? {})) weights[k] = int32(w, `limit.weights[${JSON.stringify(k)}]`);
  return {
    name: spec.name, maxRunning: int32(spec.maxRunning, 'limit.maxRunning'), rate: int32(spec.rate, 'limit.rate'),
    period: spec.periodMs === undefined ? undefined : toDuration(spec.periodMs, 'limit.periodMs'),
    strategy: word(spec.strategy, STRATEGIES, 'limit.strategy') ?? LimitStrategy.LIMIT_STRATEGY_UNSPECIFIED,
    scope: word(spec.scope, SCOPES, 'limit.scope') ?? LimitScope.LIMIT_SCOPE_UNSPECIFIED,
    kinds: [...(spec.kinds ?? [])], workflows: [...(spec.workflows ?? [])], key: spec.key ?? '', keyPath: spec.keyPath ?? '',
    weights, keys: [], createdAt: undefined, updatedAt: undefined,
  };
}

// UNSPECIFIED (0) is the server's default: queue, steps.
function nameOf<T>(words: Record<string, T>, value: T, fallback: string): string {
  return Object.keys(words).find((k) => words[k] === value) ?? fallback;
}

/** @internal A Limit message as a LimitInfo. */
export function limitInfo(m: LimitMsg | undefined): LimitInfo {
  if (!m) throw new Error('the server sent no limit');
  return {
    name: m.name, maxRunning: m.maxRunning || undefined, rate: m.rate || undefined, periodMs: fromDuration(m.period),
    strategy: nameOf(STRATEGIES, m.strategy, 'queue') as LimitStrategyName,
    scope: nameOf(SCOPES, m.scope, 'steps') as LimitScopeName,
    kinds: m.kinds, workflows: m.workflows, key: m.key, keyPath: m.keyPath, weights: { ...m.weights },
    keys: m.keys.map((k) => ({
      key: k.key, running: Number(k.running), waiting: Number(k.waiting),
      oldestWaitingAgeMs: fromDuration(k.oldestWaitingAge) ?? 0, startsInWindow: Number(k.startsInWindow),
    })),
    createdAt: m.createdAt, updatedAt: m.updatedAt,
  };
}
