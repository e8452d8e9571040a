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
from monitoring.collectors.dcgm_prometheus import DcgmPrometheusCollector
from monitoring.collectors.simulated import (
    SimulatedCollector,
    SimulatedGpu,
    SimulatedHost,
    SimulatedInstance,
)

__all__ = [
    "Collector",
    "CollectorUnavailable",
    "DcgmPrometheusCollector",
    "GpuReading",
    "InstanceReading",
    "Reading",
    "SimulatedCollector",
    "SimulatedGpu",
    "SimulatedHost",
    "SimulatedInstance",
]
