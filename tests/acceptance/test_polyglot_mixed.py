"""Acceptance: workflows whose steps are served by the Node, Go and Python demo workers at once
(each a small program on its language's SDK; see polyglot_harness.py)."""

from __future__ import annotations

from typing import Any

import pytest

pytest.register_assert_rewrite("polyglot_harness")

from cyclone_proto import types_pb2, workflows_pb2  # noqa: E402
from polyglot_harness import Runs, WorkerFixtures, state_name, step_of, task, to_py  # noqa: E402


class TestMixedLanguages(WorkerFixtures):
    """Node, Go and Python workers serve one run together."""

    async def test_run_passes_outputs_between_languages(self, server: Any, channel: Any, launch_worker: Any) -> None:
        node = launch_worker("node", server.address, {"node_step": "succeed"}, slots=2)
        go = launch_worker("go", server.address, {"go_step": "succeed"}, slots=2)
        python = launch_worker("python", server.address, {"py_step": "succeed"}, slots=2)
        runs = Runs(channel)
        #   a(py) -> b(node) -> d(go) \
        #        \-> c(go) -> e(node) -> f(py)
        run = await runs.wait(await runs.start("mixed", [
            task("a", "py_step"),
            task("b", "node_step", ["a"]), task("c", "go_step", ["a"]),
            task("d", "go_step", ["b"]), task("e", "node_step", ["c"]),
            task("f", "py_step", ["d", "e"]),
        ], {"value": 1}))
        assert state_name(run) == "RUN_STATE_COMPLETED"
        owners = {s.node: s.lease_owner for s in run.steps}
        assert owners == {"a": python.worker_id, "b": node.worker_id, "c": go.worker_id,
                          "d": go.worker_id, "e": node.worker_id, "f": python.worker_id}
        outputs = {s.node: to_py(s.output) for s in run.steps}
        # Each step read its parents' outputs, written by another language, and built on them.
        assert {n: (o["lang"], o["value"], o["from"]) for n, o in outputs.items()} == {
            "a": ("python", 2, {}),
            "b": ("node", 3, {"a": "python"}),
            "c": ("go", 3, {"a": "python"}),
            "d": ("go", 4, {"b": "node"}),
            "e": ("node", 4, {"c": "go"}),
            "f": ("python", 9, {"d": "go", "e": "node"}),
        }
        assert to_py(run.result) == {"f": outputs["f"]}

    async def test_signals_and_child_runs_cross_languages(self, server: Any, channel: Any,
                                                          launch_worker: Any) -> None:
        """Handlers use their SDK's client: a Python handler signals the run, which lets a Node
        handler start a child run served by Go and Python workers; a Go handler signals last."""
        python = launch_worker("python", server.address, {"py_step": "succeed", "py_signal": "signal:from-python"},
                               slots=2)
        node = launch_worker("node", server.address, {"node_submit": "submit:handoff-child"}, slots=2)
        go = launch_worker("go", server.address, {"go_step": "succeed", "go_signal": "signal:from-go"}, slots=2)
        runs = Runs(channel)
        await runs.workflows.RegisterWorkflow(workflows_pb2.RegisterWorkflowRequest(
            name="handoff-child", nodes=[task("x", "go_step"), task("y", "py_step", ["x"])]))

        def gate(id: str, name: str, deps: list[str] | None = None) -> types_pb2.Node:
            return types_pb2.Node(id=id, type=types_pb2.NODE_TYPE_SIGNAL, signal=name, deps=deps or [])
        #   a(py: signal) ~> py-gate -> b(node: submit child x(go) -> y(py)) -> c(go: signal) ~> go-gate
        run = await runs.wait(await runs.start("handoff", [
            task("a", "py_signal"), gate("py-gate", "from-python"),
            task("b", "node_submit", ["py-gate"]),
            task("c", "go_signal", ["b"]), gate("go-gate", "from-go", ["b"]),
        ], {"value": 10}))
        assert state_name(run) == "RUN_STATE_COMPLETED", run
        a, b, c = (step_of(run, n) for n in "abc")
        assert (a.lease_owner, b.lease_owner, c.lease_owner) == (python.worker_id, node.worker_id, go.worker_id)
        assert to_py(step_of(run, "py-gate").output) == {"from": "python", "step": a.id}
        assert to_py(step_of(run, "go-gate").output) == {"from": "go", "step": c.id}
        out = to_py(b.output)
        child = await runs.wait(out["child_run"])
        assert state_name(child) == "RUN_STATE_COMPLETED"
        assert to_py(child.input) == {"parent_step": b.id}
        assert {s.node: s.lease_owner for s in child.steps} == {"x": go.worker_id, "y": python.worker_id}
        # The child's leaf, written by Python from Go's output, came back through Node's client.
        assert out["lang"] == "node"
        assert (out["child_result"]["y"]["lang"], out["child_result"]["y"]["from"]) == ("python", {"x": "go"})
        assert out["child_result"] == to_py(child.result)
