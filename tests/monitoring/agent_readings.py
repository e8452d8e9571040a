"""An agent's reading of a test node of two H100 GPUs, the second cut into two 3g.40gb instances (the node
the agent API's tests make): what its agent would post at an instant."""

from datetime import datetime

from monitoring.collectors import GpuReading, InstanceReading, Reading


def reading(node, *, at: datetime, **figures) -> Reading:
    """Both GPUs and the cut one's instances; `figures` change the whole GPU's."""
    full, cut = node.gpus.order_by("index")
    instances = tuple(
        InstanceReading(entry["uuid"], n + 1, entry["profile"], (entry["start"], 4), 1 << 30, 40 << 30, 30.0)
        for n, entry in enumerate(cut.layout)
    )
    return Reading(
        node.name,
        at,
        (
            GpuReading(0, full.uuid, "NVIDIA H100 80GB HBM3", False, **{"power_w": 300.0, **figures}),
            GpuReading(1, cut.uuid, "NVIDIA H100 80GB HBM3", True, power_w=200.0, instances=instances),
        ),
    )
