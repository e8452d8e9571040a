"""The project's modules: each imports alone, the pure cores import no Django, no import loop exists, and no
import breaks a rule of the architecture map (docs/architecture.md, `## Import rules`).

An import counts whether it runs at module level, inside a function or only for type checking: a lazy
import hides a loop, or a door walked around, from Python, not from the reader.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.import_rules import (
    ROOT,
    broken,
    imported,
    imports_in,
    project_modules,
    pure_cores,
    read_rules,
    under,
    unknown_names,
)

ARCHITECTURE = ROOT / "docs" / "architecture.md"


def loops(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected groups of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for target in graph[module]:
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in on_stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == module:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for module in graph:
        if module not in index:
            visit(module)
    return found


def test_loop_finder_finds_a_loop():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert loops(graph) == [["a", "b", "c"]]
    assert loops({"a": {"b"}, "b": set()}) == []


def test_no_import_loop_among_the_project_modules():
    known = project_modules()
    graph = {name: imported(name, path, known) for name, path in known.items()}
    assert loops(graph) == []


def rules_of_the_map():
    return read_rules(ARCHITECTURE.read_text())


def test_no_import_breaks_a_rule_of_the_architecture_map():
    """Every module of the four apps but their migrations, which Django writes (with `django.conf`)."""
    rules = rules_of_the_map()
    known = project_modules()
    assert unknown_names(rules, known) == []
    assert broken(rules, {name: imports_in(name, path) for name, path in known.items()}) == []


def imports_alone(modules: list[str], *, django: bool, forbidden=()) -> dict[str, str]:
    """{module: what went wrong} for each of `modules` that fails to import alone, each in a process that
    has imported nothing else of the project (after `django.setup()` when `django`), and for which any
    module under a `forbidden` prefix is loaded afterwards (tests/imports_alone.py)."""
    request = {"modules": modules, "django": django, "forbidden": list(forbidden)}
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "portal.settings"}
    done = subprocess.run(
        [sys.executable, "-m", "tests.imports_alone"],
        input=json.dumps(request), cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def test_every_module_imports_alone_and_the_pure_cores_without_django():
    """Each module as `python -c "import ..."` would see it, in a process of its own after `django.setup()`:
    an import that only works after some other module happens to be loaded fails here. The pure cores
    (the map's rules that forbid Django) in a process that has not set Django up, and nothing they must not
    import may be loaded once they are, however indirectly."""
    modules = sorted(project_modules())
    assert "pools.placement.engine" in modules and "billing.metering" in modules
    failed = imports_alone(modules, django=True)
    for prefix, forbidden in pure_cores(rules_of_the_map()).items():
        pure = [module for module in modules if under(module, prefix)]
        assert pure, prefix
        failed |= imports_alone(pure, django=False, forbidden=forbidden)
    assert failed == {}


def test_the_purity_check_fails_for_a_module_that_needs_django():
    cores = pure_cores(rules_of_the_map())
    assert {"pools.placement", "pools.mig", "monitoring.collectors"} <= set(cores)
    assert imports_alone(["pools.placement.engine"], django=False, forbidden=cores["pools.placement"]) == {}
    failed = imports_alone(["pools.selectors.capacity"], django=False, forbidden=cores["pools.placement"])
    assert list(failed) == ["pools.selectors.capacity"]
    missing = imports_alone(["pools.no_such_module"], django=True)
    assert "ModuleNotFoundError" in missing["pools.no_such_module"]


RULES = """# A map

## Import rules

Some words.

| modules | must not import | except in | why |
|---|---|---|---|
| `shop.core` | `shop.web`, `requests` | — | The core is pure. |
| `*` | `vendor` | `shop.gateway`, `shop.web.vendor_hooks` | One door to the vendor. |
| `shop` | `shop.legacy` | `shop.legacy` | Nothing new leans on legacy. |

## Next section
"""

SHOP = {
    "shop/__init__.py": "",
    "shop/core/__init__.py": "from . import rules\n",
    "shop/core/rules.py": (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from shop.web.views import Page\n"
        "def fetch():\n    import requests.adapters\n"
    ),
    "shop/core/prices.py": "from ..web import forms\n",
    "shop/web/__init__.py": "from shop.core import rules\nimport vendor.client\n",
    "shop/web/forms.py": "",
    "shop/web/views.py": "from shop import legacy\n",
    "shop/web/vendor_hooks.py": "from vendor import hooks\n",
    "shop/webshop.py": "import vendorx\n",
    "shop/gateway.py": "import vendor\n",
    "shop/legacy/__init__.py": "from shop.legacy import old\n",
    "shop/legacy/old.py": "",
}


@pytest.fixture
def shop(tmp_path) -> dict[str, Path]:
    """A small package on disk whose imports break each kind of rule once, in each place an import sits."""
    for name, text in SHOP.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    return project_modules(tmp_path, apps=("shop",))


def test_the_rules_check_finds_each_import_that_breaks_a_rule(shop):
    rules = read_rules(RULES)
    assert [r.why for r in rules] == [
        "The core is pure.",
        "One door to the vendor.",
        "Nothing new leans on legacy.",
    ]
    graph = {name: imports_in(name, path) for name, path in shop.items()}
    assert broken(rules, graph) == [
        "shop.core.prices imports shop.web (The core is pure.)",  # relative
        "shop.core.rules imports requests.adapters (The core is pure.)",  # lazy, third-party
        "shop.core.rules imports shop.web.views (The core is pure.)",  # only for type checking
        "shop.web imports vendor.client (One door to the vendor.)",
        "shop.web.views imports shop.legacy (Nothing new leans on legacy.)",
    ]
    assert unknown_names(rules, shop, apps=("shop",)) == []
    assert unknown_names(read_rules(RULES.replace("`shop.gateway`", "`shop.gateways`")), shop, ("shop",)) == [
        "shop.gateways"
    ]


@pytest.mark.parametrize(
    ("text", "why"),
    [
        (RULES.replace("## Import rules", "## Imports"), "no '## Import rules' heading"),
        (RULES.replace("| modules |", "| module |"), "the table's columns"),
        (RULES.replace("`shop.web`, `requests`", "`shop.web` `requests`"), "not a list"),
        (RULES.replace("| — |", "|  |"), "not a list"),
        (RULES.split("| `shop.core`")[0], "has no rows"),
    ],
)
def test_a_map_without_a_well_formed_rules_table_is_refused(text, why):
    with pytest.raises(ValueError, match=why):
        read_rules(text)
