"""Tenant isolation: every page and endpoint, seen from inside and from outside the tenant.

The table lists each of the project's routes once. A route added without a row
fails `test_every_route_is_in_the_table`, so the table grows with the API.
"""

from collections.abc import Callable
from dataclasses import dataclass

import pytest
from django.urls import URLPattern, URLResolver, get_resolver, reverse

from tests.factories import InvitationFactory, InvoiceFactory

OUR_APPS = ("portal.", "pools.", "billing.", "monitoring.")


@dataclass
class Route:
    name: str
    method: str
    url: Callable  # (tenancy, objects) -> url of an acme object
    owner_status: int  # what an acme admin gets
    data: dict | None = None
    api: bool = False


def acme_objects(t):
    from pools.models import PoolRequest
    from pools.sync import sync_cluster
    from tests.factories import ClusterFactory

    invitation = InvitationFactory(tenant=t.acme, invited_by=t.acme_admin)
    member = t.acme.memberships.get(user=t.acme_member)
    sync_cluster(cluster=ClusterFactory(name="iso", fleet=[("n", 1, "H100-80GB", [None] * 8)]))
    request = PoolRequest.objects.create(project=t.vision, submitted_by=t.acme_member)
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
    from django.utils import timezone

    from pools.models import Cluster, Pool, PoolRequest

    fulfilled = PoolRequest.objects.create(project=project, submitted_by=user, state="fulfilled")
    cluster = Cluster.objects.get(name="iso")
    return Pool.objects.create(
        request=fulfilled, project=project, cluster=cluster, state="active", reserved_at=timezone.now()
    )


def page(name, obj):
    return reverse(name, kwargs={"tenant_slug": "acme", "pk": obj.pk})


def pool_request_url(action):
    return lambda t, o: reverse(f"v1:pool-request-{action}", args=[o["request"].pk])


ROUTES = [
    # Pages of one tenant's objects: an outsider gets 404, never a hint that they exist.
    Route("tenant", "get", lambda t, o: reverse("tenant", kwargs={"slug": "acme"}), 200),
    Route(
        "project",
        "get",
        lambda t, o: reverse("project", kwargs={"tenant_slug": "acme", "slug": "vision"}),
        200,
    ),
    Route(
        "project-create",
        "post",
        lambda t, o: reverse("project-create", kwargs={"slug": "acme"}),
        302,
        data={"name": "New", "slug": "new-project"},
    ),
    Route(
        "invitation-create",
        "post",
        lambda t, o: reverse("invitation-create", kwargs={"slug": "acme"}),
        302,
        data={"email": "new@example.com", "role": "member"},
    ),
    Route(
        "invitation-revoke",
        "post",
        lambda t, o: reverse("invitation-revoke", kwargs={"slug": "acme", "pk": o["invitation"].pk}),
        302,
    ),
    Route(
        "member-role",
        "post",
        lambda t, o: reverse("member-role", kwargs={"slug": "acme", "pk": o["member"].pk}),
        302,
        data={"role": "viewer"},
    ),
    Route(
        "member-remove",
        "post",
        lambda t, o: reverse("member-remove", kwargs={"slug": "acme", "pk": o["member"].pk}),
        302,
    ),
    Route(
        "v1:tenant-detail", "get", lambda t, o: reverse("v1:tenant-detail", args=[t.acme.pk]), 200, api=True
    ),
    Route(
        "v1:project-detail",
        "get",
        lambda t, o: reverse("v1:project-detail", args=[t.vision.pk]),
        200,
        api=True,
    ),
    Route(
        "v1:project-list",
        "post",
        lambda t, o: reverse("v1:project-list"),
        201,
        data={"tenant": "acme", "slug": "api-project", "name": "API project"},
        api=True,
    ),
    Route("v1:pool-request-detail", "get", pool_request_url("detail"), 200, api=True),
    Route("v1:pool-request-approve", "post", pool_request_url("approve"), 403, api=True),  # approvers only
    Route("v1:pool-request-reject", "post", pool_request_url("reject"), 403, data={"reason": "x"}, api=True),
    Route("v1:pool-request-cancel", "post", pool_request_url("cancel"), 200, api=True),
    Route(
        "pool-request-new",
        "get",
        lambda t, o: reverse("pool-request-new", kwargs={"tenant_slug": "acme", "slug": "vision"}),
        200,
    ),
    # A tenant's lists name the tenant in their address: an outsider gets 404, as for its objects.
    Route(
        "tenant-requests", "get", lambda t, o: reverse("tenant-requests", kwargs={"tenant_slug": "acme"}), 200
    ),
    Route("tenant-pools", "get", lambda t, o: reverse("tenant-pools", kwargs={"tenant_slug": "acme"}), 200),
    Route("pool-request", "get", lambda t, o: page("pool-request", o["request"]), 200),
    Route("pool-request-cancel", "post", lambda t, o: page("pool-request-cancel", o["request"]), 302),
    Route("pool", "get", lambda t, o: page("pool", o["pool"]), 200),
    Route(
        "pool-usage-chart",
        "get",
        lambda t, o: reverse(
            "pool-usage-chart", kwargs={"tenant_slug": "acme", "pk": o["pool"].pk, "metric": "sm_active_pct"}
        ),
        200,
    ),
    Route(
        "tenant-invoices", "get", lambda t, o: reverse("tenant-invoices", kwargs={"tenant_slug": "acme"}), 200
    ),
    Route(
        "tenant-invoice-download",
        "get",
        lambda t, o: reverse(
            "tenant-invoice-download", kwargs={"tenant_slug": "acme", "pk": o["invoice"].pk, "kind": "csv"}
        ),
        200,
    ),
    Route(
        "tenant-credit-note-pdf",
        "get",
        lambda t, o: reverse(
            "tenant-credit-note-pdf", kwargs={"tenant_slug": "acme", "pk": o["credit_note"].pk}
        ),
        200,
    ),
    Route("pool-release", "post", lambda t, o: page("pool-release", o["pool"]), 302),
    Route(
        "v1:pool-detail", "get", lambda t, o: reverse("v1:pool-detail", args=[o["pool"].pk]), 200, api=True
    ),
    Route(
        "v1:pool-release", "post", lambda t, o: reverse("v1:pool-release", args=[o["pool"].pk]), 200, api=True
    ),
    Route(
        "v1:pool-request-list",
        "post",
        lambda t, o: reverse("v1:pool-request-list"),
        201,
        data={"project": None, "items": [{"spec": "h100-80gb.full", "count": 1}]},
        api=True,
    ),
]

# Lists: an outsider gets 200 with none of acme's rows.
LISTS = [
    ("home", False),
    ("v1:pool-request-list", True),
    ("v1:pool-list", True),
    ("v1:tenant-list", True),
    ("v1:project-list", True),
    ("v1:usage", True),
]

# Routes with no tenant object in them, and why.
NOT_TENANT_SCOPED = {
    "invitation": "addressed by a secret token, checked against the signed-in user's e-mail",
    "v1:api-token": "signs a user in; returns only their own token",
    "preferences": "the signed-in person's own settings",
    "set_language": "the signed-in person's own language (tests/portal/test_email_language.py)",
    "api-tokens": "the signed-in person's own tokens",
    "api-token-revoke": "the person's own tokens; another's answers 404 (tests/portal/test_tokens.py)",
    "capacity-dashboard": "platform staff only (tests/pools/test_capacity_views.py)",
    **dict.fromkeys(
        ["approvals", "approval", "approval-approve", "approval-reject", "approval-priority"],
        "approvers only; anyone else, tenants and other staff, gets 404 (tests/pools/test_approvals.py)",
    ),
    "favicon": "the same redirect to the portal's icon for everyone (tests/portal/test_favicon.py)",
    "audit": "approvers, operators and finance; anyone else gets 404 (tests/portal/test_audit.py)",
    **dict.fromkeys(
        ["capacity-group", "capacity-node"],
        "platform staff only; anyone else gets 404 (tests/pools/test_capacity_views.py)",
    ),
    **dict.fromkeys(
        ["whatif-list", "whatif-run", "whatif-chart", "whatif-compare", "whatif-compare-chart"],
        "platform staff who see capacity; anyone else gets 404 (tests/pools/test_whatif_page.py)",
    ),
    **dict.fromkeys(
        ["capacity-gpu-drain", "capacity-node-drain"],
        "operators only; anyone else gets 404 (tests/pools/test_dashboard_drain.py)",
    ),
    **dict.fromkeys(
        [
            "monitoring-fleet",
            "monitoring-gpu",
            "monitoring-gpu-chart",
            "monitoring-pool",
            "monitoring-pool-chart",
        ],
        "operators only; anyone else gets 404 (tests/monitoring/test_fleet_pages.py)",
    ),
    "metrics": "a bearer token or an allowed network; others get 403 (tests/monitoring/test_metrics.py)",
    "monitoring-faults": "approvers and operators; anyone else gets 404 (tests/monitoring/test_faults.py)",
    "monitoring-fault-clear": "operators only; anyone else gets 404 (tests/monitoring/test_faults.py)",
    "monitoring-fault-replace": "approvers only; tenants too get 404 (tests/monitoring/test_faults.py)",
    **dict.fromkeys(
        ["monitoring-alerts", "monitoring-alert", "monitoring-alert-acknowledge", "monitoring-rules"],
        "operators only; anyone else gets 404 (tests/monitoring/test_alert_pages.py)",
    ),
    "billing-metering": "platform staff only (tests/billing/test_metering_page.py)",
    **dict.fromkeys(
        [
            "billing-home",
            "billing-month",
            "billing-month-chart",
            "billing-month-close",
            "billing-month-issue",
            "billing-month-export",
            "billing-invoice",
            "billing-invoice-act",
            "billing-credit-note-pdf",
        ],
        "finance only; anyone else gets 404 (tests/billing/test_finance.py)",
    ),
    "v1:invoice-detail": "a tenant's admins and finance; anyone else gets 404 (tests/billing/test_api.py)",
    "v1:invoice-list": "a tenant's admins see its issued invoices only (tests/billing/test_api.py)",
    "v1:invoice-export": "as the invoice itself; anyone else gets 404 (tests/billing/test_api.py)",
    "v1:cluster-list": "cluster names and states, shared by all tenants",
    "v1:specs": "the catalogue of what can be requested, shared by all tenants",
    "v1:cluster-detail": "cluster names and states, shared by all tenants",
    "v1:capacity-summary": "platform staff only (tests/pools/test_capacity_views.py)",
    "v1:capacity-node-list": "platform staff only",
    "v1:capacity-node-detail": "platform staff only",
    "v1:capacity-gpu-list": "platform staff only",
    "v1:capacity-gpu-detail": "platform staff only",
    "v1:monitoring-samples": "node agents by agent token; its cluster is the token's (test_agent_api.py)",
}


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


@pytest.mark.parametrize("route", ROUTES, ids=lambda r: r.name)
@pytest.mark.parametrize("who", ["globex_admin", "globex_member", "globex_viewer", "outsider"])
def test_foreign_object_answers_404_and_changes_nothing(route, who, tenancy, client, api_client):
    """Every role of another tenant (and a person of none), on each of acme's objects."""
    objects = acme_objects(tenancy)
    user = foreign_user(tenancy, who)
    http = api_client if route.api else client
    if route.api:
        http.force_authenticate(user)
    else:
        http.force_login(user)
    before = _snapshot(tenancy)
    response = _request(http, route, route.url(tenancy, objects), tenancy)
    # a tenant or project you cannot see is "unknown" in a body, and "not found" in an address
    expected = 400 if route.name in ("v1:project-list", "v1:pool-request-list") else 404
    assert response.status_code == expected
    assert _snapshot(tenancy) == before
    if route.api:
        assert response["Content-Type"].startswith("application/json")
    if expected == 404 and route.api:
        assert response.json() == {"detail": "Not found."}


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
    from pools.models import Pool, PoolRequest

    acme_objects(tenancy)
    own = PoolRequest.objects.create(project=tenancy.recsys, submitted_by=tenancy.globex_member)
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
