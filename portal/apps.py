"""The portal app: tenancy (tenants, projects, memberships, invitations) and roles."""

from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class PortalConfig(AppConfig):
    name = "portal"
    verbose_name = _("Tenancy")

    def ready(self) -> None:
        from allauth.mfa import signals
        from django.contrib.auth.signals import user_logged_in

        from portal.mail import on_sign_in
        from portal.tokens import end_tokens_on_second_factor_change

        for signal in (signals.authenticator_added, signals.authenticator_removed):
            signal.connect(end_tokens_on_second_factor_change, dispatch_uid=f"portal-tokens-{id(signal)}")
        user_logged_in.connect(on_sign_in, dispatch_uid="portal-mail-language")
