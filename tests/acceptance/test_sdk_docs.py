"""Runs every Python example of docs/python-sdk.md against a real server, so the guide stays true.

Each ```python block is written to a file in one folder, in order: named by its first line
when that is ``# name.py`` (later blocks import earlier ones, e.g. ``from workflows import``),
else ``example_N.py``. A block that calls ``run_sync()`` is a worker program: it runs in the
background until the end, then gets SIGTERM and must exit 0. A ``test_*.py`` block runs
under pytest. Every other block must exit 0. ``127.0.0.1:7233`` becomes the server's
address, and CYCLONE_DATABASE_URL is set to its database.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

DOC = Path(__file__).resolve().parents[2] / "docs" / "python-sdk.md"
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)
FILENAME = re.compile(r"^# ([\w.]+\.py)$")


def examples() -> list[tuple[str, str]]:
    out = []
    for i, code in enumerate(BLOCK.findall(DOC.read_text())):
        m = FILENAME.match(code.splitlines()[0])
        out.append((m.group(1) if m else f"example_{i}.py", code))
    return out


def test_the_guide_has_examples_and_names_them_uniquely() -> None:
    names = [name for name, _ in examples()]
    assert len(names) >= 8 and len(set(names)) == len(names)


async def test_every_python_example_in_the_sdk_guide_runs(server: Any, db_url: str, tmp_path: Path) -> None:
    # The examples' folder first; then the caller's PYTHONPATH (a worktree's code over an installed copy).
    path = os.pathsep.join([str(tmp_path), *filter(None, [os.environ.get("PYTHONPATH")])])
    env = {**os.environ, "CYCLONE_DATABASE_URL": db_url, "PYTHONPATH": path, "PYTHONUNBUFFERED": "1"}
    background: list[tuple[str, subprocess.Popen[bytes]]] = []
    try:
        for name, code in examples():
            (tmp_path / name).write_text(code.replace("127.0.0.1:7233", server.address))
            if name.startswith("test_"):
                cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "asyncio_mode=auto",
                       "--rootdir", str(tmp_path), name]
            else:
                cmd = [sys.executable, name]
            if "run_sync()" in code:
                background.append((name, subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                                                          stderr=subprocess.STDOUT)))
                continue
            done = await asyncio.to_thread(subprocess.run, cmd, cwd=tmp_path, env=env, capture_output=True,
                                           text=True, timeout=180)
            assert done.returncode == 0, f"{name} failed:\n{code}\n--- output ---\n{done.stdout}\n{done.stderr}"
    finally:
        for name, proc in background:
            running = proc.poll() is None
            proc.send_signal(signal.SIGTERM)
            out = (await asyncio.to_thread(proc.communicate, timeout=60))[0].decode(errors="replace")
            assert running, f"{name} exited early:\n{out}"
            assert proc.returncode == 0, f"{name} did not stop cleanly on SIGTERM:\n{out}"
