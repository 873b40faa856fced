"""A demo worker on the Python SDK (cyclone_worker) with the command-line contract of the Node
and Go demo workers, so that the polyglot scenarios run against Python too.

    python tests/acceptance/polyglot_python_worker.py --address 127.0.0.1:7233 --slots 2 \\
        --marker-dir /tmp/m --kind ok=succeed --kind flaky=fail:2 --kind spawn=submit:child-wf

Flags (environment in brackets): --address HOST:PORT [CYCLONE_ADDRESS], --worker-id
[CYCLONE_WORKER_ID], --slots N, --marker-dir DIR [CYCLONE_MARKER_DIR], --token
[CYCLONE_TOKEN], and one --kind NAME=BEHAVIOUR per step kind [CYCLONE_KINDS=a=b,c=d]. The
behaviours are those of polyglot_harness.py: succeed, fail:N, faildelay:N:MS, permanent,
panic, snooze:SECONDS, block, sleep:SECONDS, big:BYTES, trace, hang, submit:WORKFLOW,
signal:NAME. It prints `welcome from SERVER` for every Welcome and `SIGTERM: draining` when
told to stop, and exits 0 after a graceful stop.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import re
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from cyclone_worker import Client, Context, HandlerError, Permanent, Snooze, Worker

LANG = "python"
TRACEPARENT = re.compile(r"^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?$")


def say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def derive(ctx: Context, worker: str) -> dict[str, Any]:
    """value: the run input's "value" for a root node, else the sum of the parents' values; plus one."""
    base: Any = 0
    if not ctx.parents:
        if isinstance(ctx.input, dict) and isinstance(ctx.input.get("value"), (int, float)):
            base = ctx.input["value"]
    for out in ctx.parents.values():
        value = out.get("value") if isinstance(out, dict) else None
        base += value if isinstance(value, (int, float)) else 0
    origin = {node: (out.get("lang") if isinstance(out, dict) else None) for node, out in ctx.parents.items()}
    return {"lang": LANG, "worker": worker, "node": ctx.node, "attempt": ctx.attempt, "value": base + 1,
            "from": origin}


def explode(node: str) -> None:
    raise TypeError(f"demo explosion in {node}")


def parse_trace(ctx: Context) -> dict[str, Any]:
    m = TRACEPARENT.match(ctx.traceparent or "")
    if not m or m[1] == "ff" or (m[1] == "00" and m[5]) or set(m[2]) == {"0"} or set(m[3]) == {"0"}:
        return {"lang": LANG, "traceparent": ""}
    return {"lang": LANG, "traceparent": ctx.traceparent, "tracestate": ctx.tracestate, "trace_id": m[2],
            "span_id": m[3], "sampled": int(m[4], 16) & 1 == 1}


class Demo:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self._client: Client | None = None

    def client(self) -> Client:
        if self._client is None:
            self._client = Client(self.args.address, token=self.args.token)
        return self._client

    def marker(self, ctx: Context, suffix: str, text: str) -> None:
        Path(self.args.marker_dir, f"{ctx.step_id}.{suffix}").write_text(text)

    def behaviour(self, spec: str) -> Any:  # noqa: C901 - one branch per behaviour, as in the other demo workers
        name, _, arg = spec.partition(":")
        worker = self.args.worker_id
        if name == "succeed":
            async def succeed(ctx: Context) -> Any:
                return derive(ctx, worker)
            return succeed
        if name == "fail":
            times = int(arg or "1")

            async def fail(ctx: Context) -> Any:
                if ctx.attempt <= times:
                    raise HandlerError(f"planned failure {ctx.attempt} of {times}", retry_delay=0.1)
                return derive(ctx, worker)
            return fail
        if name == "faildelay":
            n, _, ms = arg.partition(":")
            times, delay_ms = int(n or "1"), int(ms or "1000")

            async def faildelay(ctx: Context) -> Any:
                if ctx.attempt <= times:
                    raise HandlerError(f"planned failure {ctx.attempt} of {times}, retry in {delay_ms} ms",
                                       retry_delay=delay_ms / 1000)
                return derive(ctx, worker)
            return faildelay
        if name == "permanent":
            async def permanent(ctx: Context) -> Any:
                raise Permanent(f"planned permanent failure of {ctx.node}")
            return permanent
        if name == "panic":
            async def panic(ctx: Context) -> Any:
                explode(ctx.node)
            return panic
        if name == "snooze":
            seconds = float(arg or "0.5")

            async def snooze(ctx: Context) -> Any:
                if ctx.snoozes == 0:
                    raise Snooze(seconds)
                return derive(ctx, worker)
            return snooze
        if name == "block":
            async def block(ctx: Context) -> Any:
                self.marker(ctx, "started", worker)
                try:
                    await ctx.cancelled.wait()
                finally:  # the worker cancels the task right after it sets the flag
                    self.marker(ctx, "stopped", ctx.cancelled.reason)
                raise asyncio.CancelledError
            return block
        if name == "sleep":
            seconds = float(arg or "1")

            async def nap(ctx: Context) -> Any:
                self.marker(ctx, "started", worker)
                await asyncio.sleep(seconds)
                self.marker(ctx, "done", worker)
                return derive(ctx, worker)
            return nap
        if name == "big":
            size = int(arg or "2000000")

            async def big(ctx: Context) -> Any:
                return {"blob": "x" * size}
            return big
        if name == "trace":
            async def trace(ctx: Context) -> Any:
                return parse_trace(ctx)
            return trace
        if name == "hang":
            def hang(ctx: Context) -> Any:  # a thread handler: a Stop cannot interrupt it
                self.marker(ctx, "started", worker)
                threading.Event().wait()
            return hang
        if name == "submit":
            if not arg:
                raise SystemExit("submit wants submit:WORKFLOW")

            async def submit(ctx: Context) -> Any:
                run_id = await self.client().submit(arg, {"parent_step": ctx.step_id})
                result = await self.client().result(run_id)
                return {"lang": LANG, "child_run": run_id, "child_result": result}
            return submit
        if name == "signal":
            if not arg:
                raise SystemExit("signal wants signal:NAME")

            async def send_signal(ctx: Context) -> Any:
                await self.client().signal(ctx.run_id, arg, {"from": LANG, "step": ctx.step_id})
                return derive(ctx, worker)
            return send_signal
        raise SystemExit(f"unknown behaviour {spec!r}: succeed, fail:N, faildelay:N:MS, permanent, panic, "
                         "snooze:SECONDS, block, sleep:SECONDS, big:BYTES, trace, hang, submit:WORKFLOW or signal:NAME")


class DemoWorker(Worker):
    """The SDK's Worker, saying `welcome from SERVER` at every Welcome (the scenarios count them)."""

    def welcomed(self, session: Any, welcome: Any) -> Any:
        say(f"welcome from {welcome.server_id}; {len(welcome.lost)} held lease(s) lost")
        return super().welcomed(session, welcome)


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--address", default=os.environ.get("CYCLONE_ADDRESS", "127.0.0.1:7233"))
    p.add_argument("--worker-id", default=os.environ.get("CYCLONE_WORKER_ID", f"python-demo-{os.getpid()}"))
    p.add_argument("--slots", type=int, default=1)
    p.add_argument("--marker-dir", default=os.environ.get("CYCLONE_MARKER_DIR", "."))
    p.add_argument("--token", default=os.environ.get("CYCLONE_TOKEN") or None)
    p.add_argument("--kind", action="append", default=[k for k in os.environ.get("CYCLONE_KINDS", "").split(",") if k])
    args = p.parse_args(argv)
    if not args.kind:
        p.error("give at least one --kind NAME=BEHAVIOUR")
    return args


async def main(argv: list[str]) -> None:
    args = parse_args(argv)
    demo = Demo(args)
    worker = DemoWorker(args.address, worker_id=args.worker_id, slots=args.slots, token=args.token, grace=10.0)
    for spec in args.kind:
        kind, eq, behaviour = spec.partition("=")
        if not eq or not kind:
            raise SystemExit(f"--kind wants NAME=BEHAVIOUR, got {spec!r}")
        worker.register(kind, demo.behaviour(behaviour))
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        def stop(sig: signal.Signals = sig) -> None:
            say(f"{sig.name}: draining")
            worker.stop()
        loop.add_signal_handler(sig, stop)
    try:
        await worker.run()
    finally:
        if demo._client is not None:
            await demo._client.close()


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    asyncio.run(main(sys.argv[1:]))
    # A thread handler (hang) may still run: leave without waiting for it.
    os._exit(0)
