"""Beat's schedule and the tasks' queues come from the apps' plugins; every one names a real task."""

from celery.schedules import crontab

from portal import shell
from portal.celery import app, route_to_own_queue
from portal.shell import Periodic, Route


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
