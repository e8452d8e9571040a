"""Pages of the billing app."""

from django.urls import path

from billing import views

urlpatterns = [
    path("billing/metering/", views.metering_status, name="billing-metering"),
]
