"""Validates workflow definitions and fills in every node option, so stored definitions compare by value."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from typing import Any

from .errors import InvalidArgument

NODE_ID = re.compile(r"^[A-Za-z0-9_.-]{1,128}$")
NAME = re.compile(r"^[A-Za-z0-9_.-]{1,128}$")
KIND = re.compile(r"^[A-Za-z0-9_.:/-]{1,200}$")
NODE_TYPES = ("task", "child", "sleep", "signal")
ON_DEP_FAILURE = ("fail_run", "cancel_branch")
MAX_NODES = 10_000
# Durations become Postgres intervals added to now(): keep them finite and far from overflow.
MAX_SECONDS = 100 * 365.25 * 86400

# The defaults of every node option (docs/lifecycle.md, "Node option defaults"). Durations are in seconds.
DEFAULTS: dict[str, Any] = {
    "max_attempts": 25,
    "backoff_initial": 1.0,
    "backoff_max": 600.0,
    "priority": None,
    "max_reclaims": 5,
    "attempt_timeout": 600.0,
    "on_dep_failure": "fail_run",
    "retention": None,
    "max_wait": None,
    "sleep": None,
    "signal": None,
    "workflow": None,
}
# `limits` is kept only when a node lists some, so that definitions stored before it
# existed compare equal to the same definition submitted again.
OPTIONS = ("id", "kind", "type", "deps", "limits", *DEFAULTS)
MAX_LIMIT_USES = 8
MAX_KEY_LENGTH = 256
KEY_SEGMENT = re.compile(r"^[^.\x00]{1,128}$")


def validate_name(name: str, field: str = "name") -> str:
    if not isinstance(name, str) or not NAME.match(name):
        raise InvalidArgument(f"{field}: {name!r} is not a valid name ([A-Za-z0-9_.-], 1 to 128 characters)")
    return name


def validate_kind(kind: str, field: str = "kind") -> str:
    if not isinstance(kind, str) or not KIND.match(kind):
        raise InvalidArgument(f"{field}: {kind!r} is not a valid kind ([A-Za-z0-9_.:/-], 1 to 200 characters)")
    return kind


def parse_key_path(path: str, field: str) -> list[str]:
    """'input.customer.id' (or 'customer.id') -> ['customer', 'id']: the path of a limit key in the run input."""
    if not isinstance(path, str) or not path:
        raise InvalidArgument(f"{field}: must be a field path such as input.tenant, got {path!r}")
    parts = path.split(".")
    if parts[0] == "input":
        parts = parts[1:]
    if not parts or len(parts) > 16 or not all(KEY_SEGMENT.match(p) for p in parts):
        raise InvalidArgument(f"{field}: {path!r} is not a field path of the run input "
                              "(input.<field>[.<field>...], at most 16 fields of 1 to 128 characters)")
    return parts


def validate_key(key: str, field: str) -> str:
    if not isinstance(key, str) or len(key) > MAX_KEY_LENGTH or "\x00" in key:
        raise InvalidArgument(f"{field}: must be a string of at most {MAX_KEY_LENGTH} characters without NUL")
    return key


def normalize_limit_uses(value: Any, where: str) -> list[dict[str, Any]]:
    """A node's or job's `limits` -> [{"limit": name, "key": constant} | {"limit": name, "key_path": [...]}].

    Each use names its limit and gives a constant `key` or a `key_path` ("input.tenant"), not both.
    """
    if isinstance(value, str | bytes | Mapping) or not isinstance(value, Iterable):
        raise InvalidArgument(f"{where}: limits: must be a list of {{limit, key | key_path}}, got {value!r}")
    uses = list(value)
    if len(uses) > MAX_LIMIT_USES:
        raise InvalidArgument(f"{where}: limits: {len(uses)} limits, more than {MAX_LIMIT_USES}")
    out: list[dict[str, Any]] = []
    for j, use in enumerate(uses):
        field = f"{where}: limits[{j}]"
        if not isinstance(use, Mapping):
            raise InvalidArgument(f"{field}: must be an object {{limit, key | key_path}}, got {use!r}")
        unknown = set(use) - {"limit", "key", "key_path"}
        if unknown:
            raise InvalidArgument(f"{field}: unknown option(s) {', '.join(sorted(unknown))}")
        name = validate_name(use.get("limit"), f"{field}: limit")
        if any(u["limit"] == name for u in out):
            raise InvalidArgument(f"{field}: limit: {name!r} is listed twice")
        key, path = use.get("key"), use.get("key_path")
        if key and path:
            raise InvalidArgument(f"{field}: give key or key_path, not both")
        if path:
            steps = path if isinstance(path, list) else parse_key_path(path, f"{field}: key_path")
            if not steps or not all(isinstance(p, str) and KEY_SEGMENT.match(p) for p in steps):
                raise InvalidArgument(f"{field}: key_path: {path!r} is not a field path of the run input")
            out.append({"limit": name, "key_path": list(steps)})
        else:
            out.append({"limit": name, "key": validate_key(key or "", f"{field}: key")})
    return out


def normalize_nodes(nodes: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Check a DAG of nodes and return it with every option filled in.

    Each error is an InvalidArgument that names the node (``nodes[i] (id "x")``) and the
    problem: malformed or duplicate ids, unknown deps, cycles, bad options.
    """
    if isinstance(nodes, str | bytes | Mapping) or not isinstance(nodes, Iterable):
        raise InvalidArgument(f"nodes: must be a list of node objects, got {type(nodes).__name__}")
    raw = list(nodes)
    if not raw:
        raise InvalidArgument("nodes: a workflow needs at least one node")
    if len(raw) > MAX_NODES:
        raise InvalidArgument(f"nodes: {len(raw)} nodes, more than the limit of {MAX_NODES}")
    out: list[dict[str, Any]] = []
    seen: dict[str, int] = {}
    for i, node in enumerate(raw):
        out.append(_normalize_node(i, node, seen))
    for i, node in enumerate(out):
        for dep in node["deps"]:
            if dep not in seen:
                raise InvalidArgument(f'nodes[{i}] (id "{node["id"]}"): deps: unknown node "{dep}"')
    _check_acyclic(out)
    return out


def normalize_job(kind: str, options: Mapping[str, Any]) -> dict[str, Any]:
    """The single node of a standalone job (Enqueue): its id is its kind."""
    validate_kind(kind)
    node_id = kind if NODE_ID.match(kind) else "job"
    return normalize_nodes([{**options, "id": node_id, "kind": kind, "type": "task"}])[0]


def _normalize_node(i: int, node: Mapping[str, Any], seen: dict[str, int]) -> dict[str, Any]:
    where = f"nodes[{i}]"
    if not isinstance(node, Mapping):
        raise InvalidArgument(f"{where}: must be an object with an id, got {type(node).__name__}")
    node_id = node.get("id")
    if not isinstance(node_id, str) or not NODE_ID.match(node_id):
        raise InvalidArgument(f"{where}: id: {node_id!r} is not a valid node id ([A-Za-z0-9_.-], 1 to 128 characters)")
    where = f'nodes[{i}] (id "{node_id}")'
    if node_id in seen:
        raise InvalidArgument(f"{where}: id: duplicate node id (also nodes[{seen[node_id]}])")
    seen[node_id] = i
    unknown = set(node) - set(OPTIONS)
    if unknown:
        raise InvalidArgument(f"{where}: unknown option(s) {', '.join(sorted(unknown))}")

    n: dict[str, Any] = {"id": node_id}
    n["kind"] = validate_kind(node.get("kind") or node_id, f"{where}: kind")
    n["type"] = node.get("type") or "task"
    if n["type"] not in NODE_TYPES:
        raise InvalidArgument(f"{where}: type: {n['type']!r} is not one of {', '.join(NODE_TYPES)}")
    raw_deps = node.get("deps") or []
    if isinstance(raw_deps, str | bytes | Mapping) or not isinstance(raw_deps, Iterable):
        raise InvalidArgument(f"{where}: deps: must be a list of node ids, got {raw_deps!r}")
    deps = list(raw_deps)
    for dep in deps:
        if not isinstance(dep, str):
            raise InvalidArgument(f"{where}: deps: {dep!r} is not a node id")
    if node_id in deps:
        raise InvalidArgument(f"{where}: deps: a node cannot depend on itself")
    if len(set(deps)) != len(deps):
        raise InvalidArgument(f"{where}: deps: a dependency is listed twice")
    n["deps"] = deps
    if node.get("limits"):
        if n["type"] != "task":
            raise InvalidArgument(f"{where}: limits: only task nodes consume limits")
        n["limits"] = normalize_limit_uses(node["limits"], where)
    for key, default in DEFAULTS.items():
        value = node.get(key)
        n[key] = default if value is None else value

    def positive(key: str, *, zero_ok: bool = False) -> None:
        v = n[key]
        if v is None:
            return
        if (isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v < 0
                or (v == 0 and not zero_ok)):
            raise InvalidArgument(f"{where}: {key}: must be a {'non-negative' if zero_ok else 'positive'} number, got {v!r}")
        if v > MAX_SECONDS:
            raise InvalidArgument(f"{where}: {key}: must be at most {MAX_SECONDS:.0f} seconds (100 years), got {v!r}")
        n[key] = float(v) if key not in ("max_attempts", "max_reclaims", "priority") else v

    for key in ("backoff_initial", "backoff_max", "attempt_timeout", "max_wait"):
        positive(key)
    for key in ("retention", "sleep"):
        positive(key, zero_ok=True)
    for key, lo, hi in (("max_attempts", 1, 100_000), ("max_reclaims", 0, 100_000)):
        v = n[key]
        if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
            raise InvalidArgument(f"{where}: {key}: must be an integer from {lo} to {hi}, got {v!r}")
    if n["priority"] is not None and (isinstance(n["priority"], bool) or not isinstance(n["priority"], int)
                                      or abs(n["priority"]) > 2**31 - 1):
        raise InvalidArgument(f"{where}: priority: must be a 32-bit integer, got {n['priority']!r}")
    if n["backoff_max"] < n["backoff_initial"]:
        raise InvalidArgument(f"{where}: backoff_max: must be at least backoff_initial")
    if n["on_dep_failure"] not in ON_DEP_FAILURE:
        raise InvalidArgument(f"{where}: on_dep_failure: {n['on_dep_failure']!r} is not one of {', '.join(ON_DEP_FAILURE)}")

    t = n["type"]
    if t == "sleep" and n["sleep"] is None:
        raise InvalidArgument(f"{where}: sleep: a sleep node needs a duration")
    if t != "sleep" and n["sleep"] is not None:
        raise InvalidArgument(f"{where}: sleep: only a sleep node takes a duration")
    if t == "signal":
        n["signal"] = n["signal"] or node_id
        validate_name(n["signal"], f"{where}: signal")
    elif n["signal"] is not None:
        raise InvalidArgument(f"{where}: signal: only a signal node takes a signal name")
    if t == "child":
        if not n["workflow"]:
            raise InvalidArgument(f"{where}: workflow: a child node names the workflow it starts")
        validate_name(n["workflow"], f"{where}: workflow")
    elif n["workflow"] is not None:
        raise InvalidArgument(f"{where}: workflow: only a child node starts a workflow")
    if t == "task" and n["max_wait"] is not None:
        raise InvalidArgument(f"{where}: max_wait: only wait nodes (child, sleep, signal) take max_wait")
    return n


def _check_acyclic(nodes: list[dict[str, Any]]) -> None:
    deps = {n["id"]: n["deps"] for n in nodes}
    state: dict[str, int] = {}  # 1 on the path, 2 done

    for start in deps:
        if state.get(start):
            continue
        stack: list[tuple[str, int]] = [(start, 0)]
        path: list[str] = [start]
        state[start] = 1
        while stack:
            node, i = stack[-1]
            if i < len(deps[node]):
                stack[-1] = (node, i + 1)
                nxt = deps[node][i]
                if state.get(nxt) == 1:
                    cycle = path[path.index(nxt):] + [nxt]
                    idx = next(j for j, n in enumerate(nodes) if n["id"] == nxt)
                    raise InvalidArgument(
                        f'nodes[{idx}] (id "{nxt}"): deps: cycle {" -> ".join(reversed(cycle))}'
                    )
                if not state.get(nxt):
                    state[nxt] = 1
                    stack.append((nxt, 0))
                    path.append(nxt)
            else:
                state[node] = 2
                stack.pop()
                path.pop()
