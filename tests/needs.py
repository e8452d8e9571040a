"""What a test needs beyond its own process, found from its code: a browser, a fuzzer (the API's, or the walk
of the whole site with bad input), a real Celery worker, or another process (a manage.py command, gunicorn,
Prometheus, promtool, a script).

tests/conftest.py marks each collected test with what it needs (`browser`, `fuzz`, `celery`, `process`),
so that `./scripts/test --fast` leaves those out. No test is marked by hand: a test needs what the code it
runs reaches, and that is read from the code of the test, of every fixture it uses and, transitively, of
every function and class of the tests' own modules they name (`tests.*`). A name is followed to what the
module's globals or an import give it (`subprocess`, `running_worker(...)`, `restored.run(...)`), so a
helper that starts a process marks every test that calls it, however many helpers away. The few helpers
that are themselves a worker or a fuzzer say so once (`@needs(...)`).
"""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
from collections.abc import Iterable
from types import CodeType, FunctionType, ModuleType

MARKERS = {
    "browser": "drives Chromium through playwright",
    "fuzz": "fuzzes the API with schemathesis, or the whole site with bad input",
    "celery": "runs a real Celery worker",
    "process": "starts another process (a command, a server, a script)",
}
# A module a test reaches, by the first part of its name, and what that means it needs.
MODULES = {
    "playwright": "browser",
    "schemathesis": "fuzz",
    "subprocess": "process",
    "multiprocessing": "process",
}
PROCESS_CALLS = {os.fork, os.system, subprocess.Popen}
NAMED: dict[object, str] = {}  # helpers that say what they are (`@needs`)
PROBED = {"tests", "os"}  # modules whose attributes a test reaches through them (`restored.run`, `os.fork`)


def needs(what: str):
    """Says that a helper of the tests is itself what `what` names (the session's worker, a walk of the whole
    site with bad input): every test that reaches it needs that."""
    if what not in MARKERS:
        raise ValueError(f"{what!r} is none of {sorted(MARKERS)}")

    def name(function):
        NAMED[function] = what
        return function

    return name


def codes(code: CodeType) -> Iterable[CodeType]:
    """`code` and the code of every function, lambda and comprehension written inside it."""
    yield code
    for const in code.co_consts:
        if isinstance(const, CodeType):
            yield from codes(const)


def named(code: CodeType, namespace: dict) -> Iterable[object]:
    """The objects `code` names: each name it reads that `namespace` (the module's globals) or an import
    (`import a.b`, `from a import b`) gives, and `module.attribute` for the modules among them whose
    attributes matter (the tests' own, and `os`). Read from the names the code uses, not from its
    instructions: an attribute named like one of the module's globals counts too, which only ever marks a
    test with more than it needs."""
    names = code.co_names
    for name in names:
        value = namespace.get(name)
        if value is None:
            value = sys.modules.get(name)  # a dotted name the code imports
        if value is None:
            continue
        yield value
        if isinstance(value, ModuleType) and value.__name__.partition(".")[0] in PROBED:
            for attribute in names:
                yield getattr(value, attribute, None)


def _lookup(table: dict | set, value: object) -> object:
    """`table[value]` (a set: whether it holds `value`), or None; unhashable values are in no table."""
    try:
        return table.get(value) if isinstance(table, dict) else (value in table or None)
    except TypeError:
        return None


class Reach:
    """What a piece of the tests' code needs, each function read once however often it is reached."""

    def __init__(self):
        self.seen: dict[int, tuple[object, set[str]]] = {}  # by id, each object kept so that its id stays its

    def of(self, value: object) -> set[str]:
        if id(value) in self.seen:
            return self.seen[id(value)][1]
        found: set[str] = set()
        self.seen[id(value)] = (value, found)  # a function reached again while being read adds nothing new
        found |= self._of(value)
        return found

    def _of(self, value: object) -> set[str]:
        if isinstance(value, ModuleType):
            need = MODULES.get(value.__name__.partition(".")[0])
            return {need} if need else set()
        named_need = _lookup(NAMED, value)
        if named_need:
            return {named_need} | self._body(value)
        if _lookup(PROCESS_CALLS, value):
            return {"process"}
        module = (getattr(value, "__module__", None) or "").partition(".")[0]
        if module in MODULES:
            return {MODULES[module]}
        return self._body(value) if module == "tests" else set()

    def _body(self, value: object) -> set[str]:
        if isinstance(value, type):
            return set().union(*(self.of(member) for member in vars(value).values() if _callable(member)))
        function = _function(value)
        if function is None:
            return set()
        needs: set[str] = set()
        for code in codes(function.__code__):
            for reached in named(code, {**_closure(function), **function.__globals__}):
                if reached is not None:
                    needs |= self.of(reached)
        return needs


def _callable(member: object) -> bool:
    return isinstance(member, FunctionType | staticmethod | classmethod | property)


def _function(value: object) -> FunctionType | None:
    """The plain function behind a test, a fixture, a method or a hypothesis-wrapped test."""
    if isinstance(value, staticmethod | classmethod):
        value = value.__func__
    if isinstance(value, property):
        value = value.fget
    value = getattr(getattr(value, "hypothesis", None), "inner_test", value)
    if callable(value):
        value = inspect.unwrap(value)
    return value if isinstance(value, FunctionType) else None


def _closure(function: FunctionType) -> dict[str, object]:
    """The names a function closes over (a fixture's helper defined inside it, a local import)."""
    cells = function.__closure__ or ()
    out = {}
    for name, cell in zip(function.__code__.co_freevars, cells, strict=True):
        try:
            out[name] = cell.cell_contents
        except ValueError:  # not yet filled
            continue
    return out


def needs_of(item, reach: Reach) -> set[str]:
    """What a collected test needs: what its own code, every fixture it uses and the kind of test it is (a
    schemathesis case) reach."""
    fixtures = [each.func for defs in item._fixtureinfo.name2fixturedefs.values() for each in defs]
    return set().union(reach.of(type(item)), reach.of(item.function), *(reach.of(each) for each in fixtures))
