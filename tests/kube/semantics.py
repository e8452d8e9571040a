"""Kubernetes API rules the test API server imitates: Status errors, label and field selectors, patches.

Words used here:
- requirement: one comma-separated term of a selector (`k in (a,b)`, `!k`, `spec.nodeName=n1`);
- merge patch: RFC 7386 (maps merge, null deletes, lists replace); the server also treats strategic
  merge patches this way, which is exact for the labels, annotations and quota fields we patch;
- JSON patch: RFC 6902 operations on JSON-pointer paths (`/metadata/labels/nvidia.com~1mig.config`).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from copy import deepcopy
from typing import Any

# Reasons a real API server puts in a Status body, by HTTP code; clients branch on them.
REASONS: dict[int, str] = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    409: "Conflict",
    410: "Expired",
    415: "UnsupportedMediaType",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}


class ApiError(Exception):
    """An error answered as a Status body; `reason` defaults to the one a real server uses for `code`."""

    def __init__(
        self,
        code: int,
        message: str,
        *,
        reason: str | None = None,
        name: str = "",
        kind: str = "",
        group: str = "",
        causes: list[dict[str, str]] | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.reason = reason or REASONS.get(code, "Unknown")
        self.name = name
        self.kind = kind
        self.group = group
        self.causes = causes or []
        self.metadata = metadata or {}

    def status(self) -> dict[str, Any]:
        details: dict[str, Any] = {}
        if self.name:
            details["name"] = self.name
        if self.group:
            details["group"] = self.group
        if self.kind:
            details["kind"] = self.kind
        if self.causes:
            details["causes"] = self.causes
        return status_body(
            code=self.code, message=self.message, reason=self.reason, details=details, metadata=self.metadata
        )


def status_body(
    *,
    code: int,
    message: str,
    reason: str,
    details: dict[str, Any] | None = None,
    metadata: dict[str, Any] | None = None,
) -> dict:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": metadata or {},
        "status": "Success" if code < 400 else "Failure",
        "message": message,
        "reason": reason,
        "details": details or {},
        "code": code,
    }


def not_found(resource: str, name: str) -> ApiError:
    return ApiError(404, f'{resource} "{name}" not found', name=name, kind=resource)


# --- label selectors -------------------------------------------------------------------------------------

_KEY = r"[A-Za-z0-9][-A-Za-z0-9_./]*"
_VALUE = r"(?:[A-Za-z0-9](?:[-A-Za-z0-9_.]*[A-Za-z0-9])?)?"
_SET_TERM = re.compile(rf"^({_KEY})\s+(in|notin)\s+\(([^()]*)\)$")
_EQUALITY_TERM = re.compile(rf"^({_KEY})\s*(==|!=|=)\s*({_VALUE})$")
_EXISTS_TERM = re.compile(rf"^(!?)\s*({_KEY})$")

Labels = dict[str, str]


def _split_terms(selector: str) -> list[str]:
    """Split on commas outside parentheses: `a in (x,y),b` is two terms, not three."""
    terms, depth, start = [], 0, 0
    for i, char in enumerate(selector):
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        elif char == "," and depth == 0:
            terms.append(selector[start:i])
            start = i + 1
    terms.append(selector[start:])
    return [term.strip() for term in terms if term.strip()]


def _label_requirement(term: str) -> Callable[[Labels], bool]:
    if match := _SET_TERM.match(term):
        key, operator, raw_values = match.groups()
        values = {value.strip() for value in raw_values.split(",") if value.strip()}
        if not all(re.fullmatch(_VALUE, value) for value in values):
            raise ApiError(400, f"unable to parse requirement: invalid values in {term!r}")
        if operator == "in":
            return lambda labels: labels.get(key) in values
        return lambda labels: labels.get(key) not in values
    if match := _EQUALITY_TERM.match(term):
        key, operator, value = match.groups()
        if operator == "!=":
            # A real server counts an object without the key as "not equal".
            return lambda labels: labels.get(key) != value
        return lambda labels: labels.get(key) == value
    if match := _EXISTS_TERM.match(term):
        negated, key = match.groups()
        if negated:
            return lambda labels: key not in labels
        return lambda labels: key in labels
    raise ApiError(400, f"unable to parse requirement: {term!r}")


def label_matcher(selector: str | None) -> Callable[[Labels], bool]:
    """A predicate over a label map; raises ApiError(400) for a selector a real server would refuse."""
    requirements = [_label_requirement(term) for term in _split_terms(selector or "")]
    return lambda labels: all(requirement(labels) for requirement in requirements)


# A LabelSelector object's `matchExpressions` operators: each takes the labels and the expression's values.
SELECTOR_OPERATORS: dict[str, Callable[[Labels, str, list], bool]] = {
    "In": lambda labels, key, values: key in labels and labels[key] in values,
    "NotIn": lambda labels, key, values: key not in labels or labels[key] not in values,
    "Exists": lambda labels, key, _: key in labels,
    "DoesNotExist": lambda labels, key, _: key not in labels,
}


def selector_matches(selector: dict | None, labels: Labels) -> bool:
    """A LabelSelector object (`matchLabels` and `matchExpressions`, all ANDed); an empty or absent one
    matches everything."""
    selector = selector or {}
    if any(labels.get(key) != value for key, value in (selector.get("matchLabels") or {}).items()):
        return False
    return all(
        SELECTOR_OPERATORS[term["operator"]](labels, term["key"], term.get("values") or [])
        for term in selector.get("matchExpressions") or []
    )


def selector_problem(selector: Any) -> tuple[str, str] | None:
    """Why a LabelSelector object is invalid, as (field under the selector, problem), or None."""
    if selector is None:
        return None
    if not isinstance(selector, dict):
        return "", "Invalid value: must be an object"
    for index, term in enumerate(selector.get("matchExpressions") or []):
        operator, values = term.get("operator"), term.get("values") or []
        where = f"matchExpressions[{index}]"
        if not term.get("key"):
            return f"{where}.key", "Required value"
        if operator not in SELECTOR_OPERATORS:
            supported = ", ".join(f'"{name}"' for name in SELECTOR_OPERATORS)
            return f"{where}.operator", f'Unsupported value: "{operator}": supported values: {supported}'
        if operator in ("In", "NotIn") and not values:
            return f"{where}.values", "Required value: must be specified when `operator` is 'In' or 'NotIn'"
        if operator in ("Exists", "DoesNotExist") and values:
            return (
                f"{where}.values",
                "Forbidden: may not be specified when `operator` is 'Exists' or 'DoesNotExist'",
            )
    return None


# --- field selectors -------------------------------------------------------------------------------------

_FIELD_TERM = re.compile(r"^([A-Za-z.]+)\s*(==|!=|=)\s*(.*)$")

# The fields a real API server lets you select on, per kind, and how to read each from a stored object.
_FIELDS: dict[str, dict[str, Callable[[dict], str]]] = {
    "Pod": {
        "spec.nodeName": lambda pod: pod.get("spec", {}).get("nodeName") or "",
        "status.phase": lambda pod: pod.get("status", {}).get("phase") or "",
    },
    "Node": {
        "spec.unschedulable": lambda node: str(bool(node.get("spec", {}).get("unschedulable"))).lower(),
    },
    "Namespace": {
        "status.phase": lambda namespace: namespace.get("status", {}).get("phase") or "",
    },
    "ResourceSlice": {
        "spec.nodeName": lambda slice_: slice_.get("spec", {}).get("nodeName") or "",
        "spec.driver": lambda slice_: slice_.get("spec", {}).get("driver") or "",
        "spec.pool.name": lambda slice_: (slice_.get("spec", {}).get("pool") or {}).get("name") or "",
    },
}
_COMMON_FIELDS: dict[str, Callable[[dict], str]] = {
    "metadata.name": lambda obj: obj["metadata"]["name"],
    "metadata.namespace": lambda obj: obj["metadata"].get("namespace") or "",
}


def field_matcher(kind: str, selector: str | None) -> Callable[[dict], bool]:
    """A predicate over a stored object; unsupported fields answer 400 as they do on a real server."""
    readers = {**_COMMON_FIELDS, **_FIELDS.get(kind, {})}
    requirements: list[Callable[[dict], bool]] = []
    for term in _split_terms(selector or ""):
        match = _FIELD_TERM.match(term)
        if not match:
            raise ApiError(400, f"invalid field selector: {term!r}")
        field, operator, value = match.groups()
        if field not in readers:
            raise ApiError(400, f'field label not supported: "{field}"')
        read = readers[field]
        if operator == "!=":
            requirements.append(lambda obj, read=read, value=value: read(obj) != value)
        else:
            requirements.append(lambda obj, read=read, value=value: read(obj) == value)
    return lambda obj: all(requirement(obj) for requirement in requirements)


# --- patches ---------------------------------------------------------------------------------------------

MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
JSON_PATCH = "application/json-patch+json"


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 merge patch; returns a new value and leaves both arguments untouched."""
    if not isinstance(patch, dict):
        return deepcopy(patch)
    result = deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise ApiError(400, f"invalid JSON pointer {path!r}")
    return [token.replace("~1", "/").replace("~0", "~") for token in path[1:].split("/")]


def _list_index(container: list, token: str, *, allow_end: bool) -> int:
    if allow_end and token == "-":
        return len(container)
    if not token.isdigit():
        raise ApiError(422, f"invalid list index {token!r}")
    index = int(token)
    if index > len(container) or (index == len(container) and not allow_end):
        raise ApiError(422, f"list index {index} out of range")
    return index


def _parent(document: Any, tokens: list[str], path: str) -> Any:
    node = document
    for token in tokens[:-1]:
        if isinstance(node, dict) and token in node:
            node = node[token]
        elif isinstance(node, list):
            node = node[_list_index(node, token, allow_end=False)]
        else:
            raise ApiError(422, f"path {path!r} does not exist")
    return node


def _read(document: Any, path: str) -> Any:
    tokens = _pointer(path)
    if not tokens:
        return document
    parent, last = _parent(document, tokens, path), tokens[-1]
    if isinstance(parent, dict) and last in parent:
        return parent[last]
    if isinstance(parent, list):
        return parent[_list_index(parent, last, allow_end=False)]
    raise ApiError(422, f"path {path!r} does not exist")


def _add(document: Any, path: str, value: Any) -> Any:
    tokens = _pointer(path)
    if not tokens:
        return value
    parent, last = _parent(document, tokens, path), tokens[-1]
    if isinstance(parent, dict):
        parent[last] = value
    elif isinstance(parent, list):
        parent.insert(_list_index(parent, last, allow_end=True), value)
    else:
        raise ApiError(422, f"path {path!r} does not exist")
    return document


def _remove(document: Any, path: str) -> Any:
    tokens = _pointer(path)
    if not tokens:
        raise ApiError(422, "cannot remove the whole document")
    parent, last = _parent(document, tokens, path), tokens[-1]
    if isinstance(parent, dict) and last in parent:
        del parent[last]
    elif isinstance(parent, list):
        del parent[_list_index(parent, last, allow_end=False)]
    else:
        raise ApiError(422, f"path {path!r} does not exist")
    return document


def json_patch(target: Any, operations: Any) -> Any:
    """RFC 6902 JSON patch; returns a new value. Malformed operations answer 400, ones that do not
    apply (a missing path, a failed `test`) 422, as the real server does."""
    if not isinstance(operations, list):
        raise ApiError(400, "a JSON patch must be a list of operations")
    document = deepcopy(target)
    for operation in operations:
        if not isinstance(operation, dict) or not isinstance(operation.get("path"), str):
            raise ApiError(400, f"malformed JSON patch operation: {operation!r}")
        op, path = operation.get("op"), operation["path"]
        if op in ("add", "replace", "test") and "value" not in operation:
            raise ApiError(400, f"JSON patch operation {op!r} needs a value")
        if op == "add":
            document = _add(document, path, deepcopy(operation["value"]))
        elif op == "remove":
            document = _remove(document, path)
        elif op == "replace":
            _read(document, path)  # replace requires the target to exist
            document = _add(_remove(document, path), path, deepcopy(operation["value"]))
        elif op == "test":
            if _read(document, path) != operation["value"]:
                raise ApiError(422, f"test operation failed at {path!r}")
        elif op in ("move", "copy"):
            source = operation.get("from")
            if not isinstance(source, str):
                raise ApiError(400, f"JSON patch operation {op!r} needs 'from'")
            value = deepcopy(_read(document, source))
            if op == "move":
                document = _remove(document, source)
            document = _add(document, path, value)
        else:
            raise ApiError(400, f"unknown JSON patch operation {op!r}")
    return document


def apply_patch(target: dict, patch: Any, content_type: str) -> dict:
    """Apply a PATCH body by its content type (parameters such as charset ignored)."""
    media_type = content_type.split(";")[0].strip().lower()
    if media_type in (MERGE_PATCH, STRATEGIC_MERGE_PATCH):
        if not isinstance(patch, dict):
            raise ApiError(400, "a merge patch must be a JSON object")
        return merge_patch(target, patch)
    if media_type == JSON_PATCH:
        result = json_patch(target, patch)
        if not isinstance(result, dict):
            raise ApiError(422, "the patch did not leave an object")
        return result
    raise ApiError(
        415,
        f"the body of the request was in an unknown format - accepted media types include: "
        f"{JSON_PATCH}, {MERGE_PATCH}, {STRATEGIC_MERGE_PATCH}",
    )
