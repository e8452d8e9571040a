"""Roles: what tenant admins, members and viewers may do, and what the platform groups hold."""

import pytest
from django.contrib.auth.models import Group
from django.urls import reverse

from portal.models import Membership, Role
from tests.factories import MembershipFactory


@pytest.mark.parametrize(
    ("who", "status"),
    [("acme_admin", 302), ("acme_member", 403), ("acme_viewer", 403)],
)
def test_only_tenant_admins_add_projects(who, status, tenancy, client_for):
    client = client_for(getattr(tenancy, who))
    response = client.post(
        reverse("project-create", kwargs={"slug": "acme"}), {"name": "Speech", "slug": "speech"}
    )
    assert response.status_code == status
    assert tenancy.acme.projects.filter(slug="speech").exists() == (status == 302)


@pytest.mark.parametrize(
    ("who", "status"),
    [("acme_admin", 302), ("acme_member", 403), ("acme_viewer", 403)],
)
def test_only_tenant_admins_invite(who, status, tenancy, client_for):
    client = client_for(getattr(tenancy, who))
    response = client.post(
        reverse("invitation-create", kwargs={"slug": "acme"}), {"email": "new@example.com", "role": "member"}
    )
    assert response.status_code == status
    assert tenancy.acme.invitations.filter(email="new@example.com").exists() == (status == 302)


@pytest.mark.parametrize(
    ("who", "status"),
    [("acme_admin", 201), ("acme_member", 403), ("acme_viewer", 403)],
)
def test_only_tenant_admins_add_projects_through_the_api(who, status, tenancy, api_for):
    response = api_for(getattr(tenancy, who)).post(
        "/api/v1/projects/", {"tenant": "acme", "slug": "speech", "name": "Speech"}, format="json"
    )
    assert response.status_code == status, response.content
    assert tenancy.acme.projects.filter(slug="speech").exists() == (status == 201)


def test_admin_sets_member_roles(tenancy, client_for):
    member = tenancy.acme.memberships.get(user=tenancy.acme_member)
    client = client_for(tenancy.acme_admin)
    response = client.post(
        reverse("member-role", kwargs={"slug": "acme", "pk": member.pk}), {"role": "admin"}
    )
    assert response.status_code == 302
    member.refresh_from_db()
    assert member.role == Role.ADMIN


def test_a_tenant_keeps_one_admin(tenancy, client_for):
    admin = tenancy.acme.memberships.get(user=tenancy.acme_admin)
    client = client_for(tenancy.acme_admin)
    demote = client.post(reverse("member-role", kwargs={"slug": "acme", "pk": admin.pk}), {"role": "member"})
    remove = client.post(reverse("member-remove", kwargs={"slug": "acme", "pk": admin.pk}))
    assert demote.status_code == 409
    assert remove.status_code == 409
    assert "at least one admin" in remove.content.decode()
    admin.refresh_from_db()
    assert admin.role == Role.ADMIN


def test_second_admin_can_leave(tenancy, client_for):
    MembershipFactory(tenant=tenancy.acme, role=Role.ADMIN)
    admin = tenancy.acme.memberships.get(user=tenancy.acme_admin)
    response = client_for(tenancy.acme_admin).post(
        reverse("member-remove", kwargs={"slug": "acme", "pk": admin.pk})
    )
    assert response.status_code == 302
    assert not Membership.objects.filter(pk=admin.pk).exists()


def test_unknown_role_is_refused(tenancy, client_for):
    member = tenancy.acme.memberships.get(user=tenancy.acme_member)
    response = client_for(tenancy.acme_admin).post(
        reverse("member-role", kwargs={"slug": "acme", "pk": member.pk}), {"role": "owner"}
    )
    assert response.status_code == 400
    member.refresh_from_db()
    assert member.role == Role.MEMBER


def test_viewer_sees_tenant_without_admin_forms(tenancy, client_for):
    body = client_for(tenancy.acme_viewer).get(reverse("tenant", kwargs={"slug": "acme"})).content.decode()
    assert "vision" in body.lower()
    assert reverse("invitation-create", kwargs={"slug": "acme"}) not in body
    assert reverse("project-create", kwargs={"slug": "acme"}) not in body


PLATFORM_GROUPS = {
    "approver": {"portal.view_tenant", "portal.view_project", "portal.view_membership"},
    "operator": {"portal.view_tenant", "portal.view_project", "portal.view_membership"},
    "finance": {"portal.view_tenant", "portal.view_project", "portal.view_membership"},
}


@pytest.mark.parametrize("group", sorted(PLATFORM_GROUPS))
def test_platform_groups_exist_with_their_permissions(group, db):
    perms = Group.objects.get(name=group).permissions.select_related("content_type")
    granted = {f"{p.content_type.app_label}.{p.codename}" for p in perms}
    assert PLATFORM_GROUPS[group] <= granted
    assert not any(p.startswith("portal.") and not p.split(".")[1].startswith("view_") for p in granted), (
        "platform staff read tenancy; only superusers change it"
    )


@pytest.mark.parametrize("group", sorted(PLATFORM_GROUPS))
def test_platform_staff_see_every_tenant_but_cannot_change_one(group, tenancy, staff_user, client_for):
    client = client_for(staff_user(group))
    listing = client.get(reverse("admin:portal_tenant_changelist"))
    assert listing.status_code == 200
    assert "Acme" in listing.content.decode() and "Globex" in listing.content.decode()
    change = client.post(reverse("admin:portal_tenant_change", args=[tenancy.acme.pk]), {"name": "Hacked"})
    assert change.status_code == 403
    assert client.get(reverse("tenant", kwargs={"slug": "globex"})).status_code == 200


def test_staff_without_group_sees_no_tenant(tenancy, client_for):
    from tests.factories import UserFactory

    client = client_for(UserFactory(is_staff=True))
    assert client.get(reverse("tenant", kwargs={"slug": "acme"})).status_code == 404
