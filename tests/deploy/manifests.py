"""The portal's own deployment as data for its tests: the Kubernetes manifests under deploy/kubernetes in
kustomization order, lookups by kind and name, and applying them through the official client."""

from __future__ import annotations

from collections.abc import Iterator
from copy import deepcopy
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client, utils

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
KUBERNETES = DEPLOY / "kubernetes"
KUSTOMIZATION = KUBERNETES / "kustomization.yaml"


@dataclass(frozen=True)
class Manifest:
    file: str
    obj: dict

    @property
    def kind(self) -> str:
        return self.obj["kind"]

    @property
    def name(self) -> str:
        return self.obj["metadata"]["name"]

    @property
    def namespace(self) -> str:
        return self.obj["metadata"].get("namespace", "")


def kustomization() -> dict:
    return yaml.safe_load(KUSTOMIZATION.read_text())


@cache
def manifests() -> tuple[Manifest, ...]:
    """Every object of every file the kustomization lists, in its order (the order `kubectl` applies).
    Read once per test run: treat the objects as read-only (`apply` copies them)."""
    found = []
    for file in kustomization()["resources"]:
        for obj in yaml.safe_load_all((KUBERNETES / file).read_text()):
            if obj is not None:
                found.append(Manifest(file, obj))
    return tuple(found)


def the(kind: str, name: str) -> dict:
    matches = [m.obj for m in manifests() if m.kind == kind and m.name == name]
    assert len(matches) == 1, f"expected one {kind} {name}, found {len(matches)}"
    return matches[0]


def of_kind(kind: str) -> list[dict]:
    return [m.obj for m in manifests() if m.kind == kind]


def pod_templates() -> Iterator[tuple[str, dict]]:
    """(Kind/name, pod template) of every workload: the Deployments and the migrate Job."""
    for manifest in manifests():
        if manifest.kind in ("Deployment", "Job"):
            yield f"{manifest.kind}/{manifest.name}", manifest.obj["spec"]["template"]


def containers() -> Iterator[tuple[str, dict, dict]]:
    """(Kind/name, pod spec, container) of every container of every workload."""
    for owner, template in pod_templates():
        for container in template["spec"]["containers"]:
            yield owner, template["spec"], container


# --- through the official client ------------------------------------------------------------------------


def _api_and_kind(api_client: client.ApiClient, obj: dict) -> tuple[Any, str]:
    """The client's typed API class and snake_case kind for an object, as create_from_yaml finds them."""
    group, _, version = obj["apiVersion"].rpartition("/")
    group = "".join(word.capitalize() for word in group.removesuffix(".k8s.io").split(".")) or "Core"
    api = getattr(client, f"{group}{version.capitalize()}Api")(api_client)
    kind = "".join(f"_{c.lower()}" if c.isupper() else c for c in obj["kind"]).lstrip("_")
    return api, kind


def apply(api_client: client.ApiClient, objects: list[dict]) -> None:
    """Creates each object in order, as a first `kubectl apply -k` does."""
    for obj in objects:
        utils.create_from_dict(api_client, deepcopy(obj))


def read_back(api_client: client.ApiClient, obj: dict) -> dict:
    """The stored object, read through the client's typed API and serialised back to the API's field names."""
    api, kind = _api_and_kind(api_client, obj)
    metadata = obj["metadata"]
    if "namespace" in metadata and hasattr(api, f"read_namespaced_{kind}"):
        typed = getattr(api, f"read_namespaced_{kind}")(metadata["name"], metadata["namespace"])
    else:
        typed = getattr(api, f"read_{kind}")(metadata["name"])
    return api_client.sanitize_for_serialization(typed)
