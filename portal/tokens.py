"""API tokens: issue one, find the live token behind a key, revoke.

- key: the secret a client sends as `Authorization: Token <key>`. It is shown
  once, when issued, and never stored.
- digest: the SHA-256 of a key, the only form the portal keeps. Keys are 256
  random bits, so a fast hash is enough; a slow one would only cost CPU per call.
- credential stamp: the owner's session hash when the token was issued. It
  changes with the password, so every way of changing a password (the account
  page, a reset link, the admin, `changepassword`) ends the person's tokens.
- live: not revoked, not expired, and issued under the current password.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.db.models import Q, QuerySet
from django.utils import timezone
from django.utils.translation import gettext as _

from portal.errors import InvalidInput, NotAllowed
from portal.models import ApiToken, TokenRevocation, TokenStatus
from portal.permissions import staff_may

KEY_BYTES = 32
PREFIX_LENGTH = 8
# `last_used_at` is written at most this often per token, so busy scripts cost no write per call.
USE_RECORDED_EVERY = timedelta(minutes=1)


@dataclass(frozen=True)
class IssuedToken:
    token: ApiToken
    key: str


def digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def live_tokens(*, user: AbstractBaseUser) -> QuerySet[ApiToken]:
    return ApiToken.objects.filter(
        Q(expires_at__isnull=True) | Q(expires_at__gt=timezone.now()),
        user=user,
        revoked_at__isnull=True,
        credential_stamp=user.get_session_auth_hash(),
    )


def issue_token(*, user: AbstractBaseUser, name: str = "") -> IssuedToken:
    """A new token for `user`; past `API_TOKENS_PER_USER` live ones, the oldest are revoked."""
    name = name.strip() or _("API token")
    if len(name) > ApiToken._meta.get_field("name").max_length:
        raise InvalidInput(_("A token name has at most 100 characters."))
    key = secrets.token_urlsafe(KEY_BYTES)
    ttl_days = settings.API_TOKEN_TTL_DAYS
    with transaction.atomic():
        # One issue at a time per person, so that the cap below counts every token.
        get_user_model().objects.select_for_update().filter(pk=user.pk).first()
        token = ApiToken.objects.create(
            user=user,
            name=name,
            prefix=key[:PREFIX_LENGTH],
            digest=digest(key),
            credential_stamp=user.get_session_auth_hash(),
            expires_at=timezone.now() + timedelta(days=ttl_days) if ttl_days else None,
        )
        surplus = live_tokens(user=user).order_by("-created_at", "-pk")[settings.API_TOKENS_PER_USER :]
        ApiToken.objects.filter(pk__in=[t.pk for t in surplus]).update(
            revoked_at=timezone.now(), revoked_reason=TokenRevocation.REPLACED
        )
    return IssuedToken(token=token, key=key)


def token_for_key(key: str) -> ApiToken | None:
    """The live token of an active person behind `key`, or None."""
    token = ApiToken.objects.select_related("user").filter(digest=digest(key)).first()
    if token is None or not token.user.is_active or token.status != TokenStatus.ACTIVE:
        return None
    record_use(token)
    return token


def record_use(token) -> None:
    """Note that `token` (an API or agent token: any model with `last_used_at`) was just used, writing at
    most once per USE_RECORDED_EVERY."""
    now = timezone.now()
    if token.last_used_at is None or now - token.last_used_at >= USE_RECORDED_EVERY:
        type(token).objects.filter(pk=token.pk).update(last_used_at=now)
        token.last_used_at = now


def can_revoke(*, actor: AbstractBaseUser, token: ApiToken) -> bool:
    return token.user_id == actor.pk or staff_may(user=actor, permission="portal.change_apitoken")


def revoke_token(*, token: ApiToken, actor: AbstractBaseUser) -> ApiToken:
    """Revoke one token: its owner may, and platform staff allowed to change tokens."""
    if not can_revoke(actor=actor, token=token):
        raise NotAllowed(_("Only the token's owner can revoke it."))
    reason = TokenRevocation.BY_OWNER if token.user_id == actor.pk else TokenRevocation.BY_STAFF
    with transaction.atomic():
        token = ApiToken.objects.select_for_update().get(pk=token.pk)
        if token.revoked_at is None:  # revoking twice is a no-op, not an error
            token.revoked_at = timezone.now()
            token.revoked_reason = reason
            token.save(update_fields=["revoked_at", "revoked_reason"])
    return token


def revoke_all_tokens(*, user: AbstractBaseUser, reason: TokenRevocation) -> int:
    """End every token of `user`, e.g. when their second factor changes; returns how many."""
    return ApiToken.objects.filter(user=user, revoked_at__isnull=True).update(
        revoked_at=timezone.now(), revoked_reason=reason
    )


def end_tokens_on_second_factor_change(sender, request=None, user=None, authenticator=None, **kwargs) -> None:
    """allauth's signal when a second factor is added or removed: tokens issued before no longer
    speak for the person, so they stop working (the person asks for new ones)."""
    if user is not None and (authenticator is None or authenticator.type == "totp"):
        revoke_all_tokens(user=user, reason=TokenRevocation.TWO_FACTOR)
