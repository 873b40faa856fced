"""cyclone_worker._loop: which event loop `Worker.run_sync` and the server run on."""

from __future__ import annotations

import argparse
import asyncio
import gc
import importlib.util
import signal
import sys
import threading
import time
import warnings

import pytest

from cyclone_server.serve import settings
from cyclone_worker._loop import from_env, loop_factory, loop_name, run, timer_slack, wait_event_until


async def running_loop() -> str:
    await asyncio.sleep(0)
    return loop_name()


def test_auto_runs_on_uvloop_where_it_is_installed() -> None:
    pytest.importorskip("uvloop")  # a dependency of the distribution on Linux and macOS
    assert run(running_loop()) == "uvloop"
    assert run(running_loop(), "uvloop") == "uvloop"


def test_asyncio_keeps_the_standard_library_loop() -> None:
    assert loop_factory("asyncio") is None
    assert run(running_loop(), "asyncio") == "asyncio"


def test_without_uvloop_auto_falls_back_and_uvloop_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "uvloop", None)  # `import uvloop` now raises ImportError
    assert run(running_loop(), "auto") == "asyncio"
    with pytest.raises(ValueError, match="uvloop is not installed"):
        loop_factory("uvloop")


def test_an_unknown_loop_is_refused_and_the_coroutine_is_closed_not_left_unawaited() -> None:
    coro = running_loop()
    with pytest.raises(ValueError, match=r"event loop 'trio' is not one of auto, uvloop, asyncio"):
        run(coro, "trio")
    assert coro.cr_frame is None  # closed; an unawaited coroutine keeps its frame (and warns when collected)


@pytest.mark.parametrize("choice", ["uvloop", "asyncio"])
def test_the_signal_handlers_a_loop_took_are_put_back_after_it(choice: str) -> None:
    if choice == "uvloop":
        pytest.importorskip("uvloop")
    original = signal.getsignal(signal.SIGTERM)

    def the_programs_own(signum: int, frame: object) -> None:
        raise AssertionError("not called")
    signal.signal(signal.SIGTERM, the_programs_own)
    try:
        before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}

        async def take_them() -> None:
            loop = asyncio.get_running_loop()
            for s in before:
                loop.add_signal_handler(s, lambda: None)

        run(take_them(), choice)
        # uvloop's loop removes its handlers only while it runs: without run's clean-up SIGTERM and
        # SIGINT would stay bound to the closed loop, and the rest of the program would not hear them.
        # asyncio's sets SIG_DFL, not the handler it found.
        assert {s: signal.getsignal(s) for s in before} == before
    finally:
        signal.signal(signal.SIGTERM, original)


def test_the_environment_chooses_when_the_code_does_not(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CYCLONE_EVENT_LOOP", raising=False)
    assert from_env() == "auto"
    monkeypatch.setenv("CYCLONE_EVENT_LOOP", "asyncio")
    assert from_env() == "asyncio" and from_env("uvloop") == "uvloop"
    for bad in ("trio", "Asyncio", ""):  # exactly as the server's --event-loop takes it
        monkeypatch.setenv("CYCLONE_EVENT_LOOP", bad)
        with pytest.raises(ValueError, match=rf"CYCLONE_EVENT_LOOP='{bad}' is not one of auto, uvloop, asyncio"):
            from_env()


def test_run_sync_with_a_bad_variable_raises_and_leaves_no_coroutine_unawaited(monkeypatch: pytest.MonkeyPatch) -> None:
    from cyclone_worker import Worker

    monkeypatch.setenv("CYCLONE_EVENT_LOOP", "trio")
    worker = Worker("127.0.0.1:1", slots=1)
    worker.handler("k")(running_loop)
    unraisable: list[object] = []
    monkeypatch.setattr(sys, "unraisablehook", unraisable.append)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # "coroutine ... was never awaited", when collected, goes to unraisablehook
        with pytest.raises(ValueError, match="CYCLONE_EVENT_LOOP='trio'"):
            worker.run_sync()
        gc.collect()
    assert unraisable == []


def test_uvloop_gets_a_millisecond_of_slack_and_asyncio_none() -> None:
    async def slack() -> float:
        return timer_slack()
    assert run(slack(), "asyncio") == 0.0
    if importlib.util.find_spec("uvloop") is not None:
        assert run(slack(), "uvloop") == 0.001


def test_run_sync_in_a_thread_that_is_not_the_main_one_runs_without_signal_handlers() -> None:
    # Signal handlers can only be set from the main thread: asyncio's loop says so with a
    # RuntimeError, uvloop's with a ValueError; run_sync goes on without them on either.
    from cyclone_worker import Worker

    errors: list[BaseException] = []
    for choice in ("auto", "asyncio"):
        worker = Worker("127.0.0.1:1", slots=1)
        worker.handler("k")(running_loop)
        worker.stop()  # stopped before it runs: run() returns at once

        def go(w: Worker = worker, c: str = choice) -> None:
            try:
                w.run_sync(event_loop=c)
            except BaseException as e:  # noqa: BLE001 - reported below
                errors.append(e)
        t = threading.Thread(target=go)
        t.start()
        t.join(30)
        assert not t.is_alive()
    assert errors == []


def test_the_server_setting_names_the_flag_when_uvloop_is_asked_for_and_missing(
        monkeypatch: pytest.MonkeyPatch) -> None:
    p = argparse.ArgumentParser()
    settings.add(p, environ={"CYCLONE_EVENT_LOOP": "uvloop"})
    args = p.parse_args(["--database-url", "postgresql:///x"])
    if importlib.util.find_spec("uvloop") is not None:
        assert settings.from_args(args).event_loop == "uvloop"
    monkeypatch.setitem(sys.modules, "uvloop", None)
    with pytest.raises(settings.SettingsError, match="--event-loop: event loop 'uvloop': uvloop is not installed"):
        settings.from_args(args)


def test_the_server_defaults_to_auto() -> None:
    p = argparse.ArgumentParser()
    settings.add(p, environ={})
    args = p.parse_args(["--database-url", "postgresql:///x"])
    assert settings.from_args(args).event_loop == "auto"


@pytest.mark.parametrize("choice", ["uvloop", "asyncio"])
def test_wait_event_until_returns_at_the_event_or_not_before_the_deadline(choice: str) -> None:
    if choice == "uvloop":
        pytest.importorskip("uvloop")

    async def waits() -> tuple[list[float], bool]:
        event = asyncio.Event()
        early = []
        for _ in range(30):
            deadline = time.monotonic() + 0.0105
            assert await wait_event_until(event, deadline) is False
            early.append(max(deadline - time.monotonic(), 0.0))
        asyncio.get_running_loop().call_later(0.01, event.set)
        return early, await wait_event_until(event, time.monotonic() + 60)

    early, set_in_time = run(waits(), choice)
    assert early == [0.0] * 30  # uvloop's timers alone fired before the deadline in most of these
    assert set_in_time is True
