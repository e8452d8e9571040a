"""RBAC in the test API server: a service account's token is authorized by the stored Roles, ClusterRoles
and bindings as a real server authorizes it, refusals are real 403 Status bodies, each allowed request
records the rule that allowed it, and a SelfSubjectReview tells each caller who it is."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client
from kubernetes.client import ApiException, CoreV1Api
from kubernetes.config import new_client_from_config

from tests.kube.rbac import ADMIN_USERNAME, request_info
from tests.kube.server import KubeApiServer

RBAC = "rbac.authorization.k8s.io"
USER = "system:serviceaccount:apps:reader"


@pytest.fixture
def kube() -> Iterator[KubeApiServer]:
    with KubeApiServer() as server:
        server.add_namespace("apps")
        server.add_namespace("other")
        server.add_gpu_node("gpu-a")
        yield server


@pytest.fixture
def admin(kube: KubeApiServer, tmp_path: Path) -> Iterator[client.ApiClient]:
    api_client = new_client_from_config(config_file=str(kube.write_kubeconfig(tmp_path / "admin")))
    yield api_client
    api_client.close()


@pytest.fixture
def account(admin) -> None:
    CoreV1Api(admin).create_namespaced_service_account("apps", {"metadata": {"name": "reader"}})


def as_account(kube: KubeApiServer, tmp_path: Path, name: str = "reader") -> CoreV1Api:
    token = kube.service_account_token("apps", name)
    return CoreV1Api(
        new_client_from_config(config_file=str(kube.write_kubeconfig(tmp_path / name, token=token)))
    )


def grant(
    admin, rules: list[dict], *, namespace: str | None = None, subject: dict | None = None, role_kind=None
):
    """A role with `rules` bound to apps/reader: cluster-wide without `namespace`, else in it."""
    rbac = client.RbacAuthorizationV1Api(admin)
    subject = subject or {"kind": "ServiceAccount", "name": "reader", "namespace": "apps"}
    role_kind = role_kind or ("ClusterRole" if namespace is None else "Role")
    ref = {"apiGroup": RBAC, "kind": role_kind, "name": "granted"}
    if role_kind == "ClusterRole":
        rbac.create_cluster_role({"metadata": {"name": "granted"}, "rules": rules})
    else:
        rbac.create_namespaced_role(namespace, {"metadata": {"name": "granted"}, "rules": rules})
    binding = {"metadata": {"name": "granted"}, "roleRef": ref, "subjects": [subject]}
    if namespace is None:
        rbac.create_cluster_role_binding(binding)
    else:
        rbac.create_namespaced_role_binding(namespace, binding)


def refused(call) -> dict:
    with pytest.raises(ApiException) as raised:
        call()
    assert raised.value.status == 403
    return json.loads(raised.value.body)


@pytest.mark.parametrize(
    ("method", "path", "query", "expected"),
    [
        ("GET", "/api/v1/nodes", {}, ("list", "", "", "nodes", "", "")),
        ("GET", "/api/v1/nodes/n1", {}, ("get", "", "", "nodes", "", "n1")),
        ("GET", "/api/v1/pods", {"watch": "true"}, ("watch", "", "", "pods", "", "")),
        ("POST", "/api/v1/namespaces", {}, ("create", "", "", "namespaces", "", "")),
        ("PATCH", "/api/v1/namespaces/ns1", {}, ("patch", "", "ns1", "namespaces", "", "ns1")),
        ("PUT", "/api/v1/namespaces/ns1/status", {}, ("update", "", "ns1", "namespaces", "status", "ns1")),
        (
            "DELETE",
            "/api/v1/namespaces/ns1/configmaps",
            {},
            ("deletecollection", "", "ns1", "configmaps", "", ""),
        ),
        (
            "GET",
            "/apis/apps/v1/namespaces/ns1/deployments/w/scale",
            {},
            ("get", "apps", "ns1", "deployments", "scale", "w"),
        ),
    ],
)
def test_requests_are_read_as_a_real_server_reads_them(method, path, query, expected):
    info = request_info(method, path, query)

    assert info.is_resource
    assert (info.verb, info.group, info.namespace, info.resource, info.subresource, info.name) == expected


@pytest.mark.parametrize("path", ["/version", "/api", "/api/v1", "/apis", "/apis/apps", "/apis/apps/v1"])
def test_discovery_paths_are_not_resources(path):
    assert not request_info("GET", path, {}).is_resource


def test_a_token_of_an_account_that_does_not_exist_is_unauthorized(kube, tmp_path):
    core = as_account(kube, tmp_path)

    with pytest.raises(ApiException) as raised:
        core.list_node()

    assert raised.value.status == 401


def test_an_account_with_no_binding_is_forbidden_with_a_real_status(kube, tmp_path, account):
    body = refused(lambda: as_account(kube, tmp_path).read_node("gpu-a"))

    assert body == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": f'nodes "gpu-a" is forbidden: User "{USER}" cannot get resource "nodes" in API group "" '
        "at the cluster scope",
        "reason": "Forbidden",
        "details": {"name": "gpu-a", "kind": "nodes"},
        "code": 403,
    }
    assert [(user, info.verb, info.resource) for user, info in kube.denials] == [(USER, "get", "nodes")]


def test_a_cluster_role_allows_its_verbs_and_the_grant_is_recorded(kube, tmp_path, admin, account):
    grant(
        admin,
        [
            {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]},
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]},
        ],
    )
    core = as_account(kube, tmp_path)

    node = core.read_node("gpu-a")
    core.list_pod_for_all_namespaces()
    body = refused(lambda: core.patch_node("gpu-a", {"metadata": {"labels": {"x": "y"}}}))

    assert node.metadata.name == "gpu-a"
    assert [(g.role, g.rule, g.request.verb) for g in kube.grants if g.request.is_resource] == [
        (("ClusterRole", "", "granted"), 0, "get"),
        (("ClusterRole", "", "granted"), 1, "list"),
    ]
    assert "cannot patch resource" in body["message"]


def test_resource_names_limit_get_and_update_and_never_allow_create(kube, tmp_path, admin, account):
    core_admin = CoreV1Api(admin)
    for name in ("mine", "theirs"):
        core_admin.create_namespaced_config_map("other", {"metadata": {"name": name}, "data": {"k": "v"}})
    grant(
        admin,
        [
            {
                "apiGroups": [""],
                "resources": ["configmaps"],
                "resourceNames": ["mine"],
                "verbs": ["get", "update", "create", "list"],
            }
        ],
        namespace="other",
    )
    core = as_account(kube, tmp_path)

    mine = core.read_namespaced_config_map("mine", "other")
    mine.data = {"k": "w"}
    core.replace_namespaced_config_map("mine", "other", mine)
    refusals = [
        refused(lambda: core.read_namespaced_config_map("theirs", "other")),
        refused(lambda: core.create_namespaced_config_map("other", {"metadata": {"name": "mine2"}})),
        refused(lambda: core.list_namespaced_config_map("other")),
    ]

    assert kube.get("ConfigMap", "mine", "other")["data"] == {"k": "w"}
    assert [body["message"].split(" is forbidden")[0] for body in refusals] == [
        'configmaps "theirs"',
        "configmaps",
        "configmaps",
    ]


def test_a_role_binding_grants_only_in_its_namespace(kube, tmp_path, admin, account):
    grant(admin, [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["list"]}], namespace="apps")
    core = as_account(kube, tmp_path)

    core.list_namespaced_config_map("apps")
    body = refused(lambda: core.list_namespaced_config_map("other"))
    across = refused(lambda: core.list_config_map_for_all_namespaces())

    assert body["message"].endswith('in the namespace "other"')
    assert across["message"].endswith("at the cluster scope")


def test_a_role_binding_to_a_cluster_role_grants_it_in_one_namespace(kube, tmp_path, admin, account):
    grant(
        admin,
        [{"apiGroups": [""], "resources": ["resourcequotas"], "verbs": ["get", "list"]}],
        namespace="other",
        role_kind="ClusterRole",
    )
    core = as_account(kube, tmp_path)

    core.list_namespaced_resource_quota("other")
    refused(lambda: core.list_namespaced_resource_quota("apps"))

    (used,) = [g for g in kube.grants if g.request.is_resource]
    assert (used.binding, used.role) == (("RoleBinding", "other", "granted"), ("ClusterRole", "", "granted"))


@pytest.mark.parametrize(
    "subject",
    [
        {"kind": "Group", "name": "system:serviceaccounts:apps", "apiGroup": RBAC},
        {"kind": "Group", "name": "system:serviceaccounts", "apiGroup": RBAC},
        {"kind": "User", "name": USER, "apiGroup": RBAC},
    ],
    ids=["namespace-group", "all-accounts", "user-name"],
)
def test_groups_and_user_names_are_subjects_too(kube, tmp_path, admin, account, subject):
    grant(admin, [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["list"]}], subject=subject)

    assert [n.metadata.name for n in as_account(kube, tmp_path).list_node().items] == ["gpu-a"]


def test_a_rule_of_another_group_or_a_subresource_does_not_match(kube, tmp_path, admin, account):
    grant(
        admin,
        [
            {"apiGroups": ["apps"], "resources": ["nodes"], "verbs": ["list"]},
            {"apiGroups": [""], "resources": ["nodes/status"], "verbs": ["get"]},
        ],
    )
    core = as_account(kube, tmp_path)

    refused(lambda: core.list_node())
    refused(lambda: core.read_node("gpu-a"))


def test_a_wildcard_rule_allows_everything_as_on_a_real_server(kube, tmp_path, admin, account):
    grant(admin, [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}])
    core = as_account(kube, tmp_path)

    core.list_node()
    client.AppsV1Api(core.api_client).list_deployment_for_all_namespaces()


def test_an_account_reads_discovery_through_the_bootstrap_role(kube, tmp_path, account):
    core = as_account(kube, tmp_path)

    version = client.VersionApi(core.api_client).get_code()

    assert version.git_version == "v1.31.0-test"
    (used,) = kube.grants
    assert (used.role, used.request.path) == (("ClusterRole", "", "system:discovery"), "/version/")


def test_the_admin_token_is_not_subject_to_rbac(kube, admin):
    CoreV1Api(admin).list_namespaced_secret("apps")

    assert kube.grants == [] and kube.denials == []


# --- who am I -------------------------------------------------------------------------------------------


def self_subject_review(api_client: client.ApiClient) -> client.V1UserInfo:
    review = client.V1SelfSubjectReview(api_version="authentication.k8s.io/v1", kind="SelfSubjectReview")
    return client.AuthenticationV1Api(api_client).create_self_subject_review(review).status.user_info


def test_a_self_subject_review_tells_the_admin_who_it_is(kube, admin):
    user = self_subject_review(admin)

    assert (user.username, user.groups) == (ADMIN_USERNAME, ["system:masters", "system:authenticated"])


def test_a_self_subject_review_tells_an_account_who_it_is_through_the_basic_user_role(
    kube, tmp_path, account
):
    user = self_subject_review(as_account(kube, tmp_path).api_client)

    assert (user.username, user.groups) == (
        USER,
        ["system:serviceaccounts", "system:serviceaccounts:apps", "system:authenticated"],
    )
    (used,) = [g for g in kube.grants if g.request.is_resource]
    assert (used.binding, used.role, used.request.verb, used.request.resource) == (
        ("ClusterRoleBinding", "", "system:basic-user"),
        ("ClusterRole", "", "system:basic-user"),
        "create",
        "selfsubjectreviews",
    )
    assert kube.objects("SelfSubjectReview") == []  # answered, never stored


def test_a_token_nobody_knows_gets_no_self_subject_review(kube, tmp_path):
    with pytest.raises(ApiException) as raised:
        self_subject_review(as_account(kube, tmp_path).api_client)  # the account was never created

    assert raised.value.status == 401
