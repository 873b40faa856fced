"""Reads: runs with their steps from one snapshot, run lists, stats and ended runs."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from cyclone_server.errors import InvalidArgument, NotFound
from cyclone_server.records import RUN_STATES, parse_id

from .core import Core, run_with_steps


def _id_range(prefix: str) -> dict[str, uuid.UUID | None]:
    """The ids starting with `prefix` (hex digits, dashes ignored) as a range: uuids order as their bytes."""
    digits = prefix.replace("-", "").lower()
    if not digits:
        return {"id_min": None, "id_max": None}
    if len(digits) > 32 or not all(c in "0123456789abcdef" for c in digits):
        raise InvalidArgument(f"id_prefix: {prefix!r} is not the beginning of a run id (hex digits and dashes)")
    return {"id_min": uuid.UUID(digits.ljust(32, "0")), "id_max": uuid.UUID(digits.ljust(32, "f"))}



class ReadStore(Core):
    """Reads that change nothing."""

    # -- reads ---------------------------------------------------------------------------
    # A run read with its steps comes from one snapshot (docs/lifecycle.md, "Reads are
    # snapshots"): under READ COMMITTED each statement sees its own moment, and a transition
    # committed between the run's statement and its steps' would show a run whose state
    # contradicts its steps. One REPEATABLE READ transaction keeps the rows as typed as any
    # other read (one statement aggregating the steps as JSON would turn their timestamps,
    # ids and intervals into strings); the steps of a whole ListRuns page are one statement.


    async def get_run(self, run_id: str, *, steps: bool = True) -> dict[str, Any]:
        rid = parse_id(run_id, "run_id")
        if not steps:
            row = await self._one("run_get", run_id=rid)
        else:
            async with self._snapshot() as issue:
                row = await run_with_steps(issue, rid)
        if row is None:
            raise NotFound(f"run {run_id} not found")
        return row

    async def run_states(self, run_ids: Sequence[str]) -> dict[str, str]:
        rows = await self._all("runs_states", run_ids=[uuid.UUID(r) for r in run_ids])
        return {str(r["id"]): r["state"] for r in rows}

    async def list_runs(self, *, states: Sequence[str] = (), workflow: str | None = None,
                        created_after: datetime | None = None, created_before: datetime | None = None,
                        limit: int = 100, after: tuple[datetime, str] | None = None,
                        steps: bool = False, schedule: str | None = None,
                        schedule_fire_at: datetime | None = None, id_prefix: str = "") -> list[dict[str, Any]]:
        """Newest first. `id_prefix`: only runs whose id starts with these hex digits (dashes ignored)."""
        for s in states:
            if s not in RUN_STATES:
                raise InvalidArgument(f"states: {s!r} is not a run state")
        params = {"states": list(states), "workflow": workflow or None, "created_after": created_after,
                  "created_before": created_before, "after_created": after[0] if after else None,
                  "after_id": uuid.UUID(after[1]) if after else None, "limit": limit,
                  "schedule": schedule or None, "schedule_fire_at": schedule_fire_at, **_id_range(id_prefix)}
        if not steps:
            return await self._all("runs_list", **params)
        async with self._snapshot() as issue:
            rows = await (await issue("runs_list", **params)).fetchall()
            by_run: dict[uuid.UUID, list[dict[str, Any]]] = {row["id"]: [] for row in rows}
            if by_run:
                for step in await (await issue("runs_steps", run_ids=list(by_run))).fetchall():
                    by_run[step["run_id"]].append(step)
        for row in rows:
            row["steps"] = by_run[row["id"]]
        return rows

    async def stats(self) -> list[dict[str, Any]]:
        return await self._all("kinds_stats")

    async def runs_ended(self, since: datetime | None, lag: timedelta) -> tuple[list[dict[str, Any]], datetime]:
        """How many runs ended in (since, now - lag], by workflow and state; and now - lag,
        the next call's `since`. With `since` None: no rows, only the bound."""
        rows = await self._all("runs_ended", since=since, lag=lag)
        return [r for r in rows if r["n"]], rows[0]["until"]

