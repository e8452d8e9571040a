"""`manage.py simulate --input TRACE.json`: the admission queue run over a timed trace, without a database."""

import json
import sys
import time
from pathlib import Path
from typing import TextIO

from django.core.management.base import BaseCommand, CommandError

from pools.placement.simulation import SimulationResult, simulate
from pools.placement.timetrace import TraceError, read_simulation_trace, write_outcomes

HELP = """Run the admission queue over the timed requests of a trace, on its GPUs, from second 0 to the
horizon, and print when each request was admitted and where it went as JSON (API.md, "Simulation trace");
a summary goes to standard error. Reads no database row and writes none. --input is required.

The GPUs are those of a placement trace (see `manage.py place --help`). The trace also has "horizon"
(seconds, above 0), "backfill_grace_seconds" (null or absent: a request that fits is always admitted; else
how long a blocked request waits before no later request competing with it is admitted until it is), and
"requests", in arrival order: id, arrive and hold (whole seconds, 0 or more), items [{model, profile ("full"
for a whole GPU), count}] and optionally group. At each arrival and release the waiting requests are taken in
arrival order, each whole or not at all, as the portal's queue takes them."""


class Command(BaseCommand):
    help = HELP
    # Nothing here needs the database or the checks that read it; the command must work without one.
    requires_system_checks: list[str] = []
    requires_migrations_checks = False
    stealth_options = ("stdin",)  # call_command(..., stdin=stream) stands in for standard input

    def add_arguments(self, parser) -> None:
        # One source of requests per run; a group, so that other sources can join --input as alternatives.
        source = parser.add_mutually_exclusive_group(required=True)
        source.add_argument(
            "--input",
            dest="source",
            help="path of the JSON simulation trace, or - for standard input (required)",
        )

    def handle(self, *args, source: str, **options) -> None:
        text = self._read(source, options.get("stdin") or sys.stdin)
        try:
            data = json.loads(text)
        except json.JSONDecodeError as error:
            raise CommandError(
                f"{self._name(source)} is not valid JSON: {error.msg} at line {error.lineno}, "
                f"column {error.colno}."
            ) from error
        try:
            trace = read_simulation_trace(data)
        except TraceError as error:
            raise CommandError(f"{self._name(source)}: {error}") from error
        started = time.perf_counter()
        result = simulate(trace)
        elapsed = time.perf_counter() - started
        # Built in full before anything is written, so a failure leaves standard output empty.
        self.stdout.write(json.dumps(write_outcomes(result.outcomes), ensure_ascii=False, indent=2))
        self.stderr.write(summary_text(result, elapsed))

    def _read(self, source: str, stdin: TextIO) -> str:
        if source == "-":
            return stdin.read()
        try:
            return Path(source).read_text(encoding="utf-8")
        except OSError as error:
            raise CommandError(f"Cannot read {source}: {error.strerror or error}.") from error
        except UnicodeDecodeError as error:
            raise CommandError(f"Cannot read {source}: it is not UTF-8 text.") from error

    @staticmethod
    def _name(source: str) -> str:
        return "standard input" if source == "-" else source


def summary_text(result: SimulationResult, elapsed: float) -> str:
    """The summary lines of a run, for people: throughput, waits, stranded slices, run time."""
    summary = result.summary
    lines = [
        f"served: {summary.served_slice_hours:.1f} compute-slice-hours",
        f"admitted: {summary.admitted} of {summary.requests} requests",
    ]
    if summary.mean_wait_seconds is None:
        lines.append("wait: no request was admitted")
    else:
        mean, p95 = summary.mean_wait_seconds, summary.p95_wait_seconds
        lines.append(f"wait of admitted requests: mean {mean:.0f} s, p95 {p95} s")
    counts = [count for _at, count in summary.stranded]
    if counts:
        lines.append(
            f"stranded compute slices over {len(counts)} event times: min {min(counts)}, "
            f"mean {sum(counts) / len(counts):.1f}, max {max(counts)}, last {counts[-1]} "
            f"(at {summary.stranded[-1][0]} s)"
        )
    else:
        lines.append("stranded compute slices: no event before the horizon")
    lines.append(f"run time: {elapsed:.2f} s")
    return "\n".join(lines)
