"""Collectors: what each GPU (and each MIG instance) of a host reads now, behind one protocol.

This package is the only place that imports `pynvml`; nothing in it needs Django.
"""

from monitoring.collectors.base import (
    Collector,
    CollectorUnavailable,
    GpuReading,
    InstanceReading,
    Reading,
)

__all__ = ["Collector", "CollectorUnavailable", "GpuReading", "InstanceReading", "Reading"]
