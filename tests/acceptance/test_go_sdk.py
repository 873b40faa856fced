"""The Go SDK (sdks/go): its generated code is current, it is gofmt-clean, and its own unit
tests pass (`go vet` and `go test ./...`, run as its README says, with the venv's Go and
Debian's Go packages in GOPATH mode: sdks/go/scripts/go.sh).

The Go tests drive the worker and the client against in-process fake servers (the stream
protocol's edge cases: reconnects with held leases, resent results, Stop, lost leases, a
silent server, the graceful stop, output measuring); test_polyglot_go.py runs the SDK's
demo worker against the real server.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest

pytest.register_assert_rewrite("polyglot_harness")
# Importing the harness also makes scripts/test.sh run scripts/examples_setup.sh first, which
# installs the Debian Go packages these tests build with.
from polyglot_harness import ROOT, SETUP  # noqa: E402

SDK = ROOT / "sdks" / "go"
GO_SH = SDK / "scripts" / "go.sh"


def run(args: list[str], timeout: float = 600) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "GOFLAGS": ""}
    return subprocess.run(args, cwd=SDK, env=env, capture_output=True, text=True, timeout=timeout)


def test_the_generated_code_is_what_the_protos_generate() -> None:
    """sdks/go/scripts/gen.sh --check regenerates cyclonepb/ from proto/ and fails on any change."""
    done = run([str(SDK / "scripts" / "gen.sh"), "--check"])
    assert done.returncode == 0, f"{done.stdout}{done.stderr}\n(if a tool is missing: {SETUP})"
    assert "is up to date (7 protos)" in done.stderr
    assert sorted(p.name for p in (SDK / "cyclonepb").glob("*.go")) == sorted(
        [f"{name}.pb.go" for name in ("admin", "limits", "runs", "schedules", "types", "workers", "workflows")]
        + [f"{name}_grpc.pb.go" for name in ("admin", "limits", "runs", "schedules", "workers", "workflows")])


def test_the_sources_are_gofmt_clean() -> None:
    goroot = run([str(GO_SH), "env", "GOROOT"]).stdout.strip()
    sources = [str(p) for p in SDK.rglob("*.go") if ".gopath" not in p.parts]
    assert len(sources) > 20
    done = run([str(Path(goroot) / "bin" / "gofmt"), "-l", *sources])
    assert done.returncode == 0, done.stderr
    assert done.stdout == "", f"not gofmt-clean:\n{done.stdout}"


def test_go_vet_and_the_sdks_unit_tests_pass() -> None:
    vet = run([str(GO_SH), "vet", "./..."])
    assert vet.returncode == 0, f"go vet:\n{vet.stdout}{vet.stderr}\n({SETUP})"
    tests = run([str(GO_SH), "test", "-count=1", "-v", "./..."])
    output = tests.stdout + tests.stderr
    assert tests.returncode == 0, f"go test:\n{output[-20000:]}"
    passed = set(re.findall(r"^--- PASS: (\w+)", output, re.M))
    assert not re.search(r"^--- FAIL", output, re.M)
    # Each package's tests ran, the protocol's hard cases among them.
    for package in ("client", "cycloneotel", "internal/jsonv", "internal/w3c", "worker"):
        assert re.search(rf"^ok\s+github.com/cyclone-workflows/cyclone/sdks/go/{package}\s", output, re.M), package
    for name in ("TestReconnectListsHeldLeasesAndResendsUnackedResults",
                 "TestGracefulStopFinishesRunningHandlersAndHandsBackTheOthers",
                 "TestAnOutputOverTheLimitIsSentAsItsSizeMeasuredAsTheServerDoes",
                 "TestAWrongAddressFailsAtOnce", "TestTheHandlerSpanIsAChildOfTheLeasesTraceContext"):
        assert name in passed, name
    assert len(passed) >= 35, sorted(passed)


DOC = ROOT / "docs" / "go-sdk.md"
EXAMPLES = ("hello-worker", "hello-client")


def test_the_docs_quick_start_runs_against_a_real_server(server: Any, tmp_path: Path) -> None:
    """docs/go-sdk.md shows sdks/go/examples/hello-worker and hello-client verbatim; built
    (pointed at this test's server) and run, the client prints the worker's greeting, and
    SIGTERM stops the worker gracefully."""
    doc = DOC.read_text()
    gopath = tmp_path / "gopath"
    binaries = {}
    for name in EXAMPLES:
        source = (SDK / "examples" / name / "main.go").read_text()
        assert f"```go\n{source}```" in doc, f"docs/go-sdk.md does not show examples/{name}/main.go as it is"
        package = gopath / "src" / "docs.example" / name
        package.mkdir(parents=True)
        (package / "main.go").write_text(source.replace("127.0.0.1:7233", server.address))
        binaries[name] = tmp_path / name
        built = subprocess.run([str(GO_SH), "build", "-o", str(binaries[name]), f"docs.example/{name}"],
                               env={**os.environ, "GOFLAGS": "", "GOPATH_EXTRA": str(gopath)},
                               capture_output=True, text=True, timeout=600)
        assert built.returncode == 0, built.stdout + built.stderr
    log = tmp_path / "worker.log"
    with open(log, "wb") as out:
        worker = subprocess.Popen([binaries["hello-worker"]], stdout=out, stderr=subprocess.STDOUT)
    try:
        done = subprocess.run([binaries["hello-client"]], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stdout + done.stderr
        assert done.stdout == "map[greeting:hello Ada]\n"
    finally:
        worker.send_signal(signal.SIGTERM)
        code = worker.wait(60)
    text = log.read_text()
    assert code == 0, text
    assert "welcome from" in text and "draining" in text, text
