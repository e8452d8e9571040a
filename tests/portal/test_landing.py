"""Where people land after signing in: tenant members on their tenants, platform staff who belong to no
tenant on their own workspace (approvers on the approvals queue, operators on capacity, finance on billing),
declared by each app's plugin and found by the shell."""

import pytest
from django.apps import apps
from django.contrib.auth.models import Group

from portal import shell
from tests.factories import MembershipFactory, UserFactory


def platform_user(username: str, *groups: str):
    user = UserFactory(username=username, is_staff=True)
    for group in groups:
        user.groups.add(Group.objects.get(name=group))
    return user


@pytest.mark.parametrize(
    ("username", "group", "workspace"),
    [
        ("carol", "approver", "/approvals/"),
        ("erin", "operator", "/capacity/"),
        ("dave", "finance", "/billing/"),
    ],
)
def test_platform_staff_without_a_tenant_land_on_their_workspace(username, group, workspace, db, client_for):
    client = client_for(platform_user(username, group))
    response = client.get("/")
    assert response.status_code == 302 and response["Location"] == workspace
    assert client.get("/", follow=True).status_code == 200
    assert "You do not belong to any tenant yet" not in client.get("/", follow=True).content.decode()


def test_the_first_workspace_in_order_wins(db):
    both = platform_user("carol-and-erin", "operator", "approver")
    assert shell.workspace_for(both) == "/approvals/"
    assert shell.workspace_for(platform_user("erin-and-dave", "finance", "operator")) == "/capacity/"


def test_tenant_members_keep_their_home_page(tenancy, client_for):
    response = client_for(tenancy.acme_member).get("/")
    assert response.status_code == 200 and "Acme" in response.content.decode()


def test_staff_who_belong_to_a_tenant_keep_the_home_page(tenancy, client_for):
    carol = platform_user("carol", "approver")
    MembershipFactory(user=carol, tenant=tenancy.acme)
    assert client_for(carol).get("/").status_code == 200


def test_people_with_no_tenant_and_no_workspace_see_why(tenancy, client_for):
    response = client_for(tenancy.outsider).get("/")
    assert response.status_code == 200
    assert "You do not belong to any tenant yet" in response.content.decode()
    assert shell.workspace_for(tenancy.outsider) is None
    assert client_for(UserFactory(username="staff-nothing", is_staff=True)).get("/").status_code == 200


def test_workspaces_are_declared_by_the_apps_not_the_shell():
    declared = {
        app: [link.url_name for link in apps.get_app_config(app).plugin.workspaces]
        for app in ("pools", "billing")
    }
    assert declared == {"pools": ["approvals", "capacity-dashboard"], "billing": ["billing-home"]}
