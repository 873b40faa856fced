"""Trace context for runs: read from submit calls, kept with the run, passed on in leases; spans.

The W3C `traceparent` / `tracestate` of a SubmitRun, Enqueue or EnqueueMany call (gRPC
metadata) is checked here by hand, so that the server stores and forwards a submitter's
context whether or not OpenTelemetry is installed; a malformed one is ignored (logged at
debug), never an error.

With the `otel` extra installed and the OTEL_* variables set (docs/tracing.md), the
server also records spans: one per submit call (a child of the caller's span), and per
step execution a `queue {kind}` span (from when the step became claimable to its claim,
`waited` from the claim) and a `step {kind}` span (from the claim to the result being
applied, or the lease being stopped or left), both children of the run's context. The
run then keeps the submit span's context, and a lease carries its step span's context,
so a worker's handler span is a child of the server's step span. Without it the run keeps
the caller's context and leases carry that.
"""

from __future__ import annotations

import contextlib
import logging
import re
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from cyclone_proto import workers_pb2 as pb

log = logging.getLogger("cyclone.tracing")

# version-traceid-parentid-flags; a version above 00 may append fields (W3C, section 3.2).
_TRACEPARENT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?", re.S)
# W3C asks to pass on at least 512 characters of tracestate; a longer one is dropped whole.
MAX_TRACESTATE = 512
_TRACESTATE = re.compile(r"[\x20-\x7e]*")
# A submit span lists the run ids of at most this many runs (EnqueueMany makes up to 1000).
MAX_NAMED_RUNS = 100

_tracer: Any = None  # an OpenTelemetry Tracer once `configure` found tracing configured
_api: Any = None  # (trace module, W3C propagator) with a tracer


def configure() -> bool:
    """Set up span export from the standard OTEL_* environment (once per process); True
    when the server records spans."""
    global _tracer, _api
    if _tracer is not None:
        return True
    # One set-up for the server and the Python worker: the SDK's (same distribution).
    from cyclone_worker._tracing import install_provider

    provider = install_provider("cyclone-server")
    if provider is None:
        return False
    from opentelemetry import trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    _api = (trace, TraceContextTextMapPropagator())
    _tracer = provider.get_tracer("cyclone_server")
    log.info("tracing: exporting spans (OTEL_* environment)")
    return True


def enabled() -> bool:
    """True when this process records spans (`configure` found tracing configured)."""
    return _tracer is not None


def flush() -> None:
    """Export what is buffered (graceful stop)."""
    if _tracer is not None:
        from cyclone_worker._tracing import flush as sdk_flush
        sdk_flush()  # a no-op unless the server set up the provider (it always does when tracing)


# -- W3C trace context ---------------------------------------------------------------------


def parse_traceparent(value: str) -> str | None:
    """A well-formed traceparent as version 00 ("00-trace-span-flags"), else None."""
    m = _TRACEPARENT.fullmatch(value.strip())
    if m is None:
        return None
    version, trace_id, span_id, flags, rest = m.groups()
    if version == "ff" or (version == "00" and rest) or set(trace_id) == {"0"} or set(span_id) == {"0"}:
        return None
    return f"00-{trace_id}-{span_id}-{flags}"


def incoming_context(metadata: Iterable[Any] | None) -> dict[str, str] | None:
    """The caller's trace context from call metadata ({"traceparent", "tracestate"?}), or
    None when it sent none or a malformed one (ignored, logged at debug)."""
    parents: list[str] = []
    states: list[str] = []
    for item in metadata or ():
        key, value = item[0], item[1]
        if key == "traceparent":
            parents.append(value if isinstance(value, str) else value.decode("latin-1"))
        elif key == "tracestate":
            states.append(value if isinstance(value, str) else value.decode("latin-1"))
    if not parents:
        return None
    traceparent = parse_traceparent(parents[0]) if len(parents) == 1 else None
    if traceparent is None:
        log.debug("ignoring a malformed traceparent: %r", parents if len(parents) > 1 else parents[0])
        return None
    out = {"traceparent": traceparent}
    tracestate = ",".join(s.strip() for s in states if s.strip())
    if tracestate:
        if len(tracestate) <= MAX_TRACESTATE and _TRACESTATE.fullmatch(tracestate):
            out["tracestate"] = tracestate
        else:
            log.debug("ignoring a tracestate over %d characters or not printable ASCII", MAX_TRACESTATE)
    return out


def lease_context(carrier: Mapping[str, str]) -> pb.TraceContext:
    """Lease.trace_context for a stored context."""
    return pb.TraceContext(traceparent=carrier.get("traceparent", ""), tracestate=carrier.get("tracestate", ""))


# -- spans ---------------------------------------------------------------------------------


class SubmitSpan:
    """The span of one submit call; `context` is what the runs it creates keep."""

    def __init__(self, span: Any, context: dict[str, str] | None) -> None:
        self.span = span
        self.context = context

    # Without tracing, submit_span returns the SubmitSpan itself as its context manager.
    def __enter__(self) -> SubmitSpan:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def created(self, run_ids: Sequence[str], created: Sequence[bool]) -> None:
        """Name the runs the call made or found (idempotency) on the span: their count, and
        their ids and whether each was new, up to MAX_NAMED_RUNS."""
        if self.span is not None:
            self.span.set_attribute("cyclone.runs", len(run_ids))
            if len(run_ids) <= MAX_NAMED_RUNS:
                self.span.set_attribute("cyclone.run_ids", list(run_ids))
                self.span.set_attribute("cyclone.created", list(created))


def submit_span(method: str, metadata: Iterable[Any] | None,
                **attributes: Any) -> contextlib.AbstractContextManager[SubmitSpan]:
    """Around a submit call (method: SubmitRun, Enqueue, EnqueueMany): the context to store
    with its runs, and the server's span when tracing (a child of the caller's span)."""
    incoming = incoming_context(metadata)
    if _tracer is None:  # no span to open: nothing to do on the way out either
        return SubmitSpan(None, incoming)
    return _traced_submit(method, incoming, attributes)


@contextlib.contextmanager
def _traced_submit(method: str, incoming: dict[str, str] | None, attributes: Mapping[str, Any]) -> Iterator[SubmitSpan]:
    trace, w3c = _api
    parent = w3c.extract(incoming) if incoming else None
    attrs = {"rpc.system": "grpc", "rpc.service": "cyclone.v1.Runs", "rpc.method": method,
             **{f"cyclone.{k}": v for k, v in attributes.items() if v is not None}}
    with _tracer.start_as_current_span(f"cyclone.v1.Runs/{method}", context=parent, kind=trace.SpanKind.SERVER,
                                       attributes=attrs) as span:
        carrier: dict[str, str] = {}
        w3c.inject(carrier, context=trace.set_span_in_context(span))
        yield SubmitSpan(span, carrier or incoming)


class StepSpan:
    """The open `step {kind}` span of one lease, ended with its outcome."""

    def __init__(self, span: Any) -> None:
        self.span = span

    def end(self, outcome: str, error: str = "") -> None:
        if self.span is None:
            return
        span, self.span = self.span, None
        span.set_attribute("cyclone.outcome", outcome)
        if error:
            trace, _ = _api
            span.set_status(trace.Status(trace.StatusCode.ERROR, error))
        span.end()


def step_claimed(row: dict[str, Any]) -> StepSpan | None:
    """A claimed step (a row of cyclone_steps_claim) of a run with a trace context: records
    its queue wait span and opens its step span, whose context then replaces the run's in
    `row["trace_context"]` (what the lease carries). None when the server does not trace
    or the run has no context."""
    carrier = row.get("trace_context")
    if _tracer is None or not carrier:
        return None
    trace, w3c = _api
    parent = w3c.extract(carrier)
    now = time.time_ns()
    attrs = {"cyclone.run_id": str(row["run_id"]), "cyclone.step_id": str(row["step_id"]),
             "cyclone.node": row["node"], "cyclone.kind": row["kind"], "cyclone.attempt": row["attempt"]}
    waited = _tracer.start_span(f"queue {row['kind']}", context=parent, attributes=attrs,
                                start_time=now - int(max(row.get("waited") or 0.0, 0.0) * 1e9))
    waited.end(end_time=now)
    span = _tracer.start_span(f"step {row['kind']}", context=parent, start_time=now,
                              attributes={**attrs, "cyclone.lease_generation": row["lease_generation"]})
    lease_carrier: dict[str, str] = {}
    w3c.inject(lease_carrier, context=trace.set_span_in_context(span))
    row["trace_context"] = lease_carrier or carrier
    return StepSpan(span)


# The SQL status of an applied result, as the step span's outcome; failures mark it an error.
_FAILED = {"retried": "failed", "discarded": "discarded", "output_too_large": "output_too_large",
           "invalid": "invalid"}


def result_applied(step: StepSpan | None, outcome: str, status: str, message: str = "") -> None:
    """End a step span at its result: `outcome` is the worker's (completed, failed,
    snoozed), `status` what the server did with it (applied, retried, stale, ...)."""
    if step is None:
        return
    if status in _FAILED:
        step.end(_FAILED[status], message or status)
    elif status in ("applied", "snoozed"):
        step.end(outcome)
    else:
        step.end(f"refused_{status}")  # stale, ended, unknown: the lease was over already


def leases_ended(steps: Iterable[StepSpan | None], reason: str) -> None:
    """End the step spans of leases that ended without a result (Stop reason, or
    "disconnected" when the worker's stream ended)."""
    for step in steps:
        if step is not None:
            step.end(reason, "" if reason == "cancelled" else reason)
