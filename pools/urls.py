"""Pages of the pools app."""

from django.urls import path

from pools import approval_views, capacity_views, drain_views, views, whatif_views

urlpatterns = [
    path("approvals/", approval_views.approvals_list, name="approvals"),
    path("approvals/<int:pk>/", approval_views.approval_detail, name="approval"),
    path("approvals/<int:pk>/approve/", approval_views.approval_approve, name="approval-approve"),
    path("approvals/<int:pk>/reject/", approval_views.approval_reject, name="approval-reject"),
    path("approvals/<int:pk>/priority/", approval_views.approval_priority, name="approval-priority"),
    path("capacity/", capacity_views.dashboard, name="capacity-dashboard"),
    path("capacity/clusters/<int:pk>/groups/<str:group>/", capacity_views.group, name="capacity-group"),
    path("capacity/nodes/<int:pk>/", capacity_views.node, name="capacity-node"),
    path("capacity/gpus/<int:pk>/drain/", drain_views.gpu_drain, name="capacity-gpu-drain"),
    path("capacity/nodes/<int:pk>/drain/", drain_views.node_drain, name="capacity-node-drain"),
    path("capacity/whatif/", whatif_views.whatif_list, name="whatif-list"),
    path("capacity/whatif/<int:pk>/", whatif_views.whatif_run, name="whatif-run"),
    path("capacity/whatif/<int:pk>/<slug:metric>.svg", whatif_views.whatif_chart, name="whatif-chart"),
    path("capacity/whatif/compare/", whatif_views.whatif_compare, name="whatif-compare"),
    path(
        "capacity/whatif/compare/<slug:metric>.svg",
        whatif_views.whatif_compare_chart,
        name="whatif-compare-chart",
    ),
    path("t/<slug:tenant_slug>/p/<slug:slug>/request/", views.request_new, name="pool-request-new"),
    path("t/<slug:tenant_slug>/requests/", views.tenant_requests, name="tenant-requests"),
    path("t/<slug:tenant_slug>/requests/<int:pk>/", views.request_detail, name="pool-request"),
    path("t/<slug:tenant_slug>/requests/<int:pk>/cancel/", views.request_cancel, name="pool-request-cancel"),
    path("t/<slug:tenant_slug>/pools/", views.tenant_pools, name="tenant-pools"),
    path("t/<slug:tenant_slug>/pools/<int:pk>/", views.pool_detail, name="pool"),
    path("t/<slug:tenant_slug>/pools/<int:pk>/release/", views.pool_release, name="pool-release"),
]
