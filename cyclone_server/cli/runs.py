"""`cyclone runs|workflows|jobs|stats ...`: start, read and steer runs over gRPC, as tables or JSON."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

from google.protobuf.message import Message
from rich.console import Group
from rich.live import Live

from cyclone_proto import admin_pb2, runs_pb2, types_pb2, workflows_pb2
from cyclone_worker.values import to_value

from . import start, workers
from .common import (EXIT_CANCELLED, EXIT_FAILED, EXIT_OK, EXIT_TIMEOUT, EXIT_USAGE, RUN_STATES, UNITS, Client, Leaves,
                     age_arg, duration, json_arg, pb_duration, show)
from .show import (age, console, live_view, payload, run_duration, run_state, run_view, step_change_time, step_info,
                   step_state, table, ts, workflow_view)


async def cmd_runs_list(c: Client, a: argparse.Namespace) -> int:
    req = runs_pb2.ListRunsRequest(states=[types_pb2.RunState.Value(f"RUN_STATE_{s.upper()}") for s in a.state],
                                   workflow=a.workflow or "", limit=a.limit, page_token=a.page_token or "")
    runs: list[types_pb2.Run] = []
    while True:
        resp = await c.runs.ListRuns(req, timeout=c.timeout)
        runs += resp.runs
        if not (a.all and resp.next_page_token):
            break
        req.page_token = resp.next_page_token
    if resp.next_page_token and not a.all and not a.json:
        print(f"(more: --page-token {resp.next_page_token}, or --all)", file=sys.stderr)
    return show(a, runs, table(["RUN ID", "WORKFLOW", "STATE", "CREATED (UTC)", "FINISHED (UTC)", "DURATION"], [
        [r.id, r.workflow or "(job)", run_state(r), ts(r, "created_at"), ts(r, "finished_at"), run_duration(r)]
        for r in runs]))


async def cmd_runs_get(c: Client, a: argparse.Namespace) -> int:
    run = await c.runs.GetRun(runs_pb2.GetRunRequest(run_id=a.run_id), timeout=c.timeout)
    stuck = [workers.no_worker_line(k) for k in await workers.stuck_kinds(c, run)]
    return show(a, run, run_view(run), *workers.details_lines(run), *([""] + stuck if stuck else []))


async def cmd_runs_wait(c: Client, a: argparse.Namespace) -> int:
    return await wait_for_run(c, a, a.run_id)


async def wait_for_run(c: Client, a: argparse.Namespace, run_id: str) -> int:
    """Follow a run until it ends: a live table on a terminal, one line per step change
    otherwise (the server's time of the change first); then every attempt's error, if any.
    A kind of a waiting step that no connected worker runs is named (looked up every 5 s)."""
    live = sys.stdout.isatty() and not a.json
    started, seen = time.monotonic(), {}
    stuck: list[str] = []
    stuck_at = -1e9
    view = Live(console=console(), auto_refresh=False, transient=False) if live else None
    try:
        if view is not None:
            view.start()
        while True:
            run = await c.runs.GetRun(runs_pb2.GetRunRequest(run_id=run_id), timeout=c.timeout)
            now = {s.node: (step_state(s), s.attempt) for s in run.steps}
            if time.monotonic() - stuck_at >= 5:
                before, stuck, stuck_at = stuck, await workers.stuck_kinds(c, run), time.monotonic()
                if view is None and not a.json:
                    for kind in sorted(set(stuck) - set(before)):
                        print(f"cyclone: {workers.no_worker_line(kind)}", file=sys.stderr, flush=True)
            if view is not None:
                view.update(Group(live_view(run), *map(workers.no_worker_line, stuck)), refresh=True)
            elif not a.json:
                for s in run.steps:
                    if now[s.node] != seen.get(s.node):
                        before = seen.get(s.node, ("", 0))[0]
                        print(f"{step_change_time(s)}  {s.node}  {before + ' -> ' if before else ''}"
                              f"{step_state(s)}  attempt {s.attempt}  {step_info(s)}".rstrip(), flush=True)
            seen = now
            state = run_state(run)
            if state in ("completed", "failed", "cancelled"):
                break
            if a.timeout is not None and time.monotonic() - started >= a.timeout:
                print(f"run {run.id} is still {state} after {age(a.timeout)}", file=sys.stderr)
                return EXIT_TIMEOUT
            await asyncio.sleep(a.interval)
    finally:
        if view is not None:
            view.stop()
    errors = [f"  {s.node} attempt {e.attempt} at {ts(e, 'at')}: {e.error_kind}: {e.message}"
              for s in run.steps for e in s.errors]
    result = f"; result {payload(run.result)[:200]}" if run.HasField("result") else ""
    show(a, run, f"run {run.id} {state} after {run_duration(run)}{result}",
         *(["errors, every attempt:", *errors] if errors else []))
    return {"completed": EXIT_OK, "failed": EXIT_FAILED}.get(state, EXIT_CANCELLED)


def _action(rpc: str, make: Callable[[argparse.Namespace], Message], past: str) -> Callable[..., Awaitable[int]]:
    async def cmd(c: Client, a: argparse.Namespace) -> int:
        resp = await getattr(c.runs, rpc)(make(a), timeout=c.timeout)
        note = "" if resp.applied else " (no change: it already was)"
        return show(a, resp, f"run {resp.run.id}: {past}{note}; state {run_state(resp.run)}")
    return cmd


def _deadline(a: argparse.Namespace) -> dict[str, Any]:
    return {"deadline_in": pb_duration(a.deadline_in)} if a.deadline_in else {}


async def cmd_runs_signal(c: Client, a: argparse.Namespace) -> int:
    resp = await c.runs.Signal(runs_pb2.SignalRequest(run_id=a.run_id, name=a.name,
                                                      payload=to_value(a.payload, "--payload")),
                               timeout=c.timeout)
    where = f"consumed by step {resp.consumed_by_step_id}" if resp.consumed_by_step_id else "kept in the mailbox"
    return show(a, resp, f"signal {resp.signal_id}: {where}")


async def cmd_runs_purge(c: Client, a: argparse.Namespace) -> int:
    older_than = pb_duration(a.older_than)
    unit = next(u for u in ("d", "h", "m", "s") if u == "s" or a.older_than and a.older_than % UNITS[u] == 0)
    what = f"terminal runs that ended more than {a.older_than / UNITS[unit]:g}{unit} ago"
    if a.dry_run or not a.yes:
        resp = await c.runs.PurgeTerminalRuns(runs_pb2.PurgeTerminalRunsRequest(
            older_than=older_than, dry_run=True), timeout=c.timeout)
        eligible = resp.eligible
        batch = "" if a.all or eligible <= a.limit else f" (this call deletes {a.limit}; --all for every one)"
        if a.dry_run:
            print(json.dumps({"eligible": eligible}) if a.json else f"would delete {eligible} {what}{batch}")
            return EXIT_OK
        if eligible == 0:
            print(json.dumps({"deleted": 0}) if a.json else f"deleted 0 {what}")
            return EXIT_OK
        if not sys.stdin.isatty():
            print(f"cyclone: {eligible} {what} would be deleted; confirm with --yes (stdin is not a terminal "
                  "to ask on)", file=sys.stderr)
            return EXIT_USAGE
        answer = await asyncio.to_thread(input, f"Delete {eligible} {what}{batch}? [y/N] ")
        if answer.strip().lower() not in ("y", "yes"):
            print("nothing deleted", file=sys.stderr)
            return EXIT_USAGE
    total = 0
    while True:  # bounded batches: each call is one short statement
        resp = await c.runs.PurgeTerminalRuns(runs_pb2.PurgeTerminalRunsRequest(
            older_than=older_than, limit=a.limit), timeout=c.timeout)
        total += resp.deleted
        if not a.all or resp.deleted < a.limit:
            break
    print(json.dumps({"deleted": total}) if a.json else f"deleted {total} {what}")
    return EXIT_OK


async def cmd_workflows_register(c: Client, a: argparse.Namespace) -> int:
    resp = await c.workflows.RegisterWorkflow(start.workflow_request(a.file), timeout=c.timeout)
    w = resp.workflow
    note = "registered" if resp.created else "unchanged (the same definition is already registered)"
    return show(a, resp, f"workflow {w.name} v{w.version}: {note}; {len(w.nodes)} nodes")


async def cmd_runs_submit(c: Client, a: argparse.Namespace) -> int:
    resp = await c.runs.SubmitRun(start.submit_request(a), timeout=c.timeout)
    return await _started(c, a, resp, f"run {resp.run_id} of {a.workflow}")


async def cmd_jobs_enqueue(c: Client, a: argparse.Namespace) -> int:
    resp = await c.runs.Enqueue(start.enqueue_request(a), timeout=c.timeout)
    return await _started(c, a, resp, f"job {resp.run_id} ({a.kind})")


async def _started(c: Client, a: argparse.Namespace, resp: Message, what: str) -> int:
    note = "started" if resp.created else "already exists (same idempotency key); not started again"  # type: ignore[attr-defined]
    if not a.wait:
        return show(a, resp, f"{what}: {note}")
    if not a.json:
        print(f"{what}: {note}", flush=True)
    return await wait_for_run(c, a, resp.run_id)  # type: ignore[attr-defined]


async def cmd_workflows_list(c: Client, a: argparse.Namespace) -> int:
    resp = await c.workflows.ListWorkflows(workflows_pb2.ListWorkflowsRequest(
        name_prefix=a.prefix, all_versions=a.all_versions), timeout=c.timeout)
    return show(a, list(resp.workflows), table(["NAME", "VERSION", "NODES", "REGISTERED (UTC)"], [
        [w.name, w.version, len(w.nodes), ts(w, "created_at")] for w in resp.workflows]))


async def cmd_workflows_get(c: Client, a: argparse.Namespace) -> int:
    w = await c.workflows.GetWorkflow(workflows_pb2.GetWorkflowRequest(name=a.name, version=a.version),
                                      timeout=c.timeout)
    return show(a, w, *workflow_view(w))


async def cmd_stats(c: Client, a: argparse.Namespace) -> int:
    resp = await c.admin.GetStats(admin_pb2.GetStatsRequest(), timeout=c.timeout)
    # AVAILABLE is the backlog (claimable now); SCHEDULED waits for a later scheduled_at.
    # WORKERS: connected workers that run the kind; NONE when its steps wait for one.
    missing = [workers.no_worker_line(k) for k in workers.kinds_without_workers(resp)]
    return show(a, resp, table(["KIND", "AVAILABLE", "SCHEDULED", "RUNNING", "OLDEST AVAILABLE", "WORKERS",
                                "FREE SLOTS"], [
        [k.kind, k.available, k.scheduled, k.running, age(k.oldest_available_age.ToTimedelta().total_seconds()),
         "NONE" if k.no_workers else k.workers, k.free_slots]
        for k in resp.kinds]), *([""] + missing if missing else []))



def register(subparsers: argparse._SubParsersAction, leaf: Leaves) -> None:  # type: ignore[type-arg]
    """Add `runs`, `workflows`, `jobs` and `stats`."""


    runs = subparsers.add_parser("runs", help="list, inspect and steer runs").add_subparsers(
        dest="runs_command", required=True, metavar="COMMAND")
    p = leaf(runs, "list", cmd_runs_list, "list runs, newest first")
    p.add_argument("--state", action="append", choices=RUN_STATES, default=[],
                   help="only runs in this state; repeat for several (default: any)")
    p.add_argument("--workflow", help="only runs of this workflow (default: any, and jobs)")
    p.add_argument("--limit", type=int, default=20, help="runs per page")
    p.add_argument("--page-token", help="the page after the one that printed this token (default: the first)")
    p.add_argument("--all", action="store_true", help="follow pages to the end")
    leaf(runs, "get", cmd_runs_get, "a run with its steps and every attempt's error", "run_id")
    p = leaf(runs, "wait", cmd_runs_wait, "follow a run's steps live until it ends", "run_id")
    p.add_argument("--timeout", type=duration, help="give up after this long (exit 5); default never")
    p.add_argument("--interval", type=duration, default=0.5, help=argparse.SUPPRESS)
    for name, rpc, req, past in (("cancel", "CancelRun", runs_pb2.CancelRunRequest, "cancelled"),
                                 ("pause", "PauseRun", runs_pb2.PauseRunRequest, "paused"),
                                 ("resume", "ResumeRun", runs_pb2.ResumeRunRequest, "resumed")):
        leaf(runs, name, _action(rpc, lambda a, req=req: req(run_id=a.run_id), past), f"{name} a run ({rpc})",
             "run_id")
    p = leaf(runs, "retry", _action("RetryStep", lambda a: runs_pb2.RetryStepRequest(
        run_id=a.run_id, node=a.node, **_deadline(a)), "retried"), "reopen one discarded node (RetryStep)",
        "run_id", "node")
    p.add_argument("--deadline-in", type=duration, help="new run deadline from now (needed after a deadline)")
    p = leaf(runs, "retry-all", _action("RetryAll", lambda a: runs_pb2.RetryAllRequest(
        run_id=a.run_id, **_deadline(a)), "retried"), "reopen every discarded node (RetryAll)", "run_id")
    p.add_argument("--deadline-in", type=duration, help="new run deadline from now (needed after a deadline)")
    p = leaf(runs, "signal", cmd_runs_signal, "send a signal to a run's mailbox", "run_id",
             "name=the signal's name")
    p.add_argument("--payload", type=json_arg, default=None, help="JSON payload (default null)")
    p = leaf(runs, "purge", cmd_runs_purge, "delete terminal runs that ended long enough ago (asks first)")
    p.add_argument("--older-than", type=age_arg, required=True, metavar="AGE",
                   help="with a unit: 30d, 12h, 45m, 90s (a bare number is refused); a run is also kept "
                        "until its own retention has passed")
    p.add_argument("--limit", type=int, default=1000, help="runs deleted per call (default 1000)")
    p.add_argument("--all", action="store_true", help="repeat until nothing eligible is left (default: one call)")
    p.add_argument("--dry-run", action="store_true", help="only count the runs that would be deleted")
    p.add_argument("--yes", "-y", action="store_true", help="do not ask for confirmation (needed when stdin "
                   "is not a terminal)")

    wf = subparsers.add_parser("workflows", help="register and read workflow definitions").add_subparsers(
        dest="workflows_command", required=True, metavar="COMMAND")
    p = leaf(wf, "register", cmd_workflows_register, "register a workflow from a JSON or YAML file "
             "(RegisterWorkflowRequest: name, nodes)", "file")
    p = leaf(wf, "list", cmd_workflows_list, "registered workflows (latest versions)")
    p.add_argument("--prefix", default="", help="only names starting with this")
    p.add_argument("--all-versions", action="store_true", help="every version, not only the latest")
    p = leaf(wf, "get", cmd_workflows_get, "one workflow definition", "name")
    p.add_argument("--version", type=int, default=0, help="default: the latest")
    leaf(subparsers, "stats", cmd_stats, "backlog per step kind (Admin/GetStats)")

    p = leaf(runs, "submit", cmd_runs_submit, "start a run of a registered workflow", "workflow")
    p.add_argument("--version", type=int, default=0, help="the workflow version; 0 = the latest")
    start.add_start_options(p, duration)
    jobs = subparsers.add_parser("jobs", help="enqueue standalone jobs").add_subparsers(
        dest="jobs_command", required=True, metavar="COMMAND")
    p = leaf(jobs, "enqueue", cmd_jobs_enqueue, "enqueue one job: a run of a single task of this kind", "kind")
    start.add_start_options(p, duration)
    start.add_job_options(p, duration)




__all__ = ["register", "wait_for_run"]
