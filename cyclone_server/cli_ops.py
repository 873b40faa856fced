"""The operator's command line: `cyclone runs|workflows|stats ...` over gRPC, as tables or JSON.

Every command is one call of the public API (the raw stubs of cyclone_proto), so
whatever it shows, a script can get with grpcurl too. Exit codes: 0 success, 1 an RPC
failed (the status and message go to stderr), 2 bad arguments; `runs wait` also returns
3 when the run failed, 4 when it was cancelled, 5 when --timeout passed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from datetime import timezone
from typing import Any

import grpc
from google.protobuf import duration_pb2, json_format, struct_pb2
from google.protobuf.message import Message

from cyclone_proto import (admin_pb2, admin_pb2_grpc, runs_pb2, runs_pb2_grpc, types_pb2, workflows_pb2,
                                   workflows_pb2_grpc)

from .auth import SecurityConfigError, open_channel

DEFAULT_ADDRESS = "127.0.0.1:7233"
EXIT_OK, EXIT_RPC, EXIT_USAGE, EXIT_FAILED, EXIT_CANCELLED, EXIT_TIMEOUT = 0, 1, 2, 3, 4, 5
RUN_STATES = ["running", "paused", "completed", "failed", "cancelled"]
STEP_HEADER = ["NODE", "KIND", "TYPE", "STATE", "ATTEMPT", "RECLAIMS", "INFO"]
_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}


class Client:
    """The stubs over one channel, with the per-call deadline."""

    def __init__(self, channel: grpc.aio.Channel, rpc_timeout: float) -> None:
        self.runs, self.timeout = runs_pb2_grpc.RunsStub(channel), rpc_timeout
        self.workflows, self.admin = workflows_pb2_grpc.WorkflowsStub(channel), admin_pb2_grpc.AdminStub(channel)


# -- formatting ----------------------------------------------------------------------------

def duration(text: str) -> float:
    """'90', '1.5s', '250ms', '5m', '1h30m', '7d' -> seconds."""
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)?", text.strip())
    if not text.strip() or "".join(n + u for n, u in parts) != text.strip():
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration like 30s, 5m, 2h or 7d")
    return sum(float(n) * _UNITS[u or "s"] for n, u in parts)


def age(text: str) -> float:
    """'30d', '12h', '45m', '90s', '1h30m' -> seconds; a bare number is an error (30 what?)."""
    value = text.strip()
    if re.fullmatch(r"\d+(?:\.\d+)?", value):
        raise argparse.ArgumentTypeError(f"{text!r} has no unit: write {value}d, {value}h, {value}m or {value}s")
    if not re.fullmatch(r"(?:\d+(?:\.\d+)?(?:d|h|m|s))+", value):
        raise argparse.ArgumentTypeError(f"{text!r} is not an age like 30d, 12h, 45m or 90s")
    return duration(value)


def _json_arg(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"not valid JSON: {e}") from None


def _pb_duration(seconds: float) -> duration_pb2.Duration:
    return duration_pb2.Duration(seconds=int(seconds), nanos=int(round(seconds % 1 * 1e9)))


def _state(enum: Any, value: int, prefix: str) -> str:
    return enum.Name(value)[len(prefix):].lower() if value in enum.values() else str(value)


def run_state(run: types_pb2.Run) -> str:
    return _state(types_pb2.RunState, run.state, "RUN_STATE_")


def step_state(step: types_pb2.Step) -> str:
    return _state(types_pb2.StepState, step.state, "STEP_STATE_")


def _ts(msg: Message, field: str) -> str:
    ts = getattr(msg, field)
    return ts.ToDatetime(tzinfo=timezone.utc).strftime("%Y-%m-%d %H:%M:%S") if msg.HasField(field) else "-"


def _age(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f}s"
    m, s = divmod(int(seconds), 60)
    return f"{m}m{s:02d}s" if m < 60 else f"{m // 60}h{m % 60:02d}m"


def table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    cells = [list(header)] + [["-" if c in ("", None) else str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells]


def as_json(msg: Message | list[Message]) -> str:
    one = lambda m: json_format.MessageToDict(m, preserving_proto_field_name=True)  # noqa: E731
    return json.dumps([one(m) for m in msg] if isinstance(msg, list) else one(msg), indent=2, ensure_ascii=False)


def show(a: argparse.Namespace, msg: Message | list[Message], lines: Sequence[str]) -> int:
    """Print `msg` as JSON with --json, else the human `lines`."""
    print(as_json(msg) if a.json else "\n".join(lines))
    return EXIT_OK


def _step_info(s: types_pb2.Step) -> str:
    state = step_state(s)
    if state == "discarded":
        last = s.errors[-1].message if s.errors else ""
        return f"{s.error_kind}" + (f" ({s.reason})" if s.reason else "") + (f": {last[:60]}" if last else "")
    return {"cancelled": f"cause: {s.cancel_cause}", "running": f"worker {s.lease_owner}",
            "completed": f"by {s.lease_owner}" if s.lease_owner else ""}.get(
        state, f"child run {s.child_run_id}" if s.child_run_id else "")


def step_rows(run: types_pb2.Run) -> list[list[Any]]:
    return [[s.node, s.kind, _state(types_pb2.NodeType, s.type, "NODE_TYPE_"), step_state(s),
             f"{s.attempt}/{s.max_attempts}" if s.type == types_pb2.NODE_TYPE_TASK else "", s.reclaims or "",
             _step_info(s)] for s in run.steps]


def run_lines(run: types_pb2.Run) -> list[str]:
    what = f"{run.workflow} v{run.workflow_version}" if run.workflow else "standalone job"
    lines = [f"run       {run.id}  ({what})", f"state     {run_state(run)}",
             f"created   {_ts(run, 'created_at')}   finished {_ts(run, 'finished_at')}"]
    if run.HasField("deadline"):
        lines.append(f"deadline  {_ts(run, 'deadline')}")
    if run.parent_run_id:
        lines.append(f"parent    {run.parent_run_id}")
    if run.HasField("result"):
        lines.append(f"result    {json.dumps(json_format.MessageToDict(run.result), ensure_ascii=False)[:200]}")
    return lines + [""] + table(STEP_HEADER, step_rows(run))


def progress(run: types_pb2.Run, width: int = 20) -> str:
    done = sum(step_state(s) in ("completed", "discarded", "cancelled") for s in run.steps)
    n = max(len(run.steps), 1)
    bar = "#" * (width * done // n) + "-" * (width - width * done // n)
    return f"[{bar}] {done}/{len(run.steps)} steps ended · run {run_state(run)}"


# -- commands ------------------------------------------------------------------------------

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
    return show(a, runs, table(["RUN ID", "WORKFLOW", "STATE", "CREATED (UTC)", "FINISHED (UTC)"], [
        [r.id, r.workflow or "(job)", run_state(r), _ts(r, "created_at"), _ts(r, "finished_at")] for r in runs]))


async def cmd_runs_get(c: Client, a: argparse.Namespace) -> int:
    run = await c.runs.GetRun(runs_pb2.GetRunRequest(run_id=a.run_id), timeout=c.timeout)
    return show(a, run, run_lines(run))


async def cmd_runs_wait(c: Client, a: argparse.Namespace) -> int:
    live, started = sys.stdout.isatty() and not a.json, time.monotonic()
    drawn, seen = 0, {}
    width = shutil.get_terminal_size().columns
    while True:
        run = await c.runs.GetRun(runs_pb2.GetRunRequest(run_id=a.run_id), timeout=c.timeout)
        now = {s.node: (step_state(s), s.attempt) for s in run.steps}
        if live:
            if now != seen or drawn == 0:
                block = [line[:width] for line in [progress(run), *table(STEP_HEADER, step_rows(run))]]
                # Move up over the previous drawing and clear it: the table redraws in place.
                sys.stdout.write((f"\x1b[{drawn}F\x1b[J" if drawn else "") + "\n".join(block) + "\n")
                sys.stdout.flush()
                drawn = len(block)
        elif not a.json:
            for s in run.steps:
                if now[s.node] != seen.get(s.node):
                    before = seen.get(s.node, ("", 0))[0]
                    print(f"{time.strftime('%H:%M:%S')}  {s.node}  {before + ' -> ' if before else ''}"
                          f"{step_state(s)}  attempt {s.attempt}  {_step_info(s)}".rstrip(), flush=True)
        seen = now
        state = run_state(run)
        if state in ("completed", "failed", "cancelled"):
            break
        if a.timeout is not None and time.monotonic() - started >= a.timeout:
            print(f"run {run.id} is still {state} after {_age(a.timeout)}", file=sys.stderr)
            return EXIT_TIMEOUT
        await asyncio.sleep(a.interval)
    show(a, run, [f"run {run.id} {state} after {_age(time.monotonic() - started)}"])
    return {"completed": EXIT_OK, "failed": EXIT_FAILED}.get(state, EXIT_CANCELLED)


def _action(rpc: str, make: Callable[[argparse.Namespace], Message], past: str) -> Callable[..., Awaitable[int]]:
    async def cmd(c: Client, a: argparse.Namespace) -> int:
        resp = await getattr(c.runs, rpc)(make(a), timeout=c.timeout)
        note = "" if resp.applied else " (no change: it already was)"
        return show(a, resp, [f"run {resp.run.id}: {past}{note}; state {run_state(resp.run)}"])
    return cmd


def _deadline(a: argparse.Namespace) -> dict[str, Any]:
    return {"deadline_in": _pb_duration(a.deadline_in)} if a.deadline_in else {}


async def cmd_runs_signal(c: Client, a: argparse.Namespace) -> int:
    payload = json_format.ParseDict(a.payload, struct_pb2.Value())
    resp = await c.runs.Signal(runs_pb2.SignalRequest(run_id=a.run_id, name=a.name, payload=payload),
                               timeout=c.timeout)
    where = f"consumed by step {resp.consumed_by_step_id}" if resp.consumed_by_step_id else "kept in the mailbox"
    return show(a, resp, [f"signal {resp.signal_id}: {where}"])


async def cmd_runs_purge(c: Client, a: argparse.Namespace) -> int:
    older_than = _pb_duration(a.older_than)
    unit = next(u for u in ("d", "h", "m", "s") if u == "s" or a.older_than and a.older_than % _UNITS[u] == 0)
    what = f"terminal runs that ended more than {a.older_than / _UNITS[unit]:g}{unit} ago"
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


async def cmd_workflows_list(c: Client, a: argparse.Namespace) -> int:
    resp = await c.workflows.ListWorkflows(workflows_pb2.ListWorkflowsRequest(
        name_prefix=a.prefix, all_versions=a.all_versions), timeout=c.timeout)
    return show(a, list(resp.workflows), table(["NAME", "VERSION", "NODES", "REGISTERED (UTC)"], [
        [w.name, w.version, len(w.nodes), _ts(w, "created_at")] for w in resp.workflows]))


async def cmd_workflows_get(c: Client, a: argparse.Namespace) -> int:
    w = await c.workflows.GetWorkflow(workflows_pb2.GetWorkflowRequest(name=a.name, version=a.version),
                                      timeout=c.timeout)
    rows = [[n.id, n.kind, _state(types_pb2.NodeType, n.type, "NODE_TYPE_"), ",".join(n.deps),
             n.max_attempts if n.type == types_pb2.NODE_TYPE_TASK else "",
             _state(types_pb2.OnDepFailure, n.on_dep_failure, "ON_DEP_FAILURE_")] for n in w.nodes]
    return show(a, w, [f"workflow  {w.name} v{w.version}  (registered {_ts(w, 'created_at')} UTC)", "",
                       *table(["NODE", "KIND", "TYPE", "DEPS", "MAX ATTEMPTS", "ON DEP FAILURE"], rows)])


async def cmd_stats(c: Client, a: argparse.Namespace) -> int:
    resp = await c.admin.GetStats(admin_pb2.GetStatsRequest(), timeout=c.timeout)
    # AVAILABLE is the backlog (claimable now); SCHEDULED waits for a later scheduled_at.
    return show(a, resp, table(["KIND", "AVAILABLE", "SCHEDULED", "RUNNING", "OLDEST AVAILABLE"], [
        [k.kind, k.available, k.scheduled, k.running, _age(k.oldest_available_age.ToTimedelta().total_seconds())]
        for k in resp.kinds]))


# -- wiring --------------------------------------------------------------------------------

def _runner(cmd: Callable[[Client, argparse.Namespace], Awaitable[int]]) -> Callable[[argparse.Namespace], int]:
    async def go(a: argparse.Namespace) -> int:
        async with open_channel(a.address, token=a.token or None, tls=a.tls, ca_file=a.ca_file,
                                cert_file=a.client_cert, key_file=a.client_key) as channel:
            return await cmd(Client(channel, a.rpc_timeout), a)

    def run(a: argparse.Namespace) -> int:
        try:
            return asyncio.run(go(a))
        except (grpc.aio.AioRpcError, SecurityConfigError) as e:
            rpc_error = isinstance(e, grpc.aio.AioRpcError)
            print(f"cyclone: {e.code().name}: {e.details()}" if rpc_error else f"cyclone: {e}", file=sys.stderr)
            return EXIT_RPC
        except KeyboardInterrupt:
            return 130
    return run


def _common() -> argparse.ArgumentParser:
    env = os.environ.get
    p = argparse.ArgumentParser(add_help=False)
    g = p.add_argument_group("connection")
    g.add_argument("--address", default=env("CYCLONE_ADDRESS", DEFAULT_ADDRESS),
                   help=f"server HOST:PORT (env CYCLONE_ADDRESS; default {DEFAULT_ADDRESS})")
    g.add_argument("--token", default=env("CYCLONE_TOKEN"), help="bearer token (env CYCLONE_TOKEN)")
    g.add_argument("--tls", action="store_true", default=env("CYCLONE_TLS", "") in ("1", "true", "yes"),
                   help="connect with TLS (implied by the file options; env CYCLONE_TLS=1)")
    g.add_argument("--ca-file", default=env("CYCLONE_CA_FILE"), help="CA to trust instead of the system roots")
    g.add_argument("--client-cert", default=env("CYCLONE_CLIENT_CERT"), help="client certificate for mTLS")
    g.add_argument("--client-key", default=env("CYCLONE_CLIENT_KEY"), help="client key for mTLS")
    g.add_argument("--rpc-timeout", type=duration, default=30.0, help="deadline of each call (default 30s)")
    p.add_argument("--json", action="store_true", help="print JSON (the proto JSON mapping) instead of tables")
    return p


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add `runs`, `workflows` and `stats`; each leaf sets func=(args) -> exit code."""
    common = _common()

    def leaf(group: Any, name: str, cmd: Any, help: str, *positionals: str) -> argparse.ArgumentParser:
        p = group.add_parser(name, parents=[common], help=help, description=help)
        p.set_defaults(func=_runner(cmd))
        for positional in positionals:
            p.add_argument(positional)
        return p

    runs = subparsers.add_parser("runs", help="list, inspect and steer runs").add_subparsers(
        dest="runs_command", required=True, metavar="COMMAND")
    p = leaf(runs, "list", cmd_runs_list, "list runs, newest first")
    p.add_argument("--state", action="append", choices=RUN_STATES, default=[], help="repeat for several")
    p.add_argument("--workflow", help="only runs of this workflow")
    p.add_argument("--limit", type=int, default=20)
    p.add_argument("--page-token")
    p.add_argument("--all", action="store_true", help="follow pages to the end")
    leaf(runs, "get", cmd_runs_get, "a run with its steps", "run_id")
    p = leaf(runs, "wait", cmd_runs_wait, "follow a run's steps live until it ends", "run_id")
    p.add_argument("--timeout", type=duration, help="give up after this long (exit 5)")
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
    p.add_argument("--deadline-in", type=duration)
    p = leaf(runs, "signal", cmd_runs_signal, "send a signal to a run's mailbox", "run_id", "name")
    p.add_argument("--payload", type=_json_arg, default=None, help="JSON payload (default null)")
    p = leaf(runs, "purge", cmd_runs_purge, "delete terminal runs that ended long enough ago (asks first)")
    p.add_argument("--older-than", type=age, required=True, metavar="AGE",
                   help="with a unit: 30d, 12h, 45m, 90s (a bare number is refused); a run's own retention wins")
    p.add_argument("--limit", type=int, default=1000, help="runs deleted per call (default 1000)")
    p.add_argument("--all", action="store_true", help="repeat until nothing eligible is left (default: one call)")
    p.add_argument("--dry-run", action="store_true", help="only count the runs that would be deleted")
    p.add_argument("--yes", "-y", action="store_true", help="do not ask for confirmation (needed when stdin "
                   "is not a terminal)")

    wf = subparsers.add_parser("workflows", help="read workflow definitions").add_subparsers(
        dest="workflows_command", required=True, metavar="COMMAND")
    p = leaf(wf, "list", cmd_workflows_list, "registered workflows (latest versions)")
    p.add_argument("--prefix", default="")
    p.add_argument("--all-versions", action="store_true")
    p = leaf(wf, "get", cmd_workflows_get, "one workflow definition", "name")
    p.add_argument("--version", type=int, default=0, help="default: the latest")
    leaf(subparsers, "stats", cmd_stats, "backlog per step kind (Admin/GetStats)")


def main(argv: Sequence[str] | None = None) -> int:
    """Standalone entry (the `cyclone` command wires `register` into its own parser)."""
    parser = argparse.ArgumentParser(prog="cyclone", description="Operate a Cyclone server.")
    register(parser.add_subparsers(dest="command", required=True, metavar="COMMAND"))
    args = parser.parse_args(argv)
    return int(args.func(args))


__all__ = ["register", "main", "duration"]
