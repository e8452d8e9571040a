"""Bad input is a 4xx that says what was wrong, never a 500: the findings one by one, then every
URL pattern of the site (pages, admin, API, accounts) walked with NUL bytes, over-long values and
invalid paging."""

import re
from urllib.parse import quote

import pytest
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver, reverse

from portal import tokens
from portal.models import Project
from tests.factories import AlertFactory, UserFactory
from tests.needs import needs
from tests.portal.test_isolation import acme_objects

LISTS = [
    "/api/v1/projects/",
    "/api/v1/tenants/",
    "/api/v1/pool-requests/",
    "/api/v1/pools/",
    "/api/v1/clusters/",
    "/api/v1/capacity/nodes/",
    "/api/v1/capacity/gpus/",
]


@pytest.fixture
def root(db):
    return UserFactory(username="root", is_staff=True, is_superuser=True)


@pytest.mark.parametrize("path", LISTS)
@pytest.mark.parametrize(
    "query", ["limit=99999999999999999999", "limit=0", "limit=501", "limit=abc", "offset=-1", "offset=x1"]
)
def test_invalid_paging_is_a_400_that_names_the_parameter(path, query, root, api_for):
    response = api_for(root).get(f"{path}?{query}")
    assert response.status_code == 400
    assert query.split("=")[0] in response.json()


def test_paging_within_bounds_still_works(tenancy, api_for):
    body = api_for(tenancy.acme_member).get("/api/v1/projects/?limit=500&offset=0").json()
    assert body["count"] == 1 and len(body["results"]) == 1
    assert api_for(tenancy.acme_member).get("/api/v1/projects/?offset=3").status_code == 200


@pytest.mark.parametrize(
    "path",
    [
        "/api/v1/capacity/nodes/?cluster=seoul-a%00",
        "/api/v1/capacity/gpus/?group=%00",
        "/api/v1/specs/?cluster=seoul-a%00&purpose=x",
        "/admin/portal/project/?tenant__id__exact=%00",
        "/admin/pools/poolrequest/?q=a%00b",
    ],
)
def test_a_nul_in_a_query_is_a_400(path, root, client_for):
    response = client_for(root).get(path)
    assert response.status_code == 400
    assert "NUL" in response.content.decode()


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/api/v1/pool-requests/", {"project": 1, "items": [], "cluster": "seoul-a\u0000"}),
        ("/api/v1/projects/", {"tenant": "acme\u0000", "slug": "x", "name": "x"}),
        ("/api/v1/auth/token/", {"username": "bob\u0000", "password": "x"}),
        ("/api/v1/projects/", {"tenant\u0000": "acme"}),
    ],
)
def test_a_nul_in_a_json_body_is_a_400(path, body, tenancy, api_for):
    response = api_for(tenancy.acme_admin).post(path, body, format="json")
    assert response.status_code == 400
    assert "NUL" in response.json()["detail"]
    assert Project.objects.count() == 2


def test_a_nul_in_a_form_is_a_400(tenancy, client_for):
    response = client_for(tenancy.acme_admin).post(
        reverse("project-create", kwargs={"slug": "acme"}), {"name": "x\x00", "slug": "x"}
    )
    assert response.status_code == 400
    assert "NUL" in response.content.decode()
    assert Project.objects.count() == 2


def test_json_nested_thousands_deep_is_a_400(tenancy, api_for):
    body = "[" * 5000 + "]" * 5000
    response = api_for(tenancy.acme_admin).post("/api/v1/projects/", body, content_type="application/json")
    assert response.status_code == 400
    assert "nested deeper" in response.json()["detail"]
    modest = '{"tenant": "acme", "slug": "deep", "name": "Deep", "description": ' + "[" * 40 + "]" * 40 + "}"
    response = api_for(tenancy.acme_admin).post("/api/v1/projects/", modest, content_type="application/json")
    assert response.status_code == 400 and "nested deeper" in response.json()["detail"]


def test_an_oversized_json_body_is_refused(tenancy, api_for, settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1000
    body = '{"name": "' + "x" * 2000 + '"}'
    response = api_for(tenancy.acme_admin).post("/api/v1/projects/", body, content_type="application/json")
    assert response.status_code == 400
    assert response.json()["detail"] == "The request body is larger than 1000 bytes."


def test_a_post_to_an_unknown_api_address_is_a_json_404(tenancy, client_for):
    client = Client(enforce_csrf_checks=True)
    client.force_login(tenancy.acme_member)
    for method in (client.post, client.put, client.delete, client.get):
        response = method("/api/v1/no-such-thing/")
        assert response.status_code == 404
        assert response.json() == {"detail": "Not found."}


def test_a_failed_csrf_check_under_the_api_answers_json(tenancy):
    client = Client(enforce_csrf_checks=True)
    client.force_login(tenancy.acme_admin)
    response = client.post("/api/v1/projects/", {"tenant": "acme", "slug": "x", "name": "x"})
    assert response.status_code == 403
    assert "CSRF" in response.json()["detail"]


def test_a_viewer_is_not_offered_the_request_form(tenancy, client_for):
    client = client_for(tenancy.acme_viewer)
    url = reverse("pool-request-new", kwargs={"tenant_slug": "acme", "slug": "vision"})
    response = client.get(url)
    assert response.status_code == 403
    assert "Viewers cannot request GPUs" in response.content.decode()
    project = client.get(reverse("project", kwargs={"tenant_slug": "acme", "slug": "vision"}))
    assert url not in project.content.decode()
    assert url in client_for(tenancy.acme_member).get(project.request["PATH_INFO"]).content.decode()


# --- Every URL pattern ----------------------------------------------------------------------------

PARAMETER = re.compile(r"<(?:\w+:)?(\w+)>|\(\?P<(\w+)>")
QUERIES = [
    "limit=abc&offset=-5",
    "limit=99999999999999999999&offset=99999999999999999999999999",
    "q=%00&cluster=%00&group=%00&model=%00&node=%00&project=%00&state=%00&next=%00",
    "cluster=" + "a" * 5000,
    "q=" + "a" * 2000 + "&cluster=" + "b" * 2000,  # long, but under the limit: the views see them
    "p=99999999999999999999&page=99999999999999999999&o=99999",
    "p=-1&page=x&o=-3.x",
    "range=1y&usage_range=forever&sort=-nothing&state=x&events_page=-1&tenants_page=x",
    "size=huge&range=24h",
]


def _patterns(resolver=None, prefix="", namespace=""):
    resolver = resolver or get_resolver()
    for entry in resolver.url_patterns:
        if isinstance(entry, URLResolver):
            inner = f"{namespace}{entry.namespace}:" if entry.namespace else namespace
            yield from _patterns(entry, prefix + str(entry.pattern), inner)
        elif isinstance(entry, URLPattern):
            yield (f"{namespace}{entry.name}" if entry.name else None), prefix + str(entry.pattern)


def _base_values(t, objects):
    token = tokens.issue_token(user=t.acme_member, name="walk").token
    pool, request = objects["pool"], objects["request"]
    node = pool.cluster.nodes.first()
    by_route = {
        "pool": pool.pk,
        "pool-release": pool.pk,
        "v1:pool-detail": pool.pk,
        "v1:pool-release": pool.pk,
        "invitation-revoke": objects["invitation"].pk,
        "member-role": objects["member"].pk,
        "member-remove": objects["member"].pk,
        "api-token-revoke": token.pk,
        "v1:tenant-detail": t.acme.slug,
        "v1:project-detail": t.vision.pk,
        "v1:capacity-node-detail": node.pk,
        "v1:capacity-gpu-detail": node.gpus.first().pk,
        "capacity-node-drain": node.pk,
        "capacity-node": node.pk,
        "capacity-group": pool.cluster.pk,
        "capacity-gpu-drain": node.gpus.first().pk,
        **dict.fromkeys(
            ["billing-invoice", "billing-invoice-act", "tenant-invoice-download", "v1:invoice-detail"],
            objects["invoice"].pk,
        ),
        "tenant-credit-note-pdf": objects["credit_note"].pk,
        **dict.fromkeys(["monitoring-pool", "monitoring-pool-chart", "pool-usage-chart"], pool.pk),
        **dict.fromkeys(["monitoring-gpu", "monitoring-gpu-chart"], node.gpus.first().pk),
        "monitoring-fault-replace": pool.pk,
        "monitoring-fault-clear": _open_fault(node.gpus.first()).pk,
        "billing-credit-note-pdf": objects["credit_note"].pk,
        **dict.fromkeys(
            ["monitoring-alert", "monitoring-alert-acknowledge"], AlertFactory(gpu=node.gpus.first()).pk
        ),
    }
    common = {
        "tenant_slug": "acme",
        "format": "json",
        "app_label": "portal",
        "token": objects["invitation"].token,
        "name": pool.cluster.name,
        "uidb36": "1z",
        "key": "set-password",
        "object_id": str(t.vision.pk),
        "url": "nowhere/",
        "month": "2026-01",
        "kind": "csv",
        "act": "paid",
        "metric": "sm_active_pct",
        "group": "none",  # a cluster's nodes in no GPU group (capacity-group)
    }
    return by_route, common, request.pk


def _open_fault(gpu):
    from django.utils import timezone

    from monitoring.models import GpuFault

    return GpuFault.objects.create(gpu=gpu, kind="ecc", code=1, at=timezone.now(), drained_by_portal=False)


def _urls(t, objects):
    """(name, base url, [(argument, value)]) for every pattern of the site that can be built."""
    by_route, common, request_pk = _base_values(t, objects)
    for name, pattern in _patterns():
        params = [m.group(1) or m.group(2) for m in PARAMETER.finditer(pattern)]
        if name is None:
            yield pattern, "/" + re.sub(r"[\^$]", "", pattern).replace("(?P<url>.*)", "nowhere/"), []
            continue
        values = {}
        for param in params:
            if param == "slug":
                values[param] = "vision" if "tenant_slug" in params else "acme"
            elif param == "pk":
                values[param] = by_route.get(name, request_pk)
            else:
                values[param] = common.get(param, "1")
        yield name, reverse(name, kwargs=values), [(p, str(v)) for p, v in values.items()]


def _path_mutations(url, arguments):
    for _param, value in arguments:
        head, found, tail = url.rpartition(quote(value, safe=""))
        if not found:
            continue
        long_value = "9" * 40 if value.isdigit() else "a" * 3000
        yield head + quote(value + "\x00") + tail
        yield head + long_value + tail


ROLES = ("superuser", "tenant admin", "nobody")
SHARDS = 4  # each role's walk in parts, so that parallel test processes share it


def _sorted_urls(t, objects):
    return sorted(_urls(t, objects), key=lambda url: (url[0], url[1]))


def test_the_walk_covers_every_part_of_the_site(tenancy):
    urls = [url for _name, url, _arguments in _sorted_urls(tenancy, acme_objects(tenancy))]
    assert len(urls) > 100
    for part in ("/admin/", "/api/v1/", "/accounts/", "/capacity/", "/billing/", "/monitoring/"):
        assert any(url.startswith(part) for url in urls), part


@needs("fuzz")
def walk(client: Client, user, who: str, urls) -> tuple[int, list[str]]:
    """GET each URL with each bad query and each bad path argument, and POST a form with a NUL to it and
    to its bad paths (signed out: only the bad paths, GET); returns how many requests were sent and the
    answers of 5xx."""
    failures = []
    walked = 0
    for name, url, arguments in urls:
        if user is not None:
            client.force_login(user)  # a sign-out page met before must not end the walk
        paths = [url, *_path_mutations(url, arguments)]
        requests = [("get", path, None) for path in paths]
        if user is not None:
            requests += [("get", f"{url}?{query}", None) for query in QUERIES]
            requests += [("post", path, {"name": "x\x00", "reason": "y"}) for path in paths]
        for method, candidate, data in requests:
            response = getattr(client, method)(candidate, data)
            walked += 1
            if response.status_code >= 500:
                failures.append(f"{who} {method.upper()} {candidate[:100]} ({name}): {response.status_code}")
    return walked, failures


@pytest.mark.parametrize("shard", range(SHARDS))
@pytest.mark.parametrize("who", ROLES)
def test_no_url_of_the_site_answers_5xx_to_bad_input(tenancy, root, who, shard):
    """Every pattern of the site walked with bad input: as a superuser everywhere, as a tenant admin
    outside the admin (which only sends them to sign in), and signed out with bad paths."""
    user = {"superuser": root, "tenant admin": tenancy.acme_admin, "nobody": None}[who]
    urls = _sorted_urls(tenancy, acme_objects(tenancy))[shard::SHARDS]
    if who == "tenant admin":
        urls = [url for url in urls if not url[1].startswith("/admin/")]
    walked, failures = walk(Client(raise_request_exception=False), user, who, urls)
    each = 1 if user is None else 2 + len(QUERIES)  # the URL; signed in, each bad query and a POST too
    assert walked >= each * len(urls)
    assert failures == []
