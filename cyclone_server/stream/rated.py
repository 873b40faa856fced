"""Leases whose starts count against a rate: reported to the database once written to their workers."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable

from cyclone_server.store.engine import Engine

log = logging.getLogger(__name__)


class RatedPushes:
    """A rated step's start counts from its claim until its lease is written to the worker's
    stream, then from that moment (cyclone_limit_starts_pushed, docs/flow-control.md). The
    hub hands each such write's step ids to `add`; `run` reports them, one statement at a
    time, for all the writes since the one before. A report that fails, or that a stopping
    server never makes, leaves those starts counted from their claims, as a server of an
    earlier release counts them.

    Example::

        pushes = RatedPushes(engine)
        task = asyncio.create_task(pushes.run())
        pushes.add(["0190...", "0190..."])  # after the Leases message with them was written
    """

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._ids: list[str] = []
        self._more = asyncio.Event()

    def add(self, step_ids: Iterable[str]) -> None:
        self._ids.extend(step_ids)
        self._more.set()

    async def run(self) -> None:
        while True:
            await self._more.wait()
            await self.flush()

    async def flush(self) -> None:
        """Report the writes added so far (`run`'s only caller: one report at a time)."""
        self._more.clear()
        ids, self._ids = self._ids, []
        if not ids:
            return
        try:
            await self.engine.limit_starts_pushed(ids)
        except Exception as e:  # counted from their claims: a window's strictness on the workers' clocks is all it costs
            log.warning("reporting %d rated leases as pushed failed: %s", len(ids), e)


__all__ = ["RatedPushes"]
