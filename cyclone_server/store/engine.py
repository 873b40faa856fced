"""The engine: Cyclone's state machine as Python calls, one transaction per transition.

`Engine` is the store's one face to the rest of the server, made of one part per concern:
runs (runs.py), steps and leases (steps.py), reads (reads.py), schedules (schedules.py),
the workers registry (workers.py) and limits (limits.py), over the pool and named statements of core.py.
"""

from __future__ import annotations

from .limits import LimitStore
from .reads import ReadStore
from .runs import RunStore
from .schedules import ScheduleStore
from .steps import StepStore
from .workers import WorkerStore


class Engine(RunStore, StepStore, ReadStore, ScheduleStore, WorkerStore, LimitStore):
    """Every transition of the lifecycle (docs/lifecycle.md), over a connection pool.

    Example::

        engine = await Engine.open("postgresql://localhost/cyclone")
        run_id, _ = await engine.submit_run("etl", input={"day": "2026-12-01"})
        leases = await engine.claim("worker-1", ["extract"], limit=10)
    """


__all__ = ["Engine"]
