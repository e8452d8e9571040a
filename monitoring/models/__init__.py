"""Models of the monitoring app: GPU samples, roll-ups, newest figures, GPU events, agent tokens."""

from monitoring.models.agents import AgentToken, CollectorStatus
from monitoring.models.alerts import Alert, AlertDelivery, AlertRule
from monitoring.models.faults import FaultNotice, GpuFault
from monitoring.models.samples import METRICS, GpuEvent, Latest, Rollup, RollupMark, Sample

__all__ = [
    "METRICS",
    "AgentToken",
    "Alert",
    "AlertDelivery",
    "AlertRule",
    "CollectorStatus",
    "FaultNotice",
    "GpuEvent",
    "GpuFault",
    "Latest",
    "Rollup",
    "RollupMark",
    "Sample",
]
