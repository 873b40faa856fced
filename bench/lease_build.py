"""What building one Lease costs the server, against the way it was built before.

`cyclone_server.stream.wire.lease_message` fills each Lease in place from a row of
`Engine.claim_leases` (ids as text, times in microseconds, the input and parents as JSON
text, parsed and put straight into the message) and the dispatcher adds it directly to the
outgoing `Leases`. The reference below is the first code: from a row as `Engine.claim`
returns it (UUIDs, datetimes, parsed JSON), a `Value` built and then copied in,
`Timestamp.FromDatetime`, and a list of Leases copied into the message.
Both build the same message, which this checks first; then it times both in the same
process, alternating, --rounds times, and prints each figure as the median of the rounds
with their min and max (no Postgres: the rows are made in memory).

    .venv/bin/python bench/lease_build.py            # --leases 1000 --rounds 7
"""

from __future__ import annotations

import argparse
import json
import statistics
import timeit
import uuid
from datetime import datetime, timedelta, timezone
from collections import namedtuple
from typing import Any

from cyclone_proto import workers_pb2 as pb
from cyclone_server.convert import py_to_value, to_timestamp
from cyclone_server.stream.wire import lease_message

from _report import MIN_ROUNDS, fmt_spread  # bench/ is sys.path[0] when run as a script


def reference_lease(row: dict[str, Any]) -> pb.Lease:
    lease = pb.Lease(
        run_id=str(row["run_id"]), step_id=str(row["step_id"]), node=row["node"], kind=row["kind"],
        attempt=row["attempt"], max_attempts=row["max_attempts"], reclaims=row["reclaims"],
        snoozes=row["snoozes"], lease_generation=row["lease_generation"], input=py_to_value(row["input"]),
        parents=py_to_value(row["parents"] or {}).struct_value, lease_expiry=to_timestamp(row["lease_expiry"]))
    if row["attempt_deadline"] is not None:
        lease.attempt_deadline.CopyFrom(to_timestamp(row["attempt_deadline"]))
    return lease


def reference(rows: list[dict[str, Any]]) -> bytes:
    return pb.ServerMessage(leases=pb.Leases(leases=[reference_lease(r) for r in rows])).SerializeToString()


def current(rows: list[Any]) -> bytes:
    msg = pb.ServerMessage()
    leases = msg.leases.leases
    for row in rows:
        lease_message(row, leases.add())
    return msg.SerializeToString()


WireRow = namedtuple("WireRow", "step_id run_id node kind attempt max_attempts reclaims snoozes lease_generation "
                                "lease_expiry_us attempt_deadline_us waited input parents trace_context")


def _us(dt: datetime | None) -> int | None:
    return None if dt is None else (dt - datetime(1970, 1, 1, tzinfo=timezone.utc)) // timedelta(microseconds=1)


def wire_rows(rows: list[dict[str, Any]]) -> list[WireRow]:
    """The same rows as `Engine.claim_leases` returns them."""
    return [WireRow(str(r["step_id"]), str(r["run_id"]), r["node"], r["kind"], r["attempt"], r["max_attempts"],
                    r["reclaims"], r["snoozes"], r["lease_generation"], _us(r["lease_expiry"]),
                    _us(r["attempt_deadline"]), r["waited"], json.dumps(r["input"]),
                    json.dumps(r["parents"]) if r["parents"] else None, r["trace_context"]) for r in rows]


def claimed_rows(n: int) -> list[dict[str, Any]]:
    """Rows as cyclone_steps_claim returns them: jobs with a small input, and DAG steps with parents."""
    now = datetime.now(timezone.utc)
    return [{"step_id": uuid.uuid4(), "run_id": uuid.uuid4(), "node": "job", "kind": "noop", "priority": 0,
             "attempt": 1, "max_attempts": 25, "reclaims": 0, "snoozes": 0, "lease_generation": 1,
             "lease_expiry": now + timedelta(seconds=30), "attempt_deadline": now + timedelta(minutes=10),
             "trace_context": None,
             "waited": 0.01, "input": {"i": i, "tags": ["a", "b"], "ok": True, "note": None},
             "parents": {} if i % 4 else {"root": {"rows": i}}} for i in range(n)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--leases", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=7, help=f"at least {MIN_ROUNDS}")
    args = ap.parse_args()
    if args.rounds < MIN_ROUNDS:
        ap.error(f"--rounds: at least {MIN_ROUNDS}")
    rows = claimed_rows(args.leases)
    wire = wire_rows(rows)
    # The same message (compared parsed: the order of a Struct's map entries on the wire may differ).
    assert pb.ServerMessage.FromString(reference(rows)) == pb.ServerMessage.FromString(current(wire)), \
        "the two builders must produce the same message"
    took: dict[str, list[float]] = {"reference (before)": [], "lease_message (now)": []}
    for _ in range(args.rounds):
        for name, fn, data in (("reference (before)", reference, rows), ("lease_message (now)", current, wire)):
            took[name].append(timeit.timeit(lambda: fn(data), number=3) / 3 / len(rows) * 1e6)
    print(f"leases={args.leases} rounds={args.rounds}")
    for name, us in took.items():
        print(f"{name}: {fmt_spread(us, '{:.1f}')} µs per lease, built and serialized")
    ratios = [a / b for a, b in zip(took["lease_message (now)"], took["reference (before)"])]
    print(f"ratio now / before: {statistics.median(took['lease_message (now)']) / statistics.median(took['reference (before)']):.2f} "
          f"(rounds: min {min(ratios):.2f}, max {max(ratios):.2f})")


if __name__ == "__main__":
    main()
