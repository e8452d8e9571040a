"""The pools app's settings, with their defaults: each is Django's setting of that name when one is set, else
the environment variable of that name, else the default here (portal/appsettings.py). Every pools module
reads its settings from `pools.conf.settings`; a name not declared here is the shell's.
"""

from portal.appsettings import AppSettings, Setting

settings = AppSettings(
    # --- Clusters and their sync -------------------------------------------------------------------------
    # Encrypts stored kubeconfigs and Prometheus credentials (pools/secrets.py); derived from SECRET_KEY when
    # empty.
    CLUSTER_SECRETS_KEY=Setting.str(""),
    # How often beat syncs every cluster whose back-off has run out.
    CAPACITY_SYNC_SECONDS=Setting.int(60, minimum=1),
    # A sync follows a cluster by watch from where the last one stopped (pools/services/inventory.py); beat's
    # sync watches this long, catching up first, then applying changes as they come (0: it only catches up).
    # It holds a worker that long, so keep it well below CAPACITY_SYNC_SECONDS.
    CAPACITY_WATCH_SECONDS=Setting.int(20, minimum=0),
    # Cluster syncs wait on a queue of their own: each holds a worker while it waits on its cluster (beat's
    # goes on watching it for CAPACITY_WATCH_SECONDS), every cluster due at once, and none of that delays
    # provisioning. The workers of deploy/kubernetes/sync-worker-deployment.yaml and ./scripts/run consume
    # it, the others not.
    SYNC_QUEUE=Setting.str("sync"),
    # A sync lists the cluster whole again, as a safety net, when its last full list is this old.
    CAPACITY_RELIST_SECONDS=Setting.int(3600, minimum=1),
    # A sync that finds nothing new writes nothing, except "last seen" times at most this often.
    SYNC_HEARTBEAT_SECONDS=Setting.int(600, minimum=0),
    # A failing cluster is retried after CAPACITY_SYNC_SECONDS × 2^failures, capped here.
    SYNC_BACKOFF_MAX_SECONDS=Setting.int(1800, minimum=0),
    # /readyz calls a cluster behind (degraded, still ready) when its last sync is older than this; 0: the
    # heartbeat (SYNC_HEARTBEAT_SECONDS) plus three sync periods (pools/selectors/readiness.py).
    SYNC_STALE_SECONDS=Setting.int(0, minimum=0),
    # --- Provisioning and the sweeper --------------------------------------------------------------------
    # How often provisioning looks at a MIG change under way.
    PROVISION_POLL_SECONDS=Setting.float(5.0, minimum=0),
    # How long a node may stay in MIG state "pending" before a change counts as failed.
    MIG_PENDING_TIMEOUT_SECONDS=Setting.int(600, minimum=0),
    # Deadlines of a pool in `provisioning` (counted from its reservation) or `releasing` (from the release):
    # past POOL_REDRIVE_SECONDS the sweeper enqueues its task again (at most once per that period; the task is
    # safe to repeat); past POOL_STUCK_SECONDS it fails the pool (capacity returned, tenant told) or closes
    # the release (released, quota change given up), saying why. The first comes after
    # MIG_PENDING_TIMEOUT_SECONDS, so a slow MIG change is failed by its own deadline first; the sweeper runs
    # every POOL_SWEEP_SECONDS.
    POOL_REDRIVE_SECONDS=Setting.int(lambda s: s.MIG_PENDING_TIMEOUT_SECONDS + 300, minimum=0),
    POOL_STUCK_SECONDS=Setting.int(lambda s: 2 * s.POOL_REDRIVE_SECONDS, minimum=0),
    POOL_SWEEP_SECONDS=Setting.int(60, minimum=1),
    # Provisioning, and the rest of what drives pools (queue runs, moves, releases, reclaims, the sweeper),
    # waits on a queue of its own, never behind syncs, metering, monitoring, what-if runs or e-mail; the
    # workers of deploy/kubernetes/provisioning-worker-deployment.yaml and ./scripts/run consume it, the
    # others not. The pools' e-mails go to the default queue (CELERY_QUEUE).
    PROVISIONING_QUEUE=Setting.str("provisioning"),
    # The simulated GPU Operator's delay between a layout or sharing change and its success.
    SIMULATED_MIG_APPLY_SECONDS=Setting.float(8.0, minimum=0),
    # --- Quotas (pools/models/quotas.py) ------------------------------------------------------------------
    # The limit, in compute slices, of a tenant in a GPU group and model where it has no quota (none: none).
    QUOTA_DEFAULT_LIMIT=Setting.optional_int(None, minimum=0),
    # The notice a borrowed pool is given, once chosen to make room for a request within a guarantee, before
    # it is released.
    RECLAIM_NOTICE_SECONDS=Setting.int(900, minimum=0),
    # A pool released at its notice's end has its request asked again: approved as before, it waits in the
    # queue for room, so that borrowed work comes back when capacity does instead of being lost.
    RECLAIM_REQUEUE=Setting.bool(True),
    # --- Pools that end (pools/services/lifecycle.py) ----------------------------------------------------
    # Days before a pool's end at which its people are reminded (by e-mail and on the pool's page), each once
    # per end; an extension starts them again. Fractions allowed (0.25: six hours); empty: no reminders.
    POOL_END_REMINDERS=Setting.numbers((7, 2, 1), minimum=0),
    # --- The queue -------------------------------------------------------------------------------------
    # How often beat runs the queue (it runs after each approval and release too: capacity may have freed up).
    QUEUE_RUN_SECONDS=Setting.int(60, minimum=1),
    # A blocked request that has waited this long stops smaller ones behind it from backfilling.
    QUEUE_BACKFILL_GRACE_SECONDS=Setting.int(1800, minimum=0),
    # Requests approved this far back are the recent demand the queue tells placement, each counting less the
    # older it is (half every half window): re-partitioned GPUs get layouts for what is being asked. The
    # what-if simulator weighs its trace the same way (pools/placement/demand.py).
    QUEUE_DEMAND_WINDOW_SECONDS=Setting.int(7 * 24 * 3600, minimum=0),
    # How long a process may reuse its picture of the fleet (availability for the request form and the specs
    # API) while no change of capacity has been seen; 0 rebuilds it on every read.
    CAPACITY_PICTURE_SECONDS=Setting.int(30, minimum=0),
    # --- What-if runs ----------------------------------------------------------------------------------
    # What-if runs (minutes each) wait on a queue of their own, never ahead of provisioning, syncs or alerts;
    # the workers of deploy/kubernetes/whatif-worker-deployment.yaml and ./scripts/run consume it, the others
    # not.
    WHATIF_QUEUE=Setting.str("whatif"),
    # A what-if run kept for the operators' page (pools/whatif/runs.py) must start within this many seconds of
    # being asked for, and finish within as many of starting; past either deadline the sweeper
    # (POOL_SWEEP_SECONDS) fails it, and the worker stops a run that overstays it.
    WHATIF_RUN_SECONDS=Setting.int(1800, minimum=1),
    # The most GPUs a what-if run's changed fleet may hold at any step of its changes: four times the
    # 8,000-GPU fleet the benchmarks take as large. A larger one is refused when asked for, before anything is
    # queued.
    WHATIF_MAX_GPUS=Setting.int(32_000, minimum=1),
    # The most what-if runs queued or running at once, whoever asked (each person one at a time): the what-if
    # workers' concurrency (deploy/kubernetes/whatif-worker-deployment.yaml), so that none waits its deadline
    # out.
    WHATIF_MAX_RUNNING=Setting.int(2, minimum=1),
)
