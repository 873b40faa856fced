"""The worker: registers handlers, runs the leases the server pushes on the stream, answers each with a result."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import time
import uuid
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from typing import Any

import grpc

from ._channel import auth_metadata, open_channel
from ._context import Context, set_event
from ._leases import LeaseTable
from ._loop import from_env, loop_name, run as run_on
from cyclone_proto import workers_pb2, workers_pb2_grpc
from ._session import Disconnected, Session, reconnectable
from . import _tracing

__all__ = ["Worker", "Reconnect", "Handler"]

log = logging.getLogger("cyclone_worker")

#: A handler takes the step's Context and returns its JSON-able output (sync or async).
Handler = Callable[[Context], Any]

try:
    _SDK = f"python/{version('cyclone-workflows')}"  # this SDK's distribution (pyproject's name)
except PackageNotFoundError:  # running from a source tree
    _SDK = "python/dev"


@dataclass(frozen=True)
class Reconnect:
    """Backoff between reconnect attempts: exponential with jitter from `initial` to `maximum`
    seconds; `attempts` consecutive failures end `Worker.run` with the last error (None: never).

    Example::

        Worker("cyclone:7233", reconnect=Reconnect(initial=0.5, maximum=30))
    """

    initial: float = 0.1
    maximum: float = 5.0
    attempts: int | None = None


class Worker:
    """Runs handlers for step kinds: connects to a Cyclone server, receives leases up to
    `slots` at a time, answers each with the handler's result, and reconnects on its own.

    Handlers may be async (run in the worker's event loop) or plain functions (run in a
    thread pool). With `database_url`, handlers can use `ctx.completion_tx()`.

    Example::

        worker = Worker("127.0.0.1:7233", slots=4)

        @worker.handler("resize")
        async def resize(ctx: Context) -> dict:
            return {"url": await make_thumbnail(ctx.input["url"])}

        worker.run_sync()  # until SIGTERM / SIGINT
    """

    def __init__(self, address: str, *, slots: int = 8, worker_id: str | None = None,
                 database_url: str | None = None, reconnect: Reconnect | None = Reconnect(),
                 token: str | None = None, tls: grpc.ChannelCredentials | None = None,
                 grace: float = 30.0, connect_timeout: float = 10.0) -> None:
        if slots < 1:
            raise ValueError(f"slots: {slots} must be at least 1")
        self.address = address
        self.slots = slots
        self.worker_id = worker_id or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.database_url = database_url
        self.reconnect = reconnect
        self.grace = grace
        self.connect_timeout = connect_timeout
        #: What happened to this worker's results and streams, by name (applied, stale, ...).
        self.counts: Counter[str] = Counter()
        self._tls = tls
        self._metadata = auth_metadata(token)
        self._handlers: dict[str, Handler] = {}
        self._leases = LeaseTable(self._handlers, self.worker_id, self.counts)
        self._session: Session | None = None  # the welcomed stream, while one is up
        self._connected = asyncio.Event()
        self._stop_requested = asyncio.Event()  # a worker runs once: stop() is final
        self._loop: asyncio.AbstractEventLoop | None = None
        self._connection: asyncio.Task[None] | None = None
        self._background: asyncio.Task[None] | None = None

    # -- handlers ---------------------------------------------------------------------------

    def handler(self, kind: str | None = None) -> Callable[[Handler], Handler]:
        """Decorator registering a handler for step kind `kind` (default: the function's name).

        Example::

            @worker.handler("send_email")
            def send_email(ctx: Context) -> None:
                smtp.send(ctx.input["to"], ctx.input["body"])
        """
        def register(fn: Handler) -> Handler:
            self.register(kind or fn.__name__, fn)
            return fn
        return register

    def register(self, kind: str, fn: Handler) -> None:
        """Register `fn` as the handler of step kind `kind` (the non-decorator form).

        Example::

            worker.register("parse", parse)
        """
        if kind in self._handlers:
            raise ValueError(f"kind {kind!r} already has a handler")
        self._handlers[kind] = fn

    @property
    def kinds(self) -> list[str]:
        """The step kinds this worker handles."""
        return list(self._handlers)

    @property
    def connected(self) -> bool:
        """True while the stream is up (after the server's Welcome)."""
        return self._connected.is_set()

    async def wait_connected(self, timeout: float | None = None) -> None:
        """Wait until the worker's stream is up (raises TimeoutError after `timeout` s).

        Example::

            task = asyncio.create_task(worker.run())
            await worker.wait_connected(timeout=30)
        """
        async with asyncio.timeout(timeout):  # not wait_for, which can lose a cancel on Python 3.11
            await self._connected.wait()

    # -- running ----------------------------------------------------------------------------

    async def __aenter__(self) -> Worker:
        """Run the worker in the background until the block ends, then stop it gracefully.

        Entering waits for the first Welcome (a fatal error, or reconnect attempts running
        out, is raised here).

        Example::

            async with Worker(address) as worker:  # handlers registered before entering
                run_id = await client.submit("etl")
                await client.wait(run_id)
        """
        self._background = asyncio.create_task(self.run(), name="cyclone-worker")
        connected = asyncio.create_task(self._connected.wait())
        await asyncio.wait([self._background, connected], return_when=asyncio.FIRST_COMPLETED)
        connected.cancel()
        if self._background.done():
            self._background.result()
            raise RuntimeError("the worker stopped before it connected")
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.stop()
        if self._background is not None:
            task, self._background = self._background, None
            await task

    def run_sync(self, *, event_loop: str | None = None) -> None:
        """Run until SIGTERM or SIGINT, then stop gracefully (blocks; for scripts and `main`).

        `event_loop`: "auto" runs on uvloop when it is installed (the distribution's dependency
        on Linux and macOS; about a tenth less CPU per step than asyncio's loop), "uvloop" insists
        on it (ValueError if it is not installed), "asyncio" keeps the standard library's loop;
        None (the default) takes the environment variable CYCLONE_EVENT_LOOP, else "auto".
        `run()` runs on whatever loop awaits it.

        Example::

            if __name__ == "__main__":
                worker.run_sync()
        """
        async def main() -> None:
            loop = asyncio.get_running_loop()
            log.debug("cyclone worker %s: event loop %s", self.worker_id, loop_name(loop))
            for sig in (signal.SIGTERM, signal.SIGINT):
                try:
                    loop.add_signal_handler(sig, self.stop)
                # Windows; not the main thread (asyncio's loop raises RuntimeError, uvloop's ValueError)
                except (NotImplementedError, RuntimeError, ValueError):
                    pass
            await self.run()
        choice = from_env(event_loop)  # before main() exists: a bad variable leaves no coroutine unawaited
        run_on(main(), choice)

    def stop(self) -> None:
        """Stop gracefully: take no new work, let running handlers finish (up to `grace`
        seconds), deliver their results, then close. Safe from any thread and signal handler.

        Example::

            loop.add_signal_handler(signal.SIGTERM, worker.stop)
        """
        if self._loop is None:
            self._stop_requested.set()
            return
        set_event(self._loop, self._stop_requested)

    async def run(self) -> None:
        """Connect and run leases until `stop()` (then drain gracefully) or a fatal error
        (INVALID_ARGUMENT, auth errors, or reconnect attempts exhausted: CycloneClientError).

        Example::

            task = asyncio.create_task(worker.run())
            ...
            worker.stop()
            await task
        """
        if not self._handlers:
            raise ValueError("a worker needs at least one handler (@worker.handler(kind))")
        self._loop = asyncio.get_running_loop()
        _tracing.install_provider("cyclone-worker")  # only when OTEL_* variables ask for it
        # Twice the slots: a thread handler that ignores a Stop keeps its thread a while.
        executor = ThreadPoolExecutor(max_workers=max(4, 2 * self.slots), thread_name_prefix="cyclone-handler")
        pool = None
        if self.database_url:
            from psycopg_pool import AsyncConnectionPool
            pool = AsyncConnectionPool(self.database_url, min_size=1, max_size=self.slots, open=False,
                                       kwargs={"autocommit": True})
            await pool.open()
        self._leases.open(self._loop, executor, pool)
        channel = open_channel(self.address, tls=self._tls)
        stub = workers_pb2_grpc.WorkersStub(channel)
        connection = asyncio.create_task(self._connect_loop(stub), name="cyclone-worker-stream")
        self._connection = connection
        stopping = asyncio.create_task(self._stop_requested.wait())
        try:
            await asyncio.wait([connection, stopping], return_when=asyncio.FIRST_COMPLETED)
            if connection.done():
                connection.result()  # a fatal stream error ends run() with it
                return
            await self._drain()
        finally:
            stopping.cancel()
            connection.cancel()
            await asyncio.gather(connection, return_exceptions=True)
            await self._leases.abandon()
            await channel.close(None)
            executor.shutdown(wait=False, cancel_futures=True)
            if pool is not None:
                await pool.close()
            if _tracing.installed():
                await asyncio.to_thread(_tracing.flush)

    async def _connect_loop(self, stub: workers_pb2_grpc.WorkersStub) -> None:
        from tenacity import (AsyncRetrying, retry_if_exception, stop_after_attempt, stop_never, wait_exponential,
                              wait_random)

        policy = self.reconnect
        while True:
            if policy is None:
                await self._run_session(stub)
                return
            retrying = AsyncRetrying(
                retry=retry_if_exception(reconnectable),
                wait=wait_exponential(multiplier=policy.initial, max=policy.maximum) + wait_random(0, policy.initial),
                stop=stop_after_attempt(policy.attempts) if policy.attempts else stop_never,
                before_sleep=lambda state: log.warning(
                    "cyclone worker %s: cannot connect to %s (%s); retrying", self.worker_id, self.address,
                    state.outcome.exception() if state.outcome else "?"),
                reraise=True)
            try:
                async for attempt in retrying:
                    with attempt:
                        await self._run_session(stub)
                return  # the session ended because the worker is closing
            except Disconnected as e:
                # A welcomed stream died: reconnect at once with a fresh backoff budget,
                # after a short pause so a server that drops every stream is not hammered.
                log.warning("cyclone worker %s: stream lost (%s); reconnecting", self.worker_id, e)
                self.counts["disconnects"] += 1
                await asyncio.sleep(policy.initial)

    async def _run_session(self, stub: workers_pb2_grpc.WorkersStub) -> None:
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            # The worker is stopping, and a cancel was taken for a lost stream on its way
            # here (asyncio.wait_for on Python 3.11 can do that): no new stream.
            raise asyncio.CancelledError
        session = Session(self, self._leases, stub.Connect(metadata=self._metadata))
        try:
            await session.run()
        finally:
            if self._session is session:
                self._session, self._leases.outlet = None, None
            self._connected.clear()

    # -- called by the session --------------------------------------------------------------

    def hello(self) -> workers_pb2.Hello:
        return workers_pb2.Hello(worker_id=self.worker_id, kinds=self.kinds, slots=self.slots,
                                 held=self._leases.refs(), sdk=_SDK)

    def welcomed(self, session: Session, welcome: workers_pb2.Welcome) -> list[workers_pb2.StepResult]:
        """Stop the lost leases; returns the results still to deliver on this new stream."""
        self._session = session
        results = self._leases.welcomed(session.send_result, list(welcome.lost), welcome.max_payload_bytes)
        self._connected.set()
        self.counts["welcomes"] += 1
        return results

    # -- stopping -------------------------------------------------------------------------

    async def _drain(self) -> None:
        """Graceful stop: start no new handlers; wait (up to `grace`) until every started
        lease is answered and acked; hand back the leases that never started; close."""
        self._leases.draining = True
        log.info("cyclone worker %s: stopping; waiting for %d running handlers", self.worker_id,
                 self._leases.running())
        await self._wait_until(lambda: self._leases.running() == 0, self.grace)
        # Handlers still running after the grace are cut off without an answer: their leases
        # expire and are reclaimed, as after a crash, since their side effects may be partial.
        # The zero snoozes of unstarted leases go out just before the half-close, without
        # waiting for their acks: the server pushes nothing to a worker while one of its
        # snoozes waits for its ack, and reads the half-close before that ack, so nothing
        # more comes (were we to wait for the acks, it would push the same steps straight
        # back into the freed slots).
        self._leases.give_back_unstarted()
        if self._session is not None:
            await self._session.close()

    async def _wait_until(self, done: Callable[[], bool], timeout: float) -> None:
        """Wait for `done()` (re-checked whenever a lease changes), at most `timeout` s, and
        no longer than the stream task lives (a fatal stream error ends the drain)."""
        changed = self._leases.changed
        end = time.monotonic() + timeout
        while not done() and time.monotonic() < end:
            if self._connection is not None and self._connection.done():
                return
            changed.clear()
            try:
                async with asyncio.timeout(min(0.5, end - time.monotonic())):  # not wait_for (see above)
                    await changed.wait()
            except TimeoutError:
                pass
