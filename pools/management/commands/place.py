"""`manage.py place --input TRACE.json`: the placement engine on a JSON trace, without a database."""

import json
import sys

from django.core.management.base import BaseCommand, CommandError

from pools.management.trace_files import read_json, source_name
from pools.placement import place_all
from pools.placement.trace import TraceError, read_trace, write_results

HELP = """Place the requests of a trace on its GPUs, in order, each whole or not at all, and print the
placements as JSON (docs/traces.md, "Placement trace"). Reads no database row and writes none.

Each GPU: id, node, model (A100-40GB, A100-80GB, H100-80GB, H200-141GB, B200-180GB), mig (true/false),
allocated (a MIG-disabled GPU in use), instances [{profile, start, allocated}], and optionally group,
cluster (a request's items stay in one cluster; default ""), schedulable (false when drained or unhealthy:
it gets nothing new; default true) and reconfiguring (its node is being re-partitioned now, so new layouts
prefer it; default false). Each request: id, items [{model, profile ("full" for a whole GPU), count}] and
optionally group (then only GPUs of that group are used)."""


class Command(BaseCommand):
    help = HELP
    # Nothing here needs the database or the checks that read it; the command must work without one.
    requires_system_checks: list[str] = []
    requires_migrations_checks = False
    stealth_options = ("stdin",)  # call_command(..., stdin=stream) stands in for standard input

    def add_arguments(self, parser) -> None:
        parser.add_argument(
            "--input", dest="source", required=True, help="path of the JSON trace, or - for standard input"
        )

    def handle(self, *args, source: str, **options) -> None:
        data = read_json(source, options.get("stdin") or sys.stdin)
        try:
            fleet, requests = read_trace(data)
        except TraceError as error:
            raise CommandError(f"{source_name(source)}: {error}") from error
        placements, _ = place_all(fleet, requests)
        # Built in full before anything is written, so a failure leaves standard output empty.
        self.stdout.write(json.dumps(write_results(placements), ensure_ascii=False, indent=2))
