"""The portal app: tenancy (tenants, projects, memberships, invitations) and roles."""

from celery.schedules import crontab
from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _

from portal.shell import AppPlugin, Periodic


class PortalConfig(AppConfig):
    name = "portal"
    verbose_name = _("Tenancy")
    # The shell's own pages are portal/urls.py's; what the portal adds through a plugin is its periodic task.
    plugin = AppPlugin(
        periodic_tasks=(
            # Nightly, when few people are signed in.
            Periodic(
                "clear-expired-sessions", "portal.tasks.clear_expired_sessions", crontab(minute=17, hour=3)
            ),
        ),
    )

    def ready(self) -> None:
        from allauth.account import signals as account_signals
        from allauth.mfa import signals
        from django.contrib.auth.signals import user_logged_in

        from portal.mail import on_sign_in
        from portal.sso.adapter import signed_in_through_provider
        from portal.tokens import end_tokens_on_second_factor_change

        for signal in (signals.authenticator_added, signals.authenticator_removed):
            signal.connect(end_tokens_on_second_factor_change, dispatch_uid=f"portal-tokens-{id(signal)}")
        user_logged_in.connect(on_sign_in, dispatch_uid="portal-mail-language")
        # allauth's own signal, which carries the sign-in through a provider (Django's does not).
        account_signals.user_logged_in.connect(signed_in_through_provider, dispatch_uid="portal-sso-roles")
