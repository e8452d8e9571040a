"""The admission policy the portal applies to every Kubernetes cluster it manages, as plain objects.

Words used here:
- managed namespace: one the portal created for a project (labelled NAMESPACE_LABELS); the policy binds
  only there, so nothing outside the portal's namespaces is refused by it.
- the portal: the user the cluster knows the portal's credentials as (a SelfSubjectReview tells it).
- confined: a pod that can only be scheduled on the nodes where its namespace's pools hold GPUs: its
  `nodeName`, a `kubernetes.io/hostname` node selector, or a required node affinity on that label names
  only such nodes. The portal writes those nodes, and the namespace's binding mode, as annotations of
  the namespace (`NODES_ANNOTATION`, `BINDING_ANNOTATION`); tenants cannot change a namespace.

What the policy refuses, in managed namespaces:
- a ResourceClaim or ResourceClaimTemplate created by anyone but the portal, or changed by anyone else in
  its devices (`spec`) or labels: claims select exact devices, so only the portal may hand them out;
- under DRA, a pod asking for a GPU's extended resources (`nvidia.com/gpu`, `nvidia.com/mig-…`) instead of
  naming its pool's claims; shares of a GPU (`nvidia.com/gpu.shared`) are still asked for that way, as a
  claim cannot hold a shared GPU;
- a pod asking for any `nvidia.com/` resource that is not confined to its namespace's nodes.

The checks are CEL of the Kubernetes standard library only (no `split`, no optional fields), so that a
cluster from 1.30, when ValidatingAdmissionPolicy became GA, evaluates them as written.
"""

from __future__ import annotations

import json
from collections.abc import Iterable

from django.utils.translation import gettext as _

from pools.drivers.base import NAMESPACE_LABELS

NAME = "gpu-portal-binding"
ADMISSION_API = "admissionregistration.k8s.io/v1"
BINDING_ANNOTATION = "gpu-portal/binding"  # the cluster's binding mode: dra or device-plugin
NODES_ANNOTATION = "gpu-portal/nodes"  # the nodes where the namespace's pools hold GPUs, comma-separated
HOSTNAME_LABEL = "kubernetes.io/hostname"
SHARED_RESOURCE = "nvidia.com/gpu.shared"
DRA_MODE = "dra"

_CLAIM_RESOURCES = ["resourceclaims", "resourceclaimtemplates"]
_PORTAL_USER = "$PORTAL_USER"  # replaced by the user name, as a CEL string

_VARIABLES = {
    "portal": f"request.userInfo.username == {_PORTAL_USER}",
    "annotations": ("has(namespaceObject.metadata.annotations) ? namespaceObject.metadata.annotations : {}"),
    "binding": f"'{BINDING_ANNOTATION}' in variables.annotations ? "
    f"variables.annotations['{BINDING_ANNOTATION}'] : ''",
    "nodes": f"',' + ('{NODES_ANNOTATION}' in variables.annotations ? "
    f"variables.annotations['{NODES_ANNOTATION}'] : '') + ','",
    "isPod": "request.resource.group == '' && request.resource.resource == 'pods'",
    "containers": "variables.isPod ? object.spec.containers + "
    "(has(object.spec.initContainers) ? object.spec.initContainers : []) : []",
    "asked": "variables.containers.map(c, has(c.resources) ? "
    "(has(c.resources.limits) ? c.resources.limits : {}) : {}) + "
    "variables.containers.map(c, has(c.resources) ? "
    "(has(c.resources.requests) ? c.resources.requests : {}) : {})",
    "asksGpu": "variables.asked.exists(r, r.exists(k, k.startsWith('nvidia.com/')))",
    "asksDevice": "variables.asked.exists(r, r.exists(k, k.startsWith('nvidia.com/') "
    f"&& k != '{SHARED_RESOURCE}'))",
    "onNode": "has(object.spec.nodeName) && object.spec.nodeName != ''",
    "pinnedBySelector": f"has(object.spec.nodeSelector) && '{HOSTNAME_LABEL}' in object.spec.nodeSelector "
    f"&& variables.nodes.contains(',' + object.spec.nodeSelector['{HOSTNAME_LABEL}'] + ',')",
    "pinnedByAffinity": "has(object.spec.affinity) && has(object.spec.affinity.nodeAffinity) && "
    "has(object.spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution) && "
    "object.spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms"
    ".all(t, has(t.matchExpressions) && t.matchExpressions.exists(e, "
    f"e.key == '{HOSTNAME_LABEL}' && e.operator == 'In' && "
    "e.values.all(v, variables.nodes.contains(',' + v + ','))))",
    "confined": "variables.onNode ? variables.nodes.contains(',' + object.spec.nodeName + ',') : "
    "(variables.pinnedBySelector || variables.pinnedByAffinity)",
    "keepsClaim": "request.operation == 'UPDATE' && object.spec == oldObject.spec && "
    "(has(object.metadata.labels) ? object.metadata.labels : {}) == "
    "(has(oldObject.metadata.labels) ? oldObject.metadata.labels : {})",
}

_VALIDATIONS = [
    {
        "expression": "request.resource.group != 'resource.k8s.io' || variables.portal "
        "|| variables.keepsClaim",
        "message": "Only the GPU portal may create or change ResourceClaims and ResourceClaimTemplates in "
        "this namespace: the pools of its project hold their GPUs through the portal's claims. Name those "
        "claims in the pod's spec.resourceClaims.",
        "reason": "Forbidden",
    },
    {
        "expression": f"!variables.isPod || variables.binding != '{DRA_MODE}' || !variables.asksDevice",
        "message": "This cluster binds GPUs through Dynamic Resource Allocation: a pod uses its pool's GPUs "
        "by naming the pool's ResourceClaims in spec.resourceClaims, not by asking for nvidia.com/ "
        "resources. The pool's page shows the manifest.",
        "reason": "Forbidden",
    },
    {
        "expression": "!variables.isPod || !variables.asksGpu || variables.confined",
        "message": "A pod that asks for GPUs in this namespace must be pinned to the nodes where its pools "
        f"hold them (the namespace's {NODES_ANNOTATION} annotation), by spec.nodeName, a {HOSTNAME_LABEL} "
        "node selector or a required node affinity on that label. The pool page's manifest shows how.",
        "reason": "Forbidden",
    },
]


def portal_policy(username: str) -> dict:
    """The ValidatingAdmissionPolicy, with `username` as the only one who may create GPU claims."""
    variables = [
        {"name": name, "expression": expression.replace(_PORTAL_USER, json.dumps(username))}
        for name, expression in _VARIABLES.items()
    ]
    return {
        "apiVersion": ADMISSION_API,
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": NAME, "labels": dict(NAMESPACE_LABELS)},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {
                "namespaceSelector": {"matchLabels": dict(NAMESPACE_LABELS)},
                "resourceRules": [
                    {
                        "apiGroups": ["resource.k8s.io"],
                        "apiVersions": ["*"],
                        "operations": ["CREATE", "UPDATE"],
                        "resources": _CLAIM_RESOURCES,
                    },
                    {
                        "apiGroups": [""],
                        "apiVersions": ["v1"],
                        "operations": ["CREATE"],
                        "resources": ["pods"],
                    },
                ],
            },
            "variables": variables,
            "validations": [dict(validation) for validation in _VALIDATIONS],
        },
    }


def portal_policy_binding() -> dict:
    """The binding that puts the policy to work in the portal's namespaces, refusing what it fails."""
    return {
        "apiVersion": ADMISSION_API,
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": NAME, "labels": dict(NAMESPACE_LABELS)},
        "spec": {
            "policyName": NAME,
            "validationActions": ["Deny"],
            "matchResources": {"namespaceSelector": {"matchLabels": dict(NAMESPACE_LABELS)}},
        },
    }


def namespace_annotations(binding: str, nodes: Iterable[str]) -> dict[str, str]:
    """What the policy reads of a managed namespace: the cluster's binding mode, and its pools' nodes."""
    return {BINDING_ANNOTATION: binding, NODES_ANNOTATION: ",".join(sorted(set(nodes)))}


def drift(wanted: dict, found: dict | None) -> str:
    """How an object in the cluster differs from what the portal ships: "missing", "changed", or "" when
    its spec holds everything the portal wrote (the server adds its defaults, which are no drift)."""
    if found is None:
        return "missing"
    return "" if _holds(found.get("spec"), wanted["spec"]) else "changed"


def restored_text(obj: dict, drift: str) -> str:
    """What a driver says of one of the objects it applied again."""
    values = {"kind": obj["kind"], "name": obj["metadata"]["name"]}
    if drift == "missing":
        return _("%(kind)s %(name)s was missing and has been applied.") % values
    return _("%(kind)s %(name)s had been changed in the cluster and has been put back.") % values


def _holds(found: object, wanted: object) -> bool:
    if isinstance(wanted, dict):
        return isinstance(found, dict) and all(_holds(found.get(key), value) for key, value in wanted.items())
    if isinstance(wanted, list):
        return (
            isinstance(found, list)
            and len(found) == len(wanted)
            and all(_holds(f, w) for f, w in zip(found, wanted, strict=True))
        )
    return found == wanted
