"""Tenant isolation: every page and endpoint, seen from inside and from outside the tenant.

The table (tests/portal/isolation_table.py) lists each of the project's routes once. A route added
without a row fails `test_every_route_is_in_the_table`, so the table grows with the API.
"""

import pytest
from django.urls import URLPattern, URLResolver, get_resolver, reverse

from pools.services import sync_inventory
from tests.factories import ClusterFactory, InvitationFactory, InvoiceFactory, PoolFactory, PoolRequestFactory
from tests.portal.isolation_table import LISTS, NOT_TENANT_SCOPED, OUR_APPS, ROUTES


def acme_objects(t):
    invitation = InvitationFactory(tenant=t.acme, invited_by=t.acme_admin)
    member = t.acme.memberships.get(user=t.acme_member)
    sync_inventory(cluster=ClusterFactory(name="iso", fleet=[("n", 1, "H100-80GB", [None] * 8)]))
    request = PoolRequestFactory(project=t.vision, submitted_by=t.acme_member, items=[])
    pool = make_pool(t.vision, t.acme_member)
    invoice = make_invoice(t.acme)
    note = make_credit_note(invoice)
    return {
        "invitation": invitation,
        "member": member,
        "request": request,
        "pool": pool,
        "invoice": invoice,
        "credit_note": note,
    }


def make_credit_note(invoice):
    from decimal import Decimal

    from billing.invoices import credit

    return credit(invoice_id=invoice.pk, amount=Decimal(10), reason="a GPU was down")


def make_invoice(tenant):
    from datetime import date
    from decimal import Decimal

    return InvoiceFactory(
        tenant=tenant, month=date(2026, 1, 1), state="issued", number="2026-00001", subtotal=Decimal(100)
    )


def make_pool(project, user):
    """An active pool of the project on the cluster `acme_objects` syncs, ending in 2029."""
    from datetime import UTC, datetime

    return PoolFactory(
        project=project,
        request__submitted_by=user,
        request__items=[],
        cluster=ClusterFactory(name="iso"),
        end_at=datetime(2029, 12, 1, tzinfo=UTC),
    )


def _our_route_names(resolver=None, namespace=""):
    resolver = resolver or get_resolver()
    for entry in resolver.url_patterns:
        if isinstance(entry, URLResolver):
            prefix = f"{namespace}{entry.namespace}:" if entry.namespace else namespace
            yield from _our_route_names(entry, prefix)
        elif isinstance(entry, URLPattern) and entry.name:
            module = getattr(entry.callback, "__module__", "")
            if module.startswith(OUR_APPS):
                yield f"{namespace}{entry.name}"


def test_every_route_is_in_the_table():
    covered = {r.name for r in ROUTES} | {name for name, _ in LISTS} | set(NOT_TENANT_SCOPED)
    routes = set(_our_route_names())
    routes = {name for name in routes if not name.endswith("-format")}  # the .json twins of API routes
    assert routes - covered == set(), "add these routes to the isolation table"
    assert covered - routes == set(), "the table names routes that no longer exist"


def _request(client, route, url, tenancy=None):
    call = getattr(client, route.method)
    data = dict(route.data or {})
    if "project" in data:  # acme's project, whoever asks
        data["project"] = tenancy.vision.pk
    if route.api:
        return call(url, data, format="json")
    return call(url, route.data or {})


def foreign_user(tenancy, who: str):
    """A person of another tenant in each of its roles, or of none."""
    from portal.models import Role
    from tests.factories import MembershipFactory

    roles = {"globex_admin": Role.ADMIN, "globex_viewer": Role.VIEWER}
    if who in roles:
        return MembershipFactory(tenant=tenancy.globex, role=roles[who], user__username=who).user
    return getattr(tenancy, who)


FOREIGN = ["globex_admin", "globex_member", "globex_viewer", "outsider"]


@pytest.mark.parametrize("route", ROUTES, ids=lambda r: r.name)
def test_foreign_object_answers_404_and_changes_nothing(route, tenancy, client, api_client):
    """Every role of another tenant (and a person of none), on each of acme's objects."""
    objects = acme_objects(tenancy)
    http = api_client if route.api else client
    # a tenant or project you cannot see is "unknown" in a body, and "not found" in an address
    expected = 400 if route.name in ("v1:project-list", "v1:pool-request-list") else 404
    for who in FOREIGN:
        user = foreign_user(tenancy, who)
        if route.api:
            http.force_authenticate(user)
        else:
            http.force_login(user)
        before = _snapshot(tenancy)
        response = _request(http, route, route.url(tenancy, objects), tenancy)
        assert response.status_code == expected, who
        assert _snapshot(tenancy) == before, who
        if route.api:
            assert response["Content-Type"].startswith("application/json"), who
        if expected == 404 and route.api:
            assert response.json() == {"detail": "Not found."}, who


@pytest.mark.parametrize("route", ROUTES, ids=lambda r: r.name)
def test_tenant_admin_reaches_every_route(route, tenancy, client, api_client):
    objects = acme_objects(tenancy)
    http = api_client if route.api else client
    if route.api:
        http.force_authenticate(tenancy.acme_admin)
    else:
        http.force_login(tenancy.acme_admin)
    response = _request(http, route, route.url(tenancy, objects), tenancy)
    assert response.status_code == route.owner_status, response.content


@pytest.mark.parametrize(("name", "api"), LISTS)
def test_lists_show_only_own_tenants(name, api, tenancy, client, api_client):
    from pools.models import Pool

    acme_objects(tenancy)
    own = PoolRequestFactory(project=tenancy.recsys, submitted_by=tenancy.globex_member, items=[])
    own_pool = make_pool(tenancy.recsys, tenancy.globex_member)
    if name == "v1:usage":  # an hour of this month used by each tenant
        from django.utils import timezone

        from billing.models import UsageRecord
        from billing.selectors import month_bounds

        hour = max(timezone.now().replace(minute=0, second=0, microsecond=0), month_bounds(None)[0])
        for pool in Pool.objects.all():
            UsageRecord.objects.create(
                pool=pool,
                gpu_model="H100-80GB",
                profile="full",
                period_start=hour,
                count=1,
                seconds=3600,
                currency="KRW",
            )
    http = api_client if api else client
    if api:
        http.force_authenticate(tenancy.globex_member)
    else:
        http.force_login(tenancy.globex_member)
    response = http.get(reverse(name))
    body = response.content.decode()
    assert "acme" not in body.lower()
    assert "vision" not in body
    if name == "v1:pool-request-list":
        rows = {(row["id"], row["project"]) for row in response.json()["results"]}
        assert rows == {(own.pk, tenancy.recsys.pk), (own_pool.request_id, tenancy.recsys.pk)}
    else:
        assert "recsys" in body or "globex" in body.lower()


def _snapshot(t):
    from pools.models import PoolRequest

    acme = t.acme
    return (
        sorted(acme.projects.values_list("slug", "name")),
        sorted(acme.memberships.values_list("user_id", "role")),
        sorted(acme.invitations.values_list("email", "revoked_at")),
        sorted(PoolRequest.objects.filter(project__tenant=acme).values_list("pk", "state")),
        sorted(acme.projects.values_list("pools__pk", "pools__state")),
    )
