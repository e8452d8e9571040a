"""./scripts/run, read as text: the Celery workers it starts consume every queue the portal sends tasks to,
what-if runs on a worker of their own, as the Kubernetes manifests have it."""

import contextlib
import io
import re
import shlex

from pools.conf import settings
from tests.deploy.manifests import ROOT


def workers() -> list[list[str]]:
    """The words of each `celery -A portal worker` command of the script, up to its redirections."""
    text = (ROOT / "scripts" / "run").read_text().replace("\\\n", " ")
    lines = [line.strip() for line in text.splitlines()]
    commands = [line for line in lines if line.startswith("celery -A portal worker")]
    return [shlex.split(command.partition(">")[0], posix=False) for command in commands]


def option(words: list[str], name: str) -> str | None:
    return words[words.index(name) + 1] if name in words else None


def test_one_worker_takes_every_queue_but_what_if_runs_and_another_only_those():
    text = (ROOT / "scripts" / "run").read_text()
    found = workers()

    assert len(found) == 2
    general, whatif = sorted(found, key=lambda words: "--queues" in words)
    assert option(general, "--queues") is None  # the default queue, CELERY_QUEUE
    assert option(general, "--exclude-queues") == '"$whatif_queue"'
    assert option(whatif, "--queues") == '"$whatif_queue"'
    assert option(whatif, "--concurrency") == '"$whatif_runs"'
    assert "read -r whatif_queue whatif_runs" in text


def test_the_what_if_queue_and_runs_are_those_the_portal_reads():
    """The code the script gives `manage.py shell -c`, run here: it prints the queue and how many runs at
    once, as the portal reads them (from the environment or .env)."""
    text = (ROOT / "scripts" / "run").read_text().replace("\\\n", " ")
    (code,) = re.findall(r"manage\.py shell --no-imports\s+-c '([^']*)'", text)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(code, {})
    assert printed.getvalue().split() == [settings.WHATIF_QUEUE, str(settings.WHATIF_MAX_RUNNING)]
