"""Models of the monitoring app: GPU samples, roll-ups, newest figures, GPU events, agent tokens, alerts,
GPU faults and the notifications about them."""

from monitoring.models.agents import AgentToken, CollectorStatus
from monitoring.models.alerts import Alert, AlertRule
from monitoring.models.faults import FaultNotice, GpuFault
from monitoring.models.notifications import Delivery
from monitoring.models.samples import METRICS, GpuEvent, Latest, Rollup, RollupMark, Sample

__all__ = [
    "METRICS",
    "AgentToken",
    "Alert",
    "AlertRule",
    "CollectorStatus",
    "Delivery",
    "FaultNotice",
    "GpuEvent",
    "GpuFault",
    "Latest",
    "Rollup",
    "RollupMark",
    "Sample",
]
