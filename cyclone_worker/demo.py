"""A demo worker: registers the workflow "demo" (fetch -> parse, enrich -> report) and runs its handlers.

    python -m cyclone_worker.demo --address 127.0.0.1:7233 [--submit 3]

Runs until SIGTERM or SIGINT. The input of a run is ``{"city": "Lisbon", "days": 7}``;
`fetch` makes up a week of weather readings, `parse` summarises them, `enrich` looks the
city up, and `report` joins both into one line.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import logging
import random
import signal
import sys
from typing import Any

import grpc
from tenacity import AsyncRetrying, retry_if_exception, stop_after_delay, wait_exponential

from ._client import Client
from ._context import Context
from ._errors import CycloneClientError, Permanent
from ._loop import from_env, loop_factory, run as run_on
from ._worker import Worker
from ._workflow import Workflow

__all__ = ["WORKFLOW", "build_worker", "main"]

#: The demo's workflow: a diamond.
WORKFLOW = (Workflow("demo")
            .task("fetch", max_attempts=5, backoff_initial=0.5)
            .task("parse", deps=["fetch"])
            .task("enrich", deps=["fetch"])
            .task("report", deps=["parse", "enrich"]))

_CITIES: dict[str, dict[str, Any]] = {
    "lisbon": {"country": "Portugal", "timezone": "Europe/Lisbon", "climate": "mediterranean"},
    "oslo": {"country": "Norway", "timezone": "Europe/Oslo", "climate": "subarctic"},
    "nairobi": {"country": "Kenya", "timezone": "Africa/Nairobi", "climate": "subtropical highland"},
    "lima": {"country": "Peru", "timezone": "America/Lima", "climate": "desert"},
}


async def fetch(ctx: Context) -> dict[str, Any]:
    """Make up `days` daily temperatures for the city (seeded by its name: reruns agree)."""
    city = str((ctx.input or {}).get("city", "Lisbon"))
    days = int((ctx.input or {}).get("days", 7))
    if not 1 <= days <= 366:
        raise Permanent(f"days: {days} is not between 1 and 366")
    await asyncio.sleep(0.2)  # a pretend network call
    rng = random.Random(hashlib.sha256(city.lower().encode()).digest())
    base = rng.uniform(5, 25)
    return {"city": city, "readings": [round(base + rng.uniform(-6, 6), 1) for _ in range(days)]}


def parse(ctx: Context) -> dict[str, Any]:
    """Summarise the readings (a plain function: it runs in the worker's thread pool)."""
    readings = ctx.parents["fetch"]["readings"]
    return {"days": len(readings), "min": min(readings), "max": max(readings),
            "mean": round(sum(readings) / len(readings), 1)}


async def enrich(ctx: Context) -> dict[str, Any]:
    """Look the city up; an unknown city is not an error, just less to say."""
    city = ctx.parents["fetch"]["city"]
    return {"city": city, **_CITIES.get(city.lower(), {"country": "unknown"})}


async def report(ctx: Context) -> dict[str, Any]:
    """Join the summary and the city facts into one line."""
    stats, place = ctx.parents["parse"], ctx.parents["enrich"]
    text = (f"{place['city']} ({place['country']}): {stats['days']} days, "
            f"{stats['min']}..{stats['max']} °C, mean {stats['mean']} °C")
    return {"text": text, "run": ctx.run_id}


def build_worker(address: str, *, slots: int = 8) -> Worker:
    """A worker with the demo's four handlers.

    Example::

        worker = build_worker("127.0.0.1:7233")
        await worker.run()
    """
    worker = Worker(address, slots=slots)
    for fn in (fetch, parse, enrich, report):
        worker.register(fn.__name__, fn)
    return worker


async def _register(address: str, submit: int) -> None:
    # `cyclone dev` starts this beside the server: wait for it to come up.
    async with Client(address) as client:
        async for attempt in AsyncRetrying(
                retry=retry_if_exception(lambda e: isinstance(e, CycloneClientError)
                                         and e.code == grpc.StatusCode.UNAVAILABLE),
                wait=wait_exponential(multiplier=0.2, max=2), stop=stop_after_delay(60), reraise=True):
            with attempt:
                info = await client.register(WORKFLOW)
        logging.info("demo: workflow %s version %d registered", info.name, info.version)
        for city in list(_CITIES)[:submit]:
            run_id = await client.submit("demo", {"city": city.title(), "days": 7})
            logging.info("demo: submitted run %s for %s", run_id, city.title())


async def _main(address: str, slots: int, submit: int) -> None:
    worker = build_worker(address, slots=slots)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, worker.stop)
    await _register(address, submit)
    await worker.run()


def main(argv: list[str] | None = None) -> int:
    """Command line entry: ``python -m cyclone_worker.demo --address HOST:PORT``."""
    parser = argparse.ArgumentParser(prog="python -m cyclone_worker.demo", description=__doc__.splitlines()[0])
    parser.add_argument("--address", default="127.0.0.1:7233", help="the Cyclone server (HOST:PORT)")
    parser.add_argument("--slots", type=int, default=8, help="steps run at once")
    parser.add_argument("--submit", type=int, default=0, metavar="N", help="also submit N demo runs (up to 4)")
    parser.add_argument("--log-level", default="INFO")
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(message)s")
    try:
        event_loop = from_env()
        loop_factory(event_loop)
    except ValueError as e:  # CYCLONE_EVENT_LOOP names no loop, or uvloop where it is missing
        parser.error(str(e))
    try:
        run_on(_main(args.address, args.slots, args.submit), event_loop)
    except CycloneClientError as e:
        print(f"demo: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
