"""Validating admission policies as the tests of tests/kube/ write them: two namespaces (one labelled as a
tenant's), a policy on config maps and its binding (or both enforced at once), service accounts that may
write config maps, and the refusal a write met."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from kubernetes import client
from kubernetes.client import ApiException, CoreV1Api
from kubernetes.config import new_client_from_config

from tests.kube.server import KubeApiServer

TENANT = "team-a"  # labelled as a tenant's namespace
OPS = "ops"  # not labelled
TENANT_LABELS = {"tier": "tenant"}


def start_tenant_cluster() -> KubeApiServer:
    server = KubeApiServer().start()
    server.add_namespace(TENANT, labels=TENANT_LABELS)
    server.add_namespace(OPS)
    return server


def config_writer(kube: KubeApiServer, admin, tmp_path: Path, name: str) -> CoreV1Api:
    """A service account of the tenant that may create and patch config maps everywhere."""
    CoreV1Api(admin).create_namespaced_service_account(TENANT, {"metadata": {"name": name}})
    rbac = client.RbacAuthorizationV1Api(admin)
    rule = {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["create", "patch"]}
    if not kube.get("ClusterRole", "config-writer"):
        rbac.create_cluster_role({"metadata": {"name": "config-writer"}, "rules": [rule]})
    rbac.create_cluster_role_binding(
        {
            "metadata": {"name": f"config-writer-{name}"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "config-writer",
            },
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": TENANT}],
        }
    )
    token = kube.service_account_token(TENANT, name)
    return CoreV1Api(
        new_client_from_config(config_file=str(kube.write_kubeconfig(tmp_path / name, token=token)))
    )


def policy(name: str, validations: list[dict], **spec) -> dict:
    """A policy on config maps (create and update) unless `matchConstraints` says otherwise."""
    rule = {
        "apiGroups": [""],
        "apiVersions": ["v1"],
        "operations": ["CREATE", "UPDATE"],
        "resources": ["configmaps"],
    }
    return {
        "metadata": {"name": name},
        "spec": {"matchConstraints": {"resourceRules": [rule]}, "validations": validations, **spec},
    }


def binding(name: str, policy_name: str | None = None, actions: tuple[str, ...] = ("Deny",), **spec) -> dict:
    return {
        "metadata": {"name": name},
        "spec": {"policyName": policy_name or name, "validationActions": list(actions), **spec},
    }


def enforce(policies, name: str, validations: list[dict], *, actions=("Deny",), binding_spec=None, **spec):
    policies.create_validating_admission_policy(policy(name, validations, **spec))
    policies.create_validating_admission_policy_binding(
        binding(name, actions=actions, **(binding_spec or {}))
    )


def config_map(name: str, data: dict[str, str] | None = None, labels: dict[str, str] | None = None) -> dict:
    return {"metadata": {"name": name, "labels": labels or {}}, "data": data or {}}


def refusal(call) -> tuple[int, dict]:
    """The code and Status body of a write that must fail."""
    with pytest.raises(ApiException) as raised:
        call()
    return raised.value.status, json.loads(raised.value.body)
