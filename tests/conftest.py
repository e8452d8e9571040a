"""Shared fixtures: two tenants with people in every role, API clients, static files."""

from dataclasses import dataclass

import pytest
from django.contrib.auth.models import Group
from django.core.cache import cache
from django.core.management import call_command
from rest_framework.test import APIClient

from portal.models import Project, Role, Tenant
from tests.factories import MembershipFactory, ProjectFactory, TenantFactory, UserFactory


@pytest.fixture(scope="session", autouse=True)
def _test_settings(tmp_path_factory, django_test_environment):
    """Fast password hashing; static files collected once, as production does, so that
    templates resolve them through the manifest."""
    from django.conf import settings

    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    settings.STATIC_ROOT = tmp_path_factory.mktemp("static")
    call_command("collectstatic", interactive=False, verbosity=0)


@pytest.fixture(autouse=True)
def _fresh_cache():
    """Rate limits and used TOTP codes live in the cache; each test starts without them."""
    cache.clear()


@dataclass
class Tenancy:
    acme: Tenant
    globex: Tenant
    vision: Project
    recsys: Project
    acme_admin: object
    acme_member: object
    acme_viewer: object
    globex_member: object
    outsider: object


@pytest.fixture
def tenancy(db) -> Tenancy:
    acme = TenantFactory(slug="acme", name="Acme")
    globex = TenantFactory(slug="globex", name="Globex")
    return Tenancy(
        acme=acme,
        globex=globex,
        vision=ProjectFactory(tenant=acme, slug="vision"),
        recsys=ProjectFactory(tenant=globex, slug="recsys"),
        acme_admin=MembershipFactory(tenant=acme, role=Role.ADMIN, user__username="bob").user,
        acme_member=MembershipFactory(tenant=acme, role=Role.MEMBER, user__username="alice").user,
        acme_viewer=MembershipFactory(tenant=acme, role=Role.VIEWER, user__username="victor").user,
        globex_member=MembershipFactory(tenant=globex, role=Role.MEMBER, user__username="mallory").user,
        outsider=UserFactory(username="olivia"),
    )


@pytest.fixture
def staff_user(db):
    def make(group: str):
        user = UserFactory(username=f"staff-{group}", is_staff=True)
        user.groups.add(Group.objects.get(name=group))
        return user

    return make


@pytest.fixture
def api_client():
    return APIClient()


@pytest.fixture
def client_for(client):
    def login(user):
        client.force_login(user)
        return client

    return login


@pytest.fixture
def api_for(api_client):
    def login(user):
        api_client.force_authenticate(user)
        return api_client

    return login
