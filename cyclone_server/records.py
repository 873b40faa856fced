"""What the services hand the store and get back: jobs, results, ids, payload limits and states.

Pure code: the services check input with it before anything reaches Postgres, and the
store builds its statements' parameters from it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from cyclone_server.errors import InvalidArgument

DEFAULT_MAX_PAYLOAD_BYTES = 1 << 20
# A failure message is stored up to this many bytes (UTF-8); a longer one is cut there and
# marked. Unlike payloads, a message is never a reason to refuse a result.
MAX_ERROR_MESSAGE_BYTES = 64 * 1024
# A failure's details (Failed.details: a traceback, a stack) are stored per attempt up to
# this many bytes (UTF-8), cut and marked the same way past it.
MAX_ERROR_DETAILS_BYTES = 16 * 1024
ENQUEUE_MANY_MAX = 1000  # jobs per EnqueueMany call
TERMINAL_RUN_STATES = frozenset({"completed", "failed", "cancelled"})
RUN_STATES = ("running", "paused", "completed", "failed", "cancelled")
RUN_ACTIONS = frozenset({"cancel", "pause", "resume", "retry"})


@dataclass(frozen=True)
class Job:
    """One standalone job for `Engine.enqueue_many`, with `Engine.enqueue`'s arguments."""

    kind: str
    input: Any = None
    priority: int = 0
    idempotency_key: str | None = None
    deadline: datetime | None = None
    scheduled_at: datetime | None = None
    options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    # What identifies the request for the idempotency check; default: the fields above.
    request_fingerprint: Any = None
    # The submitter's W3C trace context ({"traceparent", "tracestate"}), kept with the run.
    trace_context: Mapping[str, str] | None = None


@dataclass(frozen=True)
class PreparedJob:
    """A Job checked by `Engine.prepare_job`: the parameters of cyclone_job_enqueue, its
    input's size in bytes (compact JSON), and its element of cyclone_jobs_enqueue's batch
    as JSON text (`item`: the input serialized once, for its size and for the batch)."""

    params: dict[str, Any]
    input_bytes: int
    item: str


@dataclass(frozen=True)
class Result:
    """One worker result for `Engine.apply_results`."""

    step_id: str
    generation: int
    outcome: str  # "completed" | "failed" | "snoozed"
    output: Any = None
    message: str = ""
    permanent: bool = False
    retry_delay: float | None = None  # seconds
    delay: float | None = None  # seconds, snooze
    details: str = ""  # Failed.details (a traceback); "" for none
    # The output's size (compact JSON) when the worker measured it over the limit and sent
    # the size instead of the output: the step is discarded (output_too_large).
    oversized_output_bytes: int | None = None
    # Set when the worker's answer was malformed (why, naming the field): this Result is the
    # failed attempt that replaces it, so that no lease outlives an answer nobody can apply.
    invalid: str | None = None

    def batch_item(self, step_id: str, max_output_bytes: int) -> str:
        """The element of cyclone_results_apply's batch, as JSON text, with `step_id` (this
        result's id in canonical form). An output over `max_output_bytes` is left out: only
        its size goes to the database, which discards the step. A completion's output is
        serialized once, and that text is both measured and sent (the id is a canonical UUID
        and the output text what `json.dumps` wrote: nothing in either can break out of the
        element)."""
        if self.outcome == "completed":
            if self.oversized_output_bytes is None:
                text = compact(self.output)
                size = len(text.encode("utf-8", "surrogatepass"))
            else:
                text, size = "null", self.oversized_output_bytes
            head = f'{{"step_id":"{step_id}","generation":{int(self.generation)},"outcome":"completed","output_bytes":{size}'
            return head + "}" if size > max_output_bytes else f'{head},"output":{text}}}'
        d: dict[str, Any] = {"step_id": step_id, "generation": self.generation, "outcome": self.outcome}
        if self.outcome == "failed":
            d["message"] = storable_message(self.message)
            d["permanent"] = self.permanent
            if self.retry_delay is not None:
                d["retry_delay_ms"] = self.retry_delay * 1000
            if self.details:
                d["details"] = storable_message(self.details, MAX_ERROR_DETAILS_BYTES)
        elif self.outcome == "snoozed":
            d["delay_ms"] = (self.delay or 0) * 1000
        return compact(d)


_CANONICAL_ID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def canonical_id(value: str, field: str) -> str:
    """`str(parse_id(value, field))`, without parsing an id already in that form (every id
    the server sends is, so the ids workers echo back are)."""
    if type(value) is str and _CANONICAL_ID.fullmatch(value):
        return value
    return str(parse_id(value, field))


def parse_id(value: str, field: str) -> uuid.UUID:
    """A run or step id from the wire; a malformed one is INVALID_ARGUMENT naming the field."""
    try:
        return uuid.UUID(str(value))
    except ValueError:
        raise InvalidArgument(f"{field}: {value!r} is not a valid id") from None



def compact(value: Any) -> str:
    """Compact JSON (the measure of every payload limit)."""
    return _compact(value)


# What json.dumps(value, separators=(",", ":"), ensure_ascii=False) does, without making an
# encoder per call (json.dumps makes one for any argument but the defaults): every result's
# output goes through here.
_compact = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode


def check_payload(value: Any, field: str, limit: int = DEFAULT_MAX_PAYLOAD_BYTES) -> int:
    """The payload's size in bytes as compact JSON (the measure of every payload limit);
    InvalidArgument naming `field` when over `limit`."""
    return checked_payload_text(value, field, limit)[1]


def checked_payload_text(value: Any, field: str, limit: int = DEFAULT_MAX_PAYLOAD_BYTES) -> tuple[str, int]:
    """`check_payload`, also returning the compact JSON it measured. A string holding a
    lone surrogate is refused here (_utf8), rather than failing to encode for Postgres."""
    text = compact(value)
    size = len(utf8(text, field))
    if size > limit:
        raise InvalidArgument(f"{field}: payload is {size} bytes, over the limit of {limit} bytes")
    return text, size


def utf8(text: str, field: str) -> bytes:
    """`text` in UTF-8; InvalidArgument naming `field` when it holds a lone surrogate
    (possible only from Python callers: protobuf strings are UTF-8)."""
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise InvalidArgument(f"{field}: contains a lone surrogate (U+{ord(text[e.start]):04X}), "
                              "which is not text") from None


def storable_message(text: str, limit: int = MAX_ERROR_MESSAGE_BYTES) -> str:
    """A failure message as Postgres can store it: U+0000 (which text and JSONB refuse)
    becomes U+FFFD, and past `limit` bytes of UTF-8 it is cut and marked (docs/lifecycle.md, "Storable error messages":
    a result is never refused for its text)."""
    text = text.replace("\x00", "\ufffd")
    raw = text.encode("utf-8", "surrogatepass")
    if len(raw) <= limit:
        return text
    return raw[:limit].decode("utf-8", "ignore") + f"... [cut at {limit} of {len(raw)} bytes]"

def request_hash(*fields: Any) -> str:
    return hashlib.sha256(json.dumps(fields, sort_keys=True, default=str).encode()).hexdigest()



__all__ = ["DEFAULT_MAX_PAYLOAD_BYTES", "MAX_ERROR_MESSAGE_BYTES", "MAX_ERROR_DETAILS_BYTES", "ENQUEUE_MANY_MAX",
           "TERMINAL_RUN_STATES", "RUN_STATES", "RUN_ACTIONS", "Job", "PreparedJob", "Result", "canonical_id",
           "parse_id", "compact", "check_payload", "checked_payload_text", "storable_message", "request_hash", "utf8"]
