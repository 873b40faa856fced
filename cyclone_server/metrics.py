"""Prometheus metrics of one server: counters kept in memory, the backlog read from Postgres at scrape time.

The text exposition format (version 0.0.4) is small enough to write by hand, so the server
needs no metrics library and no HTTP framework: `serve_metrics` is a plain asyncio server
that answers `GET /metrics`. Counters are per process (Prometheus sums them across
servers); the per-kind backlog gauges come from the view `cyclone_v_kinds`, so every
server reports the same, database-wide numbers.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import math
import os
import time
from collections.abc import Awaitable, Callable, Sequence
from datetime import timedelta
from typing import Any, Protocol

from .listen import bare_host, split_host_port

log = logging.getLogger(__name__)

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
DEFAULT_METRICS_PORT = 9233
# Step available -> lease pushed: from "claimed at once" to "the queue was minutes behind".
DISPATCH_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
                    300.0)
STATS_TIMEOUT = 10.0  # seconds; a scrape must answer even when Postgres does not
REQUEST_TIMEOUT = 5.0


class StatsSource(Protocol):
    async def stats(self) -> list[dict[str, Any]]: ...


def _escape(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def _labels(names: Sequence[str], values: Sequence[str], extra: str = "") -> str:
    parts = [f'{n}="{_escape(v)}"' for n, v in zip(names, values, strict=True)]
    if extra:
        parts.append(extra)
    return "{" + ",".join(parts) + "}" if parts else ""


def _num(v: float) -> str:
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return repr(float(v)) if not float(v).is_integer() else str(int(v))


class _Family:
    type_name = ""

    def __init__(self, name: str, help: str, labelnames: Sequence[str] = ()) -> None:
        self.name = name
        self.help = help
        self.labelnames = tuple(labelnames)
        self._values: dict[tuple[str, ...], float] = {}

    def _key(self, labels: dict[str, str]) -> tuple[str, ...]:
        if set(labels) != set(self.labelnames):
            raise ValueError(f"{self.name}: labels must be {self.labelnames}, got {tuple(labels)}")
        return tuple(str(labels[n]) for n in self.labelnames)

    def value(self, **labels: str) -> float:
        return self._values.get(self._key(labels), 0.0)

    def header(self) -> list[str]:
        return [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} {self.type_name}"]

    def render(self) -> list[str]:
        lines = self.header()
        if not self.labelnames and not self._values:
            lines.append(f"{self.name} 0")
        for key, v in sorted(self._values.items()):
            lines.append(f"{self.name}{_labels(self.labelnames, key)} {_num(v)}")
        return lines


class Counter(_Family):
    """A value that only goes up (per process; it starts at 0 when the server starts)."""

    type_name = "counter"

    def inc(self, amount: float = 1.0, **labels: str) -> None:
        if amount < 0:
            raise ValueError(f"{self.name}: a counter cannot decrease")
        key = self._key(labels)
        self._values[key] = self._values.get(key, 0.0) + amount

    def set_total(self, value: float, **labels: str) -> None:
        """Mirror a running total kept elsewhere (e.g. a collections.Counter of the hub)."""
        self._values[self._key(labels)] = float(value)


class Gauge(_Family):
    """A value that goes up and down."""

    type_name = "gauge"

    def set(self, value: float, **labels: str) -> None:
        self._values[self._key(labels)] = float(value)

    def inc(self, amount: float = 1.0, **labels: str) -> None:
        key = self._key(labels)
        self._values[key] = self._values.get(key, 0.0) + amount

    def dec(self, amount: float = 1.0, **labels: str) -> None:
        self.inc(-amount, **labels)


class Histogram(_Family):
    """Observations counted into cumulative buckets (no labels)."""

    type_name = "histogram"

    def __init__(self, name: str, help: str, buckets: Sequence[float]) -> None:
        super().__init__(name, help)
        self.buckets = tuple(sorted(buckets)) + (math.inf,)
        self.counts = [0] * len(self.buckets)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.sum += value
        self.count += 1
        for i, bound in enumerate(self.buckets):
            if value <= bound:
                self.counts[i] += 1
                break

    def render(self) -> list[str]:
        lines = self.header()
        running = 0
        for bound, n in zip(self.buckets, self.counts, strict=True):
            running += n
            lines.append(f'{self.name}_bucket{{le="{_num(bound)}"}} {running}')
        lines += [f"{self.name}_sum {_num(self.sum)}", f"{self.name}_count {self.count}"]
        return lines


def _seconds(v: Any) -> float:
    return v.total_seconds() if isinstance(v, timedelta) else float(v or 0)


class Metrics:
    """The metrics of one server process; the hub and the background tasks update them.

    Example::

        metrics = Metrics()
        metrics.claims_total.inc(kind="send_email")
        metrics.failures_total.inc(kind="send_email", error_kind="error")
        text = await metrics.render(engine)     # what GET /metrics returns
    """

    def __init__(self) -> None:
        self.claims_total = Counter("cyclone_claims_total", "Steps claimed (leased to a worker).", ["kind"])
        self.completions_total = Counter("cyclone_completions_total", "Completed results applied.", ["kind"])
        self.failures_total = Counter(
            "cyclone_failures_total",
            "Failed results applied; error_kind is error (retried), permanent, max_attempts or timeout.",
            ["kind", "error_kind"])
        self.reclaims_total = Counter("cyclone_reclaims_total",
                                      "Expired leases handled by this server's recovery sweep.")
        self.fenced_results_total = Counter("cyclone_fenced_results_total",
                                            "Results refused by the lease fence, by refusal status.", ["status"])
        self.stream_reconnects_total = Counter("cyclone_stream_reconnects_total",
                                               "Worker streams opened with held leases (a reconnect).")
        self.connected_workers = Gauge("cyclone_connected_workers", "Worker streams open on this server.")
        self.dispatch_latency_seconds = Histogram(
            "cyclone_dispatch_latency_seconds", "From a step becoming claimable to its lease being pushed.",
            DISPATCH_BUCKETS)
        self._families: list[_Family] = [
            self.claims_total, self.completions_total, self.failures_total, self.reclaims_total,
            self.fenced_results_total, self.stream_reconnects_total, self.connected_workers,
            self.dispatch_latency_seconds]
        self._stats_inflight: asyncio.Future[list[dict[str, Any]]] | None = None
        self._sources: list[Callable[[], None]] = []

    def add_source(self, refresh: Callable[[], None]) -> None:
        """Run `refresh` before each scrape, e.g. `lambda: m.connected_workers.set(hub.connected_workers)`."""
        self._sources.append(refresh)

    def count_result(self, kind: str, outcome: str, status: str, permanent: bool = False) -> None:
        """Count one worker result by its apply status (see cyclone_results_apply).

        Failures get error_kind "error" (retried), "permanent" (the handler said so),
        "max_attempts" (discarded on the last attempt) or "output_too_large".
        """
        if status in ("stale", "ended", "unknown"):
            self.fenced_results_total.inc(status=status)
        elif outcome == "completed" and status == "applied":
            self.completions_total.inc(kind=kind)
        elif status == "output_too_large":
            self.failures_total.inc(kind=kind, error_kind="output_too_large")
        elif outcome == "failed" and status in ("retried", "discarded", "applied"):
            error_kind = "error" if status == "retried" else "permanent" if permanent else "max_attempts"
            self.failures_total.inc(kind=kind, error_kind=error_kind)

    def render_counters(self) -> str:
        """The in-memory metrics alone (no database read)."""
        for refresh in self._sources:
            try:
                refresh()
            except Exception:  # a broken source must not take the other metrics down with it
                log.exception("metrics: a source failed")
        return "\n".join(line for f in self._families for line in f.render()) + "\n"

    async def _stats(self, engine: StatsSource) -> list[dict[str, Any]]:
        # Concurrent scrapes (several Prometheus replicas) share one query in flight.
        if self._stats_inflight is None:
            self._stats_inflight = asyncio.ensure_future(asyncio.wait_for(engine.stats(), STATS_TIMEOUT))
            self._stats_inflight.add_done_callback(lambda _: setattr(self, "_stats_inflight", None))
        return await asyncio.shield(self._stats_inflight)

    async def render(self, engine: StatsSource | None) -> str:
        """The whole exposition: the counters, then the backlog of every kind read now."""
        lines = [self.render_counters().rstrip("\n")]
        if engine is None:
            return lines[0] + "\n"
        start = time.perf_counter()
        try:
            kinds, ok = await self._stats(engine), 1
        except Exception as e:  # a scrape reports the failure instead of failing itself
            log.warning("metrics: reading cyclone_v_kinds failed: %s", e)
            kinds, ok = [], 0
        elapsed = time.perf_counter() - start
        backlog = [
            ("cyclone_available", "Steps claimable now (the backlog), by kind.", "available"),
            ("cyclone_scheduled", "Steps available but waiting for a later scheduled_at (backoff, snooze), by kind.",
             "scheduled"),
            ("cyclone_running", "Steps running (leased), by kind.", "running"),
            ("cyclone_oldest_available_age_seconds",
             "Age of the oldest claimable step, by kind: the primary backlog indicator.", "oldest_available_age"),
        ]
        for name, help, column in backlog:
            lines += [f"# HELP {name} {help}", f"# TYPE {name} gauge"]
            lines += [f'{name}{{kind="{_escape(str(k["kind"]))}"}} {_num(_seconds(k[column]))}' for k in kinds]
        lines += ["# HELP cyclone_stats_up 1 when the last read of cyclone_v_kinds succeeded.",
                  "# TYPE cyclone_stats_up gauge", f"cyclone_stats_up {ok}",
                  "# HELP cyclone_stats_scrape_seconds Time spent reading cyclone_v_kinds for this scrape.",
                  "# TYPE cyclone_stats_scrape_seconds gauge", f"cyclone_stats_scrape_seconds {_num(elapsed)}"]
        return "\n".join(lines) + "\n"


class MetricsServer:
    """The running HTTP endpoint; `port` is the bound port (useful with port 0)."""

    def __init__(self, server: asyncio.Server, host: str, port: int) -> None:
        self._server = server
        self.host = host
        self.port = port

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    async def close(self) -> None:
        self._server.close()
        await self._server.wait_closed()


def _response(status: str, body: bytes, content_type: str = "text/plain; charset=utf-8",
              head: bool = False) -> bytes:
    headers = (f"HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {len(body)}\r\n"
               "Connection: close\r\n\r\n")
    return headers.encode() + (b"" if head else body)


def _handler(render: Callable[[], Awaitable[str]]) -> Callable[[asyncio.StreamReader, asyncio.StreamWriter],
                                                                 Awaitable[None]]:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), REQUEST_TIMEOUT)
            parts = head.split(b"\r\n", 1)[0].decode("latin-1").split()
            method, target = (parts[0], parts[1]) if len(parts) == 3 else ("", "")
            path = target.split("?", 1)[0]
            if not method:
                reply = _response("400 Bad Request", b"bad request\n")
            elif path != "/metrics":
                reply = _response("404 Not Found", b"not found: the metrics are at /metrics\n")
            elif method not in ("GET", "HEAD"):
                reply = _response("405 Method Not Allowed", b"only GET /metrics\n")
            else:
                reply = _response("200 OK", (await render()).encode(), CONTENT_TYPE, head=method == "HEAD")
            writer.write(reply)
            await writer.drain()
        except (asyncio.TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
            pass  # a client that sends no complete request gets no answer
        finally:
            writer.close()

    return handle


async def serve_metrics(metrics: Metrics, engine: StatsSource | None, host: str = "127.0.0.1",
                        port: int = DEFAULT_METRICS_PORT) -> MetricsServer:
    """Serve `GET /metrics` on host:port (0: any free port) until `close()`."""
    server = await asyncio.start_server(_handler(lambda: metrics.render(engine)), host, port)
    bound = server.sockets[0].getsockname()[1]
    log.info("metrics listening on http://%s:%d/metrics", host, bound)
    return MetricsServer(server, host, bound)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """`--metrics-listen HOST:PORT` (env CYCLONE_METRICS_LISTEN); unset: no metrics endpoint."""
    parser.add_argument("--metrics-listen", metavar="HOST:PORT", default=os.environ.get("CYCLONE_METRICS_LISTEN"),
                        help="serve Prometheus metrics at http://HOST:PORT/metrics (env CYCLONE_METRICS_LISTEN; "
                             f"e.g. 0.0.0.0:{DEFAULT_METRICS_PORT}); off when unset")


def parse_listen(value: str) -> tuple[str, int]:
    """'HOST:PORT' (IPv6 as [::1]:PORT) -> (host, port); ValueError naming the value."""
    # ':PORT' (no host) listens on every interface.
    host, port = split_host_port("0.0.0.0" + value if value.startswith(":") else value, what="listen address")
    return bare_host(host), port


__all__ = ["Metrics", "MetricsServer", "serve_metrics", "add_arguments", "parse_listen", "Counter", "Gauge",
           "Histogram", "CONTENT_TYPE", "DEFAULT_METRICS_PORT"]
