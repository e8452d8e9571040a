"""The one way from the pools services to Celery: a task named, sent once the transaction commits.

Services never import the task modules (the tasks call the services, so the dependency runs one
way), and nothing is sent for a change that is rolled back. What is about to be sent is a `Send`,
so a test can read it off the transaction's commit callbacks.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.db import transaction

from portal.celery import app

ADMIT = "pools.tasks.admit_waiting_requests"
PROVISION = "pools.tasks.provision_pool"
FINISH_RELEASE = "pools.tasks.finish_pool_release"
SETTLE_MOVE = "pools.tasks.settle_pool_move"
SYNC = "pools.tasks.sync_cluster_now"
EVENT_EMAIL = "pools.tasks.send_event_email"
WHATIF_RUN = "pools.tasks.execute_whatif_run"


@dataclass(frozen=True)
class Send:
    task: str
    args: tuple = ()

    def __call__(self) -> None:
        app.send_task(self.task, args=list(self.args))


def after_commit(task: str, *args) -> None:
    """Enqueue `task` with `args` when the current transaction commits (at once outside of one)."""
    transaction.on_commit(Send(task, args))
