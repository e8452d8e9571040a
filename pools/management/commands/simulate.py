"""`manage.py simulate --input TRACE.json`: the admission queue run over a timed trace, without a database;
`manage.py simulate --history YYYY-MM [--cluster C] [--add …] [--remove …] [--regroup …]`: a month of the
portal's own requests on today's fleet and on a changed one."""

import json
import sys
import time

from django.core.management.base import BaseCommand, CommandError
from django.db import DatabaseError

from pools.management.trace_files import read_json, source_name
from pools.placement.fleet_changes import ADD, REGROUP, REMOVE
from pools.placement.simulation import SimulationResult, simulate
from pools.placement.timetrace import TraceError, read_simulation_trace, write_outcomes
from pools.placement.whatif import side_by_side
from pools.whatif.report import BAD_INPUT, InvalidAnswer, run_whatif

HELP = """Run the admission queue over the timed requests of a trace, on its GPUs, from second 0 to the
horizon, and print when each request was admitted and where it went as JSON (docs/traces.md, "Simulation
trace"); a summary goes to standard error. --input is required unless --history is given; --input reads no
database row, and neither writes any.

The GPUs are those of a placement trace (see `manage.py place --help`). The trace also has "horizon"
(seconds, above 0), "backfill_grace_seconds" (null or absent: a request that fits is always admitted; else
how long a blocked request waits before no later request competing with it is admitted until it is), and
"requests", in arrival order: id, arrive and hold (whole seconds, 0 or more), items [{model, profile ("full"
for a whole GPU), count}] and optionally group. At each arrival and release the waiting requests are taken in
arrival order, each whole or not at all, as the portal's queue takes them.

--history YYYY-MM (a month in the billing time zone) reads that month's approved requests instead, with the
holds their pools really had, and runs them on today's fleet, emptied, as JSON: {"month", "cluster",
"changes", "fleets": {"real": {...}, "changed": {...}}}, each fleet's requests, admitted,
served_slice_hours, mean and p95 wait, stranded min/mean/max, GPUs, and series (its figures over the month
in buckets of whole hours); the two side by side go to standard error. --cluster, --add "N MODEL [GROUP]",
--remove NODE and --regroup NODE=GROUP go only with --history; the changes, each repeatable, apply in the
order given and make the "changed" fleet."""

# How the command line names each fleet change; one list keeps their order across kinds.
CHANGES = {"--add": ADD, "--remove": REMOVE, "--regroup": REGROUP}
HISTORY_ONLY = ("--cluster", *CHANGES)


class Command(BaseCommand):
    help = HELP
    # Nothing here needs the database or the checks that read it; the command must work without one.
    requires_system_checks: list[str] = []
    requires_migrations_checks = False
    stealth_options = ("stdin",)  # call_command(..., stdin=stream) stands in for standard input

    def add_arguments(self, parser) -> None:
        # One source of requests per run. Which one is required is checked in handle, so that the message
        # for none keeps naming --input as it always has.
        source = parser.add_mutually_exclusive_group()
        source.add_argument(
            "--input",
            dest="source",
            help="path of the JSON simulation trace, or - for standard input (required unless --history)",
        )
        source.add_argument(
            "--history",
            metavar="YYYY-MM",
            help="simulate that month of the portal's own requests on today's fleet (reads the database)",
        )
        parser.add_argument("--cluster", help="with --history: only this cluster's requests and GPUs")
        helps = {
            "--add": ("GPUS", '"N MODEL [GROUP]", e.g. "8 H200-141GB training": N GPUs in new 8-GPU nodes'),
            "--remove": ("NODE", "every GPU of that node goes"),
            "--regroup": ("NODE=GROUP", "that node's GPUs move to the group (NODE=: to none)"),
        }
        for flag, kind in CHANGES.items():
            metavar, text = helps[flag]
            parser.add_argument(
                flag,
                dest="changes",
                action="append",
                type=lambda value, kind=kind: (kind, value),
                metavar=metavar,
                help=f"with --history, repeatable: {text}",
            )

    def handle(self, *args, source: str | None, history: str | None, **options) -> None:
        if history is None:
            given = [flag for flag in HISTORY_ONLY if self._given(flag, options)]
            if given:
                need = "needs" if len(given) == 1 else "need"
                raise CommandError(f"{' and '.join(given)} {need} --history YYYY-MM: a month to run.")
        if source is None and history is None:
            # In argparse's words, as before --history joined --input; either one is required.
            raise CommandError("Error: one of the arguments --input is required, or --history YYYY-MM.")
        if history is not None:
            return self._history(history, options.get("cluster"), options.get("changes") or [])
        data = read_json(source, options.get("stdin") or sys.stdin)
        try:
            trace = read_simulation_trace(data)
        except TraceError as error:
            raise CommandError(f"{source_name(source)}: {error}") from error
        started = time.perf_counter()
        result = simulate(trace)
        elapsed = time.perf_counter() - started
        # Built in full before anything is written, so a failure leaves standard output empty.
        answer = write_outcomes(result.outcomes, quotas=bool(trace.quotas), requeue=trace.requeue_reclaimed)
        self.stdout.write(json.dumps(answer, ensure_ascii=False, indent=2))
        self.stderr.write(summary_text(result, elapsed))

    @staticmethod
    def _given(flag: str, options: dict) -> bool:
        if flag == "--cluster":
            return options.get("cluster") is not None
        return any(kind == CHANGES[flag] for kind, _text in options.get("changes") or [])

    def _history(self, month: str, cluster: str | None, changes: list[tuple[str, str]]) -> None:
        started = time.perf_counter()
        try:
            report = run_whatif(month=month, cluster=cluster, changes=changes)
        except (*BAD_INPUT, InvalidAnswer) as error:
            raise CommandError(str(error)) from error
        except DatabaseError as error:
            raise CommandError(f"--history reads the portal's database, and cannot: {error}") from error
        self.stdout.write(json.dumps(report, ensure_ascii=False, indent=2))
        self.stderr.write(side_by_side(report))
        self.stderr.write(f"run time: {time.perf_counter() - started:.2f} s")


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
