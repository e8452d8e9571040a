"""Demo data of the pools app: two simulated clusters with GPU groups, synced once."""

from pools.drivers.simulated import DEMO_FLEETS, fleet_state, seed
from pools.models import Cluster, GpuGroup, NodeCapacity, SimulatedClusterState
from pools.sync import sync_cluster

# node name prefix → GPU group of its cluster
GROUPS = {
    "h200-train": ("training", "Full H200 GPUs for training jobs"),
    "h200-serve": ("inference", "MIG-partitioned H200 for serving"),
    "h100-dev": ("development", "Small MIG instances for notebooks and development"),
    "a100-train": ("training", "Full A100 GPUs for training jobs"),
}


def load(stdout) -> None:
    for name, fleet in DEMO_FLEETS.items():
        cluster, _created = Cluster.objects.get_or_create(
            name=name, defaults={"driver": Cluster.Driver.SIMULATED}
        )
        if not SimulatedClusterState.objects.filter(cluster=cluster).exists():
            seed(cluster, fleet_state(fleet))
        report = sync_cluster(cluster=cluster)
        for prefix, _count, _model, _layouts in fleet:
            group_name, description = GROUPS[prefix]
            group, _ = GpuGroup.objects.get_or_create(
                cluster=cluster, name=group_name, defaults={"description": description}
            )
            NodeCapacity.objects.filter(cluster=cluster, name__startswith=f"{prefix}-", group=None).update(
                group=group
            )
        stdout.write(report.summary())
