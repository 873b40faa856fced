"""Reads are snapshots (docs/lifecycle.md): GetRun, ListRuns with steps and WaitRun never show a
run whose state contradicts its steps, however transitions race with them.

Writers drive runs through completions, pauses, fail-fast and child runs while readers
poll the runs being driven in a tight loop; every answer must be a state that existed.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import grpc
import pytest
from engine_helpers import task
from google.protobuf import duration_pb2

from cyclone_server import convert
from cyclone_server.serve.app import CycloneServer
from cyclone_server.serve.settings import Settings
from cyclone_server.store.engine import Engine
from cyclone_proto import runs_pb2, runs_pb2_grpc, types_pb2

pytestmark = pytest.mark.statemachine

WRITERS = 4
ROUNDS = 10  # of each scenario, per writer
TERMINAL_STEPS = frozenset({"completed", "discarded", "cancelled"})
TERMINAL_RUNS = frozenset({"completed", "failed", "cancelled"})


def contradiction(run_state: str, steps: Iterable[tuple[str, str]]) -> str | None:
    """What is impossible about a run in `run_state` with these (node, step state) pairs, or
    None. The workflows here declare no CancelBranch, so no discard is contained."""
    states = [s for _, s in steps]
    if not states:
        return "no steps"
    active = [s for s in states if s not in TERMINAL_STEPS]
    if run_state in TERMINAL_RUNS and active:
        return f"{run_state} run with non-terminal steps {active}"
    if run_state in ("running", "paused") and not active:
        return f"{run_state} run whose steps are all terminal {states}"
    if run_state == "completed" and any(s != "completed" for s in states):
        return f"completed run with steps {states}"
    if run_state == "failed" and "discarded" not in states:
        return f"failed run without a discarded step {states}"
    if run_state == "running" and "paused" in states:
        return f"running run with a paused step {states}"
    if run_state == "paused" and any(s == "available" or s.startswith("waiting_") for s in states):
        return f"paused run with steps {states}"
    return None


@dataclass
class Board:
    """What the writers are driving, and what the readers saw."""

    current: list[str] = field(default_factory=list)  # a run id per writer: the one it is driving
    done: bool = False
    reads: int = 0  # answers that showed a run not yet ended
    seen: list[str] = field(default_factory=list)  # the contradictions, with the run

    def check(self, how: str, run_id: str, run_state: str, steps: Iterable[tuple[str, str]]) -> None:
        if run_state not in TERMINAL_RUNS:
            self.reads += 1
        problem = contradiction(run_state, steps)
        if problem is not None:
            self.seen.append(f"{how} {run_id}: {problem}")


async def claim(engine: Engine, kind: str) -> dict[str, Any]:
    leases = await engine.claim("w", [kind], limit=1, lease_ttl=60)
    assert len(leases) == 1, (kind, leases)
    return leases[0]


async def complete(engine: Engine, kind: str) -> None:
    lease = await claim(engine, kind)
    assert await engine.complete(str(lease["step_id"]), lease["lease_generation"], {"k": kind}) == "applied"


async def writer(engine: Engine, board: Board, w: int) -> None:
    """Drive ROUNDS runs of each scenario; kinds are the writer's own, so claims take its steps."""
    x, y, z = f"x{w}", f"y{w}", f"z{w}"
    await engine.register_workflow(f"chain{w}", [task(x), task(y, x)])
    await engine.register_workflow(f"pair{w}", [task(x), task(y)])
    await engine.register_workflow(f"leaf{w}", [task(z)])
    await engine.register_workflow(f"parent{w}", [task("kid", type="child", workflow=f"leaf{w}")])

    async def submit(workflow: str) -> str:
        run_id, _ = await engine.submit_run(workflow)
        board.current[w] = run_id
        return run_id

    for i in range(ROUNDS):
        # Completions: x then y; the run completes with y.
        await submit(f"chain{w}")
        await complete(engine, x)
        await complete(engine, y)
        # Pauses: x paused while available, running through a pause, y promoted at resume.
        run_id = await submit(f"chain{w}")
        await engine.pause_run(run_id)
        await engine.resume_run(run_id)
        lease = await claim(engine, x)
        await engine.pause_run(run_id)
        await engine.complete(str(lease["step_id"]), lease["lease_generation"], None)
        await engine.resume_run(run_id)
        await complete(engine, y)
        # Fail-fast: x discarded, running y cancelled, the run failed, in one transaction.
        await submit(f"pair{w}")
        lx, ly = await claim(engine, x), await claim(engine, y)
        assert await engine.fail(str(lx["step_id"]), lx["lease_generation"], "no", permanent=True) == "discarded"
        assert await engine.fail(str(ly["step_id"]), ly["lease_generation"], "late") != "applied"
        # A child run: its end settles the parent's only node, and the parent with it.
        parent = await submit(f"parent{w}")
        lz = await claim(engine, z)
        if i % 2:
            await engine.complete(str(lz["step_id"]), lz["lease_generation"], None)
        else:
            await engine.fail(str(lz["step_id"]), lz["lease_generation"], "no", permanent=True)
        while (await engine.get_run(parent, steps=False))["state"] == "running":
            await engine.settle_children()


async def race(engine: Engine, readers: list[Callable[[Board, random.Random], Awaitable[None]]]) -> Board:
    board = Board(current=[""] * WRITERS)
    rng = random.Random(10)

    async def read_until_done(read: Callable[[Board, random.Random], Awaitable[None]]) -> None:
        while not board.done:
            await read(board, rng)
            await asyncio.sleep(0)  # let the writers run on this one event loop

    async def write_all() -> None:
        try:
            await asyncio.gather(*(writer(engine, board, w) for w in range(WRITERS)))
        finally:
            board.done = True

    await asyncio.gather(write_all(), *(read_until_done(r) for r in readers))
    return board


def _pick(board: Board, rng: random.Random) -> str | None:
    ids = [r for r in board.current if r]
    return rng.choice(ids) if ids else None


async def test_engine_reads_show_a_run_and_its_steps_at_one_moment(engine: Engine, db_url: str) -> None:
    reader_engine = await Engine.open(db_url, min_size=2, max_size=4)

    async def get_run(board: Board, rng: random.Random) -> None:
        run_id = _pick(board, rng)
        if run_id is not None:
            run = await reader_engine.get_run(run_id)
            board.check("get_run", run_id, run["state"], ((s["node"], s["state"]) for s in run["steps"]))

    async def list_runs(board: Board, rng: random.Random) -> None:
        for run in await reader_engine.list_runs(limit=2 * WRITERS, steps=True):
            board.check("list_runs", str(run["id"]), run["state"], ((s["node"], s["state"]) for s in run["steps"]))

    try:
        board = await race(engine, [get_run, get_run, list_runs])
    finally:
        await reader_engine.close()
    assert board.seen == []
    assert board.reads >= 100, board.reads  # the readers did see runs in motion


def _proto_steps(run: types_pb2.Run) -> list[tuple[str, str]]:
    return [(s.node, convert.STEP_STATE_NAMES[s.state]) for s in run.steps]


async def test_rpc_reads_show_a_run_and_its_steps_at_one_moment(engine: Engine, db_url: str) -> None:
    server = CycloneServer(Settings(database_url=db_url, listen="127.0.0.1:0", migrate=False, sweep_interval=0.2))
    await server.start()
    channel = grpc.aio.insecure_channel(server.address)
    stub = runs_pb2_grpc.RunsStub(channel)

    def check(board: Board, how: str, run: types_pb2.Run) -> None:
        board.check(how, run.id, convert.RUN_STATE_NAMES[run.state], _proto_steps(run))

    async def get_run(board: Board, rng: random.Random) -> None:
        run_id = _pick(board, rng)
        if run_id is not None:
            check(board, "GetRun", await stub.GetRun(runs_pb2.GetRunRequest(run_id=run_id)))

    async def list_runs(board: Board, rng: random.Random) -> None:
        resp = await stub.ListRuns(runs_pb2.ListRunsRequest(limit=2 * WRITERS, include_steps=True))
        for run in resp.runs:
            check(board, "ListRuns", run)

    async def wait_run(board: Board, rng: random.Random) -> None:
        run_id = _pick(board, rng)
        if run_id is not None:  # a short wait: mostly answers with the run still in motion
            resp = await stub.WaitRun(runs_pb2.WaitRunRequest(run_id=run_id,
                                                              timeout=duration_pb2.Duration(nanos=2_000_000)))
            check(board, "WaitRun", resp.run)

    try:
        board = await race(engine, [get_run, list_runs, wait_run])
    finally:
        await channel.close()
        await server.stop()
    assert board.seen == []
    assert board.reads >= 100, board.reads


def test_contradictions_are_recognised() -> None:
    """The checker itself: each impossible answer named in the issue is caught."""
    assert contradiction("running", [("a", "completed"), ("b", "completed")])
    assert contradiction("paused", [("a", "completed")])
    assert contradiction("running", [("kid", "discarded")])
    assert contradiction("running", [("a", "paused")])
    assert contradiction("paused", [("a", "running"), ("b", "available")])
    assert contradiction("failed", [("a", "completed"), ("b", "cancelled")])
    assert contradiction("completed", [("a", "completed"), ("b", "running")])
    assert contradiction("running", [("a", "completed"), ("b", "pending")]) is None
    assert contradiction("paused", [("a", "running"), ("b", "pending")]) is None
    assert contradiction("failed", [("a", "discarded"), ("b", "cancelled")]) is None

