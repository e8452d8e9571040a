"""Pages of the monitoring app: the alerts', the faults' and the fleet's."""

from django.urls import include, path

from monitoring.pages import fleet, tenant

urlpatterns: list = [
    path("", include("monitoring.alerts.urls")),
    path("", include("monitoring.faults.urls")),
    path("monitoring/", fleet.fleet, name="monitoring-fleet"),
    path("monitoring/gpus/<int:pk>/", fleet.gpu, name="monitoring-gpu"),
    path("monitoring/gpus/<int:pk>/<slug:metric>.svg", fleet.gpu_chart, name="monitoring-gpu-chart"),
    path("monitoring/pools/<int:pk>/", fleet.pool, name="monitoring-pool"),
    path("monitoring/pools/<int:pk>/<slug:metric>.svg", fleet.pool_chart, name="monitoring-pool-chart"),
    path(
        "t/<slug:tenant_slug>/pools/<int:pk>/usage/<slug:metric>.svg",
        tenant.pool_usage_chart,
        name="pool-usage-chart",
    ),
]
