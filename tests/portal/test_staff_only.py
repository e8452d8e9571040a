"""Every staff-only page and endpoint refuses every tenant role, generated from the URL patterns.

The routes are the project's routes that `test_isolation.NOT_TENANT_SCOPED` says are for platform staff, and
every admin page of the project's models. Each is asked with GET and POST, with the ids of real objects, by an
admin, a member and a viewer of a tenant: pages answer 404 (tenants do not learn they exist), the staff
API 403 or 404, the admin sends them to its sign-in page, and nothing changes."""

import re

import pytest
from django.urls import URLPattern, URLResolver, get_resolver, reverse
from django.utils import timezone

from tests.factories import AlertFactory, AllocationFactory, ClusterFactory, PoolFactory, WhatIfRunFactory
from tests.portal.test_isolation import NOT_TENANT_SCOPED, OUR_APPS, _snapshot, make_credit_note, make_invoice

# What the isolation table says of a route meant for platform staff only, by its first words.
STAFF_WORDS = ("platform staff", "operators", "approvers", "finance")
# The other routes with no tenant in them: each person's own, shared by everyone, or by token.
NOT_STAFF = {
    "invitation",
    "v1:api-token",
    "preferences",
    "set_language",
    "api-tokens",
    "api-token-revoke",
    "openid_connect_login",  # signing in through an identity provider, before anyone is signed in
    "openid_connect_callback",
    "favicon",
    "metrics",  # a bearer token or an allowed network, whoever is signed in (test_metrics.py)
    "v1:invoice-detail",
    "v1:invoice-list",
    "v1:invoice-export",
    "v1:cluster-list",
    "v1:cluster-detail",
    "v1:specs",
    "v1:quotas",  # each tenant's people see their own tenant's rows (tests/pools/test_quota_api.py)
    "v1:monitoring-samples",
}
ROLES = ["acme_admin", "acme_member", "acme_viewer"]


def _patterns(resolver=None, namespace=""):
    """(route name, URLPattern) of every named route of the project's apps and of the admin."""
    for entry in (resolver or get_resolver()).url_patterns:
        if isinstance(entry, URLResolver):
            yield from _patterns(entry, f"{namespace}{entry.namespace}:" if entry.namespace else namespace)
        elif isinstance(entry, URLPattern) and entry.name:
            name = f"{namespace}{entry.name}"
            if name.startswith("admin:") or getattr(entry.callback, "__module__", "").startswith(OUR_APPS):
                yield name, entry


def staff_only() -> list[str]:
    return sorted(name for name, why in NOT_TENANT_SCOPED.items() if why.startswith(STAFF_WORDS))


def admin_pages() -> list[str]:
    """The admin's pages of the project's own models: their lists, forms and histories."""
    apps = "|".join(app.rstrip(".") for app in OUR_APPS)
    return sorted(
        {
            name
            for name, _ in _patterns()
            if re.fullmatch(rf"admin:({apps})_\w+_(changelist|add|change|history)", name)
        }
    )


def test_every_route_without_a_tenant_is_staff_only_or_said_otherwise():
    said_staff = set(staff_only())
    assert said_staff & NOT_STAFF == set()
    assert set(NOT_TENANT_SCOPED) - said_staff - NOT_STAFF == set(), "say whether these are for staff only"
    assert len(said_staff) >= 30 and len(admin_pages()) >= 40  # the generator finds them


@pytest.fixture
def objects(tenancy):
    """One real object for each kind of id the staff routes take, all of tenant acme's or the fleet's."""
    cluster = ClusterFactory(name="staff", fleet=[("n", 1, "H100-80GB", [None] * 8)])
    from pools.services.inventory import sync_inventory

    sync_inventory(cluster=cluster)
    pool = PoolFactory(project=tenancy.vision, cluster=cluster)
    allocation = AllocationFactory(pool=pool, gpu=cluster.nodes.get().gpus.first())
    gpu, node = allocation.gpu, allocation.gpu.node
    invoice = make_invoice(tenancy.acme)
    from monitoring.models import GpuFault

    fault = GpuFault.objects.create(gpu=gpu, kind="xid", code=79, at=timezone.now(), drained_by_portal=True)
    return {
        "request": pool.request,
        "pool": pool,
        "cluster": cluster,
        "node": node,
        "gpu": gpu,
        "invoice": invoice,
        "credit_note": make_credit_note(invoice),
        "alert": AlertFactory(gpu=gpu),
        "fault": fault,
        "whatif_run": WhatIfRunFactory(state="done"),
    }


# Which object a route's `pk` names, by the route's name.
PK_OF = [
    ("approval", "request"),
    ("capacity-group", "cluster"),
    ("capacity-node", "node"),
    ("capacity-gpu", "gpu"),
    ("billing-invoice", "invoice"),
    ("billing-credit-note", "credit_note"),
    ("monitoring-alert", "alert"),
    ("monitoring-fault-clear", "fault"),
    ("monitoring-fault-replace", "pool"),
    ("monitoring-gpu", "gpu"),
    ("monitoring-pool", "pool"),
    ("v1:capacity-node", "node"),
    ("v1:capacity-gpu", "gpu"),
    ("whatif-", "whatif_run"),
]
OTHER_KWARGS = {
    "group": "none",
    "month": "2026-01",
    "kind": "xlsx",
    "act": "issue",
    "metric": "sm_active",
    "slug": "acme",
}


def url_of(name: str, objects: dict) -> str:
    pattern = dict(_patterns())[name].pattern
    kwargs = {}
    for key in [*getattr(pattern, "converters", {}), *pattern.regex.groupindex]:
        if key == "pk":
            kwargs[key] = objects[next(kind for prefix, kind in PK_OF if name.startswith(prefix))].pk
        elif key == "object_id":
            kwargs[key] = "1"
        elif key != "format":
            kwargs[key] = OTHER_KWARGS[key]
    return reverse(name, kwargs=kwargs)


@pytest.mark.parametrize("name", staff_only())
def test_a_staff_route_answers_404_to_every_tenant_role(name, tenancy, objects, client, api_client):
    url = url_of(name, objects)
    before = _snapshot(tenancy)
    # The method a route does not take is refused before anyone is asked who they are (405); the one it
    # takes answers "not found" on a page, and "not found" or "forbidden" in the API (staff collections that
    # hold no tenant's object).
    refused = {403, 404} if name.startswith("v1:") else {404}
    for role in ROLES:
        user = getattr(tenancy, role)
        answers = {}
        for method in ("get", "post"):
            if name.startswith("v1:"):
                api_client.force_authenticate(user)
                answers[method] = getattr(api_client, method)(url, {}, format="json").status_code
            else:
                client.force_login(user)
                answers[method] = getattr(client, method)(url, {}).status_code
        assert set(answers.values()) <= refused | {405} and refused & set(answers.values()), (
            role,
            url,
            answers,
        )
    assert _snapshot(tenancy) == before


@pytest.mark.parametrize("name", admin_pages())
def test_the_admin_sends_every_tenant_role_to_its_sign_in(name, tenancy, client):
    url = url_of(name, {})  # an admin page's object id is "1": the admin answers before it looks
    for role in ROLES:
        client.force_login(getattr(tenancy, role))
        for method in ("get", "post"):
            response = getattr(client, method)(url, {})
            assert response.status_code == 302, (role, method, url)
            assert response["Location"].startswith(reverse("admin:login")), (role, method, url)
