"""Pages of the monitoring app, and /metrics."""

from django.urls import include, path

from monitoring import metrics, tenant_views, views

urlpatterns: list = [
    path("", include("monitoring.alert_urls")),
    path("", include("monitoring.fault_urls")),
    path("metrics", metrics.metrics, name="metrics"),
    path("monitoring/", views.fleet, name="monitoring-fleet"),
    path("monitoring/gpus/<int:pk>/", views.gpu, name="monitoring-gpu"),
    path("monitoring/gpus/<int:pk>/<slug:metric>.svg", views.gpu_chart, name="monitoring-gpu-chart"),
    path("monitoring/pools/<int:pk>/", views.pool, name="monitoring-pool"),
    path("monitoring/pools/<int:pk>/<slug:metric>.svg", views.pool_chart, name="monitoring-pool-chart"),
    path(
        "t/<slug:tenant_slug>/pools/<int:pk>/usage/<slug:metric>.svg",
        tenant_views.pool_usage_chart,
        name="pool-usage-chart",
    ),
]
