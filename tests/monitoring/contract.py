"""The collector contract as one check for every collector's tests: `assert_honours_contract(collector)`.

It reads once and checks what any consumer of a Reading relies on: the types, the units in range, memory used
within memory total, counters that are counts, MIG placements that the GPU's model can hold (pools/mig.py),
and a `close()` that can be called twice. Figures may be None (a collector says why in `problems`); a figure
that is given must make sense.
"""

from __future__ import annotations

from datetime import datetime

from monitoring.collectors import Collector, GpuReading, InstanceReading, Reading
from pools.gpu_models import model_from_node_labels
from pools.mig import (
    MEMORY_SLICES,
    Instance,
    UnknownGpuModel,
    gpu_model,
    layout_errors,
)

MAX_TEMPERATURE_C = 120  # a GPU throttles, then shuts down, well below this
MAX_POWER_W = 1500  # above any board's cap


def assert_honours_contract(collector: Collector) -> tuple[Reading, ...]:
    """Reads `collector` once, checks the readings, closes it twice; returns the readings for more checks."""
    assert isinstance(collector.name, str) and collector.name, "a collector has a name"
    readings = collector.readings()
    assert isinstance(readings, tuple), f"readings() gives a tuple, not {type(readings).__name__}"
    hosts = [reading.host for reading in readings]
    assert len(set(hosts)) == len(hosts), f"one Reading per host: {hosts}"
    for reading in readings:
        _check_reading(reading)
    collector.close()
    collector.close()
    return readings


def _check_reading(reading: Reading) -> None:
    assert isinstance(reading, Reading), f"a Reading, not {type(reading).__name__}"
    assert isinstance(reading.host, str) and reading.host, "a Reading names its host"
    assert isinstance(reading.at, datetime) and reading.at.utcoffset() is not None, (
        f"{reading.host}: aware `at`"
    )
    _check_problems(reading.problems, reading.host)
    assert isinstance(reading.gpus, tuple), f"{reading.host}: gpus is a tuple"
    indexes = [gpu.index for gpu in reading.gpus]
    assert len(set(indexes)) == len(indexes), f"{reading.host}: GPU indexes repeat: {indexes}"
    for gpu in reading.gpus:
        _check_gpu(gpu, f"{reading.host} GPU {gpu.index}")


def _check_gpu(gpu: GpuReading, where: str) -> None:
    assert isinstance(gpu, GpuReading), f"{where}: a GpuReading, not {type(gpu).__name__}"
    assert isinstance(gpu.index, int) and gpu.index >= 0, f"{where}: index {gpu.index!r}"
    assert isinstance(gpu.uuid, str), f"{where}: uuid {gpu.uuid!r}"
    assert gpu.uuid or gpu.problems, f"{where}: a GPU without a UUID says why"
    _check_problems(gpu.problems, where)
    _check_percent(gpu.utilisation_pct, f"{where} utilisation")
    _check_percent(gpu.sm_active_pct, f"{where} SM activity")
    if gpu.temperature_c is not None:
        assert _number(gpu.temperature_c) and 0 < gpu.temperature_c < MAX_TEMPERATURE_C, (
            f"{where}: temperature {gpu.temperature_c!r} °C"
        )
    if gpu.power_w is not None:
        assert _number(gpu.power_w) and 0 <= gpu.power_w <= MAX_POWER_W, f"{where}: power {gpu.power_w!r} W"
    _check_memory(gpu.memory_used_bytes, gpu.memory_total_bytes, where)
    for name, count in (("corrected ECC", gpu.ecc_corrected), ("uncorrected ECC", gpu.ecc_uncorrected)):
        assert count is None or (isinstance(count, int) and count >= 0), f"{where}: {name} {count!r}"
    assert isinstance(gpu.xid_events, tuple), f"{where}: xid_events is a tuple"
    assert all(isinstance(xid, int) and xid > 0 for xid in gpu.xid_events), f"{where}: XIDs {gpu.xid_events}"
    assert isinstance(gpu.instances, tuple), f"{where}: instances is a tuple"
    assert not (gpu.instances and gpu.mig_enabled is False), f"{where}: MIG instances on a GPU with MIG off"
    for instance in gpu.instances:
        _check_instance(instance, f"{where} instance {instance.uuid or instance.gpu_instance_id}")
    uuids = [instance.uuid for instance in gpu.instances if instance.uuid]
    assert len(set(uuids)) == len(uuids), f"{where}: instance UUIDs repeat: {uuids}"
    _check_placements(gpu, where)


def _check_instance(instance: InstanceReading, where: str) -> None:
    assert isinstance(instance, InstanceReading), (
        f"{where}: an InstanceReading, not {type(instance).__name__}"
    )
    assert isinstance(instance.uuid, str), f"{where}: uuid {instance.uuid!r}"
    assert isinstance(instance.gpu_instance_id, int), f"{where}: GPU instance id {instance.gpu_instance_id!r}"
    _check_problems(instance.problems, where)
    _check_percent(instance.sm_active_pct, f"{where} SM activity")
    _check_memory(instance.memory_used_bytes, instance.memory_total_bytes, where)
    if instance.placement is not None:
        start, size = instance.placement
        assert start >= 0 and size >= 1 and start + size <= MEMORY_SLICES, (
            f"{where}: placement {instance.placement}"
        )


def _check_placements(gpu: GpuReading, where: str) -> None:
    """No two instances share a memory slice; where the model is known, the layout is one it can hold."""
    placed = [instance for instance in gpu.instances if instance.placement is not None]
    taken: list[int] = []
    for instance in placed:
        start, size = instance.placement  # type: ignore[misc]
        taken.extend(range(start, start + size))
    assert len(set(taken)) == len(taken), f"{where}: instances overlap: {[i.placement for i in placed]}"
    memory_mib = None if gpu.memory_total_bytes is None else gpu.memory_total_bytes >> 20
    try:
        model = gpu_model(model_from_node_labels(gpu.model or "", memory_mib))
    except UnknownGpuModel:
        return  # a model outside the catalogue: the geometry above is all we can check
    for instance in placed:
        if instance.profile is None:
            continue
        assert instance.profile in model.profiles, (
            f"{where}: {model.name} has no profile {instance.profile!r}"
        )
        size = model.profiles[instance.profile].memory_slices
        assert instance.placement[1] == size, f"{where}: {instance.profile} takes {size} slices"  # type: ignore[index]
    layout = [Instance(i.placement[0], i.profile) for i in placed if i.profile is not None]  # type: ignore[index]
    assert layout_errors(model, layout) == [], f"{where}: {layout_errors(model, layout)}"


def _check_problems(problems: tuple[str, ...], where: str) -> None:
    assert isinstance(problems, tuple), f"{where}: problems is a tuple"
    for problem in problems:
        assert isinstance(problem, str) and problem and "\n" not in problem, f"{where}: problem {problem!r}"


def _check_percent(value: float | None, where: str) -> None:
    assert value is None or (_number(value) and 0 <= value <= 100), f"{where}: {value!r} is not a percent"


def _check_memory(used: int | None, total: int | None, where: str) -> None:
    assert used is None or (isinstance(used, int) and used >= 0), f"{where}: memory used {used!r}"
    assert total is None or (isinstance(total, int) and total > 0), f"{where}: memory total {total!r}"
    if used is not None and total is not None:
        assert used <= total, f"{where}: memory used {used} above total {total}"


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)
