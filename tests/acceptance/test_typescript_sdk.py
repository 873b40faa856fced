"""The TypeScript SDK (sdks/typescript): its unit tests, its package as an application
installs it, and every example of docs/typescript-sdk.md against a real server.

scripts/examples_setup.sh (which scripts/test.sh runs before the polyglot tests, this one
among them) installs the SDK's pinned packages and builds it. Each ```ts block of the guide
is written to a file, named by its first line when that is ``// name.ts`` (else
``example_N.ts``); all of them are compiled together with the SDK's TypeScript (strict).
A block named ``worker*.ts`` is a worker program: it runs in the background until the end,
then gets SIGTERM and must exit 0. Every other block must exit 0 and print what the guide
says it prints (the checks below). ``127.0.0.1:7233`` becomes the server's address.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest

from polyglot_harness import ROOT, TS_SDK_DIR, worker_command

DOC = ROOT / "docs" / "typescript-sdk.md"
BLOCK = re.compile(r"^```ts\n(.*?)^```", re.S | re.M)
FILENAME = re.compile(r"^// ([\w.-]+\.ts)$")
TSC = TS_SDK_DIR / "node_modules" / ".bin" / "tsc"

# What each example must print (substrings of its standard output, in order).
PRINTS = {
    "client.ts": ["{ greet: { greeting: 'hello Ada' } }"],
    "failures.ts": ["{ flaky: 3 }", "{ polite: 'ok' }", "{ waits_for_report: 'report ready' }",
                    "discarded max_attempts 2", "'TypeError: bad data in attempt 1'", "    at ", "1 2"],
    "cancellation.ts": ["'crunch stopped at ", ": cancelled'", "'watch stopped: cancelled'"],
    "workflows.ts": ["book-42.pdf audit", "bill:child:completed",
                     "approval:signal:completed", "cool-off:sleep:completed", "true"],
    "errors.ts": ["true", "paused [ 'paused', 'pending' ]", "cancelled [ 'operator', 'operator' ]",
                  "FAILED_PRECONDITION", "true 5", "cannot reach 127.0.0.1:1: connection refused"],
    "logging.ts": ["info bill 1 12", "string string"],
    "tracing.ts": ["true", "true true", "completed"],
    "flowcontrol.ts": ["{ acme: 1, globex: 1 }", "{ notify: { mailed: 'acme' } }", "[ 'per-tenant 1', 'smtp 2' ]"],
}


def node_env() -> dict[str, str]:
    if shutil.which("node") is None or not TSC.exists():
        pytest.fail("node and the SDK's packages are needed: run scripts/examples_setup.sh (scripts/test.sh runs it)")
    return {**os.environ, "CYCLONE_LOG_LEVEL": "warn"}


def run(cmd: list[str], cwd: Path, timeout: float = 300, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(cmd, cwd=cwd, env=env or node_env(), capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}"
    return done.stdout + done.stderr


def test_the_sdks_unit_tests_pass() -> None:
    """`npm test` in sdks/typescript: compiles, runs every node --test file, including the
    check that src/gen is what the generation script makes from proto/."""
    worker_command("node")  # fails when the SDK's build is missing or stale
    out = run(["npm", "test"], TS_SDK_DIR)
    counts = dict(re.findall(r"^ℹ (tests|pass|fail|cancelled) (\d+)$", out, re.M))
    assert counts.get("fail") == "0" and counts.get("cancelled") == "0", out
    assert int(counts["pass"]) == int(counts["tests"]) >= 45, out
    assert "is up to date with proto/" in out


def test_the_package_installs_as_an_es_module_with_types(tmp_path: Path) -> None:
    """What an application gets from `npm install` of the packed SDK: ES modules and
    declarations, that its own TypeScript compiles against, and that run."""
    worker_command("node")
    packed = json.loads(run(["npm", "pack", "--json", "--pack-destination", str(tmp_path)], TS_SDK_DIR))
    files = {f["path"] for f in packed[0]["files"]}
    assert {"dist/index.js", "dist/index.d.ts", "dist/gen/cyclone/v1/workers.js", "package.json",
            "README.md"} <= files
    assert not any(f.startswith(("test/", "build/", "node_modules/")) for f in files), sorted(files)
    app = tmp_path / "app"
    app.mkdir()
    (app / "package.json").write_text(json.dumps({"name": "app", "private": True, "type": "module"}))
    # The packages are in npm's cache since the SDK's `npm ci`, but not always their registry
    # metadata (`npm ci` reads the lock file, not the registry), which resolving the packed
    # SDK's dependencies needs: prefer the cache, ask the registry for what it lacks.
    run(["npm", "install", "--prefer-offline", "--no-audit", "--no-fund", str(tmp_path / packed[0]["filename"]),
         "@types/node@20.19.43"], app)
    (app / "main.ts").write_text(
        "import { Client, Worker, Workflow, VERSION, type Context } from 'cyclone-workflows';\n"
        "const worker = new Worker('127.0.0.1:1', { signals: [] });\n"
        "worker.handle<{ n: number }>('double', (ctx: Context<{ n: number }>) => ctx.input.n * 2);\n"
        "const wf = new Workflow('w').task('double');\n"
        "console.log(VERSION, worker.kinds.join(), wf.toRequest().nodes.length, typeof Client);\n")
    (app / "tsconfig.json").write_text(json.dumps({"compilerOptions": {
        "target": "ES2022", "module": "NodeNext", "moduleResolution": "NodeNext", "strict": True,
        "types": ["node"]}, "include": ["main.ts"]}))
    run([str(TSC), "-p", "."], app)  # no skipLibCheck: the package's declarations type-check
    assert run(["node", "main.js"], app).strip() == "0.1.0 double 1 function"


def examples() -> list[tuple[str, str]]:
    out = []
    for i, code in enumerate(BLOCK.findall(DOC.read_text())):
        m = FILENAME.match(code.splitlines()[0])
        out.append((m.group(1) if m else f"example_{i}.ts", code))
    return out


def test_the_guide_names_its_examples_and_says_what_they_print() -> None:
    names = [name for name, _ in examples()]
    assert len(names) >= 8 and len(set(names)) == len(names)
    assert set(PRINTS) == {n for n in names if not n.startswith("worker")}


async def test_every_typescript_example_in_the_guide_compiles_and_runs(server: Any, tmp_path: Path) -> None:
    worker_command("node")
    env = node_env()
    modules = tmp_path / "node_modules"
    modules.mkdir()
    # The SDK as an application sees it, and the packages the tracing example imports.
    (modules / "cyclone-workflows").symlink_to(TS_SDK_DIR)
    for scope in ("@types", "@opentelemetry"):
        (modules / scope).symlink_to(TS_SDK_DIR / "node_modules" / scope)
    (tmp_path / "package.json").write_text(json.dumps({"private": True, "type": "module"}))
    (tmp_path / "tsconfig.json").write_text(json.dumps({"compilerOptions": {
        "target": "ES2022", "module": "NodeNext", "moduleResolution": "NodeNext", "strict": True,
        "skipLibCheck": True, "types": ["node"]}, "include": ["*.ts"]}))
    for name, code in examples():
        (tmp_path / name).write_text(code.replace("127.0.0.1:7233", server.address))
    await asyncio.to_thread(run, [str(TSC), "-p", "."], tmp_path, 300, env)
    background: list[tuple[str, subprocess.Popen[bytes]]] = []
    try:
        for name, _ in examples():
            cmd = ["node", name.removesuffix(".ts") + ".js"]
            if name.startswith("worker"):
                background.append((name, subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                                                          stderr=subprocess.STDOUT)))
                continue
            done = await asyncio.to_thread(subprocess.run, cmd, cwd=tmp_path, env=env, capture_output=True,
                                           text=True, timeout=180)
            assert done.returncode == 0, f"{name} failed:\n--- output ---\n{done.stdout}\n{done.stderr}"
            at = 0
            for expected in PRINTS[name]:
                found = done.stdout.find(expected, at)
                assert found >= 0, f"{name} did not print {expected!r} (after offset {at}):\n{done.stdout}"
                at = found + len(expected)
    finally:
        for name, proc in background:
            running = proc.poll() is None
            proc.send_signal(signal.SIGTERM)
            out = (await asyncio.to_thread(proc.communicate, timeout=60))[0].decode(errors="replace")
            assert running, f"{name} exited early:\n{out}"
            assert proc.returncode == 0, f"{name} did not stop cleanly on SIGTERM:\n{out}"
