"""What keeps `cyclone dev` from leaving things behind: its claim on a data dir, and a guard process.

- The claim (`<data dir>.dev-pid`, next to the data dir) names the `cyclone dev` that owns
  the embedded Postgres there. A second `cyclone dev` on the same data dir finds a live owner
  and refuses; it never stops a Postgres it did not start. A claim whose process is gone
  (a killed `cyclone dev`) is taken over, with the Postgres it left running.
- The guard (`python -m cyclone_server.cli.devguard DATA_DIR`) is a small child that reads its
  stdin, a pipe from `cyclone dev`. The pipe closes when `cyclone dev` exits in any way,
  SIGKILL included; if the claim is still there then, `cyclone dev` did not stop its
  Postgres, and the guard does.
- The demo worker dies with its parent (`dying_with_this_process`, Linux's PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

if TYPE_CHECKING:
    import asyncio


class DataDirBusy(Exception):
    """Another live `cyclone dev` owns this data dir."""


def claim_path(data_dir: str | Path) -> Path:
    path = Path(data_dir).expanduser().resolve()
    return path.with_name(path.name + ".dev-pid")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def read_claim(data_dir: str | Path) -> tuple[int, str] | None:
    """(pid, listen address) of the claim's owner, or None when there is no claim."""
    try:
        pid, _, listen = claim_path(data_dir).read_text().partition(" ")
        return int(pid), listen.strip()
    except (OSError, ValueError):
        return None


def claim(data_dir: str | Path, listen: str) -> None:
    """Claim `data_dir` for this process; DataDirBusy when a live `cyclone dev` holds it."""
    path = claim_path(data_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    for _ in range(2):
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            owner = read_claim(data_dir)
            if owner is not None and owner[0] != os.getpid() and _alive(owner[0]):
                raise DataDirBusy(
                    f"another cyclone dev (pid {owner[0]}, listening on {owner[1] or '?'}) is using "
                    f"{data_dir}; stop it first, or give this one its own --data-dir, --listen and "
                    "--http-listen") from None
            path.unlink(missing_ok=True)  # a killed cyclone dev's claim: take it over
            continue
        with os.fdopen(fd, "w") as f:
            f.write(f"{os.getpid()} {listen}\n")
        return
    raise DataDirBusy(f"cannot claim {data_dir}: {path} keeps reappearing")


def postgres_running(data_dir: str | Path) -> bool:
    """Whether a Postgres server runs on `data_dir` (its postmaster.pid names a live process)."""
    from cyclone_server.store.embedded import PostmasterInfo
    info = PostmasterInfo.read_from_pgdata(Path(data_dir).expanduser().resolve())
    return info is not None and info.is_running()


def release(data_dir: str | Path) -> None:
    """Drop this process's claim (after its Postgres stopped)."""
    owner = read_claim(data_dir)
    if owner is not None and owner[0] == os.getpid():
        claim_path(data_dir).unlink(missing_ok=True)


def start_guard(data_dir: str | Path) -> subprocess.Popen[bytes]:
    """The guard child; keep the returned process (its stdin is the pipe) until exit."""
    return subprocess.Popen([sys.executable, "-m", "cyclone_server.cli.devguard", str(data_dir), str(os.getpid())],
                            stdin=subprocess.PIPE, start_new_session=True)


def dying_with_this_process(argv: Sequence[str]) -> list[str]:
    """The command that runs `argv` so that it gets SIGTERM when this process's calling thread
    (the main thread, for `cyclone dev`) ends: on Linux, a fresh Python that sets that death
    signal (PR_SET_PDEATHSIG, which an exec keeps unless into a set-user-ID program), then
    becomes `argv` under the same pid (`_exec_dying_with`); elsewhere `argv` itself.

    Not subprocess's `preexec_fn`: that runs Python in a child forked from this process, where
    gRPC's and asyncio's threads may have held a lock (malloc's, the loader's, gRPC's) at the
    fork. Forked so beside a busy grpc.aio server, about one child in ten crashed before its
    exec (SIGSEGV, or SIGABRT after gRPC's "epoll_wait error: Bad file descriptor"):
    `cyclone dev`'s demo worker did, at its start. Without `preexec_fn`, subprocess forks
    without running Python in the child (tests/acceptance/test_dev.py)."""
    if not sys.platform.startswith("linux"):
        return list(argv)
    return [sys.executable, "-m", "cyclone_server.cli.devguard", "--die-with", str(os.getpid()), "--", *argv]


async def start_dying_with_this_process(argv: Sequence[str], **kwargs: Any) -> asyncio.subprocess.Process:
    """`argv` started as a subprocess (asyncio.create_subprocess_exec's `kwargs`) that gets
    SIGTERM when this process dies (`dying_with_this_process`)."""
    import asyncio  # here: the commands this module runs as stay light
    return await asyncio.create_subprocess_exec(*dying_with_this_process(argv), **kwargs)


def _exec_dying_with(parent: int, argv: list[str]) -> NoReturn:
    """Linux: set SIGTERM as this process's death signal, then become `argv` (searched on PATH)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(1, signal.SIGTERM) != 0:  # PR_SET_PDEATHSIG
        err = ctypes.get_errno()
        raise OSError(err, f"prctl(PR_SET_PDEATHSIG): {os.strerror(err)}")
    if os.getppid() != parent:  # it died before the signal was set, which then never comes
        print(f"its parent (pid {parent}) exited: not starting {argv[0]}", file=sys.stderr)
        sys.exit(1)
    for name in ("SIGPIPE", "SIGXFZ", "SIGXFSZ"):  # ignored by Python's start, kept by an exec
        if hasattr(signal, name):                  # (subprocess's restore_signals, by hand)
            signal.signal(getattr(signal, name), signal.SIG_DFL)
    os.execvp(argv[0], argv)


def _guard(data_dir: str, parent: int) -> None:
    # Its own session: no terminal signals; it lives exactly as long as the pipe.
    with contextlib.suppress(OSError):
        while sys.stdin.buffer.read(4096):
            pass
    owner = read_claim(data_dir)
    if owner is None or owner[0] != parent:
        return  # cyclone dev stopped its Postgres and let go of the claim
    from cyclone_server.store.embedded import start_embedded
    print(f"cyclone dev (pid {parent}) exited without stopping its Postgres; stopping it", file=sys.stderr)
    start_embedded(data_dir).stop()
    claim_path(data_dir).unlink(missing_ok=True)


if __name__ == "__main__":
    if sys.argv[1] == "--die-with":  # dying_with_this_process's command: --die-with PID -- ARGV...
        if len(sys.argv) < 5 or sys.argv[3] != "--":
            sys.exit("usage: python -m cyclone_server.cli.devguard --die-with PID -- PROGRAM [ARG...]")
        _exec_dying_with(int(sys.argv[2]), sys.argv[4:])
    _guard(sys.argv[1], int(sys.argv[2]))
