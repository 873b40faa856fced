"""Acceptance: the TypeScript worker of examples/worker-node against the real server."""

import pytest

pytest.register_assert_rewrite("polyglot_harness", "polyglot_scenarios")

from polyglot_scenarios import WorkerScenarios  # noqa: E402  (after the assert rewrite hook)


class TestNodeWorker(WorkerScenarios):
    lang = "node"
