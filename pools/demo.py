"""Demo data of the pools app: two simulated clusters with GPU groups, and a few pool requests."""

from pools.drivers.device_plugin import config_key
from pools.drivers.simulated import DEMO_FLEETS, fleet_state, seed
from pools.kinds import DEFAULT_OFFERS
from pools.models import Cluster, GpuGroup, NodeCapacity, SimulatedClusterState
from pools.services import sync_inventory

# node name prefix → GPU group of its cluster, and what the group offers
GROUPS = {
    "h200-train": ("training", "Full H200 GPUs for training jobs", DEFAULT_OFFERS),
    "h200-serve": ("inference", "MIG-partitioned H200 for serving", DEFAULT_OFFERS),
    "l40s-serve": (
        "shared-inference",
        "L40S GPUs in time-sliced quarters for light serving",
        ("whole", "ts-4"),
    ),
    "h100-dev": ("development", "Small MIG instances for notebooks and development", DEFAULT_OFFERS),
    "a100-train": ("training", "Full A100 GPUs for training jobs", DEFAULT_OFFERS),
    "a100-share": ("notebooks", "A100 GPUs in MPS halves for notebooks", ("whole", "mps-2")),
}
# node name prefix → the share mode its MIG-off GPUs start in
SHARED = {"l40s-serve": "ts-4", "a100-share": "mps-2"}


def load(stdout) -> None:
    for name, fleet in DEMO_FLEETS.items():
        cluster, _created = Cluster.objects.get_or_create(
            name=name, defaults={"driver": Cluster.Driver.SIMULATED}
        )
        if not SimulatedClusterState.objects.filter(cluster=cluster).exists():
            seed(cluster, _shared(fleet_state(fleet)))
        report = sync_inventory(cluster=cluster)
        for prefix, _count, _model, _layouts in fleet:
            group_name, description, offers = GROUPS[prefix]
            group, _ = GpuGroup.objects.get_or_create(
                cluster=cluster,
                name=group_name,
                defaults={"description": description, "offers": list(offers)},
            )
            NodeCapacity.objects.filter(cluster=cluster, name__startswith=f"{prefix}-", group=None).update(
                group=group
            )
        stdout.write(report.summary() if report else f"{cluster.name}: a sync is already running")
    _demo_requests()


def _shared(state: dict) -> dict:
    """The simulated cluster, its shared nodes in their share mode as their device plugin was told."""
    for name, node in state["nodes"].items():
        sharing = SHARED.get(name.rsplit("-", 1)[0])
        if sharing:
            node["sharing"], node["sharing_config"] = sharing, config_key(sharing)
    return state


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
    demo_bot = submit_request(
        project=projects["llm-serving"],
        user=people["alice"],
        items=[("l40s-48gb.ts-4", 2)],
        purpose="shared-inference",
        justification="A small demo bot: two time-sliced quarters of an L40S are plenty.",
    )
    for request in (serving, recsys, demo_bot):
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
