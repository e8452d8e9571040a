"""Every state change of the pools app (one door): capacity changes and the life of pool requests.

Views, the API, admin actions and tasks call these functions; each runs in one
transaction, locks what it changes, and refuses bad input with a PortalError.
"""

from pools.services.capacity import (
    ClusterSettings,
    check_cluster,
    check_kubeconfig,
    register_cluster,
    set_gpu_drained,
    set_node_drained,
    set_node_group,
)
from pools.services.inventory import request_sync, sync_inventory
from pools.services.lifecycle import request_extension, request_growth, shrink_pool
from pools.services.provisioning import fail_pool, finish_release, provision_step, release_pool
from pools.services.queue import admit_waiting
from pools.services.requests import (
    approve_request,
    cancel_request,
    check_purpose,
    reject_request,
    set_priority,
    submit_request,
)

__all__ = [
    "ClusterSettings",
    "admit_waiting",
    "approve_request",
    "cancel_request",
    "check_cluster",
    "check_kubeconfig",
    "check_purpose",
    "fail_pool",
    "finish_release",
    "provision_step",
    "register_cluster",
    "reject_request",
    "release_pool",
    "request_extension",
    "request_growth",
    "request_sync",
    "set_gpu_drained",
    "set_node_drained",
    "set_node_group",
    "set_priority",
    "shrink_pool",
    "submit_request",
    "sync_inventory",
]
