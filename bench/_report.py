"""What every bench report states: the Postgres it ran on with the settings that move its figures,
and each figure as the median of its rounds with their min and max."""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable, Sequence

import psycopg

# The settings a reader needs to compare two reports (issue 35 names the first five).
SETTINGS = ("shared_buffers", "jit", "work_mem", "max_wal_size", "synchronous_commit", "fsync",
            "full_page_writes", "autovacuum", "checkpoint_timeout", "effective_cache_size",
            "shared_preload_libraries")
MIN_ROUNDS = 5  # fewer is no measurement on this machine (docs/benchmarks.md, "The rules")


def check_rounds(ap: argparse.ArgumentParser, rounds: int, say: Callable[[str], None] = print) -> None:
    """--rounds at least 1 (else the parser's error); under MIN_ROUNDS, `say` that it is a probe."""
    if rounds < 1:
        ap.error("--rounds must be at least 1")
    if rounds < MIN_ROUNDS:
        say(f"{rounds} rounds: fewer than {MIN_ROUNDS} is a probe, not a figure")


def postgres_line(url: str) -> str:
    """`PostgreSQL 15.20: shared_buffers=128MB jit=on ...`, read from the server at `url`."""
    with psycopg.connect(url, autocommit=True) as c:
        version = c.execute("SHOW server_version").fetchone()[0]
        shown = []
        for name in SETTINGS:
            value = c.execute(f"SHOW {name}").fetchone()[0]
            shown.append(f"{name}={value or repr('')}")  # '' for an empty list of libraries
        # jit=on does nothing on a build without LLVM (the embedded wheel's).
        shown.append(f"jit_available={c.execute('SELECT pg_jit_available()').fetchone()[0]}")
    return f"PostgreSQL {version}: " + " ".join(shown)


def spread(values: Sequence[float]) -> tuple[float, float, float]:
    """(median, min, max) of a figure's rounds."""
    return statistics.median(values), min(values), max(values)


def fmt_spread(values: Sequence[float], fmt: str = "{:,.0f}") -> str:
    """`4,210 (min 3,980, max 4,400)`: a figure as the report shows it."""
    med, lo, hi = spread(values)
    return f"{fmt.format(med)} (min {fmt.format(lo)}, max {fmt.format(hi)})"


def print_rounds(figures: Sequence[tuple[str, str, str]], rounds: Sequence[dict[str, float]]) -> None:
    """A table of `figures` ((key, name, format) each): a column per round, then the median of
    the rounds with their min and max."""
    print_rows(["figure", *[f"round {i + 1}" for i in range(len(rounds))], "median (min, max)"],
               [[name, *[fmt.format(r[key]) for r in rounds], fmt_spread([r[key] for r in rounds], fmt)]
                for key, name, fmt in figures])


def print_rows(header: list[str], rows: list[list[str]]) -> None:
    """A Markdown table: the first column to the left, the others to the right."""
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    print("| " + " | ".join(h.ljust(w) for h, w in zip(header, widths)) + " |")
    print("| " + " | ".join("-" * w for w in widths) + " |")
    for r in rows:
        print("| " + " | ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
              + " |")


def percentile_ms(values: Sequence[float], q: float) -> float:
    """The q-quantile of `values` (seconds, sorted), in milliseconds; the median for q = 0.5."""
    if q == 0.5:
        return statistics.median(values) * 1000
    return values[min(len(values) - 1, int(len(values) * q))] * 1000
