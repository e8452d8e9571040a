"""The tenant-isolation table (tests/portal/test_isolation.py): each of the project's routes once, with
what an admin of the tenant that owns the object gets, or why the route has no tenant object in it."""

from collections.abc import Callable
from dataclasses import dataclass

from django.urls import reverse

OUR_APPS = ("portal.", "pools.", "billing.", "monitoring.")


@dataclass
class Route:
    name: str
    method: str
    url: Callable  # (tenancy, objects) -> url of an acme object
    owner_status: int  # what an acme admin gets
    data: dict | None = None
    api: bool = False


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
        "v1:tenant-detail", "get", lambda t, o: reverse("v1:tenant-detail", args=[t.acme.slug]), 200, api=True
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
        "tenant-budgets", "get", lambda t, o: reverse("tenant-budgets", kwargs={"tenant_slug": "acme"}), 200
    ),
    Route(
        "tenant-budget-remove",
        "post",
        lambda t, o: reverse("tenant-budget-remove", kwargs={"tenant_slug": "acme"}),
        302,
        data={"project": ""},
    ),
    # A budget is named by its body: another tenant's answers 404 as an address would.
    Route(
        "v1:budgets",
        "put",
        lambda t, o: reverse("v1:budgets"),
        200,
        data={"tenant": "acme", "month_limit": "100", "currency": "KRW"},
        api=True,
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
        "pool-extend",
        "post",
        lambda t, o: page("pool-extend", o["pool"]),
        302,
        data={"end_at": "2030-01-01T00:00"},
    ),
    Route(
        "pool-grow",
        "post",
        lambda t, o: page("pool-grow", o["pool"]),
        302,
        data={"spec": "h100-80gb.full", "count": 1},
    ),
    # The pool holds no instance: nothing to give back, refused (the form needs one) but reached.
    Route("pool-shrink", "post", lambda t, o: page("pool-shrink", o["pool"]), 400, data={"allocation": []}),
    Route(
        "v1:pool-extend",
        "post",
        lambda t, o: reverse("v1:pool-extend", args=[o["pool"].pk]),
        201,
        data={"end_at": "2030-01-01T00:00:00Z"},
        api=True,
    ),
    Route(
        "v1:pool-resize",
        "post",
        lambda t, o: reverse("v1:pool-resize", args=[o["pool"].pk]),
        201,
        data={"add": [{"spec": "h100-80gb.full", "count": 1}]},
        api=True,
    ),
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
    **dict.fromkeys(
        ["openid_connect_login", "openid_connect_callback"],
        "signs a person in through an identity provider; no tenant in it (tests/portal/test_sso_signin.py)",
    ),
    "api-token-revoke": "the person's own tokens; another's answers 404 (tests/portal/test_tokens.py)",
    "capacity-dashboard": "platform staff only (tests/pools/test_capacity_views.py)",
    **dict.fromkeys(
        ["capacity-quotas", "capacity-quota-set", "capacity-auto-approve"],
        "operators and approvers only; anyone else gets 404 (tests/pools/test_quota_pages.py)",
    ),
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
    "metrics": "a bearer token or an allowed network; others get 403 (tests/portal/test_metrics.py)",
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
    "v1:quotas": "each tenant's people see their tenant's rows only (tests/pools/test_quota_api.py)",
    "v1:cluster-detail": "cluster names and states, shared by all tenants",
    "v1:capacity-summary": "platform staff only (tests/pools/test_capacity_views.py)",
    "v1:capacity-node-list": "platform staff only",
    "v1:capacity-node-detail": "platform staff only",
    "v1:capacity-gpu-list": "platform staff only",
    "v1:capacity-gpu-detail": "platform staff only",
    "v1:monitoring-samples": "node agents by agent token; its cluster is the token's (test_agent_api.py)",
}
