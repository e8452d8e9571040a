"""Per-kind write rules of the test API server, as a real server's registry strategies apply them: the
defaults it fills in, the validation it answers with 422, immutable fields, and Secret's `stringData`. Pod
specs have theirs in pod_specs.py, admission policies and their bindings in admission_policies.py; both
report problems that this module raises.

Words used here:
- prepare: what the server does to an object before storing it (server-owned fields, defaults);
- generation: `metadata.generation`, which a real server starts at 1 and raises on every change of `spec`
  for the kinds whose controllers report `status.observedGeneration`;
- invalid: a 422 with reason Invalid and a message in the real server's form
  (`Deployment.apps "web" is invalid: spec.selector: Required value`).
"""

from __future__ import annotations

import base64
import binascii
import ipaddress
import itertools
from copy import deepcopy
from typing import Any

from tests.kube import admission_policies, pod_specs
from tests.kube.semantics import ApiError, label_matcher
from tests.kube.store import Resource

_GENERATION_KINDS = {
    "Deployment",
    "Job",
    "Ingress",
    "PodDisruptionBudget",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
}
_PDB_STATUS = {"disruptionsAllowed": 0, "currentHealthy": 0, "desiredHealthy": 0, "expectedPods": 0}
_INITIAL_STATUS: dict[str, dict[str, Any]] = {
    "Deployment": {},
    "Job": {},
    "Service": {"loadBalancer": {}},
    "Ingress": {"loadBalancer": {}},
    "PodDisruptionBudget": _PDB_STATUS,
    "ResourceClaim": {},
    "Pod": {"phase": "Pending"},
    "ValidatingAdmissionPolicy": {},
}
_SERVICE_NETWORK = ipaddress.ip_network("10.96.0.0/16")
# Cluster IPs are handed out in order, from .2 (.1 is the API server's own); a count is safe across threads.
_cluster_ip_count = itertools.count()
_JOB_RESTART_POLICIES = ("Never", "OnFailure")
_IMMUTABLE = "Invalid value: field is immutable"
_BINDING_ROLE_KINDS = {"RoleBinding": ("Role", "ClusterRole"), "ClusterRoleBinding": ("ClusterRole",)}
_SUBJECT_KINDS = ("ServiceAccount", "User", "Group")
RBAC_GROUP = "rbac.authorization.k8s.io"


def invalid(resource: Resource, name: str, field: str, problem: str) -> ApiError:
    qualified = f"{resource.kind}.{resource.group}" if resource.group else resource.kind
    return ApiError(
        422, f'{qualified} "{name}" is invalid: {field}: {problem}', name=name, kind=resource.plural
    )


def prepare_create(resource: Resource, obj: dict) -> None:
    """Defaults and server-owned fields of a new object (changed in place); raises ApiError when invalid."""
    metadata = obj["metadata"]
    metadata.pop("generation", None)
    if resource.kind in _GENERATION_KINDS:
        metadata["generation"] = 1
    if resource.kind in _INITIAL_STATUS:
        # Status belongs to controllers: whatever a client sends with a new object is dropped.
        obj["status"] = deepcopy(_INITIAL_STATUS[resource.kind])
    _normalise(resource, obj)
    if resource.kind == "Service":
        _allocate_cluster_ip(obj)
    if resource.kind == "Job":
        _select_own_pods(obj)
    validate(resource, obj)


def prepare_update(resource: Resource, current: dict, obj: dict) -> None:
    """Carries over what a write may not change and raises the generation when `spec` changed."""
    _normalise(resource, obj)
    if resource.kind == "Service":
        _keep_cluster_ip(resource, current, obj)
    if resource.kind == "Job":
        _keep_job_pod_template(resource, current, obj)
    if resource.kind == "ResourceClaim" and obj.get("spec") != current.get("spec"):
        raise invalid(resource, current["metadata"]["name"], "spec", _IMMUTABLE)
    if resource.kind == "Pod":
        _raise_first(resource, current["metadata"]["name"], pod_specs.update_problem(current, obj))
    if resource.kind in _BINDING_ROLE_KINDS and obj.get("roleRef") != current.get("roleRef"):
        raise invalid(
            resource, current["metadata"]["name"], "roleRef", "Invalid value: cannot change roleRef"
        )
    generation = current["metadata"].get("generation")
    if generation is not None:
        changed = obj.get("spec") != current.get("spec")
        obj["metadata"]["generation"] = generation + 1 if changed else generation
    validate(resource, obj)


def _normalise(resource: Resource, obj: dict) -> None:
    if resource.kind == "Secret":
        _fold_string_data(obj)
    elif resource.kind == "Deployment" and isinstance(obj.get("spec"), dict):
        _default_deployment(obj["spec"])
    elif resource.kind == "Service":
        _default_service(obj.setdefault("spec", {}))
    elif resource.kind == "Pod" and isinstance(obj.get("spec"), dict):
        pod_specs.default_pod_spec(obj["spec"])
    elif resource.kind == "ValidatingAdmissionPolicy":
        admission_policies.default_policy(obj)
    elif resource.kind == "ValidatingAdmissionPolicyBinding":
        admission_policies.default_binding(obj)


# --- Secret ----------------------------------------------------------------------------------------------


def _fold_string_data(secret: dict) -> None:
    """A real server merges `stringData` into `data` (base64, stringData winning) and never stores it."""
    data = secret.get("data") or {}
    if not isinstance(data, dict):
        raise ApiError(400, "data must map strings to base64 strings")
    for key, value in data.items():
        try:
            base64.b64decode(str(value), validate=True)
        except (binascii.Error, ValueError) as error:
            raise ApiError(400, f"data[{key}]: illegal base64 data: {error}") from error
    string_data = secret.pop("stringData", None) or {}
    if not isinstance(string_data, dict) or not all(isinstance(v, str) for v in string_data.values()):
        raise ApiError(400, "stringData must map strings to strings")
    data = {**data, **{key: base64.b64encode(value.encode()).decode() for key, value in string_data.items()}}
    if data:
        secret["data"] = data
    secret.setdefault("type", "Opaque")


# --- Deployment, Job --------------------------------------------------------------------------------------


def _default_deployment(spec: dict) -> None:
    spec.setdefault("replicas", 1)
    spec.setdefault("revisionHistoryLimit", 10)
    spec.setdefault("progressDeadlineSeconds", 600)
    strategy = spec.setdefault("strategy", {})
    if isinstance(strategy, dict):
        strategy.setdefault("type", "RollingUpdate")
        if strategy["type"] == "RollingUpdate":
            rolling = strategy.setdefault("rollingUpdate", {})
            if isinstance(rolling, dict):
                rolling.setdefault("maxSurge", "25%")
                rolling.setdefault("maxUnavailable", "25%")
    template = spec.get("template")
    if isinstance(template, dict) and isinstance(template.get("spec"), dict):
        pod_specs.default_pod_spec(template["spec"])


def _select_own_pods(job: dict) -> None:
    """Without `manualSelector`, a real server selects the Job's pods by its uid and labels the template."""
    spec = job.setdefault("spec", {})
    spec.setdefault("backoffLimit", 6)
    spec.setdefault("completions", 1)
    spec.setdefault("parallelism", 1)
    spec.setdefault("completionMode", "NonIndexed")
    spec.setdefault("suspend", False)
    template = spec.get("template")
    if not isinstance(template, dict):
        return
    if isinstance(template.get("spec"), dict):
        pod_specs.default_pod_spec(template["spec"])
    if spec.get("manualSelector"):
        return
    uid, name = job["metadata"]["uid"], job["metadata"]["name"]
    spec["selector"] = {"matchLabels": {"batch.kubernetes.io/controller-uid": uid}}
    template_metadata = template.setdefault("metadata", {})
    template_metadata["labels"] = {
        **(template_metadata.get("labels") or {}),
        "batch.kubernetes.io/controller-uid": uid,
        "batch.kubernetes.io/job-name": name,
        "controller-uid": uid,
        "job-name": name,
    }


def _keep_job_pod_template(resource: Resource, current: dict, obj: dict) -> None:
    spec, stored = obj.setdefault("spec", {}), current.get("spec", {})
    if "selector" not in spec and "selector" in stored:
        spec["selector"] = deepcopy(stored["selector"])
    for field in ("template", "selector"):
        if spec.get(field) != stored.get(field):
            raise invalid(resource, current["metadata"]["name"], f"spec.{field}", _IMMUTABLE)


# --- Service ---------------------------------------------------------------------------------------------


def _default_service(spec: dict) -> None:
    spec.setdefault("type", "ClusterIP")
    spec.setdefault("sessionAffinity", "None")
    spec.setdefault("ipFamilies", ["IPv4"])
    spec.setdefault("ipFamilyPolicy", "SingleStack")
    spec.setdefault("internalTrafficPolicy", "Cluster")
    for port in spec.get("ports") or []:
        if isinstance(port, dict):
            port.setdefault("protocol", "TCP")
            port.setdefault("targetPort", port.get("port"))


def _allocate_cluster_ip(service: dict) -> None:
    spec = service["spec"]
    if spec.get("clusterIP") in (None, ""):  # a requested address (or "None", headless) is kept
        offset = 2 + next(_cluster_ip_count) % (_SERVICE_NETWORK.num_addresses - 3)
        spec["clusterIP"] = str(_SERVICE_NETWORK[offset])
    spec["clusterIPs"] = [spec["clusterIP"]]


def _keep_cluster_ip(resource: Resource, current: dict, obj: dict) -> None:
    spec, stored = obj["spec"], current.get("spec", {})
    if spec.get("clusterIP") in (None, ""):
        spec["clusterIP"] = stored.get("clusterIP")
    if spec["clusterIP"] != stored.get("clusterIP"):
        raise invalid(resource, current["metadata"]["name"], "spec.clusterIP", _IMMUTABLE)
    spec["clusterIPs"] = [spec["clusterIP"]]


# --- validation ------------------------------------------------------------------------------------------


def validate(resource: Resource, obj: dict) -> None:
    """The checks of a real server that a wrong manifest would meet first; others are not imitated."""
    name = obj["metadata"]["name"]
    spec = obj.get("spec") if isinstance(obj.get("spec"), dict) else {}
    if resource.kind == "Deployment":
        _validate_deployment(resource, name, spec)
    elif resource.kind == "Pod":
        _raise_first(resource, name, pod_specs.pod_problem(spec))
    elif resource.kind == "ValidatingAdmissionPolicy":
        _raise_first(resource, name, admission_policies.policy_problem(obj))
    elif resource.kind == "ValidatingAdmissionPolicyBinding":
        _raise_first(resource, name, admission_policies.binding_problem(obj))
    elif resource.kind == "Job":
        template = spec.get("template") or {}
        _raise_first(resource, name, pod_specs.container_problem("spec.template.spec", template.get("spec")))
        policy = (template.get("spec") or {}).get("restartPolicy")
        if policy not in _JOB_RESTART_POLICIES:
            raise invalid(
                resource,
                name,
                "spec.template.spec.restartPolicy",
                f'Unsupported value: "{policy}": supported values: "OnFailure", "Never"',
            )
    elif resource.kind == "Service":
        if not spec.get("ports") and spec.get("clusterIP") != "None":
            raise invalid(resource, name, "spec.ports", "Required value")
    elif resource.kind == "PodDisruptionBudget":
        if "minAvailable" in spec and "maxUnavailable" in spec:
            raise invalid(
                resource, name, "spec", "Invalid value: minAvailable and maxUnavailable cannot both be set"
            )
    elif resource.kind == "Ingress":
        _validate_ingress(resource, name, spec)
    elif resource.kind in ("Role", "ClusterRole"):
        _validate_rules(resource, name, obj.get("rules") or [])
    elif resource.kind in _BINDING_ROLE_KINDS:
        _validate_binding(resource, name, obj)
    elif resource.kind == "ResourceClaim":
        _validate_requests(
            resource, name, "spec.devices.requests", (spec.get("devices") or {}).get("requests")
        )
    elif resource.kind == "ResourceClaimTemplate":
        claim_spec = spec.get("spec") if isinstance(spec.get("spec"), dict) else {}
        requests = (claim_spec.get("devices") or {}).get("requests")
        _validate_requests(resource, name, "spec.spec.devices.requests", requests)
    elif resource.kind == "ResourceSlice":
        for field, value in (
            ("spec.driver", spec.get("driver")),
            ("spec.pool.name", (spec.get("pool") or {}).get("name")),
        ):
            if not value:
                raise invalid(resource, name, field, "Required value")


def _raise_first(resource: Resource, name: str, problem: tuple[str, str] | None) -> None:
    if problem is not None:
        raise invalid(resource, name, *problem)


def _validate_deployment(resource: Resource, name: str, spec: dict) -> None:
    selector = spec.get("selector")
    selects = isinstance(selector, dict) and (selector.get("matchLabels") or selector.get("matchExpressions"))
    if not selects:
        raise invalid(resource, name, "spec.selector", "Required value")
    template = spec.get("template") or {}
    labels = (template.get("metadata") or {}).get("labels") or {}
    match_labels = selector.get("matchLabels") or {}
    terms = ",".join(f"{key}={value}" for key, value in match_labels.items())
    if not label_matcher(terms)(labels):
        raise invalid(
            resource,
            name,
            "spec.template.metadata.labels",
            f"Invalid value: {labels!r}: `selector` does not match template `labels`",
        )
    _raise_first(resource, name, pod_specs.container_problem("spec.template.spec", template.get("spec")))
    replicas = spec.get("replicas", 1)
    if not isinstance(replicas, int) or replicas < 0:
        raise invalid(resource, name, "spec.replicas", "Invalid value: must be greater than or equal to 0")
    strategy = spec.get("strategy") or {}
    if strategy.get("type") == "Recreate" and strategy.get("rollingUpdate") is not None:
        raise invalid(
            resource,
            name,
            "spec.strategy.rollingUpdate",
            "Forbidden: may not be specified when strategy `type` is 'Recreate'",
        )


def _validate_ingress(resource: Resource, name: str, spec: dict) -> None:
    for rule_index, rule in enumerate(spec.get("rules") or []):
        for path_index, path in enumerate(((rule.get("http") or {}).get("paths")) or []):
            field = f"spec.rules[{rule_index}].http.paths[{path_index}]"
            if path.get("pathType") not in ("Exact", "Prefix", "ImplementationSpecific"):
                raise invalid(resource, name, f"{field}.pathType", "Required value")
            if not (path.get("backend") or {}).get("service"):
                raise invalid(resource, name, f"{field}.backend", "Required value")


def _validate_rules(resource: Resource, name: str, rules: list) -> None:
    for index, rule in enumerate(rules):
        if not rule.get("verbs"):
            raise invalid(resource, name, f"rules[{index}].verbs", "Required value")
        if rule.get("resources") and not rule.get("apiGroups"):
            raise invalid(resource, name, f"rules[{index}].apiGroups", "Required value")
        if rule.get("nonResourceURLs") and resource.kind == "Role":
            raise invalid(
                resource, name, f"rules[{index}].nonResourceURLs", "Invalid value: not allowed in a Role"
            )


def _validate_binding(resource: Resource, name: str, binding: dict) -> None:
    role_ref = binding.get("roleRef") or {}
    if role_ref.get("apiGroup") != RBAC_GROUP:
        raise invalid(resource, name, "roleRef.apiGroup", f'Unsupported value: "{role_ref.get("apiGroup")}"')
    if role_ref.get("kind") not in _BINDING_ROLE_KINDS[resource.kind]:
        raise invalid(resource, name, "roleRef.kind", f'Unsupported value: "{role_ref.get("kind")}"')
    if not role_ref.get("name"):
        raise invalid(resource, name, "roleRef.name", "Required value")
    for index, subject in enumerate(binding.get("subjects") or []):
        if subject.get("kind") not in _SUBJECT_KINDS:
            field, problem = f"subjects[{index}].kind", f'Unsupported value: "{subject.get("kind")}"'
            raise invalid(resource, name, field, problem)
        if not subject.get("name"):
            raise invalid(resource, name, f"subjects[{index}].name", "Required value")
        if (
            subject["kind"] == "ServiceAccount"
            and resource.kind == "ClusterRoleBinding"
            and not subject.get("namespace")
        ):
            raise invalid(resource, name, f"subjects[{index}].namespace", "Required value")


def _validate_requests(resource: Resource, name: str, field: str, requests: Any) -> None:
    """Each device request has a name and exactly one of `exactly` (with a device class) or
    `firstAvailable`."""
    for index, request in enumerate(requests or []):
        where = f"{field}[{index}]"
        if not request.get("name"):
            raise invalid(resource, name, f"{where}.name", "Required value")
        if ("exactly" in request) == ("firstAvailable" in request):
            raise invalid(
                resource,
                name,
                where,
                "Invalid value: exactly one of `exactly` or `firstAvailable` is required",
            )
        if "exactly" in request and not (request["exactly"] or {}).get("deviceClassName"):
            raise invalid(resource, name, f"{where}.exactly.deviceClassName", "Required value")
