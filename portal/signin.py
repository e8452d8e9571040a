"""Signing in outside the sign-in form (the API's token endpoint) under the form's rules.

The same per-account lock-out counts failed passwords and wrong two-factor codes
wherever they are tried: the sign-in form's code step (and the step that asks for a
code again before a sensitive change, see `portal.forms.AuthenticateForm`) and the
token endpoint guess against one count (`count_code_guess`), so LOGIN_FAILURES_LIMIT
is the number of guesses per window in all. A person with TOTP on must send a
current code; and, with `STAFF_REQUIRE_TOTP`, platform staff must have turned TOTP on at all.
"""

from __future__ import annotations

from allauth.account.adapter import get_adapter
from allauth.core.internal import ratelimit
from allauth.core.internal.ratelimit import RateLimitUsage
from allauth.mfa.models import Authenticator
from allauth.mfa.totp.internal.auth import TOTP
from django import forms
from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.http import HttpRequest
from django.utils.translation import gettext as _
from rest_framework import exceptions
from rest_framework.settings import api_settings

from portal.adapters import PasswordsOff, account_attempts_key


def staff_must_have_totp(user) -> bool:
    """Whether this person is platform staff, who must have TOTP on (STAFF_REQUIRE_TOTP)."""
    return settings.STAFF_REQUIRE_TOTP and user.is_authenticated and (user.is_staff or user.is_superuser)


def staff_without_two_factor(user) -> bool:
    """Whether this person is platform staff who must, and has not yet, turned TOTP on."""
    if not staff_must_have_totp(user):
        return False
    return not Authenticator.objects.filter(user=user, type=Authenticator.Type.TOTP).exists()


def count_code_guess(request: HttpRequest, *, user) -> RateLimitUsage | None:
    """One two-factor code tried for `user`, counted in the account's lock-out before it is checked (so
    that guesses sent at once cannot pass the limit together); None when the account has no guess left.
    The caller gives the guess back (`rollback()`) when the code was right, as allauth gives back a right
    password's; the usage that allows this comes from allauth's internal module (the public one says only
    yes or no)."""
    return ratelimit.consume(
        request, app="allauth.account", action="login_failed", key=account_attempts_key(user.pk)
    )


def locked_out_message(request: HttpRequest) -> str:
    return str(get_adapter(request).error_messages["too_many_login_attempts"])


def check_credentials(request: HttpRequest, *, login: str, password: str, code: str = "") -> AbstractBaseUser:
    """The person these credentials prove, or an API error: 400 wrong, 403 not allowed, 429 locked out."""
    adapter = get_adapter(request)
    credentials = {"email" if "@" in login else "username": login, "password": password}
    try:
        user = adapter.authenticate(request, **credentials)
    except PasswordsOff as error:
        raise exceptions.PermissionDenied(" ".join(error.messages)) from error
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
    # A code after the right password is a guess like any other: it counts, unless it is right.
    guess = count_code_guess(request, user=user)
    if guess is None:
        raise exceptions.Throttled(detail=locked_out_message(request))
    if not TOTP(totp).validate_code(code):
        raise exceptions.ValidationError({"code": [_("The two-factor code is not valid.")]})
    guess.rollback()
    return user
