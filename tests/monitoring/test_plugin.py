"""Monitoring joins the shell through its plugin: beat's tasks under the names stored schedules know, at
their intervals, and its figures on /metrics."""

from celery.schedules import crontab

from portal import shell


def test_beat_sends_monitorings_tasks_under_their_names_at_their_intervals(settings):
    settings.MONITORING_COLLECT_SECONDS = 45
    settings.MONITORING_STORE_SECONDS = 20

    schedule = shell.beat_schedule()

    assert {name: entry for name, entry in schedule.items() if entry["task"].startswith("monitoring.")} == {
        "collect-gpu-figures": {"task": "monitoring.tasks.collect", "schedule": 45},
        "store-accepted-samples": {"task": "monitoring.tasks.store_accepted_samples", "schedule": 20},
        "roll-up-gpu-samples": {"task": "monitoring.tasks.roll_up_samples", "schedule": 60},
        "prune-gpu-samples": {"task": "monitoring.tasks.prune_samples", "schedule": crontab(minute=7)},
        "evaluate-alerts": {"task": "monitoring.tasks.evaluate_alerts", "schedule": 60},
        "deliver-alert-notifications": {
            "task": "monitoring.tasks.deliver_alert_notifications",
            "schedule": 30,
        },
    }


def test_the_fleets_figures_are_monitorings_on_metrics():
    assert "monitoring.metrics.collect" in [path for path, _collect in shell.metric_collectors()]
