"""What the tests of the trace commands (`place`, `simulate`) share: a trace written to a file, a command run
in this process or as a process of its own without a database."""

import io
import json
import os
import subprocess
import sys
from pathlib import Path

from django.core.management import call_command

ROOT = Path(__file__).resolve().parents[2]
# A database URL that nothing listens on: the trace commands must not need one.
NO_DATABASE = "postgres://nobody@127.0.0.1:9/none"


def write(tmp_path: Path, trace: object, name: str = "trace.json") -> Path:
    path = tmp_path / name
    path.write_text(trace if isinstance(trace, str) else json.dumps(trace), encoding="utf-8")
    return path


def run_command(command: str, *args: str, stdin: str | None = None) -> tuple[str, str]:
    """Standard output and error of `command` run in this process."""
    out, err = io.StringIO(), io.StringIO()
    options = {"stdin": io.StringIO(stdin)} if stdin is not None else {}
    call_command(command, *args, stdout=out, stderr=err, **options)
    return out.getvalue(), err.getvalue()


def manage_command(command: str, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    """`manage.py command` as a process of its own, with no database to reach."""
    env = {**os.environ, "DATABASE_URL": NO_DATABASE, "DEBUG": "true"}
    return subprocess.run(
        [sys.executable, "manage.py", command, *args],
        cwd=ROOT,
        env=env,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
    )
