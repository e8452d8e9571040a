"""Demo data of the monitoring app: the last day of the simulated fleet's figures, so that charts have a
history from the first page view; beat's collection carries on from there."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from monitoring.ingest import collection
from monitoring.ingest.readings import ingest
from monitoring.models import Latest
from monitoring.storage import samples

HISTORY = timedelta(hours=24)
STEP = timedelta(minutes=10)
# Readings go in as one batch per this span, each within the age ingest accepts at that batch's end.
BATCH = timedelta(hours=4)


class _Clock:
    """The simulated collector's time, moved through the past day."""

    def __init__(self, at: datetime):
        self.at = at

    def __call__(self) -> datetime:
        return self.at


def load(stdout) -> None:
    now = datetime.now(UTC).replace(second=0, microsecond=0)
    if Latest.objects.filter(at__gte=now - STEP).exists():
        stdout.write("Monitoring: already there.")
        return
    written = 0
    for cluster in collection.collectable():
        if cluster.prometheus_url:
            continue  # a real cluster's figures come from its Prometheus, not from the demo
        clock = _Clock(now - HISTORY)
        collector = collection.collector_for(cluster, clock=clock)
        batch = []
        while clock.at <= now:
            batch += collector.readings()
            clock.at += STEP
            if clock.at - batch[0].at >= BATCH or clock.at > now:
                # Each batch is stored as the collector would have stored it at its last reading.
                written += ingest(
                    cluster=cluster, readings=batch, source="simulated", strict=False, now=batch[-1].at
                ).samples
                batch = []
    samples.roll_up(now=now)
    stdout.write(f"Monitoring: {written} samples over the last {HISTORY.total_seconds() / 3600:.0f} hours.")
