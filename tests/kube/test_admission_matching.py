"""What validating admission policies in the test API server take in, driven through the official client:
resource rules and exclude rules, namespace and object selectors, match conditions, the operations of
create, update, patch and delete, and the `request` and `namespaceObject` a real server passes to CEL."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from kubernetes import client
from kubernetes.client import ApiException, CoreV1Api

from tests.kube.policies import (
    OPS,
    TENANT,
    TENANT_LABELS,
    config_map,
    config_writer,
    enforce,
    refusal,
    start_tenant_cluster,
)
from tests.kube.server import KubeApiServer


@pytest.fixture
def kube() -> Iterator[KubeApiServer]:
    server = start_tenant_cluster()
    yield server
    server.stop()


@pytest.mark.parametrize(
    ("selector", "refused_in"),
    [
        ({"matchLabels": TENANT_LABELS}, {TENANT}),
        ({"matchExpressions": [{"key": "tier", "operator": "In", "values": ["tenant", "x"]}]}, {TENANT}),
        ({"matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["tenant"]}]}, {OPS}),
        ({"matchExpressions": [{"key": "tier", "operator": "Exists"}]}, {TENANT}),
        ({"matchExpressions": [{"key": "tier", "operator": "DoesNotExist"}]}, {OPS}),
        ({}, {TENANT, OPS}),
    ],
    ids=["match-labels", "in", "not-in", "exists", "does-not-exist", "empty"],
)
def test_a_namespace_selector_limits_the_binding_to_labelled_namespaces(
    admin, policies, selector, refused_in
):
    enforce(
        policies,
        "nothing",
        [{"expression": "false"}],
        binding_spec={"matchResources": {"namespaceSelector": selector}},
    )
    core = CoreV1Api(admin)

    refused = set()
    for namespace in (TENANT, OPS):
        try:
            core.create_namespaced_config_map(namespace, config_map("settings"))
        except ApiException:
            refused.add(namespace)

    assert refused == refused_in


def test_a_namespace_selector_takes_in_cluster_scoped_objects_and_a_namespace_by_its_labels(admin, policies):
    rule = {
        "apiGroups": ["", "rbac.authorization.k8s.io"],
        "apiVersions": ["v1"],
        "operations": ["CREATE"],
        "resources": ["namespaces", "clusterroles"],
    }
    enforce(
        policies,
        "no-tenants",
        [{"expression": "false"}],
        matchConstraints={"resourceRules": [rule], "namespaceSelector": {"matchLabels": TENANT_LABELS}},
    )
    core = CoreV1Api(admin)

    core.create_namespace({"metadata": {"name": "plain"}})
    tenant, _ = refusal(lambda: core.create_namespace({"metadata": {"name": "t2", "labels": TENANT_LABELS}}))
    role, _ = refusal(
        lambda: client.RbacAuthorizationV1Api(admin).create_cluster_role(
            {"metadata": {"name": "r"}, "rules": []}
        )
    )

    assert tenant == role == 422


def test_an_object_selector_and_exclude_rules_narrow_the_match(admin, policies):
    enforce(
        policies,
        "guarded",
        [{"expression": "false"}],
        binding_spec={"matchResources": {"objectSelector": {"matchLabels": {"guarded": "yes"}}}},
    )
    rule = {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["*"], "resources": ["*"]}
    exclude = {**rule, "resources": ["secrets"]}
    enforce(
        policies,
        "everything-but-secrets",
        [{"expression": "object.metadata.name != 'forbidden'"}],
        matchConstraints={"resourceRules": [rule], "excludeResourceRules": [exclude]},
    )
    core = CoreV1Api(admin)

    core.create_namespaced_config_map(OPS, config_map("plain"))
    guarded, _ = refusal(
        lambda: core.create_namespaced_config_map(OPS, config_map("g", labels={"guarded": "yes"}))
    )
    core.create_namespaced_secret(OPS, {"metadata": {"name": "forbidden"}})
    named, _ = refusal(lambda: core.create_namespaced_config_map(OPS, config_map("forbidden")))

    assert guarded == named == 422


def test_match_conditions_must_all_hold_for_the_policy_to_apply(admin, policies):
    conditions = [
        {"name": "locked", "expression": "object.metadata.name.startsWith('locked-')"},
        {
            "name": "labelled",
            "expression": "has(object.metadata.labels) && 'owner' in object.metadata.labels",
        },
    ]
    enforce(policies, "locked", [{"expression": "false", "message": "locked"}], matchConditions=conditions)
    core = CoreV1Api(admin)

    core.create_namespaced_config_map(
        OPS, config_map("locked-a")
    )  # unlabelled: the second condition is false
    core.create_namespaced_config_map(OPS, config_map("open-a", labels={"owner": "x"}))
    code, body = refusal(
        lambda: core.create_namespaced_config_map(OPS, config_map("locked-b", labels={"owner": "x"}))
    )

    assert (code, body["message"].rsplit(": ", 1)[1]) == (422, "locked")


def test_a_patch_is_judged_as_an_update_of_the_patched_object(admin, policies):
    rule = {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["UPDATE"], "resources": ["configmaps"]}
    validations = [
        {
            "expression": "object.data.mode == oldObject.data.mode",
            "messageExpression": "request.operation + ' of ' + request.name + ' changes the mode'",
        }
    ]
    enforce(policies, "fixed-mode", validations, matchConstraints={"resourceRules": [rule]})
    core = CoreV1Api(admin)
    core.create_namespaced_config_map(OPS, config_map("settings", {"mode": "safe"}))

    patched = core.patch_namespaced_config_map("settings", OPS, {"data": {"other": "1"}})
    _, body = refusal(lambda: core.patch_namespaced_config_map("settings", OPS, {"data": {"mode": "fast"}}))
    _, replaced = refusal(
        lambda: core.replace_namespaced_config_map("settings", OPS, config_map("settings", {"mode": "fast"}))
    )

    assert patched.data == {"mode": "safe", "other": "1"}
    assert body["message"].endswith("UPDATE of settings changes the mode")
    assert replaced["message"] == body["message"]


def test_a_delete_sees_the_old_object_and_no_object(admin, policies, kube):
    rule = {"apiGroups": [""], "apiVersions": ["*"], "operations": ["DELETE"], "resources": ["*"]}
    validations = [
        {"expression": "object == null && oldObject.metadata.name != 'keep'", "reason": "Forbidden"}
    ]
    enforce(policies, "keep", validations, matchConstraints={"resourceRules": [rule]})
    core = CoreV1Api(admin)
    for name in ("keep", "drop"):
        core.create_namespaced_config_map(OPS, config_map(name))

    core.delete_namespaced_config_map("drop", OPS)
    code, _ = refusal(lambda: core.delete_namespaced_config_map("keep", OPS))

    assert code == 403 and kube.get("ConfigMap", "keep", OPS) is not None


def test_request_and_namespace_object_are_what_a_real_server_passes(admin, policies, kube, tmp_path):
    validations = [
        {"expression": "request.kind == {'group': '', 'version': 'v1', 'kind': 'ConfigMap'}"},
        {"expression": "request.resource.resource == 'configmaps' && request.subResource == ''"},
        {"expression": f"request.namespace == '{TENANT}' && request.operation == 'CREATE'"},
        {"expression": "request.name == object.metadata.name && oldObject == null && params == null"},
        {"expression": "namespaceObject.metadata.labels['tier'] == 'tenant'"},
        {"expression": f"'system:serviceaccounts:{TENANT}' in request.userInfo.groups"},
        {"expression": "request.userInfo.groups.exists(g, g == 'system:authenticated')"},
    ]
    enforce(policies, "request", validations)

    config_writer(kube, admin, tmp_path, "deployer").create_namespaced_config_map(
        TENANT, config_map("settings")
    )
    _, body = refusal(lambda: CoreV1Api(admin).create_namespaced_config_map(TENANT, config_map("other")))

    assert body["message"].endswith("in request.userInfo.groups")  # the admin is not a service account


def test_policies_and_bindings_are_not_judged_by_policies(admin, policies):
    rule = {"apiGroups": ["*"], "apiVersions": ["*"], "operations": ["*"], "resources": ["*"]}
    enforce(policies, "nothing-at-all", [{"expression": "false"}], matchConstraints={"resourceRules": [rule]})

    policies.delete_validating_admission_policy_binding("nothing-at-all")
