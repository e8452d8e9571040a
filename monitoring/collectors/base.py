"""The collector contract: `readings()` gives a `Reading` per host: its GPUs and their MIG instances.

Every figure is optional: a GPU or an instance that cannot report one (NVML answers NotSupported on
MIG handles for utilisation, temperature, power and ECC) leaves it None and says why in `problems`,
and the rest of the reading stands. A collector that cannot read at all raises `CollectorUnavailable`
with one line a person can act on.

Units: watts, degrees Celsius, percent (0–100), bytes, error counts since the driver loaded.

The readings are msgspec structs: immutable, compared and hashed by value like frozen dataclasses, but made,
written as JSON and read back in C (the portal reads and passes on 12,500 of them every 15 s at 100,000
GPUs), and left out of the garbage collector's rounds, since a reading can never be part of a reference
cycle. A copy with some fields changed is `msgspec.structs.replace`.
"""

from __future__ import annotations

from datetime import datetime
from typing import Protocol

import msgspec


class CollectorUnavailable(Exception):
    """The collector cannot read anything here; the message says why in one line."""


class InstanceReading(msgspec.Struct, frozen=True, gc=False):
    """A MIG instance: its own memory and SM activity; power, temperature and ECC belong to its GPU."""

    uuid: str
    gpu_instance_id: int
    profile: str | None = None  # e.g. "3g.71gb"
    placement: tuple[int, int] | None = None  # (first memory slice, slices)
    memory_used_bytes: int | None = None
    memory_total_bytes: int | None = None
    sm_active_pct: float | None = None
    problems: tuple[str, ...] = ()


class GpuReading(msgspec.Struct, frozen=True, gc=False):
    index: int
    uuid: str
    model: str | None = None  # the name the driver gives, e.g. "NVIDIA H200"
    mig_enabled: bool | None = None
    power_w: float | None = None
    temperature_c: float | None = None
    utilisation_pct: float | None = None
    sm_active_pct: float | None = None
    memory_used_bytes: int | None = None
    memory_total_bytes: int | None = None
    ecc_corrected: int | None = None  # volatile: since the driver loaded
    ecc_uncorrected: int | None = None
    xid_events: tuple[int, ...] = ()  # XIDs seen since the previous reading
    instances: tuple[InstanceReading, ...] = ()
    problems: tuple[str, ...] = ()  # "field: why", one per figure that could not be read


class Reading(msgspec.Struct, frozen=True, gc=False):
    host: str
    at: datetime
    gpus: tuple[GpuReading, ...] = ()
    problems: tuple[str, ...] = ()


class Collector(Protocol):
    """Reads GPUs now: `readings()` gives one Reading per host it sees (a node agent sees its own host; a
    cluster's Prometheus, every host it scrapes). `close()` gives back what it holds (driver handles,
    event sets, connections)."""

    name: str

    def readings(self) -> tuple[Reading, ...]: ...

    def close(self) -> None: ...
