"""The project's modules and what each imports, read from its source, and the import rules of the
architecture map (docs/architecture.md, `## Import rules`) checked against them.

An import counts wherever it sits: at the top of a module, inside a function, or only under TYPE_CHECKING.
A rule's prefix covers the module of that name and everything under it (`pools.models` covers
`pools.models.capacity`, not `pools.modelsx`); `*` is every module of the four apps.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
APPS = ("portal", "pools", "billing", "monitoring")
HEADING = "## Import rules"
COLUMNS = ["modules", "must not import", "except in", "why"]
NONE = "—"
EVERY = "*"


def project_modules(root: Path = ROOT, apps: tuple[str, ...] = APPS) -> dict[str, Path]:
    """Dotted name -> source file of every module of `apps` under `root`, but their migrations."""
    found = {}
    for app in apps:
        for path in sorted((root / app).rglob("*.py")):
            if "migrations" in path.relative_to(root).parts:
                continue
            name = ".".join(path.relative_to(root).with_suffix("").parts).removesuffix(".__init__")
            found[name] = path
    return found


def _statements(name: str, path: Path):
    """(base, imported names) of each import statement anywhere in the module, relative ones resolved:
    `import a.b` is ("a.b", []), `from a import b, c` is ("a", ["b", "c"])."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, []
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            yield base, [alias.name for alias in node.names]


def imported(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The project modules `name` imports anywhere in its source (a package's own submodules count)."""
    out = set()

    def add(target: str) -> None:
        while target and target not in known:
            target = target.rpartition(".")[0]
        if target and target != name:
            out.add(target)

    for base, names in _statements(name, path):
        if not names:
            add(base)
        for alias in names:
            full = f"{base}.{alias}"
            add(full if full in known else base)
    return out


def imports_in(name: str, path: Path) -> set[str]:
    """Every dotted name the module imports anywhere, the project's and any other (`django.core.mail`):
    `from a import b` imports `a` and, when `b` is a module, `a.b`, so both count."""
    out = set()
    for base, names in _statements(name, path):
        out.add(base)
        out.update(f"{base}.{alias}" for alias in names if alias != "*")
    return out


def under(name: str, prefix: str) -> bool:
    return prefix == EVERY or name == prefix or name.startswith(prefix + ".")


@dataclass(frozen=True)
class Rule:
    modules: tuple[str, ...]
    forbidden: tuple[str, ...]
    exempt: tuple[str, ...]
    why: str

    def applies_to(self, module: str) -> bool:
        return any(under(module, p) for p in self.modules) and not any(under(module, p) for p in self.exempt)


def _prefixes(cell: str, *, empty_allowed: bool) -> tuple[str, ...]:
    """The backticked names of a cell, separated by commas; `—` alone where the cell may be empty."""
    cell = cell.strip()
    if empty_allowed and cell == NONE:
        return ()
    items = [item.strip() for item in cell.split(",")]
    names = [m.group(1) for item in items if (m := re.fullmatch(r"`([A-Za-z_*][\w.]*)`", item))]
    if not items or len(names) != len(items):
        raise ValueError(f"not a list of `dotted.prefix`es: {cell!r}")
    return tuple(names)


def read_rules(markdown: str) -> list[Rule]:
    """The rules of the table under the `## Import rules` heading (its first table); ValueError when the
    heading, the table or a well-formed row is missing."""
    lines = markdown.splitlines()
    if HEADING not in lines:
        raise ValueError(f"no {HEADING!r} heading")
    section = lines[lines.index(HEADING) + 1 :]
    section = section[: next((i for i, line in enumerate(section) if line.startswith("## ")), len(section))]
    start = next((i for i, line in enumerate(section) if line.startswith("|")), None)
    if start is None:
        raise ValueError(f"no table under {HEADING!r}")
    header, _separator, *rows = [line for line in section[start:] if line.startswith("|")]
    cells = [cell.strip() for cell in header.strip().strip("|").split("|")]
    if cells != COLUMNS:
        raise ValueError(f"the table's columns are {cells}, not {COLUMNS}")
    rules = []
    for row in rows:
        modules, forbidden, exempt, why = row.strip().removeprefix("|").removesuffix("|").split("|", 3)
        rules.append(
            Rule(
                modules=_prefixes(modules, empty_allowed=False),
                forbidden=_prefixes(forbidden, empty_allowed=False),
                exempt=_prefixes(exempt, empty_allowed=True),
                why=why.strip(),
            )
        )
    if not rules:
        raise ValueError(f"the table under {HEADING!r} has no rows")
    return rules


def unknown_names(
    rules: list[Rule], known: dict[str, Path] | set[str], apps: tuple[str, ...] = APPS
) -> list[str]:
    """Every prefix of the project's own apps that names no module: a rule with a typo holds vacuously."""
    names = [p for rule in rules for p in (*rule.modules, *rule.forbidden, *rule.exempt)]
    return sorted(
        {p for p in names if p.partition(".")[0] in apps and not any(under(module, p) for module in known)}
    )


def broken(rules: list[Rule], graph: dict[str, set[str]]) -> list[str]:
    """Each import that breaks a rule, as `module imports target (why)`. A module inside a forbidden prefix
    may import the rest of it (a package's own modules import each other)."""
    found = []
    for module, targets in sorted(graph.items()):
        for rule in rules:
            if not rule.applies_to(module):
                continue
            bad = {t for t in targets if any(under(t, p) and not under(module, p) for p in rule.forbidden)}
            # `from a.b import c` imports a.b and, if c is a module, a.b.c: named once, as a.b
            found += [f"{module} imports {t} ({rule.why})" for t in sorted(bad) if not _within(t, bad - {t})]
    return found


def _within(name: str, others: set[str]) -> bool:
    return any(name.startswith(other + ".") for other in others)


def pure_cores(rules: list[Rule]) -> dict[str, tuple[str, ...]]:
    """The modules that must not import Django (the pure cores) -> every prefix they must not import."""
    return {prefix: rule.forbidden for rule in rules if "django" in rule.forbidden for prefix in rule.modules}
