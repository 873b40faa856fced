"""The Workers service: worker streams, the dispatcher, lease renewal and pings."""

from __future__ import annotations

import asyncio
import collections
import logging
import time
import uuid
from datetime import datetime, timezone
from collections.abc import Callable
from typing import Any

import grpc

from cyclone_proto import workers_pb2 as pb
from cyclone_proto import workers_pb2_grpc

from cyclone_server import definitions, tracing
from cyclone_server.convert import to_duration
from cyclone_server.errors import CycloneError
from cyclone_server.records import parse_id
from cyclone_server.store.engine import Engine
from cyclone_server.store.notify import Notifier
from cyclone_server.tasks import cancel_and_wait

from .committer import ResultCommitter
from .conn import HANDBACK_QUIET, End, HeldLease, LeaseKey, RatedLeases, WorkerConn
from .dispatcher import Dispatcher
from .rated import RatedPushes
from .wire import ack, to_result

log = logging.getLogger(__name__)

MAX_SLOTS = 10_000
MAX_WORKER_ID = 200
PONG_MISSES = 3  # heartbeat intervals without a word from the worker before its stream is ended
HELLO_TIMEOUT = 30.0  # seconds a new stream may take to say hello


def _check_hello(hello: pb.Hello) -> str | None:
    """What is wrong with a Hello, naming the field, or None."""
    if not hello.worker_id:
        return "hello.worker_id: required"
    if len(hello.worker_id) > MAX_WORKER_ID:
        return f"hello.worker_id: longer than {MAX_WORKER_ID} characters"
    if "\x00" in hello.worker_id:
        return "hello.worker_id: must not contain U+0000"
    if not hello.kinds:
        return "hello.kinds: at least one step kind is required"
    for kind in hello.kinds:
        try:
            definitions.validate_kind(kind, "hello.kinds")
        except CycloneError as e:
            return e.message
    if not 1 <= hello.slots <= MAX_SLOTS:
        return f"hello.slots: must be between 1 and {MAX_SLOTS}, got {hello.slots}"
    return None


class WorkerHub(workers_pb2_grpc.WorkersServicer):
    """The Workers service: worker streams, the dispatcher, lease renewal.

    Example::

        hub = WorkerHub(engine, notifier, server_id="s1", lease_ttl=30)
        hub.add_to_server(server)
        await hub.start()
        ...
        hub.wake()  # after a transition that may have made steps available
        await hub.stop(grace=10)
    """

    def __init__(self, engine: Engine, notifier: Notifier, *, server_id: str, lease_ttl: float) -> None:
        self.engine = engine
        self.notifier = notifier
        self.server_id = server_id
        self.lease_ttl = lease_ttl
        self.heartbeat = lease_ttl / 3
        self.conns: list[WorkerConn] = []
        # Running totals for metrics, read by whoever exports them: claims, completions and
        # snoozes by kind; failures by (kind, error_kind: error | permanent | max_attempts |
        # output_too_large); fenced_results by refusal (stale | ended | unknown); stops by
        # reason; streams opened (connects) and opened with held leases (reconnects).
        # Dispatch latencies go to Dispatcher.latency_observers instead.
        self.stats: dict[str, Any] = {
            "claims": collections.Counter(), "completions": collections.Counter(),
            "failures": collections.Counter(), "snoozes": collections.Counter(),
            "fenced_results": collections.Counter(), "stops": collections.Counter(), "result_batches": 0,
            "connects": 0, "reconnects": 0, "releases": 0,
        }
        self.dispatcher = Dispatcher(engine, lambda: self.conns, lease_ttl=lease_ttl, stats=self.stats)
        self.committer = ResultCommitter(engine, stats=self.stats, on_applied=self.wake)
        self.rated = RatedPushes(engine)
        self._accepting = True
        self._dispatch_task: asyncio.Task[None] | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._releasing: set[asyncio.Task[None]] = set()
        # The workers registry (cyclone_workers): each open stream's row id and start. A row
        # lives `worker_grace` seconds past its last heartbeat (every `heartbeat` seconds).
        self.worker_grace = lease_ttl
        self._streams: dict[WorkerConn, tuple[str, datetime]] = {}
        # Called with (kind, seconds from lease pushed to result received) per result.
        self.execution_observers: list[Callable[[str, float], None]] = []

    @property
    def connected_workers(self) -> int:
        return len(self.conns)

    def wake(self) -> None:
        """Tell the dispatcher that steps may have become available (coalesced; cheap)."""
        self.dispatcher.wake()

    def _available_elsewhere(self) -> None:
        """Another server (or a transaction outside a server) made steps claimable: what,
        this one cannot tell, so it claims for them without waiting out a pace."""
        self.dispatcher.unpace()
        self.dispatcher.new_work()

    def add_to_server(self, server: grpc.aio.Server) -> None:
        workers_pb2_grpc.add_WorkersServicer_to_server(self, server)

    async def start(self) -> None:
        # Not on this server's own announcements: Engine.announce has woken the dispatcher.
        self.notifier.subscribe("cyclone_available", self._available_elsewhere, skip={self.engine.announce_token})
        self._dispatch_task = asyncio.create_task(self.dispatcher.run(), name="cyclone-dispatch")
        self._tasks = [asyncio.create_task(self.committer.run(), name="cyclone-results"),
                       asyncio.create_task(self.rated.run(), name="cyclone-rated-pushes"),
                       asyncio.create_task(self._renew_loop(), name="cyclone-renew"),
                       asyncio.create_task(self._beat_loop(), name="cyclone-workers-beat")]

    async def stop(self, grace: float) -> None:
        """Stop pushing leases at once; keep applying results and renewing for up to `grace`
        seconds while handlers finish; then end the streams with UNAVAILABLE. Leases still
        held stay valid: their workers reconnect elsewhere listing them in Hello.held."""
        self._accepting = False
        if self._dispatch_task is not None:
            await self.dispatcher.stop()
            await self._dispatch_task
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and (any(c.held for c in self.conns) or not self.committer.idle()):
            await asyncio.sleep(0.05)
        for conn in list(self.conns):
            conn.end(grpc.StatusCode.UNAVAILABLE, "the server is shutting down; reconnect with your held leases")
        deadline = time.monotonic() + 2
        while self.conns and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        await asyncio.gather(*self._releasing, return_exceptions=True)
        await cancel_and_wait(self._tasks)  # (cancelled again if a cancellation was lost)

    # -- one stream ------------------------------------------------------------------------

    async def Connect(self, request_iterator: Any, context: grpc.aio.ServicerContext) -> None:  # noqa: N802
        if not self._accepting:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "the server is shutting down")
        try:
            async with asyncio.timeout(HELLO_TIMEOUT):  # not wait_for: see cyclone_server/tasks.py
                first = await context.read()
        except asyncio.TimeoutError:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"no hello within {HELLO_TIMEOUT:.0f} s")
        if first is grpc.aio.EOF:
            return
        if first.WhichOneof("msg") != "hello":
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                f"the first message must be hello, got {first.WhichOneof('msg') or 'an empty message'}")
        hello = first.hello
        problem = _check_hello(hello)
        if problem:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, problem)
        conn = WorkerConn(worker_id=hello.worker_id, kinds=list(dict.fromkeys(hello.kinds)), slots=hello.slots,
                          sdk=hello.sdk)
        lost = await self._welcome_held(conn, hello, context)
        welcome = pb.Welcome(server_id=self.server_id, lease_ttl=to_duration(self.lease_ttl),
                             heartbeat_interval=to_duration(self.heartbeat),
                             max_payload_bytes=self.engine.max_payload_bytes,
                             lost=[pb.LeaseRef(step_id=s, lease_generation=g) for s, g in lost])
        await context.write(pb.ServerMessage(welcome=welcome))
        self.stats["connects"] += 1
        self.stats["reconnects"] += bool(hello.held)
        self.conns.append(conn)
        self._streams[conn] = (str(uuid.uuid4()), datetime.now(timezone.utc))
        log.info("worker %s connected (%s, kinds %s, %d slots, %d held)", conn.worker_id, hello.sdk or "unknown sdk",
                 ",".join(conn.kinds), conn.slots, len(conn.held))
        self.wake()
        helpers = [asyncio.create_task(self._read(conn, context)), asyncio.create_task(self._ping(conn))]
        end = End(grpc.StatusCode.UNAVAILABLE, "the stream ended")
        try:
            await self._beat([conn], takeover=True)  # listed in the workers registry at once
            while True:
                msg = await conn.outbox.get()
                if isinstance(msg, End):
                    end = msg
                    break
                if isinstance(msg, RatedLeases):
                    await context.write(msg.msg)
                    self.rated.add(msg.step_ids)  # their starts count from now (docs/flow-control.md)
                    continue
                await context.write(msg)
        finally:
            # Leases are not released: while the worker is away they expire, unless it
            # reconnects first listing them in Hello.held; the sweep reclaims the rest.
            conn.closed = True
            self.conns.remove(conn)
            tracing.leases_ended((h.trace for h in conn.held.values()), "disconnected")
            self._streams.pop(conn, None)  # its row expires worker_grace after its last heartbeat
            for task in helpers:
                task.cancel()
            log.info("worker %s disconnected (%d leases held)", conn.worker_id, len(conn.held))
        if end.code is not None:
            await context.abort(end.code, end.message)

    async def _welcome_held(self, conn: WorkerConn, hello: pb.Hello,
                            context: grpc.aio.ServicerContext) -> list[LeaseKey]:
        """Renew the leases a reconnecting worker still holds; returns those it lost."""
        lost: list[LeaseKey] = []
        keep: list[LeaseKey] = []
        for ref in hello.held:
            try:
                keep.append((str(parse_id(ref.step_id, "held.step_id")), ref.lease_generation))
            except CycloneError:
                lost.append((ref.step_id, ref.lease_generation))
        if keep:
            try:
                gone = set(await self.engine.renew(conn.worker_id, keep, self.lease_ttl))
            except Exception as e:
                log.warning("renewing the held leases of %s failed: %s", conn.worker_id, e)
                await context.abort(grpc.StatusCode.UNAVAILABLE, "the database is unavailable; reconnect later")
            lost += [k for k in keep if k in gone]
            conn.held = {k: HeldLease() for k in keep if k not in gone}
        return lost

    async def _read(self, conn: WorkerConn, context: grpc.aio.ServicerContext) -> None:
        while True:
            try:
                msg = await context.read()
            except asyncio.CancelledError:
                raise
            except Exception as e:  # the stream broke under us
                log.debug("reading from worker %s failed: %s", conn.worker_id, e)
                conn.end()
                return
            if msg is grpc.aio.EOF:
                conn.drain()
                conn.heard()
                return
            conn.last_pong = time.monotonic()  # any message shows the worker is alive
            if conn.heard():  # it did not half-close right after its last snooze
                self.wake()
            which = msg.WhichOneof("msg")
            if which == "results":
                try:
                    self._on_results(conn, msg.results.results)
                except Exception:  # a bug, not the worker's doing: said loudly, and resent
                    log.exception("handling %d results from worker %s failed", len(msg.results.results),
                                  conn.worker_id)
                    conn.end(grpc.StatusCode.UNAVAILABLE,
                             "the server could not take these results; reconnect and resend")
                    return
            elif which == "hello":
                conn.end(grpc.StatusCode.INVALID_ARGUMENT, "hello: sent twice on one stream")
                return

    def _on_results(self, conn: WorkerConn, results: Any) -> None:
        refused: list[pb.ResultAck] = []
        handed_back = False
        for r in results:
            result = to_result(r, self.engine.max_payload_bytes)
            if isinstance(result, str):  # the step id is not an id: no step to answer
                status, _, detail = result.partition(": ")
                conn.forget((r.step_id, r.lease_generation))
                self.stats["fenced_results"][status] += 1
                refused.append(ack(r.step_id, r.lease_generation, status, detail or None))
            else:
                held = conn.held.get((result.step_id, result.generation))
                if held is not None and held.kind is not None and not held.result_pending:
                    took = time.monotonic() - held.pushed_at
                    for observe in self.execution_observers:
                        observe(held.kind, took)
                self.committer.submit(conn, result, r.step_id)
                handed_back |= result.outcome == "snoozed" and not result.delay  # maybe a stopping worker's
        if handed_back:
            conn.hush(HANDBACK_QUIET)
            conn.call_at_quiet_end(self.wake)
        if refused:
            conn.send(pb.ServerMessage(acks=pb.ResultAcks(acks=refused)))
        self.wake()  # the answered leases' slots are free

    async def _ping(self, conn: WorkerConn) -> None:
        while not conn.closed:
            await asyncio.sleep(self.heartbeat)
            silent = time.monotonic() - conn.last_pong
            if silent > PONG_MISSES * self.heartbeat:
                log.info("worker %s silent for %.1fs; ending its stream and reclaiming its %d leases",
                         conn.worker_id, silent, len(conn.held))
                conn.end(grpc.StatusCode.UNAVAILABLE, f"no pong for {silent:.1f}s")
                # Its own task: ending the stream cancels this one.
                task = asyncio.create_task(self._release(conn), name="cyclone-release")
                self._releasing.add(task)
                task.add_done_callback(self._releasing.discard)
                return
            conn.ping()

    async def _release(self, conn: WorkerConn) -> None:
        """A silent worker can no longer answer its leases: reclaim them now rather than
        after their TTL. A lease whose result arrived is left to that result."""
        await self.dispatcher.release(conn.worker_id, [k for k, h in conn.held.items() if not h.result_pending])

    # -- workers registry -------------------------------------------------------------------

    def _registry_row(self, conn: WorkerConn) -> dict[str, Any] | None:
        stream = self._streams.get(conn)
        if stream is None:
            return None
        return {"worker_id": conn.worker_id, "conn_id": stream[0], "sdk": conn.sdk, "kinds": conn.kinds,
                "slots": conn.slots, "leases_held": conn.running, "connected_at": stream[1].isoformat()}

    async def _beat(self, conns: list[WorkerConn], *, takeover: bool = False) -> None:
        rows = [r for r in map(self._registry_row, conns) if r is not None]
        try:
            await self.engine.workers_beat(self.server_id, rows, self.worker_grace, takeover=takeover)
        except Exception as e:  # the registry is a view for operators: the streams go on without it
            log.warning("writing the workers registry failed: %s", e)

    async def _beat_loop(self) -> None:
        while True:
            await asyncio.sleep(self.heartbeat)
            await self._beat(list(self.conns))

    # -- lease renewal ----------------------------------------------------------------------

    async def _renew_loop(self) -> None:
        while True:
            await asyncio.sleep(self.heartbeat)
            conns = [c for c in self.conns if c.held]
            await asyncio.gather(*(self._renew(c) for c in conns))

    async def _renew(self, conn: WorkerConn) -> None:
        """One statement renews all of a worker's leases; lost ones become a Stop."""
        try:
            lost = await self.engine.renew(conn.worker_id, list(conn.held), self.lease_ttl)
            # A lease whose result is being applied (or was applied meanwhile) is not lost:
            # its ack tells the worker what happened.
            lost = [k for k in lost if k in conn.held and not conn.held[k].result_pending]
            if not lost:
                return
            by_reason: dict[str, list[LeaseKey]] = collections.defaultdict(list)
            for key, reason in zip(lost, await self._stop_reasons(conn, lost)):
                by_reason[reason].append(key)
        except Exception as e:  # a lost database: the next tick tries again, well within the TTL
            log.warning("renewing the leases of %s failed: %s", conn.worker_id, e)
            return
        for reason, keys in by_reason.items():
            for key in keys:
                held = conn.forget(key)
                tracing.leases_ended([held.trace if held is not None else None], reason)
            self.stats["stops"][reason] += len(keys)
            conn.send(pb.ServerMessage(stop=pb.Stop(
                leases=[pb.LeaseRef(step_id=s, lease_generation=g) for s, g in keys], reason=reason)))
        self.wake()  # their slots are free

    async def _stop_reasons(self, conn: WorkerConn, lost: list[LeaseKey]) -> list[str]:
        """Why each lost lease was lost: "cancelled", "timeout", else "fenced"."""
        leases = {key: conn.held[key] for key in lost}  # held may change while we read the runs
        runs: dict[str, dict[str, Any]] = {}
        for lease in leases.values():
            run_id = lease.run_id
            if run_id is not None and run_id not in runs:
                try:
                    run = await self.engine.get_run(run_id)
                    runs[run_id] = {str(s["id"]): s for s in run["steps"]}
                except CycloneError:  # purged meanwhile
                    runs[run_id] = {}
        now_us = int(time.time() * 1_000_000)
        reasons = []
        for key, lease in leases.items():
            step = runs.get(lease.run_id or "", {}).get(key[0])
            errors = (step or {}).get("errors") or []
            if step is not None and step["state"] == "cancelled":
                reasons.append("cancelled")
            elif step is not None and errors and errors[-1].get("error_kind") == "timeout" \
                    and errors[-1].get("attempt") == lease.attempt:
                reasons.append("timeout")
            elif step is None and lease.attempt_deadline_us is not None and lease.attempt_deadline_us <= now_us:
                reasons.append("timeout")
            else:
                reasons.append("fenced")
        return reasons
