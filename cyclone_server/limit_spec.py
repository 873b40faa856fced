"""Validates a limit (Limits.SetLimit, `cyclone limits set`) before it is stored: every rule of limits.proto."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .definitions import parse_key_path, validate_key, validate_kind, validate_name
from .errors import InvalidArgument

STRATEGIES = ("queue", "cancel_newest", "cancel_oldest", "keep_newest")
SCOPES = ("steps", "runs")
MAX_COUNT = 1_000_000
MIN_PERIOD, MAX_PERIOD = 1.0, 86_400.0
MAX_WEIGHT = 1000
MAX_ATTACHED = 100


def normalize_limit(d: Mapping[str, Any]) -> dict[str, Any]:
    """A limit as SetLimit takes it -> the row to store: {name, max_running, rate, period, strategy,
    scope, kinds, workflows, key_path, key_const, weights}. InvalidArgument names the field."""
    name = validate_name(d.get("name"), "limit.name")
    out: dict[str, Any] = {"name": name}
    for field in ("max_running", "rate"):
        v = d.get(field) or None
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= MAX_COUNT):
            raise InvalidArgument(f"limit.{field}: must be from 1 to {MAX_COUNT:,} (0 or unset: none), got {v!r}")
        out[field] = v
    period = d.get("period") or None
    if (out["rate"] is None) != (period is None):
        raise InvalidArgument("limit.period: a rate needs a period and a period a rate"
                              if out["rate"] is None else "limit.period: a rate needs a period (1 s to 1 day)")
    if period is not None and not MIN_PERIOD <= period <= MAX_PERIOD:
        raise InvalidArgument(f"limit.period: must be from 1 second to 1 day, got {period!r} s")
    out["period"] = period
    strategy = d.get("strategy") or "queue"
    if strategy not in STRATEGIES:
        raise InvalidArgument(f"limit.strategy: {strategy!r} is not one of {', '.join(STRATEGIES)}")
    if strategy in ("cancel_newest", "cancel_oldest") and out["max_running"] is None:
        raise InvalidArgument(f"limit.strategy: {strategy} needs max_running (the count it keeps)")
    out["strategy"] = strategy
    scope = d.get("scope") or "steps"
    if scope not in SCOPES:
        raise InvalidArgument(f"limit.scope: {scope!r} is not one of {', '.join(SCOPES)}")
    out["scope"] = scope
    kinds = list(d.get("kinds") or [])
    workflows = list(d.get("workflows") or [])
    for field, items in (("kinds", kinds), ("workflows", workflows)):
        if len(items) > MAX_ATTACHED:
            raise InvalidArgument(f"limit.{field}: {len(items)} entries, more than {MAX_ATTACHED}")
        if len(set(items)) != len(items):
            raise InvalidArgument(f"limit.{field}: an entry is listed twice")
    for i, k in enumerate(kinds):
        validate_kind(k, f"limit.kinds[{i}]")
    for i, w in enumerate(workflows):
        validate_name(w, f"limit.workflows[{i}]")
    if scope == "runs" and kinds:
        raise InvalidArgument("limit.kinds: a limit of scope runs attaches to workflows, not kinds")
    if scope == "steps" and workflows:
        raise InvalidArgument("limit.workflows: a limit of scope steps attaches to kinds (or nodes), not workflows")
    if scope == "runs" and not workflows:
        raise InvalidArgument("limit.workflows: a limit of scope runs names the workflows whose runs it caps")
    out["kinds"], out["workflows"] = kinds, workflows
    key, key_path = d.get("key") or "", d.get("key_path") or ""
    if key and key_path:
        raise InvalidArgument("limit.key_path: give key or key_path, not both")
    out["key_path"] = parse_key_path(key_path, "limit.key_path") if key_path else None
    out["key_const"] = validate_key(key, "limit.key")
    weights = dict(d.get("weights") or {})
    for k, w in weights.items():
        validate_key(k, f"limit.weights[{k!r}]")
        if isinstance(w, bool) or not isinstance(w, int) or not 1 <= w <= MAX_WEIGHT:
            raise InvalidArgument(f"limit.weights[{k!r}]: must be from 1 to {MAX_WEIGHT}, got {w!r}")
    out["weights"] = weights
    return out


__all__ = ["normalize_limit", "STRATEGIES", "SCOPES"]
