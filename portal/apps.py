"""The portal app: tenancy (tenants, projects, memberships, invitations) and roles."""

from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class PortalConfig(AppConfig):
    name = "portal"
    verbose_name = _("Tenancy")
