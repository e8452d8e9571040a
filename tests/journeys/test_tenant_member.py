"""Journey 1: a tenant member signs in, asks for MIG instances and a full GPU, watches the request wait
with its true reason and place in the queue, then the pool active with its allocations, usage and cost,
copies the pod manifest and releases the pool."""

import time
from collections import Counter
from decimal import Decimal

import pytest
import yaml
from django.contrib.auth.models import Group
from django.utils import translation
from django.utils.translation import gettext

from billing import spend
from billing.templatetags.money import money
from monitoring.ingest import collection
from pools import selectors
from pools.models import Pool, PoolRequest
from pools.services import approve_request, release_pool, submit_request
from tests.factories import PriceFactory, UserFactory

from .conftest import JOURNEY, WAIT_MS, settle

pytestmark = JOURNEY
MIG = "h200-141gb.mig-1g.18gb"
FULL = "h100-80gb.full"


def until(check, what: str, seconds: float = WAIT_MS / 1000):
    deadline = time.monotonic() + seconds
    while not (found := check()):
        assert time.monotonic() < deadline, what
        time.sleep(0.2)
    settle()
    return found


@pytest.fixture
def approver(db):
    user = UserFactory(username="carol", is_staff=True)
    user.groups.add(Group.objects.get(name="approver"))
    return user


@pytest.fixture
def h100s_held(fleet, tenancy, approver, celery_worker):
    """globex holds both H100s, so that acme's full GPU has to wait for them."""
    PriceFactory(gpu_model="H100-80GB", profile="full", hourly_price=Decimal("4200"))
    PriceFactory(gpu_model="H200-141GB", profile="1g.18gb", hourly_price=Decimal("700"))
    asked = submit_request(project=tenancy.recsys, user=tenancy.globex_member, items=[(FULL, 2)])
    approve_request(request_id=asked.pk, approver=approver)
    return until(
        lambda: Pool.objects.filter(request=asked, state="active").first(), "globex's pool is not active"
    )


def test_a_member_requests_watches_uses_and_releases_a_pool(journey, tenancy, h100s_held, approver, fleet):
    page = journey.page
    journey.sign_in("alice", next_url=f"/t/acme/p/{tenancy.vision.slug}/")
    journey.shot("project")

    page.click(f"a[href='/t/acme/p/{tenancy.vision.slug}/request/']")
    journey.check_language()
    page.select_option("select[name=spec_0]", MIG)
    page.fill("input[name=count_0]", "2")
    page.select_option("select[name=spec_1]", FULL)
    page.fill("input[name=count_1]", "1")
    page.fill("textarea[name=justification]", "Training the vision model")
    journey.shot("request-form")
    page.click("#request-form button[type=submit]:not([name=add_row])")
    page.wait_for_url("**/t/acme/requests/*/")
    journey.check_language()
    settle()
    request = PoolRequest.objects.get(project=tenancy.vision)
    items = sorted((i.gpu_model, i.profile, i.count) for i in request.items.all())
    assert items == [("H100-80GB", "full", 1), ("H200-141GB", "1g.18gb", 2)]
    assert request.state == "submitted"

    # An approver says yes; the worker finds no free H100 and queues it, saying why.
    approve_request(request_id=request.pk, approver=approver)
    until(lambda: PoolRequest.objects.get(pk=request.pk).state == "queued", "the request was not queued")
    request.refresh_from_db()
    position = selectors.queue_positions()[request.pk]
    with translation.override(journey.lang):
        reason = selectors.waiting_reason(request)
    assert position == 1 and reason
    shown = "text => document.getElementById('request-live').innerText.includes(text)"
    page.wait_for_function(shown, arg=f"#{position} — {reason}")
    journey.check_language()
    journey.shot("waiting")

    # globex gives its GPUs back: the queue admits the request, the worker provisions the pool.
    release_pool(pool_id=h100s_held.pk, user=tenancy.globex_member)
    settle()
    page.wait_for_selector("#request-live:not([data-refresh])")
    page.click("#request-live a[href*='/pools/']")
    page.wait_for_selector("#pool-live .badge.pool-active")
    journey.check_language()
    pool = Pool.objects.get(request=request)
    live = list(pool.allocations.filter(released_at=None).select_related("gpu__node"))
    assert Counter(a.profile for a in live) == {"1g.18gb": 2, "full": 1}
    rows = page.locator("#pool-live table tbody tr")
    assert rows.count() == 3
    shown = {rows.nth(n).locator("td code").last.inner_text() for n in range(3)}
    assert shown == {a.instance_uuid for a in live}

    # The collector reads the fleet; the page draws the pool's usage and its running cost.
    collection.collect(fleet)
    settle()
    page.reload()
    page.click(".usage a[href$='=1h']")  # the last hour: drawn from the raw samples
    page.wait_for_url("**=1h")
    charts = page.locator(".usage img.chart")
    assert charts.count() == 2
    with translation.override(journey.lang):
        empty = gettext("No figures in this range")
    for n in range(charts.count()):
        charts.nth(n).scroll_into_view_if_needed()
        assert charts.nth(n).evaluate("img => img.complete && img.naturalWidth > 0")
        drawn = page.request.get(journey.base + charts.nth(n).get_attribute("src")).text()
        assert 'class="series' in drawn and empty not in drawn  # the pool's figures, not "none"
    figures = spend.figures(spend.pool_spend(pools=Pool.objects.filter(pk=pool.pk), ever=True)[pool.pk])
    assert figures.hourly == Decimal(2 * 700 + 4200)
    cost = page.locator(".spend dl.facts dd").first.inner_text()
    assert cost == money(figures.hourly, figures.currency)
    journey.shot("active")

    # The manifest asks for exactly what the pool holds, one pod per node; the Copy button copies it.
    journey.context.grant_permissions(["clipboard-read", "clipboard-write"], origin=journey.base)
    page.click("button[data-copy=manifest]")
    copied = page.evaluate("() => navigator.clipboard.readText()")
    assert copied.strip() == page.locator("#manifest").inner_text().strip()
    wanted = Counter()
    for pod in yaml.safe_load_all(copied):
        assert pod["metadata"]["namespace"] == tenancy.vision.namespace
        for container in pod["spec"]["containers"]:
            wanted.update(container["resources"]["limits"])
    assert wanted == Counter(a.resource_name for a in live)
    assert {pod["spec"]["nodeSelector"]["kubernetes.io/hostname"] for pod in yaml.safe_load_all(copied)} == {
        a.gpu.node.name for a in live
    }

    page.click(f"form[action='/t/acme/pools/{pool.pk}/release/'] button")
    page.wait_for_selector("#pool-live .badge.pool-released")
    journey.check_language()
    journey.shot("released")
    settle()
    assert Pool.objects.get(pk=pool.pk).state == "released"
