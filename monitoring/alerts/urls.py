"""Pages of the alerts, included by monitoring/urls.py."""

from django.urls import path

from monitoring.alerts import views as alert_views

urlpatterns = [
    path("monitoring/alerts/", alert_views.alert_list, name="monitoring-alerts"),
    path("monitoring/alerts/<int:pk>/", alert_views.alert_detail, name="monitoring-alert"),
    path(
        "monitoring/alerts/<int:pk>/acknowledge/",
        alert_views.alert_acknowledge,
        name="monitoring-alert-acknowledge",
    ),
    path("monitoring/rules/", alert_views.rule_list, name="monitoring-rules"),
]
