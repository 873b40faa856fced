"""Unit tests of how handler exceptions become step results, and of the SDK's error types."""

from __future__ import annotations

from datetime import timedelta

import grpc
import pytest

from cyclone_worker import (CycloneClientError, CycloneError, Fenced, HandlerError, Permanent, RetryAfter,
                            RunCancelled, RunFailed, Snooze)
from cyclone_worker._errors import outcome_of
from cyclone_worker._models import Run, Step, StepError
from cyclone_worker._session import Disconnected, reconnectable


def test_any_exception_is_a_retryable_failure_named_by_its_type() -> None:
    r = outcome_of(ValueError("bad row 7"))
    assert r.WhichOneof("outcome") == "failed"
    assert r.failed.message == "ValueError: bad row 7"
    assert not r.failed.permanent and not r.failed.HasField("retry_delay")


def test_permanent_discards_and_takes_a_message_or_an_exception() -> None:
    r = outcome_of(Permanent("no such user"))
    assert r.failed.permanent and r.failed.message == "no such user"
    r = outcome_of(Permanent(KeyError("user_id")))
    assert r.failed.permanent and r.failed.message == "KeyError: 'user_id'"
    assert not r.failed.HasField("retry_delay")


def test_retry_after_sets_the_delay() -> None:
    r = outcome_of(RetryAfter(2.5, "rate limited"))
    assert not r.failed.permanent and r.failed.message == "rate limited"
    assert r.failed.retry_delay.ToTimedelta() == timedelta(seconds=2.5)
    assert outcome_of(RetryAfter(timedelta(minutes=1))).failed.retry_delay.seconds == 60


def test_retryability_is_data_on_the_error() -> None:
    r = outcome_of(HandlerError("quota", permanent=False, retry_delay=3))
    assert not r.failed.permanent and r.failed.retry_delay.seconds == 3
    assert outcome_of(HandlerError("broken", permanent=True, retry_delay=3)).failed.permanent
    # a permanent failure carries no retry delay: it will not be retried
    assert not outcome_of(HandlerError("broken", permanent=True, retry_delay=3)).failed.HasField("retry_delay")


def test_snooze_is_not_a_failure() -> None:
    r = outcome_of(Snooze(30))
    assert r.WhichOneof("outcome") == "snoozed" and r.snoozed.delay.seconds == 30
    with pytest.raises(ValueError):
        Snooze(-1)


def test_error_tree_has_one_root() -> None:
    for cls in (HandlerError, Permanent, RetryAfter, Snooze, Fenced, CycloneClientError, RunFailed, RunCancelled):
        assert issubclass(cls, CycloneError)


def test_client_error_carries_the_grpc_code() -> None:
    e = CycloneClientError(grpc.StatusCode.NOT_FOUND, "run 1 not found")
    assert e.code == grpc.StatusCode.NOT_FOUND and e.message == "run 1 not found"
    assert str(e) == "NOT_FOUND: run 1 not found"


def test_fenced_names_the_refusal() -> None:
    e = Fenced("stale", "step-1", 3)
    assert e.status == "stale" and "generation 3" in str(e)


def test_run_failed_lists_the_discarded_steps() -> None:
    step = Step(id="s", run_id="r", node="charge", kind="charge", type="task", state="discarded", attempt=1,
                max_attempts=3, reclaims=0, max_reclaims=5, snoozes=0, priority=0, lease_generation=1,
                error_kind="permanent", errors=[StepError(1, "permanent", "card declined", None)])
    e = RunFailed(Run(id="r", workflow="w", workflow_version=1, state="failed", steps=[step]))
    assert "charge: permanent card declined" in str(e)
    assert e.run.step("charge") is step


@pytest.mark.parametrize("code, retry", [
    (grpc.StatusCode.UNAVAILABLE, True), (grpc.StatusCode.INTERNAL, True),
    (grpc.StatusCode.DEADLINE_EXCEEDED, True), (grpc.StatusCode.INVALID_ARGUMENT, False),
    (grpc.StatusCode.UNAUTHENTICATED, False), (grpc.StatusCode.PERMISSION_DENIED, False),
])
def test_worker_reconnects_on_every_status_but_invalid_and_auth(code: grpc.StatusCode, retry: bool) -> None:
    assert reconnectable(CycloneClientError(code, "x")) is retry
    assert not reconnectable(Disconnected("lost"))  # handled apart: reconnect at once
    assert not reconnectable(RuntimeError("a bug is not a network problem"))
