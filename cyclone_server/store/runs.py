"""Runs: workflow definitions, submitting runs and enqueueing jobs, run actions, signals and purges."""

from __future__ import annotations

import asyncio
import functools
import json
import time
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from psycopg.types.json import Jsonb

from cyclone_server import definitions
from cyclone_server.errors import InvalidArgument, NotFound
from cyclone_server.records import (ENQUEUE_MANY_MAX, RUN_ACTIONS, Job, PreparedJob, check_payload,
                                    checked_payload_text, compact, parse_id, request_hash, utf8)

from .core import MAY_MAKE_AVAILABLE, Core, issuer, jobs_payload, run_with_steps, seconds
from .queries import Q
from .faults import translated

HISTORY_READ_PAGES = 2048  # pages of a day's runs read per transaction (16 MB; about 90,000 runs)
HISTORY_READ_PACE = 8.0  # and after each slice, a pause this many times as long as the slice took
HISTORY_DROP_TRIES = 3  # calls that try for a parent's lock to detach a partition (each tries five times)
HISTORY_KEPT_RECHECK = 600.0  # seconds before a day whose read found a run that must stay is read again


def _node_and_json(kind: str, options: Mapping[str, Any]) -> tuple[dict[str, Any], str]:
    node = definitions.normalize_job(kind, options)
    return node, compact(node)


@functools.lru_cache(maxsize=1024)
def _cached_job_node(kind: str, options: tuple[tuple[str, type, Any], ...]) -> tuple[dict[str, Any], str]:
    return _node_and_json(kind, {k: v for k, _, v in options})


def _job_node(kind: str, options: Mapping[str, Any]) -> tuple[dict[str, Any], str]:
    """definitions.normalize_job, and the node as compact JSON, remembered for the (kind,
    options) that jobs repeat. The node is shared between the jobs that have it: nothing
    may change it."""
    key = tuple((k, type(v), v) for k, v in sorted(options.items()))
    try:
        hash(key)
    except TypeError:  # an option the cache cannot key: checked every time
        return _node_and_json(kind, options)
    return _cached_job_node(kind, key)



def _job_item(node_json: str, input_json: str, params: Mapping[str, Any]) -> str:
    """One element of cyclone_jobs_enqueue's p_jobs, as JSON text: {node, input, priority,
    and those of idempotency_key, request_hash, deadline, scheduled_at and trace_context
    that are set} (the SQL reads a missing key as null). The node and input are compact
    JSON already; every other value goes through json.dumps or is an ISO time, an integer
    or a hex digest, so nothing can break out of the element."""
    parts = [f'{{"node":{node_json},"input":{input_json},"priority":{int(params["priority"])}']
    if params["idempotency_key"] is not None:
        key = json.dumps(params["idempotency_key"])
        parts.append(f',"idempotency_key":{key},"request_hash":"{params["request_hash"]}"')
    for name in ("deadline", "scheduled_at"):
        if params[name] is not None:
            parts.append(f',"{name}":"{params[name].isoformat()}"')
    if params["trace_context"] is not None:
        parts.append(f',"trace_context":{json.dumps(params["trace_context"])}')
    parts.append("}")
    return "".join(parts)






class RunStore(Core):
    """The transitions that begin a run or act on one, and the definitions they start from."""

    async def register_workflow(self, name: str, nodes: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
        """Validate and store a definition; returns {name, version, created, created_at, nodes}."""
        definitions.validate_name(name)
        normalized = definitions.normalize_nodes(nodes)
        row = await self._one("workflow_register", name=name, definition=Jsonb({"nodes": normalized}))
        assert row is not None
        return {"name": name, "nodes": normalized, **row}

    async def get_workflow(self, name: str, version: int = 0) -> dict[str, Any]:
        row = await self._one("workflow_get", name=name, version=version or 0)
        if row is None:
            raise NotFound(f'workflow "{name}" ' + (f"has no version {version}" if version else "is not registered"))
        return row

    async def list_workflows(self, prefix: str = "", all_versions: bool = False) -> list[dict[str, Any]]:
        return await self._all("workflow_list", prefix=prefix.replace("%", r"\%").replace("_", r"\_"),
                               all_versions=all_versions)

    # -- runs begin ----------------------------------------------------------------------

    async def submit_run(self, workflow: str, *, version: int = 0, input: Any = None, priority: int = 0,
                         idempotency_key: str | None = None, deadline: datetime | None = None,
                         request_fingerprint: Any = None,
                         trace_context: Mapping[str, str] | None = None) -> tuple[str, bool]:
        """Start a run of a registered workflow; returns (run_id, created).

        `request_fingerprint` identifies the request for the idempotency check (defaults to
        the arguments themselves); a repeat with the same key and fingerprint returns the
        existing run, a different request with the same key is ALREADY_EXISTS.
        """
        definitions.validate_name(workflow, "workflow")
        check_payload(input, "input", self.max_payload_bytes)
        fp = request_fingerprint if request_fingerprint is not None else (workflow, version, input, priority, deadline)
        row = await self._one("run_submit", workflow=workflow, version=version, input=Jsonb(input),
                              priority=priority, idempotency_key=idempotency_key or None,
                              request_hash=request_hash("run", fp), deadline=deadline,
                              trace_context=Jsonb(dict(trace_context)) if trace_context else None)
        assert row is not None
        return str(row["run_id"]), row["created"]

    async def enqueue(self, kind: str, *, input: Any = None, priority: int = 0, idempotency_key: str | None = None,
                      deadline: datetime | None = None, scheduled_at: datetime | None = None,
                      options: Mapping[str, Any] | None = None,
                      request_fingerprint: Any = None) -> tuple[str, str, bool]:
        """A standalone job: a one-node run; returns (run_id, step_id, created)."""
        return await self.enqueue_job(Job(kind, input=input, priority=priority, idempotency_key=idempotency_key,
                                          deadline=deadline, scheduled_at=scheduled_at, options=options or {},
                                          request_fingerprint=request_fingerprint))

    async def enqueue_job(self, job: Job) -> tuple[str, str, bool]:
        """`enqueue` with its arguments as a Job."""
        return await self.enqueue_prepared_one(self.prepare_job(job))

    async def enqueue_many(self, jobs: Sequence[Job]) -> list[tuple[str, str, bool]]:
        """Many standalone jobs in one transaction, all or none; (run_id, step_id, created) each, in order.

        An error names the job by its index: "jobs[3].kind: ..." (checked here), "jobs[3]: ..."
        (refused by the database).
        """
        if not jobs:
            raise InvalidArgument("jobs: at least one job is required")
        if len(jobs) > ENQUEUE_MANY_MAX:
            raise InvalidArgument(f"jobs: {len(jobs)} jobs, over the limit of {ENQUEUE_MANY_MAX} per call")
        prepared = []
        for i, job in enumerate(jobs):
            try:
                prepared.append(self.prepare_job(job))
            except InvalidArgument as e:
                raise InvalidArgument(f"jobs[{i}].{e.message}") from None
        return await self.enqueue_prepared(prepared)

    def prepare_job(self, job: Job) -> PreparedJob:
        """Check a job as far as Python can (InvalidArgument, naming the field); what the
        database needs to make it."""
        try:
            node, node_json = _job_node(job.kind, job.options)
        except InvalidArgument as e:
            # The job's options are validated as its one node: name the request's field,
            # 'nodes[0] (id "email"): max_attempts: ...' -> 'max_attempts: ...'.
            message = e.message.split(": ", 1)[-1] if e.message.startswith("nodes[0]") else e.message
            raise InvalidArgument(message) from None
        input_json, size = checked_payload_text(job.input, "input", self.max_payload_bytes)
        # The fingerprint matters only to a repeat of the same idempotency key.
        fingerprint = None
        if job.idempotency_key:
            utf8(job.idempotency_key, "idempotency_key")
            fp = job.request_fingerprint if job.request_fingerprint is not None else (
                job.kind, job.input, job.priority, job.deadline, job.scheduled_at, dict(job.options))
            fingerprint = request_hash("job", fp)
        params = {"node": node, "input": job.input, "priority": job.priority,
                  "idempotency_key": job.idempotency_key or None, "request_hash": fingerprint,
                  "deadline": job.deadline, "scheduled_at": job.scheduled_at,
                  "trace_context": dict(job.trace_context) if job.trace_context else None}
        return PreparedJob(params, size, _job_item(node_json, input_json, params))

    async def enqueue_prepared_one(self, job: PreparedJob) -> tuple[str, str, bool]:
        """One prepared job in its own transaction (cyclone_job_enqueue)."""
        p = job.params
        trace = Jsonb(p["trace_context"]) if p["trace_context"] else None
        row = await self._one("job_enqueue", **{**p, "node": Jsonb(p["node"]), "input": Jsonb(p["input"]),
                                                "trace_context": trace})
        assert row is not None
        return str(row["run_id"]), str(row["step_id"]), row["created"]

    async def enqueue_prepared(self, jobs: Sequence[PreparedJob]) -> list[tuple[str, str, bool]]:
        """Prepared jobs in one transaction, in order (cyclone_jobs_enqueue); errors name "jobs[i]: "."""
        rows = await self._all("jobs_enqueue", jobs=jobs_payload(jobs))
        if len(rows) != len(jobs):  # one row per job, or the transaction failed
            raise RuntimeError(f"cyclone_jobs_enqueue returned {len(rows)} rows for {len(jobs)} jobs")
        return [(r["run_id"], r["step_id"], r["created"]) for r in rows]  # ids as text already

    # An action that may end its run (cancel, resume, retry, signal) also settles the run's
    # parent node, when it has one, before it returns: an action's effects are
    # visible when its call returns.

    async def act(self, action: str, run_id: str, *, node: str | None = None,
                  deadline: datetime | None = None) -> tuple[bool, dict[str, Any]]:
        """Cancel, pause, resume or retry (`node`: one discarded node; None: all of them) a
        run; returns whether the action applied, and the run with its steps as the action
        left it.

        The run is read in the action's own transaction, while the action holds the run's
        lock: read after the commit, a fast worker could already have ended a retried or
        resumed run, and the answer to Retry would show a completed run. No other
        transaction changes the run's row before this one commits; a claim or renewal of
        one of its steps (which takes no run lock) may show."""
        applied, run = await self._act(action, run_id, node=node, deadline=deadline, read=True)
        assert run is not None
        return applied, run

    async def _act(self, action: str, run_id: str, *, node: str | None = None, deadline: datetime | None = None,
                   read: bool) -> tuple[bool, dict[str, Any] | None]:
        if action not in RUN_ACTIONS:
            raise ValueError(f"{action!r} is not a run action")
        if node is not None and not definitions.NODE_ID.match(node):
            raise InvalidArgument(f"node: {node!r} is not a valid node id")
        rid = parse_id(run_id, "run_id")
        query = f"run_{action}"
        params = {"run_id": rid, **({"node": node, "deadline": deadline} if action == "retry" else {})}
        run = None
        with translated():
            async with self.warm.connection() as conn, conn.transaction():
                issue = issuer(conn)
                applied = (await (await issue(query, **params)).fetchone())["applied"]  # type: ignore[index]
                if read:  # both reads in one round trip (pipelined), the run's lock held
                    async with conn.pipeline():
                        run = await run_with_steps(issue, rid)
                    assert run is not None  # locked by the action, which raised NotFound without it
        if query in MAY_MAKE_AVAILABLE:
            self.announce()
        if action != "pause":
            await self.settle_parents([rid])
        return applied, run

    async def cancel_run(self, run_id: str) -> bool:
        return (await self._act("cancel", run_id, read=False))[0]

    async def pause_run(self, run_id: str) -> bool:
        return (await self._act("pause", run_id, read=False))[0]

    async def resume_run(self, run_id: str) -> bool:
        return (await self._act("resume", run_id, read=False))[0]

    async def retry(self, run_id: str, node: str | None = None, *, deadline: datetime | None = None) -> bool:
        """Reopen one discarded node (`node`) or all of them (`node=None`)."""
        return (await self._act("retry", run_id, node=node, deadline=deadline, read=False))[0]

    async def signal(self, run_id: str, name: str, payload: Any = None) -> tuple[str, str | None]:
        """Write a signal to the run's mailbox; returns (signal_id, consumed_by_step_id)."""
        definitions.validate_name(name, "name")
        check_payload(payload, "payload", self.max_payload_bytes)
        rid = parse_id(run_id, "run_id")
        row = await self._one("run_signal", run_id=rid, name=name, payload=Jsonb(payload))
        assert row is not None
        await self.settle_parents([rid])
        return str(row["signal_id"]), (str(row["consumed_by"]) if row["consumed_by"] else None)

    async def purge(self, older_than: float | timedelta | None, limit: int = 1000, *, sweep: bool = False) -> int:
        """Delete at most `limit` terminal runs eligible for purge (see 60_retention.sql).

        PurgeTerminalRuns: runs finished at least `older_than` ago, and past their own
        retention. `sweep=True` (the retention sweep): a run's own retention, else `older_than`.
        """
        row = await self._one("runs_purge", age=seconds(older_than), limit=limit, sweep=sweep)
        return row["deleted"]  # type: ignore[index]

    async def drop_history_day(self, older_than: float | timedelta | None, *,
                               pace: float = HISTORY_READ_PACE) -> int | None:
        """The retention sweep's first part: drop the oldest day of history (before today,
        UTC) whose runs are all eligible, as whole partitions (65_history.sql). Returns how
        many runs went with it (0: an empty day, or one whose runs went before); -1 when a
        day may go but a lock was not had, or another server sweeps days now (try again
        later: what is left of the day goes then); None when no day may go.

        A day is read HISTORY_READ_PAGES pages of its runs at a time, each slice in its own
        transaction and followed by a pause `pace` times as long as the slice took: the
        read takes a core while it runs, and a drain beside it, on a machine with few,
        slows by much less when it is spread out. A day of 1,000,000 runs is about 23,000
        pages, read in 0.2 to 0.5 s of a core (docs/benchmarks.md). One server sweeps at a
        time (a session's advisory lock, held on one connection throughout); a day its read
        found must stay is not read again for HISTORY_KEPT_RECHECK seconds."""
        age = seconds(older_than)
        async with self.pool.connection() as conn:

            async def one(query: str, **params: Any) -> dict[str, Any] | None:
                with translated():
                    return await (await conn.execute(Q[query], params)).fetchone()

            if not (await one("history_sweep_lock"))["locked"]:  # type: ignore[index]
                return -1
            try:
                return await self._drop_history_day(one, age, pace)
            finally:
                try:
                    await one("history_sweep_unlock")
                except BaseException:
                    await conn.close()  # the pool drops it, and its session's lock with it
                    raise

    async def _drop_history_day(self, one: Any, age: timedelta | None, pace: float) -> int | None:
        kept = self._history_kept
        now = time.monotonic()
        for lo in [lo for lo, until in kept.items() if until <= now]:
            del kept[lo]
        after = None
        while True:
            day = await one("history_next", age=age, after=after)
            if day is None:
                return None
            after = day["lo"]
            if after in kept:
                continue
            runs, page, blocked = 0, 0, False
            while page is not None and not blocked:
                began = time.monotonic()
                row = await one("history_read", lo=day["lo"], age=age, page=page, pages=HISTORY_READ_PAGES)
                assert row is not None
                runs += row["runs"]
                page, blocked = row["next_page"], row["blocked"]
                if page is not None and pace > 0:
                    await asyncio.sleep((time.monotonic() - began) * pace)
            if blocked:
                kept[day["lo"]] = time.monotonic() + HISTORY_KEPT_RECHECK
                continue
            detached = await self._detach_history_day(one, day["lo"], day["read_at"])
            if detached is None:
                # The day changed since its read began (the next sweep reads it again), or
                # it went meanwhile: on to the next day.
                continue
            await one("history_drop_detached", lo=day["lo"])  # (what it leaves goes at the next call)
            return runs if detached else -1

    async def _detach_history_day(self, one: Any, lo: Any, read_at: datetime) -> bool | None:
        """The day's three partitions detached, one per transaction
        (cyclone_history_detach_part): True when its runs' is (what else is left goes at the
        next sweep); False when the runs' lock was not had in HISTORY_DROP_TRIES calls, a
        second apart; None when the runs' check found the day changed."""
        for table in ("cyclone_runs", "cyclone_steps", "cyclone_step_deps"):
            for attempt in range(HISTORY_DROP_TRIES):
                if attempt:
                    await asyncio.sleep(1.0)
                row = await one("history_detach_part", lo=lo, table=table, read_at=read_at)
                done = row["done"]  # type: ignore[index]
                if done is not False:
                    break
            if not done:
                return done if table == "cyclone_runs" else True
        return True

    async def tidy_history(self, limit: int = 1000) -> int:
        """Delete at most `limit` signals and child runs left by dropped days (their runs
        went with the day); returns how many."""
        row = await self._one("history_tidy", limit=limit)
        return row["deleted"]  # type: ignore[index]

    async def ensure_history(self) -> int:
        """Make the coming days of history (today and two days ahead, UTC); returns how
        many it made."""
        row = await self._one("history_ensure")
        return row["made"]  # type: ignore[index]

    async def settle_history(self) -> int:
        """Settle the days of history that have ended and whose runs are all terminal
        (migration 0015: the claim and the sweeps read no settled day), each in its own
        transaction. Returns how many it settled; a day with a live run, or whose lock was not
        had at once, is left to the next call."""
        settled = 0
        for row in await self._all("history_unsettled"):
            if (await self._one("history_settle", lo=row["lo"]))["settled"]:  # type: ignore[index]
                settled += 1
        return settled

    async def history_days(self) -> int:
        """How many partitions each table of history has (docs/operations.md, "Days of
        history"): the days kept, the days made ahead and the first partition."""
        row = await self._one("history_days")
        return row["days"]  # type: ignore[index]

    async def history_live_days(self) -> int:
        """How many of those days the claim and the sweeps read: the days from the first one not
        settled on (migration 0015), the days ahead included."""
        row = await self._one("history_live_days")
        return row["days"]  # type: ignore[index]

    async def purge_count(self, older_than: float | timedelta) -> int:
        """How many runs PurgeTerminalRuns with `older_than` would delete now (its dry run)."""
        row = await self._one("runs_purge_count", age=seconds(older_than))
        return row["eligible"]  # type: ignore[index]

