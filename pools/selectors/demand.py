"""What the queue tells the placement engine of recent demand: the approved requests of the demand window,
weighed by pools.placement.demand (the what-if simulator weighs its trace's arrivals the same way)."""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime, timedelta

from django.db.models import FloatField
from django.db.models.functions import Cast, Extract

from pools.conf import settings
from pools.models import RequestItem
from pools.placement.demand import recent_demand
from pools.placement.types import Item


def queue_demand(*, now: datetime) -> dict[tuple[str, str], float]:
    """Instances per (model, profile) asked for by requests approved within QUEUE_DEMAND_WINDOW_SECONDS
    before `now`, decayed; one query, its rows those of the window's requests."""
    window = settings.QUEUE_DEMAND_WINDOW_SECONDS
    # When each was approved as seconds since the epoch, read as a number: thousands of items a week, and
    # a moment read with its time zone costs more than the rest of the row.
    approved_at = Cast(Extract("request__approved_at", "epoch"), FloatField())
    rows = (
        RequestItem.objects.filter(
            request__approved_at__gt=now - timedelta(seconds=window), request__approved_at__lte=now
        )
        .annotate(approved_at=approved_at)
        .values_list("request_id", "approved_at", "gpu_model", "profile", "count")
    )
    items: dict[int, list[Item]] = defaultdict(list)
    approved: dict[int, float] = {}
    for request_id, when, model, profile, count in rows:
        items[request_id].append(Item(model, profile, count))
        approved[request_id] = when
    arrivals = [(approved[request_id], found) for request_id, found in items.items()]
    return recent_demand(arrivals, now=now.timestamp(), window_seconds=window)
