"""`cyclone limits ...`: set, read and delete the limits of flow control over gRPC (Limits), as tables or JSON.

Each command is one call of the public API, as `cyclone runs ...` (cli/runs.py), whose
connection options and exit codes it shares: 0 success, 1 an RPC failed (status and
message on stderr), 2 bad arguments. The rules of a limit are the server's
(limit_spec.py): `set` sends what it is given and shows the server's refusal as it is.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from rich.console import RenderableType

from cyclone_proto import limits_pb2

from cyclone_server.limit_spec import SCOPES, STRATEGIES

from .common import Client, Command, HelpFormatter, Leaves, duration, pb_duration, show
from .show import age, table, ts

PER = {"second": 1, "minute": 60, "hour": 3600, "day": 86400}
KEYS_HEADER = ["LIMIT", "KEY", "RUNNING", "WAITING", "OLDEST WAITING", "STARTS IN WINDOW"]
LIST_KEYS = 5  # busiest keys per limit that `limits list` shows (`limits get` shows all the server sends)


def _enum(enum: Any, value: int, prefix: str) -> str:
    return enum.Name(value).removeprefix(prefix).lower() if value in enum.values() else str(value)


def strategy(limit: limits_pb2.Limit) -> str:
    return _enum(limits_pb2.LimitStrategy, limit.strategy, "LIMIT_STRATEGY_")


def scope(limit: limits_pb2.Limit) -> str:
    return _enum(limits_pb2.LimitScope, limit.scope, "LIMIT_SCOPE_")


def period(seconds: float) -> str:
    """86400 -> '1d', 90 -> '90s', 300 -> '5m'."""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"


def rate(limit: limits_pb2.Limit) -> str:
    return f"{limit.rate} per {period(limit.period.ToTimedelta().total_seconds())}" if limit.rate else ""


def applies_to(limit: limits_pb2.Limit) -> str:
    if limit.workflows:
        return "workflows " + ",".join(limit.workflows)
    return "kinds " + ",".join(limit.kinds) if limit.kinds else "nodes naming it"


def key_of(limit: limits_pb2.Limit) -> str:
    """The key of the steps and runs its kinds or workflows attach: a path of the input, or a constant."""
    return limit.key_path or (f'"{limit.key}"' if limit.key else "")


def key_rows(limit: limits_pb2.Limit, keys: Sequence[limits_pb2.LimitKeyStats]) -> list[list[Any]]:
    """Per key: running (of max_running), waiting, how long the oldest waiting step has, starts (of rate)."""
    return [[limit.name, f'"{k.key}"' if k.key == "" else k.key,
             f"{k.running}/{limit.max_running}" if limit.max_running else k.running, k.waiting,
             age(k.oldest_waiting_age.ToTimedelta().total_seconds()) if k.waiting else "",
             f"{k.starts_in_window}/{limit.rate}" if limit.rate else ""] for k in keys]


def limit_view(limit: limits_pb2.Limit, note: str = "") -> list[RenderableType | str]:
    unit = "active runs" if scope(limit) == "runs" else "running steps"
    lines = [f"limit     {limit.name}  (scope {scope(limit)}, strategy {strategy(limit)}){note}",
             f"cap       {f'{limit.max_running} {unit} per key' if limit.max_running else 'none'}",
             f"rate      {f'{rate(limit)} per key' if limit.rate else 'none'}",
             f"applies   {applies_to(limit)}",
             f"key       {key_of(limit) or '(one key for all)'}"]
    if limit.weights:
        lines.append("weights   " + ", ".join(f"{k}={w}" for k, w in sorted(limit.weights.items())))
    lines.append(f"created   {ts(limit, 'created_at')} UTC   updated {ts(limit, 'updated_at')} UTC")
    if not limit.keys:
        return [*lines, "", "no step or run waits or runs under this limit"]
    return [*lines, "", table(KEYS_HEADER, key_rows(limit, limit.keys))]


async def cmd_list(c: Client, a: argparse.Namespace) -> int:
    resp = await c.limits.ListLimits(limits_pb2.ListLimitsRequest(), timeout=c.timeout)
    limits = list(resp.limits)
    rows = [[x.name, scope(x), strategy(x), x.max_running or "", rate(x), applies_to(x), key_of(x),
             ",".join(f"{k}={w}" for k, w in sorted(x.weights.items()))] for x in limits]
    items: list[RenderableType | str] = [table(["NAME", "SCOPE", "STRATEGY", "MAX RUNNING", "RATE", "APPLIES TO",
                                               "KEY", "WEIGHTS"], rows)]
    busiest = [row for x in limits for row in key_rows(x, x.keys[:a.keys])]
    if busiest:
        items += ["", f"busiest keys (at most {a.keys} per limit):", table(KEYS_HEADER, busiest)]
    return show(a, limits, *items)


async def cmd_get(c: Client, a: argparse.Namespace) -> int:
    limit = await c.limits.GetLimit(limits_pb2.GetLimitRequest(name=a.name), timeout=c.timeout)
    return show(a, limit, *limit_view(limit))


def limit_of(a: argparse.Namespace) -> limits_pb2.Limit:
    """The Limit that `limits set` sends: every field, those not given at their default (SetLimit replaces all)."""
    limit = limits_pb2.Limit(name=a.name, max_running=a.max_running or 0, rate=a.rate or 0, kinds=a.kind,
                             workflows=a.workflow, key=a.key or "", key_path=a.key_path or "", weights=dict(a.weight))
    seconds = PER[a.per] if a.per else a.period
    if seconds is not None:
        limit.period.CopyFrom(pb_duration(seconds))
    if a.strategy:
        limit.strategy = limits_pb2.LimitStrategy.Value("LIMIT_STRATEGY_" + a.strategy.upper())
    if a.scope:
        limit.scope = limits_pb2.LimitScope.Value("LIMIT_SCOPE_" + a.scope.upper())
    return limit


async def cmd_set(c: Client, a: argparse.Namespace) -> int:
    limit = await c.limits.SetLimit(limits_pb2.SetLimitRequest(limit=limit_of(a)), timeout=c.timeout)
    created = limit.created_at == limit.updated_at  # one statement wrote both: a new limit
    return show(a, limit, *limit_view(limit, "  created" if created else "  replaced"))


async def cmd_delete(c: Client, a: argparse.Namespace) -> int:
    resp = await c.limits.DeleteLimit(limits_pb2.DeleteLimitRequest(name=a.name), timeout=c.timeout)
    return show(a, resp, f"limit {a.name} deleted (the steps it held are claimable at the next claim)")


def weight(text: str) -> tuple[str, int]:
    """'acme=3' -> ('acme', 3); the key may hold '=' itself (the last one splits)."""
    key, sep, n = text.rpartition("=")
    try:
        if sep:
            return key, int(n)
    except ValueError:
        pass
    raise argparse.ArgumentTypeError(f"{text!r} is not KEY=N (a key and its weight, 1 to 1000)")


class _Weights(argparse.Action):
    """--weight KEY=N, repeatable: a key given twice is an error (exit 2), not the last one winning."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        got = list(getattr(namespace, self.dest) or [])
        key, n = values
        if any(k == key for k, _ in got):
            parser.error(f"argument --weight: key {key!r} is given twice")
        setattr(namespace, self.dest, got + [(key, n)])


def keys_arg(text: str) -> int:
    """--keys: a count of keys, 0 or more."""
    try:
        n = int(text)
    except ValueError:
        n = -1
    if n < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a count of keys (0 or more)")
    return n


def _set_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-running", type=int, metavar="N",
                   help="at most N running steps (scope steps) or active runs (scope runs) per key")
    p.add_argument("--rate", type=int, metavar="N", help="at most N starts per key in any window of the period")
    window = p.add_mutually_exclusive_group()
    window.add_argument("--per", choices=list(PER), help="the period of --rate")
    window.add_argument("--period", type=duration, metavar="DURATION",
                        help="the period of --rate: seconds, or 90s, 5m, 1h (1 second to 1 day)")
    p.add_argument("--strategy", choices=STRATEGIES,
                   help="what an arrival beyond --max-running does (default queue: it waits)")
    p.add_argument("--scope", choices=SCOPES, help="what a slot is: a running step, or an active run of "
                                                   "--workflow (default steps)")
    p.add_argument("--kind", action="append", default=[], metavar="KIND",
                   help="every step of this kind consumes the limit (repeat for more; scope steps)")
    p.add_argument("--workflow", action="append", default=[], metavar="WORKFLOW",
                   help="every run of this workflow consumes the limit (repeat for more; scope runs)")
    key = p.add_mutually_exclusive_group()
    key.add_argument("--key", help="the key of what --kind or --workflow attaches: a constant")
    key.add_argument("--key-path", metavar="PATH", help="... or a field of the run input, e.g. input.tenant")
    p.add_argument("--weight", type=weight, action=_Weights, default=[], metavar="KEY=N",
                   help="fair dispatch: KEY gets N slots for each one of a key of weight 1 (repeat for more)")


def register(subparsers: argparse._SubParsersAction, leaves: Leaves) -> None:  # type: ignore[type-arg]
    """Add `limits` with its commands."""
    group = subparsers.add_parser("limits", help="set, read and delete the limits of flow control",
                                  formatter_class=HelpFormatter).add_subparsers(
        dest="limits_command", required=True, metavar="COMMAND")

    def leaf(name: str, cmd: Command, help: str, *, named: bool = True) -> argparse.ArgumentParser:
        return leaves(group, name, cmd, help, *(["name=the limit's name"] if named else []))

    p = leaf("list", cmd_list, "every limit with its settings and its busiest keys", named=False)
    p.add_argument("--keys", type=keys_arg, default=LIST_KEYS, metavar="N", help="busiest keys shown per limit")
    leaf("get", cmd_get, "one limit with the usage of its busiest keys (at most 20)")
    _set_arguments(leaf("set", cmd_set, "create a limit, or replace every setting of one (those not given are "
                                        "reset to their defaults)"))
    leaf("delete", cmd_delete, "delete a limit (the steps it held are no longer held)")


__all__ = ["register", "limit_view", "key_rows"]
