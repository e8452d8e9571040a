"""The one way from any app's services to Celery: a task named, sent once the transaction commits.

Services never import task modules (the tasks call the services, so the dependency runs one way), and
nothing is sent for a change that is rolled back. Each app names its own tasks (`pools/task_names.py` and
the like). What is about to be sent is a `Send`, so a test can read it off the transaction's commit
callbacks.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.db import transaction

from portal.celery import app


@dataclass(frozen=True)
class Send:
    task: str
    args: tuple = ()
    countdown: float | None = None  # seconds after the commit that the task runs, for a deadline

    def __call__(self) -> None:
        app.send_task(self.task, args=list(self.args), countdown=self.countdown)


def after_commit(task: str, *args, countdown: float | None = None) -> None:
    """Enqueue `task` with `args` when the current transaction commits (at once outside of one); with
    `countdown`, for that many seconds later."""
    transaction.on_commit(Send(task, args, countdown))
