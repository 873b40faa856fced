"""Steps: claims and leases, results, renewals and hand-backs, and the sweeps that time steps out."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from psycopg.rows import namedtuple_row, tuple_row
from psycopg.types.json import Jsonb

from cyclone_server.records import MAX_ERROR_DETAILS_BYTES, PreparedJob, Result, canonical_id, parse_id, storable_message

from .core import Core, jobs_payload, seconds


class StepStore(Core):
    """The transitions of a step's lease: claimed, answered, renewed, released or swept."""

    async def enqueue_claim(self, jobs: Sequence[PreparedJob], owner: str, kinds: Sequence[str], limit: int,
                            lease_ttl: float) -> tuple[list[tuple[str, str, bool]], list[Any]]:
        """`enqueue_prepared`, then `claim_leases` in the same transaction (one commit): the
        jobs' (run_id, step_id, created), and the leases claimed. New work is announced only
        if something this transaction made is left claimable: when every job it created was
        claimed here too, no dispatcher has anything to look for."""
        rows = await self._fetch("jobs_enqueue_claim", {"jobs": jobs_payload(jobs), "owner": owner, "kinds": list(kinds),
                                                        "limit": limit, "lease_ttl": seconds(lease_ttl)}, namedtuple_row)
        made = sorted((r for r in rows if r.idx is not None), key=lambda r: r.idx)
        if len(made) != len(jobs):
            raise RuntimeError(f"cyclone_jobs_enqueue_claim_rated returned {len(made)} jobs for {len(jobs)}")
        leases = [r for r in rows if r.idx is None]
        claimed = {r.step_id for r in leases}
        if any(r.created and r.step_id not in claimed for r in made):
            self.announce(jobs_only=True)
        return [(r.run_id, r.step_id, r.created) for r in made], leases

    async def claim(self, owner: str, kinds: Sequence[str], limit: int, lease_ttl: float) -> list[dict[str, Any]]:
        """available -> running for up to `limit` steps of `kinds`, priority then FIFO."""
        if limit <= 0 or not kinds:
            return []
        return await self._all("steps_claim", owner=owner, kinds=list(kinds), limit=limit,
                               lease_ttl=seconds(lease_ttl))

    async def claim_leases(self, owner: str, kinds: Sequence[str], limit: int, lease_ttl: float) -> list[Any]:
        """`claim` for the dispatcher: named tuples with the columns as a Lease carries them
        (`steps_claim_leases` in queries.sql: ids as text, times in microseconds since the
        epoch, input and parents as JSON text, parents None when the node has none)."""
        if limit <= 0 or not kinds:
            return []
        return await self._fetch("steps_claim_leases", {"owner": owner, "kinds": list(kinds), "limit": limit,
                                                        "lease_ttl": seconds(lease_ttl)}, namedtuple_row)

    async def limit_starts_pushed(self, step_ids: Sequence[str]) -> int:
        """The leases of these steps were written to their workers: their starts against a
        rate count from now (cyclone_limit_starts_pushed). Returns how many starts moved."""
        rows = await self._fetch("limit_starts_pushed", {"ids": list(step_ids)}, tuple_row)
        return rows[0][0]

    async def apply_results(self, results: Sequence[Result]) -> list[tuple[str, int, str]]:
        """Apply many results in one transaction; returns (step_id, generation, status) each.

        A result whose run another transaction holds is applied again, alone, so the batch
        never waits on two runs at once; a failed step's results are applied on their own
        (see below).
        Statuses are by position: two answers to one lease get one status each (the first
        applied, the later ones 'ended'). Once the batch committed, the parent nodes of the
        child runs it ended are settled (`settle_parents`) before this returns.
        """
        ids = [canonical_id(r.step_id, "step_id") for r in results]  # canonical: safe in JSON text
        out: list[str | None] = [None] * len(results)
        ended_children: list[uuid.UUID] = []
        # A failure can discard its step, and fail-fast then cancels the child runs below it,
        # locking them parent first. A transaction that also holds other runs of the batch
        # (one of them may be such a descendant) would take locks out of that order and could
        # deadlock with a cancel of that subtree: so each failed step's results go in a
        # transaction of their own, which holds its run alone; the rest go together.
        failing = dict.fromkeys(r.step_id for r in results if r.outcome == "failed")
        groups = [[i for i, r in enumerate(results) if r.step_id not in failing]]
        groups += [[i for i, r in enumerate(results) if r.step_id == s] for s in failing]
        for pending in groups:
            while pending:  # each call applies at least the results of the first run it locks
                batch = "[" + ",".join(results[i].batch_item(ids[i], self.max_payload_bytes) for i in pending) + "]"
                # Plain tuples (idx, status, ended_child_run, available), as results_apply
                # selects them: one per result, so no dict is made for each.
                rows = await self._fetch("results_apply", {"results": batch, "max_output_bytes": self.max_payload_bytes},
                                         tuple_row)
                if any(row[3] for row in rows):  # not after a batch of jobs' completions
                    self.announce()
                busy = []
                for idx, status, ended_child_run, _ in rows:
                    i = pending[idx - 1]
                    if status == "busy":
                        busy.append(i)
                    else:
                        out[i] = status
                    if ended_child_run is not None:
                        ended_children.append(ended_child_run)
                pending = sorted(busy)
        if ended_children:
            await self.settle_parents(ended_children)
        return [(r.step_id, r.generation, status) for r, status in zip(results, out)]  # type: ignore[misc]

    async def in_doubt_statuses(self, results: Sequence[Result]) -> list[str | None]:
        """For results whose commit was in doubt (the connection broke during it) and that,
        applied again, found their lease ended: the status each had if it did commit, that
        is if its step holds this lease's generation and this result's outcome; else None.

        A completion left its step completed with its output (or discarded as
        output_too_large when its output was over the limit); a failure appended its message
        as the last error and left the step available again (retried) or discarded; a snooze
        left it available (a reclaim of the same lease would too; the step is claimable again
        either way). The caller passes only the first answer to each lease."""
        rows = await self._all("steps_lease_outcome", step_ids=[parse_id(r.step_id, "step_id") for r in results])
        steps = {str(row["id"]): row for row in rows}
        return [_status_held(steps.get(canonical_id(r.step_id, "step_id")), r) for r in results]

    async def settle_parents(self, child_run_ids: Sequence[uuid.UUID | str]) -> int:
        """End the waiting parent nodes of these child runs if they ended (each in a new
        transaction after the one that ended the child run, as the document says), and so
        on up the tree; returns how many nodes moved. Runs with no waiting parent node cost
        one index probe. What a busy parent run keeps from this, the child scanner does."""
        ids = [uuid.UUID(str(i)) for i in child_run_ids]
        moved = 0
        while ids:
            rows = await self._all("child_runs_settle", run_ids=ids)
            moved += len(rows)
            ids = [r["ended_child_run"] for r in rows if r["ended_child_run"] is not None]
        return moved

    async def complete(self, step_id: str, generation: int, output: Any) -> str:
        row = await self._one("step_complete", step_id=parse_id(step_id, "step_id"), generation=generation,
                              output=Jsonb(output), max_output_bytes=self.max_payload_bytes)
        return row["status"]  # type: ignore[index]

    async def fail(self, step_id: str, generation: int, message: str, *, permanent: bool = False,
                   retry_delay: float | None = None, details: str = "") -> str:
        row = await self._one("step_fail", step_id=parse_id(step_id, "step_id"), generation=generation,
                              message=storable_message(message), permanent=permanent,
                              retry_delay=seconds(retry_delay),
                              details=storable_message(details, MAX_ERROR_DETAILS_BYTES) if details else None)
        return row["status"]  # type: ignore[index]

    async def snooze(self, step_id: str, generation: int, delay: float) -> str:
        row = await self._one("step_snooze", step_id=parse_id(step_id, "step_id"), generation=generation,
                              delay=seconds(delay))
        return row["status"]  # type: ignore[index]

    async def renew(self, owner: str, leases: Sequence[tuple[str, int]], lease_ttl: float) -> list[tuple[str, int]]:
        """Extend `owner`'s leases in one statement; returns the (step_id, generation) lost."""
        if not leases:
            return []
        rows = await self._all("leases_renew", owner=owner, step_ids=[parse_id(s, "step_id") for s, _ in leases],
                               generations=[g for _, g in leases], lease_ttl=seconds(lease_ttl))
        return [(str(r["step_id"]), r["lease_generation"]) for r in rows]

    async def release(self, owner: str, leases: Sequence[tuple[str, int]]) -> list[tuple[str, str]]:
        """Reclaim now the leases of a worker that went silent; returns (step_id, outcome) of
        those reclaimed or discarded (reclaim_limit). The others were answered meanwhile,
        or their run was busy: the recovery sweep takes those at expiry."""
        if not leases:
            return []
        rows = await self._all("leases_release", owner=owner, step_ids=[parse_id(s, "step_id") for s, _ in leases],
                               generations=[g for _, g in leases])
        return [(str(r["step_id"]), r["outcome"]) for r in rows]

    async def next_due(self, kinds: Sequence[str]) -> float | None:
        """Seconds until the next available step of `kinds` becomes claimable (a backoff, a
        snooze, a scheduled job); 0.0 when one is claimable now (a claim that came up short
        did not get it: another transaction held its lock); None when there is none."""
        if not kinds:
            return None
        row = await self._one("steps_next_due", kinds=list(kinds))
        return None if row is None or row["seconds"] is None else max(0.0, row["seconds"])

    async def sweep(self, limit: int = 500) -> dict[str, int]:
        """One pass of the recovery sweep and the wait scanners, each its own transaction."""
        counts: dict[str, int] = {}
        for name in ("leases_sweep", "attempts_timeout", "deadlines_expire", "waits_expire",
                     "timers_fire", "children_start", "children_settle"):
            counts[name] = len(await self._all(name, limit=limit))
        return counts

    async def settle_children(self, limit: int = 500) -> int:
        """Only the child scanners: start retried child nodes, end the nodes whose child runs
        ended; returns how many nodes moved."""
        started = len(await self._all("children_start", limit=limit))
        return started + len(await self._all("children_settle", limit=limit))


def _status_held(step: Mapping[str, Any] | None, r: Result) -> str | None:
    """The status `r` had if its step holds what `r` did (StepStore.in_doubt_statuses), else None."""
    if step is None or step["lease_generation"] != r.generation or step["state"] == "running":
        return None
    state, last = step["state"], step["last_error"] or {}
    if r.outcome == "completed":
        if state == "completed" and r.oversized_output_bytes is None and step["output"] == r.output:
            return "applied"
        if state == "discarded" and step["reason"] == "output_too_large":
            return "output_too_large"
        return None
    if r.outcome == "failed":
        if last.get("message") != storable_message(r.message):
            return None
        if state in ("available", "paused") and last.get("error_kind") == "error":
            return "retried"
        return "discarded" if state == "discarded" else None
    return "snoozed" if state in ("available", "paused") else None
