"""Real Celery workers as the operations tests drive them: several prefork workers on one queue, tasks sent
where production's router sends them, a condition waited for, and what the workers did read back from their
logs."""

import re
import subprocess
import time
from contextlib import ExitStack, contextmanager

from tests.conftest import running_worker

TWO_MIG = "h200-141gb.mig-2g.35gb"  # no GPU has one yet: a pool of them waits for a re-partition


def wait_for(condition, what: str, timeout: float = 60, every: float = 0.1, meanwhile=None):
    """Poll until `condition()` holds, calling `meanwhile()` (which watches, or asserts) each time."""
    deadline = time.monotonic() + timeout
    while not (found := condition()):
        assert time.monotonic() < deadline, what
        if meanwhile is not None:
            meanwhile()
        time.sleep(every)
    return found


@contextmanager
def default_queue(name: str):
    """Tasks the test sends without naming a queue go to `name` meanwhile: to workers of its own."""
    from portal.celery import app

    before = app.conf.task_default_queue
    app.conf.task_default_queue = name
    try:
        yield
    finally:
        app.conf.task_default_queue = before


@contextmanager
def routed(default: str):
    """Tasks the test sends go where production's router sends them (each app's plugin, with its queue
    settings as the test sets them), the others to `default`, instead of all to the session's queue."""
    from portal.celery import app, route_to_own_queue

    before = {"task_default_queue": app.conf.task_default_queue, "task_routes": app.conf.task_routes}
    app.conf.update(task_default_queue=default, task_routes=(route_to_own_queue,))  # update: a new router
    try:
        yield
    finally:
        app.conf.update(before)


@contextmanager
def workers(queue: str, tmp_path, names=("a", "b"), env=None):
    """Prefork workers, one per name, each under its own node name, all consuming `queue`."""
    with ExitStack() as stack:
        started = []
        for name in names:
            workdir = tmp_path / name
            workdir.mkdir()
            started.append(
                stack.enter_context(
                    running_worker(queue, workdir, pool="prefork", hostname=f"{name}-{queue}@%h", env=env)
                )
            )
        yield started


def took(worker, task: str) -> int:
    """How many deliveries of `task` the worker received (a retry is a delivery of its own)."""
    return worker.log.read_text().count(f"Task {task}[")  # the banner lists names without a bracket


def finished(workers_, task: str) -> list[str]:
    """What each run of `task` returned, over all the workers' logs, in no particular order."""
    pattern = re.compile(rf"Task {re.escape(task)}\[[^\]]+\] succeeded in [\d.]+s: (.*)")
    return [m.group(1) for w in workers_ for m in pattern.finditer(w.log.read_text())]


def failures(workers_) -> list[str]:
    return [line for w in workers_ for line in w.log.read_text().splitlines() if "raised unexpected" in line]


def pool_children(worker) -> list[int]:
    found = subprocess.run(["pgrep", "-P", str(worker.process.pid)], capture_output=True, text=True)
    return [int(pid) for pid in found.stdout.split()]
