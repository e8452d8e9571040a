"""The pools app: capacity of the GPU fleet and the pools carved from it."""

from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class PoolsConfig(AppConfig):
    name = "pools"
    verbose_name = _("GPU pools")

    def ready(self) -> None:
        # Each driver registers its kind on import; importing them here keeps base free of them.
        from pools.drivers import kubernetes, simulated  # noqa: F401
