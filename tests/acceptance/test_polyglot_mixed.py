"""Acceptance: one workflow whose nodes are served by Python, Node and Go workers at once."""

from __future__ import annotations

from typing import Any

import pytest

pytest.register_assert_rewrite("polyglot_harness")

from polyglot_harness import Runs, WorkerFixtures, state_name, task, to_py  # noqa: E402

from cyclone_worker import Context, Worker  # noqa: E402


def derive(ctx: Context, worker_id: str) -> dict[str, Any]:
    """The demo workers' output rule, in Python: value = (root: input value, else sum of parents) + 1."""
    if ctx.parents:
        base = sum(p["value"] for p in ctx.parents.values())
    else:
        base = (ctx.input or {}).get("value", 0)
    return {"lang": "python", "worker": worker_id, "node": ctx.node, "attempt": ctx.attempt,
            "value": base + 1, "from": {node: out["lang"] for node, out in ctx.parents.items()}}


class TestMixedLanguages(WorkerFixtures):
    """Python (the SDK's Worker), Node and Go workers serve one run together."""

    async def test_run_passes_outputs_between_languages(self, server: Any, channel: Any, launch_worker: Any) -> None:
        node = launch_worker("node", server.address, {"node_step": "succeed"}, slots=2)
        go = launch_worker("go", server.address, {"go_step": "succeed"}, slots=2)
        python = Worker(server.address, worker_id="python-worker", slots=2)
        python.register("py_step", lambda ctx: derive(ctx, python.worker_id))
        runs = Runs(channel)
        async with python:
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
