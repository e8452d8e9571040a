"""Beat's schedule and the tasks' queues come from the apps' plugins; every one names a real task, and every
task has its place: a queue of its kind's own, or the default queue."""

import pytest
from celery.schedules import crontab
from django.apps import apps
from django.core.exceptions import ImproperlyConfigured

from portal import shell
from portal.celery import app, route_to_own_queue
from portal.shell import Periodic, Route
from tests.conftest import QUEUE_SETTINGS

# Where each of the portal's tasks goes: the setting naming its queue, or None for the default queue (e-mail
# and small housekeeping). A new task fails the test below until it is given its place here and in its app.
QUEUE_OF = {
    "pools.tasks.provision_pool": "PROVISIONING_QUEUE",
    "pools.tasks.settle_pool_move": "PROVISIONING_QUEUE",
    "pools.tasks.finish_pool_release": "PROVISIONING_QUEUE",
    "pools.tasks.release_reclaimed_pools": "PROVISIONING_QUEUE",
    "pools.tasks.admit_waiting_requests": "PROVISIONING_QUEUE",
    "pools.tasks.sweep_stuck_pools": "PROVISIONING_QUEUE",
    "pools.tasks.sync_all_clusters": "SYNC_QUEUE",
    "pools.tasks.sync_cluster_now": "SYNC_QUEUE",
    "pools.tasks.execute_whatif_run": "WHATIF_QUEUE",
    "monitoring.tasks.collect": "MONITORING_QUEUE",
    "monitoring.tasks.store_accepted_samples": "MONITORING_QUEUE",
    "monitoring.tasks.roll_up_samples": "MONITORING_QUEUE",
    "monitoring.tasks.prune_samples": "MONITORING_QUEUE",
    "monitoring.tasks.evaluate_alerts": "MONITORING_QUEUE",
    "monitoring.tasks.deliver_alert_notifications": "MONITORING_QUEUE",
    "billing.tasks.meter_usage": "METERING_QUEUE",
    "billing.tasks.warn_budgets": "METERING_QUEUE",
    "billing.tasks.email_invoice": "METERING_QUEUE",
    "billing.tasks.email_credit_note": "METERING_QUEUE",
    "pools.tasks.send_event_email": None,
    "portal.tasks.send_invitation": None,
    "portal.tasks.clear_expired_sessions": None,
}


def test_periodic_schedules_read_when_asked(settings):
    settings.SOME_SECONDS = 45
    assert Periodic("x", "t", lambda: settings.SOME_SECONDS).schedule() == 45
    assert Periodic("x", "t", 30).schedule() == 30
    every_hour = crontab(minute=7)
    assert Periodic("x", "t", every_hour).schedule() is every_hour
    assert (
        Route("t", lambda: settings.SOME_QUEUE if hasattr(settings, "SOME_QUEUE") else "q").queue_name()
        == "q"
    )


def test_every_scheduled_task_exists_and_every_app_schedules_its_own():
    schedule = shell.beat_schedule()
    app.loader.import_default_modules()
    for name, entry in schedule.items():
        assert entry["task"] in app.tasks, name
        assert entry["schedule"], name
    assert {entry["task"].partition(".")[0] for entry in schedule.values()} >= {
        "pools",
        "billing",
        "monitoring",
    }


def test_a_routed_task_goes_to_its_queue_and_others_to_the_default(settings):
    routes = shell.task_routes()
    assert routes, "no app routes a task"
    task, route = next(iter(routes.items()))
    assert route_to_own_queue(task, (), {}, {}) == route
    assert route_to_own_queue("portal.tasks.clear_expired_sessions", (), {}, {}) is None


def test_every_task_goes_to_the_queue_of_its_kind_as_its_setting_names_it(settings):
    for name in QUEUE_SETTINGS:
        setattr(settings, name, f"{name.lower()}-elsewhere")
    app.loader.import_default_modules()
    ours = {
        name
        for name in app.tasks
        if name.partition(".")[0] in {config.name for config in apps.get_app_configs()}
    }

    assert ours == set(QUEUE_OF)
    for task, setting in QUEUE_OF.items():
        expected = None if setting is None else {"queue": f"{setting.lower()}-elsewhere"}
        assert route_to_own_queue(task, (), {}, {}) == expected, task


def test_the_defaults_keep_each_kind_apart_from_the_others_and_from_the_default_queue(settings):
    queues = {route["queue"] for route in shell.task_routes().values()}

    assert queues == {"provisioning", "sync", "monitoring", "metering", "whatif"}
    assert settings.CELERY_TASK_DEFAULT_QUEUE not in queues


def test_the_tests_workers_are_given_every_queue_setting(settings):
    """tests/conftest.py gives a test's worker its queue under each of QUEUE_SETTINGS: with all of them set
    to one queue, every route leads there, so what the worker sends comes back to it."""
    assert set(QUEUE_SETTINGS) == {
        "PROVISIONING_QUEUE",
        "SYNC_QUEUE",
        "MONITORING_QUEUE",
        "METERING_QUEUE",
        "WHATIF_QUEUE",
    }
    for name in QUEUE_SETTINGS:
        setattr(settings, name, "the-one")
    assert {route["queue"] for route in shell.task_routes().values()} == {"the-one"}


@pytest.mark.parametrize("value", ["", "provisioning,monitoring", "two words", " provisioning"])
def test_a_queue_setting_that_names_no_queue_stops_the_app_naming_it(settings, value):
    from pools import conf

    settings.PROVISIONING_QUEUE = value
    with pytest.raises(ImproperlyConfigured, match=r"^PROVISIONING_QUEUE must name a Celery queue"):
        apps.get_app_config("pools").ready()
    settings.PROVISIONING_QUEUE = "provisioning-2.eu:a@b"
    assert shell.check_queue_settings(conf.settings, "PROVISIONING_QUEUE") is None
