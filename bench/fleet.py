#!/usr/bin/env python
"""Benchmark: the whole portal at a fleet's size, beside the same figures at today's size, from one run.

Runs each of the benchmarks below twice, one after the other, for `--small` GPUs (8,000 unless told) and for
`--gpus` GPUs (8 a node), and prints each figure of the larger fleet under the same figure of the smaller
one, followed by the targets each benchmark checks, as the larger fleet met them or not:
- sync (bench/sync.py): the first sync of one cluster of all the fleet's nodes on the test Kubernetes API
  server, a re-sync listed whole, an idle re-sync by watch (0 writes) and a 1 % change applied by watch;
- placement (bench/placement.py, `--quick`): the engine's time per request (mean, p95) on the fleet, fresh
  and nearly full, and its index; its quality on the small traces is the same for both and printed once;
- queue (bench/admission.py): one queue run with `--waiting` requests waiting (5,000 unless told), the
  fleet split into clusters as for the pages;
- ingest (bench/ingest.py, 2 rounds, no charts): agents' samples through the HTTP endpoint next to plain
  COPY of the same rows, one whole round of the fleet's readings through gunicorn, the roll-up per minute;
- metrics (bench/metrics.py): the size and time of one /metrics scrape;
- pages (bench/pages.py): the home page and every fleet page and list through gunicorn, their ratio to the
  home page, and a web process's memory once the capacity picture is built; the fleet split into
  `--clusters` clusters (10 unless told; the small fleet into as many as keep 1,250 nodes or fewer each);
- metering (bench/metering.py): one period of one pool for each GPU, next to a plain bulk insert.
Each benchmark builds its own fleet in a throwaway database of its own, so one that fails leaves the others
to run; its failure is printed with the end of what it wrote. `--only` runs the benchmarks named.

Run from the repository root, with the test environment (PostgreSQL per DATABASE_URL, Redis per
REDIS_URL / CACHE_URL):
    .venv/bin/python bench/fleet.py [--gpus 100000] [--small 8000] [--clusters 10] [--waiting 5000]
                                    [--only sync,placement,queue,ingest,metrics,pages,metering]
At 100,000 GPUs the run takes about an hour on two cores. Prints one figure per line.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GPUS_PER_NODE = 8
NODES_PER_CLUSTER = 1250  # the most nodes a cluster of the split fleet has, unless --clusters says more


@dataclass(frozen=True)
class Part:
    name: str
    script: str
    arguments: Callable[[int, argparse.Namespace], list[str]]  # for a fleet of so many GPUs
    once: tuple[str, ...] = ()  # the beginnings of lines that do not depend on the fleet: printed once


def _clusters(gpus: int, options: argparse.Namespace) -> int:
    if gpus == options.gpus:
        return options.clusters
    return max(1, -(-gpus // (GPUS_PER_NODE * NODES_PER_CLUSTER)))


def _few(gpus: int) -> int:
    """The nodes of the fleet that sync's query counts are set beside: 100, or a tenth of a small fleet."""
    return max(1, min(100, gpus // GPUS_PER_NODE // 10))


PARTS = (
    Part(
        "sync",
        "sync.py",
        lambda gpus, _o: ["--nodes", str(gpus // GPUS_PER_NODE), "--small", str(_few(gpus))],
    ),
    Part(
        "placement",
        "placement.py",
        lambda gpus, _o: ["--quick", "--timing-nodes", str(gpus // GPUS_PER_NODE)],
        once=(
            "seeds",
            "demand",
            "engine admitted",
            "first-fit",
            "offline",
            "optimum",
            "engine vs",
            "baseline vs",
            "engine refusals",
            "target engine ≥",
        ),
    ),
    Part(
        "queue",
        "admission.py",
        lambda gpus, o: [
            *("--nodes", str(gpus // GPUS_PER_NODE), "--waiting", str(o.waiting)),
            *("--clusters", str(_clusters(gpus, o))),
        ],
    ),
    Part("ingest", "ingest.py", lambda gpus, _o: ["--gpus", str(gpus), "--rounds", "2", "--no-charts"]),
    Part(
        "metrics", "metrics.py", lambda gpus, o: ["--gpus", str(gpus), "--clusters", str(_clusters(gpus, o))]
    ),
    Part("pages", "pages.py", lambda gpus, o: ["--gpus", str(gpus), "--clusters", str(_clusters(gpus, o))]),
    Part("metering", "metering.py", lambda gpus, _o: ["--pools", str(gpus)]),
)

_NUMBER = re.compile(r"\d[\d,._]*")


def shape(line: str) -> str:
    """What a line is a figure of: its words before the first colon (the whole line without one), numbers
    taken out, so that the same figure of two fleets has the same shape."""
    label = line.strip().split(": ", 1)[0]
    return _NUMBER.sub("#", label)


@dataclass
class Run:
    gpus: int
    lines: list[str]
    seconds: float
    failed: str | None  # why, with the end of what it wrote; None when it ran through


def run(part: Part, gpus: int, options: argparse.Namespace) -> Run:
    command = [sys.executable, str(ROOT / "bench" / part.script), *part.arguments(gpus, options)]
    began = time.monotonic()
    try:
        done = subprocess.run(
            command,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=options.timeout_minutes * 60,
            check=False,
        )
    except subprocess.TimeoutExpired as expired:
        out = expired.stdout.decode() if isinstance(expired.stdout, bytes) else expired.stdout or ""
        return Run(
            gpus, out.splitlines(), time.monotonic() - began, f"stopped after {options.timeout_minutes} min"
        )
    lines = [line for line in done.stdout.splitlines() if line.strip()]
    failed = None
    if done.returncode:
        tail = "\n".join(done.stderr.strip().splitlines()[-8:])
        failed = f"exit status {done.returncode}:\n{tail}"
    return Run(gpus, lines, time.monotonic() - began, failed)


def side_by_side(part: Part, small: Run, large: Run) -> list[str]:
    """Each line of the larger fleet's run under the line of the same shape of the smaller fleet's, in
    order; a line that only one run printed stands alone, and the targets come last."""
    out: list[str] = []
    width = len(f"{large.gpus:,}")
    unmatched = list(small.lines)
    targets = []
    for line in large.lines:
        if line.startswith(part.once):
            if line.startswith("target"):
                targets.append(line)
            else:
                out.append(f"  {'':>{width}}   {line}")
            continue
        if line.startswith("target"):
            targets.append(line)
            continue
        twin = next((other for other in unmatched if shape(other) == shape(line)), None)
        if twin is not None:
            unmatched.remove(twin)
            out.append(f"  {small.gpus:>{width},}   {twin}")
        out.append(f"  {large.gpus:>{width},}   {line}")
    for line in unmatched:
        if not line.startswith(("target", *part.once)):
            out.append(f"  {small.gpus:>{width},}   {line}")
    out += [f"  {large.gpus:>{width},}   {line}" for line in targets]
    return out


def machine() -> str:
    model = "unknown processor"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
        memory_kb = next(
            int(line.split()[1])
            for line in Path("/proc/meminfo").read_text().splitlines()
            if line.startswith("MemTotal")
        )
        memory = f"{memory_kb / 2**20:.0f} GiB"
    except (OSError, StopIteration, ValueError):
        memory = "unknown memory"
    return f"{model}, {os.cpu_count()} cores, {memory}, {platform.system()} {platform.release()}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=100_000, help="GPUs of the large fleet, 8 a node")
    parser.add_argument("--small", type=int, default=8000, help="GPUs of the fleet it is set beside")
    parser.add_argument("--clusters", type=int, default=10, help="clusters the large fleet is split into")
    parser.add_argument("--waiting", type=int, default=5000, help="requests waiting in the queue run")
    parser.add_argument("--only", help="the benchmarks to run, by name, separated by commas")
    parser.add_argument("--timeout-minutes", type=int, default=60, help="the longest one benchmark may run")
    options = parser.parse_args()
    names = [part.name for part in PARTS]
    chosen = names if not options.only else [name.strip() for name in options.only.split(",")]
    unknown = sorted(set(chosen) - set(names))
    if unknown:
        parser.error(f"no benchmark named {', '.join(unknown)}; the names are {', '.join(names)}")
    for size in (options.gpus, options.small):
        if size < GPUS_PER_NODE * 10 or size % GPUS_PER_NODE:
            parser.error(f"{size} GPUs: give a multiple of {GPUS_PER_NODE}, at least {GPUS_PER_NODE * 10}")
    if options.clusters < 1 or options.clusters > options.gpus // GPUS_PER_NODE:
        parser.error("--clusters: at least 1, and no more than the large fleet's nodes")
    if options.waiting < 1:
        parser.error("--waiting: at least 1")

    print(f"machine: {machine()}", flush=True)
    print(f"fleets: {options.small:,} GPUs beside {options.gpus:,} GPUs, 8 a node", flush=True)
    began = time.monotonic()
    failures = []
    for part in PARTS:
        if part.name not in chosen:
            continue
        small = run(part, options.small, options)
        large = run(part, options.gpus, options)
        print(
            f"\n{part.name} (bench/{part.script}; {small.seconds:.0f} s and {large.seconds:.0f} s):",
            flush=True,
        )
        print("\n".join(side_by_side(part, small, large)), flush=True)
        for result in (small, large):
            if result.failed:
                failures.append(part.name)
                print(f"  {result.gpus:,} GPUs FAILED, {result.failed}", flush=True)
    print(f"\nbenchmark wall time: {(time.monotonic() - began) / 60:.1f} min")
    if failures:
        print(f"failed: {', '.join(sorted(set(failures)))}")
        sys.exit(1)


if __name__ == "__main__":
    main()
