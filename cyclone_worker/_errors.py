"""The SDK's errors, and how a handler's exception becomes a step result on the wire.

Retryability is data on the error (`HandlerError.permanent`, `.retry_delay`), not a class
hierarchy: `Permanent` and `RetryAfter` are shorthands that set it.
"""

from __future__ import annotations

import traceback
from typing import TYPE_CHECKING, Any

import grpc

from cyclone_proto import workers_pb2
from .values import Seconds, seconds_of, to_duration

if TYPE_CHECKING:
    from ._models import Run

__all__ = ["CycloneError", "HandlerError", "Permanent", "RetryAfter", "Snooze", "Fenced",
           "CycloneClientError", "RunFailed", "RunCancelled", "outcome_of"]


class CycloneError(Exception):
    """Root of every error the Cyclone SDK raises.

    Example::

        try:
            await client.result(run_id)
        except CycloneError as e:
            log.error("cyclone: %s", e)
    """


class HandlerError(CycloneError):
    """Raised by a handler to fail its step, saying whether and when to retry.

    `permanent=True` discards the step at once (no retry); `retry_delay` (seconds or a
    timedelta) replaces the node's backoff before the next attempt.

    Example::

        @worker.handler("charge")
        async def charge(ctx):
            if ctx.input["amount"] <= 0:
                raise HandlerError("amount must be positive", permanent=True)
    """

    def __init__(self, message: Any = "", *, permanent: bool = False, retry_delay: Seconds | None = None) -> None:
        if isinstance(message, BaseException):
            message = f"{type(message).__name__}: {message}"
        super().__init__(str(message))
        self.message: str = str(message)
        self.permanent = permanent
        self.retry_delay: float | None = None if retry_delay is None else seconds_of(retry_delay, "retry_delay")


class Permanent(HandlerError):
    """A failure that retrying cannot fix: the step is discarded (error_kind "permanent").

    Takes a message or the exception that caused it.

    Example::

        try:
            user = load_user(ctx.input["user_id"])
        except KeyError as e:
            raise Permanent(e) from e
    """

    def __init__(self, err_or_message: Any = "") -> None:
        super().__init__(err_or_message, permanent=True)


class RetryAfter(HandlerError):
    """A retryable failure with its own delay before the next attempt (instead of the backoff).

    Example::

        if response.status == 429:
            raise RetryAfter(float(response.headers["Retry-After"]), "rate limited")
    """

    def __init__(self, seconds: Seconds, message: Any = "") -> None:
        super().__init__(message or f"retry after {seconds_of(seconds, 'seconds')} s", retry_delay=seconds)


class Snooze(CycloneError):
    """Raised by a handler to run the step again after `seconds`; not a failure (attempt unchanged).

    Example::

        if not report_ready(ctx.input["report_id"]):
            raise Snooze(30)
    """

    def __init__(self, seconds: Seconds) -> None:
        self.delay = seconds_of(seconds, "seconds")
        super().__init__(f"snooze {self.delay} s")


class Fenced(CycloneError):
    """The step's lease is no longer ours (cancelled, reclaimed, already ended): nothing was applied.

    `status` is the engine's refusal: "stale", "ended" or "unknown".

    Example::

        try:
            async with ctx.completion_tx() as tx:
                ...
        except Fenced:
            log.info("another worker owns this step now")
            raise
    """

    def __init__(self, status: str, step_id: str = "", lease_generation: int = 0) -> None:
        self.status = status
        self.step_id = step_id
        self.lease_generation = lease_generation
        super().__init__(f"step {step_id} generation {lease_generation}: result refused ({status})")


class CycloneClientError(CycloneError):
    """A failed call to the Cyclone server: `code` is the grpc.StatusCode, `message` its detail.

    Example::

        try:
            await client.retry(run_id, "fetch")
        except CycloneClientError as e:
            if e.code == grpc.StatusCode.FAILED_PRECONDITION:
                print("not discarded:", e.message)
    """

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        self.code = code
        self.message = message
        super().__init__(f"{code.name}: {message}")

    @classmethod
    def from_rpc(cls, e: grpc.RpcError) -> CycloneClientError:
        """The error for a failed gRPC call."""
        code = e.code() if hasattr(e, "code") else grpc.StatusCode.UNKNOWN
        details = e.details() if hasattr(e, "details") else str(e)
        return cls(code or grpc.StatusCode.UNKNOWN, details or "")


class RunFailed(CycloneError):
    """`Client.result` of a run that failed; `run` holds its steps (see the discarded ones).

    Example::

        try:
            await client.result(run_id)
        except RunFailed as e:
            bad = [s for s in e.run.steps if s.state == "discarded"]
    """

    def __init__(self, run: Run) -> None:
        self.run = run
        detail = "; ".join(f"{s.node}: {s.error_kind} {s.errors[-1].message if s.errors else ''}".strip()
                           for s in run.steps if s.state == "discarded")
        super().__init__(f"run {run.id} failed" + (f" ({detail})" if detail else ""))


class RunCancelled(CycloneError):
    """`Client.result` of a run that was cancelled.

    Example::

        try:
            await client.result(run_id)
        except RunCancelled:
            pass
    """

    def __init__(self, run: Run) -> None:
        self.run = run
        super().__init__(f"run {run.id} was cancelled")


def outcome_of(exc: BaseException) -> workers_pb2.StepResult:
    """The StepResult outcome (no ids set) for a handler that raised `exc`.

    Snooze -> snoozed; HandlerError -> failed with its permanence and retry delay; any
    other exception -> a retryable failure named ``"{type}: {message}"``.
    A failure carries the exception's formatted traceback in `failed.details` (with its
    causes), which the server keeps in the step's error history.
    """
    result = workers_pb2.StepResult()
    if isinstance(exc, Snooze):
        result.snoozed.delay.CopyFrom(to_duration(exc.delay))
        return result
    if isinstance(exc, HandlerError):
        result.failed.message = exc.message
        result.failed.permanent = exc.permanent
        if exc.retry_delay is not None and not exc.permanent:
            result.failed.retry_delay.CopyFrom(to_duration(exc.retry_delay))
    else:
        result.failed.message = f"{type(exc).__name__}: {exc}"
    result.failed.details = "".join(traceback.format_exception(exc))
    return result
