"""The `cyclone` commands that start work: `workflows register`, `runs submit`, `jobs enqueue`.

A definition file is RegisterWorkflowRequest in the proto JSON mapping, as JSON or YAML
(node `type` and `on_dep_failure` may also be written short: `signal`, `cancel_branch`). An
input is JSON, inline or `@file` (`@-`: stdin), sent through cyclone_worker.values.

    cyclone workflows register etl.yaml
    cyclone runs submit etl --input '{"day": "2026-12-01"}' --wait
    cyclone jobs enqueue resize --input @job.json --max-attempts 5
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from google.protobuf import json_format

from cyclone_proto import runs_pb2, types_pb2, workflows_pb2
from cyclone_worker.values import to_duration, to_timestamp, to_value

_ENUM_PREFIXES = {"type": ("NODE_TYPE_", types_pb2.NodeType), "on_dep_failure": ("ON_DEP_FAILURE_", types_pb2.OnDepFailure)}


class BadInput(Exception):
    """A file or argument that cannot be read; exit code 2 with this message."""


def _read(source: str) -> str:
    """The text of FILE, or of stdin for '-'."""
    try:
        return sys.stdin.read() if source == "-" else Path(source).read_text()
    except OSError as e:
        raise BadInput(f"{source}: {e.strerror or e}") from None


def json_input(text: str, what: str = "--input") -> Any:
    """--input: inline JSON, or @FILE (@- for stdin) holding JSON."""
    body = _read(text[1:]) if text.startswith("@") else text
    try:
        return json.loads(body)
    except json.JSONDecodeError as e:
        raise BadInput(f"{what}: not valid JSON ({e})") from None


def workflow_request(source: str) -> workflows_pb2.RegisterWorkflowRequest:
    """A definition file (JSON or YAML; '-' for stdin) as a RegisterWorkflowRequest."""
    text = _read(source)
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        import yaml
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise BadInput(f"{source}: neither JSON nor YAML ({e})") from None
    if not isinstance(data, dict):
        raise BadInput(f"{source}: a workflow definition is an object with name and nodes")
    for node in data.get("nodes") or []:
        for field, (prefix, enum) in _ENUM_PREFIXES.items():
            value = node.get(field) if isinstance(node, dict) else None
            if isinstance(value, str) and not value.upper().startswith(prefix) and prefix + value.upper() in enum.keys():
                node[field] = prefix + value.upper()
    try:
        return json_format.ParseDict(data, workflows_pb2.RegisterWorkflowRequest())
    except json_format.ParseError as e:
        raise BadInput(f"{source}: {e}") from None


def submit_request(a: argparse.Namespace) -> runs_pb2.SubmitRunRequest:
    req = runs_pb2.SubmitRunRequest(workflow=a.workflow, version=a.version, priority=a.priority,
                                    idempotency_key=a.idempotency_key or "")
    _fill_common(req, a)
    return req


def enqueue_request(a: argparse.Namespace) -> runs_pb2.EnqueueRequest:
    req = runs_pb2.EnqueueRequest(kind=a.kind, priority=a.priority, idempotency_key=a.idempotency_key or "")
    _fill_common(req, a)
    if a.max_attempts is not None:
        req.max_attempts = a.max_attempts
    if a.max_reclaims is not None:
        req.max_reclaims = a.max_reclaims
    for name in ("backoff_initial", "backoff_max", "attempt_timeout", "retention"):
        if getattr(a, name) is not None:
            getattr(req, name).CopyFrom(to_duration(getattr(a, name), "--" + name.replace("_", "-")))
    if a.scheduled_in is not None:
        req.scheduled_at.CopyFrom(to_timestamp(datetime.now(timezone.utc) + timedelta(seconds=a.scheduled_in)))
    return req


def _fill_common(req: Any, a: argparse.Namespace) -> None:
    if a.input is not None:
        try:
            req.input.CopyFrom(to_value(json_input(a.input), "--input"))
        except (TypeError, ValueError) as e:
            raise BadInput(str(e)) from None
    if a.deadline_in is not None:
        req.deadline_in.CopyFrom(to_duration(a.deadline_in, "--deadline-in"))


def add_start_options(p: argparse.ArgumentParser, duration: Any) -> None:
    """The options `runs submit` and `jobs enqueue` share."""
    p.add_argument("--input", metavar="JSON|@FILE", help="the input: JSON, or @FILE holding it (@- reads stdin); "
                   "default null")
    p.add_argument("--priority", type=int, default=0, help="claim priority, lower first")
    p.add_argument("--idempotency-key", metavar="KEY", help="the same key again returns the same run")
    p.add_argument("--deadline-in", type=duration, metavar="DURATION", help="the run fails if not done this long "
                   "from now (e.g. 10m); default none")
    p.add_argument("--wait", action="store_true", help="then follow the run until it ends (as `runs wait`)")
    p.add_argument("--timeout", type=duration, metavar="DURATION", help="with --wait: give up after this long "
                   "(exit 5); default never")
    p.add_argument("--interval", type=duration, default=0.5, help=argparse.SUPPRESS)


def add_job_options(p: argparse.ArgumentParser, duration: Any) -> None:
    """`jobs enqueue`'s retry and timing options; unset ones take the server's defaults."""
    p.add_argument("--max-attempts", type=int, metavar="N", help="attempts before the job is discarded "
                   "(server default 25)")
    p.add_argument("--backoff-initial", type=duration, metavar="DURATION", help="first retry delay (server default)")
    p.add_argument("--backoff-max", type=duration, metavar="DURATION", help="longest retry delay (server default)")
    p.add_argument("--attempt-timeout", type=duration, metavar="DURATION", help="an attempt running longer fails "
                   "(default none)")
    p.add_argument("--max-reclaims", type=int, metavar="N", help="lost leases before the job is discarded "
                   "(server default)")
    p.add_argument("--retention", type=duration, metavar="DURATION", help="keep the ended run this long "
                   "(default: until purged)")
    p.add_argument("--scheduled-in", type=duration, metavar="DURATION", help="not claimable before this long from "
                   "now (default: at once)")


__all__ = ["BadInput", "json_input", "workflow_request", "submit_request", "enqueue_request", "add_start_options",
           "add_job_options"]
