"""Shared by the console tests: a real cyclone-server with --http-listen, its console's URL, tokens."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

SUBMIT_TOKEN = "submit-token-0123456789abcdef"
ADMIN_TOKEN = "admin-token-0123456789abcdefgh"
WORKER_TOKEN = "worker-token-0123456789abcdef"


def http_url(srv: Any) -> str:
    """The console's base URL, from the newest ready file of `srv` ("http_address")."""
    ready = max(srv.workdir.glob("ready-*.json"), key=lambda p: p.stat().st_mtime)
    return "http://" + json.loads(ready.read_text())["http_address"]


def start_console_server(start_server: Callable[..., Any], db_url: str, tmp_path: Path, *, tokens: bool = False,
                         extra_args: Sequence[str] = ()) -> tuple[Any, str]:
    """A server with the console on a free loopback port; with `tokens`, the three tokens above."""
    args = ["--http-listen", "127.0.0.1:0", *extra_args]
    if tokens:
        path = tmp_path / "tokens.txt"
        path.write_text(f"{SUBMIT_TOKEN} submit\n{ADMIN_TOKEN} admin\n{WORKER_TOKEN} worker\n")
        args += ["--tokens-file", str(path)]
    srv = start_server(db_url, extra_args=args)
    return srv, http_url(srv)


def csrf_of(html: str) -> str:
    m = re.search(r'name="csrf" value="([^"]+)"', html)
    assert m, "no CSRF field on the page"
    return m.group(1)


def node_states(html: str) -> dict[str, str]:
    """{node id: state} of the DAG drawn on a run page."""
    return dict(re.findall(r'<g class="node [^"]*" data-node="([^"]+)" data-state="([^"]*)"', html))
