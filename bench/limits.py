"""Flow control (limits, docs/flow-control.md): what it costs kinds without limits, how fast limited
work drains, how fairly keys share the slots, and how exactly a rate holds.

    nice -n 19 .venv/bin/python bench/limits.py                        # every part, 5 rounds, Postgres 15
    nice -n 19 .venv/bin/python bench/limits.py --parts a --head       # a, also against HEAD's code
    nice -n 19 .venv/bin/python bench/limits.py --quick                # small sizes, 1 round: a look
    nice -n 19 .venv/bin/python bench/limits.py --embedded             # the embedded Postgres 18

Each drain gets a fresh database (bench_limits_*, dropped after it) of one Postgres, migrated,
loaded with `cyclone_jobs_enqueue` (what Enqueue runs; 5,000 jobs a call), limits set with
`cyclone_limit_set` (what Limits.SetLimit runs, from limit_spec.normalize_limit), then VACUUM
ANALYZE and a CHECKPOINT; then fresh `cyclone-server`s and SDK worker processes (--workers x
--slots, no-op handlers) that connect at a go. A round runs every case of a part in turn, so a
change in the machine's load hits all; a figure is the median of --rounds rounds with min and
max, a ratio the ratio of the medians with the min and max of the rounds' own ratios.

a. Kinds without limits pay nothing: --a-jobs no-op jobs drained, the clock from the go to the
   last `finished_at`. `unused`: no limit exists. `other`: a limit of max_running --a-cap on
   the kind `held`, --a-held jobs of it, a third worker process (2 x --a-cap slots, in both
   cases) holding --a-cap of them running (its handler sleeps), the rest waiting: limited
   steps in the table, held at their cap. `head` (--head): `unused` on the code of --head-commit (a `git archive` of it:
   the claim before limits), its server and migrations, the same SDK workers. `full`: as
   `other`, the third worker with --a-cap slots, all held (its server never claims for it).
   Target: other/unused within 5%.
b. --b-jobs jobs over --b-keys keys (input.tenant), drained with a limit of max_running 1 per
   key, against the same jobs without a limit. Target: limited >= 0.7 x unlimited.
c. Fair dispatch. A limit of kind `noop` keyed by input.tenant, no cap. Tenant A has
   --c-backlog jobs; --c-delay s after the go, tenants B.. (--c-tenants of them) enqueue
   --c-jobs each (one EnqueueMany per tenant, its request built first, all sent at once on one
   channel). Handlers log their start (time.time(), the workers' clocks); a wait is enqueue
   (the client's clock as the tenant's call is sent; A's: its load) to handler start. B..'s time to finish (enqueue to the
   last start) is set against (tenants + 1) x --c-jobs / the rate A alone drained at before
   (slots shared equally); also from the calls' answers, and as the starts made until then
   against the (tenants + 1) x --c-jobs an equal share needs. Target: <= 2x. Weighted:
   weights 3 and 1, --c-weighted jobs each queued; the share of starts among the first
   --c-weighted starts (both keys still have work). Target: 3:1 within 10%.
d. A rate: --d-rate starts per second (period 1 s, one key) on a backlog of 1.5 x as many, for
   --seconds s; with 1 server and with --d-servers servers on one database (3 worker
   processes in both, spread over the servers). Counted from the first handler start: starts
   in --seconds s (target within 2% of rate x seconds) and the most in any 1 s window (target
   <= rate) on three clocks: the handlers' starts (workers), the claims' `started_at` (the
   claim transaction's start) and `cyclone_limit_starts.at` (what the limit counts: the push of
   the lease to its worker, or the claim until then; read every 0.25 s while its rows live), the bursts the limit admits and their spacing, the delay from
   claim to handler start, and when the handlers' busiest second was claimed.

--dsn (default the machine's Postgres 15; its settings as they are) needs a role that may create
databases and run CHECKPOINT. --embedded: a durable embedded Postgres 18 (_pg.start_postgres).
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import json
import math
import multiprocessing as mp
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path

import psycopg
from psycopg.conninfo import make_conninfo
from psycopg.types.json import Jsonb

from cyclone_server import definitions
from cyclone_server.limit_spec import normalize_limit
from cyclone_server.store.migrate import migrate

# bench/ is sys.path[0] when run as a script
from _common import SERVER, note, start_server
from _drain import print_rows
from _pg import MARK, settle, start_postgres
from _report import MIN_ROUNDS, fmt_spread, postgres_line

DEFAULT_DSN = "postgresql://postgres@127.0.0.1:5432/postgres"
KIND, HELD = "noop", "held"
CALL = 5_000  # jobs per cyclone_jobs_enqueue call
POLL = 0.1


class External:
    """A Postgres server given by URL, with EmbeddedPostgres's `url(dbname)`."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn

    def url(self, dbname: str = "postgres") -> str:
        return make_conninfo(self.dsn, dbname=dbname)


# -- databases, loads and limits -----------------------------------------------------------------

def fresh_db(pg, name: str, head: Path | None = None) -> str:
    """A new migrated database (by --head-commit's migrations with `head`)."""
    with psycopg.connect(pg.url(), autocommit=True) as c:
        c.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        c.execute(f"CREATE DATABASE {name}")
    url = pg.url(name)
    if head:
        subprocess.run([sys.executable, "-c", f"import sys; sys.path.insert(0, {str(head)!r}); "
                        f"from cyclone_server.store.migrate import migrate; migrate({url!r})"], check=True)
    else:
        migrate(url)
    return url


def drop_db(pg, name: str) -> None:
    with psycopg.connect(pg.url(), autocommit=True) as c:
        c.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def enqueue(url: str, kind: str, jobs: int, tenant_sql: str = "'-'") -> None:
    """`jobs` committed jobs of `kind`, input {i, tenant: tenant_sql (of i), at: epoch of the load}."""
    node = json.dumps(definitions.normalize_job(kind, {}))
    with psycopg.connect(url, autocommit=True) as c:
        for start in range(0, jobs, CALL):
            c.execute(f"SELECT {MARK} count(*) FROM cyclone_jobs_enqueue((SELECT jsonb_agg(jsonb_build_object("
                      "'node', %s::jsonb, 'input', jsonb_build_object('i', i, 'tenant', " + tenant_sql +
                      ", 'at', extract(epoch FROM clock_timestamp()))) ORDER BY i) "
                      "FROM generate_series(%s::int, %s::int) i))", (node, start, min(start + CALL, jobs) - 1))


def set_limit(url: str, **fields) -> None:
    with psycopg.connect(url, autocommit=True) as c:
        c.execute(f"SELECT {MARK} cyclone_limit_set(%s::jsonb)", (Jsonb(normalize_limit(fields)),))


def wait_for(url: str, sql: str, deadline: float, interval: float = POLL) -> None:
    with psycopg.connect(url, autocommit=True) as c:
        while not c.execute(sql).fetchone()[0]:
            if time.monotonic() > deadline:
                raise SystemExit(f"timed out waiting for: {sql}")
            time.sleep(interval)


# -- worker processes -------------------------------------------------------------------------------

def worker_main(address: str, slots: int, kinds: dict[str, str], log: str | None, ready, go) -> None:
    """An SDK worker: per kind a no-op handler ("noop"; it logs "<start> <step id> <tenant>" with
    `log`) or one that sleeps an hour ("sleep": a step held running)."""
    from cyclone_worker import Context, Worker
    worker = Worker(address, slots=slots)
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644) if log else None

    async def noop(ctx: Context) -> None:
        if fd is not None:
            t = time.time()
            tenant = ctx.input.get("tenant", "-") if isinstance(ctx.input, dict) else "-"
            os.write(fd, f"{t:.6f} {ctx.step_id} {tenant}\n".encode())

    async def sleep(ctx: Context) -> None:
        await asyncio.sleep(3600)

    for kind, mode in kinds.items():
        worker.handler(kind)(sleep if mode == "sleep" else noop)
    ready.put(os.getpid())
    go.wait()
    worker.run_sync()


def read_log(paths: list[Path]) -> list[tuple[float, str, str]]:
    """(start, step id, tenant) of every handler start, by start."""
    out = []
    for p in paths:
        if p.exists():
            for line in p.read_text().splitlines():
                t, sid, tenant = line.split(" ", 2)
                out.append((float(t), sid, tenant))
    return sorted(out)


class Stage:
    """`servers` cyclone-servers on one database, and worker processes added with `workers`, each
    connecting at its group's go."""

    def __init__(self, url: str, workdir: Path, servers: int = 1, program: tuple[str, ...] = SERVER) -> None:
        self.url, self.workdir = url, workdir
        self.servers, self.addresses = [], []
        self.procs: list[mp.Process] = []
        self.ctx = mp.get_context("spawn")
        try:
            for _ in range(servers):
                proc, address = start_server(url, workdir, program=program)
                self.servers.append(proc)
                self.addresses.append(address)
        except BaseException:
            self.stop()
            raise

    def workers(self, n: int, slots: int, kinds: dict[str, str], log: bool = False) -> tuple[object, list[Path]]:
        """n worker processes, spread over the servers, started and waiting; returns their go
        (an Event to set) and their log files."""
        ready, go = self.ctx.Queue(), self.ctx.Event()
        logs = []
        for i in range(n):
            path = self.workdir / f"starts-{time.monotonic_ns()}-{i}.log" if log else None
            if path:
                logs.append(path)
            p = self.ctx.Process(target=worker_main, daemon=True,
                                 args=(self.addresses[(len(self.procs)) % len(self.addresses)], slots, kinds,
                                       str(path) if path else None, ready, go))
            p.start()
            self.procs.append(p)
        for _ in range(n):
            ready.get(timeout=120)
        return go, logs

    def stop(self) -> None:
        for p in self.procs:
            if p.is_alive():
                p.terminate()
        for p in self.procs:
            p.join(15)
            if p.is_alive():
                p.kill()
                p.join(5)
        for s in self.servers:
            s.terminate()
        for s in self.servers:
            try:
                s.wait(30)
            except subprocess.TimeoutExpired:
                s.kill()
                s.wait(5)


def drain_seconds(stage: Stage, go, jobs: int, timeout: float) -> float:
    """From the go to the last no-op job's finish (its transaction's start; one machine, one clock)."""
    t0 = time.time()
    go.set()
    wait_for(stage.url, f"SELECT {MARK} NOT EXISTS (SELECT 1 FROM cyclone_steps WHERE kind = '{KIND}' "
                        "AND state IN ('available', 'running'))", time.monotonic() + timeout)
    with psycopg.connect(stage.url, autocommit=True) as c:
        done, end = c.execute(f"SELECT {MARK} count(*), extract(epoch FROM max(finished_at)) FROM cyclone_steps "
                              f"WHERE kind = '{KIND}' AND state = 'completed'").fetchone()
    if done != jobs:
        raise SystemExit(f"{done} of {jobs} jobs completed")
    return float(end) - t0


# -- a: kinds without limits ---------------------------------------------------------------------

def part_a(pg, case: str, args, workdir: Path, head: Path | None) -> float:
    db = f"bench_limits_a_{case}"
    url = fresh_db(pg, db, head if case == "head" else None)
    program = SERVER if case != "head" else (
        "-c", f"import sys, runpy; sys.path.insert(0, {str(head)!r}); "
              "runpy.run_module('cyclone_server', run_name='__main__', alter_sys=True)")
    try:
        enqueue(url, KIND, args.a_jobs)
        if case in ("other", "full"):
            set_limit(url, name="held", max_running=args.a_cap, kinds=[HELD])
            enqueue(url, HELD, args.a_held)
        settle(url)
        stage = Stage(url, workdir, program=program)
        try:
            hold, _ = stage.workers(1, args.a_cap * (1 if case == "full" else 2), {HELD: "sleep"})
            hold.set()
            if case in ("other", "full"):  # the held kind at its cap before the drain starts
                wait_for(url, f"SELECT {MARK} count(*) = {args.a_cap} FROM cyclone_steps "
                              f"WHERE kind = '{HELD}' AND state = 'running'", time.monotonic() + 60)
            go, _ = stage.workers(args.workers, args.slots, {KIND: "noop"})
            seconds = drain_seconds(stage, go, args.a_jobs, args.timeout)
            if case in ("other", "full"):
                with psycopg.connect(url) as c:
                    running = c.execute(f"SELECT {MARK} count(*) FROM cyclone_steps WHERE kind = '{HELD}' "
                                        "AND state = 'running'").fetchone()[0]
                if running != args.a_cap:
                    raise SystemExit(f"a/{case}: {running} held steps running, not {args.a_cap}")
        finally:
            stage.stop()
        return args.a_jobs / seconds
    finally:
        drop_db(pg, db)


# -- b: one slot per key ---------------------------------------------------------------------------

def part_b(pg, case: str, args, workdir: Path) -> float:
    db = f"bench_limits_b_{case}"
    url = fresh_db(pg, db)
    try:
        if case == "limited":
            set_limit(url, name="tenants", max_running=1, kinds=[KIND], key_path="input.tenant")
        enqueue(url, KIND, args.b_jobs, f"'t' || mod(i, {args.b_keys})")
        settle(url)
        stage = Stage(url, workdir)
        try:
            go, _ = stage.workers(args.workers, args.slots, {KIND: "noop"})
            return args.b_jobs / drain_seconds(stage, go, args.b_jobs, args.timeout)
        finally:
            stage.stop()
    finally:
        drop_db(pg, db)


# -- c: fair dispatch --------------------------------------------------------------------------------

async def enqueue_tenants(address: str, tenants: list[str], jobs: int) -> tuple[list[str], dict[str, float], list[float]]:
    """One EnqueueMany of `jobs` per tenant, all sent at once; the run ids, when each tenant's call
    was sent (time.time()) and how long each took. The requests are built first: building 1,000
    jobs' messages in this (niced) process on a busy machine took tens of milliseconds, time
    that no dispatcher can act on."""
    import grpc

    from cyclone_proto import runs_pb2, runs_pb2_grpc
    from cyclone_worker import Job
    reqs = {t: runs_pb2.EnqueueManyRequest(jobs=[Job(KIND, {"i": i, "tenant": t}).to_proto() for i in range(jobs)])
            for t in tenants}
    async with grpc.aio.insecure_channel(address) as channel:
        await channel.channel_ready()
        stub = runs_pb2_grpc.RunsStub(channel)

        async def one(tenant: str) -> tuple[list[str], float, float]:
            at = time.time()
            resp = await stub.EnqueueMany(reqs[tenant])
            return [j.run_id for j in resp.jobs], at, time.time() - at
        done = await asyncio.gather(*(one(t) for t in tenants))
    return ([r for ids, _, _ in done for r in ids], {t: at for t, (_, at, _) in zip(tenants, done)},
            [took for _, _, took in done])


def pct(values: list[float], q: float) -> float:
    v = sorted(values)
    return v[min(len(v) - 1, max(0, math.ceil(q * len(v)) - 1))]


def part_c(pg, args, workdir: Path) -> dict:
    db = "bench_limits_c"
    url = fresh_db(pg, db)
    others = [chr(ord("B") + i) for i in range(args.c_tenants)]
    try:
        set_limit(url, name="fair", kinds=[KIND], key_path="input.tenant")
        enqueue(url, KIND, args.c_backlog, "'A'")
        settle(url)
        stage = Stage(url, workdir)
        try:
            go, logs = stage.workers(args.workers, args.slots, {KIND: "noop"}, log=True)
            t_go = time.time()
            go.set()
            time.sleep(args.c_delay)
            runs, sent, took = asyncio.run(enqueue_tenants(stage.addresses[0], others, args.c_jobs))
            t_done = time.time()  # every EnqueueMany answered: committed
            t_enq = min(sent.values())
            ids = "{" + ",".join(runs) + "}"
            wait_for(url, f"SELECT {MARK} count(*) = {len(runs)} FROM cyclone_runs WHERE id = ANY ('{ids}'::uuid[]) "
                          "AND state = 'completed'", time.monotonic() + args.timeout)
        finally:
            stage.stop()
        starts = read_log(logs)
        with psycopg.connect(url) as c:
            enq = dict(c.execute(f"SELECT {MARK} s.id::text, (r.input ->> 'at')::float8 FROM cyclone_steps s "
                                 "JOIN cyclone_runs r ON r.id = s.run_id WHERE s.started_at IS NOT NULL").fetchall())
    finally:
        drop_db(pg, db)
    waits: dict[str, list[float]] = defaultdict(list)
    for t, sid, tenant in starts:  # A's jobs carry their load's time, the others' their call's
        waits[tenant].append(t - sent.get(tenant, enq.get(sid, 0.0)))
    first_a = min(t for t, _, tenant in starts if tenant == "A")
    a_before = sum(1 for t, _, tenant in starts if tenant == "A" and t < t_enq)
    rate = a_before / (t_enq - max(first_a, t_go))  # A alone, from its first start to the others' enqueue
    last = max(t for t, _, tenant in starts if tenant != "A")
    first = min(t for t, _, tenant in starts if tenant != "A")
    in_window = sum(1 for t, _, _ in starts if t_enq <= t <= last)
    fair = (len(others) + 1) * args.c_jobs / rate
    return {"waits": {k: (statistics.median(v), pct(v, 0.99), len(v)) for k, v in waits.items()},
            "finish": last - t_enq, "fair": fair, "ratio": (last - t_enq) / fair, "rate": rate,
            "calls": t_done - t_enq, "call_min": min(took), "call_median": statistics.median(took),
            "first": first - t_enq, "ratio_commit": (last - t_done) / fair,
            "window_starts": in_window, "window_fair": (len(others) + 1) * args.c_jobs}


def part_c_weighted(pg, args, workdir: Path) -> dict:
    db = "bench_limits_cw"
    url = fresh_db(pg, db)
    try:
        set_limit(url, name="weighted", kinds=[KIND], key_path="input.tenant", weights={"heavy": 3, "light": 1})
        enqueue(url, KIND, args.c_weighted * 2, "CASE WHEN mod(i, 2) = 0 THEN 'heavy' ELSE 'light' END")
        settle(url)
        stage = Stage(url, workdir)
        try:
            go, logs = stage.workers(args.workers, args.slots, {KIND: "noop"}, log=True)
            go.set()
            wait_for(url, f"SELECT {MARK} count(*) >= {args.c_weighted} FROM cyclone_steps WHERE kind = '{KIND}' "
                          "AND state = 'completed'", time.monotonic() + args.timeout, interval=0.5)
        finally:
            stage.stop()
        starts = read_log(logs)[:args.c_weighted]
    finally:
        drop_db(pg, db)
    n = Counter(tenant for _, _, tenant in starts)
    return {"heavy": n["heavy"], "light": n["light"], "ratio": n["heavy"] / max(1, n["light"])}


# -- d: a rate --------------------------------------------------------------------------------------

def most_in_window(times: list[float], window: float = 1.0) -> int:
    """The most of `times` (sorted) in any half-open window [t, t + window)."""
    return max((bisect.bisect_left(times, t + window) - i for i, t in enumerate(times)), default=0)


def part_d(pg, servers: int, args, workdir: Path) -> dict:
    db = f"bench_limits_d{servers}"
    url = fresh_db(pg, db)
    try:
        set_limit(url, name="rate", rate=args.d_rate, period=1.0, kinds=[KIND])
        enqueue(url, KIND, args.d_backlog)
        settle(url)
        stage = Stage(url, workdir, servers=servers)
        # step id -> at: every row of cyclone_limit_starts while it lives (a start's `at` moves
        # to its lease's push: the last one read counts)
        ats: dict[str, float] = {}
        try:
            go, logs = stage.workers(3, args.slots, {KIND: "noop"}, log=True)
            go.set()
            end = time.monotonic() + args.seconds + 2 + 10  # the first start comes within seconds of the go
            with psycopg.connect(url, autocommit=True) as c:
                first = None
                while time.monotonic() < end:
                    for step, at in c.execute(f"SELECT {MARK} step_id::text, extract(epoch FROM at)::float8 "
                                              "FROM cyclone_limit_starts").fetchall():
                        ats[step] = at
                    if first is None and ats:
                        first = time.monotonic()
                        end = first + args.seconds + 2
                    time.sleep(0.25)
        finally:
            stage.stop()
        starts = read_log(logs)
        with psycopg.connect(url) as c:
            claimed = dict(c.execute(f"SELECT {MARK} id::text, extract(epoch FROM started_at)::float8 "
                                     f"FROM cyclone_steps WHERE started_at IS NOT NULL").fetchall())
    finally:
        drop_db(pg, db)
    handler = [t for t, _, _ in starts]
    claim = sorted(claimed.values())
    at = sorted(ats.values())
    out = {}
    for name, times in (("handler", handler), ("claim", claim), ("at", at)):
        t0 = times[0]
        span = [t for t in times if t < t0 + args.seconds]
        out[name] = {"total": len(span), "most": most_in_window(span)}
    lag = [t - claimed[sid] for t, sid, _ in starts if sid in claimed]
    # The handlers' busiest 1 s: when were its steps claimed?
    i = max(range(len(handler)), key=lambda k: bisect.bisect_left(handler, handler[k] + 1.0) - k)
    busiest = starts[i:bisect.bisect_left(handler, handler[i] + 1.0)]
    worst = sorted(claimed[sid] for _, sid, _ in busiest if sid in claimed)
    out["worst"] = (len(worst), worst[-1] - worst[0], most_in_window(worst))
    # Starts come in bursts (a window's worth as soon as the window allows): their spacing.
    heads = [t for k, t in enumerate(at) if k == 0 or t - at[k - 1] > 0.5]
    out["spacing"] = statistics.median(b - a for a, b in zip(heads, heads[1:])) if len(heads) > 1 else float("nan")
    out["bursts"] = len(heads)
    out["lag"] = (statistics.median(lag), pct(lag, 0.99), max(lag))
    return out


# -- the report -----------------------------------------------------------------------------------

def ratio_row(name: str, num: list[float], den: list[float]) -> list[str]:
    rounds = [a / b for a, b in zip(num, den)]
    med = statistics.median(num) / statistics.median(den)
    return [name, *[f"{x:.3f}" for x in rounds], f"{med:.3f} (rounds: min {min(rounds):.3f}, max {max(rounds):.3f})"]


def spread_row(label: str, values: list[float], fmt: str = "{:.2f}") -> list[str]:
    return [label, *[fmt.format(v) for v in values], fmt_spread(values, fmt)]


def report(res: dict, args, settings: str) -> None:
    n = args.rounds
    head = ["", *[f"round {i + 1}" for i in range(n)], "median (min, max)"]
    print(f"\nlimits: {n} round(s), {args.workers} workers x {args.slots} slots, "
          f"date={time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} cores={os.cpu_count()} "
          f"load(1,5,15)={tuple(round(x, 2) for x in os.getloadavg())}")
    print(settings)
    if "a" in res:
        a = res["a"]
        print(f"\na. {args.a_jobs:,} no-op jobs, jobs/s; other: limit max_running {args.a_cap} on kind {HELD}, "
              f"{args.a_held:,} of it waiting")
        rows = [[f"{k}, jobs/s", *[f"{x:,.0f}" for x in v], fmt_spread(v)] for k, v in a.items()]
        rows.append(ratio_row("other / unused (target 0.95 to 1.05)", a["other"], a["unused"]))
        rows.append(ratio_row("full / unused", a["full"], a["unused"]))
        if "head" in a:
            rows.append(ratio_row("unused / head (the claim before limits)", a["unused"], a["head"]))
            rows.append(ratio_row("other / head", a["other"], a["head"]))
        print_rows(head, rows)
    if "b" in res:
        b = res["b"]
        print(f"\nb. {args.b_jobs:,} jobs over {args.b_keys:,} keys, jobs/s")
        rows = [[f"{k}, jobs/s", *[f"{x:,.0f}" for x in v], fmt_spread(v)] for k, v in b.items()]
        rows.append(ratio_row("limited / unlimited (target >= 0.7)", b["limited"], b["unlimited"]))
        print_rows(head, rows)
    if "c" in res:
        cs = res["c"]
        print(f"\nc. fair dispatch: A has {args.c_backlog:,} queued; {args.c_tenants} tenants enqueue "
              f"{args.c_jobs} each {args.c_delay:.0f} s after the go; waits in s (workers' clocks)")
        tenants = sorted(cs[0]["waits"])
        rows = [[f"{t}: p50 / p99 wait, s",
                 *[("{:.2f} / {:.2f}".format(*r["waits"][t][:2]) if t in r["waits"] else "-") for r in cs], ""]
                for t in tenants]
        rows.append(["A: starts before the end", *[f"{r['waits']['A'][2]:,}" for r in cs], ""])
        for label, key, fmt in (
                ("A alone, starts/s", "rate", "{:,.0f}"), ("B..: enqueue to last start, s", "finish", "{:.2f}"),
                ("slots shared equally, s", "fair", "{:.2f}"), ("ratio (target <= 2)", "ratio", "{:.2f}"),
                ("B..: enqueue calls took, s", "calls", "{:.2f}"),
                ("B..: one call took, fastest, s", "call_min", "{:.3f}"),
                ("B..: one call took, median, s", "call_median", "{:.3f}"),
                ("B..: enqueue to first start, s", "first", "{:.2f}"),
                ("ratio from the calls' answers", "ratio_commit", "{:.2f}"),
                (f"starts in that time (equal share: {cs[0]['window_fair']})", "window_starts", "{:,.0f}")):
            rows.append(spread_row(label, [r[key] for r in cs], fmt))
        rows.append(spread_row("those starts / an equal share's", [r["window_starts"] / r["window_fair"] for r in cs]))
        cw = res["cw"]
        rows.append([f"weights 3:1, first {args.c_weighted:,} starts: heavy / light",
                     *[f"{r['heavy']:,} / {r['light']:,}" for r in cw], ""])
        rows.append(spread_row("share heavy:light (target 2.7 to 3.3)", [r["ratio"] for r in cw]))
        print_rows(head, rows)
    if "d" in res:
        print(f"\nd. rate {args.d_rate}/s for {args.seconds:.0f} s (target: {args.d_rate * args.seconds:,.0f} "
              f"+- 2%, at most {args.d_rate} in any 1 s); 3 worker processes")
        rows = []
        for servers, rs in res["d"].items():
            for clock, what in (("handler", "handler starts (workers)"), ("claim", "claims' started_at"),
                                ("at", "cyclone_limit_starts.at (pushes)")):
                totals = [r[clock]["total"] for r in rs]
                most = [r[clock]["most"] for r in rs]
                rows.append([f"{servers} server(s), {what}: total / most in 1 s",
                             *[f"{t:,} / {m}" for t, m in zip(totals, most)],
                             f"{fmt_spread(totals)}; most max {max(most)}"])
            rows.append([f"{servers} server(s), claim to handler: p50 / p99 / max ms",
                         *["{:.1f} / {:.1f} / {:.1f}".format(*(x * 1e3 for x in r["lag"])) for r in rs], ""])
            rows.append([f"{servers} server(s), bursts on the at clock: count / median spacing s",
                         *[f"{r['bursts']} / {r['spacing']:.3f}" for r in rs], ""])
            rows.append([f"{servers} server(s), handlers' busiest 1 s: starts, their claims' span s, most claimed in 1 s",
                         *["{} / {:.3f} / {}".format(*r["worst"]) for r in rs], ""])
        print_rows(head, rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--parts", default="a,b,c,d", help="comma-separated: a, b, c, d")
    ap.add_argument("--rounds", type=int, default=MIN_ROUNDS)
    ap.add_argument("--quick", action="store_true", help="small sizes and 1 round (a look, not a figure)")
    ap.add_argument("--dsn", default=DEFAULT_DSN, help=f"a Postgres server's URL (default {DEFAULT_DSN})")
    ap.add_argument("--embedded", action="store_true", help="an embedded Postgres 18 instead of --dsn")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--slots", type=int, default=64)
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--a-jobs", type=int, default=20_000)
    ap.add_argument("--a-held", type=int, default=10_000)
    ap.add_argument("--a-cap", type=int, default=8)
    ap.add_argument("--head", action="store_true", help="part a also on the code of --head-commit")
    ap.add_argument("--head-commit", default="HEAD")
    ap.add_argument("--b-jobs", type=int, default=50_000)
    ap.add_argument("--b-keys", type=int, default=1_000)
    ap.add_argument("--c-backlog", type=int, default=100_000)
    ap.add_argument("--c-tenants", type=int, default=10)
    ap.add_argument("--c-jobs", type=int, default=100)
    ap.add_argument("--c-delay", type=float, default=3.0)
    ap.add_argument("--c-weighted", type=int, default=20_000)
    ap.add_argument("--d-rate", type=int, default=100)
    ap.add_argument("--d-servers", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=60.0)
    args = ap.parse_args()
    if args.quick:
        args.rounds = 1
        args.a_jobs, args.a_held, args.b_jobs, args.c_backlog = 5_000, 2_000, 10_000, 30_000
        args.c_weighted, args.seconds = 4_000, min(args.seconds, 10.0)
    args.d_backlog = int(args.d_rate * (args.seconds + 5) * 1.5)
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    if args.rounds < MIN_ROUNDS:
        note(f"{args.rounds} round(s): fewer than {MIN_ROUNDS} is a look, not a figure")

    with tempfile.TemporaryDirectory(prefix="cyclone-limits-") as tmp:
        workdir = Path(tmp)
        head = None
        if args.head and "a" in parts:
            head = workdir / "head"
            head.mkdir()
            archive = subprocess.run(["git", "archive", args.head_commit, "cyclone_server", "cyclone_proto"],
                                     cwd=Path(__file__).parent.parent, capture_output=True, check=True).stdout
            subprocess.run(["tar", "-x", "-C", str(head)], input=archive, check=True)
        pg = start_postgres(workdir / "pg") if args.embedded else External(args.dsn)
        try:
            settings = postgres_line(pg.url())
            note(settings)
            res: dict = {}
            for r in range(args.rounds):
                if "a" in parts:
                    for case in ("unused", "other", "full", *(("head",) if head else ())):
                        rate = part_a(pg, case, args, workdir, head)
                        res.setdefault("a", {}).setdefault(case, []).append(rate)
                        note(f"round {r + 1}: a/{case}: {rate:,.0f} jobs/s")
                if "b" in parts:
                    for case in ("unlimited", "limited"):
                        rate = part_b(pg, case, args, workdir)
                        res.setdefault("b", {}).setdefault(case, []).append(rate)
                        note(f"round {r + 1}: b/{case}: {rate:,.0f} jobs/s")
                if "c" in parts:
                    res.setdefault("c", []).append(part_c(pg, args, workdir))
                    res.setdefault("cw", []).append(part_c_weighted(pg, args, workdir))
                    note(f"round {r + 1}: c: B.. finished in {res['c'][-1]['ratio']:.2f} x the equal share; "
                         f"weighted {res['cw'][-1]['ratio']:.2f}")
                if "d" in parts:
                    for servers in (1, args.d_servers):
                        d = part_d(pg, servers, args, workdir)
                        res.setdefault("d", {}).setdefault(servers, []).append(d)
                        note(f"round {r + 1}: d/{servers} server(s): {d['handler']} (handlers), {d['at']} (at)")
            report(res, args, settings)
        finally:
            if args.embedded:
                pg.stop()


if __name__ == "__main__":
    main()
