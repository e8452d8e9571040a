"""A pool end to end on a real-HTTP cluster: MIG label set and observed, namespace and quota created."""

import time
from contextlib import contextmanager

import pytest

from pools.models import Cluster, Pool, PoolState, SpecAndCount
from pools.services import admit_waiting, approve_request, finish_release, provision_step, submit_request
from pools.services.inventory import sync_inventory
from pools.services.provisioning import DONE
from tests.factories import ClusterFactory
from tests.kube.server import KubeApiServer


@pytest.fixture
def kube_cluster(db, tmp_path):
    with KubeApiServer(mig_apply_seconds=0.05) as server:
        server.add_gpu_node("gpu-1", product="NVIDIA-H100-80GB-HBM3", memory_mib=81559)
        cluster = ClusterFactory(
            name="kube",
            driver=Cluster.Driver.KUBERNETES,
            kubeconfig=server.write_kubeconfig(tmp_path / "kubeconfig").read_text(),
        )
        sync_inventory(cluster=cluster)
        yield server, cluster


def provision(pool: Pool) -> None:
    deadline = time.monotonic() + 15
    while provision_step(pool_id=pool.pk) != DONE:
        assert time.monotonic() < deadline, "provisioning did not finish"
        time.sleep(0.05)


def admitted_pool(tenancy, staff_user, items):
    """A member's API clients, an approver's, and the pool the member asked for through the API on the
    cluster `kube`, approved and admitted as the tasks would, not provisioned yet."""
    from rest_framework.test import APIClient

    member, approver = APIClient(), APIClient()
    member.force_authenticate(tenancy.acme_member)
    approver.force_authenticate(staff_user("approver"))
    asked = member.post(
        "/api/v1/pool-requests/",
        {"project": tenancy.vision.pk, "items": items, "cluster": "kube"},
        format="json",
    ).json()
    assert (
        approver.post(f"/api/v1/pool-requests/{asked['id']}/approve/", {}, format="json").status_code == 200
    )
    admit_waiting()  # what the queue task runs after the approval
    return member, approver, Pool.objects.get(request_id=asked["id"])


def api_pool(tenancy, staff_user, items):
    """`admitted_pool`, then provisioned as the provisioning task repeats it."""
    member, approver, pool = admitted_pool(tenancy, staff_user, items)
    provision(pool)
    return member, approver, pool


def test_a_mig_pool_on_kubernetes_through_the_api(kube_cluster, tenancy, staff_user):

    server, _cluster = kube_cluster
    member, _approver, pool = api_pool(tenancy, staff_user, [{"spec": "h100-80gb.mig-3g.40gb", "count": 2}])
    shown = member.get(f"/api/v1/pools/{pool.pk}/").json()
    assert shown["state"] == "active" and [a["profile"] for a in shown["allocations"]] == [
        "3g.40gb",
        "3g.40gb",
    ]
    node = server.get("Node", "gpu-1")
    assert (
        node["metadata"]["labels"]["nvidia.com/mig.config"]
        == Pool.objects.get(pk=pool.pk).mig_configs["gpu-1"]
    )
    assert node["metadata"]["labels"]["nvidia.com/mig.config.state"] == "success"
    assert node["status"]["capacity"]["nvidia.com/mig-3g.40gb"] == "2"
    assert server.get("Namespace", "acme-vision") is not None
    quota = server.get("ResourceQuota", "gpu-portal", "acme-vision")
    assert quota["spec"]["hard"] == {"requests.nvidia.com/mig-3g.40gb": "2"}

    assert member.post(f"/api/v1/pools/{pool.pk}/release/").json()["state"] == "releasing"
    finish_release(pool_id=pool.pk)  # what the release task runs
    assert server.get("ResourceQuota", "gpu-portal", "acme-vision") is None
    assert member.get(f"/api/v1/pools/{pool.pk}/").json()["state"] == "released"


def test_an_api_error_during_provisioning_fails_the_pool_cleanly(kube_cluster, tenancy, staff_user):
    server, _cluster = kube_cluster
    request = submit_request(project=tenancy.vision, user=tenancy.acme_member, items=[("h100-80gb.full", 1)])
    approve_request(request_id=request.pk, approver=staff_user("approver"))
    admit_waiting()
    pool = Pool.objects.get(request=request)
    server.fail_requests(422, count=10)  # the API server refuses what we send
    assert provision_step(pool_id=pool.pk) == "failed"
    pool.refresh_from_db()
    assert pool.state == PoolState.FAILED and "422" in pool.failure_reason
    assert not pool.allocations.filter(released_at=None).exists()


def test_a_pool_whose_namespace_belongs_to_someone_else_fails_and_gives_its_capacity_back(
    kube_cluster, tenancy, staff_user, api_for
):
    server, _cluster = kube_cluster
    server.add_namespace("acme-vision", labels={"team": "platform"})  # made outside the portal
    request = submit_request(project=tenancy.vision, user=tenancy.acme_member, items=[("h100-80gb.full", 2)])
    approve_request(request_id=request.pk, approver=staff_user("approver"))
    admit_waiting()
    pool = Pool.objects.get(request=request)
    assert SpecAndCount.objects.get(resource_name="nvidia.com/gpu").allocated == 2

    assert provision_step(pool_id=pool.pk) == "failed"
    pool.refresh_from_db()
    assert pool.state == PoolState.FAILED
    assert "acme-vision already exists" in pool.failure_reason
    assert "not created by the portal" in pool.failure_reason
    assert not pool.allocations.filter(released_at=None).exists()
    assert SpecAndCount.objects.get(resource_name="nvidia.com/gpu").allocated == 0
    assert server.get("Namespace", "acme-vision")["metadata"]["labels"] == {
        "team": "platform",
        "kubernetes.io/metadata.name": "acme-vision",
    }
    assert server.get("ResourceQuota", "gpu-portal", "acme-vision") is None
    assert pool.events.get(to_state="failed").reason == pool.failure_reason
    shown = api_for(tenancy.acme_member).get(f"/api/v1/pools/{pool.pk}/").json()  # what the tenant sees
    assert shown["state"] == "failed" and shown["failure_reason"] == pool.failure_reason


def test_a_pool_grows_and_shrinks_on_kubernetes_quota_and_metering_following(
    kube_cluster, tenancy, staff_user
):
    from datetime import timedelta

    from billing.metering import whole_seconds
    from billing.models import UsageRecord
    from billing.services import meter
    from pools.models import Allocation
    from pools.services.replacement import settle_move

    server, _cluster = kube_cluster
    member, approver, pool = api_pool(tenancy, staff_user, [{"spec": "h100-80gb.mig-3g.40gb", "count": 2}])

    # Grow by a profile the node does not have yet: a request of its own, placed like any, joining the pool.
    growth = member.post(
        f"/api/v1/pools/{pool.pk}/resize/",
        {"add": [{"spec": "h100-80gb.mig-1g.10gb", "count": 2}]},
        format="json",
    )
    assert (
        growth.status_code == 201 and growth.json()["kind"] == "resize" and growth.json()["pool"] == pool.pk
    )
    approver.post(f"/api/v1/pool-requests/{growth.json()['id']}/approve/", {}, format="json")
    admit_waiting()
    deadline = time.monotonic() + 15
    while settle_move(pool_id=pool.pk) != DONE:  # what the settling task repeats
        assert time.monotonic() < deadline, "the growth did not settle"
        time.sleep(0.05)
    quota = server.get("ResourceQuota", "gpu-portal", "acme-vision")
    assert quota["spec"]["hard"] == {
        "requests.nvidia.com/mig-3g.40gb": "2",
        "requests.nvidia.com/mig-1g.10gb": "2",
    }
    shown = member.get(f"/api/v1/pools/{pool.pk}/").json()
    assert sorted(a["profile"] for a in shown["allocations"]) == ["1g.10gb", "1g.10gb", "3g.40gb", "3g.40gb"]
    node = server.get("Node", "gpu-1")  # the node was asked for its new layout, not taken as done before
    assert (
        node["metadata"]["labels"]["nvidia.com/mig.config"]
        == Pool.objects.get(pk=pool.pk).mig_configs["gpu-1"]
    )
    assert int(node["status"]["capacity"]["nvidia.com/mig-1g.10gb"]) >= 2

    # Shrink: the quota is lowered, then those instances are free; the pool keeps the rest.
    given = [a["id"] for a in shown["allocations"] if a["profile"] == "3g.40gb"][:1]
    shrunk = member.post(f"/api/v1/pools/{pool.pk}/resize/", {"release_allocations": given}, format="json")
    assert shrunk.status_code == 200, shrunk.content
    assert len(shrunk.json()["allocations"]) == 3
    quota = server.get("ResourceQuota", "gpu-portal", "acme-vision")
    assert quota["spec"]["hard"] == {
        "requests.nvidia.com/mig-3g.40gb": "1",
        "requests.nvidia.com/mig-1g.10gb": "2",
    }
    assert {i["spec"]: i["count"] for i in shrunk.json()["items"]} == {
        "h100-80gb.mig-3g.40gb": 1,
        "h100-80gb.mig-1g.10gb": 2,
    }

    member.post(f"/api/v1/pools/{pool.pk}/release/")
    finish_release(pool_id=pool.pk)
    pool.refresh_from_db()
    meter(now=pool.released_at + timedelta(days=1))
    held = Allocation.objects.filter(pool=pool)
    assert held.count() == 4 and not held.filter(released_at=None).exists()
    exact = sum(whole_seconds(a.released_at) - whole_seconds(a.allocated_at) for a in held)
    assert sum(UsageRecord.objects.filter(pool=pool).values_list("seconds", flat=True)) == exact


@pytest.fixture
def shared_cluster(db, tmp_path):
    """An L40S node (no MIG) in a group that offers whole GPUs and time-sliced quarters."""
    with grouped_node(
        tmp_path, "l40s-1", "inference", ["whole", "ts-4"], product="NVIDIA-L40S", memory_mib=46068
    ) as found:
        yield found


@contextmanager
def grouped_node(tmp_path, node: str, group: str, offers: list[str], **gpu_node):
    """The cluster `kube` over HTTP with one node of 2 GPUs (`gpu_node`: its product, memory), synced, in a
    GPU group offering `offers`; yields the server and the cluster."""
    from pools.models import GpuGroup, NodeCapacity
    from pools.services import set_node_group

    with KubeApiServer(mig_apply_seconds=0.05) as server:
        server.add_gpu_node(node, gpus=2, mig_capable=gpu_node.pop("mig_capable", False), **gpu_node)
        cluster = ClusterFactory(
            name="kube",
            driver=Cluster.Driver.KUBERNETES,
            kubeconfig=server.write_kubeconfig(tmp_path / "kubeconfig").read_text(),
        )
        sync_inventory(cluster=cluster)
        made = GpuGroup.objects.create(cluster=cluster, name=group, offers=offers)
        set_node_group(node=NodeCapacity.objects.get(name=node), group=made)
        yield server, cluster


def test_a_time_sliced_pool_on_kubernetes_shares_the_node_and_counts_shares_in_the_quota(
    shared_cluster, tenancy, staff_user
):
    server, _cluster = shared_cluster
    member, _approver, pool = api_pool(tenancy, staff_user, [{"spec": "l40s-48gb.ts-4", "count": 3}])
    shown = member.get(f"/api/v1/pools/{pool.pk}/").json()
    assert shown["state"] == "active"
    assert sorted((a["profile"], a["start"]) for a in shown["allocations"]) == [
        ("ts-4", 0),
        ("ts-4", 1),
        ("ts-4", 2),
    ]
    node = server.get("Node", "l40s-1")
    assert node["metadata"]["labels"]["nvidia.com/device-plugin.config"] == "portal-ts-4"
    assert node["metadata"]["labels"]["nvidia.com/gpu.sharing-strategy"] == "time-slicing"
    assert node["status"]["allocatable"]["nvidia.com/gpu.shared"] == "8"  # 2 GPUs × 4
    quota = server.get("ResourceQuota", "gpu-portal", "acme-vision")
    assert quota["spec"]["hard"] == {"requests.nvidia.com/gpu.shared": "3"}

    # The node is in quarters now: a whole GPU waits until its last share is given back, then the node's
    # sharing is turned off for it.
    from pools.models import PoolRequest

    asked = member.post(
        "/api/v1/pool-requests/",
        {"project": tenancy.vision.pk, "items": [{"spec": "l40s-48gb.full", "count": 1}], "cluster": "kube"},
        format="json",
    ).json()
    staff = staff_user("approver")
    approve_request(request_id=asked["id"], approver=staff)
    admit_waiting()
    waiting = PoolRequest.objects.get(pk=asked["id"])
    assert not Pool.objects.filter(request=waiting).exists()
    assert "needs 1 × full L40S-48GB; 0 free" in waiting.waiting_reason
    member.post(f"/api/v1/pools/{pool.pk}/release/")
    finish_release(pool_id=pool.pk)
    admit_waiting()
    whole = Pool.objects.get(request_id=asked["id"])
    provision(whole)
    labels = server.get("Node", "l40s-1")["metadata"]["labels"]
    assert labels["nvidia.com/device-plugin.config"] == "portal-none"
    assert labels["nvidia.com/gpu.sharing-strategy"] == "none"
    assert server.get("ResourceQuota", "gpu-portal", "acme-vision")["spec"]["hard"] == {
        "requests.nvidia.com/gpu": "1"
    }


def test_a_node_whose_device_plugin_never_applies_the_sharing_fails_the_pool_cleanly(
    shared_cluster, tenancy, staff_user, settings
):
    from pools.models import Allocation

    server, _cluster = shared_cluster
    server.set_device_plugin_outcome("l40s-1", "stall")
    settings.MIG_PENDING_TIMEOUT_SECONDS = 0
    _member, _approver, pool = admitted_pool(tenancy, staff_user, [{"spec": "l40s-48gb.ts-4", "count": 1}])
    deadline = time.monotonic() + 15
    while (outcome := provision_step(pool_id=pool.pk)) == "waiting":
        assert time.monotonic() < deadline
        time.sleep(0.05)
    pool.refresh_from_db()
    assert outcome == "failed" and pool.state == PoolState.FAILED
    assert "device plugin on l40s-1 has not shared its GPUs as ts-4" in pool.failure_reason
    assert not Allocation.objects.filter(pool=pool, released_at__isnull=True).exists()


def test_an_mps_pool_on_kubernetes_takes_halves_of_two_gpus(db, tmp_path, tenancy, staff_user):
    with grouped_node(
        tmp_path,
        "a100-1",
        "notebooks",
        ["mig", "mps-2"],
        product="NVIDIA-A100-SXM4-80GB",
        memory_mib=81920,
        mig_capable=True,
    ) as (server, _cluster):
        member, _approver, pool = api_pool(tenancy, staff_user, [{"spec": "a100-80gb.mps-2", "count": 3}])
        shown = member.get(f"/api/v1/pools/{pool.pk}/").json()
        assert shown["state"] == "active"
        assert sorted(a["profile"] for a in shown["allocations"]) == ["mps-2"] * 3
        assert len({a["gpu_index"] for a in shown["allocations"]}) == 2  # both halves of one GPU, one of two
        labels = server.get("Node", "a100-1")["metadata"]["labels"]
        assert (labels["nvidia.com/device-plugin.config"], labels["nvidia.com/gpu.sharing-strategy"]) == (
            "portal-mps-2",
            "mps",
        )
        assert server.get("ResourceQuota", "gpu-portal", "acme-vision")["spec"]["hard"] == {
            "requests.nvidia.com/gpu.shared": "3"
        }
        # the group offers no whole GPUs: asking for one is refused, saying what is offered
        refused = member.post(
            "/api/v1/pool-requests/",
            {
                "project": tenancy.vision.pk,
                "items": [{"spec": "a100-80gb.full", "count": 1}],
                "cluster": "kube",
            },
            format="json",
        )
        assert refused.status_code == 400


def test_a_node_s_sharing_is_asked_for_only_once_a_mig_change_there_is_done(
    shared_cluster, tenancy, staff_user, tmp_path
):
    from tests.kube.client import connect

    server, _cluster = shared_cluster
    core = connect(server, tmp_path)
    core.patch_node("l40s-1", {"metadata": {"labels": {"nvidia.com/mig.config.state": "pending"}}})
    _member, _approver, pool = admitted_pool(tenancy, staff_user, [{"spec": "l40s-48gb.ts-4", "count": 1}])
    assert provision_step(pool_id=pool.pk) == "waiting"
    assert "nvidia.com/device-plugin.config" not in server.get("Node", "l40s-1")["metadata"]["labels"]
    core.patch_node("l40s-1", {"metadata": {"labels": {"nvidia.com/mig.config.state": "success"}}})
    provision(pool)
    assert (
        server.get("Node", "l40s-1")["metadata"]["labels"]["nvidia.com/device-plugin.config"] == "portal-ts-4"
    )


def test_a_growth_onto_another_node_puts_that_node_in_the_share_mode(shared_cluster, tenancy, staff_user):
    from pools.models import GpuGroup, NodeCapacity
    from pools.services import set_node_group
    from pools.services.replacement import settle_move

    server, cluster = shared_cluster
    server.add_gpu_node("l40s-2", gpus=1, product="NVIDIA-L40S", memory_mib=46068, mig_capable=False)
    sync_inventory(cluster=cluster)
    set_node_group(node=NodeCapacity.objects.get(name="l40s-2"), group=GpuGroup.objects.get(name="inference"))
    member, approver, pool = api_pool(tenancy, staff_user, [{"spec": "l40s-48gb.ts-4", "count": 8}])
    growth = member.post(
        f"/api/v1/pools/{pool.pk}/resize/", {"add": [{"spec": "l40s-48gb.ts-4", "count": 1}]}, format="json"
    ).json()
    approver.post(f"/api/v1/pool-requests/{growth['id']}/approve/", {}, format="json")
    admit_waiting()
    deadline = time.monotonic() + 15
    while settle_move(pool_id=pool.pk) != DONE:  # what the settling task repeats
        assert time.monotonic() < deadline, "the growth did not settle"
        time.sleep(0.05)
    labels = server.get("Node", "l40s-2")["metadata"]["labels"]
    assert labels["nvidia.com/device-plugin.config"] == "portal-ts-4"
    assert server.get("ResourceQuota", "gpu-portal", "acme-vision")["spec"]["hard"] == {
        "requests.nvidia.com/gpu.shared": "9"
    }
