"""Each e-mail is written in its recipient's language: the one they last chose in the portal, else the one
they signed in with; addresses of no known person get the site's language."""

import re

from django.core import mail
from django.urls import reverse

from billing import mail as billing_mail
from billing.invoices import issue
from portal.mail import by_language, language_of
from portal.models import Preferences, Role
from tests.billing.test_credit_notes import AFTER, november_invoices
from tests.factories import MembershipFactory, UserFactory

HANGUL = re.compile("[가-힣]")


def choose(client, user, language: str) -> None:
    client.force_login(user)
    response = client.post(reverse("set_language"), {"language": language, "next": "/"})
    assert response.status_code == 302


def test_the_language_menu_keeps_the_choice_for_e_mails(client, tenancy):
    assert language_of(tenancy.acme_member) == "en"
    choose(client, tenancy.acme_member, "ko")
    assert language_of(tenancy.acme_member) == "ko"
    assert client.get("/", HTTP_ACCEPT_LANGUAGE="en").content.decode().count('lang="ko"') == 1  # the page too
    choose(client, tenancy.acme_member, "en")
    assert language_of(tenancy.acme_member) == "en"


def test_a_language_the_site_does_not_speak_changes_nothing(client, tenancy):
    choose(client, tenancy.acme_member, "ko")
    choose(client, tenancy.acme_member, "fr")
    assert language_of(tenancy.acme_member) == "ko"


def test_signing_in_records_the_language_only_until_one_is_chosen(client, tenancy):
    user = tenancy.acme_member
    user.set_password("a-long-password-1")
    user.save()
    sign_in = {"login": user.username, "password": "a-long-password-1"}
    assert client.post(reverse("account_login"), sign_in, HTTP_ACCEPT_LANGUAGE="ko-KR").status_code == 302
    assert language_of(user) == "ko"
    client.logout()
    Preferences.objects.filter(user=user).update(language="en")
    assert client.post(reverse("account_login"), sign_in, HTTP_ACCEPT_LANGUAGE="ko").status_code == 302
    assert language_of(user) == "en"


def test_the_notification_settings_choose_it_and_refuse_an_unknown_one(client, tenancy):
    client.force_login(tenancy.acme_member)
    assert client.post(reverse("preferences"), {"language": "ko"}).status_code == 302
    assert language_of(tenancy.acme_member) == "ko"
    before = Preferences.objects.get(user=tenancy.acme_member).emails_off
    assert "pools" in before  # its box was not ticked
    response = client.post(reverse("preferences"), {"language": "xx", "email_pools": "on"})
    assert response.status_code == 400
    after = Preferences.objects.get(user=tenancy.acme_member)
    assert (after.language, after.emails_off) == ("ko", before)  # the refusal changed nothing


def test_addresses_are_grouped_by_their_peoples_languages(tenancy):
    korean = UserFactory(username="kim", email="Kim@Acme.example")
    Preferences.objects.create(user=korean, language="ko")
    groups = by_language(["kim@acme.example", "stranger@elsewhere.example", tenancy.acme_admin.email, ""])
    assert groups == {
        "ko": ["kim@acme.example"],
        "en": ["stranger@elsewhere.example", tenancy.acme_admin.email],
    }


def test_an_invoice_goes_once_per_language_with_its_pdf_in_it(tenancy):
    korean = MembershipFactory(tenant=tenancy.acme, role=Role.ADMIN, user__username="kim").user
    Preferences.objects.create(user=korean, language="ko")
    invoice = issue(invoice_id=november_invoices(tenancy)["acme"].pk, at=AFTER)
    assert billing_mail.send_invoice(invoice.pk) == "sent"
    by_address = {tuple(m.to): m for m in mail.outbox}
    assert set(by_address) == {(tenancy.acme_admin.email,), (korean.email,)}
    assert HANGUL.search(by_address[(korean.email,)].subject)
    assert not HANGUL.search(by_address[(tenancy.acme_admin.email,)].subject)
    korean_pdf, english_pdf = (
        by_address[(a,)].attachments[0][1] for a in (korean.email, tenancy.acme_admin.email)
    )
    assert korean_pdf.startswith(b"%PDF") and korean_pdf != english_pdf
