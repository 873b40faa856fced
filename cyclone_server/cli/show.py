"""How the `cyclone` CLI shows things: rich tables, a run with its steps and every attempt's error, the live view.

Every time shown is the server's (created_at, started_at, finished_at, StepError.at), in
UTC; a run's duration is finished_at - created_at (or so far, while it runs). Payloads go
through cyclone_worker.values, so 41 prints as 41, not 41.0.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from datetime import datetime, timezone
from typing import Any

from google.protobuf import json_format
from google.protobuf.message import Message
from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

from cyclone_proto import types_pb2
from cyclone_worker.values import from_value, ints_back

STEP_HEADER = ["NODE", "KIND", "TYPE", "STATE", "ATTEMPT", "RECLAIMS", "STARTED (UTC)", "FINISHED (UTC)", "INFO"]
ENDED_STEP_STATES = ("completed", "discarded", "cancelled")


class _Console(Console):
    def on_broken_pipe(self) -> None:
        raise BrokenPipeError  # the CLI's runner ends quietly with 141, for rich's output and print's alike


def console(file: Any = None) -> Console:
    """A console on stdout; off a terminal no colours and no wrapping (lines stay whole for grep)."""
    out = file or sys.stdout
    terminal = out.isatty()
    width = None if terminal else int(os.environ.get("COLUMNS", "0") or 0) or 10_000
    return _Console(file=out, width=width, no_color=not terminal, highlight=False, soft_wrap=not terminal,
                   emoji=False, markup=False)


def table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> Table:
    """Columns separated by two spaces, a bold header, "-" for an empty cell."""
    t = Table(box=None, pad_edge=False, show_edge=False, padding=(0, 1), header_style="bold")
    for name in header:
        t.add_column(name, no_wrap=True, overflow="ellipsis")
    for row in rows:
        t.add_row(*["-" if c in ("", None) else str(c) for c in row])
    return t


def print_lines(c: Console, *items: RenderableType | str) -> None:
    for item in items:
        c.print(item, crop=False, overflow="ignore") if isinstance(item, str) else c.print(item)


def as_json(msg: Message | Sequence[Message]) -> str:
    """The proto JSON mapping, with integral numbers of payloads as integers again."""
    def one(m: Message) -> Any:
        return ints_back(json_format.MessageToDict(m, preserving_proto_field_name=True))
    data = [one(m) for m in msg] if isinstance(msg, Sequence) else one(msg)
    return json.dumps(data, indent=2, ensure_ascii=False)


def payload(value: Any) -> str:
    return json.dumps(from_value(value), ensure_ascii=False)


def _state(enum: Any, value: int, prefix: str) -> str:
    return enum.Name(value)[len(prefix):].lower() if value in enum.values() else str(value)


def run_state(run: types_pb2.Run) -> str:
    return _state(types_pb2.RunState, run.state, "RUN_STATE_")


def step_state(step: types_pb2.Step) -> str:
    return _state(types_pb2.StepState, step.state, "STEP_STATE_")


def node_type(value: int) -> str:
    return _state(types_pb2.NodeType, value, "NODE_TYPE_")


def when(msg: Message, field: str) -> datetime | None:
    return getattr(msg, field).ToDatetime(tzinfo=timezone.utc) if msg.HasField(field) else None


def ts(msg: Message, field: str) -> str:
    t = when(msg, field)
    return t.strftime("%Y-%m-%d %H:%M:%S") if t else "-"


def clock(msg: Message, field: str) -> str:
    t = when(msg, field)
    return t.strftime("%H:%M:%S.%f")[:-3] if t else ""


def age(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f}s"
    m, s = divmod(int(seconds), 60)
    return f"{m}m{s:02d}s" if m < 60 else f"{m // 60}h{m % 60:02d}m"


def run_duration(run: types_pb2.Run) -> str:
    """'4.2s' from the server's timestamps: created to finished, or to now while it runs."""
    start = when(run, "created_at")
    if start is None:
        return "-"
    end = when(run, "finished_at") or datetime.now(timezone.utc)
    return age(max((end - start).total_seconds(), 0.0)) + ("" if run.HasField("finished_at") else " so far")


def step_info(s: types_pb2.Step) -> str:
    state = step_state(s)
    if state == "discarded":
        last = s.errors[-1].message if s.errors else ""
        return f"{s.error_kind}" + (f" ({s.reason})" if s.reason else "") + (f": {last[:60]}" if last else "")
    if s.held_by:  # an available step a limit holds back
        return f"waiting: {s.held_by}"
    return {"cancelled": f"cause: {s.cancel_cause}", "running": f"worker {s.lease_owner}",
            "completed": f"by {s.lease_owner}" if s.lease_owner else ""}.get(
        state, f"child run {s.child_run_id}" if s.child_run_id else "")


def step_rows(run: types_pb2.Run) -> list[list[Any]]:
    return [[s.node, s.kind, node_type(s.type), step_state(s),
             f"{s.attempt}/{s.max_attempts}" if s.type == types_pb2.NODE_TYPE_TASK else "", s.reclaims or "",
             ts(s, "started_at"), ts(s, "finished_at"), step_info(s)] for s in run.steps]


def error_rows(run: types_pb2.Run) -> list[list[Any]]:
    """Every attempt's error of every step, oldest first."""
    return [[s.node, e.attempt, ts(e, "at"), e.error_kind + (f" ({e.reason})" if e.reason else ""), e.message]
            for s in run.steps for e in s.errors]


def run_view(run: types_pb2.Run) -> Group:
    what = f"{run.workflow} v{run.workflow_version}" if run.workflow else "standalone job"
    lines = [f"run       {run.id}  ({what})", f"state     {run_state(run)}",
             f"created   {ts(run, 'created_at')}   finished {ts(run, 'finished_at')}   "
             f"duration {run_duration(run)}"]
    if run.HasField("deadline"):
        lines.append(f"deadline  {ts(run, 'deadline')}")
    if run.parent_run_id:
        lines.append(f"parent    {run.parent_run_id}")
    if run.HasField("result"):
        lines.append(f"result    {payload(run.result)[:200]}")
    parts: list[RenderableType] = [Text("\n".join(lines)), Text(""), table(STEP_HEADER, step_rows(run))]
    errors = error_rows(run)
    if errors:
        parts += [Text(""), Text("errors, every attempt:"), table(["NODE", "ATTEMPT", "AT (UTC)", "KIND", "MESSAGE"],
                                                                  errors)]
    return Group(*parts)


def workflow_view(w: Any) -> list[RenderableType | str]:
    """A workflows_pb2.Workflow: its name, version, and one row per node."""
    rows = [[n.id, n.kind, node_type(n.type), ",".join(n.deps), n.max_attempts if n.type == types_pb2.NODE_TYPE_TASK
             else "", _state(types_pb2.OnDepFailure, n.on_dep_failure, "ON_DEP_FAILURE_")] for n in w.nodes]
    return [f"workflow  {w.name} v{w.version}  (registered {ts(w, 'created_at')} UTC)", "",
            table(["NODE", "KIND", "TYPE", "DEPS", "MAX ATTEMPTS", "ON DEP FAILURE"], rows)]


def progress(run: types_pb2.Run, width: int = 20) -> str:
    done = sum(step_state(s) in ENDED_STEP_STATES for s in run.steps)
    n = max(len(run.steps), 1)
    bar = "#" * (width * done // n) + "-" * (width - width * done // n)
    return f"[{bar}] {done}/{len(run.steps)} steps ended · run {run_state(run)} · {run_duration(run)}"


def live_view(run: types_pb2.Run) -> Group:
    return Group(Text(progress(run)), table(STEP_HEADER, step_rows(run)))


def step_change_time(s: types_pb2.Step) -> str:
    """When the step entered its state, by the server's clock (HH:MM:SS.mmm UTC)."""
    state = step_state(s)
    field = ("finished_at" if state in ENDED_STEP_STATES else "started_at" if state == "running"
             else "scheduled_at" if s.HasField("scheduled_at") else "created_at")
    return clock(s, field) or clock(s, "created_at") or "-"


__all__ = ["console", "table", "workflow_view", "print_lines", "as_json", "run_view", "live_view", "progress", "step_rows", "error_rows",
           "run_state", "step_state", "step_info", "step_change_time", "run_duration", "payload", "ts", "age"]
