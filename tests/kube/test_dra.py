"""Dynamic Resource Allocation in the test API server, through the official client's ResourceV1Api: the
four resource.k8s.io/v1 kinds, NVIDIA's DRA driver publishing a node's GPUs and MIG devices as slices,
claims allocated by device UUID, one claim per device, and RBAC on claims."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client
from kubernetes.client import (
    ApiException,
    ResourceV1Api,
    ResourceV1ResourceClaim,
    V1CELDeviceSelector,
    V1DeviceClaim,
    V1DeviceClass,
    V1DeviceClassSpec,
    V1DeviceRequest,
    V1DeviceSelector,
    V1ExactDeviceRequest,
    V1ObjectMeta,
    V1ResourceClaimSpec,
    V1ResourceClaimTemplate,
    V1ResourceClaimTemplateSpec,
    V1ResourcePool,
    V1ResourceSlice,
    V1ResourceSliceSpec,
)
from kubernetes.config import new_client_from_config

from tests.kube.client import ask_for_mig_config, write_mig_config
from tests.kube.client import wait_for_state as wait_for_mig_state
from tests.kube.dra_driver import gpu_uuid
from tests.kube.server import KubeApiServer

GROUP = "resource.k8s.io"
TEAM = "team-a"
H200_PRODUCT = "NVIDIA H200"


@pytest.fixture
def kube() -> Iterator[KubeApiServer]:
    with KubeApiServer() as server:
        server.add_namespace(TEAM)
        server.add_gpu_node("gpu-a", gpus=8)
        server.add_gpu_device_classes()
        yield server


@pytest.fixture
def api(kube: KubeApiServer, tmp_path: Path) -> Iterator[client.ApiClient]:
    api_client = new_client_from_config(config_file=str(kube.write_kubeconfig(tmp_path / "admin")))
    yield api_client
    api_client.close()


@pytest.fixture
def dra(api) -> ResourceV1Api:
    return ResourceV1Api(api)


def uuid_claim(name: str, uuid: str, *, device_class: str = "gpu.nvidia.com") -> ResourceV1ResourceClaim:
    return expression_claim(name, f'device.attributes["gpu.nvidia.com"].uuid == "{uuid}"', device_class)


def expression_claim(
    name: str, expression: str, device_class: str = "gpu.nvidia.com"
) -> ResourceV1ResourceClaim:
    selector = V1DeviceSelector(cel=V1CELDeviceSelector(expression=expression))
    request = V1DeviceRequest(
        name="gpu", exactly=V1ExactDeviceRequest(device_class_name=device_class, selectors=[selector])
    )
    return ResourceV1ResourceClaim(
        metadata=V1ObjectMeta(name=name, labels={"portal/pool": "vision"}),
        spec=V1ResourceClaimSpec(devices=V1DeviceClaim(requests=[request])),
    )


def node_slice(dra: ResourceV1Api, node: str) -> V1ResourceSlice:
    (only,) = dra.list_resource_slice(field_selector=f"spec.nodeName={node}").items
    return only


def uuids(resource_slice: V1ResourceSlice) -> dict[str, str]:
    return {device.name: device.attributes["uuid"].string for device in resource_slice.spec.devices}


def allocated_devices(dra: ResourceV1Api, name: str) -> list[tuple[str, str, str, str]] | None:
    allocation = dra.read_namespaced_resource_claim(name, TEAM).status.allocation
    if allocation is None:
        return None
    return [(r.request, r.driver, r.pool, r.device) for r in allocation.devices.results]


# --- discovery and the four kinds ------------------------------------------------------------------------


def test_discovery_lists_the_group_and_its_four_kinds(api, dra):
    groups = client.ApisApi(api).get_api_versions().groups
    group = client.ResourceApi(api).get_api_group()
    resources = {r.name: (r.kind, r.namespaced) for r in dra.get_api_resources().resources}

    assert GROUP in [g.name for g in groups]
    assert group.preferred_version.group_version == f"{GROUP}/v1"
    assert resources == {
        "deviceclasses": ("DeviceClass", False),
        "resourceslices": ("ResourceSlice", False),
        "resourceclaims": ("ResourceClaim", True),
        "resourceclaimtemplates": ("ResourceClaimTemplate", True),
    }


def test_device_classes_and_slices_are_created_listed_patched_and_deleted(kube, dra):
    expression = "device.driver == 'example.com'"
    device_class = V1DeviceClass(
        metadata=V1ObjectMeta(name="example.com", labels={"team": "a"}),
        spec=V1DeviceClassSpec(selectors=[V1DeviceSelector(cel=V1CELDeviceSelector(expression=expression))]),
    )
    resource_slice = V1ResourceSlice(
        metadata=V1ObjectMeta(name="node-x-example"),
        spec=V1ResourceSliceSpec(
            driver="example.com",
            node_name="node-x",
            pool=V1ResourcePool(name="node-x", generation=1, resource_slice_count=1),
            devices=[client.V1Device(name="dev-0")],
        ),
    )

    created = dra.create_device_class(device_class)
    labelled = dra.list_device_class(label_selector="team=a").items
    patched = dra.patch_device_class("example.com", {"metadata": {"labels": {"team": "b"}}})
    dra.create_resource_slice(resource_slice)
    read = dra.read_resource_slice("node-x-example")
    dra.delete_device_class("example.com")
    dra.delete_resource_slice("node-x-example")

    assert (created.api_version, created.kind) == (f"{GROUP}/v1", "DeviceClass")
    assert [c.metadata.name for c in labelled] == ["example.com"]
    assert patched.metadata.labels == {"team": "b"}
    assert [d.name for d in read.spec.devices] == ["dev-0"]
    assert kube.get("DeviceClass", "example.com") is None
    assert kube.get("ResourceSlice", "node-x-example") is None


def test_claims_and_templates_are_namespaced_and_a_claim_spec_is_immutable(kube, dra):
    template = V1ResourceClaimTemplate(
        metadata=V1ObjectMeta(name="one-gpu"),
        spec=V1ResourceClaimTemplateSpec(
            spec=expression_claim("x", "device.driver == 'gpu.nvidia.com'").spec
        ),
    )

    dra.create_namespaced_resource_claim_template(TEAM, template)
    dra.create_namespaced_resource_claim(TEAM, uuid_claim("c1", "GPU-nowhere"))
    listed = dra.list_resource_claim_for_all_namespaces(label_selector="portal/pool=vision").items
    stored = dra.read_namespaced_resource_claim_template("one-gpu", TEAM)
    stored.metadata.labels = {"v": "2"}
    replaced = dra.replace_namespaced_resource_claim_template("one-gpu", TEAM, stored)
    with pytest.raises(ApiException) as changed_spec:
        dra.patch_namespaced_resource_claim(
            "c1",
            TEAM,
            {"spec": {"devices": {"requests": [{"name": "other", "exactly": {"deviceClassName": "x"}}]}}},
        )
    dra.delete_namespaced_resource_claim("c1", TEAM)

    assert [(c.metadata.namespace, c.metadata.name) for c in listed] == [(TEAM, "c1")]
    assert replaced.metadata.labels == {"v": "2"}
    assert changed_spec.value.status == 422
    assert dra.list_namespaced_resource_claim(TEAM).items == []
    assert kube.get("ResourceClaimTemplate", "one-gpu", TEAM) is not None


def test_a_request_must_be_either_exact_or_a_list_of_alternatives(dra):
    both = {
        "name": "gpu",
        "exactly": {"deviceClassName": "gpu.nvidia.com"},
        "firstAvailable": [{"name": "mig", "deviceClassName": "mig.nvidia.com"}],
    }
    body = {"metadata": {"name": "c1"}, "spec": {"devices": {"requests": [both]}}}

    with pytest.raises(ApiException) as refused:
        dra.create_namespaced_resource_claim(TEAM, body)

    assert refused.value.status == 422
    assert "spec.devices.requests[0]" in json.loads(refused.value.body)["message"]


# --- the driver's slices ---------------------------------------------------------------------------------


def test_a_node_publishes_one_device_per_whole_gpu_with_the_driver_s_attributes(kube, dra):
    kube.publish_gpu_slices("gpu-a")

    published = node_slice(dra, "gpu-a")
    first = published.spec.devices[0]

    assert (published.spec.driver, published.spec.pool.name, published.spec.pool.generation) == (
        "gpu.nvidia.com",
        "gpu-a",
        1,
    )
    assert published.metadata.name.startswith("0-gpu.nvidia.com-gpu-a-")
    assert [d.name for d in published.spec.devices] == [f"gpu-{i}" for i in range(8)]
    assert {
        name: first.attributes[name].string for name in ("type", "productName", "architecture", "brand")
    } == {
        "type": "gpu",
        "productName": H200_PRODUCT,
        "architecture": "Hopper",
        "brand": "Nvidia",
    }
    assert first.attributes["cudaComputeCapability"].version == "9.0.0"
    assert first.attributes["uuid"].string.startswith("GPU-")
    assert len(set(uuids(published).values())) == 8
    assert first.capacity["memory"].value == "143771Mi"


def test_a_mig_repartition_republishes_the_node_s_devices_with_new_mig_uuids(kube, api, dra):
    core = client.CoreV1Api(api)
    kube.publish_gpu_slices("gpu-a")
    write_mig_config(core)
    before = uuids(node_slice(dra, "gpu-a"))

    ask_for_mig_config(core, "gpu-a", "vision-mixed")
    wait_for_mig_state(core, "gpu-a", {"success"})
    mixed = node_slice(dra, "gpu-a")
    ask_for_mig_config(core, "gpu-a", "first-gpu-whole-slice")
    wait_for_mig_state(core, "gpu-a", {"success"})
    whole = node_slice(dra, "gpu-a")

    mixed_devices = {d.name: d for d in mixed.spec.devices}
    assert mixed.spec.pool.generation == 2 and whole.spec.pool.generation == 3
    # Named as the driver names them: parent minor, profile, GPU-instance profile id, placement start.
    assert sorted(name for name in mixed_devices if name.startswith("gpu-3-")) == [
        "gpu-3-mig-1g18gb-me-20-6",
        "gpu-3-mig-2g35gb-14-4",
        "gpu-3-mig-3g71gb-9-0",
    ]
    assert len([name for name in mixed_devices if name.startswith("gpu-0-mig-1g18gb-19-")]) == 7
    assert (
        "gpu-0" not in mixed_devices and mixed_devices["gpu-4"].attributes["uuid"].string == before["gpu-4"]
    )
    three = mixed_devices["gpu-2-mig-3g71gb-9-4"]
    assert (three.attributes["type"].string, three.attributes["profile"].string) == ("mig", "3g.71gb")
    assert three.attributes["parentUUID"].string == before["gpu-2"]
    assert three.capacity["memorySlice4"].value == "1"
    # GPU 0 went from seven 1g instances to one 7g: new MIG devices, new UUIDs; GPU 2 was not touched.
    assert [name for name in uuids(whole) if name.startswith("gpu-0")] == ["gpu-0-mig-7g141gb-0-0"]
    assert uuids(whole)["gpu-2-mig-3g71gb-9-4"] == uuids(mixed)["gpu-2-mig-3g71gb-9-4"]
    assert set(uuids(whole).values()) - set(uuids(mixed).values()) == {uuids(whole)["gpu-0-mig-7g141gb-0-0"]}


def test_removing_the_driver_takes_the_node_s_slice_away_and_stops_following_the_node(kube, api, dra):
    core = client.CoreV1Api(api)
    kube.add_gpu_node("gpu-b", gpus=2)
    kube.publish_gpu_slices("gpu-a")
    kube.publish_gpu_slices("gpu-b")
    write_mig_config(core)

    kube.remove_gpu_slices("gpu-a")
    ask_for_mig_config(core, "gpu-a", "every-gpu-halved")
    wait_for_mig_state(core, "gpu-a", {"success"})

    assert [s.spec.node_name for s in dra.list_resource_slice().items] == ["gpu-b"]


# --- allocation ------------------------------------------------------------------------------------------


def test_a_claim_naming_a_gpu_by_uuid_is_allocated_that_gpu(kube, dra):
    kube.publish_gpu_slices("gpu-a")
    wanted = uuids(node_slice(dra, "gpu-a"))["gpu-5"]

    created = dra.create_namespaced_resource_claim(TEAM, uuid_claim("vision-0", wanted))
    allocation = dra.read_namespaced_resource_claim("vision-0", TEAM).status.allocation

    assert created.status is None or created.status.allocation is None  # the scheduler comes after the write
    assert allocated_devices(dra, "vision-0") == [("gpu", "gpu.nvidia.com", "gpu-a", "gpu-5")]
    (term,) = allocation.node_selector.node_selector_terms
    assert [(f.key, f.values) for f in term.match_fields] == [("metadata.name", ["gpu-a"])]
    assert kube.claim_problem(TEAM, "vision-0") is None


def test_a_mig_device_is_allocated_by_uuid_through_the_mig_class_with_the_driver_named(kube, api, dra):
    core = client.CoreV1Api(api)
    kube.publish_gpu_slices("gpu-a")
    write_mig_config(core)
    ask_for_mig_config(core, "gpu-a", "vision-mixed")
    wait_for_mig_state(core, "gpu-a", {"success"})
    wanted = uuids(node_slice(dra, "gpu-a"))["gpu-2-mig-3g71gb-9-4"]
    expression = (
        f"device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].uuid == '{wanted}'"
    )

    dra.create_namespaced_resource_claim(
        TEAM, uuid_claim("wrong-class", wanted, device_class="gpu.nvidia.com")
    )
    dra.create_namespaced_resource_claim(TEAM, expression_claim("mig", expression, "mig.nvidia.com"))

    assert allocated_devices(dra, "mig") == [("gpu", "gpu.nvidia.com", "gpu-a", "gpu-2-mig-3g71gb-9-4")]
    assert allocated_devices(dra, "wrong-class") is None


def test_a_second_claim_for_an_allocated_device_waits_until_the_first_is_deleted(kube, dra):
    kube.publish_gpu_slices("gpu-a")
    wanted = uuids(node_slice(dra, "gpu-a"))["gpu-1"]
    dra.create_namespaced_resource_claim(TEAM, uuid_claim("first", wanted))

    dra.create_namespaced_resource_claim(TEAM, uuid_claim("second", wanted))
    waiting = allocated_devices(dra, "second")
    problem = kube.claim_problem(TEAM, "second")
    deleted = dra.delete_namespaced_resource_claim("first", TEAM)

    assert waiting is None
    assert "no free device" in problem
    assert deleted.metadata.name == "first"
    assert allocated_devices(dra, "second") == [("gpu", "gpu.nvidia.com", "gpu-a", "gpu-1")]
    assert kube.claim_problem(TEAM, "second") is None


@pytest.mark.parametrize(
    "expression",
    [
        "device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('80Gi')) >= 0",
        f'device.attributes["gpu.nvidia.com"].uuid == "{gpu_uuid("gpu-a", 0)}" || device.driver == "x"',
        f'device.attributes["gpu.nvidia.com"].uuid != "{gpu_uuid("gpu-a", 0)}"',
    ],
)
def test_an_expression_outside_the_served_cel_subset_stays_unallocated_and_says_why(kube, dra, expression):
    kube.publish_gpu_slices("gpu-a")

    dra.create_namespaced_resource_claim(TEAM, expression_claim("odd", expression))

    assert allocated_devices(dra, "odd") is None
    assert kube.claim_problem(TEAM, "odd").startswith("unsupported CEL expression")


def test_a_claim_kept_pending_is_allocated_once_let_go(kube, dra):
    kube.publish_gpu_slices("gpu-a")
    wanted = uuids(node_slice(dra, "gpu-a"))["gpu-0"]
    kube.set_claim_outcome(TEAM, "held", "pending")

    dra.create_namespaced_resource_claim(TEAM, uuid_claim("held", wanted))
    held = allocated_devices(dra, "held")
    kube.set_claim_outcome(TEAM, "held", "allocate")

    assert held is None
    assert allocated_devices(dra, "held") == [("gpu", "gpu.nvidia.com", "gpu-a", "gpu-0")]


def test_claims_made_before_the_driver_publishes_share_out_its_devices_once_the_slice_comes(kube, dra):
    dra.create_namespaced_resource_claim(TEAM, uuid_claim("early", gpu_uuid("gpu-a", 3)))
    dra.create_namespaced_resource_claim(TEAM, uuid_claim("late", gpu_uuid("gpu-a", 3)))
    before = [allocated_devices(dra, name) for name in ("early", "late")]

    kube.publish_gpu_slices("gpu-a")

    assert before == [None, None]
    assert allocated_devices(dra, "early") == [("gpu", "gpu.nvidia.com", "gpu-a", "gpu-3")]
    assert allocated_devices(dra, "late") is None


# --- RBAC ------------------------------------------------------------------------------------------------


def test_a_service_account_without_rights_on_claims_is_refused_and_with_them_allowed(kube, api, tmp_path):
    core, rbac = client.CoreV1Api(api), client.RbacAuthorizationV1Api(api)
    core.create_namespaced_service_account(TEAM, {"metadata": {"name": "portal"}})
    token = kube.service_account_token(TEAM, "portal")
    account = new_client_from_config(config_file=str(kube.write_kubeconfig(tmp_path / "portal", token=token)))
    as_portal = ResourceV1Api(account)

    with pytest.raises(ApiException) as refused:
        as_portal.create_namespaced_resource_claim(TEAM, uuid_claim("c1", "GPU-x"))
    rules = [{"apiGroups": [GROUP], "resources": ["resourceclaims"], "verbs": ["create", "get"]}]
    rbac.create_namespaced_role(TEAM, {"metadata": {"name": "claims"}, "rules": rules})
    ref = {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "claims"}
    subject = {"kind": "ServiceAccount", "name": "portal", "namespace": TEAM}
    rbac.create_namespaced_role_binding(
        TEAM, {"metadata": {"name": "claims"}, "roleRef": ref, "subjects": [subject]}
    )
    created = as_portal.create_namespaced_resource_claim(TEAM, uuid_claim("c1", "GPU-x"))
    with pytest.raises(ApiException) as slices_refused:
        as_portal.list_resource_slice()
    account.close()

    assert refused.value.status == 403
    assert json.loads(refused.value.body)["reason"] == "Forbidden"
    assert created.metadata.name == "c1"
    assert slices_refused.value.status == 403
    assert kube.grants[-1].request.resource == "resourceclaims"
