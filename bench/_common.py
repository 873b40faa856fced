"""What the bench scripts share: progress notes on stderr, starting a `cyclone-server` subprocess, and
the 10-node DAG they submit."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

DAG_NODES = 10  # bench_dag's: a root, 8 nodes that depend on it, a join
SERVER = ("-m", "cyclone_server")  # what `python` runs to start a cyclone-server (start_server's `program`)


def note(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def start_server(url: str, workdir: Path, *extra: str,
                 program: tuple[str, ...] = SERVER) -> tuple[subprocess.Popen, str]:
    """A `cyclone-server` on a loopback port chosen by the OS; returns it and its address.
    `program`: what `python` runs, given the server's flags (a script that wraps the server)."""
    ready = workdir / f"ready-{time.monotonic_ns()}.json"
    proc = subprocess.Popen([sys.executable, *program, "--database-url", url,
                             "--listen", "127.0.0.1:0", "--ready-file", str(ready), "--log-level", "WARNING",
                             *extra])
    deadline = time.monotonic() + 60
    while not ready.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise SystemExit("cyclone-server did not start")
        time.sleep(0.05)
    return proc, json.loads(ready.read_text())["address"]


def bench_dag(kind: str) -> Any:
    """The workflow `bench_dag` (a cyclone_worker.Workflow): a root, 8 nodes that depend on
    it (fan-out), and a join that depends on the 8 (fan-in), every node of `kind`."""
    from cyclone_worker import Workflow
    wf = Workflow("bench_dag").task("root", kind=kind)
    for i in range(DAG_NODES - 2):
        wf.task(f"mid{i}", kind=kind, deps=["root"])
    return wf.task("join", kind=kind, deps=[f"mid{i}" for i in range(DAG_NODES - 2)])
