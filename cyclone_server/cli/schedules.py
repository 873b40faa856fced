"""`cyclone schedules ...`: make, read and steer schedules over gRPC (the Schedules service), as tables or JSON.

Each command is one call of the public API, as `cyclone runs ...` (cli/runs.py), whose
connection options and exit codes it shares: 0 success, 1 an RPC failed (status and
message on stderr), 2 bad arguments.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

from google.protobuf.message import Message
from rich.console import Console
from rich.table import Table

from cyclone_proto import runs_pb2, schedules_pb2, types_pb2
from cyclone_worker.values import to_value

from .common import Client, Command, HelpFormatter, Leaves, duration, json_arg, pb_duration
from .start import BadInput
from .show import as_json, console, ts

POLICIES = ["skip", "buffer_one", "allow_all", "cancel_previous"]


def _when(text: str) -> datetime:
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an ISO 8601 time like 2027-01-01T00:00:00Z") from None
    return when if when.tzinfo else when.replace(tzinfo=timezone.utc)


def _policy(value: int) -> str:
    return schedules_pb2.OverlapPolicy.Name(value).removeprefix("OVERLAP_POLICY_").lower()


def _spec(s: schedules_pb2.ScheduleSettings) -> str:
    if s.HasField("cron"):
        return f"cron {s.cron.expression} ({s.cron.time_zone})"
    every = s.interval.every.ToTimedelta().total_seconds()
    offset = s.interval.offset.ToTimedelta().total_seconds()
    return f"every {every:g}s" + (f" +{offset:g}s" if offset else "")


def _utc(msg: Message, field: str) -> str:
    """A time in UTC, or - when unset."""
    return f"{ts(msg, field)} UTC" if msg.HasField(field) else "-"


def _target(s: schedules_pb2.ScheduleSettings) -> str:
    return f"workflow {s.run.workflow}" if s.HasField("run") else f"job {s.job.kind}"


def _print(a: argparse.Namespace, msg: Message | list[Message], render: Callable[[Console], None]) -> int:
    if a.json:
        print(as_json(msg))
    else:
        render(console())
    return 0


def _show_one(a: argparse.Namespace, s: schedules_pb2.Schedule, note: str = "") -> int:
    def render(out: Console) -> None:
        state = "paused" if s.paused else "active"
        out.print(f"schedule  {s.name}  {state}{note}")
        out.print(f"target    {_target(s.settings)}")
        out.print(f"spec      {_spec(s.settings)}   overlap {_policy(s.settings.overlap)}")
        out.print(f"next      {_utc(s, 'next_fire_at')}   last {_utc(s, 'last_fire_at')}"
                  + (f"   buffered {_utc(s, 'buffered_fire_at')}" if s.HasField("buffered_fire_at") else ""))
        out.print(f"counts    fires {s.fires}   misses {s.misses}   skips {s.skips}")
        if s.settings.note:
            out.print(f"note      {s.settings.note}")
        if s.recent_runs:
            table = Table("RUN", "FIRE TIME (UTC)", "STATE", box=None, pad_edge=False)
            for r in s.recent_runs:
                table.add_row(r.run_id, ts(r, "fire_at"), types_pb2.RunState.Name(r.state).removeprefix(
                    "RUN_STATE_").lower())
            out.print()
            out.print(table)
    return _print(a, s, render)


# Options that belong to one target or one spec: given with the other, they are refused, not dropped.
_ONLY_WITH = {"max_attempts": ("--max-attempts", "job"), "version": ("--version", "workflow"),
              "time_zone": ("--time-zone", "cron"), "offset": ("--offset", "every")}


def settings_of(a: argparse.Namespace) -> schedules_pb2.ScheduleSettings:
    for name, (flag, needs) in _ONLY_WITH.items():
        if getattr(a, name) is not None and getattr(a, needs) is None:
            raise BadInput(f"{flag} applies only with --{needs.replace('_', '-')}")
    s = schedules_pb2.ScheduleSettings(note=a.note or "")
    if a.overlap:
        s.overlap = schedules_pb2.OverlapPolicy.Value("OVERLAP_POLICY_" + a.overlap.upper())
    input_ = to_value(a.input, "input") if a.input is not None else None
    if a.workflow:
        s.run.CopyFrom(runs_pb2.SubmitRunRequest(workflow=a.workflow, version=a.version or 0, priority=a.priority))
        target: Any = s.run
    else:
        s.job.CopyFrom(runs_pb2.EnqueueRequest(kind=a.job, priority=a.priority))
        if a.max_attempts is not None:
            s.job.max_attempts = a.max_attempts
        target = s.job
    if input_ is not None:
        target.input.CopyFrom(input_)
    if a.deadline_in:
        target.deadline_in.CopyFrom(pb_duration(a.deadline_in))
    if a.cron:
        s.cron.CopyFrom(schedules_pb2.CronSpec(expression=a.cron, time_zone=a.time_zone or "UTC"))
    else:
        s.interval.CopyFrom(schedules_pb2.IntervalSpec(every=pb_duration(a.every),
                                                       offset=pb_duration(a.offset or 0.0)))
    for name in ("start_at", "end_at"):
        when = getattr(a, name)
        if when is not None:
            getattr(s, name).FromDatetime(when.astimezone(timezone.utc))
    if a.jitter:
        s.jitter.CopyFrom(pb_duration(a.jitter))
    if a.catchup_window is not None:
        s.catchup_window.CopyFrom(pb_duration(a.catchup_window))
    return s


async def cmd_list(c: Client, a: argparse.Namespace) -> int:
    req = schedules_pb2.ListSchedulesRequest(name_prefix=a.prefix, limit=1000)
    found: list[schedules_pb2.Schedule] = []
    while True:
        resp = await c.schedules.ListSchedules(req, timeout=c.timeout)
        found.extend(resp.schedules)
        if not resp.next_page_token:
            break
        req.page_token = resp.next_page_token

    def render(out: Console) -> None:
        table = Table("NAME", "TARGET", "SPEC", "OVERLAP", "STATE", "NEXT FIRE (UTC)", "FIRES", "MISSES", "SKIPS",
                      box=None, pad_edge=False)
        for s in found:
            table.add_row(s.name, _target(s.settings), _spec(s.settings), _policy(s.settings.overlap),
                          "paused" if s.paused else "active", ts(s, "next_fire_at"), str(s.fires), str(s.misses),
                          str(s.skips))
        out.print(table)
    return _print(a, found, render)


async def cmd_get(c: Client, a: argparse.Namespace) -> int:
    return _show_one(a, await c.schedules.GetSchedule(schedules_pb2.GetScheduleRequest(name=a.name), timeout=c.timeout))


async def cmd_create(c: Client, a: argparse.Namespace) -> int:
    resp = await c.schedules.CreateSchedule(schedules_pb2.CreateScheduleRequest(
        name=a.name, settings=settings_of(a), paused=a.paused), timeout=c.timeout)
    return _show_one(a, resp.schedule, "" if resp.created else " (no change: it existed with these settings)")


async def cmd_update(c: Client, a: argparse.Namespace) -> int:
    s = await c.schedules.UpdateSchedule(schedules_pb2.UpdateScheduleRequest(name=a.name, settings=settings_of(a)),
                                  timeout=c.timeout)
    return _show_one(a, s)


def _action(rpc: str, request: Callable[[str], Message]) -> Command:
    async def cmd(c: Client, a: argparse.Namespace) -> int:
        resp = await getattr(c.schedules, rpc)(request(a.name), timeout=c.timeout)
        return _show_one(a, resp.schedule, "" if resp.applied else " (no change: it already was)")
    return cmd


async def cmd_runs(c: Client, a: argparse.Namespace) -> int:
    # NOT_FOUND for a mistyped name, rather than an empty table.
    await c.schedules.GetSchedule(schedules_pb2.GetScheduleRequest(name=a.name), timeout=c.timeout)
    resp = await c.runs.ListRuns(runs_pb2.ListRunsRequest(schedule=a.name, limit=a.limit), timeout=c.timeout)

    def render(out: Console) -> None:
        table = Table("RUN", "FIRE TIME (UTC)", "STATE", "CREATED (UTC)", "FINISHED (UTC)", box=None, pad_edge=False)
        for r in resp.runs:
            table.add_row(r.id, ts(r, "schedule_fire_at"), types_pb2.RunState.Name(r.state).removeprefix(
                "RUN_STATE_").lower(), ts(r, "created_at"), ts(r, "finished_at"))
        out.print(table)
    return _print(a, list(resp.runs), render)


async def cmd_delete(c: Client, a: argparse.Namespace) -> int:
    resp = await c.schedules.DeleteSchedule(schedules_pb2.DeleteScheduleRequest(name=a.name), timeout=c.timeout)
    return _print(a, resp, lambda out: out.print(f"schedule {a.name} deleted (its runs stay)"))


async def cmd_trigger(c: Client, a: argparse.Namespace) -> int:
    overlap = schedules_pb2.OverlapPolicy.Value("OVERLAP_POLICY_" + a.overlap.upper()) if a.overlap else 0
    resp = await c.schedules.TriggerSchedule(schedules_pb2.TriggerScheduleRequest(name=a.name, overlap=overlap),
                                      timeout=c.timeout)
    outcome = schedules_pb2.FireOutcome.Name(resp.outcome).removeprefix("FIRE_OUTCOME_").lower()
    return _print(a, resp, lambda out: out.print(
        f"schedule {a.name}: {outcome}" + (f", run {resp.run_id}" if resp.run_id else "")))


def _settings_arguments(p: argparse.ArgumentParser) -> None:
    target = p.add_mutually_exclusive_group(required=True)
    target.add_argument("--workflow", help="start a run of this registered workflow")
    target.add_argument("--job", metavar="KIND", help="start a standalone job of this kind")
    spec = p.add_mutually_exclusive_group(required=True)
    spec.add_argument("--cron", help="5 fields, or 6 with seconds first, e.g. '0 3 * * MON-FRI'")
    spec.add_argument("--every", type=duration, help="a fixed interval, e.g. 30s, 15m")
    p.add_argument("--time-zone", help="IANA time zone of --cron (default UTC)")
    p.add_argument("--offset", type=duration, help="shift of --every from the epoch grid")
    p.add_argument("--input", type=json_arg, help="run input as JSON (default null)")
    p.add_argument("--version", type=int, help="workflow version of --workflow (default: the latest)")
    p.add_argument("--priority", type=int, default=0, help="each run's priority (lower is claimed first)")
    p.add_argument("--max-attempts", type=int, help="job option (--job)")
    p.add_argument("--deadline-in", type=duration, help="each run's deadline after its start")
    p.add_argument("--overlap", choices=POLICIES, help="while a previous run is active (default skip)")
    p.add_argument("--catchup-window", type=duration, help="missed fire times this recent still start (default 1m)")
    p.add_argument("--jitter", type=duration, help="random delay of up to this after each fire time")
    p.add_argument("--start-at", type=_when, help="no fire time before (ISO 8601; UTC unless given)")
    p.add_argument("--end-at", type=_when, help="no fire time after (ISO 8601)")
    p.add_argument("--note", help="free text for operators")


def register(subparsers: argparse._SubParsersAction, leaves: Leaves) -> None:  # type: ignore[type-arg]
    """Add `schedules` with its commands."""

    group = subparsers.add_parser("schedules", help="make, read and steer schedules",
                                  formatter_class=HelpFormatter).add_subparsers(
        dest="schedules_command", required=True, metavar="COMMAND")

    def leaf(name: str, cmd: Command, help: str, *, named: bool = True) -> argparse.ArgumentParser:
        return leaves(group, name, cmd, help, *(["name=the schedule's name"] if named else []))

    p = leaf("list", cmd_list, "schedules by name, with their next fire time and counters", named=False)
    p.add_argument("--prefix", default="", help="only names starting with this")
    leaf("get", cmd_get, "one schedule with its recent runs")
    p = leaf("create", cmd_create, "make a schedule (the same settings again change nothing)")
    _settings_arguments(p)
    p.add_argument("--paused", action="store_true", help="make it paused")
    _settings_arguments(leaf("update", cmd_update, "replace a schedule's settings"))
    leaf("pause", _action("PauseSchedule", lambda n: schedules_pb2.PauseScheduleRequest(name=n)), "stop firing")
    leaf("resume", _action("ResumeSchedule", lambda n: schedules_pb2.ResumeScheduleRequest(name=n)),
         "fire again, from the next fire time after now")
    p = leaf("runs", cmd_runs, "the schedule's runs, newest first")
    p.add_argument("--limit", type=int, default=20, help="how many runs")
    leaf("delete", cmd_delete, "delete a schedule (its runs stay)")
    p = leaf("trigger", cmd_trigger, "start the target now")
    p.add_argument("--overlap", choices=POLICIES, help="this trigger's policy (default: the schedule's)")


__all__ = ["register"]
