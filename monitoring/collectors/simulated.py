"""The simulated collector: plausible GPU figures for a described fleet, so the demo's monitoring pages have
something to show without a GPU. Pure: no Django, no I/O; the same hosts, holdings, seed and clock give the
same readings.

Words used here:
- slot: where a pool can sit on a GPU, keyed `(gpu uuid, slot)`; slot `WHOLE_GPU` (-1) is a GPU with MIG off,
  any other slot is a MIG instance's `start` (its first memory slice).
- holding: `busy[slot] = load key`, the pool (e.g. "pool-17") that holds the slot. A slot nobody holds idles:
  SM activity under 0.5 %, memory next to nothing, power near the model's idle draw, cool.
- character: what a load key does, chosen once by a hash of (seed, load key) and never changing:
  one in 12 runs hot (SM activity 88–99 %, its GPU above 85 °C and near its power cap), two in 12 idle while
  billed (SM activity under 5 %: the portal alerts on these), the rest are busy (SM activity 40–95 %).

Figures move smoothly: a daily and an hourly sine wave per load key, plus jitter hashed from
(seed, slot, minute) and eased between minutes. Memory used follows activity within the slot's memory.
A MIG GPU's power and temperature follow its instances' activity weighted by their compute slices (they are
physical: an instance has none of its own); a hot pool on any of its instances makes the whole GPU hot.
NVML reports no utilisation on a MIG-enabled GPU, so neither does this: None, with the NVML collector's
problem line.

Counters are since the simulated driver loaded (`driver_loaded_at`, by default the first reading) and
never go down within one collector:
- corrected ECC grows at a small per-GPU rate (most GPUs a few a day at most);
- an uncorrected ECC error happens in minute m on GPU u when `uncorrected_ecc_in(u, m)`: a hash of
  (seed, u, m) is 0 modulo `ecc_one_in`. A reading counts each minute once, so at one reading a minute a
  GPU sees one in `ecc_one_in` readings; the error also reports XID 48 in that reading only.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum

from monitoring.collectors.base import GpuReading, InstanceReading, Reading
from pools.gpu_models import NoGeometry, model_info
from pools.mig import (
    COMPUTE_SLICES,
    MEMORY_SLICES,
    Instance,
    Profile,
    UnknownGpuModel,
    gpu_model,
    validate_layout,
)

WHOLE_GPU = -1
XID_DOUBLE_BIT_ECC = 48
DEFAULT_ECC_ONE_IN = 20_000
UTILISATION_NOT_SUPPORTED = "utilisation: not supported"  # as the NVML collector words it
HOT_ABOVE_C = 85.0
_DAY_S = 86_400.0
_HOUR_S = 3_600.0
_CORRECTED_PER_HOUR_MAX = 0.5


@dataclass(frozen=True)
class SimulatedInstance:
    profile: str  # a catalogue profile of its GPU's model, e.g. "3g.71gb"
    start: int  # first memory slice
    uuid: str


@dataclass(frozen=True)
class SimulatedGpu:
    index: int
    uuid: str
    model: str  # a catalogue name from pools.mig, e.g. "H200-141GB"
    mig_enabled: bool = False
    instances: tuple[SimulatedInstance, ...] = ()


@dataclass(frozen=True)
class SimulatedHost:
    name: str
    gpus: tuple[SimulatedGpu, ...] = ()


class Character(StrEnum):
    BUSY = "busy"
    IDLE = "idle"
    HOT = "hot"


@dataclass(frozen=True)
class _Hardware:
    """What the driver tells about a board of a catalogue model (SXM parts)."""

    driver_name: str
    memory_mib: int
    idle_w: float
    cap_w: float


# Memory as feature discovery reports it (the same figures as the simulated cluster driver's node labels).
_HARDWARE: dict[str, _Hardware] = {
    "A100-40GB": _Hardware("NVIDIA A100-SXM4-40GB", 40_960, 55.0, 400.0),
    "A100-80GB": _Hardware("NVIDIA A100-SXM4-80GB", 81_920, 60.0, 400.0),
    "H100-80GB": _Hardware("NVIDIA H100 80GB HBM3", 81_559, 70.0, 700.0),
    "H200-141GB": _Hardware("NVIDIA H200", 143_771, 75.0, 700.0),
    "B200-180GB": _Hardware("NVIDIA B200", 183_359, 140.0, 1000.0),
    "H100-94GB": _Hardware("NVIDIA H100 NVL", 95_830, 60.0, 400.0),
    "GH200-96GB": _Hardware("NVIDIA GH200 480GB", 97_871, 90.0, 900.0),
    "GB200-186GB": _Hardware("NVIDIA GB200", 189_471, 140.0, 1200.0),
    "L40S-48GB": _Hardware("NVIDIA L40S", 46_068, 35.0, 350.0),
}


def _hash(*parts: object) -> int:
    text = "\x1f".join(repr(part) for part in parts)
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


def _unit(*parts: object) -> float:
    """A number in [0, 1) fixed by its parts."""
    return _hash(*parts) / 2**64


def _jitter(seed: int, key: Hashable, seconds: float) -> float:
    """In [-1, 1]: a hashed value per minute, eased into the next minute's so that figures never jump."""
    minute = math.floor(seconds / 60)
    within = seconds / 60 - minute
    here = 2 * _unit(seed, "jitter", key, minute) - 1
    there = 2 * _unit(seed, "jitter", key, minute + 1) - 1
    return here + (there - here) * within * within * (3 - 2 * within)


def _wave(seconds: float, period: float, phase: float) -> float:
    return math.sin(2 * math.pi * (seconds / period + phase))


def _clamp(value: float, low: float, high: float) -> float:
    return min(high, max(low, value))


def character_of(seed: int, load_key: str) -> Character:
    roll = _hash(seed, "character", load_key) % 12
    if roll == 0:
        return Character.HOT
    return Character.IDLE if roll <= 2 else Character.BUSY


def gpu_instance_id(profile: Profile, start: int) -> int:
    """A stable GPU instance id by placement, numbered like the driver does: the full GPU 0, half GPUs 1–2,
    quarters 3–6, single slices 7–13. Instances on one GPU never share one."""
    if profile.memory_slices == MEMORY_SLICES:
        return 0
    if profile.memory_slices == 4:
        return 1 + start // 4
    if profile.memory_slices == 2:
        return 3 + start // 2
    return 7 + start


def instance_memory_bytes(model: str, profile: Profile) -> int:
    if profile.usable_memory_gib is not None:
        return int(profile.usable_memory_gib * 2**30)
    # No capture for this profile: its share of the memory slices, less about 5 % that the driver keeps
    # (the captured profiles lose 1–9 %).
    return int(_HARDWARE[model].memory_mib * profile.memory_slices / MEMORY_SLICES * 0.95) << 20


class SimulatedCollector:
    """Readings for `hosts`, one Reading each in the order given, GPUs by index, instances by start.

    `busy` may be replaced between readings as pools come and go; the counters carry on."""

    name = "simulated"

    def __init__(
        self,
        *,
        hosts: Sequence[SimulatedHost],
        busy: Mapping[tuple[str, int], str] | None = None,
        clock: Callable[[], datetime] | None = None,
        seed: int = 0,
        ecc_one_in: int = DEFAULT_ECC_ONE_IN,
        driver_loaded_at: datetime | None = None,
    ):
        if ecc_one_in < 1:
            raise ValueError(f"ecc_one_in must be at least 1 (got {ecc_one_in}).")
        if driver_loaded_at is not None and driver_loaded_at.tzinfo is None:
            raise ValueError("driver_loaded_at must be an aware datetime.")
        _check_fleet(hosts)
        self.hosts = tuple(hosts)
        self.busy: Mapping[tuple[str, int], str] = dict(busy or {})
        self.seed = seed
        self.ecc_one_in = ecc_one_in
        self._clock = clock or (lambda: datetime.now(UTC))
        self._loaded_at = driver_loaded_at
        self._corrected: dict[str, int] = {}
        self._uncorrected: dict[str, int] = {}
        self._last_minute: dict[str, int] = {}  # the latest minute whose uncorrected-ECC roll was counted

    def character(self, load_key: str) -> Character:
        return character_of(self.seed, load_key)

    def uncorrected_ecc_in(self, gpu_uuid: str, minute: int) -> bool:
        """The rule: GPU `gpu_uuid` has an uncorrected ECC error in `minute` (minutes since the epoch)."""
        return _hash(self.seed, "uncorrected", gpu_uuid, minute) % self.ecc_one_in == 0

    def readings(self) -> tuple[Reading, ...]:
        at = self._clock()
        if at.tzinfo is None:
            raise ValueError("The clock must give aware datetimes.")
        if self._loaded_at is None:
            self._loaded_at = at
        return tuple(
            Reading(
                host.name, at, tuple(self._gpu(gpu, at) for gpu in sorted(host.gpus, key=lambda g: g.index))
            )
            for host in self.hosts
        )

    def close(self) -> None:
        """Nothing is held."""

    # --- one GPU ---------------------------------------------------------------------------------

    def _gpu(self, gpu: SimulatedGpu, at: datetime) -> GpuReading:
        hardware = _HARDWARE[gpu.model]
        seconds = at.timestamp()
        total = hardware.memory_mib << 20
        if gpu.mig_enabled:
            model = gpu_model(gpu.model)
            instances = tuple(
                self._instance(gpu, model.profile(i.profile), i, seconds)
                for i in sorted(gpu.instances, key=lambda i: i.start)
            )
            compute = {i.uuid: model.profile(i.profile).compute_slices for i in gpu.instances}
            sm_active = sum((r.sm_active_pct or 0.0) * compute[r.uuid] for r in instances) / COMPUTE_SLICES
            used = sum(r.memory_used_bytes or 0 for r in instances)
            utilisation = None
            problems: tuple[str, ...] = (UTILISATION_NOT_SUPPORTED,)
            slots = [(gpu.uuid, i.start) for i in gpu.instances]
        else:
            instances = ()
            sm_active = self._activity((gpu.uuid, WHOLE_GPU), seconds)
            used = self._memory_used((gpu.uuid, WHOLE_GPU), total, sm_active)
            utilisation = float(round(_clamp(sm_active * 1.1, 0.0, 100.0)))  # NVML gives whole percents
            problems = ()
            slots = [(gpu.uuid, WHOLE_GPU)]
        holders = [self.busy[slot] for slot in slots if slot in self.busy]
        hot = any(self.character(load_key) is Character.HOT for load_key in holders)
        power, temperature = self._thermals(gpu.uuid, hardware, sm_active / 100, hot, seconds)
        corrected, uncorrected, xids = self._ecc(gpu.uuid, at)
        return GpuReading(
            index=gpu.index,
            uuid=gpu.uuid,
            model=hardware.driver_name,
            mig_enabled=gpu.mig_enabled,
            power_w=power,
            temperature_c=temperature,
            utilisation_pct=utilisation,
            sm_active_pct=round(sm_active, 2),
            memory_used_bytes=used,
            memory_total_bytes=total,
            ecc_corrected=corrected,
            ecc_uncorrected=uncorrected,
            xid_events=xids,
            instances=instances,
            problems=problems,
        )

    def _instance(
        self, gpu: SimulatedGpu, profile: Profile, instance: SimulatedInstance, seconds: float
    ) -> InstanceReading:
        slot = (gpu.uuid, instance.start)
        total = instance_memory_bytes(gpu.model, profile)
        activity = self._activity(slot, seconds)
        return InstanceReading(
            uuid=instance.uuid,
            gpu_instance_id=gpu_instance_id(profile, instance.start),
            profile=profile.name,
            placement=(instance.start, profile.memory_slices),
            memory_used_bytes=self._memory_used(slot, total, activity),
            memory_total_bytes=total,
            sm_active_pct=activity,
        )

    # --- figures -----------------------------------------------------------------------------------

    def _activity(self, slot: tuple[str, int], seconds: float) -> float:
        """SM activity of a slot, in percent."""
        jitter = _jitter(self.seed, slot, seconds)
        load_key = self.busy.get(slot)
        if load_key is None:
            return round(_clamp(0.15 + 0.15 * jitter, 0.0, 0.5), 2)
        daily = _wave(seconds, _DAY_S, _unit(self.seed, "daily", load_key))
        hourly = _wave(seconds, _HOUR_S, _unit(self.seed, "hourly", load_key))
        character = self.character(load_key)
        if character is Character.HOT:
            value = _clamp(93 + 2 * hourly + 1.5 * jitter, 88.0, 99.0)
        elif character is Character.IDLE:
            value = _clamp(1.5 + daily + 0.5 * hourly + 0.5 * jitter, 0.0, 4.5)
        else:
            level = 55 + 25 * _unit(self.seed, "level", load_key)
            value = _clamp(level + 10 * daily + 4 * hourly + 2.5 * jitter, 40.0, 95.0)
        return round(value, 2)

    def _memory_used(self, slot: tuple[str, int], total: int, activity: float) -> int:
        load_key = self.busy.get(slot)
        fill = 1.0 if load_key is None else 0.8 + 0.15 * _unit(self.seed, "fill", load_key)
        return int(total * activity / 100 * fill)

    def _thermals(
        self, gpu_uuid: str, hardware: _Hardware, load: float, hot: bool, seconds: float
    ) -> tuple[float, float]:
        """Power (W) and temperature (°C) of a GPU from its load in [0, 1]."""
        jitter = _jitter(self.seed, ("thermal", gpu_uuid), seconds)
        if hot:
            hourly = _wave(seconds, _HOUR_S, _unit(self.seed, "hot", gpu_uuid))
            power = hardware.cap_w * (0.955 + 0.025 * jitter)
            temperature = 89 + 2 * hourly + 0.5 * jitter
        else:
            span = hardware.cap_w - hardware.idle_w
            power = _clamp(
                hardware.idle_w + 0.9 * span * load + 4 * jitter, 0.8 * hardware.idle_w, hardware.cap_w
            )
            temperature = 31 + 42 * load + jitter
        return round(power, 1), float(round(temperature))

    def _ecc(self, gpu_uuid: str, at: datetime) -> tuple[int, int, tuple[int, ...]]:
        """Corrected and uncorrected counts since the driver loaded, and the XIDs new in this reading."""
        hours = max(0.0, (at - (self._loaded_at or at)).total_seconds() / 3600)
        rate = _CORRECTED_PER_HOUR_MAX * _unit(self.seed, "corrected rate", gpu_uuid) ** 3
        before = int(4 * _unit(self.seed, "corrected base", gpu_uuid) ** 4)
        corrected = max(self._corrected.get(gpu_uuid, 0), before + int(rate * hours))
        self._corrected[gpu_uuid] = corrected
        xids: tuple[int, ...] = ()
        minute = math.floor(at.timestamp() / 60)
        if minute > self._last_minute.get(
            gpu_uuid, minute - 1
        ):  # each minute once; a clock going back adds none
            self._last_minute[gpu_uuid] = minute
            if self.uncorrected_ecc_in(gpu_uuid, minute):
                self._uncorrected[gpu_uuid] = self._uncorrected.get(gpu_uuid, 0) + 1
                xids = (XID_DOUBLE_BIT_ECC,)
        return corrected, self._uncorrected.get(gpu_uuid, 0), xids


def _check_fleet(hosts: Sequence[SimulatedHost]) -> None:
    """Refuse a fleet no real one could be: unknown models, impossible MIG layouts, repeated names."""
    seen_hosts: set[str] = set()
    seen_uuids: set[str] = set()
    for host in hosts:
        if not host.name or host.name in seen_hosts:
            raise ValueError(f"Host names must be given and unique (got {host.name!r} twice or empty).")
        seen_hosts.add(host.name)
        indexes = [gpu.index for gpu in host.gpus]
        if len(set(indexes)) != len(indexes):
            raise ValueError(f"{host.name}: two GPUs share an index ({sorted(indexes)}).")
        for gpu in host.gpus:
            model = model_info(gpu.model)  # UnknownGpuModel for a name that is no model's
            if gpu.model not in _HARDWARE:
                raise UnknownGpuModel(f"{host.name} GPU {gpu.index}: no simulated board for {gpu.model}.")
            if not gpu.mig_enabled and gpu.instances:
                raise ValueError(f"{host.name} GPU {gpu.index}: MIG instances on a GPU with MIG off.")
            if gpu.mig_enabled:
                try:
                    validate_layout(model.geometry(), [Instance(i.start, i.profile) for i in gpu.instances])
                except NoGeometry as error:
                    raise ValueError(f"{host.name} GPU {gpu.index}: {error}") from None
            for uuid in (gpu.uuid, *(i.uuid for i in gpu.instances)):
                if not uuid or uuid in seen_uuids:
                    raise ValueError(f"{host.name} GPU {gpu.index}: UUID {uuid!r} is empty or used twice.")
                seen_uuids.add(uuid)
