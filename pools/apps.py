"""The pools app: capacity of the GPU fleet and the pools carved from it."""

from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class PoolsConfig(AppConfig):
    name = "pools"
    verbose_name = _("GPU pools")
