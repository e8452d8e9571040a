"""What the what-if tests share: the list's address, the changes a form asks for, times of March 2026 in
Seoul (the month `march` in tests/pools/conftest.py writes), and a way to Celery that loses what it sends."""

from datetime import datetime
from types import SimpleNamespace
from zoneinfo import ZoneInfo

from portal import dispatch

SEOUL = ZoneInfo("Asia/Seoul")
LIST = "/capacity/whatif/"
CHANGES = {"add": "8 H100-80GB training", "remove": "h200-2", "regroup": "h100-1=inference"}


def kst(day: int, hour: int = 0) -> datetime:
    return datetime(2026, 3, day, hour, tzinfo=SEOUL)


# The runs' way to Celery, losing what it sends: a test that commits runs its run itself, not the worker.
LOSING = SimpleNamespace(after_commit=lambda task, *args: None)


def sends(callbacks) -> list[tuple[str, tuple]]:
    return [(c.task, c.args) for c in callbacks if isinstance(c, dispatch.Send)]
