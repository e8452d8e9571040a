"""Celery tasks of the monitoring app: thin wrappers over collection, samples and alerts."""

from __future__ import annotations

from celery import shared_task

from monitoring import alerts, collection, notifications, samples


@shared_task
def collect() -> str:
    """Beat: read every cluster the portal collects itself (simulated, or with a Prometheus URL)."""
    done = [collection.collect(cluster) for cluster in collection.collectable()]
    return "; ".join(
        f"{c.cluster}: {c.error}" if c.error else f"{c.cluster}: {c.gpus} GPUs, {c.samples} samples"
        for c in done
    )


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
    """Beat: check every alert rule; fire and resolve alerts (once, however often this runs)."""
    return alerts.evaluate().summary()


@shared_task
def deliver_alert_notifications() -> str:
    """Beat, and after an evaluation that recorded notifications: send those due; failures wait their
    back-off and are tried again by a later run."""
    return notifications.deliver_due().summary()


@shared_task(autoretry_for=(OSError,), retry_backoff=True, retry_backoff_max=600, max_retries=8)
def send_fault_notices(fault_id: int) -> str:
    """E-mail the people of each pool a GPU fault flagged, and the approvers; once per (fault, pool)."""
    from monitoring.faults import send_notices

    return send_notices(fault_id)
