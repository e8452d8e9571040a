"""Pages of the pools app."""

from django.urls import path

from pools import drain_views, views

urlpatterns = [
    path("capacity/", views.dashboard, name="capacity-dashboard"),
    path("capacity/gpus/<int:pk>/drain/", drain_views.gpu_drain, name="capacity-gpu-drain"),
    path("capacity/nodes/<int:pk>/drain/", drain_views.node_drain, name="capacity-node-drain"),
    path("t/<slug:tenant_slug>/p/<slug:slug>/request/", views.request_new, name="pool-request-new"),
    path("t/<slug:tenant_slug>/requests/", views.tenant_requests, name="tenant-requests"),
    path("t/<slug:tenant_slug>/requests/<int:pk>/", views.request_detail, name="pool-request"),
    path("t/<slug:tenant_slug>/requests/<int:pk>/cancel/", views.request_cancel, name="pool-request-cancel"),
    path("t/<slug:tenant_slug>/pools/", views.tenant_pools, name="tenant-pools"),
    path("t/<slug:tenant_slug>/pools/<int:pk>/", views.pool_detail, name="pool"),
    path("t/<slug:tenant_slug>/pools/<int:pk>/release/", views.pool_release, name="pool-release"),
]
