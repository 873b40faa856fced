"""Fire times (schedule_spec): cron in a time zone across daylight-saving changes, intervals, catch-up plans."""

from __future__ import annotations

import random
from datetime import datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import pytest

from cyclone_server.errors import InvalidArgument
from cyclone_server.schedule_spec import MAX_MISSES_COUNTED, MIN_CATCHUP_WINDOW, Spec, due_at, plan

NY = ZoneInfo("America/New_York")
UTC = timezone.utc


def fires(spec: Spec, after: datetime, n: int) -> list[str]:
    out, t = [], after
    for _ in range(n):
        t = spec.next_after(t)
        out.append(t.astimezone(NY).strftime("%m-%d %H:%M%z"))
    return out


def test_spring_forward_a_skipped_wall_time_fires_right_after_the_jump() -> None:
    # 2026-03-08: 02:00 EST jumps to 03:00 EDT, 02:30 does not exist that day.
    spec = Spec(cron="30 2 * * *", time_zone="America/New_York").check()
    assert fires(spec, datetime(2026, 3, 7, 12, tzinfo=NY), 3) == [
        "03-08 03:00-0400", "03-09 02:30-0400", "03-10 02:30-0400"]


def test_fall_back_a_fixed_hour_fires_once_in_the_repeated_hour() -> None:
    # 2026-11-01: 02:00 EDT goes back to 01:00 EST, 01:00-02:00 happens twice.
    spec = Spec(cron="30 1 * * *", time_zone="America/New_York").check()
    assert fires(spec, datetime(2026, 10, 31, 12, tzinfo=NY), 3) == [
        "11-01 01:30-0400", "11-02 01:30-0500", "11-03 01:30-0500"]
    every20 = Spec(cron="*/20 1 * * *", time_zone="America/New_York").check()
    assert fires(every20, datetime(2026, 11, 1, 0, 30, tzinfo=NY), 4) == [
        "11-01 01:00-0400", "11-01 01:20-0400", "11-01 01:40-0400", "11-02 01:00-0500"]


def test_fall_back_a_wildcard_hour_follows_real_time_through_both_passes() -> None:
    spec = Spec(cron="0 * * * *", time_zone="America/New_York").check()
    assert fires(spec, datetime(2026, 11, 1, 0, 10, tzinfo=NY), 3) == [
        "11-01 01:00-0400", "11-01 01:00-0500", "11-01 02:00-0500"]
    # In spring the skipped hour simply has no fire time.
    assert fires(spec, datetime(2026, 3, 8, 0, 10, tzinfo=NY), 2) == ["03-08 01:00-0500", "03-08 03:00-0400"]


def test_fire_times_are_instants_the_same_from_any_server_time_zone() -> None:
    spec = Spec(cron="0 9 * * MON-FRI", time_zone="Europe/Paris").check()
    a = spec.next_after(datetime(2026, 12, 4, 12, tzinfo=UTC))
    b = spec.next_after(datetime(2026, 12, 4, 7, tzinfo=ZoneInfo("America/Los_Angeles")))
    assert a == b == datetime(2026, 12, 7, 8, tzinfo=UTC)  # Monday 09:00 CET
    assert a.tzinfo is UTC


def test_six_fields_have_seconds_first() -> None:
    spec = Spec(cron="*/15 * * * * *").check()
    t = datetime(2026, 1, 1, tzinfo=UTC)
    assert [spec.next_after(t + timedelta(seconds=s)).second for s in (0, 15, 44)] == [15, 30, 45]


def test_intervals_sit_on_the_epoch_grid_shifted_by_the_offset() -> None:
    spec = Spec(every=900, offset=300).check()
    t = datetime(2026, 1, 1, 0, 5, tzinfo=UTC)
    assert spec.next_after(t) == datetime(2026, 1, 1, 0, 20, tzinfo=UTC)
    assert spec.next_after(t - timedelta(microseconds=1)) == t
    tiny = Spec(every=0.1).check()
    assert tiny.next_after(datetime(2026, 1, 1, 0, 0, 0, 50_000, tzinfo=UTC)).microsecond == 100_000


def test_start_and_end_bound_the_fire_times() -> None:
    start, end = datetime(2026, 6, 1, tzinfo=UTC), datetime(2026, 6, 1, 2, tzinfo=UTC)
    spec = Spec(every=3600, start_at=start, end_at=end).check()
    assert spec.next_after(datetime(2026, 1, 1, tzinfo=UTC)) == start
    assert spec.next_after(start) == start + timedelta(hours=1)
    assert spec.next_after(end) is None
    with pytest.raises(InvalidArgument, match="settings.end_at: before start_at"):
        Spec(every=60, start_at=end, end_at=start).check()


@pytest.mark.parametrize(("spec", "field"), [
    (Spec(cron="0 0 30 2 *"), "settings.cron.expression"),  # February 30th never comes
    (Spec(cron="0 0 * * * * *"), "settings.cron.expression"),  # 7 fields (a year): not offered
    (Spec(cron="@hourly x"), "settings.cron.expression"),
    (Spec(cron="0 0 * * *", time_zone="Not/AZone"), "settings.cron.time_zone"),
    (Spec(every=-5), "settings.interval.every"),
    (Spec(every=10, offset=-1), "settings.interval.offset"),
    (Spec(cron="* * * * *", every=10), "settings:"),
])
def test_bad_specs_name_the_field(spec: Spec, field: str) -> None:
    with pytest.raises(InvalidArgument) as e:
        spec.check()
    assert e.value.message.startswith(field), e.value.message


def test_plan_counts_fire_times_older_than_the_window_and_starts_the_first_within() -> None:
    spec = Spec(every=10).check()
    now = datetime(2026, 1, 1, 12, 0, 5, tzinfo=UTC)
    oldest = datetime(2026, 1, 1, 11, 58, tzinfo=UTC)  # 12 fire times to now: 11:58:00 ... 11:59:50, 12:00:00
    p = plan(spec, oldest, oldest, now, catchup_window=60)
    # Due before 11:59:05 is too old: 11:58:00 ... 11:59:00 (7 fire times).
    assert (p.missed, p.fire_at, p.next_fire_at) == (7, datetime(2026, 1, 1, 11, 59, 10, tzinfo=UTC),
                                                      datetime(2026, 1, 1, 11, 59, 20, tzinfo=UTC))
    # A window of 0 is read as MIN_CATCHUP_WINDOW: a fire found a moment late is not a miss.
    late = now - timedelta(seconds=MIN_CATCHUP_WINDOW / 2)
    on_time = plan(spec, late, late, now, catchup_window=0)
    assert on_time.missed == 0 and on_time.fire_at == late
    none_left = plan(Spec(every=10, end_at=now - timedelta(seconds=100)).check(), oldest, oldest, now,
                     catchup_window=60)
    assert none_left.fire_at is None and none_left.next_fire_at is None and none_left.missed == 3


def test_jitter_delays_the_due_time_within_its_bound() -> None:
    t = datetime(2026, 1, 1, tzinfo=UTC)
    rng = random.Random(7)
    dues = [due_at(t, 30, rng) for _ in range(200)]
    assert all(t <= d <= t + timedelta(seconds=30) for d in dues) and len(set(dues)) > 100
    assert due_at(t, 0) == t and due_at(None, 30) is None


def test_after_a_very_long_outage_the_miss_count_is_bounded_and_the_window_still_starts() -> None:
    spec = Spec(every=0.001).check()  # 1000 fire times a second
    now = datetime(2026, 1, 1, 12, tzinfo=UTC)
    oldest = now - timedelta(seconds=120)
    p = plan(spec, oldest, oldest, now, catchup_window=60)
    assert p.missed == MAX_MISSES_COUNTED
    assert p.fire_at is not None and now - timedelta(seconds=60) < p.fire_at <= now
