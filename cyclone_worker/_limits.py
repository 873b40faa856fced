"""Flow control in the SDK: the limits a node or a job consumes (`LimitUse`), a limit as read
back (`Limit`), and the Limits calls of the client. docs/flow-control.md says what a limit does."""

from __future__ import annotations

import builtins
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from cyclone_proto import limits_pb2, limits_pb2_grpc
from ._models import _time, enum_name
from .values import Seconds, from_duration, to_duration

__all__ = ["LimitUse", "Limit", "LimitKeyStats", "LimitCalls", "STRATEGIES", "SCOPES", "limit_request",
           "limit_uses_proto"]

#: What a limit does when a step (or run) arrives and its key is full (docs/flow-control.md, "Strategies").
STRATEGIES = ("queue", "cancel_newest", "cancel_oldest", "keep_newest")
#: What one unit of a limit is: a running step, or an active run of the limit's workflows.
SCOPES = ("steps", "runs")


@dataclass(frozen=True)
class LimitUse:
    """One limit a node or a job consumes, under a key: a constant `key`, or `key_path`, a field
    path of the run input ("input.tenant" or "tenant") read once when the run is submitted or the
    job enqueued. Neither: the constant key "". The limit must exist when the run is submitted.

    Example::

        Workflow("sync").task("pull", limits=[LimitUse("per-tenant", key_path="input.tenant")])
        await client.enqueue("email", {"tenant": "acme"}, limits=[LimitUse("smtp")])
    """

    limit: str
    key: str = ""
    key_path: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.limit, str) or not self.limit:
            raise ValueError(f"limit: {self.limit!r} must be a limit's name")
        for name in ("key", "key_path"):
            if not isinstance(getattr(self, name), str):
                raise TypeError(f"{name}: {getattr(self, name)!r} is not a string")
        if self.key and self.key_path:
            raise ValueError(f"limit {self.limit!r}: give key or key_path, not both")

    def to_proto(self) -> limits_pb2.LimitUse:
        return limits_pb2.LimitUse(limit=self.limit, key=self.key, key_path=self.key_path)

    @classmethod
    def from_proto(cls, u: limits_pb2.LimitUse) -> LimitUse:
        return cls(u.limit, u.key, u.key_path)


def limit_uses_proto(uses: Iterable[LimitUse], where: str = "limits") -> list[limits_pb2.LimitUse]:
    """`uses` as LimitUse messages; TypeError naming the entry (``limits[1]``) when one is not a LimitUse."""
    if isinstance(uses, str | bytes | Mapping | LimitUse):
        raise TypeError(f"{where}: expected a list of LimitUse, got {uses!r}")
    out = []
    for i, use in enumerate(uses):
        if not isinstance(use, LimitUse):
            raise TypeError(f"{where}[{i}]: expected a cyclone_worker.LimitUse, got {type(use).__name__}")
        out.append(use.to_proto())
    return out


def _word(value: str, words: Sequence[str], field: str, enum: Any, prefix: str) -> int:
    if value not in words:
        raise ValueError(f"{field}: {value!r} is not one of {', '.join(words)}")
    return int(enum.Value(prefix + value.upper()))


def _int32(value: Any, arg: str) -> None:
    """An integer argument as the message carries it (int32): TypeError / ValueError naming it."""
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{arg}: expected an integer, got {value!r}")
    if not -(1 << 31) <= value < (1 << 31):
        raise ValueError(f"{arg}: {value} is out of range (the server takes at most {(1 << 31) - 1})")


def limit_request(name: str, *, max_running: int | None = None, rate: int | None = None,
                  period: Seconds | None = None, strategy: str = "queue", scope: str = "steps",
                  kinds: Iterable[str] = (), workflows: Iterable[str] = (), key: str = "", key_path: str = "",
                  weights: Mapping[str, int] | None = None) -> limits_pb2.Limit:
    """The Limit message of `Client.set_limit`'s arguments; ValueError / TypeError naming the argument.
    The server checks the rest (ranges, names) and names the field of what it refuses."""
    for arg, value in (("kinds", kinds), ("workflows", workflows)):
        if isinstance(value, str):
            raise TypeError(f"{arg}: expected a list of names, got the string {value!r}")
    for arg, number in (("max_running", max_running), ("rate", rate),
                        *((f"weights[{k!r}]", w) for k, w in (weights or {}).items())):
        _int32(number, arg)
    m = limits_pb2.Limit(name=name, max_running=max_running or 0, rate=rate or 0,
                         strategy=_word(strategy, STRATEGIES, "strategy", limits_pb2.LimitStrategy, "LIMIT_STRATEGY_"),
                         scope=_word(scope, SCOPES, "scope", limits_pb2.LimitScope, "LIMIT_SCOPE_"),
                         kinds=list(kinds), workflows=list(workflows), key=key, key_path=key_path,
                         weights=dict(weights or {}))
    if period is not None:
        m.period.CopyFrom(to_duration(period, "period"))
    return m


@dataclass
class LimitKeyStats:
    """How one key of a limit stands: `running` steps (scope steps) or admitted runs (scope runs),
    `waiting` ones, the age in seconds of the oldest waiting one, and the starts in the rate's
    current window."""

    key: str
    running: int
    waiting: int
    oldest_waiting_age: float
    starts_in_window: int


@dataclass
class Limit:
    """A limit as stored (`Client.get_limit`, `list_limits`, `set_limit`), with its busiest keys
    (at most 20, busiest first). `max_running`, `rate` and `period` (seconds) are None when unset;
    `strategy` and `scope` are words of STRATEGIES and SCOPES; `key_path` reads "input.<path>".

    Example::

        limit = await client.get_limit("per-tenant")
        for k in limit.keys:
            print(k.key, k.running, "/", limit.max_running, "running,", k.waiting, "waiting")
    """

    name: str
    max_running: int | None
    rate: int | None
    period: float | None
    strategy: str
    scope: str
    kinds: list[str] = field(default_factory=list)
    workflows: list[str] = field(default_factory=list)
    key: str = ""
    key_path: str = ""
    weights: dict[str, int] = field(default_factory=dict)
    keys: list[LimitKeyStats] = field(default_factory=list)
    created_at: datetime | None = None
    updated_at: datetime | None = None

    def key_stats(self, key: str) -> LimitKeyStats | None:
        """The stats of `key`, or None when it is not among the listed (busiest) keys."""
        return next((k for k in self.keys if k.key == key), None)

    @classmethod
    def from_proto(cls, m: limits_pb2.Limit) -> Limit:
        return cls(
            name=m.name, max_running=m.max_running or None, rate=m.rate or None,
            period=from_duration(m.period) if m.HasField("period") else None,
            strategy=enum_name(limits_pb2.LimitStrategy, m.strategy, "LIMIT_STRATEGY_"),
            scope=enum_name(limits_pb2.LimitScope, m.scope, "LIMIT_SCOPE_"),
            kinds=list(m.kinds), workflows=list(m.workflows), key=m.key, key_path=m.key_path,
            weights=dict(m.weights),
            keys=[LimitKeyStats(k.key, k.running, k.waiting, from_duration(k.oldest_waiting_age), k.starts_in_window)
                  for k in m.keys],
            created_at=_time(m, "created_at"), updated_at=_time(m, "updated_at"))


class LimitCalls:
    """The Limits calls of `Client` (a part of it: `_call` is the Client's). SetLimit and
    DeleteLimit need the admin role, GetLimit and ListLimits the submit role."""

    if TYPE_CHECKING:  # Client's own, which this part of it calls
        async def _call(self, stub_cls: Any, method: str, request: Any, timeout: float | None = None,
                        trace: Any = None) -> Any: ...

    async def set_limit(self, name: str, *, max_running: int | None = None, rate: int | None = None,
                        period: Seconds | None = None, strategy: str = "queue", scope: str = "steps",
                        kinds: Iterable[str] = (), workflows: Iterable[str] = (), key: str = "",
                        key_path: str = "", weights: Mapping[str, int] | None = None) -> Limit:
        """Create the limit `name`, or replace every setting of the one with this name; returns it.

        At most `max_running` running steps (scope "steps") or active runs (scope "runs") per key,
        at most `rate` starts per key in any window of `period` seconds; `strategy` is "queue",
        "cancel_newest", "cancel_oldest" or "keep_newest"; `weights` share the claims among keys
        (default 1). The steps of `kinds` (scope "steps") or the runs of `workflows` (scope
        "runs") consume it under `key` or `key_path`, those queued or active now included; nodes
        and jobs can also name it (`LimitUse`). A bad setting is CycloneClientError
        INVALID_ARGUMENT naming the field.

        Example::

            await client.set_limit("per-tenant", max_running=2, kinds=["sync"], key_path="input.tenant")
            await client.set_limit("api", rate=100, period=60, weights={"premium": 3})
        """
        req = limits_pb2.SetLimitRequest(limit=limit_request(
            name, max_running=max_running, rate=rate, period=period, strategy=strategy, scope=scope, kinds=kinds,
            workflows=workflows, key=key, key_path=key_path, weights=weights))
        return Limit.from_proto(await self._call(limits_pb2_grpc.LimitsStub, "SetLimit", req))

    async def get_limit(self, name: str) -> Limit:
        """The limit `name` with its busiest keys; CycloneClientError NOT_FOUND when there is none.

        Example::

            print((await client.get_limit("per-tenant")).keys)
        """
        req = limits_pb2.GetLimitRequest(name=name)
        return Limit.from_proto(await self._call(limits_pb2_grpc.LimitsStub, "GetLimit", req))

    async def list_limits(self) -> builtins.list[Limit]:
        """Every limit, by name, each with its busiest keys.

        Example::

            for limit in await client.list_limits():
                print(limit.name, limit.max_running, limit.rate, limit.period)
        """
        resp = await self._call(limits_pb2_grpc.LimitsStub, "ListLimits", limits_pb2.ListLimitsRequest())
        return [Limit.from_proto(m) for m in resp.limits]

    async def delete_limit(self, name: str) -> None:
        """Delete the limit: the steps it held are claimable at the next claim, and nodes or jobs
        naming it can no longer be submitted. CycloneClientError NOT_FOUND when there is none.

        Example::

            await client.delete_limit("per-tenant")
        """
        await self._call(limits_pb2_grpc.LimitsStub, "DeleteLimit", limits_pb2.DeleteLimitRequest(name=name))
