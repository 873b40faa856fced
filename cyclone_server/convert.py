"""Conversions between the engine's rows and dicts and the cyclone.v1 protobuf messages.

State names are the lifecycle document's words on both sides ('waiting_child' <->
STEP_STATE_WAITING_CHILD). Payloads are JSON values: google.protobuf.Value carries every
number as a double, so an integral number within 2**53 comes back as a Python int and
{"x": 1} round-trips as 1, not 1.0.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

from google.protobuf import duration_pb2, struct_pb2, timestamp_pb2

from cyclone_proto import admin_pb2, limits_pb2, types_pb2
from cyclone_worker import values

from .errors import InvalidArgument

# The payload depth limit is the shared converter's (cyclone_worker.values).
MAX_JSON_DEPTH = values.MAX_JSON_DEPTH

# -- enums ---------------------------------------------------------------------------


def _enum_maps(enum: Any, prefix: str) -> tuple[dict[str, int], dict[int, str]]:
    to_proto = {name[len(prefix):].lower(): number for name, number in enum.items() if not name.endswith("UNSPECIFIED")}
    return to_proto, {number: name for name, number in to_proto.items()}


STEP_STATES, STEP_STATE_NAMES = _enum_maps(types_pb2.StepState, "STEP_STATE_")
RUN_STATES, RUN_STATE_NAMES = _enum_maps(types_pb2.RunState, "RUN_STATE_")
NODE_TYPES, NODE_TYPE_NAMES = _enum_maps(types_pb2.NodeType, "NODE_TYPE_")
ON_DEP_FAILURES, ON_DEP_FAILURE_NAMES = _enum_maps(types_pb2.OnDepFailure, "ON_DEP_FAILURE_")


def run_state_name(value: int, field: str = "states") -> str:
    """A RunState from a request -> 'running' etc.; UNSPECIFIED or unknown is INVALID_ARGUMENT."""
    try:
        return RUN_STATE_NAMES[value]
    except KeyError:
        raise InvalidArgument(f"{field}: {value} is not a run state") from None


# -- JSON payloads -------------------------------------------------------------------


def value_to_py(value: struct_pb2.Value, field: str = "value") -> Any:
    """google.protobuf.Value -> JSON-compatible Python (cyclone_worker.values, strict).

    NaN, infinities, U+0000 and nesting deeper than MAX_JSON_DEPTH are INVALID_ARGUMENT,
    naming the path of the value.
    """
    try:
        return values.from_value(value, field, strict=True)
    except ValueError as e:
        raise InvalidArgument(str(e)) from None


def struct_to_py(struct: struct_pb2.Struct, field: str = "value") -> dict[str, Any]:
    try:
        return values.from_struct(struct, field, strict=True)
    except ValueError as e:
        raise InvalidArgument(str(e)) from None


def optional_value(msg: Any, name: str) -> Any:
    """A request's Value field: unset reads as JSON null."""
    return value_to_py(getattr(msg, name), name) if msg.HasField(name) else None


def py_to_value(obj: Any, out: struct_pb2.Value | None = None) -> struct_pb2.Value:
    """JSON-compatible Python (a stored payload) -> google.protobuf.Value (filling `out` when given)."""
    v = values.to_value(obj, "payload", exact=False)
    if out is None:
        return v
    out.CopyFrom(v)
    return out


# -- times ---------------------------------------------------------------------------


# The ranges that google/protobuf/duration.proto and timestamp.proto define. Values outside
# them are not durations or times at all (and overflow datetime arithmetic).
DURATION_MAX_SECONDS = 315_576_000_000  # 10,000 years
TIMESTAMP_MIN_SECONDS = -62_135_596_800  # 0001-01-01T00:00:00Z
TIMESTAMP_MAX_SECONDS = 253_402_300_799  # 9999-12-31T23:59:59Z
_NANOS = 1_000_000_000


def duration_seconds(msg: Any, name: str, *, field: str | None = None, positive: bool = False,
                     maximum: float | None = None) -> float | None:
    """A request's Duration field in seconds; None when unset.

    The one reader of request Durations: out of protobuf's range, negative (or zero with
    `positive`) or over `maximum` is INVALID_ARGUMENT naming the field.
    """
    if not msg.HasField(name):
        return None
    d = getattr(msg, name)
    label = field or name
    if not -DURATION_MAX_SECONDS <= d.seconds <= DURATION_MAX_SECONDS:
        raise InvalidArgument(f"{label}: seconds out of range (a Duration is at most {DURATION_MAX_SECONDS} s "
                              f"either way), got {d.seconds}")
    if not -_NANOS < d.nanos < _NANOS:
        raise InvalidArgument(f"{label}: nanos out of range (-999999999 to 999999999), got {d.nanos}")
    if (d.seconds > 0 and d.nanos < 0) or (d.seconds < 0 and d.nanos > 0):
        raise InvalidArgument(f"{label}: seconds and nanos have different signs ({d.seconds}, {d.nanos})")
    seconds = d.seconds + d.nanos / 1e9
    if seconds < 0 or (positive and seconds == 0):
        raise InvalidArgument(f"{label}: must be {'> 0' if positive else '>= 0'}, got {seconds:g} s")
    if maximum is not None and seconds > maximum:
        raise InvalidArgument(f"{label}: {seconds:g} s is more than the limit of {maximum:g} s")
    return seconds


def to_duration(seconds: float | timedelta) -> duration_pb2.Duration:
    d = duration_pb2.Duration()
    if isinstance(seconds, timedelta):
        d.FromTimedelta(seconds)
    else:
        d.FromNanoseconds(round(seconds * 1e9))
    return d


def timestamp_dt(msg: Any, name: str, *, field: str | None = None) -> datetime | None:
    """A request's Timestamp field as an aware UTC datetime; None when unset.

    The one reader of request Timestamps: outside protobuf's range (years 1 to 9999, nanos
    in [0, 1e9)) is INVALID_ARGUMENT naming the field.
    """
    if not msg.HasField(name):
        return None
    ts = getattr(msg, name)
    label = field or name
    if not TIMESTAMP_MIN_SECONDS <= ts.seconds <= TIMESTAMP_MAX_SECONDS:
        raise InvalidArgument(f"{label}: seconds out of range (a Timestamp is between 0001-01-01 and 9999-12-31), "
                              f"got {ts.seconds}")
    if not 0 <= ts.nanos < _NANOS:
        raise InvalidArgument(f"{label}: nanos out of range (0 to 999999999), got {ts.nanos}")
    return ts.ToDatetime(tzinfo=timezone.utc)


def to_timestamp(dt: datetime) -> timestamp_pb2.Timestamp:
    ts = timestamp_pb2.Timestamp()
    ts.FromDatetime(dt if dt.tzinfo else dt.replace(tzinfo=timezone.utc))
    return ts


def _set_time(msg: Any, name: str, dt: datetime | str | None) -> None:
    if dt is None:
        return
    if isinstance(dt, str):  # timestamps inside JSONB (error history) are ISO 8601 strings
        dt = datetime.fromisoformat(dt)
    getattr(msg, name).CopyFrom(to_timestamp(dt))


# -- workflows -----------------------------------------------------------------------

_NODE_DURATIONS = ("backoff_initial", "backoff_max", "attempt_timeout", "retention", "max_wait", "sleep")
_NODE_OPTIONAL_INTS = ("max_attempts", "priority", "max_reclaims")


def node_to_dict(node: types_pb2.Node, index: int) -> dict[str, Any]:
    """A Node from a request -> the definitions dict; unset options are absent so defaults apply."""
    where = f"nodes[{index}]" + (f' (id "{node.id}")' if node.id else "")
    d: dict[str, Any] = {"id": node.id}
    if node.kind:
        d["kind"] = node.kind
    if node.deps:
        d["deps"] = list(node.deps)
    if node.type:
        d["type"] = _enum_name(NODE_TYPE_NAMES, node.type, f"{where}: type")
    for key in _NODE_OPTIONAL_INTS:
        if node.HasField(key):
            d[key] = getattr(node, key)
    for key in _NODE_DURATIONS:
        seconds = duration_seconds(node, key, field=f"{where}: {key}")
        if seconds is not None:
            d[key] = seconds
    if node.on_dep_failure:
        d["on_dep_failure"] = _enum_name(ON_DEP_FAILURE_NAMES, node.on_dep_failure, f"{where}: on_dep_failure")
    if node.signal:
        d["signal"] = node.signal
    if node.workflow:
        d["workflow"] = node.workflow
    if node.limits:
        d["limits"] = limit_uses_of(node.limits)
    return d


def limit_uses_of(uses: Any) -> list[dict[str, Any]]:
    """repeated LimitUse -> [{"limit", "key" | "key_path"}] (definitions.normalize_limit_uses checks them)."""
    return [{"limit": u.limit, "key": u.key, "key_path": u.key_path} for u in uses]


def limit_uses_to_proto(uses: list[dict[str, Any]]) -> list[limits_pb2.LimitUse]:
    return [limits_pb2.LimitUse(limit=u["limit"], key=u.get("key") or "",
                                key_path=".".join(["input", *u["key_path"]]) if u.get("key_path") else "")
            for u in uses]


def _enum_name(names: dict[int, str], value: int, field: str) -> str:
    try:
        return names[value]
    except KeyError:
        raise InvalidArgument(f"{field}: {value} is not a known value") from None


def dict_to_node(d: dict[str, Any]) -> types_pb2.Node:
    """A stored (normalized) node -> Node with its defaults spelled out."""
    node = types_pb2.Node(id=d["id"], kind=d.get("kind") or d["id"], deps=d.get("deps") or [],
                          type=NODE_TYPES[d.get("type") or "task"],
                          on_dep_failure=ON_DEP_FAILURES[d.get("on_dep_failure") or "fail_run"],
                          signal=d.get("signal") or "", workflow=d.get("workflow") or "")
    for key in _NODE_OPTIONAL_INTS:
        if d.get(key) is not None:
            setattr(node, key, d[key])
    for key in _NODE_DURATIONS:
        if d.get(key) is not None:
            getattr(node, key).CopyFrom(to_duration(d[key]))
    if d.get("limits"):
        node.limits.extend(limit_uses_to_proto(d["limits"]))
    return node


def workflow_to_proto(row: dict[str, Any]) -> types_pb2.Workflow:
    """A workflow row ({name, version, definition | nodes, created_at}) -> Workflow."""
    nodes = row["nodes"] if "nodes" in row else row["definition"]["nodes"]
    wf = types_pb2.Workflow(name=row["name"], version=row["version"], nodes=[dict_to_node(n) for n in nodes])
    _set_time(wf, "created_at", row.get("created_at"))
    return wf


# -- runs and steps ------------------------------------------------------------------


def step_to_proto(row: dict[str, Any]) -> types_pb2.Step:
    s = types_pb2.Step(
        id=str(row["id"]), run_id=str(row["run_id"]), node=row["node"], kind=row["kind"],
        type=NODE_TYPES[row["type"]], state=STEP_STATES[row["state"]], attempt=row["attempt"],
        max_attempts=row["max_attempts"], reclaims=row["reclaims"], max_reclaims=row["max_reclaims"],
        snoozes=row["snoozes"], priority=row["priority"], lease_owner=row.get("lease_owner") or "",
        lease_generation=row["lease_generation"], error_kind=row.get("error_kind") or "",
        reason=row.get("reason") or "", deps=list(row.get("deps") or []),
        child_run_id=str(row["child_run_id"]) if row.get("child_run_id") else "",
        cancel_cause=row.get("cancel_cause") or "", held_by=row.get("held_by") or "",
        limits=[t.replace("\x1f", "=", 1) for t in row.get("limit_keys") or []],
    )
    if row["state"] == "completed":
        py_to_value(row.get("output"), s.output)
    for e in row.get("errors") or []:
        err = s.errors.add(attempt=e.get("attempt") or 0, error_kind=e.get("error_kind") or "",
                           message=e.get("message") or "", reason=e.get("reason") or "",
                           details=e.get("details") or "")
        _set_time(err, "at", e.get("at"))
    for name in ("scheduled_at", "lease_expiry", "created_at", "started_at", "finished_at", "attempt_deadline"):
        _set_time(s, name, row.get(name))
    if row["state"] == "waiting_timer" and row.get("timer_at") is not None:
        # types.proto: a waiting sleep node's scheduled_at is when its timer fires (the
        # column scheduled_at is about claims, which a sleep node never has).
        _set_time(s, "scheduled_at", row["timer_at"])
    return s


def run_to_proto(row: dict[str, Any]) -> types_pb2.Run:
    """A run row (with 'steps' when read with them) -> Run."""
    r = types_pb2.Run(
        id=str(row["id"]), workflow=row.get("workflow_name") or "", workflow_version=row.get("workflow_version") or 0,
        state=RUN_STATES[row["state"]], priority=row["priority"], idempotency_key=row.get("idempotency_key") or "",
        parent_run_id=str(row["parent_run_id"]) if row.get("parent_run_id") else "",
        parent_step_id=str(row["parent_step_id"]) if row.get("parent_step_id") else "",
        steps=[step_to_proto(s) for s in row.get("steps") or []],
    )
    py_to_value(row.get("input"), r.input)
    if row["state"] == "completed":
        py_to_value(row.get("result") or {}, r.result)
    _set_time(r, "deadline", row.get("deadline_at"))
    for name in ("created_at", "updated_at", "finished_at"):
        _set_time(r, name, row.get(name))
    if row.get("schedule_name"):
        r.schedule_name = row["schedule_name"]
        _set_time(r, "schedule_fire_at", row.get("schedule_fire_at"))
    return r


def kind_stats_to_proto(row: dict[str, Any]) -> admin_pb2.KindStats:
    return admin_pb2.KindStats(kind=row["kind"], available=row["available"], running=row["running"],
                               scheduled=row["scheduled"],
                               oldest_available_age=to_duration(row["oldest_available_age"] or timedelta(0)),
                               workers=row.get("workers") or 0, free_slots=row.get("free_slots") or 0,
                               no_workers=kind_without_workers(row))


def kind_without_workers(row: dict[str, Any]) -> bool:
    """A kind_stats row with steps waiting to be claimed and no connected worker to run them."""
    return not row.get("workers") and (row["available"] > 0 or row["scheduled"] > 0)


def worker_to_proto(row: dict[str, Any]) -> admin_pb2.WorkerInfo:
    w = admin_pb2.WorkerInfo(worker_id=row["worker_id"], sdk=row["sdk"] or "", kinds=list(row["kinds"]),
                             slots=row["slots"], leases_held=row["leases_held"], server_id=row["server_id"])
    _set_time(w, "connected_since", row["connected_at"])
    _set_time(w, "last_heartbeat", row["heartbeat_at"])
    return w


# -- limits --------------------------------------------------------------------------

STRATEGIES, STRATEGY_NAMES = _enum_maps(limits_pb2.LimitStrategy, "LIMIT_STRATEGY_")
SCOPES, SCOPE_NAMES = _enum_maps(limits_pb2.LimitScope, "LIMIT_SCOPE_")


def limit_of(msg: limits_pb2.Limit) -> dict[str, Any]:
    """A Limit from SetLimit -> the dict limit_spec.normalize_limit checks. The fields that only
    responses fill (keys, created_at, updated_at) are ignored, once checked like any other."""
    for name in ("created_at", "updated_at"):
        timestamp_dt(msg, name, field=f"limit.{name}")
    for i, k in enumerate(msg.keys):
        duration_seconds(k, "oldest_waiting_age", field=f"limit.keys[{i}].oldest_waiting_age")
    return {"name": msg.name, "max_running": msg.max_running, "rate": msg.rate,
            "period": duration_seconds(msg, "period", field="limit.period"),
            "strategy": _enum_name(STRATEGY_NAMES, msg.strategy, "limit.strategy") if msg.strategy else None,
            "scope": _enum_name(SCOPE_NAMES, msg.scope, "limit.scope") if msg.scope else None,
            "kinds": list(msg.kinds), "workflows": list(msg.workflows), "key": msg.key, "key_path": msg.key_path,
            "weights": dict(msg.weights)}


def limit_to_proto(row: dict[str, Any], keys: list[dict[str, Any]]) -> limits_pb2.Limit:
    """A cyclone_limits row and its busiest keys (cyclone_limit_keys_stats) -> Limit."""
    m = limits_pb2.Limit(name=row["name"], max_running=row["max_running"] or 0, rate=row["rate"] or 0,
                         strategy=STRATEGIES[row["strategy"]], scope=SCOPES[row["scope"]], kinds=row["kinds"],
                         workflows=row["workflows"], key=row["key_const"] or "",
                         key_path=".".join(["input", *row["key_path"]]) if row["key_path"] else "",
                         weights={k: int(v) for k, v in (row["weights"] or {}).items()})
    if row["period"]:
        m.period.CopyFrom(to_duration(row["period"]))
    for k in keys:
        m.keys.add(key=k["key"], running=k["running"], waiting=k["waiting"],
                   oldest_waiting_age=to_duration(k["oldest_waiting_age"] or timedelta(0)),
                   starts_in_window=k["starts_in_window"] or 0)
    _set_time(m, "created_at", row.get("created_at"))
    _set_time(m, "updated_at", row.get("updated_at"))
    return m
