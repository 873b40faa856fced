"""Acceptance: the Go worker of examples/worker-go (a small program on the Go SDK, sdks/go)
against the real server: every scenario of polyglot_scenarios.py, and its bearer token,
which reaches both the worker stream and the SDK client its handlers use."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.register_assert_rewrite("polyglot_harness", "polyglot_scenarios")

from cyclone_proto import workflows_pb2  # noqa: E402
from cyclone_server import auth  # noqa: E402
from polyglot_harness import Runs, state_name, step_of, task, to_py  # noqa: E402
from polyglot_scenarios import WorkerScenarios  # noqa: E402  (after the assert rewrite hook)

WORKER_AND_SUBMIT = "go-worker-and-submit-0123456789"
SUBMIT = "go-submit-only-0123456789"


class TestGoWorker(WorkerScenarios):
    lang = "go"

    async def test_the_token_reaches_the_stream_and_the_handlers_client(
            self, start_server: Any, db_url: str, tmp_path: Path, launch_worker: Any) -> None:
        """--token: the worker stream needs the worker role, and the handler's Submit, WaitRun
        and Signal calls the submit role; a run needing both completes."""
        tokens = tmp_path / "tokens"
        tokens.write_text(f"{WORKER_AND_SUBMIT} worker,submit\n{SUBMIT} submit\n")
        srv = start_server(db_url, extra_args=["--tokens-file", str(tokens)])
        worker = launch_worker(self.lang, srv.address, {"parent": "submit:go-auth-child", "ok": "succeed",
                                                        "sender": "signal:go-auth"}, slots=2,
                               token=WORKER_AND_SUBMIT)
        async with auth.open_channel(srv.address, token=SUBMIT) as channel:
            runs = Runs(channel)
            await runs.workflows.RegisterWorkflow(workflows_pb2.RegisterWorkflowRequest(
                name="go-auth-child", nodes=[task("c", "ok")]))
            run = await runs.wait(await runs.start("go-auth", [task("p", "parent"), task("s", "sender")]))
            assert state_name(run) == "RUN_STATE_COMPLETED", run
            out = to_py(step_of(run, "p").output)
            assert out["child_result"] == {"c": self.expected(worker, "c", 1, {})}
            # The signal went to the run's mailbox (no node waits for it): Signal was allowed.
            assert to_py(step_of(run, "s").output)["lang"] == "go"
        # Without a token the same worker is refused for good: Run ends with UNAUTHENTICATED.
        refused = launch_worker(self.lang, srv.address, {"ok": "succeed"})
        assert refused.proc.wait(60) == 1
        assert "UNAUTHENTICATED" in refused.log_text()
