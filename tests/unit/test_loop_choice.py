"""cyclone_worker._loop: which event loop `Worker.run_sync` and the server run on."""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import sys
import warnings

import pytest

from cyclone_server.serve import settings
from cyclone_worker._loop import loop_factory, loop_name, run


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


def test_an_unknown_loop_is_refused_and_the_coroutine_is_not_left_unawaited() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # "coroutine ... was never awaited" would be a RuntimeWarning
        with pytest.raises(ValueError, match=r"event loop 'trio' is not one of auto, uvloop, asyncio"):
            run(running_loop(), "trio")


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
