"""Pages of the GPU faults, included by monitoring/urls.py."""

from django.urls import path

from monitoring.faults import views as fault_views

urlpatterns = [
    path("monitoring/faults/", fault_views.fault_list, name="monitoring-faults"),
    path("monitoring/faults/<int:pk>/clear/", fault_views.fault_clear, name="monitoring-fault-clear"),
    path(
        "monitoring/faults/pools/<int:pk>/replace/", fault_views.pool_replace, name="monitoring-fault-replace"
    ),
]
