"""Schedules on a real database: the fire transaction, overlap policies, catch-up, pause/resume/trigger,
several schedulers racing, and fire times around a daylight-saving change.

Fire times in the past stand in for waiting: a test moves a schedule's next fire time back
(as a server that was down would find it) and runs one scheduler pass.
"""

from __future__ import annotations

import asyncio
import time
from datetime import datetime, timedelta, timezone

import psycopg
import pytest

from cyclone_server.store.engine import Engine
from cyclone_server.errors import AlreadyExists, InvalidArgument, NotFound
from cyclone_server.schedule_spec import ScheduleSettings, Spec
from cyclone_server.serve.scheduler import Scheduler

# Hourly, at the minute and second half an hour from when the tests start: a test that moves
# a fire time a few seconds back then finds the next one ahead. (On the hour, a test run in
# the first seconds after it found that next one due too, and counted a second fire time.)
HOUR = Spec(every=3600, offset=float((int(time.time()) + 1800) % 3600))


def job(overlap: str = "skip", spec: Spec = HOUR, **kw) -> ScheduleSettings:
    return ScheduleSettings(spec, kind="tick", input={"n": 1}, overlap=overlap, **kw)


def scheduler(engine: Engine) -> Scheduler:
    return Scheduler(engine, None)  # type: ignore[arg-type]  # run_once needs no notifier


async def make_due(conn: psycopg.AsyncConnection, name: str, ago: float) -> datetime:
    """Set the schedule's next fire time `ago` seconds back (as found after downtime); returns it."""
    cur = await conn.execute(
        "UPDATE cyclone_schedules SET next_fire_at = now() - make_interval(secs => %s),"
        " next_due_at = now() - make_interval(secs => %s) WHERE name = %s RETURNING next_fire_at", (ago, ago, name))
    return (await cur.fetchone())[0]


async def runs_of(conn: psycopg.AsyncConnection, name: str) -> list[tuple[datetime, str]]:
    cur = await conn.execute("SELECT schedule_fire_at, state FROM cyclone_runs WHERE schedule_name = %s"
                             " ORDER BY schedule_fire_at", (name,))
    return list(await cur.fetchall())


async def test_create_sets_the_first_fire_time_after_now(engine: Engine) -> None:
    before = datetime.now(timezone.utc)
    row, created = await engine.create_schedule("hourly", job())
    assert created
    assert row["next_fire_at"] > before and row["next_fire_at"].timestamp() % 3600 == HOUR.offset  # at its second
    assert row["next_fire_at"] - before <= timedelta(hours=1)
    again, created = await engine.create_schedule("hourly", job())
    assert not created and again["next_fire_at"] == row["next_fire_at"]
    with pytest.raises(AlreadyExists, match="name: schedule \"hourly\" already exists"):
        await engine.create_schedule("hourly", job(overlap="allow_all"))


async def test_a_due_fire_time_starts_one_run_tagged_with_schedule_and_fire_time(engine: Engine, conn) -> None:
    await engine.create_schedule("s", job())
    fire_at = await make_due(conn, "s", 2)
    await scheduler(engine).run_once()
    runs = await runs_of(conn, "s")
    assert runs == [(fire_at, "running")]
    row = await engine.get_schedule("s")
    assert row["fires"] == 1 and row["last_fire_at"] == fire_at
    assert row["next_fire_at"] > datetime.now(timezone.utc)
    assert [r["schedule_fire_at"] for r in row["recent_runs"]] == [fire_at]
    listed = await engine.list_runs(schedule="s")
    assert [r["schedule_fire_at"] for r in listed] == [fire_at]
    assert await engine.list_runs(schedule="s", schedule_fire_at=fire_at + timedelta(seconds=1)) == []
    await scheduler(engine).run_once()  # nothing due any more
    assert len(await runs_of(conn, "s")) == 1


async def test_the_fire_is_a_compare_and_set_on_the_next_fire_time(engine: Engine, conn) -> None:
    await engine.create_schedule("s", job(overlap="allow_all"))
    fire_at = await make_due(conn, "s", 2)
    from cyclone_server.schedule_spec import plan
    p = plan(HOUR, fire_at, fire_at, datetime.now(timezone.utc), catchup_window=60)
    first = await engine.fire_schedule("s", fire_at, p)
    second = await engine.fire_schedule("s", fire_at, p)  # a server that woke for the same fire time
    assert first["outcome"] == "started" and second == {"outcome": "lost", "run_id": None, "detail": None}
    assert len(await runs_of(conn, "s")) == 1


async def test_skip_policy_skips_a_fire_time_while_the_previous_run_is_active(engine: Engine, conn) -> None:
    await engine.create_schedule("s", job("skip"))
    first = await make_due(conn, "s", 20)
    await scheduler(engine).run_once()
    await make_due(conn, "s", 10)
    await scheduler(engine).run_once()
    assert await runs_of(conn, "s") == [(first, "running")]
    row = await engine.get_schedule("s")
    assert (row["fires"], row["skips"]) == (1, 1)
    # Once the run ended, the next fire time starts again.
    await engine.cancel_run(str(row["recent_runs"][0]["id"]))
    third = await make_due(conn, "s", 5)
    await scheduler(engine).run_once()
    assert [f for f, _ in await runs_of(conn, "s")] == [first, third]


async def test_buffer_one_starts_one_buffered_fire_time_when_the_run_ends(engine: Engine, conn) -> None:
    await engine.create_schedule("s", job("buffer_one"))
    first = await make_due(conn, "s", 30)
    await scheduler(engine).run_once()
    second = await make_due(conn, "s", 20)
    await scheduler(engine).run_once()
    await make_due(conn, "s", 10)
    sched = scheduler(engine)
    await sched.run_once()
    row = await engine.get_schedule("s")
    assert row["buffered_fire_at"] == second and (row["fires"], row["skips"]) == (1, 1)
    assert sched._buffered  # runs ending now wake this scheduler
    await engine.cancel_run(str(row["recent_runs"][0]["id"]))
    await sched.run_once()
    assert await runs_of(conn, "s") == [(first, "cancelled"), (second, "running")]
    row = await engine.get_schedule("s")
    assert row["buffered_fire_at"] is None and row["fires"] == 2
    assert sched.counts["started", "s"] == 1


async def test_allow_all_starts_overlapping_runs(engine: Engine, conn) -> None:
    await engine.create_schedule("s", job("allow_all"))
    for ago in (20, 10):
        await make_due(conn, "s", ago)
        await scheduler(engine).run_once()
    assert [s for _, s in await runs_of(conn, "s")] == ["running", "running"]


async def test_cancel_previous_cancels_the_active_run_then_starts(engine: Engine, conn) -> None:
    await engine.create_schedule("s", job("cancel_previous"))
    for ago in (20, 10):
        await make_due(conn, "s", ago)
        await scheduler(engine).run_once()
    assert [s for _, s in await runs_of(conn, "s")] == ["cancelled", "running"]
    cancelled = await engine.list_runs(schedule="s", states=["cancelled"], steps=True)
    assert cancelled[0]["steps"][0]["cancel_cause"] == "operator"


async def test_catch_up_starts_fire_times_within_the_window_and_counts_older_ones(engine: Engine, conn) -> None:
    await engine.create_schedule("s", job("allow_all", Spec(every=10), catchup_window=60))
    now = datetime.now(timezone.utc)
    grid = now.replace(microsecond=0) - timedelta(seconds=now.second % 10)
    oldest = grid - timedelta(seconds=130)  # 13 fire times back: about 7 too old, 6 or 7 within the window
    await conn.execute("UPDATE cyclone_schedules SET next_fire_at = %s, next_due_at = %s WHERE name = 's'",
                       (oldest, oldest))
    sched = scheduler(engine)
    await sched.run_once()
    done = datetime.now(timezone.utc)
    fired = [f for f, _ in await runs_of(conn, "s")]
    row = await engine.get_schedule("s")
    # Each fire time from the oldest on is either missed (counted) or started once, in order.
    assert fired == [oldest + timedelta(seconds=10 * (row["misses"] + i)) for i in range(len(fired))]
    assert all(f >= now - timedelta(seconds=61) for f in fired) and fired[-1] > done - timedelta(seconds=10)
    assert fired[0] - timedelta(seconds=10) < done - timedelta(seconds=60)  # the one before was too old
    assert row["misses"] >= 6 and sched.counts["missed", "s"] == row["misses"]
    assert row["fires"] == len(fired) == sched.counts["started", "s"]
    assert row["next_fire_at"] == fired[-1] + timedelta(seconds=10)


async def test_fire_times_older_than_the_window_are_only_counted(engine: Engine, conn) -> None:
    now = datetime.now(timezone.utc)
    # Hourly fire times at now - 30 min, - 90 min, - 150 min: none within a minute of now.
    offset = (now.timestamp() - 1800) % 3600
    await engine.create_schedule("s", job(spec=Spec(every=3600, offset=offset), catchup_window=60))
    await make_due(conn, "s", 3 * 3600 + 5)
    sched = scheduler(engine)
    await sched.run_once()
    row = await engine.get_schedule("s")
    assert await runs_of(conn, "s") == []
    assert (row["misses"], row["fires"]) == (4, 0) and sched.counts["missed", "s"] == 4
    assert abs(row["next_fire_at"] - (now + timedelta(minutes=30))) < timedelta(seconds=1)


async def test_pause_stops_fires_trigger_still_starts_and_resume_starts_from_now(engine: Engine, conn) -> None:
    await engine.create_schedule("s", job("allow_all"))
    assert await engine.pause_schedule("s") is True
    assert await engine.pause_schedule("s") is False
    await make_due(conn, "s", 5)
    await scheduler(engine).run_once()
    assert await runs_of(conn, "s") == []
    fired = await engine.trigger_schedule("s")
    assert fired["outcome"] == "started"
    assert await runs_of(conn, "s") == [(fired["fire_at"], "running")]
    before = datetime.now(timezone.utc)
    assert await engine.resume_schedule("s") is True
    assert await engine.resume_schedule("s") is False
    row = await engine.get_schedule("s")
    assert not row["paused"] and row["next_fire_at"] > before  # the due time of the pause was let go
    assert row["misses"] == 0
    await scheduler(engine).run_once()
    assert len(await runs_of(conn, "s")) == 1


async def test_trigger_follows_the_overlap_policy_unless_told_otherwise(engine: Engine, conn) -> None:
    await engine.create_schedule("s", job("skip"))
    assert (await engine.trigger_schedule("s"))["outcome"] == "started"
    assert (await engine.trigger_schedule("s")) ["outcome"] == "skipped"
    assert (await engine.trigger_schedule("s", "allow_all"))["outcome"] == "started"
    assert [s for _, s in await runs_of(conn, "s")] == ["running", "running"]
    assert (await engine.trigger_schedule("s", "cancel_previous"))["outcome"] == "started"
    assert sorted(s for _, s in await runs_of(conn, "s")) == ["cancelled", "cancelled", "running"]
    row = await engine.get_schedule("s")
    assert (row["fires"], row["skips"]) == (3, 1)
    with pytest.raises(NotFound):
        await engine.trigger_schedule("nope")
    with pytest.raises(InvalidArgument, match="overlap"):
        await engine.trigger_schedule("s", "sometimes")


async def test_several_schedulers_start_each_fire_time_exactly_once(db_url: str, engine: Engine, conn) -> None:
    await engine.create_schedule("s", job("allow_all", Spec(every=1), catchup_window=30))
    engines = [await Engine.open(db_url, min_size=1, max_size=3) for _ in range(3)]
    try:
        start = await make_due(conn, "s", 25)
        schedulers = [scheduler(e) for e in engines]
        await asyncio.gather(*(s.run_once() for s in schedulers for _ in range(2)))
    finally:
        for e in engines:
            await e.close()
    fired = [f for f, _ in await runs_of(conn, "s")]
    assert len(fired) == len(set(fired)) >= 24
    # Consecutive fire times, none left out: each started once by exactly one of them.
    grid = [f.timestamp() for f in fired]
    # (the first is the moved-back one, off the whole-second grid of the later ones)
    assert grid[0] == start.timestamp() and 0 < grid[1] - grid[0] <= 1
    assert all(b - a == 1 for a, b in zip(grid[1:], grid[2:]))
    assert sum(s.counts["started", "s"] for s in schedulers) == len(fired)
    assert all(s.failed_passes == 0 for s in schedulers)
    assert (await engine.get_schedule("s"))["fires"] == len(fired)


def last_fall_back(before: datetime) -> datetime:
    """Midnight UTC of the latest first Sunday of November (New York's autumn change) at least two days before."""
    for year in (before.year, before.year - 1):
        day = datetime(year, 11, 1, tzinfo=timezone.utc)
        day += timedelta(days=(6 - day.weekday()) % 7)
        if day + timedelta(days=2) < before:
            return day
    raise AssertionError("unreachable")


async def test_catch_up_across_a_daylight_saving_change(engine: Engine, conn) -> None:
    """Daily at 01:30 New York time and hourly, caught up from before the latest autumn
    change (01:00-02:00 happens twice): the daily one fires once that day, the hourly one
    in both passes. Explicit instants: the fire times are in the past, nothing waits."""
    ny = "America/New_York"
    day = last_fall_back(datetime.now(timezone.utc))
    window = 800 * 86400.0  # reaches back to it, whenever the test runs
    for name, cron in (("daily", "30 1 * * *"), ("hourly", "0 * * * *")):
        await engine.create_schedule(name, job("allow_all", Spec(cron=cron, time_zone=ny), catchup_window=window))
    end = day + timedelta(days=1, hours=12)
    for name, at in (("daily", day - timedelta(hours=18, minutes=30)),  # the day before, 01:30 EDT
                     ("hourly", day + timedelta(hours=4))):  # 00:00 EDT
        await conn.execute("UPDATE cyclone_schedules SET next_fire_at = %s, next_due_at = %s, end_at = %s"
                           " WHERE name = %s", (at, at, end, name))
    await scheduler(engine).run_once()
    utc = lambda f: (f - day).total_seconds() / 3600  # noqa: E731  (hours after midnight UTC of the change)
    daily = [utc(f) for f, _ in await runs_of(conn, "daily")]
    assert daily == [-18.5, 5.5, 24 + 6.5]  # 01:30 EDT, 01:30 EDT (its second pass skipped), 01:30 EST
    hourly = [utc(f) for f, _ in await runs_of(conn, "hourly")]
    assert hourly[:4] == [4, 5, 6, 7]  # 00:00 EDT, 01:00 EDT, 01:00 EST, 02:00 EST
    assert hourly == [4 + i for i in range(33)]  # every real hour up to end_at, none twice
    assert (await engine.get_schedule("daily"))["next_fire_at"] is None  # past end_at


async def test_update_replaces_the_settings_and_keeps_the_counters(engine: Engine, conn) -> None:
    await engine.create_schedule("s", job())
    await make_due(conn, "s", 5)
    await scheduler(engine).run_once()
    row = await engine.update_schedule("s", job("allow_all", Spec(cron="*/5 * * * *", time_zone="Europe/Paris"),
                                                note="every five minutes"))
    assert row["overlap"] == "allow_all" and row["note"] == "every five minutes" and row["fires"] == 1
    assert row["spec"] == {"cron": "*/5 * * * *", "time_zone": "Europe/Paris"}
    assert row["next_fire_at"].timestamp() % 300 == 0
    with pytest.raises(NotFound):
        await engine.update_schedule("nope", job())
    await engine.delete_schedule("s")
    with pytest.raises(NotFound):
        await engine.get_schedule("s")
    assert len(await engine.list_runs(schedule="s")) == 1  # its runs stay


@pytest.mark.parametrize(("settings", "message"), [
    (ScheduleSettings(Spec(cron="61 * * * *"), kind="k"), "settings.cron.expression: '61 * * * *' is not a valid"),
    (ScheduleSettings(Spec(cron="* * *"), kind="k"), "settings.cron.expression: '* * *' has 3 fields"),
    (ScheduleSettings(Spec(cron="0 3 * * *", time_zone="Mars/Olympus"), kind="k"), "settings.cron.time_zone"),
    (ScheduleSettings(Spec(every=0), kind="k"), "settings.interval.every: must be > 0"),
    (ScheduleSettings(Spec(every=60, offset=60), kind="k"), "settings.interval.offset"),
    (ScheduleSettings(Spec(every=60), workflow="nope"), 'settings.run.workflow: workflow "nope" is not registered'),
    (ScheduleSettings(Spec(every=60), kind="k", overlap="sometimes"), "settings.overlap: 'sometimes'"),
    (ScheduleSettings(Spec(every=60), kind="k", options={"max_attempts": 0}), "settings.job.max_attempts"),
    (ScheduleSettings(Spec(every=60)), "settings: give exactly one target"),
    (ScheduleSettings(Spec(), kind="k"), "settings: give exactly one of cron and interval"),
])
async def test_bad_settings_are_invalid_argument_naming_the_field(engine: Engine, settings, message) -> None:
    with pytest.raises(InvalidArgument) as e:
        await engine.create_schedule("bad", settings)
    assert e.value.message.startswith(message), e.value.message
    with pytest.raises(NotFound):
        await engine.get_schedule("bad")


async def test_a_target_its_fires_would_refuse_for_a_limit_is_refused_at_once(engine: Engine, conn) -> None:
    """A job naming a limit that does not exist, or whose input lacks a limit's key, would fail
    at every fire (and the schedule would never fire): CreateSchedule and UpdateSchedule refuse
    it, naming the field and the limit, as Enqueue would, and nothing of the dry run stays."""
    from cyclone_server import limit_spec
    await engine.set_limit(limit_spec.normalize_limit({"name": "per-user", "kinds": ["k"], "key_path": "input.user",
                                                       "strategy": "keep_newest"}))
    await engine.enqueue("k", input={"user": "u"})
    unknown = ScheduleSettings(Spec(every=60), kind="other", options={"limits": [{"limit": "nosuch"}]})
    with pytest.raises(InvalidArgument, match=r'^settings\.job: node "other": limits\[0\]: unknown limit "nosuch"'):
        await engine.create_schedule("bad", unknown)
    no_key = ScheduleSettings(Spec(every=60), kind="k", input={"other": 1})
    with pytest.raises(InvalidArgument, match=r'^settings\.job: limit "per-user" \(kind "k"\): key_path "input.user"'):
        await engine.create_schedule("bad", no_key)
    with pytest.raises(NotFound):
        await engine.get_schedule("bad")
    good = ScheduleSettings(Spec(every=60), kind="k", input={"user": "u"})
    await engine.create_schedule("good", good)
    with pytest.raises(InvalidArgument, match=r"^settings\.job: limit \"per-user\""):
        await engine.update_schedule("good", no_key)
    # The dry runs left nothing: one run (the enqueue's, not cancelled by keep_newest), no other.
    cur = await conn.execute("SELECT state FROM cyclone_runs")
    assert [r[0] for r in await cur.fetchall()] == ["running"]


async def test_a_fire_time_whose_target_is_refused_now_is_skipped_as_a_miss(engine: Engine, conn) -> None:
    """A limit the job names is deleted after the schedule was made: its fire time is refused,
    counted in misses and logged, and the schedule moves on to its next fire time instead of
    failing at every pass; a buffered fire time refused so is dropped the same way."""
    from cyclone_server import limit_spec
    await engine.set_limit(limit_spec.normalize_limit({"name": "gone", "max_running": 1}))
    await engine.create_schedule("s", job(options={"limits": [{"limit": "gone"}]}))
    await engine.delete_limit("gone")
    fire_at = await make_due(conn, "s", 2)
    sched = scheduler(engine)
    assert await sched.run_once() > 0  # a wait for the next fire time, not the retry of a failed pass
    row = await engine.get_schedule("s")
    assert (row["fires"], row["misses"]) == (0, 1) and row["next_fire_at"] > fire_at
    assert sched.counts["missed", "s"] == 1 and sched.failed_passes == 0
    assert await runs_of(conn, "s") == []
    buffered = (await (await conn.execute("UPDATE cyclone_schedules SET buffered_fire_at = now() WHERE name = 's' "
                                          "RETURNING buffered_fire_at")).fetchone())[0]
    assert await engine.release_schedules() == [{"name": "s", "fire_at": buffered, "run_id": None}]
    row = await engine.get_schedule("s")
    assert (row["misses"], row["buffered_fire_at"]) == (2, None)
    # A buffered fire time refused while the next one fires: dropped, and the next one is
    # judged on its own (refused too here, each a miss), not failed with it.
    await conn.execute("UPDATE cyclone_schedules SET buffered_fire_at = now() - interval '1 minute' WHERE name = 's'")
    await make_due(conn, "s", 1)
    await sched.run_once()
    row = await engine.get_schedule("s")
    assert (row["misses"], row["buffered_fire_at"], sched.failed_passes) == (4, None, 0)


async def test_a_fire_time_that_already_has_its_run_is_not_started_again(engine: Engine, conn) -> None:
    # A trigger took the very instant that later comes due as a fire time: the unique key
    # holds, and the schedule moves on instead of failing on that fire time forever.
    await engine.create_schedule("s", job("allow_all"))
    fired = await engine.trigger_schedule("s")
    await conn.execute("UPDATE cyclone_schedules SET next_fire_at = %(t)s, next_due_at = %(t)s WHERE name = 's'",
                       {"t": fired["fire_at"]})
    sched = scheduler(engine)
    await sched.run_once()
    assert await runs_of(conn, "s") == [(fired["fire_at"], "running")]
    assert sched.failed_passes == 0
    assert (await engine.get_schedule("s"))["next_fire_at"] > fired["fire_at"]


async def test_create_again_compares_settings_as_stored_keeping_true_apart_from_1(engine: Engine) -> None:
    row, created = await engine.create_schedule("flags", ScheduleSettings(HOUR, kind="tick", input={"flag": 1}))
    assert created
    # 1 and 1.0 are the same JSON number once stored; an explicit default is the default.
    again, created = await engine.create_schedule(
        "flags", ScheduleSettings(HOUR, kind="tick", input={"flag": 1.0}, options={"max_attempts": 25},
                                  overlap="skip", catchup_window=60.0))
    assert not created and again["next_fire_at"] == row["next_fire_at"]
    for other in ({"flag": True}, {"flag": "1"}, {"flag": [1]}, None):
        with pytest.raises(AlreadyExists, match="already exists with other settings"):
            await engine.create_schedule("flags", ScheduleSettings(HOUR, kind="tick", input=other))
