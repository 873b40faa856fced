"""Acceptance: W3C trace context end to end, exported to a real OTLP/gRPC receiver.

The receiver is the opentelemetry-proto TraceService on a grpc server on port 0 (in a
thread of the test process). A real cyclone-server and a real Python worker run as
separate processes, each configured only through the standard OTEL_* environment; the
test's own client span is exported to the same receiver.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from cyclone_proto import runs_pb2, runs_pb2_grpc
from cyclone_worker import Client, Workflow

HERE = Path(__file__).resolve().parent
DEADLINE = 60.0


class Span:
    """One span as the receiver got it."""

    def __init__(self, service: str, raw: Any) -> None:
        self.service = service
        self.name = raw.name
        self.trace_id = raw.trace_id.hex()
        self.span_id = raw.span_id.hex()
        self.parent_id = raw.parent_span_id.hex()
        self.status = raw.status.code
        self.attributes = {a.key: _any_value(a.value) for a in raw.attributes}

    def __repr__(self) -> str:
        return f"Span({self.service} {self.name!r} {self.span_id}<-{self.parent_id} {self.attributes})"


def _any_value(v: Any) -> Any:
    which = v.WhichOneof("value")
    if which == "array_value":
        return [_any_value(x) for x in v.array_value.values]
    return getattr(v, which) if which else None


class OtlpReceiver(trace_service_pb2_grpc.TraceServiceServicer):
    """An OTLP/gRPC trace endpoint keeping every span it is sent."""

    def __init__(self) -> None:
        self.spans: list[Span] = []
        self.requests = 0
        self._lock = threading.Lock()
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4), options=[("grpc.so_reuseport", 0)])
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(self, self.server)
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.endpoint = f"http://127.0.0.1:{self.port}"

    def Export(self, request: Any, context: Any) -> Any:  # noqa: N802
        with self._lock:
            self.requests += 1
            for rs in request.resource_spans:
                service = next((a.value.string_value for a in rs.resource.attributes if a.key == "service.name"), "")
                for ss in rs.scope_spans:
                    self.spans.extend(Span(service, s) for s in ss.spans)
        return trace_service_pb2.ExportTraceServiceResponse()

    def snapshot(self) -> list[Span]:
        with self._lock:
            return list(self.spans)

    def wait_for(self, done: Callable[[list[Span]], bool], timeout: float = DEADLINE) -> list[Span]:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            spans = self.snapshot()
            if done(spans):
                return spans
            time.sleep(0.05)
        raise AssertionError(f"the receiver did not get the expected spans within {timeout} s: {self.snapshot()}")


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    r = OtlpReceiver()
    r.server.start()
    yield r
    r.server.stop(None)


def otel_env(receiver: OtlpReceiver) -> dict[str, str]:
    """The standard variables that turn export on, with a short batch delay for the test."""
    return {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint, "OTEL_BSP_SCHEDULE_DELAY": "100"}


def clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}


@pytest.fixture
def launch_worker(tmp_path: Path) -> Iterator[Callable[..., subprocess.Popen[bytes]]]:
    procs: list[tuple[subprocess.Popen[bytes], Path]] = []

    def launch(address: str, env: dict[str, str]) -> subprocess.Popen[bytes]:
        log = tmp_path / f"worker-{len(procs) + 1}.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen([sys.executable, str(HERE / "otel_worker_proc.py"), address],
                                    stdout=out, stderr=subprocess.STDOUT, env={**env, "PYTHONUNBUFFERED": "1"})
        procs.append((proc, log))
        return proc

    yield launch
    for proc, log in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        sys.stderr.write(f"--- {log.name} ---\n{log.read_text(errors='replace')}\n")


def stop(proc: subprocess.Popen[bytes]) -> int:
    proc.terminate()
    return proc.wait(30)


WORKFLOW = Workflow("traced").task("fetch").task("flaky", deps=["fetch"], max_attempts=3, backoff_initial=0.05,
                                                   backoff_max=0.05)


def test_one_run_is_one_trace_from_client_through_server_to_worker(
        receiver: OtlpReceiver, start_server: Any, db_url: str, launch_worker: Any,
        monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in otel_env(receiver).items():
        monkeypatch.setenv(key, value)  # the server subprocess inherits the test's environment
    server = start_server(db_url)
    worker = launch_worker(server.address, {**clean_env(), **otel_env(receiver)})
    provider = TracerProvider(resource=Resource.create({"service.name": "test-client"}))
    provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=receiver.endpoint, insecure=True)))
    tracer = provider.get_tracer("test")

    async def submit() -> tuple[str, dict[str, Any], str]:
        async with Client(server.address) as client:
            await client.register(WORKFLOW)
            with tracer.start_as_current_span("client submits") as span:
                run_id = await client.submit("traced", {"n": 1})
            client_span_id = format(span.get_span_context().span_id, "016x")
            return run_id, await client.result(run_id, timeout=DEADLINE), client_span_id

    run_id, result, client_span_id = asyncio.run(submit())
    provider.shutdown()

    def complete(spans: list[Span]) -> bool:
        names = [s.name for s in spans]
        return (names.count("handle flaky") == 2 and names.count("step flaky") == 2
                and "handle fetch" in names and "step fetch" in names)

    spans = receiver.wait_for(complete)
    trace_ids = {s.trace_id for s in spans}
    assert len(trace_ids) == 1, spans  # one trace: client, server and worker
    client = next(s for s in spans if s.name == "client submits")
    submit_span = next(s for s in spans if s.name == "cyclone.v1.Runs/SubmitRun")
    assert (submit_span.service, submit_span.parent_id) == ("cyclone-server", client.span_id)
    assert client.span_id == client_span_id
    assert submit_span.attributes["cyclone.run_ids"] == [run_id]

    steps = [s for s in spans if s.name.startswith("step ")]
    queues = [s for s in spans if s.name.startswith("queue ")]
    handlers = [s for s in spans if s.name.startswith("handle ")]
    assert len(steps) == len(queues) == len(handlers) == 3
    for s in steps + queues:  # the server's step spans hang under the run's (its submit span)
        assert (s.service, s.parent_id, s.attributes["cyclone.run_id"]) == ("cyclone-server", submit_span.span_id,
                                                                            run_id)
    by_lease = {(s.attributes["cyclone.step_id"], s.attributes["cyclone.lease_generation"]): s for s in steps}
    for h in handlers:  # each handler span is a child of its lease's step span, in the worker's service
        step = by_lease[(h.attributes["cyclone.step_id"], h.attributes["cyclone.lease_generation"])]
        assert (h.service, h.parent_id) == ("cyclone-worker", step.span_id)
        assert h.attributes["cyclone.run_id"] == run_id
        assert h.attributes["cyclone.node"] == h.attributes["cyclone.kind"] == h.name.split()[1]
        assert h.attributes["cyclone.attempt"] == step.attributes["cyclone.attempt"]
        assert h.attributes["cyclone.outcome"] == step.attributes["cyclone.outcome"]
    outcomes = sorted((h.attributes["cyclone.node"], h.attributes["cyclone.attempt"], h.attributes["cyclone.outcome"])
                      for h in handlers)
    assert outcomes == [("fetch", 1, "completed"), ("flaky", 1, "failed"), ("flaky", 2, "completed")]
    failed = next(h for h in handlers if h.attributes["cyclone.outcome"] == "failed")
    assert failed.status == 2  # STATUS_CODE_ERROR
    # What the handler saw: the lease's context is its step span's.
    flaky_step = next(s for s in steps if s.attributes["cyclone.node"] == "flaky"
                      and s.attributes["cyclone.attempt"] == 2)
    seen = result["flaky"]["traceparent"]
    assert seen.startswith(f"00-{flaky_step.trace_id}-{flaky_step.span_id}-") and int(seen[-2:], 16) & 1  # sampled
    assert stop(worker) == 0


RELAY = Workflow("relay").task("relay")


async def _enqueue_many_and_read(address: str, metadata: tuple[tuple[str, str], ...]) -> list[str]:
    async with grpc.aio.insecure_channel(address) as channel:
        request = runs_pb2.EnqueueManyRequest(jobs=[runs_pb2.EnqueueRequest(kind="fetch")] * 2)
        reply = await runs_pb2_grpc.RunsStub(channel).EnqueueMany(request, metadata=metadata)
    async with Client(address) as client:
        return [(await client.result(j.run_id, timeout=DEADLINE))["fetch"]["traceparent"] for j in reply.jobs]


async def _submit_and_read(address: str, metadata: tuple[tuple[str, str], ...] = (),
                           workflow: Workflow = WORKFLOW) -> dict[str, Any]:
    async with Client(address) as client:
        await client.register(workflow)
    async with grpc.aio.insecure_channel(address) as channel:
        runs = runs_pb2_grpc.RunsStub(channel)
        request = runs_pb2.SubmitRunRequest(workflow=workflow.name)
        run_id = (await runs.SubmitRun(request, metadata=metadata)).run_id
    async with Client(address) as client:
        return await client.result(run_id, timeout=DEADLINE)


def test_without_the_otel_environment_nothing_is_exported_and_the_context_still_flows(
        receiver: OtlpReceiver, start_server: Any, db_url: str, launch_worker: Any,
        monkeypatch: pytest.MonkeyPatch) -> None:
    for key in [k for k in os.environ if k.startswith("OTEL_")]:
        monkeypatch.delenv(key)
    server = start_server(db_url)
    worker = launch_worker(server.address, clean_env())

    traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    result = asyncio.run(_submit_and_read(server.address, (("traceparent", traceparent),
                                                           ("tracestate", "congo=t61rcWkgMzE"))))
    # The server does not trace: the run keeps the caller's context, and every lease carries it.
    assert result["flaky"] == {"traceparent": traceparent, "tracestate": "congo=t61rcWkgMzE",
                               "otel_imported": True}
    # A handler's client passes its lease's context on: the job it enqueues is in the same trace.
    relayed = asyncio.run(_submit_and_read(server.address, (("traceparent", traceparent),), workflow=RELAY))
    assert relayed["relay"]["traceparent"] == traceparent
    # EnqueueMany: every job of the call keeps the call's context.
    assert asyncio.run(_enqueue_many_and_read(server.address, (("traceparent", traceparent),))) == [traceparent] * 2
    # Both processes stop cleanly (their exit flushes any spans they had): none reach the receiver.
    assert stop(worker) == 0
    assert server.terminate() == 0
    assert receiver.requests == 0 and receiver.snapshot() == []


def test_without_the_otel_extra_server_and_worker_work_the_same(
        receiver: OtlpReceiver, start_server: Any, db_url: str, launch_worker: Any,
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # Each process imports a sitecustomize that makes `opentelemetry` unimportable, as when
    # the extra is not installed; tracing is asked for all the same.
    blocker = tmp_path / "no_otel"
    blocker.mkdir()
    (blocker / "sitecustomize.py").write_text(
        "import sys\n"
        "class _NoOtel:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'opentelemetry' or name.startswith('opentelemetry.'):\n"
        "            raise ModuleNotFoundError(f'No module named {name!r}', name=name)\n"
        "sys.meta_path.insert(0, _NoOtel())\n")
    pythonpath = os.pathsep.join([str(blocker), os.environ.get("PYTHONPATH", "")])
    monkeypatch.setenv("PYTHONPATH", pythonpath)
    for key, value in otel_env(receiver).items():
        monkeypatch.setenv(key, value)
    server = start_server(db_url)
    worker = launch_worker(server.address, {**os.environ})

    traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    result = asyncio.run(_submit_and_read(server.address, (("traceparent", traceparent),)))
    # The context still flows (the server checks W3C by hand); no OpenTelemetry anywhere.
    assert result["flaky"] == {"traceparent": traceparent, "tracestate": "", "otel_imported": False}
    assert stop(worker) == 0
    assert server.terminate() == 0
    assert "OpenTelemetry is not installed" in server.log_text()
    assert receiver.requests == 0


def test_a_malformed_traceparent_is_ignored_and_logged_at_debug(
        start_server: Any, db_url: str, launch_worker: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    for key in [k for k in os.environ if k.startswith("OTEL_")]:
        monkeypatch.delenv(key)
    server = start_server(db_url, extra_args=["--log-level", "DEBUG"])
    launch_worker(server.address, clean_env())

    result = asyncio.run(_submit_and_read(server.address, (("traceparent", "00-not-a-trace-context-01"),
                                                           ("tracestate", "a=b"))))
    # The run has no context (a tracestate without a traceparent means nothing): the lease carries none.
    assert (result["flaky"]["traceparent"], result["flaky"]["tracestate"]) == ("", "")
    log_text = server.log_text()
    assert "ignoring a malformed traceparent: '00-not-a-trace-context-01'" in log_text
    assert "Traceback" not in log_text


def test_a_job_a_handler_enqueues_is_a_child_of_the_handlers_span(
        receiver: OtlpReceiver, start_server: Any, db_url: str, launch_worker: Any,
        monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in otel_env(receiver).items():
        monkeypatch.setenv(key, value)
    server = start_server(db_url)
    launch_worker(server.address, {**clean_env(), **otel_env(receiver)})
    result = asyncio.run(_submit_and_read(server.address, workflow=RELAY))

    def complete(spans: list[Span]) -> bool:
        # Every span asserted on below: the server exports "step fetch" when the result is
        # applied, which may come after the worker exported "handle fetch".
        return {"cyclone.v1.Runs/SubmitRun", "handle relay", "cyclone.v1.Runs/Enqueue", "step fetch",
                "handle fetch"} <= {s.name for s in spans}

    spans = receiver.wait_for(complete)
    assert len({s.trace_id for s in spans}) == 1, spans  # no caller context: the server's submit span is the root
    by_name = {s.name: s for s in spans}
    root = by_name["cyclone.v1.Runs/SubmitRun"]
    assert root.parent_id == ""
    relay, enqueue, fetch = by_name["handle relay"], by_name["cyclone.v1.Runs/Enqueue"], by_name["handle fetch"]
    assert enqueue.parent_id == relay.span_id  # the handler's span was current when it enqueued
    assert fetch.parent_id == by_name["step fetch"].span_id and by_name["step fetch"].parent_id == enqueue.span_id
    assert result["relay"]["traceparent"].startswith(f"00-{root.trace_id}-{by_name['step fetch'].span_id}-")
