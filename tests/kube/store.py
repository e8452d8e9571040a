"""The test API server's object store: the kinds it serves (core v1, the API groups the portal's own
manifests use, resource.k8s.io for Dynamic Resource Allocation, admissionregistration.k8s.io's validating
admission policies and authentication.k8s.io's SelfSubjectReview), objects by key, one resourceVersion,
each kind's recent history of changes for watches, and the emulated controllers that observe every write.

Stored objects are never changed in place: every write stores a new dict. That lets a LIST take
references to stored objects under the lock and serialise them after releasing it, with no copy of the
store per request, and lets the history keep each change's object before and after it. Callers hold `lock`
around every method here.

Words used here:
- history: per kind, the last `history_limit` changes (as a real server's watch cache keeps them); a watch
  from a resourceVersion is served from it;
- compacted: per kind, the newest resourceVersion whose change is no longer in the history; a watch from an
  older version, or a list continued with a token made before it, is answered 410 Expired, as a real
  server answers once etcd has compacted what it would need.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from tests.kube import objects

Key = tuple[str, str]  # (namespace, or "" for cluster-scoped kinds; name)
Observer = Callable[[str, dict], None]
HISTORY_LIMIT = 10_000  # changes kept per kind


def etcd_path(key: Key) -> str:
    """Where etcd keeps an object, less its kind's prefix: a real server lists in the order of these."""
    namespace, name = key
    return f"{namespace}/{name}" if namespace else name


@dataclass(frozen=True)
class Change:
    """One change of one object: `old` None when it was created, `new` None when it was removed."""

    resource_version: int
    old: dict | None
    new: dict | None


@dataclass(frozen=True)
class Resource:
    plural: str
    kind: str
    namespaced: bool
    verbs: frozenset[str]
    # Kinds whose status belongs to a subresource: a write to the main resource leaves it alone.
    has_status: bool
    group: str = ""  # "" is the core group, served under /api/v1
    version: str = "v1"
    # False for a review: a create answers at once and nothing is stored.
    persisted: bool = True

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version


_ALL_VERBS = frozenset({"list", "watch", "get", "create", "update", "patch", "delete"})
_APPS, _BATCH, _NETWORKING, _POLICY, _RBAC, _RESOURCE, _ADMISSION, _AUTHENTICATION = (
    "apps",
    "batch",
    "networking.k8s.io",
    "policy",
    "rbac.authorization.k8s.io",
    "resource.k8s.io",  # Dynamic Resource Allocation, v1 since Kubernetes 1.34
    "admissionregistration.k8s.io",
    "authentication.k8s.io",
)
# Keyed by (API group, plural). Kinds are unique across groups here, so the store keys objects by kind.
RESOURCES: dict[tuple[str, str], Resource] = {
    (resource.group, resource.plural): resource
    for resource in (
        Resource("nodes", "Node", False, frozenset({"list", "watch", "get", "patch"}), True),
        Resource("pods", "Pod", True, _ALL_VERBS, True),
        Resource("namespaces", "Namespace", False, _ALL_VERBS - {"update"}, True),
        Resource("resourcequotas", "ResourceQuota", True, _ALL_VERBS, True),
        Resource("configmaps", "ConfigMap", True, _ALL_VERBS, False),
        Resource("secrets", "Secret", True, _ALL_VERBS, False),
        Resource("serviceaccounts", "ServiceAccount", True, _ALL_VERBS, False),
        Resource("services", "Service", True, _ALL_VERBS, True),
        Resource("deployments", "Deployment", True, _ALL_VERBS, True, _APPS),
        Resource("jobs", "Job", True, _ALL_VERBS, True, _BATCH),
        Resource("ingresses", "Ingress", True, _ALL_VERBS, True, _NETWORKING),
        Resource("poddisruptionbudgets", "PodDisruptionBudget", True, _ALL_VERBS, True, _POLICY),
        Resource("clusterroles", "ClusterRole", False, _ALL_VERBS, False, _RBAC),
        Resource("clusterrolebindings", "ClusterRoleBinding", False, _ALL_VERBS, False, _RBAC),
        Resource("roles", "Role", True, _ALL_VERBS, False, _RBAC),
        Resource("rolebindings", "RoleBinding", True, _ALL_VERBS, False, _RBAC),
        Resource("deviceclasses", "DeviceClass", False, _ALL_VERBS, False, _RESOURCE),
        Resource("resourceslices", "ResourceSlice", False, _ALL_VERBS, False, _RESOURCE),
        Resource("resourceclaims", "ResourceClaim", True, _ALL_VERBS, True, _RESOURCE),
        Resource("resourceclaimtemplates", "ResourceClaimTemplate", True, _ALL_VERBS, False, _RESOURCE),
        Resource(
            "validatingadmissionpolicies", "ValidatingAdmissionPolicy", False, _ALL_VERBS, True, _ADMISSION
        ),
        Resource(
            "validatingadmissionpolicybindings",
            "ValidatingAdmissionPolicyBinding",
            False,
            _ALL_VERBS,
            False,
            _ADMISSION,
        ),
        Resource(
            "selfsubjectreviews",
            "SelfSubjectReview",
            False,
            frozenset({"create"}),
            False,
            _AUTHENTICATION,
            persisted=False,
        ),
    )
}
_BY_NAME = {
    **{resource.plural: resource for resource in RESOURCES.values()},
    **{resource.kind.lower(): resource for resource in RESOURCES.values()},
}


def resource_for(kind: str) -> Resource:
    """Accepts `Node`, `node` or `nodes`."""
    resource = _BY_NAME.get(kind.lower())
    if resource is None:
        raise KeyError(f"unknown kind {kind!r}; known: {sorted(plural for _, plural in RESOURCES)}")
    return resource


def group_versions() -> dict[str, list[Resource]]:
    """The resources served under each group/version, as discovery lists them."""
    served: dict[str, list[Resource]] = {}
    for resource in RESOURCES.values():
        served.setdefault(resource.api_version, []).append(resource)
    return served


class ClusterStore:
    """Every object of the emulated cluster, keyed per kind, with the cluster-wide resourceVersion."""

    def __init__(self, *, history_limit: int = HISTORY_LIMIT) -> None:
        # Reentrant so a test may hold it around several control calls (e.g. a bulk load) without deadlock.
        self.lock = threading.RLock()
        # Notified after every change: open watches wait on it.
        self.changed = threading.Condition(self.lock)
        self.resource_version = 0
        self._objects: dict[str, dict[Key, dict]] = {resource.kind: {} for resource in RESOURCES.values()}
        self._sorted: dict[str, list[Key] | None] = {kind: None for kind in self._objects}
        self._history: dict[str, deque[Change]] = {kind: deque() for kind in self._objects}
        self.history_limit = history_limit
        self.compacted: dict[str, int] = dict.fromkeys(self._objects, 0)
        # Emulated controllers that follow stored objects: called (lock held) with the kind and the object
        # after each write or removal, whoever made it (REST, a test's control call, another controller).
        self.observers: list[Observer] = []

    def get(self, kind: str, name: str, namespace: str | None = None) -> dict | None:
        """The stored object itself, not a copy: read it, never change it."""
        return self._objects[resource_for(kind).kind].get((namespace or "", name))

    def keys(self, kind: str) -> list[Key]:
        """Sorted as a real server pages, in the order of their etcd keys (`<namespace>/<name>`, or the name).
        Cached until the next insert or remove."""
        keys = self._sorted[kind]
        if keys is None:
            keys = self._sorted[kind] = sorted(self._objects[kind], key=etcd_path)
        return keys

    def by_key(self, kind: str) -> dict[Key, dict]:
        return self._objects[kind]

    def in_namespace(self, kind: str, namespace: str) -> list[dict]:
        return [obj for (ns, _), obj in self._objects[kind].items() if ns == namespace]

    def has_namespace(self, name: str) -> bool:
        return ("", name) in self._objects["Namespace"]

    def insert(self, kind: str, obj: dict) -> dict:
        """Store a new object, filling in what the server owns: uid, creationTimestamp, resourceVersion."""
        metadata = obj["metadata"]
        key = (metadata.get("namespace", ""), metadata["name"])
        if key in self._objects[kind]:
            raise ValueError(f"{kind} {key} already exists")
        metadata["uid"] = metadata.get("uid") or objects.new_uid()
        metadata["creationTimestamp"] = objects.now()
        if kind == "Namespace":
            metadata["labels"] = {
                **(metadata.get("labels") or {}),
                "kubernetes.io/metadata.name": metadata["name"],
            }
        return self._store(kind, key, None, obj)

    def update(self, obj: dict) -> dict:
        """Store a new version of an object under a fresh resourceVersion."""
        kind, key = obj["kind"], (obj["metadata"].get("namespace", ""), obj["metadata"]["name"])
        return self._store(kind, key, self._objects[kind].get(key), obj)

    def remove(self, kind: str, key: Key) -> dict:
        self._sorted[kind] = None
        self.resource_version += 1
        removed = self._objects[kind].pop(key)
        self._record(kind, Change(self.resource_version, removed, None))
        self._notify(kind, removed)
        return removed

    def _store(self, kind: str, key: Key, old: dict | None, obj: dict) -> dict:
        if old is None:
            self._sorted[kind] = None
        self.resource_version += 1
        obj["metadata"]["resourceVersion"] = str(self.resource_version)
        self._objects[kind][key] = obj
        self._record(kind, Change(self.resource_version, old, obj))
        self._notify(kind, obj)
        return obj

    def _record(self, kind: str, change: Change) -> None:
        history = self._history[kind]
        history.append(change)
        while len(history) > self.history_limit:
            self.compacted[kind] = history.popleft().resource_version
        with self.changed:  # reentrant: most writers hold the lock already
            self.changed.notify_all()

    def changes_since(self, kind: str, resource_version: int) -> list[Change] | None:
        """The kind's changes after `resource_version`, oldest first; None when some of them are no longer
        kept (the version is older than the kind's compacted one)."""
        if resource_version < self.compacted[kind]:
            return None
        found: list[Change] = []
        for change in reversed(self._history[kind]):
            if change.resource_version <= resource_version:
                break
            found.append(change)
        found.reverse()
        return found

    def compact(self, kind: str | None = None) -> None:
        """Forget the history of one kind, or of all: every version up to now is compacted."""
        for each in [kind] if kind else list(self._history):
            self._history[each].clear()
            self.compacted[each] = self.resource_version

    def _notify(self, kind: str, obj: dict) -> None:
        for observer in self.observers:
            observer(kind, obj)

    def refresh_quotas(self, namespace: str) -> None:
        """Recompute `status.used` of a namespace's quotas, as the quota controller does after pod changes."""
        quotas = self.in_namespace("ResourceQuota", namespace)
        if not quotas:
            return
        pods = self.in_namespace("Pod", namespace)
        for quota in quotas:
            status = objects.quota_status(quota, pods)
            if status != quota.get("status"):
                self.update({**quota, "metadata": dict(quota["metadata"]), "status": status})
