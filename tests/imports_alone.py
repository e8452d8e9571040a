"""Imports each module alone, as `python -c "import module"` would, at the cost of one fork each.

Run as a process of its own (`python -m tests.imports_alone`) by tests/test_modules.py. It reads a JSON
request on stdin: {"modules": [...], "django": bool, "forbidden": [...]}. With "django" it runs
`django.setup()` once, as every process of the portal does before importing a module; without, it
imports nothing of the project. Then for each module it forks a child, which starts from exactly that
state, imports the module, and fails if it cannot, or if afterwards any module under a "forbidden" prefix
is loaded (a pure core that reaches Django through another module). A child's state is the fresh
interpreter's: no other project module was imported by the check itself. Prints {module: error} for the
modules that failed, as JSON.
"""

import importlib
import json
import os
import sys
import traceback

WIDTH = max(2, os.cpu_count() or 2)  # children at once: imports wait on the disk as well as the CPU
KEEP = 2000  # characters of a failure's traceback kept


def loaded_under(prefixes: list[str]) -> list[str]:
    return sorted(m for m in sys.modules if any(m == p or m.startswith(p + ".") for p in prefixes))


def child(module: str, forbidden: list[str], out: int) -> None:
    """In the forked child: import `module`, write what went wrong to `out`, exit 0 or 1."""
    os.dup2(2, 1)  # what an import prints goes to stderr; stdout carries the answer only
    failed = ""
    try:
        importlib.import_module(module)
        leaked = loaded_under(forbidden)
        if leaked:
            failed = f"imports what it must not: {', '.join(leaked[:5])}"
    except BaseException:  # a failed import may raise anything, SystemExit included
        failed = traceback.format_exc()[-KEEP:]
    os.write(out, failed.encode())
    os._exit(1 if failed else 0)


def import_each_alone(modules: list[str], forbidden: list[str]) -> dict[str, str]:
    running: dict[int, tuple[str, int]] = {}
    failures: dict[str, str] = {}

    def reap() -> None:
        pid, status = os.wait()
        module, out = running.pop(pid)
        with os.fdopen(out, "rb") as pipe:
            said = pipe.read().decode(errors="replace")
        if status != 0:
            failures[module] = said or f"exited with status {status}"

    for module in modules:
        while len(running) >= WIDTH:
            reap()
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(read)
            child(module, forbidden, write)
        os.close(write)
        running[pid] = (module, read)
    while running:
        reap()
    return failures


def main() -> None:
    request = json.load(sys.stdin)
    if request["django"]:
        import django

        django.setup()
    print(json.dumps(import_each_alone(request["modules"], request["forbidden"])))


if __name__ == "__main__":
    main()
