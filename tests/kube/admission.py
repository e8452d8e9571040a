"""Validating admission policies enforced by the test API server, as kube-apiserver's
ValidatingAdmissionPolicy plugin enforces them: the stored policies and bindings
(admissionregistration.k8s.io/v1) judge each write with CEL expressions before it is stored.

Words used here (as the Kubernetes docs, "Validating Admission Policy", use them):
- policy: a ValidatingAdmissionPolicy: what to match (`spec.matchConstraints`), when it applies
  (`spec.matchConditions`), named helper expressions (`spec.variables`), and the `spec.validations` whose
  expressions must all be true;
- binding: a ValidatingAdmissionPolicyBinding, which puts one policy (`spec.policyName`) to work, narrowed by
  its own `spec.matchResources`, with its `spec.validationActions`; a binding to a missing policy does
  nothing, and a policy without a binding does nothing either;
- attributes: what admission knows of one request: the operation (CREATE, UPDATE, DELETE), the resource,
  namespace and name, the object and the old object, and the user;
- decision: one failed validation (or an evaluation error under failurePolicy Fail), with its message and
  reason; the binding's validation actions say what it does: Deny refuses the request with the first
  decision's reason and code, Warn adds a `Warning: 299 - "..."` header, Audit adds an audit record;
- audit record: what a real server writes to its audit log as the annotation
  `validation.policy.admission.k8s.io/validation_failure`, kept in a list for tests to read.

When: on every create, update (PUT), patch (judged as an UPDATE of the patched object) and delete made over
HTTP, by every user, the admin token included (RBAC skips it, admission does not), after the object's
defaults and the server's own validation and before it is stored. Not admitted: what a test arranges through
the control API (`add_pod`, `add_namespace`, ...), the emulated controllers' writes, and the policies and
bindings themselves, which a real server exempts too.

Imitated: resource rules (groups, versions, operations, resources with `*` and `resource/subresource`,
scope, resource names), exclude rules, namespace selectors (on the labels of the object's namespace; of the
object itself for a Namespace; always matching other cluster-scoped objects), object selectors (the object's
labels or the old object's), match conditions (all true, else the policy is skipped; an error follows the
failure policy), composition variables (evaluated when first named, once per request), messages
(`messageExpression`, else `message`, else `failed expression: <expression>`), reasons and their codes
(Unauthorized 401, Forbidden 403, RequestEntityTooLarge 413, Invalid 422, the default), and the failure
policy (Fail, the default, refuses on an evaluation error; Ignore skips it). The CEL variables are `object`
(null for DELETE), `oldObject` (null for CREATE), `request`, `namespaceObject` (null for cluster-scoped
objects), `params` (always null) and `variables`.

Not imitated: parameters (a policy with `paramKind` is refused; `params` is null), `matchPolicy: Equivalent`
(only the group and version asked for match), the `authorizer` variable, audit annotations' values (compiled
at create, never evaluated), the message size limit, cost budgets, type checking (`status.typeChecking`),
and the CEL features that cel.py lists as not served.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from celpy import celtypes
from celpy.evaluation import CELEvalError

from tests.kube.cel import EvaluationError, LazyVariables, compile_expression, to_cel
from tests.kube.rbac import User
from tests.kube.semantics import ApiError, selector_matches
from tests.kube.store import ClusterStore, Resource

EXEMPT_GROUP = "admissionregistration.k8s.io"
DEFAULT_REASON = "Invalid"  # a validation without `reason`, and an evaluation error
REASON_CODES = {"Unauthorized": 401, "Forbidden": 403, "RequestEntityTooLarge": 413, "Invalid": 422}
_MESSAGE_LIMIT = 5 * 1024


@dataclass(frozen=True)
class Attributes:
    operation: str
    resource: Resource
    namespace: str  # "" for cluster-scoped objects; a Namespace's own name for a Namespace
    name: str
    object: dict | None
    old_object: dict | None
    user: User

    @property
    def labels(self) -> list[dict[str, str]]:
        """The labels of the object and of the old object, those that exist."""
        present = [obj for obj in (self.object, self.old_object) if obj is not None]
        return [obj["metadata"].get("labels") or {} for obj in present]


@dataclass(frozen=True)
class Decision:
    message: str
    reason: str
    expression_index: int | None = None


@dataclass(frozen=True)
class AuditRecord:
    """A decision of a binding with the Audit action, with the request it judged."""

    policy: str
    binding: str
    message: str
    reason: str
    expression_index: int | None
    validation_actions: tuple[str, ...]
    operation: str
    resource: str
    namespace: str
    name: str
    username: str


class Admission:
    """Judges writes by the policies and bindings in the store; callers hold the store's lock."""

    def __init__(self, store: ClusterStore) -> None:
        self.store = store
        self.audits: list[AuditRecord] = []

    def review(self, user: User) -> Review:
        return Review(self, user)

    def admit(self, attributes: Attributes, warnings: list[str]) -> None:
        """Raises the first denial after every binding has had its say (warnings and audits included)."""
        if attributes.resource.group == EXEMPT_GROUP:
            return
        denial: ApiError | None = None
        for policy, binding in self._bindings():
            for decision in _Evaluation(policy, attributes, self._namespace(attributes)).decisions(binding):
                refusal = self._act(policy, binding, decision, attributes, warnings)
                denial = denial or refusal
        if denial is not None:
            raise denial

    def _bindings(self) -> Iterator[tuple[dict, dict]]:
        """(policy, binding) pairs, policies and then their bindings by name, as a real server orders them."""
        bindings = self.store.by_key("ValidatingAdmissionPolicyBinding")
        policies = self.store.by_key("ValidatingAdmissionPolicy")
        for policy_key in self.store.keys("ValidatingAdmissionPolicy"):
            name = policy_key[1]
            for binding_key in self.store.keys("ValidatingAdmissionPolicyBinding"):
                if (bindings[binding_key].get("spec") or {}).get("policyName") == name:
                    yield policies[policy_key], bindings[binding_key]

    def _namespace(self, attributes: Attributes) -> dict | None:
        if not attributes.resource.namespaced:
            return None
        return self.store.get("Namespace", attributes.namespace)

    def _act(
        self, policy: dict, binding: dict, decision: Decision, attributes: Attributes, warnings: list[str]
    ) -> ApiError | None:
        policy_name, binding_name = policy["metadata"]["name"], binding["metadata"]["name"]
        actions = tuple(binding["spec"].get("validationActions") or ())
        if "Warn" in actions:
            warnings.append(
                f"Validation failed for ValidatingAdmissionPolicy '{policy_name}' with binding "
                f"'{binding_name}': {decision.message}"
            )
        if "Audit" in actions:
            self.audits.append(_audit_record(policy_name, binding_name, decision, actions, attributes))
        if "Deny" in actions:
            return denial(policy_name, binding_name, decision, attributes)
        return None


def _audit_record(
    policy: str, binding: str, decision: Decision, actions: tuple[str, ...], attributes: Attributes
) -> AuditRecord:
    return AuditRecord(
        policy=policy,
        binding=binding,
        message=decision.message,
        reason=decision.reason,
        expression_index=decision.expression_index,
        validation_actions=actions,
        operation=attributes.operation,
        resource=attributes.resource.plural,
        namespace=attributes.namespace,
        name=attributes.name,
        username=attributes.user.username,
    )


def denial(policy: str, binding: str, decision: Decision, attributes: Attributes) -> ApiError:
    """The real server's refusal: a Forbidden message (`configmaps "x" is forbidden: ...`) with the
    decision's reason and its code."""
    cause = (
        f"ValidatingAdmissionPolicy '{policy}' with binding '{binding}' denied request: {decision.message}"
    )
    resource = attributes.resource
    qualified = f"{resource.plural}.{resource.group}" if resource.group else resource.plural
    name = attributes.name or _named(attributes.object) or "Unknown"
    return ApiError(
        REASON_CODES.get(decision.reason, 422),
        f'{qualified} "{name}" is forbidden: {cause}',
        reason=decision.reason,
        name=name,
        kind=resource.plural,
        group=resource.group,
        causes=[{"message": cause}],
    )


def _named(obj: dict | None) -> str:
    metadata = (obj or {}).get("metadata") or {}
    return metadata.get("name") or metadata.get("generateName") or ""


# --- matching ---------------------------------------------------------------------------------------------


def matches(match: dict, attributes: Attributes, namespace: dict | None) -> bool:
    """Whether a policy's matchConstraints or a binding's matchResources take in the request."""
    if not _namespace_selected(match.get("namespaceSelector"), attributes, namespace):
        return False
    selector = match.get("objectSelector")
    if selector and not any(selector_matches(selector, labels) for labels in attributes.labels):
        return False
    if any(_rule_matches(rule, attributes) for rule in match.get("excludeResourceRules") or []):
        return False
    rules = match.get("resourceRules") or []
    return not rules or any(_rule_matches(rule, attributes) for rule in rules)


def _namespace_selected(selector: dict | None, attributes: Attributes, namespace: dict | None) -> bool:
    if not selector:
        return True
    if attributes.resource.kind == "Namespace":
        labels = attributes.labels[0]  # the new labels, the stored ones for a DELETE
    elif attributes.resource.namespaced:
        labels = ((namespace or {}).get("metadata") or {}).get("labels") or {}
    else:
        return True
    return selector_matches(selector, labels)


def _rule_matches(rule: dict, attributes: Attributes) -> bool:
    resource = attributes.resource
    return (
        _listed(rule.get("operations"), attributes.operation)
        and _listed(rule.get("apiGroups"), resource.group)
        and _listed(rule.get("apiVersions"), resource.version)
        and any(_resource_listed(entry, resource.plural) for entry in rule.get("resources") or [])
        and _scope_matches(rule.get("scope") or "*", resource)
        and (not rule.get("resourceNames") or attributes.name in rule["resourceNames"])
    )


def _listed(values: list | None, wanted: str) -> bool:
    return "*" in (values or []) or wanted in (values or [])


def _resource_listed(entry: str, plural: str) -> bool:
    """`pods` and `*` take in the main resource only, `pods/*` and `*/*` the subresources too; the test
    server serves no subresource, so only the main resource is ever asked about."""
    name, _, subresource = entry.partition("/")
    return name in ("*", plural) and subresource in ("", "*")


def _scope_matches(scope: str, resource: Resource) -> bool:
    if scope == "Namespaced":
        return resource.namespaced
    if scope == "Cluster":
        return not resource.namespaced
    return True


# --- evaluation -------------------------------------------------------------------------------------------


class _Evaluation:
    """One policy judging one request: its match, its conditions and validations, its variables."""

    def __init__(self, policy: dict, attributes: Attributes, namespace: dict | None) -> None:
        self.spec = policy.get("spec") or {}
        self.attributes = attributes
        self.namespace = namespace
        self.fails = self.spec.get("failurePolicy", "Fail") == "Fail"
        self.variables = {v["name"]: v["expression"] for v in self.spec.get("variables") or []}
        self.activation = self._activation()

    def decisions(self, binding: dict) -> list[Decision]:
        if not matches(self.spec.get("matchConstraints") or {}, self.attributes, self.namespace):
            return []
        narrowed = (binding.get("spec") or {}).get("matchResources")
        if narrowed and not matches(narrowed, self.attributes, self.namespace):
            return []
        try:
            if not self._conditions_hold():
                return []
        except EvaluationError as error:
            return [Decision(str(error), DEFAULT_REASON)] if self.fails else []
        judged = (self._judge(index, v) for index, v in enumerate(self.spec.get("validations") or []))
        return [decision for decision in judged if decision is not None]

    def _activation(self) -> dict[str, Any]:
        attributes = self.attributes
        activation = {
            "object": to_cel(attributes.object),
            "oldObject": to_cel(attributes.old_object),
            "request": to_cel(request_object(attributes)),
            "namespaceObject": to_cel(self.namespace),
            "params": None,
        }
        activation["variables"] = LazyVariables(self._variable, self.variables)
        return activation

    def _variable(self, name: str) -> Any:
        try:
            return self.evaluate(self.variables[name])
        except EvaluationError as error:
            return CELEvalError(error.what)  # an error value: it fails only the expressions that use it

    def evaluate(self, expression: str) -> Any:
        return compile_expression(expression, frozenset(self.variables)).evaluate(self.activation)

    def _conditions_hold(self) -> bool:
        """False as soon as one condition is false; an error only when none is false."""
        error: EvaluationError | None = None
        for condition in self.spec.get("matchConditions") or []:
            try:
                if not _is_true(self.evaluate(condition["expression"])):
                    return False
            except EvaluationError as failure:
                error = error or failure
        if error is not None:
            raise error
        return True

    def _judge(self, index: int, validation: dict) -> Decision | None:
        try:
            holds = _is_true(self.evaluate(validation["expression"]))
        except EvaluationError as error:
            return Decision(str(error), DEFAULT_REASON, index) if self.fails else None
        if holds:
            return None
        return Decision(self._message(validation), validation.get("reason") or DEFAULT_REASON, index)

    def _message(self, validation: dict) -> str:
        if validation.get("messageExpression"):
            try:
                message = self.evaluate(validation["messageExpression"])
            except EvaluationError:
                message = None
            if isinstance(message, str) and _usable(message.strip()):
                return message.strip()
        if validation.get("message"):
            return validation["message"].strip()
        return f"failed expression: {validation['expression'].strip()}"


def _is_true(value: Any) -> bool:
    return isinstance(value, celtypes.BoolType) and bool(value)


def _usable(message: str) -> bool:
    """A message expression's result is used unless empty, too long, or on several lines."""
    return bool(message) and len(message) <= _MESSAGE_LIMIT and "\n" not in message


def request_object(attributes: Attributes) -> dict[str, Any]:
    """The CEL `request`: an AdmissionRequest as a real server fills it in for a policy."""
    resource = attributes.resource
    kind = {"group": resource.group, "version": resource.version, "kind": resource.kind}
    plural = {"group": resource.group, "version": resource.version, "resource": resource.plural}
    user = attributes.user
    return {
        "uid": str(uuid.uuid4()),
        "kind": kind,
        "resource": plural,
        "subResource": "",
        "requestKind": kind,
        "requestResource": plural,
        "requestSubResource": "",
        "name": attributes.name,
        "namespace": attributes.namespace,
        "operation": attributes.operation,
        "userInfo": {"username": user.username, "uid": "", "groups": list(user.groups), "extra": {}},
        "dryRun": False,
    }


# --- one request ------------------------------------------------------------------------------------------


@dataclass
class Review:
    """One request's way through admission: who asks, and the warnings that Warn bindings gave it."""

    admission: Admission
    user: User
    warnings: list[str] = field(default_factory=list)

    def admit(
        self, operation: str, resource: Resource, obj: dict | None, old: dict | None, name: str
    ) -> None:
        """Raises the denial, if any; `name` is the one the request gave (empty for a generated name)."""
        metadata = (obj or old or {}).get("metadata") or {}
        namespace = name if resource.kind == "Namespace" else metadata.get("namespace", "")
        attributes = Attributes(operation, resource, namespace, name, obj, old, self.user)
        self.admission.admit(attributes, self.warnings)

    def warning_headers(self) -> list[tuple[str, str]]:
        return [("Warning", f'299 - "{_escaped(warning)}"') for warning in self.warnings]


def _escaped(text: str) -> str:
    """Quotes escaped; the text's UTF-8 bytes sent as they are, as a real server sends them (http.server
    writes headers as Latin-1, which passes each byte through)."""
    return text.replace("\\", "\\\\").replace('"', '\\"').encode().decode("latin-1")
