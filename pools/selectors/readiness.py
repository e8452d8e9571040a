"""What `/readyz` says of the clusters: each one's inventory sync, by its age and its last outcome.

A cluster behind never takes the portal out of service (see portal/health.py): it is `degraded`, so that
an operator sees it on the probe and on the capacity pages while the rest of the fleet is still served.
"""

from __future__ import annotations

from datetime import datetime

from django.utils import timezone

from pools.conf import settings
from pools.models import Cluster
from portal.health import Check


def stale_after_seconds() -> int:
    """How old a cluster's last sync may be before it counts as behind. A sync that finds nothing new
    writes its time only every SYNC_HEARTBEAT_SECONDS (pools/services/inventory.py), so a healthy cluster's
    last sync is up to that old, plus a sync period; three periods more leave room for one slow or missed
    run."""
    return settings.SYNC_STALE_SECONDS or settings.SYNC_HEARTBEAT_SECONDS + 3 * settings.CAPACITY_SYNC_SECONDS


def cluster_checks(*, now: datetime | None = None) -> list[Check]:
    now = now or timezone.now()
    limit = stale_after_seconds()
    found = []
    for name, status, last_sync_at, error in Cluster.objects.order_by("name").values_list(
        "name", "status", "last_sync_at", "last_error"
    ):
        cause = f": {error}" if error else ""
        age = None if last_sync_at is None else max(0, round((now - last_sync_at).total_seconds()))
        figures = {"status": status, "last_sync_age_seconds": age, "stale_after_seconds": limit}
        if age is None:
            detail = "never synced" + cause
        elif age > limit:
            detail = f"last synced {age} s ago (more than {limit} s)" + cause
        elif status != Cluster.Status.READY and error:
            detail = f"the last sync failed: {error}"
        else:
            found.append(Check(f"cluster:{name}", "ok", figures=figures))
            continue
        found.append(Check(f"cluster:{name}", "degraded", detail[:500], figures))
    return found
