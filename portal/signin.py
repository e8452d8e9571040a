"""Signing in outside the sign-in form (the API's token endpoint) under the form's rules.

The same per-account lock-out counts failed passwords and wrong two-factor codes
wherever they are tried; a person with TOTP on must send a current code; and,
with `STAFF_REQUIRE_TOTP`, platform staff must have turned TOTP on at all.
"""

from __future__ import annotations

from allauth.account.adapter import get_adapter
from allauth.core import ratelimit
from allauth.mfa.models import Authenticator
from allauth.mfa.totp.internal.auth import TOTP
from django import forms
from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.http import HttpRequest
from django.utils.translation import gettext as _
from rest_framework import exceptions
from rest_framework.settings import api_settings

from portal.adapters import login_attempts_key


def staff_must_have_totp(user) -> bool:
    """Whether this person is platform staff, who must have TOTP on (STAFF_REQUIRE_TOTP)."""
    return settings.STAFF_REQUIRE_TOTP and user.is_authenticated and (user.is_staff or user.is_superuser)


def staff_without_two_factor(user) -> bool:
    """Whether this person is platform staff who must, and has not yet, turned TOTP on."""
    if not staff_must_have_totp(user):
        return False
    return not Authenticator.objects.filter(user=user, type=Authenticator.Type.TOTP).exists()


def check_credentials(request: HttpRequest, *, login: str, password: str, code: str = "") -> AbstractBaseUser:
    """The person these credentials prove, or an API error: 400 wrong, 403 not allowed, 429 locked out."""
    adapter = get_adapter(request)
    credentials = {"email" if "@" in login else "username": login, "password": password}
    try:
        user = adapter.authenticate(request, **credentials)
    except forms.ValidationError as error:  # the failed-attempt lock-out of the sign-in form
        raise exceptions.Throttled(detail=" ".join(error.messages)) from error
    if user is None:
        raise exceptions.ValidationError(
            {api_settings.NON_FIELD_ERRORS_KEY: [_("Unable to sign in with these credentials.")]}
        )
    totp = Authenticator.objects.filter(user=user, type=Authenticator.Type.TOTP).first()
    if totp is None:
        if staff_must_have_totp(user):
            raise exceptions.PermissionDenied(
                _("Platform staff must turn on two-factor authentication before using the API.")
            )
        return user
    if not code:
        raise exceptions.ValidationError(
            {"code": [_("This account uses two-factor authentication: send the current code.")]}
        )
    if not TOTP(totp).validate_code(code):
        # A wrong code after the right password is a guess like any other: it counts.
        ratelimit.consume(request, action="login_failed", key=login_attempts_key(login))
        raise exceptions.ValidationError({"code": [_("The two-factor code is not valid.")]})
    return user
