"""Pages of the monitoring app, and /metrics."""

urlpatterns: list = []
