"""`manage.py gpu_agent --portal URL --token KEY`: the node agent, reading this host's GPUs through NVML and
pushing the readings to the portal. Needs no database: only the portal's address and an agent token."""

from __future__ import annotations

import logging
import os
import signal
import sys
from contextlib import contextmanager

from django.core.management.base import BaseCommand, CommandError

from monitoring.collectors.base import Collector, CollectorUnavailable
from monitoring.ingest.agent import DEFAULT_BATCH, DEFAULT_INTERVAL, DEFAULT_TIMEOUT, Agent, Portal

HELP = """Read this host's GPUs (NVML) every interval and push the readings to the portal with an agent
token (made in the admin, under agent tokens). While the portal is away the readings wait in a bounded
buffer and are sent, oldest first, once it answers again. SIGTERM or Ctrl-C: one last try, then exit.
The token may come from the environment (GPU_AGENT_TOKEN) instead of the command line, where other users
of the host could read it. Settings still load, so set SECRET_KEY (any value) where DEBUG is off; no
database is used."""

TOKEN_VARIABLE = "GPU_AGENT_TOKEN"


class Command(BaseCommand):
    help = HELP
    # It runs on GPU nodes that reach only the portal: no check may read a database.
    requires_system_checks: list[str] = []
    requires_migrations_checks = False
    stealth_options = ("collector",)  # call_command(..., collector=...) stands in for NVML in tests

    def add_arguments(self, parser) -> None:
        parser.add_argument(
            "--portal", required=True, help="the portal's address, e.g. https://gpu.example.com"
        )
        parser.add_argument("--token", default=None, help=f"the agent token's key (or set {TOKEN_VARIABLE})")
        parser.add_argument(
            "--interval", type=float, default=DEFAULT_INTERVAL, help="seconds between readings (default 15)"
        )
        parser.add_argument("--once", action="store_true", help="read once, send once, exit (0: sent)")
        parser.add_argument(
            "--buffer",
            type=int,
            default=None,
            help="readings kept while the portal is away; the oldest go first (default: 4 hours' worth)",
        )
        parser.add_argument(
            "--batch", type=int, default=DEFAULT_BATCH, help=f"readings per POST (default {DEFAULT_BATCH})"
        )
        parser.add_argument(
            "--host", default=None, help="this node's name in the portal (default: the host name)"
        )
        parser.add_argument(
            "--timeout", type=float, default=DEFAULT_TIMEOUT, help="seconds to wait for the portal's answer"
        )

    def handle(self, *args, **options) -> None:
        portal_url = options["portal"].strip()
        if not portal_url.startswith(("http://", "https://")):
            raise CommandError(f"--portal must be an http:// or https:// address, not {portal_url!r}.")
        token = options["token"] or os.environ.get(TOKEN_VARIABLE, "")
        if not token:
            raise CommandError(f"Give the agent token: --token KEY, or the {TOKEN_VARIABLE} variable.")
        if options["interval"] <= 0 or options["batch"] < 1 or (options["buffer"] or 1) < 1:
            raise CommandError("--interval, --buffer and --batch must be positive.")
        try:
            collector = options.get("collector") or self._nvml(options["host"])
        except CollectorUnavailable as error:
            self.stderr.write(str(error))
            sys.exit(1)
        portal = Portal(portal_url, token, timeout=options["timeout"])
        agent = Agent(
            collector=collector,
            portal=portal,
            interval=options["interval"],
            buffer_size=options["buffer"],
            batch_size=options["batch"],
        )
        try:
            with self._logging(quiet=options["once"] and options["verbosity"] < 2):
                if options["once"]:
                    self._once(agent, portal_url)
                else:
                    with _stopped_by_signals(agent):
                        agent.run()
        finally:
            collector.close()
            portal.close()

    def _nvml(self, host: str | None) -> Collector:
        from monitoring.collectors.nvml import NvmlCollector

        return NvmlCollector(host=host)

    def _once(self, agent: Agent, portal_url: str) -> None:
        read = agent.collect()
        gpus = sum(len(reading.gpus) for reading in agent.buffer)
        if not read:
            self.stderr.write("The collector gave no reading: nothing was sent.")
            sys.exit(1)
        if not agent.flush():
            self.stderr.write(f"Could not send {read} reading(s) to {portal_url}: {agent.last_failure}.")
            sys.exit(1)
        self.stdout.write(f"Sent {agent.sent} reading(s) of {gpus} GPU(s) to {portal_url}.")

    @contextmanager
    def _logging(self, *, quiet: bool):
        """The agent's log on standard error with times; with --once, only the one closing line."""
        logger = logging.getLogger("monitoring.ingest.agent")
        saved = (logger.handlers[:], logger.level, logger.propagate)
        if quiet:
            handler: logging.Handler = logging.NullHandler()
        else:
            handler = logging.StreamHandler(self.stderr)
            handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
        logger.handlers, logger.propagate = [handler], False
        logger.setLevel(logging.INFO)
        try:
            yield
        finally:
            logger.handlers, logger.level, logger.propagate = saved


@contextmanager
def _stopped_by_signals(agent: Agent):
    """SIGTERM and SIGINT end the loop (after one last try to send) instead of the process."""

    def stop(signum, frame):
        agent.stop()

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
