// Cyclone's TypeScript SDK: the worker runtime, the workflow builder and the client.
//
//   import { Client, Worker, Workflow } from 'cyclone-workflows';
//
//   const worker = new Worker('127.0.0.1:7233');
//   worker.handle('greet', (ctx) => ({ greeting: `hello ${ctx.input.name}` }));
//   void worker.run();
//
//   const client = new Client('127.0.0.1:7233');
//   await client.register(new Workflow('hello').task('greet'));
//   const runId = await client.submit('hello', { name: 'Ada' });

export { Worker, type WorkerOptions, type WorkerEvents, type ReconnectPolicy } from './worker.js';
export { Context } from './context.js';
export type { Handler } from './leases.js';
export {
  Client, type ClientOptions, type SubmitOptions, type JobOptions, type Job, type ListOptions, type WaitOptions, type Deadline,
} from './client.js';
export {
  Workflow, type NodeOptions, type TaskOptions, type WaitNodeOptions, type SignalOptions, type OnDepFailureName,
} from './workflow.js';
export {
  type LimitUse, type LimitSpec, type LimitInfo, type LimitKeyInfo, type LimitStrategyName, type LimitScopeName,
} from './limits.js';
export {
  Run, TERMINAL_RUN_STATES, type Step, type StepError, type RunStateName, type StepStateName, type WorkflowInfo,
  type NodeInfo, type KindStats, type WorkerInfo,
} from './models.js';
export {
  CycloneError, HandlerError, type HandlerErrorOptions, Permanent, RetryAfter, Snooze, Stopped,
  CycloneClientError, InvalidArgumentError, NotFoundError, AlreadyExistsError, FailedPreconditionError,
  UnavailableError, DeadlineExceededError, UnauthenticatedError, PermissionDeniedError, ResourceExhaustedError,
  CancelledError, UnimplementedError, InternalError, RunFailed, RunCancelled, WaitTimeout, statusName,
} from './errors.js';
export { type Logger, type LogFields, type LogLevel, type StepFields, jsonLogger, silentLogger, currentStep } from './logging.js';
export { type TraceContext, parseTraceparent } from './tracing.js';
export { type Json, jsonSize, toJson } from './json.js';
export { type ConnectionOptions, MAX_MESSAGE_BYTES } from './channel.js';
export { DEFAULT_MAX_PAYLOAD_BYTES, MAX_ERROR_MESSAGE_BYTES, MAX_ERROR_DETAILS_BYTES } from './leases.js';
export { VERSION } from './version.js';
