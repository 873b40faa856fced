"""Schedules for the client: the settings message built from keyword arguments, and the Schedule read back."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from cyclone_proto import runs_pb2, schedules_pb2, types_pb2
from ._models import _time, _value, enum_name
from .values import Seconds, from_duration, to_duration, to_timestamp, to_value

if TYPE_CHECKING:
    from ._job import Job

__all__ = ["Schedule", "ScheduleRun", "OVERLAP_POLICIES"]

OVERLAP_POLICIES = ("skip", "buffer_one", "allow_all", "cancel_previous")


def overlap_value(word: str | None, field: str = "overlap") -> int:
    """'buffer_one' -> OVERLAP_POLICY_BUFFER_ONE; None -> unspecified (the schedule's own / skip)."""
    if word is None:
        return schedules_pb2.OVERLAP_POLICY_UNSPECIFIED
    if word not in OVERLAP_POLICIES:
        raise ValueError(f"{field}: {word!r} is not an overlap policy ({', '.join(OVERLAP_POLICIES)})")
    return schedules_pb2.OverlapPolicy.Value("OVERLAP_POLICY_" + word.upper())


def settings_proto(*, workflow: str | None, job: Job | None, input: Any, version: int, priority: int,
                   deadline_in: Seconds | None, cron: str | None, time_zone: str, every: Seconds | None,
                   offset: Seconds, start_at: datetime | None, end_at: datetime | None, jitter: Seconds | None,
                   note: str, overlap: str, catchup_window: Seconds | None) -> schedules_pb2.ScheduleSettings:
    """The ScheduleSettings of `Client.create_schedule`'s arguments; ValueError / TypeError naming the argument."""
    if (workflow is None) == (job is None):
        raise ValueError("give exactly one target: workflow (a name) or job (a Job)")
    if (cron is None) == (every is None):
        raise ValueError("give exactly one spec: cron (an expression) or every (seconds)")
    s = schedules_pb2.ScheduleSettings(note=note, overlap=overlap_value(overlap))
    if workflow is not None:
        s.run.CopyFrom(runs_pb2.SubmitRunRequest(workflow=workflow, version=version, priority=priority,
                                                 input=to_value(input, "input")))
        if deadline_in is not None:
            s.run.deadline_in.CopyFrom(to_duration(deadline_in, "deadline_in"))
    else:
        assert job is not None
        s.job.CopyFrom(job.to_proto("job"))
        if deadline_in is not None:
            s.job.deadline_in.CopyFrom(to_duration(deadline_in, "deadline_in"))
    if cron is not None:
        s.cron.CopyFrom(schedules_pb2.CronSpec(expression=cron, time_zone=time_zone))
    else:
        assert every is not None
        s.interval.CopyFrom(schedules_pb2.IntervalSpec(every=to_duration(every, "every"),
                                                       offset=to_duration(offset, "offset")))
    for name, when in (("start_at", start_at), ("end_at", end_at)):
        if when is not None:
            getattr(s, name).CopyFrom(to_timestamp(when, name))
    for name, d in (("jitter", jitter), ("catchup_window", catchup_window)):
        if d is not None:
            getattr(s, name).CopyFrom(to_duration(d, name))
    return s


@dataclass
class ScheduleRun:
    """A run a schedule started, as Schedule.recent_runs lists it."""

    run_id: str
    fire_at: datetime | None
    state: str
    created_at: datetime | None


@dataclass
class Schedule:
    """A schedule as stored: what it starts (`workflow`, or the job `kind`), when (`cron` in
    `time_zone`, or `every` seconds at `offset`), its policy and counters. `settings` is the
    wire message, with everything else (job options, jitter, ...).

    Example::

        s = await client.get_schedule("nightly")
        print(s.next_fire_at, s.fires, s.misses, [r.state for r in s.recent_runs])
    """

    name: str
    paused: bool
    overlap: str
    workflow: str = ""
    kind: str = ""
    input: Any = None
    cron: str = ""
    time_zone: str = ""
    every: float | None = None
    offset: float = 0.0
    note: str = ""
    next_fire_at: datetime | None = None
    last_fire_at: datetime | None = None
    buffered_fire_at: datetime | None = None
    fires: int = 0
    misses: int = 0
    skips: int = 0
    created_at: datetime | None = None
    updated_at: datetime | None = None
    recent_runs: list[ScheduleRun] = field(default_factory=list)
    settings: schedules_pb2.ScheduleSettings | None = None

    @classmethod
    def from_proto(cls, m: schedules_pb2.Schedule) -> Schedule:
        st = m.settings
        target = st.run if st.WhichOneof("target") == "run" else st.job
        return cls(
            name=m.name, paused=m.paused,
            overlap=enum_name(schedules_pb2.OverlapPolicy, st.overlap, "OVERLAP_POLICY_"),
            workflow=st.run.workflow, kind=st.job.kind, input=_value(target, "input"),
            cron=st.cron.expression, time_zone=st.cron.time_zone,
            every=from_duration(st.interval.every) if st.HasField("interval") else None,
            offset=from_duration(st.interval.offset) if st.HasField("interval") else 0.0, note=st.note,
            next_fire_at=_time(m, "next_fire_at"), last_fire_at=_time(m, "last_fire_at"),
            buffered_fire_at=_time(m, "buffered_fire_at"), fires=m.fires, misses=m.misses, skips=m.skips,
            created_at=_time(m, "created_at"), updated_at=_time(m, "updated_at"),
            recent_runs=[ScheduleRun(r.run_id, _time(r, "fire_at"),
                                     enum_name(types_pb2.RunState, r.state, "RUN_STATE_"), _time(r, "created_at"))
                         for r in m.recent_runs],
            settings=st)
