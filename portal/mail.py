"""The language each e-mail is written in: its recipient's.

A person's language is the one they last chose in the portal (the language menu, or the notification
settings), else the one they first signed in with. An address the portal knows no person by, such as a
tenant's billing contact, gets the site's LANGUAGE_CODE. Senders render each e-mail once per language
of its recipients (`by_language`) inside `translation.override`.
"""

from __future__ import annotations

from collections.abc import Iterable

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db.models.functions import Lower
from django.utils import translation

from portal.models import Preferences


def _known(language: str | None) -> str | None:
    """The site's language matching `language` ("ko-KR" → "ko"), or None."""
    if not language:
        return None
    codes = {code for code, _name in settings.LANGUAGES}
    for candidate in (language, language.split("-")[0]):
        if candidate.lower() in codes:
            return candidate.lower()
    return None


def language_of(user) -> str:
    """The language to write to `user` in."""
    chosen = None
    if user is not None and user.pk:
        chosen = Preferences.objects.filter(user=user).values_list("language", flat=True).first()
    return _known(chosen) or settings.LANGUAGE_CODE


def by_language(addresses: Iterable[str]) -> dict[str, list[str]]:
    """`addresses` grouped by their people's languages, each group in the given order. One query."""
    addresses = list(dict.fromkeys(a for a in addresses if a))
    found = (
        get_user_model()
        .objects.annotate(address=Lower("email"))
        .filter(address__in=[a.lower() for a in addresses])
        .order_by("pk")
        .values_list("address", "preferences__language")
    )
    languages: dict[str, str] = {}
    for address, language in found:
        languages.setdefault(address, _known(language) or settings.LANGUAGE_CODE)
    groups: dict[str, list[str]] = {}
    for address in addresses:
        groups.setdefault(languages.get(address.lower(), settings.LANGUAGE_CODE), []).append(address)
    return groups


def remember_language(user, language: str, *, only_if_unset: bool = False) -> None:
    """Keep `language` as the one to write to `user` in (a language the site does not speak is ignored)."""
    language = _known(language)
    if language is None or user is None or not user.is_authenticated:
        return
    preferences, _created = Preferences.objects.get_or_create(user=user)
    if preferences.language == language or (only_if_unset and preferences.language):
        return
    preferences.language = language
    preferences.save(update_fields=["language"])


def on_sign_in(sender, request, user, **kwargs) -> None:
    """A person who never chose a language gets e-mails in the one they sign in with."""
    remember_language(user, translation.get_language(), only_if_unset=True)
