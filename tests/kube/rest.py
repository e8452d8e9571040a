"""REST verbs of the test API server: core v1 and API-group paths routed to list, watch, get, create,
update, patch and delete on the object store, with a real server's answers (paging, a continue token that
expires with the history it was made in, 404/409/422, status left to subresources, per-kind defaults and
validation in kinds.py, validating admission policies in admission.py judging every write before it is
stored), the SelfSubjectReview, and its discovery documents. Watches themselves are watch.py's."""

from __future__ import annotations

import base64
import binascii
import bisect
import json
import random
import re
import string
from collections.abc import Callable
from copy import deepcopy
from typing import Any

from tests.kube import kinds, objects
from tests.kube.admission import Review
from tests.kube.rbac import RequestInfo
from tests.kube.semantics import ApiError, apply_patch, field_matcher, label_matcher, not_found, status_body
from tests.kube.store import RESOURCES, ClusterStore, Key, Resource, etcd_path, group_versions
from tests.kube.watch import Watch, Watches

# The body is a JSON document, or a watch whose events the HTTP layer streams.
Reply = tuple[int, dict[str, Any] | Watch, list[tuple[str, str]]]

# Every field a real server reports: the client's VersionInfo requires them all.
_VERSION = {
    "major": "1",
    "minor": "31",
    "gitVersion": "v1.31.0-test",
    "gitCommit": "0" * 40,
    "gitTreeState": "clean",
    "buildDate": "2024-08-13T07:28:49Z",
    "goVersion": "go1.22.5",
    "compiler": "gc",
    "platform": "linux/amd64",
}
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^(?=.{1,253}$)[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
# RBAC objects may be named like `system:discovery`: any path segment will do.
_PATH_SEGMENT = re.compile(r"^(?!\.{1,2}$)[^/%]+$")
_RBAC_KINDS = {"Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding"}
# Kinds whose DELETE answers the deleted object, not a Status: graceful deletion, or a registry that
# returns it (resource.k8s.io's, whose OpenAPI DELETE responses are the kind itself).
_RETURN_DELETED = {
    "Namespace",
    "Pod",
    "Node",
    "ResourceQuota",
    "DeviceClass",
    "ResourceSlice",
    "ResourceClaim",
    "ResourceClaimTemplate",
}
_NOT_FOUND = "the server could not find the requested resource"


def _check_string_map(value: Any, field: str) -> None:
    """The client (and a real server) only accept string-to-string maps for labels, annotations, data."""
    if value is None:
        return
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise ApiError(400, f"{field} must map strings to strings")


def _encode_continue(key: Key, resource_version: int) -> str:
    raw = json.dumps({"rv": resource_version, "start": list(key)}).encode()
    return base64.urlsafe_b64encode(raw).decode()


def _decode_continue(token: str) -> tuple[Key, int]:
    """The key a continued list starts after, and the resourceVersion of the list it continues."""
    try:
        decoded = json.loads(base64.urlsafe_b64decode(token.encode()))
        start = decoded["start"]
        return (str(start[0]), str(start[1])), int(decoded["rv"])
    except (ValueError, KeyError, IndexError, TypeError, binascii.Error) as error:
        raise ApiError(400, "continue key is not valid") from error


def _expired_continue(start: Key, resource_version: int) -> ApiError:
    """A real server's 410 for a continue token older than what it keeps: start the list again, or take the
    fresh token it offers and accept a list that is no longer one consistent snapshot."""
    return ApiError(
        410,
        "The continue token is too old to page one consistent list: list again without it, or continue "
        "with the token in this answer's metadata, accepting changes made since the list began.",
        metadata={"continue": _encode_continue(start, resource_version)},
    )


class RestApi:
    """Answers authenticated requests. `on_node_write(current, new)` runs (lock held) before a changed node
    is stored, so the MIG manager and the device plugin can react to their config labels and change the node
    being written."""

    def __init__(
        self, store: ClusterStore, watches: Watches, *, on_node_write: Callable[[dict, dict], None]
    ) -> None:
        self.store = store
        self.watches = watches
        self.address = ""  # host:port, for the `/api` discovery document; set when the server starts
        self.lock = store.lock
        self.on_node_write = on_node_write
        self.patch_content_types: list[str] = []

    def route(
        self, info: RequestInfo, query: dict[str, str], content_type: str, body: bytes, review: Review
    ) -> Reply:
        if not info.is_resource:
            if info.verb != "get":
                raise ApiError(405, "the server does not allow this method on the requested resource")
            return 200, self._discovery(info.path), []
        resource, namespace, name, verb = self._target(info)
        if verb == "watch":
            return 200, self.watches.open(resource, namespace, query), []
        if verb == "list":
            return 200, self._list(resource, namespace, query), []
        if verb == "get":
            with self.lock:
                return 200, self._existing(resource, namespace, name), []
        if verb == "delete":
            return 200, self._delete(resource, namespace or "", name, review), []
        document = self._json(body)
        if not resource.persisted:
            return 201, self._self_subject_review(resource, document, review), []
        if verb == "create":
            return 201, self._create(resource, namespace or "", document, review), []
        if verb == "update":
            return 200, self._update(resource, namespace or "", name, document, review), []
        self.patch_content_types.append(content_type)
        return 200, self._patch(resource, namespace or "", name, document, content_type, review), []

    @staticmethod
    def _target(info: RequestInfo) -> tuple[Resource, str | None, str, str]:
        """The resource, namespace (None across namespaces), name and verb of a resource request; 404 or 405
        for what is not served."""
        resource = RESOURCES.get((info.group, info.resource))
        if resource is None or resource.version != info.version or info.subresource:
            raise ApiError(404, _NOT_FOUND)
        if info.scoped and not resource.namespaced:
            raise ApiError(404, _NOT_FOUND)
        namespace = info.namespace if info.scoped else None
        if resource.namespaced and namespace is None and info.name:
            raise ApiError(404, _NOT_FOUND)
        verb = info.verb
        if verb == "create" and resource.namespaced and namespace is None:
            verb = ""
        if verb not in resource.verbs:
            raise ApiError(405, "the server does not allow this method on the requested resource")
        return resource, namespace, info.name, verb

    def _self_subject_review(self, resource: Resource, document: Any, review: Review) -> dict:
        """A SelfSubjectReview, the one review served: who the caller is, as authentication saw it."""
        if not isinstance(document, dict) or document.get("kind", resource.kind) != resource.kind:
            raise ApiError(400, f"the request body must be a {resource.kind}")
        with self.lock:
            review.admit("CREATE", resource, {"metadata": {}, **document}, None, "")
        user = {"username": review.user.username, "groups": list(review.user.groups)}
        return {
            "apiVersion": resource.api_version,
            "kind": resource.kind,
            "metadata": {"creationTimestamp": None},
            "status": {"userInfo": user},
        }

    def _discovery(self, path: str) -> dict:
        """`/version`, `/api`, `/apis`, `/apis/<group>` and each group version's resource list."""
        parts = [part for part in path.split("/") if part]
        served = group_versions()
        if parts == ["version"]:
            return _VERSION
        if parts == ["api"]:
            address = {"clientCIDR": "0.0.0.0/0", "serverAddress": self.address}
            return {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": [address]}
        groups = {}
        for group_version in served:
            group, _, version = group_version.rpartition("/")
            if group:
                entry = {"groupVersion": group_version, "version": version}
                groups[group] = {"name": group, "versions": [entry], "preferredVersion": entry}
        if parts == ["apis"]:
            return {"kind": "APIGroupList", "apiVersion": "v1", "groups": [groups[g] for g in sorted(groups)]}
        if len(parts) == 2 and parts[0] == "apis" and parts[1] in groups:
            return {"kind": "APIGroup", "apiVersion": "v1", **groups[parts[1]]}
        group_version = "/".join(parts[1:])
        is_group_version = (parts[:1] == ["api"] and len(parts) == 2) or (
            parts[:1] == ["apis"] and len(parts) == 3
        )
        if is_group_version and group_version in served:
            return {
                "kind": "APIResourceList",
                "apiVersion": "v1",
                "groupVersion": group_version,
                "resources": [
                    {
                        "name": resource.plural,
                        "singularName": resource.kind.lower(),
                        "namespaced": resource.namespaced,
                        "kind": resource.kind,
                        "verbs": sorted(resource.verbs),
                    }
                    for resource in served[group_version]
                ],
            }
        raise ApiError(404, _NOT_FOUND)

    @staticmethod
    def _json(body: bytes) -> Any:
        try:
            return json.loads(body)
        except (ValueError, UnicodeDecodeError) as error:
            raise ApiError(400, f"the request body is not valid JSON: {error}") from error

    def _existing(self, resource: Resource, namespace: str | None, name: str) -> dict:
        stored = self.store.by_key(resource.kind).get((namespace or "", name))
        if stored is None:
            raise not_found(resource.plural, name)
        return stored

    def _list(self, resource: Resource, namespace: str | None, query: dict[str, str]) -> dict:
        selectors = query.get("labelSelector") or query.get("fieldSelector")
        labels_match = label_matcher(query.get("labelSelector"))
        fields_match = field_matcher(resource.kind, query.get("fieldSelector"))
        try:
            limit = int(query.get("limit") or 0)
        except ValueError as error:
            raise ApiError(400, "limit must be an integer") from error
        start, listed_at = _decode_continue(query["continue"]) if query.get("continue") else (None, 0)
        items: list[dict] = []
        remaining = 0
        last: Key | None = None
        with self.lock:
            if start is not None and listed_at < self.store.compacted[resource.kind]:
                raise _expired_continue(start, self.store.resource_version)
            keys = self.store.keys(resource.kind)
            store = self.store.by_key(resource.kind)
            first = bisect.bisect_right(keys, etcd_path(start), key=etcd_path) if start else 0
            for key in keys[first:]:
                if namespace is not None and key[0] != namespace:
                    continue
                obj = store[key]
                if not fields_match(obj) or not labels_match(obj["metadata"].get("labels") or {}):
                    continue
                if limit and len(items) == limit:
                    remaining += 1
                    if selectors:
                        break  # a real server does not count what is left when filtering
                    continue
                items.append(obj)
                last = key
            # Every page of a list carries the version of its first, as a real server's snapshot does.
            resource_version = listed_at or self.store.resource_version
        metadata: dict[str, Any] = {"resourceVersion": str(resource_version)}
        if remaining and last is not None:
            metadata["continue"] = _encode_continue(last, resource_version)
            if not selectors:
                metadata["remainingItemCount"] = remaining
        return {
            "apiVersion": resource.api_version,
            "kind": f"{resource.kind}List",
            "metadata": metadata,
            "items": items,
        }

    def _validated(self, resource: Resource, namespace: str, document: Any) -> dict:
        """Checks every write body: the kind, the namespace, the string maps the client insists on."""
        if not isinstance(document, dict):
            raise ApiError(400, "the request body must be a JSON object")
        if document.get("kind", resource.kind) != resource.kind:
            raise ApiError(400, f"the body is a {document.get('kind')}, not a {resource.kind}")
        if document.get("apiVersion", resource.api_version) != resource.api_version:
            raise ApiError(
                400,
                f"the API version in the data ({document.get('apiVersion')}) does not match the expected "
                f"API version ({resource.api_version})",
            )
        metadata = document.get("metadata")
        if not isinstance(metadata, dict):
            raise ApiError(400, "metadata must be an object")
        if resource.namespaced and metadata.get("namespace", namespace) != namespace:
            raise ApiError(
                400, "the namespace of the provided object does not match the namespace sent on the request"
            )
        _check_string_map(metadata.get("labels"), "metadata.labels")
        _check_string_map(metadata.get("annotations"), "metadata.annotations")
        if resource.kind == "ConfigMap":
            _check_string_map(document.get("data"), "data")
        return {**document, "apiVersion": resource.api_version, "kind": resource.kind}

    def _create(self, resource: Resource, namespace: str, document: Any, review: Review) -> dict:
        obj = deepcopy(self._validated(resource, namespace, document))
        metadata = obj["metadata"]
        requested_name = metadata.get("name") or ""
        if not metadata.get("name") and metadata.get("generateName"):
            suffix = "".join(random.choices(string.ascii_lowercase + string.digits, k=5))
            metadata["name"] = metadata["generateName"] + suffix
        name = metadata.get("name") or ""
        pattern = {"Namespace": _DNS_LABEL, **dict.fromkeys(_RBAC_KINDS, _PATH_SEGMENT)}.get(
            resource.kind, _DNS_SUBDOMAIN
        )
        if not pattern.match(name):
            raise kinds.invalid(resource, name, "metadata.name", f'Invalid value: "{name}"')
        for server_owned in ("resourceVersion", "creationTimestamp", "deletionTimestamp"):
            metadata.pop(server_owned, None)
        metadata["uid"] = objects.new_uid()  # before the defaults: a Job's selector is made of it
        if resource.namespaced:
            metadata["namespace"] = namespace
        kinds.prepare_create(resource, obj)
        if resource.kind == "Namespace":
            metadata["labels"] = {**(metadata.get("labels") or {}), "kubernetes.io/metadata.name": name}
            obj = {**objects.namespace(name, metadata["labels"]), "metadata": metadata}
        with self.lock:
            if resource.namespaced and not self.store.has_namespace(namespace):
                raise not_found("namespaces", namespace)
            review.admit("CREATE", resource, obj, None, requested_name)
            if (namespace, name) in self.store.by_key(resource.kind):
                raise ApiError(
                    409,
                    f'{resource.plural} "{name}" already exists',
                    reason="AlreadyExists",
                    name=name,
                    kind=resource.plural,
                )
            if resource.kind == "ResourceQuota":
                obj["status"] = objects.quota_status(obj, self.store.in_namespace("Pod", namespace))
            stored = self.store.insert(resource.kind, obj)
            if resource.kind == "Pod":
                self.store.refresh_quotas(namespace)
            return stored

    def _update(self, resource: Resource, namespace: str, name: str, document: Any, review: Review) -> dict:
        obj = deepcopy(self._validated(resource, namespace, document))
        if obj["metadata"].get("name") != name:
            raise ApiError(400, "the name of the object does not match the name on the URL")
        with self.lock:
            return self._write(resource, self._existing(resource, namespace, name), obj, review)

    def _patch(
        self, resource: Resource, namespace: str, name: str, patch: Any, content_type: str, review: Review
    ) -> dict:
        with self.lock:
            current = self._existing(resource, namespace, name)
            patched = apply_patch(current, patch, content_type)
            obj = deepcopy(self._validated(resource, namespace, patched))
            if obj["metadata"].get("name") != name:
                raise ApiError(400, "a patch may not change the object's name")
            return self._write(resource, current, obj, review)

    def _write(self, resource: Resource, current: dict, obj: dict, review: Review) -> dict:
        """The shared tail of PUT and PATCH (lock held): optimistic concurrency, server-owned fields,
        admission (a patch is judged as an UPDATE), the node hook, and no new resourceVersion when nothing
        changed (as a real server does)."""
        metadata, stored = obj["metadata"], current["metadata"]
        if metadata.get("resourceVersion") not in (None, stored["resourceVersion"]):
            raise ApiError(
                409,
                f'Operation cannot be fulfilled on {resource.plural} "{stored["name"]}": the object has been '
                "modified; please apply your changes to the latest version and try again",
                name=stored["name"],
                kind=resource.plural,
            )
        for server_owned in ("uid", "creationTimestamp", "resourceVersion", "namespace"):
            if server_owned in stored:
                metadata[server_owned] = stored[server_owned]
        if resource.kind == "Namespace":
            metadata["labels"] = {
                **(metadata.get("labels") or {}),
                "kubernetes.io/metadata.name": stored["name"],
            }
        if resource.has_status:
            obj["status"] = deepcopy(current.get("status", {}))
        kinds.prepare_update(resource, current, obj)
        if resource.kind == "ResourceQuota":
            obj["status"] = objects.quota_status(obj, self.store.in_namespace("Pod", stored["namespace"]))
        review.admit("UPDATE", resource, obj, current, stored["name"])
        if resource.kind == "Node":
            self.on_node_write(current, obj)
        if obj == current:
            return current
        return self.store.update(obj)

    def _delete(self, resource: Resource, namespace: str, name: str, review: Review) -> dict:
        with self.lock:
            stored = self._existing(resource, namespace, name)
            review.admit("DELETE", resource, None, stored, name)
            self.store.remove(resource.kind, (namespace, name))
            if resource.kind == "Pod":
                self.store.refresh_quotas(namespace)
            if resource.kind == "Namespace":
                # Finalisation is instant here: the namespace's objects go with it.
                for contained in RESOURCES.values():
                    if contained.namespaced:
                        for key in [key for key in self.store.keys(contained.kind) if key[0] == name]:
                            self.store.remove(contained.kind, key)
            deleted_metadata = {**stored["metadata"], "resourceVersion": str(self.store.resource_version)}
        if resource.kind not in _RETURN_DELETED:
            group = {"group": resource.group} if resource.group else {}
            details = {"name": name, **group, "kind": resource.plural, "uid": stored["metadata"]["uid"]}
            return status_body(code=200, message="", reason="", details=details)
        if resource.kind == "Namespace":
            deleted_metadata["deletionTimestamp"] = objects.now()
            return {**stored, "metadata": deleted_metadata, "status": {"phase": "Terminating"}}
        return {**stored, "metadata": deleted_metadata}
