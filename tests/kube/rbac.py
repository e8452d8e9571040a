"""RBAC authorization of the test API server: service-account requests are checked against the Roles,
ClusterRoles and bindings stored in it, as the real RBAC authorizer checks them.

Words used here:
- request info: what a real server reads from a request before authorizing it (verb, API group,
  resource and subresource, namespace, name), or a non-resource path such as `/version`;
- rule: one entry of a role's `rules`; it allows a request when the verb, the API group, the resource
  (`resource/subresource` for a subresource) and, when it lists any, the resource name all match;
- grant: the binding, role and rule that allowed one request, recorded so that a test can see which
  rules were used. A real authorizer stops at the first rule that allows; so does this one;
- user: who a token belongs to, with the groups authentication gives it: the admin token is
  `kubernetes-admin` in `system:masters` (never subject to RBAC, as a real cluster's masters group is not);
  a service account's token is `system:serviceaccount:<namespace>:<name>` in the service-account groups;
- bootstrap roles: what every real cluster carries from the start, bound to every authenticated user:
  `system:discovery`, so that a client may read `/version` and the discovery documents, and
  `system:basic-user`, so that it may ask who it is (a SelfSubjectReview).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from tests.kube.semantics import ApiError
from tests.kube.store import ClusterStore

RBAC_GROUP = "rbac.authorization.k8s.io"
RBAC_API_VERSION = f"{RBAC_GROUP}/v1"
AUTHENTICATED = "system:authenticated"
MASTERS = "system:masters"
ADMIN_USERNAME = "kubernetes-admin"  # the user of the admin token, as kubeadm names a cluster's first admin


@dataclass(frozen=True)
class RequestInfo:
    """A request as the authorizer sees it; `namespace` is also set for a Namespace's own path, as a real
    server sets it, while `scoped` says whether the path went through `namespaces/<ns>/`."""

    path: str
    verb: str
    is_resource: bool
    group: str = ""
    version: str = ""
    namespace: str = ""
    resource: str = ""
    subresource: str = ""
    name: str = ""
    scoped: bool = False

    @property
    def combined_resource(self) -> str:
        return f"{self.resource}/{self.subresource}" if self.subresource else self.resource


_METHOD_VERBS = {"POST": "create", "PUT": "update", "PATCH": "patch"}
_NAMESPACE_SUBRESOURCES = ("status", "finalize")


def request_info(method: str, path: str, query: dict[str, str]) -> RequestInfo:
    """Reads a request the way a real server's request-info resolver does."""
    parts = [part for part in path.split("/") if part]
    if parts[:1] == ["api"] and len(parts) >= 3:
        group, version, rest = "", parts[1], parts[2:]
    elif parts[:1] == ["apis"] and len(parts) >= 4:
        group, version, rest = parts[1], parts[2], parts[3:]
    else:
        return RequestInfo(path=path, verb=method.lower(), is_resource=False)
    namespace, scoped = "", False
    if rest[0] == "namespaces" and len(rest) > 1:
        namespace = rest[1]
        if len(rest) > 2 and rest[2] not in _NAMESPACE_SUBRESOURCES:
            rest, scoped = rest[2:], True
    name = rest[1] if len(rest) > 1 else ""
    if method in ("GET", "HEAD"):
        verb = "get" if name else ("watch" if query.get("watch") in ("true", "1") else "list")
    elif method == "DELETE":
        verb = "delete" if name else "deletecollection"
    else:
        verb = _METHOD_VERBS.get(method, method.lower())
    return RequestInfo(
        path=path,
        verb=verb,
        is_resource=True,
        group=group,
        version=version,
        namespace=namespace,
        resource=rest[0],
        subresource=rest[2] if len(rest) > 2 else "",
        name=name,
        scoped=scoped,
    )


@dataclass(frozen=True)
class ServiceAccountUser:
    namespace: str
    name: str

    @property
    def username(self) -> str:
        return f"system:serviceaccount:{self.namespace}:{self.name}"

    @property
    def groups(self) -> tuple[str, ...]:
        return ("system:serviceaccounts", f"system:serviceaccounts:{self.namespace}", AUTHENTICATED)


@dataclass(frozen=True)
class AdminUser:
    """The admin token's user: RBAC never asks about it, admission does."""

    username: str = ADMIN_USERNAME
    groups: tuple[str, ...] = (MASTERS, AUTHENTICATED)


User = AdminUser | ServiceAccountUser


@dataclass(frozen=True)
class Grant:
    """`role` and `binding` are (kind, namespace or "", name); `rule` is the index in the role's rules."""

    user: str
    request: RequestInfo
    binding: tuple[str, str, str]
    role: tuple[str, str, str]
    rule: int


def _matches(values: list, wanted: str) -> bool:
    return "*" in values or wanted in values


def rule_allows(rule: dict, request: RequestInfo) -> bool:
    verbs = rule.get("verbs") or []
    if not _matches(verbs, request.verb):
        return False
    if not request.is_resource:
        return any(
            url == request.path or (url.endswith("*") and request.path.startswith(url[:-1]))
            for url in rule.get("nonResourceURLs") or []
        )
    resources = rule.get("resources") or []
    resource_matches = _matches(resources, request.combined_resource) or (
        request.subresource and f"*/{request.subresource}" in resources
    )
    if not _matches(rule.get("apiGroups") or [], request.group) or not resource_matches:
        return False
    names = rule.get("resourceNames") or []
    # A create or a list carries no name, so a rule that lists names never allows them.
    return not names or request.name in names


def _applies_to(subject: dict, user: ServiceAccountUser, binding_namespace: str) -> bool:
    kind, name = subject.get("kind"), subject.get("name")
    if kind == "ServiceAccount":
        return (subject.get("namespace") or binding_namespace, name) == (user.namespace, user.name)
    if kind == "User":
        return name == user.username
    if kind == "Group":
        return name in user.groups
    return False


def forbidden(user: ServiceAccountUser, request: RequestInfo) -> ApiError:
    """403 with a real server's message, e.g. `nodes "n1" is forbidden: User "system:serviceaccount:a:b"
    cannot delete resource "nodes" in API group "" at the cluster scope`."""
    if not request.is_resource:
        return ApiError(403, f'forbidden: User "{user.username}" cannot {request.verb} path "{request.path}"')
    qualified = f"{request.resource}.{request.group}" if request.group else request.resource
    subject = f'{qualified} "{request.name}"' if request.name else qualified
    where = f'in the namespace "{request.namespace}"' if request.namespace else "at the cluster scope"
    message = (
        f'{subject} is forbidden: User "{user.username}" cannot {request.verb} resource '
        f'"{request.combined_resource}" in API group "{request.group}" {where}'
    )
    return ApiError(403, message, name=request.name, kind=request.resource, group=request.group)


class Authorizer:
    """Answers whether a service account may make a request, from the RBAC objects in the store."""

    def __init__(self, store: ClusterStore) -> None:
        self.store = store
        self.grants: list[Grant] = []
        self.denials: list[tuple[str, RequestInfo]] = []

    def authorize(self, user: ServiceAccountUser, request: RequestInfo) -> Grant:
        """The grant that allows the request (recorded); raises a 403 ApiError when nothing does."""
        with self.store.lock:
            for binding, role, rules in self._visible_rules(user, request.namespace):
                for index, rule in enumerate(rules):
                    if rule_allows(rule, request):
                        grant = Grant(user.username, request, binding, role, index)
                        self.grants.append(grant)
                        return grant
            self.denials.append((user.username, request))
        raise forbidden(user, request)

    def _visible_rules(
        self, user: ServiceAccountUser, namespace: str
    ) -> Iterator[tuple[tuple[str, str, str], tuple[str, str, str], list[dict]]]:
        """ClusterRoles bound cluster-wide first, then roles bound in the request's namespace."""
        cluster_bindings = self.store.by_key("ClusterRoleBinding")
        for key in self.store.keys("ClusterRoleBinding"):
            binding = cluster_bindings[key]
            if any(_applies_to(s, user, "") for s in binding.get("subjects") or []):
                yield from self._role_rules(("ClusterRoleBinding", "", key[1]), binding["roleRef"], "")
        if not namespace:
            return
        bindings = self.store.by_key("RoleBinding")
        for key in self.store.keys("RoleBinding"):
            if key[0] != namespace:
                continue
            binding = bindings[key]
            if any(_applies_to(s, user, namespace) for s in binding.get("subjects") or []):
                yield from self._role_rules(("RoleBinding", namespace, key[1]), binding["roleRef"], namespace)

    def _role_rules(
        self, binding: tuple[str, str, str], role_ref: dict, namespace: str
    ) -> Iterator[tuple[tuple[str, str, str], tuple[str, str, str], list[dict]]]:
        kind = role_ref.get("kind")
        role_namespace = namespace if kind == "Role" else ""
        if kind not in ("Role", "ClusterRole"):
            return
        role = self.store.get(kind, role_ref.get("name", ""), role_namespace)
        if role is not None:  # a binding to a role that does not exist grants nothing
            yield binding, (kind, role_namespace, role["metadata"]["name"]), role.get("rules") or []


def bootstrap_objects() -> list[dict]:
    """The roles every real cluster binds to all authenticated users, with their bindings."""
    discovery = [
        {
            "nonResourceURLs": ["/api", "/api/*", "/apis", "/apis/*", "/version", "/version/", "/healthz"],
            "verbs": ["get"],
        }
    ]
    basic_user = [
        {
            "apiGroups": ["authorization.k8s.io"],
            "resources": ["selfsubjectaccessreviews", "selfsubjectrulesreviews"],
            "verbs": ["create"],
        },
        {"apiGroups": ["authentication.k8s.io"], "resources": ["selfsubjectreviews"], "verbs": ["create"]},
    ]
    return [
        *_bound_to_everyone("system:basic-user", basic_user),
        *_bound_to_everyone("system:discovery", discovery),
    ]


def _bound_to_everyone(name: str, rules: list[dict]) -> list[dict]:
    labels = {"kubernetes.io/bootstrapping": "rbac-defaults"}
    return [
        {
            "apiVersion": RBAC_API_VERSION,
            "kind": "ClusterRole",
            "metadata": {"name": name, "labels": dict(labels)},
            "rules": rules,
        },
        {
            "apiVersion": RBAC_API_VERSION,
            "kind": "ClusterRoleBinding",
            "metadata": {"name": name, "labels": dict(labels)},
            "roleRef": {"apiGroup": RBAC_GROUP, "kind": "ClusterRole", "name": name},
            "subjects": [{"apiGroup": RBAC_GROUP, "kind": "Group", "name": AUTHENTICATED}],
        },
    ]
