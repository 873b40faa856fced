"""The workers registry: which workers each server has connected, for ListWorkers and the stats."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from psycopg.types.json import Jsonb

from .core import Core, seconds


class WorkerStore(Core):
    """Heartbeats of connected workers, and the registry they keep."""

    # -- workers registry ------------------------------------------------------------------

    async def workers_beat(self, server_id: str, workers: Sequence[Mapping[str, Any]], grace: float, *,
                           takeover: bool = False) -> int:
        """Upsert the rows of the worker streams this server holds, live for `grace` seconds
        more, and delete expired rows of any server (cyclone_workers_beat); `takeover` for a
        new stream's Hello. Returns how many rows were written."""
        row = await self._one("workers_beat", server_id=server_id, workers=Jsonb([dict(w) for w in workers]),
                              grace=seconds(grace), takeover=takeover)
        return row["written"]  # type: ignore[index]

    async def list_workers(self, kind: str | None = None) -> list[dict[str, Any]]:
        """The live workers of every server of this database, by worker id."""
        return await self._all("workers_list", kind=kind or None)

