"""Regions of work in between refresh themselves in a real browser (Debian's Chromium, driven by
playwright): the region is swapped in place while something waits, left alone while someone types in it,
and the refreshing stops once the server no longer marks it."""

from pathlib import Path

import pytest
from django.db import connections
from django.urls import reverse

from pools.models import PoolRequest
from tests.factories import PoolRequestFactory

CHROMIUM = Path("/usr/bin/chromium")
sync_api = pytest.importorskip("playwright.sync_api")
pytestmark = [
    pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Chromium at /usr/bin/chromium"),
    # The live server reads what the test writes: committed rows, and the database put back as it was after.
    pytest.mark.django_db(transaction=True, serialized_rollback=True),
]

SECONDS = 2  # the fewest portal.js waits between refreshes


def update(rows, **values) -> None:
    """Change rows behind the page's back. Beside playwright's loop the test's queries get a connection
    of their own, which is closed here so that nothing holds the test database at the end."""
    rows.update(**values)
    connections.close_all()


@pytest.fixture
def browser_page(live_server, client, tenancy, monkeypatch, settings):
    """A browser tab signed in as alice, failing the test on any script error or console error."""
    monkeypatch.setattr("pools.views.refresh.REFRESH_SECONDS", SECONDS)
    # The live server serves static files from the apps' folders by their plain names.
    settings.STORAGES = {
        **settings.STORAGES,
        "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
    }
    # playwright's sync API runs an event loop in this thread; the test's own queries run beside it.
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    client.force_login(tenancy.acme_member)
    cookie = client.cookies[settings.SESSION_COOKIE_NAME].value
    errors: list[str] = []
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox"])
        context = browser.new_context()
        context.add_cookies([{"name": settings.SESSION_COOKIE_NAME, "value": cookie, "url": live_server.url}])
        page = context.new_page()
        page.on("pageerror", lambda error: errors.append(str(error)))
        page.on("console", lambda message: message.type == "error" and errors.append(message.text))
        page.on("response", lambda r: r.status >= 400 and errors.append(f"{r.status} {r.url}"))
        page.fetched = []  # the pages the tab fetched by script
        page.on("request", lambda r: r.resource_type == "fetch" and page.fetched.append(r.url))
        yield page
        browser.close()
    assert errors == []


def test_a_waiting_request_refreshes_until_it_is_decided(browser_page, live_server, tenancy):
    request = PoolRequestFactory(project=tenancy.vision, state="queued")
    url = live_server.url + reverse("pool-request", kwargs={"tenant_slug": "acme", "pk": request.pk})
    page = browser_page
    page.goto(url)
    assert page.locator("#request-live[data-refresh]").count() == 1

    # Someone types in the region: the swap waits for them.
    page.evaluate(
        "() => { const f = document.createElement('input'); f.id = 'typing';"
        " document.getElementById('request-live').append(f); f.focus(); }"
    )
    update(PoolRequest.objects.filter(pk=request.pk), state="rejected", decision_reason="no budget left")
    page.wait_for_timeout(SECONDS * 1000 * 2 + 500)
    assert len(page.fetched) >= 1  # it did look
    assert page.locator("#typing").count() == 1 and "queued" in page.locator("h1").inner_text()

    # Once they leave the field, the next turn swaps in the decision, and refreshing stops.
    page.locator("#typing").blur()
    page.wait_for_selector("#request-live:not([data-refresh])", timeout=SECONDS * 1000 * 3)
    assert "rejected" in page.locator("h1").inner_text() and "no budget left" in page.content()
    assert page.locator("#typing").count() == 0
    settled = len(page.fetched)
    page.wait_for_timeout(SECONDS * 1000 * 2 + 500)
    assert len(page.fetched) == settled


def test_the_tenant_lists_swap_only_their_rows(browser_page, live_server, tenancy):
    waiting = PoolRequestFactory(project=tenancy.vision, state="submitted")
    page = browser_page
    page.goto(live_server.url + reverse("tenant-requests", kwargs={"tenant_slug": "acme"}))
    page.locator(".badge.request-submitted").wait_for()
    update(PoolRequest.objects.filter(pk=waiting.pk), state="cancelled")
    page.wait_for_selector("#requests-rows:not([data-refresh])", timeout=SECONDS * 1000 * 3)
    assert page.locator(".badge.request-cancelled").count() == 1
    assert page.locator("#requests-rows").count() == 1  # swapped in place, not nested or doubled
