"""Acceptance: the Python demo worker (polyglot_python_worker.py, on cyclone_worker) against the
real server: every scenario of polyglot_scenarios.py, as the Node and Go workers pass them."""

import pytest

pytest.register_assert_rewrite("polyglot_harness", "polyglot_scenarios")

from polyglot_scenarios import TokenScenarios, WorkerScenarios  # noqa: E402  (after the assert rewrite hook)


class TestPythonWorker(WorkerScenarios, TokenScenarios):
    lang = "python"
