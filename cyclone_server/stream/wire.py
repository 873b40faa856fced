"""The stream's messages: a claimed row as a Lease, a StepResult as a Result, and the ack of each result."""

from __future__ import annotations

import json
from typing import Any

from cyclone_proto import workers_pb2 as pb
from cyclone_worker.values import fill_stored

from cyclone_server import tracing
from cyclone_server.convert import duration_seconds, optional_value
from cyclone_server.definitions import MAX_SECONDS
from cyclone_server.errors import CycloneError, InvalidArgument
from cyclone_server.records import Result, canonical_id

_loads = json.loads

# The longest retry delay or snooze a worker may ask for, as for a node's backoff settings.
MAX_DELAY_SECONDS = MAX_SECONDS

# The SQL statuses of a result, and the ack each becomes (the SQL's finer 'applied' kinds
# travel in the ack's detail).
ACK_OF_STATUS = {
    "applied": pb.ACK_STATUS_APPLIED, "retried": pb.ACK_STATUS_APPLIED, "discarded": pb.ACK_STATUS_APPLIED,
    "snoozed": pb.ACK_STATUS_APPLIED, "output_too_large": pb.ACK_STATUS_APPLIED,
    "stale": pb.ACK_STATUS_STALE, "ended": pb.ACK_STATUS_ENDED, "unknown": pb.ACK_STATUS_UNKNOWN,
    "invalid": pb.ACK_STATUS_INVALID,
}


def _set_time_us(ts: Any, us: int) -> None:
    """Microseconds since the epoch into the Timestamp `ts` (what Timestamp.FromDatetime
    makes of the same instant)."""
    ts.seconds, micros = divmod(us, 1_000_000)
    ts.nanos = micros * 1000


def lease_message(row: Any, lease: pb.Lease | None = None) -> pb.Lease:
    """The Lease for a claimed row (Engine.claim_leases), filled into `lease` when given (an
    element added to the outgoing Leases, so that nothing is built twice and copied). The
    input and the parents arrive as JSON text and go straight into the message's own
    fields; the times arrive in microseconds. On the wire it is the same message as ever,
    field for field (`parents` is present, empty, for a step without parents)."""
    if lease is None:
        lease = pb.Lease()
    lease.run_id = row.run_id
    lease.step_id = row.step_id
    lease.node = row.node
    lease.kind = row.kind
    lease.attempt = row.attempt
    lease.max_attempts = row.max_attempts
    lease.reclaims = row.reclaims
    lease.snoozes = row.snoozes
    lease.lease_generation = row.lease_generation
    fill_stored(lease.input, None if row.input is None else _loads(row.input))
    if row.parents is not None:
        fields = lease.parents.fields
        for key, item in _loads(row.parents).items():
            fill_stored(fields[key], item)
    else:
        lease.parents.SetInParent()
    _set_time_us(lease.lease_expiry, row.lease_expiry_us)
    if row.attempt_deadline_us is not None:
        _set_time_us(lease.attempt_deadline, row.attempt_deadline_us)
    if row.trace_context:
        lease.trace_context.CopyFrom(tracing.lease_context(row.trace_context))
    return lease


def traced(row: Any) -> tuple[Any, tracing.StepSpan | None]:
    """A claimed row of a run with a trace context: its step span (None when the server
    does not trace), and the row with the context the lease carries (the span's)."""
    fields = row._asdict()
    trace = tracing.step_claimed(fields)
    return row._replace(trace_context=fields["trace_context"]), trace


def to_result(r: pb.StepResult, max_output_bytes: int) -> Result | str:
    """The engine's Result for a StepResult, or 'unknown: why' when the step id is not an id.
    `max_output_bytes`: Welcome.max_payload_bytes, which an oversized_output_bytes must exceed.

    A malformed answer (a NaN or U+0000 in the output, a delay out of range, no outcome)
    becomes a failed attempt carrying why (`Result.invalid`): the worker takes an INVALID
    ack as the end of its lease, so the server must end the attempt too, never keep a
    lease that nobody will answer. A failure message is never refused (engine.storable_message).
    """
    try:
        step_id = canonical_id(r.step_id, "step_id")
    except CycloneError:
        return "unknown: step_id is not a valid id"
    outcome = r.WhichOneof("outcome")
    try:
        if outcome == "completed":
            oversized = r.completed.oversized_output_bytes
            if oversized < 0:
                raise InvalidArgument(f"completed.oversized_output_bytes: must be >= 0, got {oversized}")
            if oversized > 0:
                if oversized <= max_output_bytes:
                    # Completing with no output would lose it without a word: the worker's bug, said.
                    raise InvalidArgument(f"completed.oversized_output_bytes: {oversized} "
                                          f"is not over the limit of {max_output_bytes} bytes "
                                          "(Welcome.max_payload_bytes): send the output itself")
                return Result(step_id, r.lease_generation, "completed", oversized_output_bytes=oversized)
            try:
                output = optional_value(r.completed, "output")
            except CycloneError as e:
                raise InvalidArgument(f"completed.{e.message}") from None
            return Result(step_id, r.lease_generation, "completed", output=output)
        if outcome == "failed":
            return Result(step_id, r.lease_generation, "failed", message=r.failed.message,
                          permanent=r.failed.permanent, details=r.failed.details,
                          retry_delay=_delay(r.failed, "retry_delay", "failed.retry_delay"))
        if outcome == "snoozed":
            return Result(step_id, r.lease_generation, "snoozed",
                          delay=_delay(r.snoozed, "delay", "snoozed.delay") or 0.0)
        raise InvalidArgument("the result has no outcome (completed, failed or snoozed)")
    except CycloneError as e:
        return invalid_result(step_id, r.lease_generation, e.message)


def invalid_result(step_id: str, generation: int, why: str) -> Result:
    """The failed attempt that stands for a malformed answer to the lease (step_id, generation)."""
    return Result(step_id, generation, "failed", message=f"invalid result: {why}", invalid=why)


def _delay(msg: Any, name: str, field: str) -> float | None:
    """A worker's Duration in seconds (None when unset), within [0, MAX_DELAY_SECONDS]."""
    return duration_seconds(msg, name, field=field, maximum=MAX_DELAY_SECONDS)


# The ack detail of each SQL status: the kind of applied result, or why it was refused.
DETAIL_OF_STATUS = {
    "applied": "", "retried": "retried", "discarded": "discarded", "snoozed": "snoozed",
    "output_too_large": "output_too_large",
    "stale": "the step runs, or ran, under another lease generation",
    "ended": "the step already left running under this lease generation",
    "unknown": "no such step", "invalid": "the result is malformed",
}


def ack(step_id: str, generation: int, status: str, detail: str | None = None) -> pb.ResultAck:
    return pb.ResultAck(step_id=step_id, lease_generation=generation, status=ACK_OF_STATUS[status],
                        detail=DETAIL_OF_STATUS[status] if detail is None else detail)


__all__ = ["MAX_DELAY_SECONDS", "ACK_OF_STATUS", "DETAIL_OF_STATUS", "lease_message", "to_result", "invalid_result",
           "ack", "traced"]
