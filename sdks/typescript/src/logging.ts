// Structured logs. The worker and every handler log through a Logger: by default one JSON
// object per line on stderr, carrying the run id, step id, node, kind and attempt of the
// step it was logged for (also for logs written by code a handler calls, through
// `currentStep()`), and the trace id when the step runs in a trace.

import { AsyncLocalStorage } from 'node:async_hooks';

/** Extra fields of a log record. */
export type LogFields = Record<string, unknown>;

/** What the SDK logs through; any logger with these four methods will do. */
export interface Logger {
  debug(message: string, fields?: LogFields): void;
  info(message: string, fields?: LogFields): void;
  warn(message: string, fields?: LogFields): void;
  error(message: string, fields?: LogFields): void;
}

export type LogLevel = 'debug' | 'info' | 'warn' | 'error' | 'silent';

const RANK: Record<LogLevel, number> = { debug: 10, info: 20, warn: 30, error: 40, silent: 100 };

/** The ids of the step a handler runs, as log fields. */
export interface StepFields {
  run_id: string;
  step_id: string;
  node: string;
  kind: string;
  attempt: number;
  trace_id?: string;
}

const current = new AsyncLocalStorage<StepFields>();

/** The step whose handler is running in this async context (undefined outside handlers). */
export function currentStep(): StepFields | undefined {
  return current.getStore();
}

/** Runs `fn` as the handler of the step `fields` (what currentStep() returns inside it). */
export function runInStep<T>(fields: StepFields, fn: () => T): T {
  return current.run(fields, fn);
}

export interface JsonLoggerOptions {
  /** The least level written. Default: the CYCLONE_LOG_LEVEL environment variable, else "info". */
  level?: LogLevel;
  /** Where lines go. Default: process.stderr. */
  write?: (line: string) => void;
  /** The "logger" field of every record. Default "cyclone". */
  name?: string;
}

/**
 * A Logger writing one JSON object per line: `time`, `level`, `logger`, `msg`, the step's
 * ids when logged inside a handler, then the record's own fields.
 *
 *   {"time":"2026-12-01T10:00:00.000Z","level":"warn","logger":"cyclone","msg":"handler resize failed: ...",
 *    "run_id":"0193...","step_id":"0193...","node":"resize","kind":"resize","attempt":2,"stack":"..."}
 */
export function jsonLogger(options: JsonLoggerOptions = {}): Logger {
  const envLevel = process.env.CYCLONE_LOG_LEVEL?.toLowerCase() as LogLevel | undefined;
  const level = options.level ?? (envLevel && envLevel in RANK ? envLevel : 'info');
  const threshold = RANK[level];
  const write = options.write ?? ((line: string) => { process.stderr.write(line); });
  const name = options.name ?? 'cyclone';
  const emit = (lvl: Exclude<LogLevel, 'silent'>, msg: string, fields?: LogFields): void => {
    if (RANK[lvl] < threshold) return;
    const record = { time: new Date().toISOString(), level: lvl, logger: name, msg, ...currentStep(), ...fields };
    let line: string;
    try {
      line = JSON.stringify(record, errorReplacer);
    } catch {
      line = JSON.stringify({ time: record.time, level: lvl, logger: name, msg });
    }
    write(`${line}\n`);
  };
  return {
    debug: (m, f) => emit('debug', m, f),
    info: (m, f) => emit('info', m, f),
    warn: (m, f) => emit('warn', m, f),
    error: (m, f) => emit('error', m, f),
  };
}

function errorReplacer(_key: string, value: unknown): unknown {
  if (value instanceof Error) return { name: value.name, message: value.message, stack: value.stack };
  if (typeof value === 'bigint') return value.toString();
  return value;
}

/** A Logger that adds `fields` to every record (the step's ids, for `ctx.log`). */
export function withFields(logger: Logger, fields: LogFields): Logger {
  return {
    debug: (m, f) => logger.debug(m, { ...fields, ...f }),
    info: (m, f) => logger.info(m, { ...fields, ...f }),
    warn: (m, f) => logger.warn(m, { ...fields, ...f }),
    error: (m, f) => logger.error(m, { ...fields, ...f }),
  };
}

/** A Logger that writes nothing. */
export const silentLogger: Logger = { debug() {}, info() {}, warn() {}, error() {} };
