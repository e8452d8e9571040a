"""Validating admission policies enforced by the test API server, driven through the official client: what
a policy and its binding decide, for the admin as for service accounts, with a real server's Status, codes,
reasons, messages, warnings, audit records and failure policy. What they match is test_admission_matching.py.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from kubernetes.client import ApiException, CoreV1Api

from tests.kube.policies import (
    OPS,
    TENANT,
    TENANT_LABELS,
    binding,
    config_map,
    config_writer,
    enforce,
    policy,
    refusal,
    start_tenant_cluster,
)
from tests.kube.server import KubeApiServer


@pytest.fixture
def kube() -> Iterator[KubeApiServer]:
    server = start_tenant_cluster()
    yield server
    server.stop()


DEPLOYER = f"system:serviceaccount:{TENANT}:deployer"


def test_a_policy_refuses_one_account_and_allows_another(kube, admin, policies, tmp_path):
    only = f"request.userInfo.username == '{DEPLOYER}'"
    enforce(
        policies,
        "only-the-deployer",
        [{"expression": only, "message": "ask the deployer", "reason": "Forbidden"}],
    )
    deployer = config_writer(kube, admin, tmp_path, "deployer")
    intruder = config_writer(kube, admin, tmp_path, "intruder")

    created = deployer.create_namespaced_config_map(TENANT, config_map("settings"))
    code, body = refusal(lambda: intruder.create_namespaced_config_map(TENANT, config_map("other")))

    assert created.metadata.name == "settings"
    cause = (
        "ValidatingAdmissionPolicy 'only-the-deployer' with binding 'only-the-deployer' denied request: "
        "ask the deployer"
    )
    assert (code, body["reason"], body["code"]) == (403, "Forbidden", 403)
    assert body["message"] == f'configmaps "other" is forbidden: {cause}'
    assert body["details"] == {"name": "other", "kind": "configmaps", "causes": [{"message": cause}]}
    assert kube.get("ConfigMap", "other", TENANT) is None


def test_the_admin_token_is_judged_too(kube, admin, policies):
    enforce(policies, "no-admin", [{"expression": "request.userInfo.username != 'kubernetes-admin'"}])

    code, body = refusal(lambda: CoreV1Api(admin).create_namespaced_config_map(OPS, config_map("settings")))

    assert (code, body["reason"]) == (422, "Invalid")  # a validation without `reason`
    assert body["message"].endswith(
        "denied request: failed expression: request.userInfo.username != 'kubernetes-admin'"
    )
    assert kube.grants == [] and kube.denials == []  # RBAC still skips the admin


@pytest.mark.parametrize(
    ("reason", "code"),
    [
        (None, 422),
        ("Invalid", 422),
        ("Forbidden", 403),
        ("Unauthorized", 401),
        ("RequestEntityTooLarge", 413),
    ],
)
def test_the_reason_sets_the_code(admin, policies, reason, code):
    validation = {"expression": "size(object.data) <= 1", **({"reason": reason} if reason else {})}
    enforce(policies, "small", [validation])

    status, body = refusal(
        lambda: CoreV1Api(admin).create_namespaced_config_map(OPS, config_map("big", {"a": "1", "b": "2"}))
    )

    assert (status, body["code"], body["reason"]) == (code, code, reason or "Invalid")


@pytest.mark.parametrize(
    ("validation", "message"),
    [
        (
            {
                "messageExpression": "'has ' + string(size(object.data)) + ' keys, ' + object.metadata.name "
                "+ ' may have 1'"
            },
            "has 2 keys, big may have 1",
        ),
        (
            {"message": "too many keys", "messageExpression": "object.nope"},
            "too many keys",
        ),  # an error falls back
        ({"message": "too many keys", "messageExpression": "'  '"}, "too many keys"),  # so does a blank
        ({"messageExpression": "object.nope"}, "failed expression: size(object.data) <= 1"),
        ({"message": "  too many keys  "}, "too many keys"),
    ],
    ids=["expression", "error-falls-back", "blank-falls-back", "default", "trimmed"],
)
def test_the_message_comes_from_the_message_expression_or_the_message(admin, policies, validation, message):
    enforce(policies, "small", [{"expression": "size(object.data) <= 1", **validation}])

    _, body = refusal(
        lambda: CoreV1Api(admin).create_namespaced_config_map(OPS, config_map("big", {"a": "1", "b": "2"}))
    )

    assert body["message"] == (
        "configmaps \"big\" is forbidden: ValidatingAdmissionPolicy 'small' with binding 'small' "
        f"denied request: {message}"
    )


def test_variables_are_named_through_variables_and_build_on_each_other(admin, policies):
    variables = [
        {"name": "keys", "expression": "has(object.data) ? object.data : {}"},
        {"name": "mode", "expression": "'mode' in variables.keys ? variables.keys['mode'] : 'none'"},
        {"name": "broken", "expression": "object.nope == 1"},  # never named: never evaluated
    ]
    validations = [
        {"expression": "variables.mode in ['safe', 'none']", "messageExpression": "'mode ' + variables.mode"}
    ]
    enforce(policies, "safe-mode", validations, variables=variables)
    core = CoreV1Api(admin)

    core.create_namespaced_config_map(OPS, config_map("empty"))
    core.create_namespaced_config_map(OPS, config_map("safe", {"mode": "safe"}))
    _, body = refusal(lambda: core.create_namespaced_config_map(OPS, config_map("fast", {"mode": "fast"})))

    assert body["message"].endswith("denied request: mode fast")


def test_an_evaluation_error_refuses_under_fail_and_is_ignored_under_ignore(admin, policies, kube):
    validations = [{"expression": "object.data.mode == 'safe'"}]
    enforce(policies, "strict", validations)  # failurePolicy defaults to Fail
    enforce(
        policies,
        "lenient",
        validations,
        failurePolicy="Ignore",
        binding_spec={"matchResources": {"namespaceSelector": {"matchLabels": TENANT_LABELS}}},
    )
    core = CoreV1Api(admin)
    policies.delete_validating_admission_policy_binding("strict")

    core.create_namespaced_config_map(TENANT, {"metadata": {"name": "no-data"}})  # lenient only: ignored
    policies.create_validating_admission_policy_binding(binding("strict"))
    code, body = refusal(lambda: core.create_namespaced_config_map(TENANT, {"metadata": {"name": "again"}}))

    assert policies.read_validating_admission_policy("strict").spec.failure_policy == "Fail"
    assert kube.get("ConfigMap", "no-data", TENANT) is not None
    assert (code, body["reason"]) == (422, "Invalid")
    assert body["message"].endswith(
        "ValidatingAdmissionPolicy 'strict' with binding 'strict' denied request: "
        "expression 'object.data.mode == 'safe'' resulted in error: no such key: data"
    )


def test_a_match_condition_error_follows_the_failure_policy(admin, policies):
    conditions = [{"name": "mode", "expression": "object.data.mode == 'x'"}]
    enforce(policies, "cond", [{"expression": "true"}], matchConditions=conditions)

    code, body = refusal(
        lambda: CoreV1Api(admin).create_namespaced_config_map(OPS, {"metadata": {"name": "a"}})
    )

    assert code == 422 and "resulted in error: no such key: data" in body["message"]


def test_a_binding_without_its_policy_does_nothing_until_the_policy_comes(admin, policies):
    core = CoreV1Api(admin)
    policies.create_validating_admission_policy_binding(binding("waiting", "later"))

    core.create_namespaced_config_map(OPS, config_map("first"))
    policies.create_validating_admission_policy(policy("later", [{"expression": "false"}]))
    code, _ = refusal(lambda: core.create_namespaced_config_map(OPS, config_map("second")))

    assert code == 422


def test_a_policy_without_a_binding_does_nothing(admin, policies):
    policies.create_validating_admission_policy(policy("unbound", [{"expression": "false"}]))

    CoreV1Api(admin).create_namespaced_config_map(OPS, config_map("settings"))


def test_warn_and_audit_actions_let_the_request_through(admin, policies, kube):
    enforce(
        policies,
        "advice",
        [{"expression": "has(object.data)", "message": 'a config map "without" data — none'}],
        actions=("Warn", "Audit"),
    )

    response = CoreV1Api(admin).create_namespaced_config_map(
        OPS, {"metadata": {"name": "bare"}}, _preload_content=False
    )

    assert response.status == 201
    assert [warning.encode("latin-1").decode() for warning in response.headers.getlist("Warning")] == [
        "299 - \"Validation failed for ValidatingAdmissionPolicy 'advice' with binding 'advice': "
        'a config map \\"without\\" data — none"'
    ]
    (audit,) = kube.admission_audits
    assert (audit.policy, audit.binding, audit.expression_index, audit.operation, audit.name) == (
        "advice",
        "advice",
        0,
        "CREATE",
        "bare",
    )
    assert audit.validation_actions == ("Warn", "Audit") and audit.username == "kubernetes-admin"


def test_the_first_denial_wins_and_every_binding_still_warns(admin, policies):
    enforce(policies, "a-first", [{"expression": "false", "message": "first", "reason": "Forbidden"}])
    enforce(policies, "b-second", [{"expression": "false", "message": "second"}])
    enforce(policies, "c-warns", [{"expression": "false", "message": "third"}], actions=("Warn",))

    with pytest.raises(ApiException) as raised:
        CoreV1Api(admin).create_namespaced_config_map(OPS, config_map("settings"))

    assert raised.value.status == 403 and json.loads(raised.value.body)["message"].endswith("request: first")
    assert raised.value.headers.getlist("Warning")[0].endswith(': third"')
