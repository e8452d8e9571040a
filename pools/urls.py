"""Pages of the pools app."""

from django.urls import path

from pools.views import approvals, capacity, drains, quotas, requests
from pools.whatif import views as whatif

urlpatterns = [
    path("approvals/", approvals.approvals_list, name="approvals"),
    path("approvals/<int:pk>/", approvals.approval_detail, name="approval"),
    path("approvals/<int:pk>/approve/", approvals.approval_approve, name="approval-approve"),
    path("approvals/<int:pk>/reject/", approvals.approval_reject, name="approval-reject"),
    path("approvals/<int:pk>/priority/", approvals.approval_priority, name="approval-priority"),
    path("capacity/", capacity.dashboard, name="capacity-dashboard"),
    path("capacity/quotas/", quotas.quotas, name="capacity-quotas"),
    path("capacity/quotas/set/", quotas.quota_set, name="capacity-quota-set"),
    path("capacity/quotas/<slug:slug>/auto-approve/", quotas.auto_approve, name="capacity-auto-approve"),
    path("capacity/clusters/<int:pk>/groups/<str:group>/", capacity.group, name="capacity-group"),
    path("capacity/nodes/<int:pk>/", capacity.node, name="capacity-node"),
    path("capacity/gpus/<int:pk>/drain/", drains.gpu_drain, name="capacity-gpu-drain"),
    path("capacity/nodes/<int:pk>/drain/", drains.node_drain, name="capacity-node-drain"),
    path("capacity/whatif/", whatif.whatif_list, name="whatif-list"),
    path("capacity/whatif/<int:pk>/", whatif.whatif_run, name="whatif-run"),
    path("capacity/whatif/<int:pk>/<slug:metric>.svg", whatif.whatif_chart, name="whatif-chart"),
    path("capacity/whatif/compare/", whatif.whatif_compare, name="whatif-compare"),
    path(
        "capacity/whatif/compare/<slug:metric>.svg",
        whatif.whatif_compare_chart,
        name="whatif-compare-chart",
    ),
    path("t/<slug:tenant_slug>/p/<slug:slug>/request/", requests.request_new, name="pool-request-new"),
    path("t/<slug:tenant_slug>/requests/", requests.tenant_requests, name="tenant-requests"),
    path("t/<slug:tenant_slug>/requests/<int:pk>/", requests.request_detail, name="pool-request"),
    path(
        "t/<slug:tenant_slug>/requests/<int:pk>/cancel/", requests.request_cancel, name="pool-request-cancel"
    ),
    path("t/<slug:tenant_slug>/pools/", requests.tenant_pools, name="tenant-pools"),
    path("t/<slug:tenant_slug>/pools/<int:pk>/", requests.pool_detail, name="pool"),
    path("t/<slug:tenant_slug>/pools/<int:pk>/release/", requests.pool_release, name="pool-release"),
    path("t/<slug:tenant_slug>/pools/<int:pk>/extend/", requests.pool_extend, name="pool-extend"),
    path("t/<slug:tenant_slug>/pools/<int:pk>/grow/", requests.pool_grow, name="pool-grow"),
    path("t/<slug:tenant_slug>/pools/<int:pk>/shrink/", requests.pool_shrink, name="pool-shrink"),
]
