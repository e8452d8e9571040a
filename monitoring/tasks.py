"""Celery tasks of the monitoring app: thin wrappers over collection, samples, alerts and notifications.
Their names (`monitoring.tasks.*`) are in beat's schedule (monitoring/apps.py) and in queued messages."""

from __future__ import annotations

from celery import shared_task

from monitoring.alerts import services as alerts
from monitoring.conf import settings
from monitoring.ingest import accepted, collection
from monitoring.notifications import sending
from monitoring.storage import samples


@shared_task
def collect() -> str:
    """Beat: read every cluster the portal collects itself (simulated, or with a Prometheus URL)."""
    done = [collection.collect(cluster) for cluster in collection.collectable()]
    return "; ".join(
        f"{c.cluster}: {c.error}" if c.error else f"{c.cluster}: {c.gpus} GPUs, {c.samples} samples"
        for c in done
    )


@shared_task
def store_accepted_samples() -> str:
    """Sent by the first batch an agent leaves on an empty list, by beat, and by a run that used its time:
    store what waits, for at most MONITORING_STORE_SECONDS."""
    return accepted.store(
        linger=settings.MONITORING_STORE_LINGER_SECONDS,
        within=settings.MONITORING_STORE_SECONDS,
        gather=settings.MONITORING_STORE_GATHER_SECONDS,
    ).summary()


@shared_task
def roll_up_samples() -> str:
    written = samples.roll_up()
    return ", ".join(f"{seconds} s: {rows} rows" for seconds, rows in written.items())


@shared_task
def prune_samples() -> str:
    """Hourly: drop raw days past their retention and old roll-ups; make the coming days' partitions."""
    pruned = samples.prune()
    samples.prepare_partitions()
    return f"dropped {len(pruned.partitions)} day(s) of samples, {pruned.rollups} roll-up rows"


@shared_task
def evaluate_alerts() -> str:
    """Beat, and after a GPU fault opens: check every alert rule, fire and resolve alerts (once, however
    often this runs), and record who is told of them and of the new faults."""
    return alerts.evaluate().summary()


@shared_task
def deliver_alert_notifications() -> str:
    """Beat, and after an evaluation that recorded notifications: send those due; failures wait their
    back-off and are tried again by a later run."""
    return sending.deliver_due().summary()
