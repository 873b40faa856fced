"""Schedules: making, changing and reading schedules, and firing them exactly once."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from datetime import datetime, timedelta, timezone
from typing import Any

from psycopg.types.json import Jsonb

from cyclone_server import definitions, schedule_spec
from cyclone_server.errors import AlreadyExists, InvalidArgument, NotFound
from cyclone_server.records import check_payload, request_hash
from cyclone_server.schedule_spec import ScheduleSettings

from .core import Core


_STORED_SETTINGS = ("target", "spec", "start_at", "end_at", "jitter", "note", "overlap", "catchup_window")


def _stored_settings(row: Mapping[str, Any]) -> str:
    """A schedule's settings as stored (defaults filled in, the job's node normalized), from its
    row or from the parameters that write one, as canonical JSON: numbers as floats (25 and
    25.0 agree, as they do once stored; true stays apart from 1), times as UTC instants."""
    return json.dumps({k: _canonical(row[k].obj if isinstance(row[k], Jsonb) else row[k]) for k in _STORED_SETTINGS},
                      sort_keys=True)


def _canonical(value: Any) -> Any:
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, dict):
        return {k: _canonical(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_canonical(v) for v in value]
    if isinstance(value, datetime):
        return value.astimezone(timezone.utc).isoformat()
    if isinstance(value, timedelta):
        return value.total_seconds()
    return str(value)


class ScheduleStore(Core):
    """Schedules and their fire times."""

    # -- schedules -----------------------------------------------------------------------
    # Fire times come from schedule_spec (a cron library); the fire itself is one SQL
    # function call (70_schedules.sql): run and next fire time in one transaction.

    async def create_schedule(self, name: str, settings: ScheduleSettings, *, paused: bool = False,
                              fingerprint: Any = None) -> tuple[dict[str, Any], bool]:
        """Store a schedule; returns (schedule, created). The same name with the same
        settings is a no-op: the same request (`fingerprint`, default the settings), or
        settings that are stored the same (a default given or left out, as GetSchedule
        returns them). Other settings are ALREADY_EXISTS (UpdateSchedule changes a schedule)."""
        definitions.validate_name(name, "name")
        params = await self._schedule_params(name, settings, fingerprint)
        row = await self._one("schedule_insert", **params, paused=paused)
        if row is None:
            row = await self.get_schedule(name, recent_runs=0)
            if row["settings_hash"] != params["settings_hash"] and _stored_settings(row) != _stored_settings(params):
                raise AlreadyExists(f'name: schedule "{name}" already exists with other settings '
                                    "(UpdateSchedule changes it)")
            return row, False
        await self._schedules_changed()
        return {**row, "recent_runs": []}, True

    async def update_schedule(self, name: str, settings: ScheduleSettings, *,
                              fingerprint: Any = None) -> dict[str, Any]:
        """Replace a schedule's settings; its next fire time is computed anew from now."""
        definitions.validate_name(name, "name")
        row = await self._one("schedule_update", **await self._schedule_params(name, settings, fingerprint))
        if row is None:
            raise NotFound(f'schedule "{name}" not found')
        await self._schedules_changed()
        return await self.get_schedule(name)

    async def _schedule_params(self, name: str, settings: ScheduleSettings, fingerprint: Any) -> dict[str, Any]:
        s = settings.check()
        where = f"settings.{s.target_field}"
        check_payload(s.input, f"{where}.input", self.max_payload_bytes)
        target: dict[str, Any] = {"input": s.input, "priority": s.priority, "deadline_in": s.deadline_in}
        if s.workflow is not None:
            definitions.validate_name(s.workflow, f"{where}.workflow")
            if s.version < 0:
                raise InvalidArgument(f"{where}.version: must be >= 0, got {s.version}")
            if await self._one("workflow_get", name=s.workflow, version=s.version) is None:
                raise InvalidArgument(f'{where}.workflow: workflow "{s.workflow}" '
                                      + (f"has no version {s.version}" if s.version else "is not registered"))
            target.update(workflow=s.workflow, version=s.version)
        else:
            try:
                target["job"] = definitions.normalize_job(s.kind or "", s.options or {})
            except InvalidArgument as e:
                # As Enqueue names a job's option: 'nodes[0] (id "x"): max_attempts: ...' -> 'max_attempts: ...'.
                message = e.message.split(": ", 1)[-1] if e.message.startswith("nodes[0]") else e.message
                raise InvalidArgument(f"{where}.{message}") from None
        try:  # what its fires would refuse (the limits it names, their keys), refused now
            await self._one("schedule_target_check", target=Jsonb(target))
        except InvalidArgument as e:
            raise InvalidArgument(f"{where}: {e.message}") from None
        now = datetime.now(timezone.utc)
        first = s.spec.next_after(now)
        fp = fingerprint if fingerprint is not None else dataclasses.asdict(s)
        return {"name": name, "target": Jsonb(target), "spec": Jsonb(s.spec.to_json()),
                "settings_hash": request_hash("schedule", fp), "start_at": s.spec.start_at, "end_at": s.spec.end_at,
                "jitter": timedelta(seconds=s.jitter), "note": s.note, "overlap": s.overlap,
                "catchup_window": timedelta(seconds=s.catchup_window), "next_fire_at": first,
                "next_due_at": schedule_spec.due_at(first, s.jitter)}

    async def _schedules_changed(self) -> None:
        """Wake the schedulers: this server's at once, the others' by NOTIFY cyclone_schedules."""
        for listener in self.schedule_listeners:
            listener()
        await self._all("schedules_changed")

    async def get_schedule(self, name: str, *, recent_runs: int = 10) -> dict[str, Any]:
        """A schedule with its `recent_runs` (newest first: id, state, schedule_fire_at, ...)."""
        row = await self._one("schedule_get", name=name)
        if row is None:
            raise NotFound(f'schedule "{name}" not found')
        row["recent_runs"] = (await self._all("schedule_recent_runs", name=name, limit=recent_runs)
                              if recent_runs else [])
        return row

    async def list_schedules(self, prefix: str = "", *, limit: int = 100,
                             after: str | None = None) -> list[dict[str, Any]]:
        """Schedules by name, those after `after` (the last name of the previous page)."""
        return await self._all("schedules_list", prefix=prefix.replace("%", r"\%").replace("_", r"\_"),
                               after=after, limit=limit)

    async def pause_schedule(self, name: str) -> bool:
        """Stop firing (Trigger still works); False when already paused."""
        applied = await self._one("schedule_pause", name=name) is not None
        if not applied:
            await self.get_schedule(name, recent_runs=0)  # NOT_FOUND
        return applied

    async def resume_schedule(self, name: str) -> bool:
        """Fire again, from the next fire time after now; False when not paused."""
        while True:
            row = await self.get_schedule(name, recent_runs=0)
            if not row["paused"]:
                return False
            spec = schedule_spec.Spec.from_row(row)
            first = spec.next_after(datetime.now(timezone.utc))
            due = schedule_spec.due_at(first, row["jitter"].total_seconds())
            # Guarded by the spec read: an update in between makes this try again.
            if await self._one("schedule_resume", name=name, spec=Jsonb(row["spec"]), next_fire_at=first,
                               next_due_at=due) is not None:
                await self._schedules_changed()
                return True

    async def delete_schedule(self, name: str) -> None:
        """Delete a schedule; its runs stay (with the schedule's name)."""
        if await self._one("schedule_delete", name=name) is None:
            raise NotFound(f'schedule "{name}" not found')

    async def trigger_schedule(self, name: str, overlap: str | None = None) -> dict[str, Any]:
        """Start the target now (fire time: now) under `overlap` or the schedule's policy;
        returns {outcome: started | skipped | buffered, run_id, fire_at}."""
        if overlap is not None and overlap not in schedule_spec.OVERLAP_POLICIES:
            raise InvalidArgument(f"overlap: {overlap!r} is not an overlap policy")
        row = await self._one("schedule_trigger", name=name, policy=overlap)
        assert row is not None
        if row["run_id"] is not None:
            self.announce()
        return row

    async def schedules_due(self, limit: int = 100) -> list[dict[str, Any]]:
        return await self._all("schedules_due", limit=limit)

    async def schedules_next_due(self) -> tuple[float | None, bool]:
        """(seconds until the next due time or None, whether a buffered fire time waits)."""
        row = await self._one("schedules_next_due")
        assert row is not None
        return row["seconds"], row["buffered"]

    async def fire_schedule(self, name: str, expected: datetime, plan: schedule_spec.FirePlan) -> dict[str, Any]:
        """cyclone_schedule_fire: {outcome: started | skipped | buffered | missed | lost | refused, run_id,
        detail (why it was refused)}."""
        row = await self._one("schedule_fire", name=name, expected=expected, missed=plan.missed,
                              fire_at=plan.fire_at, next_fire_at=plan.next_fire_at, next_due_at=plan.next_due_at)
        assert row is not None
        if row["run_id"] is not None:
            self.announce()
        return row

    async def release_schedules(self, limit: int = 100) -> list[dict[str, Any]]:
        """Start the buffered fire times whose previous run ended: [{name, fire_at, run_id}]
        (run_id None: that fire time was refused, and dropped as a miss)."""
        rows = await self._all("schedules_release", limit=limit)
        if any(r["run_id"] is not None for r in rows):
            self.announce()
        return rows
