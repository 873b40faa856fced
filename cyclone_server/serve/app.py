"""Builds one server process: engine, notifier, worker hub, background work and the gRPC server."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import ssl
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection, reflection_pb2_grpc

from cyclone_proto import (admin_pb2, admin_pb2_grpc, runs_pb2, runs_pb2_grpc, workers_pb2,
                                   workflows_pb2, workflows_pb2_grpc)
from cyclone_proto import limits_pb2, limits_pb2_grpc, schedules_pb2, schedules_pb2_grpc

from cyclone_server import auth
from .background import Background
from cyclone_server.store.engine import Engine
from cyclone_server.stream.hub import WorkerHub
from .settings import Settings
from .metrics import Metrics, MetricsServer, scrape, serve_metrics
from cyclone_server.store.migrate import migrate
from cyclone_server.store.notify import Notifier
from cyclone_server.api.handlers import CallGate, Registrar
from cyclone_server.listen import bare_host, busy_message, port_in_use, split_host_port
from cyclone_server.api.admin import AdminServicer
from cyclone_server.api.workflows import WorkflowsServicer
from cyclone_server.api.runs import RunsServicer
from cyclone_server import tracing
from .scheduler import Scheduler
from cyclone_server.api.schedules import SchedulesServicer
from cyclone_server.api.limits import LimitsServicer
from cyclone_worker._loop import loop_name

if TYPE_CHECKING:
    from cyclone_server.console import HttpServer

log = logging.getLogger("cyclone.server")
# After the database was lost, the first sweep waits one lease renewal interval and this
# much more once it is back (Background.renew_wait).
RENEW_MARGIN = 1.0
# A stopping server waits until no call has come for this long before grpc's own stop
# (CallGate.quiet): calls it accepted but had not started yet would be CANCELLED.
STOP_QUIET = 0.05

SERVICE_NAMES = tuple(
    module.DESCRIPTOR.services_by_name[name].full_name
    for module, name in ((workflows_pb2, "Workflows"), (runs_pb2, "Runs"), (workers_pb2, "Workers"),
                         (admin_pb2, "Admin"), (schedules_pb2, "Schedules"), (limits_pb2, "Limits"))
)

# A dead peer (a worker whose host vanished) must be noticed within seconds, not at the
# kernel's TCP timeout: ping every 10 s, give up after 5 s without an answer. Workers may
# ping as often as every 5 s, also with no call in flight.
KEEPALIVE_OPTIONS = [
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.min_ping_interval_without_data_ms", 5_000),
    ("grpc.http2.max_pings_without_data", 0),
]

# Each call may have 4 MiB of its request in flight (its HTTP/2 window), and the window does
# not grow. gRPC's BDP probe would grow it with the link's speed, and a window is what a
# call refused on its metadata costs the server (auth._refusing): grown windows let eight
# unauthenticated 256 MiB calls raise the server's memory by 183 MiB on a loaded machine.
# 4 MiB a round trip carries a message of the default payload limit (1 MiB) in one.
WINDOW_OPTIONS = [
    ("grpc.http2.bdp_probe", 0),
    ("grpc.http2.lookahead_bytes", 4 << 20),
]


class CycloneServer:
    """One running control plane; `start()` then `stop()`, or `serve_forever()`."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.address = ""
        self.engine: Engine | None = None
        self.notifier: Notifier | None = None
        self.hub: WorkerHub | None = None
        self.background: Background | None = None
        self.scheduler: Scheduler | None = None
        self.server: grpc.aio.Server | None = None
        self.health = health.aio.HealthServicer()
        self.runs: RunsServicer | None = None
        self.gate = CallGate()  # unary calls of Cyclone's services, answered at a graceful stop
        self.metrics = Metrics()
        self.metrics_server: MetricsServer | None = None
        self.http_server: HttpServer | None = None  # the console's HTTP port (--http-listen)
        self._started: list[str] = []

    async def start(self) -> str:
        """Migrate, connect, listen; returns the bound address 'HOST:PORT'."""
        s = self.settings
        host, _ = split_host_port(s.listen, what="--listen")
        tracing.configure()  # spans only when the OTEL_* environment asks for them
        if s.migrate:
            applied = await asyncio.to_thread(migrate, s.database_url)
            log.info("migrations: %s", ", ".join(applied) if applied else "up to date")
        self.engine = await Engine.open(s.database_url, max_size=20, max_payload_bytes=s.max_payload_bytes,
                                        announces=True)
        self.notifier = Notifier(s.database_url)
        await self.notifier.start()
        self._started.append("notifier")
        self.server = self._grpc_server()
        try:
            if s.credentials is not None:
                port = self.server.add_secure_port(s.listen, s.credentials)
            else:
                port = self.server.add_insecure_port(s.listen)
        except RuntimeError:  # grpcio raises when the bind fails
            port = 0
        if port == 0:
            in_use = port_in_use(*split_host_port(s.listen)) and not s.reuse_port
            raise OSError(busy_message(s.listen) if in_use else f"cannot bind address {s.listen}")
        self.address = f"{host}:{port}"
        await self.server.start()
        self._started.append("server")
        assert self.hub is not None and self.background is not None
        await self.hub.start()
        self._started.append("hub")
        await self.background.start()
        self._started.append("background")
        assert self.scheduler is not None
        await self.scheduler.start()
        self._started.append("scheduler")
        if s.metrics_listen:
            mhost, mport = split_host_port(s.metrics_listen, default_host="0.0.0.0", what="--metrics-listen")
            mhost = bare_host(mhost)
            self.metrics_server = await serve_metrics(self.metrics, self.engine, mhost, mport)
        if s.http_listen:
            await self._serve_http(s.http_listen)
        for name in ("", *SERVICE_NAMES):
            await self.health.set(name, health_pb2.HealthCheckResponse.SERVING)
        log.info("cyclone-server listening on %s (event loop %s)", self.address, loop_name())
        if s.ready_file:
            write_ready_file(s.ready_file, self.address,
                             self.metrics_server.address if self.metrics_server is not None else None,
                             **({"http_address": self.http_server.address} if self.http_server is not None else {}))
        return self.address

    def _grpc_server(self) -> grpc.aio.Server:
        s = self.settings
        assert self.engine is not None and self.notifier is not None
        server = grpc.aio.server(interceptors=s.interceptors, options=[
            ("grpc.so_reuseport", 1 if s.reuse_port else 0),
            # No size limit on messages (only protobuf's 2 GiB): every size that matters is
            # checked on the decoded field, where the answer can name it (an input over the
            # payload limit is INVALID_ARGUMENT; on the worker stream an output over it
            # discards its step, a long failure message is cut). A message gRPC refused
            # unread would end a worker's stream, and the worker would resend it forever.
            ("grpc.max_receive_message_length", -1),
            *KEEPALIVE_OPTIONS,
            *WINDOW_OPTIONS,
        ])
        self.hub = WorkerHub(self.engine, self.notifier, server_id=s.server_id, lease_ttl=s.lease_ttl)
        self.engine.prompt_listeners.append(self.hub.dispatcher.unpace)
        self.engine.available_listeners.append(self.hub.dispatcher.new_work)
        self.runs = RunsServicer(self.engine, self.notifier, claim=self.hub.dispatcher.enqueue)
        # Every service registers through a Registrar: a request that does not parse is
        # INVALID_ARGUMENT. Cyclone's unary calls pass the gate; health and reflection keep
        # answering while the server drains (health says NOT_SERVING then).
        cyclone, plain = Registrar(server, self.gate), Registrar(server)
        workflows_pb2_grpc.add_WorkflowsServicer_to_server(WorkflowsServicer(self.engine), cyclone)
        runs_pb2_grpc.add_RunsServicer_to_server(self.runs, cyclone)
        admin_pb2_grpc.add_AdminServicer_to_server(AdminServicer(self.engine), cyclone)
        tokens = next((i for i in s.interceptors if isinstance(i, auth.TokenAuthInterceptor)), None)
        schedules_pb2_grpc.add_SchedulesServicer_to_server(SchedulesServicer(self.engine, tokens=tokens), cyclone)
        limits_pb2_grpc.add_LimitsServicer_to_server(LimitsServicer(self.engine), cyclone)
        self.scheduler = Scheduler(self.engine, self.notifier)
        self.background = Background(self.engine, self.notifier, sweep_interval=s.sweep_interval,
                                     retention_interval=s.retention_interval,
                                     retention_default_age=s.retention_default_age,
                                     renew_wait=self.hub.heartbeat + RENEW_MARGIN, on_database=self._database)
        self.hub.add_to_server(cyclone)  # type: ignore[arg-type]  # its stream is not gated: it has its own stop
        self._export_metrics()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, plain)
        # What reflection.enable_server_reflection does for an asyncio server, through the Registrar.
        reflection_pb2_grpc.add_ServerReflectionServicer_to_server(reflection.aio.ReflectionServicer(
            (*SERVICE_NAMES, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME)),
            plain)
        return server

    async def _serve_http(self, listen: str) -> None:
        """The console, /metrics and /healthz on `listen`, on this event loop, reading through this engine."""
        # Imported here: aiohttp and Jinja2 take a fifth of a second to import, which every
        # server start and CLI call would pay without a console.
        from cyclone_server.console import Console, serve_console

        host, port = split_host_port(listen, what="--http-listen")
        assert self.engine is not None
        tokens = next((i for i in self.settings.interceptors if isinstance(i, auth.TokenAuthInterceptor)), None)
        console = Console(self.engine, tokens=tokens, metrics=self.scrape_metrics, server_id=self.settings.server_id,
                          ready=lambda: self.http_server is not None and "server" in self._started
                          and not self.gate.closing)
        tls = None
        if self.settings.http_tls is not None:
            tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            tls.load_cert_chain(*self.settings.http_tls)
        self.http_server = await serve_console(console, host, port, reuse_port=self.settings.reuse_port,
                                               ssl_context=tls)

    async def scrape_metrics(self) -> tuple[bytes, str]:
        """GET /metrics of the HTTP port: the Prometheus text exposition, and its content type."""
        return await scrape(self.metrics, self.engine)

    def _export_metrics(self) -> None:
        """Counters live where the work happens (hub, background); the metrics mirror them per scrape."""
        m, hub, bg = self.metrics, self.hub, self.background
        assert hub is not None and bg is not None
        hub.dispatcher.latency_observers.append(m.dispatch_latency_seconds.observe)
        hub.dispatcher.claim_observers.append(_per_kind(m.queue_wait_seconds))
        hub.execution_observers.append(_per_kind(m.step_duration_seconds))

        def refresh() -> None:
            for kind, n in hub.stats["claims"].items():
                m.mirror(m.claims_total, n, kind=kind)
            for kind, n in hub.stats["completions"].items():
                m.mirror(m.completions_total, n, kind=kind)
            for (kind, error_kind), n in hub.stats["failures"].items():
                m.mirror(m.failures_total, n, kind=kind, error_kind=error_kind)
            for status, n in hub.stats["fenced_results"].items():
                m.mirror(m.fenced_results_total, n, status=status)
            m.mirror(m.stream_reconnects_total, hub.stats["reconnects"])
            m.mirror(m.reclaims_total, bg.counts.get("leases_sweep", 0), how="expired")
            m.mirror(m.reclaims_total, hub.stats["releases"], how="worker_lost")
            m.connected_workers.set(hub.connected_workers)

        m.add_source(refresh)

        def refresh_schedules() -> None:
            assert self.scheduler is not None
            for (outcome, name), n in self.scheduler.counts.items():
                family = {"started": m.schedule_fires_total, "missed": m.schedule_misses_total,
                          "skipped": m.schedule_skips_total}.get(outcome)
                if family is not None:
                    m.mirror(family, n, schedule=name)

        m.add_source(refresh_schedules)

    async def _database(self, reachable: bool) -> None:
        """The health of Cyclone's services follows the database: NOT_SERVING while no primary
        is reachable (load balancers and readiness probes send callers elsewhere), SERVING
        again once it is back. The server's overall health ("") stays SERVING: the process is
        alive and its workers stay connected, so a liveness probe must not restart it."""
        if self.gate.closing:
            return  # stopping: health says NOT_SERVING for good
        status = health_pb2.HealthCheckResponse.SERVING if reachable else health_pb2.HealthCheckResponse.NOT_SERVING
        if not reachable:
            log.warning("the database is unreachable: health NOT_SERVING, calls UNAVAILABLE until it is back")
        for name in SERVICE_NAMES:
            await self.health.set(name, status)

    async def stop(self) -> None:
        """Graceful stop: no new work, running handlers and calls get `grace` seconds, then close.

        In order: health turns NOT_SERVING (load balancers drain the server); new unary calls
        are UNAVAILABLE and WaitRun calls answer at once with the run as it stands; calls in
        flight and worker results get up to `grace` seconds, calls still running then are
        answered UNAVAILABLE (not left to server.stop, whose cut may reach the client as
        CANCELLED, which no client retries); worker streams end UNAVAILABLE; grpc's own stop
        waits until calls have stopped coming (CallGate.quiet). Stops only what start() got
        to, so a failed start cleans up too.
        """
        await self.health.enter_graceful_shutdown()
        if self.runs is not None:
            self.runs.close()
        draining = [self.gate.close(self.settings.grace)]
        if "hub" in self._started and self.hub is not None:
            draining.append(self.hub.stop(self.settings.grace))
        await asyncio.gather(*draining)
        if self.metrics_server is not None:
            await self.metrics_server.close()
            self.metrics_server = None
        if "scheduler" in self._started and self.scheduler is not None:
            await self.scheduler.stop()
        if self.http_server is not None:
            await self.http_server.close()
            self.http_server = None
        if "background" in self._started and self.background is not None:
            await self.background.stop()
        if "server" in self._started and self.server is not None:
            await self.gate.quiet(STOP_QUIET, within=max(1.0, self.settings.grace))
            await self.server.stop(grace=1.0)
        if self.runs is not None:
            await self.runs.enqueuer.close()  # batches whose callers gave up still finish
            await self.runs.run_ends.close()
        if "notifier" in self._started and self.notifier is not None:
            await self.notifier.stop()
        if self.engine is not None:
            await self.engine.close()
        if tracing.enabled():
            await asyncio.to_thread(tracing.flush)
        self._started.clear()
        log.info("cyclone-server stopped")

    async def serve_forever(self) -> None:
        """start(), then stop() on SIGTERM or SIGINT."""
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        try:
            await self.start()
            await stop.wait()
            # A second Ctrl-C during the graceful stop interrupts it.
            loop.remove_signal_handler(signal.SIGINT)
            log.info("signal received, stopping (grace %s s)", self.settings.grace)
        finally:
            await self.stop()


def write_ready_file(path: str, address: str, metrics_address: str | None = None, **extra: object) -> None:
    """{"address", "pid"} (and "metrics_address", the bound HOST:PORT of --metrics-listen, e.g. with port 0,
    and any `extra` fields) written atomically, so a reader never sees half a file."""
    target = Path(path)
    tmp = target.with_name(target.name + ".tmp")
    ready: dict[str, object] = {"address": address, "pid": os.getpid(), **extra}
    if metrics_address is not None:
        ready["metrics_address"] = metrics_address
    tmp.write_text(json.dumps(ready))
    os.replace(tmp, target)


def _per_kind(histogram: Any) -> Callable[[str, float], None]:
    """observe(kind, seconds) on `histogram`'s child for the kind, looked up once per kind
    (labels() takes a lock and checks the values on every call; this runs per step)."""
    children: dict[str, Any] = {}

    def observe(kind: str, seconds: float) -> None:
        child = children.get(kind)
        if child is None:
            child = children[kind] = histogram.labels(kind=kind)
        child.observe(seconds)
    return observe
