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

    .venv/bin/python bench/drain_cycle.py          # --jobs 20000 --workers 2 --slots 64
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from collections import defaultdict, deque
from pathlib import Path

from _contestants import drain_cyclone
from _pg import start_postgres

WRAPPER = (str(Path(__file__).resolve().parent / "_cycle_server.py"),)


def _ms(xs: list[float]) -> str:
    if not xs:
        return "-"
    xs = sorted(xs)
    return (f"p50 {statistics.median(xs) * 1e3:6.2f}  p90 {xs[int(len(xs) * 0.9)] * 1e3:6.2f}  "
            f"mean {statistics.mean(xs) * 1e3:6.2f} ms  (n = {len(xs)})")


def report(events: list[list], jobs: int, seconds: float, workers: int, slots: int) -> None:
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

    claim_s = [e[3] - e[2] for e in claims]
    push_s = [e[3] - e[2] for e in pushes]
    span = end - start
    print(f"\n{jobs} jobs drained in {seconds:.2f} s: {jobs / seconds:,.0f} jobs/s "
          f"({workers} workers x {slots} slots)")
    print(f"claim                 {_ms(claim_s)}, {statistics.mean(e[4] for e in claims):.1f} rows each")
    print(f"push (Leases)         {_ms(push_s)}")
    print(f"worker turnaround     {_ms(turnaround)}")
    print(f"wait for a claim      {_ms(waits)}")
    if turnaround and waits:  # a drain of one claim per worker has no cycle
        cycle = (statistics.mean(claim_s) + statistics.mean(push_s) + statistics.mean(turnaround)
                 + statistics.mean(waits))
        print(f"cycle (sum of means)  {cycle * 1e3:.2f} ms: {workers} x {slots} / cycle = "
              f"{workers * slots / cycle:,.0f} jobs/s")
    print(f"Results messages      {len(results)}, {statistics.mean(e[4] for e in results):.1f} results each, "
          f"read in {_ms([e[3] - e[2] for e in results])}")
    if applies:
        print(f"result batches        {_ms([e[3] - e[2] for e in applies])}, "
              f"{statistics.mean(e[4] for e in applies):.1f} results each")
    print(f"dispatcher busy       {sum(e[3] - e[2] for e in passes) / span:.0%} of the drain "
          f"({len(passes)} passes)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=20000)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--slots", type=int, default=64)
    ap.add_argument("--timeout", type=float, default=600)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="cyclone-cycle-") as tmp:
        workdir = Path(tmp)
        pg = start_postgres(workdir / "pg")
        try:
            d = drain_cyclone(pg, "cycle", args.jobs, args.workers, args.timeout, workdir,
                              slots=args.slots, server_program=WRAPPER)
        finally:
            pg.stop()
        (events_file,) = workdir.glob("ready-*.json.events.json")
        report(json.loads(events_file.read_text()), d.jobs, d.seconds, args.workers, args.slots)


if __name__ == "__main__":
    main()
