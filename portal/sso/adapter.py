"""Who may sign in through an identity provider, and as whom.

- A person the provider names by a subject already known here signs in as that account.
- A new subject whose e-mail address an account here holds joins that account only when the provider says
  the address is verified and the account verified it here too; otherwise the sign-in is refused with a page
  that says why, and nothing is created or changed.
- Anyone else is a new person, made from the ID token (names, the address, verified only where the provider
  says so), whatever the portal's own sign-up setting: the provider is the directory.
- The token must carry this sign-in's nonce, and the group claim must be a list of names; at the sign-in the
  roles the groups map to are applied (`roles.py`) and the session remembers the provider (`session.py`).
"""

from __future__ import annotations

import requests
from allauth.account.models import EmailAddress
from allauth.core.exceptions import ImmediateHttpResponse
from allauth.core.internal.datakit import parse_bool_safely
from allauth.socialaccount.adapter import DefaultSocialAccountAdapter
from allauth.socialaccount.providers.base import AuthError
from django.contrib.auth import get_user_model
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from portal.sso import errors
from portal.sso.errors import SignInRefused
from portal.sso.provider import ID_TOKEN, NONCE
from portal.sso.roles import apply_provider_roles
from portal.sso.session import ID_TOKEN_STATE, claims, remember


def refused(request: HttpRequest, message, *, provider=None) -> HttpResponse:
    """The page of a refused sign-in: what went wrong, and the way back to the sign-in page."""
    name = getattr(provider, "name", "") if provider is not None else ""
    return render(request, "account/sso_refused.html", {"message": message, "provider": name}, status=403)


def groups_of(sociallogin) -> list[str] | None:
    """The provider's groups in its group claim; [] when it sends none, None when the claim is not a list of
    names."""
    value = claims(sociallogin).get(sociallogin.account.get_provider().groups_claim)
    if value is None:
        return []
    if isinstance(value, list) and all(isinstance(group, str) for group in value):
        return value
    return None


class SocialAccountAdapter(DefaultSocialAccountAdapter):
    def is_open_for_signup(self, request: HttpRequest, sociallogin) -> bool:
        return True

    def on_authentication_error(self, request, provider, error=None, exception=None, extra_context=None):
        if error == AuthError.CANCELLED:
            return
        if isinstance(exception, SignInRefused):
            message = exception.message
        elif isinstance(exception, requests.RequestException):
            message = errors.UNREACHABLE
        elif exception is None and not request.GET.get("error"):
            # No sign-in of this session has this state: it was used already, or never started here.
            message = errors.REPLAYED
        else:
            message = errors.PROVIDER_REFUSED
        raise ImmediateHttpResponse(refused(request, message, provider=provider))

    def pre_social_login(self, request: HttpRequest, sociallogin) -> None:
        provider = sociallogin.account.get_provider()
        said = claims(sociallogin)
        sent = (sociallogin.state or {}).get(NONCE)
        if not sent or said.get(NONCE) != sent:
            raise ImmediateHttpResponse(refused(request, errors.REPLAYED, provider=provider))
        if groups_of(sociallogin) is None:
            raise ImmediateHttpResponse(refused(request, errors.GROUPS_NOT_A_LIST, provider=provider))
        sociallogin.state[ID_TOKEN_STATE] = getattr(sociallogin, ID_TOKEN, "")
        if sociallogin.is_existing:
            return
        owner = self._owner_of_address(request, said, provider)
        if owner is not None:
            sociallogin.connect(request, owner)

    def _owner_of_address(self, request: HttpRequest, said: dict, provider):
        """The account a new subject whose ID token says `said` joins through its address, or None for a new
        person; refuses where an account holds the address but one side has not verified it."""
        email = str(said.get("email") or "").strip()
        if not email:
            return None
        User = get_user_model()
        addresses = EmailAddress.objects.filter(email__iexact=email)
        holders = set(addresses.values_list("user_id", flat=True))
        holders |= set(User.objects.filter(email__iexact=email).values_list("pk", flat=True))
        if not holders:
            return None
        if not parse_bool_safely(said.get("email_verified")):
            raise ImmediateHttpResponse(
                refused(request, errors.UNVERIFIED_EMAIL % {"email": email}, provider=provider)
            )
        verified = addresses.filter(verified=True).select_related("user").first()
        if verified is None:
            raise ImmediateHttpResponse(
                refused(request, errors.UNVERIFIED_HERE % {"email": email}, provider=provider)
            )
        return verified.user


def signed_in_through_provider(sender, request: HttpRequest, user, **kwargs) -> None:
    """At a sign-in through a provider (user_logged_in): the session remembers it, and the roles the groups
    map to are applied."""
    sociallogin = kwargs.get("sociallogin")
    if sociallogin is None:
        return
    remember(request, sociallogin)
    apply_provider_roles(
        user=user, provider=sociallogin.account.provider, groups=groups_of(sociallogin) or []
    )
