"""The project's modules: each imports alone, the pure cores import no Django, and no import loop exists.

A loop counts whether its imports run at module level, inside a function or only for type checking: a
lazy import hides a loop from Python, not from the reader.
"""

import ast
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
APPS = ("portal", "pools", "billing", "monitoring")
# Plain data in and out, no Django: the MIG geometry, the placement engine, the GPU collectors.
PURE = ("pools.mig", "pools.placement", "monitoring.collectors")


def project_modules() -> dict[str, Path]:
    found = {}
    for app in APPS:
        for path in sorted((ROOT / app).rglob("*.py")):
            if "migrations" in path.parts:
                continue
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
            found[name] = path
    return found


def imported(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The project modules `name` imports anywhere in its source (a package's own submodules count)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()

    def add(target: str) -> None:
        while target and target not in known:
            target = target.rpartition(".")[0]
        if target and target != name:
            out.add(target)

    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            for alias in node.names:
                full = f"{base}.{alias.name}"
                add(full if full in known else base)
    return out


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


def _import_alone(module: str) -> tuple[str, int, str]:
    pure = module.startswith(PURE)
    code = (
        f"import sys, {module}\n"
        "leaked = sorted(m for m in sys.modules if m.partition('.')[0] == 'django' or m == 'pools.models')\n"
        "assert not leaked, f'a pure module imports {leaked[:3]}'\n"
        if pure
        else f"import django\ndjango.setup()\nimport {module}\n"
    )
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "portal.settings"}
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    return module, done.returncode, done.stderr[-600:]


def test_every_pools_and_monitoring_module_imports_alone():
    """Each in a fresh interpreter, as `python -c "import ..."` would: an import that only works after
    some other module happens to be loaded fails here."""
    modules = [name for name in project_modules() if name.partition(".")[0] in ("pools", "monitoring")]
    assert "pools.placement.engine" in modules and "monitoring.collectors.nvml" in modules
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 4) as pool:
        failed = [(module, err) for module, rc, err in pool.map(_import_alone, modules) if rc]
    assert failed == []


def test_the_purity_check_fails_for_a_module_that_needs_django(monkeypatch):
    assert _import_alone("pools.placement.engine")[1] == 0
    monkeypatch.setattr(sys.modules[__name__], "PURE", ("pools.selectors",))
    assert _import_alone("pools.selectors.capacity")[1] != 0
