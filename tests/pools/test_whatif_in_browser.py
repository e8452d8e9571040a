"""The what-if pages in a real browser (Debian's Chromium, driven by playwright) on a 360 px phone: a run's
page follows the run until its report is in and then draws its charts, and no page scrolls sideways."""

from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest
from django.db import connections
from django.urls import reverse

from pools.models import WhatIfRun, WhatIfState
from tests.factories import WhatIfRunFactory, whatif_report

CHROMIUM = Path("/usr/bin/chromium")
sync_api = pytest.importorskip("playwright.sync_api")
pytestmark = [
    pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Chromium at /usr/bin/chromium"),
    # The live server reads what the test writes: committed rows, and the database put back as it was after.
    pytest.mark.django_db(transaction=True, serialized_rollback=True),
]

SECONDS = 2  # the fewest portal.js waits between refreshes
PHONE = {"width": 360, "height": 740}
# The n-th chart of the page has loaded and drawn.
LOADED = (
    "(n) => { const c = document.querySelectorAll('img.chart')[n]; return c.complete && c.naturalWidth > 0; }"
)


def update(rows, **values) -> None:
    """Change rows behind the page's back, on a connection closed at once (see test_refresh_in_browser)."""
    rows.update(**values)
    connections.close_all()


@pytest.fixture
def phone(live_server, client, operator, monkeypatch, settings, tmp_path):
    """A phone-sized tab signed in as an operator, failing the test on any script, console or load error."""
    monkeypatch.setattr("pools.views.refresh.REFRESH_SECONDS", SECONDS)
    settings.STORAGES = {
        **settings.STORAGES,
        "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
    }
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    client.force_login(operator)
    cookie = client.cookies[settings.SESSION_COOKIE_NAME].value
    errors: list[str] = []
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox"])
        context = browser.new_context(viewport=PHONE, device_scale_factor=1)
        context.add_cookies([{"name": settings.SESSION_COOKIE_NAME, "value": cookie, "url": live_server.url}])
        page = context.new_page()
        page.on("pageerror", lambda error: errors.append(str(error)))
        page.on("console", lambda message: message.type == "error" and errors.append(message.text))
        page.on("response", lambda r: r.status >= 400 and errors.append(f"{r.status} {r.url}"))
        page.shots = tmp_path  # where a test leaves what it saw, to look at when it fails
        yield page
        browser.close()
    assert errors == []


def fits(page) -> bool:
    """The page itself is no wider than the screen: wide tables scroll inside their cards."""
    return page.evaluate("() => document.documentElement.scrollWidth <= window.innerWidth")


def test_a_running_run_is_followed_until_its_report_and_charts_are_in(phone, live_server):
    run = WhatIfRunFactory(state=WhatIfState.RUNNING, progress=0.0)
    connections.close_all()
    phone.goto(live_server.url + reverse("whatif-run", args=[run.pk]))
    assert phone.locator("#whatif-live[data-refresh] progress").count() == 1
    update(WhatIfRun.objects.filter(pk=run.pk), progress=0.5)
    phone.wait_for_function("() => document.querySelector('progress').value === 0.5", timeout=SECONDS * 3000)
    update(WhatIfRun.objects.filter(pk=run.pk), state="done", progress=1.0, report=whatif_report())
    phone.wait_for_selector("#whatif-live:not([data-refresh])", timeout=SECONDS * 3000)
    charts = phone.locator("img.chart")
    assert charts.count() == 4
    for number in range(4):
        charts.nth(number).scroll_into_view_if_needed()
        phone.wait_for_function(LOADED, arg=number)
    assert "Side by side" in phone.content()
    assert fits(phone)
    phone.screenshot(path=phone.shots / "run.png", full_page=True)


def test_the_list_the_form_and_compare_fit_a_phone(phone, live_server):
    first = WhatIfRunFactory(state=WhatIfState.DONE)
    second = WhatIfRunFactory(state=WhatIfState.DONE, cluster="a-cluster-with-a-long-name")
    WhatIfRunFactory(state=WhatIfState.FAILED)
    connections.close_all()
    phone.goto(live_server.url + reverse("whatif-list"))
    assert fits(phone)
    phone.screenshot(path=phone.shots / "list.png", full_page=True)
    # Picking A and B on the list leads to the comparison.
    phone.locator(f'input[name="a"][value="{first.pk}"]').check()
    phone.locator(f'input[name="b"][value="{second.pk}"]').check()
    phone.get_by_role("button", name="Compare A and B").click()
    phone.wait_for_url("**/capacity/whatif/compare/*")
    assert parse_qs(urlsplit(phone.url).query) == {"a": [str(first.pk)], "b": [str(second.pk)]}
    assert phone.locator("table.whatif-figures thead th").count() == 5
    assert fits(phone)
    phone.screenshot(path=phone.shots / "compare.png", full_page=True)
