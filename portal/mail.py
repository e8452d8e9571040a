"""E-mail, sent the one way every app sends it: once per subject and recipient, in the recipient's language.

`send_once` is the only sender. It claims each (key, address) in the shell's `SentEmail` table in the same
transaction that sends, so a task that runs twice, or twice at once, sends nothing twice, and a send that
fails rolls its claim back for the retry. A worker killed between sending and committing is the one case
where an e-mail may go twice.

A person's language is the one they last chose in the portal (the language menu, or the notification
settings), else the one they first signed in with. An address the portal knows no person by, such as a
tenant's billing contact, gets the site's LANGUAGE_CODE. Senders render each e-mail once per language
of its recipients (`by_language`) inside `translation.override`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.mail import EmailMessage
from django.db import connection, transaction
from django.db.models.functions import Lower
from django.template.loader import render_to_string
from django.utils import translation

from portal.models import Preferences, SentEmail

Attachment = tuple[str, bytes, str]  # file name, content, content type


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


def send_once(
    *,
    key: str,
    to: Iterable[str],
    template: str,
    context: dict,
    attachments: Callable[[], list[Attachment]] | None = None,
    language: str | None = None,
) -> list[str]:
    """E-mail `template` (`{template}_subject.txt` and `{template}_message.txt`) about `key` to each address
    of `to` not yet sent this key, one message per language of theirs (or in `language`), with the files
    `attachments()` gives, made in that language. Returns the addresses sent to now, in the given order.

    Runs in the caller's transaction when there is one: the claims commit with it, or roll back with it."""
    addresses = list(dict.fromkeys(a.strip() for a in to if a and a.strip()))
    if not addresses:
        return []
    with transaction.atomic():
        claimed = _claim(key, addresses)
        if not claimed:
            return []
        groups = {language: claimed} if language else by_language(claimed)
        for written_in, group in groups.items():
            with translation.override(written_in):
                subject = render_to_string(f"{template}_subject.txt", context).strip()
                body = render_to_string(f"{template}_message.txt", context)
                files = attachments() if attachments else []
            message = EmailMessage(settings.EMAIL_SUBJECT_PREFIX + subject, body, to=group)
            for name, content, media in files:
                message.attach(name, content, media)
            message.send()
    return claimed


def _claim(key: str, addresses: list[str]) -> list[str]:
    """Those of `addresses` no e-mail about `key` went to, now recorded. A claim another transaction holds
    waits for it: taken once it commits, ours once it rolls back."""
    lowered = {address.lower(): address for address in reversed(addresses)}
    table = SentEmail._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {table} (key, address, sent_at) SELECT %s, unnest(%s::text[]), now() "
            "ON CONFLICT (key, address) DO NOTHING RETURNING address",
            [key, list(lowered)],
        )
        new = {row[0] for row in cursor.fetchall()}
    return [a for a in addresses if a.lower() in new and lowered[a.lower()] == a]
