"""The ClusterDriver contract, tested the same way against both drivers.

`KubernetesDriver` talks real HTTP to the project's test API server (which emulates the
GPU Operator's MIG manager and device plugin); `SimulatedDriver` runs its embedded fleet.
Each test runs once per driver through a small "world" adapter that sets the scene and
reads the truth.
"""

import time
from copy import deepcopy

import pytest

from pools.drivers import kubernetes as kubernetes_driver
from pools.drivers import simulated_log
from pools.drivers.admission import BINDING_ANNOTATION, NODES_ANNOTATION
from pools.drivers.base import (
    DEVICE_PLUGIN,
    DRA,
    NAMESPACE_LABELS,
    NODES,
    PODS,
    CaughtUp,
    ClusterUnauthorised,
    ClusterUnreachable,
    DeviceClaim,
    DriverError,
    Expired,
    GpuLayout,
    MigInstanceInfo,
    MigStatus,
    NamespaceNotManaged,
    NodeChange,
    PodChange,
    SharingStatus,
    driver_for,
)
from pools.drivers.simulated import SimulatedDriver, seed
from pools.mig import MigState
from pools.models import NodeCapacity
from pools.services.inventory import sync_inventory
from tests.factories import ClusterFactory
from tests.kube.server import KubeApiServer

PRODUCTS = {"H200-141GB": ("NVIDIA-H200", 143771), "H100-80GB": ("NVIDIA-H100-80GB-HBM3", 81559)}


class SimulatedWorld:
    def __init__(self, tmp_path):
        self.cluster = ClusterFactory(name="sim", driver="simulated")
        seed(self.cluster, {"reachable": True, "nodes": {}, "namespaces": {}, "quotas": {}, "pods": []})
        self.control = SimulatedDriver(self.cluster)

    def add_gpu_node(self, name, model="H200-141GB"):
        self.control.add_node(name, model, [None] * 8)

    def set_outcome(self, node, outcome):
        self.control.set_next_outcome(node, outcome)

    def set_sharing_outcome(self, node, outcome):
        self.control.set_next_sharing_outcome(node, outcome)

    def slow_operator(self, settings, seconds):
        settings.SIMULATED_MIG_APPLY_SECONDS = seconds

    def add_pod(self, namespace, name, node, resources):
        self.cluster.simulation.refresh_from_db()
        state = self.cluster.simulation.state
        state["pods"].append(
            {"namespace": namespace, "name": name, "node": node, "phase": "Running", "resources": resources}
        )
        self.cluster.simulation.save()

    def add_namespace(self, namespace, labels):
        self.cluster.simulation.refresh_from_db()
        self.cluster.simulation.state["namespaces"][namespace] = {"labels": dict(labels)}
        self.cluster.simulation.save()

    def quota(self, namespace):
        self.cluster.simulation.refresh_from_db()
        return self.cluster.simulation.state["quotas"].get(namespace)

    def namespace_labels(self, namespace):
        self.cluster.simulation.refresh_from_db()
        found = self.cluster.simulation.state["namespaces"].get(namespace)
        return None if found is None else found["labels"]

    def break_credentials(self):
        self.control.set_reachable(False)
        return ClusterUnreachable

    def serve_dra(self):
        self._edit(lambda state: state.update(dra=True))

    def namespace_annotations(self, namespace):
        self.cluster.simulation.refresh_from_db()
        return self.cluster.simulation.state["namespaces"][namespace].get("annotations", {})

    def change_admission_policy(self):
        self._edit(
            lambda state: state["admission"]["ValidatingAdmissionPolicy"]["spec"].update(validations=[])
        )

    def _edit(self, change):
        self.cluster.simulation.refresh_from_db()
        change(self.cluster.simulation.state)
        self.cluster.simulation.save()

    def remove_node(self, name):
        self.control.remove_node(name)

    def compact(self):
        self.control.compact()

    def close(self):
        pass


class KubeWorld:
    def __init__(self, tmp_path):
        self.tmp = tmp_path
        self.server = KubeApiServer(mig_apply_seconds=0.05).start()
        self.cluster = ClusterFactory(
            name="kube",
            driver="kubernetes",
            kubeconfig=self.server.write_kubeconfig(tmp_path / "kubeconfig").read_text(),
        )

    def add_gpu_node(self, name, model="H200-141GB"):
        product, memory = PRODUCTS[model]
        self.server.add_gpu_node(name, gpus=8, product=product, memory_mib=memory)

    def set_outcome(self, node, outcome):
        self.server.set_mig_outcome(node, outcome)

    def set_sharing_outcome(self, node, outcome):
        self.server.set_device_plugin_outcome(node, outcome)

    def slow_operator(self, settings, seconds):
        self.server.mig_apply_seconds = seconds

    def add_pod(self, namespace, name, node, resources):
        self.server.add_pod(namespace, name, node=node, resources=resources)

    def add_namespace(self, namespace, labels):
        self.server.add_namespace(namespace, labels=labels)

    def quota(self, namespace):
        found = self.server.get("ResourceQuota", "gpu-portal", namespace)
        if found is None:
            return None
        return {k.removeprefix("requests."): int(v) for k, v in found["spec"]["hard"].items()}

    def namespace_labels(self, namespace):
        found = self.server.get("Namespace", namespace)
        return None if found is None else found["metadata"].get("labels", {})

    def break_credentials(self):
        self.cluster.set_kubeconfig(self.server.write_kubeconfig(self.tmp / "bad", token="wrong").read_text())
        return ClusterUnauthorised

    def serve_dra(self):
        """NVIDIA's DRA driver: its device classes, and a slice on every GPU node."""
        self.server.add_gpu_device_classes()
        for node in self.server.objects("Node"):
            self.server.publish_gpu_slices(node["metadata"]["name"])

    def namespace_annotations(self, namespace):
        return self.server.get("Namespace", namespace)["metadata"].get("annotations", {})

    def change_admission_policy(self):
        with self.server.lock:
            policy = deepcopy(self.server.store.get("ValidatingAdmissionPolicy", "gpu-portal-binding"))
            policy["spec"]["validations"] = [{"expression": "true"}]
            self.server.store.update(policy)

    def remove_node(self, name):
        with self.server.lock:
            self.server.store.remove("Node", ("", name))

    def compact(self):
        self.server.compact()

    def close(self):
        self.server.stop()


@pytest.fixture(autouse=True)
def _mig_takes_a_moment(settings):
    settings.SIMULATED_MIG_APPLY_SECONDS = 0.2  # long enough to see `pending`, as on the test API server


@pytest.fixture(params=["simulated", "kubernetes"])
def world(request, db, tmp_path):
    world = (SimulatedWorld if request.param == "simulated" else KubeWorld)(tmp_path)
    yield world
    world.close()


def driver(world):
    return driver_for(world.cluster)


def settled(driver, node: str, config: str, *, timeout: float = 10.0) -> MigStatus:
    """The node's MIG status once the GPU Operator has finished applying `config`, successfully or not."""
    deadline = time.monotonic() + timeout
    while True:
        status = driver.mig_state(node)
        assert status.config == config, f"{node} was given {status.config!r} instead of {config!r}"
        if status.state in (MigState.SUCCESS, MigState.FAILED):
            return status
        if time.monotonic() >= deadline:
            raise TimeoutError(f"{node} is still {status.state} after {timeout} s applying {config}")
        time.sleep(0.02)


def layout(index, **counts):
    """A GpuLayout with MIG on: instances placed at the lowest starts, as listed."""
    from pools import mig

    placed = mig.place_profiles(mig.gpu_model("H200-141GB"), counts)
    return GpuLayout(index, True, tuple(MigInstanceInfo(i.profile, i.start) for i in placed))


def gpu(nodes, node, index):
    return next(n for n in nodes if n.name == node).gpus[index]


def test_inventory_of_a_fresh_node(world):
    world.add_gpu_node("gpu-a")
    (node,) = driver(world).inventory()
    assert (node.name, node.ready, node.gpu_model, len(node.gpus), node.error) == (
        "gpu-a",
        True,
        "H200-141GB",
        8,
        "",
    )
    assert all(not g.mig_enabled and g.model == "H200-141GB" and g.memory_mib == 143771 for g in node.gpus)
    assert node.resources["nvidia.com/gpu"].capacity == 8
    assert node.resources["nvidia.com/gpu"].allocatable == 8


def test_a_layout_change_goes_pending_then_succeeds_and_leaves_other_gpus_alone(world):
    world.add_gpu_node("gpu-a")
    d = driver(world)
    first = d.apply_mig_layout("gpu-a", [layout(0, **{"1g.18gb": 7}), layout(1, **{"3g.71gb": 2})])
    assert d.mig_state("gpu-a").config == first
    assert d.mig_state("gpu-a").state == MigState.PENDING  # never the previous config's success
    assert settled(d, "gpu-a", first).state == MigState.SUCCESS
    nodes = d.inventory()
    assert [(i.profile, i.start) for i in gpu(nodes, "gpu-a", 1).instances] == [
        ("3g.71gb", 0),
        ("3g.71gb", 4),
    ]
    resources = nodes[0].resources
    assert resources["nvidia.com/mig-1g.18gb"].capacity == 7
    assert resources["nvidia.com/mig-3g.71gb"].capacity == 2
    assert resources["nvidia.com/gpu"].capacity == 6

    second = d.apply_mig_layout("gpu-a", [GpuLayout(1, False)])
    assert second != first
    assert settled(d, "gpu-a", second).state == MigState.SUCCESS
    nodes = d.inventory()
    assert gpu(nodes, "gpu-a", 0).mig_enabled and len(gpu(nodes, "gpu-a", 0).instances) == 7  # untouched
    assert not gpu(nodes, "gpu-a", 1).mig_enabled
    assert (
        "nvidia.com/mig-3g.71gb" not in nodes[0].resources
        or nodes[0].resources["nvidia.com/mig-3g.71gb"].capacity == 0
    )


def test_a_change_asked_while_another_is_pending_keeps_both(world):
    """Two pools re-partition GPUs of one node, the second asking while the first change is pending."""
    world.add_gpu_node("gpu-a")
    d = driver(world)
    first = d.apply_mig_layout("gpu-a", [layout(2, **{"4g.71gb": 1})])
    assert d.mig_state("gpu-a").state == MigState.PENDING
    second = d.apply_mig_layout("gpu-a", [layout(3, **{"1g.18gb": 7})])
    assert second != first
    assert settled(d, "gpu-a", second).state == MigState.SUCCESS
    nodes = d.inventory()
    assert [i.profile for i in gpu(nodes, "gpu-a", 2).instances] == ["4g.71gb"]
    assert [i.profile for i in gpu(nodes, "gpu-a", 3).instances] == ["1g.18gb"] * 7
    assert not any(gpu(nodes, "gpu-a", index).mig_enabled for index in (0, 1, 4, 5, 6, 7))


def test_a_failed_change_is_reported_and_the_known_picture_stays(world):
    world.add_gpu_node("gpu-a")
    sync_inventory(cluster=world.cluster)
    world.set_outcome("gpu-a", "failed")
    d = driver(world)
    config = d.apply_mig_layout("gpu-a", [layout(0, **{"1g.18gb": 7})])
    assert settled(d, "gpu-a", config).state == MigState.FAILED
    sync_inventory(cluster=world.cluster)
    node = NodeCapacity.objects.get(name="gpu-a")
    assert node.mig_state == "failed" and "failed to apply" in node.error
    assert not node.gpus.get(index=0).mig_enabled


def test_the_portal_picture_follows_a_successful_change(world, settings):
    world.add_gpu_node("gpu-a")
    sync_inventory(cluster=world.cluster)
    # Slow enough that the sync below surely runs while the change is pending, however busy the machine.
    world.slow_operator(settings, 2.0)
    d = driver(world)
    config = d.apply_mig_layout("gpu-a", [layout(2, **{"2g.35gb": 3, "1g.18gb": 1})])
    sync_inventory(cluster=world.cluster)  # while pending: GPUs as last known
    assert not NodeCapacity.objects.get(name="gpu-a").gpus.get(index=2).mig_enabled
    assert settled(d, "gpu-a", config).state == MigState.SUCCESS
    sync_inventory(cluster=world.cluster)
    node = NodeCapacity.objects.get(name="gpu-a")
    assert (node.mig_state, node.mig_config, node.error) == ("success", config, "")
    assert [(i["profile"], i["start"]) for i in node.gpus.get(index=2).layout] == [
        ("2g.35gb", 0),
        ("2g.35gb", 2),
        ("2g.35gb", 4),
        ("1g.18gb", 6),
    ]
    assert node.specs.get(resource_name="nvidia.com/mig-2g.35gb").capacity == 3


def test_a_wedged_node_times_out_with_nothing_advertised(world):
    world.add_gpu_node("gpu-a")
    world.set_outcome("gpu-a", "wedge")
    d = driver(world)
    config = d.apply_mig_layout("gpu-a", [layout(0, **{"1g.18gb": 7})])
    with pytest.raises(TimeoutError, match="still pending"):
        settled(d, "gpu-a", config, timeout=0.5)
    (node,) = d.inventory()
    assert node.mig_state == "pending"
    assert sum(r.allocatable for r in node.resources.values()) == 0


@pytest.mark.parametrize(
    "bad",
    [
        [GpuLayout(0, True, (MigInstanceInfo("1g.18gb", 0), MigInstanceInfo("2g.35gb", 0)))],  # overlap
        [GpuLayout(0, True, (MigInstanceInfo("9g.99gb", 0),))],  # unknown profile
        [GpuLayout(8, False)],  # no such GPU
    ],
    ids=["overlap", "unknown-profile", "no-such-gpu"],
)
def test_an_invalid_layout_is_refused_and_changes_nothing(bad, world):
    world.add_gpu_node("gpu-a")
    d = driver(world)
    before = d.mig_state("gpu-a")
    with pytest.raises(DriverError):
        d.apply_mig_layout("gpu-a", bad)
    assert d.mig_state("gpu-a") == before


def test_namespaces_and_quotas(world):
    d = driver(world)
    labels = {"app.kubernetes.io/managed-by": "gpu-portal"}
    d.ensure_namespace("acme-vision", labels)
    d.ensure_namespace("acme-vision", labels)  # twice is fine
    assert world.namespace_labels("acme-vision")["app.kubernetes.io/managed-by"] == "gpu-portal"
    d.apply_quota("acme-vision", {"nvidia.com/mig-1g.18gb": 3, "nvidia.com/gpu": 1})
    assert world.quota("acme-vision") == {"nvidia.com/mig-1g.18gb": 3, "nvidia.com/gpu": 1}
    d.apply_quota("acme-vision", {"nvidia.com/gpu": 2})
    assert world.quota("acme-vision") == {"nvidia.com/gpu": 2}
    d.remove_quota("acme-vision")
    assert world.quota("acme-vision") is None
    d.remove_quota("acme-vision")  # twice is fine


@pytest.mark.parametrize(
    "labels",
    [{}, {"team": "observability"}, {"app.kubernetes.io/managed-by": "Helm"}],
    ids=["unlabelled", "other-labels", "managed-by-someone-else"],
)
def test_a_namespace_made_outside_the_portal_is_never_taken_over(labels, world):
    world.add_namespace("monitoring", labels)
    before = world.namespace_labels("monitoring")
    with pytest.raises(NamespaceNotManaged) as refused:
        driver(world).ensure_namespace("monitoring", NAMESPACE_LABELS)
    assert isinstance(refused.value, DriverError)  # provisioning fails the pool with this message
    assert "monitoring already exists" in str(refused.value)
    assert "not created by the portal" in str(refused.value)
    assert world.namespace_labels("monitoring") == before
    assert world.quota("monitoring") is None


def test_a_namespace_the_portal_made_before_is_ensured_again(world):
    world.add_namespace("acme-vision", {**NAMESPACE_LABELS, "team": "vision"})  # e.g. by another worker
    d = driver(world)
    d.ensure_namespace("acme-vision", NAMESPACE_LABELS)
    d.ensure_namespace("acme-vision", NAMESPACE_LABELS)
    labels = world.namespace_labels("acme-vision")
    assert labels["app.kubernetes.io/managed-by"] == "gpu-portal" and labels["team"] == "vision"
    d.apply_quota("acme-vision", {"nvidia.com/gpu": 1})
    assert world.quota("acme-vision") == {"nvidia.com/gpu": 1}


def test_a_quota_needs_its_namespace(world):
    with pytest.raises(DriverError):
        driver(world).apply_quota("no-such-namespace", {"nvidia.com/gpu": 1})


def test_workloads_list_pods_that_hold_gpus(world):
    world.add_gpu_node("gpu-a")
    world.add_pod("acme-vision", "trainer", "gpu-a", {"nvidia.com/gpu": 2})
    world.add_pod("acme-vision", "web", "gpu-a", {})
    pods = driver(world).workloads()
    assert [(p.namespace, p.name, p.node, dict(p.resources)) for p in pods] == [
        ("acme-vision", "trainer", "gpu-a", {"nvidia.com/gpu": 2})
    ]


def test_a_cluster_that_refuses_us_says_why(world):
    world.add_gpu_node("gpu-a")
    expected = world.break_credentials()
    with pytest.raises(expected):
        driver(world).inventory()


# --- sharing: time-sliced and MPS shares of MIG-off GPUs, through the device plugin -------------------


def shared(driver, node: str, sharing: str, *, timeout: float = 10.0) -> SharingStatus:
    """The node's sharing status once its labels show `sharing` ("" for none)."""
    deadline = time.monotonic() + timeout
    while (status := driver.sharing_state(node)).sharing != sharing:
        if time.monotonic() >= deadline:
            raise TimeoutError(f"{node} still shows {status.sharing!r}, not {sharing!r}, after {timeout} s")
        time.sleep(0.02)
    return status


def gpu_resources(driver, node: str) -> dict[str, int]:
    """The node's nvidia.com/* capacity, without the resources it advertises none of."""
    (found,) = [n for n in driver.inventory() if n.name == node]
    return {name: count.capacity for name, count in found.resources.items() if count.capacity}


def resources_once(driver, node: str, expected: dict[str, int], *, timeout: float = 10.0) -> dict[str, int]:
    deadline = time.monotonic() + timeout
    while (found := gpu_resources(driver, node)) != expected and time.monotonic() < deadline:
        time.sleep(0.02)
    return found


def test_a_fresh_node_shares_nothing(world):
    world.add_gpu_node("gpu-a")
    d = driver(world)
    assert d.sharing_state("gpu-a") == SharingStatus(config="", sharing="")
    (node,) = d.inventory()
    assert (node.sharing, node.sharing_config) == ("", "")


@pytest.mark.parametrize(
    ("profile", "replicas"), [("ts-4", 4), ("mps-2", 2), ("ts-8", 8)], ids=["time-sliced", "mps", "eighths"]
)
def test_a_share_mode_advertises_each_mig_off_gpu_n_times_as_shared_gpus(profile, replicas, world):
    world.add_gpu_node("gpu-a")
    d = driver(world)
    assert d.apply_sharing("gpu-a", profile) == f"portal-{profile}"
    assert shared(d, "gpu-a", profile) == SharingStatus(config=f"portal-{profile}", sharing=profile)
    (node,) = d.inventory()
    assert (node.sharing, node.sharing_config, node.error) == (profile, f"portal-{profile}", "")
    assert gpu_resources(d, "gpu-a") == {"nvidia.com/gpu.shared": 8 * replicas}
    assert node.resources["nvidia.com/gpu.shared"].allocatable == 8 * replicas
    assert len(node.gpus) == 8 and not any(g.mig_enabled for g in node.gpus)


def test_sharing_leaves_mig_instances_alone_and_goes_back_to_none(world):
    world.add_gpu_node("gpu-a")
    d = driver(world)
    config = d.apply_mig_layout("gpu-a", [layout(0, **{"1g.18gb": 7})])
    assert settled(d, "gpu-a", config).state == MigState.SUCCESS
    d.apply_sharing("gpu-a", "ts-4")
    shared(d, "gpu-a", "ts-4")
    assert gpu_resources(d, "gpu-a") == {"nvidia.com/gpu.shared": 28, "nvidia.com/mig-1g.18gb": 7}

    assert d.apply_sharing("gpu-a", "mps-2") == "portal-mps-2"
    shared(d, "gpu-a", "mps-2")
    assert gpu_resources(d, "gpu-a") == {"nvidia.com/gpu.shared": 14, "nvidia.com/mig-1g.18gb": 7}

    assert d.apply_sharing("gpu-a", "") == "portal-none"
    assert shared(d, "gpu-a", "") == SharingStatus(config="portal-none", sharing="")
    assert resources_once(d, "gpu-a", {"nvidia.com/gpu": 7, "nvidia.com/mig-1g.18gb": 7}) == {
        "nvidia.com/gpu": 7,
        "nvidia.com/mig-1g.18gb": 7,
    }


def test_a_new_share_mode_shows_only_once_the_device_plugin_applied_it(world, settings):
    world.add_gpu_node("gpu-a")
    world.slow_operator(settings, 1.0)
    d = driver(world)
    asked = time.monotonic()
    d.apply_sharing("gpu-a", "ts-4")
    assert d.sharing_state("gpu-a") == SharingStatus(config="portal-ts-4", sharing="")
    assert gpu_resources(d, "gpu-a") == {"nvidia.com/gpu": 8}
    shared(d, "gpu-a", "ts-4")
    assert time.monotonic() - asked >= 0.9
    assert gpu_resources(d, "gpu-a") == {"nvidia.com/gpu.shared": 32}


def test_asking_again_for_the_mode_a_node_has_changes_nothing(world):
    world.add_gpu_node("gpu-a")
    d = driver(world)
    d.apply_sharing("gpu-a", "ts-4")
    shared(d, "gpu-a", "ts-4")
    assert d.apply_sharing("gpu-a", "ts-4") == "portal-ts-4"
    assert d.sharing_state("gpu-a") == SharingStatus(config="portal-ts-4", sharing="ts-4")
    assert gpu_resources(d, "gpu-a") == {"nvidia.com/gpu.shared": 32}


def test_a_config_the_device_plugin_cannot_apply_takes_the_mig_off_gpus_away(world):
    world.add_gpu_node("gpu-a")
    world.set_sharing_outcome("gpu-a", "failed")
    d = driver(world)
    d.apply_sharing("gpu-a", "ts-4")
    assert resources_once(d, "gpu-a", {}) == {}
    # The labels still show the old sharing: the config asked for is never reached.
    assert d.sharing_state("gpu-a") == SharingStatus(config="portal-ts-4", sharing="")
    d.apply_sharing("gpu-a", "mps-2")  # the next config is read again
    shared(d, "gpu-a", "mps-2")
    assert gpu_resources(d, "gpu-a") == {"nvidia.com/gpu.shared": 16}


def test_a_stalled_device_plugin_never_applies_the_config(world):
    world.add_gpu_node("gpu-a")
    world.set_sharing_outcome("gpu-a", "stall")
    d = driver(world)
    d.apply_sharing("gpu-a", "ts-4")
    with pytest.raises(TimeoutError, match="still shows ''"):
        shared(d, "gpu-a", "ts-4", timeout=0.6)
    assert d.sharing_state("gpu-a") == SharingStatus(config="portal-ts-4", sharing="")
    assert gpu_resources(d, "gpu-a") == {"nvidia.com/gpu": 8}


@pytest.mark.parametrize(
    "profile", ["ts-1", "ts-9", "mps-0", "ts-04", "full", "whole", "mig", "1g.18gb", "x"]
)
def test_a_profile_that_is_no_share_mode_is_refused_and_changes_nothing(profile, world):
    world.add_gpu_node("gpu-a")
    d = driver(world)
    with pytest.raises(DriverError, match="is no share mode"):
        d.apply_sharing("gpu-a", profile)
    assert d.sharing_state("gpu-a") == SharingStatus(config="", sharing="")


def test_a_node_the_cluster_does_not_have_is_refused(world):
    world.add_gpu_node("gpu-a")
    d = driver(world)
    with pytest.raises(DriverError, match="nope is not in the cluster"):
        d.apply_sharing("nope", "ts-4")
    with pytest.raises(DriverError):
        d.sharing_state("nope")
    assert d.sharing_state("gpu-a") == SharingStatus(config="", sharing="")


def test_a_node_with_a_mig_change_under_way_is_refused_until_it_is_applied(world):
    world.add_gpu_node("gpu-a")
    d = driver(world)
    config = d.apply_mig_layout("gpu-a", [layout(0, **{"3g.71gb": 2})])
    with pytest.raises(DriverError, match="MIG change under way"):
        d.apply_sharing("gpu-a", "ts-2")
    assert d.sharing_state("gpu-a") == SharingStatus(config="", sharing="")
    assert settled(d, "gpu-a", config).state == MigState.SUCCESS
    d.apply_sharing("gpu-a", "ts-2")
    shared(d, "gpu-a", "ts-2")
    assert gpu_resources(d, "gpu-a") == {"nvidia.com/gpu.shared": 14, "nvidia.com/mig-3g.71gb": 2}


# --- binding: DRA, the device plugin, the admission policy ------------------------------------------------


def test_without_a_gpu_driver_publishing_slices_a_cluster_binds_through_the_device_plugin(world):
    world.add_gpu_node("gpu-a")
    found = driver(world).binding()
    assert found.mode == DEVICE_PLUGIN and found.why


def test_under_dra_every_device_has_its_uuid_and_a_claim_holds_exactly_it(world):
    world.add_gpu_node("gpu-a")
    d = driver(world)
    assert settled(d, "gpu-a", d.apply_mig_layout("gpu-a", [layout(0, **{"3g.71gb": 2})])).state == "success"
    world.serve_dra()
    assert d.binding() == type(d.binding())(DRA)
    nodes = d.inventory()
    sliced, whole = gpu(nodes, "gpu-a", 0), gpu(nodes, "gpu-a", 1)
    uuids = [whole.uuid, *(i.uuid for i in sliced.instances)]
    assert all(uuids) and len(set(uuids)) == 3 and whole.uuid.startswith("GPU-")
    d.ensure_namespace("acme-vision", NAMESPACE_LABELS)
    d.bind_namespace("acme-vision", DRA, ["gpu-a"])
    assert world.namespace_annotations("acme-vision") == {
        BINDING_ANNOTATION: "dra",
        NODES_ANNOTATION: "gpu-a",
    }
    claims = [
        DeviceClaim("gpu-portal-7-1", whole.uuid, True),
        DeviceClaim("gpu-portal-7-2", sliced.instances[1].uuid, False),
    ]
    d.apply_claims("acme-vision", "7", claims)
    d.apply_claims("acme-vision", "7", claims)  # twice is fine
    assert sorted((c.namespace, c.name, c.pool, c.devices, c.node) for c in d.claims()) == [
        ("acme-vision", "gpu-portal-7-1", "7", (whole.uuid,), "gpu-a"),
        ("acme-vision", "gpu-portal-7-2", "7", (sliced.instances[1].uuid,), "gpu-a"),
    ]
    d.apply_claims("acme-vision", "7", claims[1:])  # the pool gave its whole GPU back
    assert [c.name for c in d.claims()] == ["gpu-portal-7-2"]
    d.apply_claims("acme-vision", "7", [])  # released
    assert d.claims() == []


def test_a_namespace_made_outside_the_portal_is_never_bound(world):
    world.add_namespace("monitoring", {"team": "observability"})
    with pytest.raises(NamespaceNotManaged):
        driver(world).bind_namespace("monitoring", DEVICE_PLUGIN, ["gpu-a"])
    assert NODES_ANNOTATION not in world.namespace_annotations("monitoring")


def test_the_admission_policy_is_applied_once_and_put_back_when_changed(world):
    d = driver(world)
    assert d.ensure_admission_policy().count("was missing") == 2
    assert d.ensure_admission_policy() == ""
    world.change_admission_policy()
    assert d.ensure_admission_policy() == (
        "ValidatingAdmissionPolicy gpu-portal-binding had been changed in the cluster and has been put back."
    )
    assert d.ensure_admission_policy() == ""


# --- following: lists in pages, then a watch from their versions ------------------------------------------


def listed(d):
    """The versions to watch from, and the nodes and pods, of a list of each."""
    versions, nodes, pods = {}, [], []
    for page in d.list_nodes():
        nodes.extend(page.items)
        versions.update(page.versions)
    for page in d.list_pods():
        pods.extend(page.items)
        versions.update(page.versions)
    return versions, nodes, pods


def caught_up(d, versions) -> list:
    """What a watch from `versions` brings until it has caught up."""
    found = []
    for item in d.watch(versions, seconds=10):
        if isinstance(item, CaughtUp):
            return found
        found.append(item)
    raise AssertionError(f"the watch ended without catching up: {found}")


def test_a_watch_from_a_lists_versions_brings_each_change_after_it(world):
    world.add_gpu_node("gpu-a")
    world.add_pod("acme-vision", "early", "gpu-a", {"nvidia.com/gpu": 1})
    d = driver(world)
    versions, nodes, pods = listed(d)
    assert {NODES, PODS} <= set(versions)
    assert [n.name for n in nodes] == ["gpu-a"] and [p.name for p in pods] == ["early"]

    world.add_gpu_node("gpu-b")
    world.add_pod("acme-vision", "trainer", "gpu-b", {"nvidia.com/gpu": 2})
    world.add_pod("acme-vision", "web", "gpu-b", {})
    world.remove_node("gpu-a")
    items = caught_up(d, versions)

    nodes = {c.name: c.node for c in items if isinstance(c, NodeChange)}
    assert set(nodes) == {"gpu-a", "gpu-b"}
    assert nodes["gpu-a"] is None and len(nodes["gpu-b"].gpus) == 8
    pods = {c.name: c.pod for c in items if isinstance(c, PodChange)}
    assert pods.get("web") is None  # a pod that holds no GPU is none of the portal's
    assert (pods["trainer"].namespace, pods["trainer"].node, dict(pods["trainer"].resources)) == (
        "acme-vision",
        "gpu-b",
        {"nvidia.com/gpu": 2},
    )
    # Each item says where its stream stands after it: a watch from there has nothing new.
    after = {**versions, **{item.stream: item.version for item in items if hasattr(item, "stream")}}
    assert [item for item in caught_up(d, after) if isinstance(item, (NodeChange, PodChange))] == []


def test_a_version_the_cluster_no_longer_keeps_is_expired_and_a_new_list_goes_on(world):
    world.add_gpu_node("gpu-a")
    d = driver(world)
    versions, _nodes, _pods = listed(d)
    world.add_gpu_node("gpu-b")
    world.compact()
    with pytest.raises(Expired) as expired:
        caught_up(d, versions)
    assert isinstance(expired.value, DriverError) and expired.value.stream in versions
    fresh, nodes, _pods = listed(d)
    assert sorted(n.name for n in nodes) == ["gpu-a", "gpu-b"]
    assert [item for item in caught_up(d, fresh) if isinstance(item, NodeChange)] == []


def test_a_list_comes_in_pages_that_cover_its_keys_once_in_order(world, monkeypatch):
    monkeypatch.setattr(kubernetes_driver, "PAGE", 2)
    monkeypatch.setattr(simulated_log, "PAGE", 2)
    for n in range(5):
        world.add_gpu_node(f"gpu-{n}")
    pages = list(driver(world).list_nodes())
    assert [[node.name for node in page.items] for page in pages] == [
        ["gpu-0", "gpu-1"],
        ["gpu-2", "gpu-3"],
        ["gpu-4"],
    ]
    assert [(page.after, page.upto) for page in pages] == [
        (None, "gpu-1"),
        ("gpu-1", "gpu-3"),
        ("gpu-3", None),
    ]
    assert len({tuple(sorted(page.versions.items())) for page in pages}) == 1  # one list, one version
