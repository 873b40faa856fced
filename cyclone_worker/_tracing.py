"""OpenTelemetry for the SDK: a span per handler execution, and the trace context a submit carries.

Optional: everything here works through the OpenTelemetry API only when it is installed
(`pip install cyclone[otel]`); without it every function is a cheap no-op and nothing
imports `opentelemetry`. Exporting is off unless configured the standard way
(`OTEL_TRACES_EXPORTER`, `OTEL_EXPORTER_OTLP_ENDPOINT`, ...; see docs/tracing.md), and an
application that set up its own tracer provider keeps it. The wire format is W3C Trace
Context whatever propagator the application configured: that is what the server stores.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._leases import Held

__all__ = ["install_provider", "installed", "tracing_configured", "trace_metadata", "spans_wanted", "traced", "flush"]

log = logging.getLogger("cyclone_worker")

_TRACER = "cyclone_worker"
_api: Any = None  # the loaded OpenTelemetry API (a namespace), False when it is not installed
_installed: Any = None  # the tracer provider install_provider set up, if any
_provider_failed = False  # OpenTelemetry could not load the configured tracer provider (spans_wanted)


def _otel() -> Any:
    """The OpenTelemetry API, imported on first use; None when the `otel` extra is missing."""
    global _api
    if _api is None:
        try:
            from opentelemetry import context, trace
            from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
        except ImportError:
            _api = False
        else:
            class _Api:
                pass
            _api = _Api()
            _api.trace, _api.context, _api.w3c = trace, context, TraceContextTextMapPropagator()
    return _api or None


def preload() -> None:
    """Import the OpenTelemetry API now, when it is installed: the worker calls this before its
    first lease, whose handler would otherwise start only after the import (8 ms on an idle
    machine, 20 under load)."""
    _otel()


def tracing_configured(env: Mapping[str, str] = os.environ) -> bool:
    """True when the environment asks for traces to be exported: OTEL_SDK_DISABLED is not
    "true", and OTEL_TRACES_EXPORTER names an exporter other than "none" or, when it is
    unset, an OTLP endpoint is given (OTEL_EXPORTER_OTLP_ENDPOINT or ..._TRACES_ENDPOINT)."""
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporters = env.get("OTEL_TRACES_EXPORTER")
    if exporters is not None:
        return any(e.strip().lower() not in ("", "none") for e in exporters.split(","))
    return bool(env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))


def install_provider(default_service_name: str, env: Mapping[str, str] = os.environ) -> Any:
    """Set the global tracer provider from the standard environment, once per process;
    returns the provider in use when tracing is configured, else None.

    A provider the application set already is kept (and returned). Exporters, from
    OTEL_TRACES_EXPORTER (default "otlp"): "otlp" (gRPC, or HTTP when
    OTEL_EXPORTER_OTLP_[TRACES_]PROTOCOL is http/protobuf and its exporter is installed),
    "console", "none". The service name is OTEL_SERVICE_NAME, else `default_service_name`.
    Sampler, batch and exporter settings come from their own OTEL_* variables.
    """
    if not tracing_configured(env):
        return None
    api = _otel()
    if api is None:
        log.warning("cyclone: OTEL_* tracing variables are set but OpenTelemetry is not installed "
                    "(pip install 'cyclone[otel]'); not tracing")
        return None
    current = api.trace.get_tracer_provider()
    if not isinstance(current, api.trace.ProxyTracerProvider):
        return current  # the application's, or ours from an earlier call
    try:
        from opentelemetry.sdk.resources import SERVICE_NAME, Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError:
        log.warning("cyclone: the OpenTelemetry SDK is not installed (pip install 'cyclone[otel]'); not tracing")
        return None
    resource = Resource.create()
    if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: default_service_name}))
    provider = TracerProvider(resource=resource)
    names = [e.strip().lower() for e in env.get("OTEL_TRACES_EXPORTER", "otlp").split(",") if e.strip()]
    for name in names:
        exporter = _exporter(name, env)
        if exporter is not None:
            provider.add_span_processor(BatchSpanProcessor(exporter))
    api.trace.set_tracer_provider(provider)
    global _installed
    _installed = provider
    return api.trace.get_tracer_provider()


def installed() -> bool:
    """True when install_provider set up this process's tracer provider (which `flush` flushes)."""
    return _installed is not None


def _exporter(name: str, env: Mapping[str, str]) -> Any:
    if name == "none":
        return None
    if name == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter
        return ConsoleSpanExporter()
    if name != "otlp":
        log.warning("cyclone: OTEL_TRACES_EXPORTER %r is not one of otlp, console, none; ignored", name)
        return None
    protocol = env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or env.get("OTEL_EXPORTER_OTLP_PROTOCOL") or "grpc"
    try:
        if protocol.startswith("http"):
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        else:
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter  # type: ignore[assignment]
    except ImportError:
        log.warning("cyclone: no OTLP exporter for protocol %r is installed; not exporting traces", protocol)
        return None
    return OTLPSpanExporter()


def flush(timeout_millis: int = 5000) -> None:
    """Export the spans still buffered (at a graceful stop) by the provider install_provider
    set up; an application's own provider is the application's to flush."""
    if _installed is not None:
        _installed.force_flush(timeout_millis)


def trace_metadata() -> tuple[tuple[str, str], ...]:
    """gRPC metadata carrying the current span's context (`traceparent`, `tracestate`), so
    that a submitted run joins the caller's trace; empty with no current span."""
    api = _otel()
    if api is None:
        return ()
    carrier: dict[str, str] = {}
    api.w3c.inject(carrier)
    return tuple(carrier.items())


def spans_wanted() -> bool | None:
    """Whether a lease's handler runs in a span of its own: None when OpenTelemetry is not
    installed (never), True when a tracer provider is set (always), False when it is not
    (only for a lease that carries a trace context, to pass it on). Asked once per Leases
    message, not per lease: with no provider set, OpenTelemetry looks the environment up on
    every call. A provider set meanwhile counts from the next message."""
    global _provider_failed
    api = _otel()
    if api is None or _provider_failed:
        return None
    try:
        provider = api.trace.get_tracer_provider()
    except Exception as e:  # noqa: BLE001 - e.g. OTEL_PYTHON_TRACER_PROVIDER names no entry point
        # Said once; the handlers run without spans rather than the stream failing.
        _provider_failed = True
        log.warning("cyclone: the OpenTelemetry tracer provider cannot be loaded (%s); handlers run without spans", e)
        return None
    return not isinstance(provider, api.trace.ProxyTracerProvider)


async def traced(h: Held, execute: Callable[[Held], Awaitable[None]]) -> None:
    """Run `execute(h)` (a lease's handler) inside a span that is a child of the lease's
    trace context, current while the handler runs (also in a thread handler), so that the
    handler's own spans and the runs it submits join the trace. Attributes: run and step
    id, node, kind, attempt, lease generation, and the outcome (completed, failed,
    discarded for a permanent failure, snoozed, stopped)."""
    api = _otel()
    lease = h.lease
    if api is None or (isinstance(api.trace.get_tracer_provider(), api.trace.ProxyTracerProvider)
                       and not lease.trace_context.traceparent):
        # No OpenTelemetry, or no tracer provider set and no context to pass on: the span
        # would be a no-op one, and nothing would carry it.
        await execute(h)
        return
    parent = None
    if lease.HasField("trace_context") and lease.trace_context.traceparent:
        parent = api.w3c.extract({"traceparent": lease.trace_context.traceparent,
                                  "tracestate": lease.trace_context.tracestate})
    tracer = api.trace.get_tracer(_TRACER)
    attributes = {"cyclone.run_id": lease.run_id, "cyclone.step_id": lease.step_id, "cyclone.node": lease.node,
                  "cyclone.kind": lease.kind, "cyclone.attempt": lease.attempt,
                  "cyclone.lease_generation": lease.lease_generation}
    with tracer.start_as_current_span(f"handle {lease.kind}", context=parent, kind=api.trace.SpanKind.CONSUMER,
                                      attributes=attributes, record_exception=False,
                                      set_status_on_exception=False) as span:
        try:
            await execute(h)
        finally:
            outcome, error = _outcome(h)
            span.set_attribute("cyclone.outcome", outcome)
            if error:
                span.set_status(api.trace.Status(api.trace.StatusCode.ERROR, error))


def _outcome(h: Held) -> tuple[str, str]:
    """(the handler's outcome, the error message of a failure or "")."""
    r = h.result
    if r is None:
        return ("stopped" if h.stopped else "abandoned"), ""
    which = r.WhichOneof("outcome")
    if which == "failed":
        return ("discarded" if r.failed.permanent else "failed"), r.failed.message
    return which or "none", ""
