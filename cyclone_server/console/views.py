"""What the console's pages show: times, durations, JSON, runs, steps and schedules as views; form input read back."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta, timezone
from typing import Any

from cyclone_server.convert import MAX_JSON_DEPTH, py_to_value, value_to_py
from cyclone_server.errors import InvalidArgument
from cyclone_server.records import TERMINAL_RUN_STATES

MAX_SHOWN_JSON = 20_000  # characters of an input, output or result shown inline


def now() -> datetime:
    return datetime.now(timezone.utc)


def fmt_time(value: datetime | None) -> str:
    if value is None:
        return ""
    return value.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


def fmt_seconds(value: float | timedelta | None) -> str:
    """1.23 s, 4 m 05 s, 2 h 03 m, 3 d 4 h."""
    if value is None:
        return ""
    s = value.total_seconds() if isinstance(value, timedelta) else float(value)
    if s < 60:
        return f"{s:.2f} s" if s < 10 else f"{s:.1f} s"
    m, sec = divmod(int(s), 60)
    if m < 60:
        return f"{m} m {sec:02d} s"
    h, m = divmod(m, 60)
    if h < 48:
        return f"{h} h {m:02d} m"
    d, h = divmod(h, 24)
    return f"{d} d {h} h"


def fmt_json(value: Any) -> str:
    text = json.dumps(value, indent=2, ensure_ascii=False, default=str, sort_keys=False)
    if len(text) > MAX_SHOWN_JSON:
        return text[:MAX_SHOWN_JSON] + f"\n... [{len(text) - MAX_SHOWN_JSON} more characters]"
    return text


def run_summary(run: Mapping[str, Any], now: datetime) -> dict[str, Any]:
    """What the runs table and the run page's header show of a run."""
    steps = run.get("steps") or []
    done = sum(1 for s in steps if s["state"] == "completed")
    end = run.get("finished_at") or now
    return {
        "id": str(run["id"]), "state": run["state"],
        "workflow": run.get("workflow_name") or "", "version": run.get("workflow_version") or 0,
        "job_kind": steps[0]["kind"] if not run.get("workflow_name") and steps else "",
        "done": done, "total": len(steps), "age": fmt_seconds(now - run["created_at"]),
        "duration": fmt_seconds(end - run["created_at"]), "created": fmt_time(run["created_at"]),
        "finished": fmt_time(run.get("finished_at")), "terminal": run["state"] in TERMINAL_RUN_STATES,
        "parent": str(run["parent_run_id"]) if run.get("parent_run_id") else "",
        "deadline": fmt_time(run.get("deadline_at")), "priority": run.get("priority", 0),
    }


def step_view(s: Mapping[str, Any], now: datetime) -> dict[str, Any]:
    started, finished = s.get("started_at"), s.get("finished_at")
    return {
        "node": s["node"], "kind": s["kind"], "type": s["type"], "state": s["state"],
        "attempt": s["attempt"], "max_attempts": s["max_attempts"], "reclaims": s["reclaims"],
        "max_reclaims": s["max_reclaims"], "snoozes": s["snoozes"],
        "created": fmt_time(s.get("created_at")), "started": fmt_time(started), "finished": fmt_time(finished),
        "duration": fmt_seconds((finished or now) - started) if started else "",
        "lease_owner": s.get("lease_owner") or "", "lease_expiry": fmt_time(s.get("lease_expiry"))
        if s["state"] == "running" else "",
        "output": fmt_json(s["output"]) if s.get("output") is not None else "",
        "errors": [{"attempt": e.get("attempt"), "error_kind": e.get("error_kind") or "",
                    "message": e.get("message") or "", "details": e.get("details") or "",
                    "at": str(e.get("at") or "")[:19].replace("T", " ")}
                   for e in (s.get("errors") or [])],
        "reason": s.get("reason") or "", "error_kind": s.get("error_kind") or "",
        "cancel_cause": s.get("cancel_cause") or "", "held_by": s.get("held_by") or "",
        "child_run": str(s["child_run_id"]) if s.get("child_run_id") else "",
        "retryable": s["state"] == "discarded",
    }


def _span(seconds: float) -> str:
    """An interval's every or offset, exactly: 0.25 s, 90.5 s, 15 m 00 s, 24 h 00 m."""
    return f"{seconds:g} s" if seconds < 60 or seconds != int(seconds) else fmt_seconds(seconds)


def schedule_view(row: Mapping[str, Any]) -> dict[str, Any]:
    """What the schedules table and the schedule page show of a schedule row (cyclone_schedules)."""
    target, spec = row["target"], row["spec"]
    job = target.get("job")
    if spec.get("cron") is not None:
        when = f"cron {spec['cron']} ({spec.get('time_zone') or 'UTC'})"
    else:
        offset = float(spec.get("offset") or 0)
        when = f"every {_span(float(spec['every']))}" + (f" at offset {_span(offset)}" if offset else "")
    jitter, catchup = row.get("jitter"), row.get("catchup_window")
    return {
        "name": row["name"], "workflow": target.get("workflow") or "", "version": target.get("version") or 0,
        "job_kind": job["kind"] if job else "", "spec": when, "overlap": row["overlap"], "paused": row["paused"],
        "next_fire": fmt_time(row.get("next_fire_at")), "next_due": fmt_time(row.get("next_due_at")),
        "last_fire": fmt_time(row.get("last_fire_at")), "buffered": fmt_time(row.get("buffered_fire_at")),
        "fires": row.get("fires", 0), "misses": row.get("misses", 0), "skips": row.get("skips", 0),
        "note": row.get("note") or "", "start": fmt_time(row.get("start_at")), "end": fmt_time(row.get("end_at")),
        "jitter": fmt_seconds(jitter) if jitter else "", "catchup": fmt_seconds(catchup) if catchup is not None else "",
        "priority": target.get("priority") or 0,
        "deadline_in": fmt_seconds(float(target["deadline_in"])) if target.get("deadline_in") else "",
        "input": fmt_json(target.get("input")), "options": fmt_json(job) if job else "",
        "created": fmt_time(row.get("created_at")), "updated": fmt_time(row.get("updated_at")),
    }


def _per(seconds: float) -> str:
    """A rate's period: 60 -> 'minute', 7200 -> '2 h', 90 -> '90 s'."""
    for unit, name, size in (("d", "day", 86400), ("h", "hour", 3600), ("m", "minute", 60), ("s", "second", 1)):
        if seconds >= size and seconds % size == 0:
            n = int(seconds // size)
            return name if n == 1 else f"{n} {unit}"
    return f"{seconds:g} s"


def limit_view(row: Mapping[str, Any]) -> dict[str, Any]:
    """What the limits page shows of a limit (engine.list_limits: cyclone_limits and its busiest keys)."""
    cap, rate, period = row.get("max_running"), row.get("rate"), row.get("period")
    if row["workflows"]:
        applies = "runs of workflows " + ", ".join(row["workflows"])
    else:
        applies = "steps of kinds " + ", ".join(row["kinds"]) if row["kinds"] else "steps of the nodes that name it"
    keys = [{"key": k["key"], "running": k["running"], "waiting": k["waiting"],
             "oldest": fmt_seconds(k["oldest_waiting_age"]) if k["waiting"] else "",
             "starts": k.get("starts_in_window") or 0, "full": bool(cap) and k["running"] >= cap}
            for k in row.get("keys") or []]
    return {
        "name": row["name"], "scope": row["scope"], "strategy": row["strategy"], "max_running": cap or 0,
        "rate": f"{rate} per {_per(float(period))}" if rate and period else "", "rate_count": rate or 0,
        "applies": applies, "key": ".".join(["input", *row["key_path"]]) if row.get("key_path")
        else json.dumps(row["key_const"], ensure_ascii=False) if row.get("key_const") else "",
        "weights": ", ".join(f"{k}={w}" for k, w in sorted((row.get("weights") or {}).items())),
        "busiest": keys, "updated": fmt_time(row.get("updated_at")),
    }


def timeline(run: Mapping[str, Any], now: datetime) -> list[dict[str, Any]]:
    """Per step, its bar from start to end as percentages of the run's span (created .. finished or now)."""
    start = run["created_at"]
    end = run.get("finished_at") or now
    span = max((end - start).total_seconds(), 1e-3)
    bars = []
    for s in run.get("steps") or []:
        if not s.get("started_at"):
            continue
        a = (s["started_at"] - start).total_seconds()
        b = ((s.get("finished_at") or now) - start).total_seconds()
        left = min(max(a / span * 100, 0.0), 100.0)
        width = min(max((b - a) / span * 100, 0.4), 100.0 - left)
        bars.append({"node": s["node"], "state": s["state"], "left": f"{left:.2f}", "width": f"{width:.2f}",
                     "started": fmt_time(s["started_at"]), "finished": fmt_time(s.get("finished_at")),
                     "duration": fmt_seconds(b - a)})
    return bars


def when(text: str, field: str) -> datetime | None:
    """A time filter from the form: ISO 8601 (the datetime-local input), UTC when it names no zone."""
    text = text.strip()
    if not text:
        return None
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        raise InvalidArgument(f"{field}: {text!r} is not a date and time (YYYY-MM-DDTHH:MM)") from None
    return value if value.tzinfo else value.replace(tzinfo=timezone.utc)


def cursor(text: str) -> tuple[datetime, str] | None:
    if not text:
        return None
    created, _, run_id = text.partition("|")
    try:
        return datetime.fromisoformat(created), str(uuid.UUID(run_id))
    except ValueError:
        raise InvalidArgument("after: not a page cursor of this console") from None


def payload(text: str) -> Any:
    """A signal's JSON payload from the form, held to what the gRPC API accepts (convert.value_to_py:
    no NaN or infinity, no U+0000, bounded nesting)."""
    if not text.strip():
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise InvalidArgument(f"payload: not JSON ({e.msg} at line {e.lineno} column {e.colno})") from None
    except RecursionError:
        raise InvalidArgument(f"payload: nested deeper than {MAX_JSON_DEPTH} levels") from None
    try:
        return value_to_py(py_to_value(value), "payload")
    except RecursionError:
        raise InvalidArgument(f"payload: nested deeper than {MAX_JSON_DEPTH} levels") from None


def nul_in(where: str, items: Iterable[tuple[str, str]]) -> str | None:
    """What names a U+0000 among `items` (name, value), which Postgres cannot store, or None."""
    for name, value in items:
        if "\x00" in name:
            return f"{where}: a name contains the character U+0000"
        if "\x00" in value:
            return f"{where} {name}: contains the character U+0000"
    return None
