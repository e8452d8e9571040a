"""The pools app's Celery tasks by name, as its services send them through `portal.dispatch` (the tasks
themselves are in pools/tasks.py, which only Celery loads) and as its plugin schedules and routes them."""

SYNC_ALL = "pools.tasks.sync_all_clusters"
SYNC = "pools.tasks.sync_cluster_now"
ADMIT = "pools.tasks.admit_waiting_requests"
PROVISION = "pools.tasks.provision_pool"
FINISH_RELEASE = "pools.tasks.finish_pool_release"
SETTLE_MOVE = "pools.tasks.settle_pool_move"
SWEEP = "pools.tasks.sweep_stuck_pools"
RELEASE_RECLAIMED = "pools.tasks.release_reclaimed_pools"
EVENT_EMAIL = "pools.tasks.send_event_email"
WHATIF_RUN = "pools.tasks.execute_whatif_run"
