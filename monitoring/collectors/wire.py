"""Readings as JSON: the one wire format between a node agent and POST /api/v1/monitoring/samples/.

The JSON of a Reading is its struct field by field (`at` in ISO 8601 with its zone, tuples as lists,
placement as `[start, size]` or null), so the agent writes with `to_json` and the portal, once its
serializers have checked the types and ranges, reads with `from_json`. A batch is `{"readings": [...]}`.

Figures that are not finite numbers (a driver's NaN) travel as null: JSON has no NaN, and the portal
would refuse the whole batch for one.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from monitoring.collectors.base import GpuReading, InstanceReading, Reading

_FIGURES = ("power_w", "temperature_c", "utilisation_pct", "sm_active_pct")
_COUNTS = ("memory_used_bytes", "memory_total_bytes", "ecc_corrected", "ecc_uncorrected")


def _number(value: float | int | None) -> float | int | None:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _instance_to_json(instance: InstanceReading) -> dict[str, Any]:
    return {
        "uuid": instance.uuid,
        "gpu_instance_id": instance.gpu_instance_id,
        "profile": instance.profile,
        "placement": list(instance.placement) if instance.placement is not None else None,
        "memory_used_bytes": instance.memory_used_bytes,
        "memory_total_bytes": instance.memory_total_bytes,
        "sm_active_pct": _number(instance.sm_active_pct),
        "problems": list(instance.problems),
    }


def _gpu_to_json(gpu: GpuReading) -> dict[str, Any]:
    return {
        "index": gpu.index,
        "uuid": gpu.uuid,
        "model": gpu.model,
        "mig_enabled": gpu.mig_enabled,
        **{name: _number(getattr(gpu, name)) for name in (*_FIGURES, *_COUNTS)},
        "xid_events": list(gpu.xid_events),
        "problems": list(gpu.problems),
        "instances": [_instance_to_json(instance) for instance in gpu.instances],
    }


def to_json(reading: Reading) -> dict[str, Any]:
    """A Reading as a JSON-ready dict."""
    return {
        "host": reading.host,
        "at": reading.at.isoformat(),
        "gpus": [_gpu_to_json(gpu) for gpu in reading.gpus],
        "problems": list(reading.problems),
    }


def batch_to_json(readings: Iterable[Reading]) -> dict[str, Any]:
    """The body of one POST: `{"readings": [...]}`, oldest first as given."""
    return {"readings": [to_json(reading) for reading in readings]}


def _time(value: str | datetime) -> datetime:
    return value if isinstance(value, datetime) else datetime.fromisoformat(value)


def _instance_from_json(data: Mapping[str, Any]) -> InstanceReading:
    placement = data.get("placement")
    return InstanceReading(
        uuid=data["uuid"],
        gpu_instance_id=data["gpu_instance_id"],
        profile=data.get("profile"),
        placement=(placement[0], placement[1]) if placement is not None else None,
        memory_used_bytes=data.get("memory_used_bytes"),
        memory_total_bytes=data.get("memory_total_bytes"),
        sm_active_pct=data.get("sm_active_pct"),
        problems=tuple(data.get("problems") or ()),
    )


def _gpu_from_json(data: Mapping[str, Any]) -> GpuReading:
    return GpuReading(
        index=data["index"],
        uuid=data["uuid"],
        model=data.get("model"),
        mig_enabled=data.get("mig_enabled"),
        **{name: data.get(name) for name in (*_FIGURES, *_COUNTS)},
        xid_events=tuple(data.get("xid_events") or ()),
        instances=tuple(_instance_from_json(instance) for instance in data.get("instances") or ()),
        problems=tuple(data.get("problems") or ()),
    )


def from_json(data: Mapping[str, Any]) -> Reading:
    """A Reading from its JSON form (or from the same form once the portal's serializers checked it,
    where `at` is a datetime already). Assumes the shape is right: check untrusted input first."""
    return Reading(
        host=data["host"],
        at=_time(data["at"]),
        gpus=tuple(_gpu_from_json(gpu) for gpu in data.get("gpus") or ()),
        problems=tuple(data.get("problems") or ()),
    )
