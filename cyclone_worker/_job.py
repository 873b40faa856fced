"""A standalone job as the client sends it: `Job`, and the deadline fields it shares with runs."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

from cyclone_proto import runs_pb2
from ._limits import LimitUse, limit_uses_proto
from .values import Seconds, seconds_of, to_duration, to_timestamp, to_value

__all__ = ["Job", "deadline_fields"]


def deadline_fields(deadline: datetime | Seconds | None) -> dict[str, Any]:
    """A deadline as `deadline` (absolute datetime) or `deadline_in` (seconds / timedelta from now)."""
    if deadline is None:
        return {}
    if isinstance(deadline, datetime):
        return {"deadline": to_timestamp(deadline, "deadline")}
    return {"deadline_in": to_duration(deadline, "deadline")}


@dataclass(frozen=True)
class Job:
    """One standalone job for `Client.enqueue_many`; the fields are `Client.enqueue`'s arguments.

    `deadline` is a datetime, or seconds / a timedelta from submission; `scheduled_at` a
    datetime, or seconds / a timedelta from now.

    Example::

        jobs = [Job("resize", {"image": name}, priority=1, max_attempts=5) for name in names]
        run_ids = await client.enqueue_many(jobs)
        await client.enqueue_many(Job("sync", {"tenant": t}, limits=[LimitUse("per-tenant", key_path="tenant")])
                                  for t in tenants)
    """

    kind: str
    input: Any = None
    priority: int = 0
    idempotency_key: str | None = None
    deadline: datetime | Seconds | None = None
    scheduled_at: datetime | Seconds | None = None
    max_attempts: int | None = None
    backoff_initial: Seconds | None = None
    backoff_max: Seconds | None = None
    max_reclaims: int | None = None
    attempt_timeout: Seconds | None = None
    retention: Seconds | None = None
    limits: Sequence[LimitUse] = ()

    def to_proto(self, where: str = "") -> runs_pb2.EnqueueRequest:
        """The EnqueueRequest for this job; a value that cannot be sent raises TypeError or ValueError
        naming the field, after `where` (such as "jobs[3]") when given."""
        try:
            req = runs_pb2.EnqueueRequest(kind=self.kind, input=to_value(self.input, "input"), priority=self.priority,
                                          idempotency_key=self.idempotency_key or "", **deadline_fields(self.deadline))
            if self.max_attempts is not None:
                req.max_attempts = self.max_attempts
            if self.max_reclaims is not None:
                req.max_reclaims = self.max_reclaims
            for name in ("backoff_initial", "backoff_max", "attempt_timeout", "retention"):
                value = getattr(self, name)
                if value is not None:
                    getattr(req, name).CopyFrom(to_duration(value, name))
            if self.scheduled_at is not None:
                when = self.scheduled_at if isinstance(self.scheduled_at, datetime) else (
                    datetime.now(timezone.utc) + timedelta(seconds=seconds_of(self.scheduled_at, "scheduled_at")))
                req.scheduled_at.CopyFrom(to_timestamp(when, "scheduled_at"))
            req.limits.extend(limit_uses_proto(self.limits))
        except (TypeError, ValueError) as e:
            if not where:
                raise
            # "jobs[3]" + "input.rows[2]: ..." -> "jobs[3].input.rows[2]: ..."; other messages after ": ".
            message = f"{where}.{e}" if _FIELD_PATH.match(str(e)) else f"{where}: {e}"
            raise (TypeError if isinstance(e, TypeError) else ValueError)(message) from e
        return req


_FIELD_PATH = re.compile(r"^[A-Za-z_][\w.\[\]]*: ")
