#!/usr/bin/env python
"""Probe: runs the NVML collector on this machine and prints what it read, as JSON.

It only reads (NVML queries); it never changes MIG mode, layout or any setting of a GPU. SM activity
is a share of time between two samples, so the probe reads twice, `--interval` seconds apart, and
prints the second reading. On a machine without an NVIDIA driver it prints the collector's one-line
reason and exits with status 2.

    .venv/bin/python bench/nvml_probe.py [--interval 1.0]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from monitoring.collectors import CollectorUnavailable
from monitoring.collectors.nvml import NvmlCollector


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between the two readings")
    args = parser.parse_args()
    try:
        collector = NvmlCollector()
    except CollectorUnavailable as error:
        print(error, file=sys.stderr)
        return 2
    try:
        started = time.perf_counter()
        collector.read()
        first = time.perf_counter() - started
        time.sleep(args.interval)
        started = time.perf_counter()
        reading = collector.read()
        second = time.perf_counter() - started
    finally:
        collector.close()
    print(json.dumps(dataclasses.asdict(reading), default=str, indent=2))
    print(
        f"read {len(reading.gpus)} GPU(s) in {first * 1000:.1f} ms, then {second * 1000:.1f} ms",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
