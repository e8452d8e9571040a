"""DCGM's fields as dcgm-exporter names them, and the series of a cluster turned into one Reading per host
(the contract of monitoring/collectors/base.py): the half of the DCGM collector that needs no network.

Words: as in dcgm_prometheus.py (series, target). Of each series only its newest sample comes here.

What DCGM gives, in the contract's units (base.py): utilisation (%), SM activity (a ratio, shown in %),
power (W), temperature (°C), memory used and free (MiB; total = used + free), volatile ECC counts (the
aggregate ones when the volatile ones are not exported) and the last XID. A MIG instance has its own
memory and SM activity; the rest belong to its GPU, and when DCGM reports a GPU figure only per
instance, the GPU's stays None (its `problems` say so).

What it cannot give: an instance's placement and its own MIG UUID (dcgm-exporter labels an instance
with its GPU's UUID; `uuid` is ""); whether a GPU without instance series has MIG on (`mig_enabled`
is None then); which pod holds a device (the contract has no place for it). `DCGM_FI_DEV_XID_ERRORS`
keeps the last XID until the driver reloads, so a non-zero one is in every reading's `xid_events`.
A series with neither a `Hostname` nor an `instance` label belongs to no host and is left out.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import NamedTuple

from monitoring.collectors.base import GpuReading, InstanceReading, Reading

GPU_UTIL = "DCGM_FI_DEV_GPU_UTIL"
SM_ACTIVE = "DCGM_FI_PROF_SM_ACTIVE"
POWER = "DCGM_FI_DEV_POWER_USAGE"
TEMPERATURE = "DCGM_FI_DEV_GPU_TEMP"
FB_USED = "DCGM_FI_DEV_FB_USED"
FB_FREE = "DCGM_FI_DEV_FB_FREE"
ECC_SBE = ("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL")  # volatile first
ECC_DBE = ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL")
XID = "DCGM_FI_DEV_XID_ERRORS"
METRICS = (GPU_UTIL, SM_ACTIVE, POWER, TEMPERATURE, FB_USED, FB_FREE, *ECC_SBE, *ECC_DBE, XID)
MIB = 1 << 20


class Figure(NamedTuple):
    field: str  # the GpuReading / InstanceReading attribute
    label: str  # its name in `problems`
    metrics: tuple[str, ...]  # the first one exported is used
    convert: Callable[[float], float | int]


def _bytes(mib: float) -> int:
    return round(mib * MIB)


GPU_FIGURES = (
    Figure("utilisation_pct", "utilisation", (GPU_UTIL,), float),
    Figure("sm_active_pct", "SM activity", (SM_ACTIVE,), lambda ratio: round(ratio * 100, 2)),
    Figure("power_w", "power", (POWER,), float),
    Figure("temperature_c", "temperature", (TEMPERATURE,), float),
    Figure("memory_used_bytes", "memory used", (FB_USED,), _bytes),
    Figure("ecc_corrected", "ECC corrected", ECC_SBE, int),
    Figure("ecc_uncorrected", "ECC uncorrected", ECC_DBE, int),
)
INSTANCE_FIGURES = tuple(f for f in GPU_FIGURES if f.field in ("sm_active_pct", "memory_used_bytes"))
# Free memory only makes the total; the last XID becomes `xid_events`.
FREE = Figure("memory_free_bytes", "memory total", (FB_FREE,), _bytes)
LAST_XID = Figure("xid_events", "XID", (XID,), int)


class Sample(NamedTuple):
    """The newest sample of one series."""

    metric: str
    labels: Mapping[str, str]
    at: float  # seconds since the epoch
    value: float  # may be NaN or infinite: such a series is noted, not used
    raw: str | float


def readings_of(samples: list[Sample]) -> tuple[Reading, ...]:
    """One reading per host, in the order of their names, of the series their targets still export; a
    series that names no host is left out."""
    hosts: dict[str, Host] = {}
    for sample in still_exported(samples):
        host = host_name(sample.labels)
        if host:
            hosts.setdefault(host, Host()).add(sample)
    return tuple(hosts[name].reading(name) for name in sorted(hosts))


def still_exported(samples: list[Sample]) -> list[Sample]:
    """Drops the series their target no longer exports: older than the target's newest scrape."""
    newest: dict[tuple[str | None, str | None], float] = {}
    for sample in samples:
        target = (sample.labels.get("job"), sample.labels.get("instance"))
        newest[target] = max(newest.get(target, sample.at), sample.at)
    return [s for s in samples if s.at >= newest[(s.labels.get("job"), s.labels.get("instance"))]]


def host_name(labels: Mapping[str, str]) -> str:
    if labels.get("Hostname"):
        return labels["Hostname"]
    instance = labels.get("instance", "")
    if instance.startswith("["):  # [2001:db8::1]:9400
        return instance[1:].partition("]")[0]
    return instance.partition(":")[0] if instance.count(":") == 1 else instance


# --- from series to readings -------------------------------------------------------------------------


@dataclass
class Entity:
    """A GPU or a MIG instance: its newest sample of each metric."""

    labels: dict[str, str] = field(default_factory=dict)
    samples: dict[str, Sample] = field(default_factory=dict)

    def add(self, sample: Sample) -> None:
        known = self.samples.get(sample.metric)
        if known is None or sample.at > known.at:
            self.samples[sample.metric] = sample
        self.labels.update(sample.labels)

    def exports(self, figure: Figure) -> bool:
        return any(metric in self.samples for metric in figure.metrics)

    def figure(self, figure: Figure) -> tuple[float | int | None, str | None]:
        """The figure's value, or None and why."""
        for metric in figure.metrics:
            sample = self.samples.get(metric)
            if sample is None:
                continue
            try:
                if math.isfinite(sample.value):
                    return figure.convert(sample.value), None
            except OverflowError:
                pass
            return None, f"{figure.label}: {metric} is {sample.raw}; skipped"
        return None, f"{figure.label}: not exported ({' or '.join(figure.metrics)})"

    def figures(self, figures: tuple[Figure, ...], problems: list[str]) -> dict[str, object]:
        """The figures by attribute, memory total made of used + free; each missing one noted."""
        found: dict[str, object] = {}
        for figure in figures:
            found[figure.field], why = self.figure(figure)
            problems += [why] if why else []
        used, free = found.get("memory_used_bytes"), found.pop(FREE.field)
        found["memory_total_bytes"] = None if used is None or free is None else used + free
        return found


@dataclass
class Gpu(Entity):
    uuid: str = ""
    instances: dict[str, Entity] = field(default_factory=dict)  # by GPU_I_ID as labelled
    names: dict[str, str] = field(default_factory=dict)  # gpu and modelName, whichever series has them

    def add(self, sample: Sample) -> None:
        instance = sample.labels.get("GPU_I_ID")
        if instance is None:
            super().add(sample)
        else:
            self.instances.setdefault(instance, Entity()).add(sample)
        self.names.update({k: v for k, v in sample.labels.items() if k in ("gpu", "modelName") and v})

    def figure(self, figure: Figure) -> tuple[float | int | None, str | None]:
        if not self.exports(figure) and any(i.exports(figure) for i in self.instances.values()):
            return None, f"{figure.label}: reported per MIG instance only"
        return super().figure(figure)

    def reading(self, host_problems: list[str]) -> GpuReading | None:
        """The GPU's reading; None, with the reason among the host's problems, without an index."""
        index = _number(self.names.get("gpu"))
        if index is None:
            host_problems.append(
                f"GPU {self.uuid}: gpu label {self.names.get('gpu')!r}, not an index; skipped"
            )
            return None
        problems: list[str] = []
        found = self.figures((*GPU_FIGURES, FREE, LAST_XID), problems)
        xid = found.pop(LAST_XID.field)
        return GpuReading(
            index=index,
            uuid=self.uuid,
            model=self.names.get("modelName"),
            mig_enabled=True if self.instances else None,
            xid_events=(xid,) if xid else (),
            instances=self._instances(problems),
            problems=tuple(dict.fromkeys(problems)),
            **found,  # type: ignore[arg-type]
        )

    def _instances(self, gpu_problems: list[str]) -> tuple[InstanceReading, ...]:
        found = []
        for label, entity in self.instances.items():
            instance_id = _number(label)
            if instance_id is None:
                gpu_problems.append(f"MIG instance: GPU_I_ID {label!r} is not a number; skipped")
                continue
            problems: list[str] = []
            figures = entity.figures((*INSTANCE_FIGURES, FREE), problems)
            found.append(
                InstanceReading(
                    uuid="",
                    gpu_instance_id=instance_id,
                    profile=entity.labels.get("GPU_I_PROFILE") or None,
                    problems=tuple(dict.fromkeys(problems)),
                    **figures,  # type: ignore[arg-type]
                )
            )
        return tuple(sorted(found, key=lambda instance: instance.gpu_instance_id))


@dataclass
class Host:
    at: float = 0.0
    gpus: dict[str, Gpu] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    def add(self, sample: Sample) -> None:
        self.at = max(self.at, sample.at)
        uuid = sample.labels.get("UUID")
        if not uuid:
            self.problems.append(
                f"{sample.metric} of gpu {sample.labels.get('gpu', '?')}: no UUID label; skipped"
            )
            return
        self.gpus.setdefault(uuid, Gpu(uuid=uuid)).add(sample)

    def reading(self, host: str) -> Reading:
        gpus = [gpu.reading(self.problems) for gpu in self.gpus.values()]
        return Reading(
            host=host,
            at=datetime.fromtimestamp(self.at, UTC),
            gpus=tuple(sorted((gpu for gpu in gpus if gpu), key=lambda gpu: (gpu.index, gpu.uuid))),
            problems=tuple(dict.fromkeys(self.problems)),
        )


def _number(label: str | None) -> int | None:
    return int(label) if label is not None and label.isascii() and label.isdigit() else None
