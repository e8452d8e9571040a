"""Stored validating admission policies and their bindings (admissionregistration.k8s.io/v1): the defaults a
real server fills in and the validation it answers with 422, before admission.py enforces them.

Words used here:
- problem: a (field, detail) pair, such as `("spec.validationActions", "Required value")`; kinds.py turns
  the first one into a 422 in the real server's form;
- match resources: `spec.matchConstraints` of a policy, `spec.matchResources` of a binding: resource rules,
  exclude rules, namespace and object selectors;
- expressions: every CEL expression of a policy (validations, messages, variables, match conditions, audit
  annotations); each must compile (cel.py), with the composition variables it may name.

Parameters (`spec.paramKind`) are refused with a 422: the test server does not serve them.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from tests.kube.cel import compile_problem
from tests.kube.semantics import selector_problem

Problem = tuple[str, str]

OPERATIONS = ("CREATE", "UPDATE", "DELETE", "CONNECT", "*")
REASONS = ("Unauthorized", "Forbidden", "Invalid", "RequestEntityTooLarge")
VALIDATION_ACTIONS = ("Audit", "Deny", "Warn")
FAILURE_POLICIES = ("Fail", "Ignore")
_SCOPES = ("Cluster", "Namespaced", "*")
_CEL_IDENTIFIER = re.compile(r"^[_a-zA-Z][_a-zA-Z0-9]*$")


def _unsupported(value: Any, supported: tuple[str, ...]) -> str:
    return f'Unsupported value: "{value}": supported values: ' + ", ".join(f'"{s}"' for s in supported)


# --- defaults ---------------------------------------------------------------------------------------------


def default_policy(policy: dict) -> None:
    spec = policy.setdefault("spec", {})
    if isinstance(spec, dict):
        spec.setdefault("failurePolicy", "Fail")
        _default_match_resources(spec.get("matchConstraints"))


def default_binding(binding: dict) -> None:
    spec = binding.setdefault("spec", {})
    if isinstance(spec, dict):
        _default_match_resources(spec.get("matchResources"))


def _default_match_resources(match: Any) -> None:
    if not isinstance(match, dict):
        return
    match.setdefault("matchPolicy", "Equivalent")
    match.setdefault("namespaceSelector", {})
    match.setdefault("objectSelector", {})
    for rule in [*(match.get("resourceRules") or []), *(match.get("excludeResourceRules") or [])]:
        if isinstance(rule, dict):
            rule.setdefault("scope", "*")


# --- validation -------------------------------------------------------------------------------------------


def policy_problem(policy: dict) -> Problem | None:
    spec = policy.get("spec") if isinstance(policy.get("spec"), dict) else {}
    return next(_policy_problems(spec), None)


def binding_problem(binding: dict) -> Problem | None:
    spec = binding.get("spec") if isinstance(binding.get("spec"), dict) else {}
    return next(_binding_problems(spec), None)


def _policy_problems(spec: dict) -> Iterator[Problem]:
    if spec.get("paramKind") is not None:
        yield "spec.paramKind", "Forbidden: parameters are not supported by the test API server"
    match = spec.get("matchConstraints")
    if not isinstance(match, dict):
        yield "spec.matchConstraints", "Required value"
        return
    if not match.get("resourceRules"):
        yield "spec.matchConstraints.resourceRules", "Required value"
    yield from _match_problems("spec.matchConstraints", match)
    if spec.get("failurePolicy") not in FAILURE_POLICIES:
        yield "spec.failurePolicy", _unsupported(spec.get("failurePolicy"), FAILURE_POLICIES)
    if not spec.get("validations") and not spec.get("auditAnnotations"):
        yield (
            "spec.validations",
            "Required value: validations or auditAnnotations must contain at least one item",
        )
    yield from _expression_problems(spec)


def _binding_problems(spec: dict) -> Iterator[Problem]:
    if not spec.get("policyName"):
        yield "spec.policyName", "Required value"
    actions = spec.get("validationActions")
    if not actions or not isinstance(actions, list):
        yield "spec.validationActions", "Required value"
        return
    for index, action in enumerate(actions):
        if action not in VALIDATION_ACTIONS:
            yield f"spec.validationActions[{index}]", _unsupported(action, VALIDATION_ACTIONS)
        elif actions.index(action) != index:
            yield f"spec.validationActions[{index}]", f'Duplicate value: "{action}"'
    if "Deny" in actions and "Warn" in actions:
        yield "spec.validationActions", "Invalid value: must not contain both Deny and Warn"
    if isinstance(spec.get("matchResources"), dict):
        yield from _match_problems("spec.matchResources", spec["matchResources"])


def _match_problems(field: str, match: dict) -> Iterator[Problem]:
    for rules_field in ("resourceRules", "excludeResourceRules"):
        for index, rule in enumerate(match.get(rules_field) or []):
            yield from _rule_problems(f"{field}.{rules_field}[{index}]", rule)
    for selector_field in ("namespaceSelector", "objectSelector"):
        problem = selector_problem(match.get(selector_field))
        if problem is not None:
            where, detail = problem
            yield f"{field}.{selector_field}" + (f".{where}" if where else ""), detail


def _rule_problems(field: str, rule: Any) -> Iterator[Problem]:
    if not isinstance(rule, dict):
        yield field, "Invalid value: must be an object"
        return
    for required in ("apiGroups", "apiVersions", "operations", "resources"):
        if not rule.get(required):
            yield f"{field}.{required}", "Required value"
    for index, operation in enumerate(rule.get("operations") or []):
        if operation not in OPERATIONS:
            yield f"{field}.operations[{index}]", _unsupported(operation, OPERATIONS)
    if rule.get("scope", "*") not in _SCOPES:
        yield f"{field}.scope", _unsupported(rule.get("scope"), _SCOPES)


def _expression_problems(spec: dict) -> Iterator[Problem]:
    """Every expression compiles; a variable may name only the variables before it, the rest all of them."""
    declared: list[str] = []
    for index, variable in enumerate(spec.get("variables") or []):
        name = variable.get("name") or ""
        if not name:
            yield f"spec.variables[{index}].name", "Required value"
        elif not _CEL_IDENTIFIER.match(name):
            yield (
                f"spec.variables[{index}].name",
                f'Invalid value: "{name}": name is not a valid CEL identifier',
            )
        yield from _compiles(f"spec.variables[{index}].expression", variable.get("expression"), declared)
        declared.append(name)
    for index, validation in enumerate(spec.get("validations") or []):
        field = f"spec.validations[{index}]"
        yield from _compiles(f"{field}.expression", validation.get("expression"), declared)
        if validation.get("messageExpression") is not None:
            yield from _compiles(f"{field}.messageExpression", validation["messageExpression"], declared)
        if validation.get("reason") is not None and validation["reason"] not in REASONS:
            yield f"{field}.reason", _unsupported(validation["reason"], REASONS)
    yield from _condition_problems(spec.get("matchConditions") or [], declared)
    for index, annotation in enumerate(spec.get("auditAnnotations") or []):
        if not annotation.get("key"):
            yield f"spec.auditAnnotations[{index}].key", "Required value"
        value = annotation.get("valueExpression")
        yield from _compiles(f"spec.auditAnnotations[{index}].valueExpression", value, declared)


def _condition_problems(conditions: list, declared: list[str]) -> Iterator[Problem]:
    names: set[str] = set()
    for index, condition in enumerate(conditions):
        name = condition.get("name") or ""
        if not name:
            yield f"spec.matchConditions[{index}].name", "Required value"
        elif name in names:
            yield f"spec.matchConditions[{index}].name", f'Duplicate value: "{name}"'
        names.add(name)
        yield from _compiles(
            f"spec.matchConditions[{index}].expression", condition.get("expression"), declared
        )


def _compiles(field: str, expression: Any, variables: list[str]) -> Iterator[Problem]:
    if not expression:
        yield field, "Required value"
        return
    problem = compile_problem(expression, variables)
    if problem is not None:
        yield field, f'Invalid value: "{expression}": {problem}'
