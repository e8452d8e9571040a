"""What a sign-in through an identity provider leaves in the session: which provider, its ID token (for
signing out there), and whether the provider says it asked for a second factor.

A second factor at the provider: the ID token's `amr` holds `mfa`, or its `acr` is one the provider's
settings name (`mfa_acr`). Then the portal's own TOTP is not asked again at that sign-in, and staff without
TOTP are let in for that session (`portal.middleware.StaffTwoFactorMiddleware`); any other sign-in keeps the
staff rule.
"""

from __future__ import annotations

import requests
from allauth.socialaccount.adapter import get_adapter
from allauth.socialaccount.models import SocialApp
from allauth.socialaccount.providers.oauth2.client import OAuth2Error
from django.http import HttpRequest
from django.utils.http import urlencode

SESSION_KEY = "portal_sso"
ID_TOKEN_STATE = "portal_id_token"  # the raw ID token in a sign-in's state until the person is signed in


def claims(sociallogin) -> dict:
    """The ID token's claims of a sign-in through a provider."""
    return dict((sociallogin.account.extra_data or {}).get("id_token") or {})


def second_factor_used(sociallogin) -> bool:
    """Whether the provider says this sign-in used a second factor (`amr` or a configured `acr`)."""
    said = claims(sociallogin)
    amr = said.get("amr")
    if isinstance(amr, list) and "mfa" in amr:
        return True
    provider = sociallogin.account.get_provider()
    acr = said.get("acr")
    return isinstance(acr, str) and acr in getattr(provider, "mfa_acr", ())


def remember(request: HttpRequest, sociallogin) -> None:
    """Keep, for this session, the provider the person signed in through, its ID token, its second factor."""
    request.session[SESSION_KEY] = {
        "provider": sociallogin.account.provider,
        "id_token": (sociallogin.state or {}).get(ID_TOKEN_STATE, ""),
        "mfa": second_factor_used(sociallogin),
    }


def second_factor_at_provider(request: HttpRequest) -> bool:
    session = getattr(request, "session", None)
    return bool(session is not None and (session.get(SESSION_KEY) or {}).get("mfa"))


def logout_url(request: HttpRequest, *, then: str) -> str | None:
    """Where to send a person signing out so that the provider ends its session too (RP-initiated logout),
    coming back to `then`; None where they did not sign in through a provider, or it offers no such end."""
    signed_in = request.session.get(SESSION_KEY) or {}
    if not signed_in.get("provider"):
        return None
    try:
        provider = get_adapter().get_provider(request, signed_in["provider"])
        adapter = provider.get_oauth2_adapter(request)
        endpoint = adapter.openid_config.get("end_session_endpoint")
    except (requests.RequestException, ValueError, OAuth2Error, SocialApp.DoesNotExist):
        return None  # the provider is gone or unreachable: the portal's own session still ends
    if not endpoint:
        return None
    query = {"client_id": provider.app.client_id, "post_logout_redirect_uri": then}
    if signed_in.get("id_token"):
        query["id_token_hint"] = signed_in["id_token"]
    return f"{endpoint}{'&' if '?' in endpoint else '?'}{urlencode(query)}"
