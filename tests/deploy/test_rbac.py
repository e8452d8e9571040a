"""The portal's RBAC is exactly what its Kubernetes driver needs. As written: no wildcard, bound to the
portal's account only. At work: with that account's token the driver's whole protocol succeeds against
the project's API server, every verb granted is used, each one is needed (taking it away breaks the
protocol), and anything else is refused with 403."""

import json
import re
import time
from collections.abc import Iterator
from copy import deepcopy

import pytest
from kubernetes.client import (
    AdmissionregistrationV1Api,
    ApiClient,
    ApiException,
    CoreV1Api,
    RbacAuthorizationV1Api,
    ResourceV1Api,
    V1ConfigMap,
    V1ObjectMeta,
)
from kubernetes.config import new_client_from_config

from pools import mig
from pools.drivers.base import (
    CLAIMS,
    DEVICE_PLUGIN,
    DRA,
    NAMESPACE_LABELS,
    NODES,
    PODS,
    SLICES,
    CaughtUp,
    ClusterUnauthorised,
    DeviceClaim,
    GpuLayout,
    MigInstanceInfo,
    NodeChange,
    driver_for,
)
from pools.mig import MigState
from pools.models import Cluster
from pools.services.inventory import sync_inventory
from tests.deploy.manifests import apply, manifests, of_kind, the
from tests.factories import ClusterFactory
from tests.kube.server import KubeApiServer

ACCOUNT = ("gpu-portal", "gpu-portal")
USER = "system:serviceaccount:gpu-portal:gpu-portal"
ROLES = ("ClusterRole", "Role")


# --- the roles as written ---------------------------------------------------------------------------


WILDCARD = re.compile(r"\*")


def test_no_rule_grants_a_wildcard():
    rules = [rule for kind in ROLES for role in of_kind(kind) for rule in role["rules"]]

    assert rules
    for rule in rules:
        for field in ("verbs", "resources", "apiGroups", "resourceNames", "nonResourceURLs"):
            assert not any(WILDCARD.search(value) for value in rule.get(field, [])), rule
        assert "nonResourceURLs" not in rule


def test_the_bindings_bind_the_portal_account_to_roles_that_exist():
    roles = {
        (role["kind"], role["metadata"].get("namespace", ""), role["metadata"]["name"])
        for k in ROLES
        for role in of_kind(k)
    }
    account = the("ServiceAccount", "gpu-portal")["metadata"]
    bindings = [*of_kind("ClusterRoleBinding"), *of_kind("RoleBinding")]

    assert len(bindings) == 2
    for binding in bindings:
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": account["name"], "namespace": account["namespace"]}
        ]
        ref = binding["roleRef"]
        namespace = binding["metadata"].get("namespace", "") if ref["kind"] == "Role" else ""
        assert (ref["kind"], namespace, ref["name"]) in roles
        assert ref["apiGroup"] == "rbac.authorization.k8s.io"


def test_the_operator_role_names_the_default_config_maps():
    mig_namespace, _, mig_name = Cluster._meta.get_field("mig_config_map").default.partition("/")
    plugin_namespace, _, plugin_name = Cluster._meta.get_field("device_plugin_config_map").default.partition(
        "/"
    )
    (role,) = of_kind("Role")

    assert role["metadata"]["namespace"] == mig_namespace == plugin_namespace
    named = [rule for rule in role["rules"] if rule.get("resourceNames")]
    assert [rule["resourceNames"] for rule in named] == [[mig_name], [plugin_name]]
    # create cannot be limited by name (a create request carries none), so it stands alone
    assert all("create" not in rule["verbs"] for rule in named)


# --- the roles at work ----------------------------------------------------------------------------------


def portal_objects(*, without: tuple[str, int, str] | None = None) -> list[dict]:
    """The manifests, optionally with one verb taken out of one rule: (role name, rule index, verb)."""
    objects = [deepcopy(manifest.obj) for manifest in manifests()]
    if without is not None:
        name, index, verb = without
        (role,) = [o for o in objects if o["kind"] in ROLES and o["metadata"]["name"] == name]
        role["rules"][index]["verbs"].remove(verb)
        role["rules"] = [rule for rule in role["rules"] if rule["verbs"]]
    return objects


def granted_verbs() -> list[tuple[str, int, str]]:
    return [
        (manifest.name, index, verb)
        for manifest in manifests()
        if manifest.kind in ROLES
        for index, rule in enumerate(manifest.obj["rules"])
        for verb in rule["verbs"]
    ]


def start_cluster(tmp_path, objects: list[dict]) -> KubeApiServer:
    """The cluster the portal runs in: GPU Operator at work, a tenant's pod, the manifests applied."""
    server = KubeApiServer(mig_apply_seconds=0.02).start()
    server.add_gpu_node("gpu-a")
    server.add_gpu_node("gpu-b", product="NVIDIA-H100-80GB-HBM3", memory_mib=81559)
    server.add_node("cpu-a")
    server.add_pod("acme-train", "trainer-0", node="gpu-a", resources={"nvidia.com/gpu": 2})
    server.add_gpu_device_classes()
    admin = new_client_from_config(config_file=str(server.write_kubeconfig(tmp_path / "admin")))
    # The operator's own mig-parted config: the portal's account must neither read nor change it.
    CoreV1Api(admin).create_namespaced_config_map(
        "gpu-operator",
        V1ConfigMap(metadata=V1ObjectMeta(name="default-mig-parted-config"), data={"config.yaml": "{}"}),
    )
    apply(admin, objects)
    admin.close()
    return server


@pytest.fixture
def kube(tmp_path) -> Iterator[KubeApiServer]:
    server = start_cluster(tmp_path, portal_objects())
    yield server
    server.stop()


def portal_cluster(kube: KubeApiServer, tmp_path, name: str = "home") -> Cluster:
    token = kube.service_account_token(*ACCOUNT)
    kubeconfig = kube.write_kubeconfig(tmp_path / f"{name}-kubeconfig", token=token).read_text()
    return ClusterFactory(name=name, driver=Cluster.Driver.KUBERNETES, kubeconfig=kubeconfig)


def settle(driver, node: str, config: str) -> MigState:
    deadline = time.monotonic() + 10
    while (status := driver.mig_state(node)).state not in (MigState.SUCCESS, MigState.FAILED):
        assert status.config == config
        assert time.monotonic() < deadline, f"{node} still {status.state} applying {config}"
        time.sleep(0.02)
    return status.state


def sliced(index: int, **counts: int) -> GpuLayout:
    placed = mig.place_profiles(mig.gpu_model("H200-141GB"), counts)
    return GpuLayout(index, True, tuple(MigInstanceInfo(i.profile, i.start) for i in placed))


def shared(driver, node: str, config: str) -> str:
    """The share profile the node shows once its device plugin has applied `config`."""
    deadline = time.monotonic() + 10
    while (status := driver.sharing_state(node)).sharing != config.removeprefix("portal-"):
        assert status.config == config
        assert time.monotonic() < deadline, f"{node} still shows {status.sharing!r} applying {config}"
        time.sleep(0.02)
    return status.sharing


def change_the_policy(server: KubeApiServer) -> None:
    """Someone weakens the portal's admission policy and its binding in the cluster."""
    with server.lock:
        policy = deepcopy(server.store.get("ValidatingAdmissionPolicy", "gpu-portal-binding"))
        policy["spec"]["failurePolicy"] = "Ignore"
        server.store.update(policy)
        binding = deepcopy(server.store.get("ValidatingAdmissionPolicyBinding", "gpu-portal-binding"))
        binding["spec"]["validationActions"] = ["Audit"]
        server.store.update(binding)


def drive_the_whole_protocol(cluster: Cluster, server: KubeApiServer) -> None:
    """Every call of the ClusterDriver protocol, each way the driver can take through it."""
    driver = driver_for(cluster)
    assert {node.name for node in driver.inventory()} == {"gpu-a", "gpu-b"}
    assert [(pod.namespace, pod.name) for pod in driver.workloads()] == [("acme-train", "trainer-0")]
    assert driver.binding().mode == DEVICE_PLUGIN  # the API is served, but no GPU driver publishes slices
    first = driver.apply_mig_layout("gpu-a", [sliced(0, **{"1g.18gb": 7})])  # creates the ConfigMap
    assert settle(driver, "gpu-a", first) == MigState.SUCCESS
    second = driver.apply_mig_layout("gpu-a", [sliced(1, **{"3g.71gb": 2})])  # updates it
    assert settle(driver, "gpu-a", second) == MigState.SUCCESS
    assert shared(driver, "gpu-a", driver.apply_sharing("gpu-a", "ts-4")) == "ts-4"  # creates the ConfigMap
    assert shared(driver, "gpu-a", driver.apply_sharing("gpu-a", "mps-2")) == "mps-2"  # adds a key to it
    driver.ensure_namespace("acme-vision", NAMESPACE_LABELS)  # creates it
    driver.ensure_namespace("acme-vision", NAMESPACE_LABELS)  # exists: read, then re-labelled
    driver.apply_quota("acme-vision", {"nvidia.com/gpu": 1})  # creates the quota
    driver.apply_quota("acme-vision", {"nvidia.com/gpu": 2, "nvidia.com/mig-1g.18gb": 3})  # replaces it
    driver.remove_quota("acme-vision")
    assert "missing" in driver.ensure_admission_policy()  # who the portal is; creates the policy and binding
    assert driver.ensure_admission_policy() == ""  # reads them: as shipped
    change_the_policy(server)
    assert driver.ensure_admission_policy().count("put back") == 2  # replaces both
    server.publish_gpu_slices("gpu-b")  # NVIDIA's DRA driver starts there
    assert driver.binding().mode == DRA
    (whole,) = [gpu for node in driver.inventory() if node.name == "gpu-b" for gpu in node.gpus][:1]
    driver.bind_namespace("acme-vision", DRA, ["gpu-b"])  # reads the namespace, annotates it
    driver.apply_claims(
        "acme-vision", "7", [DeviceClaim("gpu-portal-7-1", whole.uuid, True)]
    )  # lists, creates
    assert [(c.namespace, c.name, c.devices) for c in driver.claims()] == [
        ("acme-vision", "gpu-portal-7-1", (whole.uuid,))
    ]
    driver.apply_claims("acme-vision", "7", [])  # deletes it
    versions = {}  # lists each stream, then watches it from there
    for pages in (driver.list_nodes(), driver.list_pods(), driver.list_claims()):
        for page in pages:
            versions.update(page.versions)
    assert set(versions) == {NODES, SLICES, PODS, CLAIMS}
    server.publish_gpu_slices("gpu-a")
    seen = []
    for item in driver.watch(versions, seconds=10):
        seen.append(item)
        if isinstance(item, CaughtUp):
            break
    assert {item.name for item in seen if isinstance(item, NodeChange)} == {
        "gpu-a"
    }  # its devices, read again
    assert sync_inventory(cluster=cluster).ok


def test_the_driver_does_everything_with_the_portal_account_and_uses_every_grant(kube, tmp_path, db):
    cluster = portal_cluster(kube, tmp_path)

    drive_the_whole_protocol(cluster, kube)

    assert kube.denials == []
    assert kube.get("ResourceQuota", "gpu-portal", "acme-vision") is None
    assert kube.get("ConfigMap", "custom-mig-parted-config", "gpu-operator") is not None
    assert set(kube.get("ConfigMap", "gpu-portal-device-plugin", "gpu-operator")["data"]) == {
        "portal-ts-4",
        "portal-mps-2",
    }
    grants = [g for g in kube.grants if g.user == USER and g.request.is_resource]
    used = {(g.role[2], g.rule, g.request.verb, g.request.group, g.request.combined_resource) for g in grants}
    for manifest in manifests():
        if manifest.kind not in ROLES:
            continue
        for index, rule in enumerate(manifest.obj["rules"]):
            for verb in rule["verbs"]:
                for group in rule["apiGroups"]:
                    for resource in rule["resources"]:
                        assert (manifest.name, index, verb, group, resource) in used, (
                            f"{manifest.kind} {manifest.name} grants {verb} {resource}, never used"
                        )
    assert {g.role for g in grants} == {
        ("ClusterRole", "", "gpu-portal"),
        ("Role", "gpu-operator", "gpu-portal-mig-config"),
        ("ClusterRole", "", "system:basic-user"),  # every account's: who am I (a SelfSubjectReview)
    }


@pytest.mark.parametrize("taken", granted_verbs(), ids=lambda t: f"{t[0]}-rule{t[1]}-{t[2]}")
def test_every_granted_verb_is_needed(taken, tmp_path, db):
    server = start_cluster(tmp_path, portal_objects(without=taken))
    try:
        cluster = portal_cluster(server, tmp_path)
        with pytest.raises(ClusterUnauthorised, match="refused our credentials"):
            drive_the_whole_protocol(cluster, server)
        name, index, verb = taken
        (role,) = [m.obj for m in manifests() if m.kind in ROLES and m.name == name]
        (denied_user, denied), *_ = server.denials
        assert denied_user == USER
        assert (denied.verb, denied.resource) in {(verb, r) for r in role["rules"][index]["resources"]}
    finally:
        server.stop()


def forbidden(kube: KubeApiServer, tmp_path, call) -> dict:
    token = kube.service_account_token(*ACCOUNT)
    api_client: ApiClient = new_client_from_config(
        config_file=str(kube.write_kubeconfig(tmp_path / "portal", token=token))
    )
    try:
        with pytest.raises(ApiException) as raised:
            call(CoreV1Api(api_client), api_client)
    finally:
        api_client.close()
    assert raised.value.status == 403
    return json.loads(raised.value.body)


OUTSIDE_THE_GRANTS = [
    (
        "delete-a-node",
        lambda core, _: core.delete_node("gpu-a"),
        'nodes "gpu-a" is forbidden: User "{user}" cannot delete resource "nodes" in API group "" at the '
        "cluster scope",
    ),
    (
        "list-secrets",
        lambda core, _: core.list_namespaced_secret("gpu-portal"),
        'secrets is forbidden: User "{user}" cannot list resource "secrets" in API group "" in the namespace '
        '"gpu-portal"',
    ),
    (
        "read-the-operators-own-config",
        lambda core, _: core.read_namespaced_config_map("default-mig-parted-config", "gpu-operator"),
        'configmaps "default-mig-parted-config" is forbidden: User "{user}" cannot get resource "configmaps" '
        'in API group "" in the namespace "gpu-operator"',
    ),
    (
        "replace-the-device-plugin-configs",  # a patch adds the portal's keys; no write replaces the others
        lambda core, _: core.replace_namespaced_config_map(
            "gpu-portal-device-plugin",
            "gpu-operator",
            V1ConfigMap(metadata=V1ObjectMeta(name="gpu-portal-device-plugin"), data={}),
        ),
        'configmaps "gpu-portal-device-plugin" is forbidden: User "{user}" cannot update resource '
        '"configmaps" in API group "" in the namespace "gpu-operator"',
    ),
    (
        "create-a-config-map-elsewhere",
        lambda core, _: core.create_namespaced_config_map(
            "gpu-portal", V1ConfigMap(metadata=V1ObjectMeta(name="x"))
        ),
        'configmaps is forbidden: User "{user}" cannot create resource "configmaps" in API group "" in the '
        'namespace "gpu-portal"',
    ),
    (
        "list-namespaces",
        lambda core, _: core.list_namespace(),
        'namespaces is forbidden: User "{user}" cannot list resource "namespaces" in API group "" at the '
        "cluster scope",
    ),
    (
        "delete-a-namespace",
        lambda core, _: core.delete_namespace("acme-train"),
        'namespaces "acme-train" is forbidden: User "{user}" cannot delete resource "namespaces" in API '
        'group "" in the namespace "acme-train"',
    ),
    (
        "read-a-pod",
        lambda core, _: core.read_namespaced_pod("trainer-0", "acme-train"),
        'pods "trainer-0" is forbidden: User "{user}" cannot get resource "pods" in API group "" in the '
        'namespace "acme-train"',
    ),
    (
        "read-another-admission-policy",
        lambda _, api_client: AdmissionregistrationV1Api(api_client).read_validating_admission_policy(
            "someone-elses"
        ),
        'validatingadmissionpolicies.admissionregistration.k8s.io "someone-elses" is forbidden: User '
        '"{user}" cannot get resource "validatingadmissionpolicies" in API group '
        '"admissionregistration.k8s.io" at the cluster scope',
    ),
    (
        "read-a-claim-template",
        lambda _, api_client: ResourceV1Api(api_client).list_namespaced_resource_claim_template("acme-train"),
        'resourceclaimtemplates.resource.k8s.io is forbidden: User "{user}" cannot list resource '
        '"resourceclaimtemplates" in API group "resource.k8s.io" in the namespace "acme-train"',
    ),
    (
        "change-its-own-role",
        lambda _, api_client: RbacAuthorizationV1Api(api_client).patch_cluster_role(
            "gpu-portal", {"rules": []}
        ),
        'clusterroles.rbac.authorization.k8s.io "gpu-portal" is forbidden: User "{user}" cannot patch '
        'resource "clusterroles" in API group "rbac.authorization.k8s.io" at the cluster scope',
    ),
]


@pytest.mark.parametrize(
    ("call", "message"), [case[1:] for case in OUTSIDE_THE_GRANTS], ids=[c[0] for c in OUTSIDE_THE_GRANTS]
)
def test_anything_else_is_forbidden(kube, tmp_path, call, message):
    body = forbidden(kube, tmp_path, call)

    assert (body["kind"], body["status"], body["reason"], body["code"]) == (
        "Status",
        "Failure",
        "Forbidden",
        403,
    )
    assert body["message"] == message.format(user=USER)
    assert kube.get("Node", "gpu-a") is not None
    assert kube.get("ClusterRole", "gpu-portal")["rules"]
