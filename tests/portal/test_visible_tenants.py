"""The one door of tenancy, `visible_tenant_ids`, table-driven over who asks and what for: the tenants a
person belongs to (in a role at least that asked), or every tenant for superusers and the platform staff
holding the permission asked; and the role checks billing and the tenant pages share."""

import pytest
from django.http import Http404

from portal import permissions
from portal.models import Role, Tenant, visible_tenant_ids
from tests.factories import MembershipFactory, UserFactory

ALL = "every tenant"


def seen(user, **asked) -> set[str] | str:
    ids = visible_tenant_ids(user, **asked)
    return ALL if ids is None else set(Tenant.objects.filter(id__in=ids).values_list("slug", flat=True))


@pytest.mark.parametrize(
    ("who", "asked", "expected"),
    [
        ("acme_admin", {}, {"acme"}),
        ("acme_viewer", {}, {"acme"}),
        ("globex_member", {}, {"globex"}),
        ("outsider", {}, set()),
        ("acme_admin", {"role": Role.ADMIN}, {"acme"}),
        ("acme_member", {"role": Role.ADMIN}, set()),
        ("acme_member", {"role": Role.MEMBER}, {"acme"}),
        ("acme_viewer", {"role": Role.MEMBER}, set()),
        ("approver", {}, ALL),  # portal.view_tenant
        ("approver", {"staff_permission": "billing.view_invoice"}, set()),
        ("finance", {"staff_permission": "billing.view_invoice"}, ALL),
        ("finance", {"staff_permission": "billing.view_invoice", "role": Role.ADMIN}, ALL),
        ("superuser", {"staff_permission": "billing.view_invoice"}, ALL),
        ("inactive_admin", {}, set()),
    ],
)
def test_each_person_sees_the_tenants_of_their_role_or_permission(who, asked, expected, tenancy, staff_user):
    people = {
        "approver": lambda: staff_user("approver"),
        "finance": lambda: staff_user("finance"),
        "superuser": lambda: UserFactory(username="root", is_superuser=True),
        "inactive_admin": lambda: (
            MembershipFactory(
                tenant=tenancy.acme, role=Role.ADMIN, user__username="gone", user__is_active=False
            ).user
        ),
    }
    user = people[who]() if who in people else getattr(tenancy, who)
    assert seen(user, **asked) == expected


def test_a_tenants_admins_are_its_active_admin_accounts(tenancy):
    MembershipFactory(tenant=tenancy.acme, role=Role.ADMIN, user__username="gone", user__is_active=False)
    MembershipFactory(tenant=tenancy.globex, role=Role.ADMIN, user__username="gina")
    assert [u.username for u in permissions.tenant_admins(tenant_id=tenancy.acme.pk)] == ["bob"]


def test_roles_are_read_per_tenant_and_superusers_act_as_admins(tenancy):
    MembershipFactory(tenant=tenancy.globex, role=Role.VIEWER, user=tenancy.acme_admin)
    roles = permissions.tenant_roles(user=tenancy.acme_admin)
    assert roles == {tenancy.acme.pk: Role.ADMIN, tenancy.globex.pk: Role.VIEWER}
    assert permissions.tenant_roles(user=tenancy.outsider) == {}
    root = UserFactory(username="root", is_superuser=True)
    assert permissions.acts_as_tenant_admin(user=root, role=None)
    assert not permissions.acts_as_tenant_admin(user=tenancy.acme_member, role=Role.MEMBER)
    assert permissions.holds_tenant_role(user=tenancy.acme_member, tenant_slug="acme", role=Role.VIEWER)
    assert not permissions.holds_tenant_role(user=tenancy.acme_member, tenant_slug="acme", role=Role.ADMIN)


def test_a_staff_page_is_not_found_without_the_permission(tenancy, staff_user):
    permissions.require_staff(user=staff_user("finance"), permission="billing.view_invoice")
    for user in (tenancy.acme_admin, staff_user("approver")):
        with pytest.raises(Http404):
            permissions.require_staff(user=user, permission="billing.view_invoice")
