"""The metrics endpoint over a real socket, with the backlog read from a real database at scrape time."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from datetime import datetime, timedelta, timezone

import pytest

from cyclone_server.store.engine import Engine
from cyclone_server.serve.metrics import CONTENT_TYPE, Metrics, MetricsServer, scrape, serve_metrics

SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(?:[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\]|\\.)*",?)*\})? (\S+)$')


async def http_get(port: int, path: str = "/metrics", method: str = "GET") -> tuple[int, dict[str, str], str]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"{method} {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    await writer.drain()
    raw = await asyncio.wait_for(reader.read(), 30)  # the server closes after one response
    writer.close()
    head, _, body = raw.decode().partition("\r\n\r\n")
    status_line, *header_lines = head.split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (h.partition(":") for h in header_lines)}
    return int(status_line.split()[1]), headers, body


def parse(text: str) -> dict[str, float]:
    """Samples keyed by 'name{labels}'; fails on any line that is not valid exposition format."""
    samples: dict[str, float] = {}
    typed: set[str] = set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            name = line.split()[2]
            assert name not in typed, f"TYPE twice for {name}"
            typed.add(name)
            continue
        if line.startswith("# HELP "):
            continue
        m = SAMPLE.match(line)
        assert m, f"not a sample line: {line!r}"
        family = re.sub(r"_(bucket|sum|count)$", "", m.group(1))
        assert m.group(1) in typed or family in typed, f"sample before its TYPE: {line!r}"
        samples[m.group(1) + (m.group(2) or "")] = float(m.group(3))
    return samples


@pytest.fixture
async def endpoint(engine: Engine) -> AsyncIterator[tuple[Metrics, MetricsServer]]:
    metrics = Metrics()
    server = await serve_metrics(metrics, engine, "127.0.0.1", 0)
    yield metrics, server
    await server.close()


async def test_backlog_per_kind_is_read_from_the_database_at_scrape_time(
        engine: Engine, endpoint: tuple[Metrics, MetricsServer]) -> None:
    _, server = endpoint
    assert server.port > 0
    status, headers, body = await http_get(server.port)
    assert status == 200 and headers["content-type"] == CONTENT_TYPE
    empty = parse(body)
    assert empty["cyclone_stats_up"] == 1
    assert not [k for k in empty if k.startswith("cyclone_available{")]

    for kind, n in (("email", 3), ("resize", 2)):
        for i in range(n):
            await engine.enqueue(kind, input={"i": i})
    later = datetime.now(timezone.utc) + timedelta(hours=1)
    await engine.enqueue("resize", scheduled_at=later)  # not claimable yet: scheduled, not backlog
    assert len(await engine.claim("w1", ["email"], 1, lease_ttl=30)) == 1
    await asyncio.sleep(0.01)  # the oldest available step is then measurably old

    samples = parse((await http_get(server.port))[2])
    assert samples['cyclone_available{kind="email"}'] == 2
    assert samples['cyclone_scheduled{kind="email"}'] == 0
    assert samples['cyclone_running{kind="email"}'] == 1
    assert samples['cyclone_available{kind="resize"}'] == 2
    assert samples['cyclone_scheduled{kind="resize"}'] == 1
    assert samples['cyclone_running{kind="resize"}'] == 0
    assert samples['cyclone_oldest_available_age_seconds{kind="resize"}'] > 0
    assert int(server.port) == int(server.address.rsplit(":", 1)[1])


async def test_counters_gauge_and_histogram_in_exposition_format(endpoint: tuple[Metrics, MetricsServer]) -> None:
    metrics, server = endpoint
    metrics.claims_total.labels(kind="email").inc()
    metrics.mirror(metrics.claims_total, 2, kind="email")  # a running total kept elsewhere: +2
    metrics.mirror(metrics.claims_total, 2, kind="email")  # unchanged: +0
    metrics.claims_total.labels(kind='we"ird\\kind\n').inc()
    metrics.count_result("email", "completed", "applied")
    metrics.count_result("email", "failed", "retried")
    metrics.count_result("email", "failed", "discarded", permanent=True)
    metrics.count_result("email", "failed", "discarded")
    metrics.count_result("email", "completed", "stale")
    metrics.reclaims_total.labels(how="expired").inc(4)
    metrics.step_duration_seconds.labels(kind="email").observe(0.2)
    metrics.queue_wait_seconds.labels(kind="email").observe(0.002)
    metrics.stream_reconnects_total.inc()
    metrics.add_source(lambda: metrics.connected_workers.set(7))
    for seconds in (0.0005, 0.02, 0.02, 3.0, 1000.0):
        metrics.dispatch_latency_seconds.observe(seconds)

    samples = parse((await http_get(server.port))[2])
    assert samples['cyclone_claims_total{kind="email"}'] == 3
    assert samples['cyclone_claims_total{kind="we\\"ird\\\\kind\\n"}'] == 1
    assert samples['cyclone_completions_total{kind="email"}'] == 1
    assert samples['cyclone_failures_total{error_kind="error",kind="email"}'] == 1
    assert samples['cyclone_failures_total{error_kind="permanent",kind="email"}'] == 1
    assert samples['cyclone_failures_total{error_kind="max_attempts",kind="email"}'] == 1
    assert samples['cyclone_fenced_results_total{status="stale"}'] == 1
    assert samples['cyclone_reclaims_total{how="expired"}'] == 4
    assert samples['cyclone_reclaims_total{how="worker_lost"}'] == 0
    assert samples["cyclone_stream_reconnects_total"] == 1
    assert samples["cyclone_connected_workers"] == 7
    h = "cyclone_dispatch_latency_seconds"
    assert samples[f'{h}_bucket{{le="0.001"}}'] == 1
    assert samples[f'{h}_bucket{{le="0.025"}}'] == 3
    assert samples[f'{h}_bucket{{le="5.0"}}'] == 4
    assert samples[f'{h}_bucket{{le="+Inf"}}'] == samples[f"{h}_count"] == 5
    assert samples[f"{h}_sum"] == pytest.approx(1003.0405)
    assert samples['cyclone_step_duration_seconds_bucket{kind="email",le="0.25"}'] == 1
    assert samples['cyclone_queue_wait_seconds_count{kind="email"}'] == 1
    # prometheus_client's own process and Python metrics come along.
    assert samples["process_cpu_seconds_total"] >= 0 and "python_info" in "".join(samples)


async def test_counters_start_at_zero_and_reject_a_decrease(endpoint: tuple[Metrics, MetricsServer]) -> None:
    metrics, server = endpoint
    samples = parse((await http_get(server.port))[2])
    assert samples['cyclone_reclaims_total{how="expired"}'] == 0 and samples["cyclone_connected_workers"] == 0
    with pytest.raises(ValueError, match="non-negative"):
        metrics.reclaims_total.labels(how="expired").inc(-1)
    with pytest.raises(ValueError, match="label"):
        metrics.claims_total.labels(wrong="x")


async def test_get_is_served_and_other_methods_are_not(endpoint: tuple[Metrics, MetricsServer]) -> None:
    _, server = endpoint
    assert (await http_get(server.port, "/metrics", "POST"))[0] == 405
    status, _, body = await http_get(server.port, "/metrics?x=1")
    assert status == 200 and "cyclone_stats_up 1.0" in body
    status, _, body = await http_get(server.port, "/metrics?name[]=cyclone_stats_up&name[]=cyclone_claims_total")
    assert status == 200 and {k.split("{")[0] for k in parse(body)} == {"cyclone_stats_up"}  # no claims yet


async def test_scrape_gives_the_same_exposition_in_the_servers_loop(engine: Engine) -> None:
    """`scrape` is what an HTTP app of the server's own loop serves at /metrics."""
    await engine.enqueue("email")
    metrics = Metrics()
    metrics.claims_total.labels(kind="email").inc()
    body, content_type = await scrape(metrics, engine)
    samples = parse(body.decode())
    assert content_type == CONTENT_TYPE
    assert samples['cyclone_available{kind="email"}'] == 1 and samples['cyclone_claims_total{kind="email"}'] == 1
    # No worker runs "email": flagged, with its workers gauge at 0.
    assert samples['cyclone_kind_workers{kind="email"}'] == 0
    assert samples["cyclone_kinds_without_workers"] == 1


async def test_the_days_of_history_are_a_gauge(engine: Engine) -> None:
    """cyclone_history_days: the partitions of each history table, which the claims pay for
    (docs/operations.md, "What the days cost"): one more with each day made."""
    samples = parse((await scrape(Metrics(), engine))[0].decode())
    days = await engine.history_days()
    assert samples["cyclone_history_days"] == days
    async with engine.pool.connection() as conn:
        await conn.execute("SELECT cyclone_history_ensure(5)")  # the days up to five ahead
    assert await engine.history_days() > days
    samples = parse((await scrape(Metrics(), engine))[0].decode())
    assert samples["cyclone_history_days"] == await engine.history_days()


async def test_the_days_the_claim_reads_are_a_gauge(engine: Engine) -> None:
    """cyclone_history_live_days: the days from the first one not settled on (migration 0015),
    which a long-running run keeps from shrinking."""
    async with engine.pool.connection() as conn:  # history from three days ago (empty days)
        for row in await (await conn.execute("SELECT suffix FROM cyclone_history_days")).fetchall():
            for table in ("cyclone_runs", "cyclone_steps", "cyclone_step_deps"):
                await conn.execute(f"DROP TABLE {table}_{row['suffix']}")
        await conn.execute("DELETE FROM cyclone_history_days")
        await conn.execute("SELECT cyclone__history_day_make(NULL, cyclone__day_uuid(now() - interval '3 days'), "
                           "'first', NULL)")
        await conn.execute("SELECT cyclone_history_ensure()")
    days = await engine.history_days()
    samples = parse((await scrape(Metrics(), engine))[0].decode())
    assert samples["cyclone_history_live_days"] == days == await engine.history_live_days()
    await engine.settle_history()
    samples = parse((await scrape(Metrics(), engine))[0].decode())
    assert samples["cyclone_history_live_days"] == await engine.history_live_days() < days


async def test_a_database_failure_is_reported_not_fatal(db_url: str) -> None:
    engine = await Engine.open(db_url, min_size=1, max_size=1)
    await engine.close()  # a real pool that can no longer give connections
    metrics = Metrics()
    metrics.claims_total.labels(kind="email").inc()
    server = await serve_metrics(metrics, engine, "127.0.0.1", 0)
    try:
        status, _, body = await http_get(server.port)
    finally:
        await server.close()
    samples = parse(body)
    assert status == 200
    assert samples["cyclone_stats_up"] == 0
    assert samples['cyclone_claims_total{kind="email"}'] == 1


async def test_concurrent_scrapes_all_get_the_backlog(engine: Engine,
                                                        endpoint: tuple[Metrics, MetricsServer]) -> None:
    _, server = endpoint
    await engine.enqueue("email")
    bodies = await asyncio.gather(*(http_get(server.port) for _ in range(8)))
    assert {parse(b)['cyclone_available{kind="email"}'] for _, _, b in bodies} == {1}
