"""The example pod manifest of a pool page: which pod runs on which node, and which container uses which of
the pool's GPUs.

A pod runs on one node, so a pool whose instances lie on several nodes gets one pod per node, pinned
there by the node's `kubernetes.io/hostname` label (the cluster's admission policy refuses a GPU pod that
is not pinned to its namespace's nodes). A CUDA process sees one MIG device, so each MIG instance gets a
container of its own; so does each share (`nvidia.com/gpu.shared`: the device plugin refuses a container
asking for more than one); whole GPUs share one container.

A unit is used one of two ways: through the device plugin, by asking for its resource (`nvidia.com/gpu: N`),
or, where the cluster binds through DRA, by naming the ResourceClaim the portal made for it: the pod lists
its claims under `spec.resourceClaims` (each with a name of its own in the pod, `gpu-<n>`), and a
container names those it uses.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from pools.kinds import SHARED_RESOURCE
from pools.mig import FULL_GPU_RESOURCE


@dataclass(frozen=True)
class Unit:
    """One live allocation as the manifest uses it: its node, its resource, and its claim ("" for none)."""

    node: str
    resource: str
    claim: str = ""


@dataclass(frozen=True)
class Container:
    name: str
    resource: str
    count: int
    claims: tuple[str, ...] = ()  # the pod's names of the claims it uses, instead of asking for `resource`


@dataclass(frozen=True)
class Pod:
    name: str
    node: str
    containers: list[Container]
    claims: tuple[tuple[str, str], ...] = ()  # (name in the pod, ResourceClaim)


def _containers(units: list[Unit], refs: dict[str, str]) -> list[Container]:
    containers = []
    gpus = [u for u in units if u.resource == FULL_GPU_RESOURCE]
    if gpus:
        claims = tuple(sorted(refs[u.claim] for u in gpus if u.claim))
        containers.append(Container("gpus", FULL_GPU_RESOURCE, len(gpus), claims))
    others = sorted(
        (u for u in units if u.resource != FULL_GPU_RESOURCE), key=lambda u: (u.resource, u.claim)
    )
    for n, unit in enumerate(others):
        prefix = "share" if unit.resource == SHARED_RESOURCE else "mig"
        claims = (refs[unit.claim],) if unit.claim else ()
        containers.append(Container(f"{prefix}-{n}", unit.resource, 1, claims))
    return containers


def pods(units: Iterable[Unit]) -> list[Pod]:
    """One pod per node, in node order, from the pool's live allocations."""
    by_node: dict[str, list[Unit]] = {}
    for unit in units:
        by_node.setdefault(unit.node, []).append(unit)
    nodes = sorted(by_node)
    found = []
    for n, node in enumerate(nodes, start=1):
        claims = sorted(u.claim for u in by_node[node] if u.claim)
        refs = {claim: f"gpu-{i}" for i, claim in enumerate(claims)}
        found.append(
            Pod(
                "gpu-job" if len(nodes) == 1 else f"gpu-job-{n}",
                node,
                _containers(by_node[node], refs),
                tuple((ref, claim) for claim, ref in refs.items()),
            )
        )
    return found
