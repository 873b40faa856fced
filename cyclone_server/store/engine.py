"""The engine: Cyclone's state machine as Python calls, one transaction per transition.

The rules themselves live in the SQL functions (sql/functions); this module converts
arguments and results, checks input that the database should never see, and maps the
functions' errors to CycloneError. It is the only module of the server that talks to
Postgres.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import hashlib
import json
import logging
import re
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

import psycopg
from psycopg.rows import dict_row, namedtuple_row
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool

from . import definitions, schedule_spec
from .errors import SQLSTATE_ERRORS, AlreadyExists, CycloneError, InvalidArgument, NotFound
from .queries import Q
from .schedule_spec import ScheduleSettings
from .warm import WarmConnections

DEFAULT_MAX_PAYLOAD_BYTES = 1 << 20
# A failure message is stored up to this many bytes (UTF-8); a longer one is cut there and
# marked. Unlike payloads, a message is never a reason to refuse a result.
MAX_ERROR_MESSAGE_BYTES = 64 * 1024
# A failure's details (Failed.details: a traceback, a stack) are stored per attempt up to
# this many bytes (UTF-8), cut and marked the same way past it.
MAX_ERROR_DETAILS_BYTES = 16 * 1024
ENQUEUE_MANY_MAX = 1000  # jobs per EnqueueMany call
ANNOUNCE_WINDOW = 0.005  # seconds: an engine's NOTIFY cyclone_available waits this long for more new work
# seconds: and comes this long after the engine's previous one at the earliest, so that a
# stream of new work is announced once per gap (the other servers' dispatchers pace their
# claims under a stream anyway: Dispatcher._pace)
ANNOUNCE_GAP = 0.020
# The statements after which steps may have become claimable (when they returned rows).
# results_apply says so per result (Engine.apply_results).
MAY_MAKE_AVAILABLE = frozenset({
    "run_submit", "job_enqueue", "jobs_enqueue", "step_complete", "step_fail", "step_snooze",
    "leases_sweep", "leases_release", "attempts_timeout", "timers_fire", "waits_expire", "children_start",
    "children_settle", "child_runs_settle", "run_resume", "run_retry", "run_signal"})
# The queries that write the jobs of Enqueue and EnqueueMany: the new work a stream of
# calls brings, which the dispatcher paces its claims for (announce(jobs_only=True)).
JOBS_WRITTEN = frozenset({"job_enqueue", "jobs_enqueue"})
log = logging.getLogger("cyclone.engine")
TERMINAL_RUN_STATES = frozenset({"completed", "failed", "cancelled"})
RUN_STATES = ("running", "paused", "completed", "failed", "cancelled")
RUN_ACTIONS = frozenset({"cancel", "pause", "resume", "retry"})


@dataclass(frozen=True)
class Job:
    """One standalone job for `Engine.enqueue_many`, with `Engine.enqueue`'s arguments."""

    kind: str
    input: Any = None
    priority: int = 0
    idempotency_key: str | None = None
    deadline: datetime | None = None
    scheduled_at: datetime | None = None
    options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    # What identifies the request for the idempotency check; default: the fields above.
    request_fingerprint: Any = None
    # The submitter's W3C trace context ({"traceparent", "tracestate"}), kept with the run.
    trace_context: Mapping[str, str] | None = None


@dataclass(frozen=True)
class PreparedJob:
    """A Job checked by `Engine.prepare_job`: the parameters of cyclone_job_enqueue, its
    input's size in bytes (compact JSON), and its element of cyclone_jobs_enqueue's batch
    as JSON text (`item`: the input serialized once, for its size and for the batch)."""

    params: dict[str, Any]
    input_bytes: int
    item: str


@dataclass(frozen=True)
class Result:
    """One worker result for `Engine.apply_results`."""

    step_id: str
    generation: int
    outcome: str  # "completed" | "failed" | "snoozed"
    output: Any = None
    message: str = ""
    permanent: bool = False
    retry_delay: float | None = None  # seconds
    delay: float | None = None  # seconds, snooze
    details: str = ""  # Failed.details (a traceback); "" for none
    # The output's size (compact JSON) when the worker measured it over the limit and sent
    # the size instead of the output: the step is discarded (output_too_large).
    oversized_output_bytes: int | None = None
    # Set when the worker's answer was malformed (why, naming the field): this Result is the
    # failed attempt that replaces it, so that no lease outlives an answer nobody can apply.
    invalid: str | None = None

    def batch_item(self, step_id: str, max_output_bytes: int) -> str:
        """The element of cyclone_results_apply's batch, as JSON text, with `step_id` (this
        result's id in canonical form). An output over `max_output_bytes` is left out: only
        its size goes to the database, which discards the step. A completion's output is
        serialized once, and that text is both measured and sent (the id is a canonical UUID
        and the output text what `json.dumps` wrote: nothing in either can break out of the
        element)."""
        if self.outcome == "completed":
            if self.oversized_output_bytes is None:
                text = _compact(self.output)
                size = len(text.encode("utf-8", "surrogatepass"))
            else:
                text, size = "null", self.oversized_output_bytes
            head = f'{{"step_id":"{step_id}","generation":{int(self.generation)},"outcome":"completed","output_bytes":{size}'
            return head + "}" if size > max_output_bytes else f'{head},"output":{text}}}'
        d: dict[str, Any] = {"step_id": step_id, "generation": self.generation, "outcome": self.outcome}
        if self.outcome == "failed":
            d["message"] = storable_message(self.message)
            d["permanent"] = self.permanent
            if self.retry_delay is not None:
                d["retry_delay_ms"] = self.retry_delay * 1000
            if self.details:
                d["details"] = storable_message(self.details, MAX_ERROR_DETAILS_BYTES)
        elif self.outcome == "snoozed":
            d["delay_ms"] = (self.delay or 0) * 1000
        return _compact(d)


_CANONICAL_ID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def canonical_id(value: str, field: str) -> str:
    """`str(parse_id(value, field))`, without parsing an id already in that form (every id
    the server sends is, so the ids workers echo back are)."""
    if type(value) is str and _CANONICAL_ID.fullmatch(value):
        return value
    return str(parse_id(value, field))


def parse_id(value: str, field: str) -> uuid.UUID:
    """A run or step id from the wire; a malformed one is INVALID_ARGUMENT naming the field."""
    try:
        return uuid.UUID(str(value))
    except ValueError:
        raise InvalidArgument(f"{field}: {value!r} is not a valid id") from None


def _compact(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def check_payload(value: Any, field: str, limit: int = DEFAULT_MAX_PAYLOAD_BYTES) -> int:
    """The payload's size in bytes as compact JSON (the measure of every payload limit);
    InvalidArgument naming `field` when over `limit`."""
    return checked_payload_text(value, field, limit)[1]


def checked_payload_text(value: Any, field: str, limit: int = DEFAULT_MAX_PAYLOAD_BYTES) -> tuple[str, int]:
    """`check_payload`, also returning the compact JSON it measured. A string holding a
    lone surrogate is refused here (_utf8), rather than failing to encode for Postgres."""
    text = _compact(value)
    size = len(_utf8(text, field))
    if size > limit:
        raise InvalidArgument(f"{field}: payload is {size} bytes, over the limit of {limit} bytes")
    return text, size


def _utf8(text: str, field: str) -> bytes:
    """`text` in UTF-8; InvalidArgument naming `field` when it holds a lone surrogate
    (possible only from Python callers: protobuf strings are UTF-8)."""
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise InvalidArgument(f"{field}: contains a lone surrogate (U+{ord(text[e.start]):04X}), "
                              "which is not text") from None


def storable_message(text: str, limit: int = MAX_ERROR_MESSAGE_BYTES) -> str:
    """A failure message as Postgres can store it: U+0000 (which text and JSONB refuse)
    becomes U+FFFD, and past `limit` bytes of UTF-8 it is cut and marked (DECISIONS 3b:
    a result is never refused for its text)."""
    text = text.replace("\x00", "\ufffd")
    raw = text.encode("utf-8", "surrogatepass")
    if len(raw) <= limit:
        return text
    return raw[:limit].decode("utf-8", "ignore") + f"... [cut at {limit} of {len(raw)} bytes]"


def _node_and_json(kind: str, options: Mapping[str, Any]) -> tuple[dict[str, Any], str]:
    node = definitions.normalize_job(kind, options)
    return node, _compact(node)


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


def request_hash(*fields: Any) -> str:
    return hashlib.sha256(json.dumps(fields, sort_keys=True, default=str).encode()).hexdigest()


_STORED_SETTINGS = ("target", "spec", "start_at", "end_at", "jitter", "note", "overlap", "catchup_window")


def _stored_settings(row: Mapping[str, Any]) -> str:
    """A schedule's settings as stored (defaults filled in, the job's node normalized), from its
    row or from the parameters that write one, as canonical JSON: numbers as floats (25 and
    25.0 agree, as they do once stored; true stays apart from 1), times as UTC instants."""
    return json.dumps({k: _canonical(row[k].obj if isinstance(row[k], Jsonb) else row[k]) for k in _STORED_SETTINGS},
                      sort_keys=True)


def _canonical(value: Any) -> Any:
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, dict):
        return {k: _canonical(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_canonical(v) for v in value]
    if isinstance(value, datetime):
        return value.astimezone(timezone.utc).isoformat()
    if isinstance(value, timedelta):
        return value.total_seconds()
    return str(value)


def _translate(e: psycopg.Error) -> CycloneError | None:
    """The CycloneError for an error a SQL function raised on purpose (SQLSTATE CY...), else None."""
    cls = SQLSTATE_ERRORS.get(e.sqlstate or "")
    return cls(e.diag.message_primary or str(e)) if cls is not None else None


@contextlib.contextmanager
def _translated() -> Iterator[None]:
    """Raise an error a SQL function raised on purpose as its CycloneError (_translate)."""
    try:
        yield
    except psycopg.Error as e:
        translated = _translate(e)
        if translated is None:
            raise
        raise translated from e


Issue = Callable[..., Awaitable[psycopg.AsyncCursor[dict[str, Any]]]]


def _issuer(conn: psycopg.AsyncConnection[Any]) -> Issue:
    """Sends a named query on `conn` and returns its cursor; in a pipeline the rows are
    waited for only when read."""
    async def issue(query: str, /, **params: Any) -> psycopg.AsyncCursor[dict[str, Any]]:
        return await conn.cursor().execute(Q[query], params)
    return issue


async def _run_with_steps(issue: Issue, rid: uuid.UUID) -> dict[str, Any] | None:
    """The run `rid` with its steps (None: no such run); both queries are sent before either
    is read, so in a pipeline they share one round trip."""
    run, steps = await issue("run_get", run_id=rid), await issue("runs_steps", run_ids=[rid])
    row = await run.fetchone()
    if row is not None:
        row["steps"] = await steps.fetchall()
    return row


def _jobs_payload(jobs: Sequence[PreparedJob]) -> str:
    """cyclone_jobs_enqueue's p_jobs for prepared jobs, as JSON text."""
    return "[" + ",".join(j.item for j in jobs) + "]"


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


def _id_range(prefix: str) -> dict[str, uuid.UUID | None]:
    """The ids starting with `prefix` (hex digits, dashes ignored) as a range: uuids order as their bytes."""
    digits = prefix.replace("-", "").lower()
    if not digits:
        return {"id_min": None, "id_max": None}
    if len(digits) > 32 or not all(c in "0123456789abcdef" for c in digits):
        raise InvalidArgument(f"id_prefix: {prefix!r} is not the beginning of a run id (hex digits and dashes)")
    return {"id_min": uuid.UUID(digits.ljust(32, "0")), "id_max": uuid.UUID(digits.ljust(32, "f"))}


def _seconds(td: float | timedelta | None) -> timedelta | None:
    if td is None:
        return None
    return td if isinstance(td, timedelta) else timedelta(seconds=td)


class Engine:
    """Every transition of the lifecycle document, over a connection pool.

    Example::

        engine = await Engine.open("postgresql://localhost/cyclone")
        run_id, _ = await engine.submit_run("etl", input={"day": "2026-12-01"})
        leases = await engine.claim("worker-1", ["extract"], limit=10)
    """

    def __init__(self, pool: AsyncConnectionPool, *, max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
                 announces: bool = False) -> None:
        self.pool = pool
        # Statements and transactions run on connections kept between them (warm.py).
        self.warm = WarmConnections(pool)
        self.max_payload_bytes = max_payload_bytes
        # Called after every transition that may have made steps claimable (e.g. the
        # server's dispatcher wake-up).
        self.available_listeners: list[Callable[[], None]] = []
        # Called before those, unless only new jobs were written: the server's dispatcher
        # then claims without waiting out a pace (Dispatcher.unpace).
        self.prompt_listeners: list[Callable[[], None]] = []
        # With `announces`, the pool's sessions don't NOTIFY cyclone_available in their
        # transactions (see cyclone__notify_available); this engine sends one NOTIFY per
        # ANNOUNCE_WINDOW instead, at most one per ANNOUNCE_GAP, on the side, for the other
        # servers.
        self.announces = announces
        # The payload of this engine's own announcements (never empty, as the SQL functions'
        # payload is). The server's dispatcher skips them (WorkerHub.start): announce() has
        # woken it already, and each echo would cost it a pass that finds nothing new.
        self.announce_token = uuid.uuid4().hex
        # Called when a schedule was made, changed or resumed (the server's scheduler wake-up).
        self.schedule_listeners: list[Callable[[], None]] = []
        self._announcing: asyncio.Task[None] | None = None
        self._announced = float("-inf")  # the loop's time of the last announcement sent
        self._announcements: set[asyncio.Task[None]] = set()  # waiting or sending

    @classmethod
    async def open(cls, url: str, *, min_size: int = 2, max_size: int = 10, announces: bool = False,
                   **kw: Any) -> Engine:
        """A pool of `min_size`..`max_size` connections. `announces=True` is for a server:
        new work is announced by `announce()`, coalesced, rather than by each transaction."""
        async def configure(conn: psycopg.AsyncConnection[Any]) -> None:
            if announces:
                await conn.execute("SET cyclone.announce = 'server'")

        pool = AsyncConnectionPool(url, min_size=min_size, max_size=max_size, open=False, configure=configure,
                                   kwargs={"autocommit": True, "row_factory": dict_row})
        await pool.open(wait=True, timeout=30)
        return cls(pool, announces=announces, **kw)

    def announce(self, *, jobs_only: bool = False) -> None:
        """Steps may have become claimable: tell the listeners now, other servers soon.
        `jobs_only`: the new work is only jobs that Enqueue or EnqueueMany wrote."""
        if not jobs_only:
            for listener in self.prompt_listeners:
                listener()
        for listener in self.available_listeners:
            listener()
        if self.announces and self._announcing is None:
            task = self._announcing = asyncio.get_running_loop().create_task(self._notify_others())
            self._announcements.add(task)  # until sent: close() waits for it
            task.add_done_callback(self._announcements.discard)

    async def _notify_others(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            # What else becomes claimable meanwhile rides along.
            await asyncio.sleep(max(ANNOUNCE_WINDOW, self._announced + ANNOUNCE_GAP - loop.time()))
        finally:
            # From here on, new work needs a new announcement (the next window's task).
            self._announcing = None
        self._announced = loop.time()
        try:
            async with self.warm.connection() as conn:
                await conn.execute("SELECT pg_notify('cyclone_available', %s)", (self.announce_token,))
        except Exception as e:  # the other servers' dispatch timers still find the work
            log.warning("announcing new work failed: %s", e)

    async def close(self) -> None:
        if self._announcing is not None:  # still waiting: nothing to send it for any more
            self._announcing.cancel()
        await asyncio.gather(*self._announcements, return_exceptions=True)  # one being sent ends first
        await self.warm.close()
        await self.pool.close()

    async def _all(self, query: str, /, **params: Any) -> list[dict[str, Any]]:
        return await self._fetch(query, params, dict_row)

    async def _fetch(self, query: str, params: Mapping[str, Any], row_factory: Any) -> list[Any]:
        """The rows of the named query, made by `row_factory`; a database error that means
        bad input becomes its CycloneError; new work is announced after the statements that
        may have made some."""
        with _translated():
            rows = await self.warm.fetch(Q[query], params, row_factory)
        if rows and query in MAY_MAKE_AVAILABLE:
            self.announce(jobs_only=query in JOBS_WRITTEN)
        return rows

    async def _one(self, query: str, /, **params: Any) -> dict[str, Any] | None:
        rows = await self._all(query, **params)
        return rows[0] if rows else None

    # -- workflows -------------------------------------------------------------------

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
            _utf8(job.idempotency_key, "idempotency_key")
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
        rows = await self._all("jobs_enqueue", jobs=_jobs_payload(jobs))
        if len(rows) != len(jobs):  # one row per job, or the transaction failed
            raise RuntimeError(f"cyclone_jobs_enqueue returned {len(rows)} rows for {len(jobs)} jobs")
        return [(r["run_id"], r["step_id"], r["created"]) for r in rows]  # ids as text already

    async def enqueue_claim(self, jobs: Sequence[PreparedJob], owner: str, kinds: Sequence[str], limit: int,
                            lease_ttl: float) -> tuple[list[tuple[str, str, bool]], list[Any]]:
        """`enqueue_prepared`, then `claim_leases` in the same transaction (one commit): the
        jobs' (run_id, step_id, created), and the leases claimed. New work is announced only
        if something this transaction made is left claimable: when every job it created was
        claimed here too, no dispatcher has anything to look for."""
        rows = await self._fetch("jobs_enqueue_claim", {"jobs": _jobs_payload(jobs), "owner": owner, "kinds": list(kinds),
                                                        "limit": limit, "lease_ttl": _seconds(lease_ttl)}, namedtuple_row)
        made = sorted((r for r in rows if r.idx is not None), key=lambda r: r.idx)
        if len(made) != len(jobs):
            raise RuntimeError(f"cyclone_jobs_enqueue_claim returned {len(made)} jobs for {len(jobs)}")
        leases = [r for r in rows if r.idx is None]
        claimed = {r.step_id for r in leases}
        if any(r.created and r.step_id not in claimed for r in made):
            self.announce(jobs_only=True)
        return [(r.run_id, r.step_id, r.created) for r in made], leases

    # -- leases --------------------------------------------------------------------------

    async def claim(self, owner: str, kinds: Sequence[str], limit: int, lease_ttl: float) -> list[dict[str, Any]]:
        """available -> running for up to `limit` steps of `kinds`, priority then FIFO."""
        if limit <= 0 or not kinds:
            return []
        return await self._all("steps_claim", owner=owner, kinds=list(kinds), limit=limit,
                               lease_ttl=_seconds(lease_ttl))

    async def claim_leases(self, owner: str, kinds: Sequence[str], limit: int, lease_ttl: float) -> list[Any]:
        """`claim` for the dispatcher: named tuples with the columns as a Lease carries them
        (`steps_claim_leases` in queries.sql: ids as text, times in microseconds since the
        epoch, input and parents as JSON text, parents None when the node has none)."""
        if limit <= 0 or not kinds:
            return []
        return await self._fetch("steps_claim_leases", {"owner": owner, "kinds": list(kinds), "limit": limit,
                                                        "lease_ttl": _seconds(lease_ttl)}, namedtuple_row)

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
                rows = await self._all("results_apply", results=batch, max_output_bytes=self.max_payload_bytes)
                if any(row["available"] for row in rows):  # not after a batch of jobs' completions
                    self.announce()
                busy = []
                for row in rows:
                    i = pending[row["idx"] - 1]
                    if row["status"] == "busy":
                        busy.append(i)
                    else:
                        out[i] = row["status"]
                    if row["ended_child_run"] is not None:
                        ended_children.append(row["ended_child_run"])
                pending = sorted(busy)
        if ended_children:
            await self.settle_parents(ended_children)
        return [(r.step_id, r.generation, status) for r, status in zip(results, out)]  # type: ignore[misc]

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
                              retry_delay=_seconds(retry_delay),
                              details=storable_message(details, MAX_ERROR_DETAILS_BYTES) if details else None)
        return row["status"]  # type: ignore[index]

    async def snooze(self, step_id: str, generation: int, delay: float) -> str:
        row = await self._one("step_snooze", step_id=parse_id(step_id, "step_id"), generation=generation,
                              delay=_seconds(delay))
        return row["status"]  # type: ignore[index]

    async def renew(self, owner: str, leases: Sequence[tuple[str, int]], lease_ttl: float) -> list[tuple[str, int]]:
        """Extend `owner`'s leases in one statement; returns the (step_id, generation) lost."""
        if not leases:
            return []
        rows = await self._all("leases_renew", owner=owner, step_ids=[parse_id(s, "step_id") for s, _ in leases],
                               generations=[g for _, g in leases], lease_ttl=_seconds(lease_ttl))
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

    # -- run actions ---------------------------------------------------------------------

    # An action that may end its run (cancel, resume, retry, signal) also settles the run's
    # parent node, when it has one, before it returns: DECISIONS 3b, an action's effects are
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
        with _translated():
            async with self.warm.connection() as conn, conn.transaction():
                issue = _issuer(conn)
                applied = (await (await issue(query, **params)).fetchone())["applied"]  # type: ignore[index]
                if read:  # both reads in one round trip (pipelined), the run's lock held
                    async with conn.pipeline():
                        run = await _run_with_steps(issue, rid)
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
        row = await self._one("runs_purge", age=_seconds(older_than), limit=limit, sweep=sweep)
        return row["deleted"]  # type: ignore[index]

    async def purge_count(self, older_than: float | timedelta) -> int:
        """How many runs PurgeTerminalRuns with `older_than` would delete now (its dry run)."""
        row = await self._one("runs_purge_count", age=_seconds(older_than))
        return row["eligible"]  # type: ignore[index]

    # -- reads ---------------------------------------------------------------------------
    # A run read with its steps comes from one snapshot (DECISIONS 3b, "Reads are
    # snapshots"): under READ COMMITTED each statement sees its own moment, and a transition
    # committed between the run's statement and its steps' would show a run whose state
    # contradicts its steps. One REPEATABLE READ transaction keeps the rows as typed as any
    # other read (one statement aggregating the steps as JSON would turn their timestamps,
    # ids and intervals into strings); the steps of a whole ListRuns page are one statement.

    @contextlib.asynccontextmanager
    async def _snapshot(self) -> AsyncIterator[Issue]:
        """Named queries that all see the database at one moment. Pipelined: a query is sent
        when issued, and its cursor waits for its rows only when read, so the queries that
        need no earlier answer share one round trip."""
        async with self.warm.connection() as conn, conn.pipeline(), conn.transaction():
            await conn.execute(Q["read_snapshot"])
            yield _issuer(conn)

    async def get_run(self, run_id: str, *, steps: bool = True) -> dict[str, Any]:
        rid = parse_id(run_id, "run_id")
        if not steps:
            row = await self._one("run_get", run_id=rid)
        else:
            async with self._snapshot() as issue:
                row = await _run_with_steps(issue, rid)
        if row is None:
            raise NotFound(f"run {run_id} not found")
        return row

    async def run_states(self, run_ids: Sequence[str]) -> dict[str, str]:
        rows = await self._all("runs_states", run_ids=[uuid.UUID(r) for r in run_ids])
        return {str(r["id"]): r["state"] for r in rows}

    async def list_runs(self, *, states: Sequence[str] = (), workflow: str | None = None,
                        created_after: datetime | None = None, created_before: datetime | None = None,
                        limit: int = 100, after: tuple[datetime, str] | None = None,
                        steps: bool = False, schedule: str | None = None,
                        schedule_fire_at: datetime | None = None, id_prefix: str = "") -> list[dict[str, Any]]:
        """Newest first. `id_prefix`: only runs whose id starts with these hex digits (dashes ignored)."""
        for s in states:
            if s not in RUN_STATES:
                raise InvalidArgument(f"states: {s!r} is not a run state")
        params = {"states": list(states), "workflow": workflow or None, "created_after": created_after,
                  "created_before": created_before, "after_created": after[0] if after else None,
                  "after_id": uuid.UUID(after[1]) if after else None, "limit": limit,
                  "schedule": schedule or None, "schedule_fire_at": schedule_fire_at, **_id_range(id_prefix)}
        if not steps:
            return await self._all("runs_list", **params)
        async with self._snapshot() as issue:
            rows = await (await issue("runs_list", **params)).fetchall()
            by_run: dict[uuid.UUID, list[dict[str, Any]]] = {row["id"]: [] for row in rows}
            if by_run:
                for step in await (await issue("runs_steps", run_ids=list(by_run))).fetchall():
                    by_run[step["run_id"]].append(step)
        for row in rows:
            row["steps"] = by_run[row["id"]]
        return rows

    async def stats(self) -> list[dict[str, Any]]:
        return await self._all("kinds_stats")

    # -- schedules -----------------------------------------------------------------------
    # Fire times come from schedule_spec (a cron library); the fire itself is one SQL
    # function call (70_schedules.sql): run and next fire time in one transaction.

    async def create_schedule(self, name: str, settings: ScheduleSettings, *, paused: bool = False,
                              fingerprint: Any = None) -> tuple[dict[str, Any], bool]:
        """Store a schedule; returns (schedule, created). The same name with the same
        settings is a no-op: the same request (`fingerprint`, default the settings), or
        settings that are stored the same (a default given or left out, as GetSchedule
        returns them). Other settings are ALREADY_EXISTS (UpdateSchedule changes a schedule)."""
        definitions.validate_name(name, "name")
        params = await self._schedule_params(name, settings, fingerprint)
        row = await self._one("schedule_insert", **params, paused=paused)
        if row is None:
            row = await self.get_schedule(name, recent_runs=0)
            if row["settings_hash"] != params["settings_hash"] and _stored_settings(row) != _stored_settings(params):
                raise AlreadyExists(f'name: schedule "{name}" already exists with other settings '
                                    "(UpdateSchedule changes it)")
            return row, False
        await self._schedules_changed()
        return {**row, "recent_runs": []}, True

    async def update_schedule(self, name: str, settings: ScheduleSettings, *,
                              fingerprint: Any = None) -> dict[str, Any]:
        """Replace a schedule's settings; its next fire time is computed anew from now."""
        definitions.validate_name(name, "name")
        row = await self._one("schedule_update", **await self._schedule_params(name, settings, fingerprint))
        if row is None:
            raise NotFound(f'schedule "{name}" not found')
        await self._schedules_changed()
        return await self.get_schedule(name)

    async def _schedule_params(self, name: str, settings: ScheduleSettings, fingerprint: Any) -> dict[str, Any]:
        s = settings.check()
        where = f"settings.{s.target_field}"
        check_payload(s.input, f"{where}.input", self.max_payload_bytes)
        target: dict[str, Any] = {"input": s.input, "priority": s.priority, "deadline_in": s.deadline_in}
        if s.workflow is not None:
            definitions.validate_name(s.workflow, f"{where}.workflow")
            if s.version < 0:
                raise InvalidArgument(f"{where}.version: must be >= 0, got {s.version}")
            if await self._one("workflow_get", name=s.workflow, version=s.version) is None:
                raise InvalidArgument(f'{where}.workflow: workflow "{s.workflow}" '
                                      + (f"has no version {s.version}" if s.version else "is not registered"))
            target.update(workflow=s.workflow, version=s.version)
        else:
            try:
                target["job"] = definitions.normalize_job(s.kind or "", s.options or {})
            except InvalidArgument as e:
                # As Enqueue names a job's option: 'nodes[0] (id "x"): max_attempts: ...' -> 'max_attempts: ...'.
                message = e.message.split(": ", 1)[-1] if e.message.startswith("nodes[0]") else e.message
                raise InvalidArgument(f"{where}.{message}") from None
        now = datetime.now(timezone.utc)
        first = s.spec.next_after(now)
        fp = fingerprint if fingerprint is not None else dataclasses.asdict(s)
        return {"name": name, "target": Jsonb(target), "spec": Jsonb(s.spec.to_json()),
                "settings_hash": request_hash("schedule", fp), "start_at": s.spec.start_at, "end_at": s.spec.end_at,
                "jitter": timedelta(seconds=s.jitter), "note": s.note, "overlap": s.overlap,
                "catchup_window": timedelta(seconds=s.catchup_window), "next_fire_at": first,
                "next_due_at": schedule_spec.due_at(first, s.jitter)}

    async def _schedules_changed(self) -> None:
        """Wake the schedulers: this server's at once, the others' by NOTIFY cyclone_schedules."""
        for listener in self.schedule_listeners:
            listener()
        await self._all("schedules_changed")

    async def get_schedule(self, name: str, *, recent_runs: int = 10) -> dict[str, Any]:
        """A schedule with its `recent_runs` (newest first: id, state, schedule_fire_at, ...)."""
        row = await self._one("schedule_get", name=name)
        if row is None:
            raise NotFound(f'schedule "{name}" not found')
        row["recent_runs"] = (await self._all("schedule_recent_runs", name=name, limit=recent_runs)
                              if recent_runs else [])
        return row

    async def list_schedules(self, prefix: str = "", *, limit: int = 100,
                             after: str | None = None) -> list[dict[str, Any]]:
        """Schedules by name, those after `after` (the last name of the previous page)."""
        return await self._all("schedules_list", prefix=prefix.replace("%", r"\%").replace("_", r"\_"),
                               after=after, limit=limit)

    async def pause_schedule(self, name: str) -> bool:
        """Stop firing (Trigger still works); False when already paused."""
        applied = await self._one("schedule_pause", name=name) is not None
        if not applied:
            await self.get_schedule(name, recent_runs=0)  # NOT_FOUND
        return applied

    async def resume_schedule(self, name: str) -> bool:
        """Fire again, from the next fire time after now; False when not paused."""
        while True:
            row = await self.get_schedule(name, recent_runs=0)
            if not row["paused"]:
                return False
            spec = schedule_spec.Spec.from_row(row)
            first = spec.next_after(datetime.now(timezone.utc))
            due = schedule_spec.due_at(first, row["jitter"].total_seconds())
            # Guarded by the spec read: an update in between makes this try again.
            if await self._one("schedule_resume", name=name, spec=Jsonb(row["spec"]), next_fire_at=first,
                               next_due_at=due) is not None:
                await self._schedules_changed()
                return True

    async def delete_schedule(self, name: str) -> None:
        """Delete a schedule; its runs stay (with the schedule's name)."""
        if await self._one("schedule_delete", name=name) is None:
            raise NotFound(f'schedule "{name}" not found')

    async def trigger_schedule(self, name: str, overlap: str | None = None) -> dict[str, Any]:
        """Start the target now (fire time: now) under `overlap` or the schedule's policy;
        returns {outcome: started | skipped | buffered, run_id, fire_at}."""
        if overlap is not None and overlap not in schedule_spec.OVERLAP_POLICIES:
            raise InvalidArgument(f"overlap: {overlap!r} is not an overlap policy")
        row = await self._one("schedule_trigger", name=name, policy=overlap)
        assert row is not None
        if row["run_id"] is not None:
            self.announce()
        return row

    async def schedules_due(self, limit: int = 100) -> list[dict[str, Any]]:
        return await self._all("schedules_due", limit=limit)

    async def schedules_next_due(self) -> tuple[float | None, bool]:
        """(seconds until the next due time or None, whether a buffered fire time waits)."""
        row = await self._one("schedules_next_due")
        assert row is not None
        return row["seconds"], row["buffered"]

    async def fire_schedule(self, name: str, expected: datetime, plan: schedule_spec.FirePlan) -> dict[str, Any]:
        """cyclone_schedule_fire: {outcome: started | skipped | buffered | missed | lost, run_id}."""
        row = await self._one("schedule_fire", name=name, expected=expected, missed=plan.missed,
                              fire_at=plan.fire_at, next_fire_at=plan.next_fire_at, next_due_at=plan.next_due_at)
        assert row is not None
        if row["run_id"] is not None:
            self.announce()
        return row

    async def release_schedules(self, limit: int = 100) -> list[dict[str, Any]]:
        """Start the buffered fire times whose previous run ended: [{name, fire_at, run_id}]."""
        rows = await self._all("schedules_release", limit=limit)
        if rows:
            self.announce()
        return rows
    async def runs_ended(self, since: datetime | None, lag: timedelta) -> tuple[list[dict[str, Any]], datetime]:
        """How many runs ended in (since, now - lag], by workflow and state; and now - lag,
        the next call's `since`. With `since` None: no rows, only the bound."""
        rows = await self._all("runs_ended", since=since, lag=lag)
        return [r for r in rows if r["n"]], rows[0]["until"]

    # -- workers registry ------------------------------------------------------------------

    async def workers_beat(self, server_id: str, workers: Sequence[Mapping[str, Any]], grace: float, *,
                           takeover: bool = False) -> int:
        """Upsert the rows of the worker streams this server holds, live for `grace` seconds
        more, and delete expired rows of any server (cyclone_workers_beat); `takeover` for a
        new stream's Hello. Returns how many rows were written."""
        row = await self._one("workers_beat", server_id=server_id, workers=Jsonb([dict(w) for w in workers]),
                              grace=_seconds(grace), takeover=takeover)
        return row["written"]  # type: ignore[index]

    async def list_workers(self, kind: str | None = None) -> list[dict[str, Any]]:
        """The live workers of every server of this database, by worker id."""
        return await self._all("workers_list", kind=kind or None)


__all__ = ["Engine", "Result", "CycloneError", "TERMINAL_RUN_STATES", "parse_id", "check_payload"]
