"""Invitations: an admin invites by e-mail, the invitee signs up and lands in the tenant."""

import re
from datetime import timedelta

import pytest
from django.core import mail
from django.urls import reverse
from django.utils import timezone

from portal.dispatch import Send
from portal.models import Invitation, Membership, Role
from portal.tasks import send_invitation
from tests.factories import PASSWORD, InvitationFactory, UserFactory


def invite(client, email="newcomer@example.com", role="member"):
    return client.post(reverse("invitation-create", kwargs={"slug": "acme"}), {"email": email, "role": role})


def test_invitee_signs_up_and_lands_in_the_tenant(tenancy, client, django_capture_on_commit_callbacks):
    client.force_login(tenancy.acme_admin)
    with django_capture_on_commit_callbacks() as callbacks:
        assert invite(client, role="viewer").status_code == 302
    invitation = Invitation.objects.get(email="newcomer@example.com")
    # the e-mail is queued only once the invitation is committed, by the task's name
    assert callbacks == [Send("portal.tasks.send_invitation", (invitation.pk,))]

    send_invitation(invitation.pk)  # what the worker runs; the Celery round trip has its own test
    assert len(mail.outbox) == 1
    link = re.search(r"http\S+/invitations/\S+/", mail.outbox[0].body).group(0)
    assert mail.outbox[0].to == ["newcomer@example.com"]
    assert "Acme" in mail.outbox[0].subject

    client.logout()
    path = re.sub(r"^https?://[^/]+", "", link)
    page = client.get(path)
    assert page.status_code == 200
    assert "Create an account" in page.content.decode()

    signup = client.post(
        reverse("account_signup"),
        {
            "email": "newcomer@example.com",
            "username": "newcomer",
            "password1": "a-long-Pass-phrase-77",
            "password2": "a-long-Pass-phrase-77",
        },
    )
    assert signup.status_code == 302
    assert signup.url == reverse("tenant", kwargs={"slug": "acme"})
    membership = Membership.objects.get(user__username="newcomer")
    assert (membership.tenant, membership.role) == (tenancy.acme, Role.VIEWER)
    invitation.refresh_from_db()
    assert invitation.accepted_by.username == "newcomer"
    # The invitation link proved the address: it is verified without another e-mail.
    assert membership.user.emailaddress_set.get().verified
    assert client.get(reverse("tenant", kwargs={"slug": "acme"})).status_code == 200


def test_signup_is_closed_without_an_invitation(client, db):
    response = client.post(
        reverse("account_signup"),
        {
            "email": "x@example.com",
            "username": "x",
            "password1": "a-long-Pass-77",
            "password2": "a-long-Pass-77",
        },
    )
    assert "closed" in response.content.decode().lower()
    assert not Membership.objects.exists()
    from django.contrib.auth import get_user_model

    assert not get_user_model().objects.filter(username="x").exists()


def test_existing_user_accepts_when_signed_in(tenancy, client):
    user = UserFactory(username="carla", email="carla@example.com", verified_email=True)
    invitation = InvitationFactory(
        tenant=tenancy.acme, email="Carla@Example.com", invited_by=tenancy.acme_admin
    )
    client.force_login(user)
    response = client.post(reverse("invitation", kwargs={"token": invitation.token}))
    assert response.status_code == 302
    assert Membership.objects.filter(user=user, tenant=tenancy.acme, role=Role.MEMBER).exists()


def test_existing_user_signs_in_from_the_invitation(tenancy, client):
    user = UserFactory(username="carla", email="carla@example.com", verified_email=True)
    invitation = InvitationFactory(
        tenant=tenancy.acme, email="carla@example.com", invited_by=tenancy.acme_admin
    )
    url = reverse("invitation", kwargs={"token": invitation.token})
    login = client.post(reverse("account_login") + f"?next={url}", {"login": "carla", "password": PASSWORD})
    assert login.status_code == 302 and login.url == url
    assert client.post(url).status_code == 302
    assert Membership.objects.filter(user=user, tenant=tenancy.acme).exists()


def test_invitation_for_another_address_is_refused(tenancy, client):
    invitation = InvitationFactory(
        tenant=tenancy.acme, email="someone@example.com", invited_by=tenancy.acme_admin
    )
    client.force_login(tenancy.globex_member)
    response = client.post(reverse("invitation", kwargs={"token": invitation.token}))
    assert response.status_code == 403
    assert "someone@example.com" in response.content.decode()
    assert not Membership.objects.filter(user=tenancy.globex_member, tenant=tenancy.acme).exists()


@pytest.mark.parametrize(
    ("change", "status"),
    [
        ({"revoked_at": timezone.now()}, 410),
        ({"expires_at": timezone.now() - timedelta(days=1)}, 410),
        ({"accepted_at": timezone.now()}, 410),
    ],
    ids=["revoked", "expired", "accepted"],
)
def test_closed_invitations_cannot_be_used(change, status, tenancy, client):
    invitation = InvitationFactory(tenant=tenancy.acme, email=tenancy.outsider.email, **change)
    client.force_login(tenancy.outsider)
    assert client.post(reverse("invitation", kwargs={"token": invitation.token})).status_code == status
    assert not Membership.objects.filter(user=tenancy.outsider).exists()


def test_unknown_token_is_404(client, db):
    assert client.get(reverse("invitation", kwargs={"token": "nope"})).status_code == 404


@pytest.mark.parametrize(
    ("data", "status", "message"),
    [
        ({"email": "not-an-address", "role": "member"}, 400, "valid email"),
        ({"email": "x@example.com", "role": "owner"}, 400, "not one of the available choices"),
        ({"email": "a" * 250 + "@example.com", "role": "member"}, 400, "at most 254"),
        ({"email": "alice@example.com", "role": "member"}, 409, "already a member"),
    ],
)
def test_bad_invitations_are_refused(data, status, message, tenancy, client_for):
    before = Invitation.objects.count()
    response = client_for(tenancy.acme_admin).post(
        reverse("invitation-create", kwargs={"slug": "acme"}), data
    )
    assert response.status_code == status
    assert message in response.content.decode()
    assert Invitation.objects.count() == before


def test_inviting_twice_is_a_conflict_until_it_expires(tenancy, client_for):
    client = client_for(tenancy.acme_admin)
    assert invite(client).status_code == 302
    assert invite(client, email="NEWCOMER@example.com").status_code == 409
    Invitation.objects.update(expires_at=timezone.now() - timedelta(minutes=1))
    assert invite(client).status_code == 302
    assert Invitation.objects.filter(email__iexact="newcomer@example.com").count() == 2
    assert Invitation.objects.pending().count() == 1


def test_revoked_invitation_is_not_sent(tenancy, client_for):
    invitation = InvitationFactory(tenant=tenancy.acme, invited_by=tenancy.acme_admin)
    client = client_for(tenancy.acme_admin)
    response = client.post(reverse("invitation-revoke", kwargs={"slug": "acme", "pk": invitation.pk}))
    assert response.status_code == 302
    assert send_invitation(invitation.pk) == "skipped"
    assert mail.outbox == []


def test_sending_twice_sends_one_mail(tenancy):
    invitation = InvitationFactory(tenant=tenancy.acme, invited_by=tenancy.acme_admin)
    assert send_invitation(invitation.pk) == "sent"
    assert send_invitation(invitation.pk) == "already sent"
    assert len(mail.outbox) == 1


def sign_up(client, email, username="newcomer", password="a-long-Pass-phrase-77"):
    return client.post(
        reverse("account_signup"),
        {"email": email, "username": username, "password1": password, "password2": password},
    )


def open_link(client, invitation):
    return client.get(reverse("invitation", kwargs={"token": invitation.token}))


def test_an_unverified_matching_address_does_not_accept(tenancy, client):
    """Anyone can type an address into their account; only a verified one accepts an invitation."""
    invitation = InvitationFactory(
        tenant=tenancy.acme, email="victim@example.com", role=Role.ADMIN, invited_by=tenancy.acme_admin
    )
    client.force_login(tenancy.globex_member)
    added = client.post(reverse("account_email"), {"action_add": "", "email": "victim@example.com"})
    assert added.status_code == 302
    assert tenancy.globex_member.emailaddress_set.filter(email="victim@example.com", verified=False).exists()

    page = open_link(client, invitation)
    assert "has not verified victim@example.com" in page.content.decode()
    refused = client.post(reverse("invitation", kwargs={"token": invitation.token}))
    assert refused.status_code == 403
    assert not Membership.objects.filter(user=tenancy.globex_member, tenant=tenancy.acme).exists()
    invitation.refresh_from_db()
    assert invitation.is_pending


def test_an_unverified_claim_does_not_keep_the_invitee_from_signing_up(tenancy, client):
    invitation = InvitationFactory(
        tenant=tenancy.acme, email="victim@example.com", invited_by=tenancy.acme_admin
    )
    squatter = UserFactory(username="squatter", email="victim@example.com")  # typed in, never verified
    squatter.emailaddress_set.create(email="victim@example.com", verified=False, primary=True)

    open_link(client, invitation)
    assert sign_up(client, "victim@example.com", username="victim").status_code == 302
    victim = Membership.objects.get(tenant=tenancy.acme, user__username="victim").user
    assert victim.emailaddress_set.get().verified
    squatter.refresh_from_db()
    assert squatter.email == "" and not squatter.emailaddress_set.exists()


def test_sign_up_through_an_invitation_only_with_the_invited_address(tenancy, client):
    invitation = InvitationFactory(
        tenant=tenancy.acme, email="newcomer@example.com", invited_by=tenancy.acme_admin
    )
    open_link(client, invitation)
    other = sign_up(client, "someone-else@example.com", username="intruder")
    assert other.status_code == 200
    assert "This invitation is for newcomer@example.com" in other.content.decode()
    from django.contrib.auth import get_user_model

    assert not get_user_model().objects.filter(username="intruder").exists()
    invitation.refresh_from_db()
    assert invitation.is_pending
    assert sign_up(client, "newcomer@example.com").status_code == 302  # the invitee still can


def test_an_invitation_link_opens_sign_up_once(tenancy, client):
    invitation = InvitationFactory(
        tenant=tenancy.acme, email="newcomer@example.com", invited_by=tenancy.acme_admin
    )
    open_link(client, invitation)
    assert sign_up(client, "newcomer@example.com").status_code == 302
    client.logout()

    assert open_link(client, invitation).status_code == 410
    again = sign_up(client, "newcomer@example.com", username="second")
    assert "closed" in again.content.decode().lower()
    from django.contrib.auth import get_user_model

    assert not get_user_model().objects.filter(username="second").exists()
