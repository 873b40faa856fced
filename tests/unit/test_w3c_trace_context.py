"""Unit: reading W3C trace context from call metadata, when the OTEL_* environment turns export on, and
when a worker loads OpenTelemetry."""

from __future__ import annotations

import logging
import subprocess
import sys

import pytest

from cyclone_server.tracing import incoming_context, parse_traceparent
from cyclone_worker._tracing import tracing_configured

GOOD = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


@pytest.mark.parametrize("value, expected", [
    (GOOD, GOOD),
    (f" {GOOD} ", GOOD),  # optional whitespace around a header value
    ("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00"),
    # A later version may append fields: its first four are read, and passed on as version 00.
    ("cc-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-what-the-future-holds", GOOD),
    ("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-extra", None),  # version 00 has exactly 4
    ("ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", None),  # version ff is invalid
    ("00-00000000000000000000000000000000-b7ad6b7169203331-01", None),  # all-zero trace id
    ("00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01", None),  # all-zero span id
    ("00-0AF7651916CD43DD8448EB211C80319C-B7AD6B7169203331-01", None),  # upper case
    ("00-0af7651916cd43dd8448eb211c80319-b7ad6b7169203331-01", None),  # short trace id
    ("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331", None),  # no flags
    ("", None),
    ("garbage", None),
])
def test_parse_traceparent(value: str, expected: str | None) -> None:
    assert parse_traceparent(value) == expected


def test_incoming_context_reads_traceparent_and_joins_tracestate_headers() -> None:
    md = (("authorization", "Bearer x"), ("traceparent", GOOD), ("tracestate", "a=1"), ("tracestate", " b=2"))
    assert incoming_context(md) == {"traceparent": GOOD, "tracestate": "a=1,b=2"}
    assert incoming_context((("traceparent", GOOD.encode()),)) == {"traceparent": GOOD}
    assert incoming_context(()) is None and incoming_context(None) is None


def test_a_malformed_context_is_ignored_and_logged_at_debug(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG, logger="cyclone.tracing"):
        assert incoming_context((("traceparent", "00-nope-01"), ("tracestate", "a=1"))) is None
        assert incoming_context((("traceparent", GOOD), ("traceparent", GOOD))) is None  # two: ambiguous
        # A tracestate over 512 characters is dropped; the traceparent is kept.
        assert incoming_context((("traceparent", GOOD), ("tracestate", "k=" + "v" * 600))) == {"traceparent": GOOD}
    messages = [r.getMessage() for r in caplog.records]
    assert [r.levelno for r in caplog.records] == [logging.DEBUG] * 3
    assert messages[0] == "ignoring a malformed traceparent: '00-nope-01'"
    assert "tracestate over 512" in messages[2]


@pytest.mark.parametrize("env, on", [
    ({}, False),
    ({"OTEL_SERVICE_NAME": "x"}, False),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4317"}, True),
    ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4317"}, True),
    ({"OTEL_TRACES_EXPORTER": "console"}, True),
    ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4317"}, False),
    ({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_SDK_DISABLED": "true"}, False),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4317", "OTEL_SDK_DISABLED": "TRUE"}, False),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4317", "OTEL_SDK_DISABLED": "false"}, True),
])
def test_export_is_on_only_when_the_standard_environment_asks(env: dict[str, str], on: bool) -> None:
    assert tracing_configured(env) is on


def test_a_worker_loads_opentelemetry_before_its_first_lease() -> None:
    """Importing the OpenTelemetry API takes 8 to 20 ms: the worker does it when it opens its
    lease table, not when its first lease's handler is about to start (a rate's first starts
    would reach their handlers that much later than the rest). In a fresh interpreter."""
    pytest.importorskip("opentelemetry.trace")
    code = """
import asyncio, sys
from collections import Counter
from cyclone_worker._leases import LeaseTable
table = LeaseTable({}, "w", Counter())
assert "opentelemetry.trace" not in sys.modules
table.open(asyncio.new_event_loop(), None, None)
assert "opentelemetry.trace" in sys.modules
"""
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
