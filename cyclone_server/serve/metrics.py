"""Prometheus metrics of one server, with prometheus_client: counters of this process, and
database-wide gauges read from Postgres once per scrape.

Counters and histograms are per process (Prometheus sums them across servers), as are
prometheus_client's process and Python metrics. The per-kind backlog, the workers per kind,
the runs ended per workflow and the usage of each limit's busiest keys come from the database
(the view `cyclone_v_kinds`, the table `cyclone_workers`, the index `cyclone_runs_finished`,
`cyclone_limit_keys_stats`), so every server reports the same, database-wide numbers.
Those are read in the server's event loop before each exposition (`Metrics.prepare`):
concurrent scrapes share one read in flight, and a read that takes longer than
STATS_TIMEOUT is reported (`cyclone_stats_up 0`), not waited for.

Two ways to serve them: `serve_metrics` (prometheus_client's HTTP server on its own
thread, `--metrics-listen`), and `scrape` for an HTTP app of the server's own loop.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics
from prometheus_client import GCCollector, PlatformCollector, ProcessCollector, generate_latest, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4

from cyclone_server.convert import kind_without_workers


log = logging.getLogger(__name__)

# No `_created` series beside every counter: Cyclone's counters start with the process.
disable_created_metrics()

CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4
DEFAULT_METRICS_PORT = 9233
# Step available -> lease pushed: from "claimed at once" to "the queue was minutes behind".
DISPATCH_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
                    300.0)
# A handler's execution, lease pushed -> result received: milliseconds to the attempt timeout.
EXECUTION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 600.0,
                     1800.0, 3600.0)
STATS_TIMEOUT = 10.0  # seconds; a scrape must answer even when Postgres does not
# Runs are counted as ended once they finished this long ago, so that a transaction that
# ended a run but committed a little later (finished_at is its start time) is not missed.
RUNS_ENDED_LAG = timedelta(seconds=5)
RECLAIM_HOWS = ("expired", "worker_lost")  # the `how` of cyclone_reclaims_total
# Keys per limit with series of their own (the busiest, by running + waiting): a bounded label set,
# however many tenants a key path brings.
LIMIT_KEYS_SHOWN = 10


class StatsSource(Protocol):
    async def stats(self) -> list[dict[str, Any]]: ...

    async def list_workers(self, kind: str | None = None) -> list[dict[str, Any]]: ...

    async def runs_ended(self, since: datetime | None, lag: timedelta) -> tuple[list[dict[str, Any]], datetime]: ...

    async def list_limits(self, *, top: int) -> list[dict[str, Any]]: ...

    async def history_days(self) -> int: ...

    async def history_live_days(self) -> int: ...


@dataclass
class Snapshot:
    """What one scrape read from the database."""

    kinds: list[dict[str, Any]] = field(default_factory=list)
    workers: list[dict[str, Any]] = field(default_factory=list)
    ok: bool = False
    seconds: float = 0.0
    limits: list[dict[str, Any]] = field(default_factory=list)  # each with its busiest keys under "keys"
    history_days: int | None = None  # partitions of each history table (Engine.history_days)
    live_days: int | None = None  # of those, the days the claim reads (Engine.history_live_days)


# Set while one exposition is generated: the snapshot the database collector reports.
_SNAPSHOT: contextvars.ContextVar[Snapshot | None] = contextvars.ContextVar("cyclone_metrics_snapshot", default=None)


def _seconds(v: Any) -> float:
    return v.total_seconds() if isinstance(v, timedelta) else float(v or 0)


class _DatabaseCollector:
    """The database-wide families, from the snapshot of the exposition being generated."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics

    def describe(self) -> list[Metric]:
        return []  # collected only at scrape time

    def collect(self) -> Iterator[Metric]:
        snap = _SNAPSHOT.get()
        if snap is None:
            return
        backlog = [
            ("cyclone_available", "Steps claimable now (the backlog), by kind.", "available"),
            ("cyclone_scheduled", "Steps available but waiting for a later scheduled_at (backoff, snooze), by kind.",
             "scheduled"),
            ("cyclone_running", "Steps running (leased), by kind.", "running"),
            ("cyclone_oldest_available_age_seconds",
             "Age of the oldest claimable step, by kind: the primary backlog indicator.", "oldest_available_age"),
        ]
        for name, help, column in backlog:
            g = GaugeMetricFamily(name, help, labels=["kind"])
            for k in snap.kinds:
                g.add_metric([str(k["kind"])], _seconds(k[column]))
            yield g
        workers: dict[str, list[int]] = {str(k["kind"]): [0, 0] for k in snap.kinds}
        for w in snap.workers:
            for kind in w["kinds"]:
                per = workers.setdefault(kind, [0, 0])
                per[0] += 1
                per[1] += max(0, w["slots"] - w["leases_held"])
        g = GaugeMetricFamily("cyclone_kind_workers", "Connected workers (all servers) that run the kind.",
                              labels=["kind"])
        s = GaugeMetricFamily("cyclone_kind_free_slots", "Free slots of the connected workers that run the kind.",
                              labels=["kind"])
        for kind, (n, free) in sorted(workers.items()):
            g.add_metric([kind], n)
            s.add_metric([kind], free)
        yield g
        yield s
        yield GaugeMetricFamily(
            "cyclone_kinds_without_workers",
            "Kinds with steps waiting to be claimed and no connected worker that runs them.",
            value=sum(1 for k in snap.kinds if kind_without_workers(k)))
        ended = CounterMetricFamily("cyclone_runs_ended", "Runs that ended (database-wide, counted from this "
                                    "server's first scrape on), by workflow and state.", labels=["workflow", "state"])
        for (workflow, state), n in sorted(self.metrics.runs_ended.items()):
            ended.add_metric([workflow, state], n)
        yield ended
        yield from _limit_families(snap.limits)
        if snap.history_days is not None:
            yield GaugeMetricFamily("cyclone_history_days",
                                    "Partitions of each history table (runs, steps, edges): the days kept, the days "
                                    "made ahead and the first. Claims slow with every one.", value=snap.history_days)
        if snap.live_days is not None:
            yield GaugeMetricFamily("cyclone_history_live_days",
                                    "Days of history the claim and the sweeps read: from the oldest day with a run "
                                    "not ended (or retried) on, the days ahead included.", value=snap.live_days)
        yield GaugeMetricFamily("cyclone_stats_up", "1 when the last read of the database for metrics succeeded.",
                                value=1 if snap.ok else 0)
        yield GaugeMetricFamily("cyclone_stats_scrape_seconds",
                                "Time spent reading the database for this scrape.", value=snap.seconds)


def _limit_families(limits: list[dict[str, Any]]) -> Iterator[Metric]:
    """Per limit its settings, and per key of its busiest LIMIT_KEYS_SHOWN the running, waiting and
    oldest waiting steps (runs, for scope runs) and the starts in the rate's window."""
    per_key = [
        ("cyclone_limit_running", "Running steps (scope steps) or active runs (scope runs) under the key, for the "
         "busiest keys of each limit.", "running"),
        ("cyclone_limit_waiting", "Steps (or runs) waiting under the key, for the busiest keys of each limit.",
         "waiting"),
        ("cyclone_limit_oldest_waiting_seconds", "How long the oldest waiting step of the key has been claimable, "
         "for the busiest keys of each limit.", "oldest_waiting_age"),
        ("cyclone_limit_starts_in_window", "Starts under the key in the current window of the limit's rate, for the "
         "busiest keys of each limit with a rate.", "starts_in_window"),
    ]
    for name, help, column in per_key:
        g = GaugeMetricFamily(name, help, labels=["limit", "key"])
        for limit in limits:
            if column == "starts_in_window" and not limit["rate"]:
                continue
            for k in limit["keys"][:LIMIT_KEYS_SHOWN]:
                g.add_metric([limit["name"], k["key"]], _seconds(k[column]))
        yield g
    cap = GaugeMetricFamily("cyclone_limit_max_running", "The limit's max_running per key (limits with a cap).",
                            labels=["limit"])
    rate = GaugeMetricFamily("cyclone_limit_rate", "Starts per key the limit allows in any window of its period "
                             "(limits with a rate).", labels=["limit"])
    period = GaugeMetricFamily("cyclone_limit_period_seconds", "The period of the limit's rate (limits with a rate).",
                               labels=["limit"])
    for limit in limits:
        if limit["max_running"]:
            cap.add_metric([limit["name"]], limit["max_running"])
        if limit["rate"]:
            rate.add_metric([limit["name"]], limit["rate"])
            period.add_metric([limit["name"]], float(limit["period"]))
    yield cap
    yield rate
    yield period


class _ThreadRegistry:
    """What prometheus_client's HTTP thread collects: the snapshot is read in the server's
    loop (where the engine, the hub and its counters live), then exposed from the thread."""

    def __init__(self, metrics: Metrics, engine: StatsSource | None, loop: asyncio.AbstractEventLoop) -> None:
        self.metrics, self.engine, self.loop = metrics, engine, loop

    def collect(self) -> Iterator[Metric]:
        future = asyncio.run_coroutine_threadsafe(self.metrics.prepare(self.engine), self.loop)
        snap = future.result(STATS_TIMEOUT + 5)
        token = _SNAPSHOT.set(snap)
        try:
            yield from self.metrics.registry.collect()
        finally:
            _SNAPSHOT.reset(token)

    def restricted_registry(self, names: list[str]) -> Any:
        """For `/metrics?name[]=...`: only the families with one of these names (or samples)."""
        wanted = set(names)
        collect = self.collect

        class Only:
            def collect(self) -> Iterator[Metric]:
                return (m for m in collect() if m.name in wanted or any(s.name in wanted for s in m.samples))
        return Only()


class Metrics:
    """The metrics of one server process; the hub and the background tasks feed them.

    Example::

        metrics = Metrics()
        metrics.claims_total.labels(kind="send_email").inc()
        metrics.count_result("send_email", "failed", "retried")
        body, content_type = await scrape(metrics, engine)   # what GET /metrics returns
    """

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry(auto_describe=True)
        ProcessCollector(registry=r)
        PlatformCollector(registry=r)
        GCCollector(registry=r)
        self.claims_total = Counter("cyclone_claims_total", "Steps claimed (leased to a worker).", ["kind"],
                                    registry=r)
        self.completions_total = Counter("cyclone_completions_total", "Completed results applied.", ["kind"],
                                         registry=r)
        self.failures_total = Counter(
            "cyclone_failures_total",
            "Failed results applied; error_kind is error (retried), permanent, max_attempts or output_too_large.",
            ["kind", "error_kind"], registry=r)
        self.reclaims_total = Counter(
            "cyclone_reclaims_total",
            "Leases this server took back from workers (the step claimable again, or discarded at its "
            "reclaim limit), by how: expired (the recovery sweep found the lease past its expiry) or "
            "worker_lost (the worker's stream ended before it could answer: it went silent, or it was gone "
            "before the claimed leases could be pushed).", ["how"], registry=r)
        for how in RECLAIM_HOWS:  # both series from the start, at 0
            self.reclaims_total.labels(how=how)
        self.fenced_results_total = Counter("cyclone_fenced_results_total",
                                            "Results refused by the lease fence, by refusal status.", ["status"],
                                            registry=r)
        self.stream_reconnects_total = Counter("cyclone_stream_reconnects_total",
                                               "Worker streams opened with held leases (a reconnect).", registry=r)
        self.connected_workers = Gauge("cyclone_connected_workers", "Worker streams open on this server.",
                                       registry=r)
        self.dispatch_latency_seconds = Histogram(
            "cyclone_dispatch_latency_seconds", "From a step becoming claimable to its lease being pushed.",
            buckets=DISPATCH_BUCKETS, registry=r)
        self.queue_wait_seconds = Histogram(
            "cyclone_queue_wait_seconds", "From a step becoming claimable to its claim, by kind.", ["kind"],
            buckets=DISPATCH_BUCKETS, registry=r)
        self.step_duration_seconds = Histogram(
            "cyclone_step_duration_seconds",
            "A handler's execution, from its lease being pushed to its result arriving, by kind.", ["kind"],
            buckets=EXECUTION_BUCKETS, registry=r)
        self.schedule_fires_total = Counter("cyclone_schedule_fires_total",
                                            "Runs started by this server's scheduler, per schedule.", ["schedule"],
                                            registry=r)
        self.schedule_misses_total = Counter(
            "cyclone_schedule_misses_total",
            "Fire times skipped: found older than the catch-up window, or their target refused.", ["schedule"],
            registry=r)
        self.schedule_skips_total = Counter("cyclone_schedule_skips_total",
                                            "Fire times skipped by the overlap policy.", ["schedule"], registry=r)
        r.register(_DatabaseCollector(self))
        # cyclone_runs_ended_total, by (workflow, state): read from the database per scrape.
        self.runs_ended: dict[tuple[str, str], int] = {}
        self._runs_ended_since: datetime | None = None
        self._inflight: asyncio.Future[Snapshot] | None = None
        self._sources: list[Callable[[], None]] = []
        self._mirrored: dict[tuple[int, tuple[str, ...]], float] = {}

    def add_source(self, refresh: Callable[[], None]) -> None:
        """Run `refresh` (in the event loop) before each scrape, e.g.
        `lambda: m.connected_workers.set(hub.connected_workers)`."""
        self._sources.append(refresh)

    def mirror(self, counter: Counter, total: float, **labels: str) -> None:
        """Bring `counter` up to a running total kept elsewhere (e.g. a collections.Counter of the hub)."""
        key = (id(counter), tuple(f"{k}={v}" for k, v in sorted(labels.items())))
        delta = total - self._mirrored.get(key, 0.0)
        if delta > 0:
            (counter.labels(**labels) if labels else counter).inc(delta)
            self._mirrored[key] = total

    def count_result(self, kind: str, outcome: str, status: str, permanent: bool = False) -> None:
        """Count one worker result by its apply status (see cyclone_results_apply).

        Failures get error_kind "error" (retried), "permanent" (the handler said so),
        "max_attempts" (discarded on the last attempt) or "output_too_large".
        """
        if status in ("stale", "ended", "unknown"):
            self.fenced_results_total.labels(status=status).inc()
        elif outcome == "completed" and status == "applied":
            self.completions_total.labels(kind=kind).inc()
        elif status == "output_too_large":
            self.failures_total.labels(kind=kind, error_kind="output_too_large").inc()
        elif outcome == "failed" and status in ("retried", "discarded", "applied"):
            error_kind = "error" if status == "retried" else "permanent" if permanent else "max_attempts"
            self.failures_total.labels(kind=kind, error_kind=error_kind).inc()

    async def prepare(self, engine: StatsSource | None) -> Snapshot:
        """Refresh the sources and read the database for one exposition (in the event loop)."""
        for refresh in self._sources:
            try:
                refresh()
            except Exception:  # a broken source must not take the other metrics down with it
                log.exception("metrics: a source failed")
        if engine is None:
            return Snapshot(ok=True)
        # Concurrent scrapes (several Prometheus replicas) share one read in flight.
        if self._inflight is None:
            self._inflight = asyncio.ensure_future(self._read(engine))
            self._inflight.add_done_callback(lambda _: setattr(self, "_inflight", None))
        return await asyncio.shield(self._inflight)

    async def _read(self, engine: StatsSource) -> Snapshot:
        start = time.perf_counter()
        try:
            async with asyncio.timeout(STATS_TIMEOUT):
                kinds = await engine.stats()
                workers = await engine.list_workers()
                ended, until = await engine.runs_ended(self._runs_ended_since, RUNS_ENDED_LAG)
                limits = await engine.list_limits(top=LIMIT_KEYS_SHOWN)
                history_days = await engine.history_days()
                live_days = await engine.history_live_days()
        except Exception as e:  # a scrape reports the failure instead of failing itself
            log.warning("metrics: reading the database failed: %s", e)
            return Snapshot(ok=False, seconds=time.perf_counter() - start)
        for row in ended:
            key = (row["workflow"] or "", row["state"])
            self.runs_ended[key] = self.runs_ended.get(key, 0) + row["n"]
        self._runs_ended_since = until
        return Snapshot(kinds, workers, True, time.perf_counter() - start, limits, history_days, live_days)

    def expose(self, snapshot: Snapshot) -> bytes:
        """The text exposition of everything, the database families from `snapshot`."""
        token = _SNAPSHOT.set(snapshot)
        try:
            return generate_latest(self.registry)
        finally:
            _SNAPSHOT.reset(token)


async def scrape(metrics: Metrics, engine: StatsSource | None) -> tuple[bytes, str]:
    """(body, content type) of GET /metrics, for an HTTP app running in the server's loop.

    Example (aiohttp)::

        async def handle(request):
            body, content_type = await scrape(server.metrics, server.engine)
            return web.Response(body=body, headers={"Content-Type": content_type})
    """
    return metrics.expose(await metrics.prepare(engine)), CONTENT_TYPE


class MetricsServer:
    """The running HTTP endpoint (prometheus_client's, on a thread); `port` is the bound port."""

    def __init__(self, httpd: Any, thread: threading.Thread, host: str, port: int) -> None:
        self._httpd = httpd
        self._thread = thread
        self.host = host
        self.port = port

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    async def close(self) -> None:
        await asyncio.to_thread(self._httpd.shutdown)
        self._httpd.server_close()
        await asyncio.to_thread(self._thread.join, 5)


async def serve_metrics(metrics: Metrics, engine: StatsSource | None, host: str = "127.0.0.1",
                        port: int = DEFAULT_METRICS_PORT) -> MetricsServer:
    """Serve GET /metrics on host:port (0: any free port) until `close()`."""
    registry = _ThreadRegistry(metrics, engine, asyncio.get_running_loop())
    httpd, thread = await asyncio.to_thread(start_http_server, port, host, registry)  # type: ignore[arg-type]
    bound = httpd.server_port
    log.info("metrics listening on http://%s:%d/metrics", host, bound)
    return MetricsServer(httpd, thread, host, bound)


__all__ = ["Metrics", "MetricsServer", "Snapshot", "scrape", "serve_metrics",
           "CONTENT_TYPE", "DEFAULT_METRICS_PORT", "RECLAIM_HOWS", "LIMIT_KEYS_SHOWN"]
