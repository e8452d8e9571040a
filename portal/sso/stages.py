"""The second-factor step of a sign-in, skipped where the identity provider says it asked for one."""

from __future__ import annotations

from allauth.mfa.stages import AuthenticateStage as AllauthAuthenticateStage
from django.http import HttpRequest

from portal.sso.session import second_factor_used

ALLAUTH_STAGE = "allauth.mfa.stages.AuthenticateStage"
STAGE = "portal.sso.stages.AuthenticateStage"


class AuthenticateStage(AllauthAuthenticateStage):
    def _should_handle(self, request: HttpRequest) -> bool:
        sociallogin = (self.login.signal_kwargs or {}).get("sociallogin")
        if sociallogin is not None and second_factor_used(sociallogin):
            return False
        return super()._should_handle(request)
