"""Models of the monitoring app: GPU samples, roll-ups, newest figures, GPU events, agent tokens."""

from monitoring.models.agents import AgentToken, CollectorStatus
from monitoring.models.samples import METRICS, GpuEvent, Latest, Rollup, RollupMark, Sample

__all__ = ["METRICS", "AgentToken", "CollectorStatus", "GpuEvent", "Latest", "Rollup", "RollupMark", "Sample"]
