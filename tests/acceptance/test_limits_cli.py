"""`cyclone limits list|get|set|delete` as an operator runs them: a CLI process against a real server process.

Steps are enqueued and claimed through the engine on the test's database (no worker
connects, so the server's dispatcher leaves them alone); the CLI sees the limits and the
usage of their keys over gRPC (Limits/*), and a held step's reason in `runs get`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cyclone_server.store.engine import Engine

from console_helpers import ADMIN_TOKEN, SUBMIT_TOKEN
from test_cli_ops import cli


def rows(text: str, header: str) -> list[list[str]]:
    """The rows (split on spaces) of the table whose header line starts with `header`, up to a blank line."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    out = []
    for line in lines[start + 1:]:
        if not line.strip():
            break
        out.append(line.split())
    return out


async def enqueue(engine: Engine, kind: str, tenants: str) -> list[str]:
    return [(await engine.enqueue(kind, input={"tenant": t}))[0] for t in tenants]


async def test_set_list_get_and_delete_a_limit_with_the_usage_of_its_keys(server: Any, engine: Engine) -> None:
    made = cli(server.address, "limits", "set", "tenants", "--max-running", "2", "--kind", "work",
               "--key-path", "input.tenant", "--weight", "acme=3", "--weight", "b=eta=2")
    assert made.returncode == 0, made.stderr
    lines = made.stdout.splitlines()
    assert lines[0].split() == ["limit", "tenants", "(scope", "steps,", "strategy", "queue)", "created"]
    assert "cap       2 running steps per key" in lines and "applies   kinds work" in lines
    assert "key       input.tenant" in lines and "weights   acme=3, b=eta=2" in lines
    assert "no step or run waits or runs under this limit" in lines

    runs = await enqueue(engine, "work", "aaaab")
    assert len(await engine.claim("cli-test", ["work"], 10, 30)) == 3  # a, a (at its cap) and b

    listed = cli(server.address, "limits", "list")
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.splitlines()[0].split() == ["NAME", "SCOPE", "STRATEGY", "MAX", "RUNNING", "RATE",
                                                     "APPLIES", "TO", "KEY", "WEIGHTS"]
    assert rows(listed.stdout, "NAME") == [["tenants", "steps", "queue", "2", "-", "kinds", "work", "input.tenant",
                                            "acme=3,b=eta=2"]]
    keys = rows(listed.stdout, "LIMIT")
    assert [k[:4] for k in keys] == [["tenants", "a", "2/2", "2"], ["tenants", "b", "1/2", "0"]]
    assert re.fullmatch(r"\d+\.\ds", keys[0][4]) and keys[1][4:] == ["-", "-"]  # oldest waiting; no rate
    data = json.loads(cli(server.address, "limits", "list", "--json").stdout)
    # int64 is a JSON string; a zero is left out
    assert [(k["key"], k["running"], k.get("waiting")) for k in data[0]["keys"]] == [("a", "2", "2"), ("b", "1", None)]
    assert len(rows(cli(server.address, "limits", "list", "--keys", "1").stdout, "LIMIT")) == 1

    got = cli(server.address, "limits", "get", "tenants")
    assert got.returncode == 0, got.stderr
    assert [k[:4] for k in rows(got.stdout, "LIMIT")] == [["tenants", "a", "2/2", "2"], ["tenants", "b", "1/2", "0"]]
    assert json.loads(cli(server.address, "limits", "get", "tenants", "--json").stdout)["max_running"] == 2

    # The step a limit holds says so in `runs get`.
    held = cli(server.address, "runs", "get", runs[3])
    assert held.returncode == 0, held.stderr
    assert "waiting: limit tenants key a: 2/2 running" in held.stdout

    replaced = cli(server.address, "limits", "set", "tenants", "--max-running", "3", "--kind", "work",
                   "--key-path", "input.tenant")
    assert replaced.returncode == 0 and replaced.stdout.split("\n")[0].endswith("replaced"), replaced.stdout
    assert "weights" not in replaced.stdout  # set replaces every setting: the weights not given are gone

    rated = cli(server.address, "limits", "set", "api", "--rate", "100", "--per", "minute", "--kind", "call",
                "--key", "global", "--strategy", "keep_newest")
    assert rated.returncode == 0, rated.stderr
    assert "rate      100 per 1m per key" in rated.stdout and 'key       "global"' in rated.stdout
    assert "strategy keep_newest" in rated.stdout and "cap       none" in rated.stdout
    await engine.enqueue("call")
    assert len(await engine.claim("cli-test", ["call"], 10, 30)) == 1
    [api] = [k for k in rows(cli(server.address, "limits", "list").stdout, "LIMIT") if k[0] == "api"]
    assert api == ["api", "global", "1", "0", "-", "1/100"]
    slow = cli(server.address, "limits", "set", "slow", "--rate", "5", "--period", "90s", "--scope", "runs",
               "--workflow", "etl")
    assert slow.returncode == 0 and "rate      5 per 90s per key" in slow.stdout, slow.stdout + slow.stderr
    assert "applies   workflows etl" in slow.stdout

    deleted = cli(server.address, "limits", "delete", "api")
    assert deleted.returncode == 0 and deleted.stdout.startswith("limit api deleted"), deleted.stderr
    assert cli(server.address, "limits", "delete", "api", "--json").returncode == 1
    missing = cli(server.address, "limits", "get", "api")
    assert missing.returncode == 1 and missing.stderr.startswith("cyclone: NOT_FOUND:") and "api" in missing.stderr
    assert [row[0] for row in rows(cli(server.address, "limits", "list").stdout, "NAME")] == ["slow", "tenants"]


async def test_refusals_are_shown_as_the_other_commands_show_them(server: Any) -> None:
    needs_cap = cli(server.address, "limits", "set", "dedupe", "--strategy", "cancel_newest")
    assert needs_cap.returncode == 1
    assert needs_cap.stderr.startswith("cyclone: INVALID_ARGUMENT: limit.strategy: cancel_newest needs max_running")
    no_period = cli(server.address, "limits", "set", "rps", "--rate", "5")
    assert no_period.returncode == 1 and "INVALID_ARGUMENT: limit.period" in no_period.stderr
    too_long = cli(server.address, "limits", "set", "rps", "--rate", "5", "--period", "2d")
    assert too_long.returncode == 1 and "limit.period: must be from 1 second to 1 day" in too_long.stderr
    bad_name = cli(server.address, "limits", "get", "no such name")
    assert bad_name.returncode == 1 and "INVALID_ARGUMENT" in bad_name.stderr
    for args in (["--weight", "acme"], ["--weight", "acme=x"], ["--per", "minute", "--period", "5s"],
                 ["--key", "a", "--key-path", "input.a"], ["--strategy", "drop"], ["--max-running", "many"],
                 ["--weight", "acme=3", "--weight", "acme=4"]):
        usage = cli(server.address, "limits", "set", "x", *args)
        assert usage.returncode == 2 and "usage:" in usage.stderr, (args, usage.stderr)
    for keys in ("-1", "many"):
        usage = cli(server.address, "limits", "list", "--keys", keys)
        assert usage.returncode == 2 and "is not a count of keys" in usage.stderr, usage.stderr
    assert cli(server.address, "limits", "list", "--json").stdout.strip() == "[]"


async def test_reading_limits_needs_submit_and_changing_them_admin(start_server: Callable[..., Any], db_url: str,
                                                                   tmp_path: Path) -> None:
    tokens = tmp_path / "tokens.txt"
    tokens.write_text(f"{SUBMIT_TOKEN} submit\n{ADMIN_TOKEN} admin\n")
    srv = start_server(db_url, extra_args=["--tokens-file", str(tokens)])
    refused = cli(srv.address, "limits", "set", "cap", "--max-running", "1", "--token", SUBMIT_TOKEN)
    assert refused.returncode == 1 and refused.stderr.startswith("cyclone: PERMISSION_DENIED:"), refused.stderr
    assert cli(srv.address, "limits", "set", "cap", "--max-running", "1", "--token", ADMIN_TOKEN).returncode == 0
    listed = cli(srv.address, "limits", "list", "--token", SUBMIT_TOKEN)
    assert listed.returncode == 0 and rows(listed.stdout, "NAME")[0][:4] == ["cap", "steps", "queue", "1"]
    anonymous = cli(srv.address, "limits", "list")
    assert anonymous.returncode == 1 and anonymous.stderr.startswith("cyclone: UNAUTHENTICATED:")
