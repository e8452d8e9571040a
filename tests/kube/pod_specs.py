"""Pod specs as a real server defaults and validates them, in pods and in the pod templates of Deployments
and Jobs: containers, and the ResourceClaims a pod asks for (Dynamic Resource Allocation).

Words used here:
- problem: a (field, detail) pair such as `("spec.containers[0].image", "Required value")`; kinds.py turns
  the first one into a 422 in the real server's form;
- pod claim: an entry of `spec.resourceClaims`, naming a ResourceClaim (`resourceClaimName`) or a template a
  claim is made from (`resourceClaimTemplateName`), exactly one of the two;
- container claim: an entry of a container's `resources.claims`, naming a pod claim the container uses.

Not imitated: the scheduler (a pod created over HTTP stays Pending with no node unless it names one), the
kubelet, and claims made from templates.
"""

from __future__ import annotations

from collections.abc import Iterator
from copy import deepcopy
from typing import Any

Problem = tuple[str, str]

# What a real server lets an update of a pod's spec change, here: the images and the deadline.
_MUTABLE_CONTAINER_FIELDS = ("image",)
_MUTABLE_SPEC_FIELDS = ("activeDeadlineSeconds",)
_IMMUTABLE_SPEC = (
    "Forbidden: pod updates may not change fields other than `spec.containers[*].image`, "
    "`spec.initContainers[*].image`, `spec.activeDeadlineSeconds`, `spec.tolerations` (only additions to "
    "existing tolerations), `spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it was "
    "previously negative)"
)
_CLAIM_SOURCES = ("resourceClaimName", "resourceClaimTemplateName")
_NO_CLAIM_SOURCE = "Invalid value: must specify one of: `resourceClaimName`, `resourceClaimTemplateName`"
_TWO_CLAIM_SOURCES = (
    "Invalid value: at most one of `resourceClaimName` or `resourceClaimTemplateName` may be specified"
)


def default_pod_spec(pod_spec: dict) -> None:
    pod_spec.setdefault("restartPolicy", "Always")
    pod_spec.setdefault("dnsPolicy", "ClusterFirst")
    pod_spec.setdefault("schedulerName", "default-scheduler")
    pod_spec.setdefault("terminationGracePeriodSeconds", 30)
    pod_spec.setdefault("securityContext", {})
    for container in _containers(pod_spec):
        container.setdefault("imagePullPolicy", _pull_policy(str(container.get("image") or "")))
        container.setdefault("terminationMessagePath", "/dev/termination-log")
        container.setdefault("terminationMessagePolicy", "File")
        for port in container.get("ports") or []:
            if isinstance(port, dict):
                port.setdefault("protocol", "TCP")


def _containers(pod_spec: dict) -> list[dict]:
    every = [*(pod_spec.get("initContainers") or []), *(pod_spec.get("containers") or [])]
    return [container for container in every if isinstance(container, dict)]


def _pull_policy(image: str) -> str:
    """Always for `latest` or no tag at all, as a real server defaults it; a digest pins the image too."""
    last = image.rpartition("/")[2]  # a registry's port is not a tag
    if "@" in last:
        return "IfNotPresent"
    tag = last.rpartition(":")[2] if ":" in last else ""
    return "Always" if tag in ("", "latest") else "IfNotPresent"


def container_problem(field: str, pod_spec: Any) -> Problem | None:
    """Every pod spec needs containers, each with a name and an image."""
    containers = pod_spec.get("containers") if isinstance(pod_spec, dict) else None
    if not containers:
        return f"{field}.containers", "Required value"
    for index, container in enumerate(containers):
        for required in ("name", "image"):
            if not container.get(required):
                return f"{field}.containers[{index}].{required}", "Required value"
    return None


def pod_problem(spec: dict) -> Problem | None:
    return container_problem("spec", spec) or next(_claim_problems(spec), None)


def _claim_problems(spec: dict) -> Iterator[Problem]:
    names: list[str] = []
    for index, claim in enumerate(spec.get("resourceClaims") or []):
        field = f"spec.resourceClaims[{index}]"
        if not claim.get("name"):
            yield f"{field}.name", "Required value"
        elif claim["name"] in names:
            yield f"{field}.name", f'Duplicate value: "{claim["name"]}"'
        names.append(claim.get("name") or "")
        sources = [source for source in _CLAIM_SOURCES if claim.get(source)]
        if not sources:
            yield field, _NO_CLAIM_SOURCE
        elif len(sources) > 1:
            yield field, _TWO_CLAIM_SOURCES
    for list_field in ("initContainers", "containers"):
        for index, container in enumerate(spec.get(list_field) or []):
            yield from _container_claim_problems(
                f"spec.{list_field}[{index}].resources.claims", container, names
            )


def _container_claim_problems(field: str, container: dict, pod_claims: list[str]) -> Iterator[Problem]:
    known = ", ".join(sorted(pod_claims)) if pod_claims else ""
    for index, claim in enumerate((container.get("resources") or {}).get("claims") or []):
        name = claim.get("name") or ""
        if not name:
            yield f"{field}[{index}].name", "Required value"
        elif name not in pod_claims:
            which = f": {known}" if known else " which is empty"
            yield (
                f"{field}[{index}]",
                f'Not found: "{name}": must be one of the names in pod.spec.resourceClaims{which}',
            )


def update_problem(current: dict, pod: dict) -> Problem | None:
    """A pod's spec is fixed once created, but for its images and its deadline."""
    stored = deepcopy(current.get("spec") or {})
    default_pod_spec(stored)  # a pod the test arranged directly carries no defaults
    if _fixed_part(pod.get("spec") or {}) != _fixed_part(stored):
        return "spec", _IMMUTABLE_SPEC
    return None


def _fixed_part(spec: dict) -> dict:
    fixed = {key: value for key, value in spec.items() if key not in _MUTABLE_SPEC_FIELDS}
    for list_field in ("initContainers", "containers"):
        if isinstance(fixed.get(list_field), list):
            fixed[list_field] = [
                {k: v for k, v in container.items() if k not in _MUTABLE_CONTAINER_FIELDS}
                for container in fixed[list_field]
                if isinstance(container, dict)
            ]
    return fixed
