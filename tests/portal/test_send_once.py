"""The one way the portal sends e-mail: once per subject and recipient, in each recipient's language."""

from types import SimpleNamespace

import pytest
from django.db import transaction

from portal import mail
from portal.models import Preferences, SentEmail
from tests.factories import UserFactory

pytestmark = pytest.mark.django_db

TEMPLATE = "portal/email/invitation"


def context():
    invitation = SimpleNamespace(
        tenant=SimpleNamespace(name="Acme"),
        invited_by=SimpleNamespace(get_username="bob"),
        get_role_display="member",
        expires_at=None,
    )
    return {"invitation": invitation, "accept_url": "https://portal.example/i/x"}


def send(key="test.thing:1", to=("ann@example.com",), **kwargs):
    return mail.send_once(key=key, to=to, template=TEMPLATE, context=context(), **kwargs)


def test_sends_each_address_once_per_key(mailoutbox):
    assert send(to=["ann@example.com", "ben@example.com"]) == ["ann@example.com", "ben@example.com"]
    assert send(to=["ANN@example.com", "cat@example.com"]) == ["cat@example.com"]
    assert send(key="test.thing:2") == ["ann@example.com"]  # another subject is another e-mail
    assert [m.to for m in mailoutbox] == [
        ["ann@example.com", "ben@example.com"],
        ["cat@example.com"],
        ["ann@example.com"],
    ]
    assert mailoutbox[0].subject == "[GPU Portal] You are invited to Acme on the GPU portal"
    assert SentEmail.objects.filter(key="test.thing:1").count() == 3


def test_the_same_address_twice_in_one_call_is_one_e_mail(mailoutbox):
    assert send(to=["ann@example.com", "Ann@Example.com", "", "  "]) == ["ann@example.com"]
    assert len(mailoutbox) == 1 and mailoutbox[0].to == ["ann@example.com"]


def test_each_language_gets_its_own_message(mailoutbox):
    korean = UserFactory(email="kim@example.com")
    Preferences.objects.create(user=korean, language="ko")
    send(to=["ann@example.com", "kim@example.com"])
    by_address = {tuple(m.to): m.subject for m in mailoutbox}
    assert set(by_address) == {("ann@example.com",), ("kim@example.com",)}
    assert by_address[("ann@example.com",)] != by_address[("kim@example.com",)]
    assert "Acme" in by_address[("kim@example.com",)]


def test_a_given_language_writes_to_everyone_in_it(mailoutbox):
    korean = UserFactory(email="kim@example.com")
    Preferences.objects.create(user=korean, language="ko")
    send(to=["ann@example.com", "kim@example.com"], language="en")
    assert len(mailoutbox) == 1 and mailoutbox[0].to == ["ann@example.com", "kim@example.com"]


def test_attachments_are_made_in_the_message_language(mailoutbox):
    def files():
        from django.utils import translation

        return [(f"doc-{translation.get_language()}.txt", b"x", "text/plain")]

    send(attachments=files)
    assert mailoutbox[0].attachments[0][0] == "doc-en.txt"


def test_a_failed_send_claims_nothing_so_a_retry_sends(mailoutbox, monkeypatch):
    def refuse(self, fail_silently=False):
        raise OSError("the mail server is down")

    monkeypatch.setattr("django.core.mail.EmailMessage.send", refuse)
    with pytest.raises(OSError):
        send()
    assert not SentEmail.objects.exists()
    monkeypatch.undo()
    assert send() == ["ann@example.com"]
    assert len(mailoutbox) == 1


def test_a_claim_rolls_back_with_the_callers_transaction(mailoutbox):
    with pytest.raises(RuntimeError), transaction.atomic():
        send()
        raise RuntimeError("the caller's change failed after sending")
    assert not SentEmail.objects.exists()  # the caller's retry sends again: at least once, never lost


def test_nobody_to_send_to_sends_nothing(mailoutbox):
    assert send(to=[]) == []
    assert mailoutbox == []
