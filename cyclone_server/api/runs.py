"""The Runs gRPC service: submit, read, wait for and steer runs."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
from datetime import datetime
from typing import Any

import grpc

from cyclone_proto import runs_pb2, runs_pb2_grpc, types_pb2

from cyclone_server import convert, definitions, tracing
from .batching import Claim, EnqueueBatcher
from cyclone_server.records import ENQUEUE_MANY_MAX, TERMINAL_RUN_STATES, Job
from cyclone_server.store.engine import Engine
from cyclone_server.errors import InvalidArgument
from cyclone_server.store.notify import Notifier
from .run_waits import RunEndWatch
from .common import deadline_of, non_negative, plain_text, required, required_id, rpc

WAIT_DEFAULT = 30.0
WAIT_MAX = 3600.0
# WaitRun re-reads the states of awaited runs at least this often, so a lost notification
# costs a moment, not the whole timeout.
WAIT_RECHECK = 2.0
LIST_DEFAULT, LIST_MAX = 100, 1000
PURGE_DEFAULT = 1000
_ENQUEUE_OPTIONS = ("max_attempts", "max_reclaims")
_ENQUEUE_DURATIONS = ("backoff_initial", "backoff_max", "attempt_timeout", "retention")


class RunsServicer(runs_pb2_grpc.RunsServicer):
    """cyclone.v1.Runs."""

    def __init__(self, engine: Engine, notifier: Notifier, claim: Claim | None = None) -> None:
        self.engine = engine
        self.notifier = notifier
        # Concurrent Enqueue calls share transactions (see batching.py), which also claim for
        # a worker that waits for their jobs (`claim`: the server's Dispatcher.enqueue).
        self.enqueuer = EnqueueBatcher(engine, claim=claim)
        # WaitRun calls share one state query per cyclone_run_ended (see run_waits.py).
        self.run_ends = RunEndWatch(engine, notifier, recheck=WAIT_RECHECK)
        self._closing = asyncio.Event()

    def close(self) -> None:
        """Server shutdown: pending WaitRun calls answer at once (timed_out) instead of holding it up."""
        self._closing.set()

    async def _run(self, run_id: str) -> types_pb2.Run:
        return convert.run_to_proto(await self.engine.get_run(run_id))

    # -- begin ---------------------------------------------------------------------------

    @rpc
    async def SubmitRun(self, request: runs_pb2.SubmitRunRequest,
                        context: grpc.aio.ServicerContext) -> runs_pb2.SubmitRunResponse:
        required(request.workflow, "workflow")
        non_negative(request.version, "version")
        plain_text(request.idempotency_key, "idempotency_key")
        deadline = deadline_of(request)
        input_ = convert.optional_value(request, "input")
        # The request as given identifies it for the idempotency check: deadline_in, not
        # the absolute deadline computed from it, which differs on every repeat.
        fingerprint = (request.workflow, request.version, input_, request.priority,
                       _fingerprint_time(request, "deadline"), _fingerprint_duration(request, "deadline_in"))
        with tracing.submit_span("SubmitRun", context.invocation_metadata(), workflow=request.workflow) as span:
            run_id, created = await self.engine.submit_run(
                request.workflow, version=request.version, input=input_, priority=request.priority,
                idempotency_key=request.idempotency_key or None, deadline=deadline, request_fingerprint=fingerprint,
                trace_context=span.context)
            span.created([run_id], [created])
        return runs_pb2.SubmitRunResponse(run_id=run_id, created=created)

    @rpc
    async def Enqueue(self, request: runs_pb2.EnqueueRequest,
                      context: grpc.aio.ServicerContext) -> runs_pb2.EnqueueResponse:
        with tracing.submit_span("Enqueue", context.invocation_metadata(), kind=request.kind) as span:
            run_id, step_id, created = await self.enqueuer.enqueue(_job_of(request, span.context))
            span.created([run_id], [created])
        return runs_pb2.EnqueueResponse(run_id=run_id, step_id=step_id, created=created)

    @rpc
    async def EnqueueMany(self, request: runs_pb2.EnqueueManyRequest,
                          context: grpc.aio.ServicerContext) -> runs_pb2.EnqueueManyResponse:
        if len(request.jobs) > ENQUEUE_MANY_MAX:  # before reading any of them
            raise InvalidArgument(f"jobs: {len(request.jobs)} jobs, over the limit of {ENQUEUE_MANY_MAX} per call")
        with tracing.submit_span("EnqueueMany", context.invocation_metadata()) as span:
            jobs = []
            for i, r in enumerate(request.jobs):
                try:
                    jobs.append(_job_of(r, span.context))
                except InvalidArgument as e:
                    raise InvalidArgument(f"jobs[{i}].{e.message}") from None
            rows = await self.engine.enqueue_many(jobs)
            span.created([r[0] for r in rows], [r[2] for r in rows])
        return runs_pb2.EnqueueManyResponse(jobs=[
            runs_pb2.EnqueueResponse(run_id=run_id, step_id=step_id, created=created)
            for run_id, step_id, created in rows])

    # -- read ----------------------------------------------------------------------------

    @rpc
    async def GetRun(self, request: runs_pb2.GetRunRequest, context: grpc.aio.ServicerContext) -> types_pb2.Run:
        return await self._run(required_id(request.run_id, "run_id"))

    @rpc
    async def ListRuns(self, request: runs_pb2.ListRunsRequest,
                       context: grpc.aio.ServicerContext) -> runs_pb2.ListRunsResponse:
        limit = min(non_negative(request.limit, "limit") or LIST_DEFAULT, LIST_MAX)
        states = sorted({convert.run_state_name(s) for s in request.states})
        plain_text(request.workflow, "workflow")
        after, before = convert.timestamp_dt(request, "created_after"), convert.timestamp_dt(request, "created_before")
        filters = _filters_hash(states, request.workflow, after, before)
        schedule = plain_text(request.schedule, "schedule") or None
        fire_at = convert.timestamp_dt(request, "schedule_fire_at")
        if schedule or fire_at:  # the schedule filters join the hash only when given: older tokens stay valid
            filters = _filters_hash(states, f"{request.workflow}\x00{schedule}\x00{fire_at}", after, before)
        cursor = _decode_page_token(request.page_token, filters) if request.page_token else None
        rows = await self.engine.list_runs(states=states, workflow=request.workflow or None, created_after=after,
                                           created_before=before, limit=limit + 1, after=cursor,
                                           steps=request.include_steps, schedule=schedule, schedule_fire_at=fire_at)
        token = ""
        if len(rows) > limit:
            rows = rows[:limit]
            token = _encode_page_token(rows[-1]["created_at"], str(rows[-1]["id"]), filters)
        return runs_pb2.ListRunsResponse(runs=[convert.run_to_proto(r) for r in rows], next_page_token=token)

    @rpc
    async def WaitRun(self, request: runs_pb2.WaitRunRequest,
                      context: grpc.aio.ServicerContext) -> runs_pb2.WaitRunResponse:
        run_id = required_id(request.run_id, "run_id")
        timeout = convert.duration_seconds(request, "timeout", field="timeout")
        timeout = WAIT_DEFAULT if timeout is None else min(timeout, WAIT_MAX)
        await self.engine.get_run(run_id, steps=False)  # NOT_FOUND before any waiting
        ended = asyncio.ensure_future(self.run_ends.ended(run_id, timeout))
        closing = asyncio.ensure_future(self._closing.wait())
        try:
            await asyncio.wait((ended, closing), return_when=asyncio.FIRST_COMPLETED)
        finally:
            ended.cancel()
            closing.cancel()
        run = await self._run(run_id)  # NOT_FOUND when the run was purged meanwhile
        return runs_pb2.WaitRunResponse(run=run, timed_out=convert.RUN_STATE_NAMES[run.state] not in TERMINAL_RUN_STATES)

    # -- actions -------------------------------------------------------------------------

    async def _act(self, action: str, run_id: str, **params: Any) -> runs_pb2.RunActionResponse:
        applied, run = await self.engine.act(action, run_id, **params)
        return runs_pb2.RunActionResponse(run=convert.run_to_proto(run), applied=applied)

    @rpc
    async def CancelRun(self, request: runs_pb2.CancelRunRequest,
                        context: grpc.aio.ServicerContext) -> runs_pb2.RunActionResponse:
        return await self._act("cancel", required_id(request.run_id, "run_id"))

    @rpc
    async def PauseRun(self, request: runs_pb2.PauseRunRequest,
                       context: grpc.aio.ServicerContext) -> runs_pb2.RunActionResponse:
        return await self._act("pause", required_id(request.run_id, "run_id"))

    @rpc
    async def ResumeRun(self, request: runs_pb2.ResumeRunRequest,
                        context: grpc.aio.ServicerContext) -> runs_pb2.RunActionResponse:
        return await self._act("resume", required_id(request.run_id, "run_id"))

    @rpc
    async def RetryStep(self, request: runs_pb2.RetryStepRequest,
                        context: grpc.aio.ServicerContext) -> runs_pb2.RunActionResponse:
        run_id = required_id(request.run_id, "run_id")
        node = required(request.node, "node")
        return await self._act("retry", run_id, node=node, deadline=deadline_of(request))

    @rpc
    async def RetryAll(self, request: runs_pb2.RetryAllRequest,
                       context: grpc.aio.ServicerContext) -> runs_pb2.RunActionResponse:
        run_id = required_id(request.run_id, "run_id")
        return await self._act("retry", run_id, node=None, deadline=deadline_of(request))

    @rpc
    async def Signal(self, request: runs_pb2.SignalRequest,
                     context: grpc.aio.ServicerContext) -> runs_pb2.SignalResponse:
        run_id = required_id(request.run_id, "run_id")
        name = required(request.name, "name")
        signal_id, consumed_by = await self.engine.signal(run_id, name, convert.optional_value(request, "payload"))
        return runs_pb2.SignalResponse(signal_id=signal_id, consumed_by_step_id=consumed_by or "")

    @rpc
    async def PurgeTerminalRuns(self, request: runs_pb2.PurgeTerminalRunsRequest,
                                context: grpc.aio.ServicerContext) -> runs_pb2.PurgeTerminalRunsResponse:
        # Further back than a century is before any run (and far enough overflows Postgres).
        older_than = convert.duration_seconds(request, "older_than", maximum=definitions.MAX_SECONDS)
        if older_than is None:
            raise InvalidArgument("older_than: required")
        # Checked on a dry run too, which ignores it: a negative limit is a mistake either way.
        limit = non_negative(request.limit, "limit") or PURGE_DEFAULT
        if request.dry_run:
            return runs_pb2.PurgeTerminalRunsResponse(eligible=await self.engine.purge_count(older_than))
        return runs_pb2.PurgeTerminalRunsResponse(deleted=await self.engine.purge(older_than, limit))


# -- helpers -------------------------------------------------------------------------


def _fingerprint_time(request: Any, name: str) -> str | None:
    dt = convert.timestamp_dt(request, name)
    return dt.isoformat() if dt else None


def _fingerprint_duration(request: Any, name: str) -> float | None:
    return convert.duration_seconds(request, name)


def _job_of(request: runs_pb2.EnqueueRequest, trace_context: dict[str, str] | None = None) -> Job:
    """An Enqueue request (or one job of EnqueueMany), read and checked as far as the wire goes;
    its run keeps `trace_context`."""
    required(request.kind, "kind")
    plain_text(request.idempotency_key, "idempotency_key")
    deadline = deadline_of(request)
    input_ = convert.optional_value(request, "input")
    options: dict[str, Any] = {k: getattr(request, k) for k in _ENQUEUE_OPTIONS if request.HasField(k)}
    for key in _ENQUEUE_DURATIONS:
        seconds = convert.duration_seconds(request, key)
        if seconds is not None:
            options[key] = seconds
    if request.limits:
        options["limits"] = convert.limit_uses_of(request.limits)
    scheduled_at = convert.timestamp_dt(request, "scheduled_at")
    fingerprint = None
    if request.idempotency_key:  # the request as given identifies it for the idempotency check (see SubmitRun)
        fingerprint = ("job", request.kind, input_, request.priority, _fingerprint_time(request, "deadline"),
                       _fingerprint_duration(request, "deadline_in"), scheduled_at, options)
    return Job(request.kind, input=input_, priority=request.priority, idempotency_key=request.idempotency_key or None,
               deadline=deadline, scheduled_at=scheduled_at, options=options, request_fingerprint=fingerprint,
               trace_context=trace_context)


def _filters_hash(states: list[str], workflow: str, after: datetime | None, before: datetime | None) -> str:
    key = json.dumps([states, workflow, after.isoformat() if after else None, before.isoformat() if before else None])
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def _encode_page_token(created_at: datetime, run_id: str, filters: str) -> str:
    raw = json.dumps({"c": created_at.isoformat(), "i": run_id, "f": filters})
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def _decode_page_token(token: str, filters: str) -> tuple[datetime, str]:
    try:
        raw = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
        created_at, run_id, issued_for = datetime.fromisoformat(raw["c"]), str(raw["i"]), raw["f"]
    except (ValueError, TypeError, KeyError):
        raise InvalidArgument("page_token: not a token issued by ListRuns") from None
    if issued_for != filters:
        raise InvalidArgument("page_token: issued for different filters (states, workflow, created_after/before)")
    required_id(run_id, "page_token")
    return created_at, run_id
