"""The limits' series of /metrics, read from a real database at scrape time: the busiest keys of each
limit only (a bounded label set), the limits' settings, one read per scrape, and a real server's endpoint."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
import pytest

from cyclone_proto import limits_pb2, limits_pb2_grpc
from cyclone_server import limit_spec
from cyclone_server.serve.metrics import LIMIT_KEYS_SHOWN, Metrics, MetricsServer, scrape, serve_metrics
from cyclone_server.store.engine import Engine

from test_metrics import http_get, parse
from test_metrics_server import metrics_port

ODD = 'we"ird\\key\n'  # a key from a run input: escaped in the exposition


async def set_limit(engine: Engine, name: str, **fields: Any) -> None:
    await engine.set_limit(limit_spec.normalize_limit({"name": name, **fields}))


def keys_of(samples: dict[str, float], family: str, limit: str) -> dict[str, float]:
    """{key (escaped as in the exposition): value} of the family's samples of `limit`."""
    prefix, suffix = f'{family}{{key="', f'",limit="{limit}"}}'  # prometheus_client sorts the labels
    return {k[len(prefix):-len(suffix)]: v for k, v in samples.items() if k.startswith(prefix) and k.endswith(suffix)}


@pytest.fixture
async def endpoint(engine: Engine) -> AsyncIterator[MetricsServer]:
    server = await serve_metrics(Metrics(), engine, "127.0.0.1", 0)
    yield server
    await server.close()


async def test_the_busiest_keys_of_each_limit_and_the_limits_settings_are_read_at_scrape_time(
        engine: Engine, endpoint: MetricsServer) -> None:
    samples = parse((await http_get(endpoint.port))[2])
    assert samples["cyclone_stats_up"] == 1 and not [k for k in samples if k.startswith("cyclone_limit")]

    await set_limit(engine, "tenants", max_running=1, kinds=["work"], key_path="tenant")
    await set_limit(engine, "rps", rate=600, period=60.0, kinds=["call"])  # one start per 0.1 s
    await set_limit(engine, "quiet", max_running=3)
    # Tenant t<i> has i + 1 jobs: one runs, i wait. The odd key is the busiest (14 jobs).
    tenants = [f"t{i:02d}" for i in range(12)]
    for t in tenants:
        for _ in range(int(t[1:]) + 1):
            await engine.enqueue("work", input={"tenant": t})
    for _ in range(14):
        await engine.enqueue("work", input={"tenant": ODD})
    assert len(await engine.claim("w", ["work"], 50, 30)) == 13  # one per key
    for _ in range(3):
        await engine.enqueue("call")
    assert len(await engine.claim("w", ["call"], 2, 30)) == 1  # a new key's bucket: one start
    await asyncio.sleep(await engine.next_due(["call"]) + 0.005)
    assert len(await engine.claim("w", ["call"], 2, 30)) == 1
    await asyncio.sleep(0.01)  # the oldest waiting steps are then measurably old

    samples = parse((await http_get(endpoint.port))[2])
    odd = ODD.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    shown = [odd] + tenants[:2:-1]  # busiest first: the odd key, then t11 .. t03
    assert len(shown) == LIMIT_KEYS_SHOWN
    running = keys_of(samples, "cyclone_limit_running", "tenants")
    assert sorted(running) == sorted(shown) and set(running.values()) == {1}
    waiting = keys_of(samples, "cyclone_limit_waiting", "tenants")
    assert waiting == {odd: 13, **{t: int(t[1:]) for t in tenants[3:]}}
    oldest = keys_of(samples, "cyclone_limit_oldest_waiting_seconds", "tenants")
    assert sorted(oldest) == sorted(shown) and min(oldest.values()) > 0
    assert keys_of(samples, "cyclone_limit_starts_in_window", "tenants") == {}  # no rate
    assert samples['cyclone_limit_max_running{limit="tenants"}'] == 1
    assert samples['cyclone_limit_max_running{limit="quiet"}'] == 3
    assert 'cyclone_limit_max_running{limit="rps"}' not in samples  # no cap
    assert keys_of(samples, "cyclone_limit_running", "rps") == {"": 2}
    assert keys_of(samples, "cyclone_limit_waiting", "rps") == {"": 1}
    assert keys_of(samples, "cyclone_limit_starts_in_window", "rps") == {"": 2}
    assert samples['cyclone_limit_rate{limit="rps"}'] == 600
    assert samples['cyclone_limit_period_seconds{limit="rps"}'] == 60
    assert keys_of(samples, "cyclone_limit_running", "quiet") == {}  # nothing runs under it

    await engine.delete_limit("tenants")
    samples = parse((await http_get(endpoint.port))[2])
    assert not [k for k in samples if 'limit="tenants"' in k]


class CountingEngine:
    """The engine, with its calls of list_limits counted."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.calls: list[dict[str, Any]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)

    async def list_limits(self, **kw: Any) -> list[dict[str, Any]]:
        self.calls.append(kw)
        return await self.engine.list_limits(**kw)


async def test_limits_are_read_once_per_scrape_and_concurrent_scrapes_share_the_read(engine: Engine) -> None:
    await set_limit(engine, "cap", max_running=2, kinds=["work"])
    await engine.enqueue("work")
    counting = CountingEngine(engine)
    metrics = Metrics()
    body, _ = await scrape(metrics, counting)  # type: ignore[arg-type]
    assert parse(body.decode())['cyclone_limit_waiting{key="",limit="cap"}'] == 1
    assert counting.calls == [{"top": LIMIT_KEYS_SHOWN}]
    bodies = await asyncio.gather(*(scrape(metrics, counting) for _ in range(8)))  # type: ignore[arg-type]
    assert len(counting.calls) == 2
    assert {parse(b.decode())['cyclone_limit_max_running{limit="cap"}'] for b, _ in bodies} == {2}


async def test_a_real_server_exports_the_limits_series(start_server: Callable[..., Any], db_url: str,
                                                        engine: Engine) -> None:
    srv = start_server(db_url, extra_args=["--metrics-listen", "127.0.0.1:0"])
    async with grpc.aio.insecure_channel(srv.address) as channel:
        await limits_pb2_grpc.LimitsStub(channel).SetLimit(limits_pb2.SetLimitRequest(limit=limits_pb2.Limit(
            name="tenants", max_running=1, kinds=["work"], key_path="input.tenant")))
    for _ in range(3):
        await engine.enqueue("work", input={"tenant": "acme"})
    assert len(await engine.claim("w", ["work"], 5, 30)) == 1
    status, _, body = await http_get(metrics_port(srv))
    samples = parse(body)
    assert status == 200 and samples["cyclone_stats_up"] == 1
    assert samples['cyclone_limit_running{key="acme",limit="tenants"}'] == 1
    assert samples['cyclone_limit_waiting{key="acme",limit="tenants"}'] == 2
    assert samples['cyclone_limit_oldest_waiting_seconds{key="acme",limit="tenants"}'] >= 0
    assert samples['cyclone_limit_max_running{limit="tenants"}'] == 1
