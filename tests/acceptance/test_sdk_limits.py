"""Flow control through the Python SDK against a real server: the Limits calls and their errors,
limits declared on nodes, jobs and workflows, and end to end with real worker processes a
concurrency limit per tenant that is reached and never passed, and a rate limit per tenant whose
windows the handlers' own clocks confirm. Also runs every Python example of docs/flow-control.md."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import psycopg
import pytest

from cyclone_worker import Client, Context, CycloneClientError, Job, LimitUse, Worker, Workflow

from waits_helpers import DEADLINE, until

HERE = Path(__file__).parent
ROOT = HERE.parents[1]


@pytest.fixture
def limits_workers(tmp_path: Path) -> Iterator[Callable[[str, int], Path]]:
    """start(address, n): n worker processes (sdk_limits_worker_proc.py, 4 slots each) sharing one
    state file, which it returns. Stopped with SIGTERM at teardown; each must exit 0."""
    procs: list[subprocess.Popen[bytes]] = []
    state = tmp_path / "state.json"

    def start(address: str, n: int) -> Path:
        for _ in range(n):
            procs.append(subprocess.Popen([sys.executable, str(HERE / "sdk_limits_worker_proc.py"), address, "4",
                                           str(state)]))
        return state

    yield start
    codes = []
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            codes.append(proc.wait(30))
        except subprocess.TimeoutExpired:
            proc.kill()
            codes.append(proc.wait())
    assert codes == [0] * len(procs), f"worker exit codes {codes}"


async def wait_all(client: Client, run_ids: list[str]) -> list[Any]:
    runs = await asyncio.gather(*(client.wait(r, timeout=DEADLINE) for r in run_ids))
    assert [r.state for r in runs] == ["completed"] * len(run_ids), [(r.id, r.state) for r in runs]
    return runs


# -- the calls ---------------------------------------------------------------------------------


async def test_set_get_list_and_delete_a_limit(client: Client) -> None:
    made = await client.set_limit("per-tenant", max_running=2, kinds=["sync"], key_path="input.tenant",
                                  weights={"gold": 3})
    assert (made.name, made.max_running, made.rate, made.period, made.strategy, made.scope) == (
        "per-tenant", 2, None, None, "queue", "steps")
    assert (made.kinds, made.key_path, made.weights, made.keys) == (["sync"], "input.tenant", {"gold": 3}, [])
    assert made.created_at is not None and made.updated_at is not None
    changed = await client.set_limit("per-tenant", max_running=3, rate=10, period=1.5, kinds=["sync"],
                                     key_path="tenant", strategy="cancel_newest")
    assert (changed.max_running, changed.rate, changed.period, changed.strategy, changed.weights) == (
        3, 10, 1.5, "cancel_newest", {})
    await client.set_limit("api", rate=100, period=60)
    assert [x.name for x in await client.list_limits()] == ["api", "per-tenant"]
    assert (await client.get_limit("api")).period == 60.0
    await client.delete_limit("api")
    assert [x.name for x in await client.list_limits()] == ["per-tenant"]
    for call in (client.get_limit("api"), client.delete_limit("api")):
        with pytest.raises(CycloneClientError) as e:
            await call
        assert e.value.code == grpc.StatusCode.NOT_FOUND and "api" in e.value.message


@pytest.mark.parametrize(("settings", "field"), [
    ({"max_running": 0, "rate": 5}, "limit.period"),
    ({"rate": 5, "period": 0.5}, "limit.period"),
    ({"strategy": "cancel_oldest"}, "limit.strategy"),
    ({"scope": "runs"}, "limit.workflows"),
    ({"key": "a", "key_path": "input.t"}, "limit.key_path"),
    ({"weights": {"a": 0}}, "limit.weights"),
])
async def test_a_bad_limit_is_invalid_argument_naming_the_field(client: Client, settings: dict[str, Any],
                                                                 field: str) -> None:
    with pytest.raises(CycloneClientError) as e:
        await client.set_limit("bad", **settings)
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT and field in e.value.message


async def test_nodes_and_jobs_consume_the_limits_they_name_and_steps_say_what_holds_them(client: Client) -> None:
    await client.set_limit("db", max_running=1)
    info = await client.register(Workflow("report").task("query", limits=[LimitUse("db", key_path="input.region")]))
    assert info.nodes[0]["limits"] == [{"limit": "db", "key": "", "key_path": "input.region"}]
    first = await client.submit("report", {"region": "eu"})
    second = await client.submit("report", {"region": "eu"})
    [job] = await client.enqueue_many([Job("export", {"n": 1}, limits=[LimitUse("db", key="us")])])
    single = await client.enqueue("export", {"n": 2}, limits=[LimitUse("db", key="us")])
    assert (await client.get(first)).step("query").limits == ["db=eu"]
    assert [(await client.get(r)).steps[0].limits for r in (job, single)] == [["db=us"], ["db=us"]]

    gate = asyncio.Event()
    worker = Worker(client.address, slots=4)

    @worker.handler("query")
    async def query(ctx: Context) -> None:
        await gate.wait()  # keeps its slot of db=eu until the test lets it go

    async def held_by() -> str:
        steps = [(await client.get(r)).step("query") for r in (first, second)]
        states = sorted(s.state for s in steps)
        return next((s.held_by for s in steps if s.held_by), "") if states == ["available", "running"] else ""

    async with worker:
        assert await until(held_by, what="one query running, the other held") == "limit db key eu: 1/1 running"
        gate.set()
        await wait_all(client, [first, second])

    with pytest.raises(CycloneClientError) as e:
        await client.enqueue("export", limits=[LimitUse("nope")])
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT and 'unknown limit "nope"' in e.value.message
    with pytest.raises(CycloneClientError) as e:
        await client.submit("report", {"other": 1})
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT and "input.region" in e.value.message


async def test_the_server_reports_each_rated_lease_it_pushed(client: Client, db_url: str) -> None:
    """A start against a rate counts from the moment the server wrote its lease to the worker's
    stream (docs/flow-control.md): each start of a rated step is marked pushed, and a step of
    the same worker without a rate leaves nothing to report."""
    await client.set_limit("calls", rate=5, period=60, kinds=["rated_call"])
    worker = Worker(client.address, slots=2)

    @worker.handler("rated_call")
    async def rated_call(ctx: Context) -> None:
        pass

    @worker.handler("plain_call")
    async def plain_call(ctx: Context) -> None:
        pass

    async with worker:
        runs = [await client.enqueue("rated_call", {"n": 1}), await client.enqueue("plain_call", {"n": 2})]
        await wait_all(client, runs)

        async def pushed() -> list[tuple[Any, ...]]:
            async with await psycopg.AsyncConnection.connect(db_url) as c:
                rows = await (await c.execute(
                    "SELECT s.run_id::text, d.pushed, d.at >= s.started_at FROM cyclone_limit_starts d "
                    "JOIN cyclone_steps s ON s.id = d.step_id")).fetchall()
            return rows if rows and all(p for _, p, _ in rows) else []
        assert await until(pushed, what="the rated start marked pushed") == [(runs[0], True, True)]


async def test_a_workflow_declares_the_limit_of_its_runs_when_registered(client: Client) -> None:
    wf = (Workflow("ingest").task("pull").task("load", deps=["pull"])
          .limit_runs("ingest-per-account", max_running=1, key_path="input.account"))
    await client.register(wf)
    limit = await client.get_limit("ingest-per-account")
    assert (limit.scope, limit.workflows, limit.max_running, limit.key_path) == (
        "runs", ["ingest"], 1, "input.account")
    first = await client.submit("ingest", {"account": 7})
    second = await client.submit("ingest", {"account": 7})
    seen: list[tuple[str, str]] = []
    worker = Worker(client.address, slots=4)
    for kind in ("pull", "load"):
        worker.register(kind, lambda ctx: seen.append((ctx.run_id, ctx.node)))
    async with worker:
        await wait_all(client, [first, second])
    # The first run holds the account's slot from its first claim until it ends.
    assert seen == [(first, "pull"), (first, "load"), (second, "pull"), (second, "load")]
    assert (await client.register(wf)).created is False  # the same workflow again; its limit set again


async def test_a_workflow_whose_limit_of_runs_is_refused_is_not_registered(client: Client) -> None:
    """Its limits are set before the workflow: a refused one leaves nothing runnable uncapped."""
    wf = Workflow("capped").task("a").limit_runs("capped-runs", max_running=-1)
    with pytest.raises(CycloneClientError) as e:
        await client.register(wf)
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT and "max_running" in e.value.message
    with pytest.raises(CycloneClientError) as missing:
        await client.get_workflow("capped")
    assert missing.value.code == grpc.StatusCode.NOT_FOUND


# -- end to end, with worker processes -----------------------------------------------------------


async def test_two_per_tenant_is_reached_and_never_passed_by_worker_processes(
        client: Client, limits_workers: Callable[[str, int], Path]) -> None:
    """Three tenants' jobs on two worker processes of four slots each (eight slots for six
    allowed steps): each tenant's handlers saw two of its steps running at once, never three."""
    await client.set_limit("per-tenant", max_running=2, kinds=["tenant_job"], key_path="input.tenant")
    run_ids = await client.enqueue_many(Job("tenant_job", {"tenant": t, "n": i})
                                        for i in range(8) for t in ("acme", "globex", "initech"))
    state = limits_workers(client.address, 2)

    async def over_cap() -> None:  # the server's side, while the work goes on
        while True:
            for k in (await client.get_limit("per-tenant")).keys:
                assert k.running <= 2, k
            await asyncio.sleep(0.05)
    watch = asyncio.create_task(over_cap())
    try:
        await wait_all(client, run_ids)
    finally:
        watch.cancel()
        with pytest.raises(asyncio.CancelledError):
            await watch
    data = json.loads(state.read_text())
    assert data["done"] == len(run_ids)
    assert data["most"] == {"acme": 2, "globex": 2, "initech": 2}
    assert data["now"] == {"acme": 0, "globex": 0, "initech": 0}


async def test_a_rate_limit_per_tenant_holds_in_every_window_of_the_handlers_clocks(
        client: Client, limits_workers: Callable[[str, int], Path]) -> None:
    """2 starts per tenant per second: in the handlers' own start times, any three starts of a
    tenant span at least a second, less a tolerance for where the window boundary falls between
    the server's claim and the handler's start."""
    tolerance = 0.15
    await client.set_limit("calls", rate=2, period=1, kinds=["rate_job"], key_path="input.tenant")
    state = limits_workers(client.address, 2)

    async def connected() -> bool:  # then a handler starts within milliseconds of its claim
        return len(await client.workers("rate_job")) == 2
    await until(connected, what="both worker processes connected")
    run_ids = await client.enqueue_many(Job("rate_job", {"tenant": t, "n": i})
                                        for i in range(5) for t in ("a", "b"))
    await wait_all(client, run_ids)
    starts: dict[str, list[float]] = {}
    for line in Path(f"{state}.starts").read_text().splitlines():
        entry = json.loads(line)
        starts.setdefault(entry["tenant"], []).append(entry["at"])
    assert {t: len(s) for t, s in starts.items()} == {"a": 5, "b": 5}
    for tenant, times in starts.items():
        times.sort()
        for i in range(len(times) - 2):
            assert times[i + 2] - times[i] >= 1 - tolerance, (tenant, times)
    assert (await client.get_limit("calls")).rate == 2


# -- the guide -------------------------------------------------------------------------------------


DOC = ROOT / "docs" / "flow-control.md"
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


async def test_every_python_example_of_the_flow_control_guide_runs(server: Any, tmp_path: Path) -> None:
    """Each ```python block of docs/flow-control.md, in order, as a program against a real server
    (127.0.0.1:7233 becomes its address); each must exit 0."""
    blocks = BLOCK.findall(DOC.read_text())
    assert len(blocks) >= 2
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    for i, code in enumerate(blocks):
        path = tmp_path / f"example_{i}.py"
        path.write_text(code.replace("127.0.0.1:7233", server.address))
        done = await asyncio.to_thread(subprocess.run, [sys.executable, str(path)], cwd=tmp_path, env=env,
                                       capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, f"example {i} failed:\n{code}\n--- output ---\n{done.stdout}\n{done.stderr}"
