"""Chaos test: thousands of steps through real processes that are killed on purpose.

    .venv/bin/python bench/chaos.py [--steps 2000] [--workers 4] [--slots 8] [--duration 60] [--timeout 600]
                                    [--failover] [--limits N [--tenants 4]] [--pg-bin DIR]

On this machine, over loopback only: an embedded Postgres with durable commits, two
`cyclone-server` processes on one database, and SDK worker processes (half connected to
each server). Standalone jobs and 5-node DAG runs (a -> b, c, d -> e) are submitted at a
steady pace during the first 60% of --duration, with idempotency keys (a call that fails is
sent again, to the other server). Meanwhile:

- a random worker is SIGKILLed every 0.3-1.5 s and a new one started in its place;
- at 35% of --duration one server is SIGKILLed, and started again on its port 2 s later;
- at 65%, Postgres stops in immediate mode (a crash) and starts again 2 s later.

With --failover the database is a primary and a synchronous streaming standby instead
(tests/acceptance/pg_replica.py: two embedded-Postgres servers on loopback ports, the
servers' URL names both with target_session_attrs=read-write), and at 50% (while jobs are
still submitted) the primary crashes (immediate mode) and the standby is promoted 2 s
later, never to fail back; no Postgres restart. The report then also gives how long after
the promotion the first step completed.

With --pg-bin DIR (/usr/lib/postgresql/15/bin, say: the oldest major supported) the
database is one durable server of those binaries instead of the embedded Postgres 18
(tests/acceptance/pg_replica.py's LonePostgres, on a loopback port), crashed and started
again as above.

Each handler appends (step id, lease generation, attempt) to its process's log file before
it does anything (one unbuffered O_APPEND write, so a SIGKILL loses no line), sleeps a
little (sometimes long enough to be killed), fails its first attempt for about 10% of the
steps, and returns {"gen": lease generation, "attempt": attempt}. When the chaos is over
and every run is terminal (or --timeout passed), it prints:

- steps lost: runs not completed, and steps not completed (target 0);
- outputs not from the final lease: a completed step whose output's gen / attempt differ
  from its row's lease_generation / attempt, or that no logged execution produced (target 0);
- executions per step (a histogram: more than 1 is a re-execution after a kill, as
  at-least-once delivery allows), and reclaims per step.

With --limits N, flow control is under the chaos too: every run input carries a tenant (one of
--tenants), and a limit (set through the Limits service before the load) caps the steps of the
kind at N running per tenant (key_path input.tenant), jobs and DAG steps alike. Each handler
marks itself running in a per-tenant directory shared by all worker processes (a file named
by its pid and lease, made before its work and removed after it), then counts that tenant's
marks whose process is alive (a SIGKILLed worker's marks are left behind; its handlers are
not running) and logs the count. The report adds the most running at once per tenant that
the workers saw, which must never exceed N.

The exit status is 0 only when nothing was lost or wrong (and, with --limits, no tenant
was seen above its limit).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psycopg

from cyclone_server.store.embedded import EmbeddedPostgres, start_embedded
from cyclone_server.store.migrate import migrate
from cyclone_worker import Client, Context, CycloneClientError, Job, Reconnect, Worker, Workflow

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "acceptance"))
from pg_replica import LonePostgres, ReplicaPair, pg_run  # noqa: E402  (--failover's pair; --pg-bin's server)

KIND = "chaos"
DAG_STEPS = 5
DAG = (Workflow("chaos_dag").task("a", kind=KIND, backoff_initial=0.1, max_reclaims=20)
       .task("b", kind=KIND, deps=["a"], backoff_initial=0.1, max_reclaims=20)
       .task("c", kind=KIND, deps=["a"], backoff_initial=0.1, max_reclaims=20)
       .task("d", kind=KIND, deps=["a"], backoff_initial=0.1, max_reclaims=20)
       .task("e", kind=KIND, deps=["b", "c", "d"], backoff_initial=0.1, max_reclaims=20))
JOB_OPTIONS = {"backoff_initial": 0.1, "max_reclaims": 20}  # a step may be hit by many kills
JOB_BATCH = 20
SERVER_FLAGS = ["--lease-ttl", "3", "--sweep-interval", "0.5", "--grace", "1", "--log-level", "WARNING"]
TERMINAL = ("completed", "failed", "cancelled")


def note(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# -- the worker process ------------------------------------------------------------------

def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False


def running_mark(log_dir: Path, fd: int, ctx: Context) -> Path:
    """Mark this handler running under its tenant, and log how many of the tenant's handlers
    (in every worker process still alive) are running now, itself included."""
    tenant_dir = log_dir / "running" / str(ctx.input["tenant"])
    tenant_dir.mkdir(parents=True, exist_ok=True)
    mark = tenant_dir / f"{os.getpid()}-{ctx.step_id}-{ctx.lease_generation}"
    mark.touch()
    pids = [int(m.name.split("-", 1)[0]) for m in tenant_dir.iterdir()]
    os.write(fd, f"{ctx.input['tenant']} {sum(1 for p in pids if p == os.getpid() or alive(p))}\n".encode())
    return mark


def worker_main(address: str, log_dir: Path, slots: int, limits: bool = False) -> None:
    fd = os.open(log_dir / f"exec-{os.getpid()}.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    seen = os.open(log_dir / f"running-{os.getpid()}.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644) \
        if limits else None
    worker = Worker(address, slots=slots, reconnect=Reconnect(initial=0.1, maximum=1.0))

    @worker.handler(KIND)
    async def handle(ctx: Context) -> dict:
        os.write(fd, f"{ctx.step_id} {ctx.lease_generation} {ctx.attempt}\n".encode())
        mark = running_mark(log_dir, seen, ctx) if seen is not None else None
        try:
            return await work(ctx)
        finally:
            if mark is not None:
                mark.unlink()

    async def work(ctx: Context) -> dict:
        # Mostly short; one in 20 runs long enough to be running when a kill comes.
        await asyncio.sleep(random.uniform(0.5, 2.0) if random.random() < 0.05 else random.uniform(0, 0.05))
        if ctx.attempt == 1 and int(ctx.step_id[-2:], 16) % 10 == 0:
            raise RuntimeError("flaky first attempt")  # retryable: the step runs again
        return {"gen": ctx.lease_generation, "attempt": ctx.attempt}

    worker.run_sync()


# -- processes -----------------------------------------------------------------------------

class Cluster:
    """Postgres, the servers and the workers, started, killed and restarted on demand."""

    def __init__(self, workdir: Path, pg: EmbeddedPostgres | ReplicaPair, url: str, workers: int, slots: int,
                 limits: bool = False) -> None:
        self.workdir, self.pg, self.url, self.slots, self.limits = workdir, pg, url, slots, limits
        self.crashed_wall = self.promoted_wall = self.promote_s = 0.0  # of the failover (time.time())
        self.log_dir = workdir / "exec"
        self.log_dir.mkdir()
        self.servers: list[subprocess.Popen | None] = [None, None]
        self.addresses: list[str] = ["", ""]
        self.workers: list[subprocess.Popen] = []
        self.worker_count = workers
        self.kills = collections.Counter()

    async def start_server(self, i: int, listen: str = "127.0.0.1:0") -> None:
        ready = self.workdir / f"ready-{i}.json"
        ready.unlink(missing_ok=True)
        log = open(self.workdir / f"server-{i}.log", "ab")
        self.servers[i] = subprocess.Popen(
            [sys.executable, "-m", "cyclone_server", "--database-url", self.url, "--listen", listen,
             "--ready-file", str(ready), *SERVER_FLAGS], stdout=log, stderr=log)
        deadline = time.monotonic() + 60
        while not ready.exists():
            if self.servers[i].poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"cyclone-server {i} did not start (see {log.name})")
            await asyncio.sleep(0.05)
        self.addresses[i] = json.loads(ready.read_text())["address"]

    def start_worker(self, slot: int) -> subprocess.Popen:
        address = self.addresses[slot % 2]  # half the workers on each server
        log = open(self.workdir / "workers.log", "ab")
        return subprocess.Popen([sys.executable, __file__, "--worker", address, "--log-dir", str(self.log_dir),
                                 "--slots", str(self.slots), *(["--limits", "1"] if self.limits else [])],
                                stdout=log, stderr=log)

    def start_workers(self) -> None:
        self.workers = [self.start_worker(i) for i in range(self.worker_count)]

    def kill_worker(self, rng: random.Random) -> None:
        i = rng.randrange(len(self.workers))
        self.workers[i].kill()
        self.workers[i].wait()
        self.kills["worker"] += 1
        self.workers[i] = self.start_worker(i)

    async def kill_server(self, i: int, down: float) -> None:
        proc = self.servers[i]
        assert proc is not None
        proc.kill()
        proc.wait()
        self.kills["server"] += 1
        note(f"server {i} killed; restarting it in {down:.0f} s on {self.addresses[i]}")
        await asyncio.sleep(down)
        await self.start_server(i, self.addresses[i])

    async def crash_postgres(self, down: float) -> None:
        """pg_ctl stop -m immediate (no shutdown checkpoint: recovery replays the WAL), then
        start it again with the options the wheel started it with."""
        if isinstance(self.pg, LonePostgres):
            await asyncio.to_thread(self.pg.crash_primary)
            self.kills["postgres"] += 1
            note(f"postgres stopped (immediate); starting it again in {down:.0f} s")
            await asyncio.sleep(down)
            await asyncio.to_thread(self.pg.start_again)
            note("postgres started")
            return
        assert isinstance(self.pg, EmbeddedPostgres)
        server = self.pg._server  # the wheel has no restart; its handle knows user and log
        socket_dir = server.get_postmaster_info().socket_dir
        # pg_run, not the wheel's pg_ctl: that forks this process, whose gRPC threads may crash the child.
        await asyncio.to_thread(pg_run, "pg_ctl", "-D", self.pg.data_dir, "-w", "-m", "immediate", "stop",
                                user=server.system_user, timeout=60)
        self.kills["postgres"] += 1
        note(f"postgres stopped (immediate); starting it again in {down:.0f} s")
        await asyncio.sleep(down)
        await asyncio.to_thread(pg_run, "pg_ctl", "-D", self.pg.data_dir, "-w", "-o", '-h ""', "-o",
                                f"-k {socket_dir}", "-l", server.log, "start", user=server.system_user, timeout=120)
        note("postgres started")

    async def failover(self, down: float) -> None:
        """The primary stops in immediate mode (a crash); `down` s later the standby is promoted."""
        assert isinstance(self.pg, ReplicaPair)
        await asyncio.to_thread(self.pg.crash_primary)
        self.crashed_wall = time.time()
        self.kills["failover"] += 1
        note(f"primary stopped (immediate); promoting the standby in {down:.0f} s")
        await asyncio.sleep(down)
        self.promote_s = await asyncio.to_thread(self.pg.promote)
        self.promoted_wall = time.time()
        note(f"standby promoted (in {self.promote_s:.2f} s)")

    def stop(self) -> None:
        for w in self.workers:
            w.kill()
        for s in self.servers:
            if s is not None and s.poll() is None:
                s.terminate()
        for s in self.servers:
            if s is not None:
                try:
                    s.wait(15)
                except subprocess.TimeoutExpired:
                    s.kill()
        for w in self.workers:
            w.wait()


# -- load and chaos --------------------------------------------------------------------------

async def call(clients: list[Client], what: str, fn, deadline: float):
    """fn(client), sent again (to the other server) until it succeeds or the deadline passes:
    idempotency keys make a repeat return what the first call made."""
    attempt = 0
    while True:
        try:
            return await fn(clients[attempt % 2])
        except CycloneClientError as e:
            attempt += 1
            if time.monotonic() > deadline:
                raise SystemExit(f"{what}: still failing at the deadline: {e}") from None
            await asyncio.sleep(min(0.1 * attempt, 1.0))


async def set_limit(address: str, max_running: int) -> None:
    """The limit of --limits, through the Limits service: `max_running` steps of KIND per tenant."""
    import grpc
    from google.protobuf.json_format import ParseDict

    from cyclone_proto import limits_pb2, limits_pb2_grpc
    limit = ParseDict({"name": "tenants", "max_running": max_running, "kinds": [KIND], "key_path": "input.tenant"},
                      limits_pb2.Limit())
    async with grpc.aio.insecure_channel(address) as channel:
        await limits_pb2_grpc.LimitsStub(channel).SetLimit(limits_pb2.SetLimitRequest(limit=limit), timeout=10)


async def submit(clients: list[Client], steps: int, window: float, deadline: float,
                 tenants: int = 0) -> tuple[int, int]:
    """About half the steps as jobs (EnqueueMany, JOB_BATCH a call), half as DAG runs, paced
    over `window` seconds; returns (jobs, dag runs). With `tenants`, each input names one."""
    def inp(i: int) -> dict:
        return {"i": i, "tenant": f"t{i % tenants}"} if tenants else {"i": i}

    await call(clients, "register", lambda c: c.register(DAG), deadline)
    jobs = steps // 2 // JOB_BATCH * JOB_BATCH
    dags = (steps - jobs) // DAG_STEPS
    units = [("jobs", i) for i in range(jobs // JOB_BATCH)] + [("dag", i) for i in range(dags)]
    random.Random(7).shuffle(units)
    t0 = time.monotonic()
    for n, (what, i) in enumerate(units):
        await asyncio.sleep(max(0.0, t0 + window * n / len(units) - time.monotonic()))
        if what == "jobs":
            batch = [Job(KIND, inp(i * JOB_BATCH + k), idempotency_key=f"job-{i * JOB_BATCH + k}", **JOB_OPTIONS)
                     for k in range(JOB_BATCH)]
            await call(clients, f"jobs batch {i}", lambda c, b=batch: c.enqueue_many(b), deadline)
        else:
            await call(clients, f"dag run {i}", lambda c, i=i: c.submit("chaos_dag", inp(i),
                                                                        idempotency_key=f"dag-{i}"), deadline)
    return jobs, dags


async def chaos(cluster: Cluster, duration: float, rng: random.Random, failover: bool) -> None:
    t0 = time.monotonic()
    # The failover comes while jobs are still submitted, so that there is work for the new primary.
    events = [(0.35 * duration, lambda: cluster.kill_server(1, 2.0)),
              (0.5 * duration, lambda: cluster.failover(2.0)) if failover else
              (0.65 * duration, lambda: cluster.crash_postgres(2.0))]
    while (now := time.monotonic() - t0) < duration:
        if events and now >= events[0][0]:
            await events.pop(0)[1]()
        cluster.kill_worker(rng)
        await asyncio.sleep(rng.uniform(0.3, 1.5))


async def query(url: str, sql: str) -> list[tuple]:
    """One query on a new connection, tried again while Postgres restarts."""
    for attempt in range(120):
        try:
            async with await psycopg.AsyncConnection.connect(url, autocommit=True, connect_timeout=5) as conn:
                return await (await conn.execute(sql)).fetchall()
        except psycopg.OperationalError:
            await asyncio.sleep(0.5)
    raise SystemExit("postgres unreachable")


async def wait_terminal(url: str, runs: int, deadline: float) -> bool:
    while time.monotonic() < deadline:
        [(total, active)] = await query(url, "SELECT count(*), count(*) FILTER (WHERE state NOT IN "
                                             "('completed', 'failed', 'cancelled')) FROM cyclone_runs")
        if total >= runs and active == 0:
            return True
        await asyncio.sleep(0.5)
    return False


# -- the verdict -------------------------------------------------------------------------------

def read_executions(log_dir: Path) -> list[tuple[str, int, int]]:
    out = []
    for f in log_dir.glob("exec-*.log"):
        for line in f.read_text().splitlines():
            parts = line.split()
            if len(parts) == 3:  # a process killed mid-write leaves at most a partial last line
                out.append((parts[0], int(parts[1]), int(parts[2])))
    return out


async def verdict(url: str, log_dir: Path, jobs: int, dags: int, cluster: Cluster) -> dict:
    runs = dict(await query(url, "SELECT state, count(*) FROM cyclone_runs GROUP BY state"))
    recovery = None
    if cluster.promoted_wall:
        # Whatever committed after the crash committed on the new primary, after the promotion.
        [(first,)] = await query(url, "SELECT extract(epoch FROM min(finished_at)) FROM cyclone_steps "
                                      f"WHERE finished_at > to_timestamp({cluster.crashed_wall})")
        recovery = None if first is None else float(first) - cluster.promoted_wall
    steps = await query(url, "SELECT id::text, state, lease_generation, attempt, reclaims, output FROM cyclone_steps")
    execs = read_executions(log_dir)
    by_step = collections.defaultdict(list)
    for sid, gen, attempt in execs:
        by_step[sid].append((gen, attempt))
    wrong = []
    for sid, state, gen, attempt, _, output in steps:
        if state != "completed":
            continue
        if not isinstance(output, dict) or (output.get("gen"), output.get("attempt")) != (gen, attempt):
            wrong.append((sid, "output not from the final lease", output, gen, attempt))
        elif (gen, attempt) not in by_step[sid]:
            wrong.append((sid, "no logged execution under the final lease", output, gen, attempt))
    beyond = sum(1 for sid, _, gen, *_ in steps for g, _ in by_step[sid] if g > gen)
    expected_runs = jobs + dags
    return {
        "runs": runs, "expected_runs": expected_runs, "expected_steps": jobs + dags * DAG_STEPS,
        "runs_not_completed": expected_runs - runs.get("completed", 0),
        "steps_not_completed": jobs + dags * DAG_STEPS - sum(1 for s in steps if s[1] == "completed"),
        "wrong": wrong, "beyond": beyond, "executions": len(execs),
        "exec_hist": collections.Counter(len(by_step[s[0]]) for s in steps),
        "reclaim_hist": collections.Counter(s[4] for s in steps),
        "retried": sum(1 for s in steps if s[3] > 1),
        # The same attempt executed again: its lease was lost (a kill, a reclaim) or fenced.
        "repeated": sum(len(e) - len({a for _, a in e}) for e in by_step.values()),
        "recovery": recovery,
    }


def read_running(log_dir: Path) -> dict[str, int]:
    """The most handlers of each tenant the workers saw running at once (--limits)."""
    most: dict[str, int] = collections.defaultdict(int)
    for f in log_dir.glob("running-*.log"):
        for line in f.read_text().splitlines():
            parts = line.split()
            if len(parts) == 2:
                most[parts[0]] = max(most[parts[0]], int(parts[1]))
    return dict(most)


def report(v: dict, args: argparse.Namespace, cluster: Cluster, jobs: int, dags: int, elapsed: float,
           finished: bool) -> bool:
    hist = lambda h: ", ".join(f"{k}: {h[k]}" for k in sorted(h))  # noqa: E731
    most = read_running(cluster.log_dir) if args.limits else {}
    ok = finished and v["runs_not_completed"] == 0 and v["steps_not_completed"] == 0 and not v["wrong"] \
        and v["beyond"] == 0 and all(n <= args.limits for n in most.values())
    rows = [
        ("submitted", f"{v['expected_steps']} steps: {jobs} jobs, {dags} DAG runs of {DAG_STEPS} steps"),
        ("chaos", f"{cluster.kills['worker']} worker SIGKILLs, {cluster.kills['server']} server SIGKILL, "
                  + (f"{cluster.kills['failover']} primary crash and standby promotion" if args.failover else
                     f"{cluster.kills['postgres']} Postgres immediate restart")),
        ("all runs terminal", f"{'yes' if finished else 'NO (timeout)'} after {elapsed:.0f} s"),
        ("runs by state", ", ".join(f"{k} {n}" for k, n in sorted(v["runs"].items()))),
        ("steps lost: runs not completed", str(v["runs_not_completed"])),
        ("steps lost: steps not completed", str(v["steps_not_completed"])),
        ("outputs not from the final lease", str(len(v["wrong"]))),
        ("executions under a later lease", str(v["beyond"])),
        ("executions logged", f"{v['executions']}: {v['retried']} steps failed a first attempt on purpose, "
                              f"{v['repeated']} attempts ran again after a lost lease"),
        ("executions per step", hist(v["exec_hist"])),
        ("reclaims per step", hist(v["reclaim_hist"])),
        ("verdict", "OK: 0 lost, 0 wrong" + (f", no tenant above {args.limits}" if args.limits else "")
         if ok else "FAILED"),
    ]
    if args.limits:
        rows.insert(-1, (f"most running at once per tenant (limit {args.limits})",
                         ", ".join(f"{t}: {most[t]}" for t in sorted(most)) or "none logged"))
    if args.failover:
        first = "no step completed after it" if v["recovery"] is None else \
            f"first step completed {v['recovery']:.2f} s after the promotion"
        rows.insert(2, ("failover", f"promote took {cluster.promote_s:.2f} s; {first}"))
    width = max(len(r[0]) for r in rows)
    print(f"\nsteps={args.steps} workers={args.workers} slots={args.slots} duration={args.duration} "
          f"seed={args.seed} failover={args.failover} limits={args.limits} tenants={args.tenants} "
          f"cores={os.cpu_count()}")
    for name, value in rows:
        print(f"{name:<{width}}  {value}")
    for w in v["wrong"][:10]:
        print("  wrong:", w)
    return ok


async def run(args: argparse.Namespace, workdir: Path) -> bool:
    rng = random.Random(args.seed)
    t_start = time.monotonic()
    deadline = t_start + args.timeout
    # Durable commits: an immediate stop must lose nothing acknowledged (nor a failover: the
    # standby is synchronous).
    if args.failover:
        pg = ReplicaPair(fsync=True, bin_dir=args.pg_bin)
    elif args.pg_bin:
        pg = LonePostgres(fsync=True, bin_dir=args.pg_bin)
    else:
        pg = start_embedded(workdir / "pg")
    with psycopg.connect(pg.url()) as c:
        note(f"postgres {c.execute('SHOW server_version').fetchone()[0]}")
    try:
        if isinstance(pg, ReplicaPair):
            url = pg.create_database("chaos")
        else:
            with psycopg.connect(pg.url("postgres"), autocommit=True) as c:
                c.execute("CREATE DATABASE chaos")
            url = pg.url("chaos")
        migrate(url)
        cluster = Cluster(workdir, pg, url, args.workers, args.slots, limits=bool(args.limits))
        try:
            await cluster.start_server(0)
            await cluster.start_server(1)
            if args.limits:
                await set_limit(cluster.addresses[0], args.limits)
            cluster.start_workers()
            note(f"postgres, 2 servers ({', '.join(cluster.addresses)}) and {args.workers} workers up")
            async with Client(cluster.addresses[0], rpc_timeout=10) as c0, \
                    Client(cluster.addresses[1], rpc_timeout=10) as c1:
                load = asyncio.create_task(submit([c0, c1], args.steps, 0.6 * args.duration, deadline,
                                                  args.tenants if args.limits else 0))
                await chaos(cluster, args.duration, rng, args.failover)
                jobs, dags = await load
            note(f"chaos over; waiting for {jobs + dags} runs to end")
            finished = await wait_terminal(url, jobs + dags, deadline)
            elapsed = time.monotonic() - t_start
            v = await verdict(url, cluster.log_dir, jobs, dags, cluster)
        finally:
            cluster.stop()
        return report(v, args, cluster, jobs, dags, elapsed, finished)
    finally:
        if isinstance(pg, ReplicaPair):
            pg.close()
        else:
            pg.stop()


def _overall_timeout(signum: int, frame: object) -> None:
    raise SystemExit("chaos: overall timeout")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=2000, help="steps to submit (about half jobs, half DAG runs)")
    ap.add_argument("--workers", type=int, default=4, help="worker processes")
    ap.add_argument("--slots", type=int, default=8, help="handlers at once per worker")
    ap.add_argument("--duration", type=float, default=60.0, help="seconds of chaos (load in the first 60%%)")
    ap.add_argument("--timeout", type=float, default=600.0, help="overall limit in seconds")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--failover", action="store_true",
                    help="a primary + synchronous standby; at 50%% crash the primary and promote the standby")
    ap.add_argument("--limits", type=int, default=0, metavar="N",
                    help="flow control: a limit of N running steps per tenant, checked by the workers")
    ap.add_argument("--tenants", type=int, default=4, help="tenants of --limits")
    ap.add_argument("--pg-bin", type=Path, metavar="DIR",
                    help="the Postgres binaries to run (e.g. /usr/lib/postgresql/15/bin; with --failover, the "
                         "pair's); default the embedded 18")
    ap.add_argument("--worker", metavar="ADDRESS", help=argparse.SUPPRESS)  # internal: run one worker process
    ap.add_argument("--log-dir", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker_main(args.worker, args.log_dir, args.slots, limits=bool(args.limits))
        return
    workdir = Path(tempfile.mkdtemp(prefix="cyclone-chaos-"))
    signal.signal(signal.SIGALRM, _overall_timeout)
    signal.alarm(int(args.timeout) + 60)  # a hard stop even if a wait hangs; the finally blocks run
    try:
        ok = asyncio.run(run(args, workdir))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
