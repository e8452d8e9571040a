"""CEL as the test API server compiles and evaluates it for admission policies: cel-python (`celpy`) parses
and evaluates, and this module adds what Kubernetes' CEL environment checks at compile time and celpy does
not.

Words used here:
- declared names: the variables an expression may name (`object`, `oldObject`, `request`, ...); naming any
  other is a compile error, as in Kubernetes (`undeclared reference to 'x'`);
- bound name: the loop variable of a macro (`c` in `containers.all(c, ...)`), declared inside the macro;
- composition variables: `variables.<name>`; an expression may name only the variables declared to it (a
  policy's variable, only those before it), anything else is a compile error;
- evaluation error: a runtime failure (a missing key without `has()`, a type mismatch, 1/0), reported as
  Kubernetes reports it: `expression '<expression>' resulted in error: <what>`.

Compile checks are syntax, undeclared names, unknown functions and undeclared composition variables; there
is no type checker, so a type error shows only when evaluated. Besides celpy's standard functions (`size`,
`contains`, `startsWith`, `endsWith`, `matches`, conversions, timestamps) and macros (`has`, `all`,
`exists`, `exists_one`, `map`, `filter`), Kubernetes' string library is served in part: `split`, `join`,
`lowerAscii`, `upperAscii`, `trim`. Not served: optional syntax (`.?`, `?.`, `optional.of`), `dyn`, the
Kubernetes libraries for lists (`isSorted`, `sum`, `indexOf`), regex (`find`), URLs, IPs, quantities, sets and
the authorizer, and string functions other than those listed.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from functools import cache, lru_cache
from typing import Any

import celpy
import lark
from celpy import celtypes
from celpy.celparser import CELParseError
from celpy.evaluation import CELEvalError, base_functions
from lark.exceptions import UnexpectedCharacters, UnexpectedToken

DECLARED = frozenset({"object", "oldObject", "request", "params", "namespaceObject", "variables"})
_MACROS = frozenset({"has", "all", "exists", "exists_one", "map", "filter"})


def _add(left: Any, right: Any) -> Any:
    """celpy's `+`, keeping CEL types: celpy's own leaves a plain str or list, on which `contains` fails."""
    result = base_functions["_+_"](left, right)
    if isinstance(result, str) and not isinstance(result, celtypes.StringType):
        return celtypes.StringType(result)
    if isinstance(result, list) and not isinstance(result, celtypes.ListType):
        return celtypes.ListType(result)
    return result


_EXTENSIONS: dict[str, Callable[..., Any]] = {
    "_+_": _add,
    "split": lambda text, separator: celtypes.ListType(
        [celtypes.StringType(p) for p in text.split(separator)]
    ),
    "join": lambda items, separator="": celtypes.StringType(str(separator).join(items)),
    "lowerAscii": lambda text: celtypes.StringType(text.lower()),
    "upperAscii": lambda text: celtypes.StringType(text.upper()),
    "trim": lambda text: celtypes.StringType(text.strip()),
}
_FUNCTIONS = frozenset(name for name in base_functions if name[0].isalpha()) | _EXTENSIONS.keys() | _MACROS
# Parsing shares one lark parser; requests arrive on many threads.
_compile_lock = threading.Lock()

Value = Any  # a celpy value: celtypes.*, or None for null


class CompileError(Exception):
    """An expression Kubernetes would refuse to store; the message is in its form (`compilation failed:`)."""


class EvaluationError(Exception):
    """An expression that failed at run time; the message is in Kubernetes' form, `what` the failure alone."""

    def __init__(self, expression: str, what: str) -> None:
        super().__init__(f"expression '{expression}' resulted in error: {what}")
        self.what = what


@cache
def _environment() -> celpy.Environment:
    return celpy.Environment()  # a third of a second: built once, on first use


@dataclass(frozen=True)
class Program:
    expression: str
    runner: celpy.Runner

    def evaluate(self, activation: Mapping[str, Value]) -> Value:
        try:
            result = self.runner.evaluate(dict(activation))
        except CELEvalError as error:
            raise EvaluationError(self.expression, describe(error)) from error
        except Exception as error:  # celpy's own failures (unsupported features, a function's TypeError)
            raise EvaluationError(self.expression, str(error) or type(error).__name__) from error
        if isinstance(result, CELEvalError):
            raise EvaluationError(self.expression, describe(result))
        return result


def describe(error: CELEvalError) -> str:
    """celpy's error in Kubernetes' words where they differ, without celpy's dump of the activation."""
    message = str(error.args[0]) if error.args else "evaluation failed"
    details = error.args[2] if len(error.args) > 2 and error.args[2] else ()
    if message == "no such key" and details:
        return f"no such key: {details[0]}"
    if message.startswith("no such member in mapping: "):
        return "no such key: " + message.removeprefix("no such member in mapping: ").strip("'")
    if message.startswith("found no matching overload"):
        return "no such overload"
    return message.split(" (in activation")[0]


@lru_cache(maxsize=512)
def compile_expression(expression: str, variables: frozenset[str] = frozenset()) -> Program:
    """A program for `expression`, which may name the declared names and `variables.<one of variables>`."""
    with _compile_lock:
        environment = _environment()
        try:
            tree = environment.compile(expression)
        except CELParseError as error:
            raise CompileError(_syntax_error(expression, error)) from error
        _check_names(tree, variables)
        return Program(expression, environment.program(tree, functions=_EXTENSIONS))


def compile_problem(expression: Any, variables: Collection[str] = ()) -> str | None:
    """Why `expression` does not compile (a 422's detail), or None."""
    if not isinstance(expression, str):
        return "compilation failed: the expression must be a string"
    try:
        compile_expression(expression, frozenset(variables))
    except CompileError as error:
        return str(error)
    return None


def _syntax_error(expression: str, error: CELParseError) -> str:
    """In ANTLR's words, which Kubernetes reports: `mismatched input '<EOF>'`, `token recognition error`;
    an early end is placed just after the text, as ANTLR places it."""
    cause = error.__context__
    line, column = error.line, error.column
    if isinstance(cause, UnexpectedToken) and cause.token.type == "$END":
        lines = expression.split("\n")
        return _located(len(lines), len(lines[-1]) + 1, "Syntax error: mismatched input '<EOF>'")
    if isinstance(cause, UnexpectedToken):
        return _located(line, column, f"Syntax error: mismatched input '{cause.token.value}'")
    if isinstance(cause, UnexpectedCharacters):
        return _located(line, column, f"Syntax error: token recognition error at: '{cause.char}'")
    return _located(line, column, "Syntax error")


def _located(line: int | None, column: int | None, problem: str) -> str:
    return f"compilation failed: ERROR: <input>:{line or 1}:{column or 1}: {problem.strip()}"


def _check_names(tree: lark.Tree, variables: frozenset[str]) -> None:
    """Kubernetes' compile-time checks that celpy lacks: every name declared, every function known."""
    known = {"ident": DECLARED | _bound_names(tree) | _FUNCTIONS, "ident_arg": _FUNCTIONS}
    for node in tree.iter_subtrees():
        if node.data in known and node.children[0] not in known[node.data]:
            _refuse(node.children[0], "undeclared reference to '{}'")
        elif node.data == "member_dot_arg" and node.children[1] not in _FUNCTIONS:
            _refuse(node.children[1], "found no matching overload for '{}'")
        elif node.data == "member_dot" and node.children[1] not in variables and _names_variables(node):
            _refuse(node.children[1], "undefined field '{}'")


def _refuse(token: lark.Token, problem: str) -> None:
    raise CompileError(_located(token.line, token.column, problem.format(token)))


def _bound_names(tree: lark.Tree) -> set[str]:
    """The loop variables of every macro in the expression (an approximation: declared everywhere)."""
    bound = set()
    for node in tree.iter_subtrees():
        if node.data == "member_dot_arg" and node.children[1] in _MACROS and len(node.children) > 2:
            arguments = node.children[2]
            if isinstance(arguments, lark.Tree) and arguments.children:
                bound.update(str(t) for t in arguments.children[0].scan_values(_is_identifier))
    return bound


def _is_identifier(value: Any) -> bool:
    return isinstance(value, lark.Token) and value.type == "IDENT"


def _names_variables(selection: lark.Tree) -> bool:
    """Whether a field selection is made on the identifier `variables` itself."""
    node = selection.children[0]
    while isinstance(node, lark.Tree) and len(node.children) == 1 and node.data != "ident":
        node = node.children[0]
    return isinstance(node, lark.Tree) and node.data == "ident" and node.children[0] == "variables"


def to_cel(value: Any) -> Value:
    """A JSON value (as json.loads gives it) as a CEL value. A map's null fields are left out, as they are
    once a real server has decoded an object; bool is tested before int, since bool is an int in Python."""
    if value is None:
        return None
    if isinstance(value, bool):
        return celtypes.BoolType(value)
    if isinstance(value, int):
        return celtypes.IntType(value)
    if isinstance(value, float):
        return celtypes.DoubleType(value)
    if isinstance(value, str):
        return celtypes.StringType(value)
    if isinstance(value, list | tuple):
        return celtypes.ListType([to_cel(item) for item in value])
    if isinstance(value, dict):
        return celtypes.MapType(
            {celtypes.StringType(key): to_cel(item) for key, item in value.items() if item is not None}
        )
    raise TypeError(f"not a JSON value: {value!r}")


class LazyVariables(celtypes.MapType):
    """`variables`: each composition variable is evaluated when first named, then kept for this request."""

    def __init__(self, compute: Callable[[str], Value], names: Collection[str]) -> None:
        super().__init__({celtypes.StringType(name): None for name in names})
        self._compute = compute
        self._values: dict[str, Value] = {}

    def __getitem__(self, key: Any) -> Value:
        super().__getitem__(key)  # a KeyError for a name not declared
        name = str(key)
        if name not in self._values:
            self._values[name] = self._compute(name)
        return self._values[name]
