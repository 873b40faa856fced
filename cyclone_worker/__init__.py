"""Cyclone's Python SDK: the worker runtime, the workflow builder and the client.

Example::

    from cyclone_worker import Client, Context, Worker, Workflow

    worker = Worker("127.0.0.1:7233")

    @worker.handler("greet")
    async def greet(ctx: Context) -> dict:
        return {"greeting": f"hello {ctx.input['name']}"}

    async with Client("127.0.0.1:7233") as client:
        await client.register(Workflow("hello").task("greet"))
        run_id = await client.submit("hello", {"name": "Ada"})
"""

from ._client import Client
from ._job import Job
from ._context import CancelFlag, CompletionTx, Context
from ._logging import StepLogFilter
from ._errors import (CycloneClientError, CycloneError, Fenced, HandlerError, Permanent, RetryAfter, RunCancelled,
                      RunFailed, Snooze)
from ._limits import Limit, LimitKeyStats, LimitUse
from ._models import TERMINAL_RUN_STATES, KindStats, Run, Step, StepError, WorkerInfo, WorkflowInfo
from ._schedules import Schedule, ScheduleRun
from ._worker import Handler, Reconnect, Worker
from ._workflow import CancelBranch, FailRun, Workflow

__all__ = [
    "Worker", "Reconnect", "Handler", "Context", "CancelFlag", "CompletionTx", "StepLogFilter",
    "Workflow", "CancelBranch", "FailRun",
    "Client", "Job", "Run", "Step", "StepError", "WorkflowInfo", "KindStats", "WorkerInfo", "TERMINAL_RUN_STATES",
    "CycloneError", "HandlerError", "Permanent", "RetryAfter", "Snooze", "Fenced", "CycloneClientError",
    "RunFailed", "RunCancelled",
    "Schedule", "ScheduleRun",
    "LimitUse", "Limit", "LimitKeyStats",
]
