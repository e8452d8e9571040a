"""./scripts/run, read as text: the Celery workers it starts consume every queue the portal sends tasks to,
each kind of work on a worker of its own, as the Kubernetes manifests have it."""

import contextlib
import io
import re
import shlex

from django.conf import settings as django_settings

from billing.conf import settings as billing_settings
from monitoring.conf import settings as monitoring_settings
from pools.conf import settings
from portal import shell
from tests.deploy.manifests import ROOT


def script() -> str:
    return (ROOT / "scripts" / "run").read_text().replace("\\\n", " ")


def workers() -> list[list[str]]:
    """The words of each `celery -A portal worker` command of the script, up to its redirections."""
    lines = [line.strip() for line in script().splitlines()]
    commands = [line for line in lines if line.startswith("celery -A portal worker")]
    return [shlex.split(command.partition(">")[0], posix=False) for command in commands]


def option(words: list[str], name: str) -> str | None:
    return words[words.index(name) + 1] if name in words else None


def read_by_the_script() -> dict[str, str]:
    """The shell variables of the script's `read -r`, each with the value the code it gives
    `manage.py shell -c` prints, run here: the queues and runs at once as the portal reads them (from the
    environment or .env)."""
    text = script()
    (names,) = re.findall(r"read -r ([\w ]+) < <\(", text)
    (code,) = re.findall(r"manage\.py shell --no-imports\s+-c '([^']*)'", text)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(code, {})
    values = printed.getvalue().split()
    assert len(values) == len(names.split())
    return dict(zip(names.split(), values, strict=True))


def test_each_queue_has_a_worker_of_its_own_and_none_takes_two():
    read = read_by_the_script()
    found = workers()
    queues = [read[option(words, "--queues").strip('"$')] for words in found]
    routed = {route["queue"] for route in shell.task_routes().values()}

    assert len(found) == 6
    assert all(option(words, "--exclude-queues") is None for words in found)
    assert sorted(queues) == sorted({django_settings.CELERY_TASK_DEFAULT_QUEUE, *routed})  # one worker each
    assert all("," not in queue for queue in queues)
    hostnames = [option(words, "--hostname") for words in found]
    assert len(set(hostnames)) == len(found)  # the default worker's is Celery's own, celery@%h


def test_the_queues_and_runs_are_those_the_portal_reads():
    read = read_by_the_script()

    assert read == {
        "default_queue": django_settings.CELERY_TASK_DEFAULT_QUEUE,
        "provisioning_queue": settings.PROVISIONING_QUEUE,
        "sync_queue": settings.SYNC_QUEUE,
        "monitoring_queue": monitoring_settings.MONITORING_QUEUE,
        "metering_queue": billing_settings.METERING_QUEUE,
        "whatif_queue": settings.WHATIF_QUEUE,
        "whatif_runs": str(settings.WHATIF_MAX_RUNNING),
    }


def test_what_if_runs_take_as_many_processes_as_the_portal_lets_go_and_the_rest_stay_modest():
    by_queue = {option(words, "--queues"): words for words in workers()}

    assert option(by_queue['"$whatif_queue"'], "--concurrency") == '"$whatif_runs"'
    others = [
        option(words, "--concurrency") for queue, words in by_queue.items() if queue != '"$whatif_queue"'
    ]
    assert all(int(concurrency) <= 2 for concurrency in others)  # the demo runs on a laptop's cores
