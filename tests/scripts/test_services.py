"""scripts/lib/services.py: a configured service that does not answer is named, with what to do."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_services(**env):
    return subprocess.run(
        [sys.executable, "scripts/lib/services.py"],
        cwd=ROOT,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_reachable_services_are_exported():
    result = run_services()
    assert result.returncode == 0, result.stderr
    assert f"export DATABASE_URL={os.environ['DATABASE_URL']}" in result.stdout
    assert "export REDIS_URL=" in result.stdout


def test_unreachable_database_is_named_and_nothing_is_started():
    result = run_services(DATABASE_URL="postgres://postgres@127.0.0.1:9/portal")
    assert result.returncode == 1
    assert (
        "PostgreSQL does not answer at DATABASE_URL=postgres://postgres@127.0.0.1:9/portal" in result.stderr
    )
    assert "export" not in result.stdout


def test_unreachable_redis_is_named():
    result = run_services(REDIS_URL="redis://127.0.0.1:9/0")
    assert result.returncode == 1
    assert "Redis does not answer at REDIS_URL=redis://127.0.0.1:9/0" in result.stderr
