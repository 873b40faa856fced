"""Helpers shared by the acceptance tests: polling with a deadline, reading runs, proto durations."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

from google.protobuf import duration_pb2

from cyclone_worker import Client, Run, Step

DEADLINE = 60.0


async def until(cond: Callable[[], Any], what: str, timeout: float = DEADLINE, every: float = 0.05) -> Any:
    """Poll `cond` (sync or async) every `every` seconds until it returns something truthy,
    and return that; fail naming `what` after `timeout` seconds. The one poller of the
    acceptance tests."""
    end = time.monotonic() + timeout
    while True:
        value = cond()
        if isinstance(value, Awaitable):
            value = await value
        if value:
            return value
        if time.monotonic() > end:
            raise AssertionError(f"not within {timeout:g} s: {what}")
        await asyncio.sleep(every)


async def run_when(client: Client, run_id: str, check: Callable[[Run], bool], what: str) -> Run:
    """Poll GetRun until `check(run)` holds; returns that run."""
    seen: list[Run] = []

    async def ok() -> bool:
        seen.append(await client.get(run_id))
        return check(seen[-1])
    await until(ok, what)
    return seen[-1]


def states(run: Run, *nodes: str) -> dict[str, str]:
    """Node -> state, of `nodes` (all of them when none is named)."""
    return {s.node: s.state for s in run.steps if not nodes or s.node in nodes}


def ended(step: Step) -> tuple[str, str, str]:
    """How a step ended: (state, error_kind, reason)."""
    return step.state, step.error_kind, step.reason


def cancelled(run: Run, *nodes: str) -> dict[str, tuple[str, str]]:
    """Node -> (state, cancel_cause) of `nodes`."""
    return {n: (run.step(n).state, run.step(n).cancel_cause) for n in nodes}


def secs(s: float) -> duration_pb2.Duration:
    """`s` seconds as a protobuf Duration (the wire type of timeouts, max_wait and sleep)."""
    d = duration_pb2.Duration()
    d.FromNanoseconds(int(s * 1e9))
    return d
