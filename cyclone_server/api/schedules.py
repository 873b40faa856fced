"""The Schedules gRPC service: messages to ScheduleSettings and schedule rows to messages; the rules live in
the engine, schedule_spec and 70_schedules.sql."""

from __future__ import annotations

import base64
import json
from typing import Any

import grpc

from cyclone_proto import runs_pb2, schedules_pb2, schedules_pb2_grpc

from cyclone_server import convert, definitions
from cyclone_server.auth import TokenAuthInterceptor
from cyclone_server.store.engine import Engine
from cyclone_server.errors import InvalidArgument, PermissionDenied
from cyclone_server.schedule_spec import DEFAULT_CATCHUP_WINDOW, OVERLAP_POLICIES, ScheduleSettings, Spec
from .common import MAX_DEADLINE_IN, non_negative, plain_text, required, rpc
from .runs import _job_of

LIST_DEFAULT, LIST_MAX = 100, 1000
# OverlapPolicy numbers <-> the words of the database (0, unspecified, is the default: skip).
CANCEL_METHOD = "/cyclone.v1.Runs/CancelRun"  # who may cancel runs may use the overlap policy cancel_previous
_POLICY_NUMBER = {"skip": 1, "buffer_one": 2, "allow_all": 3, "cancel_previous": 4}
_POLICY_WORD = {number: word for word, number in _POLICY_NUMBER.items()}
_OUTCOMES = {"started": schedules_pb2.FIRE_OUTCOME_STARTED, "skipped": schedules_pb2.FIRE_OUTCOME_SKIPPED,
             "buffered": schedules_pb2.FIRE_OUTCOME_BUFFERED}
assert set(_POLICY_NUMBER) == set(OVERLAP_POLICIES)


def policy_of(value: int, field: str) -> str | None:
    """An OverlapPolicy number as its word; None for unspecified."""
    if value == 0:
        return None
    if value not in _POLICY_WORD:
        raise InvalidArgument(f"{field}: {value} is not an overlap policy "
                              f"(1 skip, 2 buffer_one, 3 allow_all, 4 cancel_previous)")
    return _POLICY_WORD[value]


def _not_for_schedules(msg: Any, where: str, *names: str) -> None:
    for name in names:
        if name in ("deadline", "scheduled_at"):
            given = convert.timestamp_dt(msg, name, field=f"{where}.{name}") is not None  # out of range: that first
        else:
            given = bool(getattr(msg, name))
        if given:
            raise InvalidArgument(f"{where}.{name}: not allowed in a schedule (each fire is a run of its own; "
                                  "deadline_in counts from each start)")


def _prefixed(where: str, e: InvalidArgument) -> InvalidArgument:
    return InvalidArgument(f"{where}.{e.message}")


def settings_of(msg: schedules_pb2.ScheduleSettings) -> ScheduleSettings:
    """The request's settings, read and checked as far as the wire goes (INVALID_ARGUMENT naming the field)."""
    target: dict[str, Any] = {}
    which = msg.WhichOneof("target")
    if which == "run":
        r = msg.run
        _not_for_schedules(r, "settings.run", "idempotency_key", "deadline")
        try:
            deadline_in = convert.duration_seconds(r, "deadline_in", positive=True, maximum=MAX_DEADLINE_IN)
            target = {"workflow": required(r.workflow, "workflow"), "version": non_negative(r.version, "version"),
                      "input": convert.optional_value(r, "input"), "priority": r.priority, "deadline_in": deadline_in}
        except InvalidArgument as e:
            raise _prefixed("settings.run", e) from None
    elif which == "job":
        j = msg.job
        _not_for_schedules(j, "settings.job", "idempotency_key", "deadline", "scheduled_at")
        try:
            job = _job_of(j)
            target = {"kind": job.kind, "options": dict(job.options), "input": job.input, "priority": job.priority,
                      "deadline_in": convert.duration_seconds(j, "deadline_in", positive=True, maximum=MAX_DEADLINE_IN)}
        except InvalidArgument as e:
            raise _prefixed("settings.job", e) from None
    spec_kind = msg.WhichOneof("spec")
    when = {"start_at": convert.timestamp_dt(msg, "start_at", field="settings.start_at"),
            "end_at": convert.timestamp_dt(msg, "end_at", field="settings.end_at")}
    if spec_kind == "cron":
        spec = Spec(cron=required(msg.cron.expression, "settings.cron.expression"),
                    time_zone=msg.cron.time_zone or "UTC", **when)
    elif spec_kind == "interval":
        every = convert.duration_seconds(msg.interval, "every", field="settings.interval.every", positive=True) or 0.0
        offset = convert.duration_seconds(msg.interval, "offset", field="settings.interval.offset") or 0.0
        spec = Spec(every=every, offset=offset, **when)
    else:
        spec = Spec(**when)  # check() names what is missing
    jitter = convert.duration_seconds(msg, "jitter", field="settings.jitter")
    window = convert.duration_seconds(msg, "catchup_window", field="settings.catchup_window")
    return ScheduleSettings(
        spec, jitter=jitter or 0.0, note=msg.note, overlap=policy_of(msg.overlap, "settings.overlap") or "skip",
        catchup_window=DEFAULT_CATCHUP_WINDOW if window is None else window, **target).check()


def settings_to_proto(row: dict[str, Any]) -> schedules_pb2.ScheduleSettings:
    s = schedules_pb2.ScheduleSettings(note=row["note"], overlap=_POLICY_NUMBER[row["overlap"]])
    target = row["target"]
    if target.get("deadline_in") is not None:
        deadline_in = convert.to_duration(target["deadline_in"])
    else:
        deadline_in = None
    if "job" in target:
        node = target["job"]
        s.job.CopyFrom(runs_pb2.EnqueueRequest(kind=node["kind"], priority=target.get("priority") or 0,
                                               max_attempts=node["max_attempts"], max_reclaims=node["max_reclaims"]))
        for name in ("backoff_initial", "backoff_max", "attempt_timeout", "retention"):
            if node.get(name) is not None:
                getattr(s.job, name).CopyFrom(convert.to_duration(node[name]))
        convert.py_to_value(target.get("input"), s.job.input)
        if deadline_in is not None:
            s.job.deadline_in.CopyFrom(deadline_in)
    else:
        s.run.CopyFrom(runs_pb2.SubmitRunRequest(workflow=target["workflow"], version=target.get("version") or 0,
                                                 priority=target.get("priority") or 0))
        convert.py_to_value(target.get("input"), s.run.input)
        if deadline_in is not None:
            s.run.deadline_in.CopyFrom(deadline_in)
    spec = row["spec"]
    if "cron" in spec:
        s.cron.CopyFrom(schedules_pb2.CronSpec(expression=spec["cron"], time_zone=spec.get("time_zone") or "UTC"))
    else:
        s.interval.CopyFrom(schedules_pb2.IntervalSpec(every=convert.to_duration(spec["every"]),
                                                       offset=convert.to_duration(spec.get("offset") or 0.0)))
    for name in ("start_at", "end_at"):
        convert._set_time(s, name, row.get(name))
    s.jitter.CopyFrom(convert.to_duration(row["jitter"]))
    s.catchup_window.CopyFrom(convert.to_duration(row["catchup_window"]))
    return s


def schedule_to_proto(row: dict[str, Any]) -> schedules_pb2.Schedule:
    """A schedule row (with recent_runs when read with them) -> Schedule."""
    m = schedules_pb2.Schedule(name=row["name"], settings=settings_to_proto(row), paused=row["paused"],
                               fires=row["fires"], misses=row["misses"], skips=row["skips"])
    names = ["buffered_fire_at", "last_fire_at", "created_at", "updated_at"]
    if not row["paused"]:
        names += ["next_fire_at", "next_due_at"]
    for name in names:
        convert._set_time(m, name, row.get(name))
    for r in row.get("recent_runs") or []:
        run = m.recent_runs.add(run_id=str(r["id"]), state=convert.RUN_STATES[r["state"]])
        convert._set_time(run, "fire_at", r["schedule_fire_at"])
        convert._set_time(run, "created_at", r["created_at"])
    return m


def _name(value: str) -> str:
    return definitions.validate_name(required(value, "name"))


class SchedulesServicer(schedules_pb2_grpc.SchedulesServicer):
    """cyclone.v1.Schedules."""

    def __init__(self, engine: Engine, tokens: TokenAuthInterceptor | None = None) -> None:
        self.engine = engine
        self.tokens = tokens  # the server's bearer tokens, when it has any (auth.server_security)

    def _may_cancel(self, context: grpc.aio.ServicerContext, overlap: str | None, field: str) -> None:
        """The overlap policy cancel_previous cancels runs, as Runs/CancelRun does: only a caller
        who may call CancelRun (role admin) may set it on a schedule or trigger under it. Every
        other schedule call is open to role submit (auth.METHOD_ROLES)."""
        if overlap == "cancel_previous" and not self._admin(context):
            raise PermissionDenied(f"{field}: the overlap policy cancel_previous cancels runs, which needs the role "
                                   f"that may call {CANCEL_METHOD} (admin)")

    def _admin(self, context: grpc.aio.ServicerContext) -> bool:
        """Whether the caller's token may call Runs/CancelRun (always, on a server without tokens)."""
        return self.tokens is None or self.tokens.check(CANCEL_METHOD, context.invocation_metadata()) is None

    @rpc
    async def CreateSchedule(self, request: schedules_pb2.CreateScheduleRequest,
                             context: grpc.aio.ServicerContext) -> schedules_pb2.CreateScheduleResponse:
        name = _name(request.name)
        settings = settings_of(request.settings)
        self._may_cancel(context, settings.overlap, "settings.overlap")
        # The settings as sent identify the request for "same name, same settings".
        row, created = await self.engine.create_schedule(
            name, settings, paused=request.paused,
            fingerprint=request.settings.SerializeToString(deterministic=True).hex())
        return schedules_pb2.CreateScheduleResponse(schedule=schedule_to_proto(row), created=created)

    @rpc
    async def GetSchedule(self, request: schedules_pb2.GetScheduleRequest,
                          context: grpc.aio.ServicerContext) -> schedules_pb2.Schedule:
        return schedule_to_proto(await self.engine.get_schedule(_name(request.name)))

    @rpc
    async def ListSchedules(self, request: schedules_pb2.ListSchedulesRequest,
                            context: grpc.aio.ServicerContext) -> schedules_pb2.ListSchedulesResponse:
        limit = min(non_negative(request.limit, "limit") or LIST_DEFAULT, LIST_MAX)
        prefix = plain_text(request.name_prefix, "name_prefix")
        after = _decode_token(request.page_token, prefix) if request.page_token else None
        rows = await self.engine.list_schedules(prefix, limit=limit + 1, after=after)
        token = ""
        if len(rows) > limit:
            rows = rows[:limit]
            token = _encode_token(rows[-1]["name"], prefix)
        return schedules_pb2.ListSchedulesResponse(schedules=[schedule_to_proto(r) for r in rows],
                                                   next_page_token=token)

    @rpc
    async def UpdateSchedule(self, request: schedules_pb2.UpdateScheduleRequest,
                             context: grpc.aio.ServicerContext) -> schedules_pb2.Schedule:
        name = _name(request.name)
        settings = settings_of(request.settings)
        self._may_cancel(context, settings.overlap, "settings.overlap")
        row = await self.engine.update_schedule(
            name, settings, fingerprint=request.settings.SerializeToString(deterministic=True).hex())
        return schedule_to_proto(row)

    @rpc
    async def PauseSchedule(self, request: schedules_pb2.PauseScheduleRequest,
                            context: grpc.aio.ServicerContext) -> schedules_pb2.ScheduleActionResponse:
        name = _name(request.name)
        applied = await self.engine.pause_schedule(name)
        row = await self.engine.get_schedule(name)
        return schedules_pb2.ScheduleActionResponse(schedule=schedule_to_proto(row), applied=applied)

    @rpc
    async def ResumeSchedule(self, request: schedules_pb2.ResumeScheduleRequest,
                             context: grpc.aio.ServicerContext) -> schedules_pb2.ScheduleActionResponse:
        name = _name(request.name)
        applied = await self.engine.resume_schedule(name)
        row = await self.engine.get_schedule(name)
        return schedules_pb2.ScheduleActionResponse(schedule=schedule_to_proto(row), applied=applied)

    @rpc
    async def DeleteSchedule(self, request: schedules_pb2.DeleteScheduleRequest,
                             context: grpc.aio.ServicerContext) -> schedules_pb2.DeleteScheduleResponse:
        await self.engine.delete_schedule(_name(request.name))
        return schedules_pb2.DeleteScheduleResponse()

    @rpc
    async def TriggerSchedule(self, request: schedules_pb2.TriggerScheduleRequest,
                              context: grpc.aio.ServicerContext) -> schedules_pb2.TriggerScheduleResponse:
        name = _name(request.name)
        overlap = policy_of(request.overlap, "overlap")
        if overlap is None and not self._admin(context):
            # The schedule's own policy applies: checked, and passed on as checked, so that a
            # change of the schedule meanwhile cannot slip cancel_previous past the check.
            overlap = (await self.engine.get_schedule(name, recent_runs=0))["overlap"]
            self._may_cancel(context, overlap, "the schedule's overlap policy")
        else:
            self._may_cancel(context, overlap, "overlap")
        row = await self.engine.trigger_schedule(name, overlap)
        resp = schedules_pb2.TriggerScheduleResponse(outcome=_OUTCOMES[row["outcome"]],
                                                     run_id=str(row["run_id"]) if row["run_id"] else "")
        convert._set_time(resp, "fire_at", row["fire_at"])
        return resp


_TOKEN_KIND = "schedules"  # in every ListSchedules token, so that another call's token is told apart
MAX_TOKEN = 4096  # characters: more than a name (128) and a prefix (256 characters) in UTF-8 JSON, in base64


def _encode_token(after: str, prefix: str) -> str:
    raw = json.dumps({"k": _TOKEN_KIND, "a": after, "p": prefix}, separators=(",", ":"), ensure_ascii=False)
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def _decode_token(token: str, prefix: str) -> str:
    """The name a page ends with; INVALID_ARGUMENT for a token ListSchedules did not issue, or
    issued for another name_prefix."""
    try:
        if len(token) > MAX_TOKEN:  # longer than any this server issues (and too deep to parse, maybe)
            raise ValueError(token)
        raw = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
        kind, after, issued_for = raw["k"], raw["a"], raw["p"]
    except (ValueError, TypeError, KeyError, UnicodeDecodeError, RecursionError):
        kind = after = issued_for = None
    if kind != _TOKEN_KIND or not isinstance(after, str):
        raise InvalidArgument("page_token: not a token issued by ListSchedules")
    if issued_for != prefix:
        raise InvalidArgument("page_token: issued for another name_prefix")
    return after
