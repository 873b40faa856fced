"""Schedules over a real port: the Schedules service, runs on time from real servers, several servers on
one database, and a server killed in the middle of a fire."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import shlex
import subprocess
import sys
import urllib.request
from typing import Any
from datetime import datetime, timezone
from pathlib import Path

import grpc
import psycopg
import pytest
from google.protobuf import duration_pb2, json_format

from cyclone_proto import (runs_pb2, runs_pb2_grpc, schedules_pb2, schedules_pb2_grpc, types_pb2, workflows_pb2,
                          workflows_pb2_grpc)

from waits_helpers import until

DEADLINE = 30.0


def every(seconds: float) -> schedules_pb2.IntervalSpec:
    return schedules_pb2.IntervalSpec(every=duration_pb2.Duration(seconds=int(seconds),
                                                                   nanos=int(seconds % 1 * 1e9)))


def job_settings(seconds: float = 1, overlap: int = schedules_pb2.OVERLAP_POLICY_ALLOW_ALL,
                 **kw) -> schedules_pb2.ScheduleSettings:
    return schedules_pb2.ScheduleSettings(job=runs_pb2.EnqueueRequest(kind="tick", max_attempts=3),
                                          interval=every(seconds), overlap=overlap, **kw)


async def runs_of(runs: runs_pb2_grpc.RunsStub, schedule: str) -> list[types_pb2.Run]:
    return list((await runs.ListRuns(runs_pb2.ListRunsRequest(schedule=schedule, limit=1000))).runs)


async def test_a_schedule_starts_runs_on_time_and_is_steered_over_the_api(start_server, db_url: str) -> None:
    srv = start_server(db_url, extra_args=["--metrics-listen", "127.0.0.1:0"])
    async with grpc.aio.insecure_channel(srv.address) as ch:
        sched, runs = schedules_pb2_grpc.SchedulesStub(ch), runs_pb2_grpc.RunsStub(ch)
        made = await sched.CreateSchedule(schedules_pb2.CreateScheduleRequest(
            name="tick", settings=job_settings(1, note="every second")))
        assert made.created and made.schedule.HasField("next_fire_at")
        assert made.schedule.settings.job.max_attempts == 3 and made.schedule.settings.note == "every second"

        async def two_runs() -> bool:
            return len(await runs_of(runs, "tick")) >= 2
        await until(two_runs, "two runs of an every-second schedule", DEADLINE)
        started = await runs_of(runs, "tick")
        for run in started:
            assert run.schedule_name == "tick" and run.schedule_fire_at.nanos == 0
            # On time: the run is made within a second of its fire time.
            late = run.created_at.ToDatetime() - run.schedule_fire_at.ToDatetime()
            assert late.total_seconds() < 1.0, late
        one = await runs.ListRuns(runs_pb2.ListRunsRequest(schedule="tick",
                                                           schedule_fire_at=started[0].schedule_fire_at))
        assert [r.id for r in one.runs] == [started[0].id]

        paused = await sched.PauseSchedule(schedules_pb2.PauseScheduleRequest(name="tick"))
        assert paused.applied and paused.schedule.paused and not paused.schedule.HasField("next_fire_at")
        got = await sched.GetSchedule(schedules_pb2.GetScheduleRequest(name="tick"))
        assert got.fires >= 2 and 1 <= len(got.recent_runs) <= 10
        assert got.recent_runs[0].run_id in {r.id for r in await runs_of(runs, "tick")}

        trig = await sched.TriggerSchedule(schedules_pb2.TriggerScheduleRequest(name="tick"))
        assert trig.outcome == schedules_pb2.FIRE_OUTCOME_STARTED and trig.run_id
        assert (await runs.GetRun(runs_pb2.GetRunRequest(run_id=trig.run_id))).schedule_name == "tick"

        updated = await sched.UpdateSchedule(schedules_pb2.UpdateScheduleRequest(
            name="tick", settings=schedules_pb2.ScheduleSettings(
                job=runs_pb2.EnqueueRequest(kind="tick"), cron=schedules_pb2.CronSpec(expression="0 3 * * *",
                                                                                     time_zone="Europe/Paris"))))
        assert updated.settings.cron.time_zone == "Europe/Paris" and updated.paused
        resumed = await sched.ResumeSchedule(schedules_pb2.ResumeScheduleRequest(name="tick"))
        assert resumed.applied and resumed.schedule.next_fire_at.ToDatetime().hour in (1, 2)  # 03:00 Paris in UTC
        listed = await sched.ListSchedules(schedules_pb2.ListSchedulesRequest(name_prefix="ti"))
        assert [s.name for s in listed.schedules] == ["tick"] and not listed.schedules[0].recent_runs

        metrics_address = json.loads((srv.workdir / "ready-1.json").read_text())["metrics_address"]
        text = await asyncio.to_thread(lambda: urllib.request.urlopen(f"http://{metrics_address}/metrics").read())
        assert 'cyclone_schedule_fires_total{schedule="tick"}' in text.decode()

        await sched.DeleteSchedule(schedules_pb2.DeleteScheduleRequest(name="tick"))
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await sched.GetSchedule(schedules_pb2.GetScheduleRequest(name="tick"))
        assert e.value.code() == grpc.StatusCode.NOT_FOUND
        assert len(await runs_of(runs, "tick")) >= 3  # runs outlive their schedule


@pytest.mark.parametrize(("settings", "field"), [
    (schedules_pb2.ScheduleSettings(job=runs_pb2.EnqueueRequest(kind="k"),
                                    cron=schedules_pb2.CronSpec(expression="0 25 * * *")), "settings.cron.expression"),
    (schedules_pb2.ScheduleSettings(job=runs_pb2.EnqueueRequest(kind="k"),
                                    cron=schedules_pb2.CronSpec(expression="0 3 * * *", time_zone="Europe/Atlantis")),
     "settings.cron.time_zone"),
    (schedules_pb2.ScheduleSettings(run=runs_pb2.SubmitRunRequest(workflow="missing"), interval=every(60)),
     "settings.run.workflow"),
    (schedules_pb2.ScheduleSettings(job=runs_pb2.EnqueueRequest(kind="k"), interval=schedules_pb2.IntervalSpec()),
     "settings.interval.every"),
    (schedules_pb2.ScheduleSettings(job=runs_pb2.EnqueueRequest(kind="k"), interval=every(-5)),
     "settings.interval.every: must be > 0, got -5 s"),
    (schedules_pb2.ScheduleSettings(job=runs_pb2.EnqueueRequest(kind="k"), interval=every(60), overlap=9),
     "settings.overlap"),
    (schedules_pb2.ScheduleSettings(job=runs_pb2.EnqueueRequest(kind="k", idempotency_key="x"), interval=every(60)),
     "settings.job.idempotency_key"),
    (schedules_pb2.ScheduleSettings(job=runs_pb2.EnqueueRequest(kind=""), interval=every(60)), "settings.job.kind"),
    (schedules_pb2.ScheduleSettings(job=runs_pb2.EnqueueRequest(kind="k")), "settings: give exactly one of cron"),
    (schedules_pb2.ScheduleSettings(interval=every(60)), "settings: give exactly one target"),
])
async def test_bad_schedules_are_invalid_argument_naming_the_field(channel, settings, field: str) -> None:
    sched = schedules_pb2_grpc.SchedulesStub(channel)
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await sched.CreateSchedule(schedules_pb2.CreateScheduleRequest(name="bad", settings=settings))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert e.value.details().startswith(field), e.value.details()


async def test_a_workflow_target_and_the_same_create_twice(channel, wf) -> None:
    await wf.RegisterWorkflow(workflows_pb2.RegisterWorkflowRequest(name="etl", nodes=[types_pb2.Node(id="load")]))
    sched = schedules_pb2_grpc.SchedulesStub(channel)
    request = json_format.ParseDict({"name": "nightly", "settings": {
        "run": {"workflow": "etl", "input": {"full": True}}, "cron": {"expression": "0 3 * * *"},
        "overlap": "OVERLAP_POLICY_BUFFER_ONE"}}, schedules_pb2.CreateScheduleRequest())
    first = await sched.CreateSchedule(request)
    again = await sched.CreateSchedule(request)
    assert first.created and not again.created and again.schedule.name == "nightly"
    assert json_format.MessageToDict(again.schedule.settings.run.input) == {"full": True}
    request.settings.overlap = schedules_pb2.OVERLAP_POLICY_SKIP
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await sched.CreateSchedule(request)
    assert e.value.code() == grpc.StatusCode.ALREADY_EXISTS
    trig = await sched.TriggerSchedule(schedules_pb2.TriggerScheduleRequest(name="nightly"))
    run = await runs_pb2_grpc.RunsStub(channel).GetRun(runs_pb2.GetRunRequest(run_id=trig.run_id))
    assert run.workflow == "etl" and run.schedule_fire_at == trig.fire_at


async def test_several_servers_on_one_database_start_each_fire_time_once(start_server, db_url: str) -> None:
    servers = [start_server(db_url) for _ in range(3)]
    async with grpc.aio.insecure_channel(servers[0].address) as ch:
        sched, runs = schedules_pb2_grpc.SchedulesStub(ch), runs_pb2_grpc.RunsStub(ch)
        await sched.CreateSchedule(schedules_pb2.CreateScheduleRequest(name="busy", settings=job_settings(0.5)))

        async def six() -> bool:
            return len(await runs_of(runs, "busy")) >= 6
        await until(six, "six fires of a half-second schedule", DEADLINE)
        await sched.PauseSchedule(schedules_pb2.PauseScheduleRequest(name="busy"))
        fired = sorted(r.schedule_fire_at.ToNanoseconds() for r in await runs_of(runs, "busy"))
        got = await sched.GetSchedule(schedules_pb2.GetScheduleRequest(name="busy"))
    assert len(fired) == len(set(fired)) == got.fires
    # Every fire time of the half-second grid from the first on, none twice and none left out.
    assert all(b - a == 500_000_000 for a, b in zip(fired, fired[1:])) and got.misses == 0
    for srv in servers:
        assert "fire failed" not in srv.log_text() and "pass failed" not in srv.log_text()


def _fire_blocked(db_url: str) -> int | None:
    """The pid of a backend stuck in cyclone_schedule_fire on a lock, if any."""
    with psycopg.connect(db_url, autocommit=True) as c:
        row = c.execute("SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                        " AND query LIKE '%%cyclone_schedule_fire%%'").fetchone()
    return row[0] if row else None


async def test_a_server_killed_mid_fire_leaves_the_fire_time_to_the_next_server(start_server, db_url: str) -> None:
    """SIGKILL while the fire transaction is open (the run made, the next fire time moved on,
    not committed): nothing of it stays, and the next server starts that fire time once."""
    first = start_server(db_url)
    async with grpc.aio.insecure_channel(first.address) as ch:
        made = await schedules_pb2_grpc.SchedulesStub(ch).CreateSchedule(schedules_pb2.CreateScheduleRequest(
            name="crash", settings=job_settings(3, catchup_window=duration_pb2.Duration(seconds=600))))
    fire_at = made.schedule.next_fire_at.ToDatetime(tzinfo=timezone.utc)
    # Hold flow control's settings lock in an open transaction: the server's fire blocks on it
    # inside its transaction, after it has moved the schedule on, when it makes the run.
    with psycopg.connect(db_url) as blocker:
        blocker.execute("SELECT pg_advisory_xact_lock(hashtextextended('cyclone.limits', 0))")
        pid = await until(lambda: _fire_blocked(db_url), "the fire blocked making its run", DEADLINE)
        first.kill()  # SIGKILL, mid-fire
        with psycopg.connect(db_url, autocommit=True) as c:  # the host is gone: so is its session
            c.execute("SELECT pg_terminate_backend(%s)", (pid,))
        blocker.rollback()
    with psycopg.connect(db_url) as c:
        row = c.execute("SELECT next_fire_at, fires FROM cyclone_schedules WHERE name = 'crash'").fetchone()
        assert row == (fire_at, 0)  # rolled back with the killed transaction
    second = start_server(db_url)
    async with grpc.aio.insecure_channel(second.address) as ch:
        runs = runs_pb2_grpc.RunsStub(ch)

        async def fired() -> bool:
            return len(await runs_of(runs, "crash")) >= 2
        await until(fired, "the fire time of the killed server and the next one", DEADLINE)
        got = await runs_of(runs, "crash")
    at = [r.schedule_fire_at.ToDatetime(tzinfo=timezone.utc) for r in got]
    assert at.count(fire_at) == 1 and len(at) == len(set(at))
    assert datetime.now(timezone.utc) > fire_at


async def test_the_sdk_client_makes_and_steers_schedules_that_a_worker_runs(server) -> None:
    from cyclone_worker import Client, Context, CycloneClientError, Job, Worker, Workflow

    worker = Worker(server.address, slots=2)
    seen: list[Any] = []

    @worker.handler("beat")
    async def beat(ctx: Context) -> str:
        seen.append(ctx.input)
        return "ok"

    async with Client(server.address) as client, worker:
        await client.register(Workflow("pulse").task("beat"))
        made = await client.create_schedule("pulse", workflow="pulse", input={"from": "schedule"}, every=1,
                                            overlap="buffer_one", note="heartbeat")
        assert (made.workflow, made.every, made.overlap, made.note) == ("pulse", 1.0, "buffer_one", "heartbeat")

        async def completed() -> bool:
            return len(await client.list(schedule="pulse", states=["completed"])) >= 2
        await until(completed, "two completed runs of the schedule", DEADLINE)
        done = await client.list(schedule="pulse", states=["completed"])
        assert all(r.schedule_name == "pulse" and r.schedule_fire_at is not None for r in done)
        assert seen[0] == {"from": "schedule"}

        assert (await client.pause_schedule("pulse")).paused
        run_id = await client.trigger_schedule("pulse", overlap="allow_all")
        assert run_id and (await client.wait(run_id, timeout=DEADLINE)).state == "completed"
        got = await client.get_schedule("pulse")
        assert got.fires >= 3 and got.recent_runs[0].run_id == run_id
        cron = await client.update_schedule("pulse", job=Job("beat", max_attempts=2), cron="*/5 * * * *",
                                            time_zone="Asia/Tokyo")
        assert (cron.kind, cron.cron, cron.time_zone, cron.paused) == ("beat", "*/5 * * * *", "Asia/Tokyo", True)
        assert not (await client.resume_schedule("pulse")).paused
        assert [s.name for s in await client.list_schedules("pul")] == ["pulse"]
        await client.delete_schedule("pulse")
        with pytest.raises(CycloneClientError) as e:
            await client.get_schedule("pulse")
        assert e.value.code == grpc.StatusCode.NOT_FOUND
        with pytest.raises(CycloneClientError) as e:
            await client.create_schedule("bad", job=Job("beat"), every=0)
        assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT and "settings.interval.every" in e.value.message


def documented_cli_lines() -> list[str]:
    """The `cyclone schedules ...` lines of docs/operations.md's Schedules section."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "operations.md").read_text()
    section = text.split("\n## Schedules\n", 1)[1].split("\n## ", 1)[0]
    return [line for line in section.splitlines() if line.startswith("cyclone ")]


def test_every_documented_cli_line_runs(server) -> None:
    entry = "import sys; from cyclone_server.cli.main import main; sys.exit(main(sys.argv[1:]))"
    env = {**os.environ, "CYCLONE_ADDRESS": server.address, "COLUMNS": "200"}
    lines = documented_cli_lines()
    assert len(lines) >= 8
    outputs = {}
    for line in lines:
        argv = shlex.split(line, comments=True)[1:]
        proc = subprocess.run([sys.executable, "-c", entry, *argv], capture_output=True, text=True, timeout=120,
                              env=env)
        assert proc.returncode == 0, f"{line}\n{proc.stderr}"
        outputs[" ".join(argv[:3])] = proc.stdout
    assert "fires 0" in outputs["schedules get invoices"] and "buffer_one" in outputs["schedules get invoices"]
    assert "started" in outputs["schedules trigger invoices"]
    listed = subprocess.run([sys.executable, "-c", entry, "schedules", "list", "--json"], capture_output=True,
                            text=True, timeout=120, env=env)
    assert [s["name"] for s in json.loads(listed.stdout)] == ["invoices"]  # heartbeat was deleted
    bad = subprocess.run([sys.executable, "-c", entry, "schedules", "create", "x", "--job", "k", "--cron", "0 3 * *"],
                         capture_output=True, text=True, timeout=120, env=env)
    assert bad.returncode == 1 and "INVALID_ARGUMENT: settings.cron.expression" in bad.stderr
    # An option of the other target or spec is refused (exit 2), not dropped.
    for args, says in [(["--job", "k", "--cron", "0 3 * * *", "--offset", "5m"], "--offset applies only with --every"),
                       (["--workflow", "w", "--every", "1h", "--max-attempts", "3"],
                        "--max-attempts applies only with --job"),
                       (["--job", "k", "--every", "1h", "--time-zone", "Asia/Tokyo"],
                        "--time-zone applies only with --cron"),
                       (["--job", "k", "--every", "1h", "--version", "2"], "--version applies only with --workflow")]:
        proc = subprocess.run([sys.executable, "-c", entry, "schedules", "create", "y", *args], capture_output=True,
                              text=True, timeout=120, env=env)
        assert (proc.returncode, proc.stderr.strip()) == (2, f"cyclone: {says}"), args
    shown = subprocess.run([sys.executable, "-c", entry, "schedules", "create", "z", "--job", "k", "--every", "1h",
                            "--paused"], capture_output=True, text=True, timeout=120, env=env)
    assert shown.returncode == 0 and "next      -   last -" in shown.stdout  # paused, never fired: no times


async def test_creating_again_with_the_settings_as_stored_is_no_change(start_server, db_url: str) -> None:
    """The same settings again are created = false however they are written: with the defaults
    left out, given explicitly, or as GetSchedule returns them (the settings as stored)."""
    srv = start_server(db_url)
    P = schedules_pb2
    async with grpc.aio.insecure_channel(srv.address) as ch:
        sched = schedules_pb2_grpc.SchedulesStub(ch)
        for name, settings in [
                ("job", P.ScheduleSettings(job=runs_pb2.EnqueueRequest(kind="x"),
                                           cron=P.CronSpec(expression="0 3 * * *"))),
                ("wf", P.ScheduleSettings(run=runs_pb2.SubmitRunRequest(workflow="w"),
                                          interval=P.IntervalSpec(every=duration_pb2.Duration(seconds=90))))]:
            if name == "wf":
                await workflows_pb2_grpc.WorkflowsStub(ch).RegisterWorkflow(workflows_pb2.RegisterWorkflowRequest(
                    name="w", nodes=[types_pb2.Node(id="a")]))
            made = await sched.CreateSchedule(P.CreateScheduleRequest(name=name, settings=settings, paused=True))
            assert made.created
            stored = (await sched.GetSchedule(P.GetScheduleRequest(name=name))).settings
            assert stored != settings  # the defaults are filled in
            again = await sched.CreateSchedule(P.CreateScheduleRequest(name=name, settings=stored))
            assert not again.created and again.schedule.settings == stored
        explicit = P.ScheduleSettings(
            job=runs_pb2.EnqueueRequest(kind="x", max_attempts=25), overlap=P.OVERLAP_POLICY_SKIP,
            cron=P.CronSpec(expression="0 3 * * *", time_zone="UTC"), catchup_window=duration_pb2.Duration(seconds=60))
        assert not (await sched.CreateSchedule(P.CreateScheduleRequest(name="job", settings=explicit))).created
        # Settings that differ still do.
        other = P.ScheduleSettings(job=runs_pb2.EnqueueRequest(kind="x", max_attempts=3),
                                   cron=P.CronSpec(expression="0 3 * * *"))
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await sched.CreateSchedule(P.CreateScheduleRequest(name="job", settings=other))
        assert e.value.code() == grpc.StatusCode.ALREADY_EXISTS


async def test_list_schedules_pages_and_refuses_tokens_it_did_not_issue(start_server, db_url: str) -> None:
    srv = start_server(db_url)
    P = schedules_pb2
    async with grpc.aio.insecure_channel(srv.address) as ch:
        sched, runs = schedules_pb2_grpc.SchedulesStub(ch), runs_pb2_grpc.RunsStub(ch)
        names = [f"page.{i}" for i in range(5)]
        for name in [*names, "other"]:
            await sched.CreateSchedule(P.CreateScheduleRequest(name=name, settings=job_settings(3600), paused=True))
        seen, token, tokens = [], "", []
        while True:
            page = await sched.ListSchedules(P.ListSchedulesRequest(name_prefix="page.", limit=2, page_token=token))
            seen += [s.name for s in page.schedules]
            if not page.next_page_token:
                break
            token = page.next_page_token
            tokens.append(token)
        assert seen == names and len(tokens) == 2
        await runs.Enqueue(runs_pb2.EnqueueRequest(kind="x"))
        await runs.Enqueue(runs_pb2.EnqueueRequest(kind="x"))
        runs_token = (await runs.ListRuns(runs_pb2.ListRunsRequest(limit=1))).next_page_token
        assert runs_token
        for bad, says in [("YWJj", "not a token issued by ListSchedules"),  # base64 of "abc"
                          ("garbage!", "not a token issued by ListSchedules"),
                          (base64.urlsafe_b64encode(b"[" * 3000).decode(), "not a token issued by ListSchedules"),
                          (runs_token, "not a token issued by ListSchedules"),
                          (tokens[0], "issued for another name_prefix")]:
            prefix = "pa" if bad == tokens[0] else "page."
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await sched.ListSchedules(P.ListSchedulesRequest(name_prefix=prefix, page_token=bad))
            assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, bad
            assert e.value.details() == f"page_token: {says}"
