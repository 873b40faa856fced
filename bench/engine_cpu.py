"""The server's own Python CPU per job on the hot path, without gRPC and without workers.

One embedded Postgres with durable commits; `--jobs` standalone jobs enqueued and vacuumed;
then, from one Engine in this process, until every job is done: `Engine.claim_leases` of 64
(the dispatcher's claim), a `Leases` message built from those rows and serialized, and
`Engine.apply_results` of their 64 completions. It prints the process CPU time (not wall
time: what the server pays whatever else runs on the machine) per job of each of the
three, and the wall-clock rate: per round (each on a fresh database) and as the median of
--rounds rounds with their min and max, under the Postgres version and settings.

    .venv/bin/python bench/engine_cpu.py            # --jobs 20000 --rounds 5
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

import psycopg

from cyclone_proto import workers_pb2 as pb
from cyclone_server.stream.wire import lease_message
from cyclone_server.store.embedded import start_embedded
from cyclone_server.records import Job, Result
from cyclone_server.store.engine import Engine
from cyclone_server.store.migrate import migrate

from _common import note  # bench/ is sys.path[0] when run as a script
from _pg import create_db
from _report import MIN_ROUNDS, check_rounds, postgres_line, print_rounds

BATCH = 64


async def measure(url: str, jobs: int) -> dict[str, float]:
    engine = await Engine.open(url, announces=True)
    try:
        for start in range(0, jobs, 1000):
            await engine.enqueue_many([Job(kind="cpu", input={"i": i}) for i in range(start, min(start + 1000, jobs))])
        async with engine.pool.connection() as conn:
            await conn.execute("VACUUM ANALYZE")
        claim = build = apply = 0.0
        done = 0
        wall = time.perf_counter()
        while done < jobs:
            t = time.process_time()
            rows = await engine.claim_leases("cpu-bench", ["cpu"], BATCH, 30)
            claim += time.process_time() - t
            if not rows:
                break
            t = time.process_time()
            msg = pb.ServerMessage()
            for row in rows:
                lease_message(row, msg.leases.leases.add())
            msg.SerializeToString()
            build += time.process_time() - t
            t = time.process_time()
            await engine.apply_results([Result(r.step_id, r.lease_generation, "completed", output={"ok": 1})
                                        for r in rows])
            apply += time.process_time() - t
            done += len(rows)
        wall = time.perf_counter() - wall
    finally:
        await engine.close()
    return {"rate": done / wall, "claim": claim / done * 1e6, "build": build / done * 1e6,
            "apply": apply / done * 1e6}


FIGURES = [("rate", "jobs/s (wall clock)", "{:,.0f}"), ("claim", "claim, server CPU µs per job", "{:.1f}"),
           ("build", "Lease messages, server CPU µs per job", "{:.1f}"),
           ("apply", "results, server CPU µs per job", "{:.1f}")]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=20_000)
    ap.add_argument("--rounds", type=int, default=MIN_ROUNDS)
    args = ap.parse_args()
    check_rounds(ap, args.rounds, note)
    rounds = []
    with tempfile.TemporaryDirectory(prefix="cyclone-engine-cpu-") as tmp:
        pg = start_embedded(Path(tmp) / "pg")
        try:
            settings = postgres_line(pg.url())
            for r in range(args.rounds):
                url = create_db(pg, f"engine_cpu_{r}")
                migrate(url)
                rounds.append(asyncio.run(measure(url, args.jobs)))
                note(f"round {r + 1}: {rounds[-1]['rate']:,.0f} jobs/s")
                with psycopg.connect(pg.url(), autocommit=True) as c:
                    c.execute(f"DROP DATABASE engine_cpu_{r} WITH (FORCE)")
        finally:
            pg.stop()
    print(f"jobs={args.jobs} rounds={args.rounds} date={time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    print(settings)
    print_rounds(FIGURES, rounds)


if __name__ == "__main__":
    main()
