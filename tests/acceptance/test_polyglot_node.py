"""Acceptance: the Node demo worker of examples/worker-node (a small program on the TypeScript
SDK, sdks/typescript) against the real server: every scenario of polyglot_scenarios.py."""

import pytest

pytest.register_assert_rewrite("polyglot_harness", "polyglot_scenarios")

from polyglot_scenarios import TokenScenarios, WorkerScenarios  # noqa: E402  (after the assert rewrite hook)


class TestNodeWorker(WorkerScenarios, TokenScenarios):
    lang = "node"
