"""Inventory: the one way to sync a cluster's capacity into the portal.

`sync_inventory` takes the cluster's sync lock (two syncs of one cluster never run at once:
beat ticks, workers, commands and provisioning share it), reads the cluster through its
driver, writes what changed (`pools.sync`), and runs the queue when capacity may have
appeared. `request_sync` asks a worker to do it soon, for callers that must not wait on a
cluster, such as the admin inside a web request.
"""

from __future__ import annotations

from pools.models import Cluster
from pools.services import dispatch
from pools.sync import SyncReport, sync_cluster, sync_lock


def sync_inventory(*, cluster: Cluster, even_if_running: bool = False) -> SyncReport | None:
    """Sync one cluster now; None when another sync of it is running (and doing the same work).

    `even_if_running` syncs anyway: provisioning needs the instances its own MIG change made, which
    a sync that started earlier may not see, and a sync whose worker died keeps its lock until it
    expires. Two syncs at once are safe (every row is written race-proof), only redundant.
    """
    with sync_lock(cluster.pk) as held:
        if not held and not even_if_running:
            return None
        report = sync_cluster(cluster=cluster)
    if report.changed:  # capacity may have appeared: the queue may admit more now
        dispatch.after_commit(dispatch.ADMIT)
    return report


def request_sync(*, cluster: Cluster) -> None:
    """Have a worker sync the cluster soon."""
    dispatch.after_commit(dispatch.SYNC, cluster.pk)
