"""Limits: creating, changing, reading and deleting the named limits of flow control.

What a limit does is in the SQL (functions/15_limits.sql: the tokens of a submit, the
strategies, the claim's pick); this is their management, for Limits and the CLI.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from psycopg.types.json import Jsonb

from cyclone_server.errors import NotFound

from .core import Core

TOP_KEYS = 20


class LimitStore(Core):
    """The named limits and the usage of their keys."""

    async def set_limit(self, limit: Mapping[str, Any]) -> tuple[dict[str, Any], bool]:
        """Store a limit checked by limit_spec.normalize_limit; returns (limit with its keys, created)."""
        row = await self._one("limit_set", limit=Jsonb(dict(limit)))
        got = await self.get_limit(limit["name"])
        return got, bool(row["created"])  # type: ignore[index]

    async def get_limit(self, name: str, *, top: int = TOP_KEYS) -> dict[str, Any]:
        """The limit `name` with its `top` busiest keys under "keys"; NotFound when there is none."""
        rows = await self.list_limits(name=name, top=top)
        if not rows:
            raise NotFound(f"limit {name!r} not found")
        return rows[0]

    async def list_limits(self, *, name: str | None = None, top: int = TOP_KEYS) -> list[dict[str, Any]]:
        """Every limit (or the one named), by name, each with its `top` busiest keys under "keys"."""
        async with self._snapshot() as issue:
            limits_cur = await issue("limits_list", name=name)
            keys_cur = await issue("limit_keys_stats", name=name, top=top)
            limits = await limits_cur.fetchall()
            keys = await keys_cur.fetchall()
        by_name: dict[str, list[dict[str, Any]]] = {}
        for k in keys:
            by_name.setdefault(k["limit_name"], []).append(k)
        for row in limits:
            row["keys"] = by_name.get(row["name"], [])
        return limits

    async def tidy_limits(self, limit: int = 1000) -> int:
        """Remove what flow control keeps for idle keys (cyclone_limits_tidy: starts out of
        their window, lock rows and fair clocks no claim needs); returns how many rows went."""
        row = await self._one("limits_tidy", limit=limit)
        return int(row["removed"])  # type: ignore[index]

    async def delete_limit(self, name: str) -> None:
        """Delete the limit; NotFound when there is none."""
        row = await self._one("limit_delete", name=name)
        if not row["deleted"]:  # type: ignore[index]
            raise NotFound(f"limit {name!r} not found")


__all__ = ["LimitStore", "TOP_KEYS"]
