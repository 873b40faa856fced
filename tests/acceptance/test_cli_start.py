"""`cyclone` commands that start work, and the CLI's manners: a CLI process against a real server process."""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from test_cli_ops import ENTRY, cli, step

from cyclone_server.cli import main as cyclone_cli
from cyclone_server.store.engine import Engine

ETL_YAML = """\
name: etl
nodes:
  - id: extract
    max_attempts: 3
    backoff_initial: 0.1s
  - id: load
    deps: [extract]
  - id: approve
    type: signal
    deps: [load]
"""


async def claim_one(engine: Engine, kind: str) -> dict[str, Any]:
    deadline = time.monotonic() + 30
    while not (leases := await engine.claim("cli-test", [kind], 1, lease_ttl=30)):
        assert time.monotonic() < deadline, f"no {kind} step became claimable"
        await asyncio.sleep(0.05)
    return leases[0]


async def test_register_submit_and_get_keep_integers_and_show_every_error(server: Any, engine: Engine,
                                                                           tmp_path: Path) -> None:
    (tmp_path / "etl.yaml").write_text(ETL_YAML)
    out = cli(server.address, "workflows", "register", str(tmp_path / "etl.yaml"))
    assert out.returncode == 0 and out.stdout.strip() == "workflow etl v1: registered; 3 nodes", out.stderr
    again = subprocess.run([sys.executable, "-c", ENTRY, "workflows", "register", "-", "--address", server.address],
                           input=json.dumps({"name": "etl", "nodes": [{"id": "extract", "max_attempts": 3,
                                                                        "backoff_initial": "0.1s"},
                                                                       {"id": "load", "deps": ["extract"]},
                                                                       {"id": "approve", "type": "NODE_TYPE_SIGNAL",
                                                                        "deps": ["load"]}]}),
                           capture_output=True, text=True, timeout=120)
    assert again.stdout.strip() == "workflow etl v1: unchanged (the same definition is already registered); 3 nodes"
    (tmp_path / "bad.yaml").write_text("name: bad\nnodes:\n  - id: a\n    max_attempts: lots\n")
    bad = cli(server.address, "workflows", "register", str(tmp_path / "bad.yaml"))
    assert bad.returncode == 2 and "bad.yaml" in bad.stderr and "max_attempts" in bad.stderr

    (tmp_path / "input.json").write_text('{"value": 41, "ratio": 0.5}')
    submitted = cli(server.address, "runs", "submit", "etl", "--input", f"@{tmp_path / 'input.json'}", "--json")
    assert submitted.returncode == 0, submitted.stderr
    run_id = json.loads(submitted.stdout)["run_id"]
    got = json.loads(cli(server.address, "runs", "get", run_id, "--json").stdout)
    assert got["input"] == {"value": 41, "ratio": 0.5}  # 41, not 41.0
    assert re.search(r'"value": 41[,\n]', cli(server.address, "runs", "get", run_id, "--json").stdout)

    for attempt in (1, 2):  # two failed attempts, then a success
        lease = await claim_one(engine, "extract")
        assert await engine.fail(str(lease["step_id"]), lease["lease_generation"], f"boom {attempt}") == "retried"
    await step(engine, "extract")
    shown = cli(server.address, "runs", "get", run_id)
    assert shown.returncode == 0, shown.stderr
    lines = [line.split() for line in shown.stdout.splitlines()]
    assert ["extract", "1"] + ["boom", "1"] in [[w[0], w[1]] + w[-2:] for w in lines if len(w) > 3]
    assert ["extract", "2"] + ["boom", "2"] in [[w[0], w[1]] + w[-2:] for w in lines if len(w) > 3]
    assert "duration" in shown.stdout and "errors, every attempt:" in shown.stdout
    extract = next(w for w in lines if w[:1] == ["extract"] and "completed" in w)
    assert len([w for w in extract if w.count(":") == 2]) == 2  # started and finished times, from the server


async def test_submit_wait_and_enqueue_with_job_options(server: Any, engine: Engine, tmp_path: Path) -> None:
    (tmp_path / "one.json").write_text(json.dumps({"name": "one", "nodes": [{"id": "only", "kind": "work"}]}))
    assert cli(server.address, "workflows", "register", str(tmp_path / "one.json")).returncode == 0
    waiting = subprocess.Popen([sys.executable, "-c", ENTRY, "runs", "submit", "one", "--input", '{"n": 41}',
                                "--wait", "--address", server.address, "--interval", "0.05"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lease = await claim_one(engine, "work")
    assert await engine.complete(str(lease["step_id"]), lease["lease_generation"], {"n": 42}) == "applied"
    out, err = await asyncio.to_thread(waiting.communicate, timeout=120)
    assert waiting.returncode == 0, err
    assert out.splitlines()[0].endswith(": started") and out.splitlines()[0].startswith("run ")
    assert out.splitlines()[-1].split(" after ")[1].endswith('; result {"only": {"n": 42}}')  # 42, not 42.0

    job = cli(server.address, "jobs", "enqueue", "resize", "--input", '{"image": "a.png"}', "--max-attempts", "2",
              "--priority", "3", "--idempotency-key", "k1", "--attempt-timeout", "1m", "--json")
    assert job.returncode == 0, job.stderr
    created = json.loads(job.stdout)
    assert created["created"] is True
    again = cli(server.address, "jobs", "enqueue", "resize", "--input", '{"image": "a.png"}', "--max-attempts", "2",
                "--priority", "3", "--idempotency-key", "k1", "--attempt-timeout", "1m")
    assert again.stdout.strip() == f"job {created['run_id']} (resize): already exists (same idempotency key); " \
                                   "not started again"
    run = json.loads(cli(server.address, "runs", "get", created["run_id"], "--json").stdout)
    assert run["steps"][0]["max_attempts"] == 2 and run["steps"][0]["priority"] == 3
    assert cli(server.address, "jobs", "enqueue", "resize", "--input", "{nope").returncode == 2
    assert "--input: not valid JSON" in cli(server.address, "jobs", "enqueue", "resize", "--input", "{nope").stderr


async def test_version_address_default_port_and_a_closed_pipe(server: Any, engine: Engine) -> None:
    version = subprocess.run([sys.executable, "-c", ENTRY, "--version"],
                             capture_output=True, text=True, timeout=60)
    assert version.returncode == 0 and version.stdout.startswith("cyclone-workflows ")
    # No port: the default one (7233), which the error names when nothing answers there.
    out = cli("127.0.0.1", "stats", "--rpc-timeout", "5s")
    assert out.returncode == 0 or ":7233" in out.stderr
    assert cli(server.address, "runs", "list", "--address", "a:b:c").returncode == 2

    # The reader is gone before the CLI writes: a quiet exit, no BrokenPipeError traceback.
    proc = subprocess.Popen([sys.executable, "-c", ENTRY, "workflows", "list", "--address", server.address],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(60) == 141 and "Traceback" not in err and "BrokenPipe" not in err, err


def test_every_option_has_help(monkeypatch: Any) -> None:
    """Every option of every command says what it does (defaults are added by the formatter)."""
    built: list[argparse.ArgumentParser] = []

    def capture(self: argparse.ArgumentParser, *args: Any, **kw: Any) -> Any:
        built.append(self)  # the parser `cyclone` builds, before it parses anything
        raise SystemExit(0)

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", capture)
    try:
        cyclone_cli.main([])
    except SystemExit:
        pass
    seen: list[str] = []

    def walk(p: argparse.ArgumentParser, path: str) -> None:
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, child in action.choices.items():
                    walk(child, f"{path} {name}")
            elif action.help != argparse.SUPPRESS and not isinstance(action, argparse._HelpAction):
                seen.append(f"{path} {'/'.join(action.option_strings) or action.dest}")
                assert action.help, f"`{path}`: {action.option_strings or action.dest} has no help"

    walk(built[0], "cyclone")
    assert "cyclone runs purge --dry-run" in seen and "cyclone jobs enqueue --max-attempts" in seen
    assert "cyclone dev --listen" in seen and "cyclone server --lease-ttl" in seen
