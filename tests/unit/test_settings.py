"""The declared settings table: one row per flag, read from the environment, shown in the docs."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from cyclone_server.cli import main as cli

from cyclone_server.serve import settings

ROOT = Path(__file__).resolve().parents[2]


def parser(environ: dict[str, str]) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="cyclone-server")
    settings.add(p, environ=environ)
    return p


def test_the_operations_guide_holds_the_current_table() -> None:
    assert settings.markdown() in (ROOT / "docs" / "operations.md").read_text(), \
        "regenerate the table of docs/operations.md with `python -m cyclone_server.serve.settings`"


def test_every_server_flag_is_a_declared_setting_with_its_own_variable() -> None:
    p = argparse.ArgumentParser()
    cli.add_server_flags(p)
    flags = {s for a in p._actions for s in a.option_strings if s.startswith("--") and a.help != argparse.SUPPRESS} - {"--help"}
    assert flags == {s.flag for s in settings.SETTINGS}
    envs = [s.env for s in settings.SETTINGS]
    assert len(set(envs)) == len(envs) and all(e.startswith("CYCLONE_") for e in envs)
    assert all(s.help for s in settings.SETTINGS)


def test_a_variable_sets_a_value_and_a_flag_wins_over_it() -> None:
    env = {"CYCLONE_LEASE_TTL": "12.5", "CYCLONE_NO_MIGRATE": "yes", "CYCLONE_LOG_LEVEL": "debug",
           "CYCLONE_PROCESSES": "2"}
    args = parser(env).parse_args([])
    assert (args.lease_ttl, args.no_migrate, args.log_level, args.processes) == (12.5, True, "DEBUG", 2)
    assert parser(env).parse_args(["--lease-ttl", "3"]).lease_ttl == 3.0
    defaults = parser({}).parse_args([])
    assert (defaults.lease_ttl, defaults.no_migrate, defaults.listen) == (30.0, False, "127.0.0.1:7233")


@pytest.mark.parametrize(("env", "flag"), [({"CYCLONE_LEASE_TTL": "-1"}, "--lease-ttl"),
                                           ({"CYCLONE_PROCESSES": "two"}, "--processes"),
                                           ({"CYCLONE_LISTEN": "nowhere"}, "--listen"),
                                           ({"CYCLONE_LOG_LEVEL": "LOUD"}, "--log-level"),
                                           ({"CYCLONE_EVENT_LOOP": "trio"}, "--event-loop")])
def test_a_bad_variable_is_refused_naming_the_flag(env: dict[str, str], flag: str,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit:
        parser(env).parse_args([])
    assert exit.value.code == 2
    assert f"argument {flag}" in capsys.readouterr().err
