"""What paces a drain: a worker's cycle (claim, push, run, results back, next claim), timed
inside the server.

One embedded Postgres with durable commits, `--jobs` jobs committed with `EnqueueMany`, one
`cyclone-server` wrapped by `_cycle_server.py` (which records each claim, Leases push,
Results message and result batch on the monotonic clock), then `--workers` SDK worker
processes with `--slots` slots and a no-op handler, as `peers.py`'s `cyc2`. It prints, over
the drain:

- claim: from the claim's statement sent to its rows back (the claim's commit included),
  and the rows each got;
- push: building and queueing the Leases message;
- worker turnaround: from a push to the Results that answer its leases (the stream both
  ways, the worker's SDK and handlers, the server reading them);
- wait for a claim: from a worker's last Results message to the start of its next claim
  (the dispatcher claims for one worker at a time);
- the cycle these make, and the rate it implies: workers x slots / cycle;
- how busy the dispatcher was, and the result batches (applied while the next claim runs).

Each of --rounds rounds drains on a fresh database and server; each figure is the mean over
its drain, printed per round and as the median of the rounds (min, max), under the Postgres
version and settings.

    .venv/bin/python bench/drain_cycle.py          # --jobs 20000 --workers 2 --slots 64 --rounds 5
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections import defaultdict, deque
from pathlib import Path

import psycopg

from _common import note
from _contestants import drain_cyclone
from _pg import start_postgres
from _report import MIN_ROUNDS, check_rounds, postgres_line, print_rounds

WRAPPER = (str(Path(__file__).resolve().parent / "_cycle_server.py"),)


def cycle_figures(events: list[list], jobs: int, seconds: float, workers: int, slots: int) -> dict[str, float]:
    """One drain's figures (FIGURES) from the wrapper's events."""
    claims = [e for e in events if e[0] == "claim" and e[4] > 0]
    start, end = min(e[2] for e in claims), max(e[3] for e in claims)
    events = sorted((e for e in events if start <= e[2] <= end), key=lambda e: e[2])
    claims = [e for e in events if e[0] == "claim" and e[4] > 0]
    pushes = [e for e in events if e[0] == "deliver" and e[4] > 0]
    results = [e for e in events if e[0] == "results"]
    applies = [e for e in events if e[0] == "apply"]
    passes = [e for e in events if e[0] == "pass"]

    turnaround: list[float] = []  # a push's end to the Results message that answered its last lease
    waits: list[float] = []  # a worker's last Results message to its next claim's start
    owed: dict[str, deque] = defaultdict(deque)  # per worker: [push end, leases not answered yet]
    last_results: dict[str, float] = {}
    for what, worker, t0, t1, n in events:
        if what == "deliver" and n:
            owed[worker].append([t1, n])
        elif what == "results":
            last_results[worker] = t1
            left = n
            while left and owed[worker]:
                head = owed[worker][0]
                took = min(left, head[1])
                head[1] -= took
                left -= took
                if head[1] == 0:
                    turnaround.append(t0 - head[0])
                    owed[worker].popleft()
        elif what == "claim" and worker in last_results:
            waits.append(t0 - last_results.pop(worker))

    def mean_ms(xs: list[float]) -> float:
        return statistics.mean(xs) * 1e3 if xs else float("nan")

    out = {"rate": jobs / seconds, "claim": mean_ms([e[3] - e[2] for e in claims]),
           "claim_rows": statistics.mean(e[4] for e in claims), "push": mean_ms([e[3] - e[2] for e in pushes]),
           "turnaround": mean_ms(turnaround), "wait": mean_ms(waits),
           "results_each": statistics.mean(e[4] for e in results) if results else float("nan"),
           "batch": mean_ms([e[3] - e[2] for e in applies]),
           "batch_each": statistics.mean(e[4] for e in applies) if applies else float("nan"),
           "busy": 100 * sum(e[3] - e[2] for e in passes) / (end - start)}
    # A drain of one claim per worker has no cycle.
    out["cycle"] = out["claim"] + out["push"] + out["turnaround"] + out["wait"]
    out["cycle_rate"] = workers * slots / out["cycle"] * 1e3
    return out


FIGURES = [("rate", "drain, jobs/s", "{:,.0f}"),
           ("claim", "claim, statement sent to rows back (commit included), mean ms", "{:.2f}"),
           ("claim_rows", "rows per claim", "{:.1f}"),
           ("push", "push: the Leases message built and queued, mean ms", "{:.2f}"),
           ("turnaround", "worker turnaround: push to the Results that answer it, mean ms", "{:.2f}"),
           ("wait", "wait for a claim: a worker's Results to its next claim, mean ms", "{:.2f}"),
           ("cycle", "cycle (sum of the means), ms", "{:.2f}"),
           ("cycle_rate", "workers x slots / cycle, jobs/s", "{:,.0f}"),
           ("results_each", "results per Results message", "{:.1f}"),
           ("batch", "result batch, mean ms", "{:.2f}"),
           ("batch_each", "results per batch", "{:.1f}"),
           ("busy", "dispatcher busy, % of the drain", "{:.0f}")]


def report(rounds: list[dict[str, float]], args: argparse.Namespace, settings: str) -> None:
    print(f"\njobs={args.jobs} workers={args.workers} slots={args.slots} rounds={len(rounds)} "
          f"date={time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    print(settings)
    print_rounds(FIGURES, rounds)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=20000)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--slots", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=MIN_ROUNDS)
    ap.add_argument("--timeout", type=float, default=600)
    args = ap.parse_args()
    check_rounds(ap, args.rounds, note)
    rounds: list[dict[str, float]] = []
    with tempfile.TemporaryDirectory(prefix="cyclone-cycle-") as tmp:
        workdir = Path(tmp)
        pg = start_postgres(workdir / "pg")
        try:
            settings = postgres_line(pg.url())
            note(settings)
            seen: set[Path] = set()
            for r in range(args.rounds):
                d = drain_cyclone(pg, f"cycle_{r}", args.jobs, args.workers, args.timeout, workdir,
                                  slots=args.slots, server_program=WRAPPER)
                (events_file,) = set(workdir.glob("ready-*.json.events.json")) - seen
                seen.add(events_file)
                rounds.append(cycle_figures(json.loads(events_file.read_text()), d.jobs, d.seconds,
                                            args.workers, args.slots))
                note(f"round {r + 1}: {rounds[-1]['rate']:,.0f} jobs/s")
                with psycopg.connect(pg.url(), autocommit=True) as c:
                    c.execute(f"DROP DATABASE cycle_{r} WITH (FORCE)")
        finally:
            pg.stop()
    report(rounds, args, settings)


if __name__ == "__main__":
    main()
