"""cyclone_worker.testing.CycloneTestServer and the demo worker (python -m cyclone_worker.demo)."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
from typing import Any

from cyclone_worker import Client, Context, Workflow
from cyclone_worker.testing import CycloneTestServer

DEADLINE = 60.0


async def test_test_server_on_a_given_database_runs_a_workflow_and_survives_a_restart(db_url: str) -> None:
    async with CycloneTestServer(db_url, lease_ttl=2) as server:
        assert server.database_url == db_url and server.address.startswith("127.0.0.1:")
        worker = server.worker(slots=2)
        assert worker.database_url == db_url

        @worker.handler("double")
        async def double(ctx: Context) -> int:
            return ctx.input * 2

        async with server.client() as client, worker:
            first = await client.enqueue("double", 21)
            assert await client.result(first, timeout=DEADLINE) == {"double": 42}
            await asyncio.to_thread(server.restart)
            second = await client.enqueue("double", 5)
            assert await client.result(second, timeout=DEADLINE) == {"double": 10}
        assert "listening on" in server.log_text()


def test_test_server_starts_its_own_embedded_postgres() -> None:
    with CycloneTestServer() as server:
        assert server.database_url.startswith("postgresql://")

        async def use() -> list[str]:
            async with server.client() as client:
                await client.register(Workflow("w").task("a"))
                return [w.name for w in await client.list_workflows()]

        assert asyncio.run(use()) == ["w"]
    assert server.address  # still readable after stop; the process and Postgres are gone


async def test_demo_registers_its_workflow_runs_it_and_stops_on_sigterm(server: Any) -> None:
    demo = subprocess.Popen([sys.executable, "-m", "cyclone_worker.demo", "--address", server.address,
                             "--submit", "2"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        async with Client(server.address) as client:
            end = time.monotonic() + DEADLINE
            while len(done := await client.list(workflow="demo", states=["completed"])) < 2:
                assert demo.poll() is None, demo.stdout.read().decode() if demo.stdout else ""
                assert time.monotonic() < end, "the demo runs did not complete"
                await asyncio.sleep(0.1)
            info = await client.get_workflow("demo")
            assert [n["id"] for n in info.nodes] == ["fetch", "parse", "enrich", "report"]
            result = (await client.get(done[0].id)).result
            assert result["report"]["run"] == done[0].id and "°C" in result["report"]["text"]
            # A run submitted now is taken by the same worker.
            run_id = await client.submit("demo", {"city": "Oslo", "days": 3})
            text = (await client.result(run_id, timeout=DEADLINE))["report"]["text"]
            assert text.startswith("Oslo (Norway): 3 days")
        demo.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(demo.wait, DEADLINE) == 0
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.wait()
