"""What the bench scripts share: progress notes on stderr and starting a `cyclone-server` subprocess."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path


def note(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def start_server(url: str, workdir: Path, *extra: str) -> tuple[subprocess.Popen, str]:
    """A `cyclone-server` on a loopback port chosen by the OS; returns it and its address."""
    ready = workdir / f"ready-{time.monotonic_ns()}.json"
    proc = subprocess.Popen([sys.executable, "-m", "cyclone_server", "--database-url", url,
                             "--listen", "127.0.0.1:0", "--ready-file", str(ready), "--log-level", "WARNING",
                             *extra])
    deadline = time.monotonic() + 60
    while not ready.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise SystemExit("cyclone-server did not start")
        time.sleep(0.05)
    return proc, json.loads(ready.read_text())["address"]
