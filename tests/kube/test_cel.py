"""CEL as the test API server evaluates it for admission policies: what Kubernetes policies commonly write
evaluates as in Kubernetes, what is not served is refused when the policy is stored, and JSON converts to
CEL values without losing its types."""

from __future__ import annotations

import pytest
from celpy import celtypes

from tests.kube.cel import (
    CompileError,
    EvaluationError,
    LazyVariables,
    compile_expression,
    compile_problem,
    to_cel,
)

DEPLOYMENT = {
    "metadata": {"name": "web-1", "labels": {"app": "web", "app.kubernetes.io/part-of": "shop"}, "uid": None},
    "spec": {
        "replicas": 3,
        "paused": False,
        "ratio": 0.5,
        "template": {
            "spec": {
                "containers": [
                    {"name": "web", "image": "registry.example/web:1.2", "ports": [{"containerPort": 8080}]},
                    {"name": "proxy", "image": "registry.example/proxy:3"},
                ]
            }
        },
    },
}
CONTAINERS = "object.spec.template.spec.containers"


def evaluate(expression: str, obj: dict | None = DEPLOYMENT, **activation):
    values = {"object": to_cel(obj), "oldObject": None, "params": None, **activation}
    return compile_expression(expression, frozenset()).evaluate(values)


@pytest.mark.parametrize(
    "expression",
    [
        "has(object.spec.replicas) && !has(object.spec.strategy)",
        "'app' in object.metadata.labels && !('tier' in object.metadata.labels)",
        "object.metadata.labels['app.kubernetes.io/part-of'] == 'shop'",
        f"{CONTAINERS}.all(c, c.image.startsWith('registry.example/'))",
        f"{CONTAINERS}.exists(c, c.name == 'proxy')",
        f"{CONTAINERS}.exists_one(c, has(c.ports))",
        f"{CONTAINERS}.map(c, c.name) == ['web', 'proxy']",
        f"{CONTAINERS}.filter(c, c.image.endsWith(':3')).size() == 1",
        f"size({CONTAINERS}) == 2 && size(object.metadata.name) == 5",
        "object.metadata.name.contains('-') && object.metadata.name.matches('^web-[0-9]+$')",
        "object.spec.replicas > 2 ? true : false",
        "(object.spec.replicas <= 5 ? 'small' : 'large') == 'small'",
        "object.metadata.labels == {'app': 'web', 'app.kubernetes.io/part-of': 'shop'}",
        "[1, 2] == [1, 2] && [1, 2] != [2, 1]",
        "object.spec.paused == false && object.spec.ratio == 0.5",
        "string(object.spec.replicas) == '3' && int('3') == object.spec.replicas",
        "oldObject == null && params == null",
        "!has(object.metadata.uid)",  # a null field is no field, as once a real server has decoded it
        "'a,b'.split(',') == ['a', 'b'] && ['a', 'b'].join('-') == 'a-b'",
        "'Web'.lowerAscii() == 'web' && 'web'.upperAscii() == 'WEB' && ' x '.trim() == 'x'",
        "false && object.nope == 1 || true",  # errors give way to a decisive operand
        "(',' + object.metadata.name + ',').contains(',web-1,') && ([1] + [2]).exists(x, x == 2)",
    ],
)
def test_what_policies_commonly_write_evaluates_to_true(expression):
    assert evaluate(expression) == celtypes.BoolType(True)


@pytest.mark.parametrize(
    ("expression", "problem"),
    [
        ("object.?spec.orValue(1)", "Syntax error: mismatched input '?'"),  # optional syntax
        ("optional.of(1)", "undeclared reference to 'optional'"),
        ("dyn(object).spec", "undeclared reference to 'dyn'"),
        ("object.spec.containers.isSorted()", "found no matching overload for 'isSorted'"),
        ("'a'.indexOf('a') == 0", "found no matching overload for 'indexOf'"),
        ("authorizer.group('').check('get').allowed()", "undeclared reference to 'authorizer'"),
        ("variables.x", "undefined field 'x'"),
        ("object.name = 'x'", "token recognition error"),
    ],
)
def test_what_is_not_served_does_not_compile(expression, problem):
    found = compile_problem(expression)

    assert (
        found is not None and found.startswith("compilation failed: ERROR: <input>:1:") and problem in found
    )


def test_a_compile_error_says_where():
    with pytest.raises(CompileError) as raised:
        compile_expression("object.spec.replicas >\n  ", frozenset())

    assert (
        str(raised.value) == "compilation failed: ERROR: <input>:2:3: Syntax error: mismatched input '<EOF>'"
    )


@pytest.mark.parametrize(
    ("expression", "what"),
    [
        ("object.spec.strategy.type == 'Recreate'", "no such key: strategy"),
        ("object.metadata.labels['tier'] == 'x'", "no such key: tier"),
        ("object.metadata.name + 1 == 'x'", "no such overload"),
        ("object.spec.replicas / 0 == 1", "modulus or divide by zero"),
        ("oldObject.metadata.name == 'x'", "does not support field selection"),
    ],
)
def test_an_evaluation_error_names_the_expression_and_the_failure(expression, what):
    with pytest.raises(EvaluationError) as raised:
        evaluate(expression)

    assert str(raised.value).startswith(f"expression '{expression}' resulted in error: ")
    assert what in raised.value.what


def test_json_converts_to_cel_values_of_the_same_types():
    converted = to_cel({"t": True, "i": 1, "f": 1.5, "s": "x", "l": [None, 2], "m": {"k": "v"}, "n": None})

    assert [type(converted[key]) for key in ("t", "i", "f", "s", "l", "m")] == [
        celtypes.BoolType,
        celtypes.IntType,
        celtypes.DoubleType,
        celtypes.StringType,
        celtypes.ListType,
        celtypes.MapType,
    ]
    assert "n" not in converted and converted["l"] == celtypes.ListType([None, celtypes.IntType(2)])
    assert to_cel(None) is None


def test_variables_are_evaluated_once_and_only_when_named():
    evaluated: list[str] = []

    def compute(name: str):
        evaluated.append(name)
        return celtypes.IntType(len(evaluated))

    variables = LazyVariables(compute, ["used", "unused"])
    program = compile_expression("variables.used + variables.used", frozenset({"used", "unused"}))

    assert program.evaluate({"variables": variables}) == celtypes.IntType(2)
    assert evaluated == ["used"]
