"""Pages of the pools app."""

from django.urls import path

from pools import views

urlpatterns = [
    path("capacity/", views.dashboard, name="capacity-dashboard"),
]
