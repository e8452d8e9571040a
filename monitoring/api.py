"""REST API of monitoring, served under /api/v1/ by the site shell."""

from rest_framework.routers import SimpleRouter

router = SimpleRouter(trailing_slash=True)

urlpatterns: list = []
