"""The scenarios every demo worker (Node, Go, Python) must pass end to end; a test module
subclasses `WorkerScenarios` and names the language (see polyglot_harness.py for the workers).
"""

from __future__ import annotations

import asyncio
import re
import signal
from pathlib import Path
from typing import Any

import grpc
import pytest

from cyclone_proto import types_pb2, workflows_pb2
from cyclone_worker import Client, Workflow
from polyglot_harness import (DEADLINE, DemoWorker, Runs, StreamBreaker, WorkerFixtures, state_name, step_of, task,
                              to_py, wait_for_file)
from waits_helpers import until

RUNNING, COMPLETED = types_pb2.STEP_STATE_RUNNING, types_pb2.STEP_STATE_COMPLETED


class WorkerScenarios(WorkerFixtures):
    """The worker side of the protocol, end to end, for the demo worker of `lang`."""

    lang: str

    def expected(self, worker: DemoWorker, node: str, value: int, parents: dict[str, str]) -> dict[str, Any]:
        return {"lang": self.lang, "worker": worker.worker_id, "node": node, "attempt": 1,
                "value": value, "from": parents}

    @pytest.fixture
    def runs(self, channel: grpc.aio.Channel) -> Runs:
        return Runs(channel)

    async def test_dag_with_retry_then_success(self, server: Any, runs: Runs, launch_worker: Any) -> None:
        worker = launch_worker(self.lang, server.address, {"ok": "succeed", "flaky": "fail:2"})
        run = await runs.wait(await runs.start("retry", [
            task("a", "ok"), task("b", "flaky", ["a"], max_attempts=5), task("c", "ok", ["b"])], {"value": 1}))
        assert state_name(run) == "RUN_STATE_COMPLETED"
        b = step_of(run, "b")
        assert b.attempt == 3
        assert [(e.attempt, e.error_kind) for e in b.errors] == [(1, "error"), (2, "error")]
        assert b.errors[0].message == "planned failure 1 of 2"
        assert {s.lease_owner for s in run.steps} == {worker.worker_id}
        assert to_py(step_of(run, "a").output) == self.expected(worker, "a", 2, {})
        assert to_py(run.result) == {"c": self.expected(worker, "c", 4, {"b": self.lang})}

    async def test_permanent_failure_fails_the_run(self, server: Any, runs: Runs, launch_worker: Any) -> None:
        launch_worker(self.lang, server.address, {"ok": "succeed", "broken": "permanent"})
        run = await runs.wait(await runs.start("permanent", [
            task("a", "ok"), task("b", "broken", ["a"]), task("c", "ok", ["b"])]))
        assert state_name(run) == "RUN_STATE_FAILED"
        b = step_of(run, "b")
        assert (b.state, b.error_kind, b.attempt) == (types_pb2.STEP_STATE_DISCARDED, "permanent", 1)
        assert [e.message for e in b.errors] == ["planned permanent failure of b"]
        c = step_of(run, "c")
        assert (c.state, c.cancel_cause) == (types_pb2.STEP_STATE_CANCELLED, "fail_fast")

    async def test_a_failure_sends_its_stack_as_details(self, server: Any, runs: Runs, launch_worker: Any) -> None:
        """Failed.details: Node sends the error's stack, Python the formatted traceback; Go, whose
        errors have none, the chain of wrapped errors, and for a panic the panicking goroutine's stack."""
        launch_worker(self.lang, server.address, {"broken": "permanent", "boom": "panic"})
        # Two runs: in one, the first discard would cancel the other node (fail-fast).
        a = step_of(await runs.wait(await runs.start("details-a", [task("a", "broken")])), "a")
        b = step_of(await runs.wait(await runs.start("details-b", [task("b", "boom", max_attempts=1)])), "b")
        assert a.errors[-1].message == "planned permanent failure of a"
        assert "planned permanent failure of a" in a.errors[-1].details
        assert b.errors[-1].message.endswith("demo explosion in b")
        details = b.errors[-1].details
        if self.lang == "go":
            assert "goroutine " in details and "main.explode" in details
            assert a.errors[-1].details.startswith("worker.permanentError: planned permanent failure of a\n")
        elif self.lang == "python":
            assert details.startswith("Traceback (most recent call last):\n"), details
            assert ", in explode\n" in details and details.endswith("TypeError: demo explosion in b\n")
            assert a.errors[-1].details.startswith("Traceback (most recent call last):\n")
        else:
            assert details.startswith("TypeError: demo explosion in b\n") and "at explode" in details
            assert "\n    at " in a.errors[-1].details

    async def test_an_output_over_the_limit_is_sent_as_its_size_and_discards_the_step(
            self, start_server: Any, db_url: str, launch_worker: Any) -> None:
        srv = start_server(db_url, extra_args=["--max-payload-bytes", "1000"])
        async with grpc.aio.insecure_channel(srv.address) as channel:
            runs = Runs(channel)
            launch_worker(self.lang, srv.address, {"huge": "big:5000"})
            run = await runs.wait(await runs.start("huge", [task("a", "huge")]))
        assert state_name(run) == "RUN_STATE_FAILED"
        a = step_of(run, "a")
        assert (a.state, a.error_kind, a.reason) == (types_pb2.STEP_STATE_DISCARDED, "permanent", "output_too_large")
        # The worker measured the output as the server does (compact JSON), and said so.
        assert a.errors[-1].message == "output is 5011 bytes, over the limit of 1000 bytes"

    async def test_a_lease_bigger_than_grpcs_default_4_mib_is_received(self, server: Any,
                                                                        launch_worker: Any) -> None:
        """A payload within the JSON limit travels as protobuf Values several times its size:
        the worker's channel must accept more than gRPC's default 4 MiB."""
        worker = launch_worker(self.lang, server.address, {"ok": "succeed"})
        pad = [1] * 400_000  # 800,001 bytes of JSON (under the 1 MiB limit), about 4.4 MB as a Value
        async with grpc.aio.insecure_channel(server.address,
                                             options=[("grpc.max_receive_message_length", 64 << 20)]) as channel:
            runs = Runs(channel)
            run = await runs.wait(await runs.start("padded", [task("a", "ok")], {"value": 1, "pad": pad}))
        assert state_name(run) == "RUN_STATE_COMPLETED"
        a = step_of(run, "a")
        assert (a.attempt, a.reclaims, a.lease_owner) == (1, 0, worker.worker_id)
        assert to_py(a.output) == self.expected(worker, "a", 2, {})

    async def test_cancel_stops_the_running_handler(self, server: Any, runs: Runs, launch_worker: Any,
                                                    markers: Path) -> None:
        worker = launch_worker(self.lang, server.address, {"slow": "block", "ok": "succeed"}, slots=1)
        run_id = await runs.start("cancel", [task("slow", "slow")])
        step = await runs.wait_step(run_id, "slow", RUNNING)
        await wait_for_file(markers / f"{step.id}.started")
        assert state_name(await runs.cancel(run_id)) == "RUN_STATE_CANCELLED"
        # The handler saw the server's Stop, with its reason.
        assert await wait_for_file(markers / f"{step.id}.stopped") == "cancelled"
        # The Stop freed the worker's only slot: the next run is served by it.
        run = await runs.wait(await runs.start("after-cancel", [task("a", "ok")]))
        assert state_name(run) == "RUN_STATE_COMPLETED"
        assert step_of(run, "a").lease_owner == worker.worker_id

    async def test_snooze_runs_the_step_again_later(self, server: Any, runs: Runs, launch_worker: Any) -> None:
        worker = launch_worker(self.lang, server.address, {"later": "snooze:0.3"})
        run = await runs.wait(await runs.start("snooze", [task("later", "later")], {"value": 5}))
        assert state_name(run) == "RUN_STATE_COMPLETED"
        step = step_of(run, "later")
        assert (step.snoozes, step.attempt, len(step.errors)) == (1, 1, 0)
        assert step.lease_generation == 2  # one lease answered with Snoozed, then the one that completed
        assert to_py(step.output) == self.expected(worker, "later", 6, {})

    async def test_killed_worker_step_is_reclaimed_by_another(self, server: Any, runs: Runs,
                                                             launch_worker: Any, markers: Path) -> None:
        first = launch_worker(self.lang, server.address, {"stuck": "hang"})
        run_id = await runs.start("reclaim", [task("stuck", "stuck")])
        step = await runs.wait_step(run_id, "stuck", RUNNING)
        assert step.lease_owner == first.worker_id
        await wait_for_file(markers / f"{step.id}.started")  # the handler runs: kill it mid-step
        first.kill()
        second = launch_worker(self.lang, server.address, {"stuck": "succeed"})
        run = await runs.wait(run_id)
        assert state_name(run) == "RUN_STATE_COMPLETED"
        step = step_of(run, "stuck")
        assert (step.reclaims, step.attempt, step.lease_generation) == (1, 1, 2)
        assert step.lease_owner == second.worker_id
        assert to_py(step.output)["worker"] == second.worker_id

    async def test_sigterm_drains_and_hands_back_new_leases(self, server: Any, runs: Runs, launch_worker: Any,
                                                           markers: Path) -> None:
        # The nap holds the worker in its drain while the second run is pushed and handed
        # back: 6 s leaves 5 s or more for that on a loaded machine (3 s left 2.5).
        worker = launch_worker(self.lang, server.address, {"nap": "sleep:6", "ok": "succeed"}, slots=2)
        first = await runs.start("drain", [task("nap", "nap")])
        step = await runs.wait_step(first, "nap", RUNNING)
        await wait_for_file(markers / f"{step.id}.started")
        worker.proc.send_signal(signal.SIGTERM)

        async def draining() -> bool:
            return "draining" in worker.log_text()
        await until(draining, "the worker to start draining")
        # Pushed into the free slot while the worker drains: it must come back unrun.
        second = await runs.start("drained", [task("a", "ok")])
        assert await asyncio.to_thread(worker.proc.wait, 30) == 0
        assert (await runs.step(first, "nap")).state == COMPLETED  # the running handler finished
        handed_back = await runs.step(second, "a")
        assert (handed_back.state, handed_back.lease_owner) == (types_pb2.STEP_STATE_AVAILABLE, worker.worker_id)
        assert (handed_back.snoozes, handed_back.attempt, handed_back.lease_generation) == (1, 1, 1)
        other = launch_worker(self.lang, server.address, {"ok": "succeed"})
        assert step_of(await runs.wait(second), "a").lease_owner == other.worker_id

    async def test_reconnect_keeps_the_held_lease(self, start_server: Any, db_url: str, launch_worker: Any,
                                                  markers: Path) -> None:
        server = start_server(db_url, lease_ttl=3)
        breaker = StreamBreaker(server.address)
        worker = launch_worker(self.lang, await breaker.start(), {"nap": "sleep:5"})
        try:
            async with grpc.aio.insecure_channel(server.address) as channel:
                runs = Runs(channel)
                run_id = await runs.start("held", [task("nap", "nap")])
                step = await runs.wait_step(run_id, "nap", RUNNING)
                await wait_for_file(markers / f"{step.id}.started")
                breaker.drop()  # the worker reconnects at once, listing the lease in Hello.held
                run = await runs.wait(run_id)
        finally:
            await breaker.close()
        assert state_name(run) == "RUN_STATE_COMPLETED"
        done = step_of(run, "nap")
        # The handler outlived the 3 s TTL: only renewals of the held lease kept it from a reclaim.
        assert (done.lease_generation, done.reclaims, done.lease_owner) == (1, 0, worker.worker_id)
        assert worker.log_text().count("welcome from") == 2
        # The second Hello listed the lease (the server logs each Hello's held leases).
        hellos = re.findall(rf"worker {re.escape(worker.worker_id)} connected \(.*, (\d+) held\)", server.log_text())
        assert hellos == ["0", "1"], hellos

    async def test_reconnect_delivers_a_result_made_while_disconnected(
            self, start_server: Any, db_url: str, launch_worker: Any, markers: Path) -> None:
        # A long TTL: the lease must outlive the server's restart, so only the stream breaks.
        server = start_server(db_url, lease_ttl=30)
        worker = launch_worker(self.lang, server.address, {"nap": "sleep:2"})
        async with grpc.aio.insecure_channel(server.address) as channel:
            run_id = await Runs(channel).start("reconnect", [task("nap", "nap")])
            step = await Runs(channel).wait_step(run_id, "nap", RUNNING)
        await wait_for_file(markers / f"{step.id}.started")
        server.kill()
        await wait_for_file(markers / f"{step.id}.done")  # the result now waits in the worker
        server.restart()
        async with grpc.aio.insecure_channel(server.address) as channel:
            run = await Runs(channel).wait(run_id)
        assert state_name(run) == "RUN_STATE_COMPLETED"
        done = step_of(run, "nap")
        # Hello listed the held lease, the server kept it, and the result was applied under it.
        assert (done.lease_generation, done.reclaims, done.lease_owner) == (1, 0, worker.worker_id)
        assert worker.log_text().count("welcome from") == 2
        hellos = re.findall(rf"worker {re.escape(worker.worker_id)} connected \(.*, (\d+) held\)", server.log_text())
        assert hellos == ["0", "1"], hellos

    async def test_the_lease_carries_the_submitters_trace_context(self, server: Any, runs: Runs,
                                                                   launch_worker: Any) -> None:
        launch_worker(self.lang, server.address, {"traced": "trace"})
        traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
        traced = await runs.start("traced", [task("a", "traced"), task("b", "traced", ["a"])], metadata=(
            ("traceparent", traceparent), ("tracestate", "congo=t61rcWkgMzE")))
        plain = await runs.start("plain", [task("a", "traced")])
        run = await runs.wait(traced)
        # Every step of the run got the submitter's context (the server does not trace here),
        # parsed by the worker into its ids and sampled flag.
        expected = {"lang": self.lang, "traceparent": traceparent, "tracestate": "congo=t61rcWkgMzE",
                    "trace_id": "0af7651916cd43dd8448eb211c80319c", "span_id": "b7ad6b7169203331", "sampled": True}
        if self.lang == "go":
            expected["from_context"] = True  # the handler's context.Context carries it too
        assert [to_py(step_of(run, n).output) for n in ("a", "b")] == [expected, expected]
        without = {"lang": self.lang, "traceparent": ""}
        if self.lang == "go":
            without["from_context"] = True
        assert to_py(step_of(await runs.wait(plain), "a").output) == without

    async def test_faildelay_asks_for_its_own_retry_delay(self, server: Any, runs: Runs, launch_worker: Any) -> None:
        """faildelay:N:MS sends Failed.retry_delay: the node's backoff (0.1 s here) is replaced."""
        worker = launch_worker(self.lang, server.address, {"slowretry": "faildelay:2:1500"})
        run = await runs.wait(await runs.start("faildelay", [task("a", "slowretry", max_attempts=5)], {"value": 1}))
        assert state_name(run) == "RUN_STATE_COMPLETED"
        a = step_of(run, "a")
        assert (a.attempt, [e.attempt for e in a.errors]) == (3, [1, 2])
        assert a.errors[0].message == "planned failure 1 of 2, retry in 1500 ms"
        # Each retry could not start before the 1.5 s the handler asked for (a lower bound: no
        # claim on the machine's speed); with the node's backoff it would have been ~0.1 s.
        gaps = [a.errors[1].at.ToDatetime() - a.errors[0].at.ToDatetime(),
                a.started_at.ToDatetime() - a.errors[1].at.ToDatetime()]
        assert all(gap.total_seconds() >= 1.5 for gap in gaps), gaps
        assert to_py(a.output) == {**self.expected(worker, "a", 2, {}), "attempt": 3}

    async def test_submit_starts_a_child_run_through_the_sdk_client(self, server: Any, runs: Runs,
                                                                     launch_worker: Any) -> None:
        """submit:WORKFLOW: the handler submits a run with its SDK's client, waits for its result,
        and the run joins the handler's trace (the client sends the lease's traceparent)."""
        worker = launch_worker(self.lang, server.address, {"parent": f"submit:{self.lang}-child", "ok": "succeed",
                                                            "traced": "trace"}, slots=2)
        await runs.workflows.RegisterWorkflow(workflows_pb2.RegisterWorkflowRequest(
            name=f"{self.lang}-child", nodes=[task("c", "ok"), task("t", "traced")]))
        traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
        run = await runs.wait(await runs.start(f"{self.lang}-parent", [task("p", "parent")],
                                               metadata=(("traceparent", traceparent),)))
        assert state_name(run) == "RUN_STATE_COMPLETED", run
        p = step_of(run, "p")
        out = to_py(p.output)
        assert out["lang"] == self.lang
        child = await runs.wait(out["child_run"])
        assert state_name(child) == "RUN_STATE_COMPLETED"
        assert to_py(child.input) == {"parent_step": p.id}
        assert out["child_result"] == to_py(child.result)
        assert out["child_result"]["c"] == self.expected(worker, "c", 1, {})
        assert out["child_result"]["t"]["traceparent"] == traceparent

    async def test_signal_reaches_the_handlers_own_run(self, server: Any, runs: Runs, launch_worker: Any) -> None:
        """signal:NAME: the handler signals its own run; the waiting signal node completes with
        the payload, and the handler then succeeds."""
        worker = launch_worker(self.lang, server.address, {"sender": f"signal:{self.lang}-done"})
        wait = types_pb2.Node(id="wait", type=types_pb2.NODE_TYPE_SIGNAL, signal=f"{self.lang}-done")
        run = await runs.wait(await runs.start(f"{self.lang}-signal", [task("s", "sender"), wait], {"value": 3}))
        assert state_name(run) == "RUN_STATE_COMPLETED"
        s = step_of(run, "s")
        assert to_py(step_of(run, "wait").output) == {"from": self.lang, "step": s.id}
        assert to_py(s.output) == self.expected(worker, "s", 4, {})


class TokenScenarios(WorkerFixtures):
    """A server with bearer tokens: the demo worker's `--token` goes on its stream and on the
    calls its handlers make with the SDK's client. (Not in WorkerScenarios: `--token` is not
    part of the command line every demo worker must take.)"""

    lang: str
    TOKENS = "worker-submit-token-0123456789 worker,submit\nadmin-token-0123456789012345 admin\n"

    async def test_a_token_opens_the_stream_and_the_handlers_client_calls(
            self, start_server: Any, db_url: str, launch_worker: Any, tmp_path: Path) -> None:
        tokens = tmp_path / "tokens"
        tokens.write_text(self.TOKENS)
        server = start_server(db_url, extra_args=["--tokens-file", str(tokens)])
        # A wrong token is fatal: the worker exits at once instead of reconnecting.
        refused = launch_worker(self.lang, server.address, {"ok": "succeed"}, token="not-a-token-0123456789")
        assert await asyncio.to_thread(refused.proc.wait, 30) != 0
        assert "UNAUTHENTICATED" in refused.log_text() or "Unauthenticated" in refused.log_text()
        worker = launch_worker(self.lang, server.address, {"spawn": "submit:tok-child", "ok": "succeed"}, slots=2,
                               token="worker-submit-token-0123456789")
        async with Client(server.address, token="admin-token-0123456789012345") as client:
            await client.register(Workflow("tok-child").task("c", kind="ok"))
            await client.register(Workflow("tok-parent").task("p", kind="spawn"))
            run = await client.wait(await client.submit("tok-parent"), timeout=DEADLINE)
            assert run.state == "completed", run
            out = run.step("p").output
            child = await client.get(out["child_run"])
        assert (out["lang"], child.state, child.input) == (self.lang, "completed", {"parent_step": run.step("p").id})
        assert out["child_result"] == {"c": self.expected(worker, "c", 1, {})}

    def expected(self, worker: DemoWorker, node: str, value: int, parents: dict[str, str]) -> dict[str, Any]:
        return {"lang": self.lang, "worker": worker.worker_id, "node": node, "attempt": 1,
                "value": value, "from": parents}
