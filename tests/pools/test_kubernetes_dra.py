"""Pools on a real-HTTP cluster that binds through DRA: one ResourceClaim per device, selected by UUID, made,
moved and deleted by the portal; the admission policy refusing everyone else as written; the trespass
alarm; and what fails, failing cleanly."""

import time
from copy import deepcopy
from datetime import timedelta

import pytest
from django.utils import timezone
from kubernetes.client import ApiException, CoreV1Api, ResourceV1Api
from kubernetes.config import new_client_from_config

from pools.conf import settings as pools_settings
from pools.drivers.admission import BINDING_ANNOTATION, NODES_ANNOTATION
from pools.drivers.base import NAMESPACE_LABELS
from pools.models import Allocation, Cluster, Pool, PoolState, Trespass
from pools.services import admit_waiting, approve_request, finish_release, provision_step, submit_request
from pools.services.capacity import set_gpu_drained
from pools.services.inventory import sync_inventory
from pools.services.provisioning import DONE, FAILED, release_pool
from pools.services.replacement import replace, settle_move
from tests.deploy.manifests import apply, manifests
from tests.factories import ClusterFactory
from tests.kube.server import KubeApiServer

NODE = "gpu-1"
MIG = [("h100-80gb.mig-3g.40gb", 2)]
WHOLE = [("h100-80gb.full", 1)]


@pytest.fixture
def kube(db, tmp_path):
    """A cluster with NVIDIA's DRA driver on one H100 node, the portal's manifests applied, and the portal
    registered with its service account's token, synced."""
    with KubeApiServer(mig_apply_seconds=0.02) as server:
        server.add_gpu_node(NODE, gpus=4, product="NVIDIA-H100-80GB-HBM3", memory_mib=81559)
        server.add_gpu_device_classes()
        server.publish_gpu_slices(NODE)
        admin = new_client_from_config(config_file=str(server.write_kubeconfig(tmp_path / "admin")))
        apply(admin, [deepcopy(manifest.obj) for manifest in manifests()])
        token = server.service_account_token("gpu-portal", "gpu-portal")
        cluster = ClusterFactory(
            name="kube",
            driver=Cluster.Driver.KUBERNETES,
            kubeconfig=server.write_kubeconfig(tmp_path / "portal", token=token).read_text(),
        )
        sync_inventory(cluster=cluster)
        cluster.refresh_from_db()
        assert (cluster.binding, cluster.admission_note) == (Cluster.Binding.DRA, "")
        yield server, cluster, admin
        admin.close()


def admitted(tenancy, approver, items) -> Pool:
    request = submit_request(
        project=tenancy.vision,
        user=tenancy.acme_member,
        items=items,
        cluster=Cluster.objects.get(name="kube"),
    )
    approve_request(request_id=request.pk, approver=approver)
    admit_waiting()
    return Pool.objects.get(request=request)


def provisioned(pool: Pool) -> Pool:
    deadline = time.monotonic() + 15
    while (outcome := provision_step(pool_id=pool.pk)) != DONE:
        assert outcome != FAILED, Pool.objects.get(pk=pool.pk).failure_reason
        assert time.monotonic() < deadline, "provisioning did not finish"
        time.sleep(0.05)
    pool.refresh_from_db()
    return pool


def claims_of(server: KubeApiServer, namespace: str) -> dict[str, dict]:
    return {
        c["metadata"]["name"]: c
        for c in server.objects("ResourceClaim")
        if c["metadata"]["namespace"] == namespace
    }


def selected_device(server: KubeApiServer, claim: dict) -> dict:
    """The slice device a claim's allocation names."""
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    (found,) = [
        device
        for slice_ in server.objects("ResourceSlice")
        if slice_["spec"]["pool"]["name"] == result["pool"]
        for device in slice_["spec"]["devices"]
        if device["name"] == result["device"]
    ]
    return found


def uuid_of(device: dict) -> str:
    return device["attributes"]["uuid"]["string"]


def test_each_device_gets_a_claim_by_uuid_that_the_manifest_names_and_a_release_deletes(
    kube, tenancy, approver, client
):
    server, _cluster, _admin = kube
    pool = provisioned(admitted(tenancy, approver, MIG + WHOLE))
    live = list(Allocation.objects.filter(pool=pool).order_by("pk"))
    claims = claims_of(server, tenancy.vision.namespace)
    assert sorted(claims) == sorted(f"gpu-portal-{pool.pk}-{a.pk}" for a in live)
    for allocation in live:
        claim = claims[f"gpu-portal-{pool.pk}-{allocation.pk}"]
        assert claim["metadata"]["labels"]["gpu-portal/pool"] == str(pool.pk)
        device = selected_device(server, claim)
        assert uuid_of(device) == allocation.instance_uuid != ""
        assert device["attributes"]["type"]["string"] == ("gpu" if allocation.profile == "full" else "mig")
    namespace = server.get("Namespace", tenancy.vision.namespace)["metadata"]
    assert namespace["annotations"] == {BINDING_ANNOTATION: "dra", NODES_ANNOTATION: NODE}

    client.force_login(tenancy.acme_member)
    page = client.get(f"/t/{tenancy.acme.slug}/pools/{pool.pk}/").content.decode()
    for allocation in live:
        assert f"resourceClaimName: gpu-portal-{pool.pk}-{allocation.pk}" in page
    assert "nvidia.com/mig-3g.40gb: 1" not in page  # the containers name claims instead

    release_pool(pool_id=pool.pk, user=tenancy.acme_member)
    finish_release(pool_id=pool.pk)
    assert claims_of(server, tenancy.vision.namespace) == {}
    namespace = server.get("Namespace", tenancy.vision.namespace)["metadata"]
    assert namespace["annotations"][NODES_ANNOTATION] == ""


def test_a_replaced_pool_moves_its_claims_to_its_new_devices(kube, tenancy, approver):
    server, _cluster, _admin = kube
    pool = provisioned(admitted(tenancy, approver, WHOLE))
    (before,) = Allocation.objects.filter(pool=pool)
    set_gpu_drained(gpu=before.gpu, drained=True)
    replace(pool=pool, actor=approver)
    deadline = time.monotonic() + 15
    while settle_move(pool_id=pool.pk) != DONE:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    (after,) = Allocation.objects.filter(pool=pool, released_at__isnull=True)
    assert after.gpu_id != before.gpu_id and after.instance_uuid not in ("", before.instance_uuid)
    claims = claims_of(server, tenancy.vision.namespace)
    assert list(claims) == [f"gpu-portal-{pool.pk}-{after.pk}"]
    assert uuid_of(selected_device(server, claims[f"gpu-portal-{pool.pk}-{after.pk}"])) == after.instance_uuid


def refused(call) -> str:
    with pytest.raises(ApiException) as raised:
        call()
    assert raised.value.status == 403, raised.value.body
    return raised.value.body


def claim(name: str, uuid: str) -> dict:
    selector = f'device.attributes["gpu.nvidia.com"].uuid == "{uuid}"'
    request = {
        "name": "gpu",
        "exactly": {"deviceClassName": "gpu.nvidia.com", "selectors": [{"cel": {"expression": selector}}]},
    }
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {"devices": {"requests": [request]}},
    }


def pod(name: str, *, resources=None, claims=(), node: str | None = NODE) -> dict:
    container = {"name": "main", "image": "cuda", "resources": {}}
    if resources:
        container["resources"]["limits"] = resources
    if claims:
        container["resources"]["claims"] = [{"name": f"c{n}"} for n, _ in enumerate(claims)]
    spec = {"containers": [container]}
    if claims:
        spec["resourceClaims"] = [{"name": f"c{n}", "resourceClaimName": c} for n, c in enumerate(claims)]
    if node:
        spec["nodeSelector"] = {"kubernetes.io/hostname": node}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def test_the_policy_refuses_other_claims_and_unbound_gpu_pods_and_lets_the_pool_be_used(
    kube, tenancy, approver
):
    server, _cluster, admin = kube
    pool = provisioned(admitted(tenancy, approver, WHOLE))
    (held,) = Allocation.objects.filter(pool=pool)
    mine = f"gpu-portal-{pool.pk}-{held.pk}"
    resource, core = ResourceV1Api(admin), CoreV1Api(admin)
    server.add_namespace("globex-recsys", labels=dict(NAMESPACE_LABELS))  # another project's namespace

    body = refused(
        lambda: resource.create_namespaced_resource_claim("globex-recsys", claim("grab", held.instance_uuid))
    )
    assert "Only the GPU portal may create or change ResourceClaims" in body
    refused(
        lambda: resource.create_namespaced_resource_claim(
            tenancy.vision.namespace, claim("more", held.instance_uuid)
        )
    )
    body = refused(
        lambda: core.create_namespaced_pod("globex-recsys", pod("sneak", resources={"nvidia.com/gpu": "1"}))
    )
    assert "binds GPUs through Dynamic Resource Allocation" not in body and "must be pinned" in body
    body = refused(
        lambda: core.create_namespaced_pod(
            tenancy.vision.namespace, pod("old-way", resources={"nvidia.com/gpu": "1"})
        )
    )
    assert "binds GPUs through Dynamic Resource Allocation" in body

    core.create_namespaced_pod(
        tenancy.vision.namespace, pod("trainer", claims=[mine])
    )  # its own claims: allowed
    assert server.get("Pod", "trainer", tenancy.vision.namespace) is not None
    assert mine in claims_of(server, tenancy.vision.namespace)  # the portal's own claim was let through


def test_a_claim_elsewhere_on_a_pools_device_is_a_trespass_until_it_goes(kube, tenancy, approver):
    server, cluster, admin = kube
    pool = provisioned(admitted(tenancy, approver, WHOLE))
    (held,) = Allocation.objects.filter(pool=pool)
    with server.lock:  # the pool's claim is gone for a moment, and a namespace outside the portal's takes it
        server.store.remove("ResourceClaim", (tenancy.vision.namespace, f"gpu-portal-{pool.pk}-{held.pk}"))
    server.add_namespace("research")
    ResourceV1Api(admin).create_namespaced_resource_claim("research", claim("grab", held.instance_uuid))
    sync_inventory(cluster=cluster)
    (found,) = Trespass.objects.filter(ended_at__isnull=True)
    assert (found.namespace, found.device_uuid, found.pool_id, found.node.name) == (
        "research",
        held.instance_uuid,
        pool.pk,
        NODE,
    )
    ResourceV1Api(admin).delete_namespaced_resource_claim("grab", "research")
    sync_inventory(cluster=cluster)
    assert Trespass.objects.get(pk=found.pk).ended_at is not None


def test_a_claim_kubernetes_refuses_fails_the_pool_and_leaves_nothing_bound(kube, tenancy, approver):
    server, _cluster, admin = kube
    no_claims = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": "freeze"},
        "spec": {
            "matchConstraints": {
                "resourceRules": [
                    {
                        "apiGroups": ["resource.k8s.io"],
                        "apiVersions": ["*"],
                        "operations": ["CREATE"],
                        "resources": ["resourceclaims"],
                    }
                ]
            },
            "validations": [
                {"expression": "false", "message": "claims are frozen for maintenance", "reason": "Forbidden"}
            ],
        },
    }
    freeze = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": "freeze"},
        "spec": {"policyName": "freeze", "validationActions": ["Deny"]},
    }
    apply(admin, [no_claims, freeze])
    pool = admitted(tenancy, approver, WHOLE)
    while (outcome := provision_step(pool_id=pool.pk)) not in (DONE, FAILED):
        time.sleep(0.05)
    pool.refresh_from_db()
    assert outcome == FAILED and pool.state == PoolState.FAILED
    assert "claims are frozen for maintenance" in pool.failure_reason
    assert claims_of(server, tenancy.vision.namespace) == {}
    assert server.get("ResourceQuota", "gpu-portal", tenancy.vision.namespace) is None
    assert (
        server.get("Namespace", tenancy.vision.namespace)["metadata"]["annotations"][NODES_ANNOTATION] == ""
    )
    assert not Allocation.objects.filter(pool=pool, released_at__isnull=True).exists()


def test_a_device_the_driver_does_not_publish_waits_then_fails_the_pool_naming_it(
    kube, tenancy, approver, settings
):
    server, _cluster, _admin = kube
    server.remove_gpu_slices(NODE)
    server.add_gpu_node("gpu-2", gpus=1, product="NVIDIA-H100-80GB-HBM3", memory_mib=81559)
    server.publish_gpu_slices("gpu-2")  # the cluster still binds through DRA: another node publishes
    pool = admitted(tenancy, approver, [("h100-80gb.full", 4)])
    assert provision_step(pool_id=pool.pk) == "waiting"
    assert Pool.objects.get(pk=pool.pk).state == PoolState.PROVISIONING
    Pool.objects.filter(pk=pool.pk).update(
        reserved_at=timezone.now() - timedelta(seconds=pools_settings.MIG_PENDING_TIMEOUT_SECONDS + 60)
    )
    assert provision_step(pool_id=pool.pk) == FAILED
    pool.refresh_from_db()
    assert f"lists no DRA device for full on GPU 0 of {NODE}" in pool.failure_reason
    assert claims_of(server, tenancy.vision.namespace) == {}


def test_a_device_that_vanishes_from_the_slices_is_marked_shown_and_unmarked_when_back(
    kube, tenancy, approver, client, staff_user
):
    server, cluster, _admin = kube
    pool = provisioned(admitted(tenancy, approver, MIG))
    server.remove_gpu_slices(NODE)
    server.add_gpu_node("gpu-2", gpus=1, product="NVIDIA-H100-80GB-HBM3", memory_mib=81559)
    server.publish_gpu_slices("gpu-2")  # the cluster still binds through DRA
    sync_inventory(cluster=cluster)
    gone = Allocation.objects.filter(pool=pool, device_vanished_at__isnull=False)
    assert gone.count() == 2
    client.force_login(tenancy.acme_member)
    page = client.get(f"/t/{tenancy.acme.slug}/pools/{pool.pk}/").content.decode()
    assert page.count("gone from the cluster since") == 2
    client.force_login(staff_user("operator"))
    node = gone.first().gpu.node
    assert 'id="vanished"' in client.get(f"/capacity/nodes/{node.pk}/").content.decode()
    assert "no longer publishes, on:" in client.get("/capacity/").content.decode()

    server.publish_gpu_slices(NODE)  # the driver is back, with the same devices
    sync_inventory(cluster=cluster)
    assert not Allocation.objects.filter(pool=pool, device_vanished_at__isnull=False).exists()
