"""The named SQL statements of sql/queries.sql, parsed once at import."""

from __future__ import annotations

import re
from importlib import resources

_NAME = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)


def _parse(text: str) -> dict[str, str]:
    parts = _NAME.split(text)
    out: dict[str, str] = {}
    for name, body in zip(parts[1::2], parts[2::2]):
        sql = "\n".join(line for line in body.strip().splitlines() if not line.startswith("--")).strip()
        if name in out:
            raise ValueError(f"query {name} is defined twice")
        out[name] = sql.rstrip(";")
    return out


Q: dict[str, str] = _parse(resources.files("cyclone_server.store").joinpath("sql", "queries.sql").read_text())
