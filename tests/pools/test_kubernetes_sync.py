"""Syncing a real-HTTP cluster: what the portal records when the cluster or its nodes misbehave."""

import time

import pytest
from django.core.management import call_command

from pools import capacity_version, task_names
from pools.drivers.base import driver_for
from pools.models import Cluster, NodeCapacity
from pools.services.inventory import sync_inventory
from portal import dispatch
from tests.factories import ClusterFactory
from tests.kube.server import KubeApiServer


@pytest.fixture
def kube(tmp_path):
    with KubeApiServer(mig_apply_seconds=0.02) as server:
        server.kubeconfig_path = server.write_kubeconfig(tmp_path / "kubeconfig")
        yield server


@pytest.fixture
def cluster(kube, db):
    return ClusterFactory(
        name="kube", driver=Cluster.Driver.KUBERNETES, kubeconfig=kube.kubeconfig_path.read_text()
    )


def test_register_and_sync_a_cluster_from_the_command_line(kube, db, capsys):
    kube.add_gpu_node("gpu-1", product="NVIDIA-H100-80GB-HBM3", memory_mib=81559)
    kube.add_node("cpu-1")  # no GPUs: not part of the GPU picture
    call_command("register_cluster", "prod", "--kubeconfig", str(kube.kubeconfig_path))
    assert "prod: nodes new 1, gpus new 8" in capsys.readouterr().out
    node = NodeCapacity.objects.get(cluster__name="prod")
    assert (node.name, node.gpu_model, node.gpu_count, node.mig_state) == ("gpu-1", "H100-80GB", 8, "success")
    assert Cluster.objects.get(name="prod").status == Cluster.Status.READY


def test_a_cluster_that_refuses_our_token_is_marked_unauthorised(kube, cluster, tmp_path):
    cluster.set_kubeconfig(kube.write_kubeconfig(tmp_path / "bad", token="stale").read_text())
    cluster.save()
    report = sync_inventory(cluster=cluster)
    cluster.refresh_from_db()
    assert not report.ok
    assert cluster.status == Cluster.Status.UNAUTHORISED
    assert "refused our credentials" in cluster.last_error
    assert "stale" not in cluster.last_error  # no credentials in messages


def test_a_cluster_that_does_not_answer_is_marked_unreachable(kube, cluster):
    kube.stop()
    report = sync_inventory(cluster=cluster)
    cluster.refresh_from_db()
    assert not report.ok and cluster.status == Cluster.Status.UNREACHABLE
    assert "cannot reach" in cluster.last_error


def test_server_errors_are_recorded(kube, cluster):
    kube.add_gpu_node("gpu-1")
    kube.fail_requests(503, count=1)
    assert not sync_inventory(cluster=cluster).ok
    cluster.refresh_from_db()
    assert cluster.status == Cluster.Status.ERROR and "503" in cluster.last_error
    assert sync_inventory(cluster=cluster).ok  # the next sync recovers


@pytest.mark.parametrize(
    ("labels", "product", "message"),
    [
        ({"nvidia.com/gpu.count": "eight"}, "NVIDIA-H200", "cannot read"),
        ({"nvidia.com/gpu.memory": "0"}, "NVIDIA-L40S", "nvidia.com/gpu.memory"),
        ({"nvidia.com/mig.config": "not-in-the-map"}, "NVIDIA-H200", "not-in-the-map"),
    ],
    ids=["malformed-count", "no-memory-label", "unknown-config"],
)
def test_a_node_that_cannot_be_read_is_shown_with_why_and_the_rest_goes_on(
    labels, product, message, kube, cluster
):
    kube.add_gpu_node("good", product="NVIDIA-H200")
    kube.add_gpu_node("bad", product=product, labels=labels)
    report = sync_inventory(cluster=cluster)
    assert report.ok
    bad = NodeCapacity.objects.get(name="bad")
    assert message in bad.error and bad.gpus.count() == 0
    good = NodeCapacity.objects.get(name="good")
    assert good.error == "" and good.gpus.count() == 8


def test_gpus_outside_the_mig_catalogue_are_pooled_whole_and_placed(kube, cluster, tenancy, approver):
    from pools.selectors import node_views, spec_offers
    from pools.services import admit_waiting, approve_request, submit_request
    from portal.errors import InvalidInput

    kube.add_gpu_node("l40s", product="NVIDIA-L40S", memory_mib=46068, mig_capable=False)
    kube.add_gpu_node("a30", gpus=4, product="NVIDIA-A30", memory_mib=24576, mig_capable=True)
    kube.add_gpu_node("h200", product="NVIDIA-H200")
    assert sync_inventory(cluster=cluster).ok
    nodes = {node.name: node for node in NodeCapacity.objects.all()}
    assert {name: (n.error, n.gpu_model, n.gpus.count()) for name, n in nodes.items()} == {
        "l40s": ("", "L40S-48GB", 8),
        "a30": ("", "A30-24GB", 4),
        "h200": ("", "H200-141GB", 8),
    }
    assert not nodes["l40s"].gpus.filter(mig_enabled=True).exists()
    offered = {offer.spec.id: offer.total for offer in spec_offers()}
    assert offered["l40s-48gb.full"] == 8 and offered["a30-24gb.full"] == 4
    assert not [spec for spec in offered if spec.startswith(("l40s-48gb.mig", "a30-24gb.mig"))]
    assert offered["h200-141gb.mig-1g.18gb"] == 56

    reasons = {view.node.name: view.whole_only for view in node_views(NodeCapacity.objects.all())}
    assert reasons["h200"] == ""
    assert reasons["l40s"] == "L40S-48GB has no MIG: its GPUs are given out whole."
    assert "A30-24GB can run MIG, but the catalogue has no MIG geometry for it yet" in reasons["a30"]

    with pytest.raises(InvalidInput, match=r"is offered as l40s-48gb\.full, or in shares"):
        submit_request(project=tenancy.vision, user=tenancy.acme_member, items=[("l40s-48gb.mig-1g.12gb", 1)])
    request = submit_request(project=tenancy.vision, user=tenancy.acme_member, items=[("l40s-48gb.full", 3)])
    approve_request(request_id=request.pk, approver=approver)
    admit_waiting()
    request.refresh_from_db()
    held = request.pool.allocations.filter(released_at__isnull=True)
    assert (
        sorted((a.gpu.node.name, a.profile, a.resource_name) for a in held)
        == [("l40s", "full", "nvidia.com/gpu")] * 3
    )


TOO_BIG = """version: v1
mig-configs:
  too-big: [{devices: all, mig-enabled: true, mig-devices: {"4g.71gb": 2}}]
"""


def test_a_config_with_a_layout_the_catalogue_rejects_is_shown(kube, cluster):
    from kubernetes import client, config

    core = client.CoreV1Api(config.new_client_from_config(config_file=str(kube.kubeconfig_path)))
    core.create_namespaced_config_map(
        "gpu-operator",
        client.V1ConfigMap(
            metadata=client.V1ObjectMeta(name="custom-mig-parted-config"),
            data={"config.yaml": TOO_BIG},
        ),
    )
    kube.add_gpu_node("gpu-1", labels={"nvidia.com/mig.config": "too-big"})
    sync_inventory(cluster=cluster)
    node = NodeCapacity.objects.get(name="gpu-1")
    assert "does not fit" in node.error


def shared(driver, node: str, sharing: str) -> None:
    deadline = time.monotonic() + 10
    while driver.sharing_state(node).sharing != sharing:
        assert time.monotonic() < deadline, f"{node} never showed {sharing!r}"
        time.sleep(0.02)


def specs(node: NodeCapacity) -> dict[str, tuple[str, int, int]]:
    return {s.resource_name: (s.profile, s.capacity, s.allocatable) for s in node.specs.all()}


def test_a_shared_node_is_recorded_with_its_share_profile_and_its_change_runs_the_queue(
    kube, cluster, django_capture_on_commit_callbacks
):
    kube.add_gpu_node("gpu-1")
    assert sync_inventory(cluster=cluster).ok
    driver = driver_for(cluster)
    driver.apply_sharing("gpu-1", "ts-4")
    shared(driver, "gpu-1", "ts-4")
    version = capacity_version.current()

    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        report = sync_inventory(cluster=cluster)

    assert report.updated["nodes"] == 1
    assert [(c.task, c.args) for c in callbacks if isinstance(c, dispatch.Send)] == [(task_names.ADMIT, ())]
    assert capacity_version.current() != version
    node = NodeCapacity.objects.get(name="gpu-1")
    assert (node.sharing, node.sharing_config, node.error) == ("ts-4", "portal-ts-4", "")
    assert specs(node) == {"nvidia.com/gpu.shared": ("ts-4", 32, 32), "nvidia.com/gpu": ("full", 0, 0)}
    assert node.gpus.count() == 8

    driver.apply_sharing("gpu-1", "mps-2")
    shared(driver, "gpu-1", "mps-2")
    assert sync_inventory(cluster=cluster).updated["nodes"] == 1
    node.refresh_from_db()
    assert (node.sharing, node.sharing_config) == ("mps-2", "portal-mps-2")
    assert specs(node)["nvidia.com/gpu.shared"] == ("mps-2", 16, 16)

    driver.apply_sharing("gpu-1", "")
    shared(driver, "gpu-1", "")
    sync_inventory(cluster=cluster)
    node.refresh_from_db()
    assert (node.sharing, node.sharing_config) == ("", "portal-none")
    assert specs(node) == {"nvidia.com/gpu.shared": ("mps-2", 0, 0), "nvidia.com/gpu": ("full", 8, 8)}


@pytest.mark.parametrize(
    ("labels", "message"),
    [
        ({"nvidia.com/gpu.sharing-strategy": "vgpu", "nvidia.com/gpu.replicas": "4"}, "'vgpu'"),
        ({"nvidia.com/gpu.sharing-strategy": "time-slicing", "nvidia.com/gpu.replicas": "16"}, "16"),
        ({"nvidia.com/gpu.sharing-strategy": "mps", "nvidia.com/gpu.replicas": "two"}, "'two'"),
    ],
    ids=["unknown-strategy", "too-many-replicas", "malformed-replicas"],
)
def test_a_node_shared_in_a_way_the_portal_cannot_give_out_is_shown_with_why(labels, message, kube, cluster):
    kube.add_gpu_node("good")
    assert sync_inventory(cluster=cluster).ok
    kube.add_gpu_node("odd", labels=labels)
    assert sync_inventory(cluster=cluster).ok
    odd = NodeCapacity.objects.get(name="odd")
    assert message in odd.error and "cannot read" in odd.error
    assert odd.sharing == "" and odd.gpus.count() == 0
    assert NodeCapacity.objects.get(name="good").error == ""


def test_each_sync_reads_whether_the_cluster_binds_exact_devices_through_dra(kube, cluster):
    kube.add_gpu_node("gpu-1", product="NVIDIA-H200")
    assert sync_inventory(cluster=cluster).ok
    cluster.refresh_from_db()
    assert cluster.binding == Cluster.Binding.DEVICE_PLUGIN
    assert cluster.binding_note == (
        "The cluster serves DRA, but no GPU driver (gpu.nvidia.com) publishes ResourceSlices."
    )
    kube.publish_gpu_slices("gpu-1")
    assert sync_inventory(cluster=cluster).ok
    cluster.refresh_from_db()
    assert (cluster.binding, cluster.binding_note) == (Cluster.Binding.DRA, "")
    kube.remove_gpu_slices("gpu-1")
    assert sync_inventory(cluster=cluster).ok
    cluster.refresh_from_db()
    assert cluster.binding == Cluster.Binding.DEVICE_PLUGIN


def test_a_cluster_that_does_not_serve_dra_binds_through_the_device_plugin(kube, cluster, monkeypatch):
    from kubernetes import client

    def without_dra(api, **kwargs):
        groups = real(api, **kwargs)
        groups.groups = [group for group in groups.groups if group.name != "resource.k8s.io"]
        return groups

    real = client.ApisApi.get_api_versions
    monkeypatch.setattr(client.ApisApi, "get_api_versions", without_dra)
    kube.add_gpu_node("gpu-1", product="NVIDIA-H200")
    kube.publish_gpu_slices("gpu-1")
    assert sync_inventory(cluster=cluster).ok
    cluster.refresh_from_db()
    assert cluster.binding == Cluster.Binding.DEVICE_PLUGIN
    assert "does not serve resource.k8s.io/v1" in cluster.binding_note
