"""Demo data of the pools app: two simulated clusters with GPU groups, and a few pool requests."""

from pools.drivers.simulated import DEMO_FLEETS, fleet_state, seed
from pools.models import Cluster, GpuGroup, NodeCapacity, SimulatedClusterState
from pools.services import sync_inventory

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
        report = sync_inventory(cluster=cluster)
        for prefix, _count, _model, _layouts in fleet:
            group_name, description = GROUPS[prefix]
            group, _ = GpuGroup.objects.get_or_create(
                cluster=cluster, name=group_name, defaults={"description": description}
            )
            NodeCapacity.objects.filter(cluster=cluster, name__startswith=f"{prefix}-", group=None).update(
                group=group
            )
        stdout.write(report.summary() if report else f"{cluster.name}: a sync is already running")
    _demo_requests()


def _demo_requests() -> None:
    """A few requests in several states, so that approvers and tenants have something to look at."""
    from django.contrib.auth import get_user_model

    from pools.models import PoolRequest
    from pools.services import admit_waiting, approve_request, submit_request
    from portal.models import Project

    if PoolRequest.objects.exists():
        return
    people = {
        u.username: u
        for u in get_user_model().objects.filter(username__in=["alice", "bob", "mallory", "carol"])
    }
    projects = {p.slug: p for p in Project.objects.filter(slug__in=["llm-serving", "vision", "recsys"])}
    if len(people) < 4 or len(projects) < 3:
        return
    serving = submit_request(
        project=projects["llm-serving"],
        user=people["alice"],
        items=[("h200-141gb.mig-3g.71gb", 2), ("h200-141gb.mig-1g.18gb", 4)],
        purpose="inference",
        justification="Serving the chat model to the support team.",
    )
    recsys = submit_request(
        project=projects["recsys"],
        user=people["mallory"],
        items=[("a100-80gb.full", 4)],
        purpose="training",
        justification="Weekly retraining of the recommender.",
        hold_seconds=14 * 86400,  # ends two weeks after admission: reminded before, then released by itself
    )
    for request in (serving, recsys):
        approve_request(request_id=request.pk, approver=people["carol"])
    admit_waiting()  # the worker provisions them once it runs
    submit_request(
        project=projects["vision"],
        user=people["bob"],
        items=[("h200-141gb.full", 8)],
        purpose="training",
        justification="Fine-tuning the detector on the new data set.",
        hold_seconds=7 * 86400,
    )
