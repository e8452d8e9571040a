"""The names of monitoring's tasks that its services send (through `portal.dispatch`), as Celery knows them:
part of queued messages and of beat's schedule, so they never change."""

EVALUATE_ALERTS = "monitoring.tasks.evaluate_alerts"
DELIVER_NOTIFICATIONS = "monitoring.tasks.deliver_alert_notifications"
STORE_ACCEPTED = "monitoring.tasks.store_accepted_samples"
