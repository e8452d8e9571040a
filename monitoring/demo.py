"""Demo data of the monitoring app: the last day of the simulated fleet's figures, so that charts have a
history from the first page view; beat's collection carries on from there."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from monitoring import collection, samples
from monitoring.models import Latest

HISTORY = timedelta(hours=24)
STEP = timedelta(minutes=10)


def load(stdout) -> None:
    now = datetime.now(UTC).replace(second=0, microsecond=0)
    if Latest.objects.filter(at__gte=now - STEP).exists():
        stdout.write("Monitoring: already there.")
        return
    samples.prepare_partitions(now=now - HISTORY)
    written = 0
    for cluster in collection.collectable():
        if cluster.prometheus_url:
            continue  # a real cluster's figures come from its Prometheus, not from the demo
        at = now - HISTORY
        while at <= now:
            # Each instant is stored as the collector would have stored it then.
            written += collection.collect(cluster, now=at).samples
            at += STEP
    samples.roll_up(now=now)
    stdout.write(f"Monitoring: {written} samples over the last {HISTORY.total_seconds() / 3600:.0f} hours.")
