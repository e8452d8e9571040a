"""Celery tasks of the monitoring app: thin wrappers over collection, samples and alerts."""

from __future__ import annotations

from celery import shared_task

from monitoring import collection, samples


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
