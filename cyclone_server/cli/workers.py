"""What the operator's command line shows of the inside: `cyclone workers list`, kinds no
connected worker runs (for `runs get/wait` and `stats`), and failures with their details.

Registered from cli/main.py with the shared connection options of cli/common.py.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence

import grpc

from cyclone_proto import admin_pb2, types_pb2

from .common import Client, Leaves, show
from .show import age, table, ts

# Steps in these states wait for a worker of their kind.
_WAITING_FOR_WORKER = (types_pb2.STEP_STATE_AVAILABLE,)


def no_worker_line(kind: str) -> str:
    return f"no connected worker runs kind `{kind}`"


async def cmd_workers_list(c: Client, a: argparse.Namespace) -> int:
    resp = await c.admin.ListWorkers(admin_pb2.ListWorkersRequest(kind=a.kind or ""), timeout=c.timeout)
    now = time.time()
    rows = [[w.worker_id, w.sdk, ",".join(w.kinds), w.slots, w.leases_held, w.server_id,
             ts(w, "connected_since"),
             age(max(0.0, now - w.last_heartbeat.ToDatetime().timestamp())) + " ago"
             if w.HasField("last_heartbeat") else ""] for w in resp.workers]
    return show(a, list(resp.workers), table(
        ["WORKER", "SDK", "KINDS", "SLOTS", "LEASES", "SERVER", "CONNECTED (UTC)", "HEARTBEAT"], rows))


def kinds_without_workers(stats: admin_pb2.GetStatsResponse) -> list[str]:
    return [k.kind for k in stats.kinds if k.no_workers]


async def stuck_kinds(c: Client, run: types_pb2.Run) -> list[str]:
    """The kinds of the run's steps waiting to be claimed that no connected worker runs.
    Empty when GetStats is not allowed (a token without the admin role) or fails."""
    waiting = {s.kind for s in run.steps if s.state in _WAITING_FOR_WORKER}
    if not waiting:
        return []
    try:
        stats = await c.admin.GetStats(admin_pb2.GetStatsRequest(), timeout=c.timeout)
    except grpc.aio.AioRpcError:
        return []
    return sorted(waiting & set(kinds_without_workers(stats)))


def details_lines(run: types_pb2.Run) -> list[str]:
    """The details (say, the traceback) of each step's latest failure that has some; the
    error of every attempt is in the run's own view (show.run_view)."""
    lines: list[str] = []
    for s in run.steps:
        last = next((e for e in reversed(s.errors) if e.details), None)
        if last is not None:
            lines += ["", f"details of {s.node} attempt {last.attempt} ({last.error_kind}):"]
            lines += ["    " + line for line in last.details.rstrip("\n").splitlines()]
    return lines


def register(subparsers: argparse._SubParsersAction, leaf: Leaves) -> None:  # type: ignore[type-arg]
    """Add `workers list`."""
    workers = subparsers.add_parser("workers", help="connected workers").add_subparsers(
        dest="workers_command", required=True, metavar="COMMAND")
    p = leaf(workers, "list", cmd_workers_list,
             "workers connected to any server of the database (Admin/ListWorkers)")
    p.add_argument("--kind", help="only workers that run this step kind")


__all__: Sequence[str] = ["register", "stuck_kinds", "details_lines", "kinds_without_workers", "no_worker_line"]
