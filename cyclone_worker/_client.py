"""The async client: register workflows, start runs and jobs, read, wait for and steer them."""

from __future__ import annotations

import asyncio
import builtins
import time
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

import grpc

from ._channel import auth_metadata, open_channel
from ._enqueues import Enqueues, Trace
from ._errors import CycloneClientError, RunCancelled, RunFailed
from ._job import Job, deadline_fields
from ._limits import LimitCalls, LimitUse
from ._models import KindStats, Run, WorkerInfo, WorkflowInfo
from ._tracing import trace_metadata
from ._schedules import Schedule, overlap_value, settings_proto
from cyclone_proto import (admin_pb2, admin_pb2_grpc, limits_pb2, limits_pb2_grpc, runs_pb2, runs_pb2_grpc, types_pb2,
                           workflows_pb2, workflows_pb2_grpc)
from .values import Seconds, to_duration, to_timestamp, to_value
from cyclone_proto import schedules_pb2, schedules_pb2_grpc
from ._workflow import Workflow

__all__ = ["Client"]

# One WaitRun call waits at most this long; `wait` loops, so a long wait survives proxies
# that cut idle calls.
_WAIT_SLICE = 30.0


def _unreachable(details: str) -> str:
    """gRPC's connect failure in a few words: 'connection refused', 'unknown host', or as it came."""
    lowered = details.lower()
    for needle, words in (("connection refused", "connection refused"), ("lookup", "unknown host"), ("dns", "unknown host"),
                          ("timed out", "connection timed out"), ("no route", "no route to host")):
        if needle in lowered:
            return words
    return details


def _run_state(word: str) -> Any:  # a RunState value
    try:
        return types_pb2.RunState.Value("RUN_STATE_" + word.upper())
    except ValueError:
        raise ValueError(f"states: {word!r} is not a run state (running, paused, completed, failed, cancelled)") from None


# The calls that change nothing, or nothing more when made twice: made again when the
# connection they were sent on broke (see Client._call).
_REPEATABLE = frozenset({"GetRun", "GetSchedule", "GetStats", "GetWorkflow", "ListRuns", "ListSchedules",
                         "ListWorkers", "ListWorkflows", "WaitRun", "RegisterWorkflow", "GetLimit", "ListLimits",
                         "SetLimit"})

# Statuses a call can end with that the server did not send: it may not have been reached.
_NOT_AN_ANSWER = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED,
                            grpc.StatusCode.CANCELLED, grpc.StatusCode.UNKNOWN})


class Client(LimitCalls):
    """An async client of a Cyclone server.

    Every failed call raises `CycloneClientError` carrying the gRPC status code. Until the
    server has answered once, a call fails at once when nothing listens at `address`
    (UNAVAILABLE, "cannot reach HOST:PORT: connection refused"); `wait_for_server=SECONDS`
    instead waits that long for a server that is still starting. Once it has answered, a call
    made while the server is unreachable waits for it, up to `rpc_timeout` seconds (then
    DEADLINE_EXCEEDED), so a server restart does not break a client. A call that was already
    on its way when the server went away is made again if repeating it is harmless (reads,
    and registering a workflow); any other call fails with UNAVAILABLE, as it may have been
    applied (give `enqueue` and `submit` an idempotency key to make them safe to repeat).

    At most `enqueue_calls` `enqueue` calls of a Client are on the wire at once per trace
    context; the jobs of the `enqueue` calls made meanwhile go together in one EnqueueMany
    call as soon as one returns, and each caller still gets its own job's answer (a job the
    server refuses fails only its own caller). A gRPC call costs far more than writing a
    job, so a service that enqueues from many tasks at once goes several times faster.
    `enqueue_calls=0` sends one Enqueue call per job.

    Example::

        async with Client("127.0.0.1:7233") as client:
            await client.register(Workflow("etl").task("extract").task("load", deps=["extract"]))
            run_id = await client.submit("etl", {"day": "2026-12-01"})
            print(await client.result(run_id, timeout=60))
    """

    def __init__(self, address: str, *, token: str | None = None,
                 tls: grpc.ChannelCredentials | None = None, rpc_timeout: float = 30.0,
                 wait_for_server: float = 0.0, enqueue_calls: int = 2) -> None:
        if not 0 <= wait_for_server < float("inf"):
            raise ValueError(f"wait_for_server: {wait_for_server!r} is not a number of seconds >= 0")
        self.address = address
        self._metadata = auth_metadata(token)
        self._tls = tls
        self._rpc_timeout = rpc_timeout
        self._wait_for_server = wait_for_server
        self._reached = False  # has the server answered once? Then calls wait across restarts.
        self._channel: grpc.aio.Channel | None = None
        # The channel's stubs, by stub class (cleared with the channel by close()): making
        # one makes a callable per method of its service, not to be paid on every call.
        self._stubs: dict[Any, Any] = {}
        self._enqueues = Enqueues(self._runs_call, enqueue_calls, lambda: self._reached)

    async def __aenter__(self) -> Client:
        self._open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the channel (`async with` does it for you). Calls in progress end with
        CANCELLED, as do `enqueue` calls whose jobs wait to be sent."""
        self._enqueues.close()
        try:
            if self._channel is not None:
                channel, self._channel = self._channel, None
                self._stubs.clear()
                await channel.close(None)
        finally:
            await self._enqueues.closed()

    def _open(self) -> grpc.aio.Channel:
        if self._channel is None:
            self._channel = open_channel(self.address, tls=self._tls)
        return self._channel

    def _stub(self, stub_cls: Any, channel: grpc.aio.Channel) -> Any:
        stub = self._stubs.get(stub_cls)
        if stub is None:
            stub = self._stubs[stub_cls] = stub_cls(channel)
        return stub

    async def _runs_call(self, method: str, request: Any, trace: Trace) -> Any:
        return await self._call(runs_pb2_grpc.RunsStub, method, request, trace=trace)

    async def _call(self, stub_cls: Any, method: str, request: Any, timeout: float | None = None,
                    trace: Trace | None = None) -> Any:
        """The call's response; `trace` is the caller's trace metadata when not the current task's."""
        channel = self._open()
        if not self._reached and self._wait_for_server:
            try:
                # asyncio.timeout, not wait_for, which can lose a cancel on Python 3.11.
                async with asyncio.timeout(self._wait_for_server):
                    await channel.channel_ready()
            except asyncio.TimeoutError:
                raise CycloneClientError(grpc.StatusCode.UNAVAILABLE, f"cannot reach {self.address}: no server "
                                         f"answered within {self._wait_for_server:g}s") from None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + (timeout or self._rpc_timeout)
        while True:
            try:
                # wait_for_ready once the server has answered: a call made while it restarts
                # waits for it (up to the call's deadline) instead of failing with
                # UNAVAILABLE. Before that, a wrong address fails at once. The current
                # span's W3C context goes along: a run submitted under it joins its trace.
                call = getattr(self._stub(stub_cls, channel), method)
                resp = await call(request, timeout=max(deadline - loop.time(), 0.001),
                                  metadata=self._metadata + (trace_metadata() if trace is None else trace),
                                  wait_for_ready=self._reached)
                break
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if task is not None and task.cancelling() == 0:
                    # Not this task that was cancelled, but its call: close() closed the channel.
                    raise CycloneClientError(grpc.StatusCode.CANCELLED, "the Client was closed") from None
                raise
            except grpc.aio.AioRpcError as e:
                if e.code() not in _NOT_AN_ANSWER:
                    self._reached = True  # refused, but by the server: it is there
                if not self._reached and e.code() == grpc.StatusCode.UNAVAILABLE:
                    raise CycloneClientError(grpc.StatusCode.UNAVAILABLE,
                                             f"cannot reach {self.address}: {_unreachable(e.details() or '')}") from None
                # A call sent on a connection that broke under it (the server went away
                # just then) is made again when repeating it is harmless, once the server
                # is back; a write may have been applied, so its caller decides.
                if e.code() == grpc.StatusCode.UNAVAILABLE and method in _REPEATABLE and loop.time() < deadline:
                    await asyncio.sleep(0.05)
                    continue
                raise CycloneClientError.from_rpc(e) from None
        self._reached = True
        return resp

    # -- workflows ------------------------------------------------------------------------

    async def register(self, workflow: Workflow) -> WorkflowInfo:
        """Store a workflow definition; the same definition again is a no-op (`created` False).
        The limits of its runs that it declares (`Workflow.limit_runs`) are set first: one the
        server refuses leaves the workflow unregistered, rather than registered without it.

        Example::

            info = await client.register(Workflow("etl").task("extract"))
            print(info.version, info.created)
        """
        for limit in workflow.run_limits:
            await self._call(limits_pb2_grpc.LimitsStub, "SetLimit", limits_pb2.SetLimitRequest(limit=limit))
        resp = await self._call(workflows_pb2_grpc.WorkflowsStub, "RegisterWorkflow", workflow.to_proto())
        return WorkflowInfo.from_proto(resp.workflow, created=resp.created)

    async def get_workflow(self, name: str, version: int = 0) -> WorkflowInfo:
        """One version of a workflow (the latest when `version` is 0).

        Example::

            info = await client.get_workflow("etl")
        """
        req = workflows_pb2.GetWorkflowRequest(name=name, version=version)
        return WorkflowInfo.from_proto(await self._call(workflows_pb2_grpc.WorkflowsStub, "GetWorkflow", req))

    async def list_workflows(self, name_prefix: str = "", *, all_versions: bool = False) -> list[WorkflowInfo]:
        """Workflows by name then version (only the latest version of each unless `all_versions`).

        Example::

            names = [w.name for w in await client.list_workflows()]
        """
        req = workflows_pb2.ListWorkflowsRequest(name_prefix=name_prefix, all_versions=all_versions)
        resp = await self._call(workflows_pb2_grpc.WorkflowsStub, "ListWorkflows", req)
        return [WorkflowInfo.from_proto(w) for w in resp.workflows]

    # -- starting runs --------------------------------------------------------------------

    async def submit(self, workflow: str | Workflow, input: Any = None, *, version: int = 0, priority: int = 0,
                     idempotency_key: str | None = None, deadline: datetime | Seconds | None = None) -> str:
        """Start a run of a registered workflow; returns its run id.

        `deadline` is a datetime, or seconds / a timedelta from now. With an
        `idempotency_key`, repeating the same request returns the same run.

        Example::

            run_id = await client.submit("etl", {"day": "2026-12-01"}, deadline=3600)
        """
        name = workflow.name if isinstance(workflow, Workflow) else workflow
        req = runs_pb2.SubmitRunRequest(workflow=name, version=version, input=to_value(input, "input"),
                                        priority=priority, idempotency_key=idempotency_key or "",
                                        **deadline_fields(deadline))
        return (await self._call(runs_pb2_grpc.RunsStub, "SubmitRun", req)).run_id

    async def enqueue(self, kind: str, input: Any = None, *, priority: int = 0, idempotency_key: str | None = None,
                      deadline: datetime | Seconds | None = None, scheduled_at: datetime | Seconds | None = None,
                      max_attempts: int | None = None, backoff_initial: Seconds | None = None,
                      backoff_max: Seconds | None = None, max_reclaims: int | None = None,
                      attempt_timeout: Seconds | None = None, retention: Seconds | None = None,
                      limits: Sequence[LimitUse] = ()) -> str:
        """Start a standalone job (a one-node run of step kind `kind`); returns its run id.

        `scheduled_at` is a datetime, or seconds / a timedelta from now. The job consumes
        `limits` (see `LimitUse`), besides those that name its kind.

        Example::

            run_id = await client.enqueue("send_email", {"to": "ada@example.com"}, max_attempts=5)
            await client.enqueue("sync", {"tenant": "acme"}, limits=[LimitUse("per-tenant", key_path="tenant")])
        """
        job = Job(kind, input, priority=priority, idempotency_key=idempotency_key, deadline=deadline,
                  scheduled_at=scheduled_at, max_attempts=max_attempts, backoff_initial=backoff_initial,
                  backoff_max=backoff_max, max_reclaims=max_reclaims, attempt_timeout=attempt_timeout,
                  retention=retention, limits=limits)
        # The trace context is the caller's: the job may be sent by another task.
        return await self._enqueues.enqueue(job.to_proto(), trace_metadata())

    async def enqueue_many(self, jobs: Iterable[Job]) -> list[str]:
        """Start up to 1000 standalone jobs in one call and one transaction (all or none);
        returns their run ids in the same order.

        A bad job fails the whole call, with an error naming it by index (``jobs[3].kind``).

        Example::

            run_ids = await client.enqueue_many(Job("send_email", {"to": a}) for a in addresses)
        """
        jobs = builtins.list(jobs)
        for i, job in enumerate(jobs):
            if not isinstance(job, Job):
                raise TypeError(f"jobs[{i}]: expected a cyclone_worker.Job, got {type(job).__name__}")
        req = runs_pb2.EnqueueManyRequest(jobs=[job.to_proto(f"jobs[{i}]") for i, job in enumerate(jobs)])
        resp = await self._call(runs_pb2_grpc.RunsStub, "EnqueueMany", req)
        return [j.run_id for j in resp.jobs]

    # -- reading ---------------------------------------------------------------------------

    async def get(self, run_id: str) -> Run:
        """A run with all its steps.

        Example::

            run = await client.get(run_id)
            print(run.state, run.step("extract").attempt)
        """
        return Run.from_proto(await self._call(runs_pb2_grpc.RunsStub, "GetRun", runs_pb2.GetRunRequest(run_id=run_id)))

    async def list(self, *, states: Iterable[str] = (), workflow: str | None = None,
                   created_after: datetime | None = None, created_before: datetime | None = None,
                   limit: int = 100, include_steps: bool = False, schedule: str | None = None) -> list[Run]:
        """Up to `limit` runs matching every filter, newest first (`states` are run state words).

        Example::

            failed = await client.list(states=["failed"], workflow="etl", limit=20)
        """
        req = runs_pb2.ListRunsRequest(workflow=workflow or "", include_steps=include_steps,
                                       states=[_run_state(s) for s in states], schedule=schedule or "")
        if created_after is not None:
            req.created_after.CopyFrom(to_timestamp(created_after, "created_after"))
        if created_before is not None:
            req.created_before.CopyFrom(to_timestamp(created_before, "created_before"))
        runs: list[Run] = []
        while len(runs) < limit:
            req.limit = min(limit - len(runs), 1000)
            resp = await self._call(runs_pb2_grpc.RunsStub, "ListRuns", req)
            runs.extend(Run.from_proto(r) for r in resp.runs)
            if not resp.next_page_token:
                break
            req.page_token = resp.next_page_token
        return runs

    async def wait(self, run_id: str, timeout: float | None = None) -> Run:
        """Wait until the run is terminal (completed, failed, cancelled) or `timeout` seconds
        pass (None: forever); returns the run either way (check `run.terminal`).

        Example::

            run = await client.wait(run_id, timeout=60)
            assert run.state == "completed"
        """
        end = None if timeout is None else time.monotonic() + timeout
        while True:
            left = _WAIT_SLICE if end is None else max(0.0, min(_WAIT_SLICE, end - time.monotonic()))
            req = runs_pb2.WaitRunRequest(run_id=run_id, timeout=to_duration(left))
            resp = await self._call(runs_pb2_grpc.RunsStub, "WaitRun", req, timeout=left + self._rpc_timeout)
            run = Run.from_proto(resp.run)
            if run.terminal or (end is not None and time.monotonic() >= end):
                return run

    async def result(self, run_id: str, timeout: float | None = None) -> dict[str, Any]:
        """The result of a completed run: the outputs of its leaf nodes by node id.

        Raises RunFailed or RunCancelled, or TimeoutError when the run is still going.

        Example::

            out = await client.result(run_id, timeout=60)
            print(out["load"])
        """
        run = await self.wait(run_id, timeout)
        if run.state == "completed":
            return run.result if isinstance(run.result, dict) else {}
        if run.state == "failed":
            raise RunFailed(run)
        if run.state == "cancelled":
            raise RunCancelled(run)
        raise TimeoutError(f"run {run_id} is still {run.state} after {timeout} s")

    # -- actions ---------------------------------------------------------------------------

    async def _action(self, method: str, request: Any) -> Run:
        return Run.from_proto((await self._call(runs_pb2_grpc.RunsStub, method, request)).run)

    async def cancel(self, run_id: str) -> Run:
        """Cancel a running or paused run (a no-op on a cancelled one); returns the run.

        Example::

            run = await client.cancel(run_id)
        """
        return await self._action("CancelRun", runs_pb2.CancelRunRequest(run_id=run_id))

    async def pause(self, run_id: str) -> Run:
        """Pause a running run: nothing new starts; running steps finish. Returns the run.

        Example::

            await client.pause(run_id)
        """
        return await self._action("PauseRun", runs_pb2.PauseRunRequest(run_id=run_id))

    async def resume(self, run_id: str) -> Run:
        """Resume a paused run. Returns the run.

        Example::

            await client.resume(run_id)
        """
        return await self._action("ResumeRun", runs_pb2.ResumeRunRequest(run_id=run_id))

    async def retry(self, run_id: str, node: str, *, deadline: datetime | Seconds | None = None) -> Run:
        """Reopen the discarded node `node` with a fresh attempt budget. Returns the run.

        Example::

            run = await client.retry(run_id, "load")
        """
        req = runs_pb2.RetryStepRequest(run_id=run_id, node=node, **deadline_fields(deadline))
        return await self._action("RetryStep", req)

    async def retry_all(self, run_id: str, *, deadline: datetime | Seconds | None = None) -> Run:
        """Reopen every discarded node of the run. Returns the run.

        Example::

            run = await client.retry_all(run_id)
        """
        return await self._action("RetryAll", runs_pb2.RetryAllRequest(run_id=run_id, **deadline_fields(deadline)))

    async def signal(self, run_id: str, name: str, payload: Any = None) -> str:
        """Send signal `name` to a run's mailbox; returns the signal id.

        Example::

            await client.signal(run_id, "approval", {"approved_by": "ada"})
        """
        req = runs_pb2.SignalRequest(run_id=run_id, name=name, payload=to_value(payload, "payload"))
        return (await self._call(runs_pb2_grpc.RunsStub, "Signal", req)).signal_id

    async def purge(self, older_than: Seconds, limit: int = 1000) -> int:
        """Delete up to `limit` terminal runs finished more than `older_than` ago; returns how many.

        A run whose nodes declare a retention is also kept until that retention has passed.

        Example::

            while await client.purge(timedelta(days=30)) == 1000:
                pass
        """
        req = runs_pb2.PurgeTerminalRunsRequest(older_than=to_duration(older_than, "older_than"), limit=limit)
        return (await self._call(runs_pb2_grpc.RunsStub, "PurgeTerminalRuns", req)).deleted

    async def stats(self) -> builtins.list[KindStats]:
        """The backlog per step kind: available, running, oldest available age.

        Example::

            for k in await client.stats():
                print(k.kind, k.available)
        """
        resp = await self._call(admin_pb2_grpc.AdminStub, "GetStats", admin_pb2.GetStatsRequest())
        return [KindStats.from_proto(k) for k in resp.kinds]

    async def workers(self, kind: str | None = None) -> builtins.list[WorkerInfo]:
        """The workers connected to any server of the database (Admin.ListWorkers), by id;
        with `kind`, only those that run it.

        Example::

            if not await client.workers("send_email"):
                print("no worker runs send_email")
        """
        req = admin_pb2.ListWorkersRequest(kind=kind or "")
        resp = await self._call(admin_pb2_grpc.AdminStub, "ListWorkers", req)
        return [WorkerInfo.from_proto(w) for w in resp.workers]
    # -- schedules -------------------------------------------------------------------------

    async def create_schedule(self, name: str, *, workflow: str | Workflow | None = None, job: Job | None = None,
                              input: Any = None, version: int = 0, priority: int = 0,
                              deadline_in: Seconds | None = None, cron: str | None = None, time_zone: str = "UTC",
                              every: Seconds | None = None, offset: Seconds = 0,
                              start_at: datetime | None = None, end_at: datetime | None = None,
                              jitter: Seconds | None = None, note: str = "", overlap: str = "skip",
                              catchup_window: Seconds | None = None, paused: bool = False) -> Schedule:
        """Make a schedule that starts `workflow` (with `input`) or `job` on a `cron` expression
        in `time_zone` or `every` seconds (at `offset`); the same name and settings again
        return the existing schedule. `overlap`: skip, buffer_one, allow_all, cancel_previous.

        Example::

            await client.create_schedule("nightly", workflow="etl", input={"full": True},
                                         cron="0 3 * * *", time_zone="Europe/Paris", overlap="buffer_one")
            await client.create_schedule("ping", job=Job("ping", max_attempts=1), every=30)
        """
        settings = settings_proto(
            workflow=workflow.name if isinstance(workflow, Workflow) else workflow, job=job, input=input,
            version=version, priority=priority, deadline_in=deadline_in, cron=cron, time_zone=time_zone, every=every,
            offset=offset, start_at=start_at, end_at=end_at, jitter=jitter, note=note, overlap=overlap,
            catchup_window=catchup_window)
        req = schedules_pb2.CreateScheduleRequest(name=name, settings=settings, paused=paused)
        return Schedule.from_proto((await self._call(schedules_pb2_grpc.SchedulesStub, "CreateSchedule", req)).schedule)

    async def update_schedule(self, name: str, **settings: Any) -> Schedule:
        """Replace a schedule's settings (the arguments of `create_schedule` but `paused`).

        Example::

            await client.update_schedule("ping", job=Job("ping"), every=60)
        """
        args: dict[str, Any] = dict(workflow=None, job=None, input=None, version=0, priority=0, deadline_in=None,
                                    cron=None, time_zone="UTC", every=None, offset=0, start_at=None, end_at=None,
                                    jitter=None, note="", overlap="skip", catchup_window=None)
        unknown = set(settings) - set(args)
        if unknown:
            raise TypeError(f"update_schedule: unknown argument {sorted(unknown)[0]!r}")
        args.update(settings)
        if isinstance(args["workflow"], Workflow):
            args["workflow"] = args["workflow"].name
        req = schedules_pb2.UpdateScheduleRequest(name=name, settings=settings_proto(**args))
        return Schedule.from_proto(await self._call(schedules_pb2_grpc.SchedulesStub, "UpdateSchedule", req))

    async def get_schedule(self, name: str) -> Schedule:
        """A schedule with its 10 latest runs (`recent_runs`, newest first)."""
        req = schedules_pb2.GetScheduleRequest(name=name)
        return Schedule.from_proto(await self._call(schedules_pb2_grpc.SchedulesStub, "GetSchedule", req))

    async def list_schedules(self, name_prefix: str = "") -> builtins.list[Schedule]:
        """Every schedule whose name starts with `name_prefix`, by name."""
        req = schedules_pb2.ListSchedulesRequest(name_prefix=name_prefix, limit=1000)
        out: builtins.list[Schedule] = []
        while True:
            resp = await self._call(schedules_pb2_grpc.SchedulesStub, "ListSchedules", req)
            out.extend(Schedule.from_proto(m) for m in resp.schedules)
            if not resp.next_page_token:
                return out
            req.page_token = resp.next_page_token

    async def pause_schedule(self, name: str) -> Schedule:
        """Stop a schedule's fires (trigger_schedule still starts runs)."""
        req = schedules_pb2.PauseScheduleRequest(name=name)
        return Schedule.from_proto((await self._call(schedules_pb2_grpc.SchedulesStub, "PauseSchedule", req)).schedule)

    async def resume_schedule(self, name: str) -> Schedule:
        """Fire again, from the first fire time after now."""
        req = schedules_pb2.ResumeScheduleRequest(name=name)
        resp = await self._call(schedules_pb2_grpc.SchedulesStub, "ResumeSchedule", req)
        return Schedule.from_proto(resp.schedule)

    async def delete_schedule(self, name: str) -> None:
        """Delete a schedule; its runs stay."""
        req = schedules_pb2.DeleteScheduleRequest(name=name)
        await self._call(schedules_pb2_grpc.SchedulesStub, "DeleteSchedule", req)

    async def trigger_schedule(self, name: str, *, overlap: str | None = None) -> str | None:
        """Start the schedule's target now; returns the run id, or None when the overlap policy
        (the schedule's, or `overlap`) skipped or buffered it.

        Example::

            run_id = await client.trigger_schedule("nightly", overlap="allow_all")
        """
        req = schedules_pb2.TriggerScheduleRequest(name=name, overlap=overlap_value(overlap))
        resp = await self._call(schedules_pb2_grpc.SchedulesStub, "TriggerSchedule", req)
        return resp.run_id or None
