"""`cyclone-server --processes N`: N server processes behind one port, so that one command uses
a machine's cores.

Each process is a whole `cyclone-server` (its own engine, hub, dispatcher and background
work, as separate servers on one database always are); they share the port with
SO_REUSEPORT, and the kernel spreads incoming connections between them. This supervisor
applies the migrations once, starts the children, forwards SIGTERM / SIGINT to them, and
stops them all when one of them dies (a supervisor above it, such as Kubernetes or systemd,
restarts the whole group).
"""

from __future__ import annotations

import json
import logging
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from cyclone_server.listen import split_host_port

from .app import write_ready_file
from cyclone_server.store.migrate import migrate

log = logging.getLogger("cyclone.server")

STARTUP_TIMEOUT = 60.0  # seconds for every child to be serving
# Flags the supervisor sets itself for each child: (flag, takes a value).
_OWN_FLAGS = {"--processes": True, "--listen": True, "--ready-file": True, "--metrics-listen": True,
              "--server-id": True}


def child_argv(argv: Sequence[str]) -> list[str]:
    """The command line without the flags the supervisor sets per child."""
    out: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
            continue
        name = arg.split("=", 1)[0]
        if name in _OWN_FLAGS:
            skip = "=" not in arg and _OWN_FLAGS[name]
            continue
        out.append(arg)
    return out


def _reserve_port(host: str) -> socket.socket:
    """A bound (not listening) socket with SO_REUSEPORT on a free port: the children bind
    the same port beside it, and no other program can take the port meanwhile."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host.strip("[]"), 0))
    return sock


def run_processes(argv: Sequence[str], *, processes: int, database_url: str, listen: str, migrate_first: bool,
                  ready_file: str | None, metrics_listen: str | None, server_id: str) -> int:
    """Run `processes` servers on `listen` until SIGTERM / SIGINT; the exit status of the group."""
    if migrate_first:
        applied = migrate(database_url)
        log.info("migrations: %s", ", ".join(applied) if applied else "up to date")
    host, port = split_host_port(listen, what="--listen")
    reserved = _reserve_port(host) if port == 0 else None
    if reserved is not None:
        port = reserved.getsockname()[1]
    address = f"{host}:{port}"
    workdir = Path(tempfile.mkdtemp(prefix="cyclone-processes-"))
    children: list[subprocess.Popen[bytes]] = []
    stopping = False

    def stop(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True
        for child in children:
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        for i in range(processes):
            args = [sys.executable, "-m", "cyclone_server", *child_argv(argv), "--listen", address,
                    "--no-migrate", "--reuse-port", "--ready-file", str(workdir / f"ready-{i}")]
            if server_id:
                args += ["--server-id", f"{server_id}-{i}"]
            if metrics_listen:
                mhost, mport = split_host_port(metrics_listen, default_host="0.0.0.0", what="--metrics-listen")
                args += ["--metrics-listen", f"{mhost}:{mport + i if mport else 0}"]
            children.append(subprocess.Popen(args))
        ready = _wait_ready(children, workdir, lambda: stopping)
        if ready is None:
            stop(signal.SIGTERM, None)
        else:
            log.info("%d server processes listening on %s (pids %s)", processes, address,
                     ", ".join(str(c.pid) for c in children))
            if ready_file:
                metrics = [r["metrics_address"] for r in ready if "metrics_address" in r]
                write_ready_file(ready_file, address, metrics[0] if metrics else None,
                                 pids=[c.pid for c in children], metrics_addresses=metrics)
        # Wait for all of them; the first that ends on its own ends the group.
        while any(c.poll() is None for c in children):
            if not stopping and any(c.poll() is not None for c in children):
                log.error("a server process exited (%s); stopping the others",
                          ", ".join(f"pid {c.pid}: {c.returncode}" for c in children if c.returncode is not None))
                stop(signal.SIGTERM, None)
            time.sleep(0.1)
        codes = [c.returncode for c in children]
        return 0 if stopping and all(code == 0 for code in codes) and ready is not None else max(1, *codes)
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
                child.wait()
        if reserved is not None:
            reserved.close()
        for f in workdir.iterdir():
            f.unlink()
        workdir.rmdir()


def _wait_ready(children: list[subprocess.Popen[bytes]], workdir: Path,
                stopping: Callable[[], bool]) -> list[dict[str, object]] | None:
    """Each child's ready file, once all are serving; None when one exited first or time ran out."""
    deadline = time.monotonic() + STARTUP_TIMEOUT
    while time.monotonic() < deadline and not stopping():
        if any(c.poll() is not None for c in children):
            log.error("a server process exited while starting")
            return None
        files = [workdir / f"ready-{i}" for i in range(len(children))]
        if all(f.exists() for f in files):
            return [json.loads(f.read_text()) for f in files]
        time.sleep(0.05)
    if not stopping():
        log.error("the server processes did not start within %.0f s", STARTUP_TIMEOUT)
    return None

