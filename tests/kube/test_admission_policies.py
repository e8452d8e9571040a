"""ValidatingAdmissionPolicy and ValidatingAdmissionPolicyBinding as objects of the test API server: stored
with a real server's defaults, refused with its 422 when invalid (every CEL expression must compile), served
in discovery, and under RBAC like any other resource."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from kubernetes import client
from kubernetes.client import ApiException, CoreV1Api
from kubernetes.config import new_client_from_config

from tests.kube.server import KubeApiServer

GROUP = "admissionregistration.k8s.io"
RULE = {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["configmaps"]}


@pytest.fixture
def kube() -> Iterator[KubeApiServer]:
    with KubeApiServer() as server:
        server.add_namespace("apps")
        yield server


def policy_spec(**spec) -> dict:
    return {"matchConstraints": {"resourceRules": [RULE]}, "validations": [{"expression": "true"}], **spec}


def invalid(kube: KubeApiServer, admin, plural: str, body: dict, method: str = "POST") -> str:
    """The field and detail of the 422 a write answers (`spec.x: Required value`). Sent as it is: the
    client's own models would refuse a body without its required fields before sending it."""
    headers = {"Authorization": f"Bearer {kube.token}", "Content-Type": "application/json"}
    if method == "PATCH":
        headers["Content-Type"] = "application/merge-patch+json"
    path = f"{kube.url}/apis/{GROUP}/v1/{plural}" + (
        f"/{body['metadata']['name']}" if method == "PATCH" else ""
    )
    response = admin.rest_client.request(method, path, headers=headers, body=body)
    answer = json.loads(response.read())
    assert (response.status, answer["reason"]) == (422, "Invalid")
    return answer["message"].split(" is invalid: ", 1)[1]


def test_a_policy_and_a_binding_are_stored_with_a_real_servers_defaults(kube, policies):
    created = policies.create_validating_admission_policy({"metadata": {"name": "p"}, "spec": policy_spec()})
    policies.create_validating_admission_policy_binding(
        {
            "metadata": {"name": "b"},
            "spec": {"policyName": "p", "validationActions": ["Deny"], "matchResources": {}},
        }
    )
    patched = policies.patch_validating_admission_policy("p", {"spec": {"failurePolicy": "Ignore"}})
    listed = policies.list_validating_admission_policy_binding()
    stored = kube.get("ValidatingAdmissionPolicyBinding", "b")
    policies.delete_validating_admission_policy_binding("b")

    constraints = created.spec.match_constraints
    assert (created.spec.failure_policy, constraints.match_policy, constraints.resource_rules[0].scope) == (
        "Fail",
        "Equivalent",
        "*",
    )
    assert (created.metadata.generation, patched.metadata.generation) == (1, 2)
    assert stored["spec"]["matchResources"] == {
        "matchPolicy": "Equivalent",
        "namespaceSelector": {},
        "objectSelector": {},
    }
    assert [item.metadata.name for item in listed.items] == ["b"]
    assert policies.list_validating_admission_policy_binding().items == []


@pytest.mark.parametrize(
    ("spec", "problem"),
    [
        (
            {"validations": []},
            "spec.validations: Required value: validations or auditAnnotations must contain at least one "
            "item",
        ),
        ({"validations": [{"message": "no expression"}]}, "spec.validations[0].expression: Required value"),
        (
            {"validations": [{"expression": "object.spec.replicas <= "}]},
            'spec.validations[0].expression: Invalid value: "object.spec.replicas <= ": compilation failed: '
            "ERROR: <input>:1:25: Syntax error: mismatched input '<EOF>'",
        ),
        (
            {"validations": [{"expression": "spec.replicas < 5"}]},
            'spec.validations[0].expression: Invalid value: "spec.replicas < 5": compilation failed: '
            "ERROR: <input>:1:1: undeclared reference to 'spec'",
        ),
        (
            {"validations": [{"expression": "true", "messageExpression": "'a' +"}]},
            "spec.validations[0].messageExpression: Invalid value",
        ),
        (
            {"validations": [{"expression": "object.metadata.name.frobnicate()"}]},
            "found no matching overload for 'frobnicate'",
        ),
        ({"validations": [{"expression": "variables.missing"}]}, "undefined field 'missing'"),
        (
            {"variables": [{"name": "a", "expression": "variables.b"}, {"name": "b", "expression": "1"}]},
            "spec.variables[0].expression: Invalid value",  # only earlier variables may be named
        ),
        (
            {"variables": [{"name": "not-an-identifier", "expression": "1"}]},
            "spec.variables[0].name: Invalid",
        ),
        (
            {"matchConditions": [{"name": "c", "expression": "object.?x"}]},
            "spec.matchConditions[0].expression",
        ),
        ({"matchConditions": [{"expression": "true"}]}, "spec.matchConditions[0].name: Required value"),
        (
            {"validations": [{"expression": "true", "reason": "Teapot"}]},
            "spec.validations[0].reason: Unsupported",
        ),
        ({"failurePolicy": "Maybe"}, 'spec.failurePolicy: Unsupported value: "Maybe"'),
        (
            {"paramKind": {"apiVersion": "v1", "kind": "ConfigMap"}},
            "spec.paramKind: Forbidden: parameters are not supported by the test API server",
        ),
        ({"matchConstraints": {}}, "spec.matchConstraints.resourceRules: Required value"),
        (
            {"matchConstraints": {"resourceRules": [{**RULE, "operations": ["READ"]}]}},
            'spec.matchConstraints.resourceRules[0].operations[0]: Unsupported value: "READ"',
        ),
        (
            {
                "matchConstraints": {
                    "resourceRules": [RULE],
                    "namespaceSelector": {"matchExpressions": [{"key": "a", "operator": "In"}]},
                }
            },
            "spec.matchConstraints.namespaceSelector.matchExpressions[0].values: Required value",
        ),
    ],
    ids=lambda value: "" if isinstance(value, dict) else value.split(":")[0],
)
def test_an_invalid_policy_is_refused_naming_the_field(kube, admin, policies, spec, problem):
    body = {"metadata": {"name": "p"}, "spec": policy_spec(**spec)}

    message = invalid(kube, admin, "validatingadmissionpolicies", body)

    assert message.startswith(problem) or problem in message
    assert policies.list_validating_admission_policy().items == []


def test_the_message_names_the_policy_in_the_real_servers_form(policies):
    body = {
        "metadata": {"name": "p"},
        "spec": policy_spec(validations=[{"expression": "true", "reason": "No"}]),
    }

    with pytest.raises(ApiException) as raised:
        policies.create_validating_admission_policy(body)

    assert json.loads(raised.value.body)["message"] == (
        f'ValidatingAdmissionPolicy.{GROUP} "p" is invalid: spec.validations[0].reason: '
        'Unsupported value: "No": supported values: "Unauthorized", "Forbidden", "Invalid", '
        '"RequestEntityTooLarge"'
    )


def test_audit_annotations_alone_make_a_valid_policy(policies):
    spec = policy_spec(validations=None, auditAnnotations=[{"key": "who", "valueExpression": "request.name"}])

    created = policies.create_validating_admission_policy({"metadata": {"name": "p"}, "spec": spec})

    assert created.spec.audit_annotations[0].key == "who"


def test_an_update_is_validated_too(kube, admin, policies):
    policies.create_validating_admission_policy({"metadata": {"name": "p"}, "spec": policy_spec()})
    patch = {"metadata": {"name": "p"}, "spec": {"validations": [{"expression": "nope"}]}}

    message = invalid(kube, admin, "validatingadmissionpolicies", patch, method="PATCH")

    assert message.startswith('spec.validations[0].expression: Invalid value: "nope"')


@pytest.mark.parametrize(
    ("spec", "problem"),
    [
        ({"validationActions": ["Deny"]}, "spec.policyName: Required value"),
        ({"policyName": "p"}, "spec.validationActions: Required value"),
        (
            {"policyName": "p", "validationActions": ["Block"]},
            'spec.validationActions[0]: Unsupported value: "Block"',
        ),
        (
            {"policyName": "p", "validationActions": ["Deny", "Deny"]},
            "spec.validationActions[1]: Duplicate value",
        ),
        ({"policyName": "p", "validationActions": ["Deny", "Warn"]}, "spec.validationActions: Invalid value"),
        (
            {
                "policyName": "p",
                "validationActions": ["Audit"],
                "matchResources": {"resourceRules": [{**RULE, "scope": "Global"}]},
            },
            'spec.matchResources.resourceRules[0].scope: Unsupported value: "Global"',
        ),
    ],
    ids=["no-policy", "no-actions", "unknown-action", "duplicate-action", "deny-and-warn", "bad-scope"],
)
def test_an_invalid_binding_is_refused_naming_the_field(kube, admin, spec, problem):
    body = {"metadata": {"name": "b"}, "spec": spec}

    message = invalid(kube, admin, "validatingadmissionpolicybindings", body)

    assert message.startswith(problem)


def test_discovery_lists_both_resources_cluster_scoped_with_every_verb(kube, admin):
    headers = {"Authorization": f"Bearer {kube.token}"}

    found = json.loads(
        admin.rest_client.request("GET", f"{kube.url}/apis/{GROUP}/v1", headers=headers).read()
    )

    assert [(r["name"], r["kind"], r["namespaced"], r["verbs"]) for r in found["resources"]] == [
        (plural, kind, False, ["create", "delete", "get", "list", "patch", "update", "watch"])
        for plural, kind in [
            ("validatingadmissionpolicies", "ValidatingAdmissionPolicy"),
            ("validatingadmissionpolicybindings", "ValidatingAdmissionPolicyBinding"),
        ]
    ]


def test_rbac_governs_policies_like_any_other_resource(kube, admin, tmp_path):
    CoreV1Api(admin).create_namespaced_service_account("apps", {"metadata": {"name": "writer"}})
    token = kube.service_account_token("apps", "writer")
    account = new_client_from_config(config_file=str(kube.write_kubeconfig(tmp_path / "writer", token=token)))
    as_writer = client.AdmissionregistrationV1Api(account)
    body = {"metadata": {"name": "p"}, "spec": policy_spec()}

    with pytest.raises(ApiException) as raised:
        as_writer.create_validating_admission_policy(body)
    rbac = client.RbacAuthorizationV1Api(admin)
    rule = {"apiGroups": [GROUP], "resources": ["validatingadmissionpolicies"], "verbs": ["create"]}
    rbac.create_cluster_role({"metadata": {"name": "policy-writer"}, "rules": [rule]})
    rbac.create_cluster_role_binding(
        {
            "metadata": {"name": "policy-writer"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "policy-writer",
            },
            "subjects": [{"kind": "ServiceAccount", "name": "writer", "namespace": "apps"}],
        }
    )
    as_writer.create_validating_admission_policy(body)
    account.close()

    assert raised.value.status == 403
    assert json.loads(raised.value.body)["message"] == (
        f'validatingadmissionpolicies.{GROUP} is forbidden: User "system:serviceaccount:apps:writer" cannot '
        f'create resource "validatingadmissionpolicies" in API group "{GROUP}" at the cluster scope'
    )
    (used,) = [g for g in kube.grants if g.request.is_resource]
    assert (used.role, used.request.resource) == (
        ("ClusterRole", "", "policy-writer"),
        "validatingadmissionpolicies",
    )
