"""The pools app's settings are its own (pools/conf.py), and its periodic tasks and queues come from its
plugin with the intervals those settings give."""

import ast
from pathlib import Path

from pools import conf, task_names
from portal import shell
from portal.celery import route_to_own_queue

POOLS = Path(__file__).resolve().parents[2] / "pools"


def test_no_pools_module_reads_djangos_settings_itself():
    readers = []
    for path in sorted(POOLS.rglob("*.py")):
        if "migrations" in path.parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module == "django.conf":
                readers.append(str(path.relative_to(POOLS.parent)))
    assert readers == []


def test_beat_sends_the_pools_tasks_as_often_as_the_settings_say(settings):
    settings.CAPACITY_SYNC_SECONDS, settings.QUEUE_RUN_SECONDS, settings.POOL_SWEEP_SECONDS = 17, 23, 29
    schedule = shell.beat_schedule()
    assert schedule["sync-clusters"] == {"task": task_names.SYNC_ALL, "schedule": 17}
    assert schedule["admit-waiting-requests"] == {"task": task_names.ADMIT, "schedule": 23}
    assert schedule["sweep-stuck-pools"] == {"task": task_names.SWEEP, "schedule": 29}


def test_the_deadlines_follow_from_the_mig_timeout_unless_set():
    assert conf.settings.POOL_REDRIVE_SECONDS == conf.settings.MIG_PENDING_TIMEOUT_SECONDS + 300
    assert conf.settings.POOL_STUCK_SECONDS == 2 * conf.settings.POOL_REDRIVE_SECONDS


def test_what_if_runs_go_to_the_queue_the_settings_name(settings):
    settings.WHATIF_QUEUE = "what-if-elsewhere"
    assert route_to_own_queue(task_names.WHATIF_RUN, (), {}, {}) == {"queue": "what-if-elsewhere"}


def test_pools_months_and_currency_are_billings_as_it_registers_them(settings):
    from pools import pricing

    settings.BILLING_TIME_ZONE, settings.BILLING_CURRENCY = "Europe/Berlin", "EUR"
    assert (pricing.month_time_zone(), pricing.currency()) == ("Europe/Berlin", "EUR")
    assert "BILLING_TIME_ZONE" not in conf.settings.names()
