"""When a schedule fires: cron expressions (croniter) and fixed intervals, checked and iterated. Pure, no I/O.

Cron expressions have 5 fields (minute hour day-of-month month day-of-week) or 6 (a
seconds field first, as in Quartz and robfig/cron), read in the schedule's IANA time
zone. Daylight-saving changes follow Vixie cron, the behaviour cron users know: a wall
time that does not exist (the hour skipped in spring) fires at the first instant after
the jump; in the repeated hour of autumn, an expression with a fixed hour (no `*` in its
hour field) fires once, at the first occurrence, while one with `*` in its hour field
follows real time and fires in both. Intervals are anchored to the Unix epoch plus an
offset (every 15 min at offset 5 min: :05, :20, :35, :50 UTC), so every server computes
the same fire times.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import croniter

from .errors import InvalidArgument

OVERLAP_POLICIES = ("skip", "buffer_one", "allow_all", "cancel_previous")
DEFAULT_CATCHUP_WINDOW = 60.0
# A fire is late when the scheduler wakes after its due time, which always takes a moment:
# a catch-up window below this would miss fires that were on time.
MIN_CATCHUP_WINDOW = 1.0
# Fire times found too late are counted one by one up to this many per pass; beyond, the
# schedule jumps to the catch-up window and the rest are not counted.
MAX_MISSES_COUNTED = 10_000
MIN_EVERY, MAX_EVERY = 0.001, 100 * 365.25 * 86400  # seconds
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_US = timedelta(microseconds=1)


@dataclass(frozen=True)
class Spec:
    """When a schedule fires: `cron` in `time_zone`, or every `every` seconds at `offset`,
    between `start_at` and `end_at` (both optional, inclusive)."""

    cron: str | None = None
    time_zone: str = "UTC"
    every: float | None = None
    offset: float = 0.0
    start_at: datetime | None = None
    end_at: datetime | None = None

    def check(self) -> Spec:
        """Self, or InvalidArgument naming the field (settings.cron.expression, ...)."""
        if (self.cron is None) == (self.every is None):
            raise InvalidArgument("settings: give exactly one of cron and interval")
        if self.cron is not None:
            fields = self.cron.split()
            if len(fields) not in (5, 6):
                raise InvalidArgument(f"settings.cron.expression: {self.cron!r} has {len(fields)} fields; expected 5 "
                                      "(minute hour day month weekday) or 6 (a seconds field first)")
            try:
                self.zone
            except (ZoneInfoNotFoundError, ValueError, OSError):  # OSError: a folder or an overlong name
                raise InvalidArgument(f"settings.cron.time_zone: {self.time_zone!r} is not a known IANA time zone "
                                      "(such as UTC or Europe/Paris)") from None
            try:
                croniter(self.cron, datetime.now(self.zone), second_at_beginning=len(fields) == 6).get_next(datetime)
            except Exception as e:  # croniter's errors (bad field, no matching date) have no common base
                raise InvalidArgument(f"settings.cron.expression: {self.cron!r} is not a valid cron expression "
                                      f"({e})") from None
        else:
            assert self.every is not None
            if not self.every > 0:
                raise InvalidArgument(f"settings.interval.every: must be > 0, got {self.every:g} s")
            if not MIN_EVERY <= self.every <= MAX_EVERY:
                raise InvalidArgument(f"settings.interval.every: must be between {MIN_EVERY:g} s and "
                                      f"{MAX_EVERY:g} s (100 years), got {self.every:g} s")
            if not 0 <= self.offset < self.every:
                raise InvalidArgument(f"settings.interval.offset: must be >= 0 and less than every "
                                      f"({self.every:g} s), got {self.offset:g} s")
        if self.start_at is not None and self.end_at is not None and self.end_at < self.start_at:
            raise InvalidArgument("settings.end_at: before start_at")
        try:
            self.next_after(datetime.now(timezone.utc))
        except (OverflowError, ValueError):  # the first fire time would be past year 9999
            raise InvalidArgument("settings.start_at: the first fire time is after the year 9999") from None
        return self

    @property
    def zone(self) -> ZoneInfo:
        return ZoneInfo(self.time_zone or "UTC")

    def to_json(self) -> dict[str, Any]:
        """What cyclone_schedules.spec holds (start and end have columns of their own)."""
        if self.cron is not None:
            return {"cron": self.cron, "time_zone": self.time_zone}
        return {"every": self.every, "offset": self.offset}

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Spec:
        spec = row["spec"]
        return cls(cron=spec.get("cron"), time_zone=spec.get("time_zone") or "UTC", every=spec.get("every"),
                   offset=spec.get("offset") or 0.0, start_at=row.get("start_at"), end_at=row.get("end_at"))

    def next_after(self, t: datetime) -> datetime | None:
        """The first fire time strictly after `t` (and not before start_at); None past end_at."""
        if self.start_at is not None and t < self.start_at:
            t = self.start_at - _US
        found = self._cron_after(t) if self.cron is not None else self._interval_after(t)
        if self.end_at is not None and found > self.end_at:
            return None
        return found

    def _interval_after(self, t: datetime) -> datetime:
        # Whole microseconds, so that no float rounding moves a fire time.
        every = round(self.every * 1e6)  # type: ignore[operator]
        offset = round(self.offset * 1e6)
        since = (t - _EPOCH) // _US - offset
        return _EPOCH + (offset + (since // every + 1) * every) * _US

    def _cron_after(self, t: datetime) -> datetime:
        assert self.cron is not None
        fields = self.cron.split()
        zone = self.zone
        fixed_hour = "*" not in fields[-4]  # the hour field, with or without seconds first
        it = croniter(self.cron, t.astimezone(zone), second_at_beginning=len(fields) == 6)
        while True:
            found = it.get_next(datetime).astimezone(timezone.utc)
            local = found.astimezone(zone)  # from UTC, so fold says which of a repeated hour it is
            if fixed_hour and local.fold == 1 and _ambiguous(local):
                continue  # the repeated hour's second pass: a fixed-hour expression fired in the first
            return found


def _ambiguous(local: datetime) -> bool:
    """Whether this wall time happens twice (the hour repeated when clocks go back)."""
    return local.replace(fold=0).utcoffset() != local.replace(fold=1).utcoffset()


@dataclass(frozen=True)
class FirePlan:
    """What one fire transaction does (cyclone_schedule_fire's arguments): count `missed`
    fire times, start `fire_at` (None: nothing to start now), move on to `next_fire_at`."""

    missed: int
    fire_at: datetime | None
    next_fire_at: datetime | None
    next_due_at: datetime | None


def due_at(fire_at: datetime | None, jitter: float, rng: random.Random | None = None) -> datetime | None:
    """When a fire time is due: the fire time plus a random delay of up to `jitter` seconds."""
    if fire_at is None or jitter <= 0:
        return fire_at
    return fire_at + timedelta(seconds=(rng or random).uniform(0, jitter))


def plan(spec: Spec, next_fire_at: datetime, next_due_at: datetime, now: datetime, *, catchup_window: float,
         jitter: float = 0.0, rng: random.Random | None = None) -> FirePlan:
    """The fire of a due schedule: fire times due more than `catchup_window` seconds before
    `now` are missed (counted); the first one that is not, if due, starts now."""
    window = max(catchup_window, MIN_CATCHUP_WINDOW)
    oldest = now - timedelta(seconds=window)
    missed = 0
    fire: datetime | None = next_fire_at
    due: datetime | None = next_due_at
    while fire is not None and due is not None and due < oldest:
        missed += 1
        if missed >= MAX_MISSES_COUNTED:
            fire = spec.next_after(oldest)
        else:
            fire = spec.next_after(fire)
        due = due_at(fire, jitter, rng)
    if fire is None or due is None or due > now:
        return FirePlan(missed, None, fire, due)
    after = spec.next_after(fire)
    return FirePlan(missed, fire, after, due_at(after, jitter, rng))


@dataclass(frozen=True)
class ScheduleSettings:
    """Everything a schedule is made of but its name (CreateSchedule / UpdateSchedule).

    The target is a workflow run (`workflow`, `version`) or a standalone job (`kind` and
    its Enqueue `options`: max_attempts, backoff_initial, ...), with `input`, `priority`
    and an optional run deadline `deadline_in` seconds after each start.

    Example::

        ScheduleSettings(Spec(cron="0 3 * * *", time_zone="Europe/Paris"), workflow="nightly_etl",
                         input={"full": False}, overlap="buffer_one")
    """

    spec: Spec
    workflow: str | None = None
    version: int = 0
    kind: str | None = None
    options: Any = None  # Mapping[str, Any] of job options, for a `kind`
    input: Any = None
    priority: int = 0
    deadline_in: float | None = None
    jitter: float = 0.0
    note: str = ""
    overlap: str = "skip"
    catchup_window: float = DEFAULT_CATCHUP_WINDOW

    def check(self) -> ScheduleSettings:
        """Self, or InvalidArgument naming the field (what needs the database, the engine checks)."""
        self.spec.check()
        if (self.workflow is None) == (self.kind is None):
            raise InvalidArgument("settings: give exactly one target, run (a workflow) or job (a kind)")
        if self.overlap not in OVERLAP_POLICIES:
            raise InvalidArgument(f"settings.overlap: {self.overlap!r} is not an overlap policy "
                                  f"({', '.join(OVERLAP_POLICIES)})")
        for name in ("jitter", "catchup_window"):
            if not 0 <= getattr(self, name) <= MAX_EVERY:
                raise InvalidArgument(f"settings.{name}: must be between 0 and 100 years, got {getattr(self, name):g} s")
        if self.deadline_in is not None and not 0 < self.deadline_in <= 100 * 366 * 86400:
            raise InvalidArgument(f"settings.{self.target_field}.deadline_in: must be > 0 and at most 100 years")
        if len(self.note) > 1000 or "\x00" in self.note:
            raise InvalidArgument("settings.note: at most 1000 characters, without U+0000")
        return self

    @property
    def target_field(self) -> str:
        """The request field of the target, for error messages: run or job."""
        return "run" if self.workflow is not None else "job"
